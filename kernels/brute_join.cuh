// Brute force on CUDA cores: 128 × 128 tiles through shared memory, the f32 filter and the exact
// check of each pair that passes.
// Included by brute_join.cu, tc_join.cu and tc_sample_keys.cu.

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
// with the same arguments (src/cuda/launch/join.rs).
#define BRUTE_JOIN_PARAMS                                                                        \
    JoinParams p, u32 slot_begin, u32 slot_end, u32 right_begin, u32 right_len,                 \
        const float* lf, const float* rf, const double* lx, const double* rx,                   \
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm,     \
        const u32* left_order, const u32* right_order, const float* lfsq, const float* rfsq,    \
        const double* row_threshold, const float* row_limit,                                    \
        u32* counts, u64* cursors, u32* out_left, u32* out_right, double* out_distance,         \
        u64* collected, u64 capacity, int pass
