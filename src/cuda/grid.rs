//! The ε-grid of one join side built on the device (kernels/grid.cu). The host computes each
//! point's linear cell id and, for a windowed grid, its sort-dimension value (the f64 arithmetic of
//! `GridGeometry::cell_id`, so both backends put every point in the same cell); the device sorts
//! the positions by (cell, sort value) with stable 8-bit radix passes (least significant first,
//! ties staying in input order), finds the non-empty cells and their bounds, and builds the dense
//! linear id → cell table. Measured against the host build in docs/design.md#gpu-grid.

use cudarc::driver::CudaSlice;

use super::GpuDevice;
use super::Result;
use super::launch::{CellBounds, RadixKeys, cell_bounds, gather_rows, identity_order, radix_pass};
use super::memory::upload;
use super::memory::zeroed;

/// One side's grid on the device.
#[derive(Debug)]
pub struct DeviceGrid {
    /// Slot → point position: the points ordered by cell, then (windowed grids) sort value, then
    /// position.
    pub order: CudaSlice<u32>,
    /// Each slot's linear cell id.
    pub slot_cell: CudaSlice<u64>,
    /// Each slot's sort-dimension value (windowed grids; else one unused value).
    pub sort_keys: CudaSlice<f64>,
    /// The non-empty cells.
    pub bounds: CellBounds,
}

/// The points' grid from their cell ids (`cells`, input order), whose largest needs `cell_bits`
/// bits, and, when the grid is windowed, their sort-dimension values; with a dense table of
/// `table_len` entries (every possible linear id) where given.
pub fn build_grid(
    device: &GpuDevice,
    cells: &[u64],
    sort_values: Option<&[f64]>,
    cell_bits: u32,
    table_len: Option<usize>,
) -> Result<DeviceGrid> {
    let n = cells.len();
    let cell_keys = upload(device, cells)?;
    let values = sort_values.map(|v| upload(device, v)).transpose()?;
    let mut order = identity_order(device, n)?;
    let mut spare = zeroed::<u32>(&device.stream, n.max(1))?;
    // Least significant key first: the sort value's 64 bits, then the cell id's.
    let value_passes = values.iter().flat_map(|v| (0..64).step_by(8).map(move |shift| (RadixKeys::Values(v), shift)));
    let cell_passes = (0..cell_bits).step_by(8).map(|shift| (RadixKeys::Cells(&cell_keys), shift));
    for (keys, shift) in value_passes.chain(cell_passes) {
        radix_pass(device, keys, &order, &mut spare, n, shift)?;
        std::mem::swap(&mut order, &mut spare);
    }
    let slot_cell = gather_rows(device, &cell_keys, n, &order, n, 1)?;
    let sort_keys = match values {
        Some(v) => gather_rows(device, &v, n, &order, n, 1)?,
        None => zeroed::<f64>(&device.stream, 1)?,
    };
    let bounds = cell_bounds(device, &slot_cell, n, table_len)?;
    Ok(DeviceGrid { order, slot_cell, sort_keys, bounds })
}
