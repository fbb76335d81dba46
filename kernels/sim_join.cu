// ε-join and range-query kernels (GPU-Join, seed 003 §3.2.1, with Böhm's count-then-write).
//
// Thread mapping (grid_join): one thread per left row ("slot"), `slot_begin + blockIdx.x *
// blockDim.x + threadIdx.x`, over a batch [slot_begin, slot_end); brute_join: see its own comment.
// Each kernel runs as (`pass`)
//   PASS_COUNT, the count pass: counts[slot - slot_begin] = number of result pairs of that slot,
//              and every pair found is also collected (collect_pair): appended at the next free
//              index of out_left / out_right / out_distance, `*collected` counting them all, stored
//              while the index is below `capacity` (0: nothing stored). When the total fits, the
//              pass has produced the whole result and no second pass runs;
//   PASS_WRITE, the write pass (only when the total did not fit): the pairs are written from
//              offsets[slot - slot_begin] (an exclusive prefix sum of the counts, relative to a
//              batch sized to fit) into the same buffers,
// so no output buffer can overflow and no pair is lost or written twice. brute_join_tc also runs
//   PASS_SCORES, kNN's first count pass on f16 rows: each slot keeps the filter scores of the
//              pairs that pass the filter, not their exact distances, and knn_settle_slots then
//              checks exactly only those that can be among the k nearest (see there).
//
// Inputs, all in slot order (grid order for the grid kernel, input order for brute force):
//   left_filter / right_filter  f32 filter-space rows (row-major, dim wide)
//   left_exact / right_exact    f64 rows, exactly the stored values (row-major, dim wide)
//   left_norm / right_norm      cosine: Σx² per row (f64); dot-product filters: ‖x̃‖ per row (f32)
//   lfsq / rfsq                 FILTER_GEMM_L2 (brute_join): ‖x̃‖² per row (f32); the grid kernel
//                               always gets a direct filter (FILTER_SQUARED_L2, L1, L∞)
//   left_order / right_order    slot → vector position (what the output reports)
// Each candidate that passes the f32 filter is decided by the exact f64 distance of common.cuh.
// Self-joins visit each unordered pair once: later slots of the same cell, and cells with a larger
// linear id (grid), or right slots after the left slot (brute force).
#include "common.cuh"

#define PASS_COUNT 0
#define PASS_WRITE 1
#define PASS_SCORES 2

// The count pass's collection of one found pair (see the top of this file). The lanes of a warp
// that found a pair together reserve their indices with one atomic on the shared total, not one
// each: all of a join's pairs go through this one counter (P3: 5·10⁷). Indices at or beyond
// `capacity` are counted but not stored; the host then runs write passes instead.
__device__ __forceinline__ void collect_pair(u64* collected, u64 capacity, u32 left, u32 right, double dist,
                                             u32* out_left, u32* out_right, double* out_distance) {
    u32 lanes = __activemask();
    u32 lane = threadIdx.x % 32;
    u32 leader = __ffs(lanes) - 1;
    u64 first = 0;
    if (lane == leader) first = atomicAdd(collected, (u64)__popc(lanes));
    u64 at = __shfl_sync(lanes, first, leader) + __popc(lanes & ((1u << lane) - 1));
    if (at < capacity) {
        out_left[at] = left;
        out_right[at] = right;
        out_distance[at] = dist;
    }
}

// Index of the non-empty right cell with linear id `id`, or -1.
__device__ __forceinline__ long long find_cell(const JoinParams& p, const u64* cell_ids, const u32* cell_table, u64 id) {
    if (p.dense) {
        u32 c = cell_table[id];
        return c == 0xffffffffu ? -1 : (long long)c;
    }
    u32 lo = 0, hi = p.right_cells;
    while (lo < hi) {
        u32 mid = (lo + hi) >> 1;
        if (cell_ids[mid] < id) lo = mid + 1; else hi = mid;
    }
    return (lo < p.right_cells && cell_ids[lo] == id) ? (long long)lo : -1;
}

// Tests left slot `s` against right slots [begin, end); counts or writes the qualifying pairs.
// DIM > 0: the dimension, with `x` the left row in registers (loaded once per left slot) and each
// right row read in vector loads; the general path (DIM = 0) reads both rows per candidate, twice
// the load instructions per dimension (P4's grid kernel was bound by them: NOTES.md v17).
template <u32 DIM>
__device__ __forceinline__ void scan_range(const JoinParams& p, u32 s, u32 begin, u32 end, const float (&x)[DIM ? DIM : 1],
        const float* lf, const float* rf, const double* lx, const double* rx,
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm,
        const u32* left_order, const u32* right_order,
        u32& found, int pass, u64 offset, u32* out_left, u32* out_right, double* out_distance,
        u64* collected, u64 capacity) {
    for (u32 t = begin; t < end; ++t) {
        float score;
        if constexpr (DIM > 0) {
            float y[DIM];
            load_row<DIM>(rf, t, y);
            score = fixed_filter_score<DIM>(p.filter, x, y);
        } else {
            score = filter_score(p, lf + (u64)s * p.dim, rf + (u64)t * p.dim, p.limit);
        }
        float nx = p.filter == FILTER_NEG_DOT ? lfnorm[s] : 0.0f;
        float ny = p.filter == FILTER_NEG_DOT ? rfnorm[t] : 0.0f;
        if (!filter_passes(p, score, nx, ny, p.limit)) continue;
        double d = exact_distance(p, lx + (u64)s * p.dim, rx + (u64)t * p.dim, cosine_norm(p, lnorm, s), cosine_norm(p, rnorm, t));
        if (d <= p.threshold) {
            if (pass == PASS_WRITE) {
                u64 at = offset + found;
                out_left[at] = left_order[s];
                out_right[at] = right_order[t];
                out_distance[at] = d;
            } else if (capacity) {
                collect_pair(collected, capacity, left_order[s], right_order[t], d, out_left, out_right, out_distance);
            }
            ++found;
        }
    }
}

#define GRID_JOIN_PARAMS                                                                                          \
    JoinParams p, u32 slot_begin, u32 slot_end, const float* lf, const float* rf, const double* lx, const double* rx, \
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm, const u32* left_order,   \
        const u32* right_order, const u64* left_slot_cell, const u64* right_cell_ids, const u32* right_cell_start,  \
        const u32* cell_table, const double* left_keys, const double* right_keys, u32* counts, const u64* offsets, u32* out_left, u32* out_right, double* out_distance, \
        u64* collected, u64 capacity, int pass

// grid_join for dimension DIM (0: any).
template <u32 DIM>
__device__ __forceinline__ void grid_join_rows(GRID_JOIN_PARAMS) {
    u32 s = slot_begin + blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= slot_end) return;
    float x[DIM ? DIM : 1];
    if constexpr (DIM > 0) load_row<DIM>(lf, s, x);
    u64 id = left_slot_cell[s];
    u64 lo[MAX_GRID_DIMS], hi[MAX_GRID_DIMS], cur[MAX_GRID_DIMS];
    for (u32 j = 0; j < p.k; ++j) {
        u64 c = (id / p.strides[j]) % p.cells[j];
        lo[j] = c > 0 ? c - 1 : 0;
        hi[j] = c + 1 < p.cells[j] ? c + 1 : c;
        cur[j] = lo[j];
    }
    u64 offset = pass == PASS_WRITE ? offsets[s - slot_begin] : 0;
    u32 found = 0;
    for (;;) {
        u64 nid = 0;
        for (u32 j = 0; j < p.k; ++j) nid += cur[j] * p.strides[j];
        if (!p.self_join || nid >= id) {
            long long c = find_cell(p, right_cell_ids, cell_table, nid);
            if (c >= 0) {
                u32 begin = right_cell_start[c], end = right_cell_start[c + 1];
                if (p.windowed) {
                    // sortidu: a cell's slots are sorted by the sort dimension's key, and partners
                    // differ by at most the window there; the host's partition points (grid_join
                    // in src/backend/cpu.rs, whose proof covers the rounding), by the same f64
                    // subtractions: the first slot with key − u ≥ −window, then the first beyond
                    // it with key − u > window.
                    double u = left_keys[s];
                    u32 a = begin, b = end;
                    while (a < b) {
                        u32 m = a + (b - a) / 2;
                        if (right_keys[m] - u < -p.window) a = m + 1; else b = m;
                    }
                    begin = a;
                    b = end;
                    while (a < b) {
                        u32 m = a + (b - a) / 2;
                        if (right_keys[m] - u <= p.window) a = m + 1; else b = m;
                    }
                    end = a;
                }
                if (p.self_join && nid == id) begin = max(begin, s + 1);  // later slots of its own cell
                scan_range<DIM>(p, s, begin, end, x, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order,
                                right_order, found, pass, offset, out_left, out_right, out_distance, collected, capacity);
            }
        }
        u32 j = 0;
        while (j < p.k && cur[j] == hi[j]) { cur[j] = lo[j]; ++j; }
        if (j == p.k) break;
        ++cur[j];
    }
    if (pass != PASS_WRITE) counts[s - slot_begin] = found;
}

// At most 64 registers (4 blocks of 256 per SM): the sortidu window took it to 68 and 3 blocks, and
// P4's kernel from 231 to 250 ms; capped, it needs no spills (scripts/kernel-check.py).
extern "C" __global__ void __launch_bounds__(256, 4) grid_join(GRID_JOIN_PARAMS) {
#define GRID_JOIN_ARGS                                                                                              \
    p, slot_begin, slot_end, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order, right_order, left_slot_cell, \
        right_cell_ids, right_cell_start, cell_table, left_keys, right_keys, counts, offsets, out_left, out_right, out_distance, collected, \
        capacity, pass
    switch (p.dim) {
    case 2: grid_join_rows<2>(GRID_JOIN_ARGS); break;
    case 3: grid_join_rows<3>(GRID_JOIN_ARGS); break;
    case 4: grid_join_rows<4>(GRID_JOIN_ARGS); break;
    case 8: grid_join_rows<8>(GRID_JOIN_ARGS); break;
    case 16: grid_join_rows<16>(GRID_JOIN_ARGS); break;
    default: grid_join_rows<0>(GRID_JOIN_ARGS); break;
    }
#undef GRID_JOIN_ARGS
}

// kNN's infinite radius (`per_row` with a +∞ threshold, the last level): left slot s takes every
// right row, NaN distances included, so a query always gets min(k, n) candidates.
__device__ __forceinline__ bool takes_every_row(const JoinParams& p, const double* row_threshold, u32 s) {
    return p.per_row && row_threshold[s] == F64_INFINITY;
}

// brute_join's epilogue (brute_join_tc has its own separated test, tc_row_bound). Each thread
// decides an 8 × 8 set of (left, right) slots; what the filter needs of each slot (limit, norms)
// is loaded once per thread, not once per pair.
struct LeftSlot {
    float limit;     // the f32 filter limit (per row for kNN)
    float norm;      // dot-product filters: ‖x̃‖
    float sq_norm;   // FILTER_GEMM_L2: ‖x̃‖²
    bool valid;      // a slot of this pass
    bool take_all;   // takes_every_row
};
struct RightSlot {
    float norm;
    float sq_norm;
    bool valid;
};

__device__ __forceinline__ LeftSlot left_slot(const JoinParams& p, u32 s, u32 slot_end, const float* lfnorm,
                                              const float* lfsq, const double* row_threshold, const float* row_limit) {
    LeftSlot l = {0.0f, 0.0f, 0.0f, s < slot_end, false};
    if (!l.valid) return l;
    l.limit = p.per_row ? row_limit[s] : p.limit;
    l.take_all = takes_every_row(p, row_threshold, s);
    if (p.filter == FILTER_NEG_DOT || p.filter == FILTER_GEMM_L2) l.norm = lfnorm[s];
    if (p.filter == FILTER_GEMM_L2) l.sq_norm = lfsq[s];
    return l;
}

__device__ __forceinline__ RightSlot right_slot(const JoinParams& p, u32 t, u32 right_len, const float* rfnorm, const float* rfsq) {
    RightSlot r = {0.0f, 0.0f, t < right_len};
    if (!r.valid) return r;
    if (p.filter == FILTER_NEG_DOT || p.filter == FILTER_GEMM_L2) r.norm = rfnorm[t];
    if (p.filter == FILTER_GEMM_L2) r.sq_norm = rfsq[t];
    return r;
}

// Whether a pair passes the f32 filter, given `value`: −x̃·ỹ for the dot-product filters (the GEMM
// score adds the squared norms; its rounding is counted in the margin), else the direct score.
__device__ __forceinline__ bool brute_filter(const JoinParams& p, const LeftSlot& l, const RightSlot& r, float value) {
    if (l.take_all) return true;
    float score = p.filter == FILTER_GEMM_L2 ? l.sq_norm + r.sq_norm + 2.0f * value : value;
    return filter_passes(p, score, l.norm, r.norm, l.limit);
}

