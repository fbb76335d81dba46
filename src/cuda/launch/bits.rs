//! The bit strings' joins and kNN (kernels/bits.cu).

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::allow_shared;
use crate::cuda::launch::text::PairOutput;
use crate::cuda::{Error, Result};

/// Left rows a block of bits_join holds (`BITS_TILE` in kernels/bits.cu).
const BITS_TILE: u32 = 8;
/// Most words of a row bits_join takes (`BITS_MAX_WORDS`).
pub const BITS_MAX_WORDS: usize = 64;
/// Queries a block of the kNN passes holds (`BITS_KNN_QUERIES`).
const BITS_KNN_QUERIES: u32 = 16;
/// Threads of a block.
const BITS_BLOCK: u32 = 256;
/// Most blocks of a launch (each loops over further tiles).
const BITS_BLOCKS: u32 = 1 << 16;

/// One side's bit strings on the device, `words` words a row.
#[derive(Debug)]
pub struct DeviceBits {
    pub data: CudaSlice<u64>,
    pub words: u32,
    pub rows: u32,
}

/// A join launch's inputs: the left rows in the order tiles take them, and each one's window of
/// the right rows' order.
#[derive(Debug)]
pub struct BitsJoinInputs<'a> {
    pub left: &'a DeviceBits,
    pub left_order: &'a CudaSlice<u32>,
    pub right: &'a DeviceBits,
    pub right_order: &'a CudaSlice<u32>,
    pub window_start: &'a CudaSlice<u32>,
    pub window_end: &'a CudaSlice<u32>,
    /// Tanimoto (`eps`) rather than Hamming (`radius`).
    pub tanimoto: bool,
    pub radius: u32,
    pub eps: f64,
}

