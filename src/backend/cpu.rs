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

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use rayon::prelude::*;

use super::exact::{ExactCheck, write_self_pairs};
use super::plan::{FilterLimit, gemm_form, plan_join, score_threshold};
use super::simd::{Columns, LANES, gemm_lower_bounds, tile_hits};
use super::topk::{KSmallest, Neighbour, k_smallest, push_ranked};
use super::{Backend, JoinRequest, KnnRequest, PairWriter, ResultChunk, ResultSink, RunStats};
use crate::index::{GridIndex, JoinStrategy, brute_force_run_ns};
use crate::op::{IndexChoice, Metric, dot};
use crate::vectors::{Coord, Row, Values, Vectors};

/// Left rows per join tile (brute-force joins and range queries).
const TILE_QUERIES: usize = 64;
/// Query rows per kNN GEMM tile: the query block is packed once per base tile, so larger blocks
/// pack it fewer times (measured on the 100k×128, 1k-query bench: 64 → 0.345 s, 256 → 0.254 s).
const KNN_TILE_QUERIES: usize = 256;
/// Base rows per GEMM tile (a 64 × 1024 f32 tile is 256 KiB, within L2).
const TILE_BASE: usize = 1024;
/// Left rows up to which a tile's dot products are computed directly rather than by a GEMM, whose
/// packing of the right rows costs more than the products of so few left rows
/// (docs/optimisations.md, v131).
const DIRECT_DOT_ROWS: usize = 16;

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
        if request.index == IndexChoice::ListOfClusters && super::list_of_clusters::usable(request.left, request.right)
        {
            return super::list_of_clusters::join(request, sink);
        }
        if request.metric.is_text() {
            return super::text::join(request, sink);
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

        let (spaces, strategy) = plan_join(request);
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
                super::grid_join::grid_join(
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
                super::directory::join(&context, &shape, spaces.left(), spaces.right(), &mut stats)?;
            }
            JoinStrategy::BruteForce => {
                let sides = gemm_sides(left, right, metric, self_join.is_some());
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
            IndexChoice::Auto => super::list_of_clusters::pays(request, k),
            _ => false,
        };
        if clusters && super::list_of_clusters::usable(queries, base) {
            return super::list_of_clusters::knn(request, k, sink);
        }
        if request.metric.is_text() {
            return super::text::knn(request, sink);
        }
        let start = Instant::now();
        let mut stats = RunStats::default();
        if let Some(approx) = request.approx {
            if let Some(target) = approx.recall {
                let exact_ns = brute_force_run_ns(queries.len(), base.len(), base.dim, gemm_form(metric), false)
                    / rayon::current_num_threads() as f64;
                let run = |request: &KnnRequest, sink: &dyn ResultSink| self.knn(request, sink);
                return super::approx_recall::knn_to_recall(request, approx, target, "cores", exact_ns, &run, sink);
            }
            return super::approx::knn(request, approx, k, sink);
        }
        let exact = ExactCheck::new(metric, f64::INFINITY, queries, base);
        let sides = gemm_sides(queries, base, metric, false).and_then(|(q, b)| Some((q, b?)));
        let direct = if sides.is_none() { DirectColumns::new(queries, base) } else { None };
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        let candidates = AtomicU64::new(0);

        // Work units are (query block, base segment); segments keep every core busy when there are
        // few queries, and a unit returns its exact top-k, so merging segments is a plain k-select.
        let threads = rayon::current_num_threads();
        let block = (64 << 20) / (k * 16).max(1); // keep per-block candidate lists near 64 MiB
        let block = block.clamp(1, KNN_TILE_QUERIES);
        let blocks = queries.len().div_ceil(block);
        let segments = (2 * threads).div_ceil(blocks).clamp(1, base.len().div_ceil(8192).max(1));
        let segment_len = base.len().div_ceil(segments);
        let wave = (4 * threads).div_ceil(segments).max(1);
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
                for (i, list) in merged.into_iter().enumerate() {
                    push_ranked(&mut chunk, first_query + i, &list);
                }
                if chunk.len() >= sink.chunk_rows() {
                    sink.send(std::mem::take(&mut chunk))?;
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

/// The f32 filter sides of a GEMM-form metric (the right one omitted for a self-join), centred on
/// the right input's mean; `None` when the metric has no GEMM form or the values exceed f32 scores.
///
/// A right input kept in f32 whose mean lies near the origin (`64·‖μ‖² ≤` its mean squared norm,
/// as for embeddings and other data centred by construction) is not centred: its values are then
/// its filter rows as they are, with no copy, and the norms, and so the margin, are larger by a
/// few percent at most. The inner product never centres.
fn gemm_sides<'v>(
    left: &'v Vectors,
    right: &'v Vectors,
    metric: Metric,
    same: bool,
) -> Option<(GemmSide<'v>, Option<GemmSide<'v>>)> {
    if !gemm_form(metric) {
        return None;
    }
    let uncentred = match (&right.values, metric) {
        // (Norms too large for f32 scores uncentred may still fit centred: then centre.)
        (Values::F32(_), Metric::L2 | Metric::L2Squared | Metric::InnerProduct) => GemmSide::new(right, metric, None)
            .filter(|side| {
                let mean_sq_norm = side.sq_norms.iter().map(|&s| s as f64).sum::<f64>() / side.len().max(1) as f64;
                metric == Metric::InnerProduct || {
                    let center = sampled_mean(right);
                    64.0 * dot(&center, &center) <= mean_sq_norm
                }
            }),
        _ => None,
    };
    // Only L2 and L2² centre (cosine normalises its rows, the inner product keeps them).
    let origin = match metric {
        Metric::L2 | Metric::L2Squared if uncentred.is_none() => Some(right.mean()),
        _ => None,
    };
    let right_side = match uncentred {
        Some(side) => side,
        None => GemmSide::new(right, metric, origin)?,
    };
    if same {
        return Some((right_side, None));
    }
    Some((GemmSide::new(left, metric, origin)?, Some(right_side)))
}

/// The mean of at most 1,024 rows spread evenly over `v`: enough to tell data centred near the
/// origin from data far from it, without a pass over every row (the choice only sizes the
/// filter's margin; both are exact).
fn sampled_mean(v: &Vectors) -> Vec<f64> {
    let step = v.len().div_ceil(1024).max(1);
    let mut sum = vec![0.0; v.dim];
    let mut rows = 0usize;
    for i in (0..v.len()).step_by(step) {
        crate::on_row!(v.row(i), |row| sum.iter_mut().zip(row).for_each(|(s, x)| *s += x.f64()));
        rows += 1;
    }
    sum.iter_mut().for_each(|s| *s /= rows.max(1) as f64);
    sum
}

/// Everything a join worker needs.
pub(super) struct JoinContext<'a> {
    pub(super) request: &'a JoinRequest<'a>,
    pub(super) exact: &'a ExactCheck,
    pub(super) candidates: &'a AtomicU64,
    pub(super) sink: &'a dyn ResultSink,
}

