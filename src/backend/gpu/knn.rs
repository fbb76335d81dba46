//! kNN on the GPU: sample radii, count passes with candidate slots, settle, write passes, rank.

use std::time::{Duration, Instant};

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::gpu::knn_plan::KnnPlan;
use crate::backend::gpu::sides::subset_side;
use crate::backend::gpu::{GpuBackend, MAX_PASS_ROWS, RunResult, copy_failed};
use crate::backend::plan::topk::{Neighbour, k_smallest};
use crate::backend::{KnnRequest, ResultSink, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{JoinInputs, PassBuffers};
use crate::cuda::download::{KEPT_RANKED, host_ranked, host_results};
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{KNN_LEVELS, KNN_RANK_SLOTS, KNN_SELECT_SLOTS_K, PassKind, join_pass, rank_slots};
use crate::op::Metric;

impl GpuBackend {
    /// The count pass over left slots `0..slots`, in launches of at most MAX_PASS_ROWS slots:
    /// result pairs (kNN: rows within the radius) per left slot. `kind` Count or CountAndCollect.
    pub(super) fn count_pass(
        &self,
        params: &JoinParams,
        slots: std::ops::Range<usize>,
        inputs: JoinInputs,
        pass: &mut PassBuffers,
        kind: PassKind,
        stats: &mut RunStats,
    ) -> Result<Vec<u32>, GpuError> {
        let stream = &self.device.stream;
        let mut counts = Vec::with_capacity(slots.len());
        stats.count_passes += 1;
        for begin in slots.clone().step_by(MAX_PASS_ROWS) {
            let end = (begin + MAX_PASS_ROWS).min(slots.end);
            stream.memset_zeros(&mut pass.counts).map_err(copy_failed)?;
            let counting = Instant::now();
            join_pass(&self.device, params, begin as u32..end as u32, inputs, pass, kind)?;
            stats.kernel_time += counting.elapsed();
            let downloading = Instant::now();
            counts.extend(stream.clone_dtoh(&pass.counts.slice(0..end - begin)).map_err(copy_failed)?);
            stats.transfer_time += downloading.elapsed();
        }
        Ok(counts)
    }

    /// kNN as a range query with a radius per query: radii from the sampled distances
    /// (knn_sample_radius), a count pass of brute_join with those radii that also keeps each
    /// query's candidates in a slot when slots are small, the next radius for any query short of
    /// k rows (the last level, +∞, takes every row), write passes for the queries whose candidates
    /// are not all in their slot, and an exact top-k of each query's rows on the host. See
    /// kernels/knn.cu for why no neighbour is lost.
    pub(super) fn gpu_knn(&self, request: &KnnRequest, sink: &dyn ResultSink, budget: usize) -> RunResult<RunStats> {
        let k = request.k.min(request.base.len());
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if k == 0 || request.queries.is_empty() {
            return Ok(stats);
        }
        // Compile the modules now (once per process) so NVRTC stays out of the run's times.
        self.device.function(Kernel::KnnSampleRadius)?;
        self.device.function(Kernel::BruteJoin)?;
        let plan = self.knn_plan(request, k, budget, &mut stats)?;
        let probe = Instant::now();
        let first_capacity = knn_slot_capacity(k, plan.n, plan.sample_len, plan.rank, plan.nq, budget);
        // The k nearest of the queries ranked from slots (`in_slots`), k a query in query order
        // (every query ends with at least k ≤ n candidates): in page-locked memory the device
        // keeps for the next query where they fit it (host_ranked), which the first pass's
        // ranking is copied into directly. A run without slots has no table and takes none.
        let table = if first_capacity > 0 { plan.nq * k } else { 0 };
        let mut kept_table =
            if (1..=KEPT_RANKED).contains(&table) { Some(host_ranked(&self.device, table)?) } else { None };
        let mut own_table =
            if kept_table.is_none() { (vec![0f64; table], vec![0u32; table]) } else { (Vec::new(), Vec::new()) };
        let (nearest_distance, nearest_position): (&mut [f64], &mut [u32]) = match &mut kept_table {
            Some(kept) => kept.table(table)?,
            None => (&mut own_table.0, &mut own_table.1),
        };
        let counted = self.knn_count_passes(&plan, first_capacity, nearest_distance, nearest_position, &mut stats)?;
        self.knn_write_passes(
            &plan,
            counted,
            first_capacity,
            nearest_distance,
            nearest_position,
            sink,
            budget,
            &mut stats,
        )?;
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }

    /// Count passes until every query has at least k rows within its radius, each query's
    /// candidates kept in a slot where slots are small and ranked into `nearest_*` (k a query, in
    /// query order): which queries were ranked from slots, and which need a write pass.
    fn knn_count_passes(
        &self,
        plan: &KnnPlan,
        first_capacity: u32,
        nearest_distance: &mut [f64],
        nearest_position: &mut [u32],
        stats: &mut RunStats,
    ) -> Result<Counted, GpuError> {
        let KnnPlan { k, dim, n, nq, metric, tc, sample_len, rank, .. } = *plan;
        let params = plan.params;
        let (base_buffers, query_buffers) = (&plan.base_side.side, &plan.query_side.side);
        let stream = &self.device.stream;
        let mut pass = PassBuffers::new(&self.device, nq.min(MAX_PASS_ROWS), nq)?;
        // Each count pass also stores the candidates of its queries in slots of their own while
        // the slots are small (knn_slot_capacity): a query found with at least k and at most a
        // slot of candidates is then ranked from its slot, on the device where slots are at most
        // KNN_RANK_SLOTS long (k entries a query come back instead of whole slots: P1 k = 10,
        // 1.2 MB instead of 154 MB, docs/design.md#gpu-knn), and only the others need a write pass.
        let slot_values = nq * first_capacity as usize;
        pass.size_outputs(&self.device, slot_values)?;
        let ranked_on_device = first_capacity > 0 && first_capacity as usize <= KNN_RANK_SLOTS;
        // Count passes until every query has at least k rows within its radius: the first over
        // every query, each later one over the queries still short of k (a side of their own,
        // gathered on the device: a pass costs the whole base per query row, and on P1 a few
        // dozen of 10,000 queries need a second radius) and, where the slots are ranked on the
        // device, those that overflowed the first pass's slots: the later passes' few queries
        // share the same buffers in longer slots (P2 at k = 10: 204 queries in slots of 4,096
        // instead of a write pass, docs/design.md#gpu-knn). A query's level only rises, and level
        // KNN_LEVELS (+∞) counts all n ≥ k rows, so this ends. A count depends only on the exact
        // distances (the filter passes every row within the radius), so a later pass or the
        // write pass re-finds it exactly.
        // The share of base rows within a radius of `level`: about rank·4^level of the sample's
        // s rows, and every row at the last level (+∞).
        let expected_share = |level: usize| match level {
            KNN_LEVELS.. => 1.0,
            _ => (rank as f64 * 4f64.powi(level as i32) / sample_len as f64).min(1.0),
        };
        let mut levels = vec![0usize; nq];
        let mut counts = vec![0u32; nq];
        let mut in_slots = vec![false; nq];
        // Queries for the write passes, at their final levels.
        let mut rest: Vec<u32> = Vec::new();
        let mut pending: Vec<u32> = (0..nq as u32).collect();
        let mut subset_buffers = None;
        let mut capacity = first_capacity;
        let (mut transfer, mut kernel, mut emit) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut first_pass = true;
        // The first pass keeps the filter's scores in the slots where brute_join_tc filters f16 rows
        // under L2 or L2² and the slots are selected from (k ≤ 32): knn_settle_slots then checks
        // exactly the few pairs that can be among the k nearest instead of all that pass the
        // filter (P1: ~450 a query).
        let scores = ranked_on_device
            && tc.is_some()
            && !plan.byte_rows
            && matches!(metric, Metric::L2 | Metric::L2Squared)
            && k <= KNN_SELECT_SLOTS_K;
        while !pending.is_empty() {
            let (thresholds, limits) = plan.row_radii(pending.iter().map(|&q| q as usize), &levels);
            stream
                .memcpy_htod(&thresholds, &mut pass.row_threshold.slice_mut(0..pending.len()))
                .map_err(copy_failed)?;
            stream.memcpy_htod(&limits, &mut pass.row_limit.slice_mut(0..pending.len())).map_err(copy_failed)?;
            let side = subset_buffers.as_ref().unwrap_or(query_buffers);
            // The pass's densest radius sets brute_join_tc's runs and queue.
            let expected_share = pending.iter().map(|&q| expected_share(levels[q as usize])).fold(0.0, f64::max);
            let inputs = JoinInputs {
                left: side,
                right: base_buffers,
                right_len: n as u32,
                grid: None,
                directory: None,
                expected_share,
            };
            let pass_params = JoinParams { slot_capacity: capacity, ..params };
            let kind = if first_pass && scores { PassKind::Scores { k: k as u32 } } else { PassKind::Count };
            let pending_counts = self.count_pass(&pass_params, 0..pending.len(), inputs, &mut pass, kind, stats)?;
            // Candidates of the pass's queries ranked from its slots (0: not ranked from them).
            let mut slot_len = vec![0u32; pending.len()];
            let mut next = Vec::new();
            for (i, (&q, &c)) in pending.iter().zip(&pending_counts).enumerate() {
                counts[q as usize] = c;
                if (c as usize) < k {
                    if levels[q as usize] >= KNN_LEVELS {
                        return Err(GpuError::Device(format!(
                            "query {q} has {c} of {n} base rows within an infinite radius"
                        )));
                    }
                    levels[q as usize] += 1;
                    next.push(q);
                } else if c <= capacity {
                    slot_len[i] = c;
                } else if first_pass && ranked_on_device && (scores || c as usize <= KNN_RANK_SLOTS) {
                    // An overflowed scores slot's count is the filter's: the next pass counts exactly.
                    next.push(q);
                } else {
                    rest.push(q);
                }
            }
            if slot_len.iter().any(|&len| len > 0) {
                if first_pass && ranked_on_device {
                    // The first pass's queries are all of them, in order: ranked into the table.
                    let ranking = Instant::now();
                    rank_slots(
                        &self.device,
                        &pass,
                        capacity as usize,
                        k,
                        &slot_len,
                        nearest_distance,
                        nearest_position,
                    )?;
                    kernel += ranking.elapsed();
                } else {
                    let ranked = if ranked_on_device {
                        let ranking = Instant::now();
                        let mut ranked = (vec![0f64; pending.len() * k], vec![0u32; pending.len() * k]);
                        rank_slots(&self.device, &pass, capacity as usize, k, &slot_len, &mut ranked.0, &mut ranked.1)?;
                        kernel += ranking.elapsed();
                        ranked
                    } else {
                        // Slots too long to sort on the device: copied back and ranked here.
                        let (ranked, copying, ranking) =
                            self.rank_slots_on_host(&pass, capacity as usize, k, &slot_len)?;
                        (transfer, emit) = (transfer + copying, emit + ranking);
                        ranked
                    };
                    for (i, &q) in pending.iter().enumerate().filter(|&(i, _)| slot_len[i] > 0) {
                        let (to, from) = (q as usize * k..(q as usize + 1) * k, i * k..(i + 1) * k);
                        nearest_distance[to.clone()].copy_from_slice(&ranked.0[from.clone()]);
                        nearest_position[to].copy_from_slice(&ranked.1[from]);
                    }
                }
                pending
                    .iter()
                    .zip(&slot_len)
                    .filter(|&(_, &len)| len > 0)
                    .for_each(|(&q, _)| in_slots[q as usize] = true);
            }
            first_pass = false;
            // The next pass's slots, where ranked on the device: as long as the buffers allow for
            // its fewer queries, at most KNN_RANK_SLOTS.
            capacity = if ranked_on_device && !next.is_empty() {
                (slot_values / next.len()).min(KNN_RANK_SLOTS) as u32
            } else {
                0
            };
            subset_buffers =
                if next.is_empty() { None } else { Some(subset_side(&self.device, query_buffers, &next, dim)?) };
            pending = next;
        }
        Ok(Counted { levels, counts, in_slots, rest, transfer, kernel, emit })
    }

    /// The `k` nearest of each query's slot of `capacity` (the first `slot_len[i]` entries of
    /// slot i; none where 0), copied back and ranked on the host, k a query in slot order; and
    /// the time the copy and the ranking took.
    fn rank_slots_on_host(
        &self,
        pass: &PassBuffers,
        capacity: usize,
        k: usize,
        slot_len: &[u32],
    ) -> Result<((Vec<f64>, Vec<u32>), Duration, Duration), GpuError> {
        let copying = Instant::now();
        let slots = slot_len.len();
        let mut results = host_results(&self.device, slots * capacity)?;
        let (_, positions, distances) = results.download(&self.device.stream, pass, false, 0..slots * capacity)?;
        let copied = copying.elapsed();
        let ranking = Instant::now();
        let (mut nearest, mut at) = (vec![0f64; slots * k], vec![0u32; slots * k]);
        nearest
            .par_chunks_mut(k)
            .zip(at.par_chunks_mut(k))
            .zip(slot_len)
            .enumerate()
            .filter(|&(_, (_, &len))| len > 0)
            .for_each(|(i, ((nearest, at), &len))| {
                let all = (i * capacity..i * capacity + len as usize)
                    .map(|j| Neighbour { distance: distances[j], position: positions[j] })
                    .collect();
                for (j, neighbour) in k_smallest(all, k).into_iter().enumerate() {
                    (nearest[j], at[j]) = (neighbour.distance, neighbour.position);
                }
            });
        Ok(((nearest, at), copied, ranking.elapsed()))
    }
}

/// What the count passes leave for the write passes.
pub(super) struct Counted {
    /// Each query's final radius level.
    pub(super) levels: Vec<usize>,
    /// Each query's rows within its final radius.
    pub(super) counts: Vec<u32>,
    /// The queries ranked from their slots.
    pub(super) in_slots: Vec<bool>,
    /// The queries the write passes cover.
    pub(super) rest: Vec<u32>,
    pub(super) transfer: Duration,
    pub(super) kernel: Duration,
    pub(super) emit: Duration,
}

/// Most values kNN's candidate slots take on the device when they are copied back to be ranked on
/// the host (12 bytes each; slots of more than KNN_RANK_SLOTS): for larger k the slots would cost
/// more to copy than the write pass they save. Slots ranked on the device return k entries a query
/// and are bounded by the memory budget alone.
pub(super) const KNN_SLOT_VALUES: usize = 1 << 24;

/// Candidates kept per query in the first count pass (0: none, every query gets a write pass).
/// The first radius is the sample's `rank`-th smallest distance, so a query's count is about
/// Gamma(rank)·n/sample_len (exactly k when the sample is the whole base, ties aside): the mean
/// plus 4 of its standard deviations (mean/√rank) and 64 leave the slot too small for about one
/// query in 60 at rank 1 (e⁻⁴·⁰⁶ for the exponential count), fewer at larger ranks; those queries
/// take the next count pass in longer slots where these are ranked on the device, else a write
/// pass. 0 when `queries` slots exceed a quarter of the memory `budget` (12
/// bytes a value), or KNN_SLOT_VALUES where they would be copied back, or one count pass.
pub(super) fn knn_slot_capacity(
    k: usize,
    n: usize,
    sample_len: usize,
    rank: u32,
    queries: usize,
    budget: usize,
) -> u32 {
    let expected = if sample_len >= n { k as f64 } else { rank as f64 * n as f64 / sample_len as f64 };
    let capacity = (expected * (1.0 + 4.0 / (rank.max(1) as f64).sqrt()) + 64.0).ceil() as usize;
    let copied_limit = if capacity > KNN_RANK_SLOTS { KNN_SLOT_VALUES } else { usize::MAX };
    if queries > MAX_PASS_ROWS || queries.saturating_mul(capacity) > copied_limit.min(budget / 4 / 12) {
        return 0;
    }
    capacity as u32
}

#[cfg(test)]
mod tests {
    use super::knn_slot_capacity;
    use crate::backend::gpu::MAX_PASS_ROWS;

    #[test]
    fn knn_slots_fit_the_expected_count_with_room() {
        // P1, k = 10: rank 1 of 4,096 over 10⁶ rows, ~244 candidates per query → 5·244 + 64.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, 10_000, 80 << 30), 1285);
        // The whole base as the sample: k itself, plus room for ties.
        assert_eq!(knn_slot_capacity(10, 3000, 3000, 10, 100, 80 << 30), 87);
        // Rank 2 (P1, k = 10; docs/design.md#gpu-knn): 488 expected, 1,934 a slot, 1.9·10⁷ values ranked on the
        // device, so within the budget alone.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 2, 10_000, 80 << 30), 1934);
        // Large k (P1, k = 1,000: rank 9, slots beyond KNN_RANK_SLOTS to copy) or too many
        // queries: no slots, write passes instead.
        assert_eq!(knn_slot_capacity(1000, 1_000_000, 4096, 9, 10_000, 80 << 30), 0);
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, MAX_PASS_ROWS + 1, 80 << 30), 0);
        // P1's 1.3·10⁷ slot values take 154 MB: not within a quarter of a 256 MiB budget.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, 10_000, 256 << 20), 0);
    }
}
