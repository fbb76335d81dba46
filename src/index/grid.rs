//! The ε-grid of GPU-Join (Gowanlock & Karsin, GPU-Join, §3.2.1, §4): cells of edge ≥ the coordinate bound `r` over the
//! `k` highest-variance dimensions, only non-empty cells stored (sorted linearised ids, found by
//! binary search), points grouped by cell and sorted inside each cell on one more dimension
//! (`sortidu`, §4.3). `k` comes from a sampled cost model (§5.6) that can also reject the grid in
//! favour of brute force (high d, or `r` as large as the data's extent).
//!
//! Why no pair is lost: a pair within the threshold differs by at most `r` in every coordinate
//! (`backend::plan::bounds::coordinate_bound`). Cell widths are `w ≥ r·(1 + 2⁻²⁰)` and cell coordinates are
//! `floor((x - origin) / w)` with fewer than 2³¹ cells per dimension, so the computed quotients of
//! two such coordinates differ by at most `r/w + 2⁻⁴⁸ < 1`, and their cells by at most one: every
//! partner lies in one of the 3^k neighbouring cells, inside the `±r` window of the sort dimension.

use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};

use super::directory::{DirectoryShape, ranked_by_spread};
use crate::costs::{
    BRUTE_RUN_FACTOR, NS_BRUTE_DIM_DIRECT, NS_BRUTE_DIM_GEMM, NS_BRUTE_PAIR, NS_DIM, NS_LOOKUP_STEP, NS_PAIR, NS_PROBE,
    NS_RUN_CANDIDATE, NS_RUN_CANDIDATE_DIM, NS_RUN_CELL_VISIT, NS_RUN_ROW, NS_WINDOW,
};
use crate::on_coords;
use crate::op::IndexChoice;
use crate::vectors::{Coord, Coords};

/// Largest number of indexed dimensions considered: 3^8 = 6561 neighbour cells already.
const MAX_INDEXED_DIMS: usize = 8;
/// Points sampled per side for the cost model (sample × sample pair tests).
const COST_SAMPLE: usize = 1200;
/// Relative widening of the cell edge over the coordinate bound (see the module docs).
const WIDEN: f64 = 1.0 + 1.0 / (1u64 << 20) as f64;

/// The cell layout shared by the indexes of both join inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct GridGeometry {
    /// Indexed dimensions (positions in the vector), highest variance first.
    pub dims: Vec<usize>,
    /// Lower edge of the grid per indexed dimension.
    pub origin: Vec<f64>,
    /// Cell edge per indexed dimension (≥ `radius·(1 + 2⁻²⁰)`).
    pub width: Vec<f64>,
    /// Number of cells per indexed dimension.
    pub cells: Vec<u64>,
    /// Linearisation strides (dimension 0 fastest); the product of `cells` fits in u64.
    pub strides: Vec<u64>,
    /// The dimension points are sorted by inside each cell (`sortidu`).
    pub sort_dim: usize,
    /// The coordinate bound `r`: partners differ by at most this much in every dimension.
    pub radius: f64,
}

impl GridGeometry {
    /// Whether the `±r` window on the sort dimension prunes: only when that dimension is not
    /// indexed (an indexed one is already bounded by its cell, about `r` wide).
    pub fn window_prunes(&self) -> bool {
        !self.dims.contains(&self.sort_dim)
    }

    /// Half-width of the window on the sort dimension: partners differ by at most `r` there up to
    /// a few ulps of rounding, which this widening by 2⁻³⁰ covers; fl(key − u) is monotone, so the
    /// window test `|fl(key − u)| ≤ r'` keeps every pair whose exact difference is ≤ r'.
    pub fn window(&self) -> f64 {
        self.radius * (1.0 + 1.0 / (1u64 << 30) as f64)
    }
}

impl GridGeometry {
    /// Cell coordinate of value `x` in indexed dimension `j`.
    #[inline]
    pub fn coord(&self, j: usize, x: f64) -> u64 {
        let c = ((x - self.origin[j]) / self.width[j]).floor();
        (c.max(0.0) as u64).min(self.cells[j] - 1)
    }

