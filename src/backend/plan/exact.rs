//! The exact f64 test every backend applies to its candidate pairs: [`Metric::distance`] evaluated
//! term by term in natural dimension order, with a short-circuit that cannot change the answer.

use crate::backend::KnnRequest;
use crate::backend::plan::bounds::largest_square_within;
use crate::backend::plan::topk::KSmallest;
use crate::backend::plan::topk::Neighbour;
use crate::op::{Metric, cosine_from_parts, dot, row_norm};
use crate::vectors::{Coord, Row, Vectors};

/// Decides `Metric::distance(a, b) <= threshold` and returns the distance when it holds.
#[derive(Debug, Clone)]
pub struct ExactCheck {
    metric: Metric,
    threshold: f64,
    /// Bound on partial sums past which a pair cannot qualify. Terms are non-negative, so rounded
    /// partial sums never decrease: a partial sum above this bound means the full sum is too.
    /// For L2 it is ε² widened by 2⁻⁴⁰, above every sum whose rounded square root is ≤ ε.
    partial_limit: f64,
    /// L2 and L2²: the largest sum of squares that qualifies (for L2 the largest whose rounded
    /// square root is ≤ ε: the square root is correctly rounded and so monotone, and a sum
    /// qualifies exactly when it is at most this), for a decision without the root.
    sum_limit: f64,
    /// Cosine only: Σx² of each left vector, summed in order (the same bits `distance` computes).
    left_norms: Vec<f64>,
    /// Cosine only: Σx² of each right vector.
    right_norms: Vec<f64>,
}

impl ExactCheck {
    /// The test for `threshold` between vectors of `left` and `right`.
    pub fn new(metric: Metric, threshold: f64, left: &Vectors, right: &Vectors) -> Self {
        let partial_limit = match metric {
            Metric::L2 => threshold * threshold * (1.0 + 1.0 / (1u64 << 40) as f64),
            _ => threshold,
        };
        let norms = |v: &Vectors| -> Vec<f64> {
            if metric == Metric::Cosine { (0..v.len()).map(|i| row_norm(v.row(i))).collect() } else { Vec::new() }
        };
        let left_norms = norms(left);
        let right_norms = if std::ptr::eq(left, right) { left_norms.clone() } else { norms(right) };
        let sum_limit = if metric == Metric::L2 { largest_square_within(threshold) } else { threshold };
        Self { metric, threshold, partial_limit, sum_limit, left_norms, right_norms }
    }

    /// Whether two f64 rows qualify, decided as [`ExactCheck::within_f64`] decides it but without
    /// the distance (L2 compares the sum of squares with [`ExactCheck::sum_limit`]: no root), for
    /// a join that counts its pairs.
    #[inline(always)]
    pub fn qualifies_f64(&self, a: &[f64], b: &[f64], ia: usize, ib: usize) -> bool {
        match self.metric {
            Metric::L2 | Metric::L2Squared => self.squares_within(a, b).is_some_and(|sum| sum <= self.sum_limit),
            _ => self.within_of(a, b, ia, ib).is_some(),
        }
    }

    /// The distance between left vector `ia` (values `a`) and right vector `ib` (values `b`) when
    /// it is within the threshold.
    #[inline]
    pub fn within(&self, a: Row, b: Row, ia: usize, ib: usize) -> Option<f64> {
        crate::on_rows!(a, b, |x, y| self.within_of(x, y, ia, ib))
    }

    /// [`ExactCheck::within`] of two f64 rows, inlined into the caller's loop: the candidates of
    /// a low-dimensional grid join are mostly true pairs, each checked here, and a call with its
    /// dispatch on the rows' types cost more than the few terms of its sum.
    #[inline(always)]
    pub fn within_f64(&self, a: &[f64], b: &[f64], ia: usize, ib: usize) -> Option<f64> {
        self.within_of(a, b, ia, ib)
    }

