//! What a run did, for EXPLAIN ANALYZE.

use std::time::Duration;

/// What a run did, for EXPLAIN ANALYZE. A new statistic is a field here, its merge in
/// [`RunStats::add`], and one row naming its metric in exec/run/metrics.rs (`RUN_COUNTERS`,
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
    /// Approximate kNN: indexes loaded from the index store, and stored there by this run.
    pub loaded_indexes: usize,
    pub stored_indexes: usize,
    /// Approximate kNN to a recall target (backend/plan/recall.rs): the effort chosen (the
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
    /// A clustering (`dbscan`): its core rows, the pairs of core rows it united, and the joins it
    /// ran (the degrees' and the components').
    pub cluster_cores: u64,
    pub cluster_edges: u64,
    pub union_passes: u64,
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
        self.loaded_indexes += other.loaded_indexes;
        self.stored_indexes += other.stored_indexes;
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
        self.cluster_cores += other.cluster_cores;
        self.cluster_edges += other.cluster_edges;
        self.union_passes += other.union_passes;
    }
}
