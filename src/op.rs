//! What is asked: the operation (ε-join, range query, kNN), its metric and its parameters, validated
//! once at planning time, and the exactness contract every backend must meet.
//!
//! # The exactness contract
//! A pair is in a join/range result iff [`Metric::distance`] of the two stored vectors (converted to
//! f64, which is exact for f16/f32/integer inputs) is `<= threshold`. kNN returns, per query, the `k`
//! smallest such distances, ties broken by the base row's position in its input. `Metric::distance`
//! is the *definition*: it sums in natural dimension order, one term at a time, so every backend
//! that filters in lower precision must re-check its candidates with exactly this function (or with
//! a test proved equivalent to it), and CPU and GPU answers are then identical.

use std::fmt;
use std::str::FromStr;

use datafusion::common::{Result, plan_err};
use serde::{Deserialize, Serialize};

use crate::vectors::{Coord, Row};

/// A distance function between two vectors of the same dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Metric {
    /// Euclidean distance `sqrt(Σ (a_i - b_i)²)`.
    #[default]
    L2,
    /// Squared Euclidean distance `Σ (a_i - b_i)²`.
    L2Squared,
    /// Cosine distance `1 - a·b / (‖a‖ ‖b‖)`; rows with a zero vector never match.
    Cosine,
    /// Negative inner product `-(a·b)`, so that smaller is closer as for every other metric.
    InnerProduct,
    /// Manhattan distance `Σ |a_i - b_i|`.
    L1,
    /// Chebyshev distance `max |a_i - b_i|`.
    LInf,
    /// Edit distance between strings: the fewest insertions, deletions and substitutions of
    /// Unicode scalar values turning one into the other (text columns only).
    Levenshtein,
    /// Jaccard distance `1 − |A ∩ B| / |A ∪ B|`: between sets (a list column, each row the set of
    /// its distinct non-NULL elements) or, over a bit column, Tanimoto's
    /// `1 − popcount(a ∧ b) / popcount(a ∨ b)`; 0 between two empty sets (or zero bit strings).
    Jaccard,
    /// Hamming distance `popcount(a ⊕ b)`: the bits in which two bit strings of one length differ.
    Hamming,
}

impl Metric {
    /// Every vector metric, in the order the documentation lists them.
    pub const ALL: [Metric; 6] =
        [Metric::L2, Metric::L2Squared, Metric::Cosine, Metric::InnerProduct, Metric::L1, Metric::LInf];

    /// Whether the metric compares strings (text columns) rather than vectors.
    pub fn is_text(self) -> bool {
        self == Metric::Levenshtein
    }

    /// Whether the metric compares sets or bit strings (a list, binary or 64-bit integer column).
    pub fn is_set_or_bits(self) -> bool {
        matches!(self, Metric::Jaccard | Metric::Hamming)
    }

    /// Whether the metric compares vectors (the six of [`Metric::ALL`]).
    pub fn is_vector(self) -> bool {
        !self.is_text() && !self.is_set_or_bits()
    }

    /// Whether its distances are whole numbers (edits, bits), so that a fractional threshold could
    /// only be a typo.
    pub fn counts(self) -> bool {
        matches!(self, Metric::Levenshtein | Metric::Hamming)
    }

    /// Whether the List of Clusters can index it: a metric in the strict sense (the triangle
    /// inequality holds), or cosine through the chord between unit vectors (`backend::cpu::list_of_clusters`).
    /// L2² and the inner product break the triangle inequality.
    pub fn is_metric(self) -> bool {
        !matches!(self, Metric::L2Squared | Metric::InnerProduct | Metric::Jaccard | Metric::Hamming)
    }

