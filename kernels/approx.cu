// The Multicurves index on the device: its curves' keys (the build's, below the search) and the
// approximate kNN from it (src/backend/gpu/approx.rs): Teodoro et al.'s search ("Approximate similarity search for online multimedia services on distributed
// CPU–GPU platforms"), one block per query. The index is the host's (src/index/curves.rs): each
// curve's keys ascending and the base position of each, and the base in f32 (unit rows under
// cosine). A query takes `per_curve` entries around its key on every curve (as many before it as
// after, fewer only at a list's ends: the host's `Multicurves::candidates`), drops repeats, and
// ranks the distinct candidates by their whole f32 distance; the best `keep` go back to the host,
// which measures the k best and any within f32 rounding of them exactly in f64. Where the cores
// rank the candidates by a proxy over the principal coordinates first (their memory reads are
// the cost), the device reads every candidate's row: its bandwidth affords it, and no true
// neighbour among the candidates is lost to the proxy.
#include "common.cuh"
#include "bitonic.cuh"

// Threads of a block (8 warps, each measuring candidates with its lanes over dimensions).
#define APPROX_THREADS 256
// Most curves of an index (threads of the first warp search one curve each).
#define APPROX_MAX_CURVES 32

#define NO_POSITION 0xffffffffu
#define F32_INFINITY __int_as_float(0x7f800000)

// Candidates a warp measures at once: their rows' loads are in flight together (one row at a
// time left each lane waiting on one load after another).
#define ROWS_AT_ONCE 4

// One term of the f32 score under FILTER (FILTER_SQUARED_L2, FILTER_L1 or FILTER_LINF).
template <u32 FILTER>
__device__ __forceinline__ float add_term(float s, float t) {
    if (FILTER == FILTER_LINF) return fmaxf(s, fabsf(t));
    if (FILTER == FILTER_L1) return s + fabsf(t);
    return s + t * t;
}

// The f32 scores under FILTER of query `query` against base rows `row[r]` (null: none), summed by
// one warp (every lane returns them). Rows of a multiple of 4 values are read 16 bytes a lane.
template <u32 FILTER>
__device__ __forceinline__ void warp_scores(const float* const (&row)[ROWS_AT_ONCE], const float* query, u32 dim,
                                            u32 lane, float (&s)[ROWS_AT_ONCE]) {
#pragma unroll
    for (u32 r = 0; r < ROWS_AT_ONCE; ++r) s[r] = 0.0f;
    if ((dim & 3) == 0) {
        const float4* q4 = (const float4*)query;
        for (u32 d = lane; d < dim / 4; d += 32) {
            const float4 q = q4[d];
            float4 x[ROWS_AT_ONCE];
#pragma unroll
            for (u32 r = 0; r < ROWS_AT_ONCE; ++r) x[r] = row[r] ? ((const float4*)row[r])[d] : q;
#pragma unroll
            for (u32 r = 0; r < ROWS_AT_ONCE; ++r) {
                s[r] = add_term<FILTER>(s[r], x[r].x - q.x);
                s[r] = add_term<FILTER>(s[r], x[r].y - q.y);
                s[r] = add_term<FILTER>(s[r], x[r].z - q.z);
                s[r] = add_term<FILTER>(s[r], x[r].w - q.w);
            }
        }
    } else {
        for (u32 d = lane; d < dim; d += 32) {
            const float q = query[d];
            float x[ROWS_AT_ONCE];
#pragma unroll
            for (u32 r = 0; r < ROWS_AT_ONCE; ++r) x[r] = row[r] ? row[r][d] : q;
#pragma unroll
            for (u32 r = 0; r < ROWS_AT_ONCE; ++r) s[r] = add_term<FILTER>(s[r], x[r] - q);
        }
    }
#pragma unroll
    for (u32 r = 0; r < ROWS_AT_ONCE; ++r) {
        for (u32 d = 16; d > 0; d >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, s[r], d);
            s[r] = FILTER == FILTER_LINF ? fmaxf(s[r], other) : s[r] + other;
        }
    }
}

