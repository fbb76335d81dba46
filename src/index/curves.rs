//! The Multicurves index of approximate kNN (Valle, Cord, Philipp-Foliguet, "High-dimensional
//! descriptor indexing for large multimedia databases"; searched as in Teodoro et al., "Approximate
//! similarity search for online multimedia services on distributed CPU–GPU platforms").
//!
//! Multicurves keeps several space-filling curves, each over a projection of the vectors onto a
//! few dimensions: a vector's position on a curve (its extended key) is a sort key, each curve is a
//! sorted list, and a query takes the `p` entries around its own key on every curve as candidates,
//! which are then ranked by their true distances. Points wrongly separated by one curve's
//! boundaries are likely kept together by another, and low-dimensional curves have milder boundary
//! effects than one curve over every dimension.
//!
//! Which dimensions each curve sees. The papers divide the dimensions among the curves. Raw
//! dimensions of embeddings and images carry very unequal shares of the variance (the 784 pixels
//! of Fashion-MNIST: 77 % of it in 16 principal directions), so a curve over 8 arbitrary pixels
//! orders the points by little more than noise. Here the data's principal axes come first (PCA of a
//! sample), and each curve sees a different random rotation of the leading axes (the randomly
//! rotated curves of Shepherd, Zhu and Megiddo), so that every curve orders the points by where
//! the data varies most, each with its boundaries elsewhere. Measured on Fashion-MNIST, 8 curves
//! over 8-dimensional rotations of the leading 16 axes reach recall@10 0.95 with ~3,000 candidates a
//! query, where 8 curves over disjoint slices of the leading 32 axes reach 0.81 with 3,800
//! (docs/optimisations.md, v105).
//!
//! The principal coordinates also rank the candidates cheaply: the axes are orthonormal, so the
//! squared distance over the leading `projected_dims` coordinates is the squared Euclidean distance
//! less what the remaining directions add (Pythagoras). Each row also keeps the norm of that
//! remainder (its residual), and the query's half of its own: their squared difference estimates
//! what the remaining directions add (`RESIDUAL_WEIGHT`). The proxy reads 256 bytes of a
//! candidate, where the whole vector of Fashion-MNIST is 3 KB, and the share of its first 16
//! coordinates is a lower bound of it, read from one cache line (backend/approx.rs).

use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::op::{Metric, dot};
use crate::vectors::{Row, Vectors};

/// Curves of an index.
const CURVES: usize = 8;
/// Leading principal axes the curves' rotations mix.
const CURVE_AXES: usize = 16;
/// Dimensions of each curve (8 coordinates of 8 bits: a 64-bit key).
const CURVE_DIMS: usize = 8;
/// Leading principal coordinates kept per vector (the ranking proxy), with the norm of what the
/// rest of the vector adds in the slot after them: 64 floats a row.
const PROJECTED_DIMS: usize = 63;
/// The query's entry in the residual slot, as a share of its own residual norm `s`: the proxy's
/// term for a base row of residual norm `r` is then `(r − s/2)² = r² − r·s + s²/4`, the expected
/// `‖r_x − r_q‖² = r² + s² − 2·r·s·cos θ` at cos θ = ½ less what is the same for every row of the
/// query. Measured on Fashion-MNIST and blobs against 0.3, 0.7 and 1 (1 makes it the lower bound
/// `(r − s)²`, which ranked worst), docs/optimisations.md v140.
const RESIDUAL_WEIGHT: f32 = 0.5;
/// Rows of the sample the principal axes are estimated from.
const PCA_SAMPLE: usize = 8192;
/// Rounds of subspace iteration (Golub & Van Loan, orthogonal iteration). The axes need only be
/// orthonormal for the proxy to be a share of the distance; how well they match the principal ones
/// decides how large a share.
const PCA_ROUNDS: usize = 8;

/// Which coordinates an index is built over: the vectors themselves, or the unit vectors of the
/// cosine distance (whose Euclidean order is the cosine order: ‖a − b‖² = 2 − 2·cos).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// L2, L2², L1 and L∞ over the vectors as they are.
    Raw,
    /// Cosine: over the normalised vectors.
    Unit,
}

impl Geometry {
    /// The coordinates `metric` is searched in; `None` for a metric the curves cannot serve: the
    /// inner product (not a distance: the nearest by it need not be near in space) and text.
    pub fn of(metric: Metric) -> Option<Self> {
        match metric {
            Metric::L2 | Metric::L2Squared | Metric::L1 | Metric::LInf => Some(Geometry::Raw),
            Metric::Cosine => Some(Geometry::Unit),
            Metric::InnerProduct | Metric::Levenshtein => None,
        }
    }
}

