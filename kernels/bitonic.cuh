// The block-wide bitonic sort of shared-memory entries (kNN's ranking of slots, knn.cu, and the
// approximate kNN's candidates, approx.cu).
#pragma once
#include "common.cuh"

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
