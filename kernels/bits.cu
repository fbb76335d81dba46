// Hamming and Tanimoto over bit strings on the device (`metric=hamming`, `metric=jaccard` over a
// bit column): rows of `words` 64-bit words, the bytes packed as src/vectors/bits.rs packs them.
// Distances are counts of bits, and Tanimoto's is `1 − both / either` divided in f64 exactly as
// the host divides it (backend/plan/bounds.rs, `jaccard_of_union`), so answers equal the CPU's.
#include "common.cuh"

// Left rows a block of bits_join holds at once in shared memory; each right row it reads is
// compared with all of them, so the right side is read once per tile instead of once per row.
#define BITS_TILE 8
// Most words of a row bits_join takes (its tile's shared memory: BITS_TILE · BITS_MAX_WORDS words).
#define BITS_MAX_WORDS 64
// Queries a block of the kNN's histogram pass holds (their rows and histograms in shared memory).
#define BITS_KNN_QUERIES 16

__device__ __forceinline__ u32 bits_hamming(const u64* a, const u64* b, u32 words) {
    u32 d = 0;
    for (u32 w = 0; w < words; ++w) d += __popcll(a[w] ^ b[w]);
    return d;
}

// The distance of two rows: their differing bits (tanimoto = 0), or Tanimoto's `1 − both/either`,
// 0 where neither has a bit set.
__device__ __forceinline__ double bits_distance(const u64* a, const u64* b, u32 words, u32 tanimoto) {
    if (!tanimoto) return (double)bits_hamming(a, b, words);
    u32 both = 0, either = 0;
    for (u32 w = 0; w < words; ++w) {
        both += __popcll(a[w] & b[w]);
        either += __popcll(a[w] | b[w]);
    }
    return either == 0 ? 0.0 : 1.0 - (double)both / (double)either;
}

// Left rows left_order[first .. first + rows] (input positions), in tiles of BITS_TILE per block;
// left row i (at slot t of the order) against right rows window_start[t] .. window_end[t] of the
// right order (row right_order[s] of `right`): every pair within the threshold — `radius` bits for
// Hamming, `eps` for Tanimoto — is appended at an atomicAdd of `count`, written when below
// `capacity` (the host runs again with room for `count` when it is not).
extern "C" __global__ void bits_join(const u64* left, const u32* left_order, u32 first, u32 rows, const u64* right,
                                     const u32* right_order, const u32* window_start, const u32* window_end, u32 words,
                                     u32 tanimoto, u32 radius, double eps, u32* out_left, u32* out_right,
                                     double* out_distance, unsigned long long* count, unsigned long long capacity) {
    __shared__ u64 tile[BITS_TILE * BITS_MAX_WORDS];
    __shared__ u32 tile_start[BITS_TILE], tile_end[BITS_TILE], tile_row[BITS_TILE];
    const u32 tiles = (rows + BITS_TILE - 1) / BITS_TILE;
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const u32 base = first + t * BITS_TILE;
        const u32 held = min((u32)BITS_TILE, first + rows - base);
        __syncthreads();
        for (u32 j = threadIdx.x; j < held * words; j += blockDim.x) {
            const u32 r = j / words;
            tile[r * words + j % words] = left[(u64)left_order[base + r] * words + j % words];
        }
        if (threadIdx.x < held) {
            tile_start[threadIdx.x] = window_start[base + threadIdx.x];
            tile_end[threadIdx.x] = window_end[base + threadIdx.x];
            tile_row[threadIdx.x] = left_order[base + threadIdx.x];
        }
        __syncthreads();
        u32 from = 0xffffffffu, to = 0;
        for (u32 r = 0; r < held; ++r) {
            from = min(from, tile_start[r]);
            to = max(to, tile_end[r]);
        }
        for (u32 s = from + threadIdx.x; s < to; s += blockDim.x) {
            const u32 position = right_order[s];
            const u64* y = right + (u64)position * words;
            for (u32 r = 0; r < held; ++r) {
                if (s < tile_start[r] || s >= tile_end[r]) continue;
                const double d = bits_distance(tile + r * words, y, words, tanimoto);
                const bool within = tanimoto ? d <= eps : (u32)d <= radius;
                if (within) {
                    const unsigned long long slot = atomicAdd(count, 1ull);
                    if (slot < capacity) {
                        out_left[slot] = tile_row[r];
                        out_right[slot] = position;
                        out_distance[slot] = d;
                    }
                }
            }
        }
    }
}

