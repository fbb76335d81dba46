//! A join's or kNN's two sides on the device: host rows in slot order, uploads (kept rows reused),
//! the tensor cores' rows, and a subset of a side gathered on the device.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};

use crate::backend::gpu::GpuBackend;
use crate::backend::gpu::filter::tc_scale_exponent;
use crate::backend::plan::gather;
use crate::cuda::buffers::{ByteRows, SideBuffers};
use crate::cuda::launch::{
    byte_row_words, byte_rows, filter_max_abs, filter_rows, gather_rows, identity_order, pack_half_rows, tc_row_words,
    widen_rows,
};
use crate::cuda::memory::{upload, zeroed};
use crate::cuda::{Error as GpuError, GpuDevice, ResidentKey};
use crate::on_coords;
use crate::op::{Metric, row_norm};
use crate::vectors::{Coord, Coords, Values, Vectors};

/// A side's exact rows on the host: the vectors' values as kept (input order), or a copy in slot
/// order. Rows kept in f32 cross the bus in f32 and are widened on the device into the f64 rows
/// the kernels read; rows already resident there are not uploaded at all.
#[derive(Clone)]
pub(super) enum ExactRows<'a> {
    Kept(&'a Values),
    Gathered(Vec<f64>),
}

impl ExactRows<'_> {
    /// The rows on the device, in f64.
    pub(super) fn upload(&self, device: &GpuDevice) -> Result<CudaSlice<f64>, GpuError> {
        match self {
            ExactRows::Kept(Values::F32(values)) => Ok(widen_rows(device, upload(device, values)?)?),
            ExactRows::Kept(Values::F64(values)) | ExactRows::Gathered(values) => Ok(upload(device, values)?),
        }
    }

    /// Whether the first `n` values are all integers in [−128, 255] (byte rows may hold the side).
    fn first_may_be_bytes(&self, n: usize) -> bool {
        let byte = |v: f64| v == v.round() && (-128.0..=255.0).contains(&v);
        match self {
            ExactRows::Kept(Values::F64(values)) | ExactRows::Gathered(values) => {
                values.iter().take(n).all(|&v| byte(v))
            }
            ExactRows::Kept(Values::F32(values)) => values.iter().take(n).all(|&v| byte(v as f64)),
        }
    }
}

/// Host-side rows of one side in slot order, ready to upload.
#[derive(Clone)]
pub(super) struct HostSide<'a> {
    pub(super) filter: Vec<f32>,
    pub(super) exact: ExactRows<'a>,
    pub(super) norms: Vec<f64>,
    pub(super) filter_norms: Vec<f32>,
    pub(super) filter_sq_norms: Vec<f32>,
    pub(super) rows: usize,
    /// Slot → position, or `None`: input order, which the device writes itself (P1's 1M-row base
    /// took 1.8 ms to build here and ~1 ms to upload, docs/design.md#gpu-knn).
    pub(super) order: Option<Vec<u32>>,
    /// The origin the device builds the filter rows from (`filter`, `filter_norms` and
    /// `filter_sq_norms` are then empty), or `None`: they were built here.
    pub(super) device_filter: Option<Vec<f64>>,
    /// Set when `exact` is the values of vectors kept across queries, in input order: their
    /// rows stay on the device under it.
    pub(super) resident: Option<ResidentKey>,
}

/// The key `v`'s rows stay on the device under, if it is kept across queries.
pub(super) fn resident_key(v: &Vectors) -> Option<ResidentKey> {
    v.resident().map(|mark| mark.clone() as ResidentKey)
}

pub(super) fn host_side<'a>(
    v: &'a Vectors,
    filter_coords: Coords,
    order: Vec<u32>,
    origin: &[f64],
    metric: Metric,
    gemm: bool,
) -> HostSide<'a> {
    let dim = v.dim.max(1);
    let mut filter = vec![0f32; order.len() * v.dim];
    on_coords!(filter_coords, |coords| {
        filter.par_chunks_mut(dim).zip(order.par_iter()).for_each(|(out, &p)| {
            let row = &coords[p as usize * dim..(p as usize + 1) * dim];
            out.iter_mut().zip(row).zip(origin).for_each(|((o, x), c)| *o = (x.f64() - c) as f32);
        })
    });
    // Input order (brute force, kNN): the vectors as they are, no copy, resident when kept.
    let in_input_order = order.len() == v.len() && order.iter().enumerate().all(|(i, &p)| p as usize == i);
    let resident = resident_key(v).filter(|_| in_input_order);
    let exact = if in_input_order { ExactRows::Kept(&v.values) } else { ExactRows::Gathered(gather(v, &order)) };
    let norms = if metric == Metric::Cosine {
        order.par_iter().map(|&p| row_norm(v.row(p as usize))).collect()
    } else {
        vec![0.0]
    };
    // ‖x̃‖² summed in f64 and rounded, ‖x̃‖ its f32 square root: as GemmSide, whose margin covers both.
    let (filter_norms, filter_sq_norms) = if gemm || metric == Metric::InnerProduct {
        let sq: Vec<f32> =
            filter.par_chunks(dim).map(|r| r.iter().map(|&x| x as f64 * x as f64).sum::<f64>() as f32).collect();
        (sq.iter().map(|s| s.sqrt()).collect(), if gemm { sq } else { vec![0.0] })
    } else {
        (vec![0.0], vec![0.0])
    };
    let rows = order.len();
    let order = (!in_input_order).then_some(order);
    HostSide { filter, exact, norms, filter_norms, filter_sq_norms, rows, order, device_filter: None, resident }
}

