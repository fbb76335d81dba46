//! Every kernel launch, each checked; the only `unsafe` launch sites of the crate.

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg, ValidAsZeroBits, sys,
};

use super::device::GpuDevice;
use super::kernels::KernelModule;

/// Threads per block of the join kernels.
const BLOCK: u32 = 256;
/// Rows per side of one brute_join block's tile (`TILE` in kernels/sim_join.cu).
const BRUTE_TILE: usize = 128;
/// Right tiles per brute_join_tc block (`p.tc_run` in kernels/sim_join.cu). Each block pays once
/// for its left tile's copies and bounds, its pipeline's filling and its queue's draining, so
/// longer runs pay off where the grid is large: 64 where it still has at least 16 waves of two
/// blocks an SM (P1, 79 left tiles × 123 runs of 64: kernel time 8.6–8.7 → 8.1–8.3 ms against
/// 16, NOTES.md v73; 16 against 8 was 11.2 → 9.3 ms, v62). But fewer, longer blocks leave the
/// last wave emptier: 60,000 × 784 (79 × 30 blocks of 16, 8.7 waves) took 5.3–5.4 → 5.9–6.0 ms
/// (v62), so 8 there. A small grid (kNN's later passes over a few hundred queries) takes the
/// longest run of at most 8 that still fills 4 waves, else runs of one tile: 60,000 × 784's
/// second pass (2 left tiles) took 0.72 ms as 118 blocks of 8 on 132 SMs, 0.41 ms as 938 blocks
/// of one (v63).
///
/// A pass expected to find many pairs (kNN at large k: `per_tile`, twice the pairs it expects a
/// tile) takes runs short enough that its queue holds them ([`tc_queue`], at most `queue_most`):
/// a pair beyond the queue is decided by its thread at once, and at P1 k = 10,000 (~230 pairs a
/// tile) runs of 64 decided most of them that way: 0.33 s against 0.15 with runs of 4 and a queue
/// of 2,048 (NOTES.md v79).
fn tc_run(device: &GpuDevice, left_tiles: usize, right_len: usize, per_tile: f64, queue_most: usize) -> usize {
    let slots = 2 * device.multiprocessors;
    let blocks = |run: usize| left_tiles * right_len.div_ceil(run * BRUTE_TILE);
    let by_grid = match [64, 16].into_iter().find(|&run| blocks(run) >= 16 * slots) {
        Some(run) => run,
        None => [8, 4, 2].into_iter().find(|&run| blocks(run) >= 4 * slots).unwrap_or(1),
    };
    let mut run = by_grid;
    while run > 1 && run as f64 * per_tile > queue_most as f64 {
        run /= 2;
    }
    run
}

/// Pairs brute_join_tc's queue holds for a run of `run` right tiles (`p.tc_queue`): 16 a tile, at
/// least 256, or where more are expected (`per_tile`, twice the pairs expected a tile) those of
/// the run, at most `queue_most`. A pair beyond the queue is decided by its thread at once, which
/// holds up the block (NOTES.md v35): P1 at k = 10 queues ~7 pairs a tile and block on average
/// (4.5 M in 617,000 tiles), and its runs of 32 with a queue of 256 ran 8.9–9.1 ms against 8.2–8.3
/// with 512 (v73). Shared memory spent on a longer queue is not spent on stages: 60,000 × 784
/// (runs of 8) took 4.0 → 4.7 ms with a queue of 512, whose 2 KB more left two stages instead of
/// three.
fn tc_queue(run: usize, per_tile: f64, queue_most: usize) -> usize {
    let expected = (run as f64 * per_tile).ceil() as usize;
    (16 * run).max(256).max(expected.min(queue_most))
}

/// The longest queue (a multiple of 64, 256 to 2,048 pairs: 16 KB) with which two brute_join_tc
/// blocks with rows of `row_words` words and their fewest stages still fit a multiprocessor
/// ([`tc_dynamic_bytes`]): 2,048 at 128 dimensions on an H100, 320 at 784.
fn tc_queue_most(per_block: usize, per_multiprocessor: usize, row_words: usize, warpgroup_mma: bool) -> usize {
    let fits = |queue: usize| {
        let bytes = tc_dynamic_bytes(per_block, per_multiprocessor, row_words, queue, warpgroup_mma);
        bytes <= per_block && 2 * (bytes + TC_STATIC_BYTES) <= per_multiprocessor
    };
    (256..=2048).rev().step_by(64).find(|&queue| fits(queue)).unwrap_or(256)
}
/// Bytes of one brute_join_tc pipeline stage (`TC_STAGE_WORDS` in kernels/sim_join.cu): both
/// sides' 128 rows × 36 words.
const TC_STAGE_BYTES: usize = 2 * BRUTE_TILE * 36 * 4;
/// Bytes of a brute_join_tc queue entry (two u32: left slot, right row).
const TC_QUEUE_ENTRY_BYTES: usize = 8;
/// Rows of at most this many chunks of 32 words keep brute_join_tc's left tile resident in shared
/// memory (`TC_RESIDENT_CHUNKS` in kernels/sim_join.cu), in `TC_RESIDENT_BYTES` ahead of stages
/// that hold the right tile's chunks only.
const TC_RESIDENT_CHUNKS: usize = 2;
const TC_RESIDENT_BYTES: usize = TC_RESIDENT_CHUNKS * BRUTE_TILE * 36 * 4;

/// brute_join_tc's static shared memory (`queue_len`, `row_bounds`, `col_offsets`, under wgmma
/// the TMA barriers; ptxas reports 2,064 or 2,096 bytes) and what the driver reserves per block
/// besides (1 KB on sm_80 and later).
const TC_STATIC_BYTES: usize = 2096 + 1024;

/// brute_join_tc's dynamic shared memory for rows of `row_words` words: its queue, the resident left
/// tile where rows are that short, and the most pipeline stages with which two blocks still fit a
/// multiprocessor; the kernel reads the stage count off the size. It is built for two resident
/// blocks (`__launch_bounds__(256, 2)`): a stage that cost the second block would halve the warps
/// that hide the tensor cores' latency. Under mma.sync two or three stages (sm_90: 228 KB, two
/// blocks of 110 + 3 KB; sm_80: 164 KB; sm_86, sm_89: 100 KB, where even two stages leave one
/// block). Under wgmma (sm_90a) three or four, since one step's wgmma stay in flight while the
/// loader runs one or two steps ahead: four for rows of at most 128 dimensions with a queue of
/// 256 pairs (two blocks of 110 + 3 KB), three for longer ones or a longer queue (`queue` pairs:
/// [`tc_queue`]).
fn tc_shared_bytes(device: &GpuDevice, row_words: usize, queue: usize) -> u32 {
    tc_dynamic_bytes(
        device.shared_memory_per_block,
        device.shared_memory_per_multiprocessor,
        row_words,
        queue,
        warpgroup_mma(device),
    ) as u32
}

/// Whether brute_join_tc multiplies by wgmma on `device` (compiled for sm_90a).
fn warpgroup_mma(device: &GpuDevice) -> bool {
    device.arch == "sm_90a"
}

fn tc_dynamic_bytes(
    per_block: usize,
    per_multiprocessor: usize,
    row_words: usize,
    queue: usize,
    warpgroup_mma: bool,
) -> usize {
    let resident = row_words.div_ceil(32) <= TC_RESIDENT_CHUNKS;
    let queue_bytes = queue * TC_QUEUE_ENTRY_BYTES;
    let bytes = |stages: usize| match resident {
        true => queue_bytes + TC_RESIDENT_BYTES + stages * TC_STAGE_BYTES / 2,
        false => queue_bytes + stages * TC_STAGE_BYTES,
    };
    let fit = |stages: usize| bytes(stages) <= per_block && 2 * (bytes(stages) + TC_STATIC_BYTES) <= per_multiprocessor;
    let fewest = if warpgroup_mma { 3 } else { 2 };
    bytes(if fit(fewest + 1) { fewest + 1 } else { fewest })
}

/// A TMA descriptor (`CUtensorMap`) passed by value: brute_join_tc's `TensorMap` parameters.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TensorMap([u64; 16]);

// SAFETY: plain bytes with the kernel parameter's size and alignment (`struct __align__(64)
// TensorMap` in kernels/sim_join.cu).
unsafe impl DeviceRepr for TensorMap {}

/// The TMA map brute_join_tc copies a side's f16 rows by under wgmma (sm_90a), and
/// brute_join_tc_bytes its byte rows: `rows.len() / row_words` rows of `row_words` 32-bit words, a
/// box of 32 words (one chunk, 128 bytes) × 128 rows (a tile) written to shared memory in the
/// 128-byte swizzle that its wgmma descriptors name, zeros beyond the rows' end. Elsewhere the kernel copies by cp.async and gets zeros.
fn tc_row_map(device: &GpuDevice, rows: &CudaSlice<u32>, row_words: usize) -> Result<TensorMap, String> {
    if device.arch != "sm_90a" || rows.is_empty() {
        return Ok(TensorMap([0; 16]));
    }
    let dims = [row_words as u64, (rows.len() / row_words) as u64];
    let row_stride = [4 * row_words as u64];
    let box_dims = [32u32, BRUTE_TILE as u32];
    let element_strides = [1u32, 1];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let (address, _record) = rows.device_ptr(&device.stream);
    // SAFETY: `map` is writable; the address is a live device allocation of `rows.len()` words
    // (cudaMalloc's alignment ≥ 16 bytes), which the dimensions and the row stride (a multiple of
    // 16 bytes: rows are whole groups of four words) stay within; the arrays hold rank 2 entries
    // (rank − 1 strides).
    let result = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            2,
            address as *mut std::ffi::c_void,
            dims.as_ptr(),
            row_stride.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    result
        .result()
        .map_err(|e| format!("brute_join_tc: TMA map of {} rows × {row_words} words refused: {e}", dims[1]))?;
    Ok(TensorMap(map.opaque))
}

/// The launch parameters of the join kernels: `struct JoinParams` of kernels/common.cuh, field
/// for field (same order, sizes and padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct JoinParams {
    pub dim: u32,
    pub metric: u32,
    pub filter: u32,
    pub self_join: u32,
    pub limit: f32,
    pub dot_margin: f32,
    pub dot_floor: f32,
    pub per_row: u32,
    pub threshold: f64,
    pub k: u32,
    pub dense: u32,
    pub right_cells: u32,
    /// Brute force: 1 launches brute_join_tc (f16 tensor cores, the dot-product filters only).
    pub tensor_cores: u32,
    /// Brute-force count pass: store each left slot's pairs in a slot of this many (kNN); 0: no.
    pub slot_capacity: u32,
    /// Grid: 1 scans only the ±`window` range of the sort dimension in each cell (sortidu).
    pub windowed: u32,
    /// brute_join_tc: 2^a, the power of two both sides' f16 rows are scaled by ([`pack_half_rows`]).
    pub tc_scale: f32,
    /// brute_join_tc: the scaled score's error per unit of a scaled norm from f16's subnormal range.
    pub tc_eta: f32,
    /// brute_join_tc: right tiles per block ([`tc_run`], set by the launch).
    pub tc_run: u32,
    /// brute_join_tc: pairs its queue holds ([`tc_queue`], set by the launch).
    pub tc_queue: u32,
    pub cells: [u64; 8],
    pub strides: [u64; 8],
    /// Grid, windowed: the half-width of that range.
    pub window: f64,
}

// SAFETY: `JoinParams` is `repr(C)` plain data laid out exactly as the CUDA struct it mirrors
// (kernels/common.cuh asserts the same size).
unsafe impl DeviceRepr for JoinParams {}
const _: () = assert!(std::mem::size_of::<JoinParams>() == 216, "JoinParams layout changed: update kernels/common.cuh");

