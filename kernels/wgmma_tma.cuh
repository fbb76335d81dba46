// Hopper's warpgroup mma (wgmma) and tensor memory accelerator (TMA): descriptors, fences,
// barriers and copies. Included by brute_join.cu, tc_join.cu and tc_sample_keys.cu.

// Hopper's warpgroup mma (sm_90a: `arch_for` in src/cuda/device.rs compiles for it on compute
// capability 9.0). mma.sync left brute_join_tc's count pass latency-bound at 16 warps an SM: each
// m16n8k16 waits on its fragments' ldmatrix and the tensor pipe was 29 % busy (docs/design.md#gpu-brute, docs/design.md#gpu-knn).
// wgmma.mma_async reads both operands from shared memory through a descriptor and multiplies a
// 64 × 128 × 16 block in one instruction, asynchronously, so a warpgroup (four warps) issues a
// chunk's four blocks back to back and waits once. Its accumulators are the mma.sync m16n8
// layout repeated along the columns: warp w of the group holds rows 16w + group (+8 for r ≥ 2)
// and, in d[0][n][r], column 8n + 2·quad (+1 for odd r) — tc_epilogue's layout with one row block
// and 16 column blocks.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TC_WGMMA 1
#else
#define TC_WGMMA 0
#endif
// A TMA descriptor (CUtensorMap, built by cuTensorMapEncodeTiled on the host), passed by value
// as a __grid_constant__ parameter; zeros where the kernel does not use TMA.
struct __align__(64) TensorMap {
    u64 opaque[16];
};
#if TC_WGMMA
// A shared-memory matrix descriptor for K-major rows of 128 bytes under the 128-byte swizzle (as
// TMA writes a chunk's tile: 16-byte group g of row r at position g ^ (r mod 8) of its row, eight
// rows a 1,024-byte atom, so that the rows an operand fetch reads together hit distinct banks):
// start address and the stride between 8-row atoms (1,024 bytes) in 16-byte
// units; the leading offset is unused by this layout (one swizzle atom spans the 16-dimension
// step); layout type 1 in bits 62–63. A step of 16 dimensions within the atom adds 32 bytes (2)
// to the start address: the hardware applies the swizzle to the addresses it forms.
__device__ __forceinline__ u64 tc_descriptor(u32 address) {
    return (u64)((address & 0x3ffff) >> 4) | (u64)1 << 16 | (u64)(1024 >> 4) << 32 | (u64)1 << 62;
}

// d (+)= A·Bᵀ for A 64 rows and B 128 rows of 16 f16 dimensions, both K-major; `accumulate` 0
// starts the tile (the accumulators' values are ignored).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[1][16][4], u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0][0]), "+f"(d[0][0][1]), "+f"(d[0][0][2]), "+f"(d[0][0][3]), "+f"(d[0][1][0]), "+f"(d[0][1][1]), "+f"(d[0][1][2]), "+f"(d[0][1][3]), "+f"(d[0][2][0]), "+f"(d[0][2][1]), "+f"(d[0][2][2]), "+f"(d[0][2][3]), "+f"(d[0][3][0]), "+f"(d[0][3][1]), "+f"(d[0][3][2]), "+f"(d[0][3][3]), "+f"(d[0][4][0]), "+f"(d[0][4][1]), "+f"(d[0][4][2]), "+f"(d[0][4][3]), "+f"(d[0][5][0]), "+f"(d[0][5][1]), "+f"(d[0][5][2]), "+f"(d[0][5][3]), "+f"(d[0][6][0]), "+f"(d[0][6][1]), "+f"(d[0][6][2]), "+f"(d[0][6][3]), "+f"(d[0][7][0]), "+f"(d[0][7][1]), "+f"(d[0][7][2]), "+f"(d[0][7][3]), "+f"(d[0][8][0]), "+f"(d[0][8][1]), "+f"(d[0][8][2]), "+f"(d[0][8][3]), "+f"(d[0][9][0]), "+f"(d[0][9][1]), "+f"(d[0][9][2]), "+f"(d[0][9][3]), "+f"(d[0][10][0]), "+f"(d[0][10][1]), "+f"(d[0][10][2]), "+f"(d[0][10][3]), "+f"(d[0][11][0]), "+f"(d[0][11][1]), "+f"(d[0][11][2]), "+f"(d[0][11][3]), "+f"(d[0][12][0]), "+f"(d[0][12][1]), "+f"(d[0][12][2]), "+f"(d[0][12][3]), "+f"(d[0][13][0]), "+f"(d[0][13][1]), "+f"(d[0][13][2]), "+f"(d[0][13][3]), "+f"(d[0][14][0]), "+f"(d[0][14][1]), "+f"(d[0][14][2]), "+f"(d[0][14][3]), "+f"(d[0][15][0]), "+f"(d[0][15][1]), "+f"(d[0][15][2]), "+f"(d[0][15][3])
        : "l"(a), "l"(b), "r"(accumulate));
}

