//! Every kernel launch, each checked. One file per
//! kind of work; the helpers are visible to the crate only.

use cudarc::driver::{CudaFunction, sys};

use super::kernels::Kernel;

mod approx;
mod bits;
mod geometry;
mod join;
mod list_of_clusters;
mod pack;
mod primitives;
mod rank;
mod sample;
mod text;

use super::{Error, Result};
pub use crate::cuda::launch::approx::ApproxBest;
pub use crate::cuda::launch::approx::ApproxQueries;
pub use crate::cuda::launch::approx::CurveInputs;
pub use crate::cuda::launch::approx::DeviceCurves;
pub use crate::cuda::launch::approx::GraphCandidates;
pub use crate::cuda::launch::approx::WALK_MAX_WIDTH;
pub use crate::cuda::launch::approx::approx_capacity;
pub use crate::cuda::launch::approx::approx_fits;
pub use crate::cuda::launch::approx::approx_knn;
pub use crate::cuda::launch::approx::approx_walk;
pub use crate::cuda::launch::approx::curve_bounds;
pub use crate::cuda::launch::approx::curve_keys;
pub use crate::cuda::launch::approx::curve_ranks;
pub use crate::cuda::launch::approx::graph_nearest;
pub use crate::cuda::launch::approx::walk_fits;

pub use crate::cuda::launch::bits::{
    BITS_MAX_WORDS, BLOCKS_MAX_WIDTH, BitsJoinInputs, DeviceBits, DeviceBlocks, bits_blocks_join, bits_join,
    bits_knn_fits, bits_knn_histogram, bits_knn_within,
};
pub use crate::cuda::launch::join::GRID_WORK_SAMPLE;
pub use crate::cuda::launch::join::PassKind;
pub use crate::cuda::launch::join::grid_kernel;
pub use crate::cuda::launch::join::join_pass;
pub use crate::cuda::launch::join::launch_join_pass;
pub use crate::cuda::launch::list_of_clusters::ClusterTextInputs;
pub use crate::cuda::launch::list_of_clusters::ClusterVectorInputs;
pub use crate::cuda::launch::list_of_clusters::DeviceClusterList;
pub use crate::cuda::launch::list_of_clusters::clusters_range_text;
pub use crate::cuda::launch::list_of_clusters::clusters_range_vectors;
pub use crate::cuda::launch::pack::byte_row_words;
pub use crate::cuda::launch::pack::byte_rows;
pub use crate::cuda::launch::pack::byte_sides;
pub use crate::cuda::launch::pack::filter_max_abs;
pub use crate::cuda::launch::pack::filter_rows;
pub use crate::cuda::launch::pack::pack_half_rows;
pub use crate::cuda::launch::pack::tc_row_words;
pub use crate::cuda::launch::primitives::CellBounds;
pub use crate::cuda::launch::primitives::RadixKeys;
pub use crate::cuda::launch::primitives::cell_bounds;
pub use crate::cuda::launch::primitives::gather_rows;
pub use crate::cuda::launch::primitives::identity_order;
pub use crate::cuda::launch::primitives::radix_pass;
pub use crate::cuda::launch::primitives::widen_rows;
pub use crate::cuda::launch::rank::KNN_RANK_SLOTS;
pub use crate::cuda::launch::rank::KNN_SELECT_SLOTS_K;
pub use crate::cuda::launch::rank::rank_lists_most_k;
pub use crate::cuda::launch::rank::rank_slots;
pub use crate::cuda::launch::rank::start_rank_lists;
pub use crate::cuda::launch::sample::KNN_LEVELS;
pub use crate::cuda::launch::sample::KNN_SAMPLE;
pub use crate::cuda::launch::sample::KnnSample;
pub use crate::cuda::launch::sample::sample_byte_rows;
pub use crate::cuda::launch::sample::sample_half_rows;
pub use crate::cuda::launch::sample::sample_radius_pass;
pub use crate::cuda::launch::sample::sample_rows;
pub use crate::cuda::launch::text::DeviceStrings;
pub use crate::cuda::launch::text::PairOutput;
pub use crate::cuda::launch::text::TEXT_MAX_WORDS;
pub use crate::cuda::launch::text::TextJoinInputs;
pub use crate::cuda::launch::text::text_join;

/// Asks for `shared` bytes of dynamic shared memory where, with the kernel's `fixed` bytes of
/// static shared memory, that is more than a block gets without asking (48 KB in all).
fn allow_shared(function: &CudaFunction, kernel: Kernel, shared: usize, fixed: usize) -> Result<()> {
    if shared + fixed > 48 << 10 {
        function
            .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32)
            .map_err(|e| Error::Device(format!("{kernel}: asking for {shared} bytes of shared memory failed: {e}")))?;
    }
    Ok(())
}
