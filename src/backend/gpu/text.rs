//! Edit-distance joins, range queries and kNN on the GPU (kernels/text.cu): the host maps the
//! strings' characters to a dense alphabet, orders the right strings by length and gives each left
//! string its window of that order (lengths within τ: the distance is at least the length
//! difference; a self-join's window starts after the string itself, so each unordered pair is met
//! once); the device measures every pair of a window by Myers' bit-parallel algorithm cut off at
//! τ. The distances are whole numbers either way, so answers equal the CPU's.
//!
//! kNN is a range search whose radius grows: every query runs within τ = 1, those with fewer than
//! `k` strings within τ again within 2τ, and so on. Once `k` strings lie within τ of a query, its
//! `k` nearest are among them (each farther string is more than τ away), so its `k` smallest by
//! (distance, position) are the answer, ties to the earlier base position as on the CPU. At τ ≥
//! max(query length, longest base string) every base string is within τ, so every query ends.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use datafusion::common::Result;
use rayon::slice::ParallelSliceMut;

use super::appended::appended_pairs;
use crate::backend::cpu::text::LengthOrder;
use crate::backend::gpu::{GpuBackend, RunResult};
use crate::backend::plan::topk::{Neighbour, Ranked, k_smallest, send_ranked};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{DeviceStrings, TEXT_MAX_WORDS, TextJoinInputs, text_join};
use crate::cuda::memory::upload;
use crate::vectors::Vectors;

/// The kNN's first radius: most queries of a dictionary have their nearest strings within 1 edit;
/// each round after doubles it.
const FIRST_KNN_TAU: u32 = 1;

/// The dense alphabet of `sides`' characters (sorted: a character's code is its rank).
pub(super) fn alphabet_of(sides: &[&Vectors]) -> Result<Vec<u32>, GpuError> {
    let mut alphabet: Vec<u32> = sides.iter().flat_map(|s| s.strings.chars.iter().copied()).collect();
    alphabet.par_sort_unstable();
    alphabet.dedup();
    let total_chars: usize = sides.iter().map(|s| s.strings.chars.len()).sum();
    if alphabet.len() > 1 << 16 || total_chars >= u32::MAX as usize {
        return Err(GpuError::Device(format!(
            "GPU text search: {} distinct characters in {total_chars} (at most 65,536 distinct, fewer than 2³² in all)",
            alphabet.len()
        )));
    }
    Ok(alphabet)
}

/// The pattern words the shared table needs for `strings` (the left side), or the error when one
/// is longer than the kernel takes.
pub(super) fn pattern_words(strings: &Vectors, rows: impl Iterator<Item = usize>) -> Result<usize, GpuError> {
    let words = rows.map(|i| strings.string(i).len().div_ceil(64).max(1)).max().unwrap_or(1);
    if words > TEXT_MAX_WORDS {
        return Err(GpuError::Device(format!(
            "GPU text search: a left string of more than {} characters (at most {})",
            64 * (words - 1),
            64 * TEXT_MAX_WORDS
        )));
    }
    Ok(words)
}