    /// The sum of squared differences of L2 and L2², unless a partial sum of it (every 8 terms)
    /// exceeds the partial limit.
    #[inline(always)]
    fn squares_within<A: Coord, B: Coord>(&self, a: &[A], b: &[B]) -> Option<f64> {
        let limit = self.partial_limit;
        if a.len() <= 8 {
            // One block, whose partial sum is the whole: the same sum and test without the
            // blocks' loop (most grid joins' rows).
            let sum = a.iter().zip(b).fold(0.0, |sum, (x, y)| {
                let d = x.f64() - y.f64();
                sum + d * d
            });
            return (sum <= limit).then_some(sum);
        }
        let mut sum = 0.0;
        for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
            for (x, y) in ca.iter().zip(cb) {
                let d = x.f64() - y.f64();
                sum += d * d;
            }
            if sum > limit {
                return None;
            }
        }
        Some(sum)
    }

    /// [`ExactCheck::within`] of the rows' values, each widened to f64 as it is read.
    #[inline(always)]
    fn within_of<A: Coord, B: Coord>(&self, a: &[A], b: &[B], ia: usize, ib: usize) -> Option<f64> {
        let limit = self.partial_limit;
        let distance = match self.metric {
            Metric::L2 | Metric::L2Squared => {
                let sum = self.squares_within(a, b)?;
                if self.metric == Metric::L2 { sum.sqrt() } else { sum }
            }
            Metric::L1 => {
                let mut sum = 0.0;
                for (ca, cb) in a.chunks(8).zip(b.chunks(8)) {
                    for (x, y) in ca.iter().zip(cb) {
                        sum += (x.f64() - y.f64()).abs();
                    }
                    if sum > limit {
                        return None;
                    }
                }
                sum
            }
            Metric::LInf => {
                let mut max = 0.0f64;
                for (x, y) in a.iter().zip(b) {
                    max = max.max((x.f64() - y.f64()).abs());
                    if max > limit {
                        return None;
                    }
                }
                max
            }
            Metric::Cosine | Metric::InnerProduct | Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => {
                self.distance_of(a, b, ia, ib)
            }
        };
        (distance <= self.threshold).then_some(distance)
    }

    /// The exact distance, bit for bit `Metric::distance(a, b)`.
    #[inline]
    pub fn distance(&self, a: Row, b: Row, ia: usize, ib: usize) -> f64 {
        crate::on_rows!(a, b, |x, y| self.distance_of(x, y, ia, ib))
    }

    #[inline]
    fn distance_of<A: Coord, B: Coord>(&self, a: &[A], b: &[B], ia: usize, ib: usize) -> f64 {
        match self.metric {
            Metric::Cosine => cosine_from_parts(dot(a, b), self.left_norms[ia], self.right_norms[ib]),
            metric => metric.distance(a, b),
        }
    }

    /// `distance(a, rows[l], ia, ibs[l])` for four rows at once, bit for bit: the same operations
    /// in the same order per row, four independent chains in flight. One distance is a chain of d
    /// dependent additions, each waiting out the latency of the one before; four interleaved fill
    /// those waits (the exact re-rank of a kNN at large k is mostly such chains, docs/design.md#cpu-knn).
    #[inline]
    pub fn distances4(&self, a: Row, ia: usize, rows: [Row; 4], ibs: [usize; 4]) -> [f64; 4] {
        match rows[0] {
            Row::F64(_) => crate::on_row!(a, |x| self.distances4_of(x, ia, rows.map(f64::of_row), ibs)),
            Row::F32(_) => crate::on_row!(a, |x| self.distances4_of(x, ia, rows.map(f32::of_row), ibs)),
        }
    }

    #[inline]
    fn distances4_of<A: Coord, B: Coord>(&self, a: &[A], ia: usize, rows: [&[B]; 4], ibs: [usize; 4]) -> [f64; 4] {
        let dim = a.len();
        let rows = rows.map(|row| &row[..dim]);
        let mut acc = [0.0f64; 4];
        match self.metric {
            Metric::L2 | Metric::L2Squared => {
                for (d, x) in a.iter().enumerate() {
                    let x = x.f64();
                    for (sum, row) in acc.iter_mut().zip(&rows) {
                        let t = x - row[d].f64();
                        *sum += t * t;
                    }
                }
            }
            Metric::Cosine | Metric::InnerProduct => {
                for (d, x) in a.iter().enumerate() {
                    let x = x.f64();
                    for (sum, row) in acc.iter_mut().zip(&rows) {
                        *sum += x * row[d].f64();
                    }
                }
            }
            Metric::L1 => {
                for (d, x) in a.iter().enumerate() {
                    let x = x.f64();
                    for (sum, row) in acc.iter_mut().zip(&rows) {
                        *sum += (x - row[d].f64()).abs();
                    }
                }
            }
            Metric::LInf => {
                for (d, x) in a.iter().enumerate() {
                    let x = x.f64();
                    for (max, row) in acc.iter_mut().zip(&rows) {
                        *max = max.max((x - row[d].f64()).abs());
                    }
                }
            }
            Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => {
                unreachable!("only vectors reach the exact check")
            }
        }
        let mut out = acc;
        for (value, ib) in out.iter_mut().zip(ibs) {
            *value = self.finish(*value, ia, ib);
        }
        out
    }

    /// The distance from its accumulated sum (of squares, products, absolute differences, or the
    /// largest difference), as `Metric::distance` finishes it.
    #[inline]
    fn finish(&self, sum: f64, ia: usize, ib: usize) -> f64 {
        match self.metric {
            Metric::L2 => sum.sqrt(),
            Metric::Cosine => cosine_from_parts(sum, self.left_norms[ia], self.right_norms[ib]),
            Metric::InnerProduct => -sum,
            Metric::L2Squared | Metric::L1 | Metric::LInf => sum,
            Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => {
                unreachable!("only vectors reach the exact check")
            }
        }
    }

    /// `distance(a, rows[l], ia, ibs[l])` for eight rows at once, bit for bit. Rows kept in f32 of
    /// the GEMM-form metrics go eight to a vector of f64 sums (AVX-512: each lane the same
    /// operations in the same order as one row's chain, the rows' values transposed into lanes
    /// eight dimensions at a time); anything else as two groups of four.
    #[inline]
    pub fn distances8(&self, a: Row, ia: usize, rows: [Row; 8], ibs: [usize; 8]) -> [f64; 8] {
        if let Some(sums) = self.sums8(a, rows) {
            return std::array::from_fn(|l| self.finish(sums[l], ia, ibs[l]));
        }
        let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
        let [i0, i1, i2, i3, i4, i5, i6, i7] = ibs;
        let (low, high) = (
            self.distances4(a, ia, [r0, r1, r2, r3], [i0, i1, i2, i3]),
            self.distances4(a, ia, [r4, r5, r6, r7], [i4, i5, i6, i7]),
        );
        std::array::from_fn(|l| if l < 4 { low[l] } else { high[l - 4] })
    }

    /// The eight rows' sums in AVX-512's f64 lanes, where the metric is a GEMM form, the rows are
    /// kept in f32 and the CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn sums8(&self, a: Row, rows: [Row; 8]) -> Option<[f64; 8]> {
        let squares = match self.metric {
            Metric::L2 | Metric::L2Squared => true,
            Metric::Cosine | Metric::InnerProduct => false,
            _ => return None,
        };
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return None;
        }
        let rows = all_f32(rows)?;
        // SAFETY: the CPU has AVX-512F (just asked), the kernel's one requirement.
        Some(crate::on_row!(a, |x| unsafe {
            if squares { lanes8::sums::<_, true>(x, rows) } else { lanes8::sums::<_, false>(x, rows) }
        }))
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    fn sums8(&self, _a: Row, _rows: [Row; 8]) -> Option<[f64; 8]> {
        None
    }
}

