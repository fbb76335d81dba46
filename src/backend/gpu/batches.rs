//! How a join's pairs are cut into work: the ranges of left slots a collecting count pass is
//! divided into, the batches its collected pairs come down in, the write passes' batches cut from
//! each slot's count, and the offsets each slot's pairs are written at.

use std::ops::Range;

use crate::backend::gpu::MAX_PASS_ROWS;

/// Parts the collecting count pass is divided into, each run while the host downloads and emits
/// the pairs of the parts before it (`collect_in_parts`).
const COLLECT_PARTS: usize = 4;

/// Least brute-force work (pairs compared × dimensions) divided into parts: P5's 1M × 32
/// self-join (1.6·10¹³) runs 10–20 % sooner in parts, its 0.2 s of kernels hiding the copies.
/// Grids are not divided: their kernels take milliseconds against the emission of their pairs,
/// and in parts 2M × 3 blobs and 4M × 2 exponential self-joins took 25–60 % longer
/// (docs/design.md#multi-gpu).
const COLLECT_PARTS_WORK: f64 = (1u64 << 40) as f64;

/// The collecting count pass's parts over `slots` (left slots of brute force against `right`
/// rows of `dim` dimensions; a self-join's slot `s` compares with the `right − s − 1` after it),
/// of equal work: equal areas of a self-join's triangle, equal counts otherwise. A single part
/// below [`COLLECT_PARTS_WORK`], under a grid, or where the slots exceed one pass.
pub(super) fn collect_parts(
    slots: Range<usize>,
    right: usize,
    dim: usize,
    grid: bool,
    self_join: bool,
) -> Vec<Range<usize>> {
    // Work of the slots before `s`.
    let work = |s: usize| -> f64 {
        let s = s as f64;
        if self_join { s * (right as f64 - 1.0) - s * (s - 1.0) / 2.0 } else { s * right as f64 }
    };
    let (first, whole) = (work(slots.start), work(slots.end) - work(slots.start));
    if grid || whole * (dim as f64) < COLLECT_PARTS_WORK || slots.len() > MAX_PASS_ROWS {
        return vec![slots];
    }
    let parts = COLLECT_PARTS.min(slots.len()).max(1);
    let mut cuts = vec![slots.start];
    for j in 1..parts {
        let target = first + whole * j as f64 / parts as f64;
        let (mut lo, mut hi) = (*cuts.last().unwrap_or(&slots.start), slots.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if work(mid) < target { lo = mid + 1 } else { hi = mid }
        }
        cuts.push(lo);
    }
    cuts.push(slots.end);
    cuts.windows(2).map(|w| w[0]..w[1]).filter(|r| !r.is_empty()).collect()
}

/// Result pairs a join's count pass collects per left row at most (the size of its output
/// buffers, 16 bytes a pair on the device): ε-joins are usually asked for tens to a few hundred
/// neighbours per row (the seeds calibrate ε to 64–256), and then the count pass alone produces the
/// result. A join with more per row gets write passes, as one too large for device memory does.
pub(super) const COLLECT_PAIRS_PER_ROW: usize = 256;

/// One downloaded and emitted batch of a join's pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ResultBatch {
    /// Pairs the count pass collected, at these indices of the output buffers.
    Collected(std::ops::Range<u64>),
    /// A write pass over these left slots, producing this many pairs.
    Written { slots: std::ops::Range<usize>, pairs: u64 },
}

impl ResultBatch {
    pub(super) fn pairs(&self) -> u64 {
        match self {
            ResultBatch::Collected(at) => at.end - at.start,
            ResultBatch::Written { pairs, .. } => *pairs,
        }
    }
}

/// Pairs per download batch of a count pass's collected pairs (64 MiB on the host; two batches'
/// worth of page-locked memory per run): small enough that copying one overlaps the emission of
/// the previous one for most of a large result, and that a process's first query page-locks
/// 128 MiB rather than the 1 GiB of two MAX_BATCH_PAIRS halves.
pub(super) const RESULT_BATCH_PAIRS: u64 = 1 << 22;

/// Download batches of `collected` pairs of a count pass: RESULT_BATCH_PAIRS each, the last fewer.
pub(super) fn collected_batches(collected: u64) -> Vec<ResultBatch> {
    (0..collected)
        .step_by(RESULT_BATCH_PAIRS as usize)
        .map(|at| ResultBatch::Collected(at..(at + RESULT_BATCH_PAIRS).min(collected)))
        .collect()
}

