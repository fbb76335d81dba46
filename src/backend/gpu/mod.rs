//! The GPU backend: ε-joins and range queries with the same strategy choice, grid and f32 filter
//! margins as the CPU backend, run by the kernels of kernels/grid_join.cu, brute_join.cu and tc_join.cu with a count pass that
//! collects the pairs and, when they do not fit, write passes in batches sized so the pairs of one
//! batch fit the device; kNN as a range query with a sampled radius per query (kernels/knn.cu).
//! Exact distances are the f64 formulas of common.cuh, compiled without FMA contraction, so
//! answers equal the CPU's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use datafusion::common::{DataFusionError, Result, resources_err};

use crate::backend::plan::tiles;
use crate::backend::{Backend, JoinRequest, KnnRequest, ResultSink, RunStats};
use crate::cuda::error::format_size;
use crate::cuda::memory::available_memory;
use crate::cuda::{Error as GpuError, GpuDevice};
use crate::index::curves::CURVES;
use crate::op::IndexChoice;

mod appended;
mod approx;
mod approx_build;
mod batches;
mod bits;
mod directory;
mod divided;
mod filter;
mod join;
mod knn;
mod knn_plan;
mod knn_write;
mod list_of_clusters;
mod multi;
mod sides;
mod text;

pub use approx::graph_built_on_device;
pub use approx_build::build_on_device;
pub use multi::MultiGpuBackend;
pub(crate) use multi::open_devices;

use crate::backend::gpu::divided::JoinParts;

/// Most result pairs one write pass produces (16 bytes each: 512 MiB of device memory).
const MAX_BATCH_PAIRS: u64 = 1 << 25;
/// Most left rows one pass covers (its counts and offsets hold one value per left row).
const MAX_PASS_ROWS: usize = 65_535 * 128;

/// ε-joins and range queries on a CUDA GPU.
#[derive(Debug, Clone)]
pub struct GpuBackend {
    device: Arc<GpuDevice>,
    /// Bytes of device memory a run may use (0: all that is available).
    memory_limit: usize,
}

impl GpuBackend {
    /// The backend on the process's shared device, using at most `memory_limit` bytes of its
    /// memory (0: all that is available).
    pub fn new(device: Arc<GpuDevice>, memory_limit: usize) -> Self {
        Self { device, memory_limit }
    }

    /// Its device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// Device memory this run may use: what is free (with what the memory pool keeps for reuse),
    /// within the limit.
    fn memory_budget(&self) -> Result<usize> {
        let available = available_memory(&self.device).map_err(|e| gpu_error("GPU", e))?;
        Ok(if self.memory_limit > 0 { available.min(self.memory_limit) } else { available })
    }
}

/// Device bytes per input row at most, on either side: its f32 filter row, f16 row (tensor
/// cores) and f64 exact row (14 bytes a dimension, and up to 14 of the f16 row's padding), and 64
/// for its position, norms, per-row pass buffers (counts, offsets, radii) and grid cell. When both sides take more than half of the memory budget, the inputs
/// run as tiles of a quarter of it each; the other half holds the result buffers (a quarter for
/// the pairs a pass collects or writes, [`output_pairs`]) and the grid.
fn device_row_bytes(dim: usize) -> usize {
    14 * dim + 78
}

impl GpuBackend {
    /// Whether `request`'s inputs fit its memory budget whole (else they run as tiles).
    fn fits(request: &JoinRequest, budget: usize) -> bool {
        let rows = request.left.len() + if request.self_join.is_some() { 0 } else { request.right.len() };
        rows.saturating_mul(device_row_bytes(request.left.dim)) <= budget / 2
    }

    /// Whether a kNN of `queries` over `base` rows of `dim` dimensions fits `budget` whole (else
    /// it runs as tiles).
    fn knn_fits_budget(base: usize, queries: usize, dim: usize, budget: usize) -> bool {
        (base + queries).saturating_mul(device_row_bytes(dim)) <= budget / 2
    }

    /// Whether a kNN of `queries` over `base` rows of `dim` dimensions fits this GPU's memory
    /// budget whole.
    pub fn knn_fits(&self, base: usize, queries: usize, dim: usize) -> Result<bool> {
        Ok(Self::knn_fits_budget(base, queries, dim, self.memory_budget()?))
    }

    /// Whether a join of vectors can run here as parts of its left slots: its inputs fit the
    /// device whole (a divided join's GPUs each hold all of them).
    pub fn takes_join_parts(&self, request: &JoinRequest) -> Result<bool> {
        Ok(request.metric.is_vector()
            && request.index != IndexChoice::ListOfClusters
            && Self::fits(request, self.memory_budget()?))
    }

