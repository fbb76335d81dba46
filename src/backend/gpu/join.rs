//! ε-joins and range queries on the GPU: the grid or brute force, count and write passes, and the
//! batches their pairs come back in.
//!
//! A run's phases, each a method below: the modules its plan needs ([`GpuBackend::load_join_modules`]),
//! the sides on the device in the form their filter reads ([`GpuBackend::upload_join_sides`]), the
//! index over them ([`GpuBackend::build_join_index`]), then either the count alone
//! ([`GpuBackend::count_join`]) or the pairs ([`GpuBackend::emit_join`]: the collecting count pass,
//! then the collected pairs' download or the write passes', [`GpuBackend::download_collected`] and
//! [`GpuBackend::download_written`]).

use std::borrow::Cow;
use std::ops::Range;
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use super::directory::DeviceDirectory;
use crate::backend::gpu::batches::{
    COLLECT_PAIRS_PER_ROW, RESULT_BATCH_PAIRS, ResultBatch, collect_parts, collected_batches, exclusive_offsets,
    write_batches,
};
use crate::backend::gpu::divided::{JoinParts, part_slots};
use crate::backend::gpu::filter::{filter_extent, filter_origin, filter_params, gemm_metric, metric_code};
use crate::backend::gpu::sides::{HostSide, device_side, host_side, in_slot_order};
use crate::backend::gpu::{GpuBackend, MAX_PASS_ROWS, RunResult, copy_failed, finish_queued, output_pairs};
use crate::backend::plan::FilterSpaces;
use crate::backend::plan::bounds::filter_limit;
use crate::backend::plan::exact::{ExactCheck, write_self_pairs};
use crate::backend::{DeviceRun, JoinRequest, PairWriter, ResultSink, RunStats, Wanted};
use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{GridBuffers, JoinInputs, PassBuffers, SideBuffers};
use crate::cuda::download::{DownloadedPairs, HostPairs, HostResults, host_results};
use crate::cuda::grid::{DeviceGrid, build_grid};
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{PassKind, byte_sides, launch_join_pass};
use crate::cuda::memory::zeroed;
use crate::cuda::{Error as GpuError, PIPELINE_STREAMS};
use crate::index::JoinStrategy;
use crate::op::Metric;
use crate::vectors::Coords;

/// A join's sides on the device in the form its plan filters them, and the index built over them.
struct DeviceJoin {
    params: JoinParams,
    left: SideBuffers,
    /// `None` for a self-join, whose right side is its left.
    right: Option<SideBuffers>,
    grid: Option<GridBuffers>,
    directory: Option<DeviceDirectory>,
    /// Left slots (rows of the left side).
    left_rows: usize,
    /// Right rows.
    right_len: u32,
}

impl DeviceJoin {
    fn inputs(&self) -> JoinInputs<'_> {
        JoinInputs {
            left: &self.left,
            right: self.right.as_ref().unwrap_or(&self.left),
            right_len: self.right_len,
            grid: self.grid.as_ref(),
            directory: self.directory.as_ref().map(|(d, _)| d),
            expected_share: 0.0,
        }
    }

    /// Whether the sides are in an index's slot order (a grid or a directory), not brute force's.
    fn indexed(&self) -> bool {
        self.grid.is_some() || self.directory.is_some()
    }
}

/// Time a run waited for copies, its kernels ran, and its host spent emitting.
#[derive(Default)]
struct PassTimes {
    transfer: Duration,
    kernel: Duration,
    emit: Duration,
}

/// A divided join's part: its index, and the plan and host rows the parts share.
type Part<'p, 'a> = Option<(usize, &'p JoinParts<'a>)>;

/// A join's write batches and the counts they were cut from.
#[derive(Clone, Copy)]
struct WrittenBatches<'b> {
    batches: &'b [ResultBatch],
    /// Each slot's pairs, from `first_slot` on.
    counts: &'b [u32],
    first_slot: usize,
    /// Pairs of the largest batch.
    largest: usize,
}

