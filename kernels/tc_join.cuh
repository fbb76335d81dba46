// The tensor-core join's building blocks: its tile geometry, the copies of a chunk's tile into
// shared memory, the filter's bounds and the f16 helpers.
// Included by brute_join.cu, tc_join.cu and tc_sample_keys.cu.

// Brute force for the dot-product filters (FILTER_GEMM_L2, FILTER_NEG_DOT) on tensor cores: the
// same 128 × 128 tiles, pairs and epilogue as brute_join, with x̃·ỹ from f16 mma.sync (m16n8k16,
// f32 accumulation). Each block takes one left tile against a run of p.tc_run right tiles; each of
// its 8 warps owns a 64 × 32 sub-tile (4 × 4 mma tiles) of the tile at hand.
// The rows are the sides' f32 filter rows scaled by one power of two 2^a and rounded to f16
// (pack_half_rows below, run by the host on every side this kernel reads: to nearest, so each
// coordinate errs by at most 2⁻¹¹ relative, or 2⁻¹⁴ absolute in f16's subnormal range), two to a
// 32-bit word, `tc_row_words` words a row (zeros up to a multiple of 8 dimensions). An f16 mma
// does twice the multiply-adds of a TF32 one at the same issue cost and reads half the bytes;
// f16's significand is TF32's (11 bits), so the relative error bound is the same, and the scaling
// (2^a exact, the largest coordinate below 2¹⁴ < 65,504) keeps the values inside f16's range. They
// enter shared memory 32 words (64 dimensions) at a time through a cp.async pipeline of `stages` buffers (3
// where the device's shared memory allows, else 2; the host sizes the dynamic shared memory) that
// runs on across the run's tiles — the next chunks, or the next tile's first, are in flight while the
// tensor cores work on this one and while a finished tile's epilogue runs — stored row-major with a
// stride of 36 words, so that the fragment loads (8 rows × 4 words per warp) hit 32 distinct
// banks. One barrier per chunk: the stage a step refills is the one every warp finished at the
// step before. (One tile per block exposed the first chunk's load latency in every tile, and the
// epilogue overlapped nothing: at d = 32 a tile has only two chunks, docs/design.md#gpu-brute. Chunks of 16
// dimensions, two stages and two barriers each left the tensor pipe 23 % busy, warps waiting
// mostly at the barriers, docs/design.md#cpu-knn.) On sm_90a (the H100 and H200) the stages are filled by
// TMA instead, in the 128-byte swizzle, and each warpgroup multiplies its 64 rows of the tile by
// wgmma from there (TC_WGMMA below; docs/design.md#gpu-brute).
// The products of f16 values are exact in f32; the error of this dot product is covered by the
// wider margin the host sets for this kernel (`tensor_core_margin` in src/backend/gpu/filter.rs, with the
// proof). Needs sm_80 or later; the host launches it only there.
// Words of a brute_join_tc row: two f16 coordinates a word, padded to whole 16-byte groups
// (`tc_row_words` in src/cuda/launch/pack.rs).
__device__ __forceinline__ u32 tc_row_words(u32 dim) { return (dim + 7) / 8 * 4; }

// Words of a brute_join_tc_bytes row: four byte coordinates a word, padded to whole 16-byte
// groups (`byte_row_words` in src/cuda/launch/pack.rs).
__device__ __forceinline__ u32 byte_row_words(u32 dim) { return (dim + 15) / 16 * 4; }

// Words (two f16 coordinates each) of a row per chunk, and a tile row's stride in shared memory.
#define TC_CHUNK 32
#define TC_STRIDE (TC_CHUNK + 4)
// Words of one pipeline stage: both sides' tiles (`TC_STAGE_BYTES` in src/cuda/launch/geometry.rs).
#define TC_STAGE_WORDS (2 * TILE * TC_STRIDE)
// Rows of at most TC_RESIDENT_CHUNKS chunks (128 dimensions) keep the block's left tile resident
// in shared memory, copied once before its run of right tiles, and the stages carry only the right
// tiles' chunks: at d = 128 the left tile was otherwise copied again for every right tile, half of
// the pass's L2 traffic and of its cp.async work (docs/design.md#gpu-brute). TC_RESIDENT_WORDS are reserved
// ahead of the stages whenever a row has that few chunks (`TC_RESIDENT_BYTES` in
// src/cuda/launch/geometry.rs, which sizes the dynamic shared memory by the same rule).
#define TC_RESIDENT_CHUNKS 2
#define TC_RESIDENT_WORDS (TC_RESIDENT_CHUNKS * TILE * TC_STRIDE)

