//! The quantile directory of Böhm, Noll, Plant and Zherdin, "Index-supported Similarity Join on
//! Graphics Processors" (§5, Fig. 4 and 5): a static directory of a few levels built by
//! fractionated sorting. Level 1 cuts the points into `fanout` parts of equal count on the
//! dimension of largest spread, level 2 cuts each part on the next, and so on; the points are
//! stored in leaf order, so that consecutive points are close in the cut dimensions. Unlike a grid
//! of cells of the threshold's width, its pages follow the data's density: a dense region gets
//! small pages, a sparse one large pages.
//!
//! A join reads the left points in blocks of [`DIRECTORY_BLOCK`] consecutive slots (on the GPU,
//! one thread each: every branch of the walk below is the same for the whole block) and visits a
//! page when it meets the block's bounding box widened by the coordinate bound `r`.
//!
//! Every node keeps the full bounding box of its points in every dimension (the paper keeps the
//! interval of its cut dimension only; a box in all `d` dimensions also prunes where the cut
//! dimensions do not, at `2·d` comparisons a node).
//!
//! Why no pair is lost: a pair within the threshold differs by at most `r` in every coordinate
//! (`backend::plan::bounds::coordinate_bound`). For a left point `x` of a block with box `[bₗ, bₕ]` and a right
//! point `y` of a node with box `[nₗ, nₕ]`: `nₗ ≤ y ≤ x + r ≤ bₕ + r`, so the real `nₗ − bₕ ≤ r`,
//! and the f64 subtraction rounds it to at most `r·(1 + 2⁻⁵³) < r·(1 + 2⁻²⁰)` (rounding is
//! monotonic, and a difference `≤ 0` rounds to `≤ 0`); likewise `bₗ − nₕ`. A node is skipped only
//! when one of these rounded differences exceeds `r·(1 + 2⁻²⁰)` (a NaN difference never skips),
//! which a true partner's node never does. Ties at quantile cuts lose nothing: parts are cut by
//! position in the sorted order, not by value, so every point lies in exactly one leaf whatever
//! values repeat, and the boxes are taken from the points each node holds.

use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::on_coords;
use crate::vectors::{Coord, Coords};

/// Consecutive left slots that share one bounding box and one walk of the directory: Böhm et al.'s
/// thread groups of 64 (two warps on the GPU). Blocks of 128 visited 1.2–2.5× the candidates on
/// 10⁵ points at d = 2 and 8 (docs/design.md#directory).
pub const DIRECTORY_BLOCK: usize = 64;
/// Points a leaf page holds on average: the paper's pages (3 levels × 16 over 2.5·10⁵ points hold
/// 61); pages of 256 visited up to 2.5× the candidates at d = 2 (docs/design.md#directory).
const LEAF_POINTS: usize = 64;
/// Most levels: the paper's three (kernels/directory_join.cu walks at most this many).
pub const MAX_LEVELS: usize = 3;
/// Largest fanout (at 3 levels, 2.6·10⁵ leaves: 6.7·10⁷ points at [`LEAF_POINTS`]).
const MAX_FANOUT: usize = 64;
/// Relative widening of the coordinate bound in the box test (see the module docs).
const WIDEN: f64 = 1.0 + 1.0 / (1u64 << 20) as f64;

/// The directory's shape: its levels, fanout and the dimension each level cuts.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectoryShape {
    /// Levels below the root (1 to [`MAX_LEVELS`]).
    pub levels: usize,
    /// Children of every inner node (and of the root).
    pub fanout: usize,
    /// The dimension level `ℓ` cuts, largest spread first.
    pub cuts: Vec<usize>,
    /// The coordinate bound `r`: partners differ by at most this much in every dimension.
    pub radius: f64,
}

