// The rows the tensor cores read, made on the device: the GEMM form's f32 filter rows, f16 rows
// scaled by a power of two, byte rows of integer data. Included by brute_join.cu.

// The GEMM form's f32 filter rows of a side's exact rows, bit for bit as the host's `host_side`
// computes them: x̃ = f32(x − c) rounded to nearest, ‖x̃‖² summed in f64 in dimension order (no FMA
// contraction: --fmad=false) and rounded to f32, ‖x̃‖ its correctly rounded f32 square root; so the
// rows need not be built on the host and cross the bus twice. A warp per 32 rows: for each 32
// dimensions, the lanes convert and store the 32 rows' coordinates a row at a time (adjacent
// addresses), keeping them in a 32 × 33 tile of shared memory, then lane i adds its row's squares
// from the tile in dimension order — the sequential sum above, once per row. (A thread per row
// reading its own row made every warp load touch 32 rows' cache lines: 9.3 ms for a 1M × 128 side,
// docs/design.md#gpu-knn; a warp per row, every lane adding the whole row's squares from shuffles, did
// 32 times the f64 work: 1.6 ms, docs/design.md#gpu-brute.)
#define FILTER_WARPS 8

extern "C" __global__ void __launch_bounds__(FILTER_WARPS * 32) filter_rows(const double* exact, u32 n, u32 dim,
        const double* origin, float* filter, float* norms, float* sq_norms) {
    __shared__ float tiles[FILTER_WARPS][32][33];  // 33: a lane's row is read without bank conflicts
    const u32 lane = threadIdx.x & 31;
    float (*values)[33] = tiles[threadIdx.x >> 5];
    const u64 groups = ((u64)n + 31) / 32, warps = (u64)gridDim.x * FILTER_WARPS;
    for (u64 g = blockIdx.x * (u64)FILTER_WARPS + (threadIdx.x >> 5); g < groups; g += warps) {
        const u64 first = g * 32;
        const u32 rows = (u32)min((u64)32, n - first);  // the same for the whole warp
        double sq = 0.0;  // row first + lane's
        for (u32 d0 = 0; d0 < dim; d0 += 32) {
            const u32 d = d0 + lane;
            const double c = d < dim ? origin[d] : 0.0;
            // All 32 loads first, so that they are in flight together: interleaved with the
            // stores to `filter`, which the compiler cannot prove apart from `exact`, each waited
            // for the one before (0.45 ms for a 10k × 784 side, docs/design.md#gpu-brute).
            double x[32];
#pragma unroll
            for (u32 i = 0; i < 32; ++i) x[i] = i < rows && d < dim ? exact[(first + i) * dim + d] : 0.0;
#pragma unroll
            for (u32 i = 0; i < 32; ++i) {
                float v = __double2float_rn(x[i] - c);
                if (i < rows && d < dim) filter[(first + i) * dim + d] = v;
                values[i][lane] = v;
            }
            __syncwarp();
            const u32 chunk = min(32u, dim - d0);
            if (lane < rows)
                for (u32 j = 0; j < chunk; ++j) {
                    double w = values[lane][j];
                    sq += w * w;
                }
            __syncwarp();  // the tile is rewritten for the next dimensions
        }
        if (lane < rows) {
            float s = __double2float_rn(sq);
            sq_norms[first + lane] = s;
            norms[first + lane] = __fsqrt_rn(s);
        }
    }
}

// The positions 0..n in order: the slot order of a side in input order (brute force, kNN), and
// the permutation the grid's stable radix sort starts from.
extern "C" __global__ void identity_order(u32* order, u32 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) order[i] = (u32)i;
}

// Exact rows the host keeps in f32, widened (exactly) into the f64 rows every kernel reads: half
// the bytes over the bus, and no widened copy on the host.
extern "C" __global__ void widen_rows(const float* from, u64 len, double* to) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) to[i] = (double)from[i];
}

// The largest |value| of `len` f32 values, as its bits (non-negative floats order as their bits;
// NaN's exceed +∞'s), atomically maxed into *result, which the host zeroed: brute_join_tc's scale,
// and the GEMM form's check of its squared norms.
extern "C" __global__ void filter_max_abs(const float* values, u64 len, u32* result) {
    u32 largest = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x)
        largest = max(largest, __float_as_uint(values[i]) & 0x7fffffffu);
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, d));
    if ((threadIdx.x & 31) == 0 && largest > 0) atomicMax(result, largest);
}