// The kNN's first pass: for queries first .. first + rows (BITS_KNN_QUERIES a block, in shared
// memory), the histogram of their Hamming distances to every base row, `bins` = bits + 1 counts a
// query, written to histograms[(query − first) · bins …]. Shared memory: BITS_KNN_QUERIES ·
// (words + bins) words of 8 and 4 bytes, asked for by the host.
extern "C" __global__ void bits_knn_histogram(const u64* queries, u32 first, u32 rows, const u64* base, u32 n,
                                              u32 words, u32 bins, u32* histograms) {
    extern __shared__ u64 shared[];
    u64* held = shared;
    u32* counts = (u32*)(shared + BITS_KNN_QUERIES * words);
    const u32 tiles = (rows + BITS_KNN_QUERIES - 1) / BITS_KNN_QUERIES;
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const u32 q0 = t * BITS_KNN_QUERIES;
        const u32 qs = min((u32)BITS_KNN_QUERIES, rows - q0);
        __syncthreads();
        for (u32 j = threadIdx.x; j < qs * words; j += blockDim.x) held[j] = queries[(u64)(first + q0) * words + j];
        for (u32 j = threadIdx.x; j < BITS_KNN_QUERIES * bins; j += blockDim.x) counts[j] = 0;
        __syncthreads();
        for (u32 p = threadIdx.x; p < n; p += blockDim.x) {
            const u64* y = base + (u64)p * words;
            for (u32 q = 0; q < qs; ++q) atomicAdd(&counts[q * bins + bits_hamming(held + q * words, y, words)], 1u);
        }
        __syncthreads();
        for (u32 j = threadIdx.x; j < qs * bins; j += blockDim.x) histograms[(u64)q0 * bins + j] = counts[j];
    }
}

// The kNN's second pass: for queries first .. first + rows, every base row within cut[query] bits
// (the smallest distance with k rows within it, from the histograms) appended at an atomicAdd of
// `count` as (query, base row, distance), written when below `capacity`. Each block takes
// BITS_KNN_QUERIES queries, their rows in shared memory.
extern "C" __global__ void bits_knn_within(const u64* queries, u32 first, u32 rows, const u64* base, u32 n, u32 words,
                                           const u32* cut, u32* out_left, u32* out_right, double* out_distance,
                                           unsigned long long* count, unsigned long long capacity) {
    extern __shared__ u64 shared[];
    u64* held = shared;
    const u32 tiles = (rows + BITS_KNN_QUERIES - 1) / BITS_KNN_QUERIES;
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        const u32 q0 = t * BITS_KNN_QUERIES;
        const u32 qs = min((u32)BITS_KNN_QUERIES, rows - q0);
        __syncthreads();
        for (u32 j = threadIdx.x; j < qs * words; j += blockDim.x) held[j] = queries[(u64)(first + q0) * words + j];
        __syncthreads();
        for (u32 p = threadIdx.x; p < n; p += blockDim.x) {
            const u64* y = base + (u64)p * words;
            for (u32 q = 0; q < qs; ++q) {
                const u32 d = bits_hamming(held + q * words, y, words);
                if (d <= cut[first + q0 + q]) {
                    const unsigned long long slot = atomicAdd(count, 1ull);
                    if (slot < capacity) {
                        out_left[slot] = first + q0 + q;
                        out_right[slot] = p;
                        out_distance[slot] = (double)d;
                    }
                }
            }
        }
    }
}

