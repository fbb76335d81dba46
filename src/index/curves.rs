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
//! (docs/approx.md#measured); 16 such curves reach 0.94 with 128 entries a curve, where 8 need
//! 512 (docs/approx.md#measured), for twice the curves' memory (76 bytes a row a curve).
//!
//! The principal coordinates also rank the candidates cheaply: the axes are orthonormal, so the
//! squared distance over the leading `projected_dims` coordinates is the squared Euclidean distance
//! less what the remaining directions add (Pythagoras). Each row also keeps the norm of that
//! remainder (its residual), and the query's half of its own: their squared difference estimates
//! what the remaining directions add (`RESIDUAL_WEIGHT`). The proxy reads 256 bytes of a
//! candidate, where the whole vector of Fashion-MNIST is 3 KB, and the share of its first 16
//! coordinates is a lower bound of it, read from one cache line (backend/cpu/approx.rs).
//!
//! The best of the proxy are ranked again over more principal coordinates (up to
//! [`PRINCIPAL_DIMS`], kept in a second array with their own residual norm) before any whole
//! vector is read: on Fashion-MNIST the true 10 nearest among the proxy's best 80 are nearly all
//! among the best 30 over 192 coordinates (docs/approx.md#measured), so 30 whole vectors are
//! read a query instead of 80. Where the vectors have at most [`PRINCIPAL_DIMS`] dimensions the
//! coordinates are a rotation of the whole vector, and that ranking is the Euclidean one.
//!
//! How a curve keys and orders the rows is index/curve_keys.rs; the build orders the curves on the
//! cores or, for the device's search, on the device (`Multicurves::build_with`), to the same lists.

use rand::{Rng, SeedableRng};
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use super::codes::Codes;
use super::curve_keys::{CurveFrame, CurveOrder, KeyInputs, MAX_CURVE_DIMS, order_on_cores};
use super::graph::NeighbourGraph;
use super::pages::huge_filled;
use crate::op::{Metric, dot};
use crate::vectors::{Row, Vectors};

/// What decides the index's build besides the vectors: its parameters and its graph's, one
/// string (part of a stored index's key, index/stored.rs).
pub fn build_parameters() -> String {
    format!(
        "curves={CURVES} axes={CURVE_AXES} dims={CURVE_DIMS} projected={PROJECTED_DIMS} principal={PRINCIPAL_DIMS} \
         sample={PCA_SAMPLE} rounds={PCA_ROUNDS}; {}",
        super::graph::build_parameters()
    )
}

/// Curves of an index (16 rather than 8: docs/approx.md#measured).
pub const CURVES: usize = 16;
/// Leading principal axes the curves' rotations mix.
const CURVE_AXES: usize = 16;
/// Dimensions of each curve (8 coordinates of 8 bits: a 64-bit key).
const CURVE_DIMS: usize = MAX_CURVE_DIMS;
/// Leading principal coordinates kept per vector (the ranking proxy), with the norm of what the
/// rest of the vector adds in the slot after them: 64 floats a row.
const PROJECTED_DIMS: usize = 63;
/// The query's entry in the residual slot, as a share of its own residual norm `s`: the proxy's
/// term for a base row of residual norm `r` is then `(r − s/2)² = r² − r·s + s²/4`, the expected
/// `‖r_x − r_q‖² = r² + s² − 2·r·s·cos θ` at cos θ = ½ less what is the same for every row of the
/// query. Measured on Fashion-MNIST and blobs against 0.3, 0.7 and 1 (1 makes it the lower bound
/// `(r − s)²`, which ranked worst), docs/approx.md#measured.
const RESIDUAL_WEIGHT: f32 = 0.5;
/// Principal coordinates kept in all: the proxy's [`PROJECTED_DIMS`], then those of the second
/// ranking (`Multicurves::refined`).
pub const PRINCIPAL_DIMS: usize = 192;
/// Keys between two entries of a curve's fence (`Curve::fences`): a query's binary search runs
/// over the fence (7.5 KB for 60,000 rows, in L1 or L2), then within one block of 64 keys (8 cache
/// lines), instead of ~16 steps over the whole key list, each a likely cache miss.
const FENCE: usize = 16;
/// Rows of the sample the principal axes are estimated from.
pub const PCA_SAMPLE: usize = 8192;
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
            Metric::InnerProduct | Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => None,
        }
    }
}

