//! Execution of [`SimilarityExec`]: collect the inputs under a memory reservation, build their
//! vectors, run the backend on a blocking thread, and stream its chunks out as batches. The channel
//! between them holds two chunks, so however many pairs there are, memory stays bounded; dropping
//! the stream closes the channel, which stops the backend at its next send.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, UInt32Array, new_empty_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err, exec_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlanProperties, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;

use super::cache::{self, VectorCache};
use super::keyed::{KeyGroups, compute_by_keys, odd_candidates_by_keys, order_by_keys, scalar_pairs_by_keys};
use super::progress::{Progress, ProgressListener};
use super::share::{Share, divided_child, self_join_pairs_only, share_partitions, take_share};
use super::{InputSide, SimilarityExec, WholeInputExec};
use crate::backend::{Backend, JoinRequest, KnnRequest, MapSink, ResultChunk, ResultSink, RunStats, SelfJoin, Wanted};
use crate::op::{Metric, Operation, PairOrder, SimilarityOp};
use crate::results::{BatchBuilder, InputColumn, OutputColumn, SideData};
use crate::vectors::{Row, Vectors, skipped_values};

/// Each statistic of a run (`RunStats`) that EXPLAIN ANALYZE shows, declared once: its metric's
/// name, and its value in a run. Counters and times add up over the runs of an operator (its
/// tiles, parts and partitions); a gauge keeps the last run's value where the run has one.
const RUN_COUNTERS: [(&str, fn(&RunStats) -> usize); 13] = [
    ("candidate_pairs", |s| s.candidates as usize),
    // Approximate kNN to a recall target: queries the exact kNN answered, the cheaper way to it.
    ("exact_queries", |s| s.exact_queries as usize),
    // Approximate kNN: distinct candidates the Multicurves index gave.
    ("curve_candidates", |s| s.curve_candidates as usize),
    // Approximate kNN on the cores: rows reached through the kNN graph.
    ("graph_rows", |s| s.graph_rows as usize),
    // Approximate kNN and the List of Clusters: indexes kept from an earlier query.
    ("kept_indexes", |s| s.kept_indexes),
    // The List of Clusters: distance computations it saved against a scan.
    ("saved_distances", |s| s.saved_distances as usize),
    // The directory: the leaf pages the left blocks visited.
    ("pages_visited", |s| s.pages_visited as usize),
    // `device=auto`: GPU runs redone on the CPU.
    ("gpu_fallbacks", |s| s.gpu_fallbacks),
    ("count_passes", |s| s.count_passes as usize),
    ("write_passes", |s| s.write_passes as usize),
    ("tiles", |s| s.tiles as usize),
    // GPU: inputs whose rows were already on the device.
    ("resident_inputs", |s| s.resident_inputs),
    // GPU: tiles whose brute-force passes ran on byte rows (exact integer filter).
    ("byte_row_tiles", |s| s.byte_row_tiles as usize),
];
const RUN_TIMES: [(&str, fn(&RunStats) -> Duration); 7] = [
    // The scheduler's predicted time and the wait for the device.
    ("predicted_time", |s| s.predicted_time),
    ("queue_time", |s| s.queue_time),
    ("build_time", |s| s.build_time),
    ("probe_time", |s| s.probe_time),
    ("transfer_time", |s| s.transfer_time),
    ("kernel_time", |s| s.kernel_time),
    ("emit_time", |s| s.emit_time),
];
const RUN_GAUGES: [(&str, fn(&RunStats) -> Option<usize>); 3] = [
    ("indexed_dims", |s| Some(s.indexed_dims)),
    // The directory: its levels and fanout.
    ("directory_levels", |s| s.directory.map(|(levels, _)| levels)),
    ("directory_fanout", |s| s.directory.map(|(_, fanout)| fanout)),
];

/// The operator's metrics (EXPLAIN ANALYZE).
#[derive(Clone)]
pub(super) struct SimilarityMetrics {
    /// The operator's set, for the per-device metrics of a run on several GPUs.
    set: ExecutionPlanMetricsSet,
    pub(super) baseline: BaselineMetrics,
    pub(super) input_rows: Count,
    pub(super) skipped_rows: Count,
    /// Inputs whose vectors came from the conversion cache (exec/cache.rs).
    pub(super) cached_inputs: Count,
    /// Concatenating each input's batches and converting them to f64 vectors (before the backend).
    convert_time: Time,
    /// The run statistics of [`RUN_COUNTERS`], [`RUN_TIMES`] and [`RUN_GAUGES`], in their order.
    run_counters: Vec<Count>,
    run_times: Vec<Time>,
    run_gauges: Vec<Gauge>,
}

