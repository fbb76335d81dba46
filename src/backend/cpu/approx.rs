//! Approximate kNN (`knn(base, query, k, 'approx=true')`) from the Multicurves index
//! (index/curves.rs), on every CPU core, by one of two searches.
//!
//! *With the kNN graph* (index/graph.rs), where the base is kept across queries or the queries are
//! as many as half its rows, so that the graph's build is repaid: each query takes `seeds` entries
//! around its key on every curve, starts from the `pool` of them nearest over the 16 leading
//! principal coordinates, and walks the graph best first (each step follows the edges of the
//! nearest row whose edges are not followed yet, until that row is farther than every row of the
//! pool), ranking each row reached by its distance over up to 192 principal coordinates and their
//! residual, read from the index's 8-bit copy of them (index/codes.rs: one byte a coordinate, so a
//! walk that reads thousands of rows at random waits on a quarter of the cache lines).
//!
//! *By the curves alone*, elsewhere: each query takes `per_curve` candidates around its key on
//! every curve (Teodoro et al.'s retrieval step) and drops repeats. The candidates are then ranked
//! by their distance over the leading principal coordinates plus an estimate of what the other
//! directions add from the two residual norms (a proxy of the Euclidean distance that reads 256
//! bytes of a candidate rather than all of it; index/curves.rs), skipping each candidate whose
//! first 16 coordinates — one cache line — already place it beyond the best `rerank` found. Under a
//! Euclidean order those best `rerank` (8k, at least 32) are ranked again by `principal_distance`.
//!
//! Either way, under a Euclidean order (L2, L2², cosine) the best `refine` (3k, at least 12) are
//! re-ranked by their whole distance in f32 (under L1 and L∞ all the candidates left are), and the
//! k best of that, with any within f32 rounding of the k-th, are measured exactly in f64: the
//! answer is the k nearest of those by exact distance (ties by base position), each returned row
//! carrying its exact distance and its rank. Where the index's f32 copy holds the base exactly,
//! the exact distances are measured from its rows, which the f32 pass has just read.
//! Nothing else is guaranteed: a true neighbour that the search never reached, or ranked below
//! the cut, is missed; the recall is measured (`simjoin bench --approx`), not assumed. Where the
//! vectors have at most 63 dimensions the proxy is the whole Euclidean distance (up to f32
//! rounding), as `principal_distance` is at most 192.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::plan::bounds::filter_kind;
use crate::backend::plan::exact::{ExactCheck, offer_exact, offer_exact_rows};
use crate::backend::plan::simd::{FilterKind, coded_pair_score, coded_score, prefetch, row_score};
use crate::backend::plan::topk::{KSmallest, Neighbour, push_ranked};
use crate::backend::{KnnRequest, ResultChunk, ResultSink, RunStats};
use crate::index::KeptIndexes;
use crate::index::codes::{CodedQuery, Codes};
use crate::index::curves::{CURVES, Geometry, LEAD, Multicurves, Query, ranks_twice};
use crate::index::graph::{self, BUILD_POOLS, NeighbourGraph, OUT_DEGREE, diverse};
use crate::op::Approx;

/// Candidates ranked again per neighbour asked for by the curves' search: the best by proxy
/// distance.
const RERANK: usize = 8;
/// Candidates whose whole vectors are read per neighbour asked for, under a Euclidean order: the
/// best by [`principal_distance`]. On Fashion-MNIST the best 30 over 192 principal coordinates
/// hold 99.8 % of the true 10 nearest among the proxy's best 80 (docs/approx.md#measured).
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
/// How many candidates ahead of its distance a candidate's codes are fetched in the kNN graph's
/// build.
const GRAPH_AHEAD: usize = 4;
/// Queries answered between two hand-offs to the sink.
const QUERY_BLOCK: usize = 2048;
/// Queries projected onto the principal axes together (one matrix product; 32 of Fashion-MNIST's
/// take 127 KB, reused by the allocator rather than mapped afresh).
const PROJECTED_BLOCK: usize = 32;
/// Relative slack on the leading coordinates' share before a candidate is skipped: it and the
/// proxy are both rounded f32 sums, so the share may exceed the proxy by a few ulps.
const BOUND_SLACK: f32 = 1e-4;
/// Queries per base row from which the graph is built for a base that is not kept: its build
/// costs about what the curves' search of half as many queries as rows costs more than the
/// graph's (Fashion-MNIST: 2 core-seconds, against ~85 µs saved a query at recall 0.95;
/// docs/approx.md#measured).
const GRAPH_QUERIES_PER_ROW: f64 = 0.5;

