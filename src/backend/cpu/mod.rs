//! The exact CPU backend on every core (rayon): the fallback when there is no GPU and the oracle
//! every other backend is tested against.
//!
//! * ε-join / range query: the ε-grid of `index::grid` when its cost model says it prunes, with
//!   unidirectional comparison for self-joins (each unordered pair computed once), the `±r` window
//!   on the sort dimension inside each neighbour cell, and the short-circuited exact check
//!   (`backend::grid_join`); Böhm et al.'s quantile directory where asked (`backend::directory`).
//!   Otherwise blocked brute force: for L2, L2², cosine and inner product an f32 GEMM tile filter
//!   whose error is bounded (see [`GemmSide`]) followed by the exact f64 check of every pair it
//!   cannot rule out; for L1 and L∞ the exact check on every pair.
//! * kNN: blocked brute force with the same f32 filter and bounded per-query selection, then an
//!   exact f64 re-rank, so the answer is exactly the k smallest f64 distances (ties by position).
//! * Text metrics: `backend::text`; the List of Clusters: `backend::list_of_clusters`.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};

use crate::backend::cpu::context::JoinContext;
use crate::backend::cpu::direct::{DirectColumns, direct_join, knn_direct_unit};
use crate::backend::cpu::gemm::{gemm_join, gemm_sides, knn_gemm_unit};
use crate::backend::plan::bounds::score_threshold;
use crate::backend::plan::exact::ExactCheck;
use crate::backend::plan::gemm_form;
use crate::backend::plan::topk::{Neighbour, k_smallest, push_ranked};
use crate::backend::{Backend, JoinRequest, KnnRequest, ResultChunk, ResultSink, RunStats};
use crate::index::{GridIndex, JoinStrategy, brute_force_run_ns};
use crate::op::{IndexChoice, Metric};
use crate::vectors::Vectors;

pub mod approx;
pub mod bits;
mod context;
mod direct;
pub mod directory;
mod gemm;
pub mod grid_join;
pub mod list_of_clusters;
pub mod sets;
pub mod text;
mod tiles;

/// Query rows per kNN GEMM tile: the query block is packed once per base tile, so larger blocks
/// pack it fewer times (measured on the 100k×128, 1k-query bench: 64 → 0.345 s, 256 → 0.254 s).
const KNN_TILE_QUERIES: usize = 256;
/// Bytes of working memory the cores' kNN units hold together (unless a unit of one query holds
/// more).
const KNN_WORKING_BYTES: usize = 128 << 20;
/// Bytes a kNN unit holds a query for each neighbour asked for: the selection of upper bounds
/// (16 bytes an entry, up to 1.25 k + 8, in a vector that grows by doubling), the candidates'
/// lower bounds (8 bytes, up to 2 k + 1024) and the exact selection and result (16 bytes each).
const KNN_QUERY_BYTES_PER_NEIGHBOUR: usize = 80;
/// Bytes of results a wave of kNN units holds at most (unless the cores outnumber its blocks).
const KNN_WAVE_BYTES: usize = 64 << 20;

