//! The backend strategy behind the one operator: what a backend is given, how it hands results
//! back (chunks through a [`ResultSink`], so results never need to fit in memory), and which
//! backend a query gets.

use std::fmt::Debug;
use std::time::Duration;

use datafusion::common::{Result, plan_err};

use crate::op::{Device, IndexChoice, Metric, SimilarityOp};
use crate::vectors::Vectors;

mod approx;
#[cfg(feature = "gpu")]
mod approx_estimate;
mod approx_recall;
#[cfg(feature = "gpu")]
mod auto;
pub mod cpu;
mod directory;
mod exact;
#[cfg(feature = "gpu")]
pub mod gpu;
mod grid_join;
mod list_of_clusters;
mod plan;
#[cfg(feature = "gpu")]
mod scheduler;
mod simd;
pub mod text;
#[cfg(feature = "gpu")]
mod tiles;
mod topk;

#[cfg(feature = "gpu")]
pub(crate) use approx::build_graph;
#[cfg(feature = "gpu")]
pub use auto::AutoBackend;
pub use cpu::CpuBackend;
#[cfg(feature = "gpu")]
pub use gpu::GpuBackend;
pub(crate) use topk::{Collector, Neighbour, Ranked, k_smallest, send_ranked};

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
    /// A scan, or the List of Clusters (`backend::clusters`).
    pub index: IndexChoice,
}

/// A piece of the result: parallel columns of vector positions (not input rows), distances and,
/// for kNN, ranks. `left` is the query side of range and kNN results.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ResultChunk {
    /// Position of the left (query) vector in its [`Vectors`].
    pub left: Vec<u32>,
    /// Position of the right (base) vector in its [`Vectors`].
    pub right: Vec<u32>,
    /// Exact distance of the pair.
    pub distance: Vec<f64>,
    /// kNN only: 1 for the nearest neighbour of the query.
    pub rank: Vec<u32>,
    /// Result rows counted but not listed, beyond those listed: sent only to a sink that wants
    /// less than the rows ([`ResultSink::wants`]).
    pub counted: u64,
    /// The smallest and largest distance of the counted rows, in IEEE 754's total order (as
    /// Arrow's `min`/`max` order floats), where the sink wants them ([`Wanted::CountAndRange`]).
    pub counted_range: Option<(f64, f64)>,
}

impl ResultChunk {
    /// Number of result rows.
    pub fn len(&self) -> usize {
        self.left.len()
    }

    /// Whether the chunk holds no row.
    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// Widens `counted_range` to take in `distance`.
    #[inline]
    pub fn widen_range(&mut self, distance: f64) {
        self.counted_range = Some(widened(self.counted_range, distance));
    }

    fn with_capacity(rows: usize) -> Self {
        Self {
            left: Vec::with_capacity(rows),
            right: Vec::with_capacity(rows),
            distance: Vec::with_capacity(rows),
            ..Self::default()
        }
    }
}

/// `range` (smallest, largest) widened to take in `distance`, in IEEE 754's total order.
#[inline]
pub fn widened(range: Option<(f64, f64)>, distance: f64) -> (f64, f64) {
    match range {
        None => (distance, distance),
        Some((low, high)) => (
            if distance.total_cmp(&low).is_lt() { distance } else { low },
            if distance.total_cmp(&high).is_gt() { distance } else { high },
        ),
    }
}

/// What the consumer of a run's results needs of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Every result row.
    Rows,
    /// How many result rows there are (the output projects no column: `SELECT count(*) FROM
    /// sim_join(…)`): a join may count its pairs ([`ResultChunk::counted`]) instead of listing
    /// them, decided by the same exact test.
    Count,
    /// How many, and the smallest and largest distance among them (`count(*)`, `min(distance)`,
    /// `max(distance)` over a join, computed in the operator: exec/summary.rs): a join may count
    /// its pairs and widen [`ResultChunk::counted_range`] instead of listing them.
    CountAndRange,
}

