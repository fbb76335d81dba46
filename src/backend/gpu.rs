//! The GPU backend: ε-joins and range queries with the same strategy choice, grid and f32 filter
//! margins as the CPU backend, run by the kernels of kernels/sim_join.cu with a count pass that
//! collects the pairs and, when they do not fit, write passes in batches sized so the pairs of one
//! batch fit the device; kNN as a range query with a sampled radius per query (kernels/knn.cu).
//! Exact distances are the f64 formulas of common.cuh, compiled without FMA contraction, so
//! answers equal the CPU's.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::common::{DataFusionError, Result, resources_err};

use super::cpu::{FilterLimit, filter_space, gather, lower_corner, plan_join, score_threshold};
use super::exact::{ExactCheck, write_self_pairs};
use super::topk::{Neighbour, Ranked, k_smallest, send_ranked};
use super::{Backend, JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats, tiles};
use crate::gpu::grid::{DeviceGrid, build_grid};
use crate::gpu::kernels::KernelModule;
use crate::gpu::launch::{
    ByteRows, DownloadedPairs, GridBuffers, HostPairs, JoinInputs, JoinParams, KEPT_RANKED, KNN_LEVELS, KNN_RANK_SLOTS,
    KNN_SAMPLE, KNN_SELECT_SLOTS_K, KnnSample, PassBuffers, PassKind, RankedLists, SideBuffers, available_memory,
    byte_row_words, byte_rows, byte_sides, filter_max_abs, filter_rows, gather_rows, host_ranked, host_results,
    identity_order, join_pass, launch_join_pass, pack_half_rows, rank_lists_most_k, rank_slots, sample_byte_rows,
    sample_half_rows, sample_radius_pass, sample_rows, start_rank_lists, tc_row_words, upload,
};
use crate::gpu::{DerivedSide, GpuDevice, PIPELINE_STREAMS, ResidentKey};
use crate::index::JoinStrategy;
use crate::op::{Metric, dot};
use crate::vectors::Vectors;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use rayon::prelude::*;

/// Most result pairs one write pass produces (16 bytes each: 512 MiB of device memory).
const MAX_BATCH_PAIRS: u64 = 1 << 25;
/// Most left rows one pass covers (its counts and offsets hold one value per left row).
const MAX_PASS_ROWS: usize = 65_535 * 128;

/// ε-joins and range queries on a CUDA GPU.
#[derive(Debug)]
pub struct GpuBackend {
    device: Arc<GpuDevice>,
    /// Bytes of device memory a run may use (0: all that is available).
    memory_limit: usize,
}

impl GpuBackend {
    /// The backend on the process's shared device, using at most `memory_limit` bytes of its
    /// memory (0: all that is available).
    pub fn new(device: Arc<GpuDevice>, memory_limit: usize) -> Self {
        Self { device, memory_limit }
    }

    /// Device memory this run may use: what is free (with what the memory pool keeps for reuse),
    /// within the limit.
    fn memory_budget(&self) -> Result<usize> {
        let available = available_memory(&self.device).map_err(DataFusionError::Execution)?;
        Ok(if self.memory_limit > 0 { available.min(self.memory_limit) } else { available })
    }
}

/// Device bytes per input row at most, on either side: its f32 filter row, f16 row (tensor
/// cores) and f64 exact row (14 bytes a dimension, and up to 14 of the f16 row's padding), and 64
/// for its position, norms, per-row pass buffers (counts, offsets, radii) and grid cell. When both sides take more than half of the memory budget, the inputs
/// run as tiles of a quarter of it each; the other half holds the result buffers (a quarter for
/// the pairs a pass collects or writes, [`output_pairs`]) and the grid.
fn device_row_bytes(dim: usize) -> usize {
    14 * dim + 78
}

impl Backend for GpuBackend {
    fn name(&self) -> String {
        match self.memory_limit {
            0 => format!("gpu({})", self.device.arch),
            limit => format!("gpu({}, memory_limit={})", self.device.arch, format_size(limit)),
        }
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let budget = self.memory_budget()?;
        let run = |tile: &JoinRequest, sink: &dyn ResultSink| {
            self.gpu_join(tile, sink, budget).map_err(|e| DataFusionError::Execution(format!("GPU join: {e}")))?
        };
        let rows = request.left.len() + if request.self_join.is_some() { 0 } else { request.right.len() };
        let row_bytes = device_row_bytes(request.left.dim);
        if rows.saturating_mul(row_bytes) <= budget / 2 {
            return run(request, sink);
        }
        tiles::tiled_join(request, sink, tile_rows(budget, request.left.dim, self.memory_limit, "GPU join")?, run)
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let budget = self.memory_budget()?;
        let run = |tile: &KnnRequest, sink: &dyn ResultSink| {
            self.gpu_knn(tile, sink, budget).map_err(|e| DataFusionError::Execution(format!("GPU kNN: {e}")))?
        };
        let row_bytes = device_row_bytes(request.base.dim);
        if (request.base.len() + request.queries.len()).saturating_mul(row_bytes) <= budget / 2 {
            return run(request, sink);
        }
        let tile_rows = tile_rows(budget, request.base.dim, self.memory_limit, "GPU kNN")?;
        tiles::tiled_knn(request, sink, tile_rows, tile_rows, run)
    }
}

/// Fewest rows per tile a run accepts: smaller tiles would turn a join into more tile pairs (each a
/// join with its own uploads and launches) than any result is worth waiting for.
const MIN_TILE_ROWS: usize = 256;

/// Rows of `dim` dimensions per input tile within `budget` (a quarter of it per tile), or the
/// error that names the limit (`memory_limit`, 0: none) when that is fewer than MIN_TILE_ROWS.
fn tile_rows(budget: usize, dim: usize, memory_limit: usize, what: &str) -> Result<usize> {
    let row_bytes = device_row_bytes(dim);
    let rows = budget / 4 / row_bytes;
    if rows >= MIN_TILE_ROWS {
        return Ok(rows);
    }
    let needed = format_size((MIN_TILE_ROWS * row_bytes * 4).next_multiple_of(1 << 10));
    match memory_limit {
        0 => resources_err!(
            "{what}: the device has {budget} bytes available, room for {rows} rows of {dim} dimensions per input tile; at least {MIN_TILE_ROWS} need {needed}"
        ),
        limit => resources_err!(
            "{what}: option gpu_memory_limit={} leaves room for {rows} rows of {dim} dimensions per input tile ({row_bytes} bytes a row, a quarter of the limit per tile); at least {MIN_TILE_ROWS} rows need gpu_memory_limit={needed}",
            format_size(limit)
        ),
    }
}

/// Most result pairs (16 bytes each on the device) one pass may collect or write: a quarter of
/// the memory budget (write passes: at most MAX_BATCH_PAIRS of them).
fn output_pairs(budget: usize) -> u64 {
    (budget / 4 / 16).max(1) as u64
}

