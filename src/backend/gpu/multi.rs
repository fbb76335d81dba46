//! Several GPUs of one host as one backend: each run's work divided among them, one thread per
//! device, each with its own context, module, streams, staging buffers, memory budget and kept
//! rows (its [`GpuBackend`]).
//!
//! * kNN: while the base fits each GPU beside its share of the queries, the queries are divided
//!   into one contiguous part per GPU (each GPU holds the whole base); a query's neighbours come
//!   from one GPU, so its list is the single-GPU list. Below [`KNN_SPLIT_WORK`] one GPU finishes
//!   first (docs/design.md#multi-gpu), so there the first GPU runs it alone, unless the GPUs
//!   were named (`devices=0,1`). A base too large for that is divided instead, every GPU finds
//!   every query's k nearest in its part, and the lists are merged per query
//!   ([`MultiGpuBackend::knn_over_base_parts`]).
//! * Joins and range queries: every GPU holds the whole inputs (and their grids), and takes one
//!   range of the left slots of about equal work (`join::part_slots`: under a grid, from the work
//!   of sampled slots that every GPU estimates alike, so skewed data is divided by its pairs'
//!   work, not by rows; brute force, equal counts, or a self-join's equal areas of its
//!   triangle). Each pair (a self-join's unordered pair, found from one of its slots alone, so
//!   the halving of the pairs is kept) comes from one part. Inputs that do not fit a device
//!   whole: a self-join runs, tiled, on the first GPU; a join of two inputs divides its left
//!   rows into parts of equal counts, each joined with the whole right input (tiled).
//!
//! Over every visible GPU (`devices=all`), a run below [`KNN_SPLIT_WORK`] or [`JOIN_SPLIT_ROWS`]
//! uses the first GPU alone, and the others' contexts are opened (all at once, each on a thread of
//! its own) only by the first run that divides: a small query in a new process pays one context,
//! not one per GPU. GPUs the user named are opened before the run and divide every run.
//!
//! Each part's results go out as its GPU produces them (the queries of different parts
//! interleave), with positions shifted back to the whole input's.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use datafusion::common::{DataFusionError, Result};

use super::GpuBackend;
use super::divided::JoinParts;
use crate::backend::plan::tiles::merged_knn;
use crate::backend::request::{join_rows, knn_rows};
use crate::backend::{Backend, DeviceRun, JoinRequest, KnnRequest, ResultSink, RunStats};
use crate::costs::{JOIN_SPLIT_ROWS, KNN_SPLIT_WORK};
use crate::cuda::{Error as GpuError, GpuDevice};

/// The GPUs of a run.
#[derive(Debug)]
pub struct MultiGpuBackend {
    /// The first GPU, open: every run uses it.
    first: GpuBackend,
    /// Every GPU of the run, the first included: given when the GPUs were named, else opened by
    /// the first run that divides (a GPU that cannot be opened is then left out).
    all: OnceLock<Vec<GpuBackend>>,
    /// The other visible GPUs, not yet opened.
    others: Vec<usize>,
    memory_limit: usize,
    /// The GPUs were named: divide every run among them.
    named: bool,
}

/// Opens the GPUs at `ordinals`, each on a thread of its own (a context takes a fraction of a
/// second; opened ones are returned at once by `GpuDevice::at`).
pub(crate) fn open_devices(ordinals: &[usize]) -> Vec<Result<Arc<GpuDevice>, GpuError>> {
    match ordinals {
        [one] => vec![GpuDevice::at(*one)],
        several => std::thread::scope(|s| {
            let handles: Vec<_> = several.iter().map(|&o| s.spawn(move || GpuDevice::at(o))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(GpuError::Device("opening a GPU panicked".into()))))
                .collect()
        }),
    }
}

impl MultiGpuBackend {
    /// A backend over the GPUs the user named (at least two, open), each run divided among them
    /// and using at most `memory_limit` bytes of each (0: all that is available).
    pub fn named(devices: Vec<Arc<GpuDevice>>, memory_limit: usize) -> Self {
        let all: Vec<GpuBackend> = devices.into_iter().map(|d| GpuBackend::new(d, memory_limit)).collect();
        let first = all[0].clone();
        Self { first, all: OnceLock::from(all), others: Vec::new(), memory_limit, named: true }
    }

    /// A backend over every visible GPU: `first` open, the `others` opened when a run divides.
    pub fn visible(first: Arc<GpuDevice>, others: Vec<usize>, memory_limit: usize) -> Self {
        let first = GpuBackend::new(first, memory_limit);
        Self { first, all: OnceLock::new(), others, memory_limit, named: false }
    }

    /// Every GPU of the run, opening the others the first time.
    fn all(&self) -> &[GpuBackend] {
        self.all.get_or_init(|| {
            let opened = open_devices(&self.others).into_iter().filter_map(|device| device.ok());
            let others = opened.map(|device| GpuBackend::new(device, self.memory_limit));
            std::iter::once(self.first.clone()).chain(others).collect()
        })
    }