impl DirectoryShape {
    /// The shape for `n` points: `fanout^levels ≈ n / 64` leaves over `min(3, d)` levels (the
    /// paper's three), fewer when there would be fewer than 2 leaves a level; `ranked` are the
    /// dimensions by spread, largest first. The threshold does not enter: a block's box widened by
    /// it decides which pages are visited, and pages smaller than the block's box gain little.
    pub fn for_points(n: usize, ranked: &[usize], radius: f64) -> Self {
        let leaves = (n / LEAF_POINTS).max(1) as f64;
        let mut levels = MAX_LEVELS.min(ranked.len()).max(1);
        while levels > 1 && leaves < (1usize << levels) as f64 {
            levels -= 1;
        }
        let fanout = (leaves.powf(1.0 / levels as f64).ceil() as usize).clamp(2, MAX_FANOUT);
        Self { levels, fanout, cuts: ranked.iter().copied().cycle().take(levels).collect(), radius }
    }

    /// Leaf pages (`fanout^levels`; those of fewer points than leaves are empty).
    pub fn leaves(&self) -> usize {
        self.fanout.pow(self.levels as u32)
    }

    /// Nodes of all levels below the root, level 1 first.
    fn nodes(&self) -> usize {
        (1..=self.levels).map(|l| self.fanout.pow(l as u32)).sum()
    }

    /// The box test's widened bound `r·(1 + 2⁻²⁰)`.
    pub fn box_radius(&self) -> f64 {
        self.radius * WIDEN
    }
}

/// The dimensions by sampled variance, largest first (ties by position).
pub fn ranked_by_spread(points: Coords, dim: usize) -> Vec<usize> {
    let n = points.len() / dim.max(1);
    let step = n.div_ceil(4096).max(1);
    let variance: Vec<f64> = on_coords!(points, |points| {
        (0..dim)
            .map(|d| {
                let values = || (0..n).step_by(step).map(|i| points[i * dim + d].f64()).filter(|x| x.is_finite());
                let count = values().count().max(1) as f64;
                let mean = values().sum::<f64>() / count;
                values().map(|x| (x - mean) * (x - mean)).sum::<f64>() / count
            })
            .collect()
    });
    let mut ranked: Vec<usize> = (0..dim).collect();
    ranked.sort_by(|&a, &b| variance[b].total_cmp(&variance[a]).then(a.cmp(&b)));
    ranked
}

/// One input's points in leaf order, with the directory's boxes.
#[derive(Debug, Clone)]
pub struct Directory {
    pub shape: DirectoryShape,
    /// Slot → point position in the input (leaf order).
    pub order: Vec<u32>,
    /// `leaf_start[l]..leaf_start[l + 1]` are the slots of leaf `l`.
    pub leaf_start: Vec<usize>,
    /// Boxes of every node (level 1 first, then level 2, …, the leaves last; inside a level in
    /// leaf order), `dim` values each; an empty node's box is `[+∞, −∞]`, which meets nothing.
    pub lo: Vec<f64>,
    pub hi: Vec<f64>,
    dim: usize,
}

