// What the ε-join and range-query kernels share (GPU-Join, Gowanlock & Karsin, §3.2.1, with Böhm's
// count-then-write): the passes, their inputs, and the collection of a found pair. Included by
// grid_join.cu, brute_join.cu and tc_join.cu.
//
// Thread mapping (grid_join): one thread per left row ("slot"), `slot_begin + blockIdx.x *
// blockDim.x + threadIdx.x`, over a batch [slot_begin, slot_end); brute_join: see its own comment.
// Each kernel runs as (`pass`)
//   PASS_COUNT, the count pass: counts[slot - slot_begin] = number of result pairs of that slot,
//              and every pair found is also collected (collect_pair): appended at the next free
//              index of out_left / out_right / out_distance, `*collected` counting them all, stored
//              while the index is below `capacity` (0: nothing stored). When the total fits, the
//              pass has produced the whole result and no second pass runs;
//   PASS_WRITE, the write pass (only when the total did not fit): the pairs are written from
//              offsets[slot - slot_begin] (an exclusive prefix sum of the counts, relative to a
//              batch sized to fit) into the same buffers,
// so no output buffer can overflow and no pair is lost or written twice. brute_join_tc also runs
//   PASS_SCORES, kNN's first count pass on f16 rows: each slot keeps the filter scores of the
//              pairs that pass the filter, not their exact distances, and knn_settle_slots then
//              checks exactly only those that can be among the k nearest (see there).
// and grid_join_work the estimated work of sampled slots (PASS_WORK, grid_join.cuh).
//
// Inputs, all in slot order (grid order for the grid kernel, input order for brute force):
//   left_filter / right_filter  f32 filter-space rows (row-major, dim wide)
//   left_exact / right_exact    f64 rows, exactly the stored values (row-major, dim wide)
//   left_norm / right_norm      cosine: Σx² per row (f64); dot-product filters: ‖x̃‖ per row (f32)
//   lfsq / rfsq                 FILTER_GEMM_L2 (brute_join): ‖x̃‖² per row (f32); the grid kernel
//                               always gets a direct filter (FILTER_SQUARED_L2, L1, L∞)
//   left_order / right_order    slot → vector position (what the output reports)
// Each candidate that passes the f32 filter is decided by the exact f64 distance of common.cuh.
// Self-joins visit each unordered pair once: later slots of the same cell, and cells with a larger
// linear id (grid), or right slots after the left slot (brute force).
#define PASS_COUNT 0
#define PASS_WRITE 1
#define PASS_SCORES 2
#define PASS_WORK 3

// The count pass's collection of one found pair (see the top of this file). The lanes of a warp
// that found a pair together reserve their indices with one atomic on the shared total, not one
// each: all of a join's pairs go through this one counter (P3: 5·10⁷). Indices at or beyond
// `capacity` are counted but not stored; the host then runs write passes instead.
__device__ __forceinline__ void collect_pair(u64* collected, u64 capacity, u32 left, u32 right, double dist,
                                             u32* out_left, u32* out_right, double* out_distance) {
    u32 lanes = __activemask();
    u32 lane = threadIdx.x % 32;
    u32 leader = __ffs(lanes) - 1;
    u64 first = 0;
    if (lane == leader) first = atomicAdd(collected, (u64)__popc(lanes));
    u64 at = __shfl_sync(lanes, first, leader) + __popc(lanes & ((1u << lane) - 1));
    if (at < capacity) {
        out_left[at] = left;
        out_right[at] = right;
        out_distance[at] = dist;
    }
}
