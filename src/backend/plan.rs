//! Planning both backends share: the filter space of a metric, the join strategy the sampled cost
//! model picks, the f32 filters' proved limits, and the row layouts the filters read.

use rayon::prelude::*;

use super::JoinRequest;
use super::simd::FilterKind;
use crate::index::{CostInputs, JoinStrategy, choose_strategy, extent};
use crate::op::Metric;
use crate::vectors::{Coord, Coords, Vectors};

/// The filter-space coordinates of both sides (the vectors for L1/L2/L∞, their unit
/// normalisations for cosine; the right side is the left one for a self-join) and the strategy the
/// cost model (or the `index` option) picks for them. Shared by the CPU and GPU backends.
pub(crate) fn plan_join<'a>(request: &JoinRequest<'a>) -> (FilterSpaces<'a>, JoinStrategy) {
    let JoinRequest { left, right, metric, threshold, self_join, index, grid_dims } = *request;
    let spaces = FilterSpaces::of(left, right, metric, self_join.is_some());
    let strategy = match metric.coordinate_bound(threshold) {
        Some(radius) => choose_strategy(&CostInputs {
            left: spaces.left(),
            right: spaces.right(),
            dim: left.dim,
            radius,
            self_join: self_join.is_some(),
            gemm_form: gemm_form(metric),
            index,
            grid_dims,
        }),
        None => JoinStrategy::BruteForce,
    };
    (spaces, strategy)
}

/// The coordinates the grid indexes and the f32 filters are taken from: the vectors as kept
/// (borrowed: an f32 input is read in f32 and widened value by value, never copied whole), or for
/// cosine their unit vectors (computed in f64).
enum FilterSpace<'a> {
    Kept(Coords<'a>),
    Unit(Vec<f64>),
}

impl FilterSpace<'_> {
    fn of(v: &Vectors, metric: Metric) -> FilterSpace<'_> {
        if metric == Metric::Cosine { FilterSpace::Unit(v.unit_values()) } else { FilterSpace::Kept(v.values.coords()) }
    }

    fn coords(&self) -> Coords<'_> {
        match self {
            FilterSpace::Kept(coords) => *coords,
            FilterSpace::Unit(values) => Coords::F64(values),
        }
    }
}

/// The filter spaces of a join's or kNN's two sides (one for a self-join).
pub(crate) struct FilterSpaces<'a> {
    left: FilterSpace<'a>,
    right: Option<FilterSpace<'a>>,
}

impl<'a> FilterSpaces<'a> {
    /// The spaces of `left` and `right` under `metric`; `same`: a self-join, whose right side is
    /// the left one.
    pub(crate) fn of(left: &'a Vectors, right: &'a Vectors, metric: Metric, same: bool) -> Self {
        Self { left: FilterSpace::of(left, metric), right: (!same).then(|| FilterSpace::of(right, metric)) }
    }

    pub(crate) fn left(&self) -> Coords<'_> {
        self.left.coords()
    }

    pub(crate) fn right(&self) -> Coords<'_> {
        self.right.as_ref().unwrap_or(&self.left).coords()
    }
}

/// Copies the rows of `v` in `order` into one contiguous buffer (in f64), so a cell's points are
/// adjacent.
pub(crate) fn gather(v: &Vectors, order: &[u32]) -> Vec<f64> {
    let mut out = vec![0.0; order.len() * v.dim];
    out.par_chunks_mut(v.dim.max(1)).zip(order.par_iter()).for_each(|(dst, &p)| {
        crate::on_row!(v.row(p as usize), |row| dst.iter_mut().zip(row).for_each(|(d, x)| *d = x.f64()))
    });
    out
}

/// Per-dimension minimum over both inputs (the origin the f32 slot copies are taken from).
pub(crate) fn lower_corner(left: Coords, right: Coords, dim: usize) -> Vec<f64> {
    let lower = extent(left, dim).0;
    if left.same(right) {
        return lower;
    }
    lower.iter().zip(&extent(right, dim).0).map(|(x, y)| x.min(*y)).collect()
}

