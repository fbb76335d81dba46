// Exact kNN as a range query with a radius per query (the GPU backend's kNN, src/backend/gpu/knn.rs).
//
// knn_sample_distances and knn_sample_radius give each query candidate radii from a sample of the
// base: its f32 distances to `sample_len` ≤ SAMPLE base rows (stored dimension-major:
// `sf[d·sample_len + i]`), and radii[q·LEVELS + j] = the (rank·4^j)-th smallest (+∞ once that
// rank is beyond the sample). brute_join then counts, per
// query, the base rows within its radius (f32 filter with the proved margins, exact f64 check);
// a query with fewer than k moves to its next level. A radius with at least k base rows within
// it bounds the k-th smallest distance, so every true neighbour is among the rows written, whose
// exact distances the host ranks (ties by base position). The sample only decides how many
// candidates there are (about rank·n/sample_len), never which neighbours are returned.
#include "common.cuh"
#include "bitonic.cuh"

#define LEVELS 4

// A radix selection's step, by one warp: the digit among 256 bins (`bins_of`, counts of the keys
// that share the digits chosen so far) in which the `target`-th of those keys lies. Each lane sums
// 8 bins, a scan over the lanes gives the keys up to each lane's last bin, and the lane whose bins
// reach `target` walks them: it alone returns true, with the digit, the keys in the bins before
// it (`before`) and in its bin (`count`). No lane does for a target of 0 or beyond the keys.
__device__ __forceinline__ bool digit_of_rank(const u32* bins_of, u32 target, u32 lane, u32& digit, u32& before, u32& count) {
    u32 bins[8], sum = 0;
#pragma unroll
    for (u32 j = 0; j < 8; ++j) sum += bins[j] = bins_of[8 * lane + j];
    u32 through = sum;  // keys in the bins up to this lane's last
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        u32 other = __shfl_up_sync(0xffffffffu, through, d);
        if (lane >= d) through += other;
    }
    u32 seen = through - sum;
    if (target == 0 || seen >= target || target > through) return false;
    for (u32 j = 0; j < 8; ++j) {
        if (seen + bins[j] >= target) {
            digit = 8 * lane + j;
            before = seen;
            count = bins[j];
            return true;
        }
        seen += bins[j];
    }
    return false;
}

// knn_sample_rows: the sample, gathered from the base's own f32 filter rows on the device
// (row-major, `dim` values a row, in input order): sample row i is base row ⌊i·n/sample_len⌋ (spread
// evenly), written dimension-major, `sample[d·sample_len + i]`, so that knn_sample_distances'
// threads (one sample row each) read adjacent values. (Built on the host from the f64 rows, the
// transposition and its upload took 5.2 ms of P2's 35, docs/design.md#gpu-knn.)
extern "C" __global__ void knn_sample_rows(const float* filter, u32 n, u32 dim, u32 sample_len, float* sample) {
    u64 len = (u64)sample_len * dim;
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < len; e += (u64)gridDim.x * blockDim.x) {
        u64 d = e / sample_len, i = e % sample_len;
        sample[e] = filter[i * n / sample_len * dim + d];
    }
}

// knn_sample_distances: the distances of SAMPLE_QUERIES queries (blockIdx.x's, of [query_begin,
// query_end)) to SAMPLE_COLUMNS sample rows (blockIdx.y's), in f32 from the filter rows: the
// queries' as uploaded (row-major), the sample's in the same filter space less the same origin
// (dimension-major). A radius only decides how many candidates the count pass finds, and
// any radius is correct: that pass tests every base row exactly against it, and a query with
// fewer than k moves to its next level. So the sample needs no exact distances (in f64, at an
// add, a multiply and an add per term, they took 17.6 ms of a 10k × 60k × 784 kNN, docs/design.md#gpu-knn).
// L2, L1 and L∞ are the filter rows' own (a common origin cancels); cosine is half the squared
// L2 distance of unit vectors (with or without an origin); the inner product's origin is 0.
// Written to distances[(q − query_begin)·SAMPLE + i] as f32 keys that order as the distances do:
// the sum itself, but the inner product's negated (L2's square root and cosine's half are taken by
// knn_sample_radius, sample_radius, of the one value it picks); NaN as +∞, which orders last.
// The block stages SAMPLE_DIMS dimensions of both sides at a time in shared memory and each thread
// keeps a 4 × 8 block of sums in registers, three 16-byte shared loads for 32 terms. (A thread per
// sample row reading 16 queries' values from global memory, a load per term, spent about as much
// on loads as on arithmetic: docs/design.md#gpu-brute.) The squared L2 distance is taken as ‖x‖² + ‖s‖² − 2x·s
// from fused multiply-adds, one instruction a term where the difference, its square and the sum
// took three (this module is built without FMA contraction, for the exact distances): its rounding,
// relative to the norms, moves a radius a little, and any radius is correct (docs/design.md#gpu-brute).
#define SAMPLE_QUERIES 64
#define SAMPLE_COLUMNS 128
#define SAMPLE_DIMS 16