/// The rows of one join side on the device, in slot order.
#[derive(Debug)]
pub struct SideBuffers {
    /// f32 filter-space rows.
    pub filter: CudaSlice<f32>,
    /// brute_join_tc's rows: `filter` scaled and rounded to f16 ([`pack_half_rows`]); `None`
    /// where the tensor cores do not filter.
    pub half_rows: Option<CudaSlice<u32>>,
    /// brute_join_tc_bytes's rows where every value is an integer within one window of 256
    /// ([`byte_rows`]); `None` elsewhere.
    pub byte_rows: Option<ByteRows>,
    /// f64 exact rows (shared with the device's resident rows when kept across queries).
    pub exact: Arc<CudaSlice<f64>>,
    /// Cosine: Σx² per row (else one unused value).
    pub norms: CudaSlice<f64>,
    /// Dot-product filters (inner product, GEMM form): ‖x̃‖ per row (else one unused value).
    pub filter_norms: CudaSlice<f32>,
    /// GEMM form: ‖x̃‖² per row (else one unused value).
    pub filter_sq_norms: CudaSlice<f32>,
    /// Slot → vector position.
    pub order: CudaSlice<u32>,
    /// Whether the exact rows were on the device before this run (kept from an earlier query).
    pub resident: bool,
}

impl SideBuffers {
    /// Device bytes of the side's buffers but its exact rows (which may be shared).
    pub fn own_bytes(&self) -> usize {
        let byte_words = self.byte_rows.as_ref().map_or(0, |b| b.rows.len() + b.sq_norms.len());
        4 * (self.filter.len()
            + self.half_rows.as_ref().map_or(0, |h| h.len())
            + byte_words
            + self.filter_norms.len()
            + self.filter_sq_norms.len()
            + self.order.len())
            + 8 * self.norms.len()
    }
}

/// A side's rows for brute_join_tc_bytes (pack_byte_rows in kernels/sim_join.cu): each value
/// minus `offset`, a byte, four to a word ([`byte_row_words`] a row), and each row's sum of
/// squares of those bytes.
#[derive(Debug)]
pub struct ByteRows {
    pub rows: CudaSlice<u32>,
    pub sq_norms: CudaSlice<u32>,
    /// 0 for values in [0, 255], −128 for values in [−128, 127]: both sides of a pass need the same.
    pub offset: i32,
}

/// The grid of a join on the device.
#[derive(Debug)]
pub struct GridBuffers {
    /// Linear cell id of each left slot.
    pub left_slot_cell: CudaSlice<u64>,
    /// Non-empty right cell ids, ascending.
    pub right_cell_ids: CudaSlice<u64>,
    /// First right slot of each cell, plus the end.
    pub right_cell_start: CudaSlice<u32>,
    /// Linear id → right cell (dense grids; else one unused value).
    pub cell_table: CudaSlice<u32>,
    /// Each left slot's key on the sort dimension (sortidu).
    pub left_sort_keys: CudaSlice<f64>,
    /// Each right slot's key on the sort dimension, ascending within each cell.
    pub right_sort_keys: CudaSlice<f64>,
}

/// What a pass of a join reads: both sides, and the grid (`None`: brute force over all
/// `right_len` right rows).
#[derive(Debug, Clone, Copy)]
pub struct JoinInputs<'a> {
    /// The left side's rows, in slot order.
    pub left: &'a SideBuffers,
    /// The right side's rows (the left side's for a self-join).
    pub right: &'a SideBuffers,
    /// Right rows.
    pub right_len: u32,
    /// The grid over the right side, or `None` for brute force.
    pub grid: Option<&'a GridBuffers>,
    /// The share of the pass's (left, right) pairs expected to pass the filter, where known (kNN,
    /// from its radii), else 0: sizes brute_join_tc's runs and queue ([`tc_run`]).
    pub expected_share: f64,
}

/// Where a pass puts its results.
#[derive(Debug)]
pub struct PassBuffers {
    /// Count pass: result pairs per left slot of the batch.
    pub counts: CudaSlice<u32>,
    /// Write pass: first output index of each left slot of the batch (brute_join advances these
    /// as cursors, so they are uploaded again before each write pass).
    pub offsets: CudaSlice<u64>,
    /// Collecting count pass and write pass: left vector positions.
    pub out_left: CudaSlice<u32>,
    /// Collecting count pass and write pass: right vector positions.
    pub out_right: CudaSlice<u32>,
    /// Collecting count pass and write pass: exact distances.
    pub out_distance: CudaSlice<f64>,
    /// Collecting count pass: the pairs found so far (stored or not), one value.
    pub collected: CudaSlice<u64>,
    /// brute_join with `per_row`: each left slot's exact threshold (else one unused value).
    pub row_threshold: CudaSlice<f64>,
    /// brute_join with `per_row`: each left slot's f32 filter limit (else one unused value).
    pub row_limit: CudaSlice<f32>,
}

impl PassBuffers {
    /// Buffers for passes over at most `slots` left slots, with `row_values` per-row thresholds
    /// and limits (0 without `per_row`); the outputs start empty and are sized after the count.
    pub fn new(device: &GpuDevice, slots: usize, row_values: usize) -> Result<Self, String> {
        let s = &device.stream;
        let alloc = |e: cudarc::driver::DriverError| format!("GPU allocation failed: {e}");
        Ok(Self {
            counts: s.alloc_zeros::<u32>(slots.max(1)).map_err(alloc)?,
            offsets: s.alloc_zeros::<u64>(1).map_err(alloc)?,
            out_left: s.alloc_zeros::<u32>(1).map_err(alloc)?,
            out_right: s.alloc_zeros::<u32>(1).map_err(alloc)?,
            out_distance: s.alloc_zeros::<f64>(1).map_err(alloc)?,
            collected: s.alloc_zeros::<u64>(1).map_err(alloc)?,
            row_threshold: s.alloc_zeros::<f64>(row_values.max(1)).map_err(alloc)?,
            row_limit: s.alloc_zeros::<f32>(row_values.max(1)).map_err(alloc)?,
        })
    }

    /// Output buffers for `pairs` pairs (what a collecting count pass may store, or the largest
    /// write batch's count).
    pub fn size_outputs(&mut self, device: &GpuDevice, pairs: usize) -> Result<(), String> {
        let s = &device.stream;
        let alloc = |e: cudarc::driver::DriverError| format!("GPU allocation of {pairs} result pairs failed: {e}");
        self.out_left = s.alloc_zeros::<u32>(pairs.max(1)).map_err(alloc)?;
        self.out_right = s.alloc_zeros::<u32>(pairs.max(1)).map_err(alloc)?;
        self.out_distance = s.alloc_zeros::<f64>(pairs.max(1)).map_err(alloc)?;
        Ok(())
    }
}

/// What a pass of the join kernels does (kernels/sim_join.cu, top).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    /// Counts each left slot's pairs.
    Count,
    /// Counts, and collects the pairs into the output buffers while they have room.
    CountAndCollect,
    /// Writes each left slot's pairs from its uploaded offset.
    Write,
    /// kNN's first count pass on f16 rows (brute_join_tc, L2 and L2², slots of
    /// `slot_capacity`): the slots keep the filter's scores of their pairs, and knn_settle_slots
    /// then checks exactly only those that can be among the `k` nearest. The counts it leaves
    /// are those of the checked pairs within the radius where they settle the query (at least k)
    /// or prove it short (below k), and the filter's count where the slot overflowed, which an
    /// exact pass must count again (PASS_SCORES in kernels/sim_join.cu).
    Scores { k: u32 },
}

/// Runs a pass of a join over left slots `slots` on the device's stream (with knn_settle_slots
/// after a scores pass) and waits for it.
pub fn join_pass(
    device: &GpuDevice,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
    kind: PassKind,
) -> Result<(), String> {
    let kernel = launch_join_pass(device, &device.stream, params, slots.clone(), inputs, pass, kind)?;
    if let PassKind::Scores { k } = kind {
        settle_slots(device, params, slots, k, inputs, pass)?;
    }
    device.stream.synchronize().map_err(|e| format!("{kernel} failed: {e}"))
}

