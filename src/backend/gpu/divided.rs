//! A join divided among several GPUs (multi.rs): the plan every GPU shares, and the ranges of left
//! slots each takes, of about equal work (GPU-Join's division by workload, Gowanlock & Karsin).

use std::time::Instant;

use datafusion::common::Result;

use crate::backend::gpu::sides::HostSide;
use crate::backend::gpu::{GpuBackend, MAX_PASS_ROWS, copy_failed};
use crate::backend::{JoinRequest, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{JoinInputs, PassBuffers};
use crate::cuda::launch::{GRID_WORK_SAMPLE, PassKind, join_pass};

/// A side's grid cell of every row and, under a window, every row's sort key.
type CellKeys = (Vec<u64>, Option<Vec<f64>>);

/// A join divided among several GPUs (multi.rs), prepared once for all of them (with the plan of
/// their shared request, [`JoinRequest::plan`]): the host's rows of each side and, under a grid,
/// every row's cell and sort key — work on the host's cores, which every GPU's thread made again at
/// the same time on the same cores (10M × 8 on two H100s: build_time 0.62 s on each against 0.20 s
/// on one GPU alone).
pub struct JoinParts<'a> {
    /// Each side's cells and sort keys (the left's, then the right's; a self-join's right is its left).
    pub(super) keys: [std::sync::OnceLock<CellKeys>; 2],
    /// Each side's host rows (the right's unused by a self-join).
    pub(super) sides: [std::sync::OnceLock<HostSide<'a>>; 2],
    pub(super) parts: usize,
}

impl<'a> JoinParts<'a> {
    /// The plan of join `request` divided into `parts`.
    pub fn new(request: &JoinRequest<'a>, parts: usize) -> Self {
        // Planned here, before the GPUs' threads start, so none of them waits on another's planning.
        request.plan();
        Self { keys: Default::default(), sides: Default::default(), parts }
    }
}

/// The `i`-th of `parts` ranges of a join's `n` left slots, of about equal work. Under a grid,
/// `work` holds every GRID_WORK_SAMPLE-th slot's estimated work (`GpuBackend::grid_work`), each
/// standing for itself and the slots up to the next sample (slot order is cell order, so those
/// are mostly slots of the same cell), and range `i` starts at the first sample where the work
/// before it reaches `i / parts` of the whole: GPU-Join's division by workload, which keeps
/// skewed data, whose dense cells hold most of the pairs, from loading one GPU with them. Brute
/// force compares every left slot with every right row (equal counts are equal work), or in a
/// self-join slot `s` with the `n − s − 1` after it, so there range `i` ends where that
/// triangle's area reaches `(i + 1) / parts` of the whole. Every GPU computes the same cuts from
/// the same grid, so the ranges cover the slots once.
pub(super) fn part_slots(
    n: usize,
    i: usize,
    parts: usize,
    work: Option<&[u32]>,
    self_join: bool,
) -> std::ops::Range<usize> {
    let prefix: Option<Vec<u64>> = work.map(|w| {
        std::iter::once(0)
            .chain(w.iter().scan(0u64, |sum, &x| {
                *sum += x as u64 + 1;
                Some(*sum)
            }))
            .collect()
    });
    let start = |i: usize| -> usize {
        if i >= parts {
            return n;
        }
        let share = i as f64 / parts as f64;
        let at = match &prefix {
            Some(prefix) => {
                let total = *prefix.last().expect("holds 0") as f64;
                let sample = prefix.partition_point(|&w| (w as f64) < share * total);
                sample * GRID_WORK_SAMPLE
            }
            None if self_join => (n as f64 * (1.0 - (1.0 - share).sqrt())).round() as usize,
            None => (n as f64 * share).round() as usize,
        };
        at.min(n)
    };
    start(i)..start(i + 1)
}

// Every pass of grid_work samples from its first slot.
const _: () = assert!(MAX_PASS_ROWS.is_multiple_of(GRID_WORK_SAMPLE));

impl GpuBackend {
    /// The estimated work of every GRID_WORK_SAMPLE-th of the grid join's `n` left slots (see
    /// [`PassKind::Work`]), for [`part_slots`].
    pub(super) fn grid_work(
        &self,
        params: &JoinParams,
        n: usize,
        inputs: JoinInputs,
        stats: &mut RunStats,
    ) -> Result<Vec<u32>, GpuError> {
        let estimating = Instant::now();
        let mut pass = PassBuffers::new(&self.device, MAX_PASS_ROWS.div_ceil(GRID_WORK_SAMPLE), 0)?;
        let mut work = Vec::with_capacity(n.div_ceil(GRID_WORK_SAMPLE));
        // MAX_PASS_ROWS is a multiple of GRID_WORK_SAMPLE: every launch samples from its first slot.
        for begin in (0..n).step_by(MAX_PASS_ROWS) {
            let end = (begin + MAX_PASS_ROWS).min(n);
            join_pass(&self.device, params, begin as u32..end as u32, inputs, &mut pass, PassKind::Work)?;
            let samples = (end - begin).div_ceil(GRID_WORK_SAMPLE);
            work.extend(self.device.stream.clone_dtoh(&pass.counts.slice(0..samples)).map_err(copy_failed)?);
        }
        stats.kernel_time += estimating.elapsed();
        Ok(work)
    }
}

#[cfg(test)]
mod tests {
    use super::part_slots;
    use crate::cuda::launch::GRID_WORK_SAMPLE;

    #[test]
    fn parts_cover_every_slot_once_with_about_equal_work() {
        // (grid, self-join): a grid's parts by sampled work, brute force's by its comparisons.
        for (grid, self_join) in [(true, true), (false, true), (false, false)] {
            for (n, parts) in [(0usize, 2), (1, 2), (7, 3), (1000, 2), (999_983, 8)] {
                // A grid's sampled work: skewed, the first tenth of the samples (a dense region's
                // cells) 100 times the rest's.
                let samples = n.div_ceil(GRID_WORK_SAMPLE);
                let sampled: Vec<u32> =
                    (0..samples).map(|s| if s < samples / 10 { 10_000 + s as u32 % 7 } else { 100 }).collect();
                let work_of = grid.then_some(sampled.as_slice());
                let ranges: Vec<_> = (0..parts).map(|i| part_slots(n, i, parts, work_of, self_join)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[parts - 1].end, n);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "{ranges:?}");
                // (A grid's 16 samples of 1,000 slots are too coarse to cut within 1 %.)
                if n >= 1000 && !(grid && n < 100_000) {
                    // Work per range within 1 % of an equal share (a grid's: its samples' work).
                    let work = |r: &std::ops::Range<usize>| -> f64 {
                        if grid {
                            let samples = r.start / GRID_WORK_SAMPLE..r.end.div_ceil(GRID_WORK_SAMPLE);
                            sampled[samples].iter().map(|&w| w as f64 + 1.0).sum()
                        } else if self_join {
                            r.clone().map(|s| (n - s - 1) as f64).sum()
                        } else {
                            r.len() as f64
                        }
                    };
                    let total: f64 = ranges.iter().map(work).sum();
                    for r in &ranges {
                        assert!((work(r) / total - 1.0 / parts as f64).abs() < 0.01, "{grid} {r:?}");
                    }
                }
            }
        }
    }
}