/// Whether the cores search `base` with the graph (built first where it is not): where it is
/// built already (kept with a kept base, or loaded from the index store), the base is kept (later
/// queries reuse the graph) or the queries (the whole run's, for a calibration's sample) are many
/// enough to repay its build, and the base has more rows than the curves' search takes entries
/// (otherwise that search reads about every row, and answers exactly where it does).
pub(in crate::backend) fn walks_graph(request: &KnnRequest, approx: Approx, k: usize) -> bool {
    let n = request.base.len();
    let queries = approx.planned_queries.unwrap_or(request.queries.len());
    let built = Geometry::of(request.metric).is_some_and(|g| request.base.curves_graph_built(g));
    // The self-test compares the GPU's search, which ranks the same candidates by their whole
    // distance, with the curves' alone (`Checks::curves_alone`).
    !approx.curves_alone
        && n > CURVES * approx.per_curve(k)
        && (built || request.base.resident().is_some() || queries as f64 >= GRAPH_QUERIES_PER_ROW * n as f64)
}

/// The approximate `k` nearest base vectors of each query (`k` at most the base's size, and
/// neither side empty: `CpuBackend::knn` answers those cases).
pub(super) fn knn(request: &KnnRequest, approx: Approx, k: usize, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, metric, .. } = *request;
    let mut stats = RunStats::default();
    let geometry = Geometry::of(metric).expect("approx metrics are checked at planning (functions::table)");
    let (index, kept) = base.curves(geometry);
    let graph = walks_graph(request, approx, k).then(|| {
        // The walk ranks by the codes, which a loaded index encodes on first use: here, before
        // the queries' parallel loop (Multicurves::codes).
        index.codes();
        index.graph(build_graph)
    });
    stats.kept_indexes = usize::from(kept && graph.is_none_or(|(_, graph_kept)| graph_kept));
    let seeds = Start::Curves { per_curve: approx.seeds_per_curve(k) };
    let walk = graph.map(|(graph, _)| (Walk { graph, pool: approx.pool(k) }, seeds));
    let exact = ExactCheck::new(metric, f64::INFINITY, queries, base);
    stats.build_time = start.elapsed();

    let probe = Instant::now();
    let search = Search {
        index: &index,
        kind: filter_kind(metric),
        k,
        walk,
        per_curve: approx.per_curve(k),
        rerank: RERANK * k.max(4),
        refine: ranks_twice(metric).then_some(REFINE * k.max(4)),
    };
    let (gathered, walked, exactly) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
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
                        let (curves, graph) = search.run(projected.get(q - start), scratch);
                        gathered.fetch_add(curves as u64, Ordering::Relaxed);
                        walked.fetch_add(graph as u64, Ordering::Relaxed);
                        exactly.fetch_add(scratch.best.len() as u64, Ordering::Relaxed);
                        measured(request, &exact, &index, q, scratch.best.iter().map(|&(_, p)| p as usize))
                    })
                    .collect()
                },
            )
            .collect();
        // Sent as soon as a chunk is full (a block of 2,048 queries at k = 100 is 204,800 rows), as
        // the exact kNN sends (docs/design.md#cpu-knn).
        for (i, list) in lists.iter().flatten().enumerate() {
            push_ranked(&mut chunk, first + i, list);
            if chunk.len() >= sink.chunk_rows() {
                sink.send(std::mem::take(&mut chunk))?;
            }
        }
        sink.advance(1);
    }
    if !chunk.is_empty() {
        sink.send(chunk)?;
    }
    stats.curve_candidates = gathered.into_inner();
    stats.graph_rows = walked.into_inner();
    stats.candidates = exactly.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The graph the search walks over `index`'s rows, on every core: the kNN graph by NN-descent