/// Queues knn_settle_slots over left slots `slots` after a scores pass over them (see
/// [`PassKind::Scores`]).
fn settle_slots(
    device: &GpuDevice,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    k: u32,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
) -> Result<(), String> {
    if slots.is_empty() {
        return Ok(());
    }
    let function = device.function(KernelModule::SimJoin, "knn_settle_slots")?;
    let warps = BLOCK as usize / 32;
    let config = LaunchConfig {
        grid_dim: (slots.len().div_ceil(warps) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let (begin, end) = (slots.start, slots.end);
    let JoinInputs { left, right, .. } = inputs;
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(params)
        .arg(&begin)
        .arg(&end)
        .arg(&k)
        .arg(left.exact.as_ref())
        .arg(right.exact.as_ref())
        .arg(&left.filter_norms)
        .arg(&left.filter_sq_norms)
        .arg(&right.order)
        .arg(&pass.row_threshold)
        .arg(&mut pass.counts)
        .arg(&mut pass.out_right)
        .arg(&mut pass.out_distance);
    // SAFETY: the arguments match knn_settle_slots' parameter list one for one. Warp w reads left
    // slot begin + w < `end` (the pass's slots, all within the left side's rows, norms and the
    // per-row thresholds, as for the pass itself), its count at w < end − begin, and, where that
    // count is at most `params.slot_capacity`, that many entries of its slot from w ·
    // slot_capacity, which launch_join_pass checked the outputs hold; each entry's right slot is
    // one the pass stored, below `right_len`, so its exact row and order entry exist. It writes
    // only within those entries and its own count.
    unsafe { builder.launch(config) }.map_err(|e| format!("knn_settle_slots launch failed: {e}"))?;
    Ok(())
}

/// Queues a pass of a join over left slots `slots` on `stream` without waiting for it; the
/// kernel's name.
pub fn launch_join_pass(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
    kind: PassKind,
) -> Result<&'static str, String> {
    let JoinInputs { left, right, right_len, grid, expected_share } = inputs;
    let byte_sides = byte_sides(device, params, left, right);
    let kernel = match grid {
        Some(_) => "grid_join",
        None if byte_sides.is_some() => "brute_join_tc_bytes",
        None if params.tensor_cores != 0 => "brute_join_tc",
        None => "brute_join",
    };
    let tensor_cores = kernel.starts_with("brute_join_tc");
    if slots.is_empty() {
        return Ok(kernel);
    }
    let function = device.function(KernelModule::SimJoin, kernel)?;
    // brute_join_tc reads the sides' f16 rows, brute_join_tc_bytes their byte rows, in the f32
    // filter rows' place (and the byte rows' squared norms in the f32 ones').
    let (tc_rows, row_words) = match (byte_sides, &left.half_rows, &right.half_rows) {
        (Some((l, r)), ..) => (Some((&l.rows, &r.rows)), byte_row_words(params.dim as usize)),
        (None, Some(l), Some(r)) if tensor_cores => (Some((l, r)), tc_row_words(params.dim as usize)),
        _ if tensor_cores => return Err("brute_join_tc: a side has no f16 rows".to_string()),
        _ => (None, 0),
    };
    let left_tiles = slots.len().div_ceil(BRUTE_TILE);
    // brute_join_tc's run and queue, from twice the pairs expected a tile where the pass expects
    // many (kNN: `expected_share`); brute_join_tc_bytes decides every pair in its epilogue and
    // queues none; the other kernels have neither.
    let (run, queue) = match kernel {
        "brute_join_tc" => {
            let per_tile = 2.0 * expected_share * (BRUTE_TILE * BRUTE_TILE) as f64;
            let queue_most = tc_queue_most(
                device.shared_memory_per_block,
                device.shared_memory_per_multiprocessor,
                row_words,
                warpgroup_mma(device),
            );
            let run = tc_run(device, left_tiles, right_len as usize, per_tile, queue_most);
            (run, tc_queue(run, per_tile, queue_most))
        }
        "brute_join_tc_bytes" => (tc_run(device, left_tiles, right_len as usize, 0.0, 0), 0),
        _ => (1, 0),
    };
    let params = &JoinParams { tc_run: run as u32, tc_queue: queue as u32, ..*params };
    let shared_mem_bytes = if tensor_cores { tc_shared_bytes(device, row_words, params.tc_queue as usize) } else { 0 };
    let maps = match tc_rows {
        Some((l, r)) => Some((tc_row_map(device, l, row_words)?, tc_row_map(device, r, row_words)?)),
        None => None,
    };
    if shared_mem_bytes > 0 {
        // More than the 48 KB a block gets without asking.
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| format!("{kernel}: {shared_mem_bytes} bytes of shared memory refused: {e}"))?;
    }
    // PASS_COUNT, PASS_WRITE and PASS_SCORES in kernels/sim_join.cu (a collecting count pass is
    // a count pass with a capacity).
    let pass_code: i32 = match kind {
        PassKind::Count | PassKind::CountAndCollect => 0,
        PassKind::Write => 1,
        PassKind::Scores { .. } => 2,
    };
    if matches!(kind, PassKind::Scores { .. }) && (kernel != "brute_join_tc" || params.slot_capacity == 0) {
        return Err(format!("{kernel}: a scores pass needs brute_join_tc and slots"));
    }
    if params.slot_capacity > 0 && kind != PassKind::Write {
        let needed = slots.len() as u64 * params.slot_capacity as u64;
        if grid.is_some() || (pass.out_right.len().min(pass.out_distance.len()) as u64) < needed {
            return Err(format!(
                "{kernel}: slots of {} pairs for {} left rows need {needed} outputs",
                params.slot_capacity,
                slots.len()
            ));
        }
    }
    let capacity = match kind {
        PassKind::CountAndCollect => pass.out_left.len().min(pass.out_right.len()).min(pass.out_distance.len()) as u64,
        _ => 0,
    };
    let (begin, end) = (slots.start, slots.end);
    // Launches as (first right row, blocks): the grid join one block per BLOCK left slots; brute
    // force one block per left tile of 128 rows and run of right tiles (brute_join one tile,
    // brute_join_tc tc_run), left tiles fastest (brute_tile in sim_join.cu), in as many launches
    // over consecutive runs as the 2³¹ − 1 blocks of a grid require.
    let launches: Vec<(u32, u32)> = match grid {
        Some(_) => vec![(0, slots.len().div_ceil(BLOCK as usize) as u32)],
        None => {
            let run_rows = BRUTE_TILE * run;
            let runs = (right_len as usize).div_ceil(run_rows);
            let per_launch = (i32::MAX as usize / left_tiles).min(runs).max(1);
            (0..runs)
                .step_by(per_launch)
                .map(|first| ((first * run_rows) as u32, (left_tiles * per_launch.min(runs - first)) as u32))
                .collect()
        }
    };
    for (right_begin, blocks) in launches {
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes };
        let mut builder = stream.launch_builder(&function);
        builder.arg(params).arg(&begin).arg(&end);
        if grid.is_none() {
            builder.arg(&right_begin).arg(&right_len);
        }
        match tc_rows {
            Some((l, r)) => builder.arg(l).arg(r),
            None => builder.arg(&left.filter).arg(&right.filter),
        };
        builder
            .arg(left.exact.as_ref())
            .arg(right.exact.as_ref())
            .arg(&left.norms)
            .arg(&right.norms)
            .arg(&left.filter_norms)
            .arg(&right.filter_norms)
            .arg(&left.order)
            .arg(&right.order);
        match grid {
            Some(g) => builder
                .arg(&g.left_slot_cell)
                .arg(&g.right_cell_ids)
                .arg(&g.right_cell_start)
                .arg(&g.cell_table)
                .arg(&g.left_sort_keys)
                .arg(&g.right_sort_keys),
            None => {
                match byte_sides {
                    Some((l, r)) => builder.arg(&l.sq_norms).arg(&r.sq_norms),
                    None => builder.arg(&left.filter_sq_norms).arg(&right.filter_sq_norms),
                };
                builder.arg(&pass.row_threshold).arg(&pass.row_limit)
            }
        };
        builder
            .arg(&mut pass.counts)
            .arg(&mut pass.offsets)
            .arg(&mut pass.out_left)
            .arg(&mut pass.out_right)
            .arg(&mut pass.out_distance)
            .arg(&mut pass.collected)
            .arg(&capacity)
            .arg(&pass_code);
        if let Some((left_map, right_map)) = &maps {
            builder.arg(left_map).arg(right_map);
        }
        // SAFETY: the arguments match the kernel's parameter list in kernels/sim_join.cu one for
        // one (types and order). Every row buffer holds `dim` values per slot for all slots the
        // kernel reads: left slots < `end` ≤ left rows, right slots < `right_len` or within
        // `right_cell_start`; with `params.per_row`, `row_threshold` and `row_limit` hold a value
        // for every left slot; with the GEMM filter, `filter_norms` and `filter_sq_norms` hold one
        // per row of their side. `counts` and `offsets` hold at least `end - begin` entries (counts
        // zeroed before the count pass). A collecting count pass stores a pair only at an index
        // below `capacity`, the length of all three output buffers; one with `slot_capacity`
        // only below (end − begin)·slot_capacity, which `out_right` and `out_distance` hold
        // (checked above). brute_join_tc gets the dynamic shared memory of its queue and 2 to 4
        // pipeline stages (tc_shared_bytes, allowed by the attribute set above) and uses no more
        // than the stages that size holds; its TMA maps (sm_90a) cover exactly its sides' f16 rows
        // (brute_join_tc_bytes: byte rows, `byte_row_words` a row, and one u32 squared norm a row
        // in the squared norms' place, which it reads as u32). A write pass's output buffers
        // hold at least the batch's total count, which it never exceeds because it re-finds
        // exactly the pairs the count pass counted (same inputs, same deterministic arithmetic),
        // each row within its own [offset, offset + count) range, whatever launches the right rows
        // are split into.
        unsafe { builder.launch(config) }.map_err(|e| format!("{kernel} launch failed: {e}"))?;
    }
    Ok(kernel)
}

/// Words of a brute_join_tc row of `dim` coordinates (`tc_row_words` in kernels/sim_join.cu): two
/// f16 a word, padded to whole groups of four words.
pub fn tc_row_words(dim: usize) -> usize {
    dim.div_ceil(8) * 4
}

/// Words of a brute_join_tc_bytes row of `dim` coordinates (`byte_row_words` in
/// kernels/sim_join.cu): four bytes a word, padded to whole groups of four words.
pub fn byte_row_words(dim: usize) -> usize {
    dim.div_ceil(16) * 4
}

/// The most dimensions of byte rows: the s32 dot products and squared norms of brute_join_tc_bytes
/// stay below 2²⁹ (8,192 · 255² < 2²⁹; its bounds and sentinels in kernels/sim_join.cu rely on it).
const BYTE_ROWS_MOST_DIM: usize = 8192;

/// Both sides' byte rows where a pass runs on them (brute_join_tc_bytes): brute force on the
/// tensor cores (the GEMM filter of L2 and L2², the only metrics given byte rows: the sides'
/// builder, `with_tensor_core_rows` in src/backend/gpu.rs), under wgmma, both sides shifted alike.
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
/// [0, 255] or else in [−128, 127] (integer_range, then pack_byte_rows in kernels/sim_join.cu);
/// `None` otherwise.
pub fn byte_rows(
    device: &GpuDevice,
    exact: &CudaSlice<f64>,
    rows: usize,
    dim: usize,
) -> Result<Option<ByteRows>, String> {
    if !warpgroup_mma(device) || rows == 0 || dim == 0 || dim > BYTE_ROWS_MOST_DIM || exact.len() < rows * dim {
        return Ok(None);
    }
    let stream = &device.stream;
    let failed = |e: cudarc::driver::DriverError| format!("integer_range failed: {e}");
    let range = device.function(KernelModule::SimJoin, "integer_range")?;
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
    unsafe { builder.launch(config) }.map_err(|e| format!("integer_range launch failed: {e}"))?;
    let offset = match stream.clone_dtoh(&result).map_err(failed)?[..] {
        [least, greatest, 0] if least >= 0 && greatest <= 255 => 0,
        [least, greatest, 0] if least >= -128 && greatest <= 127 => -128,
        _ => return Ok(None),
    };
    let pack = device.function(KernelModule::SimJoin, "pack_byte_rows")?;
    let row_words = byte_row_words(dim);
    let mut packed = stream.alloc_zeros::<u32>(rows * row_words).map_err(alloc_failed)?;
    let mut sq_norms = stream.alloc_zeros::<u32>(rows).map_err(alloc_failed)?;
    let (rows64, dim32, words32) = (rows as u64, dim as u32, row_words as u32);
    let mut builder = stream.launch_builder(&pack);
    builder.arg(exact).arg(&rows64).arg(&dim32).arg(&words32).arg(&offset).arg(&mut packed).arg(&mut sq_norms);
    // SAFETY: pack_byte_rows(const double*, u64, u32, u32, int, u32*, u32*) reads rows · dim ≤
    // the exact rows' length values and writes rows · row_words words and rows norms, the
    // outputs' lengths, a warp a row in a grid-stride loop.
    unsafe { builder.launch(strided(rows as u64 * 32)) }.map_err(|e| format!("pack_byte_rows launch failed: {e}"))?;
    Ok(Some(ByteRows { rows: packed, sq_norms, offset }))
}

/// The largest |value| of f32 `values` (filter_max_abs in kernels/sim_join.cu); NaN if one is.
pub fn filter_max_abs(device: &GpuDevice, values: &CudaSlice<f32>) -> Result<f32, String> {
    let function = device.function(KernelModule::SimJoin, "filter_max_abs")?;
    let failed = |e: cudarc::driver::DriverError| format!("filter_max_abs failed: {e}");
    let mut result = device.stream.alloc_zeros::<u32>(1).map_err(failed)?;
    let len = values.len() as u64;
    let blocks = len.div_ceil(BLOCK as u64 * 8).clamp(1, 4096) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(values).arg(&len).arg(&mut result);
    // SAFETY: filter_max_abs(const float*, u64, u32*) reads indices < `len`, the buffer's length
    // (a grid-stride loop), and updates the single u32 of `result`.
    unsafe { builder.launch(config) }.map_err(|e| format!("filter_max_abs launch failed: {e}"))?;
    let bits = device.stream.clone_dtoh(&result).map_err(failed)?;
    Ok(f32::from_bits(bits[0]))
}