/// `bytes` as the gpu_memory_limit option takes it: `64M`, `2G`, or a number of bytes.
fn format_size(bytes: usize) -> String {
    match bytes {
        b if b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

impl GpuBackend {
    /// The count pass over left slots `0..slots`, in launches of at most MAX_PASS_ROWS slots:
    /// result pairs (kNN: rows within the radius) per left slot. `kind` Count or CountAndCollect.
    fn count_pass(
        &self,
        params: &JoinParams,
        slots: usize,
        inputs: JoinInputs,
        pass: &mut PassBuffers,
        kind: PassKind,
        stats: &mut RunStats,
    ) -> Result<Vec<u32>, String> {
        let stream = &self.device.stream;
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        let mut counts = Vec::with_capacity(slots);
        stats.count_passes += 1;
        for begin in (0..slots).step_by(MAX_PASS_ROWS) {
            let end = (begin + MAX_PASS_ROWS).min(slots);
            stream.memset_zeros(&mut pass.counts).map_err(copy)?;
            let counting = Instant::now();
            join_pass(&self.device, params, begin as u32..end as u32, inputs, pass, kind)?;
            stats.kernel_time += counting.elapsed();
            let downloading = Instant::now();
            counts.extend(stream.clone_dtoh(&pass.counts.slice(0..end - begin)).map_err(copy)?);
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
    fn gpu_knn(&self, request: &KnnRequest, sink: &dyn ResultSink, budget: usize) -> Result<Result<RunStats>, String> {
        let KnnRequest { base, queries, metric, k } = *request;
        let k = k.min(base.len());
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if k == 0 || queries.is_empty() {
            return Ok(Ok(stats));
        }
        // Compile the modules now (once per process) so NVRTC stays out of the run's times.
        self.device.function(KernelModule::Knn, "knn_sample_radius")?;
        self.device.function(KernelModule::SimJoin, "brute_join")?;
        let start = Instant::now();
        let (dim, n, nq) = (base.dim, base.len(), queries.len());
        let (query_filter, base_filter) = (filter_space(queries, metric), filter_space(base, metric));
        let identity = |n: usize| (0..n as u32).collect::<Vec<u32>>();
        // The GEMM form's filter rows of L2 and L2² are built on the device from the exact rows
        // (device_side); the other filters' here (host_side).
        let sides = |gemm: bool| {
            let origin = filter_origin(metric, gemm, &query_filter, &base_filter, base);
            let (query_host, base_host) = if gemm && metric != Metric::Cosine {
                (device_side(queries, &origin), device_side(base, &origin))
            } else {
                (
                    host_side(queries, &query_filter, identity(nq), &origin, metric, gemm),
                    host_side(base, &base_filter, identity(n), &origin, metric, gemm),
                )
            };
            (query_host, base_host)
        };
        let mut gemm = gemm_metric(metric);
        let (mut query_host, mut base_host) = sides(gemm);
        let uploading = Instant::now();
        // A kept base's side for the GEMM form of L2 and L2² (whose filter centres on the base's
        // mean alone), as an earlier query built it: its filter rows, f16 rows and largest
        // coordinate are not built again (DerivedSide). Likewise a kept query table's side,
        // centred on that kept base's mean, for a service's repeated queries (build_time −0.2 ms
        // on 60,000 × 784, NOTES.md v75).
        let keep_key = resident_key(base).filter(|_| gemm && metric != Metric::Cosine);
        let query_key = resident_key(queries).filter(|_| keep_key.is_some());
        let mut kept = keep_key.as_ref().and_then(|key| self.device.derived_side(key, metric_code(metric), None));
        let mut kept_query = query_key
            .as_ref()
            .zip(keep_key.as_ref())
            .and_then(|(key, base_key)| self.device.derived_side(key, metric_code(metric), Some(base_key)));
        let mut query_built = if kept_query.is_some() { None } else { Some(self.upload(&query_host)?) };
        let mut built = if kept.is_some() { None } else { Some(self.upload(&base_host)?) };
        // A kept side fitted the GEMM form when it was built.
        let fits = |host: &HostSide, built: &Option<SideBuffers>| match built {
            Some(buffers) => self.gemm_fits(&[(host, buffers)]),
            None => Ok(true),
        };
        if gemm && !(fits(&base_host, &built)? && fits(&query_host, &query_built)?) {
            gemm = false;
            (kept, kept_query) = (None, None);
            (query_host, base_host) = sides(false);
            (query_built, built) = (Some(self.upload(&query_host)?), Some(self.upload(&base_host)?));
        }
        stats.transfer_time += uploading.elapsed();
        let extent = if gemm { 0.0 } else { filter_extent(&[&query_host, &base_host]) };
        let uploading = Instant::now();
        let largest_of = |kept: &Option<Arc<DerivedSide>>, built: &Option<SideBuffers>| match (kept, built) {
            (Some(kept), _) => Ok(vec![kept.largest]),
            (None, Some(built)) => self.largest_coordinates(metric, gemm, &[built]),
            (None, None) => Ok(Vec::new()),
        };
        let (query_largest, base_largest) = (largest_of(&kept_query, &query_built)?, largest_of(&kept, &built)?);
        let largest: Vec<f32> = query_largest.iter().chain(&base_largest).copied().collect();
        let tc = self.tensor_core_scale(metric, gemm, &largest);
        let sample_len = knn_sample_len(n, tc.is_some());
        let params = JoinParams {
            dim: dim as u32,
            metric: metric_code(metric),
            per_row: 1,
            ..filter_params(metric, dim, gemm, tc)
        };
        // A kept side serves only at the scale this run's sides allow; else it is built (and kept,
        // where its rows are) at this scale.
        let derive = |kept: Option<Arc<DerivedSide>>,
                      built: Option<SideBuffers>,
                      host: &HostSide,
                      largest: &[f32],
                      key: Option<&ResidentKey>,
                      centre: Option<&ResidentKey>|
         -> Result<(Arc<DerivedSide>, bool), String> {
            if let Some(kept) = kept.filter(|kept| kept.scale_exponent == tc) {
                return Ok((kept, true));
            }
            let side = match built {
                Some(side) => side,
                None => self.upload(host)?,
            };
            let side = self.with_tensor_core_rows(side, &host.exact, dim, tc, metric)?;
            let centred_on = centre.map(Arc::downgrade);
            let derived = Arc::new(DerivedSide {
                metric: metric_code(metric),
                centred_on,
                scale_exponent: tc,
                largest: largest.first().copied().unwrap_or(f32::NAN),
                side,
            });
            if let Some(key) = key.filter(|_| gemm && !largest.is_empty()) {
                self.device.keep_derived_side(key, derived.clone());
            }
            Ok((derived, false))
        };
        let (base_side, reused) = derive(kept, built, &base_host, &base_largest, keep_key.as_ref(), None)?;
        let (query_side, query_reused) =
            derive(kept_query, query_built, &query_host, &query_largest, query_key.as_ref(), keep_key.as_ref())?;
        let (base_buffers, query_buffers) = (&base_side.side, &query_side.side);
        let base_bytes = byte_sides(&self.device, &params, query_buffers, base_buffers).map(|(_, base)| base);
        stats.byte_row_tiles = base_bytes.is_some().into();
        stats.resident_inputs =
            usize::from(query_reused || query_buffers.resident) + usize::from(reused || base_buffers.resident);
        // Where the tensor cores filter, the sample's distances come from them too (NOTES.md v54),
        // but for a sample of the whole base: its rank is then k, and the k-th smallest key, f16's
        // rounding below the k-th distance about half the time, would leave those queries short.
        // On byte rows, from theirs: exact keys on the integer tensor cores.
        let sample = match (tc, base_bytes) {
            (Some(_), Some(base_bytes)) if sample_len < n => {
                sample_byte_rows(&self.device, base_bytes, n, dim, sample_len)?
            }
            (Some(a), _) if sample_len < n => {
                sample_half_rows(&self.device, base_buffers, n, dim, sample_len, a, metric != Metric::InnerProduct)?
            }
            _ => KnnSample::Filter(sample_rows(&self.device, &base_buffers.filter, n, dim, sample_len)?),
        };
        let stream = &self.device.stream;
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        let alloc = |e: cudarc::driver::DriverError| format!("GPU allocation failed: {e}");
        let mut radii_buffer = stream.alloc_zeros::<f64>(nq * KNN_LEVELS).map_err(alloc)?;
        stats.transfer_time += uploading.elapsed();

        let sampling = Instant::now();
        let rank = knn_sample_rank(k, n, sample_len);
        // The sample distances' scratch (a row of KNN_SAMPLE f32 per query of a round) within an
        // eighth of the budget, 16 to 8,192 queries a round (128 MiB).
        let chunk_queries = (budget / 8 / (KNN_SAMPLE * 4)).clamp(16, 8192);
        sample_radius_pass(
            &self.device,
            &params,
            0..nq as u32,
            query_buffers,
            &sample,
            sample_len as u32,
            rank,
            chunk_queries,
            &mut radii_buffer,
        )?;
        stats.kernel_time += sampling.elapsed();
        let radii = stream.clone_dtoh(&radii_buffer).map_err(copy)?;
        drop(radii_buffer);
        let radius = |q: usize, level: usize| match radii.get(q * KNN_LEVELS + level) {
            Some(&r) if level < KNN_LEVELS && !r.is_nan() => r,
            _ => f64::INFINITY,
        };
        stats.build_time = start.elapsed();

        let probe = Instant::now();
        let mut pass = PassBuffers::new(&self.device, nq.min(MAX_PASS_ROWS), nq)?;
        // Each count pass also stores the candidates of its queries in slots of their own while
        // the slots are small (knn_slot_capacity): a query found with at least k and at most a
        // slot of candidates is then ranked from its slot, on the device where slots are at most
        // KNN_RANK_SLOTS long (k entries a query come back instead of whole slots: P1 k = 10,
        // 1.2 MB instead of 154 MB, NOTES.md v32), and only the others need a write pass.
        let first_capacity = knn_slot_capacity(k, n, sample_len, rank, nq, budget);
        let slot_values = nq * first_capacity as usize;
        pass.size_outputs(&self.device, slot_values)?;
        let ranked_on_device = first_capacity > 0 && first_capacity as usize <= KNN_RANK_SLOTS;
        // Count passes until every query has at least k rows within its radius: the first over
        // every query, each later one over the queries still short of k (a side of their own,
        // gathered on the device: a pass costs the whole base per query row, and on P1 a few
        // dozen of 10,000 queries need a second radius) and, where the slots are ranked on the
        // device, those that overflowed the first pass's slots: the later passes' few queries
        // share the same buffers in longer slots (P2 at k = 10: 204 queries in slots of 4,096
        // instead of a write pass, NOTES.md v54). A query's level only rises, and level
        // KNN_LEVELS (+∞) counts all n ≥ k rows, so this ends. A count depends only on the exact
        // distances (the filter passes every row within the radius), so a later pass or the
        // write pass re-finds it exactly.
        // The exact radii and f32 filter limits of `queries` at their levels, in that order.
        let row_radii = |queries: &mut dyn Iterator<Item = usize>, levels: &[usize]| -> (Vec<f64>, Vec<f32>) {
            let thresholds: Vec<f64> = queries.map(|q| radius(q, levels[q])).collect();
            let limits = thresholds.iter().map(|&t| filter_limit(metric, t, dim, extent, gemm)).collect();
            (thresholds, limits)
        };
        // The share of base rows within a radius of `level`: about rank·4^level of the sample's
        // s rows, and every row at the last level (+∞).
        let expected_share = |level: usize| match level {
            KNN_LEVELS.. => 1.0,
            _ => (rank as f64 * 4f64.powi(level as i32) / sample_len as f64).min(1.0),
        };
        let mut levels = vec![0usize; nq];
        let mut counts = vec![0u32; nq];
        // The k nearest of the queries ranked from slots (`in_slots`), k a query in query order
        // (every query ends with at least k ≤ n candidates): in page-locked memory the device
        // keeps for the next query where they fit it (host_ranked), which the first pass's
        // ranking is copied into directly. A run without slots has no table and takes none.
        let table = if first_capacity > 0 { nq * k } else { 0 };
        let mut kept_table =
            if (1..=KEPT_RANKED).contains(&table) { Some(host_ranked(&self.device, table)?) } else { None };
        let mut own_table =
            if kept_table.is_none() { (vec![0f64; table], vec![0u32; table]) } else { (Vec::new(), Vec::new()) };
        let (nearest_distance, nearest_position): (&mut [f64], &mut [u32]) = match &mut kept_table {
            Some(kept) => kept.table(table)?,
            None => (&mut own_table.0, &mut own_table.1),
        };
        let mut in_slots = vec![false; nq];
        // Queries for the write passes, at their final levels.
        let mut rest: Vec<u32> = Vec::new();
        let mut pending: Vec<u32> = identity(nq);
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
            && base_bytes.is_none()
            && matches!(metric, Metric::L2 | Metric::L2Squared)
            && k <= KNN_SELECT_SLOTS_K;
        while !pending.is_empty() {
            let (thresholds, limits) = row_radii(&mut pending.iter().map(|&q| q as usize), &levels);
            stream.memcpy_htod(&thresholds, &mut pass.row_threshold.slice_mut(0..pending.len())).map_err(copy)?;
            stream.memcpy_htod(&limits, &mut pass.row_limit.slice_mut(0..pending.len())).map_err(copy)?;
            let side = subset_buffers.as_ref().unwrap_or(query_buffers);
            // The pass's densest radius sets brute_join_tc's runs and queue.
            let expected_share = pending.iter().map(|&q| expected_share(levels[q as usize])).fold(0.0, f64::max);
            let inputs =
                JoinInputs { left: side, right: base_buffers, right_len: n as u32, grid: None, expected_share };
            let pass_params = JoinParams { slot_capacity: capacity, ..params };
            let kind = if first_pass && scores { PassKind::Scores { k: k as u32 } } else { PassKind::Count };
            let pending_counts = self.count_pass(&pass_params, pending.len(), inputs, &mut pass, kind, &mut stats)?;
            // Candidates of the pass's queries ranked from its slots (0: not ranked from them).
            let mut slot_len = vec![0u32; pending.len()];
            let mut next = Vec::new();
            for (i, (&q, &c)) in pending.iter().zip(&pending_counts).enumerate() {
                counts[q as usize] = c;
                if (c as usize) < k {
                    if levels[q as usize] >= KNN_LEVELS {
                        return Err(format!("query {q} has {c} of {n} base rows within an infinite radius"));
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
                        let copying = Instant::now();
                        let cap = capacity as usize;
                        let mut results = host_results(&self.device, pending.len() * cap)?;
                        let (_, positions, distances) =
                            results.download(stream, &pass, false, 0..pending.len() * cap)?;
                        transfer += copying.elapsed();
                        let ranking = Instant::now();
                        let (mut nearest, mut at) = (vec![0f64; pending.len() * k], vec![0u32; pending.len() * k]);
                        nearest
                            .par_chunks_mut(k)
                            .zip(at.par_chunks_mut(k))
                            .zip(&slot_len)
                            .enumerate()
                            .filter(|&(_, (_, &len))| len > 0)
                            .for_each(|(i, ((nearest, at), &len))| {
                                let all = (i * cap..i * cap + len as usize)
                                    .map(|j| Neighbour { distance: distances[j], position: positions[j] })
                                    .collect();
                                for (j, neighbour) in k_smallest(all, k).into_iter().enumerate() {
                                    (nearest[j], at[j]) = (neighbour.distance, neighbour.position);
                                }
                            });
                        emit += ranking.elapsed();
                        (nearest, at)
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
        drop(pass);
        // Write passes take turns on PIPELINE_STREAMS streams, each with output buffers, the
        // rest's radii and limits, and a part of the host buffers of its own, as the joins' do:
        // batch i is queued on stream i mod 3 once the host is done with batch i − 3's part, so
        // the kernels of the next batches run while the host emits this one (P1 k = 10,000: 23
        // passes, NOTES.md v76, v77).
        let lanes_needed = batches.len().min(PIPELINE_STREAMS);
        let slots_most = batches.iter().map(|&(begin, end, _)| end - begin).max().unwrap_or(1);
        let mut lanes = Vec::with_capacity(lanes_needed);
        let mut ranked_lanes = Vec::with_capacity(lanes_needed);
        if lanes_needed > 0 {
            let (thresholds, limits) = row_radii(&mut rest.iter().map(|&q| q as usize), &levels);
            for _ in 0..lanes_needed {
                let mut lane = PassBuffers::new(&self.device, slots_most, rest.len())?;
                lane.size_outputs(&self.device, capacity)?;
                lane.offsets = stream.alloc_zeros::<u64>(slots_most + 1).map_err(alloc)?;
                stream.memcpy_htod(&thresholds, &mut lane.row_threshold.slice_mut(0..rest.len())).map_err(copy)?;
                stream.memcpy_htod(&limits, &mut lane.row_limit.slice_mut(0..rest.len())).map_err(copy)?;
                lanes.push(lane);
                if lists_on_device {
                    ranked_lanes.push(RankedLists::new(&self.device, slots_most * k)?);
                }
            }
        }
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
        let outcome = (|| -> Result<()> {
            let exec = |e: String| DataFusionError::Execution(e);
            let sync = |e: cudarc::driver::DriverError| DataFusionError::Execution(copy(e));
            // Queries in order: those ranked from slots up to each write batch's query, then it.
            let mut next = 0usize;
            if let Some(results) = results.as_mut() {
                let streams = self.device.pipeline_streams().map_err(exec)?;
                let mut parts = results.parts::<PIPELINE_STREAMS>().map_err(exec)?;
                // Queues batch `i` on its stream: its write pass, the ranking of its lists where
                // that runs on the device, and the copy back; the events around its kernels time
                // them.
                let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let queue = |i: usize,
                             lane: &mut PassBuffers,
                             mut ranked: Option<&mut RankedLists>,
                             part: &mut HostPairs|
                 -> Result<[CudaEvent; 2]> {
                    let (begin, end, total) = batches[i];
                    let stream = &streams[i % PIPELINE_STREAMS];
                    let offsets = &batch_offsets[i];
                    stream.memcpy_htod(offsets, &mut lane.offsets.slice_mut(0..offsets.len())).map_err(sync)?;
                    let started = stream.record_event(timing).map_err(sync)?;
                    let expected_share = total as f64 / ((end - begin) as f64 * n as f64);
                    let inputs = JoinInputs {
                        left: rest_side,
                        right: base_buffers,
                        right_len: n as u32,
                        grid: None,
                        expected_share,
                    };
                    launch_join_pass(
                        &self.device,
                        stream,
                        &params,
                        begin as u32..end as u32,
                        inputs,
                        lane,
                        PassKind::Write,
                    )
                    .map_err(exec)?;
                    if let Some(ranked) = ranked.as_deref_mut() {
                        start_rank_lists(&self.device, stream, lane, end - begin, k, ranked).map_err(exec)?;
                    }
                    let written = stream.record_event(timing).map_err(sync)?;
                    match ranked {
                        Some(ranked) => part.start_download_ranked(stream, ranked, (end - begin) * k).map_err(exec)?,
                        None => part.start_download(stream, lane, false, 0..total as usize).map_err(exec)?,
                    }
                    Ok([started, written])
                };
                let mut in_flight = Vec::with_capacity(batches.len());
                for (i, (lane, part)) in lanes.iter_mut().zip(parts.iter_mut()).enumerate() {
                    in_flight.push(queue(i, lane, ranked_lanes.get_mut(i), part)?);
                }
                for (i, &(begin, end, total)) in batches.iter().enumerate() {
                    let lane = i % PIPELINE_STREAMS;
                    let (waited, ran) = finish_queued(&streams[lane], &in_flight[i]).map_err(sync)?;
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
                        // Each query's rows lie in its own [offset, next offset) range, in no set
                        // order: ranked here (k beyond what the device sorts in a block).
                        let offsets = &batch_offsets[i];
                        let nearest: Vec<Vec<Neighbour>> = (begin..end)
                            .into_par_iter()
                            .map(|i| {
                                let range = offsets[i - begin] as usize..offsets[i - begin + 1] as usize;
                                let all = range
                                    .map(|j| Neighbour { distance: distances[j], position: positions[j] })
                                    .collect();
                                k_smallest(all, k)
                            })
                            .collect();
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
                lane.synchronize().map_err(copy)?;
            }
        }
        stats.probe_time = probe.elapsed();
        stats.transfer_time += transfer;
        stats.kernel_time += kernel;
        stats.emit_time += emit;
        Ok(outcome.map(|()| stats))
    }
}

/// Waits for the write pass queued on `stream` (its kernel between `events`, then its copy to the
/// host): the time waited, and the kernel's own time.
fn finish_queued(
    stream: &CudaStream,
    events: &[CudaEvent; 2],
) -> Result<(Duration, Duration), cudarc::driver::DriverError> {
    let waiting = Instant::now();
    stream.synchronize()?;
    let waited = waiting.elapsed();
    let [started, written] = events;
    Ok((waited, Duration::from_secs_f32(started.elapsed_ms(written)? / 1e3)))
}

/// Host-side rows of one side in slot order, ready to upload.
struct HostSide<'a> {
    filter: Vec<f32>,
    exact: Cow<'a, [f64]>,
    norms: Vec<f64>,
    filter_norms: Vec<f32>,
    filter_sq_norms: Vec<f32>,
    rows: usize,
    /// Slot → position, or `None`: input order, which the device writes itself (P1's 1M-row base
    /// took 1.8 ms to build here and ~1 ms to upload, NOTES.md v49).
    order: Option<Vec<u32>>,
    /// The origin the device builds the filter rows from (`filter`, `filter_norms` and
    /// `filter_sq_norms` are then empty), or `None`: they were built here.
    device_filter: Option<Vec<f64>>,
    /// Set when `exact` is the values of vectors kept across queries, in input order: their
    /// rows stay on the device under it.
    resident: Option<ResidentKey>,
}

/// The key `v`'s rows stay on the device under, if it is kept across queries.
fn resident_key(v: &Vectors) -> Option<ResidentKey> {
    v.resident().map(|mark| mark.clone() as ResidentKey)
}

fn host_side<'a>(
    v: &'a Vectors,
    filter_coords: &[f64],
    order: Vec<u32>,
    origin: &[f64],
    metric: Metric,
    gemm: bool,
) -> HostSide<'a> {
    let dim = v.dim.max(1);
    let mut filter = vec![0f32; order.len() * v.dim];
    filter.par_chunks_mut(dim).zip(order.par_iter()).for_each(|(out, &p)| {
        let row = &filter_coords[p as usize * dim..(p as usize + 1) * dim];
        out.iter_mut().zip(row).zip(origin).for_each(|((o, x), c)| *o = (x - c) as f32);
    });
    // Input order (brute force, kNN): the vectors as they are, no copy, resident when kept.
    let in_input_order = order.len() == v.len() && order.iter().enumerate().all(|(i, &p)| p as usize == i);
    let resident = resident_key(v).filter(|_| in_input_order);
    let exact = if in_input_order { Cow::Borrowed(v.values.as_slice()) } else { Cow::Owned(gather(v, &order)) };
    let norms = if metric == Metric::Cosine {
        order.par_iter().map(|&p| dot(v.row(p as usize), v.row(p as usize))).collect()
    } else {
        vec![0.0]
    };
    // ‖x̃‖² summed in f64 and rounded, ‖x̃‖ its f32 square root: as GemmSide, whose margin covers both.
    let (filter_norms, filter_sq_norms) = if gemm || metric == Metric::InnerProduct {
        let sq: Vec<f32> =
            filter.par_chunks(dim).map(|r| r.iter().map(|&x| x as f64 * x as f64).sum::<f64>() as f32).collect();
        (sq.iter().map(|s| s.sqrt()).collect(), if gemm { sq } else { vec![0.0] })
    } else {
        (vec![0.0], vec![0.0])
    };
    let rows = order.len();
    let order = (!in_input_order).then_some(order);
    HostSide { filter, exact, norms, filter_norms, filter_sq_norms, rows, order, device_filter: None, resident }
}

/// The rows of `v` in input order, their GEMM-form filter rows (centred on `origin`) left to the
/// device (`filter_rows`), which computes them bit for bit as [`host_side`] would: the f32 rows then
/// need neither a pass over the data here nor a copy over the bus. Only where the filter space is
/// the vectors themselves (L2, L2²; cosine's unit vectors are computed here).
fn device_side<'a>(v: &'a Vectors, origin: &[f64]) -> HostSide<'a> {
    HostSide {
        filter: Vec::new(),
        exact: Cow::Borrowed(v.values.as_slice()),
        norms: vec![0.0],
        filter_norms: Vec::new(),
        filter_sq_norms: Vec::new(),
        rows: v.len(),
        order: None,
        device_filter: Some(origin.to_vec()),
        resident: resident_key(v),
    }
}

/// A side's buffers, uploaded in input order, in the slot order of its grid (`order`, slot →
/// position), each freed once gathered (the exact rows unless resident, whose kept copy stays).
/// The per-row buffers are gathered where they hold a value per row (an unused one holds a single
/// value, which a one-row side gathers harmlessly).
fn in_slot_order(
    device: &GpuDevice,
    side: SideBuffers,
    order: cudarc::driver::CudaSlice<u32>,
    dim: usize,
) -> Result<SideBuffers, String> {
    let n = order.len();
    // A grid's sides are never the tensor cores' (gpu_join), so they have no f16 or byte rows to
    // gather.
    let SideBuffers { filter, exact, norms, filter_norms, filter_sq_norms, resident, .. } = side;
    let per_row = |buffer: cudarc::driver::CudaSlice<f32>| {
        if buffer.len() == n { gather_rows(device, &buffer, n, &order, n, 1) } else { Ok(buffer) }
    };
    Ok(SideBuffers {
        half_rows: None,
        byte_rows: None,
        filter: gather_rows(device, &filter, n, &order, n, dim)?,
        exact: Arc::new(gather_rows(device, &exact, n, &order, n, dim)?),
        norms: if norms.len() == n { gather_rows(device, &norms, n, &order, n, 1)? } else { norms },
        filter_norms: per_row(filter_norms)?,
        filter_sq_norms: per_row(filter_sq_norms)?,
        order,
        resident,
    })
}

/// The rows `rows` (slots of `side`, each below its length) of `side` as a side of their own, in
/// that order, gathered on the device: the queries a kNN pass runs again. The same values as the
/// whole side's (f16 rows included), so a query's filter and exact distances do not change; building
/// and uploading such a side from the host took ~1 ms for 300 of P2's queries (NOTES.md v54).
fn subset_side(device: &GpuDevice, side: &SideBuffers, rows: &[u32], dim: usize) -> Result<SideBuffers, String> {
    let (source, n) = (side.order.len(), rows.len());
    if let Some(&row) = rows.iter().find(|&&row| row as usize >= source) {
        return Err(format!("kNN pass: query slot {row} of a side of {source}"));
    }
    let picked = device.stream.clone_htod(rows).map_err(|e| format!("GPU copy failed: {e}"))?;
    // A buffer the metric does not use holds one value, which no kernel reads per row.
    fn per_row<T: DeviceRepr + ValidAsZeroBits>(
        device: &GpuDevice,
        buffer: &CudaSlice<T>,
        source: usize,
        picked: &CudaSlice<u32>,
    ) -> Result<CudaSlice<T>, String> {
        match buffer.len() == source {
            true => gather_rows(device, buffer, source, picked, picked.len(), 1),
            false => device.stream.alloc_zeros(1).map_err(|e| format!("GPU allocation failed: {e}")),
        }
    }
    Ok(SideBuffers {
        filter: gather_rows(device, &side.filter, source, &picked, n, dim)?,
        half_rows: side
            .half_rows
            .as_ref()
            .map(|h| gather_rows(device, h, source, &picked, n, tc_row_words(dim)))
            .transpose()?,
        byte_rows: match &side.byte_rows {
            Some(b) => Some(ByteRows {
                rows: gather_rows(device, &b.rows, source, &picked, n, byte_row_words(dim))?,
                sq_norms: gather_rows(device, &b.sq_norms, source, &picked, n, 1)?,
                offset: b.offset,
            }),
            None => None,
        },
        exact: Arc::new(gather_rows(device, &side.exact, source, &picked, n, dim)?),
        norms: per_row(device, &side.norms, source, &picked)?,
        filter_norms: per_row(device, &side.filter_norms, source, &picked)?,
        filter_sq_norms: per_row(device, &side.filter_sq_norms, source, &picked)?,
        order: gather_rows(device, &side.order, source, &picked, n, 1)?,
        resident: false,
    })
}

impl GpuBackend {
    /// The side's buffers on the device.
    fn upload(&self, side: &HostSide) -> Result<SideBuffers, String> {
        let device = &self.device;
        let (exact, resident) = match &side.resident {
            Some(key) => device.resident_rows(key, side.exact.as_ref())?,
            None => (Arc::new(upload(device, side.exact.as_ref())?), false),
        };
        let (filter, filter_norms, filter_sq_norms) = match &side.device_filter {
            Some(origin) => {
                let rows = filter_rows(device, &exact, side.rows, origin)?;
                (rows.filter, rows.norms, rows.sq_norms)
            }
            None => (
                upload(device, &side.filter)?,
                upload(device, &side.filter_norms)?,
                upload(device, &side.filter_sq_norms)?,
            ),
        };
        let order = match &side.order {
            Some(order) => upload(device, order)?,
            None => identity_order(device, side.rows)?,
        };
        Ok(SideBuffers {
            filter,
            half_rows: None,
            byte_rows: None,
            exact,
            norms: upload(device, &side.norms)?,
            filter_norms,
            filter_sq_norms,
            order,
            resident,
        })
    }

    /// The exponent `a` of the power of two brute_join_tc scales every side's f16 rows by (the
    /// same for all: the scores then scale by 2^2a), from the sides' largest |filter coordinate|;
    /// `None` where the tensor cores do not filter: a metric without a dot-product filter, a device
    /// without them, or coordinates f16 cannot hold after any such scaling ([`tc_scale_exponent`]).
    fn tensor_core_scale(&self, metric: Metric, gemm: bool, largest: &[f32]) -> Option<i32> {
        if !self.tensor_cores_filter(metric, gemm) {
            return None;
        }
        tc_scale_exponent(
            largest
                .iter()
                .fold(0f32, |all, &side| if all.is_nan() || side.is_nan() { f32::NAN } else { all.max(side) }),
        )
    }

    /// Whether brute force over `metric` filters on the tensor cores: a dot-product filter on a
    /// device with them.
    fn tensor_cores_filter(&self, metric: Metric, gemm: bool) -> bool {
        (gemm || metric == Metric::InnerProduct) && self.device.has_tensor_cores()
    }

    /// Each side's largest |filter coordinate| (NaN if one is) where the tensor cores filter, for
    /// [`GpuBackend::tensor_core_scale`]; none elsewhere.
    fn largest_coordinates(&self, metric: Metric, gemm: bool, sides: &[&SideBuffers]) -> Result<Vec<f32>, String> {
        match self.tensor_cores_filter(metric, gemm) {
            true => sides.iter().map(|side| filter_max_abs(&self.device, &side.filter)).collect(),
            false => Ok(Vec::new()),
        }
    }

    /// `side` with its rows for the tensor cores where they filter: its f16 rows for brute_join_tc,
    /// scaled by 2^a, and for L2 and L2² its byte rows where every value is an integer within one
    /// window of 256 ([`byte_rows`]: brute_join_tc_bytes, whose integer filter is exact). `values`
    /// are its exact values on the host: where their first ones already rule byte rows out, as a
    /// Gaussian's first value does, the device's pass over all of them (and its wait) is skipped.
    fn with_tensor_core_rows(
        &self,
        mut side: SideBuffers,
        values: &[f64],
        dim: usize,
        tc: Option<i32>,
        metric: Metric,
    ) -> Result<SideBuffers, String> {
        if let Some(a) = tc {
            side.half_rows = Some(pack_half_rows(&self.device, &side.filter, side.order.len(), dim, 2f32.powi(a))?);
            let may_be_bytes = values.iter().take(4096).all(|&v| v == v.round() && (-128.0..=255.0).contains(&v));
            if matches!(metric, Metric::L2 | Metric::L2Squared) && may_be_bytes {
                side.byte_rows = byte_rows(&self.device, &side.exact, side.order.len(), dim)?;
            }
        }
        Ok(side)
    }

    /// Whether the sides' GEMM-form squared norms stay where f32 scores are meaningful
    /// (GemmSide's 10³⁶; a NaN fails), their largest found on the device where it built them (one
    /// value read back instead of a row's: P1's 4 MB took 1.5 ms, NOTES.md v47).
    fn gemm_fits(&self, sides: &[(&HostSide, &SideBuffers)]) -> Result<bool, String> {
        for (host, buffers) in sides {
            let fits = if host.device_filter.is_some() {
                filter_max_abs(&self.device, &buffers.filter_sq_norms)? <= 1e36
            } else {
                host.filter_sq_norms.iter().all(|s| *s <= 1e36)
            };
            if !fits {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn gpu_join(
        &self,
        request: &JoinRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> Result<Result<RunStats>, String> {
        let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if left.is_empty() || right.is_empty() {
            return Ok(Ok(stats));
        }
        // Compile the modules now (once per process) so NVRTC stays out of the run's times; the
        // grid's only when the plan has a grid, its compilation then left out of build_time.
        self.device.function(KernelModule::SimJoin, "grid_join")?;
        let start = Instant::now();
        let dim = left.dim;
        let (left_filter, right_filter, strategy) = plan_join(request);
        let compiling = Instant::now();
        if matches!(strategy, JoinStrategy::Grid(_)) {
            self.device.function(KernelModule::Grid, "radix_scatter")?;
        }
        let start = start + compiling.elapsed();

        // The host's rows go up in input order; a grid then orders them on the device.
        let geometry = match &strategy {
            JoinStrategy::Grid(g) => Some(g),
            JoinStrategy::BruteForce => None,
        };
        let identity = |n: usize| (0..n as u32).collect::<Vec<u32>>();
        // The GEMM form's filter rows of L2 and L2² (brute force) are built on the device from
        // the exact rows (device_side); the other filters' here (host_side).
        let sides = |gemm: bool| {
            let origin = filter_origin(metric, gemm, &left_filter, &right_filter, right);
            let side = |v, filter: &[f64]| {
                if gemm && metric != Metric::Cosine {
                    device_side(v, &origin)
                } else {
                    host_side(v, filter, identity(v.len()), &origin, metric, gemm)
                }
            };
            (side(left, &left_filter), self_join.is_none().then(|| side(right, &right_filter)))
        };
        let upload_sides = |left_host: &HostSide,
                            right_host: &Option<HostSide>|
         -> Result<(SideBuffers, Option<SideBuffers>), String> {
            Ok((self.upload(left_host)?, right_host.as_ref().map(|h| self.upload(h)).transpose()?))
        };
        let mut gemm = geometry.is_none() && gemm_metric(metric);
        let (mut left_host, mut right_host) = sides(gemm);
        let uploading = Instant::now();
        let (mut left_buffers, mut right_buffers) = upload_sides(&left_host, &right_host)?;
        let fits = !gemm || {
            let sides: Vec<_> = std::iter::once((&left_host, &left_buffers))
                .chain(right_host.as_ref().zip(right_buffers.as_ref()))
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
            filter_extent(&std::iter::once(&left_host).chain(right_host.as_ref()).collect::<Vec<_>>())
        };
        // The tensor cores filter brute force only (a grid's sides are gathered into slot order).
        let tc = match geometry {
            None => {
                let sides: Vec<&SideBuffers> = std::iter::once(&left_buffers).chain(right_buffers.as_ref()).collect();
                self.tensor_core_scale(metric, gemm, &self.largest_coordinates(metric, gemm, &sides)?)
            }
            Some(_) => None,
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
            .zip(right_host.as_ref())
            .map(|(side, host)| self.with_tensor_core_rows(side, &host.exact, dim, tc, metric))
            .transpose()?;
        stats.byte_row_tiles =
            byte_sides(&self.device, &params, &left_buffers, right_buffers.as_ref().unwrap_or(&left_buffers))
                .is_some()
                .into();
        let right_len = right_host.as_ref().map_or(left_host.rows, |h| h.rows) as u32;
        let stream = &self.device.stream;
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        let grid = match geometry {
            Some(g) => {
                stats.indexed_dims = g.dims.len();
                let windowed = g.window_prunes();
                let build = |filter: &[f64]| {
                    let (cells, values) = g.keys(filter, dim, windowed);
                    build_grid(&self.device, &cells, values.as_deref(), g.id_bits(), g.table_len(cells.len()))
                };
                let DeviceGrid { order, slot_cell, sort_keys: left_sort_keys, bounds } = build(&left_filter)?;
                left_buffers = in_slot_order(&self.device, left_buffers, order, dim)?;
                // A self-join probes its own cells.
                let (right_bounds, right_sort_keys) = match right_buffers.take() {
                    Some(side) => {
                        let DeviceGrid { order, sort_keys, bounds: right_bounds, .. } = build(&right_filter)?;
                        right_buffers = Some(in_slot_order(&self.device, side, order, dim)?);
                        (right_bounds, sort_keys)
                    }
                    None => (bounds, stream.clone_dtod(&left_sort_keys).map_err(copy)?),
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
                Some(GridBuffers {
                    left_slot_cell: slot_cell,
                    right_cell_ids: right_bounds.cell_ids,
                    right_cell_start: right_bounds.cell_start,
                    cell_table: right_bounds.table,
                    left_sort_keys,
                    right_sort_keys,
                })
            }
            None => None,
        };
        let right_buffers_ref = right_buffers.as_ref().unwrap_or(&left_buffers);
        // The build's last gathers are queued, not done: they count as build time.
        stream.synchronize().map_err(copy)?;
        stats.build_time = start.elapsed();

        // One count pass over every left slot that also collects the pairs into buffers sized for
        // COLLECT_PAIRS_PER_ROW per left row. When they all fit, that pass is the whole result,
        // downloaded in batches of RESULT_BATCH_PAIRS; otherwise write passes follow, in
        // batches of at most RESULT_BATCH_PAIRS pairs (a single slot with more gets a batch of
        // its own), each from offsets the counts give, pipelined over PIPELINE_STREAMS streams.
        let probe = Instant::now();
        let n_left = left_host.rows;
        let mut pass = PassBuffers::new(&self.device, n_left.min(MAX_PASS_ROWS), 0)?;
        let collect_capacity = n_left.saturating_mul(COLLECT_PAIRS_PER_ROW).min(output_pairs(budget) as usize);
        pass.size_outputs(&self.device, collect_capacity)?;
        let inputs = JoinInputs {
            left: &left_buffers,
            right: right_buffers_ref,
            right_len,
            grid: grid.as_ref(),
            expected_share: 0.0,
        };
        let counts = self.count_pass(&params, n_left, inputs, &mut pass, PassKind::CountAndCollect, &mut stats)?;
        let collected = stream.clone_dtoh(&pass.collected).map_err(copy)?[0];
        let batches: Vec<ResultBatch> = if collected <= collect_capacity as u64 {
            collected_batches(collected)
        } else {
            // Each pipeline stream holds a batch's outputs: a third of the result quarter each.
            let most = (output_pairs(budget) / PIPELINE_STREAMS as u64).min(RESULT_BATCH_PAIRS);
            pass.size_outputs(&self.device, 0)?;
            write_batches(&counts, most)
                .0
                .into_iter()
                .map(|(begin, end, pairs)| ResultBatch::Written { slots: begin..end, pairs })
                .collect()
        };
        let largest = batches.iter().map(ResultBatch::pairs).max().unwrap_or(0).max(1) as usize;
        // Collected pairs come back through two halves of the host buffers, each batch's copy
        // overlapping the emission of the one before; write batches through a part per stream.
        let collected_path = matches!(batches.first(), Some(ResultBatch::Collected(_)));
        let mut results = host_results(&self.device, largest * if collected_path { 2 } else { PIPELINE_STREAMS })?;
        sink.start(batches.len() as u64);

        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        let exact = ExactCheck::new(metric, threshold, left, right);
        let (mut transfer, mut kernel, mut emit) = Default::default();
        // Downloaded pairs into result chunks, on every core: each piece builds and sends its own.
        let emit_pairs = |(lefts, rights, distances): DownloadedPairs| -> Result<()> {
            let n = rights.len();
            let piece = (1 << 16).max(n.div_ceil(rayon::current_num_threads() * 4));
            (0..n.div_ceil(piece)).into_par_iter().try_for_each(|p| -> Result<()> {
                let range = p * piece..((p + 1) * piece).min(n);
                let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
                for i in range {
                    let (a, b, d) = (lefts[i], rights[i], distances[i]);
                    // Self-joins report the smaller position first (the mirror adds (b, a)).
                    let (a, b) = if self_join.is_some() && a > b { (b, a) } else { (a, b) };
                    writer.push(a, b, d)?;
                }
                writer.flush()
            })
        };
        let outcome = (|| -> Result<()> {
            let exec = |e: String| DataFusionError::Execution(e);
            let sync = |e: cudarc::driver::DriverError| DataFusionError::Execution(copy(e));
            if collected_path {
                let stored = |batch: &ResultBatch| match batch {
                    ResultBatch::Collected(pairs) => Some(pairs.start as usize..pairs.end as usize),
                    ResultBatch::Written { .. } => None,
                };
                let mut halves = results.parts::<2>().map_err(exec)?;
                if let Some(pairs) = batches.first().and_then(stored) {
                    halves[0].start_download(stream, &pass, true, pairs).map_err(exec)?;
                }
                for (i, batch) in batches.iter().enumerate() {
                    let copying = Instant::now();
                    stream.synchronize().map_err(sync)?; // batch i is in half i % 2
                    transfer += copying.elapsed();
                    let [even, odd] = &mut halves;
                    let (current, next) = if i % 2 == 0 { (even, odd) } else { (odd, even) };
                    if let Some(pairs) = batches.get(i + 1).and_then(stored) {
                        next.start_download(stream, &pass, true, pairs).map_err(exec)?;
                    }
                    let emitting = Instant::now();
                    emit_pairs(current.pairs(batch.pairs() as usize, true))?;
                    emit += emitting.elapsed();
                    sink.advance(1);
                }
            } else {
                // Write passes take turns on PIPELINE_STREAMS streams, each with output buffers
                // and a part of the host buffers of its own: batch i is queued (offsets, kernel,
                // copy to the host) on stream i mod 3 as soon as the host has emitted batch
                // i − 3 from that stream's part, so while the host emits one batch the next
                // one's copy and the one after's kernel run (seed 003 §3.2.2). Emission stays in
                // batch order.
                let streams = self.device.pipeline_streams().map_err(exec)?;
                let slots_most = batches
                    .iter()
                    .map(|b| if let ResultBatch::Written { slots, .. } = b { slots.len() } else { 0 })
                    .max()
                    .unwrap_or(1);
                let mut lanes = Vec::with_capacity(PIPELINE_STREAMS);
                for _ in 0..PIPELINE_STREAMS {
                    let mut lane = PassBuffers::new(&self.device, slots_most, 0).map_err(exec)?;
                    lane.size_outputs(&self.device, largest).map_err(exec)?;
                    lane.offsets = stream.alloc_zeros::<u64>(slots_most.max(1)).map_err(sync)?;
                    lanes.push(lane);
                }
                let mut parts = results.parts::<PIPELINE_STREAMS>().map_err(exec)?;
                // Queues batch `i` on its stream; the events around its kernel time it.
                let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let queue = |i: usize, lane: &mut PassBuffers, part: &mut HostPairs| -> Result<[CudaEvent; 2]> {
                    let ResultBatch::Written { slots, pairs } = &batches[i] else { unreachable!("write batches only") };
                    let stream = &streams[i % PIPELINE_STREAMS];
                    let offsets = exclusive_offsets(&counts[slots.clone()]);
                    stream
                        .memcpy_htod(&offsets[..slots.len()], &mut lane.offsets.slice_mut(0..slots.len()))
                        .map_err(sync)?;
                    let started = stream.record_event(timing).map_err(sync)?;
                    let slots = slots.start as u32..slots.end as u32;
                    launch_join_pass(&self.device, stream, &params, slots, inputs, lane, PassKind::Write)
                        .map_err(exec)?;
                    let written = stream.record_event(timing).map_err(sync)?;
                    part.start_download(stream, lane, true, 0..*pairs as usize).map_err(exec)?;
                    Ok([started, written])
                };
                let mut in_flight = Vec::with_capacity(batches.len());
                for i in 0..batches.len().min(PIPELINE_STREAMS) {
                    in_flight.push(queue(i, &mut lanes[i], &mut parts[i])?);
                }
                for i in 0..batches.len() {
                    let lane = i % PIPELINE_STREAMS;
                    let (waited, ran) = finish_queued(&streams[lane], &in_flight[i]).map_err(sync)?;
                    (transfer, kernel) = (transfer + waited, kernel + ran);
                    stats.write_passes += 1;
                    let emitting = Instant::now();
                    emit_pairs(parts[lane].pairs(batches[i].pairs() as usize, true))?;
                    emit += emitting.elapsed();
                    sink.advance(1);
                    if i + PIPELINE_STREAMS < batches.len() {
                        in_flight.push(queue(i + PIPELINE_STREAMS, &mut lanes[lane], &mut parts[lane])?);
                    }
                }
            }
            if self_join.is_some_and(|s| s.include_self) {
                write_self_pairs(&exact, left, 0..left.len(), &mut writer)?;
            }
            writer.flush()
        })();
        // No copy may still be writing into the host buffers when they are released, nor a pass
        // reading the inputs when they are freed (an early return above, e.g. a cancelled query,
        // can leave some in flight).
        stream.synchronize().map_err(copy)?;
        if !collected_path {
            for lane in self.device.pipeline_streams()? {
                lane.synchronize().map_err(copy)?;
            }
        }
        stats.probe_time = probe.elapsed();
        stats.transfer_time += transfer;
        stats.kernel_time += kernel;
        stats.emit_time += emit;
        Ok(outcome.map(|()| stats))
    }
}

/// Result pairs a join's count pass collects per left row at most (the size of its output
/// buffers, 16 bytes a pair on the device): ε-joins are usually asked for tens to a few hundred
/// neighbours per row (the seeds calibrate ε to 64–256), and then the count pass alone produces the
/// result. A join with more per row gets write passes, as one too large for device memory does.
const COLLECT_PAIRS_PER_ROW: usize = 256;

/// One downloaded and emitted batch of a join's pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ResultBatch {
    /// Pairs the count pass collected, at these indices of the output buffers.
    Collected(std::ops::Range<u64>),
    /// A write pass over these left slots, producing this many pairs.
    Written { slots: std::ops::Range<usize>, pairs: u64 },
}

impl ResultBatch {
    fn pairs(&self) -> u64 {
        match self {
            ResultBatch::Collected(at) => at.end - at.start,
            ResultBatch::Written { pairs, .. } => *pairs,
        }
    }
}

/// Pairs per download batch of a count pass's collected pairs (64 MiB on the host; two batches'
/// worth of page-locked memory per run): small enough that copying one overlaps the emission of
/// the previous one for most of a large result, and that a process's first query page-locks
/// 128 MiB rather than the 1 GiB of two MAX_BATCH_PAIRS halves.
const RESULT_BATCH_PAIRS: u64 = 1 << 22;

/// Download batches of `collected` pairs of a count pass: RESULT_BATCH_PAIRS each, the last fewer.
fn collected_batches(collected: u64) -> Vec<ResultBatch> {
    (0..collected)
        .step_by(RESULT_BATCH_PAIRS as usize)
        .map(|at| ResultBatch::Collected(at..(at + RESULT_BATCH_PAIRS).min(collected)))
        .collect()
}

/// Write-pass batches `(first slot, end slot, pairs)` over consecutive left slots, each at most
/// `max_pairs` pairs and MAX_PASS_ROWS slots (a slot with more pairs gets a batch of its own),
/// and the output capacity the largest batch needs.
fn write_batches(counts: &[u32], max_pairs: u64) -> (Vec<(usize, usize, u64)>, usize) {
    let mut batches = Vec::new();
    let (mut begin, mut total) = (0usize, 0u64);
    for (slot, &c) in counts.iter().enumerate() {
        if (total + c as u64 > max_pairs || slot - begin == MAX_PASS_ROWS) && slot > begin {
            batches.push((begin, slot, total));
            begin = slot;
            total = 0;
        }
        total += c as u64;
    }
    batches.push((begin, counts.len(), total));
    let capacity = batches.iter().map(|b| b.2).max().unwrap_or(0).max(1) as usize;
    (batches, capacity)
}

/// Where each slot's pairs start in a batch's output, plus the end: an exclusive prefix sum.
fn exclusive_offsets(counts: &[u32]) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut at = 0u64;
    offsets.push(at);
    for &c in counts {
        at += c as u64;
        offsets.push(at);
    }
    offsets
}

/// The index of `metric` in kernels/common.cuh's METRIC_* codes.
fn metric_code(metric: Metric) -> u32 {
    Metric::ALL.iter().position(|m| *m == metric).unwrap_or(0) as u32
}

/// Whether brute force over `metric` filters with the GEMM form ‖x̃‖² + ‖ỹ‖² − 2x̃·ỹ (one fused
/// multiply-add per dimension instead of a subtraction and one), as the CPU's GemmSide does.
fn gemm_metric(metric: Metric) -> bool {
    matches!(metric, Metric::L2 | Metric::L2Squared | Metric::Cosine)
}

/// The f32 filter kind (FILTER_* of common.cuh) of `metric`, with the dot-product forms' margins:
/// GemmSide's `(d + 16)·2⁻²³·(‖x̃‖ + ‖ỹ‖)²` and its subnormal floor, or, where `tc` (brute force on
/// a device with tensor cores, rows scaled by 2^a: [`GpuBackend::tensor_core_scale`]), the wider
/// [`tensor_core_margin`] and brute_join_tc.
fn filter_params(metric: Metric, dim: usize, gemm: bool, tc: Option<i32>) -> JoinParams {
    let dot_form = |filter| match tc {
        Some(a) => {
            let TensorCoreMargin { margin, floor, eta } = tensor_core_margin(dim);
            JoinParams {
                filter,
                dot_margin: margin,
                dot_floor: floor,
                tc_eta: eta,
                tc_scale: 2f32.powi(a),
                tensor_cores: 1,
                ..Default::default()
            }
        }
        None => JoinParams {
            filter,
            dot_margin: (dim as f32 + 16.0) / (1u32 << 23) as f32,
            dot_floor: (dim as f32 + 16.0) * 2f32.powi(-140),
            ..Default::default()
        },
    };
    match metric {
        _ if gemm => dot_form(4),
        Metric::InnerProduct => dot_form(3),
        Metric::L1 => JoinParams { filter: 1, ..Default::default() },
        Metric::LInf => JoinParams { filter: 2, ..Default::default() },
        _ => JoinParams::default(),
    }
}

/// The exponent `a` that brings `largest`, the sides' largest |filter coordinate|, below 2¹⁴ (f16
/// holds up to 65,504; the dot products' f32 sums then stay below d·2²⁸), at most 60; `None` where
/// it is not finite or needs a below −60 (2⁷⁴ and more), which would leave 2^2a, the scale of the
/// scores brute_join_tc compares, outside f32's normal range.
fn tc_scale_exponent(largest: f32) -> Option<i32> {
    if !largest.is_finite() || largest >= 2f32.powi(74) {
        return None;
    }
    // largest < 2^(e + 1), e its binary exponent (−127 for 0 and subnormals, which are < 2⁻¹²⁶).
    let e = ((largest.to_bits() >> 23) & 0xff) as i32 - 127;
    Some((13 - e).min(60))
}

/// brute_join_tc's margins, in the scaled space of its f16 rows (every length times 2^a, every
/// score times 2^2a): the factor `margin` = 2⁻¹⁰ + (d + 16)·2⁻²¹ of (n(x̃) + n(ỹ))², `eta` =
/// 5·√d·2⁻¹⁴ of n(x̃) + n(ỹ), and the absolute `floor` = (d + 16)·2⁻²⁶ (n the scaled f32 norms).
struct TensorCoreMargin {
    margin: f32,
    floor: f32,
    eta: f32,
}

/// The margins of the dot-product filters when x̃·ỹ comes from f16 tensor cores (brute_join_tc).
///
/// # Why the filter still loses no pair
/// Everything below is in the scaled space: both sides' f32 filter rows are multiplied by the same
/// power of two 2^a (exact: the largest coordinate lands below 2¹⁴, [`tc_scale_exponent`]), so
/// every squared distance, score, limit and squared norm is 2^2a times its own, and a pair passes
/// the scaled test exactly when it passes the unscaled one. pack_half_rows rounds every scaled
/// coordinate to f16 to nearest, so `x̂ᵢ = x̃ᵢ(1 + δᵢ) + εᵢ` with `|δᵢ| ≤ 2⁻¹¹` and `|εᵢ| ≤ η = 2⁻¹⁴`
/// (f16's subnormal range, below 2⁻¹⁴, errs by at most 2⁻²⁵, or by the value itself if the tensor
/// cores flush it). Then `|x̂ᵢŷᵢ − x̃ᵢỹᵢ| ≤ (2⁻¹⁰ + 2⁻²²)|x̃ᵢỹᵢ| + (1 + 2⁻¹¹)η(|x̃ᵢ| + |ỹᵢ|) + η²`,
/// summed: `(2⁻¹⁰ + 2⁻²²)Σ|x̃ᵢỹᵢ| + (1 + 2⁻¹¹)η√d(‖x̃‖ + ‖ỹ‖) + dη²`. Products of f16 values are
/// exact in f32 (11 × 11 significant bits); the tensor cores add them into f32 accumulators, each
/// addition erring by at most 2⁻²² of the magnitudes it adds (truncation, 2⁻²³, doubled for adding
/// several aligned products at once: Fasi et al., "Numerical behavior of NVIDIA tensor cores",
/// PeerJ CS 2021), so the d additions err by at most `d·2⁻²²·Σ|x̂ᵢŷᵢ|`. With
/// `Σ|x̃ᵢỹᵢ| ≤ ‖x̃‖‖ỹ‖ ≤ (‖x̃‖ + ‖ỹ‖)²/4`, the relative part of the dot product errs by at most
/// `(2⁻¹⁰ + (d + 2)·2⁻²²)·(‖x̃‖ + ‖ỹ‖)²/4` (to first order), the GEMM score `‖x̃‖² + ‖ỹ‖² − 2x̃·ỹ` by
/// twice that, `(2⁻¹¹ + (d + 2)·2⁻²³)·(‖x̃‖ + ‖ỹ‖)²`, and everything else of GemmSide's analysis
/// (norms, the f64 → f32 rounding, the final additions) by at most `2⁻²¹·(‖x̃‖ + ‖ỹ‖)²`: in all less
/// than half of `margin`. The absolute part, doubled for the score and again for the additions'
/// error on it (d·2⁻²² < 1), is at most `4(1 + 2⁻¹¹)η√d(‖x̃‖ + ‖ỹ‖) + 4dη²`, within
/// `eta·(n(x̃) + n(ỹ))` (5 for 4(1 + 2⁻¹¹) also covers the f32 norms' own rounding) and
/// `4d·2⁻²⁸ = d·2⁻²⁶` of `floor`; the rest of `floor`, 16·2⁻²⁶, covers accumulators flushed below
/// f32's 2⁻¹²⁶. So a pair within the threshold always passes, and the exact f64 check decides it as
/// before. (brute_join_tc evaluates the test separated into a bound per left row and an offset per
/// right row, with a wider margin and every rounding toward passing: `tc_row_bound` in
/// kernels/sim_join.cu. It passes a superset.)
fn tensor_core_margin(dim: usize) -> TensorCoreMargin {
    let d = dim as f32 + 16.0;
    let eta = round_up(5.0 * (dim as f64).sqrt() * 2f64.powi(-14));
    TensorCoreMargin { margin: 2f32.powi(-10) + d * 2f32.powi(-21), floor: d * 2f32.powi(-26), eta }
}

/// The origin the f32 filter rows are offsets from: the right side's mean for the GEMM form (small
/// norms, small margins; cosine's unit vectors stay as they are, like GemmSide's), the lower corner
/// of both sides for the direct differences, none for the inner product.
fn filter_origin(metric: Metric, gemm: bool, left_filter: &[f64], right_filter: &[f64], right: &Vectors) -> Vec<f64> {
    match metric {
        Metric::InnerProduct => vec![0.0; right.dim],
        Metric::Cosine if gemm => vec![0.0; right.dim],
        _ if gemm => right.mean().to_vec(),
        _ => lower_corner(left_filter, right_filter, right.dim),
    }
}

/// The f32 filter limit of an exact threshold: no pair within `threshold` scores above it (the
/// proofs are on [`FilterLimit`] and, for the dot-product forms, `GemmSide` in cpu.rs). `extent`
/// matters only to the direct differences (not the GEMM form).
fn filter_limit(metric: Metric, threshold: f64, dim: usize, extent: f64, gemm: bool) -> f32 {
    if gemm {
        return score_threshold(metric, threshold);
    }
    if metric == Metric::InnerProduct {
        return round_up(threshold);
    }
    FilterLimit::new(metric, threshold, dim, extent).limit
}

/// The largest |coordinate| of the f32 filter rows of both sides (the filter margins scale with it).
fn filter_extent(sides: &[&HostSide]) -> f64 {
    sides.iter().flat_map(|h| h.filter.iter()).fold(0f64, |m, v| m.max(v.abs() as f64))
}

/// Most values kNN's candidate slots take on the device when they are copied back to be ranked on
/// the host (12 bytes each; slots of more than KNN_RANK_SLOTS): for larger k the slots would cost
/// more to copy than the write pass they save. Slots ranked on the device return k entries a query
/// and are bounded by the memory budget alone.
const KNN_SLOT_VALUES: usize = 1 << 24;

/// Candidates kept per query in the first count pass (0: none, every query gets a write pass).
/// The first radius is the sample's `rank`-th smallest distance, so a query's count is about
/// Gamma(rank)·n/sample_len (exactly k when the sample is the whole base, ties aside): the mean
/// plus 4 of its standard deviations (mean/√rank) and 64 leave the slot too small for about one
/// query in 60 at rank 1 (e⁻⁴·⁰⁶ for the exponential count), fewer at larger ranks; those queries
/// take the next count pass in longer slots where these are ranked on the device, else a write
/// pass. 0 when `queries` slots exceed a quarter of the memory `budget` (12
/// bytes a value), or KNN_SLOT_VALUES where they would be copied back, or one count pass.
fn knn_slot_capacity(k: usize, n: usize, sample_len: usize, rank: u32, queries: usize, budget: usize) -> u32 {
    let expected = if sample_len >= n { k as f64 } else { rank as f64 * n as f64 / sample_len as f64 };
    let capacity = (expected * (1.0 + 4.0 / (rank.max(1) as f64).sqrt()) + 64.0).ceil() as usize;
    let copied_limit = if capacity > KNN_RANK_SLOTS { KNN_SLOT_VALUES } else { usize::MAX };
    if queries > MAX_PASS_ROWS || queries.saturating_mul(capacity) > copied_limit.min(budget / 4 / 12) {
        return 0;
    }
    capacity as u32
}

/// Base rows in kNN's radius sample (at most [`KNN_SAMPLE`]), from which each query's ranks are
/// picked. Where the tensor cores filter (`tensor_cores`), they take the sample's distances too, and
/// the sample is KNN_SAMPLE rows (or the whole base): a sample row then costs about 1.5 count-pass
/// rows (P2: 0.63 ms of keys for 4,096 rows against 6.1 ms for the pass's 60,000, NOTES.md v55),
/// and the larger sample gives tighter radii, fewer candidates for the same share of queries
/// short (P2, 60,000 rows of 784 at k = 10: 64 candidates a query and 4 % short with 1,875
/// rows at rank 2, 44 and 3 % with 4,096 at rank 3; NOTES.md v54). On f32 CUDA cores a sample
/// row cost about as much as 8 of the count pass's base rows (P2: a sample of 4,096 took 10.7 ms
/// against the count pass's 9.2 ms, v45), so there it is a 32nd of the base, at least 1,024 rows,
/// and the whole base up to that. A smaller sample only makes the candidate counts vary more (a
/// query short of k takes another count pass at its next radius), never an answer.
fn knn_sample_len(n: usize, tensor_cores: bool) -> usize {
    const SMALLEST: usize = 1024;
    match n {
        _ if tensor_cores => n.min(KNN_SAMPLE),
        0..=SMALLEST => n,
        _ => (n / 32).clamp(SMALLEST, KNN_SAMPLE),
    }
}

/// The sample rank of kNN's first radius. With the whole base as the sample it is k itself (the
/// radius is then the exact k-th distance). Otherwise it comes from two ranks:
/// - about `c·k` base rows fall within the (c·k·s/n)-th smallest of s evenly spread sample
///   distances, and `c = 2 + 6/√k` puts c·k more than 4.6 standard deviations of that count
///   (near-Poisson) above k;
/// - the sample itself varies: the r-th smallest sample distance lies below the k-th smallest base
///   distance, leaving the query short of k (and a second count pass, then a write pass, for it),
///   when at least r sample rows are among its k nearest, a count near Poisson(λ), λ = k·s/n. That
///   rank is the smallest r with P(Poisson(λ) ≥ r) ≤ 1 %.
///
/// For small λ the rank is the first, or the second where larger but at most 2: each rank adds
/// n/s candidates a query, each an exact f64 check whose cost grows with d. Measured on the H100
/// (NOTES.md v49): P1 (k = 10, λ = 0.04) at rank 2 instead of 1 left 0.1 % of its queries short
/// instead of 4.5 % and ran ~2 ms faster; 60,000 × 784 rows (k = 10, λ = 0.31) at rank 3 instead
/// of 2 ran 2.5–3 ms slower. For large λ the second rank, about λ + 2.3√λ, is the smaller, and is
/// the one: the sample's own variation is what leaves a query short, and c·k then only adds
/// candidates (P1 at k = 10,000, λ = 41: rank 58 instead of 85, 1.4·10⁴ candidates a query
/// instead of 2.1·10⁴, NOTES.md v78).
fn knn_sample_rank(k: usize, n: usize, sample_len: usize) -> u32 {
    if sample_len >= n {
        return k as u32;
    }
    let lambda = k as f64 * sample_len as f64 / n as f64;
    let c = 2.0 + 6.0 / (k as f64).sqrt();
    let by_count = (c * lambda).ceil() as usize;
    // P(X ≤ r − 1) summed term by term, each in logarithms (e^−λ underflows beyond λ ≈ 745),
    // until the tail P(X ≥ r) is at most 1 %.
    let (mut by_sample, mut log_term) = (1usize, -lambda);
    let mut below = log_term.exp();
    while 1.0 - below > 0.01 && by_sample <= sample_len {
        log_term += (lambda / by_sample as f64).ln();
        below += log_term.exp();
        by_sample += 1;
    }
    by_count.min(by_sample).max(by_sample.min(2)).clamp(1, sample_len + 1) as u32
}

/// `x` as f32, rounded up.
fn round_up(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x { f.next_up() } else { f }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_batches_cover_every_slot_once_within_the_limits() {
        let big = MAX_BATCH_PAIRS as u32;
        let counts = [3, big - 2, 1, 1, big + 5, 0, 7];
        let (batches, capacity) = write_batches(&counts, MAX_BATCH_PAIRS);
        assert_eq!(batches, vec![(0, 1, 3), (1, 4, big as u64), (4, 5, big as u64 + 5), (5, 7, 7)]);
        assert_eq!(capacity, big as usize + 5, "a slot over the limit gets a batch of its own");
        let many = vec![1u32; MAX_PASS_ROWS + 3];
        let (batches, _) = write_batches(&many, MAX_BATCH_PAIRS);
        assert_eq!(batches, vec![(0, MAX_PASS_ROWS, MAX_PASS_ROWS as u64), (MAX_PASS_ROWS, MAX_PASS_ROWS + 3, 3)]);
        assert_eq!(write_batches(&[], MAX_BATCH_PAIRS), (vec![(0, 0, 0)], 1));
        // A small memory budget: batches of its quarter's worth of pairs.
        assert_eq!(output_pairs(64 * 4 * 16), 64);
        assert_eq!(
            write_batches(&[40, 30, 20, 15], output_pairs(64 * 4 * 16)).0,
            vec![(0, 1, 40), (1, 3, 50), (3, 4, 15)]
        );
        assert_eq!(exclusive_offsets(&[3, 0, 2]), vec![0, 3, 3, 5]);
    }

    #[test]
    fn collected_pairs_download_in_batches_within_the_limit() {
        let big = RESULT_BATCH_PAIRS;
        assert_eq!(collected_batches(0), vec![]);
        assert_eq!(collected_batches(5), vec![ResultBatch::Collected(0..5)]);
        assert_eq!(collected_batches(big), vec![ResultBatch::Collected(0..big)]);
        let batches = collected_batches(2 * big + 1);
        assert_eq!(
            batches,
            vec![
                ResultBatch::Collected(0..big),
                ResultBatch::Collected(big..2 * big),
                ResultBatch::Collected(2 * big..2 * big + 1)
            ]
        );
        assert_eq!(batches.iter().map(ResultBatch::pairs).sum::<u64>(), 2 * big + 1);
    }

    #[test]
    fn knn_slots_fit_the_expected_count_with_room() {
        // P1, k = 10: rank 1 of 4,096 over 10⁶ rows, ~244 candidates per query → 5·244 + 64.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, 10_000, 80 << 30), 1285);
        // The whole base as the sample: k itself, plus room for ties.
        assert_eq!(knn_slot_capacity(10, 3000, 3000, 10, 100, 80 << 30), 87);
        // Rank 2 (P1, k = 10 since v49): 488 expected, 1,934 a slot, 1.9·10⁷ values ranked on the
        // device, so within the budget alone.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 2, 10_000, 80 << 30), 1934);
        // Large k (P1, k = 1,000: rank 9, slots beyond KNN_RANK_SLOTS to copy) or too many
        // queries: no slots, write passes instead.
        assert_eq!(knn_slot_capacity(1000, 1_000_000, 4096, 9, 10_000, 80 << 30), 0);
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, MAX_PASS_ROWS + 1, 80 << 30), 0);
        // P1's 1.3·10⁷ slot values take 154 MB: not within a quarter of a 256 MiB budget.
        assert_eq!(knn_slot_capacity(10, 1_000_000, 4096, 1, 10_000, 256 << 20), 0);
    }

    #[test]
    fn tiles_below_the_minimum_are_an_error_that_names_the_limit() {
        // 2-D rows take 106 bytes: 415K gives tiles of 1,002 rows (the selftest's case).
        assert_eq!(tile_rows(415 << 10, 2, 415 << 10, "GPU join").unwrap(), 1002);
        let err = tile_rows(64 << 10, 2, 64 << 10, "GPU join").unwrap_err().strip_backtrace();
        assert_eq!(
            err,
            "Resources exhausted: GPU join: option gpu_memory_limit=64K leaves room for 154 rows of 2 dimensions per input tile \
             (106 bytes a row, a quarter of the limit per tile); at least 256 rows need gpu_memory_limit=106K"
        );
        let err = tile_rows(1000, 128, 0, "GPU kNN").unwrap_err().strip_backtrace();
        assert!(
            err.contains("GPU kNN: the device has 1000 bytes available, room for 0 rows of 128 dimensions"),
            "{err}"
        );
    }

    #[test]
    fn knn_samples_within_their_limits() {
        assert_eq!(knn_sample_len(1, false), 1);
        assert_eq!(knn_sample_len(1024, false), 1024);
        assert_eq!(knn_sample_len(10_000, false), 1024);
        // P2: 60,000 rows.
        assert_eq!(knn_sample_len(60_000, false), 1875);
        // P1: 1M rows.
        assert_eq!(knn_sample_len(1_000_000, false), KNN_SAMPLE);
        // Tensor cores: KNN_SAMPLE rows, the whole base up to that.
        assert_eq!(knn_sample_len(1, true), 1);
        assert_eq!(knn_sample_len(3000, true), 3000);
        assert_eq!(knn_sample_len(60_000, true), KNN_SAMPLE);
        assert_eq!(knn_sample_len(1_000_000, true), KNN_SAMPLE);
    }

    #[test]
    fn knn_sample_ranks() {
        // The whole base as the sample: the k-th distance itself.
        assert_eq!(knn_sample_rank(10, 3000, 3000), 10);
        // P1: 1M rows, 4096 sampled. k = 10: the sample minimum covers ~244 rows ≥ 3.9·10, but
        // 4 % of queries would fall short (1 − e^−0.041); rank 2 leaves 0.08 %.
        assert_eq!(knn_sample_rank(10, 1_000_000, 4096), 2);
        // k = 1: 0.4 % short at rank 1.
        assert_eq!(knn_sample_rank(1, 1_000_000, 4096), 1);
        // k = 1,000 (λ = 4.1): 9 by the count (1.6 % short; 10 would leave 0.65 %, but the sample's
        // rank stops at 2).
        assert_eq!(knn_sample_rank(1000, 1_000_000, 4096), 9);
        // P2: 60,000 rows, 1,875 sampled, k = 10 (λ = 0.31): 2 (4 % short; 3 would leave 0.4 %).
        assert_eq!(knn_sample_rank(10, 60_000, 1875), 2);
        // 4,096 sampled (λ = 0.68): 3 by the count (3.2 % short; 4 would leave 0.5 %).
        assert_eq!(knn_sample_rank(10, 60_000, 4096), 3);
        // k = 10,000 (λ = 41): the sample's rank, 58 (1 % short), below the count's 85.
        assert_eq!(knn_sample_rank(10_000, 1_000_000, 4096), 58);
        // λ = 1,000, where e^−λ underflows: still the sample's rank (λ + 2.3√λ), not an infinite
        // radius.
        let rank = knn_sample_rank(244_141, 1_000_000, 4096);
        assert!((1070..1080).contains(&rank), "{rank}");
        // k = 900,000 (λ = 3,686): the sample's rank, 3,829 of its 4,096 (the count's 7,400 is
        // beyond the sample).
        assert_eq!(knn_sample_rank(900_000, 1_000_000, 4096), 3829);
        // More than the sample holds: rank sample_len + 1, i.e. an infinite first radius.
        assert_eq!(knn_sample_rank(999_990, 1_000_000, 4096), 4097);
    }

    #[test]
    fn tensor_cores_serve_only_the_dot_product_filters() {
        for metric in Metric::ALL {
            let gemm = gemm_metric(metric);
            let params = filter_params(metric, 128, gemm, Some(-3));
            let dot_filter = gemm || metric == Metric::InnerProduct;
            assert_eq!(params.tensor_cores != 0, dot_filter, "{metric}: brute_join_tc computes dot products only");
            if dot_filter {
                assert!(params.dot_margin > filter_params(metric, 128, gemm, None).dot_margin);
                assert_eq!(params.tc_scale, 0.125);
            }
        }
    }

    #[test]
    fn tensor_core_scales_bring_the_largest_coordinate_below_two_to_the_fourteenth() {
        for largest in [1.0f32, 0.75, 3.0, 1e-3, 65_504.0, 1e18, 2f32.powi(73), 1e-30, f32::MIN_POSITIVE / 4.0] {
            let a = tc_scale_exponent(largest).unwrap();
            let scaled = largest as f64 * 2f64.powi(a);
            assert!(scaled < 16_384.0 && (scaled >= 8_192.0 || a == 60), "{largest}: 2^{a} gives {scaled}");
        }
        assert_eq!(tc_scale_exponent(0.0), Some(60));
        assert_eq!(tc_scale_exponent(2f32.powi(74)), None);
        assert_eq!(tc_scale_exponent(f32::INFINITY), None);
        assert_eq!(tc_scale_exponent(f32::NAN), None);
    }

    /// brute_join_tc's arithmetic on the CPU at its worst: coordinates scaled by 2^a and rounded to
    /// f16 (to nearest even; f16's subnormal range flushed to zero), exact products, every
    /// accumulation truncated toward zero. The scaled GEMM score stays within half of
    /// `tensor_core_margin`'s margin, plus its η and floor terms, of the exact scaled squared
    /// distance, and the kernel's separated filter test passes a pair whose limit is its exact
    /// squared distance.
    #[test]
    fn tensor_core_scores_stay_within_half_the_margin() {
        use rand::{Rng, SeedableRng};
        let half = |x: f32| -> f32 {
            let v = x as f64;
            if v.abs() < 2f64.powi(-14) {
                return 0.0;
            }
            let ulp = 2f64.powi(v.abs().log2().floor() as i32 - 10);
            ((v / ulp).round_ties_even() * ulp) as f32
        };
        let toward_zero = |a: f32, b: f32| {
            let exact = a as f64 + b as f64;
            let near = exact as f32;
            if (near as f64).abs() > exact.abs() {
                if near > 0.0 { near.next_down() } else { near.next_up() }
            } else {
                near
            }
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut worst = 0f64;
        for dim in [2usize, 8, 128, 784] {
            let TensorCoreMargin { margin, floor, eta } = tensor_core_margin(dim);
            for case in 0..200 {
                // Mixed magnitudes (1e-3 … 1e3, or down to 1e-9 in every third case, whose smallest
                // coordinates fall into f16's subnormal range) and near-duplicate pairs, where the
                // score is small.
                let low = if case % 3 == 0 { -9.0 } else { -3.0 };
                let scale: Vec<f64> = (0..dim).map(|_| 10f64.powf(rng.random_range(low..3.0))).collect();
                let x: Vec<f64> = scale.iter().map(|s| s * rng.random_range(-1.0..1.0)).collect();
                let y: Vec<f64> = if case % 2 == 0 {
                    x.iter().map(|v| v * (1.0 + rng.random_range(-1e-4..1e-4))).collect()
                } else {
                    scale.iter().map(|s| s * rng.random_range(-1.0..1.0)).collect()
                };
                let (xf, yf): (Vec<f32>, Vec<f32>) =
                    (x.iter().map(|&v| v as f32).collect(), y.iter().map(|&v| v as f32).collect());
                let largest = xf.iter().chain(&yf).fold(0f32, |m, v| m.max(v.abs()));
                let a = tc_scale_exponent(largest).unwrap();
                let (s1, s2) = (2f32.powi(a), 2f32.powi(2 * a));
                let sq = |v: &[f32]| v.iter().map(|&a| a as f64 * a as f64).sum::<f64>() as f32;
                let dot = xf.iter().zip(&yf).fold(0f32, |acc, (&a, &b)| toward_zero(acc, half(a * s1) * half(b * s1)));
                let (sx, sy) = (sq(&xf), sq(&yf));
                let score = (sx * s2) as f64 + (sy * s2) as f64 - 2.0 * dot as f64;
                let exact: f64 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
                let r = ((sx.sqrt() + sy.sqrt()) * s1) as f64;
                let allowed = 0.5 * margin as f64 * r * r + eta as f64 * r + floor as f64;
                let ratio = (score - exact * s2 as f64).abs() / allowed;
                worst = worst.max(ratio);
                assert!(
                    ratio <= 1.0,
                    "dim {dim}, case {case}: error {} is {ratio} of what the margin allows",
                    (score - exact * s2 as f64).abs()
                );
                // The kernel's separated test (tc_row_bound, tc_col_offset: rounded toward
                // passing) with the tightest limit this pair meets: the pair passes.
                let down = |v: f64| -round_up(-v);
                let widening = |n: f32| {
                    let n = n * s1;
                    round_up(
                        round_up(round_up(2.0 * margin as f64 * n as f64) as f64 * n as f64) as f64
                            + round_up(eta as f64 * n as f64) as f64,
                    )
                };
                let limit = round_up(round_up(exact) as f64 * s2 as f64);
                let bound = round_up(
                    round_up(limit as f64 + round_up(widening(sx.sqrt()) as f64 + floor as f64) as f64) as f64
                        - (sx * s2) as f64,
                );
                let offset = down((sy * s2) as f64 - widening(sy.sqrt()) as f64);
                assert!(
                    down(-2.0 * dot as f64 + offset as f64) <= bound,
                    "dim {dim}, case {case}: a pair at the limit fails the separated test"
                );
            }
        }
        assert!(worst > 1e-4, "the test reached only {worst} of the margin: it exercises nothing");
    }
}
