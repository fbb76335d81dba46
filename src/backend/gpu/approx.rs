//! Approximate kNN on the GPU (`knn(…, 'approx=true')` where the cost model sends it to the
//! device and finds the index's search faster there than the exact one: backend/auto/mod.rs). The
//! Multicurves index is the one the cores search (kept with the vectors: index/curves.rs; its
//! curves ordered on the device where this run builds it: approx_build.rs). Its curves' keys and
//! positions and its f32 rows are on the device (uploaded where the cores ordered the curves), the
//! queries are projected and keyed on the host, and kernels/approx.cu gives each query's best
//! candidates by whole f32 distance. Where the cores would walk the kNN graph (the same rule,
//! `walks_graph`: a kept base, or queries enough to repay its build), so does the device (building
//! the graph itself where the index has none yet: `graph_on_device`): the
//! curves give each query `seeds_per_curve` entries a curve, their `pool` nearest start the walk
//! (approx_walk), and the pool it ends with are the best candidates. The host measures the k best
//! and any within f32 rounding of them exactly (as the cores' search does: backend/cpu/approx.rs), so
//! each returned row carries its exact distance and its rank among the returned rows.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use datafusion::common::Result;
use datafusion::common::exec_datafusion_err;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use crate::backend::ResultChunk;
use crate::backend::cpu::approx::{build_graph, measured, walks_graph, within_rounding};
use crate::backend::gpu::{GpuBackend, RunError, RunResult, copy_failed};
use crate::backend::plan::exact::ExactCheck;
use crate::backend::plan::topk::Neighbour;
use crate::backend::plan::topk::push_ranked;
use crate::backend::{DeviceRun, KnnRequest, ResultSink, RunStats};
use crate::cuda::abi::FilterCode;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{
    ApproxBest, ApproxQueries, DeviceCurves, GraphCandidates, WALK_MAX_WIDTH, approx_capacity, approx_fits, approx_knn,
    approx_walk, curve_ranks, graph_nearest, walk_fits,
};
use crate::cuda::memory::{upload, zeroed};
use crate::cuda::{Error as GpuError, GpuDevice, ResidentKey};
use crate::index::curves::{Geometry, Multicurves};
use crate::index::graph::{DEGREE, NeighbourGraph, Offer, WIDTH, WINDOW};
use crate::op::Approx;
use crate::op::Metric;
use crate::vectors::Vectors;

/// Best candidates a query sends back per neighbour asked for: the k best by f32 distance and
/// room for those within rounding of the k-th, which the host measures exactly.
const KEEP_PER_NEIGHBOUR: usize = 2;
/// Most queries of one launch (their rows, keys and best lists stay on the device meanwhile).
const QUERY_TILE: usize = 1 << 16;
/// Most steps of a walk, per row of its pool (and 64 more): a walk ends once every row of its pool
/// is followed, at least `pool` steps; this bounds one that a graph would keep going.
const WALK_STEPS_PER_POOL_ROW: usize = 8;

const _: () = assert!(WIDTH <= WALK_MAX_WIDTH, "approx_walk follows at most WALK_MAX_WIDTH edges a row");

/// Device bytes a base row takes in the index: its f32 row, and its key and position on each curve.
pub(super) fn index_row_bytes(dim: usize, curves: usize) -> usize {
    4 * dim + 12 * curves
}