/// One curve: its frame (rotation and quantisation) and the base positions sorted by key.
#[derive(Debug)]
struct Curve {
    frame: CurveFrame,
    /// Keys of the base vectors, ascending, and the position of each.
    keys: Vec<u64>,
    /// Every [`FENCE`]th key, from the first.
    fences: Vec<u64>,
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
    /// `(projected_dims + refined_dims) × dim`, row-major: orthonormal principal axes, by
    /// decreasing variance.
    axes: Vec<f32>,
    /// Principal coordinates of the proxy (≤ 63).
    projected_dims: usize,
    /// Principal coordinates after those of the proxy, for the second ranking (0 where the
    /// proxy's are the whole vector).
    refined_dims: usize,
    /// Every base vector's leading principal coordinates, `stride` floats a row (zero-padded to a
    /// multiple of 16, so a row's first 16 share one 64-byte cache line), from `first` on (the
    /// offset that aligns row 0 to 64 bytes).
    projected: Vec<f32>,
    first: usize,
    stride: usize,
    /// Every base vector's principal coordinates after the proxy's, with the norm of what the
    /// rest adds in the slot after them, `refined_stride` floats a row (zero-padded to a multiple
    /// of 16), from `refined_first` on (64-byte aligned). Empty where `refined_dims` is 0.
    refined: Vec<f32>,
    refined_first: usize,
    refined_stride: usize,
    /// `len × dim`: the base in f32 (unit vectors under cosine), for the re-rank's first pass.
    values: Vec<f32>,
    /// Whether `values` holds the base exactly (raw coordinates, each an f32 value, as pixels and
    /// f32 embeddings are): the exact distances are then measured from these rows, which the f32
    /// pass has just read, instead of the base's own.
    exact_values: bool,
    /// Leading axes each curve's rotation mixes.
    curve_axes: usize,
    bits: u32,
    curves: Vec<Curve>,
    len: usize,
    /// The kNN graph the cores' search walks (index/graph.rs), built on their first search: the
    /// device's search does not use it.
    graph: std::sync::OnceLock<NeighbourGraph>,
    /// The 8-bit copy of the principal coordinates the cores' walk of the graph ranks by
    /// (index/codes.rs), made on the walk's first use.
    codes: std::sync::OnceLock<Codes>,
    /// The efforts chosen for recall targets on samples of base rows (backend/plan/recall.rs),
    /// by searcher, metric, k and target: later small batches of queries reuse them.
    calibrations: std::sync::Mutex<Vec<(String, Calibration)>>,
}

/// A search's effort chosen for a recall target on a sample of queries, and the sample's true
/// neighbours it found (`found` of `truth`); `effort` `None` where the exact kNN answers instead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub effort: Option<f64>,
    pub found: u64,
    pub truth: u64,
}

/// Principal coordinates in a row's first cache line.
pub const LEAD: usize = 16;

impl Multicurves {
    /// Builds the index of `base` for `geometry`, on every core. Deterministic: the sample, the
    /// starting subspace and the rotations are fixed, so one base always gives one index.
    pub fn build(base: &Vectors, geometry: Geometry) -> Self {
        Self::build_with(base, geometry, order_on_cores)
    }

