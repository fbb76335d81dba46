//! One CUDA device: its context, its stream and its kernel modules (machine code for the device's
//! own `sm_XY`, from the disk cache or NVRTC: src/cuda/compile.rs), loaded on first use.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys::CUdevice_attribute::{
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, PinnedHostSlice};
use cudarc::nvrtc::Ptx;

use super::buffers::SideBuffers;
use super::download::ResultBuffers;
use super::kernels::{Kernel, KernelModule};
use super::launch::DeviceCurves;
use super::{Error, Result};
use super::{GpuInfo, probe_ordinal};

/// A usable GPU.
#[derive(Debug)]
pub struct GpuDevice {
    /// What the probe saw.
    pub info: GpuInfo,
    /// The device's primary context.
    pub ctx: Arc<CudaContext>,
    /// The stream every kernel and copy of this device is ordered on.
    pub stream: Arc<CudaStream>,
    /// `sm_XY` for NVRTC.
    pub arch: &'static str,
    /// The most shared memory a block may ask for (bytes, beyond the default 48 KB by opting in).
    pub shared_memory_per_block: usize,
    /// Shared memory of one multiprocessor (bytes), which its resident blocks share.
    pub shared_memory_per_multiprocessor: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    /// `cuDriverGetVersion`: part of the compiled-kernel cache's key.
    pub driver_version: i32,
    modules: [OnceLock<Result<Arc<CudaModule>>>; KernelModule::ALL.len()],
    /// Two page-locked buffers that large uploads pass through (`memory::upload`), allocated on
    /// first use and kept: page-locking costs more than the copies it speeds up.
    pub(super) staging: Mutex<Option<[PinnedHostSlice<u8>; 2]>>,
    /// Page-locked buffers that write passes copy their pairs into (`download::host_results`),
    /// kept for the next run.
    pub(super) results: Mutex<Option<ResultBuffers>>,
    /// Page-locked buffers that kNN's neighbours ranked on the device are copied into
    /// (`download::host_ranked`), kept for the next run.
    pub(super) ranked: Mutex<Option<ResultBuffers>>,
    /// The streams of pipelined write passes, created on first use (from then on cudarc orders
    /// every buffer's uses across streams with events).
    pipeline: OnceLock<Result<[Arc<CudaStream>; PIPELINE_STREAMS]>>,
    /// Exact rows kept on the device between queries ([`GpuDevice::resident_rows`]).
    resident: Mutex<ResidentRows>,
    /// The device copy of the Multicurves index searched last, while its host index lives
    /// ([`GpuDevice::kept_curves`]).
    curves: Mutex<Option<KeptCurves>>,
}

/// A device copy of a host index, and the host index it copies (held weakly).
#[derive(Debug)]
struct KeptCurves {
    key: Weak<dyn Any + Send + Sync>,
    curves: Arc<DeviceCurves>,
}

/// The key rows stay resident under: the mark of host vectors whose values never change while it
/// lives (the conversion cache's, `crate::vectors::ResidentMark`), held here weakly.
pub type ResidentKey = Arc<dyn Any + Send + Sync>;

#[derive(Debug, Default)]
struct ResidentRows {
    entries: Vec<ResidentEntry>,
    clock: u64,
}

impl ResidentRows {
    /// The entry kept under `key`.
    fn entry(&mut self, key: &ResidentKey) -> Option<&mut ResidentEntry> {
        self.entries.iter_mut().find(|e| std::ptr::addr_eq(e.key.as_ptr(), Arc::as_ptr(key)))
    }

    /// Drops the least recently used entries until the rest take at most `capacity` bytes.
    fn evict(&mut self, capacity: usize) {
        while self.entries.iter().map(ResidentEntry::bytes).sum::<usize>() > capacity {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else {
                return;
            };
            self.entries.swap_remove(oldest);
        }
    }
}

#[derive(Debug)]
struct ResidentEntry {
    key: Weak<dyn Any + Send + Sync>,
    rows: Arc<CudaSlice<f64>>,
    /// Sides built from `rows` for a metric, one a metric ([`GpuDevice::derived_side`]).
    derived: Vec<Arc<DerivedSide>>,
    last_used: u64,
}