// Scores every distinct entry of `ids` (ascending, a repeat after its first occurrence; repeats
// and NO_POSITION get +∞) into `scores`, each warp ROWS_AT_ONCE entries at a time.
template <u32 FILTER>
__device__ __forceinline__ void score_entries(const u32* ids, float* scores, u32 capacity, const float* base, u32 dim,
                                              const float* query) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (u32 first = warp * ROWS_AT_ONCE; first < capacity; first += warps * ROWS_AT_ONCE) {
        const float* row[ROWS_AT_ONCE];
#pragma unroll
        for (u32 r = 0; r < ROWS_AT_ONCE; ++r) {
            const u32 i = first + r;
            const u32 id = i < capacity ? ids[i] : NO_POSITION;
            const bool measured = id != NO_POSITION && (i == 0 || ids[i - 1] != id);
            row[r] = measured ? base + (u64)id * dim : nullptr;
        }
        float s[ROWS_AT_ONCE];
        warp_scores<FILTER>(row, query, dim, lane, s);
#pragma unroll
        for (u32 r = 0; r < ROWS_AT_ONCE; ++r) {
            if (lane == 0 && first + r < capacity) scores[first + r] = row[r] ? s[r] : F32_INFINITY;
        }
    }
}

// Scores entries as score_entries does, under the filter code `filter`.
__device__ __forceinline__ void score_by_filter(u32 filter, const u32* ids, float* scores, u32 count,
                                                const float* base, u32 dim, const float* query) {
    if (filter == FILTER_LINF) score_entries<FILTER_LINF>(ids, scores, count, base, dim, query);
    else if (filter == FILTER_L1) score_entries<FILTER_L1>(ids, scores, count, base, dim, query);
    else score_entries<FILTER_SQUARED_L2>(ids, scores, count, base, dim, query);
}

// Sorts `size` (a power of two) entries of `ids` ascending: a repeat follows its first occurrence.
__device__ __forceinline__ void sort_ids(u32* ids, u32 size) {
    bitonic_sort(size, [&](u32 i, u32 j, bool ascending) {
        const u32 a = ids[i], b = ids[j];
        if ((a > b) == ascending) {
            ids[i] = b;
            ids[j] = a;
        }
    });
}

// Sorts `size` (a power of two) entries ascending by (score, id): the host's order of equal f32
// scores does not matter, as every candidate within rounding of the k-th is measured exactly there.
__device__ __forceinline__ void sort_by_score(u32* ids, float* scores, u32 size) {
    bitonic_sort(size, [&](u32 i, u32 j, bool ascending) {
        const float a = scores[i], b = scores[j];
        const u32 x = ids[i], y = ids[j];
        if ((a > b || (a == b && x > y)) == ascending) {
            scores[i] = b;
            scores[j] = a;
            ids[i] = y;
            ids[j] = x;
        }
    });
}

// approx_knn: queries [0, query_count) of `queries` (`dim` f32 values each) with their keys on
// every curve (`query_keys[q·curves + c]`); the index's `curves` lists of `n` keys (`keys[c·n + i]`,
// ascending) and positions (`positions[c·n + i]`), and the base rows (`base`, `dim` values each).
// `capacity`, a power of two ≥ curves·min(per_curve, n), is the entries of dynamic shared memory
// (a position and a score each). Writes each query's `keep` best (score, position), ascending by
// score then position, to out_scores/out_positions[q·keep ..]; +∞ and NO_POSITION past its
// distinct candidates.
extern "C" __global__ void __launch_bounds__(APPROX_THREADS) approx_knn(
    const u64* keys, const u32* positions, u32 n, u32 curves, u32 per_curve, const float* base, u32 dim, u32 filter,
    const float* queries, const u64* query_keys, u32 query_count, u32 capacity, u32 keep, u32* out_positions,
    float* out_scores) {
    extern __shared__ u32 entries[];
    u32* ids = entries;
    float* scores = (float*)(entries + capacity);
    __shared__ u32 starts[APPROX_MAX_CURVES];
    const u32 take = min(per_curve, n);
    for (u32 q = blockIdx.x; q < query_count; q += gridDim.x) {
        if (threadIdx.x < curves) {
            const u64* list = keys + (u64)threadIdx.x * n;
            const u64 key = query_keys[(u64)q * curves + threadIdx.x];
            // The first entry whose key is not below the query's.
            u32 low = 0, high = n;
            while (low < high) {
                const u32 middle = low + (high - low) / 2;
                if (list[middle] < key) low = middle + 1;
                else high = middle;
            }
            starts[threadIdx.x] = min(low - min(low, take / 2), n - take);
        }
        __syncthreads();
        for (u32 i = threadIdx.x; i < capacity; i += blockDim.x) {
            const u32 c = i / take;
            ids[i] = c < curves ? positions[(u64)c * n + starts[c] + i % take] : NO_POSITION;
        }
        __syncthreads();
        sort_ids(ids, capacity);
        score_by_filter(filter, ids, scores, capacity, base, dim, queries + (u64)q * dim);
        __syncthreads();
        sort_by_score(ids, scores, capacity);
        for (u32 i = threadIdx.x; i < keep; i += blockDim.x) {
            const bool found = i < capacity && scores[i] < F32_INFINITY;
            out_positions[(u64)q * keep + i] = found ? ids[i] : NO_POSITION;
            out_scores[(u64)q * keep + i] = found ? scores[i] : F32_INFINITY;
        }
        __syncthreads();
    }
}