    /// The SQL spelling of the metric.
    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::L2Squared => "l2sq",
            Metric::Cosine => "cosine",
            Metric::InnerProduct => "inner_product",
            Metric::L1 => "l1",
            Metric::LInf => "linf",
            Metric::Levenshtein => "levenshtein",
            Metric::Jaccard => "jaccard",
            Metric::Hamming => "hamming",
        }
    }

    /// The definition of the distance between vectors (see the module docs). `a` and `b` have
    /// the same length. Text metrics never reach vector code (planning resolves a text metric to a
    /// text column, see `vectors::VectorSource::resolve`); theirs is `backend::cpu::text::levenshtein`.
    pub fn distance<A: Coord, B: Coord>(self, a: &[A], b: &[B]) -> f64 {
        debug_assert_eq!(a.len(), b.len());
        let pairs = || a.iter().zip(b).map(|(x, y)| (x.f64(), y.f64()));
        match self {
            Metric::L2 => squared_l2(a, b).sqrt(),
            Metric::L2Squared => squared_l2(a, b),
            Metric::Cosine => {
                let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
                for (x, y) in pairs() {
                    dot += x * y;
                    na += x * x;
                    nb += y * y;
                }
                cosine_from_parts(dot, na, nb)
            }
            Metric::InnerProduct => -dot(a, b),
            Metric::L1 => pairs().map(|(x, y)| (x - y).abs()).fold(0.0, |s, t| s + t),
            Metric::LInf => pairs().map(|(x, y)| (x - y).abs()).fold(0.0, f64::max),
            Metric::Levenshtein | Metric::Jaccard | Metric::Hamming => {
                unreachable!("{self} compares strings, sets or bits, never vectors")
            }
        }
    }

    /// [`Metric::distance`] of two rows as kept (each widened to f64 as it is read).
    pub fn row_distance(self, a: Row, b: Row) -> f64 {
        crate::on_rows!(a, b, |x, y| self.distance(x, y))
    }

    /// Whether a distance bound bounds every coordinate difference, so that the grid and the
    /// directory can index the metric (`backend::plan::bounds::coordinate_bound`): not the inner
    /// product, nor the edit distance.
    pub fn bounds_coordinates(self) -> bool {
        self.is_vector() && self != Metric::InnerProduct
    }

    /// Whether the threshold may be negative: only the negative inner product takes negative values.
    pub fn allows_negative_threshold(self) -> bool {
        self == Metric::InnerProduct
    }
}

/// `Σ (a_i - b_i)²` summed in order: the one formula shared by L2 and L2².
#[inline]
pub fn squared_l2<A: Coord, B: Coord>(a: &[A], b: &[B]) -> f64 {
    let mut sum = 0.0;
    for (x, y) in a.iter().zip(b) {
        let d = x.f64() - y.f64();
        sum += d * d;
    }
    sum
}

/// `Σ a_i b_i` summed in order.
#[inline]
pub fn dot<A: Coord, B: Coord>(a: &[A], b: &[B]) -> f64 {
    let mut sum = 0.0;
    for (x, y) in a.iter().zip(b) {
        sum += x.f64() * y.f64();
    }
    sum
}

/// [`dot`] of a row with itself: `Σx²` summed in order.
pub fn row_norm(a: Row) -> f64 {
    crate::on_row!(a, |x| dot(x, x))
}

/// Cosine distance from the dot product and both squared norms, each summed in order. Callers that
/// precompute `na`/`nb` get the same bits as [`Metric::distance`], since the sums are identical.
#[inline]
pub fn cosine_from_parts(dot: f64, na: f64, nb: f64) -> f64 {
    1.0 - dot / (na.sqrt() * nb.sqrt())
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        Metric::ALL.into_iter().chain([Metric::Levenshtein, Metric::Jaccard, Metric::Hamming]).find(|m| m.name() == lower).ok_or_else(
            || {
                format!(
                    "unknown metric '{s}' (expected one of l2, l2sq, cosine, inner_product, l1, linf, levenshtein, jaccard, hamming)"
                )
            },
        )
    }
}

/// Where the work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Device {
    /// Per run, the GPU or every CPU core, whichever is estimated to finish first (every CPU core
    /// when no GPU is usable).
    #[default]
    Auto,
    /// The GPU, or an error saying why it cannot be used.
    Gpu,
    /// Every CPU core.
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Gpu => "gpu",
            Device::Cpu => "cpu",
        })
    }
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "gpu" | "cuda" => Ok(Device::Gpu),
            "cpu" => Ok(Device::Cpu),
            _ => Err(format!("unknown device '{s}' (expected one of auto, gpu, cpu)")),
        }
    }
}