    /// Linearised id of the cell holding `point`.
    #[inline]
    pub fn cell_id<T: Coord>(&self, point: &[T]) -> u64 {
        self.dims.iter().enumerate().map(|(j, &d)| self.coord(j, point[d].f64()) * self.strides[j]).sum()
    }

    /// Each point's linear cell id and, when `windowed`, its sort-dimension value, in input order.
    #[cfg(feature = "gpu")]
    pub fn keys(&self, points: Coords, dim: usize, windowed: bool) -> (Vec<u64>, Option<Vec<f64>>) {
        on_coords!(points, |points| {
            let cells = points.par_chunks(dim).map(|p| self.cell_id(p)).collect();
            let values = windowed.then(|| points.par_chunks(dim).map(|p| p[self.sort_dim].f64()).collect());
            (cells, values)
        })
    }

    /// Bits of the largest linear id.
    #[cfg(feature = "gpu")]
    pub fn id_bits(&self) -> u32 {
        let possible: u128 = self.cells.iter().map(|&c| c as u128).product();
        128 - (possible - 1).leading_zeros()
    }

    /// Entries of the linear id → cell table of an index over `n` points, when the grid has few
    /// enough cells for one (at most max(4n, 2²⁰)); lookups then cost one load instead of a
    /// binary search.
    pub fn table_len(&self, n: usize) -> Option<usize> {
        let possible: u128 = self.cells.iter().map(|&c| c as u128).product();
        (possible <= (4 * n as u128).max(1 << 20) && n < u32::MAX as usize).then_some(possible as usize)
    }

    /// Calls `f` with the id of every cell of the 3^k neighbourhood of `cell` that lies in the grid.
    pub fn for_each_neighbour(&self, cell: u64, mut f: impl FnMut(u64)) {
        let k = self.dims.len();
        let mut lo = [0u64; MAX_INDEXED_DIMS];
        let mut hi = [0u64; MAX_INDEXED_DIMS];
        for j in 0..k {
            let c = (cell / self.strides[j]) % self.cells[j];
            lo[j] = c.saturating_sub(1);
            hi[j] = (c + 1).min(self.cells[j] - 1);
        }
        let mut cur = lo;
        loop {
            f((0..k).map(|j| cur[j] * self.strides[j]).sum());
            // odometer increment over the clipped ranges
            let mut j = 0;
            loop {
                if j == k {
                    return;
                }
                if cur[j] < hi[j] {
                    cur[j] += 1;
                    break;
                }
                cur[j] = lo[j];
                j += 1;
            }
        }
    }
}

/// What the cost model chose.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinStrategy {
    /// The ε-grid over some dimensions.
    Grid(GridGeometry),
    /// The quantile directory of Böhm et al. (`index=directory`, `index::directory`).
    Directory(DirectoryShape),
    /// Every pair, in blocked tiles.
    BruteForce,
}

/// Inputs of the cost model: the filter-space coordinates of both sides.
pub struct CostInputs<'a> {
    /// Row-major coordinates of the left (probe) side.
    pub left: Coords<'a>,
    /// Row-major coordinates of the right (indexed) side; the same values for a self-join.
    pub right: Coords<'a>,
    /// Vector dimension.
    pub dim: usize,
    /// Per-dimension minimum and maximum over both sides (`Vectors::extent`, kept with the vectors).
    pub extent: (&'a [f64], &'a [f64]),
    /// Coordinate bound `r`.
    pub radius: f64,
    /// One input joined with itself (each unordered pair computed once).
    pub self_join: bool,
    /// Whether brute force can use the f32 GEMM form (L2, L2², cosine, inner product).
    pub gemm_form: bool,
    /// Grid, brute force, or the cost model's choice.
    pub index: IndexChoice,
    /// Dimensions to index with the grid (0: the cost model decides).
    pub grid_dims: usize,
}