// ---- The graph search: the kNN graph (src/index/graph.rs) walked best first from each query's
// nearest seeds, as the cores' search walks it (src/backend/cpu/approx.rs; the lowest layer of Malkov
// and Yashunin's HNSW), one block a query. The pool holds the `pool` nearest rows found, ascending
// by f32 score, each marked once its edges are followed; a step follows the edges of the nearest
// row not yet followed, scores the rows they reach for the first time, and keeps the `pool` best
// of the pool and those; the search ends when every row of the pool has been followed (the
// nearest unfollowed row is then farther than the whole full pool, the cores' stopping rule) or
// after `max_steps` steps. Rows are scored by their whole f32 distance where the cores rank by a
// principal-coordinate proxy (the walk found more than the cores at every effort measured:
// docs/design.md#approx).

// Threads of a walking block (4 warps; a step scores at most WALK_MAX_WIDTH rows).
#define WALK_THREADS 128
// Most edges of a row (graph::WIDTH).
#define WALK_MAX_WIDTH 32
// Entries of the table of rows reached (open addressing, a power of two). Past half full it is
// emptied and refilled with the pool's rows: a row reached before and since dropped from the pool
// may then be scored again, but never enters the pool twice (the pool's rows stay in the table),
// and it was no better than the pool's worst, which only improves.
#define WALK_TABLE 4096
#define WALK_EMPTY 0xffffffffu

// Inserts `row` into the table of rows reached; whether it was not there.
__device__ __forceinline__ bool reach(u32* table, u32 row) {
    u32 slot = (row * 2654435761u) & (WALK_TABLE - 1);
    for (u32 probe = 0; probe < WALK_TABLE; ++probe) {
        const u32 old = atomicCAS(table + slot, WALK_EMPTY, row);
        if (old == WALK_EMPTY) return true;
        if (old == row) return false;
        slot = (slot + 1) & (WALK_TABLE - 1);
    }
    return false;
}