    /// [`Multicurves::build`] with the curves' keys computed and sorted by `order` (on the cores,
    /// or on the device: index/curve_keys.rs), the rest on every core.
    pub fn build_with(base: &Vectors, geometry: Geometry, order: impl FnOnce(&KeyInputs) -> Vec<CurveOrder>) -> Self {
        let dim = base.dim;
        let len = base.len();
        let (mean, axes, kept) = principal_axes(base, geometry);
        let projected_dims = kept.min(PROJECTED_DIMS);
        let refined_dims = kept - projected_dims;
        let layout = Layout::new(projected_dims, refined_dims);
        let mut values = huge_filled(len * dim, 0f32);
        values
            .par_chunks_mut(dim.max(1))
            .enumerate()
            .for_each(|(i, out)| out.copy_from_slice(&to_f32(base.row(i), geometry)));
        let (mut projected, first) = aligned(len * layout.stride);
        let (mut refined, refined_first) = aligned(len * layout.refined_stride);
        project_rows(
            &values,
            &mean,
            &axes,
            &layout,
            (
                &mut projected[first..first + len * layout.stride],
                &mut refined[refined_first..][..len * layout.refined_stride],
            ),
            1.0,
        );
        let (stride, refined_stride) = (layout.stride, layout.refined_stride);
        let exact_values = geometry == Geometry::Raw
            && (0..len).into_par_iter().all(|i| match base.row(i) {
                Row::F32(_) => true,
                Row::F64(row) => row.iter().all(|&x| f64::from(x as f32) == x),
            });
        let rows = &projected[first..first + len * stride];
        let curve_axes = CURVE_AXES.min(projected_dims);
        let curve_dims = CURVE_DIMS.min(curve_axes);
        let bits = (64 / curve_dims as u32).min(16);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6d75_6c74_6963_7576);
        let rotations: Vec<Vec<f32>> = (0..CURVES).map(|_| random_rotation(curve_axes, curve_dims, &mut rng)).collect();
        let inputs = KeyInputs { rows, stride, axes: curve_axes, dims: curve_dims, bits, rotations: &rotations };
        let orders = order(&inputs);
        assert_eq!(orders.len(), CURVES, "an order for every curve");
        let curves = orders
            .into_par_iter()
            .zip(rotations)
            .map(|(CurveOrder { low, high, keys, positions }, rotation)| {
                let fences = keys.iter().step_by(FENCE).copied().collect();
                let leads = positions
                    .par_iter()
                    .flat_map_iter(|&p| rows[p as usize * stride..][..LEAD].iter().copied())
                    .collect();
                Curve { frame: CurveFrame::new(rotation, low, &high, bits), keys, fences, positions, leads }
            })
            .collect();
        Self {
            dim,
            geometry,
            mean,
            axes,
            projected_dims,
            refined_dims,
            projected,
            first,
            stride,
            refined,
            refined_first,
            refined_stride,
            values,
            exact_values,
            curve_axes,
            bits,
            curves,
            len,
            graph: std::sync::OnceLock::new(),
            codes: std::sync::OnceLock::new(),
            calibrations: std::sync::Mutex::default(),
        }
    }

    /// The graph over the rows, where it is built.
    pub fn built_graph(&self) -> Option<&NeighbourGraph> {
        self.graph.get()
    }

    /// The calibrations kept (see `calibrations`), in the order they were made.
    pub fn calibrations(&self) -> Vec<(String, Calibration)> {
        self.calibrations.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Dimension of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Curve `c`'s order as the build made it ([`CurveOrder`]'s parts: the span of each of its
    /// dimensions, its keys and their positions), which [`Multicurves::build_with`] takes back.
    pub fn curve_order(&self, c: usize) -> (&[f32], &[f32], &[u64], &[u32]) {
        let curve = &self.curves[c];
        (&curve.frame.low, &curve.frame.high, &curve.keys, &curve.positions)
    }

    /// Whether the kNN graph over the rows is built.
    pub fn graph_built(&self) -> bool {
        self.graph.get().is_some()
    }

    /// The kNN graph over the rows, built by `build` where it is not built yet, and whether it was.
    pub fn graph(&self, build: impl FnOnce(&Self) -> NeighbourGraph) -> (&NeighbourGraph, bool) {
        let kept = self.graph_built();
        (self.graph.get_or_init(|| build(self)), kept)
    }

    /// The 8-bit copy of every row's principal coordinates (index/codes.rs), made where it is not
    /// yet: each row's leading coordinates (not the proxy's residual slot) and, where the index
    /// keeps more, those after them with the residual norm after those — the terms of the
    /// second ranking's distance.
    ///
    /// The first call encodes the rows on every core: it must not come from within a parallel
    /// loop whose other jobs ask for the codes too, since the thread encoding them, waiting for
    /// its own jobs, could take up one of those and wait on itself (a search over a loaded index
    /// hung so on 16 cores; backend/cpu/approx.rs's test). The search and the build ask for them
    /// before their loops.
    pub fn codes(&self) -> &Codes {
        self.codes.get_or_init(|| {
            Codes::encode(self.len, self.coded_columns(), |i, out| {
                let (projected, refined) = self.row_terms(i);
                for (o, x) in out.iter_mut().zip(self.coded_terms(projected, refined)) {
                    *o = x;
                }
            })
        })
    }

    /// A row's or a query's coordinates in the order [`Multicurves::codes`] codes them.
    pub fn coded_terms<'a>(&self, projected: &'a [f32], refined: &'a [f32]) -> impl Iterator<Item = f32> + 'a {
        let refined_terms = if self.refined_dims == 0 { 0 } else { self.refined_dims + 1 };
        projected[..self.projected_dims].iter().chain(&refined[..refined_terms]).copied()
    }

    fn coded_columns(&self) -> usize {
        self.projected_dims + if self.refined_dims == 0 { 0 } else { self.refined_dims + 1 }
    }

    /// The calibration kept under `key` (see `calibrations`).
    pub fn calibration(&self, key: &str) -> Option<Calibration> {
        let kept = self.calibrations.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().find(|(k, _)| k == key).map(|&(_, c)| c)
    }

    /// Keeps `calibration` under `key` for later searches.
    pub fn keep_calibration(&self, key: String, calibration: Calibration) {
        let mut kept = self.calibrations.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|(k, _)| *k != key);
        kept.push((key, calibration));
    }

    /// Base vectors indexed.
    pub fn len(&self) -> usize {
        self.len
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

    /// Principal coordinates of the second ranking (0 where the proxy's are the whole vector).
    pub fn refined_dims(&self) -> usize {
        self.refined_dims
    }

    /// Base vector `i`'s principal coordinates after the proxy's, with its residual norm after
    /// them (zero-padded to a multiple of [`LEAD`]); empty where [`Multicurves::refined_dims`] is 0.
    #[inline]
    pub fn refined(&self, i: usize) -> &[f32] {
        let start = self.refined_first + i * self.refined_stride;
        &self.refined[start..start + self.refined_stride]
    }

    /// Base vector `i` in the terms a query is searched in: its leading principal coordinates and
    /// those after them (the residual slots holding its whole residual norms).
    #[inline]
    pub fn row_terms(&self, i: usize) -> (&[f32], &[f32]) {
        (self.projected(i), self.refined(i))
    }

    /// Base vector `i` in f32 (its unit vector under cosine).
    #[inline]
    pub fn values(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    /// Base vector `i` exactly, from the index's f32 copy, where that copy holds the base exactly.
    #[inline]
    pub fn exact_values<'a>(&'a self) -> Option<impl Fn(usize) -> Row<'a>> {
        self.exact_values.then_some(|i| Row::F32(self.values(i)))
    }

    /// Queries `rows` of `queries` in the index's terms, projected together (one matrix product).
    pub fn queries(&self, queries: &Vectors, rows: std::ops::Range<usize>) -> QueryBlock {
        let layout = Layout::new(self.projected_dims, self.refined_dims);
        let values: Vec<f32> = rows.clone().flat_map(|i| to_f32(queries.row(i), self.geometry)).collect();
        let n = rows.len();
        let mut projected = vec![0f32; n * layout.stride];
        let mut refined = vec![0f32; n * layout.refined_stride];
        project_rows(&values, &self.mean, &self.axes, &layout, (&mut projected, &mut refined), RESIDUAL_WEIGHT);
        QueryBlock { dim: self.dim, layout, values, projected, refined }
    }

    /// Each curve's `per_curve` entries around the query's key (as many before it as after, fewer
    /// only at a list's ends): their base positions and the [`LEAD`] leading principal coordinates
    /// of each, read from the curve's own copy, in key order; a position may repeat across curves.
    /// Every curve's key is searched before any entry is read (the searches are independent, so
    /// their cache misses overlap).
    pub fn candidate_runs(&self, projected: &[f32], per_curve: usize) -> [(&[u32], &[f32]); CURVES] {
        let n = self.len();
        let take = per_curve.min(n);
        std::array::from_fn(|c| {
            let curve = &self.curves[c];
            let at = curve.position_of(self.key_on(curve, projected));
            let start = at.saturating_sub(take / 2).min(n - take);
            (&curve.positions[start..start + take], &curve.leads[start * LEAD..(start + take) * LEAD])
        })
    }

    /// Curves of the index.
    pub fn curve_count(&self) -> usize {
        self.curves.len()
    }

    /// Curve `c`'s keys, ascending, and the base position of each (the lists the device searches).
    pub fn curve(&self, c: usize) -> (&[u64], &[u32]) {
        (&self.curves[c].keys, &self.curves[c].positions)
    }

    /// Every base vector in f32 (unit vectors under cosine), `dim` values a row.
    #[cfg(feature = "gpu")]
    pub fn all_values(&self) -> &[f32] {
        &self.values[..self.len * self.dim]
    }

    /// Queries `rows` of `queries` as the device searches them: their f32 rows (unit rows under
    /// cosine) and their key on each curve (`keys[q·curves + c]`), projected onto the curves' leading
    /// axes alone (one matrix product), where [`Multicurves::queries`] projects onto every axis the
    /// cores' rankings use (192 on Fashion-MNIST, 16 of them the curves').
    #[cfg(feature = "gpu")]
    pub fn query_keys(&self, queries: &Vectors, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<u64>) {
        let values: Vec<f32> = rows.flat_map(|i| to_f32(queries.row(i), self.geometry)).collect();
        let axes = self.curve_axes;
        let (_, coordinates) = principal_coordinates(&values, &self.mean, &self.axes, axes);
        let keys = coordinates
            .chunks_exact(axes.max(1))
            .flat_map(|row| self.curves.iter().map(|curve| self.key_on(curve, row)))
            .collect();
        (values, keys)
    }

    /// The key on `curve` of principal coordinates `projected`.
    fn key_on(&self, curve: &Curve, projected: &[f32]) -> u64 {
        curve.frame.key(&projected[..self.curve_axes], self.bits)
    }
}

