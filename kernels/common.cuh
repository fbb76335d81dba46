// Shared device helpers for the similarity kernels: the parameter block, the exact f64 distance
// (the same formulas, in the same order, as `Metric::distance` on the host), and the f32 filter.
//
// Compiled by NVRTC with --fmad=false: every `a * b + c` rounds twice, exactly as on the CPU, so
// exact distances are bit-identical across backends. The f32 filter's error margins are proved
// for rounding after every operation (src/backend/plan/bounds.rs and src/backend/cpu/gemm.rs, FilterLimit and GemmSide).
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

// Metric codes (the order of `Metric` in src/op.rs).
#define METRIC_L2 0u
#define METRIC_L2SQ 1u
#define METRIC_COSINE 2u
#define METRIC_INNER_PRODUCT 3u
#define METRIC_L1 4u
#define METRIC_LINF 5u

// Filter kinds: the f32 score a candidate gets.
#define FILTER_SQUARED_L2 0u
#define FILTER_L1 1u
#define FILTER_LINF 2u
#define FILTER_NEG_DOT 3u
// brute_join only: the GEMM form ‖x̃‖² + ‖ỹ‖² − 2·x̃·ỹ of the squared L2 distance of centred rows
// (L2, L2², cosine), one fused multiply-add per dimension, with FILTER_NEG_DOT's norm margin.
#define FILTER_GEMM_L2 4u

#define MAX_GRID_DIMS 8

// +∞ as a double (NVRTC has no math.h and so no INFINITY).
#define F64_INFINITY __longlong_as_double(0x7ff0000000000000ull)

// Everything a join launch needs besides its buffers; passed by value.
struct JoinParams {
    u32 dim;            // vector dimension
    u32 metric;         // METRIC_*
    u32 filter;         // FILTER_*
    u32 self_join;      // 1: left and right are one input; each unordered pair is visited once
    float limit;        // f32 filter: scores above this cannot qualify (FILTER_NEG_DOT: the threshold)
    float dot_margin;   // FILTER_NEG_DOT, FILTER_GEMM_L2: (d + 16)·2⁻²³, times (‖x‖ + ‖y‖)²
    float dot_floor;    // FILTER_NEG_DOT, FILTER_GEMM_L2: absolute margin for subnormal scores
    u32 per_row;        // brute_join: 1 = thresholds and limits per left slot (kNN radii), not the two below
    double threshold;   // the exact f64 threshold
    // Grid (k = 0: brute force over all right rows).
    u32 k;
    u32 dense;          // 1: `cell_table[id]` maps a linear id to its cell (u32 max: empty)
    u32 right_cells;    // number of non-empty right cells
    u32 tensor_cores;   // brute force: the host launched brute_join_tc (the margins above are its own)
    u32 slot_capacity;  // brute force, count pass: each left slot's pairs are also stored at
                        // (slot − slot_begin)·slot_capacity + i while i < slot_capacity (kNN's
                        // candidates, grouped by query without a write pass); 0: not stored so
    u32 windowed;       // grid: 1 = scan only the ±window range of the sort dimension in each cell
    float tc_scale;     // brute_join_tc: 2^a, the power of two both sides' f16 rows are scaled by
    float tc_eta;       // brute_join_tc: 5·√d·2⁻¹⁴, the scaled score's error per unit of a norm from
                        // f16's subnormal range (tensor_core_margin in src/backend/gpu/filter.rs)
    u32 tc_run;         // brute_join_tc: right tiles per block (`tc_run` in src/cuda/launch/geometry.rs)
    u32 tc_queue;       // brute_join_tc: pairs its queue holds (`tc_queue` in src/cuda/launch/geometry.rs)
    u64 cells[MAX_GRID_DIMS];
    u64 strides[MAX_GRID_DIMS];
    double window;      // grid, windowed: half-width of that range (sortidu, Gowanlock & Karsin, GPU-Join, §4.3)
    u32 levels;         // directory: levels below the root (1 to 3)
    u32 fanout;         // directory: children of every inner node
    double box_radius;  // directory: the coordinate bound widened by 2⁻²⁰ (the box test's slack)
};
// The host's mirror (`JoinParams` in src/cuda/abi.rs) asserts the same size.
static_assert(sizeof(JoinParams) == 232, "JoinParams layout changed: update src/cuda/abi.rs");

// Entries of a query's row of kNN sample keys (knn.cu, and tc_sample_keys.cu's knn_sample_keys_bytes):
// the largest sample (KNN_SAMPLE in src/cuda/launch/sample.rs).
#define SAMPLE 4096