// approx_walk: queries [0, query_count) of `queries` (`dim` f32 values each) over the base rows
// (`base`, `dim` values each) and the graph's edges (`edges[r·width ..]`, WALK_EMPTY past a row's
// last). Each query's seeds are the first `pool` entries of best_positions/best_scores[q·keep ..]
// (ascending, distinct, NO_POSITION past the last: approx_knn's output), replaced by the walk's
// best `keep` (ascending by score then position; NO_POSITION and +∞ past the pool). `size`, a
// power of two ≥ pool + width, is the pool's entries of dynamic shared memory. Adds the rows each
// query reached through the graph to `reached`.
extern "C" __global__ void __launch_bounds__(WALK_THREADS) approx_walk(
    const u32* edges, u32 width, const float* base, u32 dim, u32 filter, const float* queries, u32 query_count,
    u32 pool, u32 size, u32 max_steps, u32 keep, u32* best_positions, float* best_scores,
    unsigned long long* reached) {
    extern __shared__ u32 walk_shared[];
    u32* ids = walk_shared;
    float* scores = (float*)(walk_shared + size);
    u32* followed = walk_shared + 2 * size;
    __shared__ u32 table[WALK_TABLE];
    __shared__ u32 fresh[WALK_MAX_WIDTH];
    __shared__ u32 fresh_count, current, filled;
    for (u32 q = blockIdx.x; q < query_count; q += gridDim.x) {
        u32* positions = best_positions + (u64)q * keep;
        float* best = best_scores + (u64)q * keep;
        for (u32 i = threadIdx.x; i < WALK_TABLE; i += blockDim.x) table[i] = WALK_EMPTY;
        if (threadIdx.x == 0) filled = 0;
        __syncthreads();
        for (u32 i = threadIdx.x; i < size; i += blockDim.x) {
            const u32 id = i < pool ? positions[i] : NO_POSITION;
            ids[i] = id;
            scores[i] = id == NO_POSITION ? F32_INFINITY : best[i];
            followed[i] = id == NO_POSITION;
            if (id != NO_POSITION) {
                reach(table, id);
                atomicAdd(&filled, 1u);
            }
        }
        __syncthreads();
        const float* query = queries + (u64)q * dim;
        u32 walked = 0;
        for (u32 step = 0; step < max_steps; ++step) {
            if (threadIdx.x == 0) {
                current = NO_POSITION;
                fresh_count = 0;
            }
            __syncthreads();
            // The nearest row of the pool not yet followed (the pool is ascending).
            for (u32 i = threadIdx.x; i < pool; i += blockDim.x) {
                if (!followed[i]) atomicMin(&current, i);
            }
            __syncthreads();
            if (current == NO_POSITION) break;
            const u32 row = ids[current];
            // A table past half full is emptied and refilled with the pool's rows.
            if (filled + width > WALK_TABLE / 2) {
                __syncthreads();
                for (u32 i = threadIdx.x; i < WALK_TABLE; i += blockDim.x) table[i] = WALK_EMPTY;
                if (threadIdx.x == 0) filled = 0;
                __syncthreads();
                for (u32 i = threadIdx.x; i < pool; i += blockDim.x) {
                    if (ids[i] != NO_POSITION) {
                        reach(table, ids[i]);
                        atomicAdd(&filled, 1u);
                    }
                }
                __syncthreads();
            }
            if (threadIdx.x < width) {
                const u32 next = edges[(u64)row * width + threadIdx.x];
                if (next != WALK_EMPTY && reach(table, next)) fresh[atomicAdd(&fresh_count, 1u)] = next;
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                followed[current] = 1;
                filled += fresh_count;
            }
            const u32 count = fresh_count;
            walked += count;
            // The fresh rows' scores, after the pool's `pool` entries; the rest of the entries empty.
            for (u32 i = pool + threadIdx.x; i < size; i += blockDim.x) {
                ids[i] = i - pool < count ? fresh[i - pool] : NO_POSITION;
                followed[i] = i - pool >= count;
            }
            __syncthreads();
            score_by_filter(filter, ids + pool, scores + pool, count, base, dim, query);
            for (u32 i = pool + count + threadIdx.x; i < size; i += blockDim.x) scores[i] = F32_INFINITY;
            __syncthreads();
            bitonic_sort(size, [&](u32 i, u32 j, bool ascending) {
                const float a = scores[i], b = scores[j];
                const u32 x = ids[i], y = ids[j];
                if ((a > b || (a == b && x > y)) == ascending) {
                    scores[i] = b;
                    scores[j] = a;
                    ids[i] = y;
                    ids[j] = x;
                    const u32 f = followed[i];
                    followed[i] = followed[j];
                    followed[j] = f;
                }
            });
        }
        for (u32 i = threadIdx.x; i < keep; i += blockDim.x) {
            const bool found = i < pool && ids[i] != NO_POSITION;
            positions[i] = found ? ids[i] : NO_POSITION;
            best[i] = found ? scores[i] : F32_INFINITY;
        }
        if (threadIdx.x == 0) atomicAdd(reached, (unsigned long long)walked);
        __syncthreads();
    }
}

// ---- The kNN graph's build (src/index/graph.rs: NN-descent from the curves' windows), each
// row's candidates gathered, measured and ranked by one block as approx_knn ranks a query's. The
// host runs the rounds and the reverse edges; the device measures every row's candidates by its
// whole f32 distance (the cores by the principal coordinates' proxy), the cost of the build.

// curve_ranks: every row's rank on each of `curves` curves of `n` rows: ranks[c·n + positions[c·n
// + r]] = r.
extern "C" __global__ void __launch_bounds__(256) curve_ranks(const u32* positions, u32 n, u32 curves, u32* ranks) {
    const u64 total = (u64)n * curves;
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 c = e / n;
        ranks[c * n + positions[e]] = (u32)(e - c * n);
    }
}