fn same_centre(derived: &DerivedSide, centre: Option<&ResidentKey>) -> bool {
    match (&derived.centred_on, centre) {
        (None, None) => true,
        (Some(kept), Some(centre)) => std::ptr::addr_eq(kept.as_ptr(), Arc::as_ptr(centre)),
        _ => false,
    }
}

impl ResidentEntry {
    /// Device bytes the entry keeps: its rows and the derived sides' own buffers (their exact
    /// rows are `rows`).
    fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<f64>() + self.derived.iter().map(|d| d.side.own_bytes()).sum::<usize>()
    }
}

/// A side built on the device from kept rows, with its f16 rows at one scale and its largest
/// |filter coordinate|: a kNN over a kept base would otherwise build it again for every query
/// (P1: ~1.2 ms of its 21, docs/design.md#memory), and a repeated query table its own side (docs/design.md#memory).
/// The GEMM form of L2 and L2² centres its filter on the base's mean, so a base's side depends on
/// its rows alone and a query side on its rows and the base's.
#[derive(Debug)]
pub struct DerivedSide {
    /// The METRIC_* code it was built for.
    pub metric: u32,
    /// The kept base whose mean a query side's filter centres on (`None`: a base's own side).
    /// Compared by address, which the weak reference keeps from being reused.
    pub centred_on: Option<Weak<dyn Any + Send + Sync>>,
    /// The exponent its f16 rows are scaled by (`None`: no f16 rows).
    pub scale_exponent: Option<i32>,
    /// Its largest |filter coordinate| (NaN if one is NaN).
    pub largest: f32,
    pub side: SideBuffers,
}

/// The share of the device's memory that resident rows may take: the rest stays for the runs,
/// whose buffers (candidate slots, result pairs) scale with the work rather than the inputs.
const RESIDENT_SHARE: usize = 4;

/// Streams that write passes take turns on: while the host emits one batch, the next batch's
/// copy to the host and the one after's kernel run on the other two (Gowanlock & Karsin, GPU-Join, §3.2.2).
pub const PIPELINE_STREAMS: usize = 3;

/// The most devices one process opens (`devices=` names ordinals below this).
pub const MAX_DEVICES: usize = 16;

