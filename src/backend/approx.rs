//! Approximate kNN (`knn(base, query, k, 'approx=true')`) from the Multicurves index
//! (index/curves.rs), on every CPU core.
//!
//! Each query takes `per_curve` candidates around its key on every curve (Teodoro et al.'s
//! retrieval step) and drops repeats. The candidates are then ranked by their distance over the
//! leading principal coordinates plus an estimate of what the other directions add from the two
//! residual norms (a proxy of the Euclidean distance that reads 256 bytes of a candidate rather
//! than all of it; index/curves.rs), skipping each candidate whose first 16 coordinates — one
//! cache line — already place it beyond the best `rerank` found. Under a Euclidean order (L2,
//! L2², cosine) those best `rerank` (8k, at least 32) are ranked again over up to 192 principal
//! coordinates and their residual (`index.refined`), and the best `refine` of that (3k, at least
//! 12) are re-ranked by their whole distance in f32 (under L1 and L∞ all `rerank` are), and the
//! k best of that, with any within f32 rounding of the k-th, are measured exactly in f64: the
//! answer is the k nearest of those by exact distance (ties by base position), each returned row
//! carrying its exact distance and its rank. Where the index's f32 copy holds the base exactly,
//! the exact distances are measured from its rows, which the f32 pass has just read.
//! Nothing else is guaranteed: a true neighbour that no curve placed near the query, or that the
//! proxy ranked below `rerank`, is missed; the recall is measured (`simjoin bench --approx`), not
//! assumed. Where the vectors have at most 63 dimensions the proxy is the whole Euclidean
//! distance (up to f32 rounding), as the second ranking is at most 192.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use rayon::prelude::*;

use super::cpu::{offer_exact, offer_exact_rows};
use super::exact::ExactCheck;
use super::plan::filter_kind;
use super::simd::{FilterKind, prefetch, row_score};
use super::topk::{KSmallest, Neighbour, push_ranked};
use super::{KnnRequest, ResultChunk, ResultSink, RunStats};
use crate::index::curves::{Geometry, LEAD, Multicurves, Query, ranks_twice};
use crate::op::Approx;

