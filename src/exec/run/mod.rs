//! Execution of [`SimilarityExec`]: collect the inputs under a memory reservation, build their
//! vectors, run the backend on a blocking thread, and stream its chunks out as batches. The channel
//! between them holds two chunks, so however many pairs there are, memory stays bounded; dropping
//! the stream closes the channel, which stops the backend at its next send.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err, exec_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlanProperties, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use crate::backend::{
    Backend, ClusterRequest, JoinRequest, KnnRequest, MapSink, NOISE, ResultChunk, ResultSink, RunStats, SelfJoin,
};
use crate::exec::cache::VectorCache;
use crate::exec::keyed::{KeyGroups, compute_by_keys, odd_candidates_by_keys, order_by_keys, scalar_pairs_by_keys};
use crate::exec::progress::{Progress, ProgressListener};
use crate::exec::share::{Share, divided_child, self_join_pairs_only, share_partitions, take_share};
use crate::exec::{InputSide, SimilarityExec, WholeInputExec};
use crate::op::{Operation, PairOrder, SimilarityOp};
use crate::results::{BatchBuilder, InputColumn, SideData};
use crate::vectors::Vectors;

mod inputs;
mod metrics;
mod odd_rows;
mod sink;
mod stored;
mod workers;

pub(super) use inputs::{ConvertedSide, check_dimensions, collect_partition, convert_side, projected_columns};
pub(super) use metrics::SimilarityMetrics;
pub(super) use odd_rows::{
    OddRows, numbered_with_odd_rows, odd_candidates, scalar_pair, scalar_pairs, send_candidates,
};
use sink::ChannelSink;
pub(super) use workers::{return_worker_pool, worker_pool};

/// The task collecting one partition of an input.
type PartitionTask = SpawnedTask<Result<Vec<RecordBatch>>>;

/// Everything a run needs, detached from the plan.
pub(super) struct Run {
    pub(super) op: Arc<SimilarityOp>,
    pub(super) left: InputSide,
    pub(super) right: InputSide,
    pub(super) backend: Arc<dyn Backend>,
    pub(super) builder: BatchBuilder,
    pub(super) metrics: SimilarityMetrics,
    pub(super) progress: Option<Arc<dyn ProgressListener>>,
    /// The session's converted vectors kept across queries (exec/cache.rs).
    pub(super) cache: Option<Arc<VectorCache>>,
    /// The base is read and searched part by part (exec/base_by_parts.rs).
    streamed: bool,
}

/// Runs the operator. `share`: on a cluster, the number of shares and the stream of the
/// task-numbering leaf's partition that says which share this is (exec/share.rs).
pub(super) fn execute(
    exec: &SimilarityExec,
    context: Arc<TaskContext>,
    share: Option<(usize, SendableRecordBatchStream)>,
) -> Result<SendableRecordBatchStream> {
    // DataFusion lets a file scan's partitions take files from their siblings' lists; the inputs
    // are read without that, so that partition `p` holds the `p`-th file group's rows (the scan
    // order that breaks ties) and a plan run more than once (several shares of one task on a
    // cluster) does not share one list of files among its runs.
    let mut input_config = context.session_config().clone();
    input_config.options_mut().execution.enable_file_stream_work_stealing = false;
    let input_context = Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        input_config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ));
    let inputs = exec
        .inputs()
        .iter()
        .map(|child| {
            // An input read whole by each task of a cluster: its partitions, concurrently.
            let child = match child.downcast_ref::<WholeInputExec>() {
                Some(whole) => whole.input(),
                None => child,
            };
            let partitions = child.output_partitioning().partition_count();
            let streams =
                (0..partitions).map(|p| child.execute(p, input_context.clone())).collect::<Result<Vec<_>>>()?;
            Ok((child.schema(), streams))
        })
        .collect::<Result<Vec<_>>>()?;
    let reservation = MemoryConsumer::new("SimilarityExec").register(context.memory_pool());
    let metrics = SimilarityMetrics::new(&exec.metrics);
    let baseline = metrics.baseline.clone();
    let run = Run {
        op: exec.op.clone(),
        left: exec.left.clone(),
        right: exec.right.clone(),
        backend: exec.backend.clone(),
        builder: BatchBuilder {
            schema: exec.schema.clone(),
            columns: exec.columns.clone(),
            batch_size: context.session_config().batch_size(),
            share: 0,
            summary: exec.summary.clone(),
        },
        metrics,
        progress: context.session_config().get_extension::<Progress>().map(|p| p.0.clone()),
        cache: context.session_config().get_extension::<VectorCache>(),
        streamed: share.is_none() && crate::exec::base_by_parts::streams_base(exec),
    };
    let stream = futures::stream::once(run.start(inputs, share, reservation)).try_flatten();
    let stream: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(exec.schema.clone(), stream));
    let stream = match exec.summary.as_slice() {
        [] => stream,
        columns => super::summary::fold(stream, columns.to_vec(), exec.schema.clone()),
    };
    let recorded = stream.inspect_ok(move |batch| baseline.record_output(batch.num_rows()));
    Ok(Box::pin(RecordBatchStreamAdapter::new(exec.schema.clone(), recorded)))
}

