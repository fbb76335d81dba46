// Brute force on CUDA cores (brute_join). The filter rows, their packings and kNN's settle step
// are rows.cu, the tensor-core joins tc_join.cu, kNN's sample keys tc_sample_keys.cu: separate
// modules compile concurrently on a machine's first query (one module held them all and took 7 s
// of NVRTC), and a query waits only for those it launches.
#include "common.cuh"
#include "join_pairs.cuh"
#include "brute_join.cuh"

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
