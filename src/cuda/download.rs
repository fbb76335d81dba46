//! Results coming back: page-locked host buffers for the pairs of a pass, copied in batches.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PinnedHostSlice};

use super::buffers::{PassBuffers, RankedLists};
use super::device::GpuDevice;
use super::memory::pinned_buffer;
use super::{Error, Result};

/// Page-locked host buffers for the pairs of one write pass (left and right positions, exact
/// distances).
#[derive(Debug)]
pub struct ResultBuffers {
    pub left: PinnedHostSlice<u32>,
    pub right: PinnedHostSlice<u32>,
    pub distance: PinnedHostSlice<f64>,
}

impl ResultBuffers {
    fn new(device: &GpuDevice, capacity: usize) -> Result<Self> {
        Ok(Self {
            left: pinned_buffer(device, capacity, true)?,
            right: pinned_buffer(device, capacity, true)?,
            distance: pinned_buffer(device, capacity, true)?,
        })
    }
}

/// Downloaded pairs: left positions (empty when not asked for), right positions, exact distances.
pub type DownloadedPairs<'a> = (&'a [u32], &'a [u32], &'a [f64]);

/// A run's result buffers: the device's kept ones when no other run holds them, else its own.
#[derive(Debug)]
pub struct HostResults<'a> {
    kept: Option<std::sync::MutexGuard<'a, Option<ResultBuffers>>>,
    own: Option<ResultBuffers>,
}

impl HostResults<'_> {
    /// Copies the pairs at indices `pairs` of `pass`'s output buffers from the device (left
    /// positions only `with_left`) and returns them; at most the buffers' capacity.
    pub fn download(
        &mut self,
        stream: &Arc<CudaStream>,
        pass: &PassBuffers,
        with_left: bool,
        pairs: std::ops::Range<usize>,
    ) -> Result<DownloadedPairs<'_>> {
        let n = pairs.len();
        let [mut all] = self.parts()?;
        all.start_download(stream, pass, with_left, pairs)?;
        stream.synchronize().map_err(|e| Error::Device(format!("GPU copy failed: {e}")))?;
        Ok(all.into_pairs(n, with_left))
    }

    /// The first `len` distances and positions of the buffers, for the host to fill and read
    /// (kNN's table of ranked neighbours, [`host_ranked`]).
    pub fn table(&mut self, len: usize) -> Result<(&mut [f64], &mut [u32])> {
        let [all] = self.parts::<1>()?;
        if len > all.capacity() {
            return Err(Error::Device(format!(
                "a table of {len} neighbours does not fit result buffers of {}",
                all.capacity()
            )));
        }
        let HostPairs { right, distance, .. } = all;
        Ok((&mut distance[..len], &mut right[..len]))
    }

    /// The buffers cut into `N` views of an `N`th of the capacity each.
    pub fn parts<const N: usize>(&mut self) -> Result<[HostPairs<'_>; N]> {
        let buffers = match &mut self.kept {
            Some(kept) => kept.as_mut().expect("filled by host_results"),
            None => self.own.as_mut().expect("filled by host_results"),
        };
        let pinned = |e: cudarc::driver::DriverError| Error::Device(format!("pinned buffer: {e}"));
        let (mut left, mut right, mut distance) = (
            buffers.left.as_mut_slice().map_err(pinned)?,
            buffers.right.as_mut_slice().map_err(pinned)?,
            buffers.distance.as_mut_slice().map_err(pinned)?,
        );
        let part = right.len() / N;
        Ok(std::array::from_fn(|_| {
            let (l, r, d) = (std::mem::take(&mut left), std::mem::take(&mut right), std::mem::take(&mut distance));
            let ((left_part, left_rest), (right_part, right_rest), (distance_part, distance_rest)) =
                (l.split_at_mut(part), r.split_at_mut(part), d.split_at_mut(part));
            (left, right, distance) = (left_rest, right_rest, distance_rest);
            HostPairs { left: left_part, right: right_part, distance: distance_part }
        }))
    }
}

/// A view of a run's page-locked result buffers: all of them ([`HostResults::download`]) or one
/// of several parts ([`HostResults::parts`]: a batch of pairs is copied into one part while the
/// host reads the previous batch from another: the transfers overlap the host's use of the
/// results, as in Gowanlock & Karsin, GPU-Join, §3.2.2).
#[derive(Debug)]
pub struct HostPairs<'a> {
    left: &'a mut [u32],
    right: &'a mut [u32],
    distance: &'a mut [f64],
}

impl<'a> HostPairs<'a> {
    /// Pairs the view holds.
    pub fn capacity(&self) -> usize {
        self.right.len()
    }