/// A side's f32 filter rows (`rows` of `dim`) times `scale` (a power of two), rounded to f16 and
/// packed as brute_join_tc reads them (pack_half_rows in kernels/sim_join.cu; the margin counts the
/// rounding: `tensor_core_margin` in src/backend/gpu.rs).
pub fn pack_half_rows(
    device: &GpuDevice,
    filter: &CudaSlice<f32>,
    rows: usize,
    dim: usize,
    scale: f32,
) -> Result<CudaSlice<u32>, String> {
    if filter.len() < rows * dim {
        return Err(format!("pack_half_rows: {rows} rows of {dim} values from {} values", filter.len()));
    }
    let function = device.function(KernelModule::SimJoin, "pack_half_rows")?;
    let row_words = tc_row_words(dim);
    let mut packed = device
        .stream
        .alloc_zeros::<u32>((rows * row_words).max(1))
        .map_err(|e| format!("GPU allocation failed: {e}"))?;
    let (rows64, dim32, words32) = (rows as u64, dim as u32, row_words as u32);
    let blocks = ((rows * row_words) as u64).div_ceil(BLOCK as u64).clamp(1, 65_536) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(filter).arg(&rows64).arg(&dim32).arg(&words32).arg(&scale).arg(&mut packed);
    // SAFETY: pack_half_rows(const float*, u64, u32, u32, float, u32*) writes indices < rows ·
    // row_words ≤ the output's length and reads values < rows · dim ≤ the filter's length (checked
    // above), in a grid-stride loop.
    unsafe { builder.launch(config) }.map_err(|e| format!("pack_half_rows launch failed: {e}"))?;
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
/// computed on the device exactly as the host computes them (filter_rows in kernels/sim_join.cu).
pub fn filter_rows(device: &GpuDevice, exact: &CudaSlice<f64>, n: usize, origin: &[f64]) -> Result<FilterRows, String> {
    let dim = origin.len();
    if exact.len() < n * dim || n >= u32::MAX as usize || dim == 0 {
        return Err(format!("filter rows of {n} rows of {dim} values from {} values", exact.len()));
    }
    let stream = &device.stream;
    let alloc = |e: cudarc::driver::DriverError| format!("GPU allocation failed: {e}");
    let origin = stream.clone_htod(origin).map_err(|e| format!("GPU copy failed: {e}"))?;
    let mut filter = stream.alloc_zeros::<f32>((n * dim).max(1)).map_err(alloc)?;
    let mut norms = stream.alloc_zeros::<f32>(n.max(1)).map_err(alloc)?;
    let mut sq_norms = stream.alloc_zeros::<f32>(n.max(1)).map_err(alloc)?;
    let function = device.function(KernelModule::SimJoin, "filter_rows")?;
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
    unsafe { builder.launch(config) }.map_err(|e| format!("filter_rows launch failed: {e}"))?;
    Ok(FilterRows { filter, norms, sq_norms })
}

/// Queries and sample rows per block of knn_sample_distances (`SAMPLE_QUERIES`, `SAMPLE_COLUMNS` in
/// kernels/knn.cu).
const SAMPLE_QUERIES: u32 = 64;
const SAMPLE_COLUMNS: u32 = 128;

/// The base rows kNN's radii are picked from, as the kernel that takes their distances reads them.
pub enum KnnSample {
    /// f32 filter rows, dimension-major ([`sample_rows`]): knn_sample_distances.
    Filter(CudaSlice<f32>),
    /// brute_join_tc's f16 rows, scaled by 2^`scale_exponent`, and their squared filter norms where
    /// the keys are squared L2 distances (`None`: the inner product's, −x·s):
    /// knn_sample_distances_tc ([`sample_half_rows`]).
    Half { rows: CudaSlice<u32>, sq_norms: Option<CudaSlice<f32>>, scale_exponent: i32 },
    /// brute_join_tc_bytes's byte rows and their squared norms, whose keys are exact squared
    /// distances: knn_sample_keys_bytes ([`sample_byte_rows`]).
    Bytes(ByteRows),
}

/// The sample as knn_sample_distances_tc reads it, where the base has f16 rows (scaled by
/// 2^`scale_exponent`): rows ⌊i·n/sample_len⌋ (knn_sample_rows' choice) of them and, for keys that
/// are `squared_distances` (the GEMM form's metrics), of its squared filter norms, gathered.
pub fn sample_half_rows(
    device: &GpuDevice,
    base: &SideBuffers,
    n: usize,
    dim: usize,
    sample_len: usize,
    scale_exponent: i32,
    squared_distances: bool,
) -> Result<KnnSample, String> {
    let Some(half_rows) = &base.half_rows else {
        return Err("knn_sample_distances_tc: the base has no f16 rows".into());
    };
    if sample_len == 0 || sample_len > n {
        return Err(format!("knn_sample_distances_tc: a sample of {sample_len} rows of a base of {n} rows"));
    }
    let picked = sample_positions(device, n, sample_len)?;
    let rows = gather_rows(device, half_rows, n, &picked, sample_len, tc_row_words(dim))?;
    let sq_norms = match squared_distances {
        true if base.filter_sq_norms.len() < n => {
            return Err(format!(
                "knn_sample_distances_tc: {} squared norms for a base of {n} rows",
                base.filter_sq_norms.len()
            ));
        }
        true => Some(gather_rows(device, &base.filter_sq_norms, n, &picked, sample_len, 1)?),
        false => None,
    };
    Ok(KnnSample::Half { rows, sq_norms, scale_exponent })
}

/// The base rows a sample of `sample_len` of `n` takes, ⌊i·n/sample_len⌋ (knn_sample_rows' choice),
/// on the device.
fn sample_positions(device: &GpuDevice, n: usize, sample_len: usize) -> Result<CudaSlice<u32>, String> {
    let picked: Vec<u32> = (0..sample_len).map(|i| (i as u64 * n as u64 / sample_len as u64) as u32).collect();
    device.stream.clone_htod(&picked).map_err(|e| format!("GPU copy failed: {e}"))
}

/// The sample as knn_sample_keys_bytes reads it, where the base has byte rows: rows ⌊i·n/sample_len⌋
/// (knn_sample_rows' choice) of them and of their squared norms, gathered.
pub fn sample_byte_rows(
    device: &GpuDevice,
    base: &ByteRows,
    n: usize,
    dim: usize,
    sample_len: usize,
) -> Result<KnnSample, String> {
    if sample_len == 0 || sample_len > n {
        return Err(format!("knn_sample_keys_bytes: a sample of {sample_len} rows of a base of {n} rows"));
    }
    let picked = sample_positions(device, n, sample_len)?;
    Ok(KnnSample::Bytes(ByteRows {
        rows: gather_rows(device, &base.rows, n, &picked, sample_len, byte_row_words(dim))?,
        sq_norms: gather_rows(device, &base.sq_norms, n, &picked, sample_len, 1)?,
        offset: base.offset,
    }))
}

/// kNN's radius sample (knn_sample_rows in kernels/knn.cu): `sample_len` evenly spread rows of the
/// base's f32 filter rows (`base_filter`, `n` rows of `dim` in input order), dimension-major.
pub fn sample_rows(
    device: &GpuDevice,
    base_filter: &CudaSlice<f32>,
    n: usize,
    dim: usize,
    sample_len: usize,
) -> Result<CudaSlice<f32>, String> {
    if sample_len == 0 || sample_len > n || base_filter.len() < n * dim {
        return Err(format!("knn_sample_rows: a sample of {sample_len} rows of a base of {n} rows of {dim} values"));
    }
    let function = device.function(KernelModule::Knn, "knn_sample_rows")?;
    let mut sample =
        device.stream.alloc_zeros::<f32>(sample_len * dim).map_err(|e| format!("GPU allocation failed: {e}"))?;
    let blocks = (sample_len * dim).div_ceil(BLOCK as usize).clamp(1, 65_536) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let (n32, dim32, len32) = (n as u32, dim as u32, sample_len as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(base_filter).arg(&n32).arg(&dim32).arg(&len32).arg(&mut sample);
    // SAFETY: the arguments match knn_sample_rows's parameter list one for one. It writes indices
    // < sample_len·dim, the sample's length, and reads row ⌊i·n/sample_len⌋ < n (i < sample_len),
    // values < n·dim ≤ the filter's length (checked above).
    unsafe { builder.launch(config) }.map_err(|e| format!("knn_sample_rows launch failed: {e}"))?;
    Ok(sample)
}

/// A kNN sample's keys on brute_join_tc's pipeline (sm_90a): knn_sample_keys_bytes or
/// knn_sample_keys_half, the dynamic shared memory it was allowed, and the TMA maps of the
/// queries' and the sample's rows.
struct SampleKeys {
    function: CudaFunction,
    shared_mem_bytes: u32,
    query_map: TensorMap,
    sample_map: TensorMap,
}

/// Sampled kNN radii (kernels/knn.cu): for each query of `queries`, `LEVELS` radii into `radii`
/// (indexed by query position), from the f32 distances of the filter rows to the sample's
/// (`sample`: [`sample_rows`] in the query side's filter space, or [`sample_half_rows`] beside the
/// query side's f16 rows): computed for groups of queries at a time (knn_sample_distances or
/// knn_sample_distances_tc) into a scratch row per query, then the radii picked per query
/// (knn_sample_radius), at most `chunk_queries` (≥ 1) queries a round, the scratch's rows.
#[allow(clippy::too_many_arguments)]
pub fn sample_radius_pass(
    device: &GpuDevice,
    params: &JoinParams,
    queries: std::ops::Range<u32>,
    query_side: &SideBuffers,
    sample: &KnnSample,
    sample_len: u32,
    rank: u32,
    chunk_queries: usize,
    radii: &mut CudaSlice<f64>,
) -> Result<(), String> {
    if queries.is_empty() {
        return Ok(());
    }
    if sample_len as usize > KNN_SAMPLE || sample_len == 0 || rank == 0 || chunk_queries == 0 {
        return Err(format!(
            "knn_sample_radius: a sample of {sample_len} rows (at most {KNN_SAMPLE}) at rank {rank}, {chunk_queries} queries a round"
        ));
    }
    let stream = &device.stream;
    // The f16 kernel's squared L2 distances need both sides' squared norms.
    if let KnnSample::Half { sq_norms: Some(sq_norms), .. } = sample
        && (query_side.filter_sq_norms.len() < queries.end as usize || sq_norms.len() < sample_len as usize)
    {
        return Err("knn_sample_distances_tc: squared filter norms missing".into());
    }
    // Under wgmma the tensor-core keys come from brute_join_tc's pipeline (knn_sample_keys_bytes,
    // knn_sample_keys_half: TMA and wgmma, its shared memory without a queue), over the queries'
    // and the sample's rows by their TMA maps; mma.sync devices keep knn_sample_distances_tc.
    let on_pipeline = |kernel: &str,
                       query_rows: &CudaSlice<u32>,
                       sample_rows: &CudaSlice<u32>,
                       row_words: usize|
     -> Result<SampleKeys, String> {
        let function = device.function(KernelModule::SimJoin, kernel)?;
        let shared_mem_bytes = tc_shared_bytes(device, row_words, 0);
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| format!("{kernel}: {shared_mem_bytes} bytes of shared memory refused: {e}"))?;
        Ok(SampleKeys {
            function,
            shared_mem_bytes,
            query_map: tc_row_map(device, query_rows, row_words)?,
            sample_map: tc_row_map(device, sample_rows, row_words)?,
        })
    };
    let dim = params.dim as usize;
    let pipeline = match (sample, &query_side.half_rows, &query_side.byte_rows) {
        (KnnSample::Bytes(sample), _, Some(query))
            if query.offset == sample.offset
                && query.sq_norms.len() >= queries.end as usize
                && sample.sq_norms.len() >= sample_len as usize =>
        {
            Some(on_pipeline("knn_sample_keys_bytes", &query.rows, &sample.rows, byte_row_words(dim))?)
        }
        (KnnSample::Bytes(_), ..) => {
            return Err("knn_sample_keys_bytes: the queries have no byte rows shifted as the sample's".into());
        }
        (KnnSample::Half { rows, .. }, Some(query_rows), _) if warpgroup_mma(device) => {
            Some(on_pipeline("knn_sample_keys_half", query_rows, rows, tc_row_words(dim))?)
        }
        _ => None,
    };
    let distances_kernel = match (sample, &pipeline) {
        (_, Some(keys)) => keys.function.clone(),
        (KnnSample::Filter(_), None) => device.function(KernelModule::Knn, "knn_sample_distances")?,
        (_, None) => device.function(KernelModule::Knn, "knn_sample_distances_tc")?,
    };
    let radius_kernel = device.function(KernelModule::Knn, "knn_sample_radius")?;
    let chunk = chunk_queries.min(queries.len());
    let mut distances =
        stream.alloc_zeros::<f32>(chunk * KNN_SAMPLE).map_err(|e| format!("GPU allocation failed: {e}"))?;
    for begin in queries.clone().step_by(chunk) {
        let end = (begin as usize + chunk).min(queries.end as usize) as u32;
        let groups = (end - begin).div_ceil(SAMPLE_QUERIES);
        let config = LaunchConfig {
            grid_dim: (groups, sample_len.div_ceil(SAMPLE_COLUMNS), 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // On the pipeline: brute_join_tc's grid, a block per left tile and run of right tiles.
        let pipeline_launch = |keys: &SampleKeys| {
            let left_tiles = (end - begin).div_ceil(BRUTE_TILE as u32) as usize;
            let run = tc_run(device, left_tiles, sample_len as usize, 0.0, 0);
            let blocks = left_tiles * (sample_len as usize).div_ceil(BRUTE_TILE * run);
            let config = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: keys.shared_mem_bytes,
            };
            (JoinParams { tc_run: run as u32, tc_queue: 0, ..*params }, config)
        };
        let mut builder = stream.launch_builder(&distances_kernel);
        match (sample, &query_side.half_rows, &query_side.byte_rows, &pipeline) {
            (KnnSample::Half { rows, sq_norms, scale_exponent }, Some(query_rows), _, pipeline) => {
                let (row_words, unscale) = (tc_row_words(dim) as u32, 2f32.powi(-2 * scale_exponent));
                // Without squared norms (the inner product) the kernel reads none: any buffer will do.
                let (squared, sample_sq) =
                    (u32::from(sq_norms.is_some()), sq_norms.as_ref().unwrap_or(&query_side.filter_sq_norms));
                // knn_sample_keys_half takes the launch's JoinParams where knn_sample_distances_tc
                // takes the row's words, and the two maps last.
                let (keys_params, keys_config) = match pipeline {
                    Some(keys) => pipeline_launch(keys),
                    None => (*params, config),
                };
                match pipeline {
                    Some(_) => builder.arg(&keys_params),
                    None => builder.arg(&row_words),
                };
                builder
                    .arg(&begin)
                    .arg(&end)
                    .arg(query_rows)
                    .arg(&query_side.filter_sq_norms)
                    .arg(rows)
                    .arg(sample_sq)
                    .arg(&sample_len)
                    .arg(&unscale)
                    .arg(&squared)
                    .arg(&mut distances);
                if let Some(keys) = pipeline {
                    builder.arg(&keys.query_map).arg(&keys.sample_map);
                }
                // SAFETY: the arguments match knn_sample_keys_half's parameter list one for one
                // (on the pipeline) or knn_sample_distances_tc's. A block reads f16 rows of query
                // slots in [begin, end) (end ≤ queries.end, within the query side's f16 rows,
                // packed with this `dim`) and of sample rows < sample_len (gathered with this
                // `dim` by sample_half_rows), on the pipeline by TMA maps built over exactly those
                // buffers, and, where `squared`, the squared norms of those rows (checked above to
                // hold them); on the pipeline it gets brute_join_tc's dynamic shared memory
                // without a queue (allowed by the attribute set above). It writes entry
                // (q − begin)·SAMPLE + i for q < end and i < sample_len, within `distances`
                // (chunk ≥ end − begin rows of SAMPLE).
                unsafe { builder.launch(keys_config) }.map_err(|e| {
                    format!(
                        "{} launch failed: {e}",
                        if pipeline.is_some() { "knn_sample_keys_half" } else { "knn_sample_distances_tc" }
                    )
                })?;
            }
            (KnnSample::Half { .. }, None, ..) => {
                return Err("knn_sample_distances_tc: the queries have no f16 rows".into());
            }
            (KnnSample::Bytes(sample), _, Some(query), Some(keys)) => {
                let (keys_params, config) = pipeline_launch(keys);
                builder
                    .arg(&keys_params)
                    .arg(&begin)
                    .arg(&end)
                    .arg(&query.rows)
                    .arg(&query.sq_norms)
                    .arg(&sample.rows)
                    .arg(&sample.sq_norms)
                    .arg(&sample_len)
                    .arg(&mut distances)
                    .arg(&keys.query_map)
                    .arg(&keys.sample_map);
                // SAFETY: the arguments match knn_sample_keys_bytes's parameter list one for one. A
                // block reads byte rows (packed with this `dim`) of query slots in [begin, end),
                // within the query side's byte rows, and of sample rows < sample_len, by TMA maps
                // built over exactly those buffers, and their squared norms (checked above); it gets
                // brute_join_tc_bytes's dynamic shared memory (allowed by the attribute set above)
                // and writes entry (q − begin)·SAMPLE + i for q < end and i < sample_len, within
                // `distances` (chunk ≥ end − begin rows of SAMPLE).
                unsafe { builder.launch(config) }.map_err(|e| format!("knn_sample_keys_bytes launch failed: {e}"))?;
            }
            (KnnSample::Bytes(_), ..) => return Err("knn_sample_keys_bytes: the queries have no byte rows".into()),
            (KnnSample::Filter(sample), ..) => {
                builder
                    .arg(params)
                    .arg(&begin)
                    .arg(&end)
                    .arg(&query_side.filter)
                    .arg(sample)
                    .arg(&sample_len)
                    .arg(&mut distances);
                // SAFETY: the arguments match knn_sample_distances's parameter list one for one. A
                // block reads `dim` filter values of query rows in [begin, end) (end ≤ queries.end,
                // within the query side's filter rows) and of sample rows < sample_len ≤ SAMPLE
                // (dimension-major: `dim · sample_len` values, the sample's length), and writes
                // entry (q − begin)·SAMPLE + i for q < end and i < sample_len, within `distances`
                // (chunk ≥ end − begin rows of SAMPLE).
                unsafe { builder.launch(config) }.map_err(|e| format!("knn_sample_distances launch failed: {e}"))?;
            }
        }
        let config = LaunchConfig { grid_dim: (end - begin, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let mut builder = stream.launch_builder(&radius_kernel);
        builder.arg(&params.metric).arg(&begin).arg(&distances).arg(&sample_len).arg(&rank).arg(&mut *radii);
        // SAFETY: the arguments match knn_sample_radius's parameter list one for one. Block b reads
        // row b < end − begin ≤ chunk of `distances` (its first sample_len entries, written above)
        // and writes LEVELS radii at query position begin + b < queries.end, within `radii`, which
        // holds LEVELS values for every query.
        unsafe { builder.launch(config) }.map_err(|e| format!("knn_sample_radius launch failed: {e}"))?;
    }
    stream.synchronize().map_err(|e| format!("knn_sample_radius failed: {e}"))
}

/// The largest k knn_select_slots ranks (kernels/knn.cu): a warp per query takes the smallest
/// remaining candidate k times, where knn_rank_slots sorts the whole slot. Beyond a few dozen its
/// rounds cost more than the sort (k = 100: 1.53 ms against 0.72, NOTES.md v67).
pub const KNN_SELECT_SLOTS_K: usize = 32;

/// Most candidates knn_rank_slots sorts per query (`RANK_SLOTS` in kernels/knn.cu).
pub const KNN_RANK_SLOTS: usize = 4096;

/// The `k` nearest candidates of each query whose slot (of `capacity` entries in `pass`'s
/// outputs, as the first count pass stored them) holds `slot_len[q]` ≥ k of them, ranked on the
/// device by (distance, base position) as the host ranks them (knn_select_slots in kernels/knn.cu
/// for k ≤ 32, knn_rank_slots above);
/// queries with `slot_len[q] = 0` are left out. `k` (distances, positions) per query, nearest
/// first, in query order, into the first `k` · queries places of `nearest_distance` and
/// `nearest_position` (a left-out query's are zeros).
pub fn rank_slots(
    device: &GpuDevice,
    pass: &PassBuffers,
    capacity: usize,
    k: usize,
    slot_len: &[u32],
    nearest_distance: &mut [f64],
    nearest_position: &mut [u32],
) -> Result<(), String> {
    let queries = slot_len.len();
    if capacity > KNN_RANK_SLOTS
        || queries == 0
        || k == 0
        || queries * capacity > pass.out_right.len().min(pass.out_distance.len())
    {
        return Err(format!("knn_rank_slots: {queries} slots of {capacity} (at most {KNN_RANK_SLOTS}) for k = {k}"));
    }
    if nearest_distance.len().min(nearest_position.len()) < queries * k {
        return Err(format!(
            "knn_rank_slots: {} and {} places for {queries} queries' {k} neighbours",
            nearest_distance.len(),
            nearest_position.len()
        ));
    }
    if let Some(q) = slot_len.iter().position(|&len| (len != 0 && (len as usize) < k) || len as usize > capacity) {
        return Err(format!("knn_rank_slots: query {q} has {} candidates, outside [{k}, {capacity}]", slot_len[q]));
    }
    let stream = &device.stream;
    let failed = |e: cudarc::driver::DriverError| format!("knn_rank_slots: {e}");
    let lengths = stream.clone_htod(slot_len).map_err(failed)?;
    let mut out_distance = stream.alloc_zeros::<f64>(queries * k).map_err(failed)?;
    let mut out_position = stream.alloc_zeros::<u32>(queries * k).map_err(failed)?;
    let (queries_arg, capacity_arg, k_arg) = (queries as u32, capacity as u32, k as u32);
    // Small k: a warp per query selects (knn_select_slots); else a block per query sorts.
    let select = k <= KNN_SELECT_SLOTS_K;
    let function = device.function(KernelModule::Knn, if select { "knn_select_slots" } else { "knn_rank_slots" })?;
    // Shared memory for the longest slot's sort: a key (8 bytes) and a position (4) an entry.
    let room = slot_len.iter().max().map_or(1, |&len| len.max(1).next_power_of_two());
    let config = match select {
        true => LaunchConfig {
            grid_dim: (queries.div_ceil(BLOCK as usize / 32) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        false => {
            LaunchConfig { grid_dim: (queries as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: room * 12 }
        }
    };
    let mut builder = stream.launch_builder(&function);
    if select {
        builder.arg(&queries_arg);
    }
    builder.arg(&capacity_arg).arg(&k_arg);
    if !select {
        builder.arg(&room);
    }
    builder.arg(&lengths).arg(&pass.out_distance).arg(&pass.out_right).arg(&mut out_distance).arg(&mut out_position);
    // SAFETY: the arguments match the chosen kernel's parameter list one for one (knn_select_slots
    // takes `queries` first and no `room`; its warp q < `queries` reads and writes what block q
    // of knn_rank_slots does, without shared memory). Block q reads
    // slot_len[q] (q < `queries`, its length) and, when it is not 0, entries [q·capacity,
    // q·capacity + slot_len[q]) of the distances and positions, within both (checked above:
    // slot_len[q] ≤ capacity ≤ RANK_SLOTS, and queries · capacity entries fit), sorts the next
    // power of two ≥ slot_len[q], at most `room` entries, in its 12·room bytes of dynamic shared
    // memory (≤ 48 KB: room ≤ RANK_SLOTS = 4,096), and writes k values at [q·k, q·k + k) of the
    // outputs, which hold queries · k.
    unsafe { builder.launch(config) }.map_err(|e| format!("knn_rank_slots launch failed: {e}"))?;
    stream.memcpy_dtoh(&out_distance, &mut nearest_distance[..queries * k]).map_err(failed)?;
    stream.memcpy_dtoh(&out_position, &mut nearest_position[..queries * k]).map_err(failed)?;
    stream.synchronize().map_err(failed)
}

/// Threads of a knn_rank_lists block (its `__launch_bounds__`): each round of its selection reads
/// the whole list, and its sort is a thousand entries a thread at most.
const RANK_LISTS_BLOCK: u32 = 1024;

/// knn_rank_lists' static shared memory (its histogram and choices; ptxas: 1,056 bytes), beside
/// the dynamic `room` entries.
const RANK_LISTS_STATIC_BYTES: usize = 1024 + 64;

/// The largest k knn_rank_lists ranks on `device` ([`rank_lists_most_entries`]).
pub fn rank_lists_most_k(device: &GpuDevice) -> usize {
    rank_lists_most_entries(device.shared_memory_per_block)
}

/// The largest k knn_rank_lists ranks with `per_block` bytes of shared memory a block: it sorts
/// the next power of two ≥ k entries (a key of 8 bytes and a position of 4) in one block's shared
/// memory, beside its static memory. H100 (227 KB a block): 16,384; A100 (163 KB): 8,192.
fn rank_lists_most_entries(per_block: usize) -> usize {
    let entries = per_block.saturating_sub(RANK_LISTS_STATIC_BYTES) / 12;
    if entries == 0 { 0 } else { 1 << entries.ilog2() }
}

/// Device buffers for the k nearest of each list of a kNN write pass ([`start_rank_lists`]).
#[derive(Debug)]
pub struct RankedLists {
    /// Exact distances, k a list, nearest first.
    pub distance: CudaSlice<f64>,
    /// Base positions, as `distance`.
    pub position: CudaSlice<u32>,
}

impl RankedLists {
    /// Buffers for `neighbours` (lists · k) ranked neighbours.
    pub fn new(device: &GpuDevice, neighbours: usize) -> Result<Self, String> {
        let alloc =
            |e: cudarc::driver::DriverError| format!("GPU allocation of {neighbours} ranked neighbours failed: {e}");
        Ok(Self {
            distance: device.stream.alloc_zeros::<f64>(neighbours.max(1)).map_err(alloc)?,
            position: device.stream.alloc_zeros::<u32>(neighbours.max(1)).map_err(alloc)?,
        })
    }
}

/// Queues on `stream`, behind the kNN write pass that filled `pass`'s outputs for `lists` queries
/// (each with at least k candidates), the ranking of each query's k nearest by (distance, base
/// position), as the host ranks them (knn_rank_lists in kernels/knn.cu), into the first lists · k
/// places of `ranked`, nearest first, in list order. The pass must have run on the same stream:
/// the kernel finds each list's end in `pass.offsets`, where the write pass leaves its cursors.
pub fn start_rank_lists(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pass: &PassBuffers,
    lists: usize,
    k: usize,
    ranked: &mut RankedLists,
) -> Result<(), String> {
    let most = rank_lists_most_k(device);
    if lists == 0
        || k == 0
        || k > most
        || pass.offsets.len() < lists
        || ranked.distance.len().min(ranked.position.len()) < lists * k
    {
        return Err(format!(
            "knn_rank_lists: {lists} lists at k = {k} (at most {most}) for {} offsets and {} places",
            pass.offsets.len(),
            ranked.distance.len().min(ranked.position.len())
        ));
    }
    let function = device.function(KernelModule::Knn, "knn_rank_lists")?;
    let room = k.next_power_of_two();
    let shared_mem_bytes = (room * 12) as u32;
    if shared_mem_bytes as usize + RANK_LISTS_STATIC_BYTES > 48 << 10 {
        // More than the 48 KB a block gets without asking, static memory included (k = 4,000:
        // 48 KB of entries and the histogram), within the device's (k ≤ most).
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| format!("knn_rank_lists: {shared_mem_bytes} bytes of shared memory refused: {e}"))?;
    }
    let config = LaunchConfig { grid_dim: (lists as u32, 1, 1), block_dim: (RANK_LISTS_BLOCK, 1, 1), shared_mem_bytes };
    let (k_arg, room_arg) = (k as u32, room as u32);
    let mut builder = stream.launch_builder(&function);
    builder
        .arg(&k_arg)
        .arg(&room_arg)
        .arg(&pass.offsets)
        .arg(&pass.out_distance)
        .arg(&pass.out_right)
        .arg(&mut ranked.distance)
        .arg(&mut ranked.position);
    // SAFETY: the arguments match knn_rank_lists' parameter list one for one. Block q < `lists`
    // reads offsets[q − 1] and offsets[q] (within the `lists` checked above): the write pass
    // before it on this stream advanced each cursor from its list's exclusive offset by its
    // count, so they bound list q inside the batch's total, for which the host sized the
    // outputs it reads (`distance`, `position`). It gathers at most k entries (its `slot < k`)
    // into the 12·room bytes of dynamic shared memory given here (room ≥ k, within the device's
    // opt-in: k ≤ rank_lists_most_k) and writes [q·k, q·k + k) of the outputs, which hold
    // lists · k (checked above).
    unsafe { builder.launch(config) }.map_err(|e| format!("knn_rank_lists launch failed: {e}"))?;
    Ok(())
}

/// Most sample rows knn_sample_radius selects from (`SAMPLE` in kernels/knn.cu).
pub const KNN_SAMPLE: usize = 4096;
/// Radii per query knn_sample_radius writes (`LEVELS` in kernels/knn.cu): ranks r, 4r, 16r, 64r.
pub const KNN_LEVELS: usize = 4;

/// Makes the device's default memory pool, which cudarc's stream-ordered allocations come from,
/// keep the memory freed to it for the next allocation instead of returning it to the driver at
/// every synchronisation (a release threshold of 0, the default). Each run allocates its inputs and
/// result buffers anew, up to several GB (P3 collects 4 GB of pairs); mapping them again in every
/// run cost more than some whole joins. The pool holds at most the largest run's peak, as
/// PyTorch's caching allocator does; `mem_get_info` counts it as used. Devices without
/// stream-ordered allocation allocate synchronously and are left as they are.
pub fn keep_freed_device_memory(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<(), String> {
    use cudarc::driver::{result::mem_pool, sys};
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let failed = |e: cudarc::driver::DriverError| format!("GPU memory pool setup failed: {e}");
    ctx.bind_to_thread().map_err(failed)?;
    let mut threshold = u64::MAX;
    // SAFETY: the device ordinal comes from an open context; RELEASE_THRESHOLD takes a cuuint64_t,
    // which `threshold` is, and the driver only reads it during the call.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device()).map_err(failed)?;
        mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
        .map_err(failed)
    }
}

/// Device memory a run can have: what the driver reports free plus what the default memory pool
/// holds for reuse (reserved, not in use; [`keep_freed_device_memory`] makes it keep freed memory,
/// which the driver then counts as used).
pub fn available_memory(device: &GpuDevice) -> Result<usize, String> {
    use cudarc::driver::{result::mem_pool, sys};
    let failed = |e: cudarc::driver::DriverError| format!("GPU memory query failed: {e}");
    let (free, _) = device.ctx.mem_get_info().map_err(failed)?;
    if !device.ctx.has_async_alloc() {
        return Ok(free);
    }
    let (mut reserved, mut used) = (0u64, 0u64);
    // SAFETY: the device ordinal comes from an open context (bound to this thread by
    // mem_get_info); RESERVED_MEM_CURRENT and USED_MEM_CURRENT write a cuuint64_t, which both
    // targets are, and the driver writes them only during the call.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(device.ctx.cu_device()).map_err(failed)?;
        mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&raw mut reserved).cast(),
        )
        .map_err(failed)?;
        mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&raw mut used).cast(),
        )
        .map_err(failed)?;
    }
    Ok(free + reserved.saturating_sub(used) as usize)
}

/// Bytes per staging buffer of [`upload`].
const STAGE_BYTES: usize = 32 << 20;

/// `values` on the device. Large slices go through the device's two page-locked staging buffers:
/// while one is copied to the device, the worker threads fill the other, so a 1 GB side moves at
/// DMA speed instead of the few GB/s of a copy from pageable memory (NOTES.md v12). Smaller ones
/// (under two stages) are copied directly.
pub fn upload<T: DeviceRepr + ValidAsZeroBits>(device: &GpuDevice, values: &[T]) -> Result<CudaSlice<T>, String> {
    use rayon::prelude::*;
    let stream = &device.stream;
    let copy = |e: cudarc::driver::DriverError| format!("copy to the GPU failed: {e}");
    // SAFETY: `T: DeviceRepr` is plain data without padding requirements on the host side beyond
    // its size, so its bytes may be read as `u8`; the view covers exactly `values`.
    let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
    if bytes.len() < 2 * STAGE_BYTES {
        return stream.clone_htod(values).map_err(copy);
    }
    let mut device_values = stream.alloc_zeros::<T>(values.len()).map_err(|e| format!("GPU allocation failed: {e}"))?;
    let mut staging = device.staging.lock().map_err(|_| "the GPU staging buffers are poisoned".to_string())?;
    if staging.is_none() {
        *staging =
            Some([pinned_buffer::<u8>(device, STAGE_BYTES, false)?, pinned_buffer::<u8>(device, STAGE_BYTES, false)?]);
    }
    let stages = staging.as_mut().expect("allocated above");
    // SAFETY: the device buffer holds exactly `bytes.len()` bytes (`values.len()` values of `T`).
    let mut target =
        unsafe { device_values.transmute_mut::<u8>(bytes.len()) }.ok_or("staging: buffer size mismatch")?;
    // When each stage's last copy to the device is done (recorded explicitly: on a single-stream
    // context cudarc records no event for pinned copies, and refilling a stage early corrupted data).
    let mut copied: [Option<CudaEvent>; 2] = [None, None];
    for (i, chunk) in bytes.chunks(STAGE_BYTES).enumerate() {
        let mut to = target.slice_mut(i * STAGE_BYTES..i * STAGE_BYTES + chunk.len());
        if chunk.len() < STAGE_BYTES {
            stream.memcpy_htod(chunk, &mut to).map_err(copy)?;
            continue;
        }
        if let Some(done) = copied[i % 2].take() {
            done.synchronize().map_err(copy)?;
        }
        let host = stages[i % 2].as_mut_slice().map_err(|e| format!("staging buffer: {e}"))?;
        host.par_chunks_mut(1 << 20).zip(chunk.par_chunks(1 << 20)).for_each(|(h, c)| h.copy_from_slice(c));
        stream.memcpy_htod(&stages[i % 2], &mut to).map_err(copy)?;
        copied[i % 2] = Some(stream.record_event(None).map_err(copy)?);
    }
    stream.synchronize().map_err(copy)?;
    Ok(device_values)
}

/// Page-locked host buffers for the pairs of one write pass (left and right positions, exact
/// distances).
#[derive(Debug)]
pub struct ResultBuffers {
    pub left: PinnedHostSlice<u32>,
    pub right: PinnedHostSlice<u32>,
    pub distance: PinnedHostSlice<f64>,
}

impl ResultBuffers {
    fn new(device: &GpuDevice, capacity: usize) -> Result<Self, String> {
        Ok(Self {
            left: pinned_buffer(device, capacity, true)?,
            right: pinned_buffer(device, capacity, true)?,
            distance: pinned_buffer(device, capacity, true)?,
        })
    }
}

/// Downloaded pairs: left positions (empty when not asked for), right positions, exact distances.
pub type DownloadedPairs<'a> = (&'a [u32], &'a [u32], &'a [f64]);

