//! The device buffers of a join: each side's rows, the grid, and what a pass writes.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::Result;
use super::device::GpuDevice;
use super::memory::zeroed;

/// The rows of one join side on the device, in slot order.
#[derive(Debug)]
pub struct SideBuffers {
    /// f32 filter-space rows.
    pub filter: CudaSlice<f32>,
    /// brute_join_tc's rows: `filter` scaled and rounded to f16 ([`pack_half_rows`]); `None`
    /// where the tensor cores do not filter.
    pub half_rows: Option<CudaSlice<u32>>,
    /// brute_join_tc_bytes's rows where every value is an integer within one window of 256
    /// ([`byte_rows`]); `None` elsewhere.
    pub byte_rows: Option<ByteRows>,
    /// f64 exact rows (shared with the device's resident rows when kept across queries).
    pub exact: Arc<CudaSlice<f64>>,
    /// Cosine: Σx² per row (else one unused value).
    pub norms: CudaSlice<f64>,
    /// Dot-product filters (inner product, GEMM form): ‖x̃‖ per row (else one unused value).
    pub filter_norms: CudaSlice<f32>,
    /// GEMM form: ‖x̃‖² per row (else one unused value).
    pub filter_sq_norms: CudaSlice<f32>,
    /// Slot → vector position.
    pub order: CudaSlice<u32>,
    /// Whether the exact rows were on the device before this run (kept from an earlier query).
    pub resident: bool,
}

impl SideBuffers {
    /// Device bytes of the side's buffers but its exact rows (which may be shared).
    pub fn own_bytes(&self) -> usize {
        let byte_words = self.byte_rows.as_ref().map_or(0, |b| b.rows.len() + b.sq_norms.len());
        4 * (self.filter.len()
            + self.half_rows.as_ref().map_or(0, |h| h.len())
            + byte_words
            + self.filter_norms.len()
            + self.filter_sq_norms.len()
            + self.order.len())
            + 8 * self.norms.len()
    }
}

/// A side's rows for brute_join_tc_bytes (pack_byte_rows in kernels/pack_rows.cuh): each value
/// minus `offset`, a byte, four to a word ([`byte_row_words`] a row), and each row's sum of
/// squares of those bytes.
#[derive(Debug)]
pub struct ByteRows {
    pub rows: CudaSlice<u32>,
    pub sq_norms: CudaSlice<u32>,
    /// 0 for values in [0, 255], −128 for values in [−128, 127]: both sides of a pass need the same.
    pub offset: i32,
}

/// The grid of a join on the device.
#[derive(Debug)]
pub struct GridBuffers {
    /// Linear cell id of each left slot.
    pub left_slot_cell: CudaSlice<u64>,
    /// Non-empty right cell ids, ascending.
    pub right_cell_ids: CudaSlice<u64>,
    /// First right slot of each cell, plus the end.
    pub right_cell_start: CudaSlice<u32>,
    /// Linear id → right cell (dense grids; else one unused value).
    pub cell_table: CudaSlice<u32>,
    /// Each left slot's key on the sort dimension (sortidu).
    pub left_sort_keys: CudaSlice<f64>,
    /// Each right slot's key on the sort dimension, ascending within each cell.
    pub right_sort_keys: CudaSlice<f64>,
}

/// The quantile directory of a join on the device (`index::directory`), its slots in leaf order.
#[derive(Debug)]
pub struct DirectoryBuffers {
    /// Each left block's bounding box (DIRECTORY_BLOCK slots), `dim` values a block.
    pub block_lo: CudaSlice<f64>,
    pub block_hi: CudaSlice<f64>,
    /// Each right node's bounding box (level 1 first, the leaves last), `dim` values a node.
    pub node_lo: CudaSlice<f64>,
    pub node_hi: CudaSlice<f64>,
    /// First right slot of each leaf, plus the end.
    pub leaf_start: CudaSlice<u32>,
}