impl JoinContext<'_> {
    pub(super) fn writer(&self) -> PairWriter<'_> {
        PairWriter::new(self.sink, self.request.self_join.is_some_and(|s| s.ordered))
    }

    /// Writes a self-join pair with its smaller position first.
    #[inline]
    pub(super) fn push(&self, writer: &mut PairWriter, a: u32, b: u32, distance: f64) -> Result<()> {
        if self.request.self_join.is_some() && a > b {
            writer.push(b, a, distance)
        } else {
            writer.push(a, b, distance)
        }
    }

    /// Self-join with `include_self`: each vector against itself, by the same exact test.
    pub(super) fn self_pairs(&self, positions: impl IntoIterator<Item = usize>, writer: &mut PairWriter) -> Result<()> {
        if !self.request.self_join.is_some_and(|s| s.include_self) {
            return Ok(());
        }
        write_self_pairs(self.exact, self.request.left, positions, writer)
    }
}

/// Brute force for L1 and L∞: each right tile through the vectorised f32 filter for a block of
/// left rows at the threshold's FilterLimit (no pair within the threshold is lost), the pairs that
/// pass by the exact check; without f32 columns (values beyond f32), the exact check on every pair.
fn direct_join(ctx: &JoinContext, columns: Option<&DirectColumns>) -> Result<()> {
    let JoinRequest { left, right, metric, threshold, self_join, .. } = *ctx.request;
    let blocks = left.len().div_ceil(TILE_QUERIES);
    ctx.sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = ctx.writer();
        let rows = b * TILE_QUERIES..((b + 1) * TILE_QUERIES).min(left.len());
        let mut tested = 0u64;
        match columns {
            Some(columns) => {
                let limit = FilterLimit::new(metric, threshold, left.dim, columns.extent);
                let left_columns = Columns { values: &columns.queries, len: left.len() };
                let tile_rows = columns.tile_rows;
                let mut hits = Vec::new();
                // Self-joins: only tiles with a right row after the block's first left row.
                let first_tile = if self_join.is_some() { (rows.start + 1) / tile_rows } else { 0 };
                for t in first_tile..right.len().div_ceil(tile_rows) {
                    let tile = &columns.base[t * tile_rows * left.dim..(t + 1) * tile_rows * left.dim];
                    let tile_columns = Columns { values: tile, len: tile_rows };
                    tile_hits(
                        limit.kind,
                        left.dim,
                        left_columns,
                        rows.clone(),
                        tile_columns,
                        0..tile_rows,
                        limit.limit,
                        &mut hits,
                    );
                    for &(row, offset) in &hits {
                        let (i, j) = (rows.start + row as usize, t * tile_rows + offset as usize);
                        if j >= right.len() || (self_join.is_some() && j <= i) {
                            continue;
                        }
                        tested += 1;
                        if let Some(d) = ctx.exact.within(left.row(i), right.row(j), i, j) {
                            ctx.push(&mut writer, i as u32, j as u32, d)?;
                        }
                    }
                }
            }
            None => {
                for i in rows.clone() {
                    let from = if self_join.is_some() { i + 1 } else { 0 };
                    for j in from..right.len() {
                        tested += 1;
                        if let Some(d) = ctx.exact.within(left.row(i), right.row(j), i, j) {
                            ctx.push(&mut writer, i as u32, j as u32, d)?;
                        }
                    }
                }
            }
        }
        ctx.candidates.fetch_add(tested, Ordering::Relaxed);
        ctx.self_pairs(rows, &mut writer)?;
        ctx.sink.advance(1);
        writer.flush()
    })
}