/// A run's result buffers: the device's kept ones when no other run holds them, else its own.
#[derive(Debug)]
pub struct HostResults<'a> {
    kept: Option<std::sync::MutexGuard<'a, Option<ResultBuffers>>>,
    own: Option<ResultBuffers>,
}

impl HostResults<'_> {
    /// Copies the pairs at indices `pairs` of `pass`'s output buffers from the device (left
    /// positions only `with_left`) and returns them; at most the buffers' capacity.
    pub fn download(
        &mut self,
        stream: &Arc<CudaStream>,
        pass: &PassBuffers,
        with_left: bool,
        pairs: std::ops::Range<usize>,
    ) -> Result<DownloadedPairs<'_>, String> {
        let n = pairs.len();
        let [mut all] = self.parts()?;
        all.start_download(stream, pass, with_left, pairs)?;
        stream.synchronize().map_err(|e| format!("GPU copy failed: {e}"))?;
        Ok(all.into_pairs(n, with_left))
    }

    /// The first `len` distances and positions of the buffers, for the host to fill and read
    /// (kNN's table of ranked neighbours, [`host_ranked`]).
    pub fn table(&mut self, len: usize) -> Result<(&mut [f64], &mut [u32]), String> {
        let [all] = self.parts::<1>()?;
        if len > all.capacity() {
            return Err(format!("a table of {len} neighbours does not fit result buffers of {}", all.capacity()));
        }
        let HostPairs { right, distance, .. } = all;
        Ok((&mut distance[..len], &mut right[..len]))
    }

    /// The buffers cut into `N` views of an `N`th of the capacity each.
    pub fn parts<const N: usize>(&mut self) -> Result<[HostPairs<'_>; N], String> {
        let buffers = match &mut self.kept {
            Some(kept) => kept.as_mut().expect("filled by host_results"),
            None => self.own.as_mut().expect("filled by host_results"),
        };
        let pinned = |e: cudarc::driver::DriverError| format!("pinned buffer: {e}");
        let (mut left, mut right, mut distance) = (
            buffers.left.as_mut_slice().map_err(pinned)?,
            buffers.right.as_mut_slice().map_err(pinned)?,
            buffers.distance.as_mut_slice().map_err(pinned)?,
        );
        let part = right.len() / N;
        Ok(std::array::from_fn(|_| {
            let (l, r, d) = (std::mem::take(&mut left), std::mem::take(&mut right), std::mem::take(&mut distance));
            let ((left_part, left_rest), (right_part, right_rest), (distance_part, distance_rest)) =
                (l.split_at_mut(part), r.split_at_mut(part), d.split_at_mut(part));
            (left, right, distance) = (left_rest, right_rest, distance_rest);
            HostPairs { left: left_part, right: right_part, distance: distance_part }
        }))
    }
}