// A pair that passed the filter, with its exact f64 distance: that decides (unless the slot takes
// every row), then a count or a written pair.
__device__ __forceinline__ void record_pair(const JoinParams& p, u32 s, u32 t, double dist, u32 slot_begin,
        const u32* left_order, const u32* right_order, const double* row_threshold,
        u32* counts, u64* cursors, u32* out_left, u32* out_right, double* out_distance, u64* collected,
        u64 capacity, int pass) {
    double threshold = p.per_row ? row_threshold[s] : p.threshold;
    if (!(dist <= threshold) && !takes_every_row(p, row_threshold, s)) return;
    if (pass == PASS_WRITE) {
        u64 at = atomicAdd(&cursors[s - slot_begin], 1ull);
        out_left[at] = left_order[s];
        out_right[at] = right_order[t];
        out_distance[at] = dist;
    } else {
        u32 found = atomicAdd(&counts[s - slot_begin], 1u);
        if (p.slot_capacity) {
            if (found < p.slot_capacity) {
                u64 at = (u64)(s - slot_begin) * p.slot_capacity + found;
                out_right[at] = right_order[t];
                out_distance[at] = dist;
            }
        } else if (capacity) {
            collect_pair(collected, capacity, left_order[s], right_order[t], dist, out_left, out_right, out_distance);
        }
    }
}

// record_pair of a pair's exact distance, computed here.
__device__ __forceinline__ void exact_pair(const JoinParams& p, u32 s, u32 t, u32 slot_begin,
        const double* lx, const double* rx, const double* lnorm, const double* rnorm,
        const u32* left_order, const u32* right_order, const double* row_threshold,
        u32* counts, u64* cursors, u32* out_left, u32* out_right, double* out_distance, u64* collected,
        u64 capacity, int pass) {
    double dist = exact_distance(p, lx + (u64)s * p.dim, rx + (u64)t * p.dim, cosine_norm(p, lnorm, s), cosine_norm(p, rnorm, t));
    record_pair(p, s, t, dist, slot_begin, left_order, right_order, row_threshold, counts, cursors, out_left, out_right,
                out_distance, collected, capacity, pass);
}

// Brute force, tiled like a matrix product: each block scores 128 left rows against 128 right rows
// (brute_tile; a launch covers the right rows from `right_begin`); its 256 threads form a 16 × 16
// grid and each scores an 8 × 8 micro-tile, reading both sides from shared memory 8 dimensions at a time, so each row is read from
// device memory once per 128 × 128 tile instead of once per pair. Pairs are counted and written
// with atomics on the left row's counter (count pass) or cursor (write pass: `cursors` starts as the
// exclusive prefix of the counts), so a row's pairs land in its own range in an unspecified order.
// Self-joins skip tiles entirely below the diagonal and, on it, right rows ≤ the left row.
// With `p.per_row` (kNN as a range query, see knn.cu) left slot s has its own exact threshold
// `row_threshold[s]` and f32 filter limit `row_limit[s]`; an infinite threshold takes every right
// row, NaN distances included, so a query always gets min(k, n) candidates.
#define TILE 128
#define MICRO 8
#define CHUNK 8

// One shared-memory chunk (8 dimensions) into a thread's 8 × 8 accumulators. The filter kind is a
// template parameter and every loop is unrolled, so `acc` stays in registers (a run-time switch
// inside the loops put it in local memory: 1M×32 took 75 s instead of seconds).
template <u32 FILTER>
__device__ __forceinline__ void accumulate_chunk(const float (*xs)[TILE + 4], const float (*ys)[TILE + 4],
                                                 u32 tx, u32 ty, float (&acc)[MICRO][MICRO]) {
#pragma unroll
    for (u32 d = 0; d < CHUNK; ++d) {
        float x[MICRO], y[MICRO];
#pragma unroll
        for (int i = 0; i < MICRO; ++i) x[i] = xs[d][ty * MICRO + i];
#pragma unroll
        for (int j = 0; j < MICRO; ++j) y[j] = ys[d][tx * MICRO + j];
#pragma unroll
        for (int i = 0; i < MICRO; ++i) {
#pragma unroll
            for (int j = 0; j < MICRO; ++j) {
                float t = y[j] - x[i];
                // Fused multiply-adds (explicit: the module is compiled with --fmad=false for the
                // exact f64 code) round once where the proved margins allow for two roundings, so
                // the f32 filter's error stays within them (FilterLimit, GemmSide in cpu.rs).
                if (FILTER == FILTER_SQUARED_L2) acc[i][j] = __fmaf_rn(t, t, acc[i][j]);
                else if (FILTER == FILTER_L1) acc[i][j] = acc[i][j] + fabsf(t);
                else if (FILTER == FILTER_LINF) acc[i][j] = fmaxf(acc[i][j], fabsf(t));
                else acc[i][j] = __fmaf_rn(-x[i], y[j], acc[i][j]);
            }
        }
    }
}
// The tiles of block `blockIdx.x`: left rows row0.. (TILE) against `tiles` consecutive right
// tiles from col0. Consecutive blocks take consecutive left tiles of one run of right tiles, so
// that the right rows are read from device memory about once while the left side, a few MB for
// kNN's queries, stays in L2 (the transposed order read P6's 512 MB base once per left tile: 40 GB
// per pass). False for a block with nothing to do: self-joins skip right tiles whose rows all
// precede the left rows.
__device__ __forceinline__ bool brute_tile(const JoinParams& p, u32 slot_begin, u32 slot_end, u32 right_begin,
                                           u32 tiles, u32& row0, u32& col0) {
    u32 left_tiles = (slot_end - slot_begin + TILE - 1) / TILE;
    row0 = slot_begin + blockIdx.x % left_tiles * TILE;
    col0 = right_begin + blockIdx.x / left_tiles * TILE * tiles;
    return !(p.self_join && col0 + TILE * tiles <= row0);
}

// The parameter list of brute_join and brute_join_tc: one list, because the host launches both
// with the same arguments (src/gpu/launch.rs).
#define BRUTE_JOIN_PARAMS                                                                        \
    JoinParams p, u32 slot_begin, u32 slot_end, u32 right_begin, u32 right_len,                 \
        const float* lf, const float* rf, const double* lx, const double* rx,                   \
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm,     \
        const u32* left_order, const u32* right_order, const float* lfsq, const float* rfsq,    \
        const double* row_threshold, const float* row_limit,                                    \
        u32* counts, u64* cursors, u32* out_left, u32* out_right, double* out_distance,         \
        u64* collected, u64 capacity, int pass

extern "C" __global__ void __launch_bounds__(256, 2) brute_join(BRUTE_JOIN_PARAMS) {
    __shared__ float xs[CHUNK][TILE + 4];
    __shared__ float ys[CHUNK][TILE + 4];
    u32 row0, col0;
    if (!brute_tile(p, slot_begin, slot_end, right_begin, 1, row0, col0)) return;
    u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[MICRO][MICRO];
#pragma unroll
    for (int i = 0; i < MICRO; ++i)
#pragma unroll
        for (int j = 0; j < MICRO; ++j) acc[i][j] = 0.0f;
    for (u32 d0 = 0; d0 < p.dim; d0 += CHUNK) {
        // 256 threads load 128 rows × 8 dimensions of each side (4 values each); 0 beyond the data.
        for (u32 e = threadIdx.x; e < TILE * CHUNK; e += 256) {
            u32 r = e / CHUNK, d = e % CHUNK;
            u32 s = row0 + r, t = col0 + r;
            xs[d][r] = (s < slot_end && d0 + d < p.dim) ? lf[(u64)s * p.dim + d0 + d] : 0.0f;
            ys[d][r] = (t < right_len && d0 + d < p.dim) ? rf[(u64)t * p.dim + d0 + d] : 0.0f;
        }
        __syncthreads();
        switch (p.filter) {
        case FILTER_SQUARED_L2: accumulate_chunk<FILTER_SQUARED_L2>(xs, ys, tx, ty, acc); break;
        case FILTER_L1: accumulate_chunk<FILTER_L1>(xs, ys, tx, ty, acc); break;
        case FILTER_LINF: accumulate_chunk<FILTER_LINF>(xs, ys, tx, ty, acc); break;
        default: accumulate_chunk<FILTER_NEG_DOT>(xs, ys, tx, ty, acc); break;  // also FILTER_GEMM_L2
        }
        __syncthreads();
    }
    // The epilogue in two steps. First the f32 filter marks the passing pairs of the thread's
    // 8 × 8 in a 64-bit mask (bit 8i + j: left slot i, right slot j); then the marked pairs are
    // decided one at a time. The exact distance, inlined once instead of in each of the 64
    // unrolled pair positions, keeps the code small, and the accumulators are dead before it runs.
    u64 marked = 0;
    {
        RightSlot cols[MICRO];
#pragma unroll
        for (int j = 0; j < MICRO; ++j) cols[j] = right_slot(p, col0 + tx * MICRO + j, right_len, rfnorm, rfsq);
#pragma unroll
        for (int i = 0; i < MICRO; ++i) {
            u32 s = row0 + ty * MICRO + i;
            LeftSlot row = left_slot(p, s, slot_end, lfnorm, lfsq, row_threshold, row_limit);
            if (!row.valid) continue;
#pragma unroll
            for (int j = 0; j < MICRO; ++j) {
                u32 t = col0 + tx * MICRO + j;
                if (cols[j].valid && !(p.self_join && t <= s) && brute_filter(p, row, cols[j], acc[i][j]))
                    marked |= 1ull << (i * MICRO + j);
            }
        }
    }
    while (marked) {
        u32 bit = __ffsll((long long)marked) - 1;
        marked &= marked - 1;
        exact_pair(p, row0 + ty * MICRO + bit / MICRO, col0 + tx * MICRO + bit % MICRO, slot_begin, lx, rx, lnorm,
                   rnorm, left_order, right_order, row_threshold, counts, cursors, out_left, out_right, out_distance,
                   collected, capacity, pass);
    }
}

// Brute force for the dot-product filters (FILTER_GEMM_L2, FILTER_NEG_DOT) on tensor cores: the
// same 128 × 128 tiles, pairs and epilogue as brute_join, with x̃·ỹ from f16 mma.sync (m16n8k16,
// f32 accumulation). Each block takes one left tile against a run of p.tc_run right tiles; each of
// its 8 warps owns a 64 × 32 sub-tile (4 × 4 mma tiles) of the tile at hand.
// The rows are the sides' f32 filter rows scaled by one power of two 2^a and rounded to f16
// (pack_half_rows below, run by the host on every side this kernel reads: to nearest, so each
// coordinate errs by at most 2⁻¹¹ relative, or 2⁻¹⁴ absolute in f16's subnormal range), two to a
// 32-bit word, `tc_row_words` words a row (zeros up to a multiple of 8 dimensions). An f16 mma
// does twice the multiply-adds of a TF32 one at the same issue cost and reads half the bytes;
// f16's significand is TF32's (11 bits), so the relative error bound is the same, and the scaling
// (2^a exact, the largest coordinate below 2¹⁴ < 65,504) keeps the values inside f16's range. They
// enter shared memory 32 words (64 dimensions) at a time through a cp.async pipeline of `stages` buffers (3
// where the device's shared memory allows, else 2; the host sizes the dynamic shared memory) that
// runs on across the run's tiles — the next chunks, or the next tile's first, are in flight while the
// tensor cores work on this one and while a finished tile's epilogue runs — stored row-major with a
// stride of 36 words, so that the fragment loads (8 rows × 4 words per warp) hit 32 distinct
// banks. One barrier per chunk: the stage a step refills is the one every warp finished at the
// step before. (One tile per block exposed the first chunk's load latency in every tile, and the
// epilogue overlapped nothing: at d = 32 a tile has only two chunks, NOTES.md v16. Chunks of 16
// dimensions, two stages and two barriers each left the tensor pipe 23 % busy, warps waiting
// mostly at the barriers, NOTES.md v35.) On sm_90a (the H100 and H200) the stages are filled by
// TMA instead, in the 128-byte swizzle, and each warpgroup multiplies its 64 rows of the tile by
// wgmma from there (TC_WGMMA below; NOTES.md v58, v59).
// The products of f16 values are exact in f32; the error of this dot product is covered by the
// wider margin the host sets for this kernel (`tensor_core_margin` in src/backend/gpu.rs, with the
// proof). Needs sm_80 or later; the host launches it only there.
// Words (two f16 coordinates each) of a row per chunk, and a tile row's stride in shared memory.
#define TC_CHUNK 32
#define TC_STRIDE (TC_CHUNK + 4)
// Words of one pipeline stage: both sides' tiles (`TC_STAGE_BYTES` in src/gpu/launch.rs).
#define TC_STAGE_WORDS (2 * TILE * TC_STRIDE)
// Rows of at most TC_RESIDENT_CHUNKS chunks (128 dimensions) keep the block's left tile resident
// in shared memory, copied once before its run of right tiles, and the stages carry only the right
// tiles' chunks: at d = 128 the left tile was otherwise copied again for every right tile, half of
// the pass's L2 traffic and of its cp.async work (NOTES.md v50). TC_RESIDENT_WORDS are reserved
// ahead of the stages whenever a row has that few chunks (`TC_RESIDENT_BYTES` in
// src/gpu/launch.rs, which sizes the dynamic shared memory by the same rule).
#define TC_RESIDENT_CHUNKS 2
#define TC_RESIDENT_WORDS (TC_RESIDENT_CHUNKS * TILE * TC_STRIDE)

