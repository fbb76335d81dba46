// The ε-grid join (GPU-Join, Gowanlock & Karsin, §3.2.1): one module of its own, so that it
// compiles concurrently with the other join modules on a machine's first query.
#include "common.cuh"
#include "join_pairs.cuh"
#include "grid_join.cuh"
