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
