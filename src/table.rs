//! [`SimilarityTable`]: the table a simjoin function call returns. Its schema is fixed by the call;
//! `scan()` reads only the input columns the query uses (plus the vector columns) and builds the
//! [`SimilarityExec`].
//!
//! A `WHERE` on one input's columns runs below the operator, on that input, where that cannot
//! change the answer: each pair of an ε-join or a range query stands alone, and so do a kNN query's
//! neighbours, so filters on either side of `sim_join(a, b, …)` and `range_query`, and on kNN's
//! query side, drop rows before they are searched. A filter on kNN's base is never pushed (the k
//! nearest of a filtered base are other rows), nor one of a self-join (its one input is both
//! sides). Pushed filters are also kept above the operator (`Inexact`).

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::datasource::TableType;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, StatisticsArgs, StatisticsContext};

use crate::backend::{Backend, KnownSizes};
use crate::exec::{InputSide, KnnMergeExec, SimilarityExecBuilder, WholeInputExec};
use crate::op::{Operation, SimilarityOp};
use crate::results::OutputColumn;
use crate::vectors::VectorSource;

/// The output columns `dbscan` adds to its input's: the cluster (NULL for noise) and whether the
/// row is a core row. (`cluster` itself is a keyword to DataFusion's SQL parser.)
pub const CLUSTER_ID: &str = "cluster_id";
pub const CORE: &str = "core";

/// One input table of a call.
#[derive(Debug, Clone)]
pub struct TableInput {
    /// The table read.
    pub provider: Arc<dyn TableProvider>,
    /// Its vector column(s), in its full schema.
    pub source: VectorSource,
    /// The argument, for error messages (`argument 'base'`).
    pub describe: String,
}

/// The result of one `sim_join` / `range_query` / `knn` call, as a table.
#[derive(Debug)]
pub struct SimilarityTable {
    op: Arc<SimilarityOp>,
    /// The side whose columns come first (join left / query).
    left: TableInput,
    /// The side whose columns come second (join right / base); `None` for a self-join.
    right: Option<TableInput>,
    schema: SchemaRef,
    columns: Vec<OutputColumn>,
    backend: Arc<dyn Backend>,
    /// Planned by a cluster's scheduler: the operator divides its work into `op.tasks` shares
    /// (see `exec`).
    on_cluster: bool,
}

impl SimilarityTable {
    /// The table for `op` over `left` and `right` (`None`: self-join of `left`).
    pub fn new(op: SimilarityOp, left: TableInput, right: Option<TableInput>, backend: Arc<dyn Backend>) -> Self {
        if let Operation::Clusters { .. } = op.operation {
            // One row per input row: its columns as they are, its cluster and whether it is core.
            let mut fields: Vec<Field> = left.provider.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
            let mut columns: Vec<OutputColumn> = (0..fields.len()).map(OutputColumn::Left).collect();
            fields.push(Field::new(CLUSTER_ID, DataType::Int64, true));
            columns.push(OutputColumn::Cluster);
            fields.push(Field::new(CORE, DataType::Boolean, false));
            columns.push(OutputColumn::Core);
            let schema = Arc::new(Schema::new(fields));
            return Self { op: Arc::new(op), left, right: None, schema, columns, backend, on_cluster: false };
        }
        let (left_prefix, right_prefix) = match op.operation {
            Operation::SimJoin { .. } => ("left_", "right_"),
            _ => ("query_", "base_"),
        };
        let right_schema = right.as_ref().unwrap_or(&left).provider.schema();
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        for (i, f) in left.provider.schema().fields().iter().enumerate() {
            fields.push(f.as_ref().clone().with_name(format!("{left_prefix}{}", f.name())));
            columns.push(OutputColumn::Left(i));
        }
        for (i, f) in right_schema.fields().iter().enumerate() {
            fields.push(f.as_ref().clone().with_name(format!("{right_prefix}{}", f.name())));
            columns.push(OutputColumn::Right(i));
        }
        fields.push(Field::new("distance", DataType::Float64, false));
        columns.push(OutputColumn::Distance);
        if matches!(op.operation, Operation::Knn { .. }) {
            fields.push(Field::new("rank", DataType::Int64, false));
            columns.push(OutputColumn::Rank);
        }
        let schema = Arc::new(Schema::new(fields));
        Self { op: Arc::new(op), left, right, schema, columns, backend, on_cluster: false }
    }

    /// This table as a cluster's scheduler plans it: its work divided among tasks.
    #[cfg(feature = "cluster")]
    pub fn on_cluster(self) -> Self {
        Self { on_cluster: true, ..self }
    }

    /// What is computed.
    #[cfg(feature = "cluster")]
    pub fn op(&self) -> &SimilarityOp {
        &self.op
    }