// The GEMM form's f32 filter rows of a side's exact rows, bit for bit as the host's `host_side`
// computes them: x̃ = f32(x − c) rounded to nearest, ‖x̃‖² summed in f64 in dimension order (no FMA
// contraction: --fmad=false) and rounded to f32, ‖x̃‖ its correctly rounded f32 square root; so the
// rows need not be built on the host and cross the bus twice. A warp per 32 rows: for each 32
// dimensions, the lanes convert and store the 32 rows' coordinates a row at a time (adjacent
// addresses), keeping them in a 32 × 33 tile of shared memory, then lane i adds its row's squares
// from the tile in dimension order — the sequential sum above, once per row. (A thread per row
// reading its own row made every warp load touch 32 rows' cache lines: 9.3 ms for a 1M × 128 side,
// NOTES.md v33; a warp per row, every lane adding the whole row's squares from shuffles, did
// 32 times the f64 work: 1.6 ms, NOTES.md v50.)
#define FILTER_WARPS 8

extern "C" __global__ void __launch_bounds__(FILTER_WARPS * 32) filter_rows(const double* exact, u32 n, u32 dim,
        const double* origin, float* filter, float* norms, float* sq_norms) {
    __shared__ float tiles[FILTER_WARPS][32][33];  // 33: a lane's row is read without bank conflicts
    const u32 lane = threadIdx.x & 31;
    float (*values)[33] = tiles[threadIdx.x >> 5];
    const u64 groups = ((u64)n + 31) / 32, warps = (u64)gridDim.x * FILTER_WARPS;
    for (u64 g = blockIdx.x * (u64)FILTER_WARPS + (threadIdx.x >> 5); g < groups; g += warps) {
        const u64 first = g * 32;
        const u32 rows = (u32)min((u64)32, n - first);  // the same for the whole warp
        double sq = 0.0;  // row first + lane's
        for (u32 d0 = 0; d0 < dim; d0 += 32) {
            const u32 d = d0 + lane;
            const double c = d < dim ? origin[d] : 0.0;
            // All 32 loads first, so that they are in flight together: interleaved with the
            // stores to `filter`, which the compiler cannot prove apart from `exact`, each waited
            // for the one before (0.45 ms for a 10k × 784 side, NOTES.md v50).
            double x[32];
#pragma unroll
            for (u32 i = 0; i < 32; ++i) x[i] = i < rows && d < dim ? exact[(first + i) * dim + d] : 0.0;
#pragma unroll
            for (u32 i = 0; i < 32; ++i) {
                float v = __double2float_rn(x[i] - c);
                if (i < rows && d < dim) filter[(first + i) * dim + d] = v;
                values[i][lane] = v;
            }
            __syncwarp();
            const u32 chunk = min(32u, dim - d0);
            if (lane < rows)
                for (u32 j = 0; j < chunk; ++j) {
                    double w = values[lane][j];
                    sq += w * w;
                }
            __syncwarp();  // the tile is rewritten for the next dimensions
        }
        if (lane < rows) {
            float s = __double2float_rn(sq);
            sq_norms[first + lane] = s;
            norms[first + lane] = __fsqrt_rn(s);
        }
    }
}

// The positions 0..n in order: the slot order of a side in input order (brute force, kNN), and
// the permutation the grid's stable radix sort starts from.
extern "C" __global__ void identity_order(u32* order, u32 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) order[i] = (u32)i;
}

// The largest |value| of `len` f32 values, as its bits (non-negative floats order as their bits;
// NaN's exceed +∞'s), atomically maxed into *result, which the host zeroed: brute_join_tc's scale,
// and the GEMM form's check of its squared norms.
extern "C" __global__ void filter_max_abs(const float* values, u64 len, u32* result) {
    u32 largest = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x)
        largest = max(largest, __float_as_uint(values[i]) & 0x7fffffffu);
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, d));
    if ((threadIdx.x & 31) == 0 && largest > 0) atomicMax(result, largest);
}

// brute_join_tc's rows: `n` f32 filter rows of `dim` values scaled by `scale` (2^a: exact, the
// results below 2¹⁴ in magnitude) and rounded to f16 (to nearest even), packed two to a word
// (dimension 2w in the low half of word w), `row_words` words a row, zeros beyond `dim`.
extern "C" __global__ void pack_half_rows(const float* filter, u64 n, u32 dim, u32 row_words, float scale, u32* out) {
#if __CUDA_ARCH__ >= 800
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n * row_words; e += (u64)gridDim.x * blockDim.x) {
        u64 r = e / row_words;
        u32 d = (u32)(e % row_words) * 2;
        float low = d < dim ? filter[r * dim + d] * scale : 0.0f;
        float high = d + 1 < dim ? filter[r * dim + d + 1] * scale : 0.0f;
        u32 packed;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
        out[e] = packed;
    }
#endif
}

// Words of a brute_join_tc row: two f16 coordinates a word, padded to whole 16-byte groups
// (`tc_row_words` in src/gpu/launch.rs).
__device__ __forceinline__ u32 tc_row_words(u32 dim) { return (dim + 7) / 8 * 4; }

// Words of a brute_join_tc_bytes row: four byte coordinates a word, padded to whole 16-byte
// groups (`byte_row_words` in src/gpu/launch.rs).
__device__ __forceinline__ u32 byte_row_words(u32 dim) { return (dim + 15) / 16 * 4; }

// Whether byte rows can hold a side (brute_join_tc_bytes): into result = {least, greatest,
// others}, which the host set to {2³¹ − 1, −2³¹, 0}, the least and greatest of `len` f64 values
// where each is an integer of magnitude at most 2²⁴, and others = 1 where one is not (NaN and
// infinities included). Reduced across the block before the three atomics: a warp's own atomics,
// 65,536 blocks of 8 warps on three addresses, took 0.38 ms for Fashion-MNIST's 47 M values,
// three times their read (NOTES.md v84).
#define RANGE_WARPS 8
extern "C" __global__ void __launch_bounds__(RANGE_WARPS * 32) integer_range(const double* values, u64 len, int* result) {
    __shared__ int warp_least[RANGE_WARPS], warp_greatest[RANGE_WARPS];
    __shared__ u32 warp_others[RANGE_WARPS];
    int least = 0x7fffffff, greatest = -0x7fffffff - 1;
    u32 others = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) {
        const double v = values[i];
        if (v == rint(v) && fabs(v) <= 16777216.0) {
            least = min(least, (int)v);
            greatest = max(greatest, (int)v);
        } else {
            others = 1;
        }
    }
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) {
        least = min(least, __shfl_xor_sync(0xffffffffu, least, d));
        greatest = max(greatest, __shfl_xor_sync(0xffffffffu, greatest, d));
        others |= __shfl_xor_sync(0xffffffffu, others, d);
    }
    const u32 warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        warp_least[warp] = least;
        warp_greatest[warp] = greatest;
        warp_others[warp] = others;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 w = 1; w < RANGE_WARPS; ++w) {
            least = min(least, warp_least[w]);
            greatest = max(greatest, warp_greatest[w]);
            others |= warp_others[w];
        }
        atomicMin(&result[0], least);
        atomicMax(&result[1], greatest);
        if (others) atomicOr(&result[2], 1);
    }
}

// brute_join_tc_bytes's rows: `n` rows of `dim` integer values (integer_range) shifted by
// −offset into [0, 255] and packed four to a word (dimension 4w + j in byte j of word w),
// `row_words` words a row, zeros beyond `dim`; and each row's Σ(x − offset)², exact in u32 (below
// 2³¹ at d ≤ 8,192). A warp a row, its lanes on consecutive words.
extern "C" __global__ void pack_byte_rows(const double* exact, u64 n, u32 dim, u32 row_words, int offset, u32* out, u32* sq_norms) {
    const u32 lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 r = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; r < n; r += warps) {
        u32 sq = 0;
        for (u32 w = lane; w < row_words; w += 32) {
            u32 packed = 0;
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const u32 d = 4 * w + j;
                const u32 b = d < dim ? (u32)((int)exact[r * dim + d] - offset) : 0;
                sq += b * b;
                packed |= b << (8 * j);
            }
            out[r * row_words + w] = packed;
        }
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, d);
        if (lane == 0) sq_norms[r] = sq;
    }
}

// What one thread copies of a tile's rows, chunk after chunk: four words (eight f16 coordinates)
// from word w of rows r, r + 32, r + 64 and r + 96, their address computed once per tile rather
// than once per chunk (that arithmetic was about half of the kernel's instructions: NOTES.md v11).
struct TileCopy {
    const u32* from;    // row r at word w; the buffer's start when row r is outside
    u32 stride;         // words between rows r and r + 32
    u32 inside;         // bit i: row r + 32·i exists (rows run out at the end only)
    u32 r, w;
};
static_assert(TILE * TC_CHUNK / 4 == 4 * 256, "four groups of four words per thread and chunk");

__device__ __forceinline__ TileCopy tile_copy(u32 row_words, const u32* rows, u32 first, u32 end) {
    TileCopy c;
    c.r = threadIdx.x / 8;
    c.w = threadIdx.x % 8 * 4;
    c.stride = 32 * row_words;
    c.inside = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) c.inside |= (u32)(first + c.r + 32 * i < end) << i;
    c.from = c.inside & 1 ? rows + (u64)(first + c.r) * row_words + c.w : rows;
    return c;
}

// Starts copying one chunk (TC_CHUNK words from w0) of a tile's rows into the tile at shared
// address `tile` (rows of TC_STRIDE words), 16 bytes per cp.async; zeros beyond the data (which
// add nothing to a dot product). Rows are whole groups of four words (pack_half_rows pads them), so
// each group lies wholly inside or outside the data; a source size of 0 writes zeros and reads
// nothing. The caller commits the cp.async group.
__device__ __forceinline__ void copy_chunk(u32 row_words, const TileCopy& c, u32 tile, u32 w0) {
    bool words_inside = w0 + c.w < row_words;
    const u32 to = tile + (c.r * TC_STRIDE + c.w) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        bool inside = (c.inside >> i & 1) && words_inside;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     ::"r"(to + i * 32 * TC_STRIDE * 4), "l"(inside ? c.from + (u64)i * c.stride + w0 : c.from), "r"(inside ? 16u : 0u));
    }
}

// brute_join_tc's filter, separated into a bound per left row and an offset per right row so that
// a pair costs one fused multiply-add and one comparison, all in the scaled space of its f16 rows
// (every length times 2^a = tc_scale, every score times 2^2a): it passes when
//     −scale·x̂·ŷ + offset(ỹ) ≤ bound(x̃),   scale = 2 (GEMM form) or 1 (inner product),
//     offset(ỹ) = [‖ỹ‖²] − 2m·n(ỹ)² − η·n(ỹ),   bound(x̃) = limit + 2m·n(x̃)² + η·n(x̃) − [‖x̃‖²] + floor,
// with m, floor the host's `dot_margin`, `dot_floor`, η its `tc_eta`, n the scaled f32 norms, [·]
// for the GEMM form only. That is brute_filter's test `score − (m·(n(x̃) + n(ỹ))² + η·(n(x̃) + n(ỹ))
// + floor) ≤ limit` with the margin widened to m·(2n(x̃)² + 2n(ỹ)²) + …, never less since
// (a + b)² ≤ 2a² + 2b²; and every rounding here errs toward passing (bounds rounded up, offsets and
// the pair's sum rounded down; scaling by a power of two is exact but for an overflow, rounded
// the same way), so a pair that passes the test in exact arithmetic on these inputs passes here,
// and `tensor_core_margin`'s proof (src/backend/gpu.rs) applies unchanged. NaN (an invalid slot)
// passes nothing; kNN's infinite radius, a bound of +∞, passes everything else.
#define F32_NAN __int_as_float(0x7fc00000)
#define F32_INFINITY __int_as_float(0x7f800000)

// 2m·n² + η·n of a scaled norm n, rounded up: the widening of a row's or a column's test.
__device__ __forceinline__ float tc_widening(const JoinParams& p, float n) {
    return __fadd_ru(__fmul_ru(__fmul_ru(2.0f * p.dot_margin, n), n), __fmul_ru(p.tc_eta, n));
}