/// Runs bits_join over slots `rows` of the left order, appending to `out` (its count reset
/// first), waits, and returns the pairs found (more than `out` holds when it overflowed).
pub fn bits_join(
    device: &GpuDevice,
    inputs: &BitsJoinInputs,
    rows: std::ops::Range<u32>,
    out: &mut PairOutput<f64>,
) -> Result<u64> {
    let BitsJoinInputs { left, right, .. } = *inputs;
    if left.words != right.words
        || left.words as usize > BITS_MAX_WORDS
        || left.words == 0
        || left.data.len() < left.rows as usize * left.words as usize
        || right.data.len() < right.rows as usize * right.words as usize
        || rows.end as usize > inputs.left_order.len()
        || inputs.window_start.len() < inputs.left_order.len()
        || inputs.window_end.len() < inputs.left_order.len()
        || inputs.right_order.len() > right.rows as usize
    {
        return Err(Error::Device(format!(
            "bits_join: {} left rows of {} words and {} right rows of {} words, rows {rows:?} of an order of {}, {} right in order (at most {BITS_MAX_WORDS} words)",
            left.rows,
            left.words,
            right.rows,
            right.words,
            inputs.left_order.len(),
            inputs.right_order.len()
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, Kernel::BitsJoin)?;
    let function = device.function(Kernel::BitsJoin)?;
    let tiles = rows.len().div_ceil(BITS_TILE as usize);
    let config = LaunchConfig {
        grid_dim: (tiles.min(BITS_BLOCKS as usize) as u32, 1, 1),
        block_dim: (BITS_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let (first, count, tanimoto) = (rows.start, rows.len() as u32, u32::from(inputs.tanimoto));
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&left.data)
        .arg(inputs.left_order)
        .arg(&first)
        .arg(&count)
        .arg(&right.data)
        .arg(inputs.right_order)
        .arg(inputs.window_start)
        .arg(inputs.window_end)
        .arg(&left.words)
        .arg(&tanimoto)
        .arg(&inputs.radius)
        .arg(&inputs.eps);
    out.push_args(&mut builder);
    // SAFETY: bits_join(const u64*, const u32*, u32, u32, const u64*, const u32*, const u32*,
    // const u32*, u32, u32, u32, double, u32*, u32*, double*, u64*, u64): tiles read slots first ..
    // first + count of the left order (checked within its length above), each an input row whose
    // `words` words lie within the left data (the host built the order from those rows), and each
    // slot's window of the right order, whose entries are right rows within the right data (the
    // windows are built from the order's length, the order from those rows); a tile holds at most
    // BITS_TILE rows of at most BITS_MAX_WORDS words, its static shared memory; pairs are written at
    // slots below the output's capacity, its buffers' length, and `count` holds one value.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("bits_join launch failed: {e}")))?;
    out.found(device, Kernel::BitsJoin)
}

/// Shared memory a block of the kNN passes needs: its queries' rows and (for the histogram pass)
/// `bins` counts each.
fn knn_shared(words: u32, bins: u32) -> usize {
    BITS_KNN_QUERIES as usize * (words as usize * 8 + bins as usize * 4)
}

/// Whether the device's blocks hold the kNN's histograms of `bits`-bit rows.
pub fn bits_knn_fits(device: &GpuDevice, words: u32, bits: u32) -> bool {
    knn_shared(words, bits + 1) <= device.shared_memory_per_block && words > 0
}

/// The histogram of every query's Hamming distances to the base, `bits + 1` counts a query, for
/// queries `rows` (written to `histograms` from its start).
pub fn bits_knn_histogram(
    device: &GpuDevice,
    queries: &DeviceBits,
    base: &DeviceBits,
    bits: u32,
    rows: std::ops::Range<u32>,
    histograms: &mut CudaSlice<u32>,
) -> Result<()> {
    let bins = bits + 1;
    let shared = knn_shared(queries.words, bins);
    if queries.words != base.words
        || !bits_knn_fits(device, queries.words, bits)
        || (bits as usize).div_ceil(64) != queries.words as usize
        || rows.end > queries.rows
        || histograms.len() < rows.len() * bins as usize
        || queries.data.len() < queries.rows as usize * queries.words as usize
        || base.data.len() < base.rows as usize * base.words as usize
    {
        return Err(Error::Device(format!(
            "bits_knn_histogram: {} queries and {} base rows of {} and {} words, {bits} bits, rows {rows:?}, {} counts ({shared} bytes of shared memory, {} allowed)",
            queries.rows,
            base.rows,
            queries.words,
            base.words,
            histograms.len(),
            device.shared_memory_per_block
        )));
    }
    if rows.is_empty() {
        return Ok(());
    }
    let function = device.function(Kernel::BitsKnnHistogram)?;
    allow_shared(&function, Kernel::BitsKnnHistogram, shared, 0)?;
    let config = LaunchConfig {
        grid_dim: (rows.len().div_ceil(BITS_KNN_QUERIES as usize).min(BITS_BLOCKS as usize) as u32, 1, 1),
        block_dim: (BITS_BLOCK, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let (first, count) = (rows.start, rows.len() as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&queries.data)
        .arg(&first)
        .arg(&count)
        .arg(&base.data)
        .arg(&base.rows)
        .arg(&queries.words)
        .arg(&bins)
        .arg(histograms);
    // SAFETY: bits_knn_histogram(const u64*, u32, u32, const u64*, u32, u32, u32, u32*): blocks
    // read query rows first .. first + count (below the queries' rows, checked) and every base
    // row, each `words` words within their data (checked); a distance is at most `bits`, the last
    // of a query's `bins` counts, and the histograms hold count · bins values (checked); the
    // dynamic shared memory asked for holds BITS_KNN_QUERIES rows and histograms.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("bits_knn_histogram launch failed: {e}")))?;
    Ok(())
}

/// Every base row within `cut[q]` bits of each query `q` of `rows` appended to `out` as (q, base
/// row, distance); waits and returns the pairs found (more than `out` holds when it overflowed).
pub fn bits_knn_within(
    device: &GpuDevice,
    queries: &DeviceBits,
    base: &DeviceBits,
    rows: std::ops::Range<u32>,
    cut: &CudaSlice<u32>,
    out: &mut PairOutput<f64>,
) -> Result<u64> {
    let shared = knn_shared(queries.words, 0);
    if queries.words != base.words
        || shared > device.shared_memory_per_block
        || rows.end > queries.rows
        || cut.len() < rows.end as usize
        || queries.data.len() < queries.rows as usize * queries.words as usize
        || base.data.len() < base.rows as usize * base.words as usize
    {
        return Err(Error::Device(format!(
            "bits_knn_within: {} queries and {} base rows of {} and {} words, rows {rows:?}, {} cuts",
            queries.rows,
            base.rows,
            queries.words,
            base.words,
            cut.len()
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, Kernel::BitsKnnWithin)?;
    let function = device.function(Kernel::BitsKnnWithin)?;
    allow_shared(&function, Kernel::BitsKnnWithin, shared, 0)?;
    let config = LaunchConfig {
        grid_dim: (rows.len().div_ceil(BITS_KNN_QUERIES as usize).min(BITS_BLOCKS as usize) as u32, 1, 1),
        block_dim: (BITS_BLOCK, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let (first, count) = (rows.start, rows.len() as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(&queries.data).arg(&first).arg(&count).arg(&base.data).arg(&base.rows).arg(&queries.words).arg(cut);
    out.push_args(&mut builder);
    // SAFETY: bits_knn_within(const u64*, u32, u32, const u64*, u32, u32, const u32*, u32*, u32*,
    // double*, u64*, u64): blocks read query rows first .. first + count and every base row (within
    // their data, checked) and cut[first .. first + count] (checked); pairs are written at slots below the
    // output's capacity, its buffers' length; the dynamic shared memory holds BITS_KNN_QUERIES rows.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("bits_knn_within launch failed: {e}")))?;
    out.found(device, Kernel::BitsKnnWithin)
}

/// The right side's blocks on the device for multi-index hashing: each block's bit range, and its
/// index (the offsets of its every value, its rows in value order).
#[derive(Debug)]
pub struct DeviceBlocks {
    pub starts: CudaSlice<u32>,
    pub widths: CudaSlice<u32>,
    /// Where each block's offsets begin in `offsets`.
    pub offset_base: CudaSlice<u64>,
    pub offsets: CudaSlice<u32>,
    /// The rows of block j in value order, at `rows · j`.
    pub rows: CudaSlice<u32>,
    pub blocks: u32,
    /// Flipped bits a lookup covers within a block.
    pub s: u32,
    /// The offsets every block's table holds (2^width + 1 each), for the launch's check.
    pub widths_host: Vec<u32>,
}

/// Most bits of a block the device's table indexes (`TABLE_BITS` of backend/cpu/bits.rs), and the
/// most flipped bits a lookup enumerates.
pub const BLOCKS_MAX_WIDTH: u32 = 22;
const BLOCKS_MAX_FLIPS: u32 = 3;

/// Runs bits_blocks_join over left rows `rows` within `radius` bits, appending to `out` (its count
/// reset first), waits, and returns the pairs found (more than `out` holds when it overflowed).
pub fn bits_blocks_join(
    device: &GpuDevice,
    left: &DeviceBits,
    right: &DeviceBits,
    blocks: &DeviceBlocks,
    radius: u32,
    self_join: bool,
    rows: std::ops::Range<u32>,
    out: &mut PairOutput<f64>,
) -> Result<u64> {
    let tables: usize = blocks.widths_host.iter().map(|&w| (1usize << w) + 1).sum();
    if left.words != right.words
        || blocks.widths_host.len() != blocks.blocks as usize
        || blocks.widths_host.iter().any(|&w| w == 0 || w > BLOCKS_MAX_WIDTH)
        || blocks.widths_host.iter().sum::<u32>() > 64 * left.words
        || blocks.s > BLOCKS_MAX_FLIPS
        || blocks.offsets.len() < tables
        || blocks.rows.len() < right.rows as usize * blocks.blocks as usize
        || rows.end > left.rows
        || left.data.len() < left.rows as usize * left.words as usize
        || right.data.len() < right.rows as usize * right.words as usize
    {
        return Err(Error::Device(format!(
            "bits_blocks_join: {} left and {} right rows of {} words, blocks of widths {:?} within {} flips, rows {rows:?}",
            left.rows, right.rows, left.words, blocks.widths_host, blocks.s
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, Kernel::BitsBlocksJoin)?;
    let function = device.function(Kernel::BitsBlocksJoin)?;
    let threads = rows.len() as u64 * blocks.blocks as u64;
    let config = LaunchConfig {
        grid_dim: (threads.div_ceil(BITS_BLOCK as u64).min(BITS_BLOCKS as u64 * 4) as u32, 1, 1),
        block_dim: (BITS_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let (first, count, same) = (rows.start, rows.len() as u32, u32::from(self_join));
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&left.data)
        .arg(&first)
        .arg(&count)
        .arg(&right.data)
        .arg(&left.words)
        .arg(&blocks.blocks)
        .arg(&blocks.starts)
        .arg(&blocks.widths)
        .arg(&blocks.offset_base)
        .arg(&blocks.offsets)
        .arg(&blocks.rows)
        .arg(&right.rows)
        .arg(&blocks.s)
        .arg(&radius)
        .arg(&same);
    out.push_args(&mut builder);
    // SAFETY: bits_blocks_join(const u64*, u32, u32, const u64*, u32, u32, const u32*, const u32*,
    // const u64*, const u32*, const u32*, u32, u32, u32, u32, u32*, u32*, u32*, u64*, u64): threads
    // read left rows first .. first + count (below the left rows, checked) and right rows named by
    // the blocks' row lists (built on the host from the right side's rows, each below n); a block's
    // bit range lies within the row's words (the widths sum to at most its bits, checked) and each
    // of its values, at most 2^width − 1 (width ≤ 22, checked), indexes its table of 2^width + 1
    // offsets (the tables' total checked against the offsets' length), whose entries index its n
    // rows; at most BLOCKS_MAX_FLIPS bits are flipped; pairs are written at slots below the
    // output's capacity, its buffers' length, and `count` holds one value.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("bits_blocks_join launch failed: {e}")))?;
    out.found(device, Kernel::BitsBlocksJoin)
}
