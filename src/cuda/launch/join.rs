//! A pass of a join (count, collect, write, or kNN's scores pass with its settle step).

use std::sync::Arc;

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaStream, LaunchConfig};

use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{JoinInputs, PassBuffers};
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::geometry::{
    BLOCK, BRUTE_TILE, tc_queue, tc_queue_most, tc_row_map, tc_run, tc_shared_bytes, warpgroup_mma,
};
use crate::cuda::launch::pack::{byte_row_words, byte_sides, tc_row_words};
use crate::cuda::{Error, Result};

/// What a pass of the join kernels does (kernels/join_pairs.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    /// Counts each left slot's pairs.
    Count,
    /// Counts, and collects the pairs into the output buffers while they have room.
    CountAndCollect,
    /// Writes each left slot's pairs from its uploaded offset.
    Write,
    /// kNN's first count pass on f16 rows (brute_join_tc, L2 and L2², slots of
    /// `slot_capacity`): the slots keep the filter's scores of their pairs, and knn_settle_slots
    /// then checks exactly only those that can be among the `k` nearest. The counts it leaves
    /// are those of the checked pairs within the radius where they settle the query (at least k)
    /// or prove it short (below k), and the filter's count where the slot overflowed, which an
    /// exact pass must count again (PASS_SCORES in kernels/join_pairs.cuh).
    Scores { k: u32 },
    /// A grid's estimated work of every [`GRID_WORK_SAMPLE`]-th left slot from the first: the
    /// right slots the grid join would scan for it and the neighbour cells it would look up,
    /// into `counts` (grid_join_work in kernels/grid_join.cuh); nothing is compared.
    Work,
}

/// Left slots one [`PassKind::Work`] count stands for (GRID_WORK_SAMPLE in kernels/grid_join.cuh).
pub const GRID_WORK_SAMPLE: usize = 64;

/// The grid join's kernel for rows of `dim` values: its 2- to 4-dimensional instances are a
/// module of their own (kernels/grid_join.cu), so that a low-dimensional join does not wait for
/// the others' compilation on a machine's first query.
pub fn grid_kernel(dim: usize) -> Kernel {
    if (2..=4).contains(&dim) { Kernel::GridJoin } else { Kernel::GridJoinWide }
}

/// Runs a pass of a join over left slots `slots` on the device's stream (with knn_settle_slots
/// after a scores pass) and waits for it.
pub fn join_pass(
    device: &GpuDevice,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
    kind: PassKind,
) -> Result<()> {
    let kernel = launch_join_pass(device, &device.stream, params, slots.clone(), inputs, pass, kind)?;
    if let PassKind::Scores { k } = kind {
        settle_slots(device, params, slots, k, inputs, pass)?;
    }
    device.stream.synchronize().map_err(|e| Error::Device(format!("{kernel} failed: {e}")))
}