impl Directory {
    /// Sorts `points` (row-major, `dim` wide) into the directory `shape` describes: at each level
    /// every node's points by the level's cut dimension (ties by position, so the order is
    /// deterministic), cut into `fanout` parts of equal count.
    pub fn build(shape: &DirectoryShape, points: Coords, dim: usize) -> Self {
        let n = points.len() / dim.max(1);
        let mut order: Vec<u32> = (0..n as u32).collect();
        let mut starts = vec![0, n];
        for &cut in &shape.cuts {
            on_coords!(points, |points| {
                let key = |p: u32| points[p as usize * dim + cut].f64();
                let order_by = |a: &u32, b: &u32| key(*a).total_cmp(&key(*b)).then(a.cmp(b));
                let mut parts = Vec::with_capacity(starts.len());
                let mut rest = order.as_mut_slice();
                for w in starts.windows(2) {
                    let (part, tail) = std::mem::take(&mut rest).split_at_mut(w[1] - w[0]);
                    parts.push(part);
                    rest = tail;
                }
                parts.into_par_iter().for_each(|part| {
                    if part.len() > 1 << 16 {
                        part.par_sort_unstable_by(order_by)
                    } else {
                        part.sort_unstable_by(order_by)
                    }
                });
            });
            let f = shape.fanout;
            starts =
                starts.windows(2).flat_map(|w| (0..f).map(move |i| w[0] + i * (w[1] - w[0]) / f)).chain([n]).collect();
        }
        let leaves = shape.leaves();
        debug_assert_eq!(starts.len(), leaves + 1);
        let nodes = shape.nodes();
        let mut lo = vec![f64::INFINITY; nodes * dim];
        let mut hi = vec![f64::NEG_INFINITY; nodes * dim];
        let first_leaf = nodes - leaves;
        on_coords!(points, |points| {
            lo[first_leaf * dim..]
                .par_chunks_mut(dim.max(1))
                .zip(hi[first_leaf * dim..].par_chunks_mut(dim.max(1)))
                .enumerate()
                .for_each(|(leaf, (lo, hi))| {
                    for &p in &order[starts[leaf]..starts[leaf + 1]] {
                        for (d, x) in points[p as usize * dim..(p as usize + 1) * dim].iter().enumerate() {
                            // (f64::min/max skip a NaN: a row with one never qualifies.)
                            lo[d] = lo[d].min(x.f64());
                            hi[d] = hi[d].max(x.f64());
                        }
                    }
                })
        });
        // Inner nodes from their children, bottom up.
        for level in (1..shape.levels).rev() {
            let (first, children) = (level_offset(shape, level), level_offset(shape, level + 1));
            for node in 0..shape.fanout.pow(level as u32) {
                for child in node * shape.fanout..(node + 1) * shape.fanout {
                    for d in 0..dim {
                        let (c, p) = ((children + child) * dim + d, (first + node) * dim + d);
                        lo[p] = lo[p].min(lo[c]);
                        hi[p] = hi[p].max(hi[c]);
                    }
                }
            }
        }
        Self { shape: shape.clone(), order, leaf_start: starts, lo, hi, dim }
    }

    /// Leaves whose box meets the box `[lo, hi]` widened by the coordinate bound, in leaf order,
    /// skipping every node whose slots all lie before `from` (a self-join's block finds its pairs
    /// with later slots only); returns the nodes tested.
    pub fn visit(&self, lo: &[f64], hi: &[f64], from: usize, mut leaf: impl FnMut(usize)) -> u64 {
        let mut tested = 0;
        self.walk(1, 0, lo, hi, from, &mut tested, &mut leaf);
        tested
    }

    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        level: usize,
        parent: usize,
        lo: &[f64],
        hi: &[f64],
        from: usize,
        tested: &mut u64,
        leaf: &mut impl FnMut(usize),
    ) {
        let shape = &self.shape;
        let span = shape.fanout.pow((shape.levels - level) as u32);
        let r = shape.box_radius();
        let offset = level_offset(shape, level);
        for j in parent * shape.fanout..(parent + 1) * shape.fanout {
            let (first, end) = (self.leaf_start[j * span], self.leaf_start[(j + 1) * span]);
            if end <= from || first == end {
                continue;
            }
            *tested += 1;
            let node = (offset + j) * self.dim;
            let (nlo, nhi) = (&self.lo[node..node + self.dim], &self.hi[node..node + self.dim]);
            // Skipped only where a rounded difference exceeds r·(1 + 2⁻²⁰) (module docs).
            if (0..self.dim).any(|d| nlo[d] - hi[d] > r || lo[d] - nhi[d] > r) {
                continue;
            }
            if level == shape.levels {
                leaf(j);
            } else {
                self.walk(level + 1, j, lo, hi, from, tested, leaf);
            }
        }
    }

    /// The bounding box of every [`DIRECTORY_BLOCK`] consecutive slots of `points` in this
    /// directory's order: `(lo, hi)`, `dim` values a block.
    pub fn block_boxes(&self, points: Coords) -> (Vec<f64>, Vec<f64>) {
        let dim = self.dim;
        let blocks = self.order.len().div_ceil(DIRECTORY_BLOCK);
        let mut lo = vec![f64::INFINITY; blocks * dim];
        let mut hi = vec![f64::NEG_INFINITY; blocks * dim];
        on_coords!(points, |points| {
            lo.par_chunks_mut(dim.max(1)).zip(hi.par_chunks_mut(dim.max(1))).enumerate().for_each(|(b, (lo, hi))| {
                let slots = b * DIRECTORY_BLOCK..((b + 1) * DIRECTORY_BLOCK).min(self.order.len());
                for &p in &self.order[slots] {
                    for (d, x) in points[p as usize * dim..(p as usize + 1) * dim].iter().enumerate() {
                        lo[d] = lo[d].min(x.f64());
                        hi[d] = hi[d].max(x.f64());
                    }
                }
            })
        });
        (lo, hi)
    }
}

