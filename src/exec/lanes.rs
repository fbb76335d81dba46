//! One run's output read by several partitions ("lanes"), so that the partial aggregates of
//! `SELECT sum(…) FROM sim_join(…)` consume the rows on every core without a relay in between.
//!
//! DataFusion spreads a one-partition input over the cores by a round-robin `RepartitionExec`:
//! one task pulls every batch and sends it on through a channel per output partition, with a
//! memory reservation and a wake-up each. For 5·10⁷ pairs (6,100 batches) that one task spent
//! 0.15 s sending on a 16-core H200 host, longer than the GPU's whole join (docs/design.md,
//! docs/design.md#results). The physical rule over aggregates (summary.rs) replaces such a repartition between a
//! [`SimilarityExec`] and the partial aggregate above it by the operator itself with as many
//! output partitions ([`spread_directly`]): each partition's stream takes the run's next batches
//! itself (those of a chunk that are ready, up to 4 MiB), under a lock held only while it takes
//! them, and is then consumed on its own task. The run's channel still holds two chunks, so the
//! rows in flight are those two and a few MiB a lane.
//!
//! The rows are the run's rows, each given to exactly one lane; which lane gets which varies from
//! run to run, so the rule applies only where that cannot change an answer. Not on a cluster:
//! there the operator's partitions are the tasks' shares of the work (exec/share.rs), one task
//! each.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use datafusion::common::{Result, internal_err};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, SendableRecordBatchStream};
use futures::stream::Fuse;
use futures::{FutureExt, StreamExt};

use super::SimilarityExec;

/// A run's one output stream, taken from by every lane (fused: each lane asks again after its end).
type SharedOutput = tokio::sync::Mutex<Fuse<SendableRecordBatchStream>>;

/// The most a lane takes at once: a chunk's batches (`chunk_rows` is eight batches), and no more
/// once they hold this many bytes (wide rows: a projected vector column).
const TAKEN_AT_ONCE: (usize, usize) = (8, 4 << 20);

/// The lanes of one operator: how many, and the run they currently read.
pub(super) struct Lanes {
    count: usize,
    current: Mutex<Current>,
}

/// The run the lanes read. Held strongly until every lane has been asked for, so a consumer that
/// executes partitions one after the other still gets every row (the first lane then reads them
/// all); after that only weakly, so dropping every lane drops the run's stream, which stops the
/// backend at its next send (exec/run/mod.rs).
#[derive(Default)]
struct Current {
    pending: Option<Arc<SharedOutput>>,
    started: Weak<SharedOutput>,
    taken: Vec<bool>,
}

impl fmt::Debug for Lanes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lanes").field("count", &self.count).finish_non_exhaustive()
    }
}

impl Lanes {
    pub(super) fn new(count: usize) -> Self {
        Self { count: count.max(1), current: Mutex::new(Current::default()) }
    }

    /// The number of lanes: the operator's output partitions in one process.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Lane `partition`'s stream. The first lane asked for starts the run (`start`); a lane asked
    /// for again starts the next run, so a plan executed twice answers twice.
    pub(super) fn lane(
        &self,
        partition: usize,
        exec: &SimilarityExec,
        start: impl FnOnce() -> Result<SendableRecordBatchStream>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.count {
            return internal_err!("SimilarityExec has {} output partitions, asked for {partition}", self.count);
        }
        let mut current = match self.current.lock() {
            Ok(current) => current,
            Err(_) => return internal_err!("SimilarityExec: a lane's state was poisoned by a panic"),
        };
        let running = match current.pending.clone().or_else(|| current.started.upgrade()) {
            Some(output) if !current.taken[partition] => output,
            _ => {
                let output = Arc::new(tokio::sync::Mutex::new(start()?.fuse()));
                *current = Current {
                    pending: Some(output.clone()),
                    started: Arc::downgrade(&output),
                    taken: vec![false; self.count],
                };
                output
            }
        };
        current.taken[partition] = true;
        if current.taken.iter().all(|&t| t) {
            current.pending = None;
        }
        // A lane takes, under the lock, the batch it waits for and those ready behind it (the rest
        // of the backend's chunk, exec/run/sink.rs): one hand-off a chunk rather than a batch.
        let next = futures::stream::unfold((running, VecDeque::new()), |(output, mut taken)| async move {
            if taken.is_empty() {
                let mut stream = output.lock().await;
                let (most, most_bytes) = TAKEN_AT_ONCE;
                let mut bytes = 0;
                while taken.len() < most && bytes < most_bytes {
                    let batch = match taken.is_empty() {
                        true => stream.next().await?,
                        false => match stream.next().now_or_never() {
                            Some(Some(batch)) => batch,
                            _ => break,
                        },
                    };
                    bytes += batch.as_ref().map_or(0, |b| b.get_array_memory_size());
                    taken.push_back(batch);
                }
            }
            let batch = taken.pop_front()?;
            Some((batch, (output, taken)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(exec.schema(), next)))
    }
}

/// `node` reading the operator's lanes, where it is a partial aggregate of order-blind functions
/// over a round-robin repartition of a one-partition operator. Only there: above a sort, a window
/// or a `LIMIT`, which rows land in which partition decides the order of equal rows (and which of
/// them a `LIMIT` keeps), and the round-robin decides it the same way every run; a lane takes
/// whichever batch is next. A partial aggregate of `count`, `sum`, `min`, `max` or `avg` gives the
/// same groups and values however its rows are spread (a floating-point sum up to its rounding, as
/// over the round-robin, whose partial states also merge in the order they finish).
pub(super) fn spread_directly(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(aggregate) = node.downcast_ref::<AggregateExec>() else { return Ok(None) };
    let order_blind = aggregate
        .aggr_expr()
        .iter()
        .all(|function| function.order_bys().is_empty() && ORDER_BLIND.contains(&function.fun().name()));
    if *aggregate.mode() != AggregateMode::Partial || !order_blind {
        return Ok(None);
    }
    let Some(spread) = aggregate.input().downcast_ref::<RepartitionExec>() else { return Ok(None) };
    let (Partitioning::RoundRobinBatch(lanes), false) = (spread.partitioning(), spread.preserve_order()) else {
        return Ok(None);
    };
    let Some(exec) = spread.input().downcast_ref::<SimilarityExec>() else { return Ok(None) };
    // On a cluster the partitions are the tasks' shares; a summary is one row.
    if exec.tasks().is_some()
        || !exec.summary().is_empty()
        || exec.properties().output_partitioning().partition_count() != 1
    {
        return Ok(None);
    }
    let lanes: Arc<dyn ExecutionPlan> = Arc::new(exec.to_builder().lanes(*lanes).build()?);
    Ok(Some(replace_children_if_necessary(node.clone(), vec![lanes])?))
}

/// The aggregate functions whose partial states do not depend on the order of their rows.
const ORDER_BLIND: [&str; 5] = ["count", "sum", "min", "max", "avg"];
