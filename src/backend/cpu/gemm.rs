//! The brute-force joins and kNN units of the GEMM-form metrics (L2, L2², cosine, inner product):
//! a GEMM tile filter whose error is bounded (f32 products, or bf16 ones on the cores' bf16 unit,
//! `tiles.rs`), then the exact f64 check of what it cannot rule out.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};

use crate::backend::cpu::context::{JoinContext, TILE_QUERIES};
use crate::backend::cpu::tiles::{self, TILE_MAX_NORM, TileLayout, TileRows};
use crate::backend::plan::bounds::score_threshold;
use crate::backend::plan::exact::ExactCheck;
use crate::backend::plan::exact::offer_exact;
use crate::backend::plan::gemm_form;
use crate::backend::plan::simd::gemm_candidates;
use crate::backend::plan::topk::{KSmallest, Neighbour};
use crate::backend::{JoinRequest, KnnRequest};
use crate::op::{Metric, dot};
use crate::vectors::{Coord, Values, Vectors};

/// Base rows per GEMM tile (a 64 × 1024 f32 tile is 256 KiB, within L2).
const TILE_BASE: usize = 1024;

/// Left rows up to which a tile's dot products are computed directly rather than by a GEMM, whose
/// packing of the right rows costs more than the products of so few left rows
/// (docs/design.md#inputs).
const DIRECT_DOT_ROWS: usize = 16;

/// Left rows from which the dot products run on the CPU's bf16 unit where it has one: packing the
/// right side in bf16 is a pass over its rows, which fewer left rows would not repay
/// (docs/design.md#cpu-knn).
const TILE_MIN_LEFT_ROWS: usize = 64;

/// Dimensions from which the dot products run on the bf16 unit: below, a product is a small part
/// of a pair's work and a kNN's k-th distance small beside the norms that size the bf16 margin
/// (at 8 dimensions the kNN's candidates double and it runs slower; docs/design.md#cpu-knn).
const TILE_MIN_DIM: usize = 16;

/// The f32 filter sides of a GEMM-form metric (the right one omitted for a self-join), centred on
/// the right input's mean; `None` when the metric has no GEMM form or the values exceed f32 scores.
///
/// A right input kept in f32 whose mean lies near the origin (`64·‖μ‖² ≤` its mean squared norm,
/// as for embeddings and other data centred by construction) is not centred: its values are then
/// its filter rows as they are, with no copy, and the norms, and so the margin, are larger by a
/// few percent at most. The inner product never centres.
///
/// `limit` is a join's or range query's score threshold (`None` for a kNN): the bf16 unit's wider
/// margin is taken only where it stays small beside it.
pub(super) fn gemm_sides<'v>(
    left: &'v Vectors,
    right: &'v Vectors,
    metric: Metric,
    same: bool,
    limit: Option<f32>,
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
        let mut side = right_side;
        if use_tiles(&side, &side, limit) {
            side.tiles_left = Some(TileRows::left(&side.data, side.dim));
            side.tiles_right = Some(TileRows::right(&side.data, side.dim));
            side.widen_for_tiles();
        }
        return Some((side, None));
    }
    let (mut left_side, mut right_side) = (GemmSide::new(left, metric, origin)?, right_side);
    if use_tiles(&left_side, &right_side, limit) {
        left_side.tiles_left = Some(TileRows::left(&left_side.data, left_side.dim));
        right_side.tiles_right = Some(TileRows::right(&right_side.data, right_side.dim));
        left_side.widen_for_tiles();
        right_side.widen_for_tiles();
    }
    Some((left_side, Some(right_side)))
}

/// Whether the dot products of `left` and `right` run on the CPU's bf16 unit: the cores have one,
/// the left side has enough rows to repay packing the right, the rows enough dimensions for the
/// products to be most of the work, the margin at the sides' mean norms is at most an eighth of
/// the score threshold where there is one (a wider margin admits candidates by the multiple), and
/// no norm is so large that the unit's absolute error would exceed its floor
/// ([`tiles::tile_margin`]).
fn use_tiles(left: &GemmSide, right: &GemmSide, limit: Option<f32>) -> bool {
    let mean_norm = |side: &GemmSide| side.norms.iter().map(|&n| n as f64).sum::<f64>() / side.len().max(1) as f64;
    let margin = || tiles::tile_margin(left.dim) as f64 * (mean_norm(left) + mean_norm(right)).powi(2);
    left.len() >= TILE_MIN_LEFT_ROWS
        && left.dim >= TILE_MIN_DIM
        && tiles::available()
        && limit.is_none_or(|limit| margin() <= limit as f64 / 8.0)
        && [left, right].iter().all(|side| side.norms.iter().all(|&n| n <= TILE_MAX_NORM))
}