__device__ __forceinline__ float tc_row_bound(const JoinParams& p, u32 s, u32 slot_end, const float* lfnorm,
                                              const float* lfsq, const double* row_threshold, const float* row_limit) {
    if (s >= slot_end) return F32_NAN;
    if (takes_every_row(p, row_threshold, s)) return F32_INFINITY;
    float squared_scale = p.tc_scale * p.tc_scale;
    float limit = __fmul_ru(p.per_row ? row_limit[s] : p.limit, squared_scale);
    float bound = __fadd_ru(limit, __fadd_ru(tc_widening(p, __fmul_ru(lfnorm[s], p.tc_scale)), p.dot_floor));
    return p.filter == FILTER_GEMM_L2 ? __fsub_ru(bound, __fmul_rd(lfsq[s], squared_scale)) : bound;
}

__device__ __forceinline__ float tc_col_offset(const JoinParams& p, u32 t, u32 right_len, const float* rfnorm, const float* rfsq) {
    if (t >= right_len) return F32_NAN;
    float widening = tc_widening(p, __fmul_ru(rfnorm[t], p.tc_scale));
    return p.filter == FILTER_GEMM_L2 ? __fsub_rd(__fmul_rd(rfsq[t], p.tc_scale * p.tc_scale), widening) : -widening;
}

// PASS_SCORES: a slot whose pair found no room in the block's queue, which makes the host count
// its query again exactly (its count then exceeds any slot's room).
#define SLOT_OVERFLOWED 0x80000000u

// Two f16 (a word of pack_half_rows) as f32, exactly.
__device__ __forceinline__ float2 half_pair(u32 word) {
    float low, high;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}" : "=f"(low), "=f"(high) : "r"(word));
    return make_float2(low, high);
}

// Member `member` of a group of `group` lanes' part of x̂·ŷ for two f16 rows of `row_words` words
// (pack_half_rows): its 16-byte groups of words member, member + group, …, by fused
// multiply-adds; the group then adds its parts. Each product of two f16 is exact in f32 and each
// addition errs by at most 2⁻²⁴ of what it adds, so the whole sum, in any order, errs by at most
// d·2⁻²⁴·Σ|x̂ᵢŷᵢ|, within the d·2⁻²² that tensor_core_margin allows the tensor cores' sum.
__device__ __forceinline__ float half_dot_part(u32 row_words, u32 group, u32 member, const u32* x, const u32* y) {
    float sum = 0.0f;
#pragma unroll 4
    for (u32 w = 4 * member; w < row_words; w += 4 * group) {
        const uint4 a = *(const uint4*)(x + w), b = *(const uint4*)(y + w);
        const u32 xs[4] = {a.x, a.y, a.z, a.w}, ys[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (u32 j = 0; j < 4; ++j) {
            const float2 xf = half_pair(xs[j]), yf = half_pair(ys[j]);
            sum = __fmaf_rn(xf.x, yf.x, sum);
            sum = __fmaf_rn(xf.y, yf.y, sum);
        }
    }
    return sum;
}

// PASS_SCORES: a pair (s, t) that passed brute_join_tc's filter, with a value v = −2x̂·ŷ +
// offset(t) (rounded down; x̂·ŷ from half_dot_part, within the filter's margin as the tensor cores'
// is), counted and, while its slot has room, kept there for knn_settle_slots: the right slot t,
// and in the distance's place two f32, v and v + 2·widening(t) rounded up (its scores a and b
// there).
__device__ __forceinline__ void keep_scores(const JoinParams& p, u32 s, u32 t, float v, u32 slot_begin, const float* rfnorm,
                                            u32* counts, u32* out_right, double* out_distance) {
    const u32 found = atomicAdd(&counts[s - slot_begin], 1u);
    if (found >= p.slot_capacity) return;
    const u64 at = (u64)(s - slot_begin) * p.slot_capacity + found;
    out_right[at] = t;
    *(float2*)&out_distance[at] = make_float2(v, __fadd_ru(v, __fmul_ru(2.0f, tc_widening(p, __fmul_ru(rfnorm[t], p.tc_scale)))));
}

// Hopper's warpgroup mma (sm_90a: `arch_for` in src/gpu/device.rs compiles for it on compute
// capability 9.0). mma.sync left brute_join_tc's count pass latency-bound at 16 warps an SM: each
// m16n8k16 waits on its fragments' ldmatrix and the tensor pipe was 29 % busy (NOTES.md v53, v55).
// wgmma.mma_async reads both operands from shared memory through a descriptor and multiplies a
// 64 × 128 × 16 block in one instruction, asynchronously, so a warpgroup (four warps) issues a
// chunk's four blocks back to back and waits once. Its accumulators are the mma.sync m16n8
// layout repeated along the columns: warp w of the group holds rows 16w + group (+8 for r ≥ 2)
// and, in d[0][n][r], column 8n + 2·quad (+1 for odd r) — tc_epilogue's layout with one row block
// and 16 column blocks.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_WGMMA 1
#else
#define TC_WGMMA 0
#endif
// A TMA descriptor (CUtensorMap, built by cuTensorMapEncodeTiled on the host), passed by value
// as a __grid_constant__ parameter; zeros where the kernel does not use TMA.
struct __align__(64) TensorMap {
    u64 opaque[16];
};
#if TC_WGMMA
// A shared-memory matrix descriptor for K-major rows of 128 bytes under the 128-byte swizzle (as
// TMA writes a chunk's tile: 16-byte group g of row r at position g ^ (r mod 8) of its row, eight
// rows a 1,024-byte atom, so that the rows an operand fetch reads together hit distinct banks):
// start address and the stride between 8-row atoms (1,024 bytes) in 16-byte
// units; the leading offset is unused by this layout (one swizzle atom spans the 16-dimension
// step); layout type 1 in bits 62–63. A step of 16 dimensions within the atom adds 32 bytes (2)
// to the start address: the hardware applies the swizzle to the addresses it forms.
__device__ __forceinline__ u64 tc_descriptor(u32 address) {
    return (u64)((address & 0x3ffff) >> 4) | (u64)1 << 16 | (u64)(1024 >> 4) << 32 | (u64)1 << 62;
}

// d (+)= A·Bᵀ for A 64 rows and B 128 rows of 16 f16 dimensions, both K-major; `accumulate` 0
// starts the tile (the accumulators' values are ignored).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[1][16][4], u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0][0]), "+f"(d[0][0][1]), "+f"(d[0][0][2]), "+f"(d[0][0][3]), "+f"(d[0][1][0]), "+f"(d[0][1][1]), "+f"(d[0][1][2]), "+f"(d[0][1][3]), "+f"(d[0][2][0]), "+f"(d[0][2][1]), "+f"(d[0][2][2]), "+f"(d[0][2][3]), "+f"(d[0][3][0]), "+f"(d[0][3][1]), "+f"(d[0][3][2]), "+f"(d[0][3][3]), "+f"(d[0][4][0]), "+f"(d[0][4][1]), "+f"(d[0][4][2]), "+f"(d[0][4][3]), "+f"(d[0][5][0]), "+f"(d[0][5][1]), "+f"(d[0][5][2]), "+f"(d[0][5][3]), "+f"(d[0][6][0]), "+f"(d[0][6][1]), "+f"(d[0][6][2]), "+f"(d[0][6][3]), "+f"(d[0][7][0]), "+f"(d[0][7][1]), "+f"(d[0][7][2]), "+f"(d[0][7][3]), "+f"(d[0][8][0]), "+f"(d[0][8][1]), "+f"(d[0][8][2]), "+f"(d[0][8][3]), "+f"(d[0][9][0]), "+f"(d[0][9][1]), "+f"(d[0][9][2]), "+f"(d[0][9][3]), "+f"(d[0][10][0]), "+f"(d[0][10][1]), "+f"(d[0][10][2]), "+f"(d[0][10][3]), "+f"(d[0][11][0]), "+f"(d[0][11][1]), "+f"(d[0][11][2]), "+f"(d[0][11][3]), "+f"(d[0][12][0]), "+f"(d[0][12][1]), "+f"(d[0][12][2]), "+f"(d[0][12][3]), "+f"(d[0][13][0]), "+f"(d[0][13][1]), "+f"(d[0][13][2]), "+f"(d[0][13][3]), "+f"(d[0][14][0]), "+f"(d[0][14][1]), "+f"(d[0][14][2]), "+f"(d[0][14][3]), "+f"(d[0][15][0]), "+f"(d[0][15][1]), "+f"(d[0][15][2]), "+f"(d[0][15][3])
        : "l"(a), "l"(b), "r"(accumulate));
}

// d (+)= A·Bᵀ for A 64 rows and B 128 rows of 32 byte coordinates (unsigned), both K-major, into
// s32 accumulators: brute_join_tc_bytes's product. 32 bytes of a row an instruction, as
// wgmma_m64n128k16's 16 f16, so the same descriptors and steps serve both. Exact: each product
// is at most 255², a row's sum at most 8,192·255² < 2³¹ (`byte_rows` in src/gpu/launch.rs keeps
// d ≤ 8,192).
__device__ __forceinline__ void wgmma_m64n128k32_u8(int (&d)[1][16][4], u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p;\n}\n"
        : "+r"(d[0][0][0]), "+r"(d[0][0][1]), "+r"(d[0][0][2]), "+r"(d[0][0][3]), "+r"(d[0][1][0]), "+r"(d[0][1][1]), "+r"(d[0][1][2]), "+r"(d[0][1][3]), "+r"(d[0][2][0]), "+r"(d[0][2][1]), "+r"(d[0][2][2]), "+r"(d[0][2][3]), "+r"(d[0][3][0]), "+r"(d[0][3][1]), "+r"(d[0][3][2]), "+r"(d[0][3][3]), "+r"(d[0][4][0]), "+r"(d[0][4][1]), "+r"(d[0][4][2]), "+r"(d[0][4][3]), "+r"(d[0][5][0]), "+r"(d[0][5][1]), "+r"(d[0][5][2]), "+r"(d[0][5][3]), "+r"(d[0][6][0]), "+r"(d[0][6][1]), "+r"(d[0][6][2]), "+r"(d[0][6][3]), "+r"(d[0][7][0]), "+r"(d[0][7][1]), "+r"(d[0][7][2]), "+r"(d[0][7][3]), "+r"(d[0][8][0]), "+r"(d[0][8][1]), "+r"(d[0][8][2]), "+r"(d[0][8][3]), "+r"(d[0][9][0]), "+r"(d[0][9][1]), "+r"(d[0][9][2]), "+r"(d[0][9][3]), "+r"(d[0][10][0]), "+r"(d[0][10][1]), "+r"(d[0][10][2]), "+r"(d[0][10][3]), "+r"(d[0][11][0]), "+r"(d[0][11][1]), "+r"(d[0][11][2]), "+r"(d[0][11][3]), "+r"(d[0][12][0]), "+r"(d[0][12][1]), "+r"(d[0][12][2]), "+r"(d[0][12][3]), "+r"(d[0][13][0]), "+r"(d[0][13][1]), "+r"(d[0][13][2]), "+r"(d[0][13][3]), "+r"(d[0][14][0]), "+r"(d[0][14][1]), "+r"(d[0][14][2]), "+r"(d[0][14][3]), "+r"(d[0][15][0]), "+r"(d[0][15][1]), "+r"(d[0][15][2]), "+r"(d[0][15][3])
        : "l"(a), "l"(b), "r"(accumulate));
}

// Orders the warpgroup's earlier register and shared-memory accesses before its next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// Closes the wgmma issued since the last commit into a group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// Waits until at most `pending` of the warpgroup's groups are unfinished.
template <int pending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(pending) : "memory"); }

// After a wait: accumulators the compiler must read only from here on (they are this statement's
// outputs, and it stays after the wait as volatile statements keep their order).
__device__ __forceinline__ void wgmma_settled(float (&d)[1][16][4]) { asm volatile("" : "+f"(d[0][0][0]), "+f"(d[0][0][1]), "+f"(d[0][0][2]), "+f"(d[0][0][3]), "+f"(d[0][1][0]), "+f"(d[0][1][1]), "+f"(d[0][1][2]), "+f"(d[0][1][3]), "+f"(d[0][2][0]), "+f"(d[0][2][1]), "+f"(d[0][2][2]), "+f"(d[0][2][3]), "+f"(d[0][3][0]), "+f"(d[0][3][1]), "+f"(d[0][3][2]), "+f"(d[0][3][3]), "+f"(d[0][4][0]), "+f"(d[0][4][1]), "+f"(d[0][4][2]), "+f"(d[0][4][3]), "+f"(d[0][5][0]), "+f"(d[0][5][1]), "+f"(d[0][5][2]), "+f"(d[0][5][3]), "+f"(d[0][6][0]), "+f"(d[0][6][1]), "+f"(d[0][6][2]), "+f"(d[0][6][3]), "+f"(d[0][7][0]), "+f"(d[0][7][1]), "+f"(d[0][7][2]), "+f"(d[0][7][3]), "+f"(d[0][8][0]), "+f"(d[0][8][1]), "+f"(d[0][8][2]), "+f"(d[0][8][3]), "+f"(d[0][9][0]), "+f"(d[0][9][1]), "+f"(d[0][9][2]), "+f"(d[0][9][3]), "+f"(d[0][10][0]), "+f"(d[0][10][1]), "+f"(d[0][10][2]), "+f"(d[0][10][3]), "+f"(d[0][11][0]), "+f"(d[0][11][1]), "+f"(d[0][11][2]), "+f"(d[0][11][3]), "+f"(d[0][12][0]), "+f"(d[0][12][1]), "+f"(d[0][12][2]), "+f"(d[0][12][3]), "+f"(d[0][13][0]), "+f"(d[0][13][1]), "+f"(d[0][13][2]), "+f"(d[0][13][3]), "+f"(d[0][14][0]), "+f"(d[0][14][1]), "+f"(d[0][14][2]), "+f"(d[0][14][3]), "+f"(d[0][15][0]), "+f"(d[0][15][1]), "+f"(d[0][15][2]), "+f"(d[0][15][3]) :: "memory"); }