/// Whether the best of the proxy are ranked again over more principal coordinates under
/// `metric`: only where its order is the Euclidean one (L2, L2², cosine over unit vectors).
pub fn ranks_twice(metric: Metric) -> bool {
    matches!(metric, Metric::L2 | Metric::L2Squared | Metric::Cosine)
}

/// The index's shape for EXPLAIN, before it is built (`dim` of the vectors, searched by `metric`).
pub fn describe_for(dim: usize, metric: Metric) -> String {
    let axes = CURVE_AXES.min(dim.min(PROJECTED_DIMS));
    let dims = CURVE_DIMS.min(axes);
    let ranking = if dim > PROJECTED_DIMS && ranks_twice(metric) {
        format!("ranked over {PROJECTED_DIMS} then {} principal coordinates", dim.min(PRINCIPAL_DIMS))
    } else {
        format!("ranked over {} principal coordinates", dim.min(PROJECTED_DIMS))
    };
    format!(
        "curves={CURVES}, each a Hilbert curve over {dims} rotated dims of the leading {axes} principal axes, {ranking}"
    )
}

/// A block of queries in an index's terms.
#[derive(Debug)]
pub struct QueryBlock {
    dim: usize,
    layout: Layout,
    values: Vec<f32>,
    projected: Vec<f32>,
    refined: Vec<f32>,
}

