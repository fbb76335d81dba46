//! The f32 filter's dot products in bf16 with f32 sums, where the cores multiply bf16 faster than
//! f32: on Intel's AMX tiles (one `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into
//! 16 × 16 f32 sums, sixteen times the multiply-adds of an AVX-512 f32 FMA) or with AVX-512 BF16
//! (`vdpbf16ps`: 16 sums of two products a vector, twice an f32 FMA's; AMD Zen 4 and later, Intel
//! Cooper Lake and later). Both read the same packed rows; docs/design.md#cpu-knn has their
//! measured rates against the f32 GEMM.
//!
//! Rounding to bf16 widens the filter's margin ([`tile_margin`], the proof in `GemmSide`'s terms
//! below); the exact f64 check still decides every pair the filter passes, so answers are the same.

use std::ops::Range;
use std::sync::OnceLock;

use rayon::iter::{IndexedParallelIterator, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};

/// bf16 values per tile row (64 bytes), the dot products' length per `tdpbf16ps`.
const CHUNK: usize = 32;
/// Rows (and columns) per tile.
const TILE: usize = 16;
/// bf16 values per packed tile of the right side (16 pairs of rows of 16 columns × 2).
const TILE_VALUES: usize = TILE * CHUNK;
/// Rows added at the end of both packings, zero: the kernel computes whole 32 × 32 blocks, which
/// may reach 31 rows past the last.
const PAD_ROWS: usize = 2 * TILE;

/// The largest norm of a filter row the tiles take (`‖x̃‖ ≤ 2³⁹`, so `‖x̃‖ + ‖ỹ‖ ≤ 2⁴⁰`): it keeps
/// the absolute error of values flushed below f32's normal range within [`tile_floor`].
pub(super) const TILE_MAX_NORM: f32 = (1u64 << 39) as f32;

/// How the cores compute bf16 dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bf16Unit {
    /// Intel AMX-BF16 tiles.
    Tiles,
    /// AVX-512 BF16 vectors.
    Vectors,
}

/// Whether the cores compute bf16 dot products this process may use.
pub(super) fn available() -> bool {
    unit().is_some()
}