/// One side of the f32 GEMM filter.
///
/// # Why the filter loses no pair
/// Vectors are transformed in f64 (centred on the base mean for L2/L2², unit-normalised for
/// cosine, unchanged for inner product), rounded to f32 (`x̃`), and the score is
/// `s = ‖x̃‖² + ‖ỹ‖² − 2 x̃·ỹ` (squared distance; twice the cosine distance) or `s = −x̃·ỹ`. With
/// `u = 2⁻²⁴`, a dot product of length d in any summation order errs by at most `d·u·Σ|x̃ᵢỹᵢ|`, the
/// norms by `u` relative, the f64→f32 rounding and the f64 transform by `~2u·(‖x‖+‖y‖)²`, and the
/// final additions by `~4u(‖x‖+‖y‖)²`: in all `|s − exact| ≤ (d/2 + 8)·u·(‖x̃‖ + ‖ỹ‖)²`. The
/// filter keeps a margin of `(d + 16)·2⁻²³·(‖x̃‖ + ‖ỹ‖)²`, four times that, so a pair whose exact
/// score is within the threshold always passes and is then decided by the exact f64 check.
/// Centring keeps the norms, and so the margin, small for data far from the origin.
struct GemmSide<'v> {
    dim: usize,
    /// Transformed vectors in f32, row-major (the vectors themselves where they are kept in f32
    /// and neither centred nor normalised).
    data: Cow<'v, [f32]>,
    /// ‖x̃‖² per row.
    sq_norms: Vec<f32>,
    /// ‖x̃‖ per row.
    norms: Vec<f32>,
    /// Inner product: the score is `−x̃·ỹ`.
    inner_product: bool,
    /// Margin factor `(d + 16)·2⁻²³`.
    margin: f32,
    /// Absolute margin `(d + 16)·2⁻¹⁴⁰` for scores near f32's subnormal range, where rounding
    /// errors are absolute (at most 2⁻¹⁴⁹ per operation) rather than relative.
    floor: f32,
}