impl GpuBackend {
    /// The approximate kNN of `request` (whose index fits this run's `budget`: `GpuBackend::knn`
    /// tiles the base otherwise).
    pub(super) fn gpu_approx_knn(
        &self,
        request: &KnnRequest,
        approx: Approx,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> RunResult<RunStats> {
        let KnnRequest { base, queries, metric, .. } = *request;
        let k = request.k.min(base.len());
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if k == 0 || queries.is_empty() {
            return Ok(stats);
        }
        // Load the module now (once per process) so that it stays out of the run's times.
        self.device.function(Kernel::ApproxKnn)?;
        let start = Instant::now();
        let geometry = Geometry::of(metric).expect("approx metrics are checked at planning (functions::table)");
        let (index, kept, lists) = self.curves_ordered_here(base, geometry)?;
        let pool = approx.pool(k).min(index.len());
        let walks = walks_graph(request, approx, k) && walk_fits(&self.device, pool);
        let graph_kept = index.graph_built();
        stats.kept_indexes = usize::from(kept && (!walks || graph_kept));
        let exact = ExactCheck::new(metric, f64::INFINITY, queries, base);
        stats.build_time = start.elapsed();
        let (n, curves, dim) = (index.len(), index.curve_count(), base.dim);
        let per_curve = if walks { approx.seeds_per_curve(k) } else { approx.per_curve(k) }.min(n);
        let capacity = approx_capacity(curves, per_curve, n);
        if !approx_fits(&self.device, capacity) {
            return Err(RunError::Query(exec_datafusion_err!(
                "knn: approx_effort={} with k={k} takes {per_curve} entries on each of {curves} curves, more than a block of this GPU holds ({} bytes of shared memory); lower approx_effort or k, or use device=cpu",
                approx.effort,
                self.device.shared_memory_per_block
            )));
        }
        let keep = (KEEP_PER_NEIGHBOUR * k).max(k + 8).min(capacity);
        // A walk's seeds are the first `pool` of approx_knn's best, and its pool comes back.
        let keep = if walks { keep.max(pool) } else { keep };
        let filter = filter_code(metric);

        let uploading = Instant::now();
        let key: ResidentKey = index.clone();
        let (device_index, on_device) = self.device.kept_curves(&key, || match lists {
            // The lists this run's build left on the device: only the rows go up.
            Some(lists) => Ok(DeviceCurves {
                keys: lists.keys,
                positions: lists.positions,
                rows: upload(&self.device, index.all_values())?,
                n,
                curves,
                dim,
                graph: Default::default(),
            }),
            None => upload_curves(&self.device, &index, dim),
        })?;
        stats.resident_inputs += usize::from(on_device);
        stats.transfer_time += uploading.elapsed();
        let edges = if walks { Some(self.graph_edges(&index, &device_index, filter, &mut stats)?) } else { None };
        let query_bytes = 4 * dim + 8 * curves + 8 * keep;
        let tile = (budget / 4 / query_bytes).clamp(1, QUERY_TILE).min(queries.len());
        let mut tile_queries = ApproxQueries {
            rows: zeroed::<f32>(&self.device.stream, (tile * dim).max(1))?,
            keys: zeroed::<u64>(&self.device.stream, tile * curves)?,
            count: 0,
        };
        let mut best = ApproxBest {
            positions: zeroed::<u32>(&self.device.stream, tile * keep)?,
            scores: zeroed::<f32>(&self.device.stream, tile * keep)?,
            keep,
        };
        let mut measured_count = 0u64;
        let mut chunk = ResultChunk::default();
        sink.start(queries.len().div_ceil(tile) as u64);
        let probe = Instant::now();
        for first in (0..queries.len()).step_by(tile) {
            let rows = first..(first + tile).min(queries.len());
            let (values, keys) = query_tile(&index, queries, rows.clone());
            let uploading = Instant::now();
            let stream = &self.device.stream;
            stream.memcpy_htod(&values, &mut tile_queries.rows.slice_mut(0..values.len())).map_err(copy_failed)?;
            stream.memcpy_htod(&keys, &mut tile_queries.keys.slice_mut(0..keys.len())).map_err(copy_failed)?;
            tile_queries.count = rows.len();
            stats.transfer_time += uploading.elapsed();
            let searching = Instant::now();
            approx_knn(&self.device, &device_index, &tile_queries, per_curve, filter, &mut best)?;
            if let Some(edges) = edges {
                let steps = WALK_STEPS_PER_POOL_ROW * pool + 64;
                stats.graph_rows += approx_walk(
                    &self.device,
                    &device_index,
                    edges,
                    WIDTH,
                    &tile_queries,
                    filter,
                    pool,
                    steps,
                    &mut best,
                )?;
            }
            stream.synchronize().map_err(|e| GpuError::Device(format!("approx_knn failed: {e}")))?;
            stats.kernel_time += searching.elapsed();
            let downloading = Instant::now();
            let listed = rows.len() * keep;
            let positions = stream.clone_dtoh(&best.positions.slice(0..listed)).map_err(copy_failed)?;
            let scores = stream.clone_dtoh(&best.scores.slice(0..listed)).map_err(copy_failed)?;
            stats.transfer_time += downloading.elapsed();
            let lists: Vec<(u64, Vec<Neighbour>)> = rows
                .clone()
                .into_par_iter()
                .map(|q| {
                    let at = (q - first) * keep;
                    let mut candidates: Vec<(f32, u32)> = scores[at..at + keep]
                        .iter()
                        .zip(&positions[at..at + keep])
                        .filter(|&(_, &p)| p != u32::MAX)
                        .map(|(&s, &p)| (s, p))
                        .collect();
                    within_rounding(&mut candidates, k);
                    let list = measured(request, &exact, &index, q, candidates.iter().map(|&(_, p)| p as usize));
                    (candidates.len() as u64, list)
                })
                .collect();
            for (q, (count, list)) in rows.zip(&lists) {
                measured_count += count;
                push_ranked(&mut chunk, q, list);
            }
            if chunk.len() >= sink.chunk_rows() {
                sink.send(std::mem::take(&mut chunk))?;
            }
            sink.advance(1);
        }
        if !chunk.is_empty() {
            sink.send(chunk)?;
        }
        stats.curve_candidates = (queries.len() * curves * per_curve) as u64;
        stats.candidates = measured_count;
        stats.probe_time = probe.elapsed();
        stats.devices =
            vec![DeviceRun { ordinal: self.ordinal(), rows: queries.len(), base_rows: n, ..Default::default() }];
        Ok(stats)
    }
}

impl GpuBackend {
    /// The kNN graph's edges on the device, for a walk of `index`: the graph built here where the
    /// index has none yet (kept with the index, where the cores' search walks it too), its edges
    /// uploaded by the first search of this index that walks it.
    fn graph_edges<'d>(
        &self,
        index: &Multicurves,
        device_index: &'d DeviceCurves,
        filter: FilterCode,
        stats: &mut RunStats,
    ) -> RunResult<&'d CudaSlice<u32>> {
        let building = Instant::now();
        let graph = if index.graph_built() {
            index.graph(build_graph).0
        } else {
            // The kNN graph by NN-descent on the device. The cores' passes that choose diverse
            // edges search for every row twice, which the host would add to the device's build;
            // until the device runs them, its graph is the kNN one (docs/approx.md, "The index").
            let built = graph_on_device(&self.device, device_index, filter)?;
            index.graph(|_| built).0
        };
        stats.build_time += building.elapsed();
        let uploading = Instant::now();
        let edges = match device_index.graph.get() {
            Some(edges) => edges,
            None => {
                let edges = upload(&self.device, graph.edges())?;
                device_index.graph.get_or_init(|| edges)
            }
        };
        stats.transfer_time += uploading.elapsed();
        Ok(edges)
    }
}

