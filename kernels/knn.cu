// Exact kNN as a range query with a radius per query (the GPU backend's kNN, src/backend/gpu.rs).
//
// knn_sample_distances and knn_sample_radius give each query candidate radii from a sample of the
// base: its f32 distances to `sample_len` ≤ SAMPLE base rows (stored dimension-major:
// `sf[d·sample_len + i]`), sorted, and radii[q·LEVELS + j] = the
// (rank·4^j)-th smallest (+∞ once that rank is beyond the sample). brute_join then counts, per
// query, the base rows within its radius (f32 filter with the proved margins, exact f64 check);
// a query with fewer than k moves to its next level. A radius with at least k base rows within
// it bounds the k-th smallest distance, so every true neighbour is among the rows written, whose
// exact distances the host ranks (ties by base position). The sample only decides how many
// candidates there are (about rank·n/sample_len), never which neighbours are returned.
#include "common.cuh"

#define SAMPLE 4096
#define LEVELS 4

// Bitonic sort of `size` (a power of two) shared-memory entries by the block: `exchange(i, j,
// ascending)` orders entries i < j (ascending or not) and is called for each pair of a step by one
// thread; every step ends with __syncthreads, so the block must call this together.
template <class Exchange>
__device__ __forceinline__ void bitonic_sort(u32 size, Exchange exchange) {
    for (u32 width = 2; width <= size; width <<= 1) {
        for (u32 stride = width >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < size; i += blockDim.x) {
                u32 j = i ^ stride;
                if (j > i) exchange(i, j, (i & width) == 0);
            }
            __syncthreads();
        }
    }
}

// knn_sample_distances: the distances of a group of SAMPLE_QUERIES queries (blockIdx.x's, of
// [query_begin, query_end)) to 256 sample rows (blockIdx.y's, one per thread), each sample value
// read once for the whole group, in f32 from the filter rows: the queries' as uploaded (row-major,
// TF32-rounded when the tensor cores filter), the sample's in the same filter space less the same
// origin (dimension-major). A radius only decides how many candidates the count pass finds, and
// any radius is correct: that pass tests every base row exactly against it, and a query with
// fewer than k moves to its next level. So the sample needs no exact distances (in f64, at an
// add, a multiply and an add per term, they took 17.6 ms of a 10k × 60k × 784 kNN, NOTES.md v34).
// L2, L1 and L∞ are the filter rows' own (a common origin cancels); cosine is half the squared
// L2 distance of unit vectors (with or without an origin); the inner product's origin is 0.
// Written to distances[(q − query_begin)·SAMPLE + i]; NaN as +∞, which sorts last.
#define SAMPLE_QUERIES 16