// The terms of knn_sample_distances' sums, one instantiation of its loop each.
enum SampleTerm { TERM_SQUARED, TERM_PRODUCT, TERM_ABSOLUTE, TERM_LARGEST };

template <SampleTerm TERM>
__device__ __forceinline__ float sample_term(float acc, float x, float s) {
    if (TERM == TERM_SQUARED) return __fmaf_rn(x, s, acc);  // x·s, completed by sample_distance_block
    if (TERM == TERM_PRODUCT) return acc + x * s;
    if (TERM == TERM_ABSOLUTE) return acc + fabsf(x - s);
    return fmaxf(acc, fabsf(x - s));
}

// Thread t holds queries 4·(t / 16) + [0, 4) and sample rows 4·(t % 16) + [0, 4) and + 64 of the
// block's, so that a quarter warp's sample loads cover 256 adjacent bytes (no bank conflicts) and
// its query loads are one broadcast.
template <SampleTerm TERM>
__device__ __forceinline__ void sample_distance_block(u32 dim, u32 first, u32 query_end, u32 s0, const float* qf,
        const float* sf, u32 sample_len, float (*qs)[SAMPLE_QUERIES + 4], float (*ss)[SAMPLE_COLUMNS], float (&acc)[4][8]) {
    const u32 tq = threadIdx.x / 16 * 4, ts = threadIdx.x % 16 * 4;
#pragma unroll
    for (u32 q = 0; q < 4; ++q)
#pragma unroll
        for (u32 j = 0; j < 8; ++j) acc[q][j] = 0.0f;
    float query_sq[4] = {}, sample_sq[8] = {};  // TERM_SQUARED's ‖x‖², ‖s‖²
    for (u32 d0 = 0; d0 < dim; d0 += SAMPLE_DIMS) {
        // Zeros beyond the data: a dimension past `dim` adds a zero term (L∞'s sums are ≥ 0, and
        // fmaxf passes over NaN), and the sums of rows past the ends are not written.
        for (u32 e = threadIdx.x; e < SAMPLE_QUERIES * SAMPLE_DIMS; e += blockDim.x) {
            u32 q = e / SAMPLE_DIMS, d = e % SAMPLE_DIMS;
            qs[d][q] = first + q < query_end && d0 + d < dim ? qf[(u64)(first + q) * dim + d0 + d] : 0.0f;
        }
        for (u32 e = threadIdx.x; e < SAMPLE_COLUMNS * SAMPLE_DIMS; e += blockDim.x) {
            u32 d = e / SAMPLE_COLUMNS, i = e % SAMPLE_COLUMNS;
            ss[d][i] = s0 + i < sample_len && d0 + d < dim ? sf[(u64)(d0 + d) * sample_len + s0 + i] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (u32 d = 0; d < SAMPLE_DIMS; ++d) {
            float4 x = *(const float4*)&qs[d][tq];
            float4 a = *(const float4*)&ss[d][ts], b = *(const float4*)&ss[d][64 + ts];
            const float xv[4] = {x.x, x.y, x.z, x.w}, sv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (u32 q = 0; q < 4; ++q)
#pragma unroll
                for (u32 j = 0; j < 8; ++j) acc[q][j] = sample_term<TERM>(acc[q][j], xv[q], sv[j]);
            if (TERM == TERM_SQUARED) {
#pragma unroll
                for (u32 q = 0; q < 4; ++q) query_sq[q] = __fmaf_rn(xv[q], xv[q], query_sq[q]);
#pragma unroll
                for (u32 j = 0; j < 8; ++j) sample_sq[j] = __fmaf_rn(sv[j], sv[j], sample_sq[j]);
            }
        }
        __syncthreads();
    }
    if (TERM == TERM_SQUARED) {
        // At least 0 (rounding can take a near-duplicate's below), NaN kept.
#pragma unroll
        for (u32 q = 0; q < 4; ++q)
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                float v = __fmaf_rn(-2.0f, acc[q][j], query_sq[q] + sample_sq[j]);
                acc[q][j] = v < 0.0f ? 0.0f : v;
            }
    }
}

