//! kNN and range queries whose base is read part by part. The queries are collected and converted
//! first; then every partition of the base is decoded on a task of its own, and each part of it (a
//! few batches) is converted and searched as soon as it is decoded, while the next part decodes.
//! Decoding, conversion and the search overlap, and the base is never held whole: its memory is a
//! part per partition, not the input (a 1M × 128 f32 file is 512 MB of vectors held whole, and
//! writing them once more into one buffer cost as much as the search of 10 queries).
//!
//! A range query's pairs leave as each part is searched. kNN keeps each query's k nearest of every
//! partition by (distance, row in partition) and merges the partitions' lists at the end by
//! (distance, scan order), scan order being (partition, row in partition): the k smallest of a
//! union are among the k smallest of its parts, and a part's rows are consecutive rows of its
//! partition, so the lists, ties included, are those of one search over the whole base.
//!
//! Used where nothing is gained by holding the base whole: the backend searches on the CPU cores
//! (a GPU run wants the base on the device in one piece, and the CPU's per-part searches are
//! independent), the base's vectors would not be kept for a later query (read from files, not an
//! in-memory table: exec/cache.rs), and no index over the whole base is asked for (`approx`, the
//! List of Clusters) and no keys group the rows (exec/keyed.rs). Edit distances keep the whole
//! path. A range query planned from SQL also
//! pairs the rows the operator skips by the scalar formula, part by part (exec/run/mod.rs, `scalar_pairs`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array, new_empty_array};
use datafusion::arrow::compute::concat;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err, exec_err, internal_datafusion_err};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;

use super::{InputSide, SimilarityExec};
use crate::backend::plan::topk::{Collector, Neighbour, Ranked, k_smallest, send_ranked};
use crate::backend::{Backend, ResultChunk, ResultSink, RunStats, Wanted};
use crate::exec::run::{
    ConvertedSide, OddRows, Run, SimilarityMetrics, check_dimensions, collect_partition, compute, convert_side,
    numbered_with_odd_rows, odd_candidates, projected_columns, return_worker_pool, scalar_pairs, worker_pool,
};
use crate::op::{IndexChoice, KnnTies, Operation, SimilarityOp};
use crate::results::{BatchBuilder, InputColumn, OutputColumn, SideData};
use crate::vectors::Vectors;

/// A part is searched once its batches hold this many rows or bytes (the whole partition when it
/// is smaller). Large enough that a search's fixed costs are small against it, small enough that
/// its buffers are reused from the allocator's free memory instead of fresh pages.
const PART_ROWS: usize = 65_536;
const PART_BYTES: usize = 16 << 20;

/// Whether `exec` reads its base part by part (the module's conditions).
pub(super) fn streams_base(exec: &SimilarityExec) -> bool {
    let op = &exec.op;
    let inputs = exec.inputs();
    let function = match op.operation {
        // kNN: where the lists are few. Each part is searched for every query's k nearest, so
        // the search finds k candidates per query in every part, and the lists of every partition
        // are held until the end; with many queries the search, not decoding, is the cost, and a
        // base held whole is searched faster (P1's 10,000 queries on 16 cores: 4.1 s whole, 4.3–4.4 s
        // by parts; docs/design.md#inputs).
        Operation::Knn { k } => {
            let statistics = StatisticsContext::new().compute(inputs[exec.left.child].as_ref(), &StatisticsArgs::new());
            let queries = statistics.ok().and_then(|s| s.num_rows.get_value().copied());
            queries.is_some_and(|queries| queries.saturating_mul(k) <= LIST_ENTRIES)
        }
        Operation::RangeQuery { .. } => true,
        Operation::SimJoin { .. } | Operation::Clusters { .. } => false,
    };
    function
        && exec.left.child != exec.right.child
        && exec.backend.searches_parts_on_cpu()
        && op.approx.is_none()
        // The partitions' lists merge to k a query; lists widened to their ties search whole.
        && op.ties == KnnTies::None
        && op.keys.is_empty()
        && op.index != IndexChoice::ListOfClusters
        && !op.metric.is_text()
        && !reads_memory(&inputs[exec.right.child])
}

