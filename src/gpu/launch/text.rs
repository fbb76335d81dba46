//! The edit-distance join (kernels/text.cu).

use super::*;

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

/// Where a launch appends its pairs, and how many it found.
#[derive(Debug)]
pub struct TextJoinOutput {
    pub left: CudaSlice<u32>,
    pub right: CudaSlice<u32>,
    pub distance: CudaSlice<u32>,
    pub count: CudaSlice<u64>,
}

impl TextJoinOutput {
    /// Room for `capacity` pairs.
    pub fn new(device: &GpuDevice, capacity: usize) -> Result<Self> {
        let stream = &device.stream;
        Ok(Self {
            left: zeroed(stream, capacity.max(1))?,
            right: zeroed(stream, capacity.max(1))?,
            distance: zeroed(stream, capacity.max(1))?,
            count: zeroed(stream, 1)?,
        })
    }
}

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
    let stream = &device.stream;
    stream
        .memset_zeros(&mut out.count)
        .map_err(|e| Error::Device(format!("text_join: clearing the count failed: {e}")))?;
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
    let capacity = out.left.len() as u64;
    let (first, count) = (rows.start, rows.len() as u32);
    let mut builder = stream.launch_builder(&function);
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
        .arg(&inputs.tau)
        .arg(&mut out.left)
        .arg(&mut out.right)
        .arg(&mut out.distance)
        .arg(&mut out.count)
        .arg(&capacity);
    // SAFETY: text_join(const u16*, const u32*, u32, u32, const u16*, const u32*, const u32*,
    // const u32*, const u32*, u32, u32, u32, u32*, u32*, u32*, u64*, u64): blocks read left
    // strings first .. first + count, below the left offsets' length minus one (checked above),
    // whose offsets index the left chars they were built from, and each its window, within the
    // right strings (windows are built from the right offsets, checked above to cover
    // right_positions); the pattern table of alphabet · words words fits the dynamic shared memory
    // asked for, every left code is below `alphabet` and every left string has at most `words`
    // words (the host built both from these strings); pairs are written at slots below `capacity`,
    // the output buffers' length, and `count` holds one value.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("text_join launch failed: {e}")))?;
    let mut found = [0u64];
    stream.memcpy_dtoh(&out.count, &mut found).map_err(|e| Error::Device(format!("text_join failed: {e}")))?;
    Ok(found[0])
}