extern "C" __global__ void __launch_bounds__(256) knn_sample_distances(JoinParams p, u32 query_begin, u32 query_end,
        const float* qf, const float* sf, u32 sample_len, float* distances) {
    __shared__ __align__(16) float qs[SAMPLE_DIMS][SAMPLE_QUERIES + 4];
    __shared__ __align__(16) float ss[SAMPLE_DIMS][SAMPLE_COLUMNS];
    u32 first = query_begin + blockIdx.x * SAMPLE_QUERIES, s0 = blockIdx.y * SAMPLE_COLUMNS;
    if (first >= query_end || s0 >= sample_len) return;
    float acc[4][8];
    switch (p.metric) {
    case METRIC_L2:
    case METRIC_L2SQ:
    case METRIC_COSINE:
        sample_distance_block<TERM_SQUARED>(p.dim, first, query_end, s0, qf, sf, sample_len, qs, ss, acc);
        break;
    case METRIC_INNER_PRODUCT:
        sample_distance_block<TERM_PRODUCT>(p.dim, first, query_end, s0, qf, sf, sample_len, qs, ss, acc);
        break;
    case METRIC_L1:
        sample_distance_block<TERM_ABSOLUTE>(p.dim, first, query_end, s0, qf, sf, sample_len, qs, ss, acc);
        break;
    default:
        sample_distance_block<TERM_LARGEST>(p.dim, first, query_end, s0, qf, sf, sample_len, qs, ss, acc);
        break;
    }
    const u32 tq = threadIdx.x / 16 * 4, ts = threadIdx.x % 16 * 4;
#pragma unroll
    for (u32 q = 0; q < 4; ++q) {
        if (first + tq + q >= query_end) break;
        float* row = distances + (u64)(first + tq + q - query_begin) * SAMPLE + s0;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            u32 i = ts + j % 4 + 64 * (j / 4);
            float v = p.metric == METRIC_INNER_PRODUCT ? -acc[q][j] : acc[q][j];
            if (s0 + i < sample_len) row[i] = isnan(v) ? __int_as_float(0x7f800000) : v;
        }
    }
}

// knn_sample_distances_tc: knn_sample_distances' keys where the tensor cores filter (the GEMM form
// of L2, L2² and cosine; the inner product), from the f16 rows brute_join_tc reads (both sides
// scaled by 2^a, two coordinates a word, `row_words` words a row): the queries' and the sample's,
// gathered from the base's (row i is base row ⌊i·n/sample_len⌋, as knn_sample_rows picks). x·s by
// mma.sync m16n8k16 with f32 accumulation, times `unscale` = 2^−2a; the squared L2 distance as
// ‖x‖² + ‖s‖² − 2x·s from the sides' f32 squared filter norms, at least 0, the inner product's key
// −x·s (`squared` = 0: the norms are not read). f16's 11-bit significand puts a key off by about 2⁻¹⁰·‖x‖·‖s‖, which moves a radius a
// little: any radius is correct (knn_sample_distances). On f32 CUDA cores these keys took 2.4 ms
// of a 10k × 60k × 784 kNN (docs/design.md#gpu-knn).
// A block takes TC_SAMPLE_QUERIES queries × TC_SAMPLE_COLUMNS sample rows, staging
// TC_SAMPLE_WORDS words (64 dimensions) of each row at a time in shared memory; each of its 8
// warps computes 32 × 32 of them (2 × 4 fragments). Rows are TC_SAMPLE_STRIDE words apart, so the
// eight 16-byte rows of an ldmatrix block fall in 32 distinct banks. (Fragments word by word, 16
// shared loads a step, and each stage loaded between the barriers took 0.55 ms of 60,000 × 784's
// sample at 10,000 queries; ldmatrix and the next stage's loads in flight during the mma, 0.46:
// docs/design.md#gpu-knn.)
#define TC_SAMPLE_QUERIES 64
#define TC_SAMPLE_COLUMNS 128
#define TC_SAMPLE_WORDS 32
#define TC_SAMPLE_STRIDE (TC_SAMPLE_WORDS + 4)