impl<'v> GemmSide<'v> {
    /// The side of `v`, centred on `center` where given (L2, L2²; `None`: the origin). `None` when
    /// a norm is too large for f32 scores (beyond 10¹⁸): the caller then computes every distance
    /// exactly instead.
    fn new(v: &'v Vectors, metric: Metric, center: Option<&[f64]>) -> Option<Self> {
        let dim = v.dim;
        let data = match (&v.values, metric, center) {
            (Values::F32(values), Metric::L2 | Metric::L2Squared, None)
            | (Values::F32(values), Metric::InnerProduct, _) => Cow::Borrowed(values.as_slice()),
            _ => {
                let mut data = vec![0f32; v.values.len()];
                data.par_chunks_mut(dim).enumerate().for_each(|(i, out)| {
                    crate::on_row!(v.row(i), |row| match (metric, center) {
                        (Metric::Cosine, _) => {
                            let norm = dot(row, row).sqrt();
                            out.iter_mut().zip(row).for_each(|(o, x)| *o = (x.f64() / norm) as f32);
                        }
                        (Metric::InnerProduct, _) | (_, None) => {
                            out.iter_mut().zip(row).for_each(|(o, x)| *o = x.f64() as f32)
                        }
                        (_, Some(center)) => {
                            out.iter_mut().zip(row).zip(center).for_each(|((o, x), c)| *o = (x.f64() - c) as f32)
                        }
                    })
                });
                Cow::Owned(data)
            }
        };
        let sq_norms: Vec<f32> = data.par_chunks(dim).map(|r| super::simd::sum_squares(r) as f32).collect();
        if sq_norms.iter().any(|s| s.is_nan() || *s > 1e36) {
            return None;
        }
        let norms = sq_norms.iter().map(|s| s.sqrt()).collect();
        let margin = (dim as f32 + 16.0) / (1u32 << 23) as f32;
        let floor = (dim as f32 + 16.0) * 2f32.powi(-140);
        let inner_product = metric == Metric::InnerProduct;
        Some(Self { dim, data, sq_norms, norms, inner_product, margin, floor })
    }

    fn len(&self) -> usize {
        self.norms.len()
    }

    /// `tile[i * cols + j] = x̃_(q0+i) · ỹ_(b0+j)` for the given row ranges of `self` and `other`.
    fn dot_tile(&self, other: &GemmSide, q: std::ops::Range<usize>, b: std::ops::Range<usize>, tile: &mut Vec<f32>) {
        let (m, n, k) = (q.len(), b.len(), self.dim);
        tile.resize(m * n, 0.0);
        if m <= DIRECT_DOT_ROWS {
            let (a, b) = (&self.data[q.start * k..q.end * k], &other.data[b.start * k..b.end * k]);
            return super::simd::dot_rows(a, m, b, n, k, tile);
        }
        // SAFETY: `a` holds m rows of k values (row stride k), `b` holds n rows of k values read as
        // a k × n matrix (row stride 1, column stride k), `c` holds m × n values (row stride n);
        // all three slices are at least that long and `c` does not alias the inputs.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                self.data[q.start * k..].as_ptr(),
                k as isize,
                1,
                other.data[b.start * k..].as_ptr(),
                1,
                k as isize,
                0.0,
                tile.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    }