/// ([`nearest_graph`]), then, once for each of [`BUILD_POOLS`], every row's own edges chosen for
/// diversity among the rows a search of the last graph finds for it, and the edges into each row
/// ([`diverse_graph`]).
pub(crate) fn build_graph(index: &Multicurves) -> NeighbourGraph {
    let mut graph = nearest_graph(index);
    for pool in BUILD_POOLS {
        graph = diverse_graph(index, &graph, pool);
    }
    graph
}

/// The kNN graph of `index`'s rows by the squared distance between their codes of
/// [`principal_distance`]'s terms (NN-descent from the curves; index/codes.rs).
pub(crate) fn nearest_graph(index: &Multicurves) -> NeighbourGraph {
    let codes = index.codes();
    NeighbourGraph::build(index, |i, rows, out| {
        let own = codes.row(i as u32);
        for (r, &j) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(r + GRAPH_AHEAD) {
                fetch_codes(codes, ahead);
            }
            out.push((coded_pair_score(codes.weights(), own, codes.row(j)), j));
        }
    })
}

/// The searched graph from `nearest` (the kNN graph of `index`'s rows, or the last pass's graph):
/// each row searched for as a query through `nearest` from the row itself, keeping `pool` rows;
/// its own edges the [`OUT_DEGREE`] most diverse of them ([`graph::diverse`]), and the rows whose
/// own edges name it. A search's pool holds rows in every direction around the row, where a kNN
/// list holds the nearest, often all on one side (HNSW builds its layers from such searches;
/// NSG from searches of a kNN graph, as here). The searches read `nearest` alone, so the rows are
/// searched in parallel and the graph is the same on any number of cores.
pub(crate) fn diverse_graph(index: &Multicurves, nearest: &NeighbourGraph, pool: usize) -> NeighbourGraph {
    let n = index.len();
    let walk = Walk { graph: nearest, pool };
    let codes = index.codes();
    let distance = |a: u32, b: u32| coded_pair_score(codes.weights(), codes.row(a), codes.row(b));
    let mut out = vec![graph::NONE; n * OUT_DEGREE];
    out.par_chunks_mut(OUT_DEGREE).enumerate().with_min_len(64).for_each_init(
        || Scratch::new(n),
        |scratch, (p, edges)| {
            let (projected, refined) = index.row_terms(p);
            walk_graph(
                index,
                &walk,
                Query { values: index.values(p), projected, refined },
                Start::Row(p as u32),
                scratch,
            );
            diverse(p as u32, &mut scratch.best, distance, edges);
        },
    );
    NeighbourGraph::with_edges_into(&out, n, distance)
}

/// The squared distance over the principal coordinates between a row in the index's terms
/// (`terms`: a query's, or a base row's from [`Multicurves::row_terms`]) and base row `p`: over
/// the proxy's coordinates and, where the index keeps more, over those and the residual after
/// them (the second ranking, docs/approx.md#measured; the Euclidean distance itself where the
/// vectors have at most 192 dimensions).
#[inline]
fn principal_distance(index: &Multicurves, (projected, refined): (&[f32], &[f32]), p: usize) -> f32 {
    let proxy = row_score(FilterKind::SquaredL2, projected, index.projected(p));
    if index.refined_dims() == 0 {
        return proxy;
    }
    // The proxy's residual term gives way to the coordinates it estimated and the residual after.
    let slot = index.projected_dims();
    let residual = index.projected(p)[slot] - projected[slot];
    proxy - residual * residual + row_score(FilterKind::SquaredL2, refined, index.refined(p))
}

/// Prefetches base row `p`'s principal coordinates (what [`principal_distance`] reads).
#[inline]
fn fetch_terms(index: &Multicurves, p: u32) {
    let (projected, refined) = index.row_terms(p as usize);
    for row in [projected, refined] {
        (0..row.len()).step_by(16).for_each(|d| prefetch(&row[d..]));
    }
}

/// Prefetches base row `p`'s codes (what the walk and the graph's build read).
#[inline]
fn fetch_codes(codes: &Codes, p: u32) {
    let row = codes.row(p);
    (0..row.len()).step_by(64).for_each(|b| prefetch(&row[b..]));
}

