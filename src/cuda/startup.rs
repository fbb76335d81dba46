//! Opening the device and loading its kernels off the query's path: planning starts both on a
//! background thread, so they overlap reading and decoding the inputs, and `device=auto` weighs
//! what is still left of them against the CPU's estimated time.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::device::GpuDevice;
use super::kernels::KernelModule;

/// Opening device 0 (driver initialisation, its primary context, the probe).
const OPEN: Duration = Duration::from_millis(300);
/// Loading a module whose machine code is in the disk cache.
const LOAD_CACHED: Duration = Duration::from_millis(20);

/// NVRTC's time for a module not in the cache, on an H100 host (the join kernels are six modules
/// that compile concurrently: one module of them all took 7 s).
fn compile_time(module: KernelModule) -> Duration {
    match module {
        KernelModule::TcJoin => Duration::from_millis(2200),
        KernelModule::GridJoin | KernelModule::GridJoinWide | KernelModule::DirectoryJoin => {
            Duration::from_millis(1300)
        }
        KernelModule::BruteJoin => Duration::from_millis(1800),
        KernelModule::Knn | KernelModule::TcSampleKeys => Duration::from_millis(1200),
        KernelModule::Grid
        | KernelModule::Rows
        | KernelModule::Text
        | KernelModule::Clusters
        | KernelModule::Approx
        | KernelModule::Bits => Duration::from_millis(300),
    }
}

/// When the first warm-up began.
static STARTED: OnceLock<Instant> = OnceLock::new();
/// Warm-up threads still running.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Whether a warm-up thread is still inside the CUDA driver or NVRTC (a query that ran on the
/// CPU does not wait for it). A process that exits meanwhile tears the driver down under that
/// thread, which then crashes (a segmentation fault in libcuda, seen on the H100 host): a
/// one-shot program ends with `_exit` instead, as `simjoin` does, once its output is flushed.
pub fn in_flight() -> bool {
    IN_FLIGHT.load(Ordering::Acquire) > 0
}

/// Whether the CUDA driver library can be loaded at all (no CUDA call is made). NVRTC is loaded
/// only to compile kernels this binary does not carry: loading its 140 MB library took 6–7 ms on
/// the H100 host once in the page cache, 0.12 s before, a cost to a process that ends up on the
/// cores.
pub fn libraries_present() -> bool {
    // SAFETY: this only tries to dlopen() the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Opens device 0 and loads `modules` on a background thread, unless that is done already; a
/// query that needs them first waits only for what is left.
pub fn warm_up(modules: &[KernelModule]) {
    if !libraries_present() {
        return;
    }
    match GpuDevice::opened() {
        // Opening failed for good (no device answers): nothing to start.
        Some(Err(_)) => return,
        Some(Ok(device)) if modules.iter().all(|&m| device.module_loaded(m)) => return,
        _ => {}
    }
    STARTED.get_or_init(Instant::now);
    let modules = modules.to_vec();
    // A thread that cannot start only means the query opens the device itself. Modules not in the
    // cache compile concurrently, one thread each (NVRTC compiles one program per thread).
    IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
    let spawned = std::thread::Builder::new().name("simjoin-gpu-start".into()).spawn(move || {
        // Counted out when the thread ends, however it ends.
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _done = Done;
        if let Ok(device) = GpuDevice::shared() {
            std::thread::scope(|scope| {
                for module in modules {
                    let device = &device;
                    let _ = std::thread::Builder::new()
                        .name("simjoin-gpu-load".into())
                        .spawn_scoped(scope, move || device.module(module));
                }
            });
        }
    });
    if spawned.is_err() {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A later process's start-up (opening the device, loading cached modules): what a plan weighs
/// when it decides not to start the GPU at all, since that also leaves uncompiled kernels
/// uncompiled for every later process (see `AutoBackend::for_inputs`).
pub fn cached_startup() -> Duration {
    OPEN + LOAD_CACHED
}

/// The estimated start-up still to be paid before `modules` run on device 0, or `None` when it
/// cannot be used (no libraries, or it failed to open).
pub fn startup_left(modules: &[KernelModule]) -> Option<Duration> {
    if !libraries_present() {
        return None;
    }
    let (mut expected, arch) = match GpuDevice::opened() {
        Some(Err(_)) => return None,
        Some(Ok(device)) => {
            if modules.iter().all(|&m| device.module_loaded(m)) {
                return Some(Duration::ZERO);
            }
            (Duration::ZERO, Some(device))
        }
        None => (OPEN, None),
    };
    // Modules load (or compile) concurrently: the longest is what is left of them.
    let mut longest = Duration::ZERO;
    for &module in modules {
        let cached = match &arch {
            Some(device) if device.module_loaded(module) => continue,
            Some(device) => super::compile::is_cached(module, device.arch, device.driver_version),
            None => super::compile::any_cached(module),
        };
        longest = longest.max(if cached { LOAD_CACHED } else { compile_time(module) });
    }
    expected += longest;
    // Work already under way on the background thread counts as paid.
    let elapsed = STARTED.get().map(Instant::elapsed).unwrap_or_default();
    Some(expected.saturating_sub(elapsed).max(expected / 10))
}
