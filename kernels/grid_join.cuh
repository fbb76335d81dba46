// The grid join (Gowanlock & Karsin, GPU-Join): a thread per left slot over its cell's neighbour
// cells, only the ±r window of the sort dimension scanned (sortidu). Included by grid_join.cu.

// Index of the non-empty right cell with linear id `id`, or -1.
__device__ __forceinline__ long long find_cell(const JoinParams& p, const u64* cell_ids, const u32* cell_table, u64 id) {
    if (p.dense) {
        u32 c = cell_table[id];
        return c == 0xffffffffu ? -1 : (long long)c;
    }
    u32 lo = 0, hi = p.right_cells;
    while (lo < hi) {
        u32 mid = (lo + hi) >> 1;
        if (cell_ids[mid] < id) lo = mid + 1; else hi = mid;
    }
    return (lo < p.right_cells && cell_ids[lo] == id) ? (long long)lo : -1;
}

// Tests left slot `s` against right slots [begin, end); counts or writes the qualifying pairs.
// DIM > 0: the dimension, with `x` the left row in registers (loaded once per left slot) and each
// right row read in vector loads; the general path (DIM = 0) reads both rows per candidate, twice
// the load instructions per dimension (P4's grid kernel was bound by them: docs/design.md#gpu-grid).
template <u32 DIM>
__device__ __forceinline__ void scan_range(const JoinParams& p, u32 s, u32 begin, u32 end, const float (&x)[DIM ? DIM : 1],
        const float* lf, const float* rf, const double* lx, const double* rx,
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm,
        const u32* left_order, const u32* right_order,
        u32& found, int pass, u64 offset, u32* out_left, u32* out_right, double* out_distance,
        u64* collected, u64 capacity) {
    for (u32 t = begin; t < end; ++t) {
        float score;
        if constexpr (DIM > 0) {
            float y[DIM];
            load_row<DIM>(rf, t, y);
            score = fixed_filter_score<DIM>(p.filter, x, y);
        } else {
            score = filter_score(p, lf + (u64)s * p.dim, rf + (u64)t * p.dim, p.limit);
        }
        float nx = p.filter == FILTER_NEG_DOT ? lfnorm[s] : 0.0f;
        float ny = p.filter == FILTER_NEG_DOT ? rfnorm[t] : 0.0f;
        if (!filter_passes(p, score, nx, ny, p.limit)) continue;
        double d = exact_distance(p, lx + (u64)s * p.dim, rx + (u64)t * p.dim, cosine_norm(p, lnorm, s), cosine_norm(p, rnorm, t));
        if (d <= p.threshold) {
            if (pass == PASS_WRITE) {
                u64 at = offset + found;
                out_left[at] = left_order[s];
                out_right[at] = right_order[t];
                out_distance[at] = d;
            } else if (capacity) {
                collect_pair(collected, capacity, left_order[s], right_order[t], d, out_left, out_right, out_distance);
            }
            ++found;
        }
    }
}

#define GRID_JOIN_PARAMS                                                                                          \
    JoinParams p, u32 slot_begin, u32 slot_end, const float* lf, const float* rf, const double* lx, const double* rx, \
        const double* lnorm, const double* rnorm, const float* lfnorm, const float* rfnorm, const u32* left_order,   \
        const u32* right_order, const u64* left_slot_cell, const u64* right_cell_ids, const u32* right_cell_start,  \
        const u32* cell_table, const double* left_keys, const double* right_keys, u32* counts, const u64* offsets, u32* out_left, u32* out_right, double* out_distance, \
        u64* collected, u64 capacity, int pass
#define GRID_JOIN_ARGS                                                                                              \
    p, slot_begin, slot_end, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order, right_order, left_slot_cell, \
        right_cell_ids, right_cell_start, cell_table, left_keys, right_keys, counts, offsets, out_left, out_right, out_distance, collected, \
        capacity, pass

// Every GRID_WORK_SAMPLE-th left slot's work in grid_join_work (GRID_WORK_SAMPLE in
// src/cuda/launch/join.rs).
#define GRID_WORK_SAMPLE 64