    /// The input whose columns come first, and the second (`None`: a self-join).
    #[cfg(feature = "cluster")]
    pub fn inputs(&self) -> (&TableInput, Option<&TableInput>) {
        (&self.left, self.right.as_ref())
    }
}

/// The input a filter reads only, when it may run below the operator.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FilterSide {
    Left,
    Right,
}

impl SimilarityTable {
    /// The side `filter` may be pushed to (see the module docs), or `None`.
    fn pushable_side(&self, filter: &Expr) -> Option<FilterSide> {
        if self.right.is_none() || filter.is_volatile() {
            return None;
        }
        let mut side = None;
        for column in filter.column_refs() {
            let this = match self.columns[self.schema.index_of(&column.name).ok()?] {
                OutputColumn::Left(_) => FilterSide::Left,
                OutputColumn::Right(_) => FilterSide::Right,
                _ => return None,
            };
            if side.is_some_and(|s| s != this) {
                return None;
            }
            side = Some(this);
        }
        match side? {
            FilterSide::Right if matches!(self.op.operation, Operation::Knn { .. }) => None,
            side => Some(side),
        }
    }

    /// `filter` over the input's own column names, and the input columns it reads.
    fn input_filter(&self, filter: &Expr, side: FilterSide) -> Result<(Expr, BTreeSet<usize>)> {
        let input = match side {
            FilterSide::Left => &self.left,
            FilterSide::Right => self.right.as_ref().unwrap_or(&self.left),
        };
        let input_schema = input.provider.schema();
        let mut read = BTreeSet::new();
        let rewritten = filter
            .clone()
            .transform(|e| {
                let Expr::Column(column) = &e else { return Ok(Transformed::no(e)) };
                let (OutputColumn::Left(i) | OutputColumn::Right(i)) =
                    self.columns[self.schema.index_of(&column.name)?]
                else {
                    return Ok(Transformed::no(e));
                };
                read.insert(i);
                Ok(Transformed::yes(Expr::Column(Column::new_unqualified(input_schema.field(i).name()))))
            })?
            .data;
        Ok((rewritten, read))
    }
}

/// `plan` (an input's scan) under `filters` (over its columns): passed to the provider's scan for
/// what it can use (row-group pruning), and applied exactly by a `FilterExec` above it.
async fn scan_filtered(
    state: &dyn Session,
    input: &TableInput,
    read: &[usize],
    filters: &[Expr],
) -> Result<Arc<dyn ExecutionPlan>> {
    let refs: Vec<&Expr> = filters.iter().collect();
    let usable: Vec<Expr> = input
        .provider
        .supports_filters_pushdown(&refs)?
        .into_iter()
        .zip(filters)
        .filter(|(support, _)| *support != TableProviderFilterPushDown::Unsupported)
        .map(|(_, f)| f.clone())
        .collect();
    let plan = input.provider.scan(state, Some(&read.to_vec()), &usable, None).await?;
    let Some(predicate) = conjunction(filters.iter().cloned()) else { return Ok(plan) };
    let schema = DFSchema::try_from(plan.schema().as_ref().clone())?;
    let predicate = state.create_physical_expr(predicate, &schema)?;
    Ok(Arc::new(FilterExec::try_new(predicate, plan)?))
}

/// The columns of one input that a scan needs, and where each lands in the scanned schema.
struct InputProjection {
    /// Input columns to read, ascending.
    read: Vec<usize>,
}

impl InputProjection {
    fn new(needed: BTreeSet<usize>) -> Self {
        Self { read: needed.into_iter().collect() }
    }

    /// Position of input column `i` in the scanned schema.
    fn position(&self, i: usize) -> usize {
        self.read.binary_search(&i).expect("every used column is read")
    }

    fn source(&self, source: &VectorSource) -> VectorSource {
        match source {
            VectorSource::List { index, dim } => VectorSource::List { index: self.position(*index), dim: *dim },
            VectorSource::Columns(c) => VectorSource::Columns(c.iter().map(|&i| self.position(i)).collect()),
            VectorSource::Text { index } => VectorSource::Text { index: self.position(*index) },
            VectorSource::Set { index } => VectorSource::Set { index: self.position(*index) },
            VectorSource::Bits { index, bits } => VectorSource::Bits { index: self.position(*index), bits: *bits },
        }
    }
}

impl SimilarityTable {
    /// What the scans of the inputs (`children`: the first input's, then the second's unless a
    /// self-join) state of their rows exactly, and the vectors' width where the schema fixes it.
    fn known_sizes(&self, children: &[Arc<dyn ExecutionPlan>]) -> KnownSizes {
        let context = StatisticsContext::new();
        let rows = |child: Option<&Arc<dyn ExecutionPlan>>| {
            let statistics = child.and_then(|c| context.compute(c.as_ref(), &StatisticsArgs::new()).ok());
            statistics.and_then(|s| match s.num_rows {
                Precision::Exact(rows) => Some(rows),
                _ => None,
            })
        };
        let first_rows = rows(children.first());
        let self_join = self.right.is_none();
        let second_rows = if self_join { first_rows } else { rows(children.get(1)) };
        KnownSizes { first_rows, second_rows, dim: self.left.source.static_dim(), self_join }
    }
}

