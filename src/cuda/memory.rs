//! Device memory: the stream-ordered pool kept across runs, the budget a run may use, and uploads
//! (through pinned staging buffers for large inputs).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};

use super::device::GpuDevice;
use super::{Error, Result};

/// Makes the device's default memory pool, which cudarc's stream-ordered allocations come from,
/// keep the memory freed to it for the next allocation instead of returning it to the driver at
/// every synchronisation (a release threshold of 0, the default). Each run allocates its inputs and
/// result buffers anew, up to several GB (P3 collects 4 GB of pairs); mapping them again in every
/// run cost more than some whole joins. The pool holds at most the largest run's peak, as
/// PyTorch's caching allocator does; `mem_get_info` counts it as used. Devices without
/// stream-ordered allocation allocate synchronously and are left as they are.
pub fn keep_freed_device_memory(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<()> {
    use cudarc::driver::{result::mem_pool, sys};
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let failed = |e: cudarc::driver::DriverError| Error::Device(format!("GPU memory pool setup failed: {e}"));
    ctx.bind_to_thread().map_err(failed)?;
    let mut threshold = u64::MAX;
    // SAFETY: the device ordinal comes from an open context; RELEASE_THRESHOLD takes a cuuint64_t,
    // which `threshold` is, and the driver only reads it during the call.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device()).map_err(failed)?;
        mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
        .map_err(failed)
    }
}

/// Device memory a run can have: what the driver reports free plus what the default memory pool
/// holds for reuse (reserved, not in use; [`keep_freed_device_memory`] makes it keep freed memory,
/// which the driver then counts as used).
pub fn available_memory(device: &GpuDevice) -> Result<usize> {
    use cudarc::driver::{result::mem_pool, sys};
    let failed = |e: cudarc::driver::DriverError| Error::Device(format!("GPU memory query failed: {e}"));
    let (free, _) = device.ctx.mem_get_info().map_err(failed)?;
    if !device.ctx.has_async_alloc() {
        return Ok(free);
    }
    let (mut reserved, mut used) = (0u64, 0u64);
    // SAFETY: the device ordinal comes from an open context (bound to this thread by
    // mem_get_info); RESERVED_MEM_CURRENT and USED_MEM_CURRENT write a cuuint64_t, which both
    // targets are, and the driver writes them only during the call.
    unsafe {
        let pool = cudarc::driver::result::device::get_default_mem_pool(device.ctx.cu_device()).map_err(failed)?;
        mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&raw mut reserved).cast(),
        )
        .map_err(failed)?;
        mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&raw mut used).cast(),
        )
        .map_err(failed)?;
    }
    Ok(free + reserved.saturating_sub(used) as usize)
}

/// Bytes per staging buffer of [`upload`].
pub(super) const STAGE_BYTES: usize = 32 << 20;

/// `values` on the device. Large slices go through the device's two page-locked staging buffers:
/// while one is copied to the device, the worker threads fill the other, so a 1 GB side moves at
/// DMA speed instead of the few GB/s of a copy from pageable memory (docs/design.md#gpu-transfers). Smaller ones
/// (under two stages) are copied directly.
pub fn upload<T: DeviceRepr + ValidAsZeroBits>(device: &GpuDevice, values: &[T]) -> Result<CudaSlice<T>> {
    use rayon::iter::{IndexedParallelIterator, ParallelIterator};
    use rayon::slice::{ParallelSlice, ParallelSliceMut};
    let stream = &device.stream;
    let copy = |e: cudarc::driver::DriverError| Error::Device(format!("copy to the GPU failed: {e}"));
    // SAFETY: `T: DeviceRepr` is plain data without padding requirements on the host side beyond
    // its size, so its bytes may be read as `u8`; the view covers exactly `values`.
    let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
    if bytes.len() < 2 * STAGE_BYTES {
        return stream.clone_htod(values).map_err(copy);
    }
    let mut device_values = zeroed::<T>(stream, values.len())?;
    let mut staging = device.staging.lock().map_err(|_| "the GPU staging buffers are poisoned".to_string())?;
    if staging.is_none() {
        *staging =
            Some([pinned_buffer::<u8>(device, STAGE_BYTES, false)?, pinned_buffer::<u8>(device, STAGE_BYTES, false)?]);
    }
    let stages = staging.as_mut().expect("allocated above");
    // SAFETY: the device buffer holds exactly `bytes.len()` bytes (`values.len()` values of `T`).
    let mut target =
        unsafe { device_values.transmute_mut::<u8>(bytes.len()) }.ok_or("staging: buffer size mismatch")?;
    // When each stage's last copy to the device is done (recorded explicitly: on a single-stream
    // context cudarc records no event for pinned copies, and refilling a stage early corrupted data).
    let mut copied: [Option<CudaEvent>; 2] = [None, None];
    for (i, chunk) in bytes.chunks(STAGE_BYTES).enumerate() {
        let mut to = target.slice_mut(i * STAGE_BYTES..i * STAGE_BYTES + chunk.len());
        if chunk.len() < STAGE_BYTES {
            stream.memcpy_htod(chunk, &mut to).map_err(copy)?;
            continue;
        }
        if let Some(done) = copied[i % 2].take() {
            done.synchronize().map_err(copy)?;
        }
        let host = stages[i % 2].as_mut_slice().map_err(|e| Error::Device(format!("staging buffer: {e}")))?;
        host.par_chunks_mut(1 << 20).zip(chunk.par_chunks(1 << 20)).for_each(|(h, c)| h.copy_from_slice(c));
        stream.memcpy_htod(&stages[i % 2], &mut to).map_err(copy)?;
        copied[i % 2] = Some(stream.record_event(None).map_err(copy)?);
    }
    stream.synchronize().map_err(copy)?;
    Ok(device_values)
}

/// A page-locked host buffer of `len` values (DMA at about 25 GB/s instead of pageable memory's few
/// GB/s plus first-touch page faults), zero-filled. `host_reads`: the host reads what the device
/// writes there, so the buffer is cached; otherwise (uploads) write-combined, cudarc's default,
/// which the host writes quickly but reads uncached.
pub fn pinned_buffer<T: DeviceRepr + ValidAsZeroBits + Default + Copy>(
    device: &GpuDevice,
    len: usize,
    host_reads: bool,
) -> Result<PinnedHostSlice<T>> {
    let flags = if host_reads { 0 } else { cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED };
    // SAFETY: the allocation is uninitialised; it is zero-filled below before anything reads it.
    let mut buffer = unsafe { device.ctx.alloc_pinned_with_flags::<T>(len.max(1), flags) }
        .map_err(|e| Error::Device(format!("pinned allocation failed: {e}")))?;
    buffer.as_mut_slice().map_err(|e| Error::Device(format!("pinned buffer: {e}")))?.fill(T::default());
    Ok(buffer)
}

/// `len` zeroed values of `T` on `stream`'s device; a failure names the bytes asked for.
pub fn zeroed<T: DeviceRepr + ValidAsZeroBits>(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<T>> {
    stream.alloc_zeros::<T>(len).map_err(|e| Error::allocation(len * std::mem::size_of::<T>(), e))
}
