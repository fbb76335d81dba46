//! Several GPUs of one host as one backend: each run's work divided among them, one thread per
//! device, each with its own context, module, streams, staging buffers, memory budget and kept
//! rows (its [`GpuBackend`]).
//!
//! * kNN: the queries are divided into one contiguous part per GPU (each GPU holds the whole
//!   base); a query's neighbours come from one GPU, so its list is the single-GPU list. Below
//!   [`KNN_SPLIT_WORK`] one GPU finishes first (docs/optimisations.md, v102), so there the first
//!   GPU runs it alone, unless the GPUs were named (`devices=0,1`).
//! * Joins and range queries of two inputs: the left rows (the queries of a range query) are
//!   divided the same way, each part joined with the whole right input.
//! * Self-joins: every GPU holds the whole input and its grid, and takes one range of the left
//!   slots (`join::part_slots`: equal counts under a grid, equal areas of brute force's triangle);
//!   each unordered pair is found from one of its slots alone, so the halving of the pairs is kept
//!   and the parts' pairs are disjoint. An input that does not fit a device whole runs, tiled, on
//!   the first GPU.
//!
//! Parts are of equal row counts; each part's results go out as its GPU produces them (the
//! queries of different parts interleave), with positions shifted back to the whole input's.

use std::ops::Range;
use std::sync::Arc;

use super::GpuBackend;
use super::join::SelfJoinParts;
use crate::backend::{Backend, DeviceRun, JoinRequest, KnnRequest, ResultSink, RunStats, join_rows, knn_rows};
use crate::gpu::GpuDevice;
use datafusion::common::{DataFusionError, Result};

/// kNN work (queries × base rows × dimensions) below which the first GPU runs it alone: two
/// H200s took longer than one for 100k queries over 1M × 128 (1.3·10¹³) and 1.27× less time over
/// 4M × 128 (5.1·10¹³).
const KNN_SPLIT_WORK: f64 = 3e13;

/// The GPUs of a run.
#[derive(Debug)]
pub struct MultiGpuBackend {
    gpus: Vec<GpuBackend>,
    /// The GPUs were named: divide every run among them.
    named: bool,
}

impl MultiGpuBackend {
    /// A backend over `devices` (at least one), each run using at most `memory_limit` bytes of
    /// each (0: all that is available); `named` when the user listed them.
    pub fn new(devices: Vec<Arc<GpuDevice>>, memory_limit: usize, named: bool) -> Self {
        Self { gpus: devices.into_iter().map(|d| GpuBackend::new(d, memory_limit)).collect(), named }
    }

    /// Runs `part(gpu, rows)` for one contiguous part of `0..rows` per GPU, in parallel, and adds
    /// up their statistics; the first error wins.
    fn split(
        &self,
        rows: usize,
        part: impl Fn(&GpuBackend, Range<usize>) -> Result<RunStats> + Sync,
    ) -> Result<RunStats> {
        let parts = self.gpus.len().min(rows.max(1));
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
            let handles: Vec<_> = self.gpus[..parts]
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
        let first = self.gpus[0].name();
        match self.gpus.len() {
            1 => first,
            n => format!("{n} × {first}"),
        }
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        if request.self_join.is_some() && self.gpus.len() > 1 {
            let mut parts = true;
            for gpu in &self.gpus {
                parts &= gpu.takes_self_join_parts(request)?;
            }
            if parts {
                let shared = SelfJoinParts::new(request, self.gpus.len());
                return self.on_each(self.gpus.len(), |i, gpu| gpu.self_join_part(request, sink, &shared, i));
            }
        }
        if request.self_join.is_some() || self.gpus.len() == 1 {
            return self.gpus[0].join(request, sink);
        }
        self.split(request.left.len(), |gpu, rows| join_rows(gpu, request, rows, sink))
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let work = request.queries.len() as f64 * request.base.len() as f64 * request.base.dim as f64;
        if self.gpus.len() == 1 || (work < KNN_SPLIT_WORK && !self.named) {
            return self.gpus[0].knn(request, sink);
        }
        self.split(request.queries.len(), |gpu, rows| knn_rows(gpu, request, rows, sink))
    }
}