    /// A join's `i`-th of `shared.parts` ranges of left slots (`join::part_slots`) on this GPU
    /// (where [`GpuBackend::takes_join_parts`]).
    /// Returns the run's statistics and the left slots the part took.
    pub fn join_part<'a>(
        &self,
        request: &JoinRequest<'a>,
        sink: &dyn ResultSink,
        shared: &JoinParts<'a>,
        i: usize,
    ) -> Result<(RunStats, usize)> {
        let budget = self.memory_budget()?;
        let mut stats =
            self.gpu_join(request, sink, budget, Some((i, shared))).map_err(|e| e.in_context("GPU join"))?;
        let rows = stats.devices.pop().map_or(0, |d| d.rows);
        Ok((stats, rows))
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> String {
        match self.memory_limit {
            0 => format!("gpu({})", self.device.arch),
            limit => format!("gpu({}, memory_limit={})", self.device.arch, format_size(limit)),
        }
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let budget = self.memory_budget()?;
        if request.index == IndexChoice::ListOfClusters
            && crate::backend::cpu::list_of_clusters::usable(request.left, request.right)
        {
            return self.gpu_clusters_join(request, sink, budget).map_err(|e| e.in_context("GPU List of Clusters"));
        }
        if request.metric.is_text() {
            return self.gpu_text_join(request, sink, budget).map_err(|e| e.in_context("GPU text join"));
        }
        if request.metric.is_set_or_bits() {
            return self.gpu_bits_join(request, sink, budget).map_err(|e| e.in_context("GPU bit-string join"));
        }
        let run = |tile: &JoinRequest, sink: &dyn ResultSink| {
            self.gpu_join(tile, sink, budget, None).map_err(|e| e.in_context("GPU join"))
        };
        if Self::fits(request, budget) {
            return run(request, sink);
        }
        tiles::tiled_join(request, sink, tile_rows(budget, request.left.dim, self.memory_limit, "GPU join")?, run)
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let budget = self.memory_budget()?;
        if request.metric.is_text() {
            return self.gpu_text_knn(request, sink, budget).map_err(|e| e.in_context("GPU text kNN"));
        }
        if request.metric.is_set_or_bits() {
            return self.gpu_bits_knn(request, sink, budget).map_err(|e| e.in_context("GPU Hamming kNN"));
        }
        if let Some(approx) = request.approx {
            if let Some(target) = approx.recall {
                let (queries, base) = (request.queries.len(), request.base.len());
                let exact_ns = crate::costs::exact_knn_gpu_ns(queries, base, request.base.dim);
                let run = |request: &KnnRequest, sink: &dyn ResultSink| self.knn(request, sink);
                return crate::backend::plan::recall::knn_to_recall(
                    request, approx, target, "gpu", exact_ns, &run, sink,
                );
            }
            let run = |tile: &KnnRequest, sink: &dyn ResultSink| {
                self.gpu_approx_knn(tile, approx, sink, budget).map_err(|e| e.in_context("GPU approximate kNN"))
            };
            // The index takes half of the budget at most, the queries' tiles a quarter; a larger
            // base is searched in parts, each with an index of its own, their lists merged.
            let base_rows = (budget / 2 / approx::index_row_bytes(request.base.dim, CURVES)).max(MIN_TILE_ROWS);
            if request.base.len() <= base_rows {
                return run(request, sink);
            }
            return tiles::tiled_knn(request, sink, request.queries.len(), base_rows, run);
        }
        let run = |tile: &KnnRequest, sink: &dyn ResultSink| {
            self.gpu_knn(tile, sink, budget).map_err(|e| e.in_context("GPU kNN"))
        };
        if Self::knn_fits_budget(request.base.len(), request.queries.len(), request.base.dim, budget) {
            return run(request, sink);
        }
        let tile_rows = tile_rows(budget, request.base.dim, self.memory_limit, "GPU kNN")?;
        tiles::tiled_knn(request, sink, tile_rows, tile_rows, run)
    }
}

/// Fewest rows per tile a run accepts: smaller tiles would turn a join into more tile pairs (each a
/// join with its own uploads and launches) than any result is worth waiting for.
const MIN_TILE_ROWS: usize = 256;

