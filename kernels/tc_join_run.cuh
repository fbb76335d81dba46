// The tensor-core join's queue, its template brute_join_tc_run and the kernels instantiated from
// it: brute_join_tc and brute_join_tc_bytes (tc_join.cu), kNN's sample keys (tc_sample_keys.cu).

// The pairs of a brute_join_tc block that passed the filter, decided after its run of tiles:
// `len` counts every pair pushed, the first p.tc_queue of them stored (left slot, right row), in
// dynamic shared memory ahead of the pipeline's stages (sized with the run: `tc_queue` in
// src/cuda/launch/geometry.rs).
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
// held up the whole block at its next barrier (docs/design.md#cpu-knn). A pair beyond the queue's room is
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
// dimensions those loads held 28 % of the count pass's stall samples (docs/design.md#gpu-brute). The drain is
// bound by its round trips to memory, one per DRAIN_DIMS dimensions and warp: 32 pairs a warp at 16
// dimensions a trip left half the warps idle (P1 queues ~116 pairs a block) and made 49 trips a
// warp at 784 dimensions, 1.6 of the 3.6 ms of 60,000 × 784's count pass (docs/design.md#gpu-brute).
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
        // instructions a warp, as much as the drain saved (docs/design.md#gpu-knn). A group of lanes per
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