/// The most list entries (queries × k, by the query input's statistics) of a kNN searched by parts.
const LIST_ENTRIES: usize = 1 << 14;

/// Bytes of the lists of `queries` queries, `k` each, in every one of `partitions` partitions and
/// in the merge.
fn list_bytes(queries: usize, k: usize, partitions: usize) -> usize {
    queries.saturating_mul(k).saturating_mul(std::mem::size_of::<Neighbour>()).saturating_mul(partitions + 1)
}

/// Whether a leaf of `plan` is an in-memory table (whose vectors the conversion cache keeps).
fn reads_memory(plan: &Arc<dyn ExecutionPlan>) -> bool {
    match plan.downcast_ref::<DataSourceExec>() {
        Some(source) => source.data_source().is::<MemorySourceConfig>(),
        None => plan.children().into_iter().any(reads_memory),
    }
}

/// What every partition's search of the base shares.
struct Search {
    op: Arc<SimilarityOp>,
    backend: Arc<dyn Backend>,
    builder: BatchBuilder,
    metrics: SimilarityMetrics,
    queries: SideData,
    /// The queries as the output numbers them: their vectors' rows, then their odd rows'.
    query_rows: SideData,
    /// The queries' rows a SQL-planned range query pairs by the scalar formula, and a SQL-planned
    /// kNN with every base row.
    query_odd: OddRows,
    base_side: InputSide,
    query_side: InputSide,
    base_schema: SchemaRef,
    /// The base's columns the output takes rows from.
    projected: Vec<bool>,
    reservation: Arc<MemoryReservation>,
    /// The run's worker threads, shared by the partitions' searches.
    pool: rayon::ThreadPool,
    /// Where the output batches go: each part's range pairs as it is searched, kNN's merged lists
    /// at the end.
    output: mpsc::Sender<Result<RecordBatch>>,
    /// Result rows per chunk the backend sends.
    chunk_rows: usize,
}

/// What a partition's search keeps for kNN's merge (range queries keep only `rows`).
#[derive(Default)]
struct PartitionLists {
    /// Input rows of the partition read so far.
    rows: usize,
    /// Each query's k nearest in the partition, positions its rows.
    lists: Vec<Vec<Neighbour>>,
    /// A SQL-rewritten kNN's skipped rows of the partition (candidates of the sort above it).
    skipped: Vec<u32>,
    /// The projected columns of each part, in order, cut down to the rows the lists named.
    parts: Vec<KeptPart>,
}

/// The projected columns of one part of a partition, of the rows that can still be output.
///
/// Only a row some query's list (or `skipped`) names can ever be output, and lists only lose rows
/// to later parts; so a part whose named rows are a small share of it keeps those rows alone. A
/// SQL-rewritten kNN projects the vector column for the sort above it, and keeping every part's
/// vectors whole cost as much as the search (page faults and copies of the whole base).
struct KeptPart {
    /// The partition row of the part's first row.
    first: u32,
    /// Rows of the part.
    len: u32,
    /// The partition rows kept, ascending; `None`: every row of the part.
    rows: Option<Vec<u32>>,
    columns: Vec<Option<ArrayRef>>,
}

impl KeptPart {
    /// The part's rows that `lists` or `skipped` name, or all of them where that is at least half
    /// (the copy would cost more than it saves), or where the output numbers base rows by their
    /// scan order (a cluster task's `ScanOrder`, which reads rows at their positions).
    fn new(
        columns: &[Option<InputColumn>],
        (first, len): (u32, u32),
        lists: &[Vec<Neighbour>],
        skipped: &[u32],
        keep_all: bool,
    ) -> Result<Self> {
        let whole = || -> Result<Self> {
            let columns =
                columns.iter().map(|c| c.as_ref().map(InputColumn::whole).transpose()).collect::<Result<_>>()?;
            Ok(KeptPart { first, len, rows: None, columns })
        };
        if keep_all {
            return whole();
        }
        let in_part = |row: &u32| (first..first + len).contains(row);
        let mut named: Vec<u32> =
            lists.iter().flatten().map(|n| n.position).chain(skipped.iter().copied()).filter(in_part).collect();
        named.sort_unstable();
        named.dedup();
        if named.len() * 2 >= len as usize {
            return whole();
        }
        let at = UInt32Array::from_iter_values(named.iter().map(|row| row - first));
        let columns = columns.iter().map(|c| c.as_ref().map(|c| c.take(&at)).transpose()).collect::<Result<_>>()?;
        Ok(KeptPart { first, len, rows: Some(named), columns })
    }

