//! The edit-distance join (kernels/text.cu).

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits, sys};

use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// Threads per block of text_join: one block per left string.
const TEXT_BLOCK: u32 = 128;
/// Most blocks of a launch (each loops over further left strings).
const TEXT_BLOCKS: u32 = 1 << 16;
/// Words of the longest pattern text_join takes (`TEXT_MAX_WORDS` in kernels/text.cu).
pub const TEXT_MAX_WORDS: usize = 8;

/// One side's strings on the device: each character as its alphabet code, and where each string
/// starts (one more offset than strings).
#[derive(Debug)]
pub struct DeviceStrings {
    pub chars: CudaSlice<u16>,
    pub offsets: CudaSlice<u32>,
}

/// A launch's inputs: left strings, right strings in length order with their input positions, and
/// each left string's window of that order.
#[derive(Debug)]
pub struct TextJoinInputs<'a> {
    pub left: &'a DeviceStrings,
    pub right: &'a DeviceStrings,
    pub right_positions: &'a CudaSlice<u32>,
    pub window_start: &'a CudaSlice<u32>,
    pub window_end: &'a CudaSlice<u32>,
    pub alphabet: u32,
    /// Pattern words the shared table holds (the longest left string's).
    pub words: u32,
    pub tau: u32,
}

/// Where a launch appends its pairs (left row, right position, distance `D`), and how many it
/// found.
#[derive(Debug)]
pub struct PairOutput<D> {
    pub left: CudaSlice<u32>,
    pub right: CudaSlice<u32>,
    pub distance: CudaSlice<D>,
    pub count: CudaSlice<u64>,
    /// Pairs each buffer holds.
    capacity: u64,
}

impl<D: DeviceRepr + ValidAsZeroBits> PairOutput<D> {
    /// Room for `capacity` pairs.
    pub fn new(device: &GpuDevice, capacity: usize) -> Result<Self> {
        let stream = &device.stream;
        Ok(Self {
            left: zeroed(stream, capacity.max(1))?,
            right: zeroed(stream, capacity.max(1))?,
            distance: zeroed(stream, capacity.max(1))?,
            count: zeroed(stream, 1)?,
            capacity: capacity.max(1) as u64,
        })
    }

    /// Pairs it holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The kernel arguments that append to it: the three buffers, the count and the capacity.
    pub(super) fn push_args<'a>(&'a mut self, builder: &mut cudarc::driver::LaunchArgs<'a>) {
        builder
            .arg(&mut self.left)
            .arg(&mut self.right)
            .arg(&mut self.distance)
            .arg(&mut self.count)
            .arg(&self.capacity);
    }

    /// Clears the count before a launch.
    pub(super) fn clear(&mut self, device: &GpuDevice, kernel: Kernel) -> Result<()> {
        device
            .stream
            .memset_zeros(&mut self.count)
            .map_err(|e| Error::Device(format!("{kernel}: clearing the count failed: {e}")))
    }

    /// Waits for the launch and returns the pairs it found (more than the output holds when it
    /// overflowed: nothing past its capacity was written).
    pub(super) fn found(&self, device: &GpuDevice, kernel: Kernel) -> Result<u64> {
        let mut found = [0u64];
        device
            .stream
            .memcpy_dtoh(&self.count, &mut found)
            .map_err(|e| Error::Device(format!("{kernel} failed: {e}")))?;
        Ok(found[0])
    }
}

/// The edit-distance join's output: whole edits.
pub type TextJoinOutput = PairOutput<u32>;

/// Shared memory text_join needs: the pattern table of `alphabet` codes × `words`.
pub fn text_join_shared_bytes(alphabet: usize, words: usize) -> usize {
    alphabet * words * std::mem::size_of::<u64>()
}

/// Runs text_join over left strings `rows`, appending to `out` (its count reset first), waits, and
/// returns the pairs found (more than `out` holds when it overflowed: nothing past its capacity
/// was written).
pub fn text_join(
    device: &GpuDevice,
    inputs: &TextJoinInputs,
    rows: std::ops::Range<u32>,
    out: &mut TextJoinOutput,
) -> Result<u64> {
    let shared = text_join_shared_bytes(inputs.alphabet as usize, inputs.words as usize);
    let left_rows = inputs.left.offsets.len().saturating_sub(1);
    let right_rows = inputs.right.offsets.len().saturating_sub(1);
    if shared > device.shared_memory_per_block
        || inputs.words as usize > TEXT_MAX_WORDS
        || rows.end as usize > left_rows
        || inputs.window_start.len() < left_rows
        || inputs.window_end.len() < left_rows
        || inputs.right_positions.len() < right_rows
    {
        return Err(Error::Device(format!(
            "text_join: {} left and {right_rows} right strings, rows {rows:?}, {} windows, a table of {} codes × {} words ({shared} bytes of shared memory, {} allowed)",
            left_rows,
            inputs.window_start.len(),
            inputs.alphabet,
            inputs.words,
            device.shared_memory_per_block
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, Kernel::TextJoin)?;
    let function = device.function(Kernel::TextJoin)?;
    if shared > 48 << 10 {
        function
            .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared as i32)
            .map_err(|e| Error::Device(format!("text_join: asking for {shared} bytes of shared memory failed: {e}")))?;
    }
    let config = LaunchConfig {
        grid_dim: (rows.len().min(TEXT_BLOCKS as usize) as u32, 1, 1),
        block_dim: (TEXT_BLOCK, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let (first, count) = (rows.start, rows.len() as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&inputs.left.chars)
        .arg(&inputs.left.offsets)
        .arg(&first)
        .arg(&count)
        .arg(&inputs.right.chars)
        .arg(&inputs.right.offsets)
        .arg(inputs.right_positions)
        .arg(inputs.window_start)
        .arg(inputs.window_end)
        .arg(&inputs.alphabet)
        .arg(&inputs.words)
        .arg(&inputs.tau);
    out.push_args(&mut builder);
    // SAFETY: text_join(const u16*, const u32*, u32, u32, const u16*, const u32*, const u32*,
    // const u32*, const u32*, u32, u32, u32, u32*, u32*, u32*, u64*, u64): blocks read left
    // strings first .. first + count, below the left offsets' length minus one (checked above),
    // whose offsets index the left chars they were built from, and each its window, within the
    // right strings (windows are built from the right offsets, checked above to cover
    // right_positions); the pattern table of alphabet · words words fits the dynamic shared memory
    // asked for, every left code is below `alphabet` and every left string has at most `words`
    // words (the host built both from these strings); pairs are written at slots below the output's capacity,
    // its buffers' length, and `count` holds one value.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("text_join launch failed: {e}")))?;
    out.found(device, Kernel::TextJoin)
}
