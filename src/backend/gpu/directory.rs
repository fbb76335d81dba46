//! The quantile directory of a join on the device (`index=directory`; Böhm, Noll, Plant and
//! Zherdin, "Index-supported Similarity Join on Graphics Processors", §5): built on the host, as
//! in the paper, whose fractionated sorting (a parallel sort per level over n points) costs a few
//! hundredths of the join at a million points, and whose boxes and leaf starts are a few
//! megabytes to copy; the join itself runs in kernels/directory_join.cu.

use cudarc::driver::CudaSlice;
use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use crate::backend::gpu::{GpuBackend, copy_failed};
use crate::backend::plan::FilterSpaces;
use crate::backend::{JoinRequest, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::DirectoryBuffers;
use crate::cuda::launch::GRID_WORK_SAMPLE;
use crate::index::{DIRECTORY_BLOCK, DirectoryShape, JoinDirectories};

/// The directory's buffers and, for a join divided among GPUs, the estimated work of every
/// GRID_WORK_SAMPLE-th left slot (the right slots its block's walk visits, for `part_slots`).
pub(super) type DeviceDirectory = (DirectoryBuffers, Vec<u32>);

impl GpuBackend {
    /// Builds the directories of `request`'s sides over their filter spaces (the right side's of
    /// `shape`, the left's of its own size), sets the launch parameters, and uploads the boxes
    /// and leaf starts; returns them with the orders that put each side in leaf order on the device
    /// (the right's `None` for a self-join).
    pub(super) fn device_directory(
        &self,
        shape: &DirectoryShape,
        request: &JoinRequest,
        spaces: &FilterSpaces,
        params: &mut JoinParams,
        stats: &mut RunStats,
        divided: bool,
    ) -> Result<(DeviceDirectory, CudaSlice<u32>, Option<CudaSlice<u32>>), GpuError> {
        let same = request.self_join.is_some();
        let dirs = JoinDirectories::build(shape, spaces.left(), spaces.right(), request.left.dim, same);
        let (left_dir, right) = (dirs.left(), &dirs.right);
        // A join divided among several GPUs walks each block on the host as well: the right slots
        // its pages hold are the work that divides the blocks, and the pages it visits go to
        // EXPLAIN ANALYZE. Not otherwise: at 16 dimensions the walks of 10⁶ rows took about as
        // long on 16 cores as the kernel's whole join.
        let blocks = if divided { dirs.blocks() } else { 0 };
        let walks: Vec<(u64, u64)> = (0..blocks)
            .into_par_iter()
            .map(|b| {
                let (mut pages, mut slots) = (0u64, 0u64);
                let from = if same { b * DIRECTORY_BLOCK + 1 } else { 0 };
                let (lo, hi) = dirs.block_box(b);
                right.visit(lo, hi, from, |l| {
                    pages += 1;
                    slots += (right.leaf_start[l + 1] - right.leaf_start[l]) as u64;
                });
                (pages, slots)
            })
            .collect();
        stats.pages_visited = walks.iter().map(|w| w.0).sum();
        stats.directory = Some((shape.levels, shape.fanout));
        let work = match divided {
            true => (0..left_dir.order.len())
                .step_by(GRID_WORK_SAMPLE)
                .map(|s| walks[s / DIRECTORY_BLOCK].1.min(u32::MAX as u64) as u32)
                .collect(),
            false => Vec::new(),
        };
        params.levels = shape.levels as u32;
        params.fanout = shape.fanout as u32;
        params.box_radius = shape.box_radius();
        let stream = &self.device.stream;
        let leaf_start: Vec<u32> = right.leaf_start.iter().map(|&s| s as u32).collect();
        let buffers = DirectoryBuffers {
            block_lo: stream.clone_htod(&dirs.block_lo).map_err(copy_failed)?,
            block_hi: stream.clone_htod(&dirs.block_hi).map_err(copy_failed)?,
            node_lo: stream.clone_htod(&right.lo).map_err(copy_failed)?,
            node_hi: stream.clone_htod(&right.hi).map_err(copy_failed)?,
            leaf_start: stream.clone_htod(&leaf_start).map_err(copy_failed)?,
        };
        let left_order = stream.clone_htod(&left_dir.order).map_err(copy_failed)?;
        let right_order = if same { None } else { Some(stream.clone_htod(&right.order).map_err(copy_failed)?) };
        Ok(((buffers, work), left_order, right_order))
    }
}