/// Where a graph walk starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// The [`Walk::pool`] entries nearest the query among the curves' `per_curve` entries around
    /// it: a query's search.
    Curves { per_curve: usize },
    /// Base row `p` itself, the row searched for: the graph's build. The graph searched already
    /// places the row among its neighbours, so the walk begins where a search from the curves
    /// ends up (GloVe 390,000 × 50 on 2 cores: each pass 9–11 s against 19 s from the curves,
    /// recall 0.002 lower at efforts 2 and 4; docs/approx.md#measured).
    Row(u32),
}

/// One query's search, shared by the threads.
struct Search<'a> {
    index: &'a Multicurves,
    /// The f32 score ordered as the metric (squared under L2, L2² and cosine).
    kind: FilterKind,
    k: usize,
    /// The graph search's terms and where it starts; `None` to search by the curves alone.
    walk: Option<(Walk<'a>, Start)>,
    /// Entries the curves' search takes around the query's key on every curve.
    per_curve: usize,
    /// Candidates the curves' search ranks again: the best by the proxy distance.
    rerank: usize,
    /// Candidates whose whole vectors are read: the best by [`principal_distance`]; `None` to
    /// read all the candidates left (an order other than the Euclidean).
    refine: Option<usize>,
}

/// The graph search's terms.
struct Walk<'a> {
    graph: &'a NeighbourGraph,
    /// Rows kept: the nearest found so far (by the codes of [`principal_distance`]'s terms).
    pool: usize,
}

/// A thread's working memory, reused across its queries.
struct Scratch {
    /// One bit per base vector: reached by the current query's search (cleared after each).
    seen: Vec<u64>,
    /// The curves' distinct candidates with the squared distance over their first [`LEAD`]
    /// coordinates.
    bounded: Vec<(f32, u32)>,
    /// Rows reached through the graph.
    visited: Vec<u32>,
    /// A row's edges not reached before.
    fresh: Vec<u32>,
    /// The graph search's pool: the nearest rows found, farthest on top.
    pool: BinaryHeap<(Score, u32)>,
    /// Rows whose edges are still to follow, nearest on top.
    frontier: BinaryHeap<Reverse<(Score, u32)>>,
    /// The candidates to measure.
    best: Vec<(f32, u32)>,
    /// The query in the units of the index's codes, for the walk.
    coded: CodedQuery,
}

impl Scratch {
    fn new(len: usize) -> Self {
        Self {
            seen: vec![0; len.div_ceil(64)],
            bounded: Vec::new(),
            visited: Vec::new(),
            fresh: Vec::new(),
            pool: BinaryHeap::new(),
            frontier: BinaryHeap::new(),
            best: Vec::new(),
            coded: CodedQuery::default(),
        }
    }

    /// Marks row `p` reached, and returns whether it was not before.
    #[inline]
    fn reach(&mut self, p: u32) -> bool {
        let (word, bit) = (p as usize / 64, 1u64 << (p % 64));
        let fresh = self.seen[word] & bit == 0;
        self.seen[word] |= bit;
        fresh
    }

    /// Marks row `p` not reached.
    #[inline]
    fn forget(&mut self, p: u32) {
        self.seen[p as usize / 64] &= !(1u64 << (p % 64));
    }

    /// Takes each curve's run of candidates: every distinct one into `bounded` with its leading
    /// coordinates' squared distance to `projected`'s.
    fn gather(&mut self, runs: [(&[u32], &[f32]); CURVES], projected: &[f32]) {
        self.bounded.clear();
        for (positions, leads) in runs {
            for (&p, lead) in positions.iter().zip(leads.chunks_exact(LEAD)) {
                if self.reach(p) {
                    self.bounded.push((squared_lead(&projected[..LEAD], lead), p));
                }
            }
        }
    }
}