/// Where a backend sends results. Implementations block while the consumer is behind (so memory
/// stays bounded) and fail once the consumer is gone (so cancelled queries stop working).
pub trait ResultSink: Sync {
    /// Hands one chunk downstream.
    fn send(&self, chunk: ResultChunk) -> Result<()>;
    /// Rows per chunk the consumer wants.
    fn chunk_rows(&self) -> usize;
    /// What the consumer needs of the results; a backend may always list rows instead.
    fn wants(&self) -> Wanted {
        Wanted::Rows
    }
    /// Announces how many units of work (cells, query blocks) the run has.
    fn start(&self, _total_units: u64) {}
    /// Reports units of work done.
    fn advance(&self, _units: u64) {}
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
    backend
        .join(&JoinRequest { left: &left, ..*request }, &ShiftedSink { inner: sink, left: rows.start as u32, right: 0 })
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

/// A part's results with its positions shifted to the whole inputs': left (query) positions by
/// `left`, right (base) positions by `right`.
pub(crate) struct ShiftedSink<'a> {
    pub inner: &'a dyn ResultSink,
    pub left: u32,
    pub right: u32,
}

impl ResultSink for ShiftedSink<'_> {
    fn send(&self, mut chunk: ResultChunk) -> Result<()> {
        chunk.left.iter_mut().for_each(|p| *p += self.left);
        if self.right != 0 {
            chunk.right.iter_mut().for_each(|p| *p += self.right);
        }
        self.inner.send(chunk)
    }

    fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows()
    }

    fn wants(&self) -> Wanted {
        self.inner.wants()
    }

    fn advance(&self, units: u64) {
        self.inner.advance(units);
    }
}

/// A sink passing each chunk through `map` on its way to `inner` (`None`: nothing to pass on);
/// the rest of the sink's calls go straight through.
pub(crate) struct MapSink<'a, F> {
    pub inner: &'a dyn ResultSink,
    pub map: F,
    /// Whether `map` passes counted chunks on as they are (it keeps every row): only then may the
    /// backend count instead of listing, where `inner` wants less than the rows.
    pub passes_counts: bool,
}

impl<F: Fn(ResultChunk) -> Option<ResultChunk> + Sync> ResultSink for MapSink<'_, F> {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        match (self.map)(chunk) {
            Some(chunk) => self.inner.send(chunk),
            None => Ok(()),
        }
    }

    fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows()
    }

    fn wants(&self) -> Wanted {
        if self.passes_counts { self.inner.wants() } else { Wanted::Rows }
    }

    fn start(&self, total_units: u64) {
        self.inner.start(total_units)
    }

    fn advance(&self, units: u64) {
        self.inner.advance(units)
    }
}

/// What a run did, for EXPLAIN ANALYZE. A new statistic is a field here, its merge in
/// [`RunStats::add`], and one row naming its metric in exec/stream/metrics.rs (`RUN_COUNTERS`,
/// `RUN_TIMES` or `RUN_GAUGES`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    /// Dimensions the grid indexes (0: brute force).
    pub indexed_dims: usize,
    /// Pairs whose exact distance was computed.
    pub candidates: u64,
    /// GPU: count passes over the left rows (kNN: one more for each radius some query outgrew).
    pub count_passes: u64,
    /// GPU: write passes (0 when the count pass collected every pair).
    pub write_passes: u64,
    /// GPU: pieces of the inputs run one after another (1 when both fit the device at once).
    pub tiles: u64,
    /// GPU: inputs whose rows were already on the device (kept from an earlier query).
    pub resident_inputs: usize,
    /// GPU: tiles whose brute-force passes ran on byte rows (integer coordinates within one window
    /// of 256: brute_join_tc_bytes, an exact filter on the tensor cores).
    pub byte_row_tiles: u64,
    /// Time spent choosing the strategy and building indexes.
    pub build_time: Duration,
    /// Time spent finding and sending results.
    pub probe_time: Duration,
    /// GPU: host↔device copies (inputs, counts, results), within build and probe time.
    pub transfer_time: Duration,
    /// GPU: kernel time (count and write passes), within probe time.
    pub kernel_time: Duration,
    /// GPU: turning downloaded pairs into result chunks and sending them, within probe time.
    pub emit_time: Duration,
    /// Several GPUs: each device's part of the run.
    pub devices: Vec<DeviceRun>,
    /// Approximate kNN: distinct candidates the curves gave (`candidates` counts those compared).
    pub curve_candidates: u64,
    /// Approximate kNN on the cores: rows the search reached through the kNN graph.
    pub graph_rows: u64,
    /// Approximate kNN: indexes kept from an earlier query rather than built (0 or 1 a run).
    pub kept_indexes: usize,
    /// Approximate kNN to a recall target (backend/approx_recall.rs): the effort chosen (the
    /// largest of the parts' where a run was divided), the true neighbours of the calibration's
    /// sample the search found and those there were, and the queries the exact kNN answered
    /// instead.
    pub chosen_effort: Option<f64>,
    pub recall_sample: (u64, u64),
    pub exact_queries: u64,
    /// The List of Clusters: distance computations a scan would have made and the index did not.
    pub saved_distances: u64,
    /// The directory (`index=directory`): its levels and fanout, and the leaf pages the left
    /// blocks visited (each block's visits counted once).
    pub directory: Option<(usize, usize)>,
    pub pages_visited: u64,
    /// `device=auto`/`gpu`: the scheduler's predicted time of the run where it ran (corrected by
    /// earlier runs' measured times), and how long it waited for that device.
    pub predicted_time: Duration,
    pub queue_time: Duration,
    /// `device=auto`: runs the GPU failed before sending a row, run again on the CPU.
    pub gpu_fallbacks: usize,
    /// `device=auto`: the run's left rows divided between the GPU and the CPU cores.
    pub divided: Option<DividedRun>,
}