    /// Starts copying the pairs at indices `pairs` of `pass`'s output buffers (left positions
    /// only `with_left`) into this view, without waiting: the copies are ordered on `stream`,
    /// which must be synchronised before [`HostPairs::pairs`] reads them and before the buffers
    /// are dropped (the memory is page-locked, so the copy runs while the host works).
    pub fn start_download(
        &mut self,
        stream: &Arc<CudaStream>,
        pass: &PassBuffers,
        with_left: bool,
        pairs: std::ops::Range<usize>,
    ) -> Result<()> {
        let n = pairs.len();
        if n > self.capacity() {
            return Err(Error::Device(format!("{n} pairs do not fit result buffers of {}", self.capacity())));
        }
        let copy = |e: cudarc::driver::DriverError| Error::Device(format!("GPU copy failed: {e}"));
        if n > 0 {
            if with_left {
                stream.memcpy_dtoh(&pass.out_left.slice(pairs.clone()), &mut self.left[..n]).map_err(copy)?;
            }
            stream.memcpy_dtoh(&pass.out_right.slice(pairs.clone()), &mut self.right[..n]).map_err(copy)?;
            stream.memcpy_dtoh(&pass.out_distance.slice(pairs), &mut self.distance[..n]).map_err(copy)?;
        }
        Ok(())
    }

    /// Starts copying the first `n` ranked neighbours of `ranked` into this view's positions and
    /// distances, as [`HostPairs::start_download`] copies pairs.
    pub fn start_download_ranked(&mut self, stream: &Arc<CudaStream>, ranked: &RankedLists, n: usize) -> Result<()> {
        if n > self.capacity() {
            return Err(Error::Device(format!(
                "{n} ranked neighbours do not fit result buffers of {}",
                self.capacity()
            )));
        }
        let copy = |e: cudarc::driver::DriverError| Error::Device(format!("GPU copy failed: {e}"));
        if n > 0 {
            stream.memcpy_dtoh(&ranked.position.slice(0..n), &mut self.right[..n]).map_err(copy)?;
            stream.memcpy_dtoh(&ranked.distance.slice(0..n), &mut self.distance[..n]).map_err(copy)?;
        }
        Ok(())
    }

    /// The first `n` pairs of this view (left positions empty unless `with_left`), once the
    /// stream that copied them has been synchronised.
    pub fn pairs(&self, n: usize, with_left: bool) -> DownloadedPairs<'_> {
        (if with_left { &self.left[..n] } else { &[] }, &self.right[..n], &self.distance[..n])
    }

    /// [`HostPairs::pairs`], keeping the buffers' lifetime.
    fn into_pairs(self, n: usize, with_left: bool) -> DownloadedPairs<'a> {
        (if with_left { &self.left[..n] } else { &[] }, &self.right[..n], &self.distance[..n])
    }
}

/// Result buffers for at most `capacity` pairs. The device keeps one set between runs and grows
/// it when a run needs more: page-locking and zeroing ~0.5 GB anew took ~0.3 s of every P3–P5 run
/// (docs/design.md#gpu-transfers). A run that finds the set held by another (which may be blocked on a slow
/// consumer) allocates its own rather than wait.
pub fn host_results(device: &GpuDevice, capacity: usize) -> Result<HostResults<'_>> {
    kept_host_buffers(device, &device.results, capacity)
}

/// Most neighbours kNN ranks on the device into the page-locked buffers the device keeps
/// ([`host_ranked`]; 64 MB of them, as the write passes' 2²² pairs): P1 at k = 100 has 10⁶.
pub const KEPT_RANKED: usize = 1 << 22;

/// Page-locked buffers for at most `capacity` ≤ [`KEPT_RANKED`] neighbours ranked on the device
/// (`rank_slots`), kept by the device between runs as [`host_results`]' are. Copied into
/// pageable memory allocated for each query, P1 k = 100's 10⁶ took 2 ms in most processes and
/// 5–11 ms in some (docs/design.md#gpu-knn).
pub fn host_ranked(device: &GpuDevice, capacity: usize) -> Result<HostResults<'_>> {
    if capacity > KEPT_RANKED {
        return Err(Error::Device(format!("{capacity} ranked neighbours exceed the kept buffers' {KEPT_RANKED}")));
    }
    kept_host_buffers(device, &device.ranked, capacity)
}

/// The device's `kept` buffers, grown to `capacity` where smaller, or where another run holds
/// them, buffers of this run's own.
pub(super) fn kept_host_buffers<'a>(
    device: &'a GpuDevice,
    kept: &'a std::sync::Mutex<Option<ResultBuffers>>,
    capacity: usize,
) -> Result<HostResults<'a>> {
    match kept.try_lock() {
        Ok(mut kept) => {
            if kept.as_ref().is_none_or(|b| b.left.len() < capacity) {
                *kept = None; // free the smaller set first
                *kept = Some(ResultBuffers::new(device, capacity)?);
            }
            Ok(HostResults { kept: Some(kept), own: None })
        }
        Err(_) => Ok(HostResults { kept: None, own: Some(ResultBuffers::new(device, capacity)?) }),
    }
}