/// One curve: a rotation of the leading axes onto its dimensions, their quantisation, and the base
/// positions sorted by key.
#[derive(Debug)]
struct Curve {
    /// `axes × dims`, row-major: coordinate j of the curve is Σᵢ projected[i]·rotation[i·dims + j].
    rotation: Vec<f32>,
    /// Per curve dimension: the smallest base coordinate and cells per unit.
    low: Vec<f32>,
    scale: Vec<f32>,
    /// Keys of the base vectors, ascending, and the position of each.
    keys: Vec<u64>,
    positions: Vec<u32>,
    /// The [`LEAD`] leading principal coordinates of each entry, in key order: a query's
    /// candidates on this curve are one contiguous run, streamed rather than fetched at random.
    leads: Vec<f32>,
}

/// A Multicurves index over one input's vectors.
#[derive(Debug)]
pub struct Multicurves {
    /// Dimension of the vectors.
    dim: usize,
    geometry: Geometry,
    /// The sample mean the principal axes are centred on.
    mean: Vec<f32>,
    /// `projected_dims × dim`, row-major: orthonormal principal axes, by decreasing variance.
    axes: Vec<f32>,
    /// Principal coordinates kept per vector (≤ 64).
    projected_dims: usize,
    /// Every base vector's leading principal coordinates, `stride` floats a row (zero-padded to a
    /// multiple of 16, so a row's first 16 share one 64-byte cache line), from `first` on (the
    /// offset that aligns row 0 to 64 bytes).
    projected: Vec<f32>,
    first: usize,
    stride: usize,
    /// `len × dim`: the base in f32 (unit vectors under cosine), for the re-rank's first pass.
    values: Vec<f32>,
    /// Leading axes each curve's rotation mixes, and the curve's dimensions.
    curve_axes: usize,
    curve_dims: usize,
    bits: u32,
    curves: Vec<Curve>,
    len: usize,
}

/// Principal coordinates in a row's first cache line.
pub const LEAD: usize = 16;

