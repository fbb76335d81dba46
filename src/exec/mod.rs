//! The one physical operator, [`SimilarityExec`]: gathers each input's vectors once, runs the chosen
//! backend off the async runtime and streams its results back as batches. No CUDA types here.
//!
//! Row order of an input — which breaks kNN ties and orders unordered self-join pairs — is the
//! input's scan order: its partitions in order, each partition's batches in order. The operator
//! reads every partition of a child itself (concurrently) instead of asking for one coalesced
//! partition, whose interleaving would make that order vary from run to run.
//!
//! On a cluster the operator is planned with `tasks`: its inputs are then required whole
//! (`SinglePartition`, each under a [`WholeInputExec`] whose partitions the task scans itself, in
//! order: all of them, or its share of the divided input's), and a last child, a leaf of `tasks`
//! one-row partitions holding the numbers `0..tasks`, gives the operator its output partitions.
//! The cluster's scheduler hands each task some of the leaf's partitions, so a task learns which
//! shares of the work are its own (exec/share.rs) however its slice of partitions is renumbered.
//! kNN's shares are lists per query that [`KnnMergeExec`] merges after a repartition by query.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, InputDistributionRequirements, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};

use crate::backend::Backend;
use crate::op::{IndexChoice, KnnTies, Metric, Operation, SimilarityOp};
use crate::results::{OutputColumn, SummaryColumn};
use crate::vectors::VectorSource;

mod base_by_parts;
mod cache;
mod keyed;
mod lanes;
mod merge;
mod progress;
mod run;
mod share;
mod summary;
mod whole;

pub use cache::VectorCache;
use lanes::Lanes;
pub use merge::KnnMergeExec;
pub use progress::{Progress, ProgressListener};
pub use summary::SummariseAggregates;
pub use whole::WholeInputExec;

/// One input of the operator as seen by the output: which child feeds it and where its vectors are.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InputSide {
    /// Index of the child plan (a self-join reads both sides from child 0).
    pub child: usize,
    /// The vector column(s) in that child's schema.
    pub source: VectorSource,
    /// The argument, for error messages (`argument 'left'`).
    pub describe: String,
}

/// Runs `sim_join`, `range_query` or `knn` over its inputs with one backend.
#[derive(Debug)]
pub struct SimilarityExec {
    op: Arc<SimilarityOp>,
    children: Vec<Arc<dyn ExecutionPlan>>,
    /// The side whose columns come first in the output (join left / query).
    left: InputSide,
    /// The side whose columns come second (join right / base).
    right: InputSide,
    columns: Vec<OutputColumn>,
    schema: SchemaRef,
    backend: Arc<dyn Backend>,
    /// On a cluster: the shares the work is divided into, the last child being the leaf that
    /// numbers them (see the module docs); `None` in one process.
    tasks: Option<usize>,
    /// Where not empty, the output is one row a partition of these (`columns` is then empty):
    /// an aggregate computed in the operator (summary.rs).
    summary: Vec<SummaryColumn>,
    /// In one process, the output partitions that read the run's rows (lanes.rs); one by default.
    lanes: Lanes,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

/// The leaf whose partition `p` holds the one number `p`, for `tasks` shares.
pub fn task_numbers(tasks: usize) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = Arc::new(Schema::new(vec![Field::new("share", DataType::UInt32, false)]));
    let partitions = (0..tasks)
        .map(|p| Ok(vec![RecordBatch::try_new(schema.clone(), vec![Arc::new(UInt32Array::from(vec![p as u32]))])?]))
        .collect::<Result<Vec<_>>>()?;
    Ok(MemorySourceConfig::try_new_exec(&partitions, schema, None)?)
}

/// Builds a [`SimilarityExec`]: the operation and the backend that runs it, the children and the
/// sides they feed, the output (its columns and schema, or a summary row a partition), and on a
/// cluster its tasks, in one process its lanes.
pub struct SimilarityExecBuilder {
    op: Arc<SimilarityOp>,
    backend: Arc<dyn Backend>,
    children: Vec<Arc<dyn ExecutionPlan>>,
    sides: Option<(InputSide, InputSide)>,
    output: Option<(Vec<OutputColumn>, SchemaRef)>,
    tasks: Option<usize>,
    summary: Vec<SummaryColumn>,
    lanes: usize,
}

