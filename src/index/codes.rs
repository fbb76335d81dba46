//! An 8-bit copy of a Multicurves index's principal coordinates, which the cores' walk of the
//! graph ranks the rows it reaches by (backend/cpu/approx.rs).
//!
//! Why. The walk reads a few thousand rows a query at random, so its time is the memory's latency
//! and the bytes each row spans: a row's principal coordinates in f32 take four cache lines of 64
//! bytes for GloVe's 50 dimensions and twelve for Fashion-MNIST's 192, and a base of 390,000 such
//! rows (100 MB) is three times a 32 MB L3. One byte a coordinate puts GloVe's rows in one line and
//! the whole copy (25 MB) within the L3 (docs/approx.md#measured).
//!
//! How. Each coordinate (column) is quantised uniformly over its own span across the base,
//! `low + code · step` (FAISS's `SQ8`); a query is not: its coordinates are rescaled once into
//! code units, `(q − low) / step`, and a row's score is `Σ step² · (q′ − code)²`, the squared
//! distance to the row's decoded coordinates (asymmetric: only the row is rounded, by at most
//! `step / 2` a coordinate). The score only chooses which rows the walk keeps and follows: the
//! rows it keeps are ranked again by their whole f32 distance and the best measured exactly in
//! f64, so the returned distances are exact whatever the rounding; a true neighbour the rounding
//! ranks out of the walk's pool is missed, as any the walk never reaches (the recall is measured).

use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use super::pages::huge_filled;

/// Bytes a row of codes is padded to: whole cache lines, so a row of up to 64 coordinates is one
/// line and never straddles two.
const ROW_BYTES: usize = 64;

/// Every row's principal coordinates in 8 bits, [`ROW_BYTES`]-aligned rows.
#[derive(Debug)]
pub struct Codes {
    /// Coordinates coded a row.
    columns: usize,
    /// Bytes a row (a multiple of [`ROW_BYTES`]).
    stride: usize,
    /// Each column's lowest value across the base.
    low: Vec<f32>,
    /// Each column's step between codes (1 where the column is constant: its one code is exact).
    step: Vec<f32>,
    /// Each column's `step²`, then zeros up to the stride (the scores' weights).
    weights: Vec<f32>,
    /// The codes, `stride` bytes a row, from `first` on (the offset that aligns row 0).
    codes: Vec<u8>,
    first: usize,
}

/// A query in code units ([`Codes::query`]): its coordinates rescaled, zero past the coded
/// columns (whose weights are zero, so the padding adds nothing).
#[derive(Debug, Default)]
pub struct CodedQuery {
    scaled: Vec<f32>,
}

impl Codes {
    /// Codes of `len` rows whose coordinates `row(i)` gives (`columns` values each).
    pub fn encode(len: usize, columns: usize, row: impl Fn(usize, &mut [f32]) + Sync) -> Self {
        let stride = columns.next_multiple_of(ROW_BYTES).max(ROW_BYTES);
        let (low, high) = (0..len)
            .into_par_iter()
            .fold_with(
                (vec![f32::INFINITY; columns], vec![f32::NEG_INFINITY; columns], vec![0f32; columns]),
                |(mut low, mut high, mut values), i| {
                    row(i, &mut values);
                    for ((l, h), &x) in low.iter_mut().zip(&mut high).zip(&values) {
                        *l = l.min(x);
                        *h = h.max(x);
                    }
                    (low, high, values)
                },
            )
            .map(|(low, high, _)| (low, high))
            .reduce(
                || (vec![f32::INFINITY; columns], vec![f32::NEG_INFINITY; columns]),
                |(mut low, mut high), (l2, h2)| {
                    low.iter_mut().zip(&l2).for_each(|(a, &b)| *a = a.min(b));
                    high.iter_mut().zip(&h2).for_each(|(a, &b)| *a = a.max(b));
                    (low, high)
                },
            );
        let low: Vec<f32> = low.into_iter().map(|l| if l.is_finite() { l } else { 0.0 }).collect();
        let step: Vec<f32> = low.iter().zip(&high).map(|(&l, &h)| if h > l { (h - l) / 255.0 } else { 1.0 }).collect();
        let mut codes = huge_filled(len * stride + ROW_BYTES, 0u8);
        let first = (codes.as_ptr() as usize).next_multiple_of(ROW_BYTES) - codes.as_ptr() as usize;
        codes[first..first + len * stride].par_chunks_mut(stride).enumerate().with_min_len(1024).for_each_init(
            || vec![0f32; columns],
            |values, (i, out)| {
                row(i, values);
                for ((code, &x), (&l, &s)) in out.iter_mut().zip(values.iter()).zip(low.iter().zip(&step)) {
                    *code = ((x - l) / s).round().clamp(0.0, 255.0) as u8;
                }
            },
        );
        let mut weights: Vec<f32> = step.iter().map(|s| s * s).collect();
        weights.resize(stride, 0.0);
        Self { columns, stride, low, step, weights, codes, first }
    }