// Bits [start, start + width) of a row (width ≤ 64), as a number: the same cut as the host's
// `block_value` (backend/cpu/bits.rs).
__device__ __forceinline__ u64 bits_block(const u64* row, u32 start, u32 width) {
    const u32 w = start / 64, offset = start % 64;
    u64 value = row[w] >> offset;
    if (offset + width > 64) value |= row[w + 1] << (64 - offset);
    return width < 64 ? value & ((1ull << width) - 1) : value;
}

// The right rows of block value `v` (block j's index: offsets of 2^width + 1 values, rows of the
// block in value order) checked against left row i: a right row is taken from the first block
// within `s` bits only (so once), and kept when its whole distance is within `radius`; a
// self-join keeps only right rows after the left one.
__device__ __forceinline__ void bits_block_rows(u64 v, u32 i, const u64* x, u32 j, const u32* offsets,
                                                const u32* indexed, const u64* right, u32 words,
                                                const u32* block_start, const u32* block_width, u32 s,
                                                u32 radius, u32 self_join, u32* out_left, u32* out_right,
                                                double* out_distance, unsigned long long* count,
                                                unsigned long long capacity) {
    for (u32 at = offsets[v]; at < offsets[v + 1]; ++at) {
        const u32 p = indexed[at];
        if (self_join && p <= i) continue;
        const u64* y = right + (u64)p * words;
        bool earlier = false;
        for (u32 e = 0; e < j && !earlier; ++e) {
            const u32 we = block_width[e];
            earlier = __popcll(bits_block(y, block_start[e], we) ^ bits_block(x, block_start[e], we)) <= s;
        }
        if (earlier) continue;
        const u32 d = bits_hamming(x, y, words);
        if (d <= radius) {
            const unsigned long long slot = atomicAdd(count, 1ull);
            if (slot < capacity) {
                out_left[slot] = i;
                out_right[slot] = p;
                out_distance[slot] = (double)d;
            }
        }
    }
}

// Multi-index hashing (Norouzi, Punjani and Fleet, "Fast exact search in Hamming space with
// multi-index hashing"): one thread per (left row, block), for left rows first .. first + rows and
// the `blocks` blocks of `block_start`/`block_width` (each at most 22 bits: its index is a table of
// every value). Block j's index: the offsets of its 2^width + 1 values at offset_base[j] of
// `block_offsets`, its rows in value order at n · j of `block_rows`. Every value within `s ≤ 3`
// bits of the left row's block is looked up, each once (the flipped bits in increasing order).
extern "C" __global__ void bits_blocks_join(const u64* left, u32 first, u32 rows, const u64* right, u32 words,
                                            u32 blocks, const u32* block_start, const u32* block_width,
                                            const u64* offset_base, const u32* block_offsets, const u32* block_rows,
                                            u32 n, u32 s, u32 radius, u32 self_join, u32* out_left, u32* out_right,
                                            double* out_distance, unsigned long long* count,
                                            unsigned long long capacity) {
    const u64 work = (u64)rows * blocks;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < work; t += (u64)gridDim.x * blockDim.x) {
        const u32 i = first + (u32)(t / blocks);
        const u32 j = (u32)(t % blocks);
        const u64* x = left + (u64)i * words;
        const u32 width = block_width[j];
        const u64 own = bits_block(x, block_start[j], width);
        const u32* offsets = block_offsets + offset_base[j];
        const u32* indexed = block_rows + (u64)n * j;
#define BITS_VISIT(v)                                                                                    \
    bits_block_rows((v), i, x, j, offsets, indexed, right, words, block_start, block_width, s, radius, \
                    self_join, out_left, out_right, out_distance, count, capacity)
        BITS_VISIT(own);
        for (u32 a = 0; s >= 1 && a < width; ++a) {
            const u64 va = own ^ (1ull << a);
            BITS_VISIT(va);
            for (u32 b = a + 1; s >= 2 && b < width; ++b) {
                const u64 vb = va ^ (1ull << b);
                BITS_VISIT(vb);
                for (u32 c = b + 1; s >= 3 && c < width; ++c) BITS_VISIT(vb ^ (1ull << c));
            }
        }
#undef BITS_VISIT
    }
}