/// A run whose left rows (queries) were divided between the GPU and the CPU cores: each part's
/// rows, predicted time (corrected by earlier runs) and measured wall time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DividedRun {
    pub gpu_rows: usize,
    pub gpu_predicted: Duration,
    pub gpu_time: Duration,
    pub cpu_rows: usize,
    pub cpu_predicted: Duration,
    pub cpu_time: Duration,
}

/// One GPU's part of a run divided among several.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceRun {
    /// The device's ordinal.
    pub ordinal: usize,
    /// Left rows (queries) it was given.
    pub rows: usize,
    /// kNN with the base divided among the devices: the base rows it held (0: the whole base).
    pub base_rows: usize,
    /// Its wall time, from the start of the run to the end of its part.
    pub time: Duration,
    /// Its kernel time.
    pub kernel_time: Duration,
}

impl RunStats {
    /// Adds another run's work (a tile of the same operation) to this one's.
    pub fn add(&mut self, other: &RunStats) {
        self.indexed_dims = self.indexed_dims.max(other.indexed_dims);
        self.candidates += other.candidates;
        self.count_passes += other.count_passes;
        self.write_passes += other.write_passes;
        self.tiles += other.tiles;
        self.resident_inputs += other.resident_inputs;
        self.byte_row_tiles += other.byte_row_tiles;
        self.build_time += other.build_time;
        self.probe_time += other.probe_time;
        self.transfer_time += other.transfer_time;
        self.kernel_time += other.kernel_time;
        self.emit_time += other.emit_time;
        self.devices.extend(other.devices.iter().cloned());
        self.curve_candidates += other.curve_candidates;
        self.graph_rows += other.graph_rows;
        self.kept_indexes += other.kept_indexes;
        self.chosen_effort = match (self.chosen_effort, other.chosen_effort) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.recall_sample =
            (self.recall_sample.0 + other.recall_sample.0, self.recall_sample.1 + other.recall_sample.1);
        self.exact_queries += other.exact_queries;
        self.saved_distances += other.saved_distances;
        self.directory = self.directory.or(other.directory);
        self.pages_visited += other.pages_visited;
        self.predicted_time += other.predicted_time;
        self.queue_time += other.queue_time;
        self.gpu_fallbacks += other.gpu_fallbacks;
        if self.divided.is_none() {
            self.divided.clone_from(&other.divided);
        }
    }
}

