//! What a backend is asked: a join-shaped request (ε-join, range query) or a kNN, what the plan
//! knows of the inputs before reading them, and a request's part over a range of its left rows.

use std::sync::OnceLock;

#[cfg(feature = "gpu")]
use datafusion::common::Result;

#[cfg(feature = "gpu")]
use crate::backend::Backend;
use crate::backend::plan::bounds::coordinate_bound;
use crate::backend::plan::{FilterSpaces, gemm_form};
#[cfg(feature = "gpu")]
use crate::backend::sink::{ResultSink, ShiftedSink};
#[cfg(feature = "gpu")]
use crate::backend::stats::RunStats;
use crate::index::{CostInputs, JoinStrategy, brute_force_run_ns, estimate_strategy};
use crate::op::{IndexChoice, Metric};
use crate::vectors::Vectors;

/// A join-shaped request: every (left, right) pair within `threshold` (ε-join and range query).
#[derive(Debug)]
pub struct JoinRequest<'a> {
    /// Left input (the queries of a range query).
    pub left: &'a Vectors,
    /// Right input (the base of a range query); the same vectors as `left` for a self-join.
    pub right: &'a Vectors,
    /// The distance function.
    pub metric: Metric,
    /// Largest distance of a result pair.
    pub threshold: f64,
    /// Set for a self-join: how to report pairs.
    pub self_join: Option<SelfJoin>,
    /// Grid, brute force, or the cost model's choice.
    pub index: IndexChoice,
    /// Grid dimensions to index (0: the cost model decides).
    pub grid_dims: usize,
    /// The join's plan, made by whichever needs it first ([`JoinRequest::plan`]); a new request
    /// (`Default::default()`) has none yet.
    pub plan: OnceLock<JoinPlan>,
}

impl<'a> JoinRequest<'a> {
    /// The join's plan: made on first use — by `device=auto`'s estimate, which prices the run with
    /// it, or else by the backend that runs it — and then the one every later use reads (the GPUs of
    /// a divided run, its tiles' shared strategy).
    pub fn plan(&self) -> &JoinPlan {
        self.plan.get_or_init(|| JoinPlan::of(self))
    }

    /// The filter-space coordinates of both sides (the vectors for L1/L2/L∞, their unit
    /// normalisations for cosine, which the plan holds; the right side is the left one for a
    /// self-join).
    pub(crate) fn spaces(&self) -> FilterSpaces<'_> {
        match &self.plan().units {
            Some(units) => units.view(),
            None => FilterSpaces::of(self.left, self.right, self.metric, self.self_join.is_some()),
        }
    }

    /// The same join over other sides (a tile, or a part of the left rows): planned anew, since
    /// its plan is its own sides'.
    pub fn over<'b>(&self, left: &'b Vectors, right: &'b Vectors, self_join: Option<SelfJoin>) -> JoinRequest<'b> {
        JoinRequest {
            left,
            right,
            metric: self.metric,
            threshold: self.threshold,
            self_join,
            index: self.index,
            grid_dims: self.grid_dims,
            plan: OnceLock::new(),
        }
    }
}

/// A join's plan, shared by both backends: the strategy the sampled cost model (or the `index`
/// option) picks for the sides' filter spaces ([`JoinRequest::spaces`]), the cost model's time of
/// the whole run on one CPU core, which `device=auto` weighs against the GPU's, and cosine's unit
/// vectors (computed once).
pub struct JoinPlan {
    /// Cosine's filter spaces, the unit vectors of both sides; `None`: the vectors as kept.
    units: Option<FilterSpaces<'static>>,
    pub strategy: JoinStrategy,
    /// Nanoseconds of the whole run on one CPU core, by the cost model.
    pub one_core_ns: f64,
}

impl JoinPlan {
    fn of(request: &JoinRequest) -> Self {
        let JoinRequest { left, right, metric, threshold, self_join, index, grid_dims, .. } = *request;
        let units = (metric == Metric::Cosine).then(|| FilterSpaces::units(left, right, self_join.is_some()));
        let kept;
        let spaces = match &units {
            Some(units) => units,
            None => {
                kept = FilterSpaces::of(left, right, metric, self_join.is_some());
                &kept
            }
        };
        let (strategy, one_core_ns) = match coordinate_bound(metric, threshold) {
            // Brute force by name needs no extent (a pass over every row of both sides).
            Some(radius) if index != IndexChoice::BruteForce => {
                let (lo, hi) = spaces.extent(left.dim);
                estimate_strategy(&CostInputs {
                    left: spaces.left(),
                    right: spaces.right(),
                    dim: left.dim,
                    extent: (&lo, &hi),
                    radius,
                    self_join: self_join.is_some(),
                    gemm_form: gemm_form(metric),
                    index,
                    grid_dims,
                })
            }
            _ => (
                JoinStrategy::BruteForce,
                brute_force_run_ns(left.len(), right.len(), left.dim, gemm_form(metric), self_join.is_some()),
            ),
        };
        Self { units, strategy, one_core_ns }
    }
}

impl std::fmt::Debug for JoinPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinPlan").field("strategy", &self.strategy).field("one_core_ns", &self.one_core_ns).finish()
    }
}

/// How a self-join reports its pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfJoin {
    /// Also test each vector against itself.
    pub include_self: bool,
    /// Report (a, b) and (b, a) rather than once with a before b.
    pub ordered: bool,
}

/// A kNN request: the `k` nearest base vectors of each query vector.
#[derive(Debug)]
pub struct KnnRequest<'a> {
    /// Vectors searched.
    pub base: &'a Vectors,
    /// Vectors searched for.
    pub queries: &'a Vectors,
    /// The distance function.
    pub metric: Metric,
    /// Neighbours per query.
    pub k: usize,
    /// Set for an approximate answer from the Multicurves index (`backend::approx`).
    pub approx: Option<crate::op::Approx>,
    /// A scan, or the List of Clusters (`backend::cpu::list_of_clusters`).
    pub index: IndexChoice,
}

/// What a plan knows of its inputs before reading any: the rows of each where its source states
/// them exactly (a Parquet file's footer, an in-memory table), and the vectors' width where the
/// schema fixes it. `None` where unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownSizes {
    /// Rows of the first input (a join's left, the base of `range_query` and `knn`).
    pub first_rows: Option<usize>,
    /// Rows of the second input (a self-join's: its one input's).
    pub second_rows: Option<usize>,
    /// Values per vector.
    pub dim: Option<usize>,
    /// A self-join: each pair of the one input is compared once.
    pub self_join: bool,
}

/// `backend`'s join of left rows `rows` of `request` with its whole right input (a part of a run
/// divided among devices), its results at the whole input's positions.
#[cfg(feature = "gpu")]
pub(crate) fn join_rows(
    backend: &dyn Backend,
    request: &JoinRequest,
    rows: std::ops::Range<usize>,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let left = request.left.slice(rows.clone());
    let part = request.over(&left, request.right, request.self_join);
    backend.join(&part, &ShiftedSink { inner: sink, left: rows.start as u32, right: 0 })
}

/// `backend`'s kNN of queries `rows` of `request` over its whole base, as [`join_rows`].
#[cfg(feature = "gpu")]
pub(crate) fn knn_rows(
    backend: &dyn Backend,
    request: &KnnRequest,
    rows: std::ops::Range<usize>,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let queries = request.queries.slice(rows.clone());
    backend.knn(
        &KnnRequest { queries: &queries, ..*request },
        &ShiftedSink { inner: sink, left: rows.start as u32, right: 0 },
    )
}