impl SimilarityMetrics {
    fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            set: set.clone(),
            baseline: BaselineMetrics::new(set, 0),
            input_rows: MetricBuilder::new(set).counter("input_rows", 0),
            skipped_rows: MetricBuilder::new(set).counter("skipped_rows", 0),
            cached_inputs: MetricBuilder::new(set).counter("cached_inputs", 0),
            convert_time: MetricBuilder::new(set).subset_time("convert_time", 0),
            run_counters: RUN_COUNTERS.iter().map(|(name, _)| MetricBuilder::new(set).counter(*name, 0)).collect(),
            run_times: RUN_TIMES.iter().map(|(name, _)| MetricBuilder::new(set).subset_time(*name, 0)).collect(),
            run_gauges: RUN_GAUGES.iter().map(|(name, _)| MetricBuilder::new(set).gauge(*name, 0)).collect(),
        }
    }

    /// Input conversion is part of the operator's compute time too.
    pub(super) fn record_conversion(&self, duration: Duration) {
        self.convert_time.add_duration(duration);
        self.baseline.elapsed_compute().add_duration(duration);
    }

    pub(super) fn record_run(&self, stats: &RunStats) {
        for (counter, (_, value)) in self.run_counters.iter().zip(RUN_COUNTERS) {
            counter.add(value(stats));
        }
        for (time, (_, value)) in self.run_times.iter().zip(RUN_TIMES) {
            time.add_duration(value(stats));
        }
        for (gauge, (_, value)) in self.run_gauges.iter().zip(RUN_GAUGES) {
            if let Some(v) = value(stats) {
                gauge.set(v);
            }
        }
        // Several GPUs: each device's rows, wall time and kernel time (`gpu1_time=…`).
        for device in &stats.devices {
            let name = |what: &str| format!("gpu{}_{what}", device.ordinal);
            MetricBuilder::new(&self.set).counter(name("rows"), 0).add(device.rows);
            if device.base_rows > 0 {
                MetricBuilder::new(&self.set).counter(name("base_rows"), 0).add(device.base_rows);
            }
            MetricBuilder::new(&self.set).subset_time(name("time"), 0).add_duration(device.time);
            MetricBuilder::new(&self.set).subset_time(name("kernel_time"), 0).add_duration(device.kernel_time);
        }
        // Rows divided between the GPU and the CPU: each part's rows, predicted and measured time.
        if let Some(divided) = &stats.divided {
            for (unit, rows, predicted, time) in [
                ("gpu", divided.gpu_rows, divided.gpu_predicted, divided.gpu_time),
                ("cpu", divided.cpu_rows, divided.cpu_predicted, divided.cpu_time),
            ] {
                MetricBuilder::new(&self.set).counter(format!("divided_{unit}_rows"), 0).add(rows);
                MetricBuilder::new(&self.set)
                    .subset_time(format!("divided_{unit}_predicted"), 0)
                    .add_duration(predicted);
                MetricBuilder::new(&self.set).subset_time(format!("divided_{unit}_time"), 0).add_duration(time);
            }
        }
        // A recall target: the effort chosen, as a fraction of effort 1 (`4/1`, `1/2`; a ratio
        // survives a cluster's metrics, a fraction would not), and the calibration sample's recall.
        if let Some(effort) = stats.chosen_effort {
            let chosen = MetricBuilder::new(&self.set).ratio_metrics("approx_effort_chosen", 0);
            let (part, total) =
                if effort >= 1.0 { (effort.round() as usize, 1) } else { (1, (1.0 / effort).round() as usize) };
            chosen.set_part(part);
            chosen.set_total(total);
        }
        let (found, truth) = stats.recall_sample;
        if truth > 0 {
            let recall = MetricBuilder::new(&self.set).ratio_metrics("estimated_recall", 0);
            recall.add_part(found as usize);
            recall.add_total(truth as usize);
        }
        self.baseline.elapsed_compute().add_duration(stats.build_time + stats.probe_time);
    }
}

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
    /// The base is read and searched part by part (exec/streamed.rs).
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
        streamed: share.is_none() && super::streamed::streams_base(exec),
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
    async fn start(
        mut self,
        inputs: Vec<(SchemaRef, Vec<SendableRecordBatchStream>)>,
        share: Option<(usize, SendableRecordBatchStream)>,
        reservation: MemoryReservation,
    ) -> Result<futures::stream::BoxStream<'static, Result<datafusion::arrow::array::RecordBatch>>> {
        if self.streamed {
            return super::streamed::start(self, inputs, reservation).await;
        }
        let share = match share {
            Some((count, numbers)) => Some(Share { index: share_number(numbers).await?, count }),
            None => None,
        };
        // A task reads only its group of the divided input's partitions where there are enough
        // (exec/share.rs); the streams of the others are dropped unread.
        let mut inputs = inputs;
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
        // file: docs/optimisations.md, v96). Batches are kept in partition order; dropping the
        // tasks (an error, a cancelled query) stops them.
        let reservation = Arc::new(reservation);
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
        let collected_bytes: usize =
            collected.iter().flat_map(|(_, parts)| parts).map(|b| b.get_array_memory_size()).sum();
        // After the reservation's size is known: a share's slices share the collected buffers.
        let self_join_pairs = match share {
            Some(share) => take_share(&self.op, &mut collected, &mut self.left, &self.right, share, by_partitions),
            None => None,
        };

        // The vectors of each side, and of each input only the columns the output takes rows from,
        // concatenated (the vector column itself is widened batch by batch, never concatenated).
        let op = self.op.clone();
        let (left_side, right_side) = (self.left.clone(), self.right.clone());
        let output_columns = self.builder.columns.clone();
        let converting = Instant::now();
        let cache = self.cache.clone();
        let ((left, left_cached, left_odd), (right, right_cached, right_odd), groups) =
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
            .map_err(|e| exec_datafusion_err!("{}: building vectors failed: {e}", self.op.function_name()))??;
        self.metrics.record_conversion(converting.elapsed());
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
        let side_bytes = |v: &Vectors| v.values.bytes() + v.strings.chars.len() * 4 + v.strings.offsets.len() * 8;
        let vector_bytes = side_bytes(lv) + if same { 0 } else { side_bytes(rv) };
        reservation.try_grow(3 * vector_bytes)?;

        let (sender, receiver) = mpsc::channel::<Result<Vec<RecordBatch>>>(2);
        let Run { op, backend, builder, metrics, progress, .. } = self;
        // Chunks of 8 batches: each chunk is one hand-off between a backend thread and the
        // consumer, and at one batch per chunk those hand-offs were a visible part of emitting
        // 5·10⁷ pairs (docs/optimisations.md, v18); the consumer still yields batches of `batch_size` rows.
        let chunk_rows = (8 * builder.batch_size).max(1024);
        // No column projected (`SELECT count(*) FROM sim_join(…)`) or a summary row: only the
        // rows' count (and distance range) is needed.
        let wants = builder.wants();
        let (lv, rv) = (lv.clone(), rv.clone());
        // The output numbers each side's skipped-but-compared rows after its vectors.
        let (left, right) = (numbered_with_odd_rows(&left, &left_odd), numbered_with_odd_rows(&right, &right_odd));
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

