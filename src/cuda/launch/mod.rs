//! Every kernel launch, each checked. One file per
//! kind of work; the helpers are visible to the crate only.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits, sys,
};

use super::abi::*;
use super::buffers::*;
use super::device::GpuDevice;
use super::kernels::Kernel;

mod approx;
mod geometry;
mod join;
mod list_of_clusters;
mod pack;
mod primitives;
mod rank;
mod sample;
mod text;

use super::memory::zeroed;
use super::{Error, Result};
pub use approx::*;
use geometry::*;
pub use join::*;
pub use list_of_clusters::*;
pub use pack::*;
pub use primitives::*;
pub use rank::*;
pub use sample::*;
pub use text::*;

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