/// The process's devices, opened once for every session: a CUDA context, its loaded modules and
/// its memory belong to the process, and the resident rows' budget governs the whole device.
static SHARED: [OnceLock<Result<Arc<GpuDevice>>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

impl GpuDevice {
    /// The process-wide device 0, opened on first use; `Err` says why there is none.
    pub fn shared() -> Result<Arc<GpuDevice>> {
        Self::at(0)
    }

    /// The process-wide device `ordinal`, opened on first use; `Err` says why it cannot be used.
    pub fn at(ordinal: usize) -> Result<Arc<GpuDevice>> {
        match SHARED.get(ordinal) {
            Some(slot) => slot.get_or_init(|| Self::open(ordinal).map(Arc::new)).clone(),
            None => Err(Error::Unavailable(format!("GPU {ordinal}: at most {MAX_DEVICES} devices are used"))),
        }
    }

    /// Device 0 if opening it has finished (`None` while it is opening or before).
    pub fn opened() -> Option<Result<Arc<GpuDevice>>> {
        SHARED[0].get().cloned()
    }

    /// Its ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    fn open(ordinal: usize) -> Result<GpuDevice> {
        let info = probe_ordinal(ordinal)?;
        let arch = arch_for(info.compute_capability)?;
        if let Some(reason) = super::compile::no_kernels_for(arch) {
            return Err(Error::Unavailable(format!("GPU {ordinal}: {reason}")));
        }
        let ctx = CudaContext::new(info.ordinal)
            .map_err(|e| Error::Device(format!("GPU {} cannot be opened: {e}", info.ordinal)))?;
        let stream = ctx.default_stream();
        super::memory::keep_freed_device_memory(&ctx)?;
        let attribute = |attribute| {
            ctx.attribute(attribute)
                .map(|value| value as usize)
                .map_err(|e| Error::Device(format!("GPU {} does not answer: {e}", info.ordinal)))
        };
        let shared_memory_per_block = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let shared_memory_per_multiprocessor = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
        let multiprocessors = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut driver_version = 0;
        // SAFETY: writes one int through a valid pointer; the driver library is loaded (probe).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| Error::Device(format!("the CUDA driver does not give its version: {e}")))?;
        Ok(GpuDevice {
            info,
            ctx,
            stream,
            arch,
            shared_memory_per_block,
            shared_memory_per_multiprocessor,
            multiprocessors,
            driver_version,
            modules: std::array::from_fn(|_| OnceLock::new()),
            staging: Mutex::new(None),
            results: Mutex::new(None),
            ranked: Mutex::new(None),
            pipeline: OnceLock::new(),
            resident: Mutex::default(),
            curves: Mutex::new(None),
        })
    }

    /// Whether the device has the tensor cores brute_join_tc uses (`mma.sync.m16n8k16 … .f16` with
    /// f32 accumulation: compute capability 8.0 and later).
    pub fn has_tensor_cores(&self) -> bool {
        self.info.compute_capability.0 >= 8
    }

    /// `values` (exact rows) on the device under `key`, and whether they were there already: the
    /// copy uploaded at the key's first use is kept, and returned, while the key lives and the
    /// kept rows take at most a quarter of the device's memory (the least recently used leave
    /// first). The caller vouches that `upload` puts the key's values on the device, unchanged; it
    /// is called only when they are not there.
    pub fn resident_rows(
        &self,
        key: &ResidentKey,
        upload: impl FnOnce() -> Result<CudaSlice<f64>>,
    ) -> Result<(Arc<CudaSlice<f64>>, bool)> {
        let lock = || self.resident.lock().map_err(|_| "the GPU's resident rows are poisoned".to_string());
        {
            let mut resident = lock()?;
            resident.clock += 1;
            let now = resident.clock;
            // Rows whose vectors are gone can never be asked for again.
            resident.entries.retain(|e| e.key.strong_count() > 0);
            if let Some(entry) = resident.entry(key) {
                entry.last_used = now;
                return Ok((entry.rows.clone(), true));
            }
        }
        let rows = Arc::new(upload()?);
        let capacity = self.info.total_memory / RESIDENT_SHARE;
        if rows.len() * std::mem::size_of::<f64>() <= capacity {
            let mut resident = lock()?;
            let last_used = resident.clock;
            resident.entries.push(ResidentEntry {
                key: Arc::downgrade(key),
                rows: rows.clone(),
                derived: Vec::new(),
                last_used,
            });
            resident.evict(capacity);
        }
        Ok((rows, false))
    }

    /// The Multicurves index `key` on the device, and whether it was there already: one index is
    /// kept between queries (the last searched, while its host index lives and it takes at most a
    /// quarter of the device's memory), so that repeated queries over a kept base upload nothing.
    /// The caller vouches that `upload` puts the key's index on the device; it is called only
    /// when that is not there.
    pub fn kept_curves(
        &self,
        key: &ResidentKey,
        upload: impl FnOnce() -> Result<DeviceCurves>,
    ) -> Result<(Arc<DeviceCurves>, bool)> {
        let mut kept = self.curves.lock().map_err(|_| "the GPU's kept index is poisoned".to_string())?;
        if let Some(entry) = kept.as_ref().filter(|e| std::ptr::addr_eq(e.key.as_ptr(), Arc::as_ptr(key))) {
            return Ok((entry.curves.clone(), true));
        }
        // Free the last index before uploading the next.
        *kept = None;
        let curves = Arc::new(upload()?);
        if curves.bytes() <= self.info.total_memory / RESIDENT_SHARE {
            *kept = Some(KeptCurves { key: Arc::downgrade(key), curves: curves.clone() });
        }
        Ok((curves, false))
    }

    /// The side derived from `key`'s kept rows for `metric`, centred on `centre`'s mean where
    /// that is given, if one was kept ([`GpuDevice::keep_derived_side`]).
    /// A query that finds one does not ask for the rows themselves, so this counts as their use.
    pub fn derived_side(
        &self,
        key: &ResidentKey,
        metric: u32,
        centre: Option<&ResidentKey>,
    ) -> Option<Arc<DerivedSide>> {
        let mut resident = self.resident.lock().ok()?;
        resident.clock += 1;
        let now = resident.clock;
        let entry = resident.entry(key)?;
        let derived = entry.derived.iter().find(|d| d.metric == metric && same_centre(d, centre)).cloned()?;
        entry.last_used = now;
        Some(derived)
    }

    /// Keeps `derived` (built from `key`'s kept rows, `side.exact` being them) beside those rows,
    /// in place of any kept for its metric and kind (a base's own side, or a query side: one of
    /// each a metric), while they stay and everything kept fits the share (the least recently used
    /// rows leave first, with their derived sides).
    pub fn keep_derived_side(&self, key: &ResidentKey, derived: Arc<DerivedSide>) {
        let Ok(mut resident) = self.resident.lock() else { return };
        let Some(entry) = resident.entry(key) else { return };
        if !Arc::ptr_eq(&entry.rows, &derived.side.exact) {
            return;
        }
        entry.derived.retain(|d| d.metric != derived.metric || d.centred_on.is_some() != derived.centred_on.is_some());
        entry.derived.push(derived);
        resident.evict(self.info.total_memory / RESIDENT_SHARE);
    }

    /// The streams of pipelined write passes.
    pub fn pipeline_streams(&self) -> Result<&[Arc<CudaStream>; PIPELINE_STREAMS]> {
        let streams = self.pipeline.get_or_init(|| {
            let streams: std::result::Result<Vec<_>, _> =
                (0..PIPELINE_STREAMS).map(|_| self.ctx.new_stream()).collect();
            streams
                .map_err(|e| Error::Device(format!("GPU stream creation failed: {e}")))
                .map(|s| s.try_into().expect("PIPELINE_STREAMS streams"))
        });
        streams.as_ref().map_err(Clone::clone)
    }

    /// A kernel, loading its module on first use.
    pub fn function(&self, kernel: Kernel) -> Result<CudaFunction> {
        let module = self.module(kernel.module())?;
        module.load_function(kernel.name()).map_err(|e| Error::Device(format!("kernel {kernel} not found: {e}")))
    }

    /// Whether `module` is loaded already.
    pub fn module_loaded(&self, module: KernelModule) -> bool {
        matches!(self.modules[module.index()].get(), Some(Ok(_)))
    }

    /// Whether the rows kept under `key` are on the device (without counting as their use).
    pub fn holds(&self, key: &ResidentKey) -> bool {
        self.resident.lock().is_ok_and(|mut resident| resident.entry(key).is_some())
    }

    /// `module` loaded on the device: its machine code built into this binary, else from the disk
    /// cache, else from NVRTC.
    /// Loaded once per process; later callers wait for the first.
    pub fn module(&self, module: KernelModule) -> Result<Arc<CudaModule>> {
        let loaded = self.modules[module.index()].get_or_init(|| {
            let image = |read_stored| super::compile::module_image(module, self.arch, self.driver_version, read_stored);
            let load = |image: Vec<u8>| {
                self.ctx
                    .load_module(Ptx::from_binary(image))
                    .map_err(|e| Error::Device(format!("loading {} failed: {e}", module.file_name())))
            };
            let (cubin, origin) = image(true)?;
            match load(cubin) {
                // An embedded or cached image the driver refuses (a driver older than the NVRTC
                // that built this binary, a file replaced behind the cache's back) is compiled
                // again; a fresh one it refuses is an error.
                Err(_) if origin != super::compile::ImageOrigin::Compiled => load(image(false)?.0),
                loaded => loaded,
            }
        });
        loaded.clone()
    }
}

/// NVRTC's `arch` for a compute capability.
fn arch_for((major, minor): (i32, i32)) -> Result<&'static str> {
    Ok(match (major, minor) {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        // Hopper's arch-specific features (wgmma: brute_join_tc's count pass in kernels/tc_join.cu).
        (9, 0) => "sm_90a",
        (10, 0) => "sm_100",
        (10, 3) => "sm_103",
        (12, 0) => "sm_120",
        _ => return Err(Error::Device(format!("compute capability {major}.{minor} is not supported by this build"))),
    })
}