/// Which GPUs a run may use.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Devices {
    /// Every GPU the driver shows the process (after `CUDA_VISIBLE_DEVICES`).
    #[default]
    All,
    /// These ordinals, in this order, each once.
    List(Vec<usize>),
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::All => f.write_str("all"),
            Devices::List(list) => f.write_str(&list.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

impl FromStr for Devices {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("all") || s.trim().is_empty() {
            return Ok(Devices::All);
        }
        let mut list = Vec::new();
        for part in s.split([',', ' ']).map(str::trim).filter(|p| !p.is_empty()) {
            match part.parse::<usize>() {
                Ok(ordinal) if !list.contains(&ordinal) => list.push(ordinal),
                Ok(ordinal) => return Err(format!("devices '{s}' names GPU {ordinal} twice")),
                Err(_) => return Err(format!("unknown devices '{s}' (expected all, or GPU ordinals such as 0,1)")),
            }
        }
        Ok(Devices::List(list))
    }
}

/// An approximate kNN asked for by name (`knn(…, 'approx=true')`): the answer comes from the
/// Multicurves index (index/curves.rs) and is exempt from the exactness contract, except that every
/// returned row carries its exact distance and its rank among the returned rows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Approx {
    /// Higher is slower and more accurate: the candidates taken from each curve scale with it, and
    /// on the cores the graph search's seeds and pool. Where `recall` is set, the effort the
    /// calibration starts from.
    pub effort: f64,
    /// `approx_recall`: the recall@k the answer is to reach, for which the backend chooses the
    /// effort on a sample (backend/plan/recall.rs); `None` where `approx_effort` fixes it.
    #[serde(default)]
    pub recall: Option<f64>,
    /// The queries of the whole run a calibration sample stands for: its search is planned as
    /// that run's is (on the cores, through the kNN graph or by the curves alone); `None` for the
    /// request's own queries.
    #[serde(default)]
    pub planned_queries: Option<usize>,
    /// [`Checks::curves_alone`].
    #[serde(default)]
    pub curves_alone: bool,
}

/// The effort of the measured settings below (160 candidates a curve, …), where a calibration for
/// `approx_recall` starts.
pub const DEFAULT_APPROX_EFFORT: f64 = 1.0;
/// `approx_recall`'s default: the recall@k an approximate kNN reaches unless told otherwise.
pub const DEFAULT_APPROX_RECALL: f64 = 0.95;
/// The largest `approx_effort`.
pub const MAX_APPROX_EFFORT: f64 = 1000.0;
/// Candidates taken from each curve at effort 1 (measured: recall@10 near 0.95 on Fashion-MNIST
/// with 16 curves).
const CANDIDATES_PER_CURVE: f64 = 160.0;
/// Entries taken from each curve at effort 1 as the starting points of the cores' graph search.
const SEEDS_PER_CURVE: f64 = 16.0;
/// Rows the cores' graph search keeps at effort 1 (measured on Fashion-MNIST: recall@10 0.978,
/// 0.938 at effort 0.5; docs/approx.md#measured).
const POOL: f64 = 32.0;

impl Approx {
    /// Candidates taken from each curve for `k` neighbours: at least 2k, so that one curve alone
    /// could hold the answer.
    pub fn per_curve(self, k: usize) -> usize {
        ((CANDIDATES_PER_CURVE * self.effort).round() as usize).max(2 * k).max(2)
    }

    /// Entries taken from each curve as the cores' graph search's starting points: at least k.
    pub fn seeds_per_curve(self, k: usize) -> usize {
        ((SEEDS_PER_CURVE * self.effort).round() as usize).max(k).max(2)
    }

    /// Rows the cores' graph search keeps for `k` neighbours: at least k.
    pub fn pool(self, k: usize) -> usize {
        ((POOL * self.effort).round() as usize).max(k).max(1)
    }
}

/// How a join or range query finds its candidate pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum IndexChoice {
    /// The sampled cost model picks the grid (and its dimensions) or brute force.
    #[default]
    Auto,
    /// The ε-grid, whatever the cost model says.
    Grid,
    /// Every pair, in blocked tiles.
    BruteForce,
    /// The quantile directory of Böhm et al. (joins and range queries; `index::directory`).
    Directory,
    /// The List of Clusters (Chávez & Navarro): metric pruning by the triangle inequality, for
    /// metrics only (`Metric::is_metric`); joins, range queries and kNN.
    ListOfClusters,
}