    /// Runs `part(gpu, rows)` for one contiguous part of `0..rows` per GPU, in parallel, and adds
    /// up their statistics; the first error wins.
    fn split(
        &self,
        rows: usize,
        part: impl Fn(&GpuBackend, Range<usize>) -> Result<RunStats> + Sync,
    ) -> Result<RunStats> {
        let parts = self.all().len().min(rows.max(1));
        let per_part = rows.div_ceil(parts);
        self.on_each(parts, |i, gpu| {
            let range = (i * per_part).min(rows)..((i + 1) * per_part).min(rows);
            let rows = range.len();
            Ok((part(gpu, range)?, rows))
        })
    }

    /// Runs `part(i, gpu)` on each of the first `parts` GPUs, in parallel, each returning its
    /// statistics and the left rows it took, and adds up their statistics with each device's part
    /// of the run; the first error wins.
    fn on_each(
        &self,
        parts: usize,
        part: impl Fn(usize, &GpuBackend) -> Result<(RunStats, usize)> + Sync,
    ) -> Result<RunStats> {
        let started = std::time::Instant::now();
        let outcomes: Vec<Result<RunStats>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self.all()[..parts]
                .iter()
                .enumerate()
                .map(|(i, gpu)| {
                    let part = &part;
                    scope.spawn(move || {
                        let (mut stats, rows) = part(i, gpu)?;
                        let device = DeviceRun {
                            ordinal: gpu.ordinal(),
                            rows,
                            time: started.elapsed(),
                            kernel_time: stats.kernel_time,
                            base_rows: 0,
                        };
                        stats.devices = vec![device];
                        Ok(stats)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(DataFusionError::Internal("GPU part panicked".into()))))
                .collect()
        });
        let mut stats = RunStats::default();
        for outcome in outcomes {
            stats.add(&outcome?);
        }
        Ok(stats)
    }
}

impl Backend for MultiGpuBackend {
    fn name(&self) -> String {
        let count = self.all.get().map_or(1 + self.others.len(), Vec::len);
        match count {
            1 => self.first.name(),
            n => format!("{n} × {}", self.first.name()),
        }
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        if !self.named && request.left.len() < JOIN_SPLIT_ROWS {
            return self.first.join(request, sink);
        }
        let gpus = self.all();
        if gpus.len() > 1 {
            let mut parts = true;
            for gpu in gpus {
                parts &= gpu.takes_join_parts(request)?;
            }
            if parts {
                let shared = JoinParts::new(request, gpus.len());
                return self.on_each(gpus.len(), |i, gpu| gpu.join_part(request, sink, &shared, i));
            }
        }
        if request.self_join.is_some() || gpus.len() == 1 {
            return self.first.join(request, sink);
        }
        self.split(request.left.len(), |gpu, rows| join_rows(gpu, request, rows, sink))
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let work = request.queries.len() as f64 * request.base.len() as f64 * request.base.dim as f64;
        if work < KNN_SPLIT_WORK && !self.named {
            return self.first.knn(request, sink);
        }
        let gpus = self.all();
        if gpus.len() == 1 {
            return self.first.knn(request, sink);
        }
        let query_share = request.queries.len().div_ceil(gpus.len());
        let mut base_fits = true;
        for gpu in gpus {
            base_fits &= gpu.knn_fits(request.base.len(), query_share, request.base.dim)?;
        }
        if base_fits || !request.metric.is_vector() {
            return self.split(request.queries.len(), |gpu, rows| knn_rows(gpu, request, rows, sink));
        }
        self.knn_over_base_parts(request, sink)
    }
}

/// Neighbours the base parts' lists of one tile of queries hold at most on the host before they
/// are merged (16 bytes each).
const MERGED_NEIGHBOURS: usize = 1 << 25;

impl MultiGpuBackend {
    /// A kNN whose base does not fit each GPU beside its share of the queries: the base divided
    /// into one contiguous part per GPU, every GPU finding every query's k nearest in its part
    /// (tiled there when its part does not fit either), and each query's lists merged into its k
    /// smallest by (distance, base position) — the one-GPU list (`tiles::merged_knn`). The
    /// queries go in tiles whose lists stay within MERGED_NEIGHBOURS.
    fn knn_over_base_parts(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let gpus = self.all();
        let parts = gpus.len().min(request.base.len().max(1));
        let per_part = request.base.len().div_ceil(parts);
        let base_parts: Vec<Range<usize>> = (0..parts)
            .map(|p| (p * per_part).min(request.base.len())..((p + 1) * per_part).min(request.base.len()))
            .collect();
        let query_rows = (MERGED_NEIGHBOURS / (request.k.max(1) * parts)).max(1);
        let devices: Vec<std::sync::Mutex<DeviceRun>> = (0..parts)
            .map(|p| {
                let device =
                    DeviceRun { ordinal: gpus[p].ordinal(), base_rows: base_parts[p].len(), ..Default::default() };
                std::sync::Mutex::new(device)
            })
            .collect();
        let mut stats = merged_knn(request, sink, query_rows, &base_parts, true, |p, part, sink| {
            let started = std::time::Instant::now();
            let stats = gpus[p].knn(part, sink)?;
            let mut device = devices[p].lock().unwrap_or_else(|e| e.into_inner());
            device.rows += part.queries.len();
            device.time += started.elapsed();
            device.kernel_time += stats.kernel_time;
            Ok(stats)
        })?;
        stats.devices = devices.into_iter().map(|d| d.into_inner().unwrap_or_else(|e| e.into_inner())).collect();
        Ok(stats)
    }
}
