//! The thin CUDA layer (cudarc, loaded at run time): finding a usable device without ever panicking.
//! No Arrow or DataFusion types live here.

use std::fmt;

use cudarc::driver::CudaContext;

pub mod abi;
pub mod buffers;
pub mod compile;
pub mod curves;
mod device;
pub mod download;
pub mod error;
pub mod grid;
pub mod kernels;
pub(crate) mod launch;
pub mod memory;
mod nvrtc_options;
pub mod startup;

pub use device::{DerivedSide, GpuDevice, MAX_DEVICES, PIPELINE_STREAMS, ResidentKey};
pub use error::{Error, Result};

/// A CUDA device that answered.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub total_memory: usize,
}

impl fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "GPU {} ({}, sm_{major}{minor}, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.total_memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// The first CUDA device, or why there is none. Never panics: cudarc's dynamic loading panics on
/// first use when libcuda is missing, so its presence is checked first.
pub fn probe() -> Result<GpuInfo> {
    probe_ordinal(0)
}

/// How many CUDA devices the driver shows this process (after `CUDA_VISIBLE_DEVICES`), or why
/// there is none.
pub fn device_count() -> Result<usize> {
    // NVRTC is needed only for kernels this binary does not carry (`GpuDevice` checks it).
    // SAFETY: this only tries to dlopen() the library; no CUDA function is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Unavailable("the CUDA driver library (libcuda) was not found".into()));
    }
    match CudaContext::device_count() {
        Ok(count) if count >= 1 => Ok(count as usize),
        Ok(_) => Err(Error::Unavailable("the CUDA driver reports no device".into())),
        Err(e) => Err(Error::Unavailable(format!("the CUDA driver failed: {e}"))),
    }
}

/// CUDA device `ordinal`, or why it cannot be used.
pub fn probe_ordinal(ordinal: usize) -> Result<GpuInfo> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::Unavailable(format!("GPU {ordinal} does not exist ({count} visible)")));
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| Error::Unavailable(format!("GPU {ordinal} cannot be opened: {e}")))?;
    let info = || -> std::result::Result<GpuInfo, cudarc::driver::DriverError> {
        Ok(GpuInfo {
            ordinal,
            name: ctx.name()?,
            compute_capability: ctx.compute_capability()?,
            total_memory: ctx.total_mem()?,
        })
    };
    info().map_err(|e| Error::Unavailable(format!("GPU {ordinal} does not answer: {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_never_panics() {
        // On machines without CUDA this is an Err with a reason; with a GPU it names the device.
        match super::probe() {
            Ok(info) => assert!(!info.name.is_empty()),
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}
