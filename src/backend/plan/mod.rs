//! What both backends share: the filter space of a metric and the row layouts the filters read
//! (here), the bounds a threshold implies (`bounds`), the exact test (`exact`), the selection of
//! the k nearest (`topk`), the vectorised filters (`simd`), tiles of inputs larger than a device
//! (`tiles`), the recall sampler of approximate kNN (`recall`) and kNN lists widened to their ties
//! (`ties`).

use std::borrow::Cow;

use rayon::iter::{IndexedParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::op::Metric;
use crate::vectors::{Coord, Coords, Vectors};

pub mod bounds;
pub mod exact;
pub mod recall;
pub mod simd;
pub mod ties;
#[cfg(feature = "gpu")]
pub mod tiles;
pub mod topk;

/// The coordinates the grid indexes and the f32 filters are taken from: the vectors as kept
/// (borrowed: an f32 input is read in f32 and widened value by value, never copied whole), or for
/// cosine their unit vectors (computed in f64; owned, or borrowed from the plan that holds them).
enum FilterSpace<'a> {
    Kept(&'a Vectors),
    Unit(Cow<'a, [f64]>),
}

impl FilterSpace<'_> {
    fn of(v: &Vectors, metric: Metric) -> FilterSpace<'_> {
        if metric == Metric::Cosine { FilterSpace::Unit(Cow::Owned(v.unit_values())) } else { FilterSpace::Kept(v) }
    }

    fn coords(&self) -> Coords<'_> {
        match self {
            FilterSpace::Kept(v) => v.values.coords(),
            FilterSpace::Unit(values) => Coords::F64(values),
        }
    }

    /// Per-dimension minimum and maximum: kept with the vectors, computed for unit vectors.
    fn extent(&self, dim: usize) -> Cow<'_, (Vec<f64>, Vec<f64>)> {
        match self {
            FilterSpace::Kept(v) => Cow::Borrowed(v.extent()),
            FilterSpace::Unit(values) => Cow::Owned(Coords::F64(values).extent(dim)),
        }
    }
}

/// The filter spaces of a join's or kNN's two sides (one for a self-join).
pub(crate) struct FilterSpaces<'a> {
    left: FilterSpace<'a>,
    right: Option<FilterSpace<'a>>,
}

impl<'a> FilterSpaces<'a> {
    /// The spaces of `left` and `right` under `metric`; `same`: a self-join, whose right side is
    /// the left one.
    pub(crate) fn of(left: &'a Vectors, right: &'a Vectors, metric: Metric, same: bool) -> Self {
        Self { left: FilterSpace::of(left, metric), right: (!same).then(|| FilterSpace::of(right, metric)) }
    }

    /// Cosine's spaces, the unit vectors of `left` and `right` (computed in f64), owned.
    pub(crate) fn units(left: &Vectors, right: &Vectors, same: bool) -> FilterSpaces<'static> {
        let unit = |v: &Vectors| FilterSpace::Unit(Cow::Owned(v.unit_values()));
        FilterSpaces { left: unit(left), right: (!same).then(|| unit(right)) }
    }

    /// The same spaces, borrowed.
    pub(crate) fn view(&self) -> FilterSpaces<'_> {
        fn view<'s>(space: &'s FilterSpace) -> FilterSpace<'s> {
            match space {
                FilterSpace::Kept(v) => FilterSpace::Kept(v),
                FilterSpace::Unit(values) => FilterSpace::Unit(Cow::Borrowed(values)),
            }
        }
        FilterSpaces { left: view(&self.left), right: self.right.as_ref().map(view) }
    }

    pub(crate) fn left(&self) -> Coords<'_> {
        self.left.coords()
    }

    pub(crate) fn right(&self) -> Coords<'_> {
        self.right.as_ref().unwrap_or(&self.left).coords()
    }

    /// Per-dimension minimum and maximum over both sides, `dim` wide.
    pub(crate) fn extent(&self, dim: usize) -> (Vec<f64>, Vec<f64>) {
        let (mut lo, mut hi) = self.left.extent(dim).into_owned();
        if let Some(right) = &self.right {
            let (l, h) = &*right.extent(dim);
            for d in 0..dim {
                lo[d] = lo[d].min(l[d]);
                hi[d] = hi[d].max(h[d]);
            }
        }
        (lo, hi)
    }
}

/// Copies the rows of `v` in `order` into one contiguous buffer (in f64), so a cell's points are
/// adjacent.
pub(crate) fn gather(v: &Vectors, order: &[u32]) -> Vec<f64> {
    let mut out = vec![0.0; order.len() * v.dim];
    out.par_chunks_mut(v.dim.max(1)).zip(order.par_iter()).for_each(|(dst, &p)| {
        crate::on_row!(v.row(p as usize), |row| dst.iter_mut().zip(row).for_each(|(d, x)| *d = x.f64()))
    });
    out
}

/// Per-dimension minimum over both inputs (the origin the f32 slot copies are taken from).
pub(crate) fn lower_corner(left: Coords, right: Coords, dim: usize) -> Vec<f64> {
    let lower = left.extent(dim).0;
    if left.same(right) {
        return lower;
    }
    lower.iter().zip(&right.extent(dim).0).map(|(x, y)| x.min(*y)).collect()
}

/// Whether the f32 filter can use the GEMM form `‖x‖² + ‖y‖² − 2x·y` (or `−x·y`).
pub(crate) fn gemm_form(metric: Metric) -> bool {
    matches!(metric, Metric::L2 | Metric::L2Squared | Metric::Cosine | Metric::InnerProduct)
}
