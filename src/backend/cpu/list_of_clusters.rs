//! Joins, range queries and kNN through the List of Clusters (`index=list_of_clusters`,
//! `index::clusters`) on every CPU core, for every metric that is a metric: the edit distance over
//! strings, and L2, L1, L∞ and cosine over vectors.
//!
//! The index works in a metric space of its own and the backend's exact test decides every
//! candidate, so the answer is the scan's, bit for bit:
//! * L2, L1, L∞ and the edit distance are metrics as they are; a threshold is a radius.
//! * Cosine distance `1 − cos` is not a metric, but the chord between unit vectors is
//!   (`‖â − b̂‖ = √(2·(1 − cos))`, a Euclidean distance): the index holds the unit vectors under
//!   L2, and a threshold `t` becomes the radius `√(2t)`, widened by the error of the cosine
//!   distance the exact test computes (see `backend::plan::bounds::radius`).
//! * L2² and the inner product break the triangle inequality and are refused at planning.
//!
//! The index is built over the right input (the base) on first use and kept with its vectors
//! (`KeptIndexes::list_of_clusters`, index/kept.rs), so an in-memory table builds it once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};

use crate::backend::cpu::text::Pattern;
use crate::backend::plan::bounds::radius;
use crate::backend::plan::exact::{ExactCheck, write_self_pairs};
use crate::backend::plan::topk::{KSmallest, Neighbour, rank_in_waves};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::costs::{BUILD_COST, SEARCH_COST};
use crate::index::KeptIndexes;
use crate::index::list_of_clusters::{ListOfClusters, MetricSpace, Probe, Rounding};
use crate::op::{Metric, squared_l2};
use crate::vectors::{Row, Values, Vectors};

/// Left rows (queries) per unit of parallel work.
const BLOCK: usize = 64;

/// Coordinates beyond which squared distances could overflow f64: the index then stands aside
/// (a scan computes the same answer without comparing distances to each other).
const LARGEST_COORDINATE: f64 = 1e150;

/// One input in the index's metric space.
enum Space<'a> {
    /// L2, L1, L∞: the rows as they are.
    Rows { vectors: &'a Vectors, metric: Metric },
    /// Cosine: the rows scaled to unit length, under L2.
    Unit { values: &'a [f64], dim: usize },
    /// The edit distance: the strings.
    Strings(&'a Vectors),
}

impl<'a> Space<'a> {
    fn new(vectors: &'a Vectors, metric: Metric) -> Self {
        match metric {
            Metric::Levenshtein => Space::Strings(vectors),
            Metric::Cosine => Space::Unit { values: vectors.unit_rows(), dim: vectors.dim },
            metric => Space::Rows { vectors, metric },
        }
    }

    /// How far computed distances may be from true ones (module `index::clusters`): sums of `d`
    /// non-negative terms are within `(d + 2)` units of rounding, relative; unit vectors' rows carry
    /// a relative error of the same size per coordinate, so their chords are off by as much,
    /// absolutely. Both taken twice over.
    fn rounding(&self) -> Rounding {
        let eps = f64::EPSILON;
        match self {
            Space::Strings(_) => Rounding::EXACT,
            Space::Rows { vectors, .. } => Rounding { relative: 4.0 * (vectors.dim as f64 + 4.0) * eps, absolute: 0.0 },
            Space::Unit { dim, .. } => {
                let e = 4.0 * (*dim as f64 + 4.0) * eps;
                Rounding { relative: e, absolute: e }
            }
        }
    }

    fn row(&self, i: usize) -> Row<'_> {
        match self {
            Space::Rows { vectors, .. } => vectors.row(i),
            Space::Unit { values, dim } => Row::F64(&values[i * dim..(i + 1) * dim]),
            Space::Strings(_) => unreachable!("strings have no rows"),
        }
    }

    fn vector_distance(&self, a: Row, b: Row) -> f64 {
        match self {
            Space::Rows { metric, .. } => metric.row_distance(a, b),
            _ => crate::on_rows!(a, b, |x, y| squared_l2(x, y).sqrt()),
        }
    }
}

impl MetricSpace for Space<'_> {
    fn objects(&self) -> usize {
        match self {
            Space::Rows { vectors, .. } | Space::Strings(vectors) => vectors.len(),
            Space::Unit { values, dim } => values.len() / (*dim).max(1),
        }
    }

    fn distances(&self, from: usize, to: &[u32]) -> Vec<f64> {
        match self {
            Space::Strings(strings) => {
                let pattern = Pattern::new(strings.string(from));
                to.par_iter().with_min_len(256).map(|&b| pattern.distance(strings.string(b as usize)) as f64).collect()
            }
            _ => {
                let a = self.row(from);
                to.par_iter().with_min_len(64).map(|&b| self.vector_distance(a, self.row(b as usize))).collect()
            }
        }
    }
}

