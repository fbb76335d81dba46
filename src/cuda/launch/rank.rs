//! kNN's ranking on the device: each query's slot sorted, or its list's k smallest selected.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaStream, LaunchConfig};

use crate::cuda::buffers::{PassBuffers, RankedLists};
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::geometry::BLOCK;
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// The largest k knn_select_slots ranks (kernels/knn.cu): a warp per query takes the smallest
/// remaining candidate k times, where knn_rank_slots sorts the whole slot. Beyond a few dozen its
/// rounds cost more than the sort (k = 100: 1.53 ms against 0.72, docs/design.md#gpu-knn).
pub const KNN_SELECT_SLOTS_K: usize = 32;

/// Most candidates knn_rank_slots sorts per query (`RANK_SLOTS` in kernels/knn.cu).
pub const KNN_RANK_SLOTS: usize = 4096;

/// The `k` nearest candidates of each query whose slot (of `capacity` entries in `pass`'s
/// outputs, as the first count pass stored them) holds `slot_len[q]` ≥ k of them, ranked on the
/// device by (distance, base position) as the host ranks them (knn_select_slots in kernels/knn.cu
/// for k ≤ 32, knn_rank_slots above);
/// queries with `slot_len[q] = 0` are left out. `k` (distances, positions) per query, nearest
/// first, in query order, into the first `k` · queries places of `nearest_distance` and
/// `nearest_position` (a left-out query's are zeros).
pub fn rank_slots(
    device: &GpuDevice,
    pass: &PassBuffers,
    capacity: usize,
    k: usize,
    slot_len: &[u32],
    nearest_distance: &mut [f64],
    nearest_position: &mut [u32],
) -> Result<()> {
    let queries = slot_len.len();
    if capacity > KNN_RANK_SLOTS
        || queries == 0
        || k == 0
        || queries * capacity > pass.out_right.len().min(pass.out_distance.len())
    {
        return Err(Error::Device(format!(
            "knn_rank_slots: {queries} slots of {capacity} (at most {KNN_RANK_SLOTS}) for k = {k}"
        )));
    }
    if nearest_distance.len().min(nearest_position.len()) < queries * k {
        return Err(Error::Device(format!(
            "knn_rank_slots: {} and {} places for {queries} queries' {k} neighbours",
            nearest_distance.len(),
            nearest_position.len()
        )));
    }
    if let Some(q) = slot_len.iter().position(|&len| (len != 0 && (len as usize) < k) || len as usize > capacity) {
        return Err(Error::Device(format!(
            "knn_rank_slots: query {q} has {} candidates, outside [{k}, {capacity}]",
            slot_len[q]
        )));
    }
    let stream = &device.stream;
    let failed = |e: cudarc::driver::DriverError| Error::Device(format!("knn_rank_slots: {e}"));
    let lengths = stream.clone_htod(slot_len).map_err(failed)?;
    let mut out_distance = zeroed::<f64>(stream, queries * k)?;
    let mut out_position = zeroed::<u32>(stream, queries * k)?;
    let (queries_arg, capacity_arg, k_arg) = (queries as u32, capacity as u32, k as u32);
    // Small k: a warp per query selects (knn_select_slots); else a block per query sorts.
    let select = k <= KNN_SELECT_SLOTS_K;
    let function = device.function(if select { Kernel::KnnSelectSlots } else { Kernel::KnnRankSlots })?;
    // Shared memory for the longest slot's sort: a key (8 bytes) and a position (4) an entry.
    let room = slot_len.iter().max().map_or(1, |&len| len.max(1).next_power_of_two());
    let config = match select {
        true => LaunchConfig {
            grid_dim: (queries.div_ceil(BLOCK as usize / 32) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        false => {
            LaunchConfig { grid_dim: (queries as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: room * 12 }
        }
    };
    let mut builder = stream.launch_builder(&function);
    if select {
        builder.arg(&queries_arg);
    }
    builder.arg(&capacity_arg).arg(&k_arg);
    if !select {
        builder.arg(&room);
    }
    builder.arg(&lengths).arg(&pass.out_distance).arg(&pass.out_right).arg(&mut out_distance).arg(&mut out_position);
    // SAFETY: the arguments match the chosen kernel's parameter list one for one (knn_select_slots
    // takes `queries` first and no `room`; its warp q < `queries` reads and writes what block q
    // of knn_rank_slots does, without shared memory). Block q reads
    // slot_len[q] (q < `queries`, its length) and, when it is not 0, entries [q·capacity,
    // q·capacity + slot_len[q]) of the distances and positions, within both (checked above:
    // slot_len[q] ≤ capacity ≤ RANK_SLOTS, and queries · capacity entries fit), sorts the next
    // power of two ≥ slot_len[q], at most `room` entries, in its 12·room bytes of dynamic shared
    // memory (≤ 48 KB: room ≤ RANK_SLOTS = 4,096), and writes k values at [q·k, q·k + k) of the
    // outputs, which hold queries · k.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("knn_rank_slots launch failed: {e}")))?;
    stream.memcpy_dtoh(&out_distance, &mut nearest_distance[..queries * k]).map_err(failed)?;
    stream.memcpy_dtoh(&out_position, &mut nearest_position[..queries * k]).map_err(failed)?;
    stream.synchronize().map_err(failed)
}

/// Threads of a knn_rank_lists block (its `__launch_bounds__`): each round of its selection reads
/// the whole list, and its sort is a thousand entries a thread at most.
pub(super) const RANK_LISTS_BLOCK: u32 = 1024;

/// knn_rank_lists' static shared memory (its histogram and choices; ptxas: 1,056 bytes), beside
/// the dynamic `room` entries.
pub(super) const RANK_LISTS_STATIC_BYTES: usize = 1024 + 64;

/// The largest k knn_rank_lists ranks on `device` ([`rank_lists_most_entries`]).
pub fn rank_lists_most_k(device: &GpuDevice) -> usize {
    rank_lists_most_entries(device.shared_memory_per_block)
}

/// The largest k knn_rank_lists ranks with `per_block` bytes of shared memory a block: it sorts
/// the next power of two ≥ k entries (a key of 8 bytes and a position of 4) in one block's shared
/// memory, beside its static memory. H100 (227 KB a block): 16,384; A100 (163 KB): 8,192.
pub(super) fn rank_lists_most_entries(per_block: usize) -> usize {
    let entries = per_block.saturating_sub(RANK_LISTS_STATIC_BYTES) / 12;
    if entries == 0 { 0 } else { 1 << entries.ilog2() }
}

/// Queues on `stream`, behind the kNN write pass that filled `pass`'s outputs for `lists` queries
/// (each with at least k candidates), the ranking of each query's k nearest by (distance, base
/// position), as the host ranks them (knn_rank_lists in kernels/knn.cu), into the first lists · k
/// places of `ranked`, nearest first, in list order. The pass must have run on the same stream:
/// the kernel finds each list's end in `pass.offsets`, where the write pass leaves its cursors.
pub fn start_rank_lists(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pass: &PassBuffers,
    lists: usize,
    k: usize,
    ranked: &mut RankedLists,
) -> Result<()> {
    let most = rank_lists_most_k(device);
    if lists == 0
        || k == 0
        || k > most
        || pass.offsets.len() < lists
        || ranked.distance.len().min(ranked.position.len()) < lists * k
    {
        return Err(Error::Device(format!(
            "knn_rank_lists: {lists} lists at k = {k} (at most {most}) for {} offsets and {} places",
            pass.offsets.len(),
            ranked.distance.len().min(ranked.position.len())
        )));
    }
    let function = device.function(Kernel::KnnRankLists)?;
    let room = k.next_power_of_two();
    let shared_mem_bytes = (room * 12) as u32;
    if shared_mem_bytes as usize + RANK_LISTS_STATIC_BYTES > 48 << 10 {
        // More than the 48 KB a block gets without asking, static memory included (k = 4,000:
        // 48 KB of entries and the histogram), within the device's (k ≤ most).
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| {
                Error::Device(format!("knn_rank_lists: {shared_mem_bytes} bytes of shared memory refused: {e}"))
            })?;
    }
    let config = LaunchConfig { grid_dim: (lists as u32, 1, 1), block_dim: (RANK_LISTS_BLOCK, 1, 1), shared_mem_bytes };
    let (k_arg, room_arg) = (k as u32, room as u32);
    let mut builder = stream.launch_builder(&function);
    builder
        .arg(&k_arg)
        .arg(&room_arg)
        .arg(&pass.offsets)
        .arg(&pass.out_distance)
        .arg(&pass.out_right)
        .arg(&mut ranked.distance)
        .arg(&mut ranked.position);
    // SAFETY: the arguments match knn_rank_lists' parameter list one for one. Block q < `lists`
    // reads offsets[q − 1] and offsets[q] (within the `lists` checked above): the write pass
    // before it on this stream advanced each cursor from its list's exclusive offset by its
    // count, so they bound list q inside the batch's total, for which the host sized the
    // outputs it reads (`distance`, `position`). It gathers at most k entries (its `slot < k`)
    // into the 12·room bytes of dynamic shared memory given here (room ≥ k, within the device's
    // opt-in: k ≤ rank_lists_most_k) and writes [q·k, q·k + k) of the outputs, which hold
    // lists · k (checked above).
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("knn_rank_lists launch failed: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{RANK_LISTS_STATIC_BYTES, rank_lists_most_entries};

    #[test]
    fn rank_lists_sort_the_largest_power_of_two_that_fits_a_block() {
        // H100, A100 and the 48 KB every device gives without opting in.
        assert_eq!(rank_lists_most_entries(232_448), 16_384);
        assert_eq!(rank_lists_most_entries(166_912), 8_192);
        assert_eq!(rank_lists_most_entries(48 << 10), 2_048);
        assert_eq!(rank_lists_most_entries(1_000), 0);
        // 16,384 entries and the static memory need 197,696 bytes: one byte less leaves 8,192.
        assert_eq!(rank_lists_most_entries(16_384 * 12 + RANK_LISTS_STATIC_BYTES), 16_384);
        assert_eq!(rank_lists_most_entries(16_384 * 12 + RANK_LISTS_STATIC_BYTES - 1), 8_192);
    }
}
