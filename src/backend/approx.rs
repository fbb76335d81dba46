//! Approximate kNN (`knn(base, query, k, 'approx=true')`) from the Multicurves index
//! (index/curves.rs), on every CPU core.
//!
//! Each query takes `per_curve` candidates around its key on every curve (Teodoro et al.'s
//! retrieval step) and drops repeats. The candidates are then ranked by their distance over the
//! leading principal coordinates plus an estimate of what the other directions add from the two
//! residual norms (a proxy of the Euclidean distance that reads 256 bytes of a candidate rather
//! than all of it; index/curves.rs), skipping each candidate whose first 16 coordinates — one
//! cache line — already place it beyond the best `rerank` found. Those best `rerank` (8k, at
//! least 32) are re-ranked by their whole distance in f32, and the k best of that, with any
//! within f32 rounding of the k-th, are measured exactly in f64: the answer is the k nearest of
//! those by exact distance (ties by base position), each returned row carrying its exact distance
//! and its rank.
//! Nothing else is guaranteed: a true neighbour that no curve placed near the query, or that the
//! proxy ranked below `rerank`, is missed; the recall is measured (`simjoin bench --approx`), not
//! assumed. Where the vectors have at most 64 dimensions the proxy is the whole Euclidean
//! distance (up to f32 rounding).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use rayon::prelude::*;

use super::cpu::offer_exact;
use super::exact::ExactCheck;
use super::plan::filter_kind;
use super::simd::{FilterKind, prefetch, row_score};
use super::topk::{KSmallest, Neighbour, push_ranked};
use super::{KnnRequest, ResultChunk, ResultSink, RunStats};
use crate::index::curves::{Geometry, LEAD, Multicurves};
use crate::op::Approx;

/// Candidates measured exactly per neighbour asked for: the best by proxy distance.
const RERANK: usize = 8;
/// Relative rounding allowance of the f32 re-rank: a candidate within it of the k-th best is
/// measured exactly too, so rounding cannot decide the answer among the re-ranked.
const F32_SLACK: f32 = 1e-3;
/// Every how many cache lines of the next re-ranked row a prefetch is issued (the hardware's
/// stream prefetcher fetches the lines between).
const PREFETCH_LINES: usize = 1;
/// Queries answered between two hand-offs to the sink.
const QUERY_BLOCK: usize = 2048;
/// Relative slack on the leading coordinates' share before a candidate is skipped: it and the
/// proxy are both rounded f32 sums, so the share may exceed the proxy by a few ulps.
const BOUND_SLACK: f32 = 1e-4;

/// The approximate `k` nearest base vectors of each query (`k` at most the base's size, and
/// neither side empty: `CpuBackend::knn` answers those cases).
pub(super) fn knn(request: &KnnRequest, approx: Approx, k: usize, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, metric, .. } = *request;
    let mut stats = RunStats::default();
    let geometry = Geometry::of(metric).expect("approx metrics are checked at planning (functions::table)");
    let (index, kept) = base.curves(geometry);
    stats.kept_indexes = usize::from(kept);
    let exact = ExactCheck::new(metric, f64::INFINITY, queries, base);
    stats.build_time = start.elapsed();

    let probe = Instant::now();
    let search = Search {
        index: &index,
        kind: filter_kind(metric),
        k,
        per_curve: approx.per_curve(k),
        rerank: RERANK * k.max(4),
    };
    let (gathered, measured) = (AtomicU64::new(0), AtomicU64::new(0));
    let blocks = queries.len().div_ceil(QUERY_BLOCK);
    sink.start(blocks as u64);
    let mut chunk = ResultChunk::default();
    for block in 0..blocks {
        let first = block * QUERY_BLOCK;
        let lists: Vec<Vec<Neighbour>> = (first..(first + QUERY_BLOCK).min(queries.len()))
            .into_par_iter()
            .map_init(
                || Scratch::new(index.len()),
                |scratch, q| {
                    search.run(&queries.row(q).to_vec(), scratch);
                    gathered.fetch_add(scratch.bounded.len() as u64, Ordering::Relaxed);
                    measured.fetch_add(scratch.best.len() as u64, Ordering::Relaxed);
                    let mut nearest = KSmallest::new(k);
                    let positions = scratch.best.iter().map(|&(_, p)| p as usize);
                    offer_exact(request, &exact, q, positions, &mut nearest);
                    nearest.into_sorted()
                },
            )
            .collect();
        for (i, list) in lists.iter().enumerate() {
            push_ranked(&mut chunk, first + i, list);
        }
        if chunk.len() >= sink.chunk_rows() {
            sink.send(std::mem::take(&mut chunk))?;
        }
        sink.advance(1);
    }
    if !chunk.is_empty() {
        sink.send(chunk)?;
    }
    stats.curve_candidates = gathered.into_inner();
    stats.candidates = measured.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// One query's search, shared by the threads.
