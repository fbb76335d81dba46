// The ε-grid join (GPU-Join, Gowanlock & Karsin, §3.2.1) of 2 to 4 dimensions: a module of its
// own, so that it compiles concurrently with the other join modules on a machine's first query,
// and a low-dimensional join (most grid joins) waits only for its three instances; the other
// dimensions are grid_join_wide.cu.
#include "common.cuh"
#include "join_pairs.cuh"
#include "grid_join.cuh"

// At most 64 registers (4 blocks of 256 per SM): the sortidu window took it to 68 and 3 blocks, and
// P4's kernel from 231 to 250 ms; capped, it needs no spills (scripts/kernel-check.py). Launched
// for 2, 3 and 4 dimensions only (src/cuda/launch/join.rs, grid_kernel).
extern "C" __global__ void __launch_bounds__(256, 4) grid_join(GRID_JOIN_PARAMS) {
    switch (p.dim) {
    case 2: grid_join_rows<2>(GRID_JOIN_ARGS); break;
    case 3: grid_join_rows<3>(GRID_JOIN_ARGS); break;
    default: grid_join_rows<4>(GRID_JOIN_ARGS); break;
    }
}