// graph_nearest: each row i < n's `degree` nearest other rows (out[i·degree ..], ascending by f32
// score then row, NO_POSITION past its distinct candidates) among its candidates: where `ranks` is
// given (curve_ranks'), the rows `window` either side of it along each of `curves` curves
// (positions[c·n + r]); otherwise the rows its `nearest` and `reverse` lists name (`degree` slots
// a row each, NO_POSITION after the last) and the rows their `nearest` lists name. `capacity`, a
// power of two ≥ the candidates a row can have (curves·(2·window + 1), or 2·degree·(degree + 1)),
// is the entries of dynamic shared memory (a position and a score each).
extern "C" __global__ void __launch_bounds__(APPROX_THREADS) graph_nearest(
    const float* base, u32 n, u32 dim, u32 filter, const u32* positions, const u32* ranks, u32 curves, u32 window,
    const u32* nearest, const u32* reverse, u32 degree, u32 capacity, u32* out) {
    extern __shared__ u32 entries[];
    u32* ids = entries;
    float* scores = (float*)(entries + capacity);
    const u32 span = 2 * window + 1, lists = 2 * degree, per_list = degree + 1;
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        for (u32 s = threadIdx.x; s < capacity; s += blockDim.x) {
            u32 id = NO_POSITION;
            if (ranks) {
                const u32 c = s / span;
                // Rank r + (s mod span) − window, where it lies within the curve.
                const u64 shifted = c < curves ? (u64)ranks[(u64)c * n + i] + s % span : 0;
                if (c < curves && shifted >= window && shifted - window < n)
                    id = positions[(u64)c * n + shifted - window];
            } else {
                const u32 a = s / per_list, b = s % per_list;
                if (a < lists) {
                    const u32 j = a < degree ? nearest[(u64)i * degree + a] : reverse[(u64)i * degree + a - degree];
                    if (j != NO_POSITION) id = b == 0 ? j : nearest[(u64)j * degree + b - 1];
                }
            }
            ids[s] = id == i ? NO_POSITION : id;
        }
        __syncthreads();
        sort_ids(ids, capacity);
        score_by_filter(filter, ids, scores, capacity, base, dim, base + (u64)i * dim);
        __syncthreads();
        sort_by_score(ids, scores, capacity);
        for (u32 d = threadIdx.x; d < degree; d += blockDim.x) {
            out[(u64)i * degree + d] = d < capacity && scores[d] < F32_INFINITY ? ids[d] : NO_POSITION;
        }
        __syncthreads();
    }
}

// ---- The build: each curve's keys (src/index/curve_keys.rs; the sort is kernels/grid.cu's radix
// passes). The arithmetic is the host's, operation for operation: a coordinate sums its products
// from the first axis on without fused multiply-adds (__fmul_rn, __fadd_rn), and the quantisation
// subtracts, multiplies, clamps and truncates as the host's does, so every key is the host's.

// Most dimensions of a curve (MAX_CURVE_DIMS).
#define CURVE_MAX_DIMS 8

// Coordinate j of a curve (`rotation`: axes × dims, row-major) of a row's leading coordinates `lead`.
__device__ __forceinline__ float curve_coordinate(const float* lead, const float* rotation, u32 axes, u32 dims,
                                                  u32 j) {
    float s = -0.0f;
    for (u32 i = 0; i < axes; ++i) s = __fadd_rn(s, __fmul_rn(lead[i], rotation[i * dims + j]));
    return s;
}