impl Multicurves {
    /// Builds the index of `base` for `geometry`, on every core. Deterministic: the sample, the
    /// starting subspace and the rotations are fixed, so one base always gives one index.
    pub fn build(base: &Vectors, geometry: Geometry) -> Self {
        let dim = base.dim;
        let len = base.len();
        let (mean, axes, projected_dims) = principal_axes(base, geometry);
        let stride = (projected_dims + 1).next_multiple_of(LEAD);
        let (projected, first) = project(base, geometry, &mean, &axes, projected_dims, stride);
        let mut values = vec![0f32; len * dim];
        values
            .par_chunks_mut(dim.max(1))
            .enumerate()
            .for_each(|(i, out)| out.copy_from_slice(&to_f32(base.row(i), geometry)));
        let rows = &projected[first..first + len * stride];
        let curve_axes = CURVE_AXES.min(projected_dims);
        let curve_dims = CURVE_DIMS.min(curve_axes);
        let bits = (64 / curve_dims as u32).min(16);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6d75_6c74_6963_7576);
        let rotations: Vec<Vec<f32>> = (0..CURVES).map(|_| random_rotation(curve_axes, curve_dims, &mut rng)).collect();
        let curves = rotations
            .into_par_iter()
            .map(|rotation| {
                let coords: Vec<f32> = rows
                    .par_chunks(stride)
                    .flat_map_iter(|row| rotate(&row[..curve_axes], &rotation, curve_dims))
                    .collect();
                let (mut low, mut high) = (vec![f32::INFINITY; curve_dims], vec![f32::NEG_INFINITY; curve_dims]);
                for row in coords.chunks(curve_dims) {
                    for ((l, h), &x) in low.iter_mut().zip(high.iter_mut()).zip(row) {
                        *l = l.min(x);
                        *h = h.max(x);
                    }
                }
                let cells = ((1u64 << bits) - 1) as f32;
                let scale = low.iter().zip(&high).map(|(l, h)| if h > l { cells / (h - l) } else { 0.0 }).collect();
                let mut curve =
                    Curve { rotation, low, scale, keys: Vec::new(), positions: Vec::new(), leads: Vec::new() };
                let mut keyed: Vec<(u64, u32)> = coords
                    .par_chunks(curve_dims)
                    .enumerate()
                    .map(|(i, row)| (curve.key(row, bits), i as u32))
                    .collect();
                keyed.par_sort_unstable();
                (curve.keys, curve.positions) = keyed.into_iter().unzip();
                curve.leads = curve
                    .positions
                    .par_iter()
                    .flat_map_iter(|&p| rows[p as usize * stride..][..LEAD].iter().copied())
                    .collect();
                curve
            })
            .collect();
        Self {
            dim,
            geometry,
            mean,
            axes,
            projected_dims,
            projected,
            first,
            stride,
            values,
            curve_axes,
            curve_dims,
            bits,
            curves,
            len,
        }
    }

    /// Base vectors indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no vector.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Principal coordinates kept per vector.
    pub fn projected_dims(&self) -> usize {
        self.projected_dims
    }

    /// Base vector `i`'s leading principal coordinates (zero-padded to a multiple of [`LEAD`]).
    #[inline]
    pub fn projected(&self, i: usize) -> &[f32] {
        let start = self.first + i * self.stride;
        &self.projected[start..start + self.stride]
    }

    /// Base vector `i` in f32 (its unit vector under cosine).
    #[inline]
    pub fn values(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    /// A query in the index's terms: its f32 values (its unit vector under cosine) and its leading
    /// principal coordinates (zero-padded as [`Multicurves::projected`]).
    pub fn query(&self, query: &[f64]) -> (Vec<f32>, Vec<f32>) {
        let values = to_f32(Row::F64(query), self.geometry);
        let centred: Vec<f32> = values.iter().zip(&self.mean).map(|(x, m)| x - m).collect();
        let mut projected: Vec<f32> = self.axes.chunks(self.dim).map(|axis| dot_f32(axis, &centred)).collect();
        let residual = residual_norm(&centred, &projected);
        projected.resize(self.stride, 0.0);
        projected[self.projected_dims] = RESIDUAL_WEIGHT * residual;
        (values, projected)
    }

    /// Visits each curve's `per_curve` entries around the query's key (as many before it as after,
    /// fewer only at a list's ends): `visit(position, leading coordinates)`, the [`LEAD`] leading
    /// principal coordinates read from the curve's own copy, in key order; a position may repeat.
    pub fn candidates(&self, projected: &[f32], per_curve: usize, mut visit: impl FnMut(u32, &[f32])) {
        let n = self.len();
        let take = per_curve.min(n);
        let mut coords = Vec::with_capacity(self.curve_dims);
        for curve in &self.curves {
            coords.clear();
            coords.extend(rotate(&projected[..self.curve_axes], &curve.rotation, self.curve_dims));
            let key = curve.key(&coords, self.bits);
            let at = curve.keys.partition_point(|&k| k < key);
            let start = at.saturating_sub(take / 2).min(n - take);
            let leads = curve.leads[start * LEAD..(start + take) * LEAD].chunks_exact(LEAD);
            for (&p, row) in curve.positions[start..start + take].iter().zip(leads) {
                visit(p, row);
            }
        }
    }
}

/// The index's shape for EXPLAIN, before it is built (`dim` of the vectors).
pub fn describe_for(dim: usize) -> String {
    let axes = CURVE_AXES.min(dim.min(PROJECTED_DIMS));
    let dims = CURVE_DIMS.min(axes);
    format!("curves={CURVES}, each a Hilbert curve over {dims} rotated dims of the leading {axes} principal axes")
}

impl Curve {
    /// The Hilbert key of curve coordinates `coords` quantised to `bits` bits each.
    fn key(&self, coords: &[f32], bits: u32) -> u64 {
        let top = ((1u64 << bits) - 1) as f32;
        let mut cells = [0u32; CURVE_DIMS];
        for (j, &x) in coords.iter().enumerate() {
            cells[j] = ((x - self.low[j]) * self.scale[j]).clamp(0.0, top) as u32;
        }
        hilbert_key(&mut cells[..coords.len()], bits)
    }
}

