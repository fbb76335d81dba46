//! The rows the tensor cores read, made on the device: f32 filter rows, f16 rows, byte rows.

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{ByteRows, SideBuffers};
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::geometry::{BLOCK, warpgroup_mma};
use crate::cuda::launch::primitives::strided;
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// Words of a brute_join_tc row of `dim` coordinates (`tc_row_words` in kernels/pack_rows.cuh): two
/// f16 a word, padded to whole groups of four words.
pub fn tc_row_words(dim: usize) -> usize {
    dim.div_ceil(8) * 4
}

/// Words of a brute_join_tc_bytes row of `dim` coordinates (`byte_row_words` in
/// kernels/pack_rows.cuh): four bytes a word, padded to whole groups of four words.
pub fn byte_row_words(dim: usize) -> usize {
    dim.div_ceil(16) * 4
}

/// The most dimensions of byte rows: the s32 dot products and squared norms of brute_join_tc_bytes
/// stay below 2²⁹ (8,192 · 255² < 2²⁹; its bounds and sentinels in kernels/tc_join_run.cuh rely on it).
pub(super) const BYTE_ROWS_MOST_DIM: usize = 8192;

/// Both sides' byte rows where a pass runs on them (brute_join_tc_bytes): brute force on the
/// tensor cores (the GEMM filter of L2 and L2², the only metrics given byte rows: the sides'
/// builder, `with_tensor_core_rows` in src/backend/gpu/sides.rs), under wgmma, both sides shifted alike.
pub fn byte_sides<'a>(
    device: &GpuDevice,
    params: &JoinParams,
    left: &'a SideBuffers,
    right: &'a SideBuffers,
) -> Option<(&'a ByteRows, &'a ByteRows)> {
    match (&left.byte_rows, &right.byte_rows) {
        (Some(l), Some(r)) if params.tensor_cores != 0 && warpgroup_mma(device) && l.offset == r.offset => Some((l, r)),
        _ => None,
    }
}

/// A side's byte rows (`rows` of `dim` of its exact values, [`ByteRows`]) where they can hold it:
/// on a device with wgmma, at most [`BYTE_ROWS_MOST_DIM`] dimensions, every value an integer in
/// [0, 255] or else in [−128, 127] (integer_range, then pack_byte_rows in kernels/pack_rows.cuh);
/// `None` otherwise.
pub fn byte_rows(device: &GpuDevice, exact: &CudaSlice<f64>, rows: usize, dim: usize) -> Result<Option<ByteRows>> {
    if !warpgroup_mma(device) || rows == 0 || dim == 0 || dim > BYTE_ROWS_MOST_DIM || exact.len() < rows * dim {
        return Ok(None);
    }
    let stream = &device.stream;
    let failed = |e: cudarc::driver::DriverError| Error::Device(format!("integer_range failed: {e}"));
    let range = device.function(Kernel::IntegerRange)?;
    let mut result = stream.clone_htod(&[i32::MAX, i32::MIN, 0]).map_err(failed)?;
    let len = (rows * dim) as u64;
    // At least 8 values a thread, at most 1,024 blocks of 256 threads (about as many threads as an
    // H100 holds at once), each block three atomics.
    let blocks = len.div_ceil(BLOCK as u64 * 8).clamp(1, 1024) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = stream.launch_builder(&range);
    builder.arg(exact).arg(&len).arg(&mut result);
    // SAFETY: integer_range(const double*, u64, int*) reads indices < len ≤ the rows' length
    // (checked above) in a grid-stride loop and updates the three values of `result`; blocks of
    // BLOCK = RANGE_WARPS · 32 threads, as its shared arrays assume.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("integer_range launch failed: {e}")))?;
    let offset = match stream.clone_dtoh(&result).map_err(failed)?[..] {
        [least, greatest, 0] if least >= 0 && greatest <= 255 => 0,
        [least, greatest, 0] if least >= -128 && greatest <= 127 => -128,
        _ => return Ok(None),
    };
    let pack = device.function(Kernel::PackByteRows)?;
    let row_words = byte_row_words(dim);
    let mut packed = zeroed::<u32>(stream, rows * row_words)?;
    let mut sq_norms = zeroed::<u32>(stream, rows)?;
    let (rows64, dim32, words32) = (rows as u64, dim as u32, row_words as u32);
    let mut builder = stream.launch_builder(&pack);
    builder.arg(exact).arg(&rows64).arg(&dim32).arg(&words32).arg(&offset).arg(&mut packed).arg(&mut sq_norms);
    // SAFETY: pack_byte_rows(const double*, u64, u32, u32, int, u32*, u32*) reads rows · dim ≤
    // the exact rows' length values and writes rows · row_words words and rows norms, the
    // outputs' lengths, a warp a row in a grid-stride loop.
    unsafe { builder.launch(strided(rows as u64 * 32)) }
        .map_err(|e| Error::Device(format!("pack_byte_rows launch failed: {e}")))?;
    Ok(Some(ByteRows { rows: packed, sq_norms, offset }))
}