// d (+)= A·Bᵀ for A 64 rows and B 128 rows of 32 byte coordinates (unsigned), both K-major, into
// s32 accumulators: brute_join_tc_bytes's product. 32 bytes of a row an instruction, as
// wgmma_m64n128k16's 16 f16, so the same descriptors and steps serve both. Exact: each product
// is at most 255², a row's sum at most 8,192·255² < 2³¹ (`byte_rows` in src/cuda/launch/pack.rs keeps
// d ≤ 8,192).
__device__ __forceinline__ void wgmma_m64n128k32_u8(int (&d)[1][16][4], u64 a, u64 b, u32 accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.u8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p;\n}\n"
        : "+r"(d[0][0][0]), "+r"(d[0][0][1]), "+r"(d[0][0][2]), "+r"(d[0][0][3]), "+r"(d[0][1][0]), "+r"(d[0][1][1]), "+r"(d[0][1][2]), "+r"(d[0][1][3]), "+r"(d[0][2][0]), "+r"(d[0][2][1]), "+r"(d[0][2][2]), "+r"(d[0][2][3]), "+r"(d[0][3][0]), "+r"(d[0][3][1]), "+r"(d[0][3][2]), "+r"(d[0][3][3]), "+r"(d[0][4][0]), "+r"(d[0][4][1]), "+r"(d[0][4][2]), "+r"(d[0][4][3]), "+r"(d[0][5][0]), "+r"(d[0][5][1]), "+r"(d[0][5][2]), "+r"(d[0][5][3]), "+r"(d[0][6][0]), "+r"(d[0][6][1]), "+r"(d[0][6][2]), "+r"(d[0][6][3]), "+r"(d[0][7][0]), "+r"(d[0][7][1]), "+r"(d[0][7][2]), "+r"(d[0][7][3]), "+r"(d[0][8][0]), "+r"(d[0][8][1]), "+r"(d[0][8][2]), "+r"(d[0][8][3]), "+r"(d[0][9][0]), "+r"(d[0][9][1]), "+r"(d[0][9][2]), "+r"(d[0][9][3]), "+r"(d[0][10][0]), "+r"(d[0][10][1]), "+r"(d[0][10][2]), "+r"(d[0][10][3]), "+r"(d[0][11][0]), "+r"(d[0][11][1]), "+r"(d[0][11][2]), "+r"(d[0][11][3]), "+r"(d[0][12][0]), "+r"(d[0][12][1]), "+r"(d[0][12][2]), "+r"(d[0][12][3]), "+r"(d[0][13][0]), "+r"(d[0][13][1]), "+r"(d[0][13][2]), "+r"(d[0][13][3]), "+r"(d[0][14][0]), "+r"(d[0][14][1]), "+r"(d[0][14][2]), "+r"(d[0][14][3]), "+r"(d[0][15][0]), "+r"(d[0][15][1]), "+r"(d[0][15][2]), "+r"(d[0][15][3])
        : "l"(a), "l"(b), "r"(accumulate));
}

// Orders the warpgroup's earlier register and shared-memory accesses before its next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// Closes the wgmma issued since the last commit into a group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

// Waits until at most `pending` of the warpgroup's groups are unfinished.
template <int pending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(pending) : "memory"); }

// After a wait: accumulators the compiler must read only from here on (they are this statement's
// outputs, and it stays after the wait as volatile statements keep their order).
__device__ __forceinline__ void wgmma_settled(float (&d)[1][16][4]) { asm volatile("" : "+f"(d[0][0][0]), "+f"(d[0][0][1]), "+f"(d[0][0][2]), "+f"(d[0][0][3]), "+f"(d[0][1][0]), "+f"(d[0][1][1]), "+f"(d[0][1][2]), "+f"(d[0][1][3]), "+f"(d[0][2][0]), "+f"(d[0][2][1]), "+f"(d[0][2][2]), "+f"(d[0][2][3]), "+f"(d[0][3][0]), "+f"(d[0][3][1]), "+f"(d[0][3][2]), "+f"(d[0][3][3]), "+f"(d[0][4][0]), "+f"(d[0][4][1]), "+f"(d[0][4][2]), "+f"(d[0][4][3]), "+f"(d[0][5][0]), "+f"(d[0][5][1]), "+f"(d[0][5][2]), "+f"(d[0][5][3]), "+f"(d[0][6][0]), "+f"(d[0][6][1]), "+f"(d[0][6][2]), "+f"(d[0][6][3]), "+f"(d[0][7][0]), "+f"(d[0][7][1]), "+f"(d[0][7][2]), "+f"(d[0][7][3]), "+f"(d[0][8][0]), "+f"(d[0][8][1]), "+f"(d[0][8][2]), "+f"(d[0][8][3]), "+f"(d[0][9][0]), "+f"(d[0][9][1]), "+f"(d[0][9][2]), "+f"(d[0][9][3]), "+f"(d[0][10][0]), "+f"(d[0][10][1]), "+f"(d[0][10][2]), "+f"(d[0][10][3]), "+f"(d[0][11][0]), "+f"(d[0][11][1]), "+f"(d[0][11][2]), "+f"(d[0][11][3]), "+f"(d[0][12][0]), "+f"(d[0][12][1]), "+f"(d[0][12][2]), "+f"(d[0][12][3]), "+f"(d[0][13][0]), "+f"(d[0][13][1]), "+f"(d[0][13][2]), "+f"(d[0][13][3]), "+f"(d[0][14][0]), "+f"(d[0][14][1]), "+f"(d[0][14][2]), "+f"(d[0][14][3]), "+f"(d[0][15][0]), "+f"(d[0][15][1]), "+f"(d[0][15][2]), "+f"(d[0][15][3]) :: "memory"); }