extern "C" __global__ void __launch_bounds__(256) knn_sample_distances(JoinParams p, u32 query_begin, u32 query_end,
        const float* qf, const float* sf, u32 sample_len, double* distances) {
    u32 i = blockIdx.y * blockDim.x + threadIdx.x;
    u32 first = query_begin + blockIdx.x * SAMPLE_QUERIES;
    if (i >= sample_len || first >= query_end) return;
    u32 count = min((u32)SAMPLE_QUERIES, query_end - first);
    // A group short of SAMPLE_QUERIES repeats its last query (computed, not written).
    const float* x[SAMPLE_QUERIES];
    float acc[SAMPLE_QUERIES];
#pragma unroll
    for (u32 q = 0; q < SAMPLE_QUERIES; ++q) {
        x[q] = qf + (u64)(first + min(q, count - 1)) * p.dim;
        acc[q] = 0.0f;
    }
    const float* s = sf + i;
    switch (p.metric) {
    case METRIC_L2:
    case METRIC_L2SQ:
    case METRIC_COSINE:
        for (u32 d = 0; d < p.dim; ++d) {
            float v = s[(u64)d * sample_len];
#pragma unroll
            for (u32 q = 0; q < SAMPLE_QUERIES; ++q) {
                float t = x[q][d] - v;
                acc[q] = acc[q] + t * t;
            }
        }
        break;
    case METRIC_INNER_PRODUCT:
        for (u32 d = 0; d < p.dim; ++d) {
            float v = s[(u64)d * sample_len];
#pragma unroll
            for (u32 q = 0; q < SAMPLE_QUERIES; ++q) acc[q] = acc[q] + x[q][d] * v;
        }
        break;
    case METRIC_L1:
        for (u32 d = 0; d < p.dim; ++d) {
            float v = s[(u64)d * sample_len];
#pragma unroll
            for (u32 q = 0; q < SAMPLE_QUERIES; ++q) acc[q] = acc[q] + fabsf(x[q][d] - v);
        }
        break;
    default:
        for (u32 d = 0; d < p.dim; ++d) {
            float v = s[(u64)d * sample_len];
#pragma unroll
            for (u32 q = 0; q < SAMPLE_QUERIES; ++q) acc[q] = fmaxf(acc[q], fabsf(x[q][d] - v));
        }
        break;
    }
#pragma unroll
    for (u32 q = 0; q < SAMPLE_QUERIES; ++q) {
        if (q >= count) break;
        double v = acc[q];
        if (p.metric == METRIC_L2) v = sqrt(v);
        else if (p.metric == METRIC_COSINE) v = 0.5 * v;
        else if (p.metric == METRIC_INNER_PRODUCT) v = -v;
        distances[(u64)(first + q - query_begin) * SAMPLE + i] = isnan(v) ? F64_INFINITY : v;
    }
}

