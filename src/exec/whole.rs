//! [`WholeInputExec`]: an input of a `SimilarityExec` planned for a cluster, left whole by the
//! cluster's division of partitions: the operator reads it in scan order, all of it or its task's
//! contiguous share of the partitions (exec/share.rs). It reports one partition, so the planner's
//! distribution check is met without the `CoalescePartitionsExec` it would otherwise add (which a
//! cluster's scheduler turns into a stage boundary: the input written to shuffle files and read
//! back, in an order between partitions that varies from run to run). Below it the input keeps
//! its own partitions, which `SimilarityExec` reads concurrently and keeps in order, as in one
//! process.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::StreamExt;

/// All partitions of `input`, one after another, as one partition.
#[derive(Debug)]
pub struct WholeInputExec {
    input: Arc<dyn ExecutionPlan>,
    cache: Arc<PlanProperties>,
}

impl WholeInputExec {
    /// `input` read whole, in order.
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self { input, cache }
    }

    /// The input whose partitions are read.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for WholeInputExec {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "WholeInputExec: partitions={}", self.input.output_partitioning().partition_count())?;
        if matches!(format, DisplayFormatType::Verbose) {
            write!(f, "(read in order by each task: all, or its share where the operator divides this input)")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for WholeInputExec {
    fn name(&self) -> &str {
        "WholeInputExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([input]) => Ok(Arc::new(Self::new(input))),
            Err(children) => internal_err!("WholeInputExec: expected one child, got {}", children.len()),
        }
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    /// The partitions one after another (`SimilarityExec` reads them concurrently instead).
    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("WholeInputExec has one output partition, asked for {partition}");
        }
        let partitions = self.input.output_partitioning().partition_count();
        let streams = (0..partitions).map(|p| self.input.execute(p, context.clone())).collect::<Result<Vec<_>>>()?;
        let chained = futures::stream::iter(streams).flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.input.schema(), chained)))
    }
}
