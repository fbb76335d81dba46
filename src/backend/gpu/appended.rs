//! Kernels that append their pairs at an atomic counter (text_join, the List of Clusters'
//! searches): a launch over a range of left rows reports how many pairs it found; one that found
//! more than its output holds runs again in halves (a single row, with room for all of its pairs).

use std::time::Instant;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use datafusion::common::Result;

use crate::backend::RunStats;
use crate::backend::gpu::{RunResult, copy_failed};
use crate::cuda::launch::PairOutput;
use crate::cuda::{Error as GpuError, GpuDevice};

/// Most pairs one output holds (12 or 16 bytes each on the device: 768 MiB or 1 GiB).
const MAX_APPENDED_PAIRS: usize = 1 << 26;

/// Runs `launch` over left rows `0..rows` (it appends to the output and returns how many pairs
/// it found) and hands each launch's pairs to `each` as (left rows, right positions, distances).
/// The output takes a quarter of `budget`; `each`'s error ends the run.
pub(super) fn appended_pairs<D: DeviceRepr + ValidAsZeroBits + Copy + Default>(
    device: &GpuDevice,
    rows: u32,
    budget: usize,
    stats: &mut RunStats,
    mut launch: impl FnMut(std::ops::Range<u32>, &mut PairOutput<D>) -> Result<u64, GpuError>,
    mut each: impl FnMut(&[u32], &[u32], &[D]) -> Result<()>,
) -> RunResult<()> {
    let pair_bytes = 8 + std::mem::size_of::<D>();
    let mut out = PairOutput::<D>::new(device, (budget / 4 / pair_bytes).clamp(1 << 16, MAX_APPENDED_PAIRS))?;
    let mut parts: Vec<std::ops::Range<u32>> = Vec::with_capacity(8);
    parts.push(0..rows);
    let (mut left, mut right, mut distances) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(part) = parts.pop() {
        let launched = Instant::now();
        let found = launch(part.clone(), &mut out)?;
        stats.kernel_time += launched.elapsed();
        if found > out.capacity() {
            if part.len() > 1 {
                let middle = part.start + part.len() as u32 / 2;
                parts.push(middle..part.end);
                parts.push(part.start..middle);
            } else {
                out = PairOutput::new(device, found as usize)?;
                parts.push(part);
            }
            continue;
        }
        let found = found as usize;
        let copying = Instant::now();
        left.resize(found, 0u32);
        right.resize(found, 0u32);
        distances.resize(found, D::default());
        if found > 0 {
            let stream = &device.stream;
            stream.memcpy_dtoh(&out.left.slice(0..found), &mut left[..]).map_err(copy_failed)?;
            stream.memcpy_dtoh(&out.right.slice(0..found), &mut right[..]).map_err(copy_failed)?;
            stream.memcpy_dtoh(&out.distance.slice(0..found), &mut distances[..]).map_err(copy_failed)?;
        }
        stats.transfer_time += copying.elapsed();
        let emitting = Instant::now();
        let sent = each(&left, &right, &distances);
        stats.emit_time += emitting.elapsed();
        sent?;
    }
    Ok(())
}