__device__ __forceinline__ void wgmma_settled(int (&d)[1][16][4]) { asm volatile("" : "+r"(d[0][0][0]), "+r"(d[0][0][1]), "+r"(d[0][0][2]), "+r"(d[0][0][3]), "+r"(d[0][1][0]), "+r"(d[0][1][1]), "+r"(d[0][1][2]), "+r"(d[0][1][3]), "+r"(d[0][2][0]), "+r"(d[0][2][1]), "+r"(d[0][2][2]), "+r"(d[0][2][3]), "+r"(d[0][3][0]), "+r"(d[0][3][1]), "+r"(d[0][3][2]), "+r"(d[0][3][3]), "+r"(d[0][4][0]), "+r"(d[0][4][1]), "+r"(d[0][4][2]), "+r"(d[0][4][3]), "+r"(d[0][5][0]), "+r"(d[0][5][1]), "+r"(d[0][5][2]), "+r"(d[0][5][3]), "+r"(d[0][6][0]), "+r"(d[0][6][1]), "+r"(d[0][6][2]), "+r"(d[0][6][3]), "+r"(d[0][7][0]), "+r"(d[0][7][1]), "+r"(d[0][7][2]), "+r"(d[0][7][3]), "+r"(d[0][8][0]), "+r"(d[0][8][1]), "+r"(d[0][8][2]), "+r"(d[0][8][3]), "+r"(d[0][9][0]), "+r"(d[0][9][1]), "+r"(d[0][9][2]), "+r"(d[0][9][3]), "+r"(d[0][10][0]), "+r"(d[0][10][1]), "+r"(d[0][10][2]), "+r"(d[0][10][3]), "+r"(d[0][11][0]), "+r"(d[0][11][1]), "+r"(d[0][11][2]), "+r"(d[0][11][3]), "+r"(d[0][12][0]), "+r"(d[0][12][1]), "+r"(d[0][12][2]), "+r"(d[0][12][3]), "+r"(d[0][13][0]), "+r"(d[0][13][1]), "+r"(d[0][13][2]), "+r"(d[0][13][3]), "+r"(d[0][14][0]), "+r"(d[0][14][1]), "+r"(d[0][14][2]), "+r"(d[0][14][3]), "+r"(d[0][15][0]), "+r"(d[0][15][1]), "+r"(d[0][15][2]), "+r"(d[0][15][3]) :: "memory"); }

// The Hopper tensor memory accelerator (TMA) copies a chunk's tile (128 rows × 32 words) into
// shared memory on one thread's request, in the 128-byte swizzle (the map's, src/cuda/launch/geometry.rs
// `tc_row_map`), with zeros beyond the data, and counts its bytes on an mbarrier that the
// readers wait on: the cp.async loader spent ~170 instructions a warp and step (docs/design.md#gpu-brute).
__device__ __forceinline__ void mbarrier_init(u64* barrier) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((u32)__cvta_generic_to_shared(barrier)) : "memory");
}

// The barrier's current phase completes once `bytes` have arrived (and this one arrival).
__device__ __forceinline__ void mbarrier_expect(u64* barrier, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((u32)__cvta_generic_to_shared(barrier)), "r"(bytes)
                 : "memory");
}

// Waits for the completion of the barrier's phase of parity `parity`.
__device__ __forceinline__ void mbarrier_wait(u64* barrier, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait;\n}\n" ::"r"((u32)__cvta_generic_to_shared(barrier)), "r"(parity)
        : "memory");
}

// The tile of `map` at (word, row) into shared memory at `to`, counted on `barrier`.
__device__ __forceinline__ void tma_tile(const TensorMap& map, u32 to, u32 word, u32 row, u64* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(to), "l"((u64)&map), "r"(word), "r"(row), "r"((u32)__cvta_generic_to_shared(barrier))
        : "memory");
}
#endif