impl Run {
    /// Reads every partition of every input (a share's group of the divided input's partitions
    /// where there are enough); returns the batches of each input and whether the share was taken
    /// by partitions.
    async fn read_inputs(
        &mut self,
        mut inputs: Vec<(SchemaRef, Vec<SendableRecordBatchStream>)>,
        share: Option<Share>,
        reservation: &Arc<MemoryReservation>,
    ) -> Result<(Vec<(SchemaRef, Vec<RecordBatch>)>, bool)> {
        // A task reads only its group of the divided input's partitions where there are enough
        // (exec/share.rs); the streams of the others are dropped unread.
        let mut by_partitions = false;
        if let Some(share) = share {
            self.builder.share = share.index as u32;
            let streams = &mut inputs[divided_child(&self.op, &self.left, &self.right)].1;
            if let Some(range) = share_partitions(&self.left, &self.right, streams.len(), share) {
                let kept: Vec<_> = streams.drain(range).collect();
                *streams = kept;
                by_partitions = true;
            }
        }
        // Every partition of every input on a task of its own: a partition decodes (Parquet, CSV)
        // as its stream is polled, so one task polling them all decoded on one thread (P1 from a
        // file: docs/design.md#inputs). Batches are kept in partition order; dropping the
        // tasks (an error, a cancelled query) stops them.
        let tasks: Vec<(SchemaRef, Vec<PartitionTask>)> = inputs
            .into_iter()
            .map(|(schema, streams)| {
                let tasks = streams
                    .into_iter()
                    .map(|stream| SpawnedTask::spawn(collect_partition(stream, reservation.clone())))
                    .collect();
                (schema, tasks)
            })
            .collect();
        let mut collected = Vec::with_capacity(tasks.len());
        for (schema, tasks) in tasks {
            let mut batches = Vec::new();
            for task in tasks {
                let partition = task
                    .join()
                    .await
                    .map_err(|e| exec_datafusion_err!("{}: reading an input failed: {e}", self.op.function_name()))??;
                batches.extend(partition);
            }
            collected.push((schema, batches));
        }
        Ok((collected, by_partitions))
    }

    /// The vectors of each side from the collected batches, on a blocking thread (both inputs in
    /// key order for a join within equal keys).
    async fn convert(
        &self,
        collected: Vec<(SchemaRef, Vec<RecordBatch>)>,
    ) -> Result<(ConvertedSide, ConvertedSide, Option<KeyGroups>)> {
        // The vectors of each side, and of each input only the columns the output takes rows from,
        // concatenated (the vector column itself is widened batch by batch, never concatenated).
        let op = self.op.clone();
        let (left_side, right_side) = (self.left.clone(), self.right.clone());
        let output_columns = self.builder.columns.clone();
        let converting = Instant::now();
        let cache = self.cache.clone();
        let converted =
            tokio::task::spawn_blocking(move || -> Result<(ConvertedSide, ConvertedSide, Option<KeyGroups>)> {
                let side = |input: &InputSide| {
                    let (schema, parts) = &collected[input.child];
                    let projected = projected_columns(&output_columns, &left_side, &right_side, input, schema);
                    convert_side(&op, cache.as_deref(), schema, parts, input, &projected)
                };
                let mut left = side(&left_side)?;
                let same_child = right_side.child == left_side.child;
                let mut right = if same_child { None } else { Some(side(&right_side)?) };
                // A join within equal keys: both inputs in key order (keyed.rs).
                let groups = match op.keys.is_empty() {
                    true => None,
                    false => {
                        let input = |side: &InputSide| (&collected[side.child].0, collected[side.child].1.as_slice());
                        let inputs = [input(&left_side), input(&right_side)];
                        Some(order_by_keys(&op, inputs, &mut left, right.as_mut())?)
                    }
                };
                let right = right.unwrap_or_else(|| (left.0.clone(), false, left.2.clone()));
                Ok((left, right, groups))
            })
            .await
            .map_err(|e| exec_datafusion_err!("{}: building vectors failed: {e}", self.op.function_name()))?;
        self.metrics.record_conversion(converting.elapsed());
        converted
    }

