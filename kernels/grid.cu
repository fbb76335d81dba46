// The ε-grid built on the device (Gowanlock & Karsin, GPU-Join, §3.2.1): the host computes each point's linear cell id
// and, where the window prunes, its sort-dimension value (the f64 arithmetic of
// `GridGeometry::cell_id`, so both backends place every point in the same cell); here the points
// are ordered by (cell, sort value, position) with a stable LSD radix sort of the position
// permutation, the non-empty cells are found, and the rows are gathered into that slot order.
// Windowed, the result is the host's `GridIndex::build` slot for slot: a stable sort of positions
// in input order breaks every tie by position, as the host does (unwindowed, a cell's points stay
// in position order, which no pass reads).
#include "common.cuh"

#define RADIX 256
#define RADIX_WARPS 8
// Contiguous positions of the permutation one warp ranks, 32 at a time, in order.
#define WARP_ITEMS 256
// Positions per block of radix_histogram and radix_scatter (one tile of the counts).
#define TILE_ITEMS (RADIX_WARPS * WARP_ITEMS)
// Values one block of scan_blocks scans: 256 threads × 8.
#define SCAN_THREADS 256
#define SCAN_ITEMS (SCAN_THREADS * 8)

// The radix digit at `shift` of point p's key; `float_keys`: the key is an f64, mapped to a u64
// of the same total order (`f64::total_cmp`: negatives flipped whole, positives their sign bit).
__device__ __forceinline__ u32 radix_digit(const u64* keys, u32 p, u32 shift, u32 float_keys) {
    u64 key = keys[p];
    if (float_keys) {
        key = (key >> 63) ? ~key : key | (1ull << 63);
    }
    return (u32)(key >> shift) & (RADIX - 1);
}

// Digit counts of each tile of TILE_ITEMS positions of `perm`, digit-major
// (`counts[digit · tiles + tile]`): their exclusive scan is where each tile's run of each digit
// starts in the output.
extern "C" __global__ void radix_histogram(const u64* keys, u32 float_keys, const u32* perm, u32 n, u32 shift, u32* counts, u32 tiles) {
    __shared__ u32 histogram[RADIX];
    for (u32 d = threadIdx.x; d < RADIX; d += blockDim.x) histogram[d] = 0;
    __syncthreads();
    u64 begin = (u64)blockIdx.x * TILE_ITEMS;
    u64 end = min((u64)n, begin + TILE_ITEMS);
    for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        atomicAdd(&histogram[radix_digit(keys, perm[i], shift, float_keys)], 1u);
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < RADIX; d += blockDim.x) counts[(u64)d * tiles + blockIdx.x] = histogram[d];
}

// One stable pass: each position of `perm_in` goes to `perm_out` at its tile's offset for its
// digit (`offsets`, the scanned counts) plus the positions of that digit before it in the tile.
// Stability: a tile's warps own consecutive runs of WARP_ITEMS (the earlier warps' counts come
// first), and each warp ranks its run 32 positions at a time in order, lanes of one digit by lane.
extern "C" __global__ void __launch_bounds__(RADIX_WARPS * 32) radix_scatter(
    const u64* keys, u32 float_keys, const u32* perm_in, u32* perm_out, u32 n, u32 shift, const u32* offsets, u32 tiles) {
    __shared__ u32 cursor[RADIX_WARPS][RADIX];
    u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (u32 i = threadIdx.x; i < RADIX_WARPS * RADIX; i += blockDim.x) cursor[i / RADIX][i % RADIX] = 0;
    __syncthreads();
    u64 begin = (u64)blockIdx.x * TILE_ITEMS + (u64)warp * WARP_ITEMS;
    u64 end = min((u64)n, begin + WARP_ITEMS);
    for (u64 i = begin + lane; i < end; i += 32) {
        atomicAdd(&cursor[warp][radix_digit(keys, perm_in[i], shift, float_keys)], 1u);
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < RADIX; d += blockDim.x) {
        u32 at = offsets[(u64)d * tiles + blockIdx.x];
        for (u32 w = 0; w < RADIX_WARPS; ++w) {
            u32 count = cursor[w][d];
            cursor[w][d] = at;
            at += count;
        }
    }
    __syncthreads();
    for (u64 round = begin; round < end; round += 32) {
        u64 i = round + lane;
        bool live = i < end;
        u32 p = live ? perm_in[i] : 0;
        u32 digit = live ? radix_digit(keys, p, shift, float_keys) : RADIX;  // RADIX: no digit
        u32 peers = __match_any_sync(0xffffffffu, digit);
        u32 rank = __popc(peers & ((1u << lane) - 1));
        if (live) perm_out[cursor[warp][digit] + rank] = p;
        __syncwarp();
        if (live && rank == 0) cursor[warp][digit] += __popc(peers);
        __syncwarp();
    }
}

