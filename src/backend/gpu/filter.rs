//! The f32 and f16 filters' parameters: metric codes, limits and the proved tensor-core margin.

use crate::backend::gpu::sides::HostSide;
use crate::backend::plan::bounds::round_up;
use crate::backend::plan::lower_corner;
use crate::cuda::abi::{FilterCode, JoinParams, MetricCode};
use crate::op::Metric;
use crate::vectors::{Coords, Vectors};

/// The index of `metric` in kernels/common.cuh's METRIC_* codes.
pub(super) fn metric_code(metric: Metric) -> u32 {
    let code = match metric {
        Metric::L2 => MetricCode::L2,
        Metric::L2Squared => MetricCode::L2Squared,
        Metric::Cosine => MetricCode::Cosine,
        Metric::InnerProduct => MetricCode::InnerProduct,
        Metric::L1 => MetricCode::L1,
        Metric::LInf => MetricCode::LInf,
        Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => unreachable!("only vectors reach the filters"),
    };
    code as u32
}

/// Whether brute force over `metric` filters with the GEMM form ‖x̃‖² + ‖ỹ‖² − 2x̃·ỹ (one fused
/// multiply-add per dimension instead of a subtraction and one), as the CPU's GemmSide does.
pub(super) fn gemm_metric(metric: Metric) -> bool {
    matches!(metric, Metric::L2 | Metric::L2Squared | Metric::Cosine)
}

/// The f32 filter kind (FILTER_* of common.cuh) of `metric`, with the dot-product forms' margins:
/// GemmSide's `(d + 16)·2⁻²³·(‖x̃‖ + ‖ỹ‖)²` and its subnormal floor, or, where `tc` (brute force on
/// a device with tensor cores, rows scaled by 2^a: [`GpuBackend::tensor_core_scale`]), the wider
/// [`tensor_core_margin`] and brute_join_tc.
pub(super) fn filter_params(metric: Metric, dim: usize, gemm: bool, tc: Option<i32>) -> JoinParams {
    let dot_form = |filter: FilterCode| match tc {
        Some(a) => {
            let TensorCoreMargin { margin, floor, eta } = tensor_core_margin(dim);
            JoinParams {
                filter: filter as u32,
                dot_margin: margin,
                dot_floor: floor,
                tc_eta: eta,
                tc_scale: 2f32.powi(a),
                tensor_cores: 1,
                ..Default::default()
            }
        }
        None => JoinParams {
            filter: filter as u32,
            dot_margin: (dim as f32 + 16.0) / (1u32 << 23) as f32,
            dot_floor: (dim as f32 + 16.0) * 2f32.powi(-140),
            ..Default::default()
        },
    };
    match metric {
        _ if gemm => dot_form(FilterCode::GemmL2),
        Metric::InnerProduct => dot_form(FilterCode::NegDot),
        Metric::L1 => JoinParams { filter: FilterCode::L1 as u32, ..Default::default() },
        Metric::LInf => JoinParams { filter: FilterCode::LInf as u32, ..Default::default() },
        _ => JoinParams { filter: FilterCode::SquaredL2 as u32, ..Default::default() },
    }
}

/// The exponent `a` that brings `largest`, the sides' largest |filter coordinate|, below 2¹⁴ (f16
/// holds up to 65,504; the dot products' f32 sums then stay below d·2²⁸), at most 60; `None` where
/// it is not finite or needs a below −60 (2⁷⁴ and more), which would leave 2^2a, the scale of the
/// scores brute_join_tc compares, outside f32's normal range.
pub(super) fn tc_scale_exponent(largest: f32) -> Option<i32> {
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
pub(super) struct TensorCoreMargin {
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
/// kernels/tc_join.cuh. It passes a superset.)
pub(super) fn tensor_core_margin(dim: usize) -> TensorCoreMargin {
    let d = dim as f32 + 16.0;
    let eta = round_up(5.0 * (dim as f64).sqrt() * 2f64.powi(-14));
    TensorCoreMargin { margin: 2f32.powi(-10) + d * 2f32.powi(-21), floor: d * 2f32.powi(-26), eta }
}

/// The origin the f32 filter rows are offsets from: the right side's mean for the GEMM form (small
/// norms, small margins; cosine's unit vectors stay as they are, like GemmSide's), the lower corner
/// of both sides for the direct differences, none for the inner product. `filters` gives both
/// sides' filter spaces (left, right), asked for only by the direct differences.
pub(super) fn filter_origin<'f>(
    metric: Metric,
    gemm: bool,
    right: &Vectors,
    filters: impl FnOnce() -> (Coords<'f>, Coords<'f>),
) -> Vec<f64> {
    match metric {
        Metric::InnerProduct => vec![0.0; right.dim],
        Metric::Cosine if gemm => vec![0.0; right.dim],
        _ if gemm => right.mean().to_vec(),
        _ => {
            let (left_filter, right_filter) = filters();
            lower_corner(left_filter, right_filter, right.dim)
        }
    }
}

/// The largest |coordinate| of the f32 filter rows of both sides (the filter margins scale with it).
pub(super) fn filter_extent(sides: &[&HostSide]) -> f64 {
    sides.iter().flat_map(|h| h.filter.iter()).fold(0f64, |m, v| m.max(v.abs() as f64))
}

#[cfg(test)]
mod tests {
    use super::{TensorCoreMargin, filter_params, gemm_metric, tc_scale_exponent, tensor_core_margin};
    use crate::backend::plan::bounds::round_up;
    use crate::op::Metric;

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