/// The mean of at most 1,024 rows spread evenly over `v`: enough to tell data centred near the
/// origin from data far from it, without a pass over every row (the choice only sizes the
/// filter's margin; both are exact).
pub(super) fn sampled_mean(v: &Vectors) -> Vec<f64> {
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
pub(super) struct GemmSide<'v> {
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
    /// The rows in bf16 as the left operand of the CPU's tiles, where they compute this side's
    /// products (then `margin` and `floor` are the tiles' wider ones, [`tiles::tile_margin`]).
    tiles_left: Option<TileRows>,
    /// The rows in bf16 as the right operand of the tiles.
    tiles_right: Option<TileRows>,
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
        let sq_norms: Vec<f32> =
            data.par_chunks(dim).map(|r| crate::backend::plan::simd::sum_squares(r) as f32).collect();
        if sq_norms.iter().any(|s| s.is_nan() || *s > 1e36) {
            return None;
        }
        let norms = sq_norms.iter().map(|s| s.sqrt()).collect();
        let margin = (dim as f32 + 16.0) / (1u32 << 23) as f32;
        let floor = (dim as f32 + 16.0) * 2f32.powi(-140);
        let inner_product = metric == Metric::InnerProduct;
        Some(Self { dim, data, sq_norms, norms, inner_product, margin, floor, tiles_left: None, tiles_right: None })
    }

    /// The margins of products from the tiles (both sides of a pair must agree on them).
    fn widen_for_tiles(&mut self) {
        self.margin = tiles::tile_margin(self.dim);
        self.floor = tiles::tile_floor(self.dim);
    }

    fn len(&self) -> usize {
        self.norms.len()
    }

    /// The dot products `x̃_(q0+i) · ỹ_(b0+j)` for the given row ranges of `self` and `other`, row
    /// `i` at `layout.row(tile, i, b.len())`: on the tiles where both sides are packed for them
    /// (bf16 products, within the sides' wider margin), else in f32.
    fn dot_tile(
        &self,
        other: &GemmSide,
        q: std::ops::Range<usize>,
        b: std::ops::Range<usize>,
        tile: &mut Vec<f32>,
    ) -> TileLayout {
        if let (Some(left), Some(right)) = (&self.tiles_left, &other.tiles_right) {
            return tiles::dot_tile(left, right, q, b, tile);
        }
        let (m, n, k) = (q.len(), b.len(), self.dim);
        let layout = TileLayout { stride: n, offset: 0 };
        tile.resize(m * n, 0.0);
        if m <= DIRECT_DOT_ROWS {
            let (a, b) = (&self.data[q.start * k..q.end * k], &other.data[b.start * k..b.end * k]);
            crate::backend::plan::simd::dot_rows(a, m, b, n, k, tile);
            return layout;
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
        layout
    }

    /// Score of row `i` of `self` against row `j` of `other`, given their dot product.
    #[inline]
    fn score(&self, other: &GemmSide, i: usize, j: usize, dot: f32) -> f32 {
        if self.inner_product { -dot } else { self.sq_norms[i] + other.sq_norms[j] - 2.0 * dot }
    }

    /// The rows of `js` (as offsets into it, each with its lower bound `score − slack`) that row
    /// `i` of `self` may be within `bound` of, given their dot products.
    #[inline]
    fn candidates(
        &self,
        other: &GemmSide,
        i: usize,
        js: std::ops::Range<usize>,
        dots: &[f32],
        bound: f32,
        hits: &mut Vec<(u32, f32)>,
    ) {
        let (sq, norms) = (&other.sq_norms[js.clone()], &other.norms[js]);
        gemm_candidates(
            dots,
            self.sq_norms[i],
            self.norms[i],
            sq,
            norms,
            self.margin,
            self.floor,
            self.inner_product,
            bound,
            hits,
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
pub(super) fn gemm_join(ctx: &JoinContext, left: &GemmSide, right: &GemmSide) -> Result<()> {
    let JoinRequest { left: lv, right: rv, metric, threshold, self_join, .. } = *ctx.request;
    let limit = score_threshold(metric, threshold);
    let blocks = left.len().div_ceil(TILE_QUERIES);
    ctx.sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = ctx.writer();
        let (mut tile, mut hits) = (Vec::new(), Vec::new());
        let q = b * TILE_QUERIES..((b + 1) * TILE_QUERIES).min(left.len());
        let first = if self_join.is_some() { q.start } else { 0 };
        let mut tested = 0u64;
        for b0 in (first..right.len()).step_by(TILE_BASE) {
            let r = b0..(b0 + TILE_BASE).min(right.len());
            let layout = left.dot_tile(right, q.clone(), r.clone(), &mut tile);
            for (t, i) in q.clone().enumerate() {
                let row = layout.row(&tile, t, r.len());
                left.candidates(right, i, r.clone(), row, limit, &mut hits);
                for j in hits.iter().map(|&(offset, _)| r.start + offset as usize) {
                    if !(self_join.is_some() && j <= i) {
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
pub(super) fn knn_gemm_unit(
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
    let (mut tile, mut hits) = (Vec::new(), Vec::new());
    for b0 in r.clone().step_by(TILE_BASE) {
        let br = b0..(b0 + TILE_BASE).min(r.end);
        let layout = queries.dot_tile(base, q.clone(), br.clone(), &mut tile);
        for (t, (i, (upper, list))) in q.clone().zip(uppers.iter_mut().zip(lists.iter_mut())).enumerate() {
            let row = layout.row(&tile, t, br.len());
            // The scan's bound is the one the row starts with; each candidate is then held to the
            // bound as it tightens, as one pass over the rows would.
            let mut bound = upper.bound() as f32;
            queries.candidates(base, i, br.clone(), row, bound, &mut hits);
            for &(offset, low) in &hits {
                let (j, d) = (br.start + offset as usize, row[offset as usize]);
                if low <= bound {
                    list.push((low, j as u32));
                    let upper_bound = queries.score(base, i, j, d) + queries.slack(base, i, j);
                    upper.push(Neighbour { distance: upper_bound as f64, position: j as u32 });
                    bound = upper.bound() as f32;
                }
            }
            // Rows whose lower bound exceeds the k-th upper bound can no longer be among the k
            // nearest; dropping them past 2k + 1024 entries keeps a query's list within 4,096
            // entries at k = 1000 (32 KB; at 4k + 1024 its doubling reached 8,192).
            if list.len() > 2 * k + 1024 {
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