/// A query (a left row) in the index's space.
enum Query<'a> {
    Row(Row<'a>),
    Text(Pattern),
}

impl<'a> Query<'a> {
    fn of(space: &'a Space, i: usize) -> Self {
        match space {
            Space::Strings(strings) => Query::Text(Pattern::new(strings.string(i))),
            _ => Query::Row(space.row(i)),
        }
    }

    /// The distance to object `b` of `base`, or +∞ when the edit distance exceeds `cutoff`.
    #[inline]
    fn distance(&self, base: &Space, b: usize, cutoff: f64) -> f64 {
        match (self, base) {
            (Query::Text(pattern), Space::Strings(strings)) => {
                let max = if cutoff >= u32::MAX as f64 { u32::MAX } else { cutoff.max(0.0) as u32 };
                pattern.distance_within(strings.string(b), max).map_or(f64::INFINITY, f64::from)
            }
            (Query::Row(a), _) => base.vector_distance(*a, base.row(b)),
            _ => unreachable!("a query and its base are in the same space"),
        }
    }
}

/// Whether the index can stand in for a scan of these vectors (see [`LARGEST_COORDINATE`]).
pub fn usable(left: &Vectors, right: &Vectors) -> bool {
    let small = |v: &Vectors| match &v.values {
        Values::F64(values) => values.par_iter().all(|x| x.abs() < LARGEST_COORDINATE),
        Values::F32(values) => values.par_iter().all(|x| (x.abs() as f64) < LARGEST_COORDINATE),
    };
    small(left) && small(right)
}

/// Base rows of the sample the cost model builds an index over, and queries it searches.
const SAMPLE_ROWS: usize = 16_384;
const SAMPLE_QUERIES: usize = 64;

/// `index=auto` for a kNN on the CPU: whether the List of Clusters is expected to finish first.
/// Only under L1 and L∞, whose scan computes every distance in f64 (L2 and cosine scans filter in
/// f32 GEMM tiles, which the index did not beat by enough to pay its build: BENCHMARKS.md). The
/// scan costs `q·n` distances; the index `BUILD_COST · n^1.5 / 2` to build (unless kept) and
/// `SEARCH_COST · q · (n/m + f·n)` to search, where `f`, the fraction of rows a search measures,
/// comes from an index over a sample of the base searched by a sample of the queries, for
/// `k · sample/n` neighbours (the sample's rows are sparser: the same ball holds fewer of them).
pub fn pays(request: &KnnRequest, k: usize) -> bool {
    let KnnRequest { base, queries, metric, .. } = *request;
    if !matches!(metric, Metric::L1 | Metric::LInf) || base.len() < 4 * SAMPLE_ROWS {
        return false;
    }
    let (n, q) = (base.len() as f64, queries.len() as f64);
    let scan = q * n;
    let kept = base.list_of_clusters_kept(metric);
    let build = if kept { 0.0 } else { BUILD_COST * n.powf(1.5) / 2.0 };
    let centres = n / ListOfClusters::bucket_for(base.len()) as f64;
    if build + SEARCH_COST * q * centres >= scan {
        return false;
    }
    // Every (n / SAMPLE_ROWS)-th base row, every (q / SAMPLE_QUERIES)-th query.
    let step = base.len() / SAMPLE_ROWS;
    let sample = Vectors::new(base.dim, (0..SAMPLE_ROWS).flat_map(|i| base.row(i * step).iter()).collect());
    let query_step = (queries.len() / SAMPLE_QUERIES).max(1);
    let probes = Vectors::new(
        base.dim,
        (0..queries.len()).step_by(query_step).take(SAMPLE_QUERIES).flat_map(|i| queries.row(i).iter()).collect(),
    );
    let space = Space::new(&sample, metric);
    let mut index = ListOfClusters::build(&space, ListOfClusters::bucket_for(sample.len()), space.rounding());
    index.gather_member_rows(sample.dim, |p| sample.row(p));
    let sample_k = ((k as f64 * SAMPLE_ROWS as f64 / n).round() as usize).clamp(1, SAMPLE_ROWS);
    let exact = ExactCheck::new(metric, f64::INFINITY, &probes, &sample);
    let sample_request = KnnRequest { base: &sample, queries: &probes, ..*request };
    let query_space = Space::new(&probes, metric);
    let measured: u64 = (0..probes.len())
        .map(|p| nearest(&index, &query_space, &space, &sample_request, Some(&exact), p, sample_k).1)
        .sum();
    let fraction = measured as f64 / (probes.len() * SAMPLE_ROWS) as f64;
    build + SEARCH_COST * q * (centres + fraction * n) < scan
}

