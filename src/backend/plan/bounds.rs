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
        Metric::InnerProduct | Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => None,
    }
}

/// How the f32 filter scores a pair under `metric`: Σ Δ² for L2, L2² and cosine (on unit vectors),
/// Σ |Δ| for L1, max |Δ| for L∞ (and for the inner product's bound on coordinates).
pub(crate) fn filter_kind(metric: Metric) -> FilterKind {
    match metric {
        Metric::L2 | Metric::L2Squared | Metric::Cosine => FilterKind::SquaredL2,
        Metric::L1 => FilterKind::L1,
        Metric::LInf | Metric::InnerProduct => FilterKind::LInf,
        Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => {
            unreachable!("{metric} compares strings, sets or bits, never vectors")
        }
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
///
/// # Why a pair scored at or below `sure` is within the threshold
/// The same analysis bounds the error the other way: `S − S̃ ≤ (d+3)·u·S + 4.1·u·M·√(dS)`, at most
/// the margin `m` computed at `T` for every `S ≤ T`. If `S ≥ T − m` then `S̃ ≥ T − 2m` (and more so
/// for `S > T`, as `S − m(S)` grows with `S`), so `S̃ ≤ T − 3m` gives `S < T − m`. The exact test's
/// f64 sum is within `(d+1)·2⁻⁵³·S` of `S` and its limit within an ulp of `T`, both far below
/// `m ≥ 2(d+4)·u·T`: the exact test keeps the pair. Only L2 and L2², whose exact test is that sum.
pub(crate) struct FilterLimit {
    pub(crate) kind: FilterKind,
    /// Scores at or below this may be within the threshold.
    pub(crate) limit: f32,
    /// Scores at or below this are within it (−∞ where no score is known to be).
    pub(crate) sure: f32,
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
        // Scores near f32's subnormal range err by absolute amounts the margin does not cover.
        let sure_bound = t - 3.0 * margin;
        let sure = match metric {
            Metric::L2 | Metric::L2Squared if sure_bound > 1e-30 && sure_bound.is_finite() => {
                let sure = sure_bound as f32;
                if (sure as f64) > sure_bound { sure.next_down() } else { sure }
            }
            _ => f32::NEG_INFINITY,
        };
        Self { kind, limit, sure }
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

/// The Jaccard distance of two sets of `a` and `b` elements with `common` in common (or, over bit
/// strings, of popcounts with `common` bits set in both): `1 − common / (a + b − common)` in f64,
/// 0 between two empty sets. The definition every backend computes, so the filters below are
/// stated against exactly this value.
#[inline]
pub fn jaccard_of_counts(common: u32, a: u32, b: u32) -> f64 {
    jaccard_of_union(common, a + b - common)
}

/// [`jaccard_of_counts`] from the common and the union's counts: `1 − common / union`, 0 where the
/// union is empty.
#[inline]
pub fn jaccard_of_union(common: u32, union: u32) -> f64 {
    if union == 0 { 0.0 } else { 1.0 - common as f64 / union as f64 }
}

/// The fewest common elements sets of `a` and `b` elements need for a Jaccard distance within
/// `eps` ([`jaccard_of_counts`] as computed), or `None` where even the most (`min(a, b)`) are too
/// few.
///
/// Why a search over `i` finds it: `i / (a + b − i)` grows with `i` in exact arithmetic, and
/// rounding to f64 is monotone, so the computed distance never grows with `i`; the first `i` that
/// passes is the fewest, and every larger one passes too.
pub fn min_overlap(a: u32, b: u32, eps: f64) -> Option<u32> {
    let most = a.min(b);
    if jaccard_of_counts(most, a, b) > eps {
        return None;
    }
    // Start below the real-valued bound t·(a + b) / (1 + t), t = 1 − eps, and step up.
    let t = (1.0 - eps).clamp(0.0, 1.0);
    let guess = (t * (a as f64 + b as f64) / (1.0 + t)).floor() as u32;
    let mut i = guess.saturating_sub(2).min(most);
    while i > 0 && jaccard_of_counts(i - 1, a, b) <= eps {
        i -= 1;
    }
    while jaccard_of_counts(i, a, b) > eps {
        i += 1;
    }
    Some(i)
}

/// The sizes `[low, high]` a set of `a` elements can have a partner of within `eps` (`high` is
/// `u32::MAX` for no bound): a partner of `b ≤ a` elements is at best within `1 − b / a` (all its
/// elements common), one of `b ≥ a` at best within `1 − a / b`; each is monotone in `b`, so the
/// window's ends are found by stepping from the real-valued bounds, `t·a` and `a / t`.
pub fn size_window(a: u32, eps: f64) -> (u32, u32) {
    if eps >= 1.0 {
        return (0, u32::MAX);
    }
    if a == 0 {
        // Only another empty set is within a distance below 1.
        return (0, 0);
    }
    let passes = |b: u32| jaccard_of_counts(a.min(b), a, b) <= eps;
    let t = (1.0 - eps).clamp(0.0, 1.0);
    let mut low = ((t * a as f64).floor() as u32).saturating_sub(2).clamp(1, a);
    while low > 1 && passes(low - 1) {
        low -= 1;
    }
    while !passes(low) {
        low += 1;
    }
    let mut high = if t > 0.0 { ((a as f64 / t).ceil() as u64 + 2).min(u32::MAX as u64) as u32 } else { u32::MAX };
    while high > a && !passes(high) {
        high -= 1;
    }
    while high < u32::MAX && passes(high + 1) {
        high += 1;
    }
    (low, high)
}

/// The probing prefix of a set of `a` elements for partners within `eps` in `window` (its
/// [`size_window`]): its first `a − α + 1` elements in the global order, `α` the fewest common
/// elements any partner in the window needs ([`min_overlap`] grows with the partner's size, so
/// the window's smallest size gives it). Two sets whose overlap is at least α share an element
/// within their prefixes: the common elements are at least α, so the smallest of them comes
/// within the first `a − α + 1` of either set (Chaudhuri, Ganti and Kaushik's prefix filter, as
/// AllPairs and PPJoin use it; Mann, Augsten and Bouros evaluate them). `None`: every partner
/// needs no common element (only where `eps ≥ 1` or between empty sets), so no prefix can find
/// them.
pub fn prefix_length(a: u32, eps: f64) -> Option<u32> {
    let (low, _) = size_window(a, eps);
    let alpha = min_overlap(a, low.min(a), eps)?;
    (alpha > 0).then(|| a - alpha + 1)
}

/// A Hamming threshold as the largest number of differing bits within it.
pub fn hamming_radius(eps: f64) -> u32 {
    eps.floor().clamp(0.0, u32::MAX as f64) as u32
}