impl SimilarityExecBuilder {
    /// An operator running `op` with `backend`, in one process, its rows read by one partition.
    pub fn new(op: Arc<SimilarityOp>, backend: Arc<dyn Backend>) -> Self {
        Self {
            op,
            backend,
            children: Vec::new(),
            sides: None,
            output: None,
            tasks: None,
            summary: Vec::new(),
            lanes: 1,
        }
    }

    /// Its children, and the sides of the operation they feed (`left.child`, `right.child`).
    pub fn inputs(self, children: Vec<Arc<dyn ExecutionPlan>>, left: InputSide, right: InputSide) -> Self {
        Self { children, sides: Some((left, right)), ..self }
    }

    /// Its output: `schema`, the projected output schema, and `columns`, the source of each of its
    /// columns.
    pub fn output(self, columns: Vec<OutputColumn>, schema: SchemaRef) -> Self {
        Self { output: Some((columns, schema)), summary: Vec::new(), ..self }
    }

    /// One row a partition of `summary` in `schema` instead of its result rows (summary.rs).
    pub fn summary(self, summary: Vec<SummaryColumn>, schema: SchemaRef) -> Self {
        Self { output: Some((Vec::new(), schema)), summary, ..self }
    }

    /// Its work divided into `tasks` shares on a cluster, its last child being the task-numbering
    /// leaf ([`task_numbers`]); `None`: one process.
    pub fn tasks(self, tasks: Option<usize>) -> Self {
        Self { tasks, ..self }
    }

    /// Its rows read by `lanes` output partitions in one process (lanes.rs).
    pub fn lanes(self, lanes: usize) -> Self {
        Self { lanes: lanes.max(1), ..self }
    }