/// A view of a run's page-locked result buffers: all of them ([`HostResults::download`]) or one
/// of several parts ([`HostResults::parts`]: a batch of pairs is copied into one part while the
/// host reads the previous batch from another, seed 003 §3.2.2's transfers overlapping the host's
/// use of the results).
#[derive(Debug)]
pub struct HostPairs<'a> {
    left: &'a mut [u32],
    right: &'a mut [u32],
    distance: &'a mut [f64],
}

impl<'a> HostPairs<'a> {
    /// Pairs the view holds.
    pub fn capacity(&self) -> usize {
        self.right.len()
    }

    /// Starts copying the pairs at indices `pairs` of `pass`'s output buffers (left positions
    /// only `with_left`) into this view, without waiting: the copies are ordered on `stream`,
    /// which must be synchronised before [`HostPairs::pairs`] reads them and before the buffers
    /// are dropped (the memory is page-locked, so the copy runs while the host works).
    pub fn start_download(
        &mut self,
        stream: &Arc<CudaStream>,
        pass: &PassBuffers,
        with_left: bool,
        pairs: std::ops::Range<usize>,
    ) -> Result<(), String> {
        let n = pairs.len();
        if n > self.capacity() {
            return Err(format!("{n} pairs do not fit result buffers of {}", self.capacity()));
        }
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        if n > 0 {
            if with_left {
                stream.memcpy_dtoh(&pass.out_left.slice(pairs.clone()), &mut self.left[..n]).map_err(copy)?;
            }
            stream.memcpy_dtoh(&pass.out_right.slice(pairs.clone()), &mut self.right[..n]).map_err(copy)?;
            stream.memcpy_dtoh(&pass.out_distance.slice(pairs), &mut self.distance[..n]).map_err(copy)?;
        }
        Ok(())
    }