/// A way to compute the operations.
pub trait Backend: Debug + Send + Sync {
    /// Short name shown by EXPLAIN (`cpu`, `gpu(sm_90a)`).
    fn name(&self) -> String;
    /// Every pair within the threshold (ε-join, range query).
    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats>;
    /// The `k` nearest base vectors of every query, in query order, each query's neighbours by rank.
    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats>;
    /// Whether every search runs on the CPU cores, so that a base searched part by part
    /// (exec/streamed.rs) gives the same answer as a whole one at no extra cost.
    fn searches_parts_on_cpu(&self) -> bool {
        false
    }
    /// Told, when the plan is made and before any input is read, what the plan knows of the
    /// inputs' sizes: the backend to run with instead of this one, if any. `device=auto` starts
    /// the GPU's start-up here, or settles on the CPU cores when they finish before the GPU
    /// could even start ([`AutoBackend`]).
    fn for_inputs(&self, _op: &SimilarityOp, _sizes: &KnownSizes) -> Option<std::sync::Arc<dyn Backend>> {
        None
    }
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

/// The backend for `op`: the GPU under `device=gpu`; under `device=auto`, per run, the GPU or the
/// CPU by estimated time where a GPU may be usable; otherwise (and for text metrics) every CPU
/// core. Under `device=gpu` the device's start-up begins now, on a
/// background thread, while the inputs are read; under `device=auto` when the plan knows the
/// inputs' sizes ([`Backend::for_inputs`]).
#[cfg(feature = "gpu")]
pub fn choose(op: &SimilarityOp) -> Result<std::sync::Arc<dyn Backend>> {
    check(op)?;
    let function = op.function_name();
    let knn = matches!(op.operation, crate::op::Operation::Knn { .. });
    let modules = auto::modules_of(op);
    // Text under device=auto: joins may take a GPU that is already open (AutoBackend::text_join);
    // kNN of strings runs on the cores.
    let text_join = op.metric.is_text() && !knn;
    if text_join && op.device == Device::Auto && crate::cuda::startup::libraries_present() {
        return Ok(std::sync::Arc::new(AutoBackend::text_joins(op.gpu_memory_limit, op.devices.clone())));
    }
    let text_on_cpu = op.metric.is_text() && op.device != Device::Gpu;
    let clusters_on_cpu = op.index == IndexChoice::ListOfClusters && op.device != Device::Gpu;
    if text_on_cpu || clusters_on_cpu {
        return Ok(std::sync::Arc::new(CpuBackend));
    }
    let devices = op.devices.clone();
    match op.device {
        Device::Cpu => Ok(std::sync::Arc::new(CpuBackend)),
        Device::Auto if crate::cuda::startup::libraries_present() => {
            Ok(std::sync::Arc::new(AutoBackend::new(op.gpu_memory_limit, devices, modules, op.checks)))
        }
        Device::Auto => Ok(std::sync::Arc::new(CpuBackend)),
        Device::Gpu if crate::cuda::startup::libraries_present() => {
            Ok(std::sync::Arc::new(AutoBackend::gpu_only(op.gpu_memory_limit, devices, modules, op.checks)))
        }
        Device::Gpu => match crate::cuda::probe() {
            Err(reason) => plan_err!("{function}: option device=gpu, but no GPU can be used: {reason}"),
            Ok(_) => plan_err!("{function}: option device=gpu, but the CUDA libraries failed to load"),
        },
    }
}

/// The backend for `op` in a build without the `gpu` feature: every CPU core; `device=gpu` is an
/// error that says why.
#[cfg(not(feature = "gpu"))]
pub fn choose(op: &SimilarityOp) -> Result<std::sync::Arc<dyn Backend>> {
    check(op)?;
    match op.device {
        Device::Gpu => plan_err!(
            "{}: option device=gpu, but this build of simjoin has no GPU backend (built without its `gpu` feature)",
            op.function_name()
        ),
        Device::Auto | Device::Cpu => Ok(std::sync::Arc::new(CpuBackend)),
    }
}

/// Starts opening GPU 0 and loading the vector joins' and kNN's kernel modules on a background
/// thread, where CUDA's libraries are present: for a long-lived process such as `simjoin serve`,
/// which pays the start-up once for all its queries. A one-shot process leaves it to each plan
/// ([`Backend::for_inputs`]), which under `device=auto` starts nothing for a run the cores finish
/// before the start-up would.
#[cfg(all(feature = "gpu", feature = "server"))]
pub fn start_gpu() {
    let mut modules = auto::JOIN_MODULES.to_vec();
    modules.extend(auto::KNN_MODULES.iter().filter(|m| !auto::JOIN_MODULES.contains(m)));
    crate::cuda::startup::warm_up(&modules);
}

/// For a plan that runs on a cluster: the options checked as [`choose`] checks them wherever it
/// runs, and a backend that only stands for the one each executor chooses when it decodes its
/// part of the plan (`cluster::codec`); this machine opens no GPU.
pub fn on_executor(op: &SimilarityOp) -> Result<std::sync::Arc<dyn Backend>> {
    check(op)?;
    Ok(std::sync::Arc::new(OnExecutor))
}

/// The option combinations no machine can run.
fn check(op: &SimilarityOp) -> Result<()> {
    let function = op.function_name();
    match op.device {
        Device::Gpu
            if op.index == IndexChoice::ListOfClusters && matches!(op.operation, crate::op::Operation::Knn { .. }) =>
        {
            plan_err!(
                "{function}: option device=gpu is not available with index=list_of_clusters: kNN through the List of Clusters runs on every CPU core (device=auto or cpu; joins and range queries search it on the GPU)"
            )
        }
        Device::Cpu if op.devices != crate::op::Devices::All => {
            plan_err!("{function}: option devices={} selects GPUs, but device=cpu runs on the CPU", op.devices)
        }
        _ => Ok(()),
    }
}

/// The backend of a plan planned for a cluster, before an executor replaces it with its own.
#[derive(Debug)]
pub struct OnExecutor;

impl Backend for OnExecutor {
    fn name(&self) -> String {
        "chosen by each executor".into()
    }