/// One partition of an input collected, its batches counted against the reservation.
pub(super) async fn collect_partition(
    stream: SendableRecordBatchStream,
    reservation: Arc<MemoryReservation>,
) -> Result<Vec<RecordBatch>> {
    stream
        .and_then(|batch| {
            let grown = reservation.try_grow(batch.get_array_memory_size());
            async move { grown.map(|_| batch) }
        })
        .try_collect()
        .await
}

/// The two sides' vectors have one dimension (either may be empty).
pub(super) fn check_dimensions(
    op: &SimilarityOp,
    (left, lv): (&InputSide, &Vectors),
    (right, rv): (&InputSide, &Vectors),
) -> Result<()> {
    if !lv.is_empty() && !rv.is_empty() && lv.dim != rv.dim {
        return exec_err!(
            "{}: dimension mismatch: {} has {}-dimensional vectors, {} has {}",
            op.function_name(),
            left.describe,
            lv.dim,
            right.describe,
            rv.dim
        );
    }
    Ok(())
}

/// Which columns of `input`'s schema the output takes rows from.
pub(super) fn projected_columns(
    output_columns: &[OutputColumn],
    left: &InputSide,
    right: &InputSide,
    input: &InputSide,
    schema: &SchemaRef,
) -> Vec<bool> {
    (0..schema.fields().len())
        .map(|i| {
            output_columns.iter().any(|c| match *c {
                OutputColumn::Left(j) => j == i && left.child == input.child,
                OutputColumn::Right(j) => j == i && right.child == input.child,
                _ => false,
            })
        })
        .collect()
}

