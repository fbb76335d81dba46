// Brute-force joins on tensor cores (brute_join_tc on f16 rows, brute_join_tc_bytes on byte
// rows): tc_join.cuh's tiles and bounds, wgmma_tma.cuh's Hopper pipeline and tc_join_run.cuh's
// run, with brute_join.cuh's pair helpers.
#include "common.cuh"
#include "join_pairs.cuh"
#include "brute_join.cuh"
#include "tc_join.cuh"
#include "wgmma_tma.cuh"
#include "tc_join_run.cuh"

// Two blocks an SM, so that one block's warps hide the other's latencies. (Under wgmma, one block
// with 255 registers a thread for two sets of accumulators, tile T's epilogue running while tile
// T + 1's wgmma did, took 1.5 times as long: with 8 warps an SM every barrier and epilogue was
// exposed, docs/design.md#gpu-brute.)
extern "C" __global__ void __launch_bounds__(256, 2) brute_join_tc(BRUTE_JOIN_PARAMS, const __grid_constant__ TensorMap left_map,
                                                                   const __grid_constant__ TensorMap right_map) {
    brute_join_tc_run<false>(BRUTE_JOIN_ARGS, left_map, right_map);
}

// brute_join_tc on byte rows (pack_byte_rows), passed in the f32 filter rows' place, with their
// integer squared norms in lfsq's and rfsq's: sm_90a only (the host launches it only there).
extern "C" __global__ void __launch_bounds__(256, 2) brute_join_tc_bytes(BRUTE_JOIN_PARAMS, const __grid_constant__ TensorMap left_map,
                                                                         const __grid_constant__ TensorMap right_map) {
#if TC_WGMMA
    brute_join_tc_run<true>(BRUTE_JOIN_ARGS, left_map, right_map);
#endif
}