/// The index over `vectors` under `metric`, built now or kept from an earlier query (`true`).
pub(crate) fn index_of(vectors: &Vectors, metric: Metric) -> (Arc<ListOfClusters>, bool) {
    vectors.list_of_clusters(metric, || {
        let space = Space::new(vectors, metric);
        let mut index = ListOfClusters::build(&space, ListOfClusters::bucket_for(vectors.len()), space.rounding());
        if !metric.is_text() {
            index.gather_member_rows(vectors.dim, |p| vectors.row(p));
        }
        index
    })
}

/// A range search of one left row: candidates measured by the exact test and written out.
struct RangeProbe<'a> {
    query: Query<'a>,
    base: &'a Space<'a>,
    index: &'a ListOfClusters,
    radius: f64,
    /// The left row, and the smallest right position it pairs with (a self-join's each pair once).
    row: usize,
    first: usize,
    found: Vec<(u32, f64)>,
    exact: Option<&'a ExactCheck>,
    request: &'a JoinRequest<'a>,
    checked: u64,
}

impl Probe for RangeProbe<'_> {
    fn distance(&mut self, i: usize, cutoff: f64) -> f64 {
        self.query.distance(self.base, i, cutoff)
    }

    fn radius(&self) -> f64 {
        self.radius
    }

    fn centre(&mut self, i: usize, distance: f64) {
        let JoinRequest { right, threshold, .. } = *self.request;
        match self.exact {
            Some(_) => self.measure(i, right.row(i)),
            // The edit distance is exact: the index's distance is the answer's.
            None if i >= self.first => {
                self.checked += 1;
                if distance <= threshold {
                    self.found.push((i as u32, distance));
                }
            }
            None => {}
        }
    }

    fn member(&mut self, i: usize, slot: usize) {
        match self.exact {
            Some(_) => self.measure(i, Row::F64(self.index.member_row(slot, self.request.right.dim))),
            None => self.measure(i, Row::F64(&[])),
        }
    }
}

impl RangeProbe<'_> {
    /// Right object `i` (its row `row` for vectors) measured by the exact test.
    #[inline]
    fn measure(&mut self, i: usize, row: Row) {
        if i < self.first {
            return;
        }
        self.checked += 1;
        let JoinRequest { left, right, threshold, .. } = *self.request;
        let within = match (self.exact, &self.query) {
            (Some(exact), _) => exact.within(left.row(self.row), row, self.row, i),
            (None, Query::Text(pattern)) => pattern.distance_within(right.string(i), threshold as u32).map(f64::from),
            (None, Query::Row(_)) => unreachable!("vectors are measured by the exact test"),
        };
        if let Some(d) = within {
            self.found.push((i as u32, d));
        }
    }
}

/// Every (left, right) pair within the threshold.
pub fn join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
    let mut stats = RunStats::default();
    if left.is_empty() || right.is_empty() {
        return Ok(stats);
    }
    let (index, kept) = index_of(right, metric);
    stats.kept_indexes = kept.into();
    let text = metric.is_text();
    let exact = (!text).then(|| ExactCheck::new(metric, threshold, left, right));
    let (left_space, base) = (Space::new(left, metric), Space::new(right, metric));
    let radius = radius(metric, threshold, left.dim);
    stats.build_time = start.elapsed();
    let probe_start = Instant::now();
    let (checked, centres) = (AtomicU64::new(0), AtomicU64::new(0));
    let include_self = self_join.is_some_and(|s| s.include_self);
    let blocks = left.len().div_ceil(BLOCK);
    sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        let (mut block_checked, mut block_centres) = (0, 0);
        let rows = b * BLOCK..((b + 1) * BLOCK).min(left.len());
        for a in rows.clone() {
            // A self-join finds each unordered pair once, from its smaller position.
            let first = if self_join.is_some() { a + 1 } else { 0 };
            let mut probe = RangeProbe {
                query: Query::of(&left_space, a),
                base: &base,
                index: &index,
                radius,
                row: a,
                first,
                found: Vec::new(),
                exact: exact.as_ref(),
                request,
                checked: 0,
            };
            let counts = index.search(&mut probe);
            block_centres += counts.centres;
            block_checked += probe.checked;
            probe.found.sort_unstable_by_key(|f| f.0);
            for (r, d) in probe.found {
                writer.push(a as u32, r, d)?;
            }
        }
        if include_self {
            match &exact {
                Some(exact) => write_self_pairs(exact, left, rows, &mut writer)?,
                None => rows.into_iter().try_for_each(|a| writer.push(a as u32, a as u32, 0.0))?,
            }
        }
        checked.fetch_add(block_checked, Ordering::Relaxed);
        centres.fetch_add(block_centres, Ordering::Relaxed);
        sink.advance(1);
        writer.flush()
    })?;
    stats.candidates = checked.into_inner();
    let scan = match self_join {
        Some(_) => (left.len() as u64 * left.len().saturating_sub(1) as u64) / 2,
        None => left.len() as u64 * right.len() as u64,
    };
    stats.saved_distances = scan.saturating_sub(stats.candidates + centres.into_inner());
    stats.probe_time = probe_start.elapsed();
    Ok(stats)
}