/// The rows of `v` in input order, their GEMM-form filter rows (centred on `origin`) left to the
/// device (`filter_rows`), which computes them bit for bit as [`host_side`] would: the f32 rows then
/// need neither a pass over the data here nor a copy over the bus. Only where the filter space is
/// the vectors themselves (L2, L2²; cosine's unit vectors are computed here).
pub(super) fn device_side<'a>(v: &'a Vectors, origin: &[f64]) -> HostSide<'a> {
    HostSide {
        filter: Vec::new(),
        exact: ExactRows::Kept(&v.values),
        norms: vec![0.0],
        filter_norms: Vec::new(),
        filter_sq_norms: Vec::new(),
        rows: v.len(),
        order: None,
        device_filter: Some(origin.to_vec()),
        resident: resident_key(v),
    }
}

/// A side's buffers, uploaded in input order, in the slot order of its grid (`order`, slot →
/// position), each freed once gathered (the exact rows unless resident, whose kept copy stays).
/// The per-row buffers are gathered where they hold a value per row (an unused one holds a single
/// value, which a one-row side gathers harmlessly).
pub(super) fn in_slot_order(
    device: &GpuDevice,
    side: SideBuffers,
    order: cudarc::driver::CudaSlice<u32>,
    dim: usize,
) -> Result<SideBuffers, GpuError> {
    let n = order.len();
    // A grid's sides are never the tensor cores' (gpu_join), so they have no f16 or byte rows to
    // gather.
    let SideBuffers { filter, exact, norms, filter_norms, filter_sq_norms, resident, .. } = side;
    let per_row = |buffer: cudarc::driver::CudaSlice<f32>| {
        if buffer.len() == n { gather_rows(device, &buffer, n, &order, n, 1) } else { Ok(buffer) }
    };
    Ok(SideBuffers {
        half_rows: None,
        byte_rows: None,
        filter: gather_rows(device, &filter, n, &order, n, dim)?,
        exact: Arc::new(gather_rows(device, &exact, n, &order, n, dim)?),
        norms: if norms.len() == n { gather_rows(device, &norms, n, &order, n, 1)? } else { norms },
        filter_norms: per_row(filter_norms)?,
        filter_sq_norms: per_row(filter_sq_norms)?,
        order,
        resident,
    })
}

/// The rows `rows` (slots of `side`, each below its length) of `side` as a side of their own, in
/// that order, gathered on the device: the queries a kNN pass runs again. The same values as the
/// whole side's (f16 rows included), so a query's filter and exact distances do not change; building
/// and uploading such a side from the host took ~1 ms for 300 of P2's queries (docs/design.md#gpu-knn).
pub(super) fn subset_side(
    device: &GpuDevice,
    side: &SideBuffers,
    rows: &[u32],
    dim: usize,
) -> Result<SideBuffers, GpuError> {
    let (source, n) = (side.order.len(), rows.len());
    if let Some(&row) = rows.iter().find(|&&row| row as usize >= source) {
        return Err(GpuError::Device(format!("kNN pass: query slot {row} of a side of {source}")));
    }
    let picked = device.stream.clone_htod(rows).map_err(|e| format!("GPU copy failed: {e}"))?;
    // A buffer the metric does not use holds one value, which no kernel reads per row.
    fn per_row<T: DeviceRepr + ValidAsZeroBits>(
        device: &GpuDevice,
        buffer: &CudaSlice<T>,
        source: usize,
        picked: &CudaSlice<u32>,
    ) -> Result<CudaSlice<T>, GpuError> {
        match buffer.len() == source {
            true => gather_rows(device, buffer, source, picked, picked.len(), 1),
            false => zeroed(&device.stream, 1),
        }
    }
    Ok(SideBuffers {
        filter: gather_rows(device, &side.filter, source, &picked, n, dim)?,
        half_rows: side
            .half_rows
            .as_ref()
            .map(|h| gather_rows(device, h, source, &picked, n, tc_row_words(dim)))
            .transpose()?,
        byte_rows: match &side.byte_rows {
            Some(b) => Some(ByteRows {
                rows: gather_rows(device, &b.rows, source, &picked, n, byte_row_words(dim))?,
                sq_norms: gather_rows(device, &b.sq_norms, source, &picked, n, 1)?,
                offset: b.offset,
            }),
            None => None,
        },
        exact: Arc::new(gather_rows(device, &side.exact, source, &picked, n, dim)?),
        norms: per_row(device, &side.norms, source, &picked)?,
        filter_norms: per_row(device, &side.filter_norms, source, &picked)?,
        filter_sq_norms: per_row(device, &side.filter_sq_norms, source, &picked)?,
        order: gather_rows(device, &side.order, source, &picked, n, 1)?,
        resident: false,
    })
}

