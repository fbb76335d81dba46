// The filter rows and their packings for the tensor-core kernels (pack_rows.cuh), and kNN's
// settle step after a scores pass (knn_settle.cuh): small kernels that grid joins, brute force
// and kNN all launch, a module of their own so that no query waits for brute_join.cu's tiles to
// compile on a machine's first query.
#include "common.cuh"
#include "join_pairs.cuh"
#include "brute_join.cuh"
#include "pack_rows.cuh"
#include "tc_join.cuh"
#include "knn_settle.cuh"