// What one thread copies of a tile's rows, chunk after chunk: four words (eight f16 coordinates)
// from word w of rows r, r + 32, r + 64 and r + 96, their address computed once per tile rather
// than once per chunk (that arithmetic was about half of the kernel's instructions: docs/design.md#gpu-brute).
struct TileCopy {
    const u32* from;    // row r at word w; the buffer's start when row r is outside
    u32 stride;         // words between rows r and r + 32
    u32 inside;         // bit i: row r + 32·i exists (rows run out at the end only)
    u32 r, w;
};
static_assert(TILE * TC_CHUNK / 4 == 4 * 256, "four groups of four words per thread and chunk");

__device__ __forceinline__ TileCopy tile_copy(u32 row_words, const u32* rows, u32 first, u32 end) {
    TileCopy c;
    c.r = threadIdx.x / 8;
    c.w = threadIdx.x % 8 * 4;
    c.stride = 32 * row_words;
    c.inside = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) c.inside |= (u32)(first + c.r + 32 * i < end) << i;
    c.from = c.inside & 1 ? rows + (u64)(first + c.r) * row_words + c.w : rows;
    return c;
}

// Starts copying one chunk (TC_CHUNK words from w0) of a tile's rows into the tile at shared
// address `tile` (rows of TC_STRIDE words), 16 bytes per cp.async; zeros beyond the data (which
// add nothing to a dot product). Rows are whole groups of four words (pack_half_rows pads them), so
// each group lies wholly inside or outside the data; a source size of 0 writes zeros and reads
// nothing. The caller commits the cp.async group.
__device__ __forceinline__ void copy_chunk(u32 row_words, const TileCopy& c, u32 tile, u32 w0) {
    bool words_inside = w0 + c.w < row_words;
    const u32 to = tile + (c.r * TC_STRIDE + c.w) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        bool inside = (c.inside >> i & 1) && words_inside;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     ::"r"(to + i * 32 * TC_STRIDE * 4), "l"(inside ? c.from + (u64)i * c.stride + w0 : c.from), "r"(inside ? 16u : 0u));
    }
}

// brute_join_tc's filter, separated into a bound per left row and an offset per right row so that
// a pair costs one fused multiply-add and one comparison, all in the scaled space of its f16 rows
// (every length times 2^a = tc_scale, every score times 2^2a): it passes when
//     −scale·x̂·ŷ + offset(ỹ) ≤ bound(x̃),   scale = 2 (GEMM form) or 1 (inner product),
//     offset(ỹ) = [‖ỹ‖²] − 2m·n(ỹ)² − η·n(ỹ),   bound(x̃) = limit + 2m·n(x̃)² + η·n(x̃) − [‖x̃‖²] + floor,
// with m, floor the host's `dot_margin`, `dot_floor`, η its `tc_eta`, n the scaled f32 norms, [·]
// for the GEMM form only. That is brute_filter's test `score − (m·(n(x̃) + n(ỹ))² + η·(n(x̃) + n(ỹ))
// + floor) ≤ limit` with the margin widened to m·(2n(x̃)² + 2n(ỹ)²) + …, never less since
// (a + b)² ≤ 2a² + 2b²; and every rounding here errs toward passing (bounds rounded up, offsets and
// the pair's sum rounded down; scaling by a power of two is exact but for an overflow, rounded
// the same way), so a pair that passes the test in exact arithmetic on these inputs passes here,
// and `tensor_core_margin`'s proof (src/backend/gpu/filter.rs) applies unchanged. NaN (an invalid slot)
// passes nothing; kNN's infinite radius, a bound of +∞, passes everything else.
#define F32_NAN __int_as_float(0x7fc00000)
#define F32_INFINITY __int_as_float(0x7f800000)

// 2m·n² + η·n of a scaled norm n, rounded up: the widening of a row's or a column's test.
__device__ __forceinline__ float tc_widening(const JoinParams& p, float n) {
    return __fadd_ru(__fmul_ru(__fmul_ru(2.0f * p.dot_margin, n), n), __fmul_ru(p.tc_eta, n));
}