// Byte rows' keys come from tc_sample_keys.cu's knn_sample_keys_bytes.
extern "C" __global__ void __launch_bounds__(256) knn_sample_distances_tc(u32 row_words, u32 query_begin, u32 query_end, const u32* query_rows,
        const float* query_sq, const u32* sample_rows, const float* sample_sq, u32 sample_len, float unscale, u32 squared,
        float* distances) {
    __shared__ __align__(16) u32 qs[TC_SAMPLE_QUERIES][TC_SAMPLE_STRIDE];
    __shared__ __align__(16) u32 ss[TC_SAMPLE_COLUMNS][TC_SAMPLE_STRIDE];
    u32 first = query_begin + blockIdx.x * TC_SAMPLE_QUERIES, s0 = blockIdx.y * TC_SAMPLE_COLUMNS;
    if (first >= query_end || s0 >= sample_len) return;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
    const u32 warp_row = warp / 4 * 32, warp_col = warp % 4 * 32;
    float acc[2][4][4] = {};
    // Staged four words (16 bytes) a load: rows are whole groups of four words (tc_row_words), so a
    // group lies within a row or past its end, and every group and shared row is 16-byte aligned
    // (TC_SAMPLE_STRIDE is 144 bytes). Zero words past a row's end or past the last row add
    // nothing (their sums are not written). The next stage's groups are loaded into registers
    // while this stage's mma run (a thread's QUERY_GROUPS + SAMPLE_GROUPS of them at the 256
    // threads a block that the warp layout takes), so that the loads' latency is not waited out
    // between the barriers.
    constexpr u32 GROUPS = TC_SAMPLE_WORDS / 4;
    constexpr u32 QUERY_GROUPS = TC_SAMPLE_QUERIES * GROUPS / 256, SAMPLE_GROUPS = TC_SAMPLE_COLUMNS * GROUPS / 256;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 next_queries[QUERY_GROUPS], next_sample[SAMPLE_GROUPS];
    auto fetch = [&](u32 w0) {
#pragma unroll
        for (u32 i = 0; i < QUERY_GROUPS; ++i) {
            u32 e = threadIdx.x + i * 256, r = e / GROUPS, w = w0 + e % GROUPS * 4;
            next_queries[i] = first + r < query_end && w < row_words ? *(const uint4*)&query_rows[(u64)(first + r) * row_words + w] : zero;
        }
#pragma unroll
        for (u32 i = 0; i < SAMPLE_GROUPS; ++i) {
            u32 e = threadIdx.x + i * 256, r = e / GROUPS, w = w0 + e % GROUPS * 4;
            next_sample[i] = s0 + r < sample_len && w < row_words ? *(const uint4*)&sample_rows[(u64)(s0 + r) * row_words + w] : zero;
        }
    };
    const u32 qs_at = (u32)__cvta_generic_to_shared(&qs[0][0]), ss_at = (u32)__cvta_generic_to_shared(&ss[0][0]);
    fetch(0);
    for (u32 w0 = 0; w0 < row_words; w0 += TC_SAMPLE_WORDS) {
#pragma unroll
        for (u32 i = 0; i < QUERY_GROUPS; ++i) {
            u32 e = threadIdx.x + i * 256;
            *(uint4*)&qs[e / GROUPS][e % GROUPS * 4] = next_queries[i];
        }
#pragma unroll
        for (u32 i = 0; i < SAMPLE_GROUPS; ++i) {
            u32 e = threadIdx.x + i * 256;
            *(uint4*)&ss[e / GROUPS][e % GROUPS * 4] = next_sample[i];
        }
        __syncthreads();
        if (w0 + TC_SAMPLE_WORDS < row_words) fetch(w0 + TC_SAMPLE_WORDS);
#pragma unroll
        for (u32 k = 0; k < TC_SAMPLE_WORDS; k += 8) {
            // The fragments by ldmatrix, as brute_join_tc's mma.sync path takes them
            // (load_a_fragment, load_b_fragments): four loads per step instead of 16.
            u32 a[2][4], b[4][2];
#pragma unroll
            for (u32 m = 0; m < 2; ++m) load_a_fragment(qs_at, TC_SAMPLE_STRIDE, warp_row + m * 16, k, lane, a[m]);
#pragma unroll
            for (u32 n = 0; n < 4; n += 2) load_b_fragments(ss_at, TC_SAMPLE_STRIDE, warp_col + n * 8, k, lane, b[n], b[n + 1]);
#pragma unroll
            for (u32 m = 0; m < 2; ++m)
#pragma unroll
                for (u32 n = 0; n < 4; ++n)
                    mma_f16(acc[m][n], a[m], b[n]);
        }
        __syncthreads();
    }
    // Accumulator e of fragment (m, n): query row warp_row + 16m + group + 8·(e / 2), sample row
    // warp_col + 8n + 2·quad + e % 2.
    const float twice = -2.0f * unscale;
#pragma unroll
    for (u32 m = 0; m < 2; ++m)
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
            u32 q = first + warp_row + m * 16 + group + 8 * (e / 2);
            if (q >= query_end) continue;
            float* row = distances + (u64)(q - query_begin) * SAMPLE;
#pragma unroll
            for (u32 n = 0; n < 4; ++n) {
                u32 s = s0 + warp_col + n * 8 + 2 * quad + e % 2;
                if (s >= sample_len) continue;
                float v;
                if (squared) {
                    v = __fmaf_rn(twice, acc[m][n][e], query_sq[q] + sample_sq[s]);
                    v = v < 0.0f ? 0.0f : v;
                } else {
                    v = -(acc[m][n][e] * unscale);
                }
                row[s] = isnan(v) ? __int_as_float(0x7f800000) : v;
            }
        }
}

