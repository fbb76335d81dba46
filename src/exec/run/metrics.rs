//! The operator's metrics (EXPLAIN ANALYZE): the run statistics declared once, and how each
//! run's are added to them.

use std::time::Duration;

use datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time};

use crate::backend::RunStats;

/// Each statistic of a run (`RunStats`) that EXPLAIN ANALYZE shows, declared once: its metric's
/// name, and its value in a run. Counters and times add up over the runs of an operator (its
/// tiles, parts and partitions); a gauge keeps the last run's value where the run has one.
const RUN_COUNTERS: [(&str, fn(&RunStats) -> usize); 18] = [
    ("candidate_pairs", |s| s.candidates as usize),
    // Approximate kNN to a recall target: queries the exact kNN answered, the cheaper way to it.
    ("exact_queries", |s| s.exact_queries as usize),
    // Approximate kNN: distinct candidates the Multicurves index gave.
    ("curve_candidates", |s| s.curve_candidates as usize),
    // Approximate kNN on the cores: rows reached through the kNN graph.
    ("graph_rows", |s| s.graph_rows as usize),
    // Approximate kNN and the List of Clusters: indexes kept from an earlier query.
    ("kept_indexes", |s| s.kept_indexes),
    // Approximate kNN: indexes loaded from `simjoin.index_store`, and stored there.
    ("index_loaded", |s| s.loaded_indexes),
    ("index_stored", |s| s.stored_indexes),
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
    // dbscan: its core rows, the pairs of core rows united, and the joins it ran.
    ("core_rows", |s| s.cluster_cores as usize),
    ("core_edges", |s| s.cluster_edges as usize),
    ("union_passes", |s| s.union_passes as usize),
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
pub(in crate::exec) struct SimilarityMetrics {
    /// The operator's set, for the per-device metrics of a run on several GPUs.
    set: ExecutionPlanMetricsSet,
    pub(in crate::exec) baseline: BaselineMetrics,
    pub(in crate::exec) input_rows: Count,
    pub(in crate::exec) skipped_rows: Count,
    /// Inputs whose vectors came from the conversion cache (exec/cache.rs).
    pub(in crate::exec) cached_inputs: Count,
    /// Concatenating each input's batches and converting them to f64 vectors (before the backend).
    convert_time: Time,
    /// The run statistics of [`RUN_COUNTERS`], [`RUN_TIMES`] and [`RUN_GAUGES`], in their order.
    run_counters: Vec<Count>,
    run_times: Vec<Time>,
    run_gauges: Vec<Gauge>,
}

impl SimilarityMetrics {
    pub(super) fn new(set: &ExecutionPlanMetricsSet) -> Self {
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
    pub(in crate::exec) fn record_conversion(&self, duration: Duration) {
        self.convert_time.add_duration(duration);
        self.baseline.elapsed_compute().add_duration(duration);
    }

    pub(in crate::exec) fn record_run(&self, stats: &RunStats) {
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
        // A recall target: the effort chosen, as a fraction of effort 1 (`6/1`, `24/32`: the
        // efforts tried are powers of two and three quarters of them; a ratio survives a cluster's
        // metrics, a fraction would not), and the calibration sample's recall.
        if let Some(effort) = stats.chosen_effort {
            let chosen = MetricBuilder::new(&self.set).ratio_metrics("approx_effort_chosen", 0);
            let (part, total) = if effort >= 1.0 && effort.fract() == 0.0 {
                (effort as usize, 1)
            } else {
                ((effort * 32.0).round() as usize, 32)
            };
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