/// The exact backend on every CPU core.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn searches_parts_on_cpu(&self) -> bool {
        true
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        if request.index == IndexChoice::ListOfClusters && list_of_clusters::usable(request.left, request.right) {
            return list_of_clusters::join(request, sink);
        }
        if request.metric.is_text() {
            return text::join(request, sink);
        }
        if request.metric.is_set_or_bits() {
            return match holds_bits(request.metric, request.left, request.right) {
                true => bits::join(request, sink),
                false => sets::join(request, sink),
            };
        }
        let start = Instant::now();
        let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
        let exact = ExactCheck::new(metric, threshold, left, right);
        let mut stats = RunStats::default();
        if left.is_empty() || right.is_empty() {
            return Ok(stats);
        }
        let candidates = AtomicU64::new(0);
        let context = JoinContext { request, exact: &exact, candidates: &candidates, sink };

        let (strategy, spaces) = (&request.plan().strategy, request.spaces());
        match strategy {
            JoinStrategy::Grid(geometry) => {
                stats.indexed_dims = geometry.dims.len();
                let left_index = GridIndex::build(&geometry, spaces.left(), left.dim);
                let right_index = match self_join {
                    Some(_) => None,
                    None => Some(GridIndex::build(&geometry, spaces.right(), right.dim)),
                };
                stats.build_time = start.elapsed();
                let probe = Instant::now();
                grid_join::grid_join(
                    &context,
                    &geometry,
                    &left_index,
                    right_index.as_ref(),
                    spaces.left(),
                    spaces.right(),
                )?;
                stats.probe_time = probe.elapsed();
            }
            JoinStrategy::Directory(shape) => {
                directory::join(&context, &shape, spaces.left(), spaces.right(), &mut stats)?;
            }
            JoinStrategy::BruteForce => {
                let limit = score_threshold(metric, threshold);
                let sides = gemm_sides(left, right, metric, self_join.is_some(), Some(limit));
                let direct = if sides.is_none() { DirectColumns::new(left, right) } else { None };
                stats.build_time = start.elapsed();
                let probe = Instant::now();
                match &sides {
                    Some((l, r)) => gemm_join(&context, l, r.as_ref().unwrap_or(l))?,
                    None => direct_join(&context, direct.as_ref())?,
                }
                stats.probe_time = probe.elapsed();
            }
        }
        stats.candidates = candidates.into_inner();
        Ok(stats)
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let KnnRequest { base, queries, metric, k, .. } = *request;
        let k = k.min(base.len());
        if k == 0 || queries.is_empty() {
            return Ok(RunStats::default());
        }
        let clusters = match request.index {
            IndexChoice::ListOfClusters => true,
            IndexChoice::Auto => list_of_clusters::pays(request, k),
            _ => false,
        };
        if clusters && list_of_clusters::usable(queries, base) {
            return list_of_clusters::knn(request, k, sink);
        }
        if request.metric.is_text() {
            return text::knn(request, sink);
        }
        if request.metric.is_set_or_bits() {
            return match holds_bits(request.metric, request.queries, request.base) {
                true => bits::knn(request, sink),
                false => sets::knn(request, sink),
            };
        }
        let start = Instant::now();
        let mut stats = RunStats::default();
        if let Some(approx) = request.approx {
            if let Some(target) = approx.recall {
                let exact_ns = brute_force_run_ns(queries.len(), base.len(), base.dim, gemm_form(metric), false)
                    / rayon::current_num_threads() as f64;
                let run = |request: &KnnRequest, sink: &dyn ResultSink| self.knn(request, sink);
                return crate::backend::plan::recall::knn_to_recall(
                    request, approx, target, "cores", exact_ns, &run, sink,
                );
            }
            return approx::knn(request, approx, k, sink);
        }
        let exact = ExactCheck::new(metric, f64::INFINITY, queries, base);
        let sides = gemm_sides(queries, base, metric, false, None).and_then(|(q, b)| Some((q, b?)));
        let direct = if sides.is_none() { DirectColumns::new(queries, base) } else { None };
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        let candidates = AtomicU64::new(0);

        // Work units are (query block, base segment); segments keep every core busy when there are
        // few queries, and a unit returns its exact top-k, so merging segments is a plain k-select.
        let threads = rayon::current_num_threads();
        // Each core's unit holds about KNN_QUERY_BYTES_PER_NEIGHBOUR × k bytes a query while it
        // works: blocks of fewer queries where k is large keep the cores' units within
        // KNN_WORKING_BYTES together (k = 1000 on 16 cores: 104 queries, 256 held 256 MB).
        let block = KNN_WORKING_BYTES / (threads * k * KNN_QUERY_BYTES_PER_NEIGHBOUR).max(1);
        let block = block.clamp(1, KNN_TILE_QUERIES);
        let blocks = queries.len().div_ceil(block);
        let segments = (2 * threads).div_ceil(blocks).clamp(1, base.len().div_ceil(8192).max(1));
        let segment_len = base.len().div_ceil(segments);
        // A wave's results wait for its last unit before they are merged and sent in order: four
        // units a core, but no more blocks than hold KNN_WAVE_BYTES of results (16 bytes a
        // neighbour) unless that leaves a core idle (k = 1000 on 16 cores: 64 blocks held 262 MB).
        let block_bytes = block * k * std::mem::size_of::<Neighbour>() * segments;
        let wave = (4 * threads).div_ceil(segments).min((KNN_WAVE_BYTES / block_bytes).max(threads.div_ceil(segments)));
        let wave = wave.max(1);
        sink.start(blocks as u64);
        let mut chunk = ResultChunk::default();
        for wave_start in (0..blocks).step_by(wave) {
            let wave_blocks = wave_start..(wave_start + wave).min(blocks);
            let units: Vec<(usize, usize)> =
                wave_blocks.clone().flat_map(|b| (0..segments).map(move |s| (b, s))).collect();
            let results: Vec<Vec<Vec<Neighbour>>> = units
                .par_iter()
                .map(|&(b, s)| {
                    let q = b * block..((b + 1) * block).min(queries.len());
                    let r = s * segment_len..((s + 1) * segment_len).min(base.len());
                    match &sides {
                        Some((qs, bs)) => knn_gemm_unit(request, &exact, qs, bs, q, r, k, &candidates),
                        None => knn_direct_unit(request, &exact, direct.as_ref(), q, r, k, &candidates),
                    }
                })
                .collect();
            for (unit_results, b) in results.chunks(segments).zip(wave_blocks) {
                let first_query = b * block;
                let block_len = unit_results[0].len();
                let merged: Vec<Vec<Neighbour>> = (0..block_len)
                    .into_par_iter()
                    .map(|i| k_smallest(unit_results.iter().flat_map(|u| u[i].iter().copied()).collect(), k))
                    .collect();
                // Sent as soon as a chunk is full, not after the block: a block of 256 queries at
                // k = 1000 is 256,000 rows, and the sink holds two chunks ahead of its consumer
                // (with its batches being built and read, 57 of a server's 97 MB at its peak).
                for (i, list) in merged.into_iter().enumerate() {
                    push_ranked(&mut chunk, first_query + i, &list);
                    if chunk.len() >= sink.chunk_rows() {
                        sink.send(std::mem::take(&mut chunk))?;
                    }
                }
            }
            sink.advance(units.len().div_ceil(segments) as u64);
        }
        if !chunk.is_empty() {
            sink.send(chunk)?;
        }
        stats.candidates = candidates.into_inner();
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }
}

/// Whether a `jaccard` or `hamming` run compares bit strings (Hamming, Tanimoto) rather than sets.
pub(crate) fn holds_bits(metric: Metric, left: &Vectors, right: &Vectors) -> bool {
    metric == Metric::Hamming || left.holds_bits() || right.holds_bits()
}