/// One input's collected batches converted: its vectors (from the session's `cache` where they
/// are kept), the columns the output projects (`projected`), each in one array, and the rows the
/// conversion skipped that SQL's semantics still compare.
pub(super) fn convert_side(
    op: &SimilarityOp,
    cache: Option<&VectorCache>,
    schema: &SchemaRef,
    parts: &[RecordBatch],
    input: &InputSide,
    projected: &[bool],
) -> Result<ConvertedSide> {
    let reject_zero = op.metric == Metric::Cosine;
    let describe = format!("{}: {}", op.function_name(), input.describe);
    let (vectors, cached) = cache::vectors(cache, schema, parts, &input.source, reject_zero, &describe, op.cache_size)?;
    let column = |i: usize| -> Result<Option<InputColumn>> {
        Ok(match parts {
            _ if !projected[i] => None,
            [] => Some(InputColumn::Whole(new_empty_array(schema.field(i).data_type()))),
            _ => Some(InputColumn::of(parts.iter().map(|b| b.column(i).clone()).collect())),
        })
    };
    let columns = (0..schema.fields().len()).map(column).collect::<Result<Vec<_>>>()?;
    let num_rows = parts.iter().map(|b| b.num_rows()).sum();
    let odd = match (op.scalar_semantics && vectors.skipped > 0, &op.operation) {
        (false, _) => Vec::new(),
        // Every skipped base row is a candidate of the sort above a rewritten kNN.
        (true, Operation::Knn { .. }) => vectors.skipped_rows(num_rows).into_iter().map(|r| (r, Vec::new())).collect(),
        (true, _) => skipped_values(parts, &input.source, &vectors.skipped_rows(num_rows))?,
    };
    Ok((SideData { columns, num_rows, vectors }, cached, odd))
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

/// Worker pools of finished runs, kept for the next: starting a pool's threads took 0.3–0.5 ms of a
/// 19-ms GPU kNN on a 16-core host (docs/optimisations.md, v54). At most [`IDLE_POOLS`] wait; a run whose
/// backend panicked does not return its pool. The process's, not a session's: threads on the same
/// cores, which a run of any session uses whole.
static IDLE_WORKERS: Mutex<Vec<rayon::ThreadPool>> = Mutex::new(Vec::new());
const IDLE_POOLS: usize = 4;

/// An idle worker pool, or a new one with as many threads as the global pool.
pub(super) fn worker_pool() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    if let Some(pool) = IDLE_WORKERS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
        return Ok(pool);
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("simjoin-run-{i}"))
        .build()
}

pub(super) fn return_worker_pool(pool: rayon::ThreadPool) {
    let mut idle = IDLE_WORKERS.lock().unwrap_or_else(|e| e.into_inner());
    if idle.len() < IDLE_POOLS {
        idle.push(pool);
    }
}

/// Rows skipped by the conversion but compared under `SimilarityOp::scalar_semantics`: (input
/// row, values).
pub(super) type OddRows = Vec<(u32, Vec<f64>)>;

/// `side` as the output numbers it when its odd rows are paired too: a position past its vectors
/// is an odd row (in `odd`'s order), as [`scalar_pairs`] numbers them.
pub(super) fn numbered_with_odd_rows(side: &SideData, odd: &OddRows) -> SideData {
    let mut numbered = side.clone();
    if !odd.is_empty() {
        let rows = side.vectors.rows.iter().copied().chain(odd.iter().map(|(row, _)| *row)).collect();
        numbered.vectors = Arc::new(Vectors::numbering(rows));
    }
    numbered
}

/// One converted input: its data, whether its vectors came from the cache, and its odd rows.
pub(super) type ConvertedSide = (SideData, bool, OddRows);

/// The pairs of a join planned from SQL (`SimilarityOp::scalar_semantics`) that involve a row the
/// operator's contract skips: each side's `odd` rows against every row of the other side, by the
/// scalar formula (the distance functions' own), kept when SQL's `<=` keeps the value, which
/// orders floats totally (a NaN with its sign bit set precedes every number). An odd row's
/// position is its side's vector count plus its index among the odd rows.
pub(super) fn scalar_pairs(
    metric: Metric,
    threshold: f64,
    [(left, left_odd), (right, right_odd)]: [(&Vectors, &OddRows); 2],
    sink: &dyn ResultSink,
) -> Result<()> {
    let mut writer = crate::backend::PairWriter::new(sink, false);
    let mut pair = |a: Row, b: Row, pa: usize, pb: usize| scalar_pair(metric, threshold, &mut writer, (a, b), (pa, pb));
    let right_rows = (0..right.len()).map(|j| (right.row(j), j));
    let right_all: Vec<(Row, usize)> =
        right_rows.chain(right_odd.iter().enumerate().map(|(j, (_, b))| (Row::F64(b), right.len() + j))).collect();
    for (i, (_, a)) in left_odd.iter().enumerate() {
        for &(b, pb) in &right_all {
            pair(Row::F64(a), b, left.len() + i, pb)?;
        }
    }
    for i in 0..left.len() {
        for (j, (_, b)) in right_odd.iter().enumerate() {
            pair(left.row(i), Row::F64(b), i, right.len() + j)?;
        }
    }
    writer.flush()
}