/// Queues knn_settle_slots over left slots `slots` after a scores pass over them (see
/// [`PassKind::Scores`]).
pub(super) fn settle_slots(
    device: &GpuDevice,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    k: u32,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
) -> Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let function = device.function(Kernel::KnnSettleSlots)?;
    let warps = BLOCK as usize / 32;
    let config = LaunchConfig {
        grid_dim: (slots.len().div_ceil(warps) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let (begin, end) = (slots.start, slots.end);
    let JoinInputs { left, right, .. } = inputs;
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(params)
        .arg(&begin)
        .arg(&end)
        .arg(&k)
        .arg(left.exact.as_ref())
        .arg(right.exact.as_ref())
        .arg(&left.filter_norms)
        .arg(&left.filter_sq_norms)
        .arg(&right.order)
        .arg(&pass.row_threshold)
        .arg(&mut pass.counts)
        .arg(&mut pass.out_right)
        .arg(&mut pass.out_distance);
    // SAFETY: the arguments match knn_settle_slots' parameter list one for one. Warp w reads left
    // slot begin + w < `end` (the pass's slots, all within the left side's rows, norms and the
    // per-row thresholds, as for the pass itself), its count at w < end − begin, and, where that
    // count is at most `params.slot_capacity`, that many entries of its slot from w ·
    // slot_capacity, which launch_join_pass checked the outputs hold; each entry's right slot is
    // one the pass stored, below `right_len`, so its exact row and order entry exist. It writes
    // only within those entries and its own count.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("knn_settle_slots launch failed: {e}")))?;
    Ok(())
}

/// Queues a pass of a join over left slots `slots` on `stream` without waiting for it; the
/// kernel's name.
pub fn launch_join_pass(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    params: &JoinParams,
    slots: std::ops::Range<u32>,
    inputs: JoinInputs,
    pass: &mut PassBuffers,
    kind: PassKind,
) -> Result<Kernel> {
    let JoinInputs { left, right, right_len, grid, directory, expected_share } = inputs;
    let byte_sides = byte_sides(device, params, left, right);
    let kernel = join_kernel(params, grid.is_some(), directory.is_some(), byte_sides.is_some(), kind)?;
    let tensor_cores = matches!(kernel, Kernel::BruteJoinTc | Kernel::BruteJoinTcBytes);
    if slots.is_empty() {
        return Ok(kernel);
    }
    let function = device.function(kernel)?;
    // brute_join_tc reads the sides' f16 rows, brute_join_tc_bytes their byte rows, in the f32
    // filter rows' place (and the byte rows' squared norms in the f32 ones').
    let (tc_rows, row_words) = match (byte_sides, &left.half_rows, &right.half_rows) {
        (Some((l, r)), ..) => (Some((&l.rows, &r.rows)), byte_row_words(params.dim as usize)),
        (None, Some(l), Some(r)) if tensor_cores => (Some((l, r)), tc_row_words(params.dim as usize)),
        _ if tensor_cores => return Err("brute_join_tc: a side has no f16 rows".into()),
        _ => (None, 0),
    };
    let left_tiles = slots.len().div_ceil(BRUTE_TILE);
    // brute_join_tc's run and queue, from twice the pairs expected a tile where the pass expects
    // many (kNN: `expected_share`); brute_join_tc_bytes decides every pair in its epilogue and
    // queues none; the other kernels have neither.
    let (run, queue) = match kernel {
        Kernel::BruteJoinTc => {
            let per_tile = 2.0 * expected_share * (BRUTE_TILE * BRUTE_TILE) as f64;
            let queue_most = tc_queue_most(
                device.shared_memory_per_block,
                device.shared_memory_per_multiprocessor,
                row_words,
                warpgroup_mma(device),
            );
            let run = tc_run(device, left_tiles, right_len as usize, per_tile, queue_most);
            (run, tc_queue(run, per_tile, queue_most))
        }
        Kernel::BruteJoinTcBytes => (tc_run(device, left_tiles, right_len as usize, 0.0, 0), 0),
        _ => (1, 0),
    };
    let params = &JoinParams { tc_run: run as u32, tc_queue: queue as u32, ..*params };
    let shared_mem_bytes = if tensor_cores { tc_shared_bytes(device, row_words, params.tc_queue as usize) } else { 0 };
    let maps = match tc_rows {
        Some((l, r)) => Some((tc_row_map(device, l, row_words)?, tc_row_map(device, r, row_words)?)),
        None => None,
    };
    if shared_mem_bytes > 0 {
        // More than the 48 KB a block gets without asking.
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| Error::Device(format!("{kernel}: {shared_mem_bytes} bytes of shared memory refused: {e}")))?;
    }
    // PASS_COUNT, PASS_WRITE and PASS_SCORES in kernels/join_pairs.cuh (a collecting count pass is
    // a count pass with a capacity).
    let pass_code: i32 = match kind {
        PassKind::Count | PassKind::CountAndCollect => 0,
        PassKind::Write => 1,
        PassKind::Scores { .. } => 2,
        PassKind::Work => 3,
    };
    check_pass_buffers(kernel, params, &slots, grid.is_some() || directory.is_some(), pass, kind)?;
    let capacity = match kind {
        PassKind::CountAndCollect => pass.out_left.len().min(pass.out_right.len()).min(pass.out_distance.len()) as u64,
        _ => 0,
    };
    let (begin, end) = (slots.start, slots.end);
    let launches = join_launches(&slots, grid.is_some(), directory.is_some(), kind, run, right_len);
    for (right_begin, blocks) in launches {
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes };
        let mut builder = stream.launch_builder(&function);
        builder.arg(params).arg(&begin).arg(&end);
        if grid.is_none() && directory.is_none() {
            builder.arg(&right_begin).arg(&right_len);
        }
        match tc_rows {
            Some((l, r)) => builder.arg(l).arg(r),
            None => builder.arg(&left.filter).arg(&right.filter),
        };
        builder
            .arg(left.exact.as_ref())
            .arg(right.exact.as_ref())
            .arg(&left.norms)
            .arg(&right.norms)
            .arg(&left.filter_norms)
            .arg(&right.filter_norms)
            .arg(&left.order)
            .arg(&right.order);
        match (grid, directory) {
            (_, Some(d)) => {
                builder.arg(&d.block_lo).arg(&d.block_hi).arg(&d.node_lo).arg(&d.node_hi).arg(&d.leaf_start)
            }
            (Some(g), None) => builder
                .arg(&g.left_slot_cell)
                .arg(&g.right_cell_ids)
                .arg(&g.right_cell_start)
                .arg(&g.cell_table)
                .arg(&g.left_sort_keys)
                .arg(&g.right_sort_keys),
            (None, None) => {
                match byte_sides {
                    Some((l, r)) => builder.arg(&l.sq_norms).arg(&r.sq_norms),
                    None => builder.arg(&left.filter_sq_norms).arg(&right.filter_sq_norms),
                };
                builder.arg(&pass.row_threshold).arg(&pass.row_limit)
            }
        };
        builder
            .arg(&mut pass.counts)
            .arg(&mut pass.offsets)
            .arg(&mut pass.out_left)
            .arg(&mut pass.out_right)
            .arg(&mut pass.out_distance)
            .arg(&mut pass.collected)
            .arg(&capacity)
            .arg(&pass_code);
        if let Some((left_map, right_map)) = &maps {
            builder.arg(left_map).arg(right_map);
        }
        // SAFETY: the arguments match the kernel's parameter list (brute_join.cu, tc_join.cu,
        // grid_join.cu, directory_join.cu) one for one (types and order). directory_join reads the
        // box of block s / DIRECTORY_BLOCK of every left slot s < `end` (block_lo and block_hi hold
        // one for every block of the left side's slots), and the nodes' boxes and leaf starts of a
        // directory of `params.levels` levels of `params.fanout` (node_lo, node_hi and leaf_start
        // sized for exactly that shape by gpu_join), whose leaf starts are right slots ≤ `right_len`. Every row buffer holds `dim` values per slot for all slots the
        // kernel reads: left slots < `end` ≤ left rows, right slots < `right_len` or within
        // `right_cell_start`; with `params.per_row`, `row_threshold` and `row_limit` hold a value
        // for every left slot; with the GEMM filter, `filter_norms` and `filter_sq_norms` hold one
        // per row of their side. `counts` and `offsets` hold at least `end - begin` entries (counts
        // zeroed before the count pass), except in a work pass: grid_join_work writes one count per
        // GRID_WORK_SAMPLE slots, which `counts` holds (checked above), and reads no offsets and
        // no rows. A collecting count pass stores a pair only at an index
        // below `capacity`, the length of all three output buffers; one with `slot_capacity`
        // only below (end − begin)·slot_capacity, which `out_right` and `out_distance` hold
        // (checked above). brute_join_tc gets the dynamic shared memory of its queue and 2 to 4
        // pipeline stages (tc_shared_bytes, allowed by the attribute set above) and uses no more
        // than the stages that size holds; its TMA maps (sm_90a) cover exactly its sides' f16 rows
        // (brute_join_tc_bytes: byte rows, `byte_row_words` a row, and one u32 squared norm a row
        // in the squared norms' place, which it reads as u32). A write pass's output buffers
        // hold at least the batch's total count, which it never exceeds because it re-finds
        // exactly the pairs the count pass counted (same inputs, same deterministic arithmetic),
        // each row within its own [offset, offset + count) range, whatever launches the right rows
        // are split into.
        unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    }
    Ok(kernel)
}