// The bits of `v` as an unsigned key in the order of the values (kNN's sample keys, the settled slots' bounds; negatives reversed below the
// positives; −0.0 just before +0.0), and back.
__device__ __forceinline__ u32 f32_order_key(float v) {
    u32 bits = __float_as_uint(v);
    return (bits >> 31) ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ float from_f32_order_key(u32 key) {
    return __uint_as_float((key >> 31) ? key & 0x7fffffffu : ~key);
}

// The exact distance of the contract: sums in dimension order, one term at a time (no FMA
// contraction: --fmad=false), as the host's ExactCheck. exact_term is one term of a metric family's
// sum (L2 and its square; cosine and the inner product; L1; L∞), exact_finish the distance from the
// whole sum; every exact distance on the device is built from these two, so all are the same bits.
template <u32 METRIC>
__device__ __forceinline__ double exact_term(double acc, double a, double b) {
    if (METRIC == METRIC_L2 || METRIC == METRIC_L2SQ) {
        double d = a - b;
        return acc + d * d;
    }
    if (METRIC == METRIC_COSINE || METRIC == METRIC_INNER_PRODUCT) return acc + a * b;
    if (METRIC == METRIC_L1) return acc + fabs(a - b);
    return fmax(acc, fabs(a - b));
}

__device__ __forceinline__ double exact_finish(u32 metric, double acc, double norm_a, double norm_b) {
    switch (metric) {
    case METRIC_L2: return sqrt(acc);
    case METRIC_COSINE: return 1.0 - acc / (sqrt(norm_a) * sqrt(norm_b));
    case METRIC_INNER_PRODUCT: return -acc;
    default: return acc;
    }
}

template <u32 METRIC>
__device__ __forceinline__ double exact_sum(const double* a, const double* b, u32 dim) {
    double acc = 0.0;
    for (u32 i = 0; i < dim; ++i) acc = exact_term<METRIC>(acc, a[i], b[i]);
    return acc;
}

// A row's Σx² (`norms`, cosine only: exact_finish's norm_a, norm_b); 0 for the other metrics.
__device__ __forceinline__ double cosine_norm(const JoinParams& p, const double* norms, u32 row) {
    return p.metric == METRIC_COSINE ? norms[row] : 0.0;
}

// The metric families share their loops, as the host's ExactCheck does.
__device__ __forceinline__ double exact_distance(const JoinParams& p, const double* a, const double* b, double norm_a, double norm_b) {
    switch (p.metric) {
    case METRIC_L2:
    case METRIC_L2SQ: return exact_finish(p.metric, exact_sum<METRIC_L2>(a, b, p.dim), norm_a, norm_b);
    case METRIC_COSINE:
    case METRIC_INNER_PRODUCT: return exact_finish(p.metric, exact_sum<METRIC_INNER_PRODUCT>(a, b, p.dim), norm_a, norm_b);
    case METRIC_L1: return exact_sum<METRIC_L1>(a, b, p.dim);
    default: return exact_sum<METRIC_LINF>(a, b, p.dim);
    }
}

// The f32 filter score of two filter-space rows (see FilterLimit / GemmSide on the host). The
// direct scores stop early once they exceed `limit` (shortc, Gowanlock & Karsin, GPU-Join, §4.4), checked every 8
// dimensions: their terms are non-negative and each rounded addition (or maximum) of one never
// decreases the sum, so a partial score above the limit means the whole score, summed in the same
// order, fails the filter too; the early return is such a failing score.
__device__ __forceinline__ float filter_score(const JoinParams& p, const float* x, const float* y, float limit) {
    float acc = 0.0f;
    switch (p.filter) {
    case FILTER_SQUARED_L2:
        for (u32 i = 0; i < p.dim; ++i) {
            float t = y[i] - x[i];
            acc = acc + t * t;
            if ((i & 7) == 7 && acc > limit) return acc;
        }
        return acc;
    case FILTER_L1:
        for (u32 i = 0; i < p.dim; ++i) {
            acc = acc + fabsf(y[i] - x[i]);
            if ((i & 7) == 7 && acc > limit) return acc;
        }
        return acc;
    case FILTER_LINF:
        for (u32 i = 0; i < p.dim; ++i) {
            acc = fmaxf(acc, fabsf(y[i] - x[i]));
            if ((i & 7) == 7 && acc > limit) return acc;
        }
        return acc;
    default:
        for (u32 i = 0; i < p.dim; ++i) acc = acc + x[i] * y[i];
        return -acc;
    }
}

// Whether a candidate passes the filter `limit`. The margin of the dot-product forms
// (FILTER_NEG_DOT, FILTER_GEMM_L2) depends on the two norms (GemmSide in src/backend/cpu/gemm.rs).
__device__ __forceinline__ bool filter_passes(const JoinParams& p, float score, float norm_x, float norm_y, float limit) {
    if (p.filter == FILTER_NEG_DOT || p.filter == FILTER_GEMM_L2) {
        float n = norm_x + norm_y;
        return score - (p.dot_margin * n * n + p.dot_floor) <= limit;
    }
    return score <= limit;
}

// Row `row` of `rows` (`DIM` wide) into registers, with the widest loads its alignment allows
// (device buffers start 256-byte aligned, so a row of 4k floats is 16-byte aligned).
template <u32 DIM>
__device__ __forceinline__ void load_row(const float* rows, u32 row, float (&v)[DIM]) {
    const float* from = rows + (u64)row * DIM;
    if (DIM % 4 == 0) {
#pragma unroll
        for (u32 i = 0; i < DIM / 4; ++i) {
            float4 q = reinterpret_cast<const float4*>(from)[i];
            v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
        }
    } else if (DIM % 2 == 0) {
#pragma unroll
        for (u32 i = 0; i < DIM / 2; ++i) {
            float2 q = reinterpret_cast<const float2*>(from)[i];
            v[2 * i] = q.x, v[2 * i + 1] = q.y;
        }
    } else {
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) v[i] = from[i];
    }
}

