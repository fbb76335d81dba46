// Fused exact kNN for small k at low d, compiled per (list size, dimension) on first use: the host
// defines FUSED_K (16 or 32) and FUSED_DIM (1..=32) for NVRTC (src/gpu/device.rs,
// `specialized_function`). Compiled as one module with every (K, DIM) instance it took ptxas
// 25–27 s for sm_90, the first kNN on a new machine (NOTES.md v33–v35); an instance alone takes
// about two seconds, and only the instances a workload uses are compiled.
#include "common.cuh"

#ifndef FUSED_K
#error "FUSED_K (the list size, 16 or 32) is defined by the host"
#endif
#ifndef FUSED_DIM
#error "FUSED_DIM (the dimension, 1 to 32) is defined by the host"
#endif

// knn_fused: distances and the k-selection in one pass, no
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

// knn_fused for lists of FUSED_K entries (k ≤ FUSED_K) at dimension FUSED_DIM: one block of
// FUSED_QUERIES queries per blockIdx.x, one base chunk per blockIdx.y. The base tile holds exactly
// FUSED_TILE rows of FUSED_DIM values, so a small dimension leaves shared memory for more blocks.
extern "C" __global__ void __launch_bounds__(FUSED_QUERIES) knn_fused(KNN_FUSED_PARAMS) {
    __shared__ __align__(16) float tile[FUSED_TILE * FUSED_DIM];
    __shared__ float tile_norm[FUSED_TILE];
    __shared__ float tile_sq[FUSED_TILE];
    knn_fused_rows<FUSED_DIM, FUSED_K>(KNN_FUSED_ARGS, tile, tile_norm, tile_sq);
}
#undef KNN_FUSED_ARGS