/// The position on the `cells.len()`-dimensional Hilbert curve of order `bits` of the cell
/// `cells` (each coordinate below 2^bits), by Skilling's transpose algorithm ("Programming the
/// Hilbert curve", AIP Conf. Proc. 707, 2004): the coordinates become the curve position's
/// "transposed" form, whose bits interleaved most significant first are the key. `cells` is
/// overwritten.
pub fn hilbert_key(cells: &mut [u32], bits: u32) -> u64 {
    let n = cells.len();
    if n == 0 || bits == 0 {
        return 0;
    }
    let top = 1u32 << (bits - 1);
    // Inverse undo of the excess work.
    let mut q = top;
    while q > 1 {
        let p = q - 1;
        for i in 0..n {
            if cells[i] & q != 0 {
                cells[0] ^= p;
            } else {
                let t = (cells[0] ^ cells[i]) & p;
                cells[0] ^= t;
                cells[i] ^= t;
            }
        }
        q >>= 1;
    }
    // Gray encode.
    for i in 1..n {
        cells[i] ^= cells[i - 1];
    }
    let mut t = 0;
    let mut q = top;
    while q > 1 {
        if cells[n - 1] & q != 0 {
            t ^= q - 1;
        }
        q >>= 1;
    }
    cells.iter_mut().for_each(|c| *c ^= t);
    let mut key = 0u64;
    for bit in (0..bits).rev() {
        for &c in cells.iter() {
            key = (key << 1) | u64::from((c >> bit) & 1);
        }
    }
    key
}

/// `x` (the leading axes' coordinates) times `rotation` (`x.len() × dims`).
#[inline]
fn rotate<'a>(x: &'a [f32], rotation: &'a [f32], dims: usize) -> impl Iterator<Item = f32> + 'a {
    (0..dims).map(move |j| x.iter().enumerate().map(|(i, v)| v * rotation[i * dims + j]).sum())
}

/// A vector's f32 coordinates in `geometry`.
fn to_f32(row: Row, geometry: Geometry) -> Vec<f32> {
    match geometry {
        Geometry::Raw => row.iter().map(|x| x as f32).collect(),
        Geometry::Unit => {
            let norm = crate::op::row_norm(row).sqrt();
            row.iter().map(|x| (x / norm) as f32).collect()
        }
    }
}

/// The mean of an evenly strided sample of the rows and the leading principal axes of the
/// sample's covariance (orthonormal, by decreasing variance; `min(dim, 64)` of them).
fn principal_axes(base: &Vectors, geometry: Geometry) -> (Vec<f32>, Vec<f32>, usize) {
    let (n, dim) = (base.len(), base.dim);
    let rows = n.min(PCA_SAMPLE);
    let step = n.checked_div(rows).unwrap_or(1).max(1);
    let sample: Vec<f32> = (0..rows).flat_map(|i| to_f32(base.row(i * step), geometry)).collect();
    let mut mean = vec![0f64; dim];
    for row in sample.chunks(dim) {
        mean.iter_mut().zip(row).for_each(|(m, &x)| *m += x as f64);
    }
    let mean: Vec<f32> = mean.iter().map(|m| (m / rows.max(1) as f64) as f32).collect();
    let centred: Vec<f32> = sample.chunks(dim).flat_map(|row| row.iter().zip(&mean).map(|(x, m)| x - m)).collect();
    // Covariance (up to a factor) = centredᵀ · centred, dim × dim.
    let mut covariance = vec![0f32; dim * dim];
    // SAFETY: `centred` holds rows × dim values read as a dim × rows matrix (row stride 1, column
    // stride dim) and as a rows × dim matrix (row stride dim); `covariance` holds dim × dim values
    // (row stride dim) and aliases neither.
    unsafe {
        matrixmultiply::sgemm(
            dim,
            rows,
            dim,
            1.0,
            centred.as_ptr(),
            1,
            dim as isize,
            centred.as_ptr(),
            dim as isize,
            1,
            0.0,
            covariance.as_mut_ptr(),
            dim as isize,
            1,
        );
    }
    let kept = dim.min(PROJECTED_DIMS);
    // Orthogonal iteration from a fixed random start: Q ← orth(C·Q).
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7063_6178_6573);
    let mut q: Vec<Vec<f64>> = (0..kept).map(|_| (0..dim).map(|_| rng.random::<f64>() - 0.5).collect()).collect();
    orthonormalise(&mut q);
    for _ in 0..PCA_ROUNDS {
        q = q
            .par_iter()
            .map(|v| covariance.chunks(dim).map(|row| row.iter().zip(v).map(|(&c, x)| c as f64 * x).sum()).collect())
            .collect();
        orthonormalise(&mut q);
    }
    // Order the axes by the variance they carry (the Rayleigh quotient vᵀCv).
    let mut by_variance: Vec<(f64, Vec<f64>)> = q
        .into_iter()
        .map(|v| {
            let cv: Vec<f64> =
                covariance.chunks(dim).map(|row| row.iter().zip(&v).map(|(&c, x)| c as f64 * x).sum()).collect();
            (dot(&v, &cv), v)
        })
        .collect();
    by_variance.sort_by(|a, b| b.0.total_cmp(&a.0));
    let axes = by_variance.into_iter().flat_map(|(_, v)| v.into_iter().map(|x| x as f32)).collect();
    (mean, axes, kept)
}