/// Rows of `dim` dimensions per input tile within `budget` (a quarter of it per tile), or the
/// error that names the limit (`memory_limit`, 0: none) when that is fewer than MIN_TILE_ROWS.
fn tile_rows(budget: usize, dim: usize, memory_limit: usize, what: &str) -> Result<usize> {
    let row_bytes = device_row_bytes(dim);
    let rows = budget / 4 / row_bytes;
    if rows >= MIN_TILE_ROWS {
        return Ok(rows);
    }
    let needed = format_size((MIN_TILE_ROWS * row_bytes * 4).next_multiple_of(1 << 10));
    match memory_limit {
        0 => resources_err!(
            "{what}: the device has {budget} bytes available, room for {rows} rows of {dim} dimensions per input tile; at least {MIN_TILE_ROWS} need {needed}"
        ),
        limit => resources_err!(
            "{what}: option gpu_memory_limit={} leaves room for {rows} rows of {dim} dimensions per input tile ({row_bytes} bytes a row, a quarter of the limit per tile); at least {MIN_TILE_ROWS} rows need gpu_memory_limit={needed}",
            format_size(limit)
        ),
    }
}

/// Most result pairs (16 bytes each on the device) one pass may collect or write: a quarter of
/// the memory budget (write passes: at most MAX_BATCH_PAIRS of them).
fn output_pairs(budget: usize) -> u64 {
    (budget / 4 / 16).max(1) as u64
}

/// Why a GPU run stopped: the two kinds its phases return through one `?`.
///
/// `Gpu` is the device's failure (memory exhausted, a launch, copy or driver error). `Query` is
/// the query's own: met while the results are sent (the consumer went away, the query was
/// cancelled, a batch could not be built), or a request the device cannot take (an approximate
/// search's candidates beyond a block's shared memory). Either ends a `device=gpu` run with its
/// message. Under `device=auto` a run that failed before sending a row runs again on the cores
/// (`Scheduled::run` in backend/auto/mod.rs, counted in `gpu_fallbacks`): there a device failure or a
/// request the device could not take succeeds, and a query's own error recurs.
#[derive(Debug)]
pub(super) enum RunError {
    Gpu(GpuError),
    Query(DataFusionError),
}

pub(super) type RunResult<T> = std::result::Result<T, RunError>;

impl From<GpuError> for RunError {
    fn from(e: GpuError) -> Self {
        RunError::Gpu(e)
    }
}

impl From<DataFusionError> for RunError {
    fn from(e: DataFusionError) -> Self {
        RunError::Query(e)
    }
}

impl RunError {
    /// The DataFusion error the backend returns: a device failure named by `context`
    /// ([`gpu_error`]), a query's error as it was.
    fn in_context(self, context: &str) -> DataFusionError {
        match self {
            RunError::Gpu(e) => gpu_error(context, e),
            RunError::Query(e) => e,
        }
    }
}

/// A failed copy between the host and the device, or a failed wait for one.
pub(super) fn copy_failed(e: cudarc::driver::DriverError) -> GpuError {
    GpuError::Device(format!("GPU copy failed: {e}"))
}

/// The one place a GPU error becomes a DataFusion error: device memory exhausted is a resources
/// error that names the size asked for and the option that bounds a run's memory; the rest are
/// execution errors.
pub(super) fn gpu_error(context: &str, e: GpuError) -> DataFusionError {
    match e {
        GpuError::OutOfMemory { .. } => DataFusionError::ResourcesExhausted(format!(
            "{context}: {e}; set simjoin.gpu_memory_limit below the free device memory to run the inputs as tiles"
        )),
        other => DataFusionError::Execution(format!("{context}: {other}")),
    }
}

/// Waits for the write pass queued on `stream` (its kernel between `events`, then its copy to the
/// host): the time waited, and the kernel's own time.
pub(super) fn finish_queued(
    stream: &CudaStream,
    events: &[CudaEvent; 2],
) -> Result<(Duration, Duration), cudarc::driver::DriverError> {
    let waiting = Instant::now();
    stream.synchronize()?;
    let waited = waiting.elapsed();
    let [started, written] = events;
    Ok((waited, Duration::from_secs_f32(started.elapsed_ms(written)? / 1e3)))
}

#[cfg(test)]
mod tests {
    use super::tile_rows;

    #[test]
    fn tiles_below_the_minimum_are_an_error_that_names_the_limit() {
        // 2-D rows take 106 bytes: 415K gives tiles of 1,002 rows (the selftest's case).
        assert_eq!(tile_rows(415 << 10, 2, 415 << 10, "GPU join").unwrap(), 1002);
        let err = tile_rows(64 << 10, 2, 64 << 10, "GPU join").unwrap_err().strip_backtrace();
        assert_eq!(
            err,
            "Resources exhausted: GPU join: option gpu_memory_limit=64K leaves room for 154 rows of 2 dimensions per input tile \
             (106 bytes a row, a quarter of the limit per tile); at least 256 rows need gpu_memory_limit=106K"
        );
        let err = tile_rows(1000, 128, 0, "GPU kNN").unwrap_err().strip_backtrace();
        assert!(
            err.contains("GPU kNN: the device has 1000 bytes available, room for 0 rows of 128 dimensions"),
            "{err}"
        );
    }
}
