//! kNN's write passes and emission: the queries not ranked from their slots, pipelined on the
//! device's streams, and every query's k nearest sent in query order.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaStream};
use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use super::knn::Counted;
use crate::backend::gpu::batches::{exclusive_offsets, write_batches};
use crate::backend::gpu::knn_plan::KnnPlan;
use crate::backend::gpu::sides::subset_side;
use crate::backend::gpu::{GpuBackend, MAX_BATCH_PAIRS, RunResult, copy_failed, finish_queued, output_pairs};
use crate::backend::plan::topk::{Neighbour, Ranked, k_smallest, send_ranked};
use crate::backend::{ResultSink, RunStats};
use crate::cuda::buffers::{JoinInputs, PassBuffers, RankedLists, SideBuffers};
use crate::cuda::download::{HostPairs, host_results};
use crate::cuda::launch::{PassKind, launch_join_pass, rank_lists_most_k, start_rank_lists};
use crate::cuda::memory::zeroed;
use crate::cuda::{Error as GpuError, PIPELINE_STREAMS};

impl GpuBackend {
    /// The write passes of the queries not ranked from slots (pipelined on PIPELINE_STREAMS
    /// streams, their lists ranked on the device where k allows), and every query's k nearest sent
    /// in query order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn knn_write_passes(
        &self,
        plan: &KnnPlan,
        counted: Counted,
        first_capacity: u32,
        nearest_distance: &[f64],
        nearest_position: &[u32],
        sink: &dyn ResultSink,
        budget: usize,
        stats: &mut RunStats,
    ) -> RunResult<()> {
        let KnnPlan { k, dim, nq, .. } = *plan;
        let query_buffers = &plan.query_side.side;
        let Counted { levels, counts, in_slots, mut rest, mut transfer, mut kernel, mut emit } = counted;
        stats.candidates = counts.iter().map(|&c| c as u64).sum();
        // The write passes cover the rest, in query order, each query with its final radius: all
        // queries (the query side as uploaded) or a side of their own.
        rest.sort_unstable();
        let rest_buffers = if rest.len() == nq || rest.is_empty() {
            None
        } else {
            Some(subset_side(&self.device, query_buffers, &rest, dim)?)
        };
        let rest_side = rest_buffers.as_ref().unwrap_or(query_buffers);
        let rest_counts: Vec<u32> = rest.iter().map(|&q| counts[q as usize]).collect();
        // The write passes' lists are ranked on the device where it sorts k entries in a block
        // (rank_lists_most_k): k a query comes back instead of every candidate, and the host only
        // emits them. The ranked neighbours take at most 12 bytes a written pair (each list has
        // at least k), so the batches are sized for 28 bytes a pair instead of the outputs' 16.
        let lists_on_device = k <= rank_lists_most_k(&self.device);
        // Each pipeline stream holds a batch's outputs: a third of the result quarter each.
        let most = output_pairs(budget).min(MAX_BATCH_PAIRS) / PIPELINE_STREAMS as u64;
        let most = if lists_on_device { most * 16 / 28 } else { most };
        let (batches, capacity) =
            if rest.is_empty() { (Vec::new(), 1) } else { write_batches(&rest_counts, most.max(1)) };
        // Write passes take turns on PIPELINE_STREAMS streams, each with output buffers, the
        // rest's radii and limits, and a part of the host buffers of its own, as the joins' do:
        // batch i is queued on stream i mod 3 once the host is done with batch i − 3's part, so
        // the kernels of the next batches run while the host emits this one (P1 k = 10,000: 23
        // passes, docs/design.md#gpu-knn).
        let lanes_needed = batches.len().min(PIPELINE_STREAMS);
        let slots_most = batches.iter().map(|&(begin, end, _)| end - begin).max().unwrap_or(1);
        let (mut lanes, mut ranked_lanes) =
            self.knn_write_lanes(plan, &rest, &levels, lanes_needed, slots_most, capacity, lists_on_device)?;
        // Where each batch's queries' candidates start in its output.
        let batch_offsets: Vec<Vec<u64>> =
            batches.iter().map(|&(begin, end, _)| exclusive_offsets(&rest_counts[begin..end])).collect();
        // Only write passes need the pipeline's streams and result buffers (a kNN ranked from its
        // slots alone, P1 and P2 at k = 10, creates neither): a part a stream, for the batch's
        // ranked neighbours or all its candidates.
        let part_values = if lists_on_device { slots_most * k } else { capacity };
        let mut results =
            if batches.is_empty() { None } else { Some(host_results(&self.device, part_values * PIPELINE_STREAMS)?) };
        // Progress: the queries ranked from slots as one unit, each write batch as one.
        sink.start(batches.len() as u64 + u64::from(first_capacity > 0));
        stats.write_passes = batches.len() as u64;
        // The queries ranked from slots among [from, to), in order.
        let slotted = |from: usize, to: usize| {
            (from..to).filter(|&q| in_slots[q]).map(|q| {
                let range = q * k..(q + 1) * k;
                (q, Ranked::Arrays { distances: &nearest_distance[range.clone()], positions: &nearest_position[range] })
            })
        };
        let outcome = (|| -> RunResult<()> {
            // Queries in order: those ranked from slots up to each write batch's query, then it.
            let mut next = 0usize;
            if let Some(results) = results.as_mut() {
                let streams = self.device.pipeline_streams()?;
                let mut parts = results.parts::<PIPELINE_STREAMS>()?;
                // Queues batch `i` on its stream.
                let queue =
                    |i: usize, lane: &mut PassBuffers, ranked: Option<&mut RankedLists>, part: &mut HostPairs| {
                        let stream = &streams[i % PIPELINE_STREAMS];
                        self.queue_knn_write(stream, plan, rest_side, batches[i], &batch_offsets[i], lane, ranked, part)
                    };
                let mut in_flight = Vec::with_capacity(batches.len());
                for (i, (lane, part)) in lanes.iter_mut().zip(parts.iter_mut()).enumerate() {
                    in_flight.push(queue(i, lane, ranked_lanes.get_mut(i), part)?);
                }
                for (i, &(begin, end, total)) in batches.iter().enumerate() {
                    let lane = i % PIPELINE_STREAMS;
                    let (waited, ran) = finish_queued(&streams[lane], &in_flight[i]).map_err(copy_failed)?;
                    (transfer, kernel) = (transfer + waited, kernel + ran);
                    let emitting = Instant::now();
                    let (_, positions, distances) =
                        parts[lane].pairs(if lists_on_device { (end - begin) * k } else { total as usize }, false);
                    if lists_on_device {
                        // Query begin + j's k nearest at [j·k, j·k + k) of the part: emitted from
                        // there, and the part taken by batch i + 3 only after.
                        let mut ordered = Vec::with_capacity(end - begin);
                        for (j, i) in (begin..end).enumerate() {
                            let q = rest[i] as usize;
                            // One by one: each borrow shortened to the part's (extend would tie
                            // the part's borrow to the table's, past the next queue).
                            for slotted in slotted(next, q) {
                                ordered.push(slotted);
                            }
                            let range = j * k..(j + 1) * k;
                            ordered.push((
                                q,
                                Ranked::Arrays { distances: &distances[range.clone()], positions: &positions[range] },
                            ));
                            next = q + 1;
                        }
                        send_ranked(sink, ordered)?;
                    } else {
                        // Ranked here: k beyond what the device sorts in a block.
                        let nearest = rank_on_host(&batch_offsets[i], positions, distances, begin..end, k);
                        // The part is read: its stream may take batch i + 3 while this one is sent.
                        if i + PIPELINE_STREAMS < batches.len() {
                            in_flight.push(queue(i + PIPELINE_STREAMS, &mut lanes[lane], None, &mut parts[lane])?);
                        }
                        let mut ordered = Vec::with_capacity(end - begin);
                        for (i, list) in (begin..end).zip(nearest) {
                            let q = rest[i] as usize;
                            ordered.extend(slotted(next, q));
                            ordered.push((q, Ranked::List(list)));
                            next = q + 1;
                        }
                        send_ranked(sink, ordered)?;
                    }
                    if lists_on_device && i + PIPELINE_STREAMS < batches.len() {
                        in_flight.push(queue(
                            i + PIPELINE_STREAMS,
                            &mut lanes[lane],
                            ranked_lanes.get_mut(lane),
                            &mut parts[lane],
                        )?);
                    }
                    emit += emitting.elapsed();
                    sink.advance(1);
                }
            }
            let emitting = Instant::now();
            send_ranked(sink, slotted(next, nq).collect())?;
            if first_capacity > 0 {
                sink.advance(1);
            }
            emit += emitting.elapsed();
            Ok(())
        })();
        // No copy may still be writing into the host buffers when they are released, nor a pass
        // reading the sides when they are freed (an early return above, e.g. a cancelled query,
        // can leave some in flight).
        if lanes_needed > 0 {
            for lane in self.device.pipeline_streams()? {
                lane.synchronize().map_err(copy_failed)?;
            }
        }
        stats.transfer_time += transfer;
        stats.kernel_time += kernel;
        stats.emit_time += emit;
        outcome
    }

    /// The write passes' lanes, one a pipeline stream: output buffers for `capacity` pairs, the
    /// rest's radii and limits, and where the lists are ranked on the device their ranked lists.
    #[allow(clippy::too_many_arguments)]
    fn knn_write_lanes(
        &self,
        plan: &KnnPlan,
        rest: &[u32],
        levels: &[usize],
        lanes_needed: usize,
        slots_most: usize,
        capacity: usize,
        lists_on_device: bool,
    ) -> Result<(Vec<PassBuffers>, Vec<RankedLists>), GpuError> {
        let stream = &self.device.stream;
        let k = plan.k;
        let mut lanes = Vec::with_capacity(lanes_needed);
        let mut ranked_lanes = Vec::with_capacity(lanes_needed);
        if lanes_needed > 0 {
            let (thresholds, limits) = plan.row_radii(rest.iter().map(|&q| q as usize), levels);
            for _ in 0..lanes_needed {
                let mut lane = PassBuffers::new(&self.device, slots_most, rest.len())?;
                lane.size_outputs(&self.device, capacity)?;
                lane.offsets = zeroed::<u64>(stream, slots_most + 1)?;
                stream
                    .memcpy_htod(&thresholds, &mut lane.row_threshold.slice_mut(0..rest.len()))
                    .map_err(copy_failed)?;
                stream.memcpy_htod(&limits, &mut lane.row_limit.slice_mut(0..rest.len())).map_err(copy_failed)?;
                lanes.push(lane);
                if lists_on_device {
                    ranked_lanes.push(RankedLists::new(&self.device, slots_most * k)?);
                }
            }
        }
        Ok((lanes, ranked_lanes))
    }

    /// Queues write batch `(begin, end, total)` of the rest's slots on `stream`: its offsets,
    /// its write pass, the ranking of its lists where that runs on the device (`ranked`), and
    /// the copy back into `part`; returns the events around its kernels, which time them.
    #[allow(clippy::too_many_arguments)]
    fn queue_knn_write(
        &self,
        stream: &Arc<CudaStream>,
        plan: &KnnPlan,
        rest_side: &SideBuffers,
        (begin, end, total): (usize, usize, u64),
        offsets: &[u64],
        lane: &mut PassBuffers,
        mut ranked: Option<&mut RankedLists>,
        part: &mut HostPairs,
    ) -> RunResult<[CudaEvent; 2]> {
        let (k, n) = (plan.k, plan.n);
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        stream.memcpy_htod(offsets, &mut lane.offsets.slice_mut(0..offsets.len())).map_err(copy_failed)?;
        let started = stream.record_event(timing).map_err(copy_failed)?;
        let expected_share = total as f64 / ((end - begin) as f64 * n as f64);
        let inputs = JoinInputs {
            left: rest_side,
            right: &plan.base_side.side,
            right_len: n as u32,
            grid: None,
            directory: None,
            expected_share,
        };
        launch_join_pass(&self.device, stream, &plan.params, begin as u32..end as u32, inputs, lane, PassKind::Write)?;
        if let Some(ranked) = ranked.as_deref_mut() {
            start_rank_lists(&self.device, stream, lane, end - begin, k, ranked)?;
        }
        let written = stream.record_event(timing).map_err(copy_failed)?;
        match ranked {
            Some(ranked) => part.start_download_ranked(stream, ranked, (end - begin) * k)?,
            None => part.start_download(stream, lane, false, 0..total as usize)?,
        }
        Ok([started, written])
    }
}

/// The k nearest of each of the rest's slots `slots` of a write batch, ranked on the host: each
/// slot's candidates lie in its own [offset, next offset) range of the batch's output, in no set
/// order.
fn rank_on_host(
    offsets: &[u64],
    positions: &[u32],
    distances: &[f64],
    slots: Range<usize>,
    k: usize,
) -> Vec<Vec<Neighbour>> {
    let begin = slots.start;
    slots
        .into_par_iter()
        .map(|i| {
            let range = offsets[i - begin] as usize..offsets[i - begin + 1] as usize;
            let all = range.map(|j| Neighbour { distance: distances[j], position: positions[j] }).collect();
            k_smallest(all, k)
        })
        .collect()
}