/// Each vector with itself, where a self-join includes them: written by the first part alone.
fn write_own_pairs(request: &JoinRequest, part: Part<'_, '_>, writer: &mut PairWriter) -> Result<()> {
    if request.self_join.is_some_and(|s| s.include_self) && part.is_none_or(|(i, _)| i == 0) {
        let exact = ExactCheck::new(request.metric, request.threshold, request.left, request.right);
        write_self_pairs(&exact, request.left, 0..request.left.len(), writer)?;
    }
    Ok(())
}

impl GpuBackend {
    /// The join, or with `part = Some((i, shared))` (a join divided among several GPUs) the pairs
    /// of the `i`-th of `shared.parts` ranges of left slots: each pair (a self-join's unordered
    /// pair) is found from one left slot alone, so the parts' pairs are disjoint and together the
    /// whole result.
    pub(super) fn gpu_join<'a>(
        &self,
        request: &JoinRequest<'a>,
        sink: &dyn ResultSink,
        budget: usize,
        part: Part<'_, 'a>,
    ) -> RunResult<RunStats> {
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if request.left.is_empty() || request.right.is_empty() {
            return Ok(stats);
        }
        let start = Instant::now();
        // A divided join's GPUs read the one plan of their shared request.
        let (strategy, spaces) = (&request.plan().strategy, request.spaces());
        let spaces = &spaces;
        // Loading the modules (compiling them, the first time on a machine) is left out of
        // build_time.
        let start = start + self.load_join_modules(strategy, request.left.dim)?;
        let join = self.upload_join_sides(request, spaces, strategy, part, &mut stats)?;
        let join = self.build_join_index(join, request, spaces, strategy, part, &mut stats)?;
        // The build's last gathers are queued, not done: they count as build time.
        self.device.stream.synchronize().map_err(copy_failed)?;
        stats.build_time = start.elapsed();

        let probe = Instant::now();
        let slots = match part {
            Some((i, shared)) => {
                let work = match (&join.grid, &join.directory) {
                    (Some(_), _) => Some(self.grid_work(&join.params, join.left_rows, join.inputs(), &mut stats)?),
                    (None, Some((_, work))) => Some(work.clone()),
                    (None, None) => None,
                };
                part_slots(join.left_rows, i, shared.parts, work.as_deref(), request.self_join.is_some())
            }
            None => 0..join.left_rows,
        };
        if part.is_some() {
            stats.devices = vec![DeviceRun { ordinal: self.ordinal(), rows: slots.len(), ..Default::default() }];
        }
        let outcome = if sink.wants() == Wanted::Count {
            self.count_join(request, &join, slots, part, sink, &mut stats)
        } else {
            self.emit_join(request, &join, slots, part, sink, budget, &mut stats)
        };
        stats.probe_time = probe.elapsed();
        outcome.map(|()| stats)
    }

    /// Loads the modules `strategy` runs (a brute-force join never waits for the grid's);
    /// returns the time that took.
    fn load_join_modules(&self, strategy: &JoinStrategy, dim: usize) -> Result<Duration, GpuError> {
        let loading = Instant::now();
        match strategy {
            JoinStrategy::Grid(_) => {
                self.device.function(crate::cuda::launch::grid_kernel(dim))?;
                self.device.function(Kernel::RadixScatter)?;
            }
            JoinStrategy::Directory(_) => {
                self.device.function(Kernel::DirectoryJoin)?;
                self.device.function(Kernel::GatherRows)?;
            }
            JoinStrategy::BruteForce => {}
        }
        Ok(loading.elapsed())
    }

    /// Both sides on the device, in input order, with the filter's parameters: the GEMM form for
    /// brute force under L2, L2² and cosine where its rows fit (else the direct filter), the
    /// tensor cores' rows where they filter.
    fn upload_join_sides<'a>(
        &self,
        request: &JoinRequest<'a>,
        spaces: &FilterSpaces<'_>,
        strategy: &JoinStrategy,
        part: Part<'_, 'a>,
        stats: &mut RunStats,
    ) -> Result<DeviceJoin, GpuError> {
        let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
        let dim = left.dim;
        // A grid's or directory's sides are gathered into slot order, and filtered directly.
        let indexed = !matches!(strategy, JoinStrategy::BruteForce);
        let identity = |n: usize| (0..n as u32).collect::<Vec<u32>>();
        // The GEMM form's filter rows of L2 and L2² (brute force) are built on the device from
        // the exact rows (device_side); the other filters' here (host_side).
        let sides = |gemm: bool| {
            // Made once for both sides, and not at all where a divided self-join's rows are built.
            let origin = std::cell::OnceCell::new();
            let origin =
                || origin.get_or_init(|| filter_origin(metric, gemm, right, || (spaces.left(), spaces.right())));
            let side = |v, filter: Coords| {
                if gemm && metric != Metric::Cosine {
                    device_side(v, origin())
                } else {
                    host_side(v, filter, identity(v.len()), origin(), metric, gemm)
                }
            };
            // A divided join's host rows, built once for every GPU: those of the direct filters
            // (the grid's), which a run never rebuilds in another form.
            let shared_sides = part.filter(|_| !gemm).map(|(_, shared)| &shared.sides);
            let left_side = match shared_sides {
                Some([left_side, _]) => Cow::Borrowed(left_side.get_or_init(|| side(left, spaces.left()))),
                None => Cow::Owned(side(left, spaces.left())),
            };
            let right_side = self_join.is_none().then(|| match shared_sides {
                Some([_, right_side]) => Cow::Borrowed(right_side.get_or_init(|| side(right, spaces.right()))),
                None => Cow::Owned(side(right, spaces.right())),
            });
            (left_side, right_side)
        };
        let upload_sides = |left_host: &HostSide,
                            right_host: &Option<Cow<HostSide>>|
         -> Result<(SideBuffers, Option<SideBuffers>), GpuError> {
            Ok((self.upload(left_host)?, right_host.as_ref().map(|h| self.upload(h)).transpose()?))
        };
        let mut gemm = !indexed && gemm_metric(metric);
        let (mut left_host, mut right_host) = sides(gemm);
        let uploading = Instant::now();
        let (mut left_buffers, mut right_buffers) = upload_sides(&left_host, &right_host)?;
        let fits = !gemm || {
            let sides: Vec<_> = std::iter::once((&*left_host, &left_buffers))
                .chain(right_host.as_deref().zip(right_buffers.as_ref()))
                .collect();
            self.gemm_fits(&sides)?
        };
        if !fits {
            gemm = false;
            (left_host, right_host) = sides(false);
            (left_buffers, right_buffers) = upload_sides(&left_host, &right_host)?;
        }
        stats.transfer_time += uploading.elapsed();
        stats.resident_inputs =
            std::iter::once(&left_buffers).chain(right_buffers.as_ref()).filter(|b| b.resident).count();
        let extent = if gemm {
            0.0
        } else {
            filter_extent(&std::iter::once(&*left_host).chain(right_host.as_deref()).collect::<Vec<_>>())
        };
        // The tensor cores filter brute force only (a grid's sides are gathered into slot order).
        let tc = if indexed {
            None
        } else {
            let sides: Vec<&SideBuffers> = std::iter::once(&left_buffers).chain(right_buffers.as_ref()).collect();
            self.tensor_core_scale(metric, gemm, &self.largest_coordinates(metric, gemm, &sides)?)
        };
        let mut params = JoinParams {
            dim: dim as u32,
            metric: metric_code(metric),
            self_join: self_join.is_some().into(),
            threshold,
            ..filter_params(metric, dim, gemm, tc)
        };
        params.limit = filter_limit(metric, threshold, dim, extent, gemm);
        left_buffers = self.with_tensor_core_rows(left_buffers, &left_host.exact, dim, tc, metric)?;
        right_buffers = right_buffers
            .zip(right_host.as_deref())
            .map(|(side, host)| self.with_tensor_core_rows(side, &host.exact, dim, tc, metric))
            .transpose()?;
        stats.byte_row_tiles =
            byte_sides(&self.device, &params, &left_buffers, right_buffers.as_ref().unwrap_or(&left_buffers))
                .is_some()
                .into();
        Ok(DeviceJoin {
            params,
            left: left_buffers,
            right: right_buffers,
            grid: None,
            directory: None,
            left_rows: left_host.rows,
            right_len: right_host.as_ref().map_or(left_host.rows, |h| h.rows) as u32,
        })
    }

    /// The grid or the directory of `strategy` built on the device, the sides gathered into its
    /// slot order and the filter's parameters completed; nothing for brute force.
    fn build_join_index<'a>(
        &self,
        mut join: DeviceJoin,
        request: &JoinRequest<'a>,
        spaces: &FilterSpaces<'_>,
        strategy: &JoinStrategy,
        part: Part<'_, 'a>,
        stats: &mut RunStats,
    ) -> Result<DeviceJoin, GpuError> {
        let dim = request.left.dim;
        let params = &mut join.params;
        match strategy {
            JoinStrategy::Grid(g) => {
                stats.indexed_dims = g.dims.len();
                let windowed = g.window_prunes();
                // `side` 0 the left, 1 the right.
                let build = |filter: Coords, side: usize| {
                    let own;
                    let (cells, values) = match part {
                        Some((_, shared)) => shared.keys[side].get_or_init(|| g.keys(filter, dim, windowed)),
                        None => {
                            own = g.keys(filter, dim, windowed);
                            &own
                        }
                    };
                    build_grid(&self.device, cells, values.as_deref(), g.id_bits(), g.table_len(cells.len()))
                };
                let DeviceGrid { order, slot_cell, sort_keys: left_sort_keys, bounds } = build(spaces.left(), 0)?;
                join.left = in_slot_order(&self.device, join.left, order, dim)?;
                // A self-join probes its own cells.
                let (right_bounds, right_sort_keys) = match join.right.take() {
                    Some(side) => {
                        let DeviceGrid { order, sort_keys, bounds: right_bounds, .. } = build(spaces.right(), 1)?;
                        join.right = Some(in_slot_order(&self.device, side, order, dim)?);
                        (right_bounds, sort_keys)
                    }
                    None => (bounds, self.device.stream.clone_dtod(&left_sort_keys).map_err(copy_failed)?),
                };
                params.k = g.dims.len() as u32;
                params.dense = right_bounds.dense.into();
                params.right_cells = right_bounds.cells as u32;
                params.windowed = windowed.into();
                params.window = g.window();
                for j in 0..g.dims.len() {
                    params.cells[j] = g.cells[j];
                    params.strides[j] = g.strides[j];
                }
                join.grid = Some(GridBuffers {
                    left_slot_cell: slot_cell,
                    right_cell_ids: right_bounds.cell_ids,
                    right_cell_start: right_bounds.cell_start,
                    cell_table: right_bounds.table,
                    left_sort_keys,
                    right_sort_keys,
                });
            }
            JoinStrategy::Directory(shape) => {
                let (buffers, left_order, right_order) =
                    self.device_directory(shape, request, spaces, params, stats, part.is_some())?;
                join.left = in_slot_order(&self.device, join.left, left_order, dim)?;
                if let (Some(side), Some(order)) = (join.right.take(), right_order) {
                    join.right = Some(in_slot_order(&self.device, side, order, dim)?);
                }
                join.directory = Some(buffers);
            }
            JoinStrategy::BruteForce => {}
        }
        Ok(join)
    }

    /// The number of pairs alone: a count pass over `slots`, whose counts are of the exact test's
    /// pairs, and no pair comes back.
    fn count_join(
        &self,
        request: &JoinRequest,
        join: &DeviceJoin,
        slots: Range<usize>,
        part: Part<'_, '_>,
        sink: &dyn ResultSink,
        stats: &mut RunStats,
    ) -> RunResult<()> {
        let mut pass = PassBuffers::new(&self.device, slots.len().clamp(1, MAX_PASS_ROWS), 0)?;
        let counts = if slots.is_empty() {
            Vec::new()
        } else {
            self.count_pass(&join.params, slots, join.inputs(), &mut pass, PassKind::Count, stats)?
        };
        let pairs: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        let mut writer = PairWriter::new(sink, request.self_join.is_some_and(|s| s.ordered));
        // A self-join's pairs from the grid or brute force join two different vectors.
        writer.count(pairs, pairs);
        write_own_pairs(request, part, &mut writer)?;
        Ok(writer.flush()?)
    }

    /// The pairs of `slots`: the collecting count pass (in parts where the work is large), then
    /// the pairs it collected downloaded in batches when they all fit its buffers
    /// (COLLECT_PAIRS_PER_ROW per left row), else write passes in batches of at most
    /// RESULT_BATCH_PAIRS pairs (a single slot with more gets a batch of its own) from the
    /// offsets its counts give, pipelined over PIPELINE_STREAMS streams.
    #[allow(clippy::too_many_arguments)]
    fn emit_join(
        &self,
        request: &JoinRequest,
        join: &DeviceJoin,
        slots: Range<usize>,
        part: Part<'_, '_>,
        sink: &dyn ResultSink,
        budget: usize,
        stats: &mut RunStats,
    ) -> RunResult<()> {
        let self_join = request.self_join;
        let (params, inputs) = (&join.params, join.inputs());
        // Downloaded pairs into result chunks, on every core: each piece builds and sends its own.
        let emit_pairs = |(lefts, rights, distances): DownloadedPairs| -> Result<()> {
            let n = rights.len();
            let piece = (1 << 16).max(n.div_ceil(rayon::current_num_threads() * 4));
            (0..n.div_ceil(piece)).into_par_iter().try_for_each(|p| -> Result<()> {
                let range = p * piece..((p + 1) * piece).min(n);
                let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
                // Self-joins report the smaller position first (the mirror adds (b, a)).
                let (l, r, d) = (&lefts[range.clone()], &rights[range.clone()], &distances[range]);
                writer.push_slices(l, r, d, self_join.is_some())?;
                writer.flush()
            })
        };
        // The collecting count pass in parts, each part's pairs brought back while the later parts
        // run; the slots from a part whose pairs did not all fit its buffers on (`rest`) take the
        // passes below.
        let collect_capacity = slots.len().saturating_mul(COLLECT_PAIRS_PER_ROW).min(output_pairs(budget) as usize);
        let parts = collect_parts(
            slots.clone(),
            join.right_len as usize,
            params.dim as usize,
            join.indexed(),
            self_join.is_some(),
        );
        let rest = if parts.len() > 1 {
            let done = self.collect_in_parts(params, &parts, inputs, collect_capacity, &emit_pairs, sink, stats)?;
            parts.get(done).map_or(slots.end, |p| p.start)..slots.end
        } else {
            slots
        };
        let first_slot = rest.start;
        let rest_capacity = rest.len().saturating_mul(COLLECT_PAIRS_PER_ROW).min(output_pairs(budget) as usize);
        let mut pass = PassBuffers::new(&self.device, rest.len().clamp(1, MAX_PASS_ROWS), 0)?;
        pass.size_outputs(&self.device, rest_capacity)?;
        let counts = if rest.is_empty() {
            Vec::new()
        } else {
            self.count_pass(params, rest, inputs, &mut pass, PassKind::CountAndCollect, stats)?
        };
        let collected = self.device.stream.clone_dtoh(&pass.collected).map_err(copy_failed)?[0];
        let collected_path = collected <= rest_capacity as u64;
        let batches: Vec<ResultBatch> = if collected_path {
            collected_batches(collected)
        } else {
            // Each pipeline stream holds a batch's outputs: a third of the result quarter each.
            let most = (output_pairs(budget) / PIPELINE_STREAMS as u64).min(RESULT_BATCH_PAIRS);
            pass.size_outputs(&self.device, 0)?;
            write_batches(&counts, most)
                .0
                .into_iter()
                .map(|(begin, end, pairs)| ResultBatch::Written { slots: first_slot + begin..first_slot + end, pairs })
                .collect()
        };
        let largest = batches.iter().map(ResultBatch::pairs).max().unwrap_or(0).max(1) as usize;
        // Collected pairs come back through two halves of the host buffers, each batch's copy
        // overlapping the emission of the one before; write batches through a part per stream.
        let mut results = host_results(&self.device, largest * if collected_path { 2 } else { PIPELINE_STREAMS })?;
        if parts.len() == 1 {
            sink.start(batches.len() as u64);
        }

        let mut times = PassTimes::default();
        let outcome = if collected_path {
            self.download_collected(&pass, &batches, &mut results, &emit_pairs, sink, &mut times)
        } else {
            let written = WrittenBatches { batches: &batches, counts: &counts, first_slot, largest };
            self.download_written(join, &written, &mut results, &emit_pairs, sink, &mut times, stats)
        }
        .and_then(|()| {
            let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
            write_own_pairs(request, part, &mut writer)?;
            Ok(writer.flush()?)
        });
        // No copy may still be writing into the host buffers when they are released, nor a pass
        // reading the inputs when they are freed (an early return above, e.g. a cancelled query,
        // can leave some in flight).
        self.device.stream.synchronize().map_err(copy_failed)?;
        if !collected_path {
            for lane in self.device.pipeline_streams()? {
                lane.synchronize().map_err(copy_failed)?;
            }
        }
        stats.transfer_time += times.transfer;
        stats.kernel_time += times.kernel;
        stats.emit_time += times.emit;
        outcome
    }

    /// The count pass's collected pairs, downloaded in `batches` through two halves of `results`,
    /// each batch's copy overlapping the emission of the one before.
    fn download_collected(
        &self,
        pass: &PassBuffers,
        batches: &[ResultBatch],
        results: &mut HostResults,
        emit_pairs: &(dyn Fn(DownloadedPairs) -> Result<()> + Sync),
        sink: &dyn ResultSink,
        times: &mut PassTimes,
    ) -> RunResult<()> {
        let stream = &self.device.stream;
        let stored = |batch: &ResultBatch| match batch {
            ResultBatch::Collected(pairs) => Some(pairs.start as usize..pairs.end as usize),
            ResultBatch::Written { .. } => None,
        };
        let mut halves = results.parts::<2>()?;
        if let Some(pairs) = batches.first().and_then(stored) {
            halves[0].start_download(stream, pass, true, pairs)?;
        }
        for (i, batch) in batches.iter().enumerate() {
            let copying = Instant::now();
            stream.synchronize().map_err(copy_failed)?; // batch i is in half i % 2
            times.transfer += copying.elapsed();
            let [even, odd] = &mut halves;
            let (current, next) = if i % 2 == 0 { (even, odd) } else { (odd, even) };
            if let Some(pairs) = batches.get(i + 1).and_then(stored) {
                next.start_download(stream, pass, true, pairs)?;
            }
            let emitting = Instant::now();
            emit_pairs(current.pairs(batch.pairs() as usize, true))?;
            times.emit += emitting.elapsed();
            sink.advance(1);
        }
        Ok(())
    }

    /// Write passes take turns on PIPELINE_STREAMS streams, each with output buffers and a part
    /// of `results` of its own: batch i is queued (offsets, kernel, copy to the host) on stream
    /// i mod 3 as soon as the host has emitted batch i − 3 from that stream's part, so while the
    /// host emits one batch the next one's copy and the one after's kernel run (Gowanlock &
    /// Karsin, GPU-Join, §3.2.2). Emission stays in batch order.
    #[allow(clippy::too_many_arguments)]
    fn download_written(
        &self,
        join: &DeviceJoin,
        written: &WrittenBatches,
        results: &mut HostResults,
        emit_pairs: &(dyn Fn(DownloadedPairs) -> Result<()> + Sync),
        sink: &dyn ResultSink,
        times: &mut PassTimes,
        stats: &mut RunStats,
    ) -> RunResult<()> {
        let WrittenBatches { batches, counts, first_slot, largest } = *written;
        let (params, inputs) = (&join.params, join.inputs());
        let streams = self.device.pipeline_streams()?;
        let slots_most = batches
            .iter()
            .map(|b| if let ResultBatch::Written { slots, .. } = b { slots.len() } else { 0 })
            .max()
            .unwrap_or(1);
        let mut lanes = Vec::with_capacity(PIPELINE_STREAMS);
        for _ in 0..PIPELINE_STREAMS {
            let mut lane = PassBuffers::new(&self.device, slots_most, 0)?;
            lane.size_outputs(&self.device, largest)?;
            lane.offsets = zeroed::<u64>(&self.device.stream, slots_most.max(1))?;
            lanes.push(lane);
        }
        let mut parts = results.parts::<PIPELINE_STREAMS>()?;
        // Queues batch `i` on its stream; the events around its kernel time it.
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let queue = |i: usize, lane: &mut PassBuffers, part: &mut HostPairs| -> RunResult<[CudaEvent; 2]> {
            let ResultBatch::Written { slots, pairs } = &batches[i] else { unreachable!("write batches only") };
            let stream = &streams[i % PIPELINE_STREAMS];
            let offsets = exclusive_offsets(&counts[slots.start - first_slot..slots.end - first_slot]);
            stream
                .memcpy_htod(&offsets[..slots.len()], &mut lane.offsets.slice_mut(0..slots.len()))
                .map_err(copy_failed)?;
            let started = stream.record_event(timing).map_err(copy_failed)?;
            let slots = slots.start as u32..slots.end as u32;
            launch_join_pass(&self.device, stream, params, slots, inputs, lane, PassKind::Write)?;
            let written = stream.record_event(timing).map_err(copy_failed)?;
            part.start_download(stream, lane, true, 0..*pairs as usize)?;
            Ok([started, written])
        };
        let mut in_flight = Vec::with_capacity(batches.len());
        for i in 0..batches.len().min(PIPELINE_STREAMS) {
            in_flight.push(queue(i, &mut lanes[i], &mut parts[i])?);
        }
        for i in 0..batches.len() {
            let lane = i % PIPELINE_STREAMS;
            let (waited, ran) = finish_queued(&streams[lane], &in_flight[i]).map_err(copy_failed)?;
            (times.transfer, times.kernel) = (times.transfer + waited, times.kernel + ran);
            stats.write_passes += 1;
            let emitting = Instant::now();
            emit_pairs(parts[lane].pairs(batches[i].pairs() as usize, true))?;
            times.emit += emitting.elapsed();
            sink.advance(1);
            if i + PIPELINE_STREAMS < batches.len() {
                in_flight.push(queue(i + PIPELINE_STREAMS, &mut lanes[lane], &mut parts[lane])?);
            }
        }
        Ok(())
    }

    /// The collecting count pass over `parts`, all queued at once, each part with buffers of its
    /// own sized for its share of `capacity` pairs; once a part's kernel is done its pairs are
    /// copied back on a pipeline stream and emitted while the later parts run (GPU-Join's overlap
    /// of result transfers with the kernels, Gowanlock & Karsin, §3.2.2). Buffers of its own,
    /// because cudarc orders a copy from a buffer after every write queued to it, and a write
    /// after every copy from it: in one shared buffer each part's copy would wait for the last
    /// part's kernel. Returns the index of the first part whose pairs did not all fit its
    /// buffers (`parts.len()`: none did not) — its slots and the later parts' are the caller's —
    /// or the emission's error.
    #[allow(clippy::too_many_arguments)]
    fn collect_in_parts(
        &self,
        params: &JoinParams,
        parts: &[Range<usize>],
        inputs: JoinInputs,
        capacity: usize,
        emit: &(dyn Fn(DownloadedPairs) -> Result<()> + Sync),
        sink: &dyn ResultSink,
        stats: &mut RunStats,
    ) -> RunResult<usize> {
        let stream = &self.device.stream;
        let copies = &self.device.pipeline_streams()?[0];
        let slots: usize = parts.iter().map(|p| p.len()).sum();
        let mut buffers = Vec::with_capacity(parts.len());
        for part in parts {
            let mut pass = PassBuffers::new(&self.device, part.len(), 0)?;
            pass.size_outputs(&self.device, (capacity as u128 * part.len() as u128 / slots as u128) as usize)?;
            buffers.push(pass);
        }
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let started = stream.record_event(timing).map_err(copy_failed)?;
        let mut done = Vec::with_capacity(parts.len());
        for (part, pass) in parts.iter().zip(&mut buffers) {
            let range = part.start as u32..part.end as u32;
            launch_join_pass(&self.device, stream, params, range, inputs, pass, PassKind::CountAndCollect)?;
            done.push(stream.record_event(timing).map_err(copy_failed)?);
        }
        stats.count_passes += 1;
        sink.start(parts.len() as u64);
        let mut results = host_results(&self.device, 2 * RESULT_BATCH_PAIRS as usize)?;
        let mut halves = results.parts::<2>()?;
        let (mut waited, mut emitting) = (Duration::ZERO, Duration::ZERO);
        let outcome = (|| -> RunResult<usize> {
            for (i, pass) in buffers.iter().enumerate() {
                let waiting = Instant::now();
                done[i].synchronize().map_err(|e| GpuError::Device(format!("GPU join pass failed: {e}")))?;
                let collected = copies.clone_dtoh(&pass.collected).map_err(copy_failed)?[0];
                waited += waiting.elapsed();
                if collected > pass.out_left.len() as u64 {
                    return Ok(i);
                }
                let batches: Vec<Range<usize>> = (0..collected as usize)
                    .step_by(RESULT_BATCH_PAIRS as usize)
                    .map(|at| at..(at + RESULT_BATCH_PAIRS as usize).min(collected as usize))
                    .collect();
                if let Some(first) = batches.first() {
                    halves[0].start_download(copies, pass, true, first.clone())?;
                }
                for (j, batch) in batches.iter().enumerate() {
                    let waiting = Instant::now();
                    copies.synchronize().map_err(copy_failed)?; // batch j is in half j % 2
                    waited += waiting.elapsed();
                    let [even, odd] = &mut halves;
                    let (current, next) = if j % 2 == 0 { (even, odd) } else { (odd, even) };
                    if let Some(following) = batches.get(j + 1) {
                        next.start_download(copies, pass, true, following.clone())?;
                    }
                    let at = Instant::now();
                    let sent = emit(current.pairs(batch.len(), true));
                    emitting += at.elapsed();
                    sent?;
                }
                sink.advance(1);
            }
            Ok(parts.len())
        })();
        // No kernel may still be writing into the buffers, nor a copy into the host's, when they
        // are released (an early return above leaves the later parts running).
        stream.synchronize().map_err(copy_failed)?;
        copies.synchronize().map_err(copy_failed)?;
        if let Some(last) = done.last() {
            stats.kernel_time += Duration::from_secs_f32(started.elapsed_ms(last).map_err(copy_failed)? / 1e3);
        }
        stats.transfer_time += waited;
        stats.emit_time += emitting;
        outcome
    }
}