    /// Where partition row `row` of this part lies among its kept rows.
    fn index(&self, row: u32) -> Option<usize> {
        match &self.rows {
            None => Some((row - self.first) as usize),
            Some(rows) => rows.binary_search(&row).ok(),
        }
    }

    fn kept(&self) -> usize {
        self.rows.as_ref().map_or(self.len as usize, Vec::len)
    }
}

/// Collects and converts the queries, then searches the base's partitions; the output streams
/// from a channel that the partitions (range queries) or the final merge (kNN) fill.
pub(super) async fn start(
    run: Run,
    inputs: Vec<(SchemaRef, Vec<SendableRecordBatchStream>)>,
    reservation: MemoryReservation,
) -> Result<BoxStream<'static, Result<RecordBatch>>> {
    let Run { op, left: query_side, right: base_side, backend, builder, metrics, progress, cache, .. } = run;
    let function = op.function_name();
    let mut inputs: Vec<Option<_>> = inputs.into_iter().map(Some).collect();
    let mut take = |child: usize| {
        inputs
            .get_mut(child)
            .and_then(Option::take)
            .ok_or_else(|| internal_datafusion_err!("{function}: input {child} is missing"))
    };
    let (query_schema, query_streams) = take(query_side.child)?;
    let (base_schema, base_streams) = take(base_side.child)?;
    let reservation = Arc::new(reservation);

    // The queries: every partition on a task of its own, then converted as a whole input is.
    let tasks: Vec<SpawnedTask<Result<Vec<RecordBatch>>>> = query_streams
        .into_iter()
        .map(|stream| SpawnedTask::spawn(collect_partition(stream, reservation.clone())))
        .collect();
    let mut query_batches = Vec::new();
    for task in tasks {
        let partition =
            task.join().await.map_err(|e| exec_datafusion_err!("{function}: reading an input failed: {e}"))??;
        query_batches.extend(partition);
    }
    let collected_bytes: usize = query_batches.iter().map(|b| b.get_array_memory_size()).sum();
    let converting = Instant::now();
    let projected = projected_columns(&builder.columns, &query_side, &base_side, &query_side, &query_schema);
    let (op_for_queries, side) = (op.clone(), query_side.clone());
    let (queries, cached, query_odd): ConvertedSide = tokio::task::spawn_blocking(move || {
        convert_side(&op_for_queries, cache.as_deref(), &query_schema, &query_batches, &side, &projected)
    })
    .await
    .map_err(|e| exec_datafusion_err!("{function}: building vectors failed: {e}"))??;
    metrics.record_conversion(converting.elapsed());
    metrics.cached_inputs.add(usize::from(cached));
    metrics.input_rows.add(queries.num_rows);
    metrics.skipped_rows.add(queries.vectors.skipped);
    reservation.shrink(collected_bytes);
    let kept: usize = queries.columns.iter().flatten().map(InputColumn::memory_size).sum();
    reservation.try_grow(kept + queries.vectors.values.bytes())?;

    // kNN's lists, held until the merge: every partition's and the merged.
    if let Operation::Knn { k } = op.operation {
        reservation.grow(list_bytes(queries.vectors.len(), k, base_streams.len()));
    }
    let pool = worker_pool()
        .map_err(|e| DataFusionError::ResourcesExhausted(format!("{function}: cannot start worker threads: {e}")))?;
    let (sender, receiver) = mpsc::channel::<Result<RecordBatch>>(4);
    let chunk_rows = (8 * builder.batch_size).max(1024);
    let projected = projected_columns(&builder.columns, &query_side, &base_side, &base_side, &base_schema);
    let query_rows = numbered_with_odd_rows(&queries, &query_odd);
    let search = Arc::new(Search {
        op,
        backend,
        builder,
        metrics: metrics.clone(),
        queries,
        query_rows,
        query_odd,
        base_side,
        base_schema,
        projected,
        reservation,
        pool,
        output: sender.clone(),
        chunk_rows,
        query_side,
    });
    if let Some(p) = &progress {
        p.start(function, base_streams.len() as u64);
    }
    let driver = SpawnedTask::spawn(async move {
        let outcome = search_base(&search, base_streams, progress.as_deref()).await;
        if let Some(p) = &progress {
            p.finish();
        }
        if let Err(e) = outcome {
            // The consumer may be gone (cancelled); then nobody needs the error.
            let _ = sender.send(Err(e)).await;
        }
        if let Some(search) = Arc::into_inner(search) {
            return_worker_pool(search.pool);
        }
    });
    let output = futures::stream::unfold((receiver, driver), |(mut receiver, driver)| async move {
        receiver.recv().await.map(|item| (item, (receiver, driver)))
    });
    Ok(output.boxed())
}