__device__ __forceinline__ void wgmma_settled(int (&d)[1][16][4]) { asm volatile("" : "+r"(d[0][0][0]), "+r"(d[0][0][1]), "+r"(d[0][0][2]), "+r"(d[0][0][3]), "+r"(d[0][1][0]), "+r"(d[0][1][1]), "+r"(d[0][1][2]), "+r"(d[0][1][3]), "+r"(d[0][2][0]), "+r"(d[0][2][1]), "+r"(d[0][2][2]), "+r"(d[0][2][3]), "+r"(d[0][3][0]), "+r"(d[0][3][1]), "+r"(d[0][3][2]), "+r"(d[0][3][3]), "+r"(d[0][4][0]), "+r"(d[0][4][1]), "+r"(d[0][4][2]), "+r"(d[0][4][3]), "+r"(d[0][5][0]), "+r"(d[0][5][1]), "+r"(d[0][5][2]), "+r"(d[0][5][3]), "+r"(d[0][6][0]), "+r"(d[0][6][1]), "+r"(d[0][6][2]), "+r"(d[0][6][3]), "+r"(d[0][7][0]), "+r"(d[0][7][1]), "+r"(d[0][7][2]), "+r"(d[0][7][3]), "+r"(d[0][8][0]), "+r"(d[0][8][1]), "+r"(d[0][8][2]), "+r"(d[0][8][3]), "+r"(d[0][9][0]), "+r"(d[0][9][1]), "+r"(d[0][9][2]), "+r"(d[0][9][3]), "+r"(d[0][10][0]), "+r"(d[0][10][1]), "+r"(d[0][10][2]), "+r"(d[0][10][3]), "+r"(d[0][11][0]), "+r"(d[0][11][1]), "+r"(d[0][11][2]), "+r"(d[0][11][3]), "+r"(d[0][12][0]), "+r"(d[0][12][1]), "+r"(d[0][12][2]), "+r"(d[0][12][3]), "+r"(d[0][13][0]), "+r"(d[0][13][1]), "+r"(d[0][13][2]), "+r"(d[0][13][3]), "+r"(d[0][14][0]), "+r"(d[0][14][1]), "+r"(d[0][14][2]), "+r"(d[0][14][3]), "+r"(d[0][15][0]), "+r"(d[0][15][1]), "+r"(d[0][15][2]), "+r"(d[0][15][3]) :: "memory"); }

// The Hopper tensor memory accelerator (TMA) copies a chunk's tile (128 rows × 32 words) into
// shared memory on one thread's request, in the 128-byte swizzle (the map's, src/gpu/launch.rs
// `tc_row_map`), with zeros beyond the data, and counts its bytes on an mbarrier that the
// readers wait on: the cp.async loader spent ~170 instructions a warp and step (NOTES.md v58).
__device__ __forceinline__ void mbarrier_init(u64* barrier) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(barrier)) : "memory");
}

// The barrier's current phase completes once `bytes` have arrived (and this one arrival).
__device__ __forceinline__ void mbarrier_expect(u64* barrier, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((u32)__cvta_generic_to_shared(barrier)), "r"(bytes)
                 : "memory");
}

// Waits for the completion of the barrier's phase of parity `parity`.
__device__ __forceinline__ void mbarrier_wait(u64* barrier, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait;\n}\n" ::"r"((u32)__cvta_generic_to_shared(barrier)), "r"(parity)
        : "memory");
}

// The tile of `map` at (word, row) into shared memory at `to`, counted on `barrier`.
__device__ __forceinline__ void tma_tile(const TensorMap& map, u32 to, u32 word, u32 row, u64* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(to), "l"((u64)&map), "r"(word), "r"(row), "r"((u32)__cvta_generic_to_shared(barrier))
        : "memory");
}
#endif

// The pairs of a brute_join_tc block that passed the filter, decided after its run of tiles:
// `len` counts every pair pushed, the first p.tc_queue of them stored (left slot, right row), in
// dynamic shared memory ahead of the pipeline's stages (sized with the run: `tc_queue` in
// src/gpu/launch.rs).
// The filter's column offsets of the tiles in flight (tc_col_offset), written by the loader when
// it starts a tile and read by that tile's epilogue: a ring of TC_OFFSET_RING tiles. The loader
// runs `ahead` ≤ 2 steps ahead (steps are (tile, chunk) pairs, `chunks` per tile): tile T's
// entry is written during step T·chunks − ahead ≤ T·chunks − 1 (or before the first step), so the
// barrier that starts step T·chunks orders it before T's epilogue (step T·chunks + chunks − 1);
// tile T + 3 overwrites it during step (T + 3)·chunks − ahead ≥ T·chunks + chunks, after the
// barrier that starts that step and so after T's epilogue.
#define TC_OFFSET_RING 3
struct TcQueue {
    u32& len;
    uint2* pairs;
};

// brute_join_tc's epilogue for the tile (row0, col0), from the warp's accumulators `acc`: the
// pairs that pass the filter go to the block's queue (each warp takes its places with one atomic),
// decided at the end of the run by all threads at once. Deciding them here, one exact f64 distance
// after another per thread (a chain of dependent f64 additions d long, with loads of both rows),
// held up the whole block at its next barrier (NOTES.md v35). A pair beyond the queue's room is
// decided here (under PASS_SCORES, its slot is marked overflowed). The warp's accumulators are M
// blocks of 16 rows by N of 8 columns (4 × 4 under mma.sync, 1 × 16 under wgmma).
template <int M, int N>
__device__ __forceinline__ void tc_epilogue(const JoinParams& p, u32 row0, u32 col0, u32 warp_row, u32 warp_col, u32 group,
        u32 quad, u32 lane, TcQueue& queue, const float (&acc)[M][N][4], const float* row_bounds, const float* col_offsets,
        u32 slot_begin, const double* lx, const double* rx, const double* lnorm, const double* rnorm,
        const u32* left_order, const u32* right_order, const double* row_threshold, u32* counts, u64* cursors, u32* out_left, u32* out_right,
        double* out_distance, u64* collected, u64 capacity, int pass) {
    // In two steps, as in brute_join's epilogue: the filter marks the passing pairs in a 64-bit
    // mask, then the marked pairs are queued. Accumulator r of block (m, n) holds row 16m +
    // group (+8 for r ≥ 2), column 8n + 2·quad (+1 for odd r); its bit is 2N(2m + h) + 2n + c for
    // row half h = r / 2 and column c = r % 2. A pair costs one fused multiply-add and one comparison
    // (tc_row_bound, tc_col_offset: computed once per block and once per tile into shared
    // memory, `row_bounds` and `col_offsets`); on the diagonal tiles of a self-join, right slot t
    // must follow left slot s: t − s = lead − (16m + 8h − 8n − c).
    static_assert(M * N == 16, "64 pairs a thread");
    u64 marked = 0;
    {
        float scale = p.filter == FILTER_GEMM_L2 ? -2.0f : -1.0f;
        bool diagonal = p.self_join && col0 < row0 + TILE;
        int lead = (int)(col0 + warp_col + 2 * quad) - (int)(row0 + warp_row + group);
        float2 offsets[N];
#pragma unroll
        for (int n = 0; n < N; ++n) offsets[n] = *(const float2*)&col_offsets[warp_col + n * 8 + 2 * quad];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float bound = row_bounds[warp_row + m * 16 + group + 8 * h];
#pragma unroll
                for (int n = 0; n < N; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c)
                        if (__fmaf_rd(scale, acc[m][n][2 * h + c], c ? offsets[n].y : offsets[n].x) <= bound)
                            marked |= 1ull << (2 * N * (2 * m + h) + 2 * n + c);
            }
        // The order test on diagonal tiles only (at most one tile in a block's run), apart from
        // the filter so that the other tiles' pairs cost no integer comparison.
        if (diagonal) {
#pragma unroll
            for (int bit = 0; bit < 64; ++bit) {
                int m = bit / (4 * N), h = bit / (2 * N) % 2, n = bit / 2 % N, c = bit % 2;
                if (lead <= 16 * m + 8 * h - 8 * n - c) marked &= ~(1ull << bit);
            }
        }
    }
    u32 count = __popcll(marked), end = count;  // end: the warp's inclusive prefix sum of counts
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        u32 before = __shfl_up_sync(0xffffffffu, end, d);
        if (lane >= d) end += before;
    }
    u32 first = 0;
    if (lane == 31 && end > 0) first = atomicAdd(&queue.len, end);
    u32 at = __shfl_sync(0xffffffffu, first, 31) + end - count;
    while (marked) {
        u32 bit = __ffsll((long long)marked) - 1;
        marked &= marked - 1;
        u32 s = row0 + warp_row + (bit / (4 * N)) * 16 + group + 8 * ((bit / (2 * N)) % 2);
        u32 t = col0 + warp_col + ((bit / 2) % N) * 8 + 2 * quad + bit % 2;
        if (at < p.tc_queue) {
            queue.pairs[at] = make_uint2(s, t);
        } else if (pass == PASS_SCORES) {
            // No room to keep the pair's score: the slot is marked overflowed, and the host counts
            // its query again in an exact pass.
            atomicOr(&counts[s - slot_begin], SLOT_OVERFLOWED);
        } else {
            exact_pair(p, s, t, slot_begin, lx, rx, lnorm, rnorm, left_order, right_order, row_threshold, counts, cursors,
                       out_left, out_right, out_distance, collected, capacity, pass);
        }
        ++at;
    }
}

// brute_join_tc_bytes: the GEMM form of L2 and L2² on rows whose coordinates are all integers
// within one window of 256 values, both sides shifted by the same offset into bytes
// (pack_byte_rows; a shift changes no distance). x·y is then exact in the s32 accumulators, and so
// is D² = ‖x‖² + ‖y‖² − 2x·y, every term an integer below 2³⁰ (d ≤ 8,192). exact_distance's f64
// sum of such rows is exact as well (integer terms, partial sums below 2⁵³), so exact_finish(D²),
// √D² for L2 and D² for L2², is the contract's distance bit for bit: the filter is the exact test
// and no pair's rows are read again. A pair passes when D² ≤ L(s), written as
//     offset(t) − 2x·y ≤ bound(s),   offset(t) = ‖y‖²,   bound(s) = L(s) − ‖x‖²,
// with L(s) = ⌊fl(r²)⌋ + 1 for L2's threshold r (⌊r⌋ + 1 for L2²), at most 2²⁹ (above every D²),
// and record_pair then decides by the distance itself, so L only has to keep every pair within r:
// fl(√D²) ≤ r means √D²·(1 − 2⁻⁵³) ≤ r, so D² ≤ r²·(1 + 2⁻⁵¹) ≤ fl(r²)·(1 + 2⁻⁵⁰), less than
// fl(r²) + 1 while fl(r²) < 2³⁰ (beyond that L is 2²⁹ and takes every pair), hence D² ≤ L.
// Sentinels: a slot outside the pass has bound −2³¹ (nothing passes: offset − 2x·y > −2³¹), one
// that takes every row 2³⁰ − 1 (every column of the side: offset − 2x·y ≤ ‖y‖² < 2²⁹), a column
// outside the side offset 2³¹ − 1 (nothing passes: 2³¹ − 1 − 2x·y ≥ 2³⁰ > any bound).
#define BYTES_NO_SLOT (-0x7fffffff - 1)
#define BYTES_TAKE_ALL ((1 << 30) - 1)
#define BYTES_NO_COLUMN 0x7fffffff

__device__ __forceinline__ int bytes_row_bound(const JoinParams& p, u32 s, u32 slot_end, const u32* left_sq,
                                               const double* row_threshold) {
    if (s >= slot_end) return BYTES_NO_SLOT;
    if (takes_every_row(p, row_threshold, s)) return BYTES_TAKE_ALL;
    const double r = p.per_row ? row_threshold[s] : p.threshold;
    if (!(r >= 0.0)) return BYTES_NO_SLOT;  // NaN or negative: no distance is within it
    const double squared = p.metric == METRIC_L2 ? r * r : r;
    return (int)fmin(floor(squared) + 1.0, (double)(1 << 29)) - (int)left_sq[s];
}