/// The kernel a join pass of `kind` runs: the directory's, the grid's, or brute force's (on the
/// tensor cores' byte or f16 rows where the sides have them).
fn join_kernel(params: &JoinParams, grid: bool, directory: bool, byte_sides: bool, kind: PassKind) -> Result<Kernel> {
    if kind == PassKind::Work {
        return match (directory, grid) {
            (true, _) => Err("directory_join: its work is estimated on the host".into()),
            (false, true) => Ok(Kernel::GridJoinWork),
            (false, false) => Err("grid_join_work: brute force has no cells".into()),
        };
    }
    Ok(if directory {
        Kernel::DirectoryJoin
    } else if grid {
        grid_kernel(params.dim as usize)
    } else if byte_sides {
        Kernel::BruteJoinTcBytes
    } else if params.tensor_cores != 0 {
        Kernel::BruteJoinTc
    } else {
        Kernel::BruteJoin
    })
}

/// What a pass of `kernel` over `slots` needs of its buffers, checked before the launch (its
/// SAFETY argument relies on them): a scores pass runs brute_join_tc with slots; slots of
/// `params.slot_capacity` pairs fit the outputs (and no index has slots); a work pass has a count
/// for every GRID_WORK_SAMPLE slots.
fn check_pass_buffers(
    kernel: Kernel,
    params: &JoinParams,
    slots: &std::ops::Range<u32>,
    indexed: bool,
    pass: &PassBuffers,
    kind: PassKind,
) -> Result<()> {
    if matches!(kind, PassKind::Scores { .. }) && (kernel != Kernel::BruteJoinTc || params.slot_capacity == 0) {
        return Err(Error::Device(format!("{kernel}: a scores pass needs brute_join_tc and slots")));
    }
    if params.slot_capacity > 0 && kind != PassKind::Write {
        let needed = slots.len() as u64 * params.slot_capacity as u64;
        if indexed || (pass.out_right.len().min(pass.out_distance.len()) as u64) < needed {
            return Err(Error::Device(format!(
                "{kernel}: slots of {} pairs for {} left rows need {needed} outputs",
                params.slot_capacity,
                slots.len()
            )));
        }
    }
    if kind == PassKind::Work && pass.counts.len() < slots.len().div_ceil(GRID_WORK_SAMPLE) {
        return Err(Error::Device(format!(
            "{kernel}: {} slots need more counts than {}",
            slots.len(),
            pass.counts.len()
        )));
    }
    Ok(())
}