/// Searches every partition of the base on a task of its own; for kNN, then merges their lists
/// and sends them.
async fn search_base(
    search: &Arc<Search>,
    streams: Vec<SendableRecordBatchStream>,
    progress: Option<&dyn super::ProgressListener>,
) -> Result<()> {
    let function = search.op.function_name();
    let tasks: Vec<SpawnedTask<Result<PartitionLists>>> =
        streams.into_iter().map(|stream| SpawnedTask::spawn(search_partition(search.clone(), stream))).collect();
    let mut partitions = Vec::with_capacity(tasks.len());
    for task in tasks {
        let lists =
            task.join().await.map_err(|e| exec_datafusion_err!("{function}: reading an input failed: {e}"))??;
        if let Some(p) = progress {
            p.advance(1);
        }
        partitions.push(lists);
    }
    let Operation::Knn { k } = search.op.operation else { return Ok(()) };
    let search = search.clone();
    tokio::task::spawn_blocking(move || send_merged(&search, partitions, k))
        .await
        .map_err(|e| exec_datafusion_err!("{function}: merging the lists failed: {e}"))?
}

/// Reads one partition of the base, searching each part of it on a blocking thread while the
/// next part decodes.
async fn search_partition(search: Arc<Search>, mut stream: SendableRecordBatchStream) -> Result<PartitionLists> {
    let function = search.op.function_name();
    let mut found = PartitionLists {
        lists: match search.op.operation {
            Operation::Knn { .. } => vec![Vec::new(); search.queries.vectors.len()],
            _ => Vec::new(),
        },
        ..Default::default()
    };
    let mut pending: Vec<RecordBatch> = Vec::new();
    let (mut rows, mut bytes) = (0, 0);
    // The part being searched, while the next one decodes.
    let mut searching: Option<SpawnedTask<Result<PartitionLists>>> = None;
    loop {
        let batch = stream.next().await.transpose()?;
        let end = batch.is_none();
        if let Some(batch) = batch.filter(|b| b.num_rows() > 0) {
            let size = batch.get_array_memory_size();
            search.reservation.try_grow(size)?;
            rows += batch.num_rows();
            bytes += size;
            pending.push(batch);
        }
        if !pending.is_empty() && (end || rows >= PART_ROWS || bytes >= PART_BYTES) {
            if let Some(previous) = searching.take() {
                found = previous.join().await.map_err(|e| exec_datafusion_err!("{function}: search failed: {e}"))??;
            }
            let (batches, part_bytes) = (std::mem::take(&mut pending), bytes);
            let (search, lists) = (search.clone(), std::mem::take(&mut found));
            searching = Some(SpawnedTask::spawn_blocking(move || search.search_part(batches, part_bytes, lists)));
            (rows, bytes) = (0, 0);
        }
        if end {
            break;
        }
    }
    if let Some(last) = searching {
        found = last.join().await.map_err(|e| exec_datafusion_err!("{function}: search failed: {e}"))??;
    }
    Ok(found)
}

