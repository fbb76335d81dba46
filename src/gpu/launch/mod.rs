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

mod clusters;
mod geometry;
mod join;
mod pack;
mod primitives;
mod rank;
mod sample;
mod text;

use super::memory::zeroed;
use super::{Error, Result};
pub use clusters::*;
use geometry::*;
pub use join::*;
pub use pack::*;
pub use primitives::*;
pub use rank::*;
pub use sample::*;
pub use text::*;