    /// The operator, or an internal error where its parts do not fit together.
    pub fn build(self) -> Result<SimilarityExec> {
        let (Some((left, right)), Some((columns, schema))) = (self.sides, self.output) else {
            return internal_err!("SimilarityExec: built without its inputs or its output");
        };
        let children = self.children;
        if children.is_empty() || left.child >= children.len() || right.child >= children.len() {
            return internal_err!("SimilarityExec: inputs do not match its {} children", children.len());
        }
        let partitions = match self.tasks {
            None => self.lanes,
            Some(count) => {
                let inputs = children.len() - 1;
                if count == 0 || inputs == 0 || left.child >= inputs || right.child >= inputs {
                    return internal_err!("SimilarityExec: {count} tasks over {} children", children.len());
                }
                if self.lanes > 1 {
                    return internal_err!("SimilarityExec: output lanes asked for a cluster's task");
                }
                // As many output partitions as the task-numbering leaf has left after the scheduler
                // gave this task its slice of them.
                children[inputs].output_partitioning().partition_count()
            }
        };
        Ok(SimilarityExec {
            op: self.op,
            cache: SimilarityExec::properties_for(&schema, partitions),
            children,
            left,
            right,
            columns,
            schema,
            backend: self.backend,
            tasks: self.tasks,
            summary: self.summary,
            lanes: Lanes::new(self.lanes),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl SimilarityExec {
    /// A builder holding everything this operator was built from, to build a copy with some of it
    /// changed (its metrics start anew).
    pub fn to_builder(&self) -> SimilarityExecBuilder {
        SimilarityExecBuilder {
            op: self.op.clone(),
            backend: self.backend.clone(),
            children: self.children.clone(),
            sides: Some((self.left.clone(), self.right.clone())),
            output: Some((self.columns.clone(), self.schema.clone())),
            tasks: self.tasks,
            summary: self.summary.clone(),
            lanes: self.lanes.count(),
        }
    }

    /// Where not empty, the columns of the output's one summary row a partition.
    pub fn summary(&self) -> &[SummaryColumn] {
        &self.summary
    }

    fn properties_for(schema: &SchemaRef, partitions: usize) -> Arc<PlanProperties> {
        Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ))
    }

    /// The output side of each input: (join left / query, join right / base).
    pub fn sides(&self) -> (&InputSide, &InputSide) {
        (&self.left, &self.right)
    }

    /// The source of each output column.
    pub fn columns(&self) -> &[OutputColumn] {
        &self.columns
    }

    /// On a cluster, the shares the work is divided into.
    pub fn tasks(&self) -> Option<usize> {
        self.tasks
    }

    /// The children holding the inputs (all but the task-numbering leaf).
    fn inputs(&self) -> &[Arc<dyn ExecutionPlan>] {
        &self.children[..self.children.len() - usize::from(self.tasks.is_some())]
    }

    /// What is computed.
    pub fn op(&self) -> &SimilarityOp {
        &self.op
    }

    /// Where it runs, as EXPLAIN's `backend=` names it: `cpu`, `gpu(sm_90a)`, `2 × gpu(sm_90a)`; under
    /// `device=auto`, once it has run, where its last run went.
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    /// How the answer will be found: EXPLAIN's `index=` name and what EXPLAIN VERBOSE says of it.
    fn index_description(&self) -> (&'static str, String) {
        if self.op.index == IndexChoice::ListOfClusters {
            let space = match self.op.metric {
                Metric::Cosine => "chord between unit vectors",
                Metric::Levenshtein => "edit distance",
                _ => "the metric",
            };
            let on_device =
                if self.op.device == crate::op::Device::Gpu { ", one block per left row on the device" } else { "" };
            let input = if matches!(self.op.operation, Operation::Knn { .. }) { "base" } else { "right" };
            return (
                "list_of_clusters",
                format!(
                    "bucket=√n of the {input} input, centres by largest distance sum, triangle-inequality pruning in {space}, exact check{on_device}"
                ),
            );
        }
        if self.op.metric.is_set_or_bits() {
            let bits = matches!(self.left.source, VectorSource::Bits { .. });
            let knn = matches!(self.op.operation, Operation::Knn { .. });
            let (name, how) = match (bits, self.op.metric, knn, self.op.index) {
                (false, _, true, _) => (
                    "token_lists",
                    "every token's base sets, rarest first, up to the k-th distance's prefix; exact verification",
                ),
                (false, _, false, IndexChoice::BruteForce) => ("brute_force", "size window, every pair merged"),
                (false, _, false, _) => (
                    "prefix_filter",
                    "global token order rarest first, length and position filters, exact verification",
                ),
                (true, Metric::Hamming, true, _) => ("brute_force", "every distance, the k smallest by counting"),
                (true, Metric::Hamming, false, IndexChoice::BruteForce) => ("brute_force", "every pair, popcount"),
                (true, Metric::Hamming, false, _) => (
                    "hamming_blocks",
                    "multi-index hashing (blocks within ⌊r / m⌋ bits) where the cost model expects it to pay, else every pair",
                ),
                (true, _, true, _) => {
                    ("popcount_order", "outwards from the query's popcount, stopping at the k-th distance's bound")
                }
                (true, _, false, _) => {
                    ("popcount_window", "the right rows of each left row's popcount window, popcount")
                }
            };
            return (name, how.into());
        }
        if self.op.metric.is_text() {
            let (name, how) = match (&self.op.operation, self.op.index) {
                (Operation::Knn { .. }, _) if self.op.device == crate::op::Device::Gpu => (
                    "length_windows",
                    "radius from 1 edit, doubled for queries with fewer than k, bit-parallel distance on the device",
                ),
                (Operation::Knn { .. }, _) => ("length_ordered_scan", "bit-parallel distance cut off at the k-th"),
                _ if self.op.device == crate::op::Device::Gpu => {
                    ("length_windows", "every pair of lengths within τ, bit-parallel distance on the device")
                }
                (_, IndexChoice::BruteForce) => ("brute_force", "length filter, bit-parallel distance"),
                (_, _) => ("segments", "τ + 1 per string, PASS-JOIN filter, bit-parallel distance"),
            };
            return (name, how.into());
        }
        let exact_filter = match self.op.metric {
            Metric::L1 | Metric::LInf => "exact f64",
            _ => "f32 filter + exact f64 check",
        };
        match (&self.op.operation, self.op.index) {
            (Operation::Knn { .. }, _) if self.op.approx.is_some() => (
                "multicurves",
                "f32 ranking, exact f64 distances of the best; the exact kNN where the GPU runs it faster".into(),
            ),
            (Operation::Knn { .. }, _) if matches!(self.op.metric, Metric::L1 | Metric::LInf) => match self.op.index {
                IndexChoice::Auto => {
                    ("auto", "brute_force (exact f64) or list_of_clusters by sampled cost model".into())
                }
                _ => ("brute_force", "exact f64".into()),
            },
            (Operation::Knn { .. }, _) => ("brute_force", "f32 filter + exact f64 re-rank".into()),
            (_, IndexChoice::BruteForce) => ("brute_force", exact_filter.into()),
            (_, _) if self.op.metric == Metric::InnerProduct => ("brute_force", exact_filter.into()),
            (_, IndexChoice::Grid) if self.op.grid_dims > 0 => {
                ("grid", format!("{} dims, f32 filter + exact f64 check", self.op.grid_dims))
            }
            (_, IndexChoice::Grid) => ("grid", "dims by sampled cost model, f32 filter + exact f64 check".into()),
            (_, IndexChoice::Directory) => (
                "directory",
                format!(
                    "quantile cuts on the dimensions of largest spread, min(3, d) levels, fanout^levels ≈ rows/64 \
                     leaves, blocks of {} rows against leaf boxes widened by the threshold, {exact_filter}",
                    crate::index::DIRECTORY_BLOCK
                ),
            ),
            (_, IndexChoice::Auto | IndexChoice::ListOfClusters) => {
                ("auto", "grid or brute_force by sampled cost model".into())
            }
        }
    }
}

impl DisplayAs for SimilarityExec {
    /// `key=value` pairs, as DataFusion's operators show theirs; EXPLAIN VERBOSE adds, in
    /// parentheses, how the index, the approximate search, the output and the tasks work.
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let verbose = matches!(format, DisplayFormatType::Verbose);
        let op = &self.op;
        write!(f, "SimilarityExec: op={}", op.function_name())?;
        match &op.operation {
            Operation::SimJoin { eps, self_join, include_self, pairs } => {
                write!(f, ", eps={eps}, metric={}, self_join={self_join}", op.metric)?;
                if *self_join {
                    write!(f, ", pairs={pairs}, include_self={include_self}")?;
                }
                if op.scalar_semantics {
                    write!(f, ", from=join_condition")?;
                }
            }
            Operation::RangeQuery { radius } => write!(f, ", r={radius}, metric={}", op.metric)?,
            Operation::Knn { k } => {
                write!(f, ", k={k}, metric={}", op.metric)?;
                if op.ties != KnnTies::None {
                    write!(f, ", ties={}", op.ties)?;
                }
            }
            Operation::Clusters { eps, min_points } => {
                write!(f, ", eps={eps}, min_points={min_points}, metric={}", op.metric)?
            }
        }
        if !op.keys.is_empty() {
            write!(f, ", keys=[{}]", op.keys.join(", "))?;
        }
        if let (Some(approx), Operation::Knn { k }) = (op.approx, &op.operation) {
            write!(f, ", approx=multicurves")?;
            if verbose {
                write!(
                    f,
                    "({}, candidates={} per curve at effort {}{}; on the cores where the base is kept or the queries are at \
                     least half its rows, or its graph is built, and it has more rows than the curves' candidates: a graph of \
                     {} diverse edges a row from its search of a kNN graph and up to {} in all, searched from {} seeds a \
                     curve with a pool of {})",
                    crate::index::curves::describe_for(self.right.source.static_dim().unwrap_or(usize::MAX), op.metric),
                    approx.per_curve(*k),
                    approx.effort,
                    match approx.recall {
                        Some(target) => format!(", effort chosen on a sample for recall@{k} ≥ {target}"),
                        None => String::new(),
                    },
                    crate::index::graph::OUT_DEGREE,
                    crate::index::graph::WIDTH,
                    approx.seeds_per_curve(*k),
                    approx.pool(*k),
                )?;
            }
            match approx.recall {
                // The effort is chosen on a sample of the queries (backend/plan/recall.rs).
                Some(target) => write!(f, ", approx_recall={target}")?,
                None => write!(f, ", approx_effort={}", approx.effort)?,
            }
        }
        let (index, how) = self.index_description();
        write!(f, ", device={}, backend={}, index={index}", op.device, self.backend.name())?;
        if verbose {
            write!(f, "({how})")?;
        }
        // Only the count (and the distance range) wanted: the pairs are counted, not listed —
        // except by a cluster task's share of a self-join, which keeps pairs by their rows
        // (exec/share.rs), and kNN, whose lists are found whole.
        let shared_self_join =
            self.tasks.is_some() && matches!(op.operation, Operation::SimJoin { self_join: true, .. });
        let counted = !matches!(op.operation, Operation::Knn { .. }) && !shared_self_join;
        if !self.summary.is_empty() {
            let names: Vec<&str> = self
                .summary
                .iter()
                .map(|c| match c {
                    SummaryColumn::Count => "count(*)",
                    SummaryColumn::MinDistance => "min(distance)",
                    SummaryColumn::MaxDistance => "max(distance)",
                })
                .collect();
            let rows = if self.tasks.is_some() { "per_task" } else { "one" };
            write!(f, ", output=[{}], output_rows={rows}, pairs_listed={}", names.join(", "), !counted)?;
        } else if self.columns.is_empty() && counted {
            write!(f, ", output=pair_count, pairs_listed=false")?;
        }
        if self.tasks.is_none() && base_by_parts::streams_base(self) {
            write!(f, ", base=streamed")?;
            if verbose {
                write!(f, "(searched part by part as it is read)")?;
            }
        }
        if self.lanes.count() > 1 {
            write!(f, ", output_partitions={}", self.lanes.count())?;
            if verbose {
                write!(f, "(each takes the run's next batch)")?;
            }
        }
        if let Some(tasks) = self.tasks {
            write!(f, ", tasks={tasks}")?;
            if verbose {
                let each = match op.operation {
                    Operation::SimJoin { self_join: true, .. } => "a share of the rows against the whole input",
                    Operation::SimJoin { .. } => "a share of the left input against the whole right input",
                    Operation::RangeQuery { .. } => "every query against a share of the base",
                    Operation::Knn { .. } => "every query's k nearest in a share of the base, merged per query",
                    Operation::Clusters { .. } => "the whole input (a clustering is not divided)",
                };
                write!(f, "(each: {each})")?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for SimilarityExec {
    fn name(&self) -> &str {
        "SimilarityExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.children.iter().collect()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != self.children.len() {
            return internal_err!("SimilarityExec: expected {} children, got {}", self.children.len(), children.len());
        }
        let (left, right) = (self.left.clone(), self.right.clone());
        Ok(Arc::new(self.to_builder().inputs(children, left, right).build()?))
    }

    /// The operator gathers every partition of its inputs itself (in order, concurrently), so a
    /// repartition between it and an input would only add a hand-off.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.children.len()]
    }

    /// On a cluster each task reads its inputs whole (`SinglePartition`: a cluster's scheduler
    /// would otherwise hand each task only its slice of an input's partitions, and the answer
    /// would silently miss rows) and its slice of the task-numbering leaf. In one process the
    /// operator reads every partition itself.
    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        InputDistributionRequirements::new(match self.tasks {
            None => vec![Distribution::UnspecifiedDistribution; self.children.len()],
            Some(_) => {
                let mut required = vec![Distribution::SinglePartition; self.inputs().len()];
                required.push(Distribution::UnspecifiedDistribution);
                required
            }
        })
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let share = match (self.tasks, self.children.last()) {
            (None, _) if self.lanes.count() > 1 => {
                return self.lanes.lane(partition, self, || run::execute(self, context, None));
            }
            (None, _) if partition != 0 => {
                return internal_err!("SimilarityExec has one output partition, asked for {partition}");
            }
            (None, _) => None,
            (Some(tasks), Some(numbers)) => Some((tasks, numbers.execute(partition, context.clone())?)),
            (Some(_), None) => return internal_err!("SimilarityExec: no task-numbering leaf"),
        };
        run::execute(self, context, share)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
