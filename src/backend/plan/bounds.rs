//! The bounds a join's threshold implies, each beside the proof that it loses no pair: the
//! largest coordinate difference a pair within the threshold can have (the grid's and the
//! directory's cells), the f32 filters' limits (the direct differences' [`FilterLimit`], the GEMM
//! form's [`score_threshold`], and the GPU's [`filter_limit`] of either), the exact test's own
//! squared-distance limit ([`largest_square_within`]) and the List of Clusters' radius in its space
//! ([`radius`]). The exact f64 test decides every candidate these bounds let through.

use crate::backend::plan::simd::FilterKind;
use crate::op::Metric;

/// The largest per-coordinate difference `|a_i - b_i|` a pair within `threshold` can have, in
/// the space the grid index is built over (the vectors themselves, or the unit-normalised
/// vectors for cosine); `None` when the metric bounds no coordinate (inner product).
///
/// Why no pair is lost: for L1, L∞ and L2 every term `|a_i - b_i|` is at most the distance; for
/// L2² it is at most its square root; for cosine, `‖â - b̂‖² = 2·(1 - cos)` for unit vectors, so
/// `|â_i - b̂_i| ≤ sqrt(2·threshold)`. The grid widens this bound by a relative 2⁻²⁰ (see
/// `index::grid`), far more than the few ulps by which rounding can move any of these relations.
pub fn coordinate_bound(metric: Metric, threshold: f64) -> Option<f64> {
    match metric {
        Metric::L2 | Metric::L1 | Metric::LInf => Some(threshold),
        Metric::L2Squared => Some(threshold.sqrt()),
        Metric::Cosine => Some((2.0 * threshold).min(4.0).sqrt() * (1.0 + 1e-9) + 1e-12),
        Metric::InnerProduct | Metric::Levenshtein => None,
    }
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

/// The f32 filter limit of an exact threshold: no pair within `threshold` scores above it (the
/// proofs are on [`FilterLimit`] and, for the dot-product forms, `GemmSide` in backend/cpu/gemm.rs). `extent`
/// matters only to the direct differences (not the GEMM form).
#[cfg(feature = "gpu")]
pub(crate) fn filter_limit(metric: Metric, threshold: f64, dim: usize, extent: f64, gemm: bool) -> f32 {
    if gemm {
        return score_threshold(metric, threshold);
    }
    if metric == Metric::InnerProduct {
        return round_up(threshold);
    }
    FilterLimit::new(metric, threshold, dim, extent).limit
}

/// `x` as f32, rounded up.
#[cfg(feature = "gpu")]
pub(crate) fn round_up(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x { f.next_up() } else { f }
}

/// The largest f64 whose correctly rounded square root is at most `threshold` (for ε ≥ 0): ε²
/// rounded is within an ulp or two of it, so a few steps of the neighbouring floats find it.
pub(crate) fn largest_square_within(threshold: f64) -> f64 {
    if threshold.is_nan() || threshold < 0.0 || threshold == f64::INFINITY {
        // Nothing qualifies, or everything does.
        return threshold;
    }
    let mut sum = threshold * threshold;
    while sum.sqrt() > threshold {
        sum = sum.next_down();
    }
    while sum.next_up().sqrt() <= threshold {
        sum = sum.next_up();
    }
    sum
}

/// The chord radius holding every pair whose computed cosine distance is at most `t`: the exact
/// test's `1 − dot/√(na·nb)` is within `2(d + 3)` units of rounding of the true value, so the
/// true chord is at most `√(2t + 2(d + 3)u) ≤ √(2t) + √(2(d + 3)u)`; the second term is doubled.
fn chord_radius(t: f64, dim: usize) -> f64 {
    if t.is_infinite() {
        return f64::INFINITY;
    }
    (2.0 * t.max(0.0)).sqrt() + (8.0 * (dim as f64 + 4.0) * f64::EPSILON).sqrt()
}

/// The radius in the index's space holding every pair within `threshold` by the exact test.
pub(crate) fn radius(metric: Metric, threshold: f64, dim: usize) -> f64 {
    match metric {
        Metric::Cosine => chord_radius(threshold, dim),
        _ => threshold,
    }
}
