// The directory join (Böhm, Noll, Plant and Zherdin, "Index-supported Similarity Join on Graphics
// Processors", Fig. 5 indexedJoinKernel): one thread per left slot; the slots of a block of
// DIRECTORY_BLOCK (src/index/directory.rs) share one bounding box, widened by the coordinate
// bound, and walk the quantile directory of the right side with it, so every branch of the walk
// is the same across the block and its warps stay converged; every visited leaf's right slots are
// scanned as the grid join scans a cell (scan_range: the f32 filter, then the exact f64 check),
// all threads of a warp reading the same right row at once. Passes, outputs and the collection of
// pairs as in join_pairs.cuh.
#include "common.cuh"
#include "join_pairs.cuh"
#include "grid_join.cuh"

// DIRECTORY_BLOCK and MAX_LEVELS of src/index/directory.rs.
#define DIRECTORY_BLOCK 64u
#define MAX_DIRECTORY_LEVELS 3

#define DIRECTORY_JOIN_PARAMS                                                                                     \
    JoinParams p, u32 slot_begin, u32 slot_end, const float* lf, const float* rf, const double* lx, const double* rx, \
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm, const u32* left_order,   \
        const u32* right_order, const double* block_lo, const double* block_hi, const double* node_lo,              \
        const double* node_hi, const u32* leaf_start, u32* counts, const u64* offsets, u32* out_left,               \
        u32* out_right, double* out_distance, u64* collected, u64 capacity, int pass

// Whether node `node`'s box meets the block's box widened by the coordinate bound: skipped only
// where a rounded difference exceeds p.box_radius = r·(1 + 2⁻²⁰) (a NaN difference never skips),
// the test of Directory::walk in src/index/directory.rs, whose docs prove it loses no pair.
__device__ __forceinline__ bool node_meets(const JoinParams& p, const double* node_lo, const double* node_hi, u64 node,
                                           const double* lo, const double* hi) {
    for (u32 j = 0; j < p.dim; ++j) {
        if (node_lo[node * p.dim + j] - hi[j] > p.box_radius) return false;
        if (lo[j] - node_hi[node * p.dim + j] > p.box_radius) return false;
    }
    return true;
}

template <u32 DIM>
__device__ __forceinline__ void directory_join_rows(DIRECTORY_JOIN_PARAMS) {
    u64 at = (u64)slot_begin + (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= slot_end) return;
    u32 s = (u32)at;
    float x[DIM ? DIM : 1];
    if constexpr (DIM > 0) load_row<DIM>(lf, s, x);
    u32 block = s / DIRECTORY_BLOCK;
    const double* lo = block_lo + (u64)block * p.dim;
    const double* hi = block_hi + (u64)block * p.dim;
    // A self-join's block finds its pairs with later slots only: nodes whose slots all lie before
    // the block's first slot + 1 hold none.
    u32 from = p.self_join ? block * DIRECTORY_BLOCK + 1 : 0;
    u32 fanout = p.fanout, levels = p.levels;
    // first[l]: index of level l + 1's first node among all nodes; span[l]: leaves under one node
    // of level l + 1.
    u64 first[MAX_DIRECTORY_LEVELS], span[MAX_DIRECTORY_LEVELS];
    {
        u64 count = 1, offset = 0;
        for (u32 l = 0; l < levels; ++l) {
            count *= fanout;
            first[l] = offset;
            offset += count;
        }
        u64 leaves = count;
        for (u32 l = 0; l < levels; ++l) {
            leaves /= fanout;
            span[l] = leaves;
        }
    }
    u64 offset = pass == PASS_WRITE ? offsets[s - slot_begin] : 0;
    u32 found = 0;
    // Depth-first over the implicit fanout-ary tree: child[l] is the next child to test at depth
    // l, parent[l] the node (within its level) whose children those are.
    u32 child[MAX_DIRECTORY_LEVELS];
    u64 parent[MAX_DIRECTORY_LEVELS];
    int depth = 0;
    child[0] = 0;
    parent[0] = 0;
    for (;;) {
        if (child[depth] == fanout) {
            if (depth == 0) break;
            --depth;
            ++child[depth];
            continue;
        }
        u64 j = parent[depth] * fanout + child[depth];
        u32 begin = leaf_start[j * span[depth]], end = leaf_start[(j + 1) * span[depth]];
        bool visit = end > from && begin < end && node_meets(p, node_lo, node_hi, first[depth] + j, lo, hi);
        if (visit && depth + 1 < (int)levels) {
            ++depth;
            parent[depth] = j;
            child[depth] = 0;
            continue;
        }
        if (visit) {
            if (p.self_join) begin = max(begin, s + 1);
            scan_range<DIM>(p, s, begin, end, x, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order, right_order,
                            found, pass, offset, out_left, out_right, out_distance, collected, capacity);
        }
        ++child[depth];
    }
    if (pass != PASS_WRITE) counts[s - slot_begin] = found;
}

// Rows of 2, 3, 4, 8 and 16 values in registers, the general path for the rest; at most 64
// registers, as the grid join.
extern "C" __global__ void __launch_bounds__(256, 4) directory_join(DIRECTORY_JOIN_PARAMS) {
#define DIRECTORY_JOIN_ARGS                                                                                        \
    p, slot_begin, slot_end, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order, right_order, block_lo,      \
        block_hi, node_lo, node_hi, leaf_start, counts, offsets, out_left, out_right, out_distance, collected,     \
        capacity, pass
    switch (p.dim) {
    case 2: directory_join_rows<2>(DIRECTORY_JOIN_ARGS); break;
    case 3: directory_join_rows<3>(DIRECTORY_JOIN_ARGS); break;
    case 4: directory_join_rows<4>(DIRECTORY_JOIN_ARGS); break;
    case 8: directory_join_rows<8>(DIRECTORY_JOIN_ARGS); break;
    case 16: directory_join_rows<16>(DIRECTORY_JOIN_ARGS); break;
    default: directory_join_rows<0>(DIRECTORY_JOIN_ARGS); break;
    }
}