__device__ __forceinline__ float tc_row_bound(const JoinParams& p, u32 s, u32 slot_end, const float* lfnorm,
                                              const float* lfsq, const double* row_threshold, const float* row_limit) {
    if (s >= slot_end) return F32_NAN;
    if (takes_every_row(p, row_threshold, s)) return F32_INFINITY;
    float squared_scale = p.tc_scale * p.tc_scale;
    float limit = __fmul_ru(p.per_row ? row_limit[s] : p.limit, squared_scale);
    float bound = __fadd_ru(limit, __fadd_ru(tc_widening(p, __fmul_ru(lfnorm[s], p.tc_scale)), p.dot_floor));
    return p.filter == FILTER_GEMM_L2 ? __fsub_ru(bound, __fmul_rd(lfsq[s], squared_scale)) : bound;
}

__device__ __forceinline__ float tc_col_offset(const JoinParams& p, u32 t, u32 right_len, const float* rfnorm, const float* rfsq) {
    if (t >= right_len) return F32_NAN;
    float widening = tc_widening(p, __fmul_ru(rfnorm[t], p.tc_scale));
    return p.filter == FILTER_GEMM_L2 ? __fsub_rd(__fmul_rd(rfsq[t], p.tc_scale * p.tc_scale), widening) : -widening;
}

// PASS_SCORES: a slot whose pair found no room in the block's queue, which makes the host count
// its query again exactly (its count then exceeds any slot's room).
#define SLOT_OVERFLOWED 0x80000000u

// Two f16 (a word of pack_half_rows) as f32, exactly.
__device__ __forceinline__ float2 half_pair(u32 word) {
    float low, high;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}" : "=f"(low), "=f"(high) : "r"(word));
    return make_float2(low, high);
}

// Member `member` of a group of `group` lanes' part of x̂·ŷ for two f16 rows of `row_words` words
// (pack_half_rows): its 16-byte groups of words member, member + group, …, by fused
// multiply-adds; the group then adds its parts. Each product of two f16 is exact in f32 and each
// addition errs by at most 2⁻²⁴ of what it adds, so the whole sum, in any order, errs by at most
// d·2⁻²⁴·Σ|x̂ᵢŷᵢ|, within the d·2⁻²² that tensor_core_margin allows the tensor cores' sum.
__device__ __forceinline__ float half_dot_part(u32 row_words, u32 group, u32 member, const u32* x, const u32* y) {
    float sum = 0.0f;
#pragma unroll 4
    for (u32 w = 4 * member; w < row_words; w += 4 * group) {
        const uint4 a = *(const uint4*)(x + w), b = *(const uint4*)(y + w);
        const u32 xs[4] = {a.x, a.y, a.z, a.w}, ys[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (u32 j = 0; j < 4; ++j) {
            const float2 xf = half_pair(xs[j]), yf = half_pair(ys[j]);
            sum = __fmaf_rn(xf.x, yf.x, sum);
            sum = __fmaf_rn(xf.y, yf.y, sum);
        }
    }
    return sum;
}

// PASS_SCORES: a pair (s, t) that passed brute_join_tc's filter, with a value v = −2x̂·ŷ +
// offset(t) (rounded down; x̂·ŷ from half_dot_part, within the filter's margin as the tensor cores'
// is), counted and, while its slot has room, kept there for knn_settle_slots: the right slot t,
// and in the distance's place two f32, v and v + 2·widening(t) rounded up (its scores a and b
// there).
__device__ __forceinline__ void keep_scores(const JoinParams& p, u32 s, u32 t, float v, u32 slot_begin, const float* rfnorm,
                                            u32* counts, u32* out_right, double* out_distance) {
    const u32 found = atomicAdd(&counts[s - slot_begin], 1u);
    if (found >= p.slot_capacity) return;
    const u64 at = (u64)(s - slot_begin) * p.slot_capacity + found;
    out_right[at] = t;
    *(float2*)&out_distance[at] = make_float2(v, __fadd_ru(v, __fmul_ru(2.0f, tc_widening(p, __fmul_ru(rfnorm[t], p.tc_scale)))));
}