// An f32 as a u32 that orders as the f32 does (for atomicMin/atomicMax), and back.
__device__ __forceinline__ u32 ordered_bits(float x) {
    const u32 b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// curve_bounds: for curve blockIdx.y (`rotations + blockIdx.y·axes·dims`), the lowest and highest
// coordinate of each of its `dims` dimensions over the `n` rows (`rows`, `axes` leading
// coordinates each), as ordered_bits, folded into low/high[curve·dims + j] (which the caller sets
// to +∞ and −∞). NaN coordinates are passed over, as the host's f32::min/max does.
extern "C" __global__ void __launch_bounds__(256) curve_bounds(const float* rows, u32 n, u32 axes,
                                                                 u32 dims, const float* rotations, u32* low,
                                                                 u32* high) {
    const float* rotation = rotations + (u64)blockIdx.y * axes * dims;
    float lo[CURVE_MAX_DIMS], hi[CURVE_MAX_DIMS];
#pragma unroll
    for (u32 j = 0; j < CURVE_MAX_DIMS; ++j) {
        lo[j] = F32_INFINITY;
        hi[j] = -F32_INFINITY;
    }
    for (u32 r = blockIdx.x * blockDim.x + threadIdx.x; r < n; r += gridDim.x * blockDim.x) {
        const float* lead = rows + (u64)r * axes;
#pragma unroll
        for (u32 j = 0; j < CURVE_MAX_DIMS; ++j) {
            if (j < dims) {
                const float x = curve_coordinate(lead, rotation, axes, dims, j);
                lo[j] = fminf(lo[j], x);
                hi[j] = fmaxf(hi[j], x);
            }
        }
    }
#pragma unroll
    for (u32 j = 0; j < CURVE_MAX_DIMS; ++j) {
        for (u32 offset = 16; offset > 0; offset /= 2) {
            lo[j] = fminf(lo[j], __shfl_down_sync(0xffffffffu, lo[j], offset));
            hi[j] = fmaxf(hi[j], __shfl_down_sync(0xffffffffu, hi[j], offset));
        }
    }
    if ((threadIdx.x & 31) == 0) {
        for (u32 j = 0; j < dims; ++j) {
            // A warp that saw no row keeps ±∞, which orders past every coordinate.
            atomicMin(low + blockIdx.y * dims + j, ordered_bits(lo[j]));
            atomicMax(high + blockIdx.y * dims + j, ordered_bits(hi[j]));
        }
    }
}

// The position on the `dims`-dimensional Hilbert curve of order `bits` of cell `cells` (Skilling's
// transpose algorithm, as the host's hilbert_key; `cells` is overwritten).
__device__ __forceinline__ u64 hilbert_key(u32 (&cells)[CURVE_MAX_DIMS], u32 dims, u32 bits) {
    if (dims == 0 || bits == 0) return 0;
    const u32 top = 1u << (bits - 1);
    for (u32 q = top; q > 1; q >>= 1) {
        const u32 p = q - 1;
        for (u32 i = 0; i < dims; ++i) {
            if (cells[i] & q) {
                cells[0] ^= p;
            } else {
                const u32 t = (cells[0] ^ cells[i]) & p;
                cells[0] ^= t;
                cells[i] ^= t;
            }
        }
    }
    for (u32 i = 1; i < dims; ++i) cells[i] ^= cells[i - 1];
    u32 t = 0;
    for (u32 q = top; q > 1; q >>= 1) {
        if (cells[dims - 1] & q) t ^= q - 1;
    }
    for (u32 i = 0; i < dims; ++i) cells[i] ^= t;
    u64 key = 0;
    for (u32 bit = bits; bit-- > 0;) {
        for (u32 i = 0; i < dims; ++i) key = (key << 1) | ((cells[i] >> bit) & 1u);
    }
    return key;
}

// curve_keys: the key of each of the `n` rows (`rows`, `axes` leading coordinates each) on the curve of `rotation` (axes × dims) whose dimensions start at `low` with `scale`
// cells per unit, quantised to `bits` bits: keys[r].
extern "C" __global__ void __launch_bounds__(256) curve_keys(const float* rows, u32 n, u32 axes,
                                                               u32 dims, u32 bits, const float* rotation,
                                                               const float* low, const float* scale, u64* keys) {
    const float top = (float)((1ull << bits) - 1);
    for (u32 r = blockIdx.x * blockDim.x + threadIdx.x; r < n; r += gridDim.x * blockDim.x) {
        const float* lead = rows + (u64)r * axes;
        u32 cells[CURVE_MAX_DIMS];
#pragma unroll
        for (u32 j = 0; j < CURVE_MAX_DIMS; ++j) {
            if (j < dims) {
                const float x = curve_coordinate(lead, rotation, axes, dims, j);
                const float cell = __fmul_rn(__fsub_rn(x, low[j]), scale[j]);
                // fmaxf passes a NaN over (0), as the host's clamp and cast do.
                cells[j] = (u32)fminf(fmaxf(cell, 0.0f), top);
            } else {
                cells[j] = 0;
            }
        }
        keys[r] = hilbert_key(cells, dims, bits);
    }
}