struct Search<'a> {
    index: &'a Multicurves,
    /// The f32 score ordered as the metric (squared under L2, L2² and cosine).
    kind: FilterKind,
    k: usize,
    per_curve: usize,
    /// Candidates measured exactly: the best by the proxy distance.
    rerank: usize,
}

/// A thread's working memory, reused across its queries.
struct Scratch {
    /// One bit per base vector: taken as a candidate of the current query (cleared after each).
    seen: Vec<u64>,
    /// Distinct candidates with the squared distance over their first [`LEAD`] coordinates.
    bounded: Vec<(f32, u32)>,
    /// The best `rerank` by proxy distance, unordered.
    best: Vec<(f32, u32)>,
}

impl Scratch {
    fn new(len: usize) -> Self {
        Self { seen: vec![0; len.div_ceil(64)], bounded: Vec::new(), best: Vec::new() }
    }
}

impl Search<'_> {
    /// Leaves in `scratch.best` the `rerank` candidates of `query` nearest by proxy distance.
    fn run(&self, query: &[f64], scratch: &mut Scratch) {
        let index = self.index;
        let (values, projected) = index.query(query);
        scratch.bounded.clear();
        let (seen, bounded) = (&mut scratch.seen, &mut scratch.bounded);
        index.candidates(&projected, self.per_curve, |p, lead| {
            let (word, bit) = (p as usize / 64, 1u64 << (p % 64));
            if seen[word] & bit == 0 {
                seen[word] |= bit;
                bounded.push((row_score(FilterKind::SquaredL2, &projected[..LEAD], lead), p));
            }
        });
        for &(_, p) in &scratch.bounded {
            scratch.seen[p as usize / 64] = 0;
        }
        // The `rerank` smallest leading distances first: their proxies make the bar low early.
        let rerank = self.rerank.min(scratch.bounded.len());
        if rerank < scratch.bounded.len() {
            scratch.bounded.select_nth_unstable_by(rerank, |a, b| a.0.total_cmp(&b.0));
        }
        let proxy = |lead: f32, p: u32| {
            lead + row_score(FilterKind::SquaredL2, &projected[LEAD..], &index.projected(p as usize)[LEAD..])
        };
        let mut best: std::collections::BinaryHeap<(Proxy, u32)> =
            scratch.bounded[..rerank].iter().map(|&(lead, p)| (Proxy(proxy(lead, p)), p)).collect();
        for &(lead, p) in &scratch.bounded[rerank..] {
            let bar = best.peek().map_or(f32::INFINITY, |b| b.0.0);
            // The leading coordinates' share never exceeds the whole proxy (a sum of squares).
            if lead > bar * (1.0 + BOUND_SLACK) {
                continue;
            }
            let d = proxy(lead, p);
            if d < bar {
                best.pop();
                best.push((Proxy(d), p));
            }
        }
        // The re-rank's first pass: the whole distance in f32; those within rounding of the k-th
        // best of it go on to the exact f64 measure.
        scratch.best.clear();
        scratch.best.extend(best.into_iter().map(|(_, p)| (0.0, p)));
        for i in 0..scratch.best.len() {
            if let Some(&(_, ahead)) = scratch.best.get(i + 1) {
                let row = index.values(ahead as usize);
                (0..row.len()).step_by(16 * PREFETCH_LINES).for_each(|d| prefetch(&row[d..]));
            }
            let p = scratch.best[i].1;
            scratch.best[i].0 = row_score(self.kind, &values, index.values(p as usize));
        }
        if self.k < scratch.best.len() {
            scratch.best.select_nth_unstable_by(self.k - 1, |a, b| a.0.total_cmp(&b.0));
            let bar = scratch.best[self.k - 1].0 * (1.0 + F32_SLACK) + f32::MIN_POSITIVE;
            let mut kept = self.k;
            for i in self.k..scratch.best.len() {
                if scratch.best[i].0 <= bar {
                    scratch.best.swap(kept, i);
                    kept += 1;
                }
            }
            scratch.best.truncate(kept);
        }
    }
}

/// A proxy distance ordered for the heap (never NaN: the coordinates are finite).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Proxy(f32);

impl Eq for Proxy {}

impl PartialOrd for Proxy {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Proxy {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
