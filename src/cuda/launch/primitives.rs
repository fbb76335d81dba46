//! Grid-building primitives: stable radix passes, exclusive scans, cell bounds and row gathers.

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits};

use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// Threads per block of the grid-building kernels (kernels/grid.cu: `RADIX_WARPS` warps).
pub(super) const GRID_BUILD_BLOCK: u32 = 256;
/// Positions per radix tile (`TILE_ITEMS` in kernels/grid.cu).
pub(super) const RADIX_TILE: usize = 2048;
/// Values per block of scan_blocks (`SCAN_ITEMS` in kernels/grid.cu).
pub(super) const SCAN_ITEMS: usize = 2048;

/// A grid-stride launch over `len` items.
pub(super) fn strided(len: u64) -> LaunchConfig {
    let blocks = len.div_ceil(GRID_BUILD_BLOCK as u64).clamp(1, 65_536) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The keys one radix pass orders by: each point's linear cell id, or its sort-dimension value
/// (ordered as `f64::total_cmp`).
#[derive(Debug, Clone, Copy)]
pub enum RadixKeys<'a> {
    Cells(&'a CudaSlice<u64>),
    Values(&'a CudaSlice<f64>),
}

impl RadixKeys<'_> {
    fn len(&self) -> usize {
        match self {
            RadixKeys::Cells(k) => k.len(),
            RadixKeys::Values(k) => k.len(),
        }
    }
}

/// The positions `0..n` (identity_order in kernels/pack_rows.cuh): a side's slot order in input
/// order, and the permutation a stable sort starts from.
pub fn identity_order(device: &GpuDevice, n: usize) -> Result<CudaSlice<u32>> {
    let function = device.function(Kernel::IdentityOrder)?;
    let stream = &device.stream;
    let mut perm = zeroed::<u32>(stream, n.max(1))?;
    let len = n as u32;
    let mut builder = stream.launch_builder(&function);
    builder.arg(&mut perm).arg(&len);
    // SAFETY: identity_order(u32*, u32) writes indices < n ≤ the buffer's length (grid-stride).
    unsafe { builder.launch(strided(n as u64)) }
        .map_err(|e| Error::Device(format!("identity_order launch failed: {e}")))?;
    Ok(perm)
}

/// `from` (exact rows the host keeps in f32) widened into f64 rows on the device (widen_rows in
/// kernels/pack_rows.cuh), `from` freed.
pub fn widen_rows(device: &GpuDevice, from: CudaSlice<f32>) -> Result<CudaSlice<f64>> {
    let function = device.function(Kernel::WidenRows)?;
    let stream = &device.stream;
    let len = from.len() as u64;
    let mut to = zeroed::<f64>(stream, from.len().max(1))?;
    let mut builder = stream.launch_builder(&function);
    builder.arg(&from).arg(&len).arg(&mut to);
    // SAFETY: widen_rows(const float*, u64, double*) reads `len` values of `from` and writes as
    // many of `to`, which holds at least `len` (grid-stride, every index < len).
    unsafe { builder.launch(strided(len)) }.map_err(|e| Error::Device(format!("widen_rows launch failed: {e}")))?;
    Ok(to)
}

/// One stable radix pass: `to` becomes `from` ordered by the 8-bit digit of `keys` at `shift`
/// (a point's key is `keys[position]`), ties in `from`'s order.
pub fn radix_pass(
    device: &GpuDevice,
    keys: RadixKeys,
    from: &CudaSlice<u32>,
    to: &mut CudaSlice<u32>,
    n: usize,
    shift: u32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if keys.len() < n || from.len() < n || to.len() < n || n >= u32::MAX as usize {
        return Err(Error::Device(format!(
            "radix pass over {n} positions: buffers of {}, {} and {} values",
            keys.len(),
            from.len(),
            to.len()
        )));
    }
    let stream = &device.stream;
    let tiles = n.div_ceil(RADIX_TILE);
    let mut counts = zeroed::<u32>(stream, 256 * tiles)?;
    let (len, tiles_arg) = (n as u32, tiles as u32);
    let float_keys: u32 = matches!(keys, RadixKeys::Values(_)).into();
    let config =
        LaunchConfig { grid_dim: (tiles as u32, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 };
    let histogram = device.function(Kernel::RadixHistogram)?;
    let mut builder = stream.launch_builder(&histogram);
    match keys {
        RadixKeys::Cells(k) => builder.arg(k),
        RadixKeys::Values(k) => builder.arg(k),
    };
    builder.arg(&float_keys).arg(from).arg(&len).arg(&shift).arg(&mut counts).arg(&tiles_arg);
    // SAFETY: radix_histogram(const u64*, u32, const u32*, u32, u32, u32*, u32): one block per
    // tile of RADIX_TILE positions below n; `from` holds n positions, each < n ≤ the keys' length
    // (8-byte values either way); `counts` holds 256 · tiles values, indexed digit · tiles + tile.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("radix_histogram launch failed: {e}")))?;
    exclusive_scan(device, &mut counts)?;
    let scatter = device.function(Kernel::RadixScatter)?;
    let mut builder = stream.launch_builder(&scatter);
    match keys {
        RadixKeys::Cells(k) => builder.arg(k),
        RadixKeys::Values(k) => builder.arg(k),
    };
    builder.arg(&float_keys).arg(from).arg(to).arg(&len).arg(&shift).arg(&counts).arg(&tiles_arg);
    // SAFETY: radix_scatter(const u64*, u32, const u32*, u32*, u32, u32, const u32*, u32): reads
    // as radix_histogram; the scanned counts place every position of `from` at a distinct index
    // below n (each digit's run of each tile is as long as that tile's count), which `to` holds.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("radix_scatter launch failed: {e}")))?;
    Ok(())
}

/// Exclusive prefix sums of `values` in place (scan_blocks per block of SCAN_ITEMS, the blocks'
/// totals scanned the same way, then added back).
pub fn exclusive_scan(device: &GpuDevice, values: &mut CudaSlice<u32>) -> Result<()> {
    let stream = &device.stream;
    let n = values.len();
    let blocks = n.div_ceil(SCAN_ITEMS).max(1);
    let mut totals = zeroed::<u32>(stream, blocks)?;
    let len = n as u32;
    let config =
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 };
    let scan = device.function(Kernel::ScanBlocks)?;
    let mut builder = stream.launch_builder(&scan);
    builder.arg(&mut *values).arg(&len).arg(&mut totals);
    // SAFETY: scan_blocks(u32*, u32, u32*): block b reads and writes values[b·SCAN_ITEMS ..] below
    // n, the buffer's length, and writes totals[b], b < blocks, the totals' length.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("scan_blocks launch failed: {e}")))?;
    if blocks > 1 {
        exclusive_scan(device, &mut totals)?;
        let add = device.function(Kernel::AddBlockOffsets)?;
        let mut builder = stream.launch_builder(&add);
        builder.arg(values).arg(&len).arg(&totals);
        // SAFETY: add_block_offsets(u32*, u32, const u32*): block b updates values below n and
        // reads totals[b], b < blocks.
        unsafe { builder.launch(config) }
            .map_err(|e| Error::Device(format!("add_block_offsets launch failed: {e}")))?;
    }
    Ok(())
}

/// The non-empty cells of slots ordered by cell (`slot_cell`, n values): their ids, first slots
/// (plus the end), and the linear id → cell table of `table_len` entries (`None`: no table, one
/// unused value); the number of cells is returned with them.
pub fn cell_bounds(
    device: &GpuDevice,
    slot_cell: &CudaSlice<u64>,
    n: usize,
    table_len: Option<usize>,
) -> Result<CellBounds> {
    let stream = &device.stream;
    let len = n as u32;
    let mut starts = zeroed::<u32>(stream, n.max(1))?;
    let mark = device.function(Kernel::CellStarts)?;
    let mut builder = stream.launch_builder(&mark);
    builder.arg(slot_cell).arg(&len).arg(&mut starts);
    // SAFETY: cell_starts(const u64*, u32, u32*) reads slot_cell and writes starts below n, both
    // buffers' lengths at least (grid-stride).
    unsafe { builder.launch(strided(n as u64)) }
        .map_err(|e| Error::Device(format!("cell_starts launch failed: {e}")))?;
    exclusive_scan(device, &mut starts)?;
    let mut table = zeroed::<u32>(stream, table_len.unwrap_or(1).max(1))?;
    if let Some(entries) = table_len {
        let fill = device.function(Kernel::FillU32)?;
        let (entries, empty) = (entries as u64, u32::MAX);
        let mut builder = stream.launch_builder(&fill);
        builder.arg(&mut table).arg(&entries).arg(&empty);
        // SAFETY: fill_u32(u32*, u64, u32) writes indices below `entries`, the table's length.
        unsafe { builder.launch(strided(entries)) }
            .map_err(|e| Error::Device(format!("fill_u32 launch failed: {e}")))?;
    }
    let mut bounds = CellBounds {
        cell_ids: zeroed::<u64>(stream, n.max(1))?,
        cell_start: zeroed::<u32>(stream, n + 1)?,
        table,
        dense: table_len.is_some(),
        cells: 0,
    };
    let mut count = zeroed::<u32>(stream, 1)?;
    let dense: u32 = table_len.is_some().into();
    let bound = device.function(Kernel::CellBounds)?;
    let mut builder = stream.launch_builder(&bound);
    builder
        .arg(slot_cell)
        .arg(&starts)
        .arg(&len)
        .arg(&mut bounds.cell_ids)
        .arg(&mut bounds.cell_start)
        .arg(&mut count)
        .arg(&mut bounds.table)
        .arg(&dense);
    // SAFETY: cell_bounds(const u64*, const u32*, u32, u64*, u32*, u32*, u32*, u32): slots below
    // n; cell indices (the exclusive scan of the starts) are below the number of cells ≤ n, the
    // length of cell_ids, and the end entry at most n, within cell_start's n + 1; with `dense`,
    // every cell id is below the table's length (the caller sizes it to all linear ids).
    unsafe { builder.launch(strided(n as u64)) }
        .map_err(|e| Error::Device(format!("cell_bounds launch failed: {e}")))?;
    bounds.cells = stream.clone_dtoh(&count).map_err(|e| Error::Device(format!("GPU copy failed: {e}")))?[0] as usize;
    Ok(bounds)
}

/// What [`cell_bounds`] finds.
#[derive(Debug)]
pub struct CellBounds {
    /// Non-empty cell ids, ascending (the first `cells` values).
    pub cell_ids: CudaSlice<u64>,
    /// First slot of each cell, plus the end (the first `cells + 1` values).
    pub cell_start: CudaSlice<u32>,
    /// Linear id → cell (u32 max: empty), or one unused value.
    pub table: CudaSlice<u32>,
    /// Whether `table` is the table.
    pub dense: bool,
    /// Number of non-empty cells.
    pub cells: usize,
}

/// Rows of `rows` (`source` rows of `width` values) picked by `order` (a grid's slot order, or a
/// kNN pass's queries): row s of the result is row `order[s]`, or zeros if that is not below
/// `source`. The
/// caller may free the input once the gather is queued (frees are stream-ordered, so after it
/// has run).
pub fn gather_rows<T: DeviceRepr + ValidAsZeroBits>(
    device: &GpuDevice,
    rows: &CudaSlice<T>,
    source: usize,
    order: &CudaSlice<u32>,
    n: usize,
    width: usize,
) -> Result<CudaSlice<T>> {
    let stream = &device.stream;
    let mut out = zeroed::<T>(stream, (n * width).max(1))?;
    let words = width * std::mem::size_of::<T>() / 4;
    if n == 0 || words == 0 {
        return Ok(out);
    }
    if !std::mem::size_of::<T>().is_multiple_of(4)
        || rows.len() < source * width
        || order.len() < n
        || source > u32::MAX as usize
    {
        return Err(Error::Device(format!(
            "gather of {n} rows of {width} values from {source} rows in {} values by {} positions",
            rows.len(),
            order.len()
        )));
    }
    let gather = device.function(Kernel::GatherRows)?;
    let (source_arg, len, words_arg) = (source as u32, n as u32, words as u32);
    let mut builder = stream.launch_builder(&gather);
    builder.arg(rows).arg(&source_arg).arg(order).arg(&len).arg(&words_arg).arg(&mut out);
    // SAFETY: gather_rows(const u32*, u32, const u32*, u32, u32, u32*) reads `order` below n (it
    // holds n) and of `rows` only rows below `source` (it tests each index), of `words` 4-byte
    // words each: within `rows` (source · width values of T, a multiple of 4 bytes each); it
    // writes n · words words, `out`'s size.
    unsafe { builder.launch(strided((n * words) as u64)) }
        .map_err(|e| Error::Device(format!("gather_rows launch failed: {e}")))?;
    Ok(out)
}