__device__ __forceinline__ int bytes_col_offset(u32 t, u32 right_len, const u32* right_sq) {
    return t < right_len ? (int)right_sq[t] : BYTES_NO_COLUMN;
}

// brute_join_tc_bytes's epilogue for the tile (row0, col0), from a warpgroup's accumulators (one
// block of 16 rows by 16 of 8 columns, tc_epilogue's layout and bits): each passing pair is
// recorded here with its exact distance. The filter marks the pairs first, as tc_epilogue's does,
// so that the 64 unrolled positions hold no record_pair; a marked pair's accumulator is then
// selected by its bit (an unrolled select: few pairs pass, ~12 of P2's 16,384 a tile).
__device__ __forceinline__ void bytes_epilogue(const JoinParams& p, u32 row0, u32 col0, u32 warp_row, u32 group,
        u32 quad, const int (&acc)[1][16][4], const int* row_bounds, const int* col_offsets, const u32* left_sq,
        u32 slot_begin, const u32* left_order, const u32* right_order, const double* row_threshold, u32* counts,
        u64* cursors, u32* out_left, u32* out_right, double* out_distance, u64* collected, u64 capacity, int pass) {
    const bool diagonal = p.self_join && col0 < row0 + TILE;
    const int lead = (int)(col0 + 2 * quad) - (int)(row0 + warp_row + group);
    int2 offsets[16];
#pragma unroll
    for (int n = 0; n < 16; ++n) offsets[n] = *(const int2*)&col_offsets[n * 8 + 2 * quad];
    u64 marked = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int bound = row_bounds[warp_row + group + 8 * h];
#pragma unroll
        for (int n = 0; n < 16; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c)
                if ((c ? offsets[n].y : offsets[n].x) - 2 * acc[0][n][2 * h + c] <= bound && !(diagonal && lead <= 8 * h - 8 * n - c))
                    marked |= 1ull << (32 * h + 2 * n + c);
    }
    while (marked) {
        const u32 bit = __ffsll((long long)marked) - 1;
        marked &= marked - 1;
        const u32 h = bit / 32, n = bit / 2 % 16, c = bit % 2;
        int product = 0, offset = 0;
#pragma unroll
        for (u32 i = 0; i < 64; ++i)
            if (i == bit) {
                product = acc[0][i / 2 % 16][2 * (i / 32) + i % 2];
                offset = i % 2 ? offsets[i / 2 % 16].y : offsets[i / 2 % 16].x;
            }
        const u32 s = row0 + warp_row + group + 8 * h, t = col0 + n * 8 + 2 * quad + c;
        const double squared = (double)((int)left_sq[s] + offset - 2 * product);
        record_pair(p, s, t, exact_finish(p.metric, squared, 0.0, 0.0), slot_begin, left_order, right_order, row_threshold,
                    counts, cursors, out_left, out_right, out_distance, collected, capacity, pass);
    }
}

// knn_sample_keys_bytes's epilogue for the tile (row0, col0), from a warpgroup's accumulators
// (bytes_epilogue's layout): every pair's key, its exact squared distance ‖x‖² + ‖y‖² − 2x·y (an
// integer below 2²⁹, see brute_join_tc_bytes) rounded to f32, as knn_sample_radius reads it, at
// keys[(s − slot_begin)·SAMPLE + t] for the query slots s < slot_end and sample rows t < right_len.
// Each thread stores its two adjacent columns at once: a warp's store covers 8 rows × 32 bytes.
// The sums are taken in u32: exact for a column of the sample (below 2²⁹), and a column past its
// end, whose offset is BYTES_NO_COLUMN and whose key is not stored, wraps instead of overflowing
// an int.
__device__ __forceinline__ void bytes_keys(u32 row0, u32 col0, u32 warp_row, u32 group, u32 quad, const int (&acc)[1][16][4],
        const int* col_offsets, const u32* left_sq, u32 slot_begin, u32 slot_end, u32 right_len, float* keys) {
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
        const u32 s = row0 + warp_row + group + 8 * h;
        if (s >= slot_end) continue;
        const u32 norm = left_sq[s];
        float* row = keys + (u64)(s - slot_begin) * SAMPLE;
#pragma unroll
        for (u32 n = 0; n < 16; ++n) {
            const u32 t = col0 + n * 8 + 2 * quad;
            const int2 offset = *(const int2*)&col_offsets[n * 8 + 2 * quad];
            const u32 low = norm + (u32)offset.x - 2u * (u32)acc[0][n][2 * h], high = norm + (u32)offset.y - 2u * (u32)acc[0][n][2 * h + 1];
            const float2 key = make_float2((float)(int)low, (float)(int)high);
            if (t + 1 < right_len) *(float2*)&row[t] = key;
            else if (t < right_len) row[t] = key.x;
        }
    }
}

// knn_sample_keys_half's epilogue for the tile (row0, col0), from a warpgroup's f32 accumulators
// (tc_epilogue's wgmma layout, as bytes_keys reads its s32 ones): every pair's key as knn.cu's
// knn_sample_distances_tc computes it from x̂·ŷ, the squared L2 distance ‖x̃‖² + ‖s̃‖² + twice·x̂·ŷ
// (twice = −2·2^−2a: the rows' scale undone) at least 0 where `squared`, else the inner product's
// −x̂·ŷ·2^−2a (`unscale`), NaN as +∞; at keys[(s − slot_begin)·SAMPLE + t] for the query slots s <
// slot_end and sample rows t < right_len. `sample_sq` holds the tile's sample rows' squared
// norms (the loader's column ring), `left_sq` the queries'.
__device__ __forceinline__ void half_keys(u32 row0, u32 col0, u32 warp_row, u32 group, u32 quad, const float (&acc)[1][16][4],
        const float* sample_sq, const float* left_sq, u32 slot_begin, u32 slot_end, u32 right_len, float unscale, bool squared,
        float* keys) {
    const float twice = -2.0f * unscale;
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
        const u32 s = row0 + warp_row + group + 8 * h;
        if (s >= slot_end) continue;
        const float norm = squared ? left_sq[s] : 0.0f;
        float* row = keys + (u64)(s - slot_begin) * SAMPLE;
#pragma unroll
        for (u32 n = 0; n < 16; ++n) {
            const u32 t = col0 + n * 8 + 2 * quad;
            const float2 offset = *(const float2*)&sample_sq[n * 8 + 2 * quad];
            float v[2];
#pragma unroll
            for (u32 c = 0; c < 2; ++c) {
                const float dot = acc[0][n][2 * h + c];
                if (squared) {
                    v[c] = __fmaf_rn(twice, dot, norm + (c ? offset.y : offset.x));
                    v[c] = v[c] < 0.0f ? 0.0f : v[c];
                } else {
                    v[c] = -(dot * unscale);
                }
                v[c] = isnan(v[c]) ? F32_INFINITY : v[c];
            }
            if (t + 1 < right_len) *(float2*)&row[t] = make_float2(v[0], v[1]);
            else if (t < right_len) row[t] = v[0];
        }
    }
}

// The sum of exact terms of the pairs `pairs[0, count)` (count ≤ DRAIN_PAIRS) of a brute_join_tc
// block's queue, lane i's pair i's (lanes 0–15): the warp brings their rows into `scratch` (2 ×
// DRAIN_PAIRS rows of DRAIN_STRIDE f64) DRAIN_DIMS dimensions at a time, one pair's half of them a
// load instruction (lanes 0–15 the left row's values, 16–31 the right row's: two cache lines), then
// each lane adds its pair's terms from there in dimension order, exact_distance's terms and order,
// while the next dimensions' loads are in flight. One thread per pair reading its own rows made
// each load instruction touch 32 rows' cache lines, which the L1 serves one a cycle: at 784
// dimensions those loads held 28 % of the count pass's stall samples (NOTES.md v51). The drain is
// bound by its round trips to memory, one per DRAIN_DIMS dimensions and warp: 32 pairs a warp at 16
// dimensions a trip left half the warps idle (P1 queues ~116 pairs a block) and made 49 trips a
// warp at 784 dimensions, 1.6 of the 3.6 ms of 60,000 × 784's count pass (NOTES.md v65).
#define DRAIN_PAIRS 16
#define DRAIN_DIMS 32
#define DRAIN_STRIDE (DRAIN_DIMS + 1)  // a lane's row is read without bank conflicts
// The warps' scratch (66 KB) fits in what every configuration has after the queue: two stages of
// both tiles, or the resident left tile and two stages of right tiles (72 KB either way).
static_assert(8 * 2 * DRAIN_PAIRS * DRAIN_STRIDE * 8 <= 2 * TC_STAGE_WORDS * 4, "brute_join_tc's drain scratch");

template <u32 METRIC>
__device__ __forceinline__ double drain_sum(u32 dim, const uint2* pairs, u32 count, const double* lx, const double* rx,
                                            double* scratch) {
    const u32 lane = threadIdx.x % 32, side = lane / 16, at = lane % 16;
    const double* rows = side ? rx : lx;
    double (*staged)[DRAIN_PAIRS][DRAIN_STRIDE] = (double (*)[DRAIN_PAIRS][DRAIN_STRIDE])scratch;  // [side][pair][dimension]
    // Dimensions d0 + at and d0 + 16 + at of each pair's row on this lane's side: all loads of a
    // trip issued together.
    double values[DRAIN_PAIRS][2];
    auto load = [&](u32 d0) {
#pragma unroll
        for (u32 j = 0; j < DRAIN_PAIRS; ++j) {
            uint2 pair = pairs[min(j, count - 1)];
            const double* row = rows + (u64)(side ? pair.y : pair.x) * dim;
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                const u32 d = d0 + 16 * h + at;
                values[j][h] = j < count && d < dim ? row[d] : 0.0;
            }
        }
    };
    double acc = 0.0;
    load(0);
    for (u32 d0 = 0; d0 < dim; d0 += DRAIN_DIMS) {
#pragma unroll
        for (u32 j = 0; j < DRAIN_PAIRS; ++j)
#pragma unroll
            for (u32 h = 0; h < 2; ++h) staged[side][j][16 * h + at] = values[j][h];
        __syncwarp();
        if (d0 + DRAIN_DIMS < dim) load(d0 + DRAIN_DIMS);
        if (lane < DRAIN_PAIRS) {
            const u32 width = min((u32)DRAIN_DIMS, dim - d0);
            for (u32 i = 0; i < width; ++i) acc = exact_term<METRIC>(acc, staged[0][lane][i], staged[1][lane][i]);
        }
        __syncwarp();  // the scratch is rewritten for the next dimensions
    }
    return acc;
}

