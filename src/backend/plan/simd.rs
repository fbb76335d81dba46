//! The vectorised f32 filter loops of the CPU backend, compiled for AVX-512, AVX2+FMA and the
//! baseline, and picked at run time (`multiversion`), so one binary is fast on every x86-64 CPU.
//! Each loop works on whole blocks of [`LANES`] values with no data-dependent branch.

use multiversion::multiversion;

/// Values per block (8 f32 = one AVX2 register).
pub const LANES: usize = 8;
/// Codes [`coded_score`] takes at a time (16 f32 = one AVX-512 register).
pub const CODE_BLOCK: usize = 16;

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

/// The pairs of a tile that [`tile_hits`] counts instead of listing: scores at or below `limit`
/// (`FilterLimit::sure`: pairs the exact check would keep) in columns `from..to`, and only where
/// `column − row > after` (a self-join's pairs met once: its earlier slot first).
#[derive(Debug, Clone, Copy)]
pub struct SureCount {
    /// Scores at or below this are within the threshold.
    pub limit: f32,
    /// First column that counts.
    pub from: usize,
    /// Column past the last that counts.
    pub to: usize,
    /// A counted pair's column exceeds its row by more than this.
    pub after: i64,
}

impl SureCount {
    /// Counts nothing: every pair that may be within the limit is listed.
    pub const NONE: Self = Self { limit: f32::NEG_INFINITY, from: 0, to: 0, after: i64::MIN };
}

/// The (row, column) offsets of the pairs whose score is `<= limit`: left position `rows.start + row`
/// against right position `block.start + column`, for `dims` dimensions, except those `sure`
/// counts, whose number it returns. `block.len()` is a multiple of [`LANES`]. Each lane block
/// keeps its accumulators in registers across dimensions.
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
    sure: SureCount,
    hits: &mut Vec<(u32, u32)>,
) -> u64 {
    hits.clear();
    let mut counted = 0u64;
    for (row, a) in rows.enumerate() {
        // Columns `first..sure.to` count for this row.
        let first = (sure.from as i64).max((row as i64).saturating_add(sure.after).saturating_add(1));
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
            let column = (lane_block - block.start) as i64;
            let mut listed = false;
            for (i, &s) in acc.iter().enumerate() {
                let c = column + i as i64;
                counted += u64::from(s <= sure.limit && c >= first && c < sure.to as i64);
                listed |= s <= limit && !(s <= sure.limit);
            }
            if listed {
                for (i, &s) in acc.iter().enumerate() {
                    if s <= limit && !(s <= sure.limit) {
                        hits.push((row as u32, (lane_block - block.start + i) as u32));
                    }
                }
            }
        }
    }
    counted
}

/// Values per block of [`gemm_candidates`] (16 f32 = one AVX-512 register).
const CANDIDATE_LANES: usize = 16;