/// Candidates ranked again per neighbour asked for: the best by proxy distance.
const RERANK: usize = 8;
/// Candidates whose whole vectors are read per neighbour asked for, under a Euclidean order: the
/// best of the second ranking. On Fashion-MNIST the best 30 over 192 principal coordinates hold
/// 99.8 % of the true 10 nearest among the proxy's best 80 (docs/optimisations.md, v142).
const REFINE: usize = 3;
/// Relative rounding allowance of the f32 re-rank: a candidate within it of the k-th best is
/// measured exactly too, so rounding cannot decide the answer among the re-ranked.
const F32_SLACK: f32 = 1e-3;
/// How many candidates ahead of its proxy a candidate's row is fetched: its three cache lines are
/// read at random, and eight rows in flight keep the line-fill buffers busy.
const PROXY_AHEAD: usize = 8;
/// Every how many cache lines of the next re-ranked row a prefetch is issued (the hardware's
/// stream prefetcher fetches the lines between).
const PREFETCH_LINES: usize = 1;
/// Queries answered between two hand-offs to the sink.
const QUERY_BLOCK: usize = 2048;
/// Queries projected onto the principal axes together (one matrix product; 32 of Fashion-MNIST's
/// take 127 KB, reused by the allocator rather than mapped afresh).
const PROJECTED_BLOCK: usize = 32;
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
        refine: if ranks_twice(metric) && index.refined_dims() > 0 { Some(REFINE * k.max(4)) } else { None },
    };
    let (gathered, exactly) = (AtomicU64::new(0), AtomicU64::new(0));
    let blocks = queries.len().div_ceil(QUERY_BLOCK);
    sink.start(blocks as u64);
    let mut chunk = ResultChunk::default();
    for block in 0..blocks {
        let first = block * QUERY_BLOCK;
        let end = (first + QUERY_BLOCK).min(queries.len());
        let lists: Vec<Vec<Vec<Neighbour>>> = (first..end)
            .step_by(PROJECTED_BLOCK)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map_init(
                || Scratch::new(index.len()),
                |scratch, start| {
                    let rows = start..(start + PROJECTED_BLOCK).min(end);
                    let projected = index.queries(queries, rows.clone());
                    rows.map(|q| {
                        search.run(projected.get(q - start), scratch);
                        gathered.fetch_add(scratch.bounded.len() as u64, Ordering::Relaxed);
                        exactly.fetch_add(scratch.best.len() as u64, Ordering::Relaxed);
                        measured(request, &exact, &index, q, scratch.best.iter().map(|&(_, p)| p as usize))
                    })
                    .collect()
                },
            )
            .collect();
        for (i, list) in lists.iter().flatten().enumerate() {
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
    stats.candidates = exactly.into_inner();
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
    /// Candidates ranked again: the best by the proxy distance.
    rerank: usize,
    /// Candidates whose whole vectors are read: the best of the second ranking; `None` to read
    /// all `rerank` (an order other than the Euclidean, or no coordinates beyond the proxy's).
    refine: Option<usize>,
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
    /// Leaves in `scratch.best` the candidates of `query` to measure exactly: the k nearest by f32
    /// distance among those the proxy (and the second ranking) kept, and any within rounding of
    /// the k-th.
    fn run(&self, query: Query, scratch: &mut Scratch) {
        let index = self.index;
        let Query { values, projected, refined } = query;
        scratch.bounded.clear();
        let (seen, bounded) = (&mut scratch.seen, &mut scratch.bounded);
        for (positions, leads) in index.candidate_runs(projected, self.per_curve) {
            for (&p, lead) in positions.iter().zip(leads.chunks_exact(LEAD)) {
                let (word, bit) = (p as usize / 64, 1u64 << (p % 64));
                if seen[word] & bit == 0 {
                    seen[word] |= bit;
                    bounded.push((squared_lead(&projected[..LEAD], lead), p));
                }
            }
        }
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
        // Only candidates whose leading share is within the bar so far can enter (it only falls):
        // those are listed first, so that their rows can be fetched ahead of their turn.
        let bar = best.peek().map_or(f32::INFINITY, |b| b.0.0) * (1.0 + BOUND_SLACK);
        let mut kept = rerank;
        for i in rerank..scratch.bounded.len() {
            if scratch.bounded[i].0 <= bar {
                scratch.bounded.swap(kept, i);
                kept += 1;
            }
        }
        for i in rerank..kept {
            if let Some(&(_, p)) = scratch.bounded[..kept].get(i + PROXY_AHEAD) {
                let row = &index.projected(p as usize)[LEAD..];
                (0..row.len()).step_by(16).for_each(|d| prefetch(&row[d..]));
            }
            let (lead, p) = scratch.bounded[i];
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
        scratch.best.clear();
        scratch.best.extend(best.into_iter().map(|(d, p)| (d.0, p)));
        if let Some(refine) = self.refine.filter(|&r| r < scratch.best.len()) {
            // The second ranking: the proxy's own residual term gives way to the coordinates it
            // estimated (up to 192 principal ones) and the residual after them.
            let slot = index.projected_dims();
            for i in 0..scratch.best.len() {
                if let Some(&(_, ahead)) = scratch.best.get(i + 1) {
                    let row = index.refined(ahead as usize);
                    (0..row.len()).step_by(16).for_each(|d| prefetch(&row[d..]));
                }
                let (proxy, p) = scratch.best[i];
                let residual = index.projected(p as usize)[slot] - projected[slot];
                scratch.best[i].0 =
                    proxy - residual * residual + row_score(FilterKind::SquaredL2, refined, index.refined(p as usize));
            }
            scratch.best.select_nth_unstable_by(refine - 1, |a, b| a.0.total_cmp(&b.0));
            scratch.best.truncate(refine);
        }
        // The re-rank's first pass: the whole distance in f32; those within rounding of the k-th
        // best of it go on to the exact f64 measure.
        for i in 0..scratch.best.len() {
            if let Some(&(_, ahead)) = scratch.best.get(i + 1) {
                let row = index.values(ahead as usize);
                (0..row.len()).step_by(16 * PREFETCH_LINES).for_each(|d| prefetch(&row[d..]));
            }
            let p = scratch.best[i].1;
            scratch.best[i].0 = row_score(self.kind, values, index.values(p as usize));
        }
        within_rounding(&mut scratch.best, self.k);
    }
}

/// Keeps of `best` (f32 score, base position) the `k` smallest scores and any within f32 rounding
/// of the k-th: those go on to the exact measure ([`measured`]), so rounding cannot decide the
/// answer among them.
pub(super) fn within_rounding(best: &mut Vec<(f32, u32)>, k: usize) {
    if k == 0 || k >= best.len() {
        return;
    }
    best.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
    let bar = best[k - 1].0 * (1.0 + F32_SLACK) + f32::MIN_POSITIVE;
    let mut kept = k;
    for i in k..best.len() {
        if best[i].0 <= bar {
            best.swap(kept, i);
            kept += 1;
        }
    }
    best.truncate(kept);
}

/// The `request.k` nearest of base rows `positions` to query `q` by exact distance, ranked (ties
/// by base position). Where the index's f32 copy holds the base exactly, the distances are
/// measured from its rows, which the f32 ranking has just read (bit for bit the same distances).
pub(super) fn measured(
    request: &KnnRequest,
    exact: &ExactCheck,
    index: &Multicurves,
    q: usize,
    positions: impl Iterator<Item = usize>,
) -> Vec<Neighbour> {
    let mut nearest = KSmallest::new(request.k.min(index.len()));
    match index.exact_values() {
        Some(row) => offer_exact_rows(request.queries.row(q), exact, q, positions, row, &mut nearest),
        None => offer_exact(request, exact, q, positions, &mut nearest),
    };
    nearest.into_sorted()
}

/// The squared distance over the [`LEAD`] leading coordinates, inlined (one call per candidate),
/// in four lanes the compiler keeps in one vector register.
#[inline(always)]
fn squared_lead(a: &[f32], b: &[f32]) -> f32 {
    let (a, b) = (&a[..LEAD], &b[..LEAD]);
    let mut acc = [0f32; 4];
    for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        for i in 0..4 {
            let t = x[i] - y[i];
            acc[i] += t * t;
        }
    }
    (acc[0] + acc[2]) + (acc[1] + acc[3])
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