    /// Score of row `i` of `self` against row `j` of `other`, given their dot product.
    #[inline]
    fn score(&self, other: &GemmSide, i: usize, j: usize, dot: f32) -> f32 {
        if self.inner_product { -dot } else { self.sq_norms[i] + other.sq_norms[j] - 2.0 * dot }
    }

    /// Lower bounds `score − slack` of row `i` against rows `js` of `other`, given their dots.
    #[inline]
    fn lower_bounds(&self, other: &GemmSide, i: usize, js: std::ops::Range<usize>, dots: &[f32], out: &mut Vec<f32>) {
        let (sq, norms) = (&other.sq_norms[js.clone()], &other.norms[js]);
        gemm_lower_bounds(
            dots,
            self.sq_norms[i],
            self.norms[i],
            sq,
            norms,
            self.margin,
            self.floor,
            self.inner_product,
            out,
        );
    }

    /// The error margin of a score (see the type docs).
    #[inline]
    fn slack(&self, other: &GemmSide, i: usize, j: usize) -> f32 {
        let r = self.norms[i] + other.norms[j];
        self.margin * r * r + self.floor
    }
}

/// Brute-force join through the f32 GEMM filter (L2, L2², cosine, inner product).
fn gemm_join(ctx: &JoinContext, left: &GemmSide, right: &GemmSide) -> Result<()> {
    let JoinRequest { left: lv, right: rv, metric, threshold, self_join, .. } = *ctx.request;
    let limit = score_threshold(metric, threshold);
    let blocks = left.len().div_ceil(TILE_QUERIES);
    ctx.sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = ctx.writer();
        let (mut tile, mut lower) = (Vec::new(), Vec::new());
        let q = b * TILE_QUERIES..((b + 1) * TILE_QUERIES).min(left.len());
        let first = if self_join.is_some() { q.start } else { 0 };
        let mut tested = 0u64;
        for b0 in (first..right.len()).step_by(TILE_BASE) {
            let r = b0..(b0 + TILE_BASE).min(right.len());
            left.dot_tile(right, q.clone(), r.clone(), &mut tile);
            for (i, row) in q.clone().zip(tile.chunks_exact(r.len())) {
                left.lower_bounds(right, i, r.clone(), row, &mut lower);
                for (j, &low) in r.clone().zip(&lower) {
                    if low <= limit && !(self_join.is_some() && j <= i) {
                        tested += 1;
                        if let Some(dist) = ctx.exact.within(lv.row(i), rv.row(j), i, j) {
                            ctx.push(&mut writer, i as u32, j as u32, dist)?;
                        }
                    }
                }
            }
        }
        ctx.candidates.fetch_add(tested, Ordering::Relaxed);
        ctx.self_pairs(q, &mut writer)?;
        ctx.sink.advance(1);
        writer.flush()
    })
}