// brute_join_tc on f16 rows (BYTES false) or, under wgmma only, brute_join_tc_bytes on byte rows:
// the same pipeline with half the chunks a row (128 bytes hold 128 coordinates instead of 64),
// the exact integer test of bytes_row_bound, and no queue to drain. KEYS (wgmma only):
// knn_sample_keys_bytes and knn_sample_keys_half, whose epilogue writes every pair's key to `keys`
// (bytes_keys, half_keys) and which test, count and write no pair; the column ring holds the sample
// rows' squared norms (`rfsq`), `unscale` and `squared` are half_keys's.
template <bool BYTES, bool KEYS = false>
__device__ __forceinline__ void brute_join_tc_run(BRUTE_JOIN_PARAMS, const TensorMap& left_map, const TensorMap& right_map,
                                                  float* keys = nullptr, float unscale = 1.0f, bool squared = true) {
#if __CUDA_ARCH__ >= 800
    typedef typename TcElement<BYTES>::Type Element;
    // Dynamic shared memory: the queue's pairs, the resident left tile's chunks (rows of at most
    // TC_RESIDENT_CHUNKS chunks), then the pipeline's stages (16-byte aligned), sized by the host
    // for the mma.sync layout.
    extern __shared__ __align__(16) u32 tc_shared[];
    __shared__ u32 queue_len;
    __shared__ Element row_bounds[TILE];
    __shared__ __align__(8) Element col_offsets[TC_OFFSET_RING][TILE];
#if TC_WGMMA
    // Completed by each stage's TMA copies (one phase a use), and by the resident left tile's.
    __shared__ u64 stage_full[4], left_full;
#endif
    const u32 row_words = BYTES ? byte_row_words(p.dim) : tc_row_words(p.dim);
    const u32 chunks = (row_words + TC_CHUNK - 1) / TC_CHUNK;
    const bool resident = chunks <= TC_RESIDENT_CHUNKS;
    u32 shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    const u32 stage_words = resident ? TILE * TC_STRIDE : TC_STAGE_WORDS;
    // 2 or 3 under mma.sync, 3 or 4 under wgmma, as the host sized it (tc_dynamic_bytes).
    const u32 stages = (shared_bytes - p.tc_queue * 8 - (resident ? TC_RESIDENT_WORDS * 4 : 0)) / (stage_words * 4);
    // Steps the loader runs ahead. Under wgmma a step's group stays in flight across the next
    // step's barrier and loads, so the stage refilled at step s is step s − 2's, not s − 1's.
    const u32 ahead = stages - 1 - TC_WGMMA;
    TcQueue queue = {queue_len, (uint2*)tc_shared};
    u32* x_resident = tc_shared + p.tc_queue * 2;
    // The shared addresses of a step's chunk tiles: the left one (the resident tile's chunk c, or
    // the stage's) and the right one.
#if TC_WGMMA
    // TMA's swizzled layout stores a chunk's tile in 16 KB, 1,024-byte aligned (the swizzle's
    // atoms), in the space the host sized for padded tiles of 18 KB: the alignment's at most
    // 1,008 bytes fit in the 2 KB that each tile leaves over.
    const u32 tile_bytes = TILE * TC_CHUNK * 4;
    const u32 x_base = ((u32)__cvta_generic_to_shared(x_resident) + 1023) & ~1023u;
    const u32 stage_bytes = (resident ? 1 : 2) * tile_bytes;
    const u32 stage_base = x_base + (resident ? TC_RESIDENT_CHUNKS * tile_bytes : 0);
#else
    // The f16 rows (pack_half_rows), passed in the f32 filter rows' place.
    const u32* left_rows = (const u32*)lf;
    const u32* right_rows = (const u32*)rf;
    const u32 tile_bytes = TILE * TC_STRIDE * 4;
    const u32 x_base = (u32)__cvta_generic_to_shared(x_resident);
    const u32 stage_bytes = stage_words * 4;
    const u32 stage_base = x_base + (resident ? TC_RESIDENT_WORDS * 4 : 0);
#endif
    auto x_at = [&](u32 stage, u32 c) { return resident ? x_base + c * tile_bytes : stage_base + stage * stage_bytes; };
    auto y_at = [&](u32 stage) { return stage_base + stage * stage_bytes + (resident ? 0 : tile_bytes); };
    u32 row0, run_col;
    if (!brute_tile(p, slot_begin, slot_end, right_begin, p.tc_run, row0, run_col)) return;
    // The run's tiles within the data, from the first not wholly before the diagonal (self-joins).
    u32 first_col = run_col;
    if (p.self_join && row0 > run_col) first_col += (row0 - run_col) / TILE * TILE;
    u32 end_col = min(run_col + p.tc_run * TILE, right_len);
    u32 tiles = (end_col - first_col + TILE - 1) / TILE;
    u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // The warp's part of the tile: under wgmma its warpgroup's 64 rows' 16 (all 128 columns),
    // under mma.sync 64 rows × 32 columns.
#if TC_WGMMA
    u32 warp_row = (warp / 4) * 64 + (warp % 4) * 16, warp_col = 0;
#else
    u32 warp_row = (warp / 4) * 64, warp_col = (warp % 4) * 32;
#endif
    u32 group = lane / 4, quad = lane % 4;  // the fragment coordinates of PTX's m16n8k16 layout
    if (threadIdx.x == 0) queue.len = 0;  // before any push: the first step's barrier orders them
    // The left tile's filter bounds, likewise ordered before the first epilogue.
    if (threadIdx.x < TILE && !KEYS) {
        if constexpr (BYTES) row_bounds[threadIdx.x] = bytes_row_bound(p, row0 + threadIdx.x, slot_end, (const u32*)lfsq, row_threshold);
        else row_bounds[threadIdx.x] = tc_row_bound(p, row0 + threadIdx.x, slot_end, lfnorm, lfsq, row_threshold, row_limit);
    }
#if TC_WGMMA
    typedef Element TileAcc[1][16][4];
    TileAcc acc = {};
#else
    typedef float TileAcc[4][4][4];
    TileAcc acc;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.0f;
#endif
    // Steps (tile, chunk) in order. The loader runs `ahead` steps ahead of the tensor cores: under
    // mma.sync one cp.async group per step (empty past the last), so that a step's group is complete
    // once at most ahead − 1 younger ones are pending; under wgmma one TMA request per step,
    // counted on its stage's barrier.
    const u32 steps = tiles * chunks;
#if !TC_WGMMA
    TileCopy x_copy = tile_copy(row_words, left_rows, row0, slot_end), y_copy = tile_copy(row_words, right_rows, first_col, right_len);
#endif
    // Stage indices count round instead of taking `load % stages` and `step % stages`: `stages` is
    // known only at run time, and each modulo cost an integer division per step.
    u32 load = 0, load_stage = 0, load_chunk = 0, load_col = first_col, load_tile = 0;
    auto load_next = [&]() {
        if (load < steps) {
            if (load_chunk == 0 && threadIdx.x < TILE) {
                Element& offset = col_offsets[load_tile % TC_OFFSET_RING][threadIdx.x];
                if constexpr (BYTES) offset = bytes_col_offset(load_col + threadIdx.x, right_len, (const u32*)rfsq);
                else if constexpr (KEYS) offset = squared && load_col + threadIdx.x < right_len ? rfsq[load_col + threadIdx.x] : 0.0f;
                else offset = tc_col_offset(p, load_col + threadIdx.x, right_len, rfnorm, rfsq);
            }
            u32 stage = load_stage;
            load_stage = load_stage + 1 == stages ? 0 : load_stage + 1;
#if TC_WGMMA
            if (threadIdx.x == 0) {
                mbarrier_expect(&stage_full[stage], (resident ? 1 : 2) * tile_bytes);
                if (!resident) tma_tile(left_map, x_at(stage, 0), load_chunk * TC_CHUNK, row0, &stage_full[stage]);
                tma_tile(right_map, y_at(stage), load_chunk * TC_CHUNK, load_col, &stage_full[stage]);
            }
#else
            if (load_chunk == 0 && load > 0) y_copy = tile_copy(row_words, right_rows, load_col, right_len);
            if (!resident) copy_chunk(row_words, x_copy, x_at(stage, 0), load_chunk * TC_CHUNK);
            copy_chunk(row_words, y_copy, y_at(stage), load_chunk * TC_CHUNK);
#endif
            if (++load_chunk == chunks) {
                load_chunk = 0;
                load_col += TILE;
                ++load_tile;
            }
        }
        ++load;
#if !TC_WGMMA
        asm volatile("cp.async.commit_group;");
#endif
    };
#if TC_WGMMA
    // The barriers, initialized before any copy counts on them and any thread waits on them; the
    // resident left tile's copies, waited for before the first step.
    if (threadIdx.x == 0) {
        for (u32 i = 0; i < 4; ++i) mbarrier_init(&stage_full[i]);
        mbarrier_init(&left_full);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0 && resident) {
        mbarrier_expect(&left_full, chunks * tile_bytes);
        for (u32 c = 0; c < chunks; ++c) tma_tile(left_map, x_at(0, c), c * TC_CHUNK, row0, &left_full);
    }
    for (u32 s = 0; s < ahead; ++s) load_next();
    if (resident) mbarrier_wait(&left_full, 0);
    u32 compute_phase = 0;  // the parity of the stage's phase that the step waits for
#else
    // A resident left tile's copies join the first group, which the first step waits for.
    if (resident)
        for (u32 c = 0; c < chunks; ++c) copy_chunk(row_words, x_copy, x_at(0, c), c * TC_CHUNK);
    for (u32 s = 0; s < ahead; ++s) load_next();
#endif
    u32 col0 = first_col, tile = 0, compute_stage = 0;  // the tile being computed, and the stage of its step
    auto epilogue = [&](TileAcc& tile_acc, u32 tile_col0, u32 tile_index) {
        if constexpr (KEYS && BYTES)
            bytes_keys(row0, tile_col0, warp_row, group, quad, tile_acc, col_offsets[tile_index % TC_OFFSET_RING], (const u32*)lfsq,
                       slot_begin, slot_end, right_len, keys);
        else if constexpr (KEYS)
            half_keys(row0, tile_col0, warp_row, group, quad, tile_acc, col_offsets[tile_index % TC_OFFSET_RING], lfsq, slot_begin,
                      slot_end, right_len, unscale, squared, keys);
        else if constexpr (BYTES)
            bytes_epilogue(p, row0, tile_col0, warp_row, group, quad, tile_acc, row_bounds, col_offsets[tile_index % TC_OFFSET_RING],
                           (const u32*)lfsq, slot_begin, left_order, right_order, row_threshold, counts, cursors, out_left,
                           out_right, out_distance, collected, capacity, pass);
        else
            tc_epilogue(p, row0, tile_col0, warp_row, warp_col, group, quad, lane, queue, tile_acc, row_bounds,
                        col_offsets[tile_index % TC_OFFSET_RING], slot_begin, lx, rx, lnorm, rnorm, left_order, right_order,
                        row_threshold, counts, cursors, out_left, out_right, out_distance, collected, capacity, pass);
    };
    // The start of every step: the stage that load_next refills free, and this step's data in.
    auto begin_step = [&]() {
#if TC_WGMMA
        // At most the previous step's group is unfinished, so that the barrier finds the stage
        // that load_next refills (step s − 2's) read.
        wgmma_wait<1>();
        __syncthreads();
        load_next();
        u32 stage = compute_stage;
        mbarrier_wait(&stage_full[stage], compute_phase);
        if (++compute_stage == stages) {
            compute_stage = 0;
            compute_phase ^= 1;
        }
#else
        if (ahead == 2) asm volatile("cp.async.wait_group 1;");
        else asm volatile("cp.async.wait_group 0;");
        // Every thread's copies of this step are in, and every warp is done with the stage that
        // load_next now refills.
        __syncthreads();
        load_next();
        u32 stage = compute_stage;
        compute_stage = compute_stage + 1 == stages ? 0 : compute_stage + 1;
#endif
        return stage;
    };
#if TC_WGMMA
    // A step under wgmma: the warpgroup's 64 left rows (eight atoms in) against the 128 right
    // rows, four wgmma of 8 words (32 bytes: 2 in the descriptor's units) committed as one group
    // and left in flight; a tile's first step starts the accumulators. All four even where the
    // chunk is the row's last and shorter: the copies wrote zeros beyond the row, which add
    // nothing, and a branch among them makes ptxas serialize every wgmma (ptxas's C7519), as does
    // a wait under a condition (C7518): each tile's steps are a loop and its last step, then the
    // wait for all of them and the epilogue.
    auto wgmma_step = [&](u32 c) {
        const u32 stage = begin_step();
        const u64 a = tc_descriptor(x_at(stage, c) + warp / 4 * 64 * 128), b = tc_descriptor(y_at(stage));
        wgmma_fence();
        if constexpr (BYTES) {
            wgmma_m64n128k32_u8(acc, a, b, c > 0);
#pragma unroll
            for (u32 k = 8; k < TC_CHUNK; k += 8) wgmma_m64n128k32_u8(acc, a + k / 4, b + k / 4, 1);
        } else {
            wgmma_m64n128k16(acc, a, b, c > 0);
#pragma unroll
            for (u32 k = 8; k < TC_CHUNK; k += 8) wgmma_m64n128k16(acc, a + k / 4, b + k / 4, 1);
        }
        wgmma_commit();
    };
    for (; tile < tiles; ++tile, col0 += TILE) {
        for (u32 c = 0; c + 1 < chunks; ++c) wgmma_step(c);
        wgmma_step(chunks - 1);
        wgmma_wait<0>();
        wgmma_settled(acc);
        epilogue(acc, col0, tile);
    }
#else
    for (u32 step = 0, c = 0; step < steps; ++step) {
        const u32 stage = begin_step();
        const u32 x_tile = x_at(stage, c), y_tile = y_at(stage);
        // The mma steps (8 words, 16 dimensions each) cover this chunk's words rounded up to 8.
        u32 width = min((u32)TC_CHUNK, (row_words - c * TC_CHUNK + 7) & ~7u);
#pragma unroll
        for (u32 k = 0; k < TC_CHUNK; k += 8) {
            if (k >= width) break;
            // The fragments by ldmatrix (load_a_fragment, load_b_fragments): six loads per step
            // instead of 24.
            u32 a[4][4], b[4][2];
#pragma unroll
            for (int m = 0; m < 4; ++m) load_a_fragment(x_tile, TC_STRIDE, warp_row + m * 16, k, lane, a[m]);
#pragma unroll
            for (int n = 0; n < 4; n += 2) load_b_fragments(y_tile, TC_STRIDE, warp_col + n * 8, k, lane, b[n], b[n + 1]);
#pragma unroll
            for (int m = 0; m < 4; ++m)
#pragma unroll
                for (int n = 0; n < 4; ++n)
                    mma_f16(acc[m][n], a[m], b[n]);
        }
        if (++c < chunks) continue;
        c = 0;
        epilogue(acc, col0, tile);
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[m][n][r] = 0.0f;
        col0 += TILE;
        ++tile;
    }
#endif
    // The queued pairs, DRAIN_PAIRS a warp and a thread each: their exact distances computed side
    // by side, the rows staged through the pipeline's stages, which no copy uses any more (every
    // step's group is complete) once every warp is past its last step. Byte rows queue none.
    if constexpr (BYTES || KEYS) return;
    __syncthreads();
    u32 queued = min(queue.len, p.tc_queue);
    if (pass == PASS_SCORES) {
        // The queued pairs into their slots, each with its value recomputed from the f16 rows: a
        // pair's accumulator, picked out of the 64 by its bit in the epilogue, cost ~200
        // instructions a warp, as much as the drain saved (NOTES.md v85). A group of lanes per
        // pair, about 16 words a lane (4 lanes at 128 dimensions, 32 at 784), so that each lane's
        // loads are in flight together.
        const float scale = p.filter == FILTER_GEMM_L2 ? -2.0f : -1.0f;
        u32 group = 1;
        while (group < 32 && group * 16 < row_words) group *= 2;
        const u32 member = threadIdx.x % group, per_round = blockDim.x / group;
        for (u32 first = 0; first < queued; first += per_round) {  // the same rounds for every lane
            const u32 i = first + threadIdx.x / group;
            const uint2 pair = i < queued ? queue.pairs[i] : make_uint2(0, 0);
            float dot = i < queued ? half_dot_part(row_words, group, member, (const u32*)lf + (u64)pair.x * row_words,
                                                   (const u32*)rf + (u64)pair.y * row_words)
                                   : 0.0f;
            for (u32 d = group / 2; d > 0; d >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, d);
            if (i < queued && member == 0)
                keep_scores(p, pair.x, pair.y, __fmaf_rd(scale, dot, tc_col_offset(p, pair.y, right_len, rfnorm, rfsq)),
                            slot_begin, rfnorm, counts, out_right, out_distance);
        }
        return;
    }
    double* scratch = (double*)x_resident + (threadIdx.x / 32) * 2 * DRAIN_PAIRS * DRAIN_STRIDE;
    for (u32 first = threadIdx.x / 32 * DRAIN_PAIRS; first < queued; first += blockDim.x / 32 * DRAIN_PAIRS) {
        const uint2* pairs = queue.pairs + first;
        const u32 count = min((u32)DRAIN_PAIRS, queued - first);
        double acc;
        switch (p.metric) {
        case METRIC_L2:
        case METRIC_L2SQ: acc = drain_sum<METRIC_L2>(p.dim, pairs, count, lx, rx, scratch); break;
        case METRIC_COSINE:
        case METRIC_INNER_PRODUCT: acc = drain_sum<METRIC_INNER_PRODUCT>(p.dim, pairs, count, lx, rx, scratch); break;
        case METRIC_L1: acc = drain_sum<METRIC_L1>(p.dim, pairs, count, lx, rx, scratch); break;
        default: acc = drain_sum<METRIC_LINF>(p.dim, pairs, count, lx, rx, scratch); break;
        }
        if (lane < count) {
            u32 s = pairs[lane].x, t = pairs[lane].y;
            double dist = exact_finish(p.metric, acc, cosine_norm(p, lnorm, s), cosine_norm(p, rnorm, t));
            record_pair(p, s, t, dist, slot_begin, left_order, right_order, row_threshold, counts, cursors, out_left,
                        out_right, out_distance, collected, capacity, pass);
        }
    }
#endif
}