/// Write-pass batches `(first slot, end slot, pairs)` over consecutive left slots, each at most
/// `max_pairs` pairs and MAX_PASS_ROWS slots (a slot with more pairs gets a batch of its own),
/// and the output capacity the largest batch needs.
pub(super) fn write_batches(counts: &[u32], max_pairs: u64) -> (Vec<(usize, usize, u64)>, usize) {
    let mut batches = Vec::new();
    let (mut begin, mut total) = (0usize, 0u64);
    for (slot, &c) in counts.iter().enumerate() {
        if (total + c as u64 > max_pairs || slot - begin == MAX_PASS_ROWS) && slot > begin {
            batches.push((begin, slot, total));
            begin = slot;
            total = 0;
        }
        total += c as u64;
    }
    batches.push((begin, counts.len(), total));
    let capacity = batches.iter().map(|b| b.2).max().unwrap_or(0).max(1) as usize;
    (batches, capacity)
}

/// Where each slot's pairs start in a batch's output, plus the end: an exclusive prefix sum.
pub(super) fn exclusive_offsets(counts: &[u32]) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut at = 0u64;
    offsets.push(at);
    for &c in counts {
        at += c as u64;
        offsets.push(at);
    }
    offsets
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::{
        COLLECT_PARTS, RESULT_BATCH_PAIRS, ResultBatch, collect_parts, collected_batches, exclusive_offsets,
        write_batches,
    };
    use crate::backend::gpu::{MAX_BATCH_PAIRS, MAX_PASS_ROWS, output_pairs};

    #[test]
    fn collect_parts_cover_the_slots_once_with_about_equal_work() {
        // Grids, and brute force below 2⁴⁰ pair-dimensions: one part.
        assert_eq!(collect_parts(0..2_000_000, 2_000_000, 2, true, true), vec![0..2_000_000]);
        assert_eq!(collect_parts(0..70_000, 70_000, 32, false, true), vec![0..70_000]);
        for (slots, n, self_join) in
            [(0..1_000_000, 1_000_000, true), (292_893..1_000_000, 1_000_000, true), (0..100_000, 1_000_000, false)]
        {
            let parts = collect_parts(slots.clone(), n, 32, false, self_join);
            assert_eq!(parts.len(), COLLECT_PARTS, "{slots:?}");
            assert_eq!(parts[0].start, slots.start);
            assert_eq!(parts[COLLECT_PARTS - 1].end, slots.end);
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start), "{parts:?}");
            let work = |r: &Range<usize>| -> f64 {
                if self_join { r.clone().map(|s| (n - s - 1) as f64).sum() } else { r.len() as f64 }
            };
            let total: f64 = parts.iter().map(work).sum();
            for part in &parts {
                assert!((work(part) / total - 1.0 / COLLECT_PARTS as f64).abs() < 0.01, "{part:?} of {parts:?}");
            }
        }
    }

    #[test]
    fn write_batches_cover_every_slot_once_within_the_limits() {
        let big = MAX_BATCH_PAIRS as u32;
        let counts = [3, big - 2, 1, 1, big + 5, 0, 7];
        let (batches, capacity) = write_batches(&counts, MAX_BATCH_PAIRS);
        assert_eq!(batches, vec![(0, 1, 3), (1, 4, big as u64), (4, 5, big as u64 + 5), (5, 7, 7)]);
        assert_eq!(capacity, big as usize + 5, "a slot over the limit gets a batch of its own");
        let many = vec![1u32; MAX_PASS_ROWS + 3];
        let (batches, _) = write_batches(&many, MAX_BATCH_PAIRS);
        assert_eq!(batches, vec![(0, MAX_PASS_ROWS, MAX_PASS_ROWS as u64), (MAX_PASS_ROWS, MAX_PASS_ROWS + 3, 3)]);
        assert_eq!(write_batches(&[], MAX_BATCH_PAIRS), (vec![(0, 0, 0)], 1));
        // A small memory budget: batches of its quarter's worth of pairs.
        assert_eq!(output_pairs(64 * 4 * 16), 64);
        assert_eq!(
            write_batches(&[40, 30, 20, 15], output_pairs(64 * 4 * 16)).0,
            vec![(0, 1, 40), (1, 3, 50), (3, 4, 15)]
        );
        assert_eq!(exclusive_offsets(&[3, 0, 2]), vec![0, 3, 3, 5]);
    }

    #[test]
    fn collected_pairs_download_in_batches_within_the_limit() {
        let big = RESULT_BATCH_PAIRS;
        assert_eq!(collected_batches(0), vec![]);
        assert_eq!(collected_batches(5), vec![ResultBatch::Collected(0..5)]);
        assert_eq!(collected_batches(big), vec![ResultBatch::Collected(0..big)]);
        let batches = collected_batches(2 * big + 1);
        assert_eq!(
            batches,
            vec![
                ResultBatch::Collected(0..big),
                ResultBatch::Collected(big..2 * big),
                ResultBatch::Collected(2 * big..2 * big + 1)
            ]
        );
        assert_eq!(batches.iter().map(ResultBatch::pairs).sum::<u64>(), 2 * big + 1);
    }
}