/// One query of a [`QueryBlock`].
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// Its f32 values (its unit vector under cosine).
    pub values: &'a [f32],
    /// Its principal coordinates as [`Multicurves::projected`] lays them out, its half residual
    /// norm in the residual slot.
    pub projected: &'a [f32],
    /// The same for [`Multicurves::refined`].
    pub refined: &'a [f32],
}

impl QueryBlock {
    /// Query `i` of the block.
    pub fn get(&self, i: usize) -> Query<'_> {
        let Layout { stride, refined_stride, .. } = self.layout;
        Query {
            values: &self.values[i * self.dim..(i + 1) * self.dim],
            projected: &self.projected[i * stride..(i + 1) * stride],
            refined: &self.refined[i * refined_stride..(i + 1) * refined_stride],
        }
    }
}

/// How a row's principal coordinates are laid out: the proxy's, then the second ranking's, each
/// followed by the residual norm after them and zero-padded to a multiple of [`LEAD`].
#[derive(Debug, Clone, Copy)]
struct Layout {
    projected_dims: usize,
    refined_dims: usize,
    stride: usize,
    refined_stride: usize,
}

impl Layout {
    fn new(projected_dims: usize, refined_dims: usize) -> Self {
        let refined_stride = if refined_dims == 0 { 0 } else { (refined_dims + 1).next_multiple_of(LEAD) };
        Self { projected_dims, refined_dims, stride: (projected_dims + 1).next_multiple_of(LEAD), refined_stride }
    }
}

