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
    /// Directory: levels below the root and the fanout of every inner node.
    pub levels: u32,
    pub fanout: u32,
    /// Directory: the coordinate bound widened by 2⁻²⁰ (`DirectoryShape::box_radius`).
    pub box_radius: f64,
}

// SAFETY: `JoinParams` is `repr(C)` plain data laid out exactly as the CUDA struct it mirrors
// (kernels/common.cuh asserts the same size).
unsafe impl DeviceRepr for JoinParams {}
const _: () = assert!(std::mem::size_of::<JoinParams>() == 232, "JoinParams layout changed: update kernels/common.cuh");

/// The distance a kernel computes exactly: `METRIC_*` of kernels/common.cuh.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricCode {
    L2 = 0,
    L2Squared = 1,
    Cosine = 2,
    InnerProduct = 3,
    L1 = 4,
    LInf = 5,
}

/// The f32 score a kernel filters with: `FILTER_*` of kernels/common.cuh.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterCode {
    /// Σ (x̃ − ỹ)², term by term.
    SquaredL2 = 0,
    L1 = 1,
    LInf = 2,
    /// −x̃·ỹ (the inner product).
    NegDot = 3,
    /// ‖x̃‖² + ‖ỹ‖² − 2x̃·ỹ (the GEMM form of L2, L2² and cosine).
    GemmL2 = 4,
}

#[cfg(test)]
mod tests {
    use super::{FilterCode, MetricCode};

    /// The value of `#define NAME Nu` in kernels/common.cuh.
    fn defined(name: &str) -> u32 {
        let source = include_str!("../../kernels/common.cuh");
        let line = source
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("{name} is not defined in kernels/common.cuh"));
        line.split_whitespace().nth(2).unwrap().trim_end_matches('u').parse().unwrap()
    }

    #[test]
    fn codes_match_the_kernels() {
        for (code, name) in [
            (MetricCode::L2, "METRIC_L2"),
            (MetricCode::L2Squared, "METRIC_L2SQ"),
            (MetricCode::Cosine, "METRIC_COSINE"),
            (MetricCode::InnerProduct, "METRIC_INNER_PRODUCT"),
            (MetricCode::L1, "METRIC_L1"),
            (MetricCode::LInf, "METRIC_LINF"),
        ] {
            assert_eq!(code as u32, defined(name), "{name}");
        }
        for (code, name) in [
            (FilterCode::SquaredL2, "FILTER_SQUARED_L2"),
            (FilterCode::L1, "FILTER_L1"),
            (FilterCode::LInf, "FILTER_LINF"),
            (FilterCode::NegDot, "FILTER_NEG_DOT"),
            (FilterCode::GemmL2, "FILTER_GEMM_L2"),
        ] {
            assert_eq!(code as u32, defined(name), "{name}");
        }
    }
}
