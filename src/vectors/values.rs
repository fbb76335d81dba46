//! The values of a set of vectors as kept (f32 or f64), borrowed views of them — one row
//! ([`Row`]) or many ([`Coords`]) — and [`Coord`], which reads either type as f64, exactly.

use std::borrow::Cow;

use rayon::iter::{IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSlice;

/// The values of a set of vectors, row-major, as kept: f32 for inputs whose type f32 holds
/// exactly, else f64.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F64(Vec<f64>),
    F32(Vec<f32>),
}

impl Default for Values {
    fn default() -> Self {
        Values::F64(Vec::new())
    }
}

impl Values {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F64(v) => v.len(),
            Values::F32(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the values take.
    pub fn bytes(&self) -> usize {
        match self {
            Values::F64(v) => v.len() * 8,
            Values::F32(v) => v.len() * 4,
        }
    }

    /// The values as kept, borrowed.
    pub fn coords(&self) -> Coords<'_> {
        match self {
            Values::F64(v) => Coords::F64(v),
            Values::F32(v) => Coords::F32(v),
        }
    }

    /// The values in f64: borrowed when kept in f64, else widened (exactly) into a copy.
    pub fn to_f64(&self) -> Cow<'_, [f64]> {
        match self {
            Values::F64(v) => Cow::Borrowed(v),
            Values::F32(v) => Cow::Owned(v.par_iter().map(|&x| x as f64).collect()),
        }
    }

    /// The rows of `dim` values at `positions`, in that order, as kept.
    pub(super) fn select(&self, dim: usize, positions: &[u32]) -> Values {
        fn gather<T: Copy>(v: &[T], dim: usize, positions: &[u32]) -> Vec<T> {
            positions.iter().flat_map(|&p| &v[p as usize * dim..(p as usize + 1) * dim]).copied().collect()
        }
        match self {
            Values::F64(v) => Values::F64(gather(v, dim, positions)),
            Values::F32(v) => Values::F32(gather(v, dim, positions)),
        }
    }

    /// The values in `range`, as kept.
    pub(super) fn slice(&self, range: std::ops::Range<usize>) -> Values {
        match self {
            Values::F64(v) => Values::F64(v[range].to_vec()),
            Values::F32(v) => Values::F32(v[range].to_vec()),
        }
    }
}

/// One vector's values as kept (see [`Values`]). Every computation on rows widens each value to
/// f64 as it reads it ([`Coord`]), which is exact: a row kept in f32 gives the same results, bit
/// for bit, as the same row widened beforehand.
#[derive(Debug, Clone, Copy)]
pub enum Row<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
}

impl<'a> Row<'a> {
    /// Number of coordinates.
    #[inline]
    pub fn len(self) -> usize {
        match self {
            Row::F64(r) => r.len(),
            Row::F32(r) => r.len(),
        }
    }

    /// Whether the row has no coordinates.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Coordinate `d`, in f64.
    #[inline]
    pub fn get(self, d: usize) -> f64 {
        match self {
            Row::F64(r) => r[d],
            Row::F32(r) => r[d] as f64,
        }
    }

    /// The coordinates in f64, in order.
    pub fn iter(self) -> impl Iterator<Item = f64> + 'a {
        (0..self.len()).map(move |d| self.get(d))
    }

    /// The coordinates in f64.
    pub fn to_vec(self) -> Vec<f64> {
        match self {
            Row::F64(r) => r.to_vec(),
            Row::F32(r) => r.iter().map(|&x| x as f64).collect(),
        }
    }
}

/// Row-major values of many rows as kept, borrowed: what the grids, the cost model and the f32
/// filter rows read (widening each value as they read it, so the results are those of the values
/// widened beforehand, without a widened copy of the input).
#[derive(Debug, Clone, Copy)]
pub enum Coords<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
}

