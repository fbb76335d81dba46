//! kNN's plan: both sides on the device (kept ones reused) and each query's radii from the
//! sample, which every pass of the run reads.

use std::sync::Arc;
use std::time::Instant;

use datafusion::common::Result;

use crate::backend::gpu::filter::{filter_extent, filter_origin, filter_params, gemm_metric, metric_code};
use crate::backend::gpu::sides::{HostSide, device_side, host_side, resident_key};
use crate::backend::gpu::{GpuBackend, copy_failed};
use crate::backend::plan::FilterSpaces;
use crate::backend::plan::bounds::filter_limit;
use crate::backend::{KnnRequest, RunStats};
use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::SideBuffers;
use crate::cuda::launch::{
    KNN_LEVELS, KNN_SAMPLE, KnnSample, byte_sides, sample_byte_rows, sample_half_rows, sample_radius_pass, sample_rows,
};
use crate::cuda::memory::zeroed;
use crate::cuda::{DerivedSide, Error as GpuError, ResidentKey};
use crate::op::Metric;

impl GpuBackend {
    /// The kNN's sides and radii: both sides on the device (kept ones reused, the tensor cores'
    /// rows built where they filter), the filter's parameters, and each query's radii at the
    /// sample's KNN_LEVELS ranks.
    pub(super) fn knn_plan<'r>(
        &self,
        request: &KnnRequest<'r>,
        k: usize,
        budget: usize,
        stats: &mut RunStats,
    ) -> Result<KnnPlan, GpuError> {
        let KnnRequest { base, queries, metric, .. } = *request;
        let start = Instant::now();
        let (dim, n, nq) = (base.dim, base.len(), queries.len());
        let spaces = FilterSpaces::of(queries, base, metric, false);
        let identity = |n: usize| (0..n as u32).collect::<Vec<u32>>();
        // The GEMM form's filter rows of L2 and L2² are built on the device from the exact rows
        // (device_side); the other filters' here (host_side).
        let sides = |gemm: bool| {
            let origin = filter_origin(metric, gemm, base, || (spaces.left(), spaces.right()));
            let (query_host, base_host) = if gemm && metric != Metric::Cosine {
                (device_side(queries, &origin), device_side(base, &origin))
            } else {
                (
                    host_side(queries, spaces.left(), identity(nq), &origin, metric, gemm),
                    host_side(base, spaces.right(), identity(n), &origin, metric, gemm),
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
        // on 60,000 × 784, docs/design.md#memory).
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
        let form = SideForm { metric, gemm, tc, dim };
        let (base_side, reused) =
            self.derive_side(kept, built, &base_host, &base_largest, keep_key.as_ref(), None, form)?;
        let (query_side, query_reused) = self.derive_side(
            kept_query,
            query_built,
            &query_host,
            &query_largest,
            query_key.as_ref(),
            keep_key.as_ref(),
            form,
        )?;
        let (base_buffers, query_buffers) = (&base_side.side, &query_side.side);
        let base_bytes = byte_sides(&self.device, &params, query_buffers, base_buffers).map(|(_, base)| base);
        stats.byte_row_tiles = base_bytes.is_some().into();
        stats.resident_inputs =
            usize::from(query_reused || query_buffers.resident) + usize::from(reused || base_buffers.resident);
        // Where the tensor cores filter, the sample's distances come from them too (docs/design.md#gpu-knn),
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
        let mut radii_buffer = zeroed::<f64>(stream, nq * KNN_LEVELS)?;
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
        let radii = stream.clone_dtoh(&radii_buffer).map_err(copy_failed)?;
        drop(radii_buffer);
        let byte_rows = base_bytes.is_some();
        stats.build_time = start.elapsed();
        Ok(KnnPlan {
            k,
            dim,
            n,
            nq,
            metric,
            gemm,
            extent,
            tc,
            params,
            byte_rows,
            sample_len,
            rank,
            radii,
            query_side,
            base_side,
        })
    }

    /// A side in `form`: `kept` where it was built at this run's tensor-core scale (and `true`),
    /// else `built` (or `host` uploaded) with its tensor cores' rows, kept under `key` where its
    /// rows are kept and it is of the GEMM form, centred on the base `centre` (a query table's).
    #[allow(clippy::too_many_arguments)]
    fn derive_side(
        &self,
        kept: Option<Arc<DerivedSide>>,
        built: Option<SideBuffers>,
        host: &HostSide,
        largest: &[f32],
        key: Option<&ResidentKey>,
        centre: Option<&ResidentKey>,
        form: SideForm,
    ) -> Result<(Arc<DerivedSide>, bool), GpuError> {
        let SideForm { metric, gemm, tc, dim } = form;
        if let Some(kept) = kept.filter(|kept| kept.scale_exponent == tc) {
            return Ok((kept, true));
        }
        let side = match built {
            Some(side) => side,
            None => self.upload(host)?,
        };
        let side = self.with_tensor_core_rows(side, &host.exact, dim, tc, metric)?;
        let derived = Arc::new(DerivedSide {
            metric: metric_code(metric),
            centred_on: centre.map(Arc::downgrade),
            scale_exponent: tc,
            largest: largest.first().copied().unwrap_or(f32::NAN),
            side,
        });
        if let Some(key) = key.filter(|_| gemm && !largest.is_empty()) {
            self.device.keep_derived_side(key, derived.clone());
        }
        Ok((derived, false))
    }
}

/// The form a kNN's sides take: the metric, the GEMM filter or the direct one, the tensor cores'
/// scale (where they filter), the dimension.
#[derive(Clone, Copy)]
struct SideForm {
    metric: Metric,
    gemm: bool,
    tc: Option<i32>,
    dim: usize,
}

/// What the kNN's phases share: the request, both sides on the device, the filter's parameters,
/// and each query's radii.
pub(super) struct KnnPlan {
    pub(super) k: usize,
    pub(super) dim: usize,
    pub(super) n: usize,
    pub(super) nq: usize,
    pub(super) metric: Metric,
    pub(super) gemm: bool,
    /// The largest |filter coordinate| of both sides (0 for the GEMM form): the direct filters'
    /// margins scale with it.
    pub(super) extent: f64,
    /// The exponent of the tensor cores' f16 rows, where they filter.
    pub(super) tc: Option<i32>,
    pub(super) params: JoinParams,
    /// The base's rows are byte rows (integer data on the integer tensor cores).
    pub(super) byte_rows: bool,
    pub(super) sample_len: usize,
    pub(super) rank: u32,
    /// Each query's radii at its KNN_LEVELS levels (NaN: none), from the sample.
    pub(super) radii: Vec<f64>,
    pub(super) query_side: Arc<DerivedSide>,
    pub(super) base_side: Arc<DerivedSide>,
}

impl KnnPlan {
    /// Query `q`'s exact radius at `level` (+∞ at the last level or where the sample gave none).
    pub(super) fn radius(&self, q: usize, level: usize) -> f64 {
        match self.radii.get(q * KNN_LEVELS + level) {
            Some(&r) if level < KNN_LEVELS && !r.is_nan() => r,
            _ => f64::INFINITY,
        }
    }

    /// The exact radii and f32 filter limits of `queries` at their levels, in that order.
    pub(super) fn row_radii(&self, queries: impl Iterator<Item = usize>, levels: &[usize]) -> (Vec<f64>, Vec<f32>) {
        let thresholds: Vec<f64> = queries.map(|q| self.radius(q, levels[q])).collect();
        let limits =
            thresholds.iter().map(|&t| filter_limit(self.metric, t, self.dim, self.extent, self.gemm)).collect();
        (thresholds, limits)
    }
}

/// Base rows in kNN's radius sample (at most [`KNN_SAMPLE`]), from which each query's ranks are
/// picked. Where the tensor cores filter (`tensor_cores`), they take the sample's distances too, and
/// the sample is KNN_SAMPLE rows (or the whole base): a sample row then costs about 1.5 count-pass
/// rows (P2: 0.63 ms of keys for 4,096 rows against 6.1 ms for the pass's 60,000, docs/design.md#gpu-knn),
/// and the larger sample gives tighter radii, fewer candidates for the same share of queries
/// short (P2, 60,000 rows of 784 at k = 10: 64 candidates a query and 4 % short with 1,875
/// rows at rank 2, 44 and 3 % with 4,096 at rank 3; docs/design.md#gpu-knn). On f32 CUDA cores a sample
/// row cost about as much as 8 of the count pass's base rows (P2: a sample of 4,096 took 10.7 ms
/// against the count pass's 9.2 ms, docs/design.md#gpu-knn), so there it is a 32nd of the base, at least 1,024 rows,
/// and the whole base up to that. A smaller sample only makes the candidate counts vary more (a
/// query short of k takes another count pass at its next radius), never an answer.
pub(super) fn knn_sample_len(n: usize, tensor_cores: bool) -> usize {
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
/// (docs/design.md#gpu-knn): P1 (k = 10, λ = 0.04) at rank 2 instead of 1 left 0.1 % of its queries short
/// instead of 4.5 % and ran ~2 ms faster; 60,000 × 784 rows (k = 10, λ = 0.31) at rank 3 instead
/// of 2 ran 2.5–3 ms slower. For large λ the second rank, about λ + 2.3√λ, is the smaller, and is
/// the one: the sample's own variation is what leaves a query short, and c·k then only adds
/// candidates (P1 at k = 10,000, λ = 41: rank 58 instead of 85, 1.4·10⁴ candidates a query
/// instead of 2.1·10⁴, docs/design.md#gpu-knn).
pub(super) fn knn_sample_rank(k: usize, n: usize, sample_len: usize) -> u32 {
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

#[cfg(test)]
mod tests {
    use super::{knn_sample_len, knn_sample_rank};
    use crate::cuda::launch::KNN_SAMPLE;

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
}
