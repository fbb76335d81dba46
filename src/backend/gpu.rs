//! The GPU backend for ε-joins and range queries: the same strategy choice, grid and f32 filter
//! margins as the CPU backend, run by the kernels of kernels/sim_join.cu with a count pass and a
//! write pass, in batches sized so the pairs of one batch fit the device. Exact distances are the
//! f64 formulas of common.cuh, compiled without FMA contraction, so answers equal the CPU's.

use std::sync::Arc;
use std::time::Instant;

use datafusion::common::{DataFusionError, Result};

use super::cpu::{FilterLimit, gather, lower_corner, plan_join};
use super::exact::{ExactCheck, write_self_pairs};
use super::simd::FilterKind;
use super::{Backend, CpuBackend, JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::gpu::GpuDevice;
use crate::gpu::launch::{GridBuffers, JoinParams, PassBuffers, SideBuffers, join_pass, pinned_buffer};
use rayon::prelude::*;
use crate::index::{GridIndex, JoinStrategy};
use crate::op::{Metric, dot};
use crate::vectors::Vectors;

/// Most result pairs one write pass produces (16 bytes each: 512 MiB of device memory).
const MAX_BATCH_PAIRS: u64 = 1 << 25;
/// Most left rows one pass covers: brute_join's grid has one block row per 128 left rows, and a
/// grid dimension holds at most 65,535 blocks.
const MAX_PASS_ROWS: usize = 65_535 * 128;

/// ε-joins and range queries on a CUDA GPU.
#[derive(Debug)]
pub struct GpuBackend {
    device: Arc<GpuDevice>,
}

impl GpuBackend {
    /// The backend on the process's shared device.
    pub fn new(device: Arc<GpuDevice>) -> Self {
        Self { device }
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> String {
        format!("gpu({})", self.device.arch)
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        self.gpu_join(request, sink).map_err(|e| DataFusionError::Execution(format!("GPU join: {e}")))?
    }

    /// kNN runs on the CPU until the GPU kNN kernels land (`backend::choose` routes it there).
    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        CpuBackend.knn(request, sink)
    }
}

/// Host-side rows of one side in slot order, ready to upload.
struct HostSide {
    filter: Vec<f32>,
    exact: Vec<f64>,
    norms: Vec<f64>,
    filter_norms: Vec<f32>,
    order: Vec<u32>,
}

fn host_side(v: &Vectors, filter_coords: &[f64], order: Vec<u32>, origin: &[f64], metric: Metric) -> HostSide {
    let dim = v.dim;
    let mut filter = Vec::with_capacity(order.len() * dim);
    for &p in &order {
        let row = &filter_coords[p as usize * dim..(p as usize + 1) * dim];
        filter.extend(row.iter().zip(origin).map(|(x, o)| (x - o) as f32));
    }
    let exact = gather(v, &order);
    let norms = if metric == Metric::Cosine { order.iter().map(|&p| dot(v.row(p as usize), v.row(p as usize))).collect() } else { vec![0.0] };
    let filter_norms = if metric == Metric::InnerProduct {
        filter.chunks_exact(dim).map(|r| r.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt() as f32).collect()
    } else {
        vec![0.0]
    };
    HostSide { filter, exact, norms, filter_norms, order }
}

impl GpuBackend {
    fn upload(&self, side: &HostSide) -> Result<SideBuffers, String> {
        let s = &self.device.stream;
        let e = |e: cudarc::driver::DriverError| format!("copy to the GPU failed: {e}");
        Ok(SideBuffers {
            filter: s.clone_htod(&side.filter).map_err(e)?,
            exact: s.clone_htod(&side.exact).map_err(e)?,
            norms: s.clone_htod(&side.norms).map_err(e)?,
            filter_norms: s.clone_htod(&side.filter_norms).map_err(e)?,
            order: s.clone_htod(&side.order).map_err(e)?,
        })
    }

    fn gpu_join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<Result<RunStats>, String> {
        let start = Instant::now();
        let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
        let mut stats = RunStats { strategy: "brute_force", ..Default::default() };
        if left.is_empty() || right.is_empty() {
            return Ok(Ok(stats));
        }
        // Compile the module now (once per process) so NVRTC stays out of the probe time.
        self.device.function(crate::gpu::kernels::KernelModule::SimJoin, "grid_join")?;
        let dim = left.dim;
        let (left_filter, right_filter, strategy) = plan_join(request);

        // Slot orders (grid order, or input order for brute force) and the f32 filter.
        let inner_product = metric == Metric::InnerProduct;
        let origin = if inner_product { vec![0.0; dim] } else { lower_corner(&left_filter, &right_filter, dim) };
        let (left_index, right_index) = match &strategy {
            JoinStrategy::Grid(g) => {
                let l = GridIndex::build(g, &left_filter, dim);
                let r = if self_join.is_some() { None } else { Some(GridIndex::build(g, &right_filter, dim)) };
                (Some(l), r)
            }
            JoinStrategy::BruteForce => (None, None),
        };
        let identity = |n: usize| (0..n as u32).collect::<Vec<u32>>();
        let left_order = left_index.as_ref().map_or_else(|| identity(left.len()), |i| i.order.clone());
        let left_host = host_side(left, &left_filter, left_order, &origin, metric);
        let right_host = match self_join {
            Some(_) => None,
            None => {
                let order = right_index.as_ref().map_or_else(|| identity(right.len()), |i| i.order.clone());
                Some(host_side(right, &right_filter, order, &origin, metric))
            }
        };
        let extent = left_host
            .filter
            .iter()
            .chain(right_host.iter().flat_map(|h| h.filter.iter()))
            .fold(0f64, |m, v| m.max(v.abs() as f64));
        let mut params = JoinParams {
            dim: dim as u32,
            metric: Metric::ALL.iter().position(|m| *m == metric).unwrap_or(0) as u32,
            self_join: self_join.is_some().into(),
            threshold,
            ..Default::default()
        };
        if inner_product {
            params.filter = 3;
            params.limit = round_up(threshold);
            params.dot_margin = (dim as f32 + 16.0) / (1u32 << 23) as f32;
            params.dot_floor = (dim as f32 + 16.0) * 2f32.powi(-140);
        } else {
            let limit = FilterLimit::new(metric, threshold, dim, extent);
            params.filter = match limit.kind {
                FilterKind::SquaredL2 => 0,
                FilterKind::L1 => 1,
                FilterKind::LInf => 2,
            };
            params.limit = limit.limit;
        }

        let uploading = Instant::now();
        let left_buffers = self.upload(&left_host)?;
        let right_buffers = match &right_host {
            Some(h) => Some(self.upload(h)?),
            None => None,
        };
        let right_buffers_ref = right_buffers.as_ref().unwrap_or(&left_buffers);
        let right_len = right_host.as_ref().map_or(left_host.order.len(), |h| h.order.len()) as u32;
        let stream = &self.device.stream;
        let copy = |e: cudarc::driver::DriverError| format!("GPU copy failed: {e}");
        let grid = match (&strategy, &left_index) {
            (JoinStrategy::Grid(g), Some(li)) => {
                stats.strategy = "grid";
                stats.indexed_dims = g.dims.len();
                let ri = right_index.as_ref().unwrap_or(li);
                let mut slot_cell = vec![0u64; li.order.len()];
                for c in 0..li.num_cells() {
                    slot_cell[li.slots(c)].fill(li.cell_ids[c]);
                }
                let starts: Vec<u32> = ri.cell_start.iter().map(|&s| s as u32).collect();
                let table = ri.dense_table().map_or_else(|| vec![u32::MAX], |t| t.to_vec());
                params.k = g.dims.len() as u32;
                params.dense = ri.dense_table().is_some().into();
                params.right_cells = ri.num_cells() as u32;
                for j in 0..g.dims.len() {
                    params.cells[j] = g.cells[j];
                    params.strides[j] = g.strides[j];
                }
                Some(GridBuffers {
                    left_slot_cell: stream.clone_htod(&slot_cell).map_err(copy)?,
                    right_cell_ids: stream.clone_htod(&ri.cell_ids).map_err(copy)?,
                    right_cell_start: stream.clone_htod(&starts).map_err(copy)?,
                    cell_table: stream.clone_htod(&table).map_err(copy)?,
                })
            }
            _ => None,
        };
        stats.transfer_time += uploading.elapsed();
        stats.build_time = start.elapsed();

        // Count pass over every left slot, then write passes in batches of at most
        // MAX_BATCH_PAIRS pairs (a single slot with more gets a batch of its own).
        let probe = Instant::now();
        let n_left = left_host.order.len();
        let alloc = |e: cudarc::driver::DriverError| format!("GPU allocation failed: {e}");
        let mut pass = PassBuffers {
            counts: stream.alloc_zeros::<u32>(n_left.clamp(1, MAX_PASS_ROWS)).map_err(alloc)?,
            offsets: stream.alloc_zeros::<u64>(1).map_err(alloc)?,
            out_left: stream.alloc_zeros::<u32>(1).map_err(alloc)?,
            out_right: stream.alloc_zeros::<u32>(1).map_err(alloc)?,
            out_distance: stream.alloc_zeros::<f64>(1).map_err(alloc)?,
        };
        let mut counts: Vec<u32> = Vec::with_capacity(n_left);
        for begin in (0..n_left).step_by(MAX_PASS_ROWS) {
            let end = (begin + MAX_PASS_ROWS).min(n_left);
            stream.memset_zeros(&mut pass.counts).map_err(copy)?;
            let counting = Instant::now();
            join_pass(&self.device, &params, begin as u32..end as u32, right_len, &left_buffers, right_buffers_ref, grid.as_ref(), &mut pass, false)?;
            stats.kernel_time += counting.elapsed();
            let downloading = Instant::now();
            counts.extend(stream.clone_dtoh(&pass.counts.slice(0..end - begin)).map_err(copy)?);
            stats.transfer_time += downloading.elapsed();
        }
        let mut batches = Vec::new();
        let (mut begin, mut total) = (0usize, 0u64);
        for (slot, &c) in counts.iter().enumerate().take(n_left) {
            if (total + c as u64 > MAX_BATCH_PAIRS || slot - begin == MAX_PASS_ROWS) && slot > begin {
                batches.push((begin, slot, total));
                begin = slot;
                total = 0;
            }
            total += c as u64;
        }
        batches.push((begin, n_left, total));
        let capacity = batches.iter().map(|b| b.2).max().unwrap_or(0).max(1) as usize;
        pass.out_left = stream.alloc_zeros::<u32>(capacity).map_err(alloc)?;
        pass.out_right = stream.alloc_zeros::<u32>(capacity).map_err(alloc)?;
        pass.out_distance = stream.alloc_zeros::<f64>(capacity).map_err(alloc)?;
        let mut host_left = pinned_buffer::<u32>(&self.device, capacity)?;
        let mut host_right = pinned_buffer::<u32>(&self.device, capacity)?;
        let mut host_distance = pinned_buffer::<f64>(&self.device, capacity)?;
        sink.start(batches.len() as u64);

        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        let exact = ExactCheck::new(metric, threshold, left, right);
        let (mut transfer, mut kernel, mut emit) = Default::default();
        let outcome = (|| -> Result<()> {
            for &(begin, end, total) in &batches {
                if total > 0 {
                    let mut offsets = Vec::with_capacity(end - begin);
                    let mut at = 0u64;
                    for &c in &counts[begin..end] {
                        offsets.push(at);
                        at += c as u64;
                    }
                    let copying = Instant::now();
                    pass.offsets = stream.clone_htod(&offsets).map_err(|e| DataFusionError::Execution(copy(e)))?;
                    transfer += copying.elapsed();
                    let writing = Instant::now();
                    join_pass(&self.device, &params, begin as u32..end as u32, right_len, &left_buffers, right_buffers_ref, grid.as_ref(), &mut pass, true)
                        .map_err(DataFusionError::Execution)?;
                    kernel += writing.elapsed();
                    let copying = Instant::now();
                    let n = total as usize;
                    let d2h = |e: cudarc::driver::DriverError| DataFusionError::Execution(copy(e));
                    stream.memcpy_dtoh(&pass.out_left.slice(0..n), &mut host_left).map_err(d2h)?;
                    stream.memcpy_dtoh(&pass.out_right.slice(0..n), &mut host_right).map_err(d2h)?;
                    stream.memcpy_dtoh(&pass.out_distance.slice(0..n), &mut host_distance).map_err(d2h)?;
                    stream.synchronize().map_err(d2h)?;
                    transfer += copying.elapsed();
                    let emitting = Instant::now();
                    let pinned = |e: cudarc::driver::DriverError| DataFusionError::Execution(format!("pinned buffer: {e}"));
                    let (lefts, rights, distances) = (
                        &host_left.as_slice().map_err(pinned)?[..n],
                        &host_right.as_slice().map_err(pinned)?[..n],
                        &host_distance.as_slice().map_err(pinned)?[..n],
                    );
                    // Chunks on every core: each builds and sends its own result chunks.
                    let piece = (1 << 16).max(n.div_ceil(rayon::current_num_threads() * 4));
                    (0..n.div_ceil(piece)).into_par_iter().try_for_each(|p| -> Result<()> {
                        let range = p * piece..((p + 1) * piece).min(n);
                        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
                        for i in range {
                            let (a, b, d) = (lefts[i], rights[i], distances[i]);
                            // Self-joins report the smaller position first (the mirror adds (b, a)).
                            let (a, b) = if self_join.is_some() && a > b { (b, a) } else { (a, b) };
                            writer.push(a, b, d)?;
                        }
                        writer.flush()
                    })?;
                    emit += emitting.elapsed();
                }
                sink.advance(1);
            }
            if self_join.is_some_and(|s| s.include_self) {
                write_self_pairs(&exact, left, 0..left.len(), &mut writer)?;
            }
            writer.flush()
        })();
        stats.probe_time = probe.elapsed();
        stats.transfer_time += transfer;
        stats.kernel_time += kernel;
        stats.emit_time += emit;
        Ok(outcome.map(|()| stats))
    }
}

/// `x` as f32, rounded up.
fn round_up(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x { f.next_up() } else { f }
}