impl Coords<'_> {
    /// Number of values.
    pub fn len(self) -> usize {
        match self {
            Coords::F64(v) => v.len(),
            Coords::F32(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Per-dimension minimum and maximum of the rows, `dim` wide (±∞ where there are none).
    /// Compared in the rows' own type, every value of which is an f64 exactly, and as
    /// compare-and-select over finite values (a row holding NaN or ±∞ never matches and is not
    /// kept, vectors/mod.rs), which the compiler turns into vector min/max: the grid's cost model
    /// reads every row of both sides, and 1M × 128 in f32 read as f64 through NaN-aware `min` took
    /// twice as long as this (and longer than the GPU's whole range query over them).
    pub fn extent(self, dim: usize) -> (Vec<f64>, Vec<f64>) {
        if dim == 0 || self.is_empty() {
            return (vec![f64::INFINITY; dim], vec![f64::NEG_INFINITY; dim]);
        }
        fn of<T: Coord>(values: &[T], dim: usize) -> (Vec<f64>, Vec<f64>) {
            let (lo, hi) = values
                .par_chunks(dim * 4096)
                .map(|block| {
                    let (mut lo, mut hi) = (block[..dim].to_vec(), block[..dim].to_vec());
                    for row in block.chunks_exact(dim) {
                        for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(row) {
                            *l = if x < *l { x } else { *l };
                            *h = if x > *h { x } else { *h };
                        }
                    }
                    (lo, hi)
                })
                .reduce_with(|(mut lo, mut hi), (l, h)| {
                    for d in 0..lo.len() {
                        lo[d] = if l[d] < lo[d] { l[d] } else { lo[d] };
                        hi[d] = if h[d] > hi[d] { h[d] } else { hi[d] };
                    }
                    (lo, hi)
                })
                .expect("there are rows");
            (lo.iter().map(|x| x.f64()).collect(), hi.iter().map(|x| x.f64()).collect())
        }
        match self {
            Coords::F64(values) => of(values, dim),
            Coords::F32(values) => of(values, dim),
        }
    }

    /// Whether both borrow the same values (a self-join's two sides).
    pub fn same(self, other: Coords<'_>) -> bool {
        match (self, other) {
            (Coords::F64(a), Coords::F64(b)) => std::ptr::eq(a, b),
            (Coords::F32(a), Coords::F32(b)) => std::ptr::eq(a, b),
            _ => false,
        }
    }
}

/// Runs `body` with `$x` bound to the slice inside a [`Coords`], of either type (the body is
/// generic over [`Coord`]).
#[macro_export]
macro_rules! on_coords {
    ($a:expr, |$x:ident| $body:expr) => {
        match $a {
            $crate::vectors::Coords::F64($x) => $body,
            $crate::vectors::Coords::F32($x) => $body,
        }
    };
}

/// A coordinate type rows are kept in: read as f64, exactly.
pub trait Coord: Copy + PartialOrd + Send + Sync + 'static {
    fn f64(self) -> f64;
    /// The slice inside `row`, which the caller knows to be kept in this type (rows of one
    /// [`Vectors`] all are).
    fn of_row(row: Row<'_>) -> &[Self];
}

impl Coord for f64 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self
    }

    #[inline]
    fn of_row(row: Row<'_>) -> &[f64] {
        match row {
            Row::F64(r) => r,
            Row::F32(_) => unreachable!("rows of one set of vectors are kept in one type"),
        }
    }
}

impl Coord for f32 {
    #[inline(always)]
    fn f64(self) -> f64 {
        self as f64
    }

    #[inline]
    fn of_row(row: Row<'_>) -> &[f32] {
        match row {
            Row::F32(r) => r,
            Row::F64(_) => unreachable!("rows of one set of vectors are kept in one type"),
        }
    }
}

/// Evaluates `$body` with `$x` bound to the slice inside row `$a` (as `&[f64]` or `&[f32]`): the
/// body is compiled once for each type, so generic code over [`Coord`] runs without a branch per
/// value.
#[macro_export]
macro_rules! on_row {
    ($a:expr, |$x:ident| $body:expr) => {
        match $a {
            $crate::vectors::Row::F64($x) => $body,
            $crate::vectors::Row::F32($x) => $body,
        }
    };
}

/// [`on_row!`] for two rows, each of either type.
#[macro_export]
macro_rules! on_rows {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            ($crate::vectors::Row::F64($x), $crate::vectors::Row::F64($y)) => $body,
            ($crate::vectors::Row::F64($x), $crate::vectors::Row::F32($y)) => $body,
            ($crate::vectors::Row::F32($x), $crate::vectors::Row::F64($y)) => $body,
            ($crate::vectors::Row::F32($x), $crate::vectors::Row::F32($y)) => $body,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Coords;

    #[test]
    fn the_extent_is_every_dimensions_minimum_and_maximum_in_either_type() {
        // More rows than one parallel block (4,096), values of both signs.
        let (n, dim) = (10_000, 5);
        let wide: Vec<f64> = (0..n * dim).map(|i| ((i * 7919 % 10_007) as f64 - 4_000.0) * 0.37).collect();
        let narrow: Vec<f32> = wide.iter().map(|&x| x as f32).collect();
        let column = |values: &[f64], d: usize| {
            let column = || values.iter().skip(d).step_by(dim).copied();
            (column().fold(f64::INFINITY, f64::min), column().fold(f64::NEG_INFINITY, f64::max))
        };
        let widened: Vec<f64> = narrow.iter().map(|&x| f64::from(x)).collect();
        let (lo, hi) = Coords::F64(&wide).extent(dim);
        let (lo32, hi32) = Coords::F32(&narrow).extent(dim);
        for d in 0..dim {
            assert_eq!((lo[d], hi[d]), column(&wide, d), "dimension {d}");
            assert_eq!((lo32[d], hi32[d]), column(&widened, d), "dimension {d}");
        }
        assert_eq!(Coords::F64(&[]).extent(3), (vec![f64::INFINITY; 3], vec![f64::NEG_INFINITY; 3]));
    }
}