/// Modified Gram–Schmidt; a vector that vanishes (a rank-deficient sample) is replaced by a unit
/// vector orthogonal to those before it, so the result is always orthonormal.
fn orthonormalise(vectors: &mut [Vec<f64>]) {
    let dim = vectors.first().map_or(0, Vec::len);
    for i in 0..vectors.len() {
        for attempt in 0..=dim {
            for j in 0..i {
                let (done, rest) = vectors.split_at_mut(i);
                let projection = dot(&rest[0], &done[j]);
                rest[0].iter_mut().zip(&done[j]).for_each(|(x, y)| *x -= projection * y);
            }
            let norm = dot(&vectors[i], &vectors[i]).sqrt();
            if norm > 1e-9 {
                vectors[i].iter_mut().for_each(|x| *x /= norm);
                break;
            }
            // Try the next coordinate axis.
            vectors[i] = (0..dim).map(|d| if d == (i + attempt) % dim { 1.0 } else { 0.0 }).collect();
        }
    }
}

/// A random `axes × dims` matrix with orthonormal columns (the leading columns of a random
/// rotation).
fn random_rotation(axes: usize, dims: usize, rng: &mut impl Rng) -> Vec<f32> {
    let mut columns: Vec<Vec<f64>> =
        (0..dims).map(|_| (0..axes).map(|_| rng.sample::<f64, _>(rand_distr::StandardNormal)).collect()).collect();
    orthonormalise(&mut columns);
    (0..axes).flat_map(|i| columns.iter().map(move |c| c[i] as f32)).collect()
}

/// Every row's leading principal coordinates, `stride` floats a row (zero-padded), and the offset
/// of row 0, which is 64-byte aligned.
fn project(
    base: &Vectors,
    geometry: Geometry,
    mean: &[f32],
    axes: &[f32],
    kept: usize,
    stride: usize,
) -> (Vec<f32>, usize) {
    const BLOCK: usize = 4096;
    let (n, dim) = (base.len(), base.dim);
    let mut projected = vec![0f32; n * stride + LEAD];
    let first = (projected.as_ptr() as usize).next_multiple_of(64).wrapping_sub(projected.as_ptr() as usize) / 4;
    projected[first..first + n * stride].par_chunks_mut(BLOCK * stride).enumerate().for_each(|(b, out)| {
        let rows = out.len() / stride;
        let start = b * BLOCK;
        let centred: Vec<f32> = (start..start + rows)
            .flat_map(|i| to_f32(base.row(i), geometry).into_iter().zip(mean).map(|(x, m)| x - m))
            .collect();
        // SAFETY: `centred` holds rows × dim values (row stride dim); `axes` holds kept × dim
        // values read as a dim × kept matrix (row stride 1, column stride dim); `out` holds
        // rows × stride values, of which the first `kept` of each row are written (row stride
        // stride), and aliases neither input.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                dim,
                kept,
                1.0,
                centred.as_ptr(),
                dim as isize,
                1,
                axes.as_ptr(),
                1,
                dim as isize,
                0.0,
                out.as_mut_ptr(),
                stride as isize,
                1,
            );
        }
        for (row, centred) in out.chunks_exact_mut(stride).zip(centred.chunks_exact(dim.max(1))) {
            row[kept] = residual_norm(centred, &row[..kept]);
        }
    });
    (projected, first)
}

/// The norm of what a centred vector has beyond its principal coordinates `leading`: the axes are
/// orthonormal, so its square is the vector's squared norm less theirs (Pythagoras).
fn residual_norm(centred: &[f32], leading: &[f32]) -> f32 {
    (dot_f32(centred, centred) - dot_f32(leading, leading)).max(0.0).sqrt()
}