/// The fastest bf16 unit of the cores: AMX where the CPU reports AMX-TILE and AMX-BF16 and Linux
/// grants the process its tile state (`ARCH_REQ_XCOMP_PERM`, once a process, for every thread),
/// else AVX-512 BF16. A fact of the machine, so it is asked once.
fn unit() -> Option<Bf16Unit> {
    static UNIT: OnceLock<Option<Bf16Unit>> = OnceLock::new();
    *UNIT.get_or_init(|| {
        if request_tiles() {
            Some(Bf16Unit::Tiles)
        } else if vectors_supported() {
            Some(Bf16Unit::Vectors)
        } else {
            None
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn vectors_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn vectors_supported() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tiles() -> bool {
    // CPUID leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let amx = leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes two integers and changes only which
    // register state the kernel saves for this process; an unsupported request returns an error.
    amx && unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) } == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tiles() -> bool {
    false
}

/// The margin factor of a score whose dot product comes from the tiles, of `(‖x̃‖ + ‖ỹ‖)²`.
///
/// # Why the filter still loses no pair
/// In GemmSide's terms: each f32 filter value rounds to bf16 to nearest, `x̂ᵢ = x̃ᵢ(1 + δᵢ) + εᵢ`
/// with `|δᵢ| ≤ 2⁻⁸` and `|εᵢ| ≤ η = 2⁻¹²⁶` (the tiles read values below f32's normal range as
/// zero). Products of bf16 values are exact in f32 (8 × 8 significant bits); the tiles add them
/// into f32 sums rounded to nearest, d additions each within 2⁻²⁴ of what it adds (counted here
/// as 2⁻²³). So `|x̂·ŷ − x̃·ỹ| ≤ (2⁻⁷ + 2⁻¹⁶)Σ|x̃ᵢỹᵢ| + d·2⁻²³(1 + 2⁻⁸)²Σ|x̃ᵢỹᵢ| + absolute terms`,
/// and with `Σ|x̃ᵢỹᵢ| ≤ (‖x̃‖ + ‖ỹ‖)²/4` the score `‖x̃‖² + ‖ỹ‖² − 2x̃·ỹ` errs by at most
/// `(2⁻⁸ + 2⁻¹⁷ + d·2⁻²⁴·1.01)·(‖x̃‖ + ‖ỹ‖)²` from its dot product (the inner product's `−x̃·ỹ` by
/// half that). Everything else of GemmSide's analysis (norms, the f64 → f32 rounding, the final
/// additions) is within its margin `(d + 16)·2⁻²³`. The factor here, `2⁻⁸ + 2⁻¹⁴ + (d + 16)·2⁻²²`,
/// covers both. The absolute terms — `(1 + 2⁻⁸)η√d(‖x̃‖ + ‖ỹ‖) + dη²` from the flushed values and
/// `d·2⁻¹²⁶` from sums flushed below the normal range, doubled for the score — stay below
/// `d·2⁻⁸³` while `‖x̃‖ + ‖ỹ‖ ≤ 2⁴⁰` ([`TILE_MAX_NORM`]): [`tile_floor`] adds that to GemmSide's.
pub(super) fn tile_margin(dim: usize) -> f32 {
    2f32.powi(-8) + 2f32.powi(-14) + (dim as f32 + 16.0) * 2f32.powi(-22)
}

/// The absolute margin of a tile score: GemmSide's subnormal floor plus the tiles' (see
/// [`tile_margin`]).
pub(super) fn tile_floor(dim: usize) -> f32 {
    (dim as f32 + 16.0) * 2f32.powi(-140) + dim as f32 * 2f32.powi(-83)
}

/// f32 → bf16, rounded to nearest, ties to even (the values are finite).
#[inline]
fn bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// A side's filter rows in bf16, laid out as the tiles load them.
pub(super) struct TileRows {
    /// The unit whose products these rows are packed for (the cores' fastest).
    unit: Bf16Unit,
    /// Tile rows (of [`CHUNK`] values) a vector takes, its dimensions padded with zeros.
    chunks: usize,
    /// The left side: rows one after another (`chunks · CHUNK` values each), so a tile of 16 rows
    /// loads from any row. The right side: blocks of 16 rows, each chunk a tile of 16 pairs of
    /// dimensions × 16 rows × 2 (the pairs interleaved, as `tdpbf16ps` reads its second operand).
    values: Vec<u16>,
}

impl TileRows {
    /// `data` (rows of `dim` f32 values) as the left operand of [`dot_tile`].
    pub(super) fn left(data: &[f32], dim: usize) -> Self {
        let chunks = dim.div_ceil(CHUNK);
        let width = chunks * CHUNK;
        let rows = data.len() / dim.max(1);
        let mut values = vec![0u16; (rows + PAD_ROWS) * width];
        values[..rows * width].par_chunks_mut(width).zip(data.par_chunks(dim)).for_each(|(out, row)| {
            out.iter_mut().zip(row).for_each(|(o, &x)| *o = bf16(x));
        });
        Self { unit: unit().expect("bf16 rows without a bf16 unit"), chunks, values }
    }

    /// `data` (rows of `dim` f32 values) as the right operand of [`dot_tile`].
    pub(super) fn right(data: &[f32], dim: usize) -> Self {
        let chunks = dim.div_ceil(CHUNK);
        let rows = data.len() / dim.max(1);
        let blocks = (rows + PAD_ROWS).div_ceil(TILE);
        let mut values = vec![0u16; blocks * chunks * TILE_VALUES];
        values.par_chunks_mut(chunks * TILE_VALUES).enumerate().for_each(|(block, out)| {
            for col in 0..TILE.min(rows.saturating_sub(block * TILE)) {
                let row = &data[(block * TILE + col) * dim..][..dim];
                for (k, &x) in row.iter().enumerate() {
                    let (chunk, pair, half) = (k / CHUNK, (k % CHUNK) / 2, k % 2);
                    out[chunk * TILE_VALUES + pair * 2 * TILE + col * 2 + half] = bf16(x);
                }
            }
        });
        Self { unit: unit().expect("bf16 rows without a bf16 unit"), chunks, values }
    }
}

/// Where row `i` of a dot tile lies in its buffer: `tile[i * stride + offset..][..n]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct TileLayout {
    pub(super) stride: usize,
    pub(super) offset: usize,
}

impl TileLayout {
    /// Row `i` (of `n` dot products) of `tile`.
    #[inline]
    pub(super) fn row<'t>(&self, tile: &'t [f32], i: usize, n: usize) -> &'t [f32] {
        &tile[i * self.stride + self.offset..][..n]
    }
}

