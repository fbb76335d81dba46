//! `count(*)`, `min(distance)` and `max(distance)` over a join or range query, computed in the
//! operator: a physical optimizer rule (registered by `simjoin::register`) replaces an aggregate
//! of no `GROUP BY` whose every function is one of those over a [`SimilarityExec`] by the operator
//! itself, asked for the aggregate's own output — its final values (`Single` mode, one output
//! partition) or one row of partial states a partition (`Partial` mode, merged by DataFusion's
//! `Final` aggregate above, in one process as on a cluster). The backends then count pairs and keep their
//! distance range instead of listing them ([`Wanted::CountAndRange`]): a GPU join brings back no
//! pair where only the count is asked, and no join builds a result row. An aggregate over the
//! operator that it cannot compute this way (a `sum`, an `avg`) the same rule lets read the
//! operator's rows directly, on every core (lanes.rs).
//!
//! Why the answer cannot change: the rows summarised are the rows the operator would have
//! listed, found by the same exact test; `count` of a non-NULL argument counts every one (the
//! distance is never NULL); `min` and `max` order the distances by IEEE 754's total order, as
//! Arrow's kernels under DataFusion's accumulators do, and are NULL without rows, as theirs are.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, SendableRecordBatchStream};
use futures::StreamExt;

use super::SimilarityExec;
use crate::op::Operation;
use crate::results::{OutputColumn, RowSummary, SummaryColumn};

/// The rule; see the module docs.
#[derive(Debug, Default)]
pub struct SummariseAggregates;

impl SummariseAggregates {
    /// The rule's name, which `simjoin::register` looks for before adding it.
    pub const NAME: &'static str = "simjoin_summarise_aggregates";
}

impl PhysicalOptimizerRule for SummariseAggregates {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            // An aggregate the operator cannot compute may still read its rows directly.
            let replaced = match summarised(&node)? {
                Some(exec) => Some(exec),
                None => super::lanes::spread_directly(&node)?,
            };
            Ok(match replaced {
                Some(replaced) => Transformed::yes(replaced),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    /// The operator takes the aggregate's own output schema.
    fn schema_check(&self) -> bool {
        true
    }
}

/// `node` as the operator computing it, where it is such an aggregate.
fn summarised(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregate) = node.downcast_ref::<AggregateExec>() else { return Ok(None) };
    // A partial aggregate reads the operator's rows spread over the cores (a round-robin
    // repartition): with no rows to spread, the operator's row goes to the final aggregate as
    // they would have.
    let input = match aggregate.input().downcast_ref::<RepartitionExec>() {
        Some(spread) if matches!(spread.partitioning(), Partitioning::RoundRobinBatch(_)) => spread.input(),
        _ => aggregate.input(),
    };
    let Some(exec) = input.downcast_ref::<SimilarityExec>() else { return Ok(None) };
    let single_partition = exec.properties().output_partitioning().partition_count() == 1;
    let mode_fits = match aggregate.mode() {
        AggregateMode::Partial => true,
        AggregateMode::Single => single_partition,
        _ => false,
    };
    let fits = mode_fits
        && aggregate.group_expr().is_empty()
        && aggregate.filter_expr().iter().all(Option::is_none)
        && matches!(exec.op().operation, Operation::SimJoin { .. } | Operation::RangeQuery { .. })
        && exec.summary().is_empty();
    if !fits {
        return Ok(None);
    }
    let schema = aggregate.schema();
    let is_distance = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Column>().is_some_and(|c| exec.columns().get(c.index()) == Some(&OutputColumn::Distance))
    };
    let mut columns = Vec::with_capacity(aggregate.aggr_expr().len());
    for (i, function) in aggregate.aggr_expr().iter().enumerate() {
        let args = function.expressions();
        let [arg] = args.as_slice() else { return Ok(None) };
        let (column, output_type) = match function.fun().name() {
            "count" if !function.is_distinct() => {
                let not_null = arg.downcast_ref::<Literal>().is_some_and(|l| !l.value().is_null());
                if !(not_null || is_distance(arg)) {
                    return Ok(None);
                }
                (SummaryColumn::Count, DataType::Int64)
            }
            "min" if is_distance(arg) => (SummaryColumn::MinDistance, DataType::Float64),
            "max" if is_distance(arg) => (SummaryColumn::MaxDistance, DataType::Float64),
            _ => return Ok(None),
        };
        // One output field each, of the type the summary row holds (a partial state included).
        if !function.order_bys().is_empty() || schema.fields().get(i).map(|f| f.data_type()) != Some(&output_type) {
            return Ok(None);
        }
        columns.push(column);
    }
    if schema.fields().len() != columns.len() {
        return Ok(None);
    }
    Ok(Some(Arc::new(exec.to_builder().summary(columns, schema).build()?)))
}

/// The operator's output stream of one partition folded into its one summary row: the backend's
/// chunks arrive as one row each (`results::BatchBuilder`).
pub(super) fn fold(
    mut input: SendableRecordBatchStream,
    columns: Vec<SummaryColumn>,
    schema: SchemaRef,
) -> SendableRecordBatchStream {
    let out = schema.clone();
    let folded = futures::stream::once(async move {
        let mut total = RowSummary::default();
        while let Some(batch) = input.next().await {
            total.merge(row_summary(&batch?, &columns));
        }
        total.batch(&columns, &out)
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, folded.boxed()))
}

/// The rows and distance range one batch of summary rows holds (what `columns` give of them).
fn row_summary(batch: &RecordBatch, columns: &[SummaryColumn]) -> RowSummary {
    let mut summary = RowSummary::default();
    for (column, array) in columns.iter().zip(batch.columns()) {
        match column {
            SummaryColumn::Count => {
                summary.rows = array.as_primitive::<Int64Type>().values().iter().map(|&c| c as u64).sum();
            }
            SummaryColumn::MinDistance | SummaryColumn::MaxDistance => {
                let values = array.as_primitive::<Float64Type>();
                for i in (0..values.len()).filter(|&i| values.is_valid(i)) {
                    summary.merge(RowSummary { rows: 0, range: Some((values.value(i), values.value(i))) });
                }
            }
        }
    }
    summary
}