// The distance of a knn_sample_distances key value: L2's square root and cosine's half, in f64
// (what the count pass compares exact distances with).
__device__ __forceinline__ double sample_radius(u32 metric, float v) {
    double d = v;
    if (metric == METRIC_L2) return sqrt(d);
    if (metric == METRIC_COSINE) return 0.5 * d;
    return d;
}

// knn_sample_radius: one block per query of [query_begin, query_begin + gridDim.x), its row of
// `distances` (knn_sample_distances of the same query_begin) as order keys, SAMPLE / 256 in each
// thread's registers, and each level's rank found by radix selection: four passes of 8 bits from
// the top, each counting the keys that share the digits found so far into a histogram in shared
// memory and taking the digit whose bin holds the rank. The levels take their passes together (a
// histogram each, scanned by a warp each; the first pass's, where no digit is known yet, is one
// for all): 4 rounds of block barriers where one level after another took 16 (0.30 ms for 8,192
// queries, docs/design.md#gpu-knn). The bitonic sort of the row that came before took 78 steps over 4,096
// f64 entries in shared memory (most of P1's 3.9 ms of sampling, docs/design.md#gpu-knn).
#define SAMPLE_PER_THREAD (SAMPLE / 256)

extern "C" __global__ void __launch_bounds__(256) knn_sample_radius(u32 metric, u32 query_begin, const float* distances, u32 sample_len,
        u32 rank, double* radii) {
    __shared__ u32 histogram[LEVELS][256];
    __shared__ u32 digit[LEVELS], before[LEVELS];
    u32 q = query_begin + blockIdx.x;
    const float* row = distances + (u64)blockIdx.x * SAMPLE;
    // Entries beyond the sample take the largest key, above every distance's (+∞'s is 0xff800000),
    // so they never hold a rank ≤ sample_len.
    u32 keys[SAMPLE_PER_THREAD];
#pragma unroll
    for (u32 i = 0; i < SAMPLE_PER_THREAD; ++i) {
        u32 e = threadIdx.x + 256 * i;
        keys[i] = e < sample_len ? f32_order_key(row[e]) : 0xffffffffu;
    }
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // Level j's (rank·4^j)-th smallest key: `prefix[j]` holds its digits found so far, `want[j]`
    // its rank among the keys that share them (0: beyond the sample, +∞).
    u32 prefix[LEVELS], want[LEVELS];
#pragma unroll
    for (u32 level = 0; level < LEVELS; ++level) {
        u64 r = (u64)rank << (2 * level);
        prefix[level] = 0;
        want[level] = r > sample_len ? 0 : (u32)r;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        const bool first = shift == 24;
        for (u32 i = threadIdx.x; i < LEVELS * 256; i += 256) (&histogram[0][0])[i] = 0;
        __syncthreads();
        u32 high = first ? 0u : 0xffffffffu << (shift + 8);
#pragma unroll
        for (u32 i = 0; i < SAMPLE_PER_THREAD; ++i) {
            const u32 bin = (keys[i] >> shift) & 255;
            if (first) {
                atomicAdd(&histogram[0][bin], 1u);
            } else {
#pragma unroll
                for (u32 level = 0; level < LEVELS; ++level)
                    if (want[level] > 0 && (keys[i] & high) == prefix[level]) atomicAdd(&histogram[level][bin], 1u);
            }
        }
        __syncthreads();
        // Warp j scans level j's bins (the first pass's one histogram for all), 8 a lane; the
        // lane whose bins hold rank `want` finds its digit and how many keys lie in the bins
        // before it.
        if (warp < LEVELS) {
            u32 target = 0;
#pragma unroll
            for (u32 level = 0; level < LEVELS; ++level)
                if (level == warp) target = want[level];
            u32 found, keys_before, in_bin;
            if (digit_of_rank(histogram[first ? 0 : warp], target, lane, found, keys_before, in_bin)) {
                digit[warp] = found;
                before[warp] = keys_before;
            }
        }
        __syncthreads();
#pragma unroll
        for (u32 level = 0; level < LEVELS; ++level)
            if (want[level] > 0) {
                prefix[level] |= digit[level] << shift;
                want[level] -= before[level];
            }
    }
    if (threadIdx.x < LEVELS) {
        double radius = F64_INFINITY;
#pragma unroll
        for (u32 level = 0; level < LEVELS; ++level)
            if (level == threadIdx.x && want[level] > 0) radius = sample_radius(metric, from_f32_order_key(prefix[level]));
        radii[(u64)q * LEVELS + threadIdx.x] = radius;
    }
}