// knn_sample_radius: one block per query of [query_begin, query_begin + gridDim.x), its row of
// `distances` (knn_sample_distances of the same query_begin) sorted in shared memory.
extern "C" __global__ void __launch_bounds__(256) knn_sample_radius(u32 query_begin, const double* distances, u32 sample_len, u32 rank,
        double* radii) {
    __shared__ double d[SAMPLE];
    u32 q = query_begin + blockIdx.x;
    const double* row = distances + (u64)blockIdx.x * SAMPLE;
    for (u32 i = threadIdx.x; i < SAMPLE; i += blockDim.x) d[i] = i < sample_len ? row[i] : F64_INFINITY;
    __syncthreads();
    bitonic_sort(SAMPLE, [&](u32 i, u32 j, bool ascending) {
        double a = d[i], b = d[j];
        if ((a > b) == ascending) {
            d[i] = b;
            d[j] = a;
        }
    });
    if (threadIdx.x < LEVELS) {
        u64 r = (u64)rank << (2 * threadIdx.x);
        radii[(u64)q * LEVELS + threadIdx.x] = r <= sample_len ? d[r - 1] : F64_INFINITY;
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

extern "C" __global__ void __launch_bounds__(256) knn_rank_slots(u32 capacity, u32 k, const u32* slot_len,
        const double* distance, const u32* position, double* out_distance, u32* out_position) {
    __shared__ u64 key[RANK_SLOTS];
    __shared__ u32 at[RANK_SLOTS];
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
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        out_distance[(u64)q * k + i] = from_total_order_key(key[i]);
        out_position[(u64)q * k + i] = at[i];
    }
}

// Fused exact kNN for small k at low d (knn_fused): distances and the k-selection in one pass, no
// radius, no candidate list. Each thread is one query against a contiguous chunk of the base
// (blockIdx.y: the chunk), read through shared memory in tiles; it keeps its chunk's k nearest
// rows (exact f64 distance, base position) sorted in registers. A base row is tested in f32 first,
// against the filter limit of the current k-th distance D: `score_threshold(D)` of the host
// (src/backend/cpu.rs), with the dot-product margins of the SIMT kernels (filter_passes). That
// limit passes every row whose exact distance is ≤ D (the proof of GemmSide, as for a range query
// of radius D), and only such a row can enter the k nearest, so no neighbour is lost; the rows
// that pass get their exact distance and enter when (distance, position) is below the k-th. While
// fewer than k rows are held, D = +∞ and every row passes. The host merges the chunks' lists.
#define FUSED_QUERIES 128
#define FUSED_TILE 256
#define FUSED_ROWS 4

// The f32 filter limit of an exact distance bound `kth` (the host's score_threshold, rounded up
// the same way: the smallest f32 ≥ the f64 value).
__device__ __forceinline__ float fused_limit(const JoinParams& p, double kth) {
    if (kth == F64_INFINITY) return __int_as_float(0x7f800000);
    double t = p.metric == METRIC_L2 ? kth * kth * (1.0 + 1e-9) : p.metric == METRIC_COSINE ? 2.0 * kth : kth;
    return __double2float_ru(t);
}

// (d, t) sorts before (e, u): by distance, then by base position (the host's order).
__device__ __forceinline__ bool nearer(double d, u32 t, double e, u32 u) {
    return d < e || (d == e && t < u);
}

// K ≥ k list entries, ascending; the first K − k are −∞ placeholders that nothing displaces, so the
// k-th nearest is always entry K − 1 (a fixed register, whatever k is).
template <u32 DIM, u32 K>
__device__ __forceinline__ void knn_fused_rows(const JoinParams& p, u32 k, u32 nq, u32 n, u32 chunk,
        const float* qf, const float* bf, const double* qx, const double* bx, const double* qnorm, const double* bnorm,
        const float* qfnorm, const float* bfnorm, const float* qfsq, const float* bfsq,
        double* out_distance, u32* out_position, u64* counters, float* tile, float* tile_norm, float* tile_sq) {
    const bool gemm = p.filter == FILTER_GEMM_L2;
    u32 q = blockIdx.x * FUSED_QUERIES + threadIdx.x;
    bool active = q < nq;
    u32 begin = blockIdx.y * chunk;
    u32 end = min(n, begin + chunk);
    float x[DIM];
    if (active) {
        load_row<DIM>(qf, q, x);
    } else {
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) x[i] = 0.0f;
    }
    float x_norm = active ? qfnorm[q] : 0.0f;
    float x_sq = active && gemm ? qfsq[q] : 0.0f;
    double qn = active && p.metric == METRIC_COSINE ? qnorm[q] : 0.0;
    double best[K];
    u32 at[K];
#pragma unroll
    for (u32 i = 0; i < K; ++i) {
        best[i] = i + k < K ? -F64_INFINITY : F64_INFINITY;
        at[i] = i + k < K ? 0u : 0xffffffffu;
    }
    float limit = fused_limit(p, F64_INFINITY);
    u32 exact_checks = 0;
    for (u32 t0 = begin; t0 < end; t0 += FUSED_TILE) {
        u32 rows = min(FUSED_TILE, end - t0);
        __syncthreads();
        for (u32 i = threadIdx.x; i < rows * DIM; i += blockDim.x) tile[i] = bf[(u64)t0 * DIM + i];
        for (u32 i = threadIdx.x; i < rows; i += blockDim.x) {
            tile_norm[i] = bfnorm[t0 + i];
            tile_sq[i] = gemm ? bfsq[t0 + i] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        // FUSED_ROWS rows at a time, each with its own accumulator: the dot products are chains of
        // dependent additions, and at this kernel's occupancy one chain at a time left the
        // schedulers waiting on them. Each row's dot product is still summed in dimension order,
        // the operations of fixed_filter_score's dot branch, so the proved margins hold.
        for (u32 j = 0; j < rows; j += FUSED_ROWS) {
            float dot[FUSED_ROWS];
#pragma unroll
            for (u32 r = 0; r < FUSED_ROWS; ++r) dot[r] = 0.0f;
#pragma unroll
            for (u32 i = 0; i < DIM; ++i) {
#pragma unroll
                for (u32 r = 0; r < FUSED_ROWS; ++r) dot[r] = dot[r] + x[i] * tile[(j + r) * DIM + i];
            }
#pragma unroll
            for (u32 r = 0; r < FUSED_ROWS; ++r) {
                if (j + r >= rows) break;
                float value = -dot[r];
                float score = gemm ? x_sq + tile_sq[j + r] + 2.0f * value : value;
                if (!filter_passes(p, score, x_norm, tile_norm[j + r], limit)) continue;
                u32 t = t0 + j + r;
                double bn = p.metric == METRIC_COSINE ? bnorm[t] : 0.0;
                double d = exact_distance(p, qx + (u64)q * p.dim, bx + (u64)t * p.dim, qn, bn);
                ++exact_checks;
                if (isnan(d)) {
                    counters[0] = 1;  // the host's total order puts NaN last: the radius path decides
                    continue;
                }
                if (!nearer(d, t, best[K - 1], at[K - 1])) continue;
                // Insertion from the top, in registers: each entry moves up or takes the new row.
#pragma unroll
                for (u32 i = K - 1; i > 0; --i) {
                    if (nearer(d, t, best[i - 1], at[i - 1])) {
                        best[i] = best[i - 1];
                        at[i] = at[i - 1];
                    } else if (nearer(d, t, best[i], at[i])) {
                        best[i] = d;
                        at[i] = t;
                    }
                }
                if (nearer(d, t, best[0], at[0])) {
                    best[0] = d;
                    at[0] = t;
                }
                limit = fused_limit(p, best[K - 1]);
            }
        }
    }
    if (!active) return;
    atomicAdd(&counters[1], (u64)exact_checks);
    // The chunk's list: k entries per (query, chunk), nearest first; positions 0xffffffff are
    // empty (a chunk of fewer than k rows).
    u64 out = ((u64)q * gridDim.y + blockIdx.y) * k;
#pragma unroll
    for (u32 i = 0; i < K; ++i) {
        if (i + k >= K) {
            out_distance[out + i + k - K] = best[i];
            out_position[out + i + k - K] = at[i];
        }
    }
}

#define KNN_FUSED_PARAMS JoinParams p, u32 k, u32 nq, u32 n, u32 chunk, \
        const float* qf, const float* bf, const double* qx, const double* bx, const double* qnorm, const double* bnorm, \
        const float* qfnorm, const float* bfnorm, const float* qfsq, const float* bfsq, \
        double* out_distance, u32* out_position, u64* counters
#define KNN_FUSED_ARGS p, k, nq, n, chunk, qf, bf, qx, bx, qnorm, bnorm, qfnorm, bfnorm, qfsq, bfsq, out_distance, out_position, counters

// knn_fused for lists of K entries (k ≤ K) at the dimensions it is compiled for (FUSED_DIMS in
// src/gpu/launch.rs): one block of FUSED_QUERIES queries per blockIdx.x, one base chunk per
// blockIdx.y. One kernel per K, so that k ≤ 16 does not run with the registers of 32 entries.
template <u32 K>
__device__ __forceinline__ void knn_fused_dims(KNN_FUSED_PARAMS) {
    __shared__ __align__(16) float tile[FUSED_TILE * 32];
    __shared__ float tile_norm[FUSED_TILE];
    __shared__ float tile_sq[FUSED_TILE];
    switch (p.dim) {
    case 2: knn_fused_rows<2, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    case 3: knn_fused_rows<3, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    case 4: knn_fused_rows<4, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    case 8: knn_fused_rows<8, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    case 16: knn_fused_rows<16, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    case 32: knn_fused_rows<32, K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq); break;
    default: break;
    }
}

extern "C" __global__ void __launch_bounds__(FUSED_QUERIES) knn_fused_16(KNN_FUSED_PARAMS) { knn_fused_dims<16>(KNN_FUSED_ARGS); }
extern "C" __global__ void __launch_bounds__(FUSED_QUERIES) knn_fused_32(KNN_FUSED_PARAMS) { knn_fused_dims<32>(KNN_FUSED_ARGS); }
#undef KNN_FUSED_ARGS