impl Search<'_> {
    /// Leaves in `scratch.best` the candidates of `query` to measure exactly: the k nearest by f32
    /// distance among those the search kept, and any within rounding of the k-th. Returns the
    /// distinct candidates the curves gave and the rows reached through the graph.
    fn run(&self, query: Query, scratch: &mut Scratch) -> (usize, usize) {
        let counts = match &self.walk {
            Some((walk, start)) => walk_graph(self.index, walk, query, *start, scratch),
            None => (self.by_curves(query, scratch), 0),
        };
        if let Some(refine) = self.refine.filter(|&r| r < scratch.best.len()) {
            scratch.best.select_nth_unstable_by(refine - 1, |a, b| a.0.total_cmp(&b.0));
            scratch.best.truncate(refine);
        }
        // The re-rank's first pass: the whole distance in f32; those within rounding of the k-th
        // best of it go on to the exact f64 measure.
        let index = self.index;
        for i in 0..scratch.best.len() {
            if let Some(&(_, ahead)) = scratch.best.get(i + 1) {
                let row = index.values(ahead as usize);
                (0..row.len()).step_by(16 * PREFETCH_LINES).for_each(|d| prefetch(&row[d..]));
            }
            let p = scratch.best[i].1;
            scratch.best[i].0 = row_score(self.kind, query.values, index.values(p as usize));
        }
        within_rounding(&mut scratch.best, self.k);
        counts
    }

    /// The curves' search: leaves the proxy's best `rerank` in `scratch.best`, scored again by
    /// [`principal_distance`] where the candidates are to be cut to `refine`. Returns the distinct
    /// candidates the curves gave.
    fn by_curves(&self, query: Query, scratch: &mut Scratch) -> usize {
        let index = self.index;
        let Query { projected, refined, .. } = query;
        scratch.gather(index.candidate_runs(projected, self.per_curve), projected);
        let gathered = scratch.bounded.len();
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
        let mut best: BinaryHeap<(Score, u32)> =
            scratch.bounded[..rerank].iter().map(|&(lead, p)| (Score(proxy(lead, p)), p)).collect();
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
                best.push((Score(d), p));
            }
        }
        scratch.best.clear();
        scratch.best.extend(best.into_iter().map(|(d, p)| (d.0, p)));
        if self.refine.is_some_and(|r| r < scratch.best.len()) && index.refined_dims() > 0 {
            // The second ranking: over up to 192 principal coordinates and the residual after.
            for i in 0..scratch.best.len() {
                if let Some(&(_, ahead)) = scratch.best.get(i + 1) {
                    fetch_terms(index, ahead);
                }
                let p = scratch.best[i].1;
                scratch.best[i].0 = principal_distance(index, (projected, refined), p as usize);
            }
        }
        gathered
    }
}

/// The graph search of `query` over `index`'s rows: leaves the pool in `scratch.best`, scored by
/// the index's codes of [`principal_distance`]'s coordinates (index/codes.rs). Returns the
/// distinct candidates the curves gave and the rows reached through the graph.
fn walk_graph(index: &Multicurves, walk: &Walk, query: Query, start: Start, scratch: &mut Scratch) -> (usize, usize) {
    let codes = index.codes();
    let mut coded = std::mem::take(&mut scratch.coded);
    codes.query(index.coded_terms(query.projected, query.refined), &mut coded);
    let distance = |p: u32| coded_score(coded.scaled(), codes.weights(), codes.row(p));
    let fetch = |p: u32| fetch_codes(codes, p);
    scratch.visited.clear();
    let gathered = match start {
        Start::Curves { per_curve } => {
            scratch.gather(index.candidate_runs(query.projected, per_curve), query.projected);
            let gathered = scratch.bounded.len();
            // The search starts from the `pool` seeds nearest over the leading coordinates; the
            // others may still be reached through the graph.
            let starts = walk.pool.min(scratch.bounded.len());
            if starts < scratch.bounded.len() {
                scratch.bounded.select_nth_unstable_by(starts, |a, b| a.0.total_cmp(&b.0));
                for i in starts..scratch.bounded.len() {
                    scratch.forget(scratch.bounded[i].1);
                }
                scratch.bounded.truncate(starts);
            }
            gathered
        }
        Start::Row(p) => {
            scratch.bounded.clear();
            scratch.reach(p);
            scratch.bounded.push((0.0, p));
            0
        }
    };
    let starts = scratch.bounded.len();
    scratch.pool.clear();
    scratch.frontier.clear();
    for i in 0..starts {
        if let Some(&(_, ahead)) = scratch.bounded.get(i + 1) {
            fetch(ahead);
        }
        let p = scratch.bounded[i].1;
        let d = Score(distance(p));
        scratch.pool.push((d, p));
        scratch.frontier.push(Reverse((d, p)));
    }
    // Best first (as in the lowest layer of Malkov and Yashunin's HNSW): follow the edges of
    // the nearest row not yet followed, until it is farther than every row of the full pool.
    while let Some(Reverse((d, c))) = scratch.frontier.pop() {
        let full = scratch.pool.len() >= walk.pool;
        if full && scratch.pool.peek().is_some_and(|worst| d > worst.0) {
            break;
        }
        scratch.fresh.clear();
        for j in walk.graph.neighbours(c as usize) {
            if scratch.reach(j) {
                fetch(j);
                scratch.fresh.push(j);
            }
        }
        scratch.visited.extend_from_slice(&scratch.fresh);
        for &j in &scratch.fresh {
            let d = Score(distance(j));
            if scratch.pool.len() < walk.pool {
                scratch.pool.push((d, j));
            } else if scratch.pool.peek().is_some_and(|worst| d < worst.0) {
                scratch.pool.pop();
                scratch.pool.push((d, j));
            } else {
                continue;
            }
            // Its edges are followed next if it is the nearest left: their two cache lines load
            // while the other rows are measured.
            let slots = walk.graph.slots(j as usize);
            (0..slots.len()).step_by(16).for_each(|e| prefetch(&slots[e..]));
            scratch.frontier.push(Reverse((d, j)));
        }
    }
    for &p in scratch.bounded.iter().map(|(_, p)| p).chain(&scratch.visited) {
        scratch.seen[p as usize / 64] = 0;
    }
    scratch.best.clear();
    scratch.best.extend(scratch.pool.drain().map(|(d, p)| (d.0, p)));
    scratch.coded = coded;
    (gathered, scratch.visited.len())
}

