//! The launch geometry of the tensor-core join (runs of right tiles, queue lengths, pipeline stages
//! and shared memory) and its TMA tensor maps.

use cudarc::driver::DevicePtr;
use cudarc::driver::{CudaSlice, DeviceRepr, sys};

use crate::cuda::device::GpuDevice;
use crate::cuda::{Error, Result};

/// Threads per block of the join kernels.
pub(super) const BLOCK: u32 = 256;
/// Rows per side of one brute_join block's tile (`TILE` in kernels/brute_join.cuh).
pub(super) const BRUTE_TILE: usize = 128;
/// Right tiles per brute_join_tc block (`p.tc_run` in kernels/tc_join_run.cuh). Each block pays once
/// for its left tile's copies and bounds, its pipeline's filling and its queue's draining, so
/// longer runs pay off where the grid is large: 64 where it still has at least 16 waves of two
/// blocks an SM (P1, 79 left tiles × 123 runs of 64: kernel time 8.6–8.7 → 8.1–8.3 ms against
/// 16, docs/design.md#gpu-brute; 16 against 8 was 11.2 → 9.3 ms, docs/design.md#gpu-brute). But fewer, longer blocks leave the
/// last wave emptier: 60,000 × 784 (79 × 30 blocks of 16, 8.7 waves) took 5.3–5.4 → 5.9–6.0 ms
/// (docs/design.md#gpu-brute), so 8 there. A small grid (kNN's later passes over a few hundred queries) takes the
/// longest run of at most 8 that still fills 4 waves, else runs of one tile: 60,000 × 784's
/// second pass (2 left tiles) took 0.72 ms as 118 blocks of 8 on 132 SMs, 0.41 ms as 938 blocks
/// of one (docs/design.md#gpu-brute).
///
/// A pass expected to find many pairs (kNN at large k: `per_tile`, twice the pairs it expects a
/// tile) takes runs short enough that its queue holds them ([`tc_queue`], at most `queue_most`):
/// a pair beyond the queue is decided by its thread at once, and at P1 k = 10,000 (~230 pairs a
/// tile) runs of 64 decided most of them that way: 0.33 s against 0.15 with runs of 4 and a queue
/// of 2,048 (docs/design.md#gpu-brute).
pub(super) fn tc_run(
    device: &GpuDevice,
    left_tiles: usize,
    right_len: usize,
    per_tile: f64,
    queue_most: usize,
) -> usize {
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
/// holds up the block (docs/design.md#gpu-brute): P1 at k = 10 queues ~7 pairs a tile and block on average
/// (4.5 M in 617,000 tiles), and its runs of 32 with a queue of 256 ran 8.9–9.1 ms against 8.2–8.3
/// with 512 (docs/design.md#gpu-brute). Shared memory spent on a longer queue is not spent on stages: 60,000 × 784
/// (runs of 8) took 4.0 → 4.7 ms with a queue of 512, whose 2 KB more left two stages instead of
/// three.
pub(super) fn tc_queue(run: usize, per_tile: f64, queue_most: usize) -> usize {
    let expected = (run as f64 * per_tile).ceil() as usize;
    (16 * run).max(256).max(expected.min(queue_most))
}

/// The longest queue (a multiple of 64, 256 to 2,048 pairs: 16 KB) with which two brute_join_tc
/// blocks with rows of `row_words` words and their fewest stages still fit a multiprocessor
/// ([`tc_dynamic_bytes`]): 2,048 at 128 dimensions on an H100, 320 at 784.
pub(super) fn tc_queue_most(
    per_block: usize,
    per_multiprocessor: usize,
    row_words: usize,
    warpgroup_mma: bool,
) -> usize {
    let fits = |queue: usize| {
        let bytes = tc_dynamic_bytes(per_block, per_multiprocessor, row_words, queue, warpgroup_mma);
        bytes <= per_block && 2 * (bytes + TC_STATIC_BYTES) <= per_multiprocessor
    };
    (256..=2048).rev().step_by(64).find(|&queue| fits(queue)).unwrap_or(256)
}
/// Bytes of one brute_join_tc pipeline stage (`TC_STAGE_WORDS` in kernels/tc_join.cuh): both
/// sides' 128 rows × 36 words.
pub(super) const TC_STAGE_BYTES: usize = 2 * BRUTE_TILE * 36 * 4;
/// Bytes of a brute_join_tc queue entry (two u32: left slot, right row).
pub(super) const TC_QUEUE_ENTRY_BYTES: usize = 8;
/// Rows of at most this many chunks of 32 words keep brute_join_tc's left tile resident in shared
/// memory (`TC_RESIDENT_CHUNKS` in kernels/tc_join.cuh), in `TC_RESIDENT_BYTES` ahead of stages
/// that hold the right tile's chunks only.
pub(super) const TC_RESIDENT_CHUNKS: usize = 2;
pub(super) const TC_RESIDENT_BYTES: usize = TC_RESIDENT_CHUNKS * BRUTE_TILE * 36 * 4;

/// brute_join_tc's static shared memory (`queue_len`, `row_bounds`, `col_offsets`, under wgmma
/// the TMA barriers; ptxas reports 2,064 or 2,096 bytes) and what the driver reserves per block
/// besides (1 KB on sm_80 and later).
pub(super) const TC_STATIC_BYTES: usize = 2096 + 1024;

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
pub(super) fn tc_shared_bytes(device: &GpuDevice, row_words: usize, queue: usize) -> u32 {
    tc_dynamic_bytes(
        device.shared_memory_per_block,
        device.shared_memory_per_multiprocessor,
        row_words,
        queue,
        warpgroup_mma(device),
    ) as u32
}

/// Whether brute_join_tc multiplies by wgmma on `device` (compiled for sm_90a).
pub(super) fn warpgroup_mma(device: &GpuDevice) -> bool {
    device.arch == "sm_90a"
}

pub(super) fn tc_dynamic_bytes(
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
pub(super) struct TensorMap([u64; 16]);

// SAFETY: plain bytes with the kernel parameter's size and alignment (`struct __align__(64)
// TensorMap` in kernels/wgmma_tma.cuh).
unsafe impl DeviceRepr for TensorMap {}

/// The TMA map brute_join_tc copies a side's f16 rows by under wgmma (sm_90a), and
/// brute_join_tc_bytes its byte rows: `rows.len() / row_words` rows of `row_words` 32-bit words, a
/// box of 32 words (one chunk, 128 bytes) × 128 rows (a tile) written to shared memory in the
/// 128-byte swizzle that its wgmma descriptors name, zeros beyond the rows' end. Elsewhere the kernel copies by cp.async and gets zeros.
pub(super) fn tc_row_map(device: &GpuDevice, rows: &CudaSlice<u32>, row_words: usize) -> Result<TensorMap> {
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
    result.result().map_err(|e| {
        Error::Device(format!("brute_join_tc: TMA map of {} rows × {row_words} words refused: {e}", dims[1]))
    })?;
    Ok(TensorMap(map.opaque))
}

#[cfg(test)]
mod tests {
    use super::{TC_QUEUE_ENTRY_BYTES, TC_RESIDENT_BYTES, TC_STAGE_BYTES, tc_dynamic_bytes, tc_queue, tc_queue_most};
    use crate::cuda::launch::pack::{byte_row_words, tc_row_words};

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
