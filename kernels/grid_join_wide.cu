// The ε-grid join of any other dimension than 2 to 4 (grid_join.cu): rows of 8 and 16 values in
// registers, the general path for the rest, and the work estimate of a divided self-join.
#include "common.cuh"
#include "join_pairs.cuh"
#include "grid_join.cuh"

// At most 64 registers, as grid_join.
extern "C" __global__ void __launch_bounds__(256, 4) grid_join_wide(GRID_JOIN_PARAMS) {
    switch (p.dim) {
    case 8: grid_join_rows<8>(GRID_JOIN_ARGS); break;
    case 16: grid_join_rows<16>(GRID_JOIN_ARGS); break;
    default: grid_join_rows<0>(GRID_JOIN_ARGS); break;
    }
}

// The estimated work of a divided self-join's slots (see grid_join_rows), from which every GPU
// cuts the same ranges of equal work (GPU-Join's entity partitioning by workload): one thread per
// sampled slot, the rows never read.
extern "C" __global__ void __launch_bounds__(256) grid_join_work(GRID_JOIN_PARAMS) {
    grid_join_rows<0, true>(GRID_JOIN_ARGS);
}