    /// Reads the inputs, converts them, and runs the backend on a blocking thread of its own; its
    /// chunks come out as the stream's batches.
    async fn start(
        mut self,
        inputs: Vec<(SchemaRef, Vec<SendableRecordBatchStream>)>,
        share: Option<(usize, SendableRecordBatchStream)>,
        reservation: MemoryReservation,
    ) -> Result<futures::stream::BoxStream<'static, Result<datafusion::arrow::array::RecordBatch>>> {
        if self.streamed {
            return crate::exec::base_by_parts::start(self, inputs, reservation).await;
        }
        let share = match share {
            Some((count, numbers)) => Some(Share { index: share_number(numbers).await?, count }),
            None => None,
        };
        let reservation = Arc::new(reservation);
        let (mut collected, by_partitions) = self.read_inputs(inputs, share, &reservation).await?;
        let collected_bytes: usize =
            collected.iter().flat_map(|(_, parts)| parts).map(|b| b.get_array_memory_size()).sum();
        // After the reservation's size is known: a share's slices share the collected buffers.
        let self_join_pairs = match share {
            Some(share) => take_share(&self.op, &mut collected, &mut self.left, &self.right, share, by_partitions),
            None => None,
        };

        let ((left, left_cached, left_odd), (right, right_cached, right_odd), groups) = self.convert(collected).await?;
        self.metrics.cached_inputs.add(usize::from(left_cached) + usize::from(right_cached));
        // The collected batches are gone; the output columns taken from them stay.
        let same_input = self.left.child == self.right.child;
        let kept: usize = [&left, &right][..if same_input { 1 } else { 2 }]
            .iter()
            .flat_map(|side| side.columns.iter().flatten())
            .map(InputColumn::memory_size)
            .sum();
        reservation.shrink(collected_bytes);
        reservation.try_grow(kept)?;

        let (lv, rv) = (&left.vectors, &right.vectors);
        check_dimensions(&self.op, (&self.left, lv), (&self.right, rv))?;
        // A self-join reads one input; two inputs may still share their vectors (the same kept
        // table on both sides of `sim_join(t, t, eps)`), which changes nothing of a two-table join.
        let same = same_input;
        let input_rows = left.num_rows + if same { 0 } else { right.num_rows };
        self.metrics.input_rows.add(input_rows);
        self.metrics.skipped_rows.add(lv.skipped + if same { 0 } else { rv.skipped });
        // Working memory of the backend: the vectors themselves, their f32/normalised copies and
        // the grid (ids, order, keys) — about three times the f64 vectors.
        let side_bytes = |v: &Vectors| v.bytes();
        let vector_bytes = side_bytes(lv) + if same { 0 } else { side_bytes(rv) };
        reservation.try_grow(3 * vector_bytes)?;