/// The directories of a join's two sides and the left blocks' boxes, which both backends join
/// through.
pub struct JoinDirectories {
    /// The right side's, of the planned shape.
    pub right: Directory,
    /// A separate left side's, of its own size over the same cut dimensions (`None`: a self-join,
    /// whose left side is the right one).
    left: Option<Directory>,
    /// The bounding box of each [`DIRECTORY_BLOCK`] left slots (see [`Directory::block_boxes`]).
    pub block_lo: Vec<f64>,
    pub block_hi: Vec<f64>,
}

impl JoinDirectories {
    /// Sorts the left and right filter-space rows (row-major, `dim` wide; `same`: a self-join)
    /// into their directories.
    pub fn build(shape: &DirectoryShape, left: Coords, right: Coords, dim: usize, same: bool) -> Self {
        let right_dir = Directory::build(shape, right, dim);
        let left_dir = (!same).then(|| {
            let own = DirectoryShape::for_points(left.len() / dim.max(1), &shape.cuts, shape.radius);
            Directory::build(&own, left, dim)
        });
        let (block_lo, block_hi) = left_dir.as_ref().unwrap_or(&right_dir).block_boxes(left);
        Self { right: right_dir, left: left_dir, block_lo, block_hi }
    }

    /// The left side's directory (the right one for a self-join).
    pub fn left(&self) -> &Directory {
        self.left.as_ref().unwrap_or(&self.right)
    }

    /// Left blocks.
    pub fn blocks(&self) -> usize {
        self.left().order.len().div_ceil(DIRECTORY_BLOCK)
    }

    /// Block `b`'s box, `(lo, hi)`.
    pub fn block_box(&self, b: usize) -> (&[f64], &[f64]) {
        let dim = self.right.dim;
        (&self.block_lo[b * dim..(b + 1) * dim], &self.block_hi[b * dim..(b + 1) * dim])
    }
}

/// Index of level `level`'s first node among all nodes (level 1 first).
fn level_offset(shape: &DirectoryShape, level: usize) -> usize {
    (1..level).map(|l| shape.fanout.pow(l as u32)).sum()
}

#[cfg(test)]
mod tests {
    use super::{DIRECTORY_BLOCK, Directory, DirectoryShape, ranked_by_spread};
    use crate::vectors::Coords;

    /// Skewed, with many ties: exponential values (λ = 40) rounded to multiples of 1/64.
    fn points(n: usize, dim: usize, seed: u64) -> Vec<f64> {
        let values = crate::datagen::generate(crate::datagen::Distribution::Exponential, n, dim, seed);
        values.into_iter().map(|x| (x * 64.0).round() / 64.0).collect()
    }