impl Search {
    /// Converts one part of a partition (`batches`, `bytes` reserved) and searches it: a range
    /// query's pairs are sent on, kNN's nearest are merged into the partition's lists.
    fn search_part(
        &self,
        batches: Vec<RecordBatch>,
        bytes: usize,
        mut found: PartitionLists,
    ) -> Result<PartitionLists> {
        let converting = Instant::now();
        // A part decoded for this query alone: never kept.
        let (part, _, odd) =
            convert_side(&self.op, None, &self.base_schema, &batches, &self.base_side, &self.projected)?;
        drop(batches);
        let kept: usize = part.columns.iter().flatten().map(InputColumn::memory_size).sum();
        let vector_bytes = part.vectors.values.bytes();
        self.reservation.shrink(bytes);
        self.reservation.try_grow(kept + vector_bytes)?;
        self.metrics.record_conversion(converting.elapsed());
        self.metrics.input_rows.add(part.num_rows);
        self.metrics.skipped_rows.add(part.vectors.skipped);
        let vectors = &part.vectors;
        check_dimensions(&self.op, (&self.query_side, &self.queries.vectors), (&self.base_side, vectors))?;
        let stats = match self.op.operation {
            Operation::Knn { k } => {
                let collected = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: self.chunk_rows };
                let stats = self.run(&part, &collected)?;
                let offset = found.rows as u32;
                for chunk in collected.chunks.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    for i in 0..chunk.len() {
                        let position = offset + vectors.rows[chunk.right[i] as usize];
                        found.lists[chunk.left[i] as usize].push(Neighbour { distance: chunk.distance[i], position });
                    }
                }
                self.pool.install(|| {
                    use rayon::iter::{IntoParallelRefMutIterator, ParallelIterator};
                    found
                        .lists
                        .par_iter_mut()
                        .filter(|l| l.len() > k)
                        .for_each(|l| *l = k_smallest(std::mem::take(l), k))
                });
                found.skipped.extend(odd.iter().map(|(row, _)| offset + row));
                // A skipped query is a candidate with every base row (exec/run/mod.rs, `odd_candidates`).
                let keep_all = self.builder.columns.contains(&OutputColumn::ScanOrder) || !self.query_odd.is_empty();
                let span = (offset, part.num_rows as u32);
                let kept_part = KeptPart::new(&part.columns, span, &found.lists, &found.skipped, keep_all)?;
                let kept_bytes: usize = kept_part.columns.iter().flatten().map(|c| c.get_array_memory_size()).sum();
                self.reservation.shrink(kept.saturating_sub(kept_bytes));
                found.parts.push(kept_part);
                self.reservation.shrink(vector_bytes);
                stats
            }
            _ => {
                let numbered = numbered_with_odd_rows(&part, &odd);
                let sink = BatchSender { search: self, base: &numbered };
                let stats = self.run(&part, &sink)?;
                if let Some(threshold) = self.op.threshold().filter(|_| self.op.scalar_semantics)
                    && (!self.query_odd.is_empty() || !odd.is_empty())
                {
                    let sides = [(self.queries.vectors.as_ref(), &self.query_odd), (vectors.as_ref(), &odd)];
                    scalar_pairs(self.op.metric, threshold, sides, &sink)?;
                }
                self.reservation.shrink(kept + vector_bytes);
                stats
            }
        };
        self.metrics.record_run(&stats);
        found.rows += part.num_rows;
        Ok(found)
    }

    /// The backend's search of every query against one part, on the run's worker threads.
    fn run(&self, part: &SideData, sink: &dyn ResultSink) -> Result<RunStats> {
        self.pool
            .install(|| compute(&self.op, self.backend.as_ref(), &self.queries.vectors, &part.vectors, false, sink))
    }
}