// brute_join_tc's rows: `n` f32 filter rows of `dim` values scaled by `scale` (2^a: exact, the
// results below 2¹⁴ in magnitude) and rounded to f16 (to nearest even), packed two to a word
// (dimension 2w in the low half of word w), `row_words` words a row, zeros beyond `dim`.
extern "C" __global__ void pack_half_rows(const float* filter, u64 n, u32 dim, u32 row_words, float scale, u32* out) {
#if __CUDA_ARCH__ >= 800
    for (u64 e = blockIdx.x * (u64)blockDim.x + threadIdx.x; e < n * row_words; e += (u64)gridDim.x * blockDim.x) {
        u64 r = e / row_words;
        u32 d = (u32)(e % row_words) * 2;
        float low = d < dim ? filter[r * dim + d] * scale : 0.0f;
        float high = d + 1 < dim ? filter[r * dim + d + 1] * scale : 0.0f;
        u32 packed;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
        out[e] = packed;
    }
#endif
}

// Whether byte rows can hold a side (brute_join_tc_bytes): into result = {least, greatest,
// others}, which the host set to {2³¹ − 1, −2³¹, 0}, the least and greatest of `len` f64 values
// where each is an integer of magnitude at most 2²⁴, and others = 1 where one is not (NaN and
// infinities included). Reduced across the block before the three atomics: a warp's own atomics,
// 65,536 blocks of 8 warps on three addresses, took 0.38 ms for Fashion-MNIST's 47 M values,
// three times their read (docs/design.md#byte-rows).
#define RANGE_WARPS 8
extern "C" __global__ void __launch_bounds__(RANGE_WARPS * 32) integer_range(const double* values, u64 len, int* result) {
    __shared__ int warp_least[RANGE_WARPS], warp_greatest[RANGE_WARPS];
    __shared__ u32 warp_others[RANGE_WARPS];
    int least = 0x7fffffff, greatest = -0x7fffffff - 1;
    u32 others = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) {
        const double v = values[i];
        if (v == rint(v) && fabs(v) <= 16777216.0) {
            least = min(least, (int)v);
            greatest = max(greatest, (int)v);
        } else {
            others = 1;
        }
    }
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) {
        least = min(least, __shfl_xor_sync(0xffffffffu, least, d));
        greatest = max(greatest, __shfl_xor_sync(0xffffffffu, greatest, d));
        others |= __shfl_xor_sync(0xffffffffu, others, d);
    }
    const u32 warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        warp_least[warp] = least;
        warp_greatest[warp] = greatest;
        warp_others[warp] = others;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 w = 1; w < RANGE_WARPS; ++w) {
            least = min(least, warp_least[w]);
            greatest = max(greatest, warp_greatest[w]);
            others |= warp_others[w];
        }
        atomicMin(&result[0], least);
        atomicMax(&result[1], greatest);
        if (others) atomicOr(&result[2], 1);
    }
}

// brute_join_tc_bytes's rows: `n` rows of `dim` integer values (integer_range) shifted by
// −offset into [0, 255] and packed four to a word (dimension 4w + j in byte j of word w),
// `row_words` words a row, zeros beyond `dim`; and each row's Σ(x − offset)², exact in u32 (below
// 2³¹ at d ≤ 8,192). A warp a row, its lanes on consecutive words.
extern "C" __global__ void pack_byte_rows(const double* exact, u64 n, u32 dim, u32 row_words, int offset, u32* out, u32* sq_norms) {
    const u32 lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 r = (blockIdx.x * (u64)blockDim.x + threadIdx.x) / 32; r < n; r += warps) {
        u32 sq = 0;
        for (u32 w = lane; w < row_words; w += 32) {
            u32 packed = 0;
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const u32 d = 4 * w + j;
                const u32 b = d < dim ? (u32)((int)exact[r * dim + d] - offset) : 0;
                sq += b * b;
                packed |= b << (8 * j);
            }
            out[r * row_words + w] = packed;
        }
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, d);
        if (lane == 0) sq_norms[r] = sq;
    }
}