// grid_join for dimension DIM (0: any); WORK: grid_join_work, which compares nothing and counts,
// for every GRID_WORK_SAMPLE-th slot from slot_begin, the right slots grid_join would scan for it
// plus one for each neighbour cell it would look up, into counts[(s − slot_begin) / sample].
template <u32 DIM, bool WORK = false>
__device__ __forceinline__ void grid_join_rows(GRID_JOIN_PARAMS) {
    u64 at = (u64)slot_begin + (u64)(blockIdx.x * blockDim.x + threadIdx.x) * (WORK ? GRID_WORK_SAMPLE : 1);
    if (at >= slot_end) return;
    u32 s = (u32)at;
    float x[DIM ? DIM : 1];
    if constexpr (DIM > 0) load_row<DIM>(lf, s, x);
    u64 id = left_slot_cell[s];
    u64 lo[MAX_GRID_DIMS], hi[MAX_GRID_DIMS], cur[MAX_GRID_DIMS];
    // A self-join finds each pair of two neighbouring cells from one of them, the cell that owns
    // the pair of cells: the one with the smaller linear id when the cells differ in an even number
    // of dimensions, the one with the larger id when odd. The rule is antisymmetric (the parity is
    // the same seen from either cell), so every pair is found exactly once; unlike "the smaller id"
    // alone it gives every cell about half of its neighbours, at the grid's edges too, so equal
    // counts of slots are equal work (docs/design.md#multi-gpu). `at_low` marks the dimensions
    // where this cell lies on the grid's lower edge (its coordinate is lo); `differ` those where
    // the neighbour `cur` differs from this cell.
    u32 at_low = 0;
    for (u32 j = 0; j < p.k; ++j) {
        u64 c = (id / p.strides[j]) % p.cells[j];
        lo[j] = c > 0 ? c - 1 : 0;
        hi[j] = c + 1 < p.cells[j] ? c + 1 : c;
        cur[j] = lo[j];
        if (c == 0) at_low |= 1u << j;
    }
    u32 differ = ~at_low & ((1u << p.k) - 1);  // k ≤ MAX_GRID_DIMS
    u64 offset = pass == PASS_WRITE ? offsets[s - slot_begin] : 0;
    u32 found = 0;
    for (;;) {
        u64 nid = 0;
        for (u32 j = 0; j < p.k; ++j) nid += cur[j] * p.strides[j];
        if (!p.self_join || nid == id || ((nid > id) != (bool)(__popc(differ) & 1))) {
            if constexpr (WORK) ++found;
            long long c = find_cell(p, right_cell_ids, cell_table, nid);
            if (c >= 0) {
                u32 begin = right_cell_start[c], end = right_cell_start[c + 1];
                if (p.windowed) {
                    // sortidu: a cell's slots are sorted by the sort dimension's key, and partners
                    // differ by at most the window there; the host's partition points (grid_join
                    // in src/backend/plan/bounds.rs, whose proof covers the rounding), by the same f64
                    // subtractions: the first slot with key − u ≥ −window, then the first beyond
                    // it with key − u > window.
                    double u = left_keys[s];
                    u32 a = begin, b = end;
                    while (a < b) {
                        u32 m = a + (b - a) / 2;
                        if (right_keys[m] - u < -p.window) a = m + 1; else b = m;
                    }
                    begin = a;
                    b = end;
                    while (a < b) {
                        u32 m = a + (b - a) / 2;
                        if (right_keys[m] - u <= p.window) a = m + 1; else b = m;
                    }
                    end = a;
                }
                if (p.self_join && nid == id) begin = max(begin, s + 1);  // later slots of its own cell
                if constexpr (WORK) {
                    found += end > begin ? end - begin : 0;
                } else {
                    scan_range<DIM>(p, s, begin, end, x, lf, rf, lx, rx, lnorm, rnorm, lfnorm, rfnorm, left_order,
                                    right_order, found, pass, offset, out_left, out_right, out_distance, collected,
                                    capacity);
                }
            }
        }
        u32 j = 0;
        while (j < p.k && cur[j] == hi[j]) {
            cur[j] = lo[j];
            differ = (differ & ~(1u << j)) | (~at_low & (1u << j));
            ++j;
        }
        if (j == p.k) break;
        ++cur[j];
        u64 own = lo[j] + ((at_low >> j) & 1u ? 0 : 1);
        differ = cur[j] != own ? differ | (1u << j) : differ & ~(1u << j);
    }
    if (WORK) counts[(s - slot_begin) / GRID_WORK_SAMPLE] = found;
    else if (pass != PASS_WRITE) counts[s - slot_begin] = found;
}