/// kNN: each query's k nearest over all partitions, by (distance, scan order), sent ranked in
/// query order; then a SQL-rewritten kNN's skipped base rows, each with every query, and its
/// skipped queries, each with every base row (then kept whole), NaN and rank 0 (candidates of the
/// sort or window above it, as in the whole path).
fn send_merged(search: &Search, partitions: Vec<PartitionLists>, k: usize) -> Result<()> {
    let total: usize = partitions.iter().map(|p| p.rows).sum();
    if total > u32::MAX as usize {
        return exec_err!(
            "{}: {}: {total} rows exceed the limit of 2^32 - 1",
            search.op.function_name(),
            search.base_side.describe
        );
    }
    let queries = search.queries.vectors.len();
    let mut lists: Vec<Vec<Neighbour>> = vec![Vec::new(); queries];
    let mut skipped = Vec::new();
    let mut offset = 0u32;
    for partition in &partitions {
        for (list, found) in lists.iter_mut().zip(&partition.lists) {
            list.extend(found.iter().map(|n| Neighbour { distance: n.distance, position: n.position + offset }));
        }
        skipped.extend(partition.skipped.iter().map(|&row| row + offset));
        offset += partition.rows as u32;
    }
    // Ranked by (distance, scan position); then each position becomes its row among the kept rows
    // of every part, in scan order, which are the base the output takes rows from.
    let parts: Vec<(u32, &KeptPart)> = {
        let mut offset = 0u32;
        let mut parts = Vec::new();
        for partition in &partitions {
            parts.extend(partition.parts.iter().map(|part| (offset, part)));
            offset += partition.rows as u32;
        }
        parts
    };
    let mut starts = Vec::with_capacity(parts.len());
    let mut kept_rows = 0usize;
    for (_, part) in &parts {
        starts.push(kept_rows);
        kept_rows += part.kept();
    }
    let kept_index = |position: u32| -> Result<u32> {
        let i = parts.partition_point(|(offset, part)| offset + part.first <= position).saturating_sub(1);
        let (offset, part) =
            parts.get(i).ok_or_else(|| internal_datafusion_err!("no part holds base row {position}"))?;
        let index = part
            .index(position - offset)
            .ok_or_else(|| internal_datafusion_err!("base row {position} was not kept for the output"))?;
        Ok((starts[i] + index) as u32)
    };
    let lists: Vec<(usize, Ranked)> = lists
        .into_iter()
        .map(|list| {
            k_smallest(list, k)
                .into_iter()
                .map(|n| Ok(Neighbour { distance: n.distance, position: kept_index(n.position)? }))
                .collect::<Result<Vec<_>>>()
        })
        .enumerate()
        .map(|(q, list)| Ok((q, Ranked::List(list?))))
        .collect::<Result<_>>()?;
    let skipped = skipped.into_iter().map(kept_index).collect::<Result<Vec<u32>>>()?;
    // The base's projected columns over the kept rows of all parts in scan order.
    let column = |i: usize| -> Result<Option<ArrayRef>> {
        if !search.projected[i] {
            return Ok(None);
        }
        let columns: Vec<&dyn datafusion::arrow::array::Array> =
            parts.iter().filter_map(|(_, part)| part.columns[i].as_deref()).collect();
        Ok(Some(match columns.as_slice() {
            [] => new_empty_array(search.base_schema.field(i).data_type()),
            columns => concat(columns)?,
        }))
    };
    let columns = (0..search.base_schema.fields().len())
        .map(|i| Ok(column(i)?.map(InputColumn::Whole)))
        .collect::<Result<Vec<_>>>()?;
    let base = SideData {
        columns,
        num_rows: kept_rows,
        vectors: Arc::new(Vectors::numbering((0..kept_rows as u32).collect())),
    };
    drop(parts);
    drop(partitions);
    let sink = BatchSender { search, base: &base };
    send_ranked(&sink, lists)?;
    odd_candidates((queries, search.query_odd.len()), skipped.iter().copied(), kept_rows, &sink)
}

/// Builds output batches from chunks against the queries and one base (a part, or kNN's merged
/// base) and sends them, blocking while the consumer is behind.
struct BatchSender<'a> {
    search: &'a Search,
    base: &'a SideData,
}

impl ResultSink for BatchSender<'_> {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        for batch in self.search.builder.build(&chunk, &self.search.query_rows, self.base)? {
            self.search.output.blocking_send(Ok(batch)).map_err(|_| {
                DataFusionError::Execution(format!("{}: query cancelled", self.search.op.function_name()))
            })?;
        }
        Ok(())
    }

    fn chunk_rows(&self) -> usize {
        self.search.chunk_rows
    }

    fn wants(&self) -> Wanted {
        self.search.builder.wants()
    }
}
