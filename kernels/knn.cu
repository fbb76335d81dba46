// Exact kNN as a range query with a radius per query (the GPU backend's kNN, src/backend/gpu.rs).
//
// knn_sample_radius gives each query candidate radii from a sample of the base: the exact f64
// distances to `sample_len` ≤ SAMPLE base rows (stored dimension-major: `sx[d·sample_len + i]`), sorted, and radii[q·LEVELS + j] = the
// (rank·4^j)-th smallest (+∞ once that rank is beyond the sample). brute_join then counts, per
// query, the base rows within its radius (f32 filter with the proved margins, exact f64 check);
// a query with fewer than k moves to its next level. A radius with at least k base rows within
// it bounds the k-th smallest distance, so every true neighbour is among the rows written, whose
// exact distances the host ranks (ties by base position). The sample only decides how many
// candidates there are (about rank·n/sample_len), never which neighbours are returned.
#include "common.cuh"

#define SAMPLE 4096
#define LEVELS 4

// One block per query of [query_begin, query_begin + gridDim.x).
extern "C" __global__ void __launch_bounds__(256) knn_sample_radius(JoinParams p, u32 query_begin,
        const double* qx, const double* qnorm, const double* sx, const double* snorm, u32 sample_len, u32 rank,
        double* radii) {
    __shared__ double d[SAMPLE];
    u32 q = query_begin + blockIdx.x;
    const double* x = qx + (u64)q * p.dim;
    double nq = p.metric == METRIC_COSINE ? qnorm[q] : 0.0;
    for (u32 i = threadIdx.x; i < SAMPLE; i += blockDim.x) {
        if (i < sample_len) {
            double ns = p.metric == METRIC_COSINE ? snorm[i] : 0.0;
            double v = exact_distance(p, x, sx + i, nq, ns, sample_len);
            // NaN (cosine of a zero vector) sorts last, like the host's total order.
            d[i] = isnan(v) ? F64_INFINITY : v;
        } else {
            d[i] = F64_INFINITY;
        }
    }
    __syncthreads();
    // Bitonic sort, ascending, in shared memory.
    for (u32 size = 2; size <= SAMPLE; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = threadIdx.x; i < SAMPLE; i += blockDim.x) {
                u32 j = i ^ stride;
                if (j > i) {
                    bool ascending = (i & size) == 0;
                    double a = d[i], b = d[j];
                    if ((a > b) == ascending) {
                        d[i] = b;
                        d[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    if (threadIdx.x < LEVELS) {
        u64 r = (u64)rank << (2 * threadIdx.x);
        radii[(u64)q * LEVELS + threadIdx.x] = r <= sample_len ? d[r - 1] : F64_INFINITY;
    }
}