/// Estimated nanoseconds of one CPU core comparing every pair of `n_left × n_right` rows (half of
/// them for a self-join) by brute force.
pub fn brute_force_ns(n_left: usize, n_right: usize, dim: usize, gemm_form: bool, self_join: bool) -> f64 {
    let pair_factor = if self_join { 0.5 } else { 1.0 };
    let brute_dim = if gemm_form { NS_BRUTE_DIM_GEMM } else { NS_BRUTE_DIM_DIRECT };
    n_left as f64 * n_right as f64 * pair_factor * (NS_BRUTE_PAIR + dim as f64 * brute_dim)
}

/// [`brute_force_ns`] as the absolute time of a whole run on one CPU core (nanoseconds), what the
/// scheduler compares with the GPU's (and a recall target's calibration with the index's build).
pub fn brute_force_run_ns(n_left: usize, n_right: usize, dim: usize, gemm_form: bool, self_join: bool) -> f64 {
    brute_force_ns(n_left, n_right, dim, gemm_form, self_join) * BRUTE_RUN_FACTOR
}

/// The strategy the cost model chooses and the absolute time of the run it chose on one CPU core
/// (nanoseconds; the choice itself compares the relative weights).
pub fn estimate_strategy(inputs: &CostInputs) -> (JoinStrategy, f64) {
    let CostInputs { left, right, dim, radius, self_join, index, grid_dims, .. } = *inputs;
    let (n_left, n_right) = (left.len() / dim, right.len() / dim);
    let pair_factor = if self_join { 0.5 } else { 1.0 };
    let brute_cost = brute_force_ns(n_left, n_right, dim, inputs.gemm_form, self_join);
    let brute_run = brute_cost * BRUTE_RUN_FACTOR;
    if index == IndexChoice::BruteForce || n_left == 0 || n_right == 0 {
        return (JoinStrategy::BruteForce, brute_run);
    }
    if index == IndexChoice::Directory {
        // Chosen by name: the run is priced as the grid the cost model would pick (the scheduler
        // of `device=auto` compares it with the GPU's), the shape from the right side's size.
        let (_, run) = estimate_strategy(&CostInputs { index: IndexChoice::Auto, ..*inputs });
        let shape = DirectoryShape::for_points(n_right, &ranked_by_spread(right, dim), radius);
        return (JoinStrategy::Directory(shape), run);
    }
    let forced_grid = index == IndexChoice::Grid;

    let sample_left = strided_sample(left, dim, COST_SAMPLE);
    let sample_right = if self_join { sample_left.clone() } else { strided_sample(right, dim, COST_SAMPLE) };
    let variance = sample_variance(dim, &sample_left, &sample_right);
    let (lo, hi) = inputs.extent;
    let cell_edge = (radius * WIDEN).max(f64::MIN_POSITIVE);
    // Dimensions that span at least three cells can prune; highest variance first.
    // A forced grid may index any dimension.
    let mut useful: Vec<usize> = (0..dim).filter(|&d| forced_grid || (hi[d] - lo[d]) / cell_edge >= 2.0).collect();
    useful.sort_by(|&a, &b| variance[b].total_cmp(&variance[a]).then(a.cmp(&b)));
    let ranked = useful.clone();
    useful.truncate(MAX_INDEXED_DIMS);
    let dims_to_try = match grid_dims {
        0 => 1..=useful.len(),
        k => k.min(useful.len())..=k.min(useful.len()),
    };

    let indexed_rows = if self_join { n_left } else { n_left + n_right } as f64;
    let mut best = (if forced_grid { f64::INFINITY } else { brute_cost }, JoinStrategy::BruteForce);
    let mut best_run = brute_run;
    for k in dims_to_try {
        let geometry = geometry(&useful[..k], &ranked, lo, hi, radius, dim);
        let hits = sample_candidates(&geometry, &sample_left, &sample_right, dim, self_join);
        let sample_pairs = (sample_left.len() / dim) as f64 * (sample_right.len() / dim) as f64;
        let candidates = hits / sample_pairs * n_left as f64 * n_right as f64 * pair_factor;
        let possible_cells = geometry.cells.iter().map(|&c| c as f64).product::<f64>();
        let cells_left = possible_cells.min(n_left as f64);
        let cells_right = possible_cells.min(n_right as f64);
        let neighbours = 3f64.powi(k as i32) * if self_join { 0.5 } else { 1.0 };
        let probe = if possible_cells <= (4.0 * n_right as f64).max((1u64 << 20) as f64) {
            NS_PROBE
        } else {
            (cells_right.log2() + 1.0) * NS_LOOKUP_STEP
        };
        let windows =
            if geometry.window_prunes() { n_left as f64 * neighbours.min(cells_right) * NS_WINDOW } else { 0.0 };
        let search = cells_left * neighbours * probe + windows;
        let refine = candidates * (NS_PAIR + dim as f64 * NS_DIM);
        let cost = search + refine;
        if cost < best.0 || matches!(best.1, JoinStrategy::BruteForce) && forced_grid {
            best_run = indexed_rows * NS_RUN_ROW
                + cells_left * neighbours.min(cells_right) * NS_RUN_CELL_VISIT
                + candidates * (NS_RUN_CANDIDATE + dim as f64 * NS_RUN_CANDIDATE_DIM);
            best = (cost, JoinStrategy::Grid(geometry));
        }
    }
    (best.1, best_run)
}