/// The kNN graph of an index's rows (`on_device`: its curves and rows on `device`) built on the
/// device: the cores' rounds (index/graph.rs), each row's candidates measured by graph_nearest by
/// their whole f32 score under `filter`, where the cores measure a principal-coordinate proxy
/// (docs/approx.md#measured).
pub(super) fn graph_on_device(
    device: &GpuDevice,
    on_device: &DeviceCurves,
    filter: FilterCode,
) -> Result<NeighbourGraph, GpuError> {
    let ranks = curve_ranks(device, on_device)?;
    NeighbourGraph::build_by(on_device.n, |offer| {
        let candidates = match offer {
            Offer::Curves => GraphCandidates::Curves { ranks: &ranks, window: WINDOW },
            Offer::Neighbours { nearest, reverse } => GraphCandidates::Neighbours { nearest, reverse },
        };
        let nearest = graph_nearest(device, on_device, filter, candidates, DEGREE)?;
        device.stream.clone_dtoh(&nearest).map_err(copy_failed)
    })
}

/// The kNN graph of `index`'s rows (of `dim` values, ranked as `metric` ranks) built on `device`
/// (the self-test's comparison with the cores' graph).
pub fn graph_built_on_device(
    device: &GpuDevice,
    index: &Multicurves,
    dim: usize,
    metric: Metric,
) -> Result<NeighbourGraph, GpuError> {
    graph_on_device(device, &upload_curves(device, index, dim)?, filter_code(metric))
}

/// The f32 score the device ranks by, ordered as `metric` (squared under L2, L2² and cosine's
/// unit rows).
fn filter_code(metric: Metric) -> FilterCode {
    match metric {
        Metric::L1 => FilterCode::L1,
        Metric::LInf => FilterCode::LInf,
        _ => FilterCode::SquaredL2,
    }
}

/// `index`'s curves and f32 rows (of `dim` values) on `device`.
fn upload_curves(device: &GpuDevice, index: &Multicurves, dim: usize) -> Result<DeviceCurves, GpuError> {
    let (n, curves) = (index.len(), index.curve_count());
    let stream = &device.stream;
    let mut keys = zeroed::<u64>(stream, curves * n)?;
    let mut positions = zeroed::<u32>(stream, curves * n)?;
    for c in 0..curves {
        let (curve_keys, curve_positions) = index.curve(c);
        stream.memcpy_htod(curve_keys, &mut keys.slice_mut(c * n..(c + 1) * n)).map_err(copy_failed)?;
        stream.memcpy_htod(curve_positions, &mut positions.slice_mut(c * n..(c + 1) * n)).map_err(copy_failed)?;
    }
    let rows = upload(device, index.all_values())?;
    Ok(DeviceCurves { keys, positions, rows, n, curves, dim, graph: Default::default() })
}

/// Queries projected together, a block per task: small enough that a thousand queries keep
/// every core busy with their keys (16 Hilbert keys a query; blocks of 1,024 left 1,000 queries on
/// one core, 10 of the 12 ms their GPU search took on the H100 host).
const PROJECTED_BLOCK: usize = 32;

/// Queries `rows` in the index's terms: their f32 rows (unit rows under cosine) and their key on
/// each curve, on every core.
fn query_tile(index: &Multicurves, queries: &Vectors, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<u64>) {
    let blocks: Vec<(Vec<f32>, Vec<u64>)> = rows
        .clone()
        .step_by(PROJECTED_BLOCK)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|start| index.query_keys(queries, start..(start + PROJECTED_BLOCK).min(rows.end)))
        .collect();
    let (mut values, mut keys) = (Vec::new(), Vec::new());
    for (v, k) in blocks {
        values.extend(v);
        keys.extend(k);
    }
    (values, keys)
}