/// The rows of one query's GEMM tile row that the filter cannot rule out: each offset `j` of `dots`
/// whose lower bound `s_j − margin·(r + r_j)² − floor` is at most `bound`, with that bound, in
/// order. `s_j = sq + sq_j − 2·dot_j`, or `s_j = −dot_j` for inner product (see `GemmSide`).
///
/// A block of [`CANDIDATE_LANES`] rows whose bounds all exceed `bound` writes nothing, so the scan
/// costs the bound's arithmetic and one compare a row, with no second pass over stored bounds: in
/// a kNN past its first tiles nearly every block is such.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
#[allow(clippy::too_many_arguments)]
pub fn gemm_candidates(
    dots: &[f32],
    sq: f32,
    norm: f32,
    sq_other: &[f32],
    norm_other: &[f32],
    margin: f32,
    floor: f32,
    inner_product: bool,
    bound: f32,
    hits: &mut Vec<(u32, f32)>,
) {
    hits.clear();
    // −dot_j for inner product, sq + sq_j − 2·dot_j otherwise, with no branch in the loop: the
    // products by 0, 1, −1 and −2 are exact, so both are the scores as written.
    let (norm_weight, dot_weight) = if inner_product { (0.0, -1.0) } else { (1.0, -2.0) };
    let lower = |d: f32, s: f32, n: f32| {
        let r = norm + n;
        (norm_weight * sq + norm_weight * s + dot_weight * d) - (margin * r * r + floor)
    };
    let (sq_other, norm_other) = (&sq_other[..dots.len()], &norm_other[..dots.len()]);
    let blocks = dots.len() / CANDIDATE_LANES;
    let rows = dots.chunks_exact(CANDIDATE_LANES).zip(sq_other.chunks_exact(CANDIDATE_LANES));
    for (b, ((d, s), n)) in rows.zip(norm_other.chunks_exact(CANDIDATE_LANES)).enumerate() {
        let mut low = [0f32; CANDIDATE_LANES];
        for l in 0..CANDIDATE_LANES {
            low[l] = lower(d[l], s[l], n[l]);
        }
        if low.iter().fold(false, |any, &x| any | (x <= bound)) {
            for (l, &x) in low.iter().enumerate() {
                if x <= bound {
                    hits.push(((b * CANDIDATE_LANES + l) as u32, x));
                }
            }
        }
    }
    for j in blocks * CANDIDATE_LANES..dots.len() {
        let x = lower(dots[j], sq_other[j], norm_other[j]);
        if x <= bound {
            hits.push((j as u32, x));
        }
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

/// `Σ wᵢ · (qᵢ − codeᵢ)²` over rows of equal length, a multiple of [`CODE_BLOCK`]: a query in code
/// units (`scaled`, each column's `weights`) against a row of 8-bit codes (index/codes.rs), one
/// vector of lanes per block.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
pub fn coded_score(scaled: &[f32], weights: &[f32], codes: &[u8]) -> f32 {
    let mut acc = [0f32; CODE_BLOCK];
    for ((q, w), c) in
        scaled.chunks_exact(CODE_BLOCK).zip(weights.chunks_exact(CODE_BLOCK)).zip(codes.chunks_exact(CODE_BLOCK))
    {
        for i in 0..CODE_BLOCK {
            let t = q[i] - f32::from(c[i]);
            acc[i] = (w[i] * t).mul_add(t, acc[i]);
        }
    }
    acc.iter().sum()
}

/// `Σ wᵢ · (aᵢ − bᵢ)²` over two rows of 8-bit codes of equal length, a multiple of
/// [`CODE_BLOCK`] (index/codes.rs; `weights` each column's `step²`): the squared distance between
/// the two decoded rows.
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
pub fn coded_pair_score(weights: &[f32], a: &[u8], b: &[u8]) -> f32 {
    let mut acc = [0f32; CODE_BLOCK];
    for ((w, x), y) in weights.chunks_exact(CODE_BLOCK).zip(a.chunks_exact(CODE_BLOCK)).zip(b.chunks_exact(CODE_BLOCK))
    {
        for i in 0..CODE_BLOCK {
            let t = f32::from(x[i]) - f32::from(y[i]);
            acc[i] = (w[i] * t).mul_add(t, acc[i]);
        }
    }
    acc.iter().sum()
}

/// `out[i * n + j] = a_i · b_j` for the `m` rows `a_i` of `a` and the `n` rows `b_j` of `b` (both
/// row-major, `dim` values a row), each dot product in [`LANES`] partial sums. For a few left rows
/// (a kNN of a few queries) this reads each right row once, straight from where it lies, where a
/// GEMM would first copy every right row into its packed panels: that copy cost as much as the
/// products. Any summation order keeps the error bound the filter's margin assumes
/// (`d·u·Σ|xᵢyᵢ|`).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
pub fn dot_rows(a: &[f32], m: usize, b: &[f32], n: usize, dim: usize, out: &mut [f32]) {
    let blocks = dim / LANES * LANES;
    for j in 0..n {
        let y = &b[j * dim..(j + 1) * dim];
        for i in 0..m {
            let x = &a[i * dim..(i + 1) * dim];
            let mut acc = [0f32; LANES];
            for (xs, ys) in x[..blocks].chunks_exact(LANES).zip(y[..blocks].chunks_exact(LANES)) {
                for l in 0..LANES {
                    acc[l] = xs[l].mul_add(ys[l], acc[l]);
                }
            }
            for (l, (xv, yv)) in x[blocks..].iter().zip(&y[blocks..]).enumerate() {
                acc[l] = xv.mul_add(*yv, acc[l]);
            }
            out[i * n + j] = acc.iter().sum();
        }
    }
}

/// `Σ xᵢ²` of an f32 row in f64, in [`LANES`] partial sums (so the loop vectorises; its rounding,
/// ~d·2⁻⁵³ relative, vanishes in the f32 the filter keeps).
#[multiversion(targets("x86_64+avx512f+avx512vl+avx2+fma+avx", "x86_64+avx2+fma+avx", "aarch64+neon"))]
pub fn sum_squares(row: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let blocks = row.len() / LANES * LANES;
    for xs in row[..blocks].chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += xs[l] as f64 * xs[l] as f64;
        }
    }
    for (l, x) in row[blocks..].iter().enumerate() {
        acc[l] += *x as f64 * *x as f64;
    }
    acc.iter().sum()
}