impl Curve {
    /// The first entry whose key is not below `key`: a binary search over the fence, then within
    /// the one block of keys it names.
    fn position_of(&self, key: u64) -> usize {
        let block = self.fences.partition_point(|&f| f < key);
        // fences[block - 1] < key ≤ fences[block]: the answer lies in (start, end].
        let start = block.saturating_sub(1) * FENCE;
        let end = (block * FENCE).min(self.keys.len());
        start + self.keys[start..end].partition_point(|&k| k < key)
    }
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
/// sample's covariance (orthonormal, by decreasing variance; `min(dim, PRINCIPAL_DIMS)` of them).
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
    let covariance: Vec<f64> = covariance.into_iter().map(f64::from).collect();
    let kept = dim.min(PRINCIPAL_DIMS);
    // Orthogonal iteration from a fixed random start: Q ← orth(C·Q).
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7063_6178_6573);
    let mut q: Vec<Vec<f64>> = (0..kept).map(|_| (0..dim).map(|_| rng.random::<f64>() - 0.5).collect()).collect();
    orthonormalise(&mut q);
    for _ in 0..PCA_ROUNDS {
        q = times_symmetric(&q, &covariance, dim);
        orthonormalise(&mut q);
    }
    // Order the axes by the variance they carry (the Rayleigh quotient vᵀCv).
    let cq = times_symmetric(&q, &covariance, dim);
    let mut by_variance: Vec<(f64, Vec<f64>)> = q.into_iter().zip(&cq).map(|(v, cv)| (dot(&v, cv), v)).collect();
    by_variance.sort_by(|a, b| b.0.total_cmp(&a.0));
    let axes = by_variance.into_iter().flat_map(|(_, v)| v.into_iter().map(|x| x as f32)).collect();
    (mean, axes, kept)
}