/// Exact top-k of queries `q` within base rows `r`, through the f32 filter: a bounded selection of
/// upper bounds `s + margin` gives `U ≥` the k-th smallest exact score, every row whose lower bound
/// `s − margin ≤ U` is a candidate, and the exact f64 distances of the candidates decide.
#[allow(clippy::too_many_arguments)]
fn knn_gemm_unit(
    request: &KnnRequest,
    exact: &ExactCheck,
    queries: &GemmSide,
    base: &GemmSide,
    q: std::ops::Range<usize>,
    r: std::ops::Range<usize>,
    k: usize,
    candidates: &AtomicU64,
) -> Vec<Vec<Neighbour>> {
    let mut uppers: Vec<KSmallest> = q.clone().map(|_| KSmallest::new(k)).collect();
    let mut lists: Vec<Vec<(f32, u32)>> = q.clone().map(|_| Vec::new()).collect();
    let (mut tile, mut lower) = (Vec::new(), Vec::new());
    for b0 in r.clone().step_by(TILE_BASE) {
        let br = b0..(b0 + TILE_BASE).min(r.end);
        queries.dot_tile(base, q.clone(), br.clone(), &mut tile);
        for ((i, row), (upper, list)) in
            q.clone().zip(tile.chunks_exact(br.len())).zip(uppers.iter_mut().zip(lists.iter_mut()))
        {
            let mut bound = upper.bound() as f32;
            queries.lower_bounds(base, i, br.clone(), row, &mut lower);
            for ((j, &d), &low) in br.clone().zip(row).zip(&lower) {
                if low <= bound {
                    list.push((low, j as u32));
                    let upper_bound = queries.score(base, i, j, d) + queries.slack(base, i, j);
                    upper.push(Neighbour { distance: upper_bound as f64, position: j as u32 });
                    bound = upper.bound() as f32;
                }
            }
            if list.len() > 4 * k + 1024 {
                list.retain(|&(lower, _)| lower <= bound);
            }
        }
    }
    let mut tested = 0u64;
    let out = q
        .clone()
        .zip(uppers.into_iter().zip(lists))
        .map(|(i, (mut upper, list))| {
            let bound = upper.kth() as f32;
            let mut best = KSmallest::new(k);
            let passing = list.into_iter().filter(|&(lower, _)| lower <= bound).map(|(_, j)| j as usize);
            tested += offer_exact(request, exact, i, passing, &mut best);
            best.into_sorted()
        })
        .collect();
    candidates.fetch_add(tested, Ordering::Relaxed);
    out
}

/// Offers query `i` to `best` at its exact distance to each base row of `positions`, four rows at a
/// time (`ExactCheck::distances4`); the number offered.
pub(super) fn offer_exact(
    request: &KnnRequest,
    exact: &ExactCheck,
    i: usize,
    positions: impl Iterator<Item = usize>,
    best: &mut KSmallest,
) -> u64 {
    offer_exact_rows(request.queries.row(i), exact, i, positions, |j| request.base.row(j), best)
}

/// [`offer_exact`] with base row `j` read as `base_row(j)`, which must hold the base's values
/// exactly (so that the distances are bit for bit the same).
pub(super) fn offer_exact_rows<'a>(
    query: Row,
    exact: &ExactCheck,
    i: usize,
    positions: impl Iterator<Item = usize>,
    base_row: impl Fn(usize) -> Row<'a>,
    best: &mut KSmallest,
) -> u64 {
    let (mut group, mut filled, mut offered) = ([0usize; 4], 0, 0);
    for j in positions {
        group[filled] = j;
        filled += 1;
        offered += 1;
        if filled == 4 {
            let distances = exact.distances4(query, i, group.map(&base_row), group);
            for (distance, j) in distances.into_iter().zip(group) {
                best.push(Neighbour { distance, position: j as u32 });
            }
            filled = 0;
        }
    }
    for &j in &group[..filled] {
        best.push(Neighbour { distance: exact.distance(query, base_row(j), i, j), position: j as u32 });
    }
    offered
}

/// Both sides of a direct kNN or brute-force join (L1, L∞) as f32 columns for the vectorised
/// filter: offsets from the base's (right side's) mean, dimension-major; the base in tiles of
/// `tile_rows` rows (a multiple of LANES, about 32 KB), each tile's columns contiguous, so that a
/// tile stays in the L1 cache while every query of a block passes over it. (One column per dimension across the whole base put a 128-d lane
/// block's values on 128 pages: 2.5× slower than computing every exact distance, docs/optimisations.md, v38.)
struct DirectColumns {
    queries: Vec<f32>,
    base: Vec<f32>,
    tile_rows: usize,
    /// The largest |offset| of either side: FilterLimit's M.
    extent: f64,
}