    /// Writes `query` (its `columns` coordinates from `coordinates`) into `out` in code units.
    pub fn query(&self, coordinates: impl Iterator<Item = f32>, out: &mut CodedQuery) {
        out.scaled.clear();
        out.scaled.extend(coordinates.zip(self.low.iter().zip(&self.step)).map(|(q, (&l, &s))| (q - l) / s));
        debug_assert_eq!(out.scaled.len(), self.columns, "a query codes every column");
        out.scaled.resize(self.stride, 0.0);
    }

    /// Row `p`'s codes: whole cache lines, zero past the coded columns.
    #[inline]
    pub fn row(&self, p: u32) -> &[u8] {
        &self.codes[self.first + p as usize * self.stride..][..self.stride]
    }

    /// Each column's weight (`step²`), then zeros up to the stride: a row's squared distance to a
    /// query is `Σ weight · (q′ − code)²`, to another row `Σ weight · (a − b)²`.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }
}

impl CodedQuery {
    /// The coordinates in code units, then zeros up to the codes' stride.
    pub fn scaled(&self) -> &[f32] {
        &self.scaled
    }
}

#[cfg(test)]
mod tests {
    use super::{CodedQuery, Codes};
    use crate::backend::plan::simd::coded_score;

    /// The score is the squared distance to the decoded row, within what the rounding of each
    /// coordinate (half a step) can move it.
    #[test]
    fn a_score_is_the_squared_distance_within_half_a_step_a_coordinate() {
        let (len, columns) = (500, 37);
        let value = |i: usize, c: usize| ((i * 31 + c * 17) % 101) as f32 * 0.01 * (c as f32 + 1.0) - 0.3;
        let codes =
            Codes::encode(len, columns, |i, out| out.iter_mut().enumerate().for_each(|(c, x)| *x = value(i, c)));
        let mut query = CodedQuery::default();
        let q: Vec<f32> = (0..columns).map(|c| value(7, c) * 0.9 + 0.05).collect();
        codes.query(q.iter().copied(), &mut query);
        for p in [0u32, 1, 250, 499] {
            let (mut exact, mut slack) = (0f64, 0f64);
            for (c, &qc) in q.iter().enumerate() {
                let t = f64::from(qc - value(p as usize, c));
                let half = f64::from(codes.step[c]) / 2.0;
                exact += t * t;
                slack += 2.0 * t.abs() * half + half * half;
            }
            let score = f64::from(coded_score(query.scaled(), codes.weights(), codes.row(p)));
            assert!((score - exact).abs() <= slack * 1.001 + 1e-4, "row {p}: {score} against {exact} ± {slack}");
        }
        // A constant column is coded exactly.
        let flat = Codes::encode(10, 3, |_, out| out.copy_from_slice(&[0.5, -2.0, 7.25]));
        flat.query([1.5f32, -2.0, 7.25].into_iter(), &mut query);
        assert_eq!(coded_score(query.scaled(), flat.weights(), flat.row(3)), 1.0);
    }
}
