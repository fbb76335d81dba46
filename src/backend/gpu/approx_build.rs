//! The Multicurves index built for the device's search with its curves ordered on the device
//! (cuda/curves.rs): the cores compute the principal axes and every row's principal coordinates
//! (index/curves.rs); the device computes each curve's bounds, keys and sorted lists, which come
//! back for the host's index (the one kept with the vectors, which the cores search too) and stay
//! on the device for the search, so that only the rows are uploaded after. The device's lists are
//! the cores' entry for entry (index/curve_keys.rs says why), so an index is the same wherever its
//! curves were ordered.

use std::sync::Arc;

use datafusion::common::Result;
use rayon::iter::ParallelIterator;
use rayon::slice::ParallelSlice;

use crate::backend::gpu::{GpuBackend, copy_failed};
use crate::cuda::curves::{DeviceCurveLists, order_curves};
use crate::cuda::launch::{CurveInputs, curve_bounds};
use crate::cuda::memory::upload;
use crate::cuda::{Error as GpuError, GpuDevice};
use crate::index::KeptIndexes;
use crate::index::curve_keys::{CurveOrder, KeyInputs, cell_scale, order_on_cores};
use crate::index::curves::{Geometry, Multicurves};
use crate::vectors::Vectors;

/// Fewest base rows whose curves the device orders: below, the cores' sorts take less than the
/// device's launches (8 radix passes of 3 kernels a curve) and copies.
const DEVICE_ORDER_ROWS: usize = 1 << 15;

impl GpuBackend {
    /// The index of `base` in `geometry` (kept with it), whether an earlier run built it, and, where
    /// this run built it with its curves ordered on the device, the lists it left there.
    pub(super) fn curves_ordered_here(
        &self,
        base: &Vectors,
        geometry: Geometry,
    ) -> Result<(Arc<Multicurves>, bool, Option<DeviceCurveLists>), GpuError> {
        if base.len() < DEVICE_ORDER_ROWS {
            let (index, kept) = base.curves(geometry);
            return Ok((index, kept, None));
        }
        let mut outcome = None;
        let (index, kept) = base.curves_built_by(geometry, || {
            let (index, lists) = build_on_device(&self.device, base, geometry);
            outcome = Some(lists);
            index
        });
        // On the device's error the index (its curves ordered on the cores instead) is kept, and
        // under device=auto the run goes to the cores, which search it.
        outcome.transpose().map(|lists| (index, kept, lists))
    }
}

/// The index of `base` in `geometry` with its curves ordered on `device`, and the lists left
/// there; where the device fails, the index with its curves ordered on the cores (the same
/// index), and the device's error.
pub fn build_on_device(
    device: &GpuDevice,
    base: &Vectors,
    geometry: Geometry,
) -> (Multicurves, Result<DeviceCurveLists, GpuError>) {
    let mut lists = None;
    let index = Multicurves::build_with(base, geometry, |inputs| match order_on_device(device, inputs) {
        Ok((orders, on_device)) => {
            lists = Some(Ok(on_device));
            orders
        }
        Err(e) => {
            lists = Some(Err(e));
            order_on_cores(inputs)
        }
    });
    (index, lists.expect("the build orders its curves"))
}

/// Every curve's order of `inputs`' rows, computed on `device`: the host's copies, and the lists
/// left on the device.
fn order_on_device(device: &GpuDevice, inputs: &KeyInputs) -> Result<(Vec<CurveOrder>, DeviceCurveLists), GpuError> {
    let KeyInputs { rows, stride, axes, dims, bits, rotations } = *inputs;
    let (n, curves) = (inputs.len(), rotations.len());
    let leads: Vec<f32> = rows.par_chunks(stride).flat_map_iter(|row| row[..axes].iter().copied()).collect();
    let on_device = CurveInputs {
        leads: upload(device, &leads)?,
        n,
        axes,
        dims,
        rotations: upload(device, &rotations.concat())?,
        curves,
    };
    let (low, high) = curve_bounds(device, &on_device)?;
    // The cells per unit as the host's frame computes them from the same bounds.
    let scale = cell_scale(&low, &high, bits);
    let lists = order_curves(device, &on_device, bits, &low, &scale)?;
    let orders = (0..curves)
        .map(|c| {
            Ok(CurveOrder {
                low: low[c * dims..(c + 1) * dims].to_vec(),
                high: high[c * dims..(c + 1) * dims].to_vec(),
                keys: device.stream.clone_dtoh(&lists.keys.slice(c * n..(c + 1) * n)).map_err(copy_failed)?,
                positions: device.stream.clone_dtoh(&lists.positions.slice(c * n..(c + 1) * n)).map_err(copy_failed)?,
            })
        })
        .collect::<Result<Vec<_>, GpuError>>()?;
    Ok((orders, lists))
}