/// How the f32 filter scores a pair under `metric`: Σ Δ² for L2, L2² and cosine (on unit vectors),
/// Σ |Δ| for L1, max |Δ| for L∞ (and for the inner product's bound on coordinates).
pub(crate) fn filter_kind(metric: Metric) -> FilterKind {
    match metric {
        Metric::L2 | Metric::L2Squared | Metric::Cosine => FilterKind::SquaredL2,
        Metric::L1 => FilterKind::L1,
        Metric::LInf | Metric::InnerProduct => FilterKind::LInf,
        Metric::Levenshtein => unreachable!("levenshtein compares strings, never vectors"),
    }
}

/// The f32 score the grid filter computes and the threshold it compares against.
///
/// # Why the filter loses no pair
/// Coordinates are offsets from a common origin, `|x̃| ≤ M` (`SlotFilter::extent`), each rounded
/// to f32 with error ≤ `1.01·u·M` (`u = 2⁻²⁴`, including the f64 subtraction), so a coordinate
/// difference errs by `e ≤ 2.02·u·M` before its own rounding. For the squared form, summing `d`
/// rounded squares of `|Δᵢ| + e` gives `S̃ ≤ (1 + γ_{d+2})·(S + 4.04·u·M·Σ|Δᵢ| + 4.1·d·u²·M²)` with
/// `Σ|Δᵢ| ≤ √(d·S)`: for `S ≤ T`, `S̃ − T ≤ (d+3)·u·T + 4.1·u·M·√(dT) + 4.1·d·u²·M²` (to first
/// order). L1 errs by at most `d·e + (d+2)·u·T`, L∞ by `e + 2u·T`. The limit adds twice these
/// bounds to `T` and rounds up, so every pair within the threshold passes; the exact check decides.
/// For cosine the space is the unit-normalised vectors (`‖â − b̂‖² = 2·(1 − cos)`), plus 10⁻¹² for
/// the f64 normalisation.
pub(crate) struct FilterLimit {
    pub(crate) kind: FilterKind,
    /// Scores at or below this may be within the threshold.
    pub(crate) limit: f32,
}

impl FilterLimit {
    pub(crate) fn new(metric: Metric, threshold: f64, dim: usize, extent: f64) -> Self {
        let kind = filter_kind(metric);
        let t = match metric {
            Metric::L2 => threshold * threshold,
            Metric::Cosine => 2.0 * threshold + 1e-12,
            _ => threshold,
        };
        let (u, d, m) = (2f64.powi(-24), dim as f64, extent);
        let margin = match kind {
            FilterKind::SquaredL2 => 8.0 * u * m * (d * t).sqrt() + 16.0 * d * u * u * m * m + 2.0 * (d + 4.0) * u * t,
            FilterKind::L1 => 4.0 * u * m * d + (d + 2.0) * u * t,
            FilterKind::LInf => 4.0 * u * m + 2.0 * u * t,
        };
        let bound = t + 2.0 * margin;
        let limit = bound as f32;
        let limit = if (limit as f64) < bound { limit.next_up() } else { limit };
        Self { kind, limit }
    }
}

/// A threshold in the score space of [`GemmSide`], rounded up to f32.
pub(crate) fn score_threshold(metric: Metric, threshold: f64) -> f32 {
    let t = match metric {
        Metric::L2 => threshold * threshold * (1.0 + 1e-9),
        Metric::Cosine => 2.0 * threshold,
        _ => threshold,
    };
    let f = t as f32;
    if (f as f64) < t { f.next_up() } else { f }
}

/// Whether the f32 filter can use the GEMM form `‖x‖² + ‖y‖² − 2x·y` (or `−x·y`).
pub(crate) fn gemm_form(metric: Metric) -> bool {
    matches!(metric, Metric::L2 | Metric::L2Squared | Metric::Cosine | Metric::InnerProduct)
}