    /// Starts copying the first `n` ranked neighbours of `ranked` into this view's positions and
    /// distances, as [`HostPairs::start_download`] copies pairs.
    pub fn start_download_ranked(
        &mut self,
        stream: &Arc<CudaStream>,
        ranked: &RankedLists,
        n: usize,
    ) -> Result<(), String> {
        if n > self.capacity() {
            return Err(format!("{n} ranked neighbours do not fit result buffers of {}", self.capacity()));
        }
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        if n > 0 {
            stream.memcpy_dtoh(&ranked.position.slice(0..n), &mut self.right[..n]).map_err(copy)?;
            stream.memcpy_dtoh(&ranked.distance.slice(0..n), &mut self.distance[..n]).map_err(copy)?;
        }
        Ok(())
    }

    /// The first `n` pairs of this view (left positions empty unless `with_left`), once the
    /// stream that copied them has been synchronised.
    pub fn pairs(&self, n: usize, with_left: bool) -> DownloadedPairs<'_> {
        (if with_left { &self.left[..n] } else { &[] }, &self.right[..n], &self.distance[..n])
    }

    /// [`HostPairs::pairs`], keeping the buffers' lifetime.
    fn into_pairs(self, n: usize, with_left: bool) -> DownloadedPairs<'a> {
        (if with_left { &self.left[..n] } else { &[] }, &self.right[..n], &self.distance[..n])
    }
}

/// Result buffers for at most `capacity` pairs. The device keeps one set between runs and grows
/// it when a run needs more: page-locking and zeroing ~0.5 GB anew took ~0.3 s of every P3–P5 run
/// (NOTES.md v14). A run that finds the set held by another (which may be blocked on a slow
/// consumer) allocates its own rather than wait.
pub fn host_results(device: &GpuDevice, capacity: usize) -> Result<HostResults<'_>, String> {
    kept_host_buffers(device, &device.results, capacity)
}

/// Most neighbours kNN ranks on the device into the page-locked buffers the device keeps
/// ([`host_ranked`]; 64 MB of them, as the write passes' 2²² pairs): P1 at k = 100 has 10⁶.
pub const KEPT_RANKED: usize = 1 << 22;

/// Page-locked buffers for at most `capacity` ≤ [`KEPT_RANKED`] neighbours ranked on the device
/// (`rank_slots`), kept by the device between runs as [`host_results`]' are. Copied into
/// pageable memory allocated for each query, P1 k = 100's 10⁶ took 2 ms in most processes and
/// 5–11 ms in some (NOTES.md v68).
pub fn host_ranked(device: &GpuDevice, capacity: usize) -> Result<HostResults<'_>, String> {
    if capacity > KEPT_RANKED {
        return Err(format!("{capacity} ranked neighbours exceed the kept buffers' {KEPT_RANKED}"));
    }
    kept_host_buffers(device, &device.ranked, capacity)
}

/// The device's `kept` buffers, grown to `capacity` where smaller, or where another run holds
/// them, buffers of this run's own.
fn kept_host_buffers<'a>(
    device: &'a GpuDevice,
    kept: &'a std::sync::Mutex<Option<ResultBuffers>>,
    capacity: usize,
) -> Result<HostResults<'a>, String> {
    match kept.try_lock() {
        Ok(mut kept) => {
            if kept.as_ref().is_none_or(|b| b.left.len() < capacity) {
                *kept = None; // free the smaller set first
                *kept = Some(ResultBuffers::new(device, capacity)?);
            }
            Ok(HostResults { kept: Some(kept), own: None })
        }
        Err(_) => Ok(HostResults { kept: None, own: Some(ResultBuffers::new(device, capacity)?) }),
    }
}

/// A page-locked host buffer of `len` values (DMA at about 25 GB/s instead of pageable memory's few
/// GB/s plus first-touch page faults), zero-filled. `host_reads`: the host reads what the device
/// writes there, so the buffer is cached; otherwise (uploads) write-combined, cudarc's default,
/// which the host writes quickly but reads uncached.
pub fn pinned_buffer<T: DeviceRepr + ValidAsZeroBits + Default + Copy>(
    device: &GpuDevice,
    len: usize,
    host_reads: bool,
) -> Result<PinnedHostSlice<T>, String> {
    let flags = if host_reads { 0 } else { cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED };
    // SAFETY: the allocation is uninitialised; it is zero-filled below before anything reads it.
    let mut buffer = unsafe { device.ctx.alloc_pinned_with_flags::<T>(len.max(1), flags) }
        .map_err(|e| format!("pinned allocation failed: {e}"))?;
    buffer.as_mut_slice().map_err(|e| format!("pinned buffer: {e}"))?.fill(T::default());
    Ok(buffer)
}

/// Threads per block of the grid-building kernels (kernels/grid.cu: `RADIX_WARPS` warps).
const GRID_BUILD_BLOCK: u32 = 256;
/// Positions per radix tile (`TILE_ITEMS` in kernels/grid.cu).
const RADIX_TILE: usize = 2048;
/// Values per block of scan_blocks (`SCAN_ITEMS` in kernels/grid.cu).
const SCAN_ITEMS: usize = 2048;

/// A grid-stride launch over `len` items.
fn strided(len: u64) -> LaunchConfig {
    let blocks = len.div_ceil(GRID_BUILD_BLOCK as u64).clamp(1, 65_536) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 }
}