/// The 64-byte tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

#[cfg(target_arch = "x86_64")]
impl TileConfig {
    fn sixteen_by_sixty_four() -> Self {
        let mut config = [0u8; 64];
        config[0] = 1;
        for t in 0..8 {
            config[16 + 2 * t] = 64; // bytes per row (u16, little-endian)
            config[48 + t] = TILE as u8; // rows
        }
        Self(config)
    }
}

/// `tile[i · stride + offset + j] = x̂_(q.start + i) · ŷ_(r.start + j)` for every row `i` of `q` and
/// `j` of `r`, on the cores' bf16 unit, in whole blocks (so the buffer also holds products of the
/// padding and of neighbouring rows, which no row reads).
pub(super) fn dot_tile(
    left: &TileRows,
    right: &TileRows,
    q: Range<usize>,
    r: Range<usize>,
    tile: &mut Vec<f32>,
) -> TileLayout {
    assert!(left.unit == right.unit, "dot_tile of rows packed for different units");
    let unit = left.unit;
    assert!(left.chunks == right.chunks, "dot_tile with unequal widths");
    let block_rows = match unit {
        Bf16Unit::Tiles => 2 * TILE,
        Bf16Unit::Vectors => VECTOR_ROWS,
    };
    let offset = r.start % TILE;
    let blocks = Blocks {
        chunks: left.chunks,
        first_row: q.start,
        first_block: r.start / TILE,
        rows: q.len().div_ceil(block_rows) * block_rows,
        cols: (offset + r.len()).div_ceil(2 * TILE) * 2 * TILE,
    };
    // Every block the kernels read lies within the packings (each holds PAD_ROWS rows past its
    // end, at least a block's rows).
    assert!((blocks.first_row + blocks.rows) * blocks.chunks * CHUNK <= left.values.len());
    assert!((blocks.first_block + blocks.cols / TILE) * blocks.chunks * TILE_VALUES <= right.values.len());
    tile.resize(blocks.rows * blocks.cols, 0.0);
    match unit {
        #[cfg(target_arch = "x86_64")]
        Bf16Unit::Tiles => amx_products(left, right, &blocks, tile),
        #[cfg(target_arch = "x86_64")]
        Bf16Unit::Vectors => vector_products(left, right, &blocks, tile),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("bf16 units are x86-64's"),
    }
    TileLayout { stride: blocks.cols, offset }
}

/// The blocks of a dot tile: left rows `first_row ..+ rows` against right blocks of 16 rows from
/// `first_block`, `cols` columns (a multiple of 32), into a `rows × cols` buffer.
struct Blocks {
    chunks: usize,
    first_row: usize,
    first_block: usize,
    rows: usize,
    cols: usize,
}

/// Left rows per block of the vector kernel: 12 rows × 2 vectors of 16 sums are 24 of AVX-512's
/// 32 registers, beside the two right vectors and a broadcast left pair.
const VECTOR_ROWS: usize = 12;

/// [`dot_tile`]'s products with AVX-512 BF16, in blocks of 12 × 32: for each pair of dimensions,
/// a left row's pair broadcast to every lane times 16 right rows' pairs (the packed tile's rows).
#[cfg(target_arch = "x86_64")]
fn vector_products(left: &TileRows, right: &TileRows, blocks: &Blocks, tile: &mut [f32]) {
    assert!(vectors_supported(), "AVX-512 BF16 is not available");
    let &Blocks { chunks, first_row, first_block, rows, cols } = blocks;
    let width = chunks * CHUNK;
    for pair in 0..cols / (2 * TILE) {
        let b0 = (first_block + 2 * pair) * chunks * TILE_VALUES;
        let b1 = b0 + chunks * TILE_VALUES;
        for block in 0..rows / VECTOR_ROWS {
            let a = (first_row + block * VECTOR_ROWS) * width;
            let c = block * VECTOR_ROWS * cols + 2 * TILE * pair;
            // SAFETY: the CPU has AVX-512F and AVX-512 BF16 (asserted). The kernel reads rows
            // `a / width ..+ 12` of the left packing (within it by `dot_tile`'s first
            // assertion), the `width / 2` pairs of 16 values of right blocks 2·pair and
            // 2·pair + 1 (a block's chunks are consecutive, so its pairs are: within it by the
            // second), and writes 12 rows of 32 values a row every `cols` values from `c`, within
            // `tile` (rows · cols values), which nothing else borrows.
            unsafe {
                vector_block(
                    left.values.as_ptr().add(a),
                    width,
                    right.values.as_ptr().add(b0),
                    right.values.as_ptr().add(b1),
                    tile.as_mut_ptr().add(c),
                    cols,
                )
            };
        }
    }
}