/// A pass's launches as (first right row, blocks): the grid join one block per BLOCK left slots;
/// brute force one block per left tile of 128 rows and run of right tiles (brute_join one tile,
/// brute_join_tc `run`), left tiles fastest (brute_tile in brute_join.cuh), in as many launches
/// over consecutive runs as the 2³¹ − 1 blocks of a grid require.
fn join_launches(
    slots: &std::ops::Range<u32>,
    grid: bool,
    directory: bool,
    kind: PassKind,
    run: usize,
    right_len: u32,
) -> Vec<(u32, u32)> {
    let left_tiles = slots.len().div_ceil(BRUTE_TILE);
    if grid && kind == PassKind::Work {
        return vec![(0, slots.len().div_ceil(GRID_WORK_SAMPLE).div_ceil(BLOCK as usize) as u32)];
    }
    if grid || directory {
        return vec![(0, slots.len().div_ceil(BLOCK as usize) as u32)];
    }
    let run_rows = BRUTE_TILE * run;
    let runs = (right_len as usize).div_ceil(run_rows);
    let per_launch = (i32::MAX as usize / left_tiles).min(runs).max(1);
    (0..runs)
        .step_by(per_launch)
        .map(|first| ((first * run_rows) as u32, (left_tiles * per_launch.min(runs - first)) as u32))
        .collect()
}