/// Geometry over `indexed` (a prefix of `ranked`); the sort dimension is the next ranked one.
fn geometry(indexed: &[usize], ranked: &[usize], lo: &[f64], hi: &[f64], radius: f64, dim: usize) -> GridGeometry {
    let k = indexed.len();
    // Keep Π cells < 2⁶³ so linear ids fit in u64, and each dimension below 2³¹ cells (module docs).
    let max_cells = 1u64 << (62 / k as u32).min(31);
    let mut geometry = GridGeometry {
        dims: indexed.to_vec(),
        origin: Vec::with_capacity(k),
        width: Vec::with_capacity(k),
        cells: Vec::with_capacity(k),
        strides: Vec::with_capacity(k),
        sort_dim: ranked.get(k).copied().unwrap_or(if dim > 1 { indexed[0] } else { 0 }),
        radius,
    };
    let mut stride = 1u64;
    for &d in indexed {
        let extent = hi[d] - lo[d];
        let width = (radius * WIDEN).max(extent / (max_cells - 1) as f64).max(f64::MIN_POSITIVE);
        let cells = ((extent / width).floor() as u64 + 1).clamp(1, max_cells);
        geometry.origin.push(lo[d]);
        geometry.width.push(width);
        geometry.cells.push(cells);
        geometry.strides.push(stride);
        stride *= cells;
    }
    geometry
}

/// Every `n/count`-th row (all rows when there are fewer), row-major, in f64.
fn strided_sample(points: Coords, dim: usize, count: usize) -> Vec<f64> {
    let n = points.len() / dim;
    let step = n.div_ceil(count).max(1);
    on_coords!(points, |points| {
        (0..n).step_by(step).flat_map(|i| points[i * dim..(i + 1) * dim].iter().map(|x| x.f64())).collect()
    })
}

/// Per-dimension variance of the samples of both sides.
fn sample_variance(dim: usize, sl: &[f64], sr: &[f64]) -> Vec<f64> {
    let rows = (sl.len() + sr.len()) / dim;
    (0..dim)
        .map(|d| {
            let values = || sl.iter().chain(sr).skip(d).step_by(dim);
            let mean = values().sum::<f64>() / rows as f64;
            values().map(|x| (x - mean) * (x - mean)).sum::<f64>() / rows as f64
        })
        .collect()
}

/// Sample pairs whose cells are neighbours in every indexed dimension (self-join: distinct rows).
fn sample_candidates(g: &GridGeometry, sl: &[f64], sr: &[f64], dim: usize, self_join: bool) -> f64 {
    let k = g.dims.len();
    let cells = |s: &[f64]| -> Vec<u64> {
        s.chunks_exact(dim).flat_map(|p| (0..k).map(move |j| g.coord(j, p[g.dims[j]]))).collect()
    };
    let (cl, cr) = (cells(sl), cells(sr));
    let hits: usize = cl
        .par_chunks(k)
        .enumerate()
        .map(|(i, a)| {
            cr.chunks_exact(k)
                .enumerate()
                .filter(|&(j, b)| (!self_join || i != j) && a.iter().zip(b).all(|(x, y)| x.abs_diff(*y) <= 1))
                .count()
        })
        .sum();
    hits as f64
}