/// 12 × 32 dot products: `out[m · stride + j]` for left rows `m` (a row every `width` values from
/// `left`) and the 16 rows of `right0` then of `right1`, each `width / 2` pairs of 16 × 2 values.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; the pointers hold what the comment above says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn vector_block(
    left: *const u16,
    width: usize,
    right0: *const u16,
    right1: *const u16,
    out: *mut f32,
    stride: usize,
) {
    use std::arch::x86_64::{
        __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_loadu_si512, _mm512_set1_epi32, _mm512_setzero_ps, _mm512_storeu_ps,
    };
    let mut sums = [[_mm512_setzero_ps(); 2]; VECTOR_ROWS];
    for p in 0..width / 2 {
        // SAFETY (all reads and writes here): within the ranges the caller guarantees; the
        // transmutes reinterpret 64 bytes of bf16 pairs as the vector type `vdpbf16ps` takes.
        unsafe {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(right0.add(32 * p).cast::<__m512i>()));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(right1.add(32 * p).cast::<__m512i>()));
            for (m, row) in sums.iter_mut().enumerate() {
                let pair = left.add(m * width + 2 * p).cast::<i32>().read_unaligned();
                let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                row[0] = _mm512_dpbf16_ps(row[0], a, b0);
                row[1] = _mm512_dpbf16_ps(row[1], a, b1);
            }
        }
    }
    for (m, row) in sums.iter().enumerate() {
        // SAFETY: row m's 32 values lie within `out` (the caller's guarantee).
        unsafe {
            _mm512_storeu_ps(out.add(m * stride), row[0]);
            _mm512_storeu_ps(out.add(m * stride + 16), row[1]);
        }
    }
}