// Exclusive prefix sums of each block's SCAN_ITEMS values, in place, and each block's total into
// `block_totals` (whose own exclusive scan, added back by add_block_offsets, completes the scan).
extern "C" __global__ void __launch_bounds__(SCAN_THREADS) scan_blocks(u32* values, u32 n, u32* block_totals) {
    __shared__ u32 partial[SCAN_THREADS];
    u64 base = (u64)blockIdx.x * SCAN_ITEMS + threadIdx.x * 8ull;
    u32 v[8];
    u32 total = 0;
    for (int j = 0; j < 8; ++j) {
        v[j] = base + j < n ? values[base + j] : 0;
        total += v[j];
    }
    partial[threadIdx.x] = total;
    __syncthreads();
    for (u32 offset = 1; offset < SCAN_THREADS; offset <<= 1) {
        u32 before = threadIdx.x >= offset ? partial[threadIdx.x - offset] : 0;
        __syncthreads();
        partial[threadIdx.x] += before;
        __syncthreads();
    }
    u32 running = partial[threadIdx.x] - total;
    for (int j = 0; j < 8; ++j) {
        if (base + j < n) values[base + j] = running;
        running += v[j];
    }
    if (threadIdx.x == SCAN_THREADS - 1) block_totals[blockIdx.x] = partial[SCAN_THREADS - 1];
}

// Adds each block's scanned total back to its SCAN_ITEMS values.
extern "C" __global__ void add_block_offsets(u32* values, u32 n, const u32* block_offsets) {
    u64 base = (u64)blockIdx.x * SCAN_ITEMS;
    u32 add = block_offsets[blockIdx.x];
    for (u64 i = base + threadIdx.x; i < min((u64)n, base + SCAN_ITEMS); i += blockDim.x) values[i] += add;
}

// 1 where slot s starts a cell (the first slot, or a cell id other than the slot before's).
extern "C" __global__ void cell_starts(const u64* slot_cell, u32 n, u32* starts) {
    for (u64 s = blockIdx.x * (u64)blockDim.x + threadIdx.x; s < n; s += (u64)gridDim.x * blockDim.x) {
        starts[s] = s == 0 || slot_cell[s] != slot_cell[s - 1];
    }
}

// From the exclusive scan of cell_starts (`cell_of_start`, each start slot's cell index): the
// non-empty cells' ids and first slots, the end slot after the last, their count, and, where
// `dense`, the linear id → cell table (filled with u32 max before).
extern "C" __global__ void cell_bounds(
    const u64* slot_cell, const u32* cell_of_start, u32 n, u64* cell_ids, u32* cell_start, u32* cell_count, u32* table, u32 dense) {
    for (u64 s = blockIdx.x * (u64)blockDim.x + threadIdx.x; s < n; s += (u64)gridDim.x * blockDim.x) {
        bool first = s == 0 || slot_cell[s] != slot_cell[s - 1];
        u32 c = cell_of_start[s];
        if (first) {
            cell_ids[c] = slot_cell[s];
            cell_start[c] = (u32)s;
            if (dense) table[slot_cell[s]] = c;
        }
        if (s == n - 1) {
            cell_start[c + first] = n;
            *cell_count = c + first;
        }
    }
}

// `len` copies of `value`.
extern "C" __global__ void fill_u32(u32* values, u64 len, u32 value) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) {
        values[i] = value;
    }
}

// Rows of `words` 4-byte words picked by `order`: row s of `out` is row order[s] of `rows`, which
// holds `source` rows (a grid's slot order: a permutation; a kNN pass's subset of queries). An
// index outside them yields a zero row rather than a read outside `rows`.
extern "C" __global__ void gather_rows(const u32* rows, u32 source, const u32* order, u32 n, u32 words, u32* out) {
    u64 total = (u64)n * words;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 s = i / words, w = i % words;
        u32 row = order[s];
        out[i] = row < source ? rows[(u64)row * words + w] : 0u;
    }
}
