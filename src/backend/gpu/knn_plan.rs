//! kNN's plan: both sides on the device (kept ones reused) and each query's radii from the
//! sample, which every pass of the run reads.

use super::knn::{knn_sample_len, knn_sample_rank};
use super::*;

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
        // on 60,000 × 784, docs/optimisations.md, v75).
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
         -> Result<(Arc<DerivedSide>, bool), GpuError> {
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
        // Where the tensor cores filter, the sample's distances come from them too (docs/optimisations.md, v54),
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
        let radii = stream.clone_dtoh(&radii_buffer).map_err(copy)?;
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