#define BRUTE_JOIN_ARGS                                                                                    \
    p, slot_begin, slot_end, right_begin, right_len, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order, \
        right_order, lfsq, rfsq, row_threshold, row_limit, counts, cursors, out_left, out_right, out_distance,  \
        collected, capacity, pass

// Two blocks an SM, so that one block's warps hide the other's latencies. (Under wgmma, one block
// with 255 registers a thread for two sets of accumulators, tile T's epilogue running while tile
// T + 1's wgmma did, took 1.5 times as long: with 8 warps an SM every barrier and epilogue was
// exposed, NOTES.md v58.)
extern "C" __global__ void __launch_bounds__(256, 2) brute_join_tc(BRUTE_JOIN_PARAMS, const __grid_constant__ TensorMap left_map,
                                                                   const __grid_constant__ TensorMap right_map) {
    brute_join_tc_run<false>(BRUTE_JOIN_ARGS, left_map, right_map);
}

// brute_join_tc on byte rows (pack_byte_rows), passed in the f32 filter rows' place, with their
// integer squared norms in lfsq's and rfsq's: sm_90a only (the host launches it only there).
extern "C" __global__ void __launch_bounds__(256, 2) brute_join_tc_bytes(BRUTE_JOIN_PARAMS, const __grid_constant__ TensorMap left_map,
                                                                         const __grid_constant__ TensorMap right_map) {
#if TC_WGMMA
    brute_join_tc_run<true>(BRUTE_JOIN_ARGS, left_map, right_map);
#endif
}

#if TC_WGMMA
// kNN's sample keys on byte rows (knn_sample_radius reads them as knn.cu's other sample kernels
// write theirs), through brute_join_tc_bytes's pipeline: TMA copies and wgmma. knn_sample_distances_tc's
// byte instance, its register-staged loads and mma.sync, waited on its loads (P2: 0.28 ms for
// 8,192 queries, NOTES.md v89). Query slots [query_begin, query_end) against the sample's `sample_len` rows
// (sample_byte_rows), each pair's key at keys[(q − query_begin)·SAMPLE + i]; `p` sets the
// dimensions and the run (p.tc_run, no queue), and the maps cover the two sides' byte rows.
extern "C" __global__ void __launch_bounds__(256, 2) knn_sample_keys_bytes(JoinParams p, u32 query_begin, u32 query_end,
        const u32* query_rows, const u32* query_sq, const u32* sample_rows, const u32* sample_sq, u32 sample_len, float* keys,
        const __grid_constant__ TensorMap query_map, const __grid_constant__ TensorMap sample_map) {
    brute_join_tc_run<true, true>(p, query_begin, query_end, 0, sample_len, (const float*)query_rows, (const float*)sample_rows,
                                  nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, (const float*)query_sq,
                                  (const float*)sample_sq, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  0, PASS_COUNT, query_map, sample_map, keys);
}

// kNN's sample keys on f16 rows (knn.cu's knn_sample_distances_tc, which mma.sync devices keep),
// the same way: the queries' and the sample's f16 rows (sample_half_rows) scaled by 2^a, by their
// maps, their f32 squared filter norms where `squared` (else any buffer: the inner product's keys
// read none), `unscale` = 2^−2a.
extern "C" __global__ void __launch_bounds__(256, 2) knn_sample_keys_half(JoinParams p, u32 query_begin, u32 query_end,
        const u32* query_rows, const float* query_sq, const u32* sample_rows, const float* sample_sq, u32 sample_len, float unscale,
        u32 squared, float* keys, const __grid_constant__ TensorMap query_map, const __grid_constant__ TensorMap sample_map) {
    brute_join_tc_run<false, true>(p, query_begin, query_end, 0, sample_len, (const float*)query_rows, (const float*)sample_rows,
                                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, query_sq, sample_sq, nullptr,
                                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, PASS_COUNT, query_map, sample_map,
                                   keys, unscale, squared != 0);
}
#endif

// The rest of kNN's first count pass under PASS_SCORES (brute_join_tc on f16 rows, L2 and L2²,
// k ≤ 32), a warp per left slot s of [slot_begin, slot_end). brute_join_tc's drain computed the
// exact distance of every pair that passed the filter: at P1 (k = 10) ~450 a query at its sample
// radius, 1.9 ms of its ~12 (NOTES.md, nineteenth session), of which the k nearest need few. Under
// PASS_SCORES every such pair (s, t) has in the slot (keep_scores)
//     a = v,   b = v + 2w(t),   v = −2x̂·ŷ + [‖ỹ‖²] − w(t)   (all scaled by 2^2a, w = tc_widening),
// and tensor_core_margin's bound |score − D| ≤ W (D the pair's scaled squared distance, score =
// [‖x̃‖²] + [‖ỹ‖²] − 2x̂·ŷ, W = w(s) + w(t) + floor, the filter's own widening) gives
//     L = a + [‖x̃‖²] − w(s) − floor  ≤  D  ≤  b + [‖x̃‖²] + w(s) + floor = U.
// (v is rounded down: its f32 roundings, a few 2⁻²³ of the squared norms it adds, lie far inside
// the half of W's relative part that the bound leaves unused, m·(n(x̃) + n(ỹ))²/2 ≥
// 2⁻¹¹·(n(x̃) + n(ỹ))²; L is rounded down, U up.) Let T be the k-th smallest U of the slot. k of its pairs have D ≤
// T, so the slot's k-th smallest exact distance δ_k has δ_k² ≤ T (up to the f64 sums' relative
// rounding ε ≤ d·2⁻⁵³, scaled), and any pair among its k nearest (δ ≤ δ_k, ties included) has L ≤
// D ≤ T·(1 + 3ε). So the pairs with L ≤ T·(1 + 2⁻²⁰) hold the slot's k nearest, and only they are
// checked exactly. Those within the radius are compacted to the slot's front with their exact
// distance and base position, and their number replaces the count. The slot holds every pair
// within the radius (the filter passes them all), so if at least k rows are within it, the k
// nearest of the base are, and are in the slot and checked: a count of k or more means the slot
// is ranked as before (knn_select_slots), and one below k means fewer than k rows are within the
// radius, a short query as with exact counts. A count below k is short already (the filter's
// count bounds the exact one); one above the slot's room is left as it is, and the host counts
// that query again in an exact pass.
extern "C" __global__ void __launch_bounds__(256) knn_settle_slots(JoinParams p, u32 slot_begin, u32 slot_end, u32 k,
        const double* lx, const double* rx, const float* lfnorm, const float* lfsq, const u32* right_order,
        const double* row_threshold, u32* counts, u32* out_right, double* out_distance) {
    const u32 s = slot_begin + (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (s >= slot_end) return;
    const u32 found = counts[s - slot_begin];
    if (found < k || found > p.slot_capacity) return;
    const u64 first = (u64)(s - slot_begin) * p.slot_capacity;
    const float2* scores = (const float2*)(out_distance + first);
    // T: the k-th smallest b, by keys (b's order, index), which are distinct; each round the lane
    // that held the warp's smallest looks for its next.
    auto smallest_above = [&](u64 floor, bool bounded) {
        u64 best = ~0ull;
        for (u32 j = lane; j < found; j += 32) {
            const u64 key = (u64)f32_order_key(scores[j].y) << 32 | j;
            if ((!bounded || key > floor) && key < best) best = key;
        }
        return best;
    };
    u64 mine = smallest_above(0, false), kth = 0;
    for (u32 r = 0; r < k; ++r) {
        kth = mine;
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) kth = min(kth, (u64)__shfl_xor_sync(0xffffffffu, kth, d));
        if (mine == kth) mine = smallest_above(kth, true);
    }
    const float squared_scale = p.tc_scale * p.tc_scale;
    const float widening = __fadd_ru(tc_widening(p, __fmul_ru(lfnorm[s], p.tc_scale)), p.dot_floor);
    const float upper = __fadd_ru(__fadd_ru(from_f32_order_key((u32)(kth >> 32)), __fmul_ru(lfsq[s], squared_scale)), widening);
    const float most = __fadd_ru(upper, __fmul_ru(fabsf(upper), 0x1p-20f));
    const float sq_down = __fmul_rd(lfsq[s], squared_scale);
    // The pairs to check, their right slots compacted to the slot's front. Each round's loads come
    // before its stores (__syncwarp), which land at or below the round's indices; later rounds
    // read above them.
    u32 checked = 0;
    for (u32 j0 = 0; j0 < found; j0 += 32) {
        const u32 j = j0 + lane;
        const bool check = j < found && __fsub_rd(__fadd_rd(scores[j].x, sq_down), widening) <= most;
        const u32 t = check ? out_right[first + j] : 0;
        __syncwarp();
        const u32 mask = __ballot_sync(0xffffffffu, check);
        if (check) out_right[first + checked + __popc(mask & ((1u << lane) - 1))] = t;
        checked += __popc(mask);
    }
    // Their exact distances; those within the radius compacted likewise, as record_pair keeps them.
    const double* x = lx + (u64)s * p.dim;
    u32 kept = 0;
    for (u32 j0 = 0; j0 < checked; j0 += 32) {
        const u32 j = j0 + lane;
        bool keep = false;
        u32 t = 0;
        double dist = 0.0;
        if (j < checked) {
            t = out_right[first + j];
            dist = exact_distance(p, x, rx + (u64)t * p.dim, 0.0, 0.0);
            keep = dist <= row_threshold[s] || takes_every_row(p, row_threshold, s);
        }
        __syncwarp();
        const u32 mask = __ballot_sync(0xffffffffu, keep);
        if (keep) {
            const u64 at = first + kept + __popc(mask & ((1u << lane) - 1));
            out_right[at] = right_order[t];
            out_distance[at] = dist;
        }
        kept += __popc(mask);
    }
    if (lane == 0) counts[s - slot_begin] = kept;
}