/// Each of `vectors` (of `dim` values) times the symmetric `dim × dim` matrix `matrix`.
fn times_symmetric(vectors: &[Vec<f64>], matrix: &[f64], dim: usize) -> Vec<Vec<f64>> {
    let flat: Vec<f64> = vectors.concat();
    let mut out = vec![0f64; flat.len()];
    // SAFETY: `flat` holds vectors.len() × dim values (row stride dim), `matrix` dim × dim (row
    // stride dim; symmetric, so read as itself transposed), `out` vectors.len() × dim (row stride
    // dim) and aliases neither.
    unsafe {
        matrixmultiply::dgemm(
            vectors.len(),
            dim,
            dim,
            1.0,
            flat.as_ptr(),
            dim as isize,
            1,
            matrix.as_ptr(),
            dim as isize,
            1,
            0.0,
            out.as_mut_ptr(),
            dim as isize,
            1,
        );
    }
    out.chunks(dim.max(1)).map(<[f64]>::to_vec).collect()
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

/// A zeroed array for `len` floats whose element `first` (the second value) is 64-byte aligned.
fn aligned(len: usize) -> (Vec<f32>, usize) {
    let values = huge_filled(len + LEAD, 0f32);
    let first = (values.as_ptr() as usize).next_multiple_of(64).wrapping_sub(values.as_ptr() as usize) / 4;
    (values, first)
}

/// Writes the principal coordinates of the f32 rows `values` (`mean.len()` values a row) into
/// `out`'s two arrays as `layout` lays them out, each residual norm times `residual_weight`, on
/// every core.
fn project_rows(
    values: &[f32],
    mean: &[f32],
    axes: &[f32],
    layout: &Layout,
    out: (&mut [f32], &mut [f32]),
    residual_weight: f32,
) {
    const BLOCK: usize = 1024;
    let dim = mean.len();
    let n = values.len() / dim.max(1);
    let &Layout { projected_dims, refined_dims, stride, refined_stride } = layout;
    let kept = projected_dims + refined_dims;
    let (projected, refined) = out;
    // A zero-width chunk would not split: give the empty second array one chunk per block too.
    let refined_chunks: Vec<&mut [f32]> = if refined_stride == 0 {
        (0..n.div_ceil(BLOCK)).map(|_| &mut [][..]).collect()
    } else {
        refined.chunks_mut(BLOCK * refined_stride).collect()
    };
    projected.par_chunks_mut(BLOCK * stride).zip(refined_chunks).enumerate().for_each(|(b, (out, out_refined))| {
        let rows = out.len() / stride;
        let start = b * BLOCK;
        let (centred, coordinates) =
            principal_coordinates(&values[start * dim..(start + rows) * dim], mean, axes, kept);
        for (i, (centred, coordinates)) in
            centred.chunks_exact(dim.max(1)).zip(coordinates.chunks_exact(kept.max(1))).enumerate()
        {
            let row = &mut out[i * stride..][..stride];
            row[..projected_dims].copy_from_slice(&coordinates[..projected_dims]);
            row[projected_dims] = residual_weight * residual_norm(centred, &coordinates[..projected_dims]);
            if refined_dims > 0 {
                let row = &mut out_refined[i * refined_stride..][..refined_stride];
                row[..refined_dims].copy_from_slice(&coordinates[projected_dims..]);
                row[refined_dims] = residual_weight * residual_norm(centred, coordinates);
            }
        }
    });
}

/// The f32 rows `values` (`mean.len()` values a row) less `mean`, and their coordinates on the
/// first `count` of the principal `axes` (`count` a row): one matrix product.
fn principal_coordinates(values: &[f32], mean: &[f32], axes: &[f32], count: usize) -> (Vec<f32>, Vec<f32>) {
    let dim = mean.len();
    let rows = values.len() / dim.max(1);
    let centred: Vec<f32> =
        values.chunks_exact(dim.max(1)).flat_map(|row| row.iter().zip(mean).map(|(x, m)| x - m)).collect();
    let mut coordinates = vec![0f32; rows * count];
    assert!(axes.len() >= count * dim, "{count} axes of {dim} values");
    // SAFETY: `centred` holds rows × dim values (row stride dim); the first `count` axes (row-major,
    // dim values each: within `axes`, asserted) are read as a dim × count matrix (row stride 1,
    // column stride dim); `coordinates` holds rows × count values (row stride count) and aliases
    // neither input.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            dim,
            count,
            1.0,
            centred.as_ptr(),
            dim as isize,
            1,
            axes.as_ptr(),
            1,
            dim as isize,
            0.0,
            coordinates.as_mut_ptr(),
            count as isize,
            1,
        );
    }
    (centred, coordinates)
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
    use rand::Rng;
    use rand::SeedableRng;

    use super::{CURVES, Curve, FENCE, Geometry, LEAD, Multicurves, principal_axes};
    use crate::index::curve_keys::CurveFrame;
    use crate::vectors::Vectors;

    #[test]
    fn the_fence_finds_what_a_search_over_every_key_finds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for n in [1, 63, 64, 65, 1000] {
            let mut keys: Vec<u64> = (0..n).map(|_| rng.random_range(0..5000)).collect();
            keys.sort_unstable();
            let curve = Curve {
                frame: CurveFrame::new(Vec::new(), Vec::new(), &[], 8),
                fences: keys.iter().step_by(FENCE).copied().collect(),
                keys,
                positions: Vec::new(),
                leads: Vec::new(),
            };
            for key in (0..5002).chain([u64::MAX]) {
                assert_eq!(curve.position_of(key), curve.keys.partition_point(|&k| k < key), "n {n}, key {key}");
            }
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
        assert_eq!((index.projected_dims(), index.refined_dims()), (63, 33));
        let kept = index.projected_dims();
        let squared = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum() };
        let queries = index.queries(&base, 0..3000);
        for i in (0..3000).step_by(97) {
            let q = base.row((i * 7) % 3000).to_vec();
            let qp = queries.get((i * 7) % 3000).projected;
            for j in (0..3000).step_by(31) {
                let (row, whole) = (index.projected(j), squared(qp, index.projected(j)));
                let bound = squared(&qp[..kept], &row[..kept]);
                let lead = squared(&qp[..LEAD], &row[..LEAD]);
                let full = crate::op::squared_l2(&q, &base.row(j).to_vec());
                assert!(lead <= whole * (1.0 + 1e-5), "lead {lead} above the proxy {whole}");
                assert!(f64::from(bound) <= full * (1.0 + 1e-4) + 1e-4, "bound {bound} above {full}");
                // The residual slot: the row's principal and residual parts make up its centred norm.
                let centred: f32 = index.values(j).iter().zip(&index.mean).map(|(x, m)| (x - m) * (x - m)).sum();
                let parts = row[..kept].iter().map(|x| x * x).sum::<f32>() + row[kept] * row[kept];
                assert!((parts - centred).abs() <= 1e-3 * centred, "{parts} against {centred}");
                // All 96 principal coordinates are a rotation: the distance over them is the whole.
                let refined = &index.refined(j)[..index.refined_dims()];
                let all = bound + squared(&queries.get((i * 7) % 3000).refined[..index.refined_dims()], refined);
                assert!((f64::from(all) - full).abs() <= 1e-3 * full + 1e-3, "{all} against {full}");
                assert!(index.refined(j)[index.refined_dims()] < 1e-2, "no residual after all axes");
            }
        }
    }

    #[test]
    fn a_base_vector_finds_itself_among_its_candidates() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let base = Vectors::new(20, (0..5000 * 20).map(|_| rng.random::<f64>()).collect());
        let index = Multicurves::build(&base, Geometry::Raw);
        let mut out = Vec::new();
        let queries = index.queries(&base, 0..5000);
        for i in (0..5000).step_by(50) {
            out.clear();
            for (positions, leads) in index.candidate_runs(queries.get(i).projected, 16) {
                for (&p, lead) in positions.iter().zip(leads.chunks_exact(LEAD)) {
                    assert_eq!(lead, &index.projected(p as usize)[..LEAD]);
                    out.push(p);
                }
            }
            assert_eq!(out.len(), 16 * CURVES);
            assert!(out.contains(&(i as u32)), "row {i}");
        }
    }

    #[test]
    #[cfg(feature = "gpu")]
    fn the_device_search_keys_queries_as_the_cores_do() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let (dim, n) = (40, 3000);
        let base = Vectors::new(dim, (0..n * dim).map(|_| rng.random::<f64>()).collect());
        let index = Multicurves::build(&base, Geometry::Raw);
        let (values, keys) = index.query_keys(&base, 100..164);
        let block = index.queries(&base, 100..164);
        assert_eq!(values.len(), 64 * dim);
        assert_eq!(keys.len(), 64 * CURVES);
        let mut same = 0;
        for i in 0..64 {
            assert_eq!(&values[i * dim..(i + 1) * dim], block.get(i).values);
            for (c, curve) in index.curves.iter().enumerate() {
                // The two products round differently: a key may move to the next cell, rarely.
                same += usize::from(keys[i * CURVES + c] == index.key_on(curve, block.get(i).projected));
            }
        }
        assert!(same >= 64 * CURVES * 99 / 100, "{same} of {} keys the same", 64 * CURVES);
    }
}