/// Asks the CPU to start loading the cache line holding `values[0]`, so that a loop over rows at
/// scattered addresses overlaps their loads instead of waiting out each (a hint: no effect on
/// results, nothing on other architectures).
#[inline]
pub fn prefetch<T>(values: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(first) = values.first() {
        // SAFETY: SSE is part of x86-64's baseline, and a prefetch only hints the cache: it never
        // faults and reads nothing into the program (the address is a live element anyway).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((first as *const T).cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{dot_rows, gemm_candidates, sum_squares};

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn direct_dot_products_stay_within_the_filters_error_bound() {
        for (m, n, dim) in [(1, 5, 1), (3, 9, 7), (5, 4, 8), (16, 33, 130)] {
            let (a, b) = (values(m * dim, 1), values(n * dim, 2));
            let mut out = vec![f32::NAN; m * n];
            dot_rows(&a, m, &b, n, dim, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (x, y) = (&a[i * dim..(i + 1) * dim], &b[j * dim..(j + 1) * dim]);
                    let exact: f64 = x.iter().zip(y).map(|(&p, &q)| p as f64 * q as f64).sum();
                    let magnitude: f64 = x.iter().zip(y).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                    let bound = dim as f64 * 2f64.powi(-24) * magnitude;
                    assert!((out[i * n + j] as f64 - exact).abs() <= bound, "m {m} n {n} dim {dim} ({i}, {j})");
                }
            }
        }
    }

    /// The scan keeps exactly the rows whose lower bound, written out, is within the bound, with
    /// that bound, on both sides of a block's edge and in the tail.
    #[test]
    fn candidates_are_the_rows_whose_lower_bound_is_within_the_bound() {
        let n = 53;
        let dots = values(n, 4);
        let sq_other: Vec<f32> = values(n, 5).iter().map(|x| x.abs() + 0.5).collect();
        let norm_other: Vec<f32> = sq_other.iter().map(|s| s.sqrt()).collect();
        let (sq, norm, margin, floor) = (0.75f32, 0.75f32.sqrt(), 1e-3, 1e-30);
        for inner_product in [false, true] {
            for bound in [-1.0f32, 0.0, 0.8, 1.5, f32::INFINITY] {
                let expected: Vec<(u32, f32)> = (0..n)
                    .map(|j| {
                        let r = norm + norm_other[j];
                        let score = if inner_product { -dots[j] } else { sq + sq_other[j] - 2.0 * dots[j] };
                        (j as u32, score - (margin * r * r + floor))
                    })
                    .filter(|&(_, low)| low <= bound)
                    .collect();
                let mut hits = vec![(7, 7.0)];
                gemm_candidates(
                    &dots,
                    sq,
                    norm,
                    &sq_other,
                    &norm_other,
                    margin,
                    floor,
                    inner_product,
                    bound,
                    &mut hits,
                );
                assert_eq!(hits, expected, "inner product {inner_product}, bound {bound}");
            }
        }
    }

    #[test]
    fn sums_of_squares_match_f64() {
        for dim in [1, 8, 13, 128] {
            let row = values(dim, 3);
            let exact: f64 = row.iter().map(|&x| x as f64 * x as f64).sum();
            assert!((sum_squares(&row) - exact).abs() <= exact * 1e-12);
        }
    }
}