impl GpuBackend {
    /// The side's buffers on the device.
    pub(super) fn upload(&self, side: &HostSide) -> Result<SideBuffers, GpuError> {
        let device = &self.device;
        let (exact, resident) = match &side.resident {
            Some(key) => device.resident_rows(key, || side.exact.upload(device))?,
            None => (Arc::new(side.exact.upload(device)?), false),
        };
        let (filter, filter_norms, filter_sq_norms) = match &side.device_filter {
            Some(origin) => {
                let rows = filter_rows(device, &exact, side.rows, origin)?;
                (rows.filter, rows.norms, rows.sq_norms)
            }
            None => (
                upload(device, &side.filter)?,
                upload(device, &side.filter_norms)?,
                upload(device, &side.filter_sq_norms)?,
            ),
        };
        let order = match &side.order {
            Some(order) => upload(device, order)?,
            None => identity_order(device, side.rows)?,
        };
        Ok(SideBuffers {
            filter,
            half_rows: None,
            byte_rows: None,
            exact,
            norms: upload(device, &side.norms)?,
            filter_norms,
            filter_sq_norms,
            order,
            resident,
        })
    }

    /// The exponent `a` of the power of two brute_join_tc scales every side's f16 rows by (the
    /// same for all: the scores then scale by 2^2a), from the sides' largest |filter coordinate|;
    /// `None` where the tensor cores do not filter: a metric without a dot-product filter, a device
    /// without them, or coordinates f16 cannot hold after any such scaling ([`tc_scale_exponent`]).
    pub(super) fn tensor_core_scale(&self, metric: Metric, gemm: bool, largest: &[f32]) -> Option<i32> {
        if !self.tensor_cores_filter(metric, gemm) {
            return None;
        }
        tc_scale_exponent(
            largest
                .iter()
                .fold(0f32, |all, &side| if all.is_nan() || side.is_nan() { f32::NAN } else { all.max(side) }),
        )
    }

    /// Whether brute force over `metric` filters on the tensor cores: a dot-product filter on a
    /// device with them.
    pub(super) fn tensor_cores_filter(&self, metric: Metric, gemm: bool) -> bool {
        (gemm || metric == Metric::InnerProduct) && self.device.has_tensor_cores()
    }

    /// Each side's largest |filter coordinate| (NaN if one is) where the tensor cores filter, for
    /// [`GpuBackend::tensor_core_scale`]; none elsewhere.
    pub(super) fn largest_coordinates(
        &self,
        metric: Metric,
        gemm: bool,
        sides: &[&SideBuffers],
    ) -> Result<Vec<f32>, GpuError> {
        match self.tensor_cores_filter(metric, gemm) {
            true => sides.iter().map(|side| filter_max_abs(&self.device, &side.filter)).collect(),
            false => Ok(Vec::new()),
        }
    }

    /// `side` with its rows for the tensor cores where they filter: its f16 rows for brute_join_tc,
    /// scaled by 2^a, and for L2 and L2² its byte rows where every value is an integer within one
    /// window of 256 ([`byte_rows`]: brute_join_tc_bytes, whose integer filter is exact). `values`
    /// are its exact values on the host: where their first ones already rule byte rows out, as a
    /// Gaussian's first value does, the device's pass over all of them (and its wait) is skipped.
    pub(super) fn with_tensor_core_rows(
        &self,
        mut side: SideBuffers,
        values: &ExactRows,
        dim: usize,
        tc: Option<i32>,
        metric: Metric,
    ) -> Result<SideBuffers, GpuError> {
        if let Some(a) = tc {
            side.half_rows = Some(pack_half_rows(&self.device, &side.filter, side.order.len(), dim, 2f32.powi(a))?);
            let may_be_bytes = values.first_may_be_bytes(4096);
            if matches!(metric, Metric::L2 | Metric::L2Squared) && may_be_bytes {
                side.byte_rows = byte_rows(&self.device, &side.exact, side.order.len(), dim)?;
            }
        }
        Ok(side)
    }

    /// Whether the sides' GEMM-form squared norms stay where f32 scores are meaningful
    /// (GemmSide's 10³⁶; a NaN fails), their largest found on the device where it built them (one
    /// value read back instead of a row's: P1's 4 MB took 1.5 ms, docs/design.md#gpu-brute).
    pub(super) fn gemm_fits(&self, sides: &[(&HostSide, &SideBuffers)]) -> Result<bool, GpuError> {
        for (host, buffers) in sides {
            let fits = if host.device_filter.is_some() {
                filter_max_abs(&self.device, &buffers.filter_sq_norms)? <= 1e36
            } else {
                host.filter_sq_norms.iter().all(|s| *s <= 1e36)
            };
            if !fits {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