    fn join(&self, _request: &JoinRequest, _sink: &dyn ResultSink) -> Result<RunStats> {
        datafusion::common::internal_err!("a plan for a cluster ran outside an executor (its backend is chosen there)")
    }

    fn knn(&self, _request: &KnnRequest, _sink: &dyn ResultSink) -> Result<RunStats> {
        datafusion::common::internal_err!("a plan for a cluster ran outside an executor (its backend is chosen there)")
    }
}

/// Collects pairs into chunks of the sink's size and sends each full one; where the sink wants
/// less than the rows ([`ResultSink::wants`]), counts them (and widens their distance range) and
/// sends that at the flush.
pub(crate) struct PairWriter<'s> {
    sink: &'s dyn ResultSink,
    chunk: ResultChunk,
    rows: usize,
    /// Also write (b, a) for each (a, b) (ordered self-join).
    mirror: bool,
    wants: Wanted,
}

impl<'s> PairWriter<'s> {
    pub(crate) fn new(sink: &'s dyn ResultSink, mirror: bool) -> Self {
        let wants = sink.wants();
        let rows = if wants == Wanted::Rows { sink.chunk_rows().max(2) } else { 0 };
        Self { sink, chunk: ResultChunk::with_capacity(rows), rows, mirror, wants }
    }

    /// Whether pairs are counted rather than listed, with no distance needed.
    #[inline]
    pub(crate) fn counts_only(&self) -> bool {
        self.wants == Wanted::Count
    }

    /// Counts `pairs` pairs found without their distances (only where [`PairWriter::counts_only`]);
    /// `distinct` of them have two different positions, each also counted the other way round
    /// when mirrored.
    #[inline]
    pub(crate) fn count(&mut self, pairs: u64, distinct: u64) {
        debug_assert!(self.counts_only());
        self.add_counted(pairs, distinct);
    }

    #[inline]
    fn add_counted(&mut self, pairs: u64, distinct: u64) {
        self.chunk.counted += pairs + if self.mirror { distinct } else { 0 };
    }

    /// Writes the pair (and its mirror image when asked and `a != b`).
    #[inline]
    pub(crate) fn push(&mut self, a: u32, b: u32, distance: f64) -> Result<()> {
        match self.wants {
            Wanted::Rows => {}
            Wanted::Count => {
                self.count(1, u64::from(a != b));
                return Ok(());
            }
            Wanted::CountAndRange => {
                self.add_counted(1, u64::from(a != b));
                self.chunk.widen_range(distance);
                return Ok(());
            }
        }
        self.chunk.left.push(a);
        self.chunk.right.push(b);
        self.chunk.distance.push(distance);
        if self.mirror && a != b {
            self.chunk.left.push(b);
            self.chunk.right.push(a);
            self.chunk.distance.push(distance);
        }
        if self.chunk.len() + 1 >= self.rows { self.flush() } else { Ok(()) }
    }