// The k nearest of each slotted query's candidates, ranked where they are (knn_rank_slots): the
// first count pass stored query q's candidates at [q·capacity, q·capacity + slot_len[q]) of
// `distance` and `position`; slot_len[q] = 0 for a query ranked from a write pass instead. One
// block per query sorts its entries in shared memory (bitonic, the next power of two ≥ its count,
// padded with entries that sort last) by (distance in f64 total order, base position) — the
// host's Neighbour order, `f64::total_cmp` then position, so −0.0 sorts before +0.0 as there —
// and writes its first k (slot_len[q] ≥ k for every slotted query) to out[q·k, q·k + k).
#define RANK_SLOTS 4096

// The bits of `d` as an unsigned key in f64::total_cmp's order.
__device__ __forceinline__ u64 total_order_key(double d) {
    u64 bits = (u64)__double_as_longlong(d);
    return (bits >> 63) ? ~bits : bits | 0x8000000000000000ull;
}

__device__ __forceinline__ double from_total_order_key(u64 key) {
    return __longlong_as_double((long long)((key >> 63) ? key & 0x7fffffffffffffffull : ~key));
}

// Sorts `size` (a power of two) shared-memory entries, keys `key` and base positions `at`, by key
// then position (bitonic_sort): the host's Neighbour order where the keys are total_order_key's.
__device__ __forceinline__ void sort_by_key_and_position(u32 size, u64* key, u32* at) {
    bitonic_sort(size, [&](u32 i, u32 j, bool ascending) {
        u64 a = key[i], b = key[j];
        bool greater = a > b || (a == b && at[i] > at[j]);
        if (greater == ascending) {
            key[i] = b;
            key[j] = a;
            u32 t = at[i];
            at[i] = at[j];
            at[j] = t;
        }
    });
}

extern "C" __global__ void __launch_bounds__(256) knn_rank_slots(u32 capacity, u32 k, u32 room, const u32* slot_len,
        const double* distance, const u32* position, double* out_distance, u32* out_position) {
    // `room` (a power of two ≥ every slot_len, ≤ RANK_SLOTS) keys, then as many positions, in
    // dynamic shared memory sized by the host to the longest slot: at RANK_SLOTS always, 48 KB a
    // block left room for four blocks a multiprocessor (docs/design.md#gpu-brute).
    extern __shared__ u64 rank_shared[];
    u64* key = rank_shared;
    u32* at = (u32*)(rank_shared + room);
    u32 q = blockIdx.x;
    u32 len = slot_len[q];
    if (len == 0) return;
    u32 size = 1;
    while (size < len) size <<= 1;
    u64 first = (u64)q * capacity;
    for (u32 i = threadIdx.x; i < size; i += blockDim.x) {
        key[i] = i < len ? total_order_key(distance[first + i]) : ~0ull;
        at[i] = i < len ? position[first + i] : 0xffffffffu;
    }
    __syncthreads();
    sort_by_key_and_position(size, key, at);
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        out_distance[(u64)q * k + i] = from_total_order_key(key[i]);
        out_position[(u64)q * k + i] = at[i];
    }
}

// The k nearest of each slotted query's candidates for small k (the host's KNN_SELECT_SLOTS_K;
// knn_rank_slots' job, same inputs and outputs): a warp per query takes the smallest remaining (distance, position) k
// times. Each lane keeps the smallest of its entries (i ≡ lane mod 32) above the last taken; the
// warp's smallest of those is the next neighbour, and only the lane that held it scans its entries
// again. Positions are distinct within a slot (a base row is a query's candidate once), so the
// order is strict and "above the last taken" excludes exactly the taken. At P1's k = 10 (~450
// entries a slot) that is ~15 loads a lane and ten scans of one lane: a tenth of the bitonic
// sort's work, without its ~45 block barriers (docs/design.md#gpu-knn).