    #[test]
    fn shape_has_pages_of_about_64_points() {
        // 15,625 pages of 64 points: 3 levels of fanout 25.
        let shape = DirectoryShape::for_points(1_000_000, &[0, 1, 2, 3, 4, 5, 6, 7], 0.1);
        assert_eq!((shape.levels, shape.fanout, shape.cuts.clone()), (3, 25, vec![0, 1, 2]));
        let small = DirectoryShape::for_points(1000, &[1, 0], 0.1);
        assert_eq!((small.levels, small.fanout), (2, 4));
        let tiny = DirectoryShape::for_points(200, &[1, 0], 0.1);
        assert_eq!((tiny.levels, tiny.fanout), (1, 3));
        assert_eq!(DirectoryShape::for_points(5, &[0], 0.1).leaves(), 2);
    }

    #[test]
    fn every_point_in_one_leaf_whose_box_holds_it_with_equal_counts() {
        for (n, dim) in [(0, 3), (1, 2), (37, 1), (5000, 4), (20_000, 8)] {
            let values = points(n, dim, n as u64 + 1);
            let ranked = ranked_by_spread(Coords::F64(&values), dim);
            let shape = DirectoryShape::for_points(n, &ranked, 0.5);
            let dir = Directory::build(&shape, Coords::F64(&values), dim);
            let mut seen = dir.order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>(), "a permutation");
            let first_leaf = shape.nodes() - shape.leaves();
            for leaf in 0..shape.leaves() {
                for &p in &dir.order[dir.leaf_start[leaf]..dir.leaf_start[leaf + 1]] {
                    for d in 0..dim {
                        let x = values[p as usize * dim + d];
                        let node = (first_leaf + leaf) * dim + d;
                        assert!(dir.lo[node] <= x && x <= dir.hi[node]);
                        let parent = leaf / shape.fanout.pow(shape.levels as u32 - 1);
                        assert!(
                            dir.lo[parent * dim + d] <= x && x <= dir.hi[parent * dim + d],
                            "level 1 holds its leaves"
                        );
                    }
                }
            }
            // Quantile parts differ by at most one point at the first level.
            let per = |j: usize| {
                dir.leaf_start[(j + 1) * shape.leaves() / shape.fanout]
                    - dir.leaf_start[j * shape.leaves() / shape.fanout]
            };
            let sizes: Vec<usize> = (0..shape.fanout).map(per).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
        }
    }

    #[test]
    fn walk_finds_every_partner_of_every_block() {
        let (n, dim, r) = (6000, 3, 0.02);
        let values = points(n, dim, 7);
        let ranked = ranked_by_spread(Coords::F64(&values), dim);
        let shape = DirectoryShape::for_points(n, &ranked, r);
        let dir = Directory::build(&shape, Coords::F64(&values), dim);
        let (lo, hi) = dir.block_boxes(Coords::F64(&values));
        let mut slot_of = vec![0; n];
        for (s, &p) in dir.order.iter().enumerate() {
            slot_of[p as usize] = s;
        }
        let leaf_of = |s: usize| dir.leaf_start.partition_point(|&start| start <= s) - 1;
        let mut pruned = 0;
        for b in 0..n.div_ceil(DIRECTORY_BLOCK) {
            let mut visited = vec![false; shape.leaves()];
            dir.visit(&lo[b * dim..(b + 1) * dim], &hi[b * dim..(b + 1) * dim], b * DIRECTORY_BLOCK + 1, |l| {
                visited[l] = true
            });
            pruned += visited.iter().filter(|v| !**v).count();
            for s in b * DIRECTORY_BLOCK..((b + 1) * DIRECTORY_BLOCK).min(n) {
                let x = &values[dir.order[s] as usize * dim..][..dim];
                for (q, y) in values.chunks_exact(dim).enumerate() {
                    let t = slot_of[q];
                    let close = x.iter().zip(y).all(|(a, b)| (a - b).abs() <= r);
                    if close && t > s {
                        assert!(visited[leaf_of(t)], "slot {s}'s partner {t} in an unvisited leaf");
                    }
                }
            }
        }
        assert!(pruned > 0, "the walk prunes");
    }
}