/// One pair of [`scalar_pairs`]: rows `a` and `b` at output positions `pa` and `pb`, written when
/// SQL's `<=` keeps their distance.
pub(super) fn scalar_pair(
    metric: Metric,
    threshold: f64,
    writer: &mut crate::backend::PairWriter,
    (a, b): (Row, Row),
    (pa, pb): (usize, usize),
) -> Result<()> {
    if a.len() != b.len() {
        return exec_err!("sim_join: dimension mismatch: {}-dimensional and {}-dimensional vectors", a.len(), b.len());
    }
    let distance = metric.row_distance(a, b);
    if distance.total_cmp(&threshold).is_le() { writer.push(pa as u32, pb as u32, distance) } else { Ok(()) }
}

/// A rewritten kNN's candidates beyond its lists, each with a NaN distance and rank 0 (the sort or
/// window above computes their distances itself, functions/rewrite.rs and knn_join.rs): each of
/// the `queries` queries with the skipped base rows at positions `skipped`, and each skipped query
/// (positions `queries..queries + odd_queries`, as [`numbered_with_odd_rows`] numbers them) with
/// every one of the `base` base positions — their distances are NULL or NaN, which SQL still orders.
pub(super) fn odd_candidates(
    (queries, odd_queries): (usize, usize),
    skipped: impl Iterator<Item = u32> + Clone,
    base: usize,
    sink: &dyn ResultSink,
) -> Result<()> {
    let normal = (0..queries as u32).flat_map(|q| skipped.clone().map(move |b| (q, b)));
    let odd = (queries as u32..(queries + odd_queries) as u32).flat_map(|q| (0..base as u32).map(move |b| (q, b)));
    send_candidates(normal.chain(odd), sink)
}

/// Sends the (query, base) position pairs `candidates` as result rows with a NaN distance and
/// rank 0, in chunks of the sink's size.
pub(super) fn send_candidates(candidates: impl Iterator<Item = (u32, u32)>, sink: &dyn ResultSink) -> Result<()> {
    let mut chunk = ResultChunk::default();
    for (q, position) in candidates {
        chunk.left.push(q);
        chunk.right.push(position);
        chunk.distance.push(f64::NAN);
        chunk.rank.push(0);
        if chunk.len() >= sink.chunk_rows() {
            sink.send(std::mem::take(&mut chunk))?;
        }
    }
    if chunk.is_empty() { Ok(()) } else { sink.send(chunk) }
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
            };
            backend.join(&request, sink)
        }
        Operation::Knn { k } => {
            let request =
                KnnRequest { base: right, queries: left, metric: op.metric, k, approx: op.approx, index: op.index };
            backend.knn(&request, sink)
        }
    }
}

/// Turns each chunk into batches on the thread that sends it — the backend's workers, in
/// parallel, rather than the one consumer (docs/optimisations.md, v156) — and sends them to the
/// output stream, blocking while it is two chunks behind.
struct ChannelSink {
    sender: mpsc::Sender<Result<Vec<RecordBatch>>>,
    builder: BatchBuilder,
    /// The left and right inputs the batches take their columns from.
    sides: (SideData, SideData),
    chunk_rows: usize,
    wants: Wanted,
    progress: Option<Arc<dyn ProgressListener>>,
    function: &'static str,
}

impl ResultSink for ChannelSink {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        let batches = self.builder.build(&chunk, &self.sides.0, &self.sides.1)?;
        self.sender
            .blocking_send(Ok(batches))
            .map_err(|_| DataFusionError::Execution(format!("{}: query cancelled", self.function)))
    }

    fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }

    fn wants(&self) -> Wanted {
        self.wants
    }

    fn start(&self, total_units: u64) {
        if let Some(p) = &self.progress {
            p.start(self.function, total_units);
        }
    }

    fn advance(&self, units: u64) {
        if let Some(p) = &self.progress {
            p.advance(units);
        }
    }
}
