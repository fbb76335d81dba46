//! The parameters the join kernels read: `struct JoinParams` of kernels/common.cuh, mirrored field
//! for field.

use cudarc::driver::DeviceRepr;

/// The launch parameters of the join kernels: `struct JoinParams` of kernels/common.cuh, field
/// for field (same order, sizes and padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct JoinParams {
    pub dim: u32,
    pub metric: u32,
    pub filter: u32,
    pub self_join: u32,
    pub limit: f32,
    pub dot_margin: f32,
    pub dot_floor: f32,
    pub per_row: u32,
    pub threshold: f64,
    pub k: u32,
    pub dense: u32,
    pub right_cells: u32,
    /// Brute force: 1 launches brute_join_tc (f16 tensor cores, the dot-product filters only).
    pub tensor_cores: u32,
    /// Brute-force count pass: store each left slot's pairs in a slot of this many (kNN); 0: no.
    pub slot_capacity: u32,
    /// Grid: 1 scans only the ±`window` range of the sort dimension in each cell (sortidu).
    pub windowed: u32,
    /// brute_join_tc: 2^a, the power of two both sides' f16 rows are scaled by ([`pack_half_rows`]).
    pub tc_scale: f32,
    /// brute_join_tc: the scaled score's error per unit of a scaled norm from f16's subnormal range.
    pub tc_eta: f32,
    /// brute_join_tc: right tiles per block ([`tc_run`], set by the launch).
    pub tc_run: u32,
    /// brute_join_tc: pairs its queue holds ([`tc_queue`], set by the launch).
    pub tc_queue: u32,
    pub cells: [u64; 8],
    pub strides: [u64; 8],
    /// Grid, windowed: the half-width of that range.
    pub window: f64,
}

// SAFETY: `JoinParams` is `repr(C)` plain data laid out exactly as the CUDA struct it mirrors
// (kernels/common.cuh asserts the same size).
unsafe impl DeviceRepr for JoinParams {}
const _: () = assert!(std::mem::size_of::<JoinParams>() == 216, "JoinParams layout changed: update kernels/common.cuh");