    /// Writes the pairs `(lefts[i], rights[i])` at `distances[i]`, a self-join's (`lower_first`)
    /// with its smaller position first: the rows that pushing them one by one writes, copied into
    /// the chunk a slice at a time where they are listed unmirrored (the GPU's downloaded pairs:
    /// pushed one by one, they took a third of the emitting workers' time, docs/optimisations.md,
    /// v164).
    #[cfg(any(feature = "gpu", test))]
    pub(crate) fn push_slices(
        &mut self,
        lefts: &[u32],
        rights: &[u32],
        distances: &[f64],
        lower_first: bool,
    ) -> Result<()> {
        let ordered = |(&a, &b): (&u32, &u32)| if lower_first && a > b { (b, a) } else { (a, b) };
        if self.wants != Wanted::Rows || self.mirror {
            for (pair, &d) in lefts.iter().zip(rights).zip(distances) {
                let (a, b) = ordered(pair);
                self.push(a, b, d)?;
            }
            return Ok(());
        }
        let mut at = 0;
        while at < lefts.len() {
            // `push` sends a chunk once it holds `rows - 1` rows (room for a mirrored pair).
            let end = (at + (self.rows - 1).saturating_sub(self.chunk.len()).max(1)).min(lefts.len());
            let (l, r) = (&lefts[at..end], &rights[at..end]);
            if lower_first {
                self.chunk.left.extend(l.iter().zip(r).map(|(&a, &b)| a.min(b)));
                self.chunk.right.extend(l.iter().zip(r).map(|(&a, &b)| a.max(b)));
            } else {
                self.chunk.left.extend_from_slice(l);
                self.chunk.right.extend_from_slice(r);
            }
            self.chunk.distance.extend_from_slice(&distances[at..end]);
            at = end;
            if self.chunk.len() + 1 >= self.rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Sends what is buffered.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.chunk.is_empty() && self.chunk.counted == 0 {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.chunk, ResultChunk::with_capacity(self.rows));
        self.sink.send(full)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::topk::Collector;

    /// Pairs written a slice at a time are sent in the chunks, row for row, that pushing them one
    /// by one sends: mirrored or not, a self-join's smaller position first or not.
    #[test]
    fn pairs_written_by_slices_are_the_pairs_pushed_one_by_one() {
        let n = 1000;
        let lefts: Vec<u32> = (0..n).map(|i| (i * 7919 % 1000) as u32).collect();
        let rights: Vec<u32> = (0..n).map(|i| (i * 104_729 % 997) as u32).collect();
        let distances: Vec<f64> = (0..n).map(|i| i as f64 / 7.0).collect();
        for (mirror, lower_first) in [(false, false), (false, true), (true, true)] {
            let chunks = |by_slices: bool| {
                let sink = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: 64 };
                let mut writer = PairWriter::new(&sink, mirror);
                if by_slices {
                    for at in (0..n).step_by(300) {
                        let end = (at + 300).min(n);
                        let slices = (&lefts[at..end], &rights[at..end], &distances[at..end]);
                        writer.push_slices(slices.0, slices.1, slices.2, lower_first).unwrap();
                    }
                } else {
                    for i in 0..n {
                        let (a, b) = (lefts[i], rights[i]);
                        let (a, b) = if lower_first && a > b { (b, a) } else { (a, b) };
                        writer.push(a, b, distances[i]).unwrap();
                    }
                }
                writer.flush().unwrap();
                let chunks = sink.chunks.into_inner().unwrap();
                chunks.into_iter().map(|c| (c.left, c.right, c.distance)).collect::<Vec<_>>()
            };
            let (sliced, pushed) = (chunks(true), chunks(false));
            assert!(pushed.len() > 10);
            assert_eq!(sliced, pushed, "mirror={mirror}, lower_first={lower_first}");
        }
    }
}