#[async_trait]
impl TableProvider for SimilarityTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match self.pushable_side(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let projected: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.columns.len()).collect(),
        };
        // The vector columns and the key columns (a join within equal keys), read by the operator.
        let operator_reads = |input: &TableInput| -> BTreeSet<usize> {
            let schema = input.provider.schema();
            let keys = self.op.keys.iter().filter_map(|k| schema.index_of(k).ok());
            input.source.columns().into_iter().chain(keys).collect()
        };
        let mut left_needed = operator_reads(&self.left);
        let mut right_needed = self.right.as_ref().map(operator_reads).unwrap_or_default();
        for &p in &projected {
            match self.columns[p] {
                OutputColumn::Left(i) => {
                    left_needed.insert(i);
                }
                // A self-join reads both sides from the one input.
                OutputColumn::Right(i) if self.right.is_none() => {
                    left_needed.insert(i);
                }
                OutputColumn::Right(i) => {
                    right_needed.insert(i);
                }
                _ => {}
            }
        }
        let (mut left_filters, mut right_filters) = (Vec::new(), Vec::new());
        for filter in filters {
            let Some(side) = self.pushable_side(filter) else { continue };
            let (rewritten, read) = self.input_filter(filter, side)?;
            match side {
                FilterSide::Left => {
                    left_needed.extend(read);
                    left_filters.push(rewritten);
                }
                FilterSide::Right => {
                    right_needed.extend(read);
                    right_filters.push(rewritten);
                }
            }
        }
        let left_read = InputProjection::new(left_needed);
        let right_read = InputProjection::new(right_needed);
        let mut children = vec![scan_filtered(state, &self.left, &left_read.read, &left_filters).await?];
        let left =
            InputSide { child: 0, source: left_read.source(&self.left.source), describe: self.left.describe.clone() };
        let right = match &self.right {
            Some(r) => {
                children.push(scan_filtered(state, r, &right_read.read, &right_filters).await?);
                InputSide { child: 1, source: right_read.source(&r.source), describe: r.describe.clone() }
            }
            None => left.clone(),
        };
        let right_positions = if self.right.is_some() { &right_read } else { &left_read };
        let columns = projected
            .iter()
            .map(|&p| match self.columns[p] {
                OutputColumn::Left(i) => OutputColumn::Left(left_read.position(i)),
                OutputColumn::Right(i) => OutputColumn::Right(right_positions.position(i)),
                other => other,
            })
            .collect();
        let schema = Arc::new(self.schema.project(&projected)?);
        let tasks = self.on_cluster.then(|| match self.op.tasks {
            0 => state.config().target_partitions().max(1),
            tasks => tasks,
        });
        let Some(tasks) = tasks else {
            let sizes = self.known_sizes(&children);
            let backend = self.backend.for_inputs(&self.op, &sizes).unwrap_or_else(|| self.backend.clone());
            let exec = SimilarityExecBuilder::new(self.op.clone(), backend)
                .inputs(children, left, right)
                .output(columns, schema)
                .build()?;
            return Ok(Arc::new(exec));
        };
        children = children.into_iter().map(|c| Arc::new(WholeInputExec::new(c)) as _).collect();
        children.push(crate::exec::task_numbers(tasks)?);
        // kNN divides the base: each task's lists carry what the merge needs, the lists of a query
        // meet in one partition of a hash repartition by its row, and KnnMergeExec keeps its k.
        let knn = match self.op.operation {
            Operation::Knn { k } => Some((k, columns.iter().position(|c| *c == OutputColumn::Rank))),
            _ => None,
        };
        let (columns, schema) = match knn {
            Some(_) => KnnMergeExec::list_columns(columns, &schema),
            None => (columns, schema),
        };
        let exec = SimilarityExecBuilder::new(self.op.clone(), self.backend.clone())
            .inputs(children, left, right)
            .output(columns, schema)
            .tasks(Some(tasks))
            .build()?;
        let Some((k, rank)) = knn else {
            return Ok(Arc::new(exec));
        };
        let by_query = Partitioning::Hash(vec![KnnMergeExec::query_row(&exec.schema())?], tasks);
        let shuffled = RepartitionExec::try_new(Arc::new(exec), by_query)?;
        Ok(Arc::new(KnnMergeExec::try_new(Arc::new(shuffled), k, rank)?))
    }
}