/// One input's points grouped by cell, sorted by the sort dimension inside each cell.
#[derive(Debug, Clone, Default)]
pub struct GridIndex {
    /// Linearised ids of the non-empty cells, ascending.
    pub cell_ids: Vec<u64>,
    /// `cell_start[c]..cell_start[c + 1]` are the slots of cell `c`.
    pub cell_start: Vec<usize>,
    /// Slot → point position in the input.
    pub order: Vec<u32>,
    /// Slot → the point's sort-dimension value.
    pub sort_keys: Vec<f64>,
    /// Linear id → cell index (`u32::MAX`: empty), where [`GridGeometry::table_len`] allows one.
    dense: Option<Vec<u32>>,
}

impl GridIndex {
    /// Groups `points` (row-major, `dim` wide) by cell of `geometry`.
    pub fn build(geometry: &GridGeometry, points: Coords, dim: usize) -> Self {
        let n = points.len() / dim;
        let mut keyed: Vec<(u64, f64, u32)> = on_coords!(points, |points| {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let p = &points[i * dim..(i + 1) * dim];
                    (geometry.cell_id(p), p[geometry.sort_dim].f64(), i as u32)
                })
                .collect()
        });
        keyed.par_sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut index = GridIndex {
            order: keyed.iter().map(|e| e.2).collect(),
            sort_keys: keyed.iter().map(|e| e.1).collect(),
            ..Default::default()
        };
        for (slot, e) in keyed.iter().enumerate() {
            if index.cell_ids.last() != Some(&e.0) {
                index.cell_ids.push(e.0);
                index.cell_start.push(slot);
            }
        }
        index.cell_start.push(n);
        if let Some(entries) = geometry.table_len(n) {
            let mut table = vec![u32::MAX; entries];
            for (c, &id) in index.cell_ids.iter().enumerate() {
                table[id as usize] = c as u32;
            }
            index.dense = Some(table);
        }
        index
    }

    /// Groups that are not cells: slots `starts[g]..starts[g + 1]` of `order` form group `g` (the
    /// directory's leaves and blocks, which the grid join's slot filters pad the same way).
    pub fn from_groups(order: Vec<u32>, starts: Vec<usize>) -> Self {
        GridIndex {
            cell_ids: (0..starts.len().saturating_sub(1) as u64).collect(),
            cell_start: starts,
            order,
            ..Default::default()
        }
    }

    /// The linear id → cell table, when the grid is dense enough to have one.
    #[cfg(test)]
    pub fn dense_table(&self) -> Option<&[u32]> {
        self.dense.as_deref()
    }

    /// Number of non-empty cells.
    pub fn num_cells(&self) -> usize {
        self.cell_ids.len()
    }

    /// Index of the non-empty cell with linear id `id`.
    #[inline]
    pub fn find(&self, id: u64) -> Option<usize> {
        match &self.dense {
            Some(table) => table.get(id as usize).filter(|&&c| c != u32::MAX).map(|&c| c as usize),
            None => self.cell_ids.binary_search(&id).ok(),
        }
    }

    /// Slot range of cell `c`.
    #[inline]
    pub fn slots(&self, c: usize) -> std::ops::Range<usize> {
        self.cell_start[c]..self.cell_start[c + 1]
    }
}

#[cfg(test)]
mod tests {
    use super::{CostInputs, GridIndex, JoinStrategy, estimate_strategy, geometry};
    use crate::op::IndexChoice;
    use crate::vectors::Coords;