/// A kNN search of one query: candidates measured exactly and kept when among the k nearest.
struct NearestProbe<'a> {
    query: Query<'a>,
    base: &'a Space<'a>,
    index: &'a ListOfClusters,
    metric: Metric,
    dim: usize,
    row: usize,
    nearest: KSmallest,
    exact: Option<&'a ExactCheck>,
    request: &'a KnnRequest<'a>,
    checked: u64,
}

impl Probe for NearestProbe<'_> {
    fn distance(&mut self, i: usize, cutoff: f64) -> f64 {
        self.query.distance(self.base, i, cutoff)
    }

    fn radius(&self) -> f64 {
        radius(self.metric, self.nearest.bound(), self.dim)
    }

    fn centre(&mut self, i: usize, distance: f64) {
        match self.exact {
            Some(_) => self.measure(i, self.request.base.row(i)),
            None => {
                self.checked += 1;
                self.nearest.push(Neighbour { distance, position: i as u32 });
            }
        }
    }

    fn member(&mut self, i: usize, slot: usize) {
        match self.exact {
            Some(_) => self.measure(i, Row::F64(self.index.member_row(slot, self.request.base.dim))),
            None => self.measure(i, Row::F64(&[])),
        }
    }
}

impl NearestProbe<'_> {
    /// Base object `i` (its row `row` for vectors) measured exactly and offered.
    #[inline]
    fn measure(&mut self, i: usize, row: Row) {
        self.checked += 1;
        let KnnRequest { queries, base, .. } = *self.request;
        let distance = match (self.exact, &self.query) {
            (Some(exact), _) => exact.distance(queries.row(self.row), row, self.row, i),
            (None, Query::Text(pattern)) => {
                let bound = self.nearest.bound();
                let max = if bound.is_finite() { bound as u32 } else { u32::MAX };
                match pattern.distance_within(base.string(i), max) {
                    Some(d) => d.into(),
                    None => return,
                }
            }
            (None, Query::Row(_)) => unreachable!("vectors are measured by the exact test"),
        };
        self.nearest.push(Neighbour { distance, position: i as u32 });
    }
}

/// Query `row`'s `k` nearest base rows by a search of `index`, nearest first, with the rows
/// measured exactly and the centres measured.
fn nearest<'a>(
    index: &'a ListOfClusters,
    queries: &'a Space,
    base: &'a Space<'a>,
    request: &'a KnnRequest<'a>,
    exact: Option<&'a ExactCheck>,
    row: usize,
    k: usize,
) -> (Vec<Neighbour>, u64, u64) {
    let mut probe = NearestProbe {
        query: Query::of(queries, row),
        base,
        index,
        metric: request.metric,
        dim: request.base.dim,
        row,
        nearest: KSmallest::new(k),
        exact,
        request,
        checked: 0,
    };
    let counts = index.search(&mut probe);
    (probe.nearest.into_sorted(), probe.checked, counts.centres)
}

/// The `k` nearest base rows of every query, ties by base position.
pub fn knn(request: &KnnRequest, k: usize, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, metric, .. } = *request;
    let mut stats = RunStats::default();
    let (index, kept) = index_of(base, metric);
    stats.kept_indexes = kept.into();
    let exact = (!metric.is_text()).then(|| ExactCheck::new(metric, f64::INFINITY, queries, base));
    let (query_space, base_space) = (Space::new(queries, metric), Space::new(base, metric));
    stats.build_time = start.elapsed();
    let probe_start = Instant::now();
    let (checked, centres) = (AtomicU64::new(0), AtomicU64::new(0));
    rank_in_waves(sink, queries.len(), BLOCK, |q| {
        let (list, measured, centres_measured) =
            nearest(&index, &query_space, &base_space, request, exact.as_ref(), q, k);
        checked.fetch_add(measured, Ordering::Relaxed);
        centres.fetch_add(centres_measured, Ordering::Relaxed);
        list
    })?;
    stats.candidates = checked.into_inner();
    let scan = queries.len() as u64 * base.len() as u64;
    stats.saved_distances = scan.saturating_sub(stats.candidates + centres.into_inner());
    stats.probe_time = probe_start.elapsed();
    Ok(stats)
}