// filter_score with the dimension fixed at compile time: the same operations in the same order
// (so the same proved margins hold), on rows in registers.
template <u32 DIM>
__device__ __forceinline__ float fixed_filter_score(u32 filter, const float (&x)[DIM], const float (&y)[DIM]) {
    float acc = 0.0f;
    switch (filter) {
    case FILTER_SQUARED_L2:
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) {
            float t = y[i] - x[i];
            acc = acc + t * t;
        }
        return acc;
    case FILTER_L1:
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) acc = acc + fabsf(y[i] - x[i]);
        return acc;
    case FILTER_LINF:
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) acc = fmaxf(acc, fabsf(y[i] - x[i]));
        return acc;
    default:
#pragma unroll
        for (u32 i = 0; i < DIM; ++i) acc = acc + x[i] * y[i];
        return -acc;
    }
}

// ldmatrix.x4 from shared memory (rows of 16 bytes at shared address `at`, 16-byte aligned: the
// callers' row strides, TC_STRIDE and TC_SAMPLE_STRIDE, are 144 bytes).
__device__ __forceinline__ void load_matrix_x4(u32 at, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at));
}

// mma_f16's fragments from f16 rows in shared memory (at shared address `tile`, rows `stride`
// words apart, two coordinates a word), one ldmatrix.x4 each: lane i gives the address of row i % 8
// of 8-row × 4-word block i / 8 and receives word `quad` of row `group` of each, which is exactly
// the m16n8k16 layout. The A fragment of rows row0 + [0, 16), words k + [0, 8) (blocks: rows +0/+8
// × words +0/+4); the B fragments of the two n tiles of rows col0 + [0, 8) and + [8, 16), same
// words (blocks: words +0/+4 × tiles).
__device__ __forceinline__ void load_a_fragment(u32 tile, u32 stride, u32 row0, u32 k, u32 lane, u32 (&a)[4]) {
    u32 row = row0 + lane % 8 + 8 * (lane / 8 % 2);
    load_matrix_x4(tile + (row * stride + k + 4 * (lane / 16)) * 4, a[0], a[1], a[2], a[3]);
}

__device__ __forceinline__ void load_b_fragments(u32 tile, u32 stride, u32 col0, u32 k, u32 lane, u32 (&b0)[2], u32 (&b1)[2]) {
    u32 col = col0 + 8 * (lane / 16) + lane % 8;
    load_matrix_x4(tile + (col * stride + k + 4 * (lane / 8 % 2)) * 4, b0[0], b0[1], b1[0], b1[1]);
}

// acc += A·B on f16 tensor cores (mma.sync m16n8k16, f32 accumulation): `a` a 16 × 16 fragment of
// A (row-major), `b` a 16 × 8 one of B (column-major), two f16 a register; `acc` the 16 × 8 sums.
__device__ __forceinline__ void mma_f16(float (&acc)[4], const u32 (&a)[4], const u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A tensor-core accumulator's element: f32 for f16 rows, s32 for byte rows (brute_join_tc_bytes,
// knn_sample_keys_bytes).
template <bool BYTES> struct TcElement { typedef float Type; };
template <> struct TcElement<true> { typedef int Type; };