    fn uniform(n: usize, dim: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n * dim)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    #[test]
    fn neighbourhood_is_clipped_to_the_grid() {
        let g = geometry(&[0, 1], &[0, 1], &[0.0, 0.0], &[1.0, 1.0], 0.25, 2);
        assert_eq!(g.cells, vec![4, 4]);
        let mut corner = vec![];
        g.for_each_neighbour(0, |id| corner.push(id));
        assert_eq!(corner, vec![0, 1, 4, 5]);
        let mut middle = vec![];
        g.for_each_neighbour(5, |id| middle.push(id));
        assert_eq!(middle.len(), 9);
    }

    #[test]
    fn index_groups_every_point_by_cell() {
        let points = uniform(1000, 3, 7);
        let g = geometry(&[0, 1], &[0, 1, 2], &[0.0; 3], &[1.0; 3], 0.1, 3);
        let index = GridIndex::build(&g, Coords::F64(&points), 3);
        assert_eq!(index.order.len(), 1000);
        for c in 0..index.num_cells() {
            let slots = index.slots(c);
            for s in slots.clone() {
                let p = index.order[s] as usize;
                assert_eq!(g.cell_id(&points[p * 3..p * 3 + 3]), index.cell_ids[c]);
            }
            assert!(index.sort_keys[slots].is_sorted());
        }
    }

    #[test]
    fn device_build_keys_match_the_host_index() {
        let points = uniform(2000, 3, 11);
        let g = geometry(&[0, 1], &[0, 1, 2], &[0.0; 3], &[1.0; 3], 0.1, 3);
        let (cells, values) = g.keys(Coords::F64(&points), 3, true);
        let index = GridIndex::build(&g, Coords::F64(&points), 3);
        // Sorting positions by (cell, sort value, position), as the device's radix passes do,
        // gives the host index's slot order.
        let mut order: Vec<u32> = (0..2000).collect();
        let values = values.expect("windowed keys");
        order.sort_by(|&a, &b| {
            cells[a as usize].cmp(&cells[b as usize]).then(values[a as usize].total_cmp(&values[b as usize]))
        });
        assert_eq!(order, index.order);
        // 10 × 10 cells: the largest id, 99, needs 7 bits, and the table has every id.
        assert_eq!(g.cells, vec![10, 10]);
        assert_eq!(g.id_bits(), 7);
        assert_eq!(g.table_len(2000), Some(100));
        assert_eq!(index.dense_table().map(<[u32]>::len), Some(100));
        assert!(g.keys(Coords::F64(&points), 3, false).1.is_none());
        let one_cell = geometry(&[0], &[0], &[0.0], &[0.0], 1.0, 1);
        assert_eq!(one_cell.id_bits(), 0);
        let sparse = geometry(&[0, 1, 2, 3, 4, 5, 6, 7], &[0, 1, 2, 3, 4, 5, 6, 7], &[0.0; 8], &[1.0; 8], 0.01, 8);
        assert_eq!(sparse.table_len(1000), None);
    }

    #[test]
    fn cost_model_picks_the_grid_at_low_d_and_brute_force_when_eps_covers_everything() {
        let points = uniform(20_000, 2, 1);
        let (lo, hi) = Coords::F64(&points).extent(2);
        let inputs = |radius| CostInputs {
            left: Coords::F64(&points),
            right: Coords::F64(&points),
            dim: 2,
            extent: (&lo, &hi),
            radius,
            self_join: true,
            gemm_form: true,
            index: IndexChoice::Auto,
            grid_dims: 0,
        };
        assert!(matches!(estimate_strategy(&inputs(0.01)).0, JoinStrategy::Grid(g) if g.dims.len() == 2));
        assert_eq!(estimate_strategy(&inputs(2.0)).0, JoinStrategy::BruteForce);
    }

    #[test]
    fn linear_ids_never_overflow() {
        let lo = vec![0.0; 8];
        let hi = vec![1e300; 8];
        let g = geometry(&[0, 1, 2, 3, 4, 5, 6, 7], &[0, 1, 2, 3, 4, 5, 6, 7], &lo, &hi, 1e-300, 8);
        let total: u128 = g.cells.iter().map(|&c| c as u128).product();
        assert!(total < 1u128 << 63, "{total}");
    }
}