impl fmt::Display for IndexChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IndexChoice::Auto => "auto",
            IndexChoice::Grid => "grid",
            IndexChoice::BruteForce => "brute_force",
            IndexChoice::Directory => "directory",
            IndexChoice::ListOfClusters => "list_of_clusters",
        })
    }
}

impl FromStr for IndexChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(IndexChoice::Auto),
            "grid" => Ok(IndexChoice::Grid),
            "brute_force" | "brute" => Ok(IndexChoice::BruteForce),
            "directory" => Ok(IndexChoice::Directory),
            "list_of_clusters" | "lc" => Ok(IndexChoice::ListOfClusters),
            _ => Err(format!(
                "unknown index '{s}' (expected one of auto, grid, brute_force, directory, list_of_clusters)"
            )),
        }
    }
}

/// How a self-join reports each matching pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PairOrder {
    /// Both (a, b) and (b, a).
    #[default]
    Ordered,
    /// Each pair once, left row before right row.
    Unordered,
}

impl fmt::Display for PairOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PairOrder::Ordered => "ordered",
            PairOrder::Unordered => "unordered",
        })
    }
}

impl FromStr for PairOrder {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ordered" => Ok(PairOrder::Ordered),
            "unordered" => Ok(PairOrder::Unordered),
            _ => Err(format!("unknown pairs '{s}' (expected ordered or unordered)")),
        }
    }
}

/// The operation and its parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Operation {
    /// ε-join of one table with itself (`self_join`) or of two tables.
    SimJoin {
        /// Largest distance of a result pair.
        eps: f64,
        /// One input joined with itself.
        self_join: bool,
        /// Self-join only: also report each row with itself (when its distance qualifies).
        include_self: bool,
        /// Self-join only: report (a, b) and (b, a), or each pair once.
        pairs: PairOrder,
    },
    /// Every base row within `radius` of each query row.
    RangeQuery {
        /// Largest distance of a result pair.
        radius: f64,
    },
    /// The `k` nearest base rows of each query row.
    Knn {
        /// How many neighbours per query (all base rows when the base is smaller).
        k: usize,
    },
    /// DBSCAN over the ε-graph of one input (`dbscan`): a row with at least `min_points` rows
    /// within `eps` (itself included) is a core row; core rows within `eps` of each other share a
    /// cluster (the connected components of the ε-graph where `min_points` is 1); a row within
    /// `eps` of a core row but not one itself is a border row, in its nearest core row's cluster.
    Clusters {
        /// Largest distance of an edge of the ε-graph.
        eps: f64,
        /// Rows within `eps` (itself included) that make a row a core row.
        min_points: usize,
    },
}

/// kNN only: the base rows tied with the k nearest that a list keeps besides its k. A window
/// that ranks by more than the distance (`ORDER BY dist, id`), or by `RANK` or `DENSE_RANK`, may
/// choose rows that a list of k, ties broken by base row order, left out (functions/knn_join.rs
/// has the proof that these lists hold every row it can choose; backend/plan/ties.rs finds them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KnnTies {
    /// The k nearest, ties broken by base row order.
    #[default]
    None,
    /// Also every base row at the k-th smallest distance.
    Kth,
    /// Every base row whose distance is one of the k smallest distinct distances.
    Distinct,
}

impl fmt::Display for KnnTies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KnnTies::None => "none",
            KnnTies::Kth => "kth",
            KnnTies::Distinct => "distinct_distances",
        })
    }
}