/// The rows' f32 values when all eight are kept in f32.
#[cfg(target_arch = "x86_64")]
fn all_f32<'a>(rows: [Row<'a>; 8]) -> Option<[&'a [f32]; 8]> {
    let mut out: [&'a [f32]; 8] = [&[]; 8];
    for (o, row) in out.iter_mut().zip(rows) {
        match row {
            Row::F32(values) => *o = values,
            Row::F64(_) => return None,
        }
    }
    Some(out)
}

/// Eight exact sums at once in AVX-512's f64 lanes.
#[cfg(target_arch = "x86_64")]
mod lanes8 {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_unpackhi_ps,
        _mm256_unpacklo_ps, _mm512_add_pd, _mm512_cvtps_pd, _mm512_mul_pd, _mm512_set1_pd, _mm512_setzero_pd,
        _mm512_storeu_pd, _mm512_sub_pd,
    };

    use crate::vectors::Coord;

    /// Lane `l`: `Σ_d (a_d − rows[l]_d)²` (`SQUARES`) or `Σ_d a_d·rows[l]_d`, over d in order,
    /// each term and addition in f64 without fusing (so every lane is bit for bit the scalar sum).
    /// Eight dimensions of the eight rows are loaded and transposed (an 8 × 8 f32 transpose), so
    /// vector `k` holds dimension d + k of every row; the last `dim % 8` terms follow one lane at
    /// a time, still in order.
    ///
    /// # Safety
    /// The CPU has AVX-512F. Every row holds at least `a.len()` values (checked).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sums<A: Coord, const SQUARES: bool>(a: &[A], rows: [&[f32]; 8]) -> [f64; 8] {
        let dim = a.len();
        assert!(rows.iter().all(|row| row.len() >= dim), "exact check of rows shorter than the query");
        let mut acc = _mm512_setzero_pd();
        let mut d = 0;
        while d + 8 <= dim {
            let mut r = [_mm256_setzero_ps(); 8];
            for (v, row) in r.iter_mut().zip(rows) {
                // SAFETY: d + 8 ≤ dim ≤ the row's length (asserted): the load reads its values.
                *v = unsafe { _mm256_loadu_ps(row.as_ptr().add(d)) };
            }
            let (t0, t1) = (_mm256_unpacklo_ps(r[0], r[1]), _mm256_unpackhi_ps(r[0], r[1]));
            let (t2, t3) = (_mm256_unpacklo_ps(r[2], r[3]), _mm256_unpackhi_ps(r[2], r[3]));
            let (t4, t5) = (_mm256_unpacklo_ps(r[4], r[5]), _mm256_unpackhi_ps(r[4], r[5]));
            let (t6, t7) = (_mm256_unpacklo_ps(r[6], r[7]), _mm256_unpackhi_ps(r[6], r[7]));
            let (s0, s1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
            let (s2, s3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
            let (s4, s5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
            let (s6, s7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
            let columns = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (k, column) in columns.into_iter().enumerate() {
                let (x, y) = (_mm512_set1_pd(a[d + k].f64()), _mm512_cvtps_pd(column));
                acc = if SQUARES {
                    let t = _mm512_sub_pd(x, y);
                    _mm512_add_pd(acc, _mm512_mul_pd(t, t))
                } else {
                    _mm512_add_pd(acc, _mm512_mul_pd(x, y))
                };
            }
            d += 8;
        }
        let mut out = [0f64; 8];
        // SAFETY: `out` holds eight f64.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), acc) };
        for (sum, row) in out.iter_mut().zip(rows) {
            for (x, &y) in a[d..].iter().zip(&row[d..dim]) {
                let (x, y) = (x.f64(), y as f64);
                *sum += if SQUARES { (x - y) * (x - y) } else { x * y };
            }
        }
        out
    }
}

/// Self-join with `include_self`: writes each vector at `positions` paired with itself when its own
/// distance qualifies (the same exact test as every other pair; not always 0 for cosine and inner
/// product). The one place both backends get these pairs from.
pub(crate) fn write_self_pairs(
    exact: &ExactCheck,
    vectors: &Vectors,
    positions: impl IntoIterator<Item = usize>,
    writer: &mut crate::backend::PairWriter,
) -> datafusion::common::Result<()> {
    for i in positions {
        if let Some(d) = exact.within(vectors.row(i), vectors.row(i), i, i) {
            writer.push(i as u32, i as u32, d)?;
        }
    }
    Ok(())
}

/// Offers query `i` to `best` at its exact distance to each base row of `positions`, eight rows at
/// a time (`ExactCheck::distances8`); the number offered.
pub(crate) fn offer_exact(
    request: &KnnRequest,
    exact: &ExactCheck,
    i: usize,
    positions: impl Iterator<Item = usize>,
    best: &mut KSmallest,
) -> u64 {
    offer_exact_rows(request.queries.row(i), exact, i, positions, |j| request.base.row(j), best)
}

/// [`offer_exact`] with base row `j` read as `base_row(j)`, which must hold the base's values
/// exactly (so that the distances are bit for bit the same).
pub(crate) fn offer_exact_rows<'a>(
    query: Row,
    exact: &ExactCheck,
    i: usize,
    positions: impl Iterator<Item = usize>,
    base_row: impl Fn(usize) -> Row<'a>,
    best: &mut KSmallest,
) -> u64 {
    let (mut group, mut filled, mut offered) = ([0usize; 8], 0, 0);
    for j in positions {
        group[filled] = j;
        filled += 1;
        offered += 1;
        if filled == 8 {
            let distances = exact.distances8(query, i, group.map(&base_row), group);
            for (distance, j) in distances.into_iter().zip(group) {
                best.push(Neighbour { distance, position: j as u32 });
            }
            filled = 0;
        }
    }
    let mut rest = &group[..filled];
    if let Some((four, tail)) = rest.split_first_chunk::<4>() {
        let distances = exact.distances4(query, i, four.map(&base_row), *four);
        for (distance, &j) in distances.into_iter().zip(four) {
            best.push(Neighbour { distance, position: j as u32 });
        }
        rest = tail;
    }
    for &j in rest {
        best.push(Neighbour { distance: exact.distance(query, base_row(j), i, j), position: j as u32 });
    }
    offered
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::ExactCheck;
    use crate::backend::plan::bounds::largest_square_within;
    use crate::op::Metric;
    use crate::vectors::{Values, Vectors};

    #[test]
    fn counting_decides_as_listing_does() {
        // Thresholds and pairs at the edge: distances equal to ε, an ulp or two either side, and
        // sums of squares whose roots round onto ε.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for metric in Metric::ALL.into_iter().filter(|m| *m != Metric::Levenshtein) {
            for threshold in [0.0, 1e-3, 0.1, 1.0 / 3.0, 0.7, 2.0, 1e10, f64::INFINITY] {
                assert!(largest_square_within(threshold).sqrt() <= threshold);
                if threshold.is_finite() {
                    assert!(largest_square_within(threshold).next_up().sqrt() > threshold);
                }
                for dim in [1, 2, 3, 9] {
                    let mut values = Vec::new();
                    for _ in 0..64 {
                        // A point and one at distance about ε from it, along a random direction.
                        let a: Vec<f64> = (0..dim).map(|_| rng.random::<f64>()).collect();
                        let direction: Vec<f64> = (0..dim).map(|_| rng.random::<f64>() - 0.5).collect();
                        let norm = direction.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
                        let step = if threshold.is_finite() { threshold } else { 1.0 };
                        let scale = step * (1.0 + (rng.random::<f64>() - 0.5) * 1e-15) / norm;
                        values.extend(&a);
                        values.extend(a.iter().zip(&direction).map(|(x, d)| x + d * scale));
                    }
                    let v = Vectors::new(dim, values);
                    let check = ExactCheck::new(metric, threshold, &v, &v);
                    for i in (0..v.len()).step_by(2) {
                        for j in [i + 1, (i + 3) % v.len()] {
                            let (a, b) = (v.row(i).to_vec(), v.row(j).to_vec());
                            let listed = check.within_f64(&a, &b, i, j).is_some();
                            assert_eq!(check.qualifies_f64(&a, &b, i, j), listed, "{metric} ε={threshold} ({i}, {j})");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn eight_at_once_equal_one_at_a_time_bit_for_bit() {
        // f32 rows (the lanes' path) with a query kept in f32 and one in f64, widths with and
        // without a tail past the 8 × 8 blocks, and f64 rows (two groups of four).
        for dim in [3, 8, 37, 128] {
            let value = |i: usize| ((i * 7919) % 1013) as f64 * 1.37e-3 - 0.61 + (i % 5) as f64 * 1e3;
            let f32_rows = Vectors::of(dim, Values::F32((0..dim * 9).map(|i| value(i) as f32).collect()));
            let f64_rows = Vectors::new(dim, (0..dim * 9).map(value).collect());
            for (queries, rows) in [(&f32_rows, &f32_rows), (&f64_rows, &f32_rows), (&f64_rows, &f64_rows)] {
                for metric in Metric::ALL {
                    let exact = ExactCheck::new(metric, f64::INFINITY, queries, rows);
                    let ibs = [3, 8, 1, 5, 2, 7, 4, 6];
                    let got = exact.distances8(queries.row(0), 0, ibs.map(|j| rows.row(j)), ibs);
                    for (g, j) in got.iter().zip(ibs) {
                        let one = exact.distance(queries.row(0), rows.row(j), 0, j);
                        assert_eq!(g.to_bits(), one.to_bits(), "{metric}, dim {dim}, row {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn four_at_once_equal_one_at_a_time_bit_for_bit() {
        // Values of mixed magnitude and sign, so that the order of the additions shows in the bits.
        let dim = 37;
        let values: Vec<f64> =
            (0..dim * 9).map(|i| ((i * 7919) % 1013) as f64 * 1.37e-3 - 0.61 + (i % 5) as f64 * 1e6).collect();
        let v = Vectors::new(dim, values);
        for metric in [Metric::L2, Metric::L2Squared, Metric::Cosine, Metric::InnerProduct, Metric::L1, Metric::LInf] {
            let exact = ExactCheck::new(metric, f64::INFINITY, &v, &v);
            let ibs = [3, 8, 1, 5];
            let got = exact.distances4(v.row(0), 0, ibs.map(|j| v.row(j)), ibs);
            for (g, j) in got.iter().zip(ibs) {
                assert_eq!(g.to_bits(), exact.distance(v.row(0), v.row(j), 0, j).to_bits(), "{metric} row {j}");
            }
        }
    }

    #[test]
    fn rows_kept_in_f32_give_the_bits_of_the_same_rows_widened() {
        use crate::vectors::Values;
        // f32 values of mixed magnitude and sign; one copy kept in f32, one widened to f64.
        let dim = 21;
        let narrow: Vec<f32> =
            (0..dim * 6).map(|i| ((i * 7919) % 1013) as f32 * 1.37e-3 - 0.61 + (i % 5) as f32 * 1e4).collect();
        let kept = Vectors::of(dim, Values::F32(narrow.clone()));
        let wide = Vectors::new(dim, narrow.iter().map(|&x| x as f64).collect());
        for metric in Metric::ALL {
            for threshold in [f64::INFINITY, 1e4] {
                // Both sides in f32, both in f64, and each mixed (f64 queries against an f32 base).
                let checks = [(&kept, &kept), (&wide, &wide), (&wide, &kept), (&kept, &wide)]
                    .map(|(a, b)| (ExactCheck::new(metric, threshold, a, b), a, b));
                for i in 0..kept.len() {
                    for j in 0..kept.len() {
                        let want = metric.distance(&wide.row(i).to_vec(), &wide.row(j).to_vec());
                        for (check, a, b) in &checks {
                            let got = check.distance(a.row(i), b.row(j), i, j);
                            assert_eq!(got.to_bits(), want.to_bits(), "{metric} ({i}, {j})");
                            let within = check.within(a.row(i), b.row(j), i, j);
                            assert_eq!(within.map(f64::to_bits), (want <= threshold).then_some(want.to_bits()));
                        }
                    }
                    let ibs = [0, 3, 5, 1];
                    for (check, a, b) in &checks {
                        let four = check.distances4(a.row(i), i, ibs.map(|j| b.row(j)), ibs);
                        for (got, j) in four.iter().zip(ibs) {
                            let want = metric.distance(&wide.row(i).to_vec(), &wide.row(j).to_vec());
                            assert_eq!(got.to_bits(), want.to_bits(), "{metric} four ({i}, {j})");
                        }
                    }
                }
            }
        }
    }

    fn vectors(values: Vec<f64>, dim: usize) -> Vectors {
        Vectors::new(dim, values)
    }

    #[test]
    fn agrees_with_the_definition_at_the_boundary() {
        // 0.1 + 0.2 style rounding: the check must answer exactly as `Metric::distance` does.
        let v = vectors(vec![0.0, 0.0, 0.1, 0.2, 0.3, 0.0, 3.0, 4.0], 2);
        for metric in Metric::ALL {
            for threshold in [0.0, 0.1, 0.2236, 0.30000000000000004, 0.3, 5.0, 25.0] {
                let check = ExactCheck::new(metric, threshold, &v, &v);
                for i in 0..v.len() {
                    for j in 0..v.len() {
                        let d = metric.row_distance(v.row(i), v.row(j));
                        let want = (d <= threshold).then_some(d);
                        let got = check.within(v.row(i), v.row(j), i, j);
                        assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits), "{metric} {threshold} {i} {j}");
                    }
                }
            }
        }
    }
}
