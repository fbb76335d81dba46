//! The Multicurves index's curves ordered on the device (index/curve_keys.rs says what a curve's
//! order is): kernels/approx.cu computes every row's key on each curve with the host's arithmetic,
//! and stable 8-bit radix passes (kernels/grid.cu, least significant digit first, ties staying in
//! position order) sort the positions by key, so each list is the host's, entry for entry.

use cudarc::driver::CudaSlice;

use super::GpuDevice;
use super::launch::{CurveInputs, RadixKeys, curve_keys, gather_rows, identity_order, radix_pass};
use super::memory::{upload, zeroed};
use super::{Error, Result};

/// Every curve's lists on the device: `curves` runs of `n` keys ascending (curve `c`'s at
/// `c·n ..`) and the row position of each.
#[derive(Debug)]
pub struct DeviceCurveLists {
    pub keys: CudaSlice<u64>,
    pub positions: CudaSlice<u32>,
}

/// Each curve of `inputs` with its rows sorted by key: curve `c`'s dimensions start at
/// `low[c·dims ..]` with `scale[c·dims ..]` cells per unit and are quantised to `bits` bits.
pub fn order_curves(
    device: &GpuDevice,
    inputs: &CurveInputs,
    bits: u32,
    low: &[f32],
    scale: &[f32],
) -> Result<DeviceCurveLists> {
    let CurveInputs { n, dims, curves, .. } = *inputs;
    if low.len() < curves * dims || scale.len() < curves * dims {
        return Err(Error::Device(format!(
            "ordering {curves} curves of {dims} dimensions: bounds of {} and {} values",
            low.len(),
            scale.len()
        )));
    }
    let stream = &device.stream;
    let mut lists = DeviceCurveLists {
        keys: zeroed::<u64>(stream, (curves * n).max(1))?,
        positions: zeroed::<u32>(stream, (curves * n).max(1))?,
    };
    if n == 0 {
        return Ok(lists);
    }
    let copy = |e: cudarc::driver::DriverError| Error::Device(format!("copy on the GPU failed: {e}"));
    let mut keys = zeroed::<u64>(stream, n)?;
    let mut spare = zeroed::<u32>(stream, n)?;
    let key_bits = bits * dims as u32;
    for c in 0..curves {
        let bounds =
            (upload(device, &low[c * dims..(c + 1) * dims])?, upload(device, &scale[c * dims..(c + 1) * dims])?);
        curve_keys(device, inputs, c, bits, (&bounds.0, &bounds.1), &mut keys)?;
        let mut order = identity_order(device, n)?;
        for shift in (0..key_bits).step_by(8) {
            radix_pass(device, RadixKeys::Cells(&keys), &order, &mut spare, n, shift)?;
            std::mem::swap(&mut order, &mut spare);
        }
        let sorted = gather_rows(device, &keys, n, &order, n, 1)?;
        stream.memcpy_dtod(&sorted, &mut lists.keys.slice_mut(c * n..(c + 1) * n)).map_err(copy)?;
        stream.memcpy_dtod(&order.slice(0..n), &mut lists.positions.slice_mut(c * n..(c + 1) * n)).map_err(copy)?;
    }
    Ok(lists)
}