/// Σ aᵢbᵢ in [`LANES`](crate::backend) partial sums, so the loop vectorises.
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a_blocks, b_blocks) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a_blocks.remainder().iter().zip(b_blocks.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a_blocks.zip(b_blocks) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hilbert_keys_number_every_cell_once_and_neighbours_are_adjacent() {
        // Order 3 in 3 dimensions: 512 cells; consecutive keys are cells one step apart.
        let mut by_key = vec![None; 512];
        for x in 0..8u32 {
            for y in 0..8u32 {
                for z in 0..8u32 {
                    let key = hilbert_key(&mut [x, y, z], 3) as usize;
                    assert!(by_key[key].is_none(), "key {key} given twice");
                    by_key[key] = Some([x, y, z]);
                }
            }
        }
        let cells: Vec<[u32; 3]> = by_key.into_iter().map(|c| c.expect("every key used")).collect();
        for pair in cells.windows(2) {
            let step: u32 = pair[0].iter().zip(&pair[1]).map(|(a, b)| a.abs_diff(*b)).sum();
            assert_eq!(step, 1, "{:?} → {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn principal_axes_are_orthonormal_and_find_the_spread() {
        // Points spread along (1, 1, 0, 0) far more than along anything else.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let values: Vec<f32> = (0..2000)
            .flat_map(|_| {
                let t = rng.random::<f32>() * 100.0;
                [t + rng.random::<f32>(), t + rng.random::<f32>(), rng.random::<f32>(), rng.random::<f32>()]
            })
            .collect();
        let base = Vectors::new(4, values.iter().map(|&x| x as f64).collect());
        let (_, axes, kept) = principal_axes(&base, Geometry::Raw);
        assert_eq!(kept, 4);
        for i in 0..4 {
            for j in 0..4 {
                let d: f32 = (0..4).map(|c| axes[i * 4 + c] * axes[j * 4 + c]).sum();
                assert!((d - f32::from(i == j)).abs() < 1e-4, "axes {i}·{j} = {d}");
            }
        }
        let first = &axes[..4];
        let half = std::f32::consts::FRAC_1_SQRT_2;
        assert!((first[0].abs() - half).abs() < 0.01 && (first[1].abs() - half).abs() < 0.01, "{first:?}");
    }

    #[test]
    fn the_leading_coordinates_bound_the_distance_from_below() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let dim = 96;
        let values: Vec<f64> = (0..3000 * dim).map(|_| rng.random::<f64>()).collect();
        let base = Vectors::new(dim, values);
        let index = Multicurves::build(&base, Geometry::Raw);
        assert_eq!(index.projected_dims(), 63);
        let kept = index.projected_dims();
        let squared = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum() };
        for i in (0..3000).step_by(97) {
            let q = base.row((i * 7) % 3000).to_vec();
            let (_, qp) = index.query(&q);
            for j in (0..3000).step_by(31) {
                let (row, whole) = (index.projected(j), squared(&qp, index.projected(j)));
                let bound = squared(&qp[..kept], &row[..kept]);
                let lead = squared(&qp[..LEAD], &row[..LEAD]);
                let full = crate::op::squared_l2(&q, &base.row(j).to_vec());
                assert!(lead <= whole * (1.0 + 1e-5), "lead {lead} above the proxy {whole}");
                assert!(f64::from(bound) <= full * (1.0 + 1e-4) + 1e-4, "bound {bound} above {full}");
                // The residual slot: the row's principal and residual parts make up its centred norm.
                let centred: f32 = index.values(j).iter().zip(&index.mean).map(|(x, m)| (x - m) * (x - m)).sum();
                let parts = row[..kept].iter().map(|x| x * x).sum::<f32>() + row[kept] * row[kept];
                assert!((parts - centred).abs() <= 1e-3 * centred, "{parts} against {centred}");
            }
        }
    }

    #[test]
    fn a_base_vector_finds_itself_among_its_candidates() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = Vectors::new(20, (0..5000 * 20).map(|_| rng.random::<f64>()).collect());
        let index = Multicurves::build(&base, Geometry::Raw);
        let mut out = Vec::new();
        for i in (0..5000).step_by(50) {
            out.clear();
            let (_, qp) = index.query(&base.row(i).to_vec());
            index.candidates(&qp, 16, |p, lead| {
                assert_eq!(lead, &index.projected(p as usize)[..LEAD]);
                out.push(p);
            });
            assert_eq!(out.len(), 16 * CURVES);
            assert!(out.contains(&(i as u32)), "row {i}");
        }
    }
}