struct Candidate {
    u64 key;  // total_order_key of the distance
    u32 at;   // base position
};

__device__ __forceinline__ bool ranks_before(Candidate a, Candidate b) { return a.key < b.key || (a.key == b.key && a.at < b.at); }

extern "C" __global__ void __launch_bounds__(256) knn_select_slots(u32 queries, u32 capacity, u32 k, const u32* slot_len,
        const double* distance, const u32* position, double* out_distance, u32* out_position) {
    const u32 q = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (q >= queries) return;
    const u32 len = slot_len[q];
    if (len == 0) return;
    const u64 first = (u64)q * capacity;
    // After every entry: positions are below 2³² − 1 (a base has fewer rows).
    const Candidate none = {~0ull, 0xffffffffu};
    auto smallest_above = [&](Candidate floor, bool bounded) {
        Candidate best = none;
        for (u32 i = lane; i < len; i += 32) {
            Candidate entry = {total_order_key(distance[first + i]), position[first + i]};
            if ((!bounded || ranks_before(floor, entry)) && ranks_before(entry, best)) best = entry;
        }
        return best;
    };
    Candidate mine = smallest_above(none, false);
    for (u32 r = 0; r < k; ++r) {
        Candidate next = mine;
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) {
            Candidate other = {__shfl_xor_sync(0xffffffffu, next.key, d), __shfl_xor_sync(0xffffffffu, next.at, d)};
            if (ranks_before(other, next)) next = other;
        }
        if (lane == 0) {
            out_distance[(u64)q * k + r] = from_total_order_key(next.key);
            out_position[(u64)q * k + r] = next.at;
        }
        if (mine.key == next.key && mine.at == next.at) mine = smallest_above(next, true);
    }
}

// The k nearest of each list a kNN write pass wrote (knn_rank_lists, where the host's
// rank_lists_most_k allows k): list i of the batch is [ends[i − 1], ends[i]) of `distance` and `position`
// (ends[−1] = 0), at least k candidates in no set order. These are the write pass's cursors as it
// leaves them: each started at its list's exclusive offset and was advanced once per candidate
// written. One block per list selects its k smallest by (total_order_key(distance), position),
// the host's Neighbour order, as a 96-bit composite key; positions are distinct within a list, so
// the keys are too, and exactly k are at or below the k-th. It sorts those k in shared memory
// (bitonic, `room` = the next power of two ≥ k) and writes them, nearest first, to out[i·k, i·k +
// k). Before, the host copied every candidate back (P1 at k = 10,000: ~2·10⁴ a query) and ranked
// them itself: a select and a sort of 10⁴ a query, 0.4 ms each, the larger part of the run's
// 0.8 s (docs/design.md#memory, docs/design.md#gpu-knn).
//
// The selection is a radix select over the composite key, RANK_DIGIT_BITS at a time from the
// digit that holds the highest bit in which the list's keys differ: one query's candidate
// distances share their sign, exponent and first mantissa bits, which a round would only find
// all in one bin. Each round counts, by digit, the entries whose higher bits equal the prefix
// chosen so far, and chooses the digit in which the `want`-th of them lies (`want` the entries
// still to take among those matching); the entries of the smaller digits are taken. It ends when
// the chosen digit's entries are exactly the `want` still wanted (at the last digit at the latest,
// where each key is alone in its bin). The k are then the entries whose bits from the last chosen
// digit up are at most the prefix.
#define RANK_DIGIT_BITS 8
#define RANK_DIGITS (1u << RANK_DIGIT_BITS)
#define KEY_BITS 96  // total_order_key's 64 bits above the position's 32

// The composite key's bits from `from` up (the rest zero), as its key part and its position part.
__device__ __forceinline__ u64 key_bits_from(u64 key, u32 from) { return from >= KEY_BITS ? 0 : from <= 32 ? key : key & (~0ull << (from - 32)); }
__device__ __forceinline__ u32 position_bits_from(u32 at, u32 from) { return from >= 32 ? 0 : at & (~0u << from); }

// The composite key's digit at bits [from, from + RANK_DIGIT_BITS): digits do not straddle the
// position's 32 bits, a multiple of RANK_DIGIT_BITS.
__device__ __forceinline__ u32 key_digit(u64 key, u32 at, u32 from) {
    return (from >= 32 ? (u32)(key >> (from - 32)) : at >> from) & (RANK_DIGITS - 1);
}