/// The largest |value| of f32 `values` (filter_max_abs in kernels/pack_rows.cuh); NaN if one is.
pub fn filter_max_abs(device: &GpuDevice, values: &CudaSlice<f32>) -> Result<f32> {
    let function = device.function(Kernel::FilterMaxAbs)?;
    let failed = |e: cudarc::driver::DriverError| Error::Device(format!("filter_max_abs failed: {e}"));
    let mut result = zeroed::<u32>(&device.stream, 1)?;
    let len = values.len() as u64;
    let blocks = len.div_ceil(BLOCK as u64 * 8).clamp(1, 4096) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(values).arg(&len).arg(&mut result);
    // SAFETY: filter_max_abs(const float*, u64, u32*) reads indices < `len`, the buffer's length
    // (a grid-stride loop), and updates the single u32 of `result`.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("filter_max_abs launch failed: {e}")))?;
    let bits = device.stream.clone_dtoh(&result).map_err(failed)?;
    Ok(f32::from_bits(bits[0]))
}

/// A side's f32 filter rows (`rows` of `dim`) times `scale` (a power of two), rounded to f16 and
/// packed as brute_join_tc reads them (pack_half_rows in kernels/pack_rows.cuh; the margin counts the
/// rounding: `tensor_core_margin` in src/backend/gpu/filter.rs).
pub fn pack_half_rows(
    device: &GpuDevice,
    filter: &CudaSlice<f32>,
    rows: usize,
    dim: usize,
    scale: f32,
) -> Result<CudaSlice<u32>> {
    if filter.len() < rows * dim {
        return Err(Error::Device(format!("pack_half_rows: {rows} rows of {dim} values from {} values", filter.len())));
    }
    let function = device.function(Kernel::PackHalfRows)?;
    let row_words = tc_row_words(dim);
    let mut packed = zeroed::<u32>(&device.stream, (rows * row_words).max(1))?;
    let (rows64, dim32, words32) = (rows as u64, dim as u32, row_words as u32);
    let blocks = ((rows * row_words) as u64).div_ceil(BLOCK as u64).clamp(1, 65_536) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(filter).arg(&rows64).arg(&dim32).arg(&words32).arg(&scale).arg(&mut packed);
    // SAFETY: pack_half_rows(const float*, u64, u32, u32, float, u32*) writes indices < rows ·
    // row_words ≤ the output's length and reads values < rows · dim ≤ the filter's length (checked
    // above), in a grid-stride loop.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("pack_half_rows launch failed: {e}")))?;
    Ok(packed)
}

/// The GEMM form's f32 filter rows of a side, built on the device.
#[derive(Debug)]
pub struct FilterRows {
    /// The rows, centred on the origin.
    pub filter: CudaSlice<f32>,
    /// ‖x̃‖ per row.
    pub norms: CudaSlice<f32>,
    /// ‖x̃‖² per row.
    pub sq_norms: CudaSlice<f32>,
}

/// The GEMM form's f32 filter rows of `n` exact rows (`origin.len()` wide) centred on `origin`,
/// computed on the device exactly as the host computes them (filter_rows in kernels/pack_rows.cuh).
pub fn filter_rows(device: &GpuDevice, exact: &CudaSlice<f64>, n: usize, origin: &[f64]) -> Result<FilterRows> {
    let dim = origin.len();
    if exact.len() < n * dim || n >= u32::MAX as usize || dim == 0 {
        return Err(Error::Device(format!("filter rows of {n} rows of {dim} values from {} values", exact.len())));
    }
    let stream = &device.stream;
    let origin = stream.clone_htod(origin).map_err(|e| Error::Device(format!("GPU copy failed: {e}")))?;
    let mut filter = zeroed::<f32>(stream, (n * dim).max(1))?;
    let mut norms = zeroed::<f32>(stream, n.max(1))?;
    let mut sq_norms = zeroed::<f32>(stream, n.max(1))?;
    let function = device.function(Kernel::FilterRows)?;
    let (rows, width) = (n as u32, dim as u32);
    // A warp per 32 rows (FILTER_WARPS = BLOCK / 32 warps a block).
    let blocks = (n as u64).div_ceil(BLOCK as u64).clamp(1, 65_536) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = stream.launch_builder(&function);
    builder.arg(exact).arg(&rows).arg(&width).arg(&origin).arg(&mut filter).arg(&mut norms).arg(&mut sq_norms);
    // SAFETY: filter_rows(const double*, u32, u32, const double*, float*, float*, float*): rows
    // below n (grid-stride, 32 a warp) of `dim` values, within `exact` (checked above) and
    // `filter` (n · dim);
    // `origin` holds dim values; `norms` and `sq_norms` one per row.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("filter_rows launch failed: {e}")))?;
    Ok(FilterRows { filter, norms, sq_norms })
}