/// A validated request: what to compute, with which metric, where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimilarityOp {
    /// The operation and its parameter.
    pub operation: Operation,
    /// The distance function.
    pub metric: Metric,
    /// Where the work runs.
    pub device: Device,
    /// Joins and range queries: how candidates are found.
    pub index: IndexChoice,
    /// Joins and range queries with the grid: dimensions to index (0: the cost model decides).
    pub grid_dims: usize,
    /// GPU: bytes of device memory a run may use on each GPU (0: all that is free).
    pub gpu_memory_limit: usize,
    /// GPU: which devices a run uses.
    pub devices: Devices,
    /// Bytes of converted vectors kept across queries for inputs held in memory (0: none).
    pub cache_size: usize,
    /// On a cluster: the shares the work is divided into (0: the session's
    /// `datafusion.execution.target_partitions`).
    pub tasks: usize,
    /// Set on a join planned from SQL's `dist(a.v, b.v) <= eps` (functions/rewrite.rs): the rows
    /// this contract skips without being NULL (NaN or ±Inf values, zero vectors under cosine) are
    /// compared too, by the scalar distance function, and kept when SQL's `<=` keeps the value —
    /// a total order, in which a NaN with its sign bit set precedes every number — so that the
    /// answer is the unrewritten plan's.
    pub scalar_semantics: bool,
    /// kNN only: answer approximately from the Multicurves index (`approx=true`).
    #[serde(default)]
    pub approx: Option<Approx>,
    /// kNN only: the rows tied with the k nearest that each list keeps too (set by the rewrite of
    /// a window that ranks them).
    #[serde(default)]
    pub ties: KnnTies,
    /// Columns both inputs hold (by name) whose values a pair must share — the operation runs
    /// within each group of equal keys (exec/keyed.rs); NULL keys match nothing.
    #[serde(default)]
    pub keys: Vec<String>,
    /// Approximate kNN: where the base's index is kept across processes (`simjoin.index_store`:
    /// `auto`, `off` or a folder, resolved by each process that runs the operation).
    #[serde(default)]
    pub index_store: String,
    /// The self-test's and benchmarks' switches ([`Checks`]).
    #[serde(default)]
    pub checks: Checks,
}

/// Switches of the self-test and the benchmarks, set on a session from Rust
/// ([`crate::options::SimJoinOptions::set_checks`]), never by `SET`: they choose how a run is
/// divided or which search runs, which the answers must not depend on.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Checks {
    /// `device=auto`: this share of every divisible run's left rows (queries) goes to the GPU and
    /// the rest to the cores, whatever the estimates say.
    pub gpu_share: Option<f64>,
    /// Approximate kNN on the GPU: the Multicurves index is searched there even where the exact
    /// kNN is estimated faster.
    pub approx_search_on_gpu: bool,
    /// Approximate kNN on the cores: the search goes by the curves alone, without the kNN graph.
    pub curves_alone: bool,
}

impl SimilarityOp {
    /// The SQL name of the function this operation comes from.
    pub fn function_name(&self) -> &'static str {
        match self.operation {
            Operation::SimJoin { .. } => "sim_join",
            Operation::RangeQuery { .. } => "range_query",
            Operation::Knn { .. } => "knn",
            Operation::Clusters { .. } => "dbscan",
        }
    }

    /// The distance threshold of a join, range query or clustering (`None` for kNN).
    pub fn threshold(&self) -> Option<f64> {
        match self.operation {
            Operation::SimJoin { eps, .. } | Operation::Clusters { eps, .. } => Some(eps),
            Operation::RangeQuery { radius } => Some(radius),
            Operation::Knn { .. } => None,
        }
    }
}

impl SimilarityOp {
    /// Checks the option combinations no machine can run: a planning error naming the function,
    /// the option and the value.
    pub fn validate(&self) -> Result<()> {
        let function = self.function_name();
        if self.metric.is_set_or_bits() && !matches!(self.index, IndexChoice::Auto | IndexChoice::BruteForce) {
            return plan_err!(
                "{function}: option index={} is not available for metric {}: sets and bit strings are searched by their own exact filters (index=auto) or compared pair by pair (index=brute_force)",
                self.index,
                self.metric
            );
        }
        match (&self.operation, self.index) {
            (Operation::Knn { .. }, IndexChoice::Grid | IndexChoice::Directory) => {
                return plan_err!(
                    "{function}: option index={} is not available: kNN always scans every base row (index=auto, brute_force or list_of_clusters)",
                    self.index
                );
            }
            (_, IndexChoice::Grid | IndexChoice::Directory) if !self.metric.bounds_coordinates() => {
                return plan_err!(
                    "{function}: option index={} needs a metric that bounds coordinates (l2, l2sq, cosine, l1, linf), not {}",
                    self.index,
                    self.metric
                );
            }
            (_, IndexChoice::ListOfClusters) if !self.metric.is_metric() => {
                return plan_err!(
                    "{function}: option index=list_of_clusters needs a metric with the triangle inequality (l2, l1, linf, cosine, levenshtein), not {}",
                    self.metric
                );
            }
            (_, IndexChoice::ListOfClusters) if self.approx.is_some() => {
                return plan_err!(
                    "{function}: option index=list_of_clusters finds the exact neighbours; approx=true searches the Multicurves index instead (use one or the other)"
                );
            }
            _ => {}
        }
        if self.approx.is_some() && crate::index::curves::Geometry::of(self.metric).is_none() {
            return plan_err!(
                "{function}: option approx=true needs a metric the Multicurves index can serve (l2, l2sq, cosine, l1, linf), not {}",
                self.metric
            );
        }
        match self.device {
            Device::Gpu
                if self.index == IndexChoice::ListOfClusters && matches!(self.operation, Operation::Knn { .. }) =>
            {
                plan_err!(
                    "{function}: option device=gpu is not available with index=list_of_clusters: kNN through the List of Clusters runs on every CPU core (device=auto or cpu; joins and range queries search it on the GPU)"
                )
            }
            Device::Cpu if self.devices != Devices::All => {
                plan_err!("{function}: option devices={} selects GPUs, but device=cpu runs on the CPU", self.devices)
            }
            _ => Ok(()),
        }
    }
}