/// [`dot_tile`]'s products on AMX tiles, in whole blocks of 32 × 32 (four accumulator tiles, two
/// of each operand's).
#[cfg(target_arch = "x86_64")]
fn amx_products(left: &TileRows, right: &TileRows, blocks: &Blocks, tile: &mut [f32]) {
    assert!(unit() == Some(Bf16Unit::Tiles), "AMX tiles are not available");
    let &Blocks { chunks, first_row, first_block, rows, cols } = blocks;
    let config = TileConfig::sixteen_by_sixty_four();
    let (left_row_bytes, tile_stride_bytes) = (chunks * CHUNK * 2, cols * 4);
    // SAFETY: the unit is AMX (asserted), so the CPU has AMX-TILE and AMX-BF16 and the kernel saves this
    // thread's tile state; the configuration is 64 bytes, aligned to 64, palette 1 with eight tiles
    // of 16 rows × 64 bytes, which every load, product and store below uses.
    unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
    for pair in 0..cols / (2 * TILE) {
        let b0 = (first_block + 2 * pair) * chunks * TILE_VALUES;
        let b1 = b0 + chunks * TILE_VALUES;
        for quad in 0..rows / (2 * TILE) {
            let a0 = (first_row + 2 * TILE * quad) * chunks * CHUNK;
            let a1 = a0 + TILE * chunks * CHUNK;
            // SAFETY: tiles 0–3 are the four accumulators of this 32 × 32 block.
            unsafe {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                )
            };
            for c in 0..chunks {
                // SAFETY: each load reads 16 rows of 64 bytes: the left ones at `a0`/`a1` plus
                // `c · CHUNK` values, a row every `left_row_bytes`, within `left.values` by the
                // first assertion of `dot_tile` (rows first_row + 32·quad + 31 < first_row +
                // rows); the right ones a contiguous packed tile (stride 64) of block 2·pair or
                // 2·pair + 1, within `right.values` by the second. The products only touch tile
                // registers.
                unsafe {
                    std::arch::asm!(
                        "tileloadd tmm4, [{a0} + {sa}*1]",
                        "tileloadd tmm5, [{a1} + {sa}*1]",
                        "tileloadd tmm6, [{b0} + {sb}*1]",
                        "tileloadd tmm7, [{b1} + {sb}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) left.values.as_ptr().add(a0 + c * CHUNK),
                        a1 = in(reg) left.values.as_ptr().add(a1 + c * CHUNK),
                        b0 = in(reg) right.values.as_ptr().add(b0 + c * TILE_VALUES),
                        b1 = in(reg) right.values.as_ptr().add(b1 + c * TILE_VALUES),
                        sa = in(reg) left_row_bytes,
                        sb = in(reg) 2 * CHUNK,
                        options(nostack, readonly),
                    );
                }
            }
            let c00 = 2 * TILE * quad * cols + 2 * TILE * pair;
            // SAFETY: the four stores write 16 rows of 16 f32 each at rows 32·quad (+16) and
            // columns 32·pair (+16) of the `rows × cols` buffer, a row every `cols` values: all
            // within `tile`, of rows · cols values, which nothing else borrows.
            unsafe {
                let out = tile.as_mut_ptr();
                std::arch::asm!(
                    "tilestored [{c00} + {s}*1], tmm0",
                    "tilestored [{c01} + {s}*1], tmm1",
                    "tilestored [{c10} + {s}*1], tmm2",
                    "tilestored [{c11} + {s}*1], tmm3",
                    c00 = in(reg) out.add(c00),
                    c01 = in(reg) out.add(c00 + TILE),
                    c10 = in(reg) out.add(c00 + TILE * cols),
                    c11 = in(reg) out.add(c00 + TILE * cols + TILE),
                    s = in(reg) tile_stride_bytes,
                    options(nostack),
                );
            }
        }
    }
    // SAFETY: returns the tile registers to their initial state (nothing reads them after this).
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
}

#[cfg(test)]
mod tests {
    use super::{Bf16Unit, TileRows, dot_tile, request_tiles, vectors_supported};

    /// Unaligned row ranges of both sides and widths around the tiles' 32 values, on each bf16
    /// unit the cores have: every product within the bf16 bound of the f32 one.
    #[test]
    fn bf16_products_are_the_rows_dot_products_within_the_bf16_bound() {
        let units: Vec<Bf16Unit> = [(Bf16Unit::Tiles, request_tiles()), (Bf16Unit::Vectors, vectors_supported())]
            .into_iter()
            .filter_map(|(unit, present)| present.then_some(unit))
            .collect();
        if units.is_empty() {
            eprintln!("no bf16 unit on this CPU: nothing to test");
        }
        for unit in units {
            for dim in [3, 32, 50, 128, 200] {
                let value = |i: usize| ((i.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) / 997.0;
                let left: Vec<f32> = (0..90 * dim).map(value).collect();
                let right: Vec<f32> = (0..1100 * dim).map(|i| value(i + 7)).collect();
                let (mut a, mut b) = (TileRows::left(&left, dim), TileRows::right(&right, dim));
                (a.unit, b.unit) = (unit, unit);
                let mut tile = Vec::new();
                for (q, r) in [(0..90, 0..1100), (5..70, 17..1030), (89..90, 1099..1100)] {
                    let layout = dot_tile(&a, &b, q.clone(), r.clone(), &mut tile);
                    for (i, qi) in q.clone().enumerate() {
                        let row = layout.row(&tile, i, r.len());
                        for (j, rj) in r.clone().enumerate() {
                            let (x, y) = (&left[qi * dim..][..dim], &right[rj * dim..][..dim]);
                            let exact: f64 = x.iter().zip(y).map(|(&u, &v)| u as f64 * v as f64).sum();
                            let sum_abs: f64 = x.iter().zip(y).map(|(&u, &v)| (u as f64 * v as f64).abs()).sum();
                            let bound = (2f64.powi(-7) + dim as f64 * 2f64.powi(-22)) * sum_abs + 1e-30;
                            assert!((row[j] as f64 - exact).abs() <= bound, "{unit:?}, dim {dim}, ({qi}, {rj})");
                        }
                    }
                }
            }
        }
    }
}
