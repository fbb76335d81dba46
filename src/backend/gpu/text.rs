//! Edit-distance joins and range queries on the GPU (kernels/text.cu): the host maps the strings'
//! characters to a dense alphabet, orders the right strings by length and gives each left string
//! its window of that order (lengths within τ: the distance is at least the length difference; a
//! self-join's window starts after the string itself, so each unordered pair is met once); the
//! device measures every pair of a window by Myers' bit-parallel algorithm cut off at τ. The
//! distances are whole numbers either way, so answers equal the CPU's.

use super::*;
use crate::backend::text::LengthOrder;
use crate::gpu::launch::{DeviceStrings, TEXT_MAX_WORDS, TextJoinInputs, TextJoinOutput, text_join};

/// Most pairs one launch appends (12 bytes each on the device: 768 MiB).
const MAX_TEXT_PAIRS: usize = 1 << 26;

/// Strings as alphabet codes with their offsets, in the order given.
fn coded(strings: &Vectors, order: impl Iterator<Item = usize>, alphabet: &[u32]) -> (Vec<u16>, Vec<u32>) {
    let mut chars = Vec::with_capacity(strings.strings.chars.len());
    let mut offsets = vec![0u32];
    for i in order {
        chars.extend(
            strings.string(i).iter().map(|c| alphabet.binary_search(c).expect("every character is coded") as u16),
        );
        offsets.push(chars.len() as u32);
    }
    (chars, offsets)
}

impl GpuBackend {
    pub(super) fn gpu_text_join(
        &self,
        request: &JoinRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> Result<Result<RunStats>, GpuError> {
        let JoinRequest { left, right, threshold, self_join, .. } = *request;
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if left.is_empty() || right.is_empty() {
            return Ok(Ok(stats));
        }
        self.device.function(Kernel::TextJoin)?;
        let start = Instant::now();
        let tau = threshold as u32;
        let mut alphabet: Vec<u32> = left.strings.chars.clone();
        if self_join.is_none() {
            alphabet.extend_from_slice(&right.strings.chars);
        }
        alphabet.par_sort_unstable();
        alphabet.dedup();
        let total_chars = left.strings.chars.len() + right.strings.chars.len();
        if alphabet.len() > 1 << 16 || total_chars >= u32::MAX as usize {
            return Err(GpuError::Device(format!(
                "GPU text join: {} distinct characters in {total_chars} (at most 65,536 distinct, fewer than 2³² in all)",
                alphabet.len()
            )));
        }
        let words = (0..left.len()).map(|i| left.string(i).len().div_ceil(64).max(1)).max().unwrap_or(1);
        if words > TEXT_MAX_WORDS {
            return Err(GpuError::Device(format!(
                "GPU text join: a left string of more than {} characters (at most {})",
                64 * (words - 1),
                64 * TEXT_MAX_WORDS
            )));
        }
        // The right strings by (length, position): a left string's window is one run of them.
        let order = LengthOrder::new(right);
        let rank: Vec<u32> = match self_join {
            Some(_) => {
                let mut rank = vec![0u32; order.positions.len()];
                order.positions.iter().enumerate().for_each(|(r, &p)| rank[p as usize] = r as u32);
                rank
            }
            None => Vec::new(),
        };
        let (window_start, window_end): (Vec<u32>, Vec<u32>) = (0..left.len())
            .map(|i| {
                let window = order.window(left.string(i).len(), tau as usize);
                // A self-join's window starts after the string itself (each pair once).
                let start = match self_join {
                    Some(_) => (rank[i] as usize + 1).max(window.start),
                    None => window.start,
                };
                (start.min(window.end) as u32, window.end as u32)
            })
            .unzip();
        stats.candidates = window_start.iter().zip(&window_end).map(|(s, e)| (e - s) as u64).sum();
        let (left_chars, left_offsets) = coded(left, 0..left.len(), &alphabet);
        // A self-join's right side is its left (the same vectors).
        let (right_chars, right_offsets) = coded(right, order.positions.iter().map(|&p| p as usize), &alphabet);
        stats.build_time = start.elapsed();

        let uploading = Instant::now();
        let left_strings =
            DeviceStrings { chars: upload(&self.device, &left_chars)?, offsets: upload(&self.device, &left_offsets)? };
        let right_strings = DeviceStrings {
            chars: upload(&self.device, &right_chars)?,
            offsets: upload(&self.device, &right_offsets)?,
        };
        let right_positions = upload(&self.device, &order.positions)?;
        let (window_start, window_end) = (upload(&self.device, &window_start)?, upload(&self.device, &window_end)?);
        stats.transfer_time += uploading.elapsed();
        let inputs = TextJoinInputs {
            left: &left_strings,
            right: &right_strings,
            right_positions: &right_positions,
            window_start: &window_start,
            window_end: &window_end,
            alphabet: alphabet.len() as u32,
            words: words as u32,
            tau,
        };
        let mut capacity = (budget / 4 / 12).clamp(1 << 16, MAX_TEXT_PAIRS);
        let mut out = TextJoinOutput::new(&self.device, capacity)?;
        let probe = Instant::now();
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        // Parts of the left strings, each run once more in halves while its pairs overflow.
        let mut parts: Vec<std::ops::Range<u32>> = Vec::with_capacity(8);
        parts.push(0..left.len() as u32);
        let (mut left_pairs, mut right_pairs, mut distances) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(rows) = parts.pop() {
            let launched = Instant::now();
            let found = text_join(&self.device, &inputs, rows.clone(), &mut out)?;
            stats.kernel_time += launched.elapsed();
            if found > capacity as u64 {
                if rows.len() > 1 {
                    let middle = rows.start + rows.len() as u32 / 2;
                    parts.push(middle..rows.end);
                    parts.push(rows.start..middle);
                } else {
                    capacity = found as usize;
                    out = TextJoinOutput::new(&self.device, capacity)?;
                    parts.push(rows);
                }
                continue;
            }
            let found = found as usize;
            let copying = Instant::now();
            let stream = &self.device.stream;
            let copy = |e: cudarc::driver::DriverError| GpuError::Device(format!("GPU copy failed: {e}"));
            left_pairs.resize(found, 0u32);
            right_pairs.resize(found, 0u32);
            distances.resize(found, 0u32);
            if found > 0 {
                stream.memcpy_dtoh(&out.left.slice(0..found), &mut left_pairs[..]).map_err(copy)?;
                stream.memcpy_dtoh(&out.right.slice(0..found), &mut right_pairs[..]).map_err(copy)?;
                stream.memcpy_dtoh(&out.distance.slice(0..found), &mut distances[..]).map_err(copy)?;
            }
            stats.transfer_time += copying.elapsed();
            let emitting = Instant::now();
            for ((&a, &b), &d) in left_pairs.iter().zip(&right_pairs).zip(&distances) {
                // A self-join's pair with its smaller position first.
                let (a, b) = if self_join.is_some() && a > b { (b, a) } else { (a, b) };
                if let Err(e) = writer.push(a, b, d as f64) {
                    return Ok(Err(e));
                }
            }
            stats.emit_time += emitting.elapsed();
        }
        if self_join.is_some_and(|s| s.include_self) {
            for a in 0..left.len() as u32 {
                if let Err(e) = writer.push(a, a, 0.0) {
                    return Ok(Err(e));
                }
            }
        }
        if let Err(e) = writer.flush() {
            return Ok(Err(e));
        }
        stats.probe_time = probe.elapsed();
        Ok(Ok(stats))
    }
}
