// kNN's sample keys through the tensor-core join's pipeline (tc_join_run.cuh's run with keys in
// place of pairs): a module of its own, loaded by kNN only.
#include "common.cuh"
#include "join_pairs.cuh"
#include "brute_join.cuh"
#include "tc_join.cuh"
#include "wgmma_tma.cuh"
#include "tc_join_run.cuh"

#if TC_WGMMA
// kNN's sample keys on byte rows (knn_sample_radius reads them as knn.cu's other sample kernels
// write theirs), through brute_join_tc_bytes's pipeline: TMA copies and wgmma. knn_sample_distances_tc's
// byte instance, its register-staged loads and mma.sync, waited on its loads (P2: 0.28 ms for
// 8,192 queries, docs/design.md#gpu-knn). Query slots [query_begin, query_end) against the sample's `sample_len` rows
// (sample_byte_rows), each pair's key at keys[(q − query_begin)·SAMPLE + i]; `p` sets the
// dimensions and the run (p.tc_run, no queue), and the maps cover the two sides' byte rows.
extern "C" __global__ void __launch_bounds__(256, 2) knn_sample_keys_bytes(JoinParams p, u32 query_begin, u32 query_end,
        const u32* query_rows, const u32* query_sq, const u32* sample_rows, const u32* sample_sq, u32 sample_len, float* keys,
        const __grid_constant__ TensorMap query_map, const __grid_constant__ TensorMap sample_map) {
    brute_join_tc_run<true, true>(p, query_begin, query_end, 0, sample_len, (const float*)query_rows, (const float*)sample_rows,
                                  nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, (const float*)query_sq,
                                  (const float*)sample_sq, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  0, PASS_COUNT, query_map, sample_map, keys);
}

// kNN's sample keys on f16 rows (knn.cu's knn_sample_distances_tc, which mma.sync devices keep),
// the same way: the queries' and the sample's f16 rows (sample_half_rows) scaled by 2^a, by their
// maps, their f32 squared filter norms where `squared` (else any buffer: the inner product's keys
// read none), `unscale` = 2^−2a.
extern "C" __global__ void __launch_bounds__(256, 2) knn_sample_keys_half(JoinParams p, u32 query_begin, u32 query_end,
        const u32* query_rows, const float* query_sq, const u32* sample_rows, const float* sample_sq, u32 sample_len, float unscale,
        u32 squared, float* keys, const __grid_constant__ TensorMap query_map, const __grid_constant__ TensorMap sample_map) {
    brute_join_tc_run<false, true>(p, query_begin, query_end, 0, sample_len, (const float*)query_rows, (const float*)sample_rows,
                                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, query_sq, sample_sq, nullptr,
                                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, PASS_COUNT, query_map, sample_map,
                                   keys, unscale, squared != 0);
}
#endif