impl DirectColumns {
    /// `None` when a value is too large for f32 scores: every distance is then exact.
    fn new(queries: &Vectors, base: &Vectors) -> Option<Self> {
        let (dim, origin) = (base.dim, base.mean());
        let offset = |v: &Vectors, i: usize, d: usize| (v.row(i).get(d) - origin[d]) as f32;
        let mut query_columns = vec![0f32; dim * queries.len()];
        query_columns.par_chunks_mut(queries.len().max(1)).enumerate().for_each(|(d, column)| {
            column.iter_mut().enumerate().for_each(|(i, c)| *c = offset(queries, i, d));
        });
        let tile_rows = ((32 << 10) / (4 * dim.max(1))).next_multiple_of(LANES).clamp(LANES, 1024);
        let tiles = base.len().div_ceil(tile_rows);
        let mut base_columns = vec![0f32; tiles * tile_rows * dim];
        base_columns.par_chunks_mut(tile_rows * dim).enumerate().for_each(|(t, tile)| {
            for (d, column) in tile.chunks_mut(tile_rows).enumerate() {
                for (p, c) in column.iter_mut().enumerate() {
                    let i = t * tile_rows + p;
                    *c = if i < base.len() { offset(base, i, d) } else { 0.0 };
                }
            }
        });
        let extent =
            query_columns.par_iter().chain(base_columns.par_iter()).map(|v| v.abs() as f64).reduce(|| 0.0, f64::max);
        (extent.is_finite() && extent < 1e30).then_some(Self {
            queries: query_columns,
            base: base_columns,
            tile_rows,
            extent,
        })
    }
}

/// Exact top-k of queries `q` within base rows `r` (L1, L∞): each base tile through the
/// vectorised f32 filter for every query of the block, at the limit of the query's current k-th
/// distance bound (`FilterLimit`: every row within the bound passes, and only such a row can
/// enter the k nearest); the rows that pass by their exact distance. Computing every exact
/// distance took 4–6 ns a pair (docs/optimisations.md, v38). Without f32 columns, every distance is exact.
#[allow(clippy::too_many_arguments)]
fn knn_direct_unit(
    request: &KnnRequest,
    exact: &ExactCheck,
    columns: Option<&DirectColumns>,
    q: std::ops::Range<usize>,
    r: std::ops::Range<usize>,
    k: usize,
    candidates: &AtomicU64,
) -> Vec<Vec<Neighbour>> {
    let Some(columns) = columns else {
        candidates.fetch_add((q.len() * r.len()) as u64, Ordering::Relaxed);
        return q
            .map(|i| {
                let mut best = KSmallest::new(k);
                offer_exact(request, exact, i, r.clone(), &mut best);
                best.into_sorted()
            })
            .collect();
    };
    let (metric, dim, tile_rows) = (request.metric, request.base.dim, columns.tile_rows);
    let query_columns = Columns { values: &columns.queries, len: request.queries.len() };
    let mut bests: Vec<KSmallest> = q.clone().map(|_| KSmallest::new(k)).collect();
    let mut tested = 0u64;
    let mut hits = Vec::new();
    // The tiles that overlap `r`; rows of a tile outside `r` belong to another unit.
    for t in r.start / tile_rows..r.end.div_ceil(tile_rows) {
        let tile_columns =
            Columns { values: &columns.base[t * tile_rows * dim..(t + 1) * tile_rows * dim], len: tile_rows };
        let first = t * tile_rows;
        for (i, best) in q.clone().zip(bests.iter_mut()) {
            let limit = FilterLimit::new(metric, best.bound(), dim, columns.extent);
            tile_hits(limit.kind, dim, query_columns, i..i + 1, tile_columns, 0..tile_rows, limit.limit, &mut hits);
            let passing = hits.iter().map(|&(_, offset)| first + offset as usize).filter(|j| r.contains(j));
            tested += offer_exact(request, exact, i, passing, best);
        }
    }
    candidates.fetch_add(tested, Ordering::Relaxed);
    bests.into_iter().map(KSmallest::into_sorted).collect()
}