/// Keeps of `best` (f32 score, base position) the `k` smallest scores and any within f32 rounding
/// of the k-th: those go on to the exact measure ([`measured`]), so rounding cannot decide the
/// answer among them.
pub(crate) fn within_rounding(best: &mut Vec<(f32, u32)>, k: usize) {
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
pub(crate) fn measured(
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

/// A distance ordered for the heaps (never NaN: the coordinates are finite).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f32);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::{build_graph, knn};
    use crate::backend::KnnRequest;
    use crate::backend::plan::topk::Collector;
    use crate::datagen::{Distribution, generate};
    use crate::index::KeptIndexes;
    use crate::index::curves::{Geometry, Multicurves};
    use crate::op::{Approx, IndexChoice, Metric};
    use crate::vectors::Vectors;

    fn uniform(n: usize, seed: u64) -> Vectors {
        Vectors::new(12, generate(Distribution::Uniform, n, 12, seed))
    }

    /// An index with its graph but without its codes (as the index store loads one) is searched
    /// on 64 threads to the end: the codes are encoded before the queries' parallel loop, where
    /// the thread encoding them could take up a query's job and wait on itself (encoded within
    /// the loop, this search did not end in minutes).
    #[test]
    fn a_loaded_index_is_searched_on_many_threads() {
        let (base, queries) = (uniform(50_000, 1), uniform(20_000, 2));
        let graph = build_graph(&Multicurves::build(&base, Geometry::Raw));
        let loaded = Multicurves::build(&base, Geometry::Raw);
        loaded.graph(|_| graph);
        base.curves_built_by(Geometry::Raw, || loaded);
        let approx = Approx { effort: 1.0, recall: None, planned_queries: None, curves_alone: false };
        let request = KnnRequest {
            base: &base,
            queries: &queries,
            metric: Metric::L2,
            k: 10,
            approx: Some(approx),
            index: IndexChoice::Auto,
        };
        let collector = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: 1 << 16 };
        let threads = rayon::ThreadPoolBuilder::new().num_threads(64).build().unwrap();
        let stats = threads.install(|| knn(&request, approx, 10, &collector)).unwrap();
        assert!(stats.graph_rows > 0, "the graph was walked");
        let rows: usize = collector.chunks.into_inner().unwrap().iter().map(|chunk| chunk.left.len()).sum();
        assert_eq!(rows, 20_000 * 10);
    }
}
