//! Text metrics (`metric=levenshtein`) on every CPU core.
//!
//! * ε-join / range query: the right side (the base) is indexed by the segment filter of
//!   `index::segments` (PASS-JOIN), each left string gathers its candidates there, and every
//!   candidate is verified by the bit-parallel distance cut off at the threshold. `index=brute_force`
//!   verifies every right string whose length is within the threshold instead.
//! * kNN: the base ordered by length; each query scans it outwards from its own length, with the
//!   distance cut off at its current k-th nearest, and stops once the length difference alone
//!   exceeds that (the distance is at least the length difference).

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;

use crate::backend::plan::topk::{Neighbour, rank_in_waves};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::index::segments::SegmentIndex;
use crate::op::IndexChoice;
use crate::vectors::Vectors;

mod levenshtein;

pub use levenshtein::Pattern;
#[cfg(test)]
pub use levenshtein::levenshtein;
use rayon::iter::{IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

/// Left strings per unit of parallel work.
const BLOCK: usize = 256;

/// How a text join finds its candidates.
enum Candidates {
    Segments(SegmentIndex),
    /// Right positions ordered by (length, position), and where each length begins.
    ByLength(LengthOrder),
}

/// Every (left, right) pair within the threshold.
pub fn join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let JoinRequest { left, right, threshold, self_join, index, .. } = *request;
    let mut stats = RunStats::default();
    if left.is_empty() || right.is_empty() {
        return Ok(stats);
    }
    let tau = threshold as usize;
    let max = threshold as u32;
    let candidates = match index {
        IndexChoice::BruteForce => Candidates::ByLength(LengthOrder::new(right)),
        _ => Candidates::Segments(SegmentIndex::build(right.len(), |i| right.string(i), tau)),
    };
    stats.build_time = start.elapsed();
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    let unordered_self = self_join.is_some();
    let include_self = self_join.is_some_and(|s| s.include_self);
    let blocks = left.len().div_ceil(BLOCK);
    sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        let mut found = Vec::new();
        let mut count = 0u64;
        for a in b * BLOCK..((b + 1) * BLOCK).min(left.len()) {
            let probe = left.string(a);
            found.clear();
            match &candidates {
                Candidates::Segments(index) => index.candidates(probe, &mut found),
                Candidates::ByLength(order) => found.extend_from_slice(order.within(probe.len(), tau)),
            }
            // Each unordered self-join pair once, from its smaller position.
            if unordered_self {
                found.retain(|&r| r as usize > a);
            }
            found.sort_unstable();
            found.dedup();
            let pattern = Pattern::new(probe);
            count += found.len() as u64;
            for &r in &found {
                if let Some(d) = pattern.distance_within(right.string(r as usize), max) {
                    writer.push(a as u32, r, d as f64)?;
                }
            }
            if include_self {
                writer.push(a as u32, a as u32, 0.0)?;
            }
        }
        checked.fetch_add(count, Ordering::Relaxed);
        sink.advance(1);
        writer.flush()
    })?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The `k` nearest base strings of every query, ties by base position.
pub fn knn(request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, k, .. } = *request;
    let k = k.min(base.len());
    let mut stats = RunStats::default();
    if k == 0 || queries.is_empty() {
        return Ok(stats);
    }
    let order = LengthOrder::new(base);
    stats.build_time = start.elapsed();
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    rank_in_waves(sink, queries.len(), BLOCK, |q| {
        let mut count = 0;
        let list = nearest(&order, base, queries.string(q), k, &mut count);
        checked.fetch_add(count, Ordering::Relaxed);
        list
    })?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The `k` nearest strings of `base` to `query`, nearest first, ties by position.
fn nearest(order: &LengthOrder, base: &Vectors, query: &[u32], k: usize, checked: &mut u64) -> Vec<Neighbour> {
    let pattern = Pattern::new(query);
    // A max-heap of (distance, position): its top is the current k-th nearest.
    let mut heap: BinaryHeap<(u32, u32)> = BinaryHeap::with_capacity(k + 1);
    let mut visit = |positions: &[u32], heap: &mut BinaryHeap<(u32, u32)>| {
        for &p in positions {
            let bound = if heap.len() == k { heap.peek().map_or(u32::MAX, |t| t.0) } else { u32::MAX };
            *checked += 1;
            if let Some(d) = pattern.distance_within(base.string(p as usize), bound)
                && (heap.len() < k || (d, p) < *heap.peek().expect("the heap is full"))
            {
                heap.push((d, p));
                if heap.len() > k {
                    heap.pop();
                }
            }
        }
    };
    let n = query.len();
    for delta in 0.. {
        if heap.len() == k && delta > heap.peek().map_or(0, |t| t.0 as usize) {
            break;
        }
        let (below, above) = (n.checked_sub(delta), n + delta);
        if below.is_none_or(|b| b < order.shortest) && above > order.longest {
            break;
        }
        if let Some(len) = below {
            visit(order.of_length(len), &mut heap);
        }
        if delta > 0 {
            visit(order.of_length(above), &mut heap);
        }
    }
    let mut list: Vec<Neighbour> =
        heap.into_iter().map(|(d, p)| Neighbour { distance: d as f64, position: p }).collect();
    list.sort_unstable();
    list
}

/// Positions of strings ordered by (length, position) (also the GPU join's order of its right
/// strings, `backend::gpu::text`).
pub(crate) struct LengthOrder {
    pub(crate) positions: Vec<u32>,
    /// `starts[l]`: where strings of length `l` begin in `positions` (one more entry than lengths).
    starts: Vec<usize>,
    shortest: usize,
    pub(crate) longest: usize,
}

impl LengthOrder {
    pub(crate) fn new(strings: &Vectors) -> Self {
        let len = |p: u32| strings.string(p as usize).len();
        let mut positions: Vec<u32> = (0..strings.len() as u32).collect();
        positions.par_sort_unstable_by_key(|&p| (len(p), p));
        let longest = positions.last().map_or(0, |&p| len(p));
        let shortest = positions.first().map_or(0, |&p| len(p));
        let starts = (0..=longest + 1).map(|l| positions.partition_point(|&p| len(p) < l)).collect();
        LengthOrder { positions, starts, shortest, longest }
    }

    /// Strings of length exactly `len`.
    fn of_length(&self, len: usize) -> &[u32] {
        if len > self.longest {
            return &[];
        }
        &self.positions[self.starts[len]..self.starts[len + 1]]
    }

    /// Strings whose length is within `tau` of `len`.
    fn within(&self, len: usize, tau: usize) -> &[u32] {
        &self.positions[self.window(len, tau)]
    }

    /// Where the strings whose length is within `tau` of `len` lie in `positions`.
    pub(crate) fn window(&self, len: usize, tau: usize) -> std::ops::Range<usize> {
        let from = len.saturating_sub(tau).min(self.longest + 1);
        let to = (len + tau + 1).min(self.longest + 1);
        self.starts[from]..self.starts[to.max(from)]
    }
}