extern "C" __global__ void __launch_bounds__(1024) knn_rank_lists(u32 k, u32 room, const u64* ends, const double* distance,
        const u32* position, double* out_distance, u32* out_position) {
    // `room` keys, then as many positions, in dynamic shared memory sized by the host.
    extern __shared__ u64 rank_shared[];
    u64* key = rank_shared;
    u32* at = (u32*)(rank_shared + room);
    __shared__ u32 histogram[RANK_DIGITS];
    __shared__ u64 lowest, highest;
    __shared__ u32 chosen_digit, chosen_before, chosen_count, gathered;
    const u32 q = blockIdx.x, lane = threadIdx.x % 32;
    const u64 first = q == 0 ? 0 : ends[q - 1], len = ends[q] - first;
    auto entry_key = [&](u64 i) { return total_order_key(distance[first + i]); };
    // The digit that holds the highest bit in which the keys differ (the position's top digit
    // where they are all equal), and the bits above it, which every entry shares.
    if (threadIdx.x == 0) {
        lowest = ~0ull;
        highest = 0;
    }
    __syncthreads();
    {
        u64 low = ~0ull, high = 0;
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            u64 e = entry_key(i);
            low = min(low, e);
            high = max(high, e);
        }
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) {
            low = min(low, __shfl_xor_sync(0xffffffffu, low, d));
            high = max(high, __shfl_xor_sync(0xffffffffu, high, d));
        }
        if (lane == 0) {
            atomicMin(&lowest, low);
            atomicMax(&highest, high);
        }
    }
    __syncthreads();
    const u64 differ = lowest ^ highest;
    u32 from = differ ? (95 - __clzll(differ)) / RANK_DIGIT_BITS * RANK_DIGIT_BITS : 32 - RANK_DIGIT_BITS;
    u64 prefix_key = key_bits_from(lowest, from + RANK_DIGIT_BITS);
    u32 prefix_at = 0, want = k;
    while (true) {
        for (u32 i = threadIdx.x; i < RANK_DIGITS; i += blockDim.x) histogram[i] = 0;
        __syncthreads();
        const u32 above = from + RANK_DIGIT_BITS;
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            u64 e = entry_key(i);
            u32 a = position[first + i];
            if (key_bits_from(e, above) == prefix_key && position_bits_from(a, above) == prefix_at) atomicAdd(&histogram[key_digit(e, a, from)], 1u);
        }
        __syncthreads();
        // The first warp finds the digit of the want-th matching entry.
        if (threadIdx.x < 32) {
            u32 found, keys_before, in_bin;
            if (digit_of_rank(histogram, want, lane, found, keys_before, in_bin)) {
                chosen_digit = found;
                chosen_before = keys_before;
                chosen_count = in_bin;
            }
        }
        __syncthreads();
        // Every thread reads the same choice; warp 0 writes the next one only after the next
        // round's two barriers.
        want -= chosen_before;
        if (from >= 32) prefix_key |= (u64)chosen_digit << (from - 32);
        else prefix_at |= chosen_digit << from;
        if (chosen_count == want || from == 0) break;
        from -= RANK_DIGIT_BITS;
    }
    // The k: entries whose bits from `from` up are below the prefix, or equal to it (the chosen
    // digit's, all wanted), gathered in no order (a warp's with one atomic).
    if (threadIdx.x == 0) gathered = 0;
    __syncthreads();
    for (u64 base = 0; base < len; base += blockDim.x) {
        const u64 i = base + threadIdx.x;
        bool taken = false;
        u64 e = 0;
        u32 a = 0;
        if (i < len) {
            e = entry_key(i);
            a = position[first + i];
            const u64 high_bits = key_bits_from(e, from);
            taken = high_bits < prefix_key || (high_bits == prefix_key && position_bits_from(a, from) <= prefix_at);
        }
        const u32 takers = __ballot_sync(0xffffffffu, taken);
        u32 slot = 0;
        if (lane == 0 && takers) slot = atomicAdd(&gathered, (u32)__popc(takers));
        slot = __shfl_sync(0xffffffffu, slot, 0) + __popc(takers & ((1u << lane) - 1));
        if (taken && slot < k) {
            key[slot] = e;
            at[slot] = a;
        }
    }
    // After every entry: positions are below 2³² − 1 (a base has fewer rows).
    for (u32 i = k + threadIdx.x; i < room; i += blockDim.x) {
        key[i] = ~0ull;
        at[i] = 0xffffffffu;
    }
    __syncthreads();
    sort_by_key_and_position(room, key, at);
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        out_distance[(u64)q * k + i] = from_total_order_key(key[i]);
        out_position[(u64)q * k + i] = at[i];
    }
}