/// Checks a join/range threshold: finite, non-negative unless the metric can be negative, and a
/// whole number of edits for the edit distance (whose values are whole numbers: a fractional
/// threshold would only hide a typo such as `1.5` for `1`).
pub fn validate_threshold(function: &str, argument: &str, value: f64, metric: Metric) -> Result<f64> {
    if !value.is_finite() {
        return plan_err!("{function}: argument '{argument}' must be a finite number, got {value}");
    }
    if value < 0.0 && !metric.allows_negative_threshold() {
        return plan_err!("{function}: argument '{argument}' must be >= 0 for metric {metric}, got {value}");
    }
    if metric.counts() && (value.fract() != 0.0 || value > u32::MAX as f64) {
        let unit = if metric.is_text() { "edits" } else { "bits" };
        return plan_err!(
            "{function}: argument '{argument}' must be a whole number of {unit} for metric {metric}, got {value}"
        );
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::{Metric, validate_threshold};

    #[test]
    fn distances_follow_their_definitions() {
        let a = [1.0, 2.0, 3.0];
        let b = [4.0, 6.0, 3.0];
        assert_eq!(Metric::L2.distance(&a, &b), 5.0);
        assert_eq!(Metric::L2Squared.distance(&a, &b), 25.0);
        assert_eq!(Metric::L1.distance(&a, &b), 7.0);
        assert_eq!(Metric::LInf.distance(&a, &b), 4.0);
        assert_eq!(Metric::InnerProduct.distance(&a, &b), -(4.0 + 12.0 + 9.0));
        assert_eq!(Metric::Cosine.distance(&[1.0, 0.0], &[0.0, 2.0]), 1.0);
        assert!(Metric::Cosine.distance(&[0.0, 0.0], &[0.0, 2.0]).is_nan());
    }

    #[test]
    fn metric_names_round_trip() {
        for m in Metric::ALL {
            assert_eq!(m.name().parse::<Metric>().unwrap(), m);
        }
        assert_eq!(
            "hammer".parse::<Metric>().unwrap_err(),
            "unknown metric 'hammer' (expected one of l2, l2sq, cosine, inner_product, l1, linf, levenshtein, jaccard, hamming)"
        );
        assert_eq!("Levenshtein".parse::<Metric>().unwrap(), Metric::Levenshtein);
    }

    #[test]
    fn thresholds_are_checked() {
        assert!(validate_threshold("sim_join", "eps", -0.1, Metric::L2).is_err());
        assert!(validate_threshold("sim_join", "eps", f64::NAN, Metric::L2).is_err());
        assert_eq!(validate_threshold("sim_join", "eps", -0.5, Metric::InnerProduct).unwrap(), -0.5);
        assert_eq!(validate_threshold("sim_join", "eps", 2.0, Metric::Levenshtein).unwrap(), 2.0);
        let fractional = validate_threshold("sim_join", "eps", 1.5, Metric::Levenshtein).unwrap_err();
        assert!(
            fractional.to_string().contains("'eps' must be a whole number of edits for metric levenshtein, got 1.5")
        );
    }
}