/// What a pass of a join reads: both sides, and the grid (`None`: brute force over all
/// `right_len` right rows).
#[derive(Debug, Clone, Copy)]
pub struct JoinInputs<'a> {
    /// The left side's rows, in slot order.
    pub left: &'a SideBuffers,
    /// The right side's rows (the left side's for a self-join).
    pub right: &'a SideBuffers,
    /// Right rows.
    pub right_len: u32,
    /// The grid over the right side, or `None` for brute force.
    pub grid: Option<&'a GridBuffers>,
    /// The directory over the right side (in the grid's place).
    pub directory: Option<&'a DirectoryBuffers>,
    /// The share of the pass's (left, right) pairs expected to pass the filter, where known (kNN,
    /// from its radii), else 0: sizes brute_join_tc's runs and queue ([`tc_run`]).
    pub expected_share: f64,
}

/// Where a pass puts its results.
#[derive(Debug)]
pub struct PassBuffers {
    /// Count pass: result pairs per left slot of the batch.
    pub counts: CudaSlice<u32>,
    /// Write pass: first output index of each left slot of the batch (brute_join advances these
    /// as cursors, so they are uploaded again before each write pass).
    pub offsets: CudaSlice<u64>,
    /// Collecting count pass and write pass: left vector positions.
    pub out_left: CudaSlice<u32>,
    /// Collecting count pass and write pass: right vector positions.
    pub out_right: CudaSlice<u32>,
    /// Collecting count pass and write pass: exact distances.
    pub out_distance: CudaSlice<f64>,
    /// Collecting count pass: the pairs found so far (stored or not), one value.
    pub collected: CudaSlice<u64>,
    /// brute_join with `per_row`: each left slot's exact threshold (else one unused value).
    pub row_threshold: CudaSlice<f64>,
    /// brute_join with `per_row`: each left slot's f32 filter limit (else one unused value).
    pub row_limit: CudaSlice<f32>,
}

impl PassBuffers {
    /// Buffers for passes over at most `slots` left slots, with `row_values` per-row thresholds
    /// and limits (0 without `per_row`); the outputs start empty and are sized after the count.
    pub fn new(device: &GpuDevice, slots: usize, row_values: usize) -> Result<Self> {
        let s = &device.stream;
        Ok(Self {
            counts: zeroed::<u32>(s, slots.max(1))?,
            offsets: zeroed::<u64>(s, 1)?,
            out_left: zeroed::<u32>(s, 1)?,
            out_right: zeroed::<u32>(s, 1)?,
            out_distance: zeroed::<f64>(s, 1)?,
            collected: zeroed::<u64>(s, 1)?,
            row_threshold: zeroed::<f64>(s, row_values.max(1))?,
            row_limit: zeroed::<f32>(s, row_values.max(1))?,
        })
    }

    /// Output buffers for `pairs` pairs (what a collecting count pass may store, or the largest
    /// write batch's count).
    pub fn size_outputs(&mut self, device: &GpuDevice, pairs: usize) -> Result<()> {
        let s = &device.stream;
        self.out_left = zeroed::<u32>(s, pairs.max(1))?;
        self.out_right = zeroed::<u32>(s, pairs.max(1))?;
        self.out_distance = zeroed::<f64>(s, pairs.max(1))?;
        Ok(())
    }
}

/// Device buffers for the k nearest of each list of a kNN write pass (`start_rank_lists` in src/cuda/launch/rank.rs).
#[derive(Debug)]
pub struct RankedLists {
    /// Exact distances, k a list, nearest first.
    pub distance: CudaSlice<f64>,
    /// Base positions, as `distance`.
    pub position: CudaSlice<u32>,
}

impl RankedLists {
    /// Buffers for `neighbours` (lists · k) ranked neighbours.
    pub fn new(device: &GpuDevice, neighbours: usize) -> Result<Self> {
        Ok(Self {
            distance: zeroed::<f64>(&device.stream, neighbours.max(1))?,
            position: zeroed::<u32>(&device.stream, neighbours.max(1))?,
        })
    }
}