/// Strings as alphabet codes with their offsets, in the order given.
pub(super) fn coded(strings: &Vectors, order: impl Iterator<Item = usize>, alphabet: &[u32]) -> (Vec<u16>, Vec<u32>) {
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

/// The right side on the device: its strings in length order, coded, with their input positions.
struct RightStrings {
    order: LengthOrder,
    strings: DeviceStrings,
    positions: CudaSlice<u32>,
}

impl GpuBackend {
    /// Uploads `right` in length order, coded in `alphabet`.
    fn right_strings(&self, right: &Vectors, alphabet: &[u32], stats: &mut RunStats) -> Result<RightStrings, GpuError> {
        let order = LengthOrder::new(right);
        let (chars, offsets) = coded(right, order.positions.iter().map(|&p| p as usize), alphabet);
        let uploading = Instant::now();
        let strings = DeviceStrings { chars: upload(&self.device, &chars)?, offsets: upload(&self.device, &offsets)? };
        let positions = upload(&self.device, &order.positions)?;
        stats.transfer_time += uploading.elapsed();
        Ok(RightStrings { order, strings, positions })
    }

    /// Every pair of left string `i` (of `left`, in the order `rows` gives: pair lefts are
    /// indices into it) with right strings `windows[i]` of `right`'s length order within `tau`,
    /// handed to `each` as (left index, right position, distance) batches. A launch whose pairs
    /// overflow the output runs again in halves.
    #[allow(clippy::too_many_arguments)]
    fn text_pairs(
        &self,
        left: &Vectors,
        rows: &[u32],
        right: &RightStrings,
        alphabet: &[u32],
        windows: &[std::ops::Range<usize>],
        tau: u32,
        budget: usize,
        stats: &mut RunStats,
        each: impl FnMut(&[u32], &[u32], &[u32]) -> Result<()>,
    ) -> RunResult<()> {
        let words = pattern_words(left, rows.iter().map(|&i| i as usize))?;
        stats.candidates += windows.iter().map(|w| w.len() as u64).sum::<u64>();
        let (left_chars, left_offsets) = coded(left, rows.iter().map(|&i| i as usize), alphabet);
        let (window_start, window_end): (Vec<u32>, Vec<u32>) =
            windows.iter().map(|w| (w.start as u32, w.end as u32)).unzip();
        let uploading = Instant::now();
        let left_strings =
            DeviceStrings { chars: upload(&self.device, &left_chars)?, offsets: upload(&self.device, &left_offsets)? };
        let (window_start, window_end) = (upload(&self.device, &window_start)?, upload(&self.device, &window_end)?);
        stats.transfer_time += uploading.elapsed();
        let inputs = TextJoinInputs {
            left: &left_strings,
            right: &right.strings,
            right_positions: &right.positions,
            window_start: &window_start,
            window_end: &window_end,
            alphabet: alphabet.len() as u32,
            words: words as u32,
            tau,
        };
        appended_pairs(
            &self.device,
            rows.len() as u32,
            budget,
            stats,
            |part, out| text_join(&self.device, &inputs, part, out),
            each,
        )
    }

    pub(super) fn gpu_text_join(
        &self,
        request: &JoinRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> RunResult<RunStats> {
        let JoinRequest { left, right, threshold, self_join, .. } = *request;
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if left.is_empty() || right.is_empty() {
            return Ok(stats);
        }
        self.device.function(Kernel::TextJoin)?;
        let start = Instant::now();
        let tau = threshold as u32;
        // A self-join's right side is its left (the same vectors).
        let sides = [left, right];
        let alphabet = alphabet_of(if self_join.is_some() { &sides[..1] } else { &sides })?;
        let right_strings = self.right_strings(right, &alphabet, &mut stats)?;
        let order = &right_strings.order;
        let rank: Vec<u32> = match self_join {
            Some(_) => {
                let mut rank = vec![0u32; order.positions.len()];
                order.positions.iter().enumerate().for_each(|(r, &p)| rank[p as usize] = r as u32);
                rank
            }
            None => Vec::new(),
        };
        let windows: Vec<std::ops::Range<usize>> = (0..left.len())
            .map(|i| {
                let window = order.window(left.string(i).len(), tau as usize);
                // A self-join's window starts after the string itself (each pair once).
                let start = match self_join {
                    Some(_) => (rank[i] as usize + 1).max(window.start),
                    None => window.start,
                };
                start.min(window.end)..window.end
            })
            .collect();
        let rows: Vec<u32> = (0..left.len() as u32).collect();
        stats.build_time = start.elapsed();

        let probe = Instant::now();
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        self.text_pairs(left, &rows, &right_strings, &alphabet, &windows, tau, budget, &mut stats, |l, r, d| {
            for ((&a, &b), &d) in l.iter().zip(r).zip(d) {
                // A self-join's pair with its smaller position first.
                let (a, b) = if self_join.is_some() && a > b { (b, a) } else { (a, b) };
                writer.push(a, b, d as f64)?;
            }
            Ok(())
        })?;
        if self_join.is_some_and(|s| s.include_self) {
            for a in 0..left.len() as u32 {
                writer.push(a, a, 0.0)?;
            }
        }
        writer.flush()?;
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }

    /// The `k` nearest base strings of every query (see the module documentation).
    pub(super) fn gpu_text_knn(
        &self,
        request: &KnnRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> RunResult<RunStats> {
        let KnnRequest { base, queries, k, .. } = *request;
        let k = k.min(base.len());
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if k == 0 || queries.is_empty() {
            return Ok(stats);
        }
        self.device.function(Kernel::TextJoin)?;
        let start = Instant::now();
        let alphabet = alphabet_of(&[queries, base])?;
        let right = self.right_strings(base, &alphabet, &mut stats)?;
        stats.build_time = start.elapsed();

        let probe = Instant::now();
        let mut lists: Vec<Vec<Neighbour>> = vec![Vec::new(); queries.len()];
        let mut pending: Vec<u32> = (0..queries.len() as u32).collect();
        let mut tau = FIRST_KNN_TAU;
        while !pending.is_empty() {
            let windows: Vec<std::ops::Range<usize>> =
                pending.iter().map(|&q| right.order.window(queries.string(q as usize).len(), tau as usize)).collect();
            let mut found: Vec<Vec<Neighbour>> = vec![Vec::new(); pending.len()];
            self.text_pairs(queries, &pending, &right, &alphabet, &windows, tau, budget, &mut stats, |l, r, d| {
                for ((&j, &position), &d) in l.iter().zip(r).zip(d) {
                    found[j as usize].push(Neighbour { distance: d as f64, position });
                }
                Ok(())
            })?;
            stats.count_passes += 1;
            let mut rest = Vec::new();
            for (&q, within) in pending.iter().zip(found) {
                let everything = tau as usize >= queries.string(q as usize).len().max(right.order.longest);
                if within.len() >= k || everything {
                    lists[q as usize] = k_smallest(within, k);
                } else {
                    rest.push(q);
                }
            }
            pending = rest;
            tau = tau.saturating_mul(2);
        }
        sink.start(1);
        let sent = send_ranked(sink, lists.into_iter().enumerate().map(|(q, list)| (q, Ranked::List(list))).collect());
        sink.advance(1);
        stats.probe_time = probe.elapsed();
        sent?;
        Ok(stats)
    }
}
