//! The vectorised f32 filter loops of the CPU backend, compiled for AVX-512, AVX2+FMA and the
//! baseline, and picked at run time (`multiversion`), so one binary is fast on every x86-64 CPU.
//! Each loop works on whole blocks of [`LANES`] values with no data-dependent branch.

use multiversion::multiversion;

/// Values per block (8 f32 = one AVX2 register).
pub const LANES: usize = 8;

/// How the grid filter scores a pair from coordinate differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKind {
    /// Σ Δ² (L2, L2², cosine on unit vectors).
    SquaredL2,
    /// Σ |Δ|.
    L1,
    /// max |Δ|.
    LInf,
}

/// A dimension-major f32 matrix: `values[d * len + p]` is coordinate `d` of position `p`.
#[derive(Debug, Clone, Copy)]
pub struct Columns<'a> {
    /// The values.
    pub values: &'a [f32],
    /// Positions per dimension.
    pub len: usize,
}

/// The (row, column) offsets of the pairs whose score is `<= limit`: left position `rows.start + row`
/// against right position `block.start + column`, for `dims` dimensions. `block.len()` is a
/// multiple of [`LANES`]. Each lane block keeps its accumulators in registers across dimensions.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
#[allow(clippy::too_many_arguments)]
pub fn tile_hits(
    kind: FilterKind,
    dims: usize,
    left: Columns,
    rows: std::ops::Range<usize>,
    right: Columns,
    block: std::ops::Range<usize>,
    limit: f32,
    hits: &mut Vec<(u32, u32)>,
) {
    hits.clear();
    for (row, a) in rows.enumerate() {
        for lane_block in (block.start..block.end).step_by(LANES) {
            let mut acc = [0f32; LANES];
            for d in 0..dims {
                let x = left.values[d * left.len + a];
                let y = &right.values[d * right.len + lane_block..d * right.len + lane_block + LANES];
                match kind {
                    FilterKind::SquaredL2 => {
                        for i in 0..LANES {
                            let t = y[i] - x;
                            acc[i] += t * t;
                        }
                    }
                    FilterKind::L1 => {
                        for i in 0..LANES {
                            acc[i] += (y[i] - x).abs();
                        }
                    }
                    FilterKind::LInf => {
                        for i in 0..LANES {
                            acc[i] = acc[i].max((y[i] - x).abs());
                        }
                    }
                }
            }
            if acc.iter().fold(false, |any, &s| any | (s <= limit)) {
                for (i, &s) in acc.iter().enumerate() {
                    if s <= limit {
                        hits.push((row as u32, (lane_block - block.start + i) as u32));
                    }
                }
            }
        }
    }
}

/// Lower bounds of GEMM-form scores for one query row: `out[j] = s_j − margin·(r + r_j)² − floor`
/// with `s_j = sq + sq_j − 2·dot_j`, or `s_j = −dot_j` for inner product (see `GemmSide`).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_lower_bounds(
    dots: &[f32],
    sq: f32,
    norm: f32,
    sq_other: &[f32],
    norm_other: &[f32],
    margin: f32,
    floor: f32,
    inner_product: bool,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(dots.len(), 0.0);
    let items = out.iter_mut().zip(dots).zip(sq_other.iter().zip(norm_other));
    if inner_product {
        items.for_each(|((o, &d), (_, &r))| {
            let n = norm + r;
            *o = -d - (margin * n * n + floor);
        });
    } else {
        items.for_each(|((o, &d), (&s, &r))| {
            let n = norm + r;
            *o = (sq + s - 2.0 * d) - (margin * n * n + floor);
        });
    }
}

/// The score of two f32 rows of equal length: Σ Δ², Σ |Δ| or max |Δ|, in [`LANES`] partial sums
/// (so the loop vectorises), added lane by lane at the end.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
pub fn row_score(kind: FilterKind, a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (a_blocks, a_tail) = a.split_at(a.len() / LANES * LANES);
    let (b_blocks, b_tail) = b[..a.len()].split_at(a_blocks.len());
    for (x, y) in a_blocks.chunks_exact(LANES).zip(b_blocks.chunks_exact(LANES)) {
        for i in 0..LANES {
            let t = x[i] - y[i];
            acc[i] = match kind {
                FilterKind::SquaredL2 => acc[i] + t * t,
                FilterKind::L1 => acc[i] + t.abs(),
                FilterKind::LInf => acc[i].max(t.abs()),
            };
        }
    }
    for (i, (x, y)) in a_tail.iter().zip(b_tail).enumerate() {
        let t = x - y;
        acc[i] = match kind {
            FilterKind::SquaredL2 => acc[i] + t * t,
            FilterKind::L1 => acc[i] + t.abs(),
            FilterKind::LInf => acc[i].max(t.abs()),
        };
    }
    match kind {
        FilterKind::LInf => acc.iter().fold(0f32, |m, &x| m.max(x)),
        _ => acc.iter().sum(),
    }
}

/// Asks the CPU to start loading the cache line holding `values[0]`, so that a loop over rows at
/// scattered addresses overlaps their loads instead of waiting out each (a hint: no effect on
/// results, nothing on other architectures).
#[inline]
pub fn prefetch(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(first) = values.first() {
        // SAFETY: SSE is part of x86-64's baseline, and a prefetch only hints the cache: it never
        // faults and reads nothing into the program (the address is a live element anyway).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((first as *const f32).cast());
        }
    }
}