fn alloc_failed(e: cudarc::driver::DriverError) -> String {
    format!("GPU allocation failed: {e}")
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

/// The positions `0..n` (identity_order in kernels/sim_join.cu): a side's slot order in input
/// order, and the permutation a stable sort starts from.
pub fn identity_order(device: &GpuDevice, n: usize) -> Result<CudaSlice<u32>, String> {
    let function = device.function(KernelModule::SimJoin, "identity_order")?;
    let stream = &device.stream;
    let mut perm = stream.alloc_zeros::<u32>(n.max(1)).map_err(alloc_failed)?;
    let len = n as u32;
    let mut builder = stream.launch_builder(&function);
    builder.arg(&mut perm).arg(&len);
    // SAFETY: identity_order(u32*, u32) writes indices < n ≤ the buffer's length (grid-stride).
    unsafe { builder.launch(strided(n as u64)) }.map_err(|e| format!("identity_order launch failed: {e}"))?;
    Ok(perm)
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
) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    if keys.len() < n || from.len() < n || to.len() < n || n >= u32::MAX as usize {
        return Err(format!(
            "radix pass over {n} positions: buffers of {}, {} and {} values",
            keys.len(),
            from.len(),
            to.len()
        ));
    }
    let stream = &device.stream;
    let tiles = n.div_ceil(RADIX_TILE);
    let mut counts = stream.alloc_zeros::<u32>(256 * tiles).map_err(alloc_failed)?;
    let (len, tiles_arg) = (n as u32, tiles as u32);
    let float_keys: u32 = matches!(keys, RadixKeys::Values(_)).into();
    let config =
        LaunchConfig { grid_dim: (tiles as u32, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 };
    let histogram = device.function(KernelModule::Grid, "radix_histogram")?;
    let mut builder = stream.launch_builder(&histogram);
    match keys {
        RadixKeys::Cells(k) => builder.arg(k),
        RadixKeys::Values(k) => builder.arg(k),
    };
    builder.arg(&float_keys).arg(from).arg(&len).arg(&shift).arg(&mut counts).arg(&tiles_arg);
    // SAFETY: radix_histogram(const u64*, u32, const u32*, u32, u32, u32*, u32): one block per
    // tile of RADIX_TILE positions below n; `from` holds n positions, each < n ≤ the keys' length
    // (8-byte values either way); `counts` holds 256 · tiles values, indexed digit · tiles + tile.
    unsafe { builder.launch(config) }.map_err(|e| format!("radix_histogram launch failed: {e}"))?;
    exclusive_scan(device, &mut counts)?;
    let scatter = device.function(KernelModule::Grid, "radix_scatter")?;
    let mut builder = stream.launch_builder(&scatter);
    match keys {
        RadixKeys::Cells(k) => builder.arg(k),
        RadixKeys::Values(k) => builder.arg(k),
    };
    builder.arg(&float_keys).arg(from).arg(to).arg(&len).arg(&shift).arg(&counts).arg(&tiles_arg);
    // SAFETY: radix_scatter(const u64*, u32, const u32*, u32*, u32, u32, const u32*, u32): reads
    // as radix_histogram; the scanned counts place every position of `from` at a distinct index
    // below n (each digit's run of each tile is as long as that tile's count), which `to` holds.
    unsafe { builder.launch(config) }.map_err(|e| format!("radix_scatter launch failed: {e}"))?;
    Ok(())
}

/// Exclusive prefix sums of `values` in place (scan_blocks per block of SCAN_ITEMS, the blocks'
/// totals scanned the same way, then added back).
pub fn exclusive_scan(device: &GpuDevice, values: &mut CudaSlice<u32>) -> Result<(), String> {
    let stream = &device.stream;
    let n = values.len();
    let blocks = n.div_ceil(SCAN_ITEMS).max(1);
    let mut totals = stream.alloc_zeros::<u32>(blocks).map_err(alloc_failed)?;
    let len = n as u32;
    let config =
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (GRID_BUILD_BLOCK, 1, 1), shared_mem_bytes: 0 };
    let scan = device.function(KernelModule::Grid, "scan_blocks")?;
    let mut builder = stream.launch_builder(&scan);
    builder.arg(&mut *values).arg(&len).arg(&mut totals);
    // SAFETY: scan_blocks(u32*, u32, u32*): block b reads and writes values[b·SCAN_ITEMS ..] below
    // n, the buffer's length, and writes totals[b], b < blocks, the totals' length.
    unsafe { builder.launch(config) }.map_err(|e| format!("scan_blocks launch failed: {e}"))?;
    if blocks > 1 {
        exclusive_scan(device, &mut totals)?;
        let add = device.function(KernelModule::Grid, "add_block_offsets")?;
        let mut builder = stream.launch_builder(&add);
        builder.arg(values).arg(&len).arg(&totals);
        // SAFETY: add_block_offsets(u32*, u32, const u32*): block b updates values below n and
        // reads totals[b], b < blocks.
        unsafe { builder.launch(config) }.map_err(|e| format!("add_block_offsets launch failed: {e}"))?;
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
) -> Result<CellBounds, String> {
    let stream = &device.stream;
    let len = n as u32;
    let mut starts = stream.alloc_zeros::<u32>(n.max(1)).map_err(alloc_failed)?;
    let mark = device.function(KernelModule::Grid, "cell_starts")?;
    let mut builder = stream.launch_builder(&mark);
    builder.arg(slot_cell).arg(&len).arg(&mut starts);
    // SAFETY: cell_starts(const u64*, u32, u32*) reads slot_cell and writes starts below n, both
    // buffers' lengths at least (grid-stride).
    unsafe { builder.launch(strided(n as u64)) }.map_err(|e| format!("cell_starts launch failed: {e}"))?;
    exclusive_scan(device, &mut starts)?;
    let mut table = stream.alloc_zeros::<u32>(table_len.unwrap_or(1).max(1)).map_err(alloc_failed)?;
    if let Some(entries) = table_len {
        let fill = device.function(KernelModule::Grid, "fill_u32")?;
        let (entries, empty) = (entries as u64, u32::MAX);
        let mut builder = stream.launch_builder(&fill);
        builder.arg(&mut table).arg(&entries).arg(&empty);
        // SAFETY: fill_u32(u32*, u64, u32) writes indices below `entries`, the table's length.
        unsafe { builder.launch(strided(entries)) }.map_err(|e| format!("fill_u32 launch failed: {e}"))?;
    }
    let mut bounds = CellBounds {
        cell_ids: stream.alloc_zeros::<u64>(n.max(1)).map_err(alloc_failed)?,
        cell_start: stream.alloc_zeros::<u32>(n + 1).map_err(alloc_failed)?,
        table,
        dense: table_len.is_some(),
        cells: 0,
    };
    let mut count = stream.alloc_zeros::<u32>(1).map_err(alloc_failed)?;
    let dense: u32 = table_len.is_some().into();
    let bound = device.function(KernelModule::Grid, "cell_bounds")?;
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
    unsafe { builder.launch(strided(n as u64)) }.map_err(|e| format!("cell_bounds launch failed: {e}"))?;
    bounds.cells = stream.clone_dtoh(&count).map_err(|e| format!("GPU copy failed: {e}"))?[0] as usize;
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
) -> Result<CudaSlice<T>, String> {
    let stream = &device.stream;
    let mut out = stream.alloc_zeros::<T>((n * width).max(1)).map_err(alloc_failed)?;
    let words = width * std::mem::size_of::<T>() / 4;
    if n == 0 || words == 0 {
        return Ok(out);
    }
    if !std::mem::size_of::<T>().is_multiple_of(4)
        || rows.len() < source * width
        || order.len() < n
        || source > u32::MAX as usize
    {
        return Err(format!(
            "gather of {n} rows of {width} values from {source} rows in {} values by {} positions",
            rows.len(),
            order.len()
        ));
    }
    let gather = device.function(KernelModule::Grid, "gather_rows")?;
    let (source_arg, len, words_arg) = (source as u32, n as u32, words as u32);
    let mut builder = stream.launch_builder(&gather);
    builder.arg(rows).arg(&source_arg).arg(order).arg(&len).arg(&words_arg).arg(&mut out);
    // SAFETY: gather_rows(const u32*, u32, const u32*, u32, u32, u32*) reads `order` below n (it
    // holds n) and of `rows` only rows below `source` (it tests each index), of `words` 4-byte
    // words each: within `rows` (source · width values of T, a multiple of 4 bytes each); it
    // writes n · words words, `out`'s size.
    unsafe { builder.launch(strided((n * words) as u64)) }.map_err(|e| format!("gather_rows launch failed: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_passes_take_longer_queues_that_leave_two_blocks_a_multiprocessor() {
        // H100 (sm_90a): rows of 128 dimensions leave room for the longest queue; of 784, only
        // for what two blocks of three stages of both tiles leave.
        assert_eq!(tc_queue_most(232_448, 233_472, tc_row_words(128), true), 2048);
        assert_eq!(tc_queue_most(232_448, 233_472, tc_row_words(784), true), 320);
        // P1 at k = 10 (rank 2 of a sample of 4,096: 8 pairs a tile, doubled) keeps runs of 64's
        // 1,024; at k = 10,000 (rank 58: ~232, doubled) runs of 4 queue what they expect.
        assert_eq!(tc_queue(64, 16.0, 2048), 1024);
        assert_eq!(tc_queue(4, 464.0, 2048), 1856);
        // Every row (kNN's last radius) at runs of one: the longest queue; none expected: 256.
        assert_eq!(tc_queue(1, 32_768.0, 2048), 2048);
        assert_eq!(tc_queue(1, 0.0, 2048), 256);
    }

    #[test]
    fn rank_lists_sort_the_largest_power_of_two_that_fits_a_block() {
        // H100, A100 and the 48 KB every device gives without opting in.
        assert_eq!(rank_lists_most_entries(232_448), 16_384);
        assert_eq!(rank_lists_most_entries(166_912), 8_192);
        assert_eq!(rank_lists_most_entries(48 << 10), 2_048);
        assert_eq!(rank_lists_most_entries(1_000), 0);
        // 16,384 entries and the static memory need 197,696 bytes: one byte less leaves 8,192.
        assert_eq!(rank_lists_most_entries(16_384 * 12 + RANK_LISTS_STATIC_BYTES), 16_384);
        assert_eq!(rank_lists_most_entries(16_384 * 12 + RANK_LISTS_STATIC_BYTES - 1), 8_192);
    }

    /// The queue of runs of up to 16 tiles.
    const QUEUE: usize = 256;
    const QUEUE_BYTES: usize = QUEUE * TC_QUEUE_ENTRY_BYTES;

    #[test]
    fn three_stages_only_where_two_blocks_still_fit() {
        // 227 KB a block, 228 KB a multiprocessor (an H100 as if it had no wgmma).
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, tc_row_words(784), QUEUE, false),
            QUEUE_BYTES + 3 * TC_STAGE_BYTES
        );
        // sm_80 (A100): three stages would fit one block (163 KB) but not two in 164 KB.
        assert_eq!(
            tc_dynamic_bytes(166_912, 167_936, tc_row_words(784), QUEUE, false),
            QUEUE_BYTES + 2 * TC_STAGE_BYTES
        );
        // sm_86, sm_89: 99 KB a block.
        assert_eq!(
            tc_dynamic_bytes(101_376, 102_400, tc_row_words(784), QUEUE, false),
            QUEUE_BYTES + 2 * TC_STAGE_BYTES
        );
    }

    #[test]
    fn warpgroup_mma_takes_a_stage_more_where_two_blocks_fit() {
        // sm_90a (H100): 784 dimensions, three stages of both tiles; 128, four of the right tile's.
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, tc_row_words(784), QUEUE, true),
            QUEUE_BYTES + 3 * TC_STAGE_BYTES
        );
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, tc_row_words(128), QUEUE, true),
            QUEUE_BYTES + TC_RESIDENT_BYTES + 4 * TC_STAGE_BYTES / 2
        );
        // Runs of 64 (P1): the queue of 1,024 pairs leaves room for three.
        assert_eq!(tc_queue(64, 0.0, 2048), 1024);
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, tc_row_words(128), 1024, true),
            1024 * TC_QUEUE_ENTRY_BYTES + TC_RESIDENT_BYTES + 3 * TC_STAGE_BYTES / 2
        );
    }

    #[test]
    fn byte_rows_take_half_the_chunks_and_no_queue() {
        // 784 byte coordinates: 196 words, seven chunks (f16: 392, thirteen), three stages of both
        // tiles; 256: two chunks, the left tile resident and four stages of the right one's.
        assert_eq!((byte_row_words(784), tc_row_words(784)), (196, 392));
        assert_eq!(tc_dynamic_bytes(232_448, 233_472, byte_row_words(784), 0, true), 3 * TC_STAGE_BYTES);
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, byte_row_words(256), 0, true),
            TC_RESIDENT_BYTES + 4 * TC_STAGE_BYTES / 2
        );
        assert_eq!(byte_row_words(1), 4);
    }

    #[test]
    fn rows_of_two_chunks_keep_the_left_tile_resident() {
        let resident = |stages: usize| QUEUE_BYTES + TC_RESIDENT_BYTES + stages * TC_STAGE_BYTES / 2;
        // 128 dimensions: 64 words, two chunks; 129: 68 words, three.
        assert_eq!(tc_dynamic_bytes(232_448, 233_472, tc_row_words(128), QUEUE, false), resident(3));
        assert_eq!(tc_dynamic_bytes(232_448, 233_472, tc_row_words(1), QUEUE, false), resident(3));
        assert_eq!(
            tc_dynamic_bytes(232_448, 233_472, tc_row_words(129), QUEUE, false),
            QUEUE_BYTES + 3 * TC_STAGE_BYTES
        );
        assert_eq!(tc_dynamic_bytes(166_912, 167_936, tc_row_words(128), QUEUE, false), resident(2));
        assert_eq!(tc_dynamic_bytes(101_376, 102_400, tc_row_words(128), QUEUE, false), resident(2));
    }
}