        let (sender, receiver) = mpsc::channel::<Result<Vec<RecordBatch>>>(2);
        let Run { op, backend, builder, metrics, progress, .. } = self;
        // Chunks of 8 batches: each chunk is one hand-off between a backend thread and the
        // consumer, and at one batch per chunk those hand-offs were a visible part of emitting
        // 5·10⁷ pairs (docs/design.md#gpu-transfers); the consumer still yields batches of `batch_size` rows.
        let chunk_rows = (8 * builder.batch_size).max(1024);
        // No column projected (`SELECT count(*) FROM sim_join(…)`) or a summary row: only the
        // rows' count (and distance range) is needed.
        let wants = builder.wants();
        let (lv, rv) = (lv.clone(), rv.clone());
        // The output numbers each side's skipped-but-compared rows after its vectors.
        let (left, right) = (numbered_with_odd_rows(&left, &left_odd), numbered_with_odd_rows(&right, &right_odd));
        // A clustering outputs every input row: its skipped ones (NULL, NaN, …) as noise, numbered
        // after its vectors.
        let unclustered = match op.operation {
            Operation::Clusters { .. } => lv.skipped_rows(left.num_rows),
            _ => Vec::new(),
        };
        let left = match unclustered.is_empty() {
            true => left,
            false => {
                let rows = lv.rows.iter().chain(&unclustered).copied().collect();
                SideData { vectors: Arc::new(Vectors::numbering(rows)), ..left }
            }
        };
        tokio::task::spawn_blocking(move || {
            let sink = ChannelSink {
                sender,
                builder,
                sides: (left, right),
                chunk_rows,
                wants,
                progress: progress.clone(),
                function: op.function_name(),
            };
            // Each run gets worker threads of its own (an earlier run's idle pool, or new ones): a
            // backend blocks in `sink.send` while its consumer is behind (a paused Flight client, a
            // slow writer), and in the shared global pool a few such runs would stall every other
            // query of the process.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let pool = worker_pool().map_err(|e| {
                    DataFusionError::ResourcesExhausted(format!(
                        "{}: cannot start worker threads: {e}",
                        op.function_name()
                    ))
                })?;
                let result = pool.install(|| {
                    let stats = match (self_join_pairs, &groups) {
                        (None, None) => compute(&op, backend.as_ref(), &lv, &rv, same, &sink)?,
                        (None, Some(groups)) => {
                            compute_by_keys(&op, backend.as_ref(), (&lv, &rv), same, groups, &sink)?
                        }
                        (Some(pairs), _) => {
                            let map = self_join_pairs_only(pairs, &lv.rows, &rv.rows);
                            // The share's map drops pairs by their rows: they must be listed.
                            let sink = MapSink { inner: &sink, map, passes_counts: false };
                            compute(&op, backend.as_ref(), &lv, &rv, same, &sink)?
                        }
                    };
                    if !unclustered.is_empty() {
                        let first = lv.len() as u32;
                        let count = unclustered.len();
                        let chunk = ResultChunk {
                            left: (first..first + count as u32).collect(),
                            cluster: vec![NOISE; count],
                            core: vec![false; count],
                            ..Default::default()
                        };
                        sink.send(chunk)?;
                    }
                    match op.threshold() {
                        Some(threshold) if !left_odd.is_empty() || !right_odd.is_empty() => {
                            let sides = [(lv.as_ref(), &left_odd), (rv.as_ref(), &right_odd)];
                            match &groups {
                                None => scalar_pairs(op.metric, threshold, sides, &sink)?,
                                Some(groups) => scalar_pairs_by_keys(&op, threshold, sides, groups, &sink)?,
                            }
                        }
                        None if !left_odd.is_empty() || !right_odd.is_empty() => match &groups {
                            None => odd_candidates(
                                (lv.len(), left_odd.len()),
                                (0..right_odd.len() as u32).map(|j| rv.len() as u32 + j),
                                rv.len() + right_odd.len(),
                                &sink,
                            )?,
                            Some(groups) => odd_candidates_by_keys(lv.len(), rv.len(), groups, &sink)?,
                        },
                        _ => {}
                    }
                    Ok(stats)
                });
                return_worker_pool(pool);
                result
            }));
            if let Some(p) = &progress {
                p.finish();
            }
            let result = outcome.unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(DataFusionError::Internal(format!("{}: backend panicked: {what}", op.function_name())))
            });
            match result {
                Ok(stats) => metrics.record_run(&stats),
                // The consumer may be gone (cancelled); then nobody needs the error.
                Err(e) => drop(sink.sender.blocking_send(Err(e))),
            }
            // Keep `reservation` alive until the backend is done with the vectors.
            drop(reservation);
        });

        let output = futures::stream::unfold(receiver, |mut r| async move { r.recv().await.map(|item| (item, r)) })
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        Ok(output.boxed())
    }
}

/// The share number in a partition of the task-numbering leaf (`exec::task_numbers`).
async fn share_number(mut numbers: SendableRecordBatchStream) -> Result<usize> {
    while let Some(batch) = numbers.next().await.transpose()? {
        if let Some(numbers) = batch.column(0).as_any().downcast_ref::<UInt32Array>()
            && !numbers.is_empty()
        {
            return Ok(numbers.value(0) as usize);
        }
    }
    exec_err!("SimilarityExec: a task's partition of the task numbers is empty")
}

/// Calls the backend for the operation.
pub(super) fn compute(
    op: &SimilarityOp,
    backend: &dyn Backend,
    left: &Vectors,
    right: &Vectors,
    same: bool,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    match op.operation {
        Operation::SimJoin { eps: threshold, include_self, pairs, .. } => {
            let self_join = same.then_some(SelfJoin { include_self, ordered: pairs == PairOrder::Ordered });
            let request = JoinRequest {
                left,
                right,
                metric: op.metric,
                threshold,
                self_join,
                index: op.index,
                grid_dims: op.grid_dims,
                plan: Default::default(),
            };
            backend.join(&request, sink)
        }
        Operation::RangeQuery { radius } => {
            let request = JoinRequest {
                left,
                right,
                metric: op.metric,
                threshold: radius,
                self_join: None,
                index: op.index,
                grid_dims: op.grid_dims,
                plan: Default::default(),
            };
            backend.join(&request, sink)
        }
        Operation::Knn { k } => {
            let request =
                KnnRequest { base: right, queries: left, metric: op.metric, k, approx: op.approx, index: op.index };
            stored::with_index_store(op, right, || {
                crate::backend::plan::ties::knn_with_ties(backend, &request, op.ties, sink)
            })
        }
        Operation::Clusters { eps, min_points } => {
            let request = ClusterRequest {
                rows: left,
                metric: op.metric,
                eps,
                min_points,
                index: op.index,
                grid_dims: op.grid_dims,
            };
            backend.clusters(&request, sink)
        }
    }
}
