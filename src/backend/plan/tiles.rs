//! Inputs larger than a device's memory, run as tiles: contiguous ranges of vector positions, each
//! pair of tiles an operation of its own on the backend, its results mapped back to the whole
//! inputs' positions. The answer is the same set of pairs (and, for kNN, the same neighbours in
//! the same order) as one run over everything:
//! - a join's pair (a, b) lies in exactly one (left tile, right tile) pair;
//! - a self-join runs each tile against itself as a self-join (its own pairs once, or both ways,
//!   and each row with itself when asked) and each tile against every later tile as a plain join,
//!   whose pairs already have the smaller position first (the tiles are ordered ranges);
//! - kNN keeps, per query, the k smallest of the running top-k and the next base tile's top-k,
//!   by (distance, position): the k smallest of a union are among the k smallest of its parts.

use std::ops::Range;
use std::sync::Mutex;

use datafusion::common::{Result, exec_err};
use rayon::iter::{IntoParallelRefMutIterator, ParallelIterator};

use crate::backend::plan::topk::{Collector, Neighbour, Ranked, k_smallest, send_ranked};
use crate::backend::{JoinRequest, KnnRequest, ResultChunk, ResultSink, RunStats, Wanted};

/// `0..len` in consecutive ranges of at most `tile_rows` positions.
pub(crate) fn tile_ranges(len: usize, tile_rows: usize) -> Vec<Range<usize>> {
    let tile_rows = tile_rows.max(1);
    (0..len).step_by(tile_rows).map(|start| start..(start + tile_rows).min(len)).collect()
}

/// The join `request` as tiles of at most `tile_rows` positions per side, each (left tile, right
/// tile) pair run by `run` and its pairs sent on to `sink` with the whole inputs' positions.
pub(crate) fn tiled_join(
    request: &JoinRequest,
    sink: &dyn ResultSink,
    tile_rows: usize,
    run: impl Fn(&JoinRequest, &dyn ResultSink) -> Result<RunStats>,
) -> Result<RunStats> {
    let left_tiles = tile_ranges(request.left.len(), tile_rows);
    let right_tiles = tile_ranges(request.right.len(), tile_rows);
    // (left tile, right tile, whether the pair is a tile against itself of a self-join).
    let pairs: Vec<(usize, usize, bool)> = match request.self_join {
        Some(_) => (0..left_tiles.len()).flat_map(|i| (i..left_tiles.len()).map(move |j| (i, j, i == j))).collect(),
        None => (0..left_tiles.len()).flat_map(|i| (0..right_tiles.len()).map(move |j| (i, j, false))).collect(),
    };
    sink.start(pairs.len() as u64);
    let mut stats = RunStats::default();
    let mut left_tile: Option<(usize, crate::vectors::Vectors)> = None;
    for (i, j, diagonal) in pairs {
        let (left_range, right_range) = (
            left_tiles[i].clone(),
            if request.self_join.is_some() { left_tiles[j].clone() } else { right_tiles[j].clone() },
        );
        // The left tile is copied once for all its right tiles.
        if left_tile.as_ref().is_none_or(|(at, _)| *at != i) {
            left_tile = Some((i, request.left.slice(left_range.clone())));
        }
        let left = &left_tile.as_ref().expect("set above").1;
        let right_copy = (!diagonal).then(|| request.right.slice(right_range.clone()));
        let right = right_copy.as_ref().unwrap_or(left);
        let self_join = if diagonal { request.self_join } else { None };
        let tile = request.over(left, right, self_join);
        // Off the diagonal of an ordered self-join, each pair is also reported the other way.
        let mirror = !diagonal && request.self_join.is_some_and(|s| s.ordered);
        let offsets =
            OffsetSink { inner: sink, left: left_range.start as u32, right: right_range.start as u32, mirror };
        stats.add(&run(&tile, &offsets)?);
        sink.advance(1);
    }
    Ok(stats)
}

/// kNN `request` as tiles: queries in tiles of at most `query_rows`, the base in tiles of at most
/// `base_rows`, one after another ([`merged_knn`]).
pub(crate) fn tiled_knn(
    request: &KnnRequest,
    sink: &dyn ResultSink,
    query_rows: usize,
    base_rows: usize,
    run: impl Fn(&KnnRequest, &dyn ResultSink) -> Result<RunStats> + Sync,
) -> Result<RunStats> {
    let base_parts = tile_ranges(request.base.len(), base_rows);
    merged_knn(request, sink, query_rows, &base_parts, false, |_, part, sink| run(part, sink))
}

/// kNN `request` with its base in `base_parts` (contiguous ranges of positions): each tile of at
/// most `query_rows` queries is run by `run(p, …)` against every part `p` — all parts at once, on
/// a thread each, when `parallel` (a device each), else one after another — and each query's
/// lists are merged into its k smallest by (distance, whole-base position) and sent on in query
/// order, ranked. That is the list of one run over the whole base, ties by base scan order
/// included: the k smallest of a union are among the k smallest of its parts.
pub(crate) fn merged_knn(
    request: &KnnRequest,
    sink: &dyn ResultSink,
    query_rows: usize,
    base_parts: &[Range<usize>],
    parallel: bool,
    run: impl Fn(usize, &KnnRequest, &dyn ResultSink) -> Result<RunStats> + Sync,
) -> Result<RunStats> {
    let query_tiles = tile_ranges(request.queries.len(), query_rows);
    sink.start((query_tiles.len() * base_parts.len()) as u64);
    let mut stats = RunStats::default();
    // The parts' bases are copied once for all query tiles when they are needed more than once or
    // at the same time; else one at a time.
    let base_copies: Option<Vec<crate::vectors::Vectors>> =
        (query_tiles.len() > 1 || parallel).then(|| base_parts.iter().map(|r| request.base.slice(r.clone())).collect());
    for query_range in query_tiles {
        let queries = request.queries.slice(query_range.clone());
        let run_part = |p: usize| -> Result<(RunStats, Vec<ResultChunk>)> {
            let sliced;
            let base = match &base_copies {
                Some(copies) => &copies[p],
                None => {
                    sliced = request.base.slice(base_parts[p].clone());
                    &sliced
                }
            };
            let collected = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: sink.chunk_rows() };
            let part_stats = run(p, &KnnRequest { base, queries: &queries, ..*request }, &collected)?;
            sink.advance(1);
            Ok((part_stats, collected.chunks.into_inner().unwrap_or_else(|e| e.into_inner())))
        };
        let mut nearest: Vec<Vec<Neighbour>> = vec![Vec::new(); queries.len()];
        let mut merge = |p: usize, (part_stats, chunks): (RunStats, Vec<ResultChunk>)| {
            stats.add(&part_stats);
            for chunk in chunks {
                for i in 0..chunk.len() {
                    let position = chunk.right[i] + base_parts[p].start as u32;
                    nearest[chunk.left[i] as usize].push(Neighbour { distance: chunk.distance[i], position });
                }
            }
            nearest.par_iter_mut().for_each(|list| *list = k_smallest(std::mem::take(list), request.k));
        };
        if parallel {
            let outcomes: Vec<Result<(RunStats, Vec<ResultChunk>)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..base_parts.len()).map(|p| scope.spawn(move || run_part(p))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| exec_err!("kNN: a part of the base panicked")))
                    .collect()
            });
            for (p, outcome) in outcomes.into_iter().enumerate() {
                merge(p, outcome?);
            }
        } else {
            for p in 0..base_parts.len() {
                merge(p, run_part(p)?);
            }
        }
        send_ranked(
            sink,
            nearest.into_iter().enumerate().map(|(i, list)| (query_range.start + i, Ranked::List(list))).collect(),
        )?;
    }
    Ok(stats)
}

/// Passes a tile's chunks on with the whole inputs' positions (and, `mirror`, each pair also the
/// other way round). The tile's own progress is not passed on: the tiles are the units.
struct OffsetSink<'s> {
    inner: &'s dyn ResultSink,
    left: u32,
    right: u32,
    mirror: bool,
}

impl ResultSink for OffsetSink<'_> {
    fn send(&self, mut chunk: ResultChunk) -> Result<()> {
        chunk.left.iter_mut().for_each(|p| *p += self.left);
        chunk.right.iter_mut().for_each(|p| *p += self.right);
        if self.mirror {
            let (lefts, rights, distances) = (chunk.right.clone(), chunk.left.clone(), chunk.distance.clone());
            chunk.left.extend(lefts);
            chunk.right.extend(rights);
            chunk.distance.extend(distances);
            // An off-diagonal tile's pairs join two disjoint ranges: each has a mirror image.
            chunk.counted *= 2;
        }
        self.inner.send(chunk)
    }

    fn chunk_rows(&self) -> usize {
        if self.mirror { (self.inner.chunk_rows() / 2).max(1) } else { self.inner.chunk_rows() }
    }

    fn wants(&self) -> Wanted {
        self.inner.wants()
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::Mutex;

    use datafusion::common::Result;

    use super::{merged_knn, tile_ranges, tiled_join, tiled_knn};
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, SelfJoin};
    use crate::backend::{JoinRequest, KnnRequest, ResultChunk, ResultSink};
    use crate::datagen::{self, Distribution};
    use crate::op::{IndexChoice, Metric};
    use crate::vectors::Vectors;

    #[test]
    fn tiles_cover_every_position_once() {
        assert_eq!(tile_ranges(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(tile_ranges(8, 4), vec![0..4, 4..8]);
        assert_eq!(tile_ranges(0, 4), Vec::<Range<usize>>::new());
        assert_eq!(tile_ranges(3, 0), vec![0..1, 1..2, 2..3]);
    }

    /// Collects everything a run sends.
    #[derive(Default)]
    struct Rows(Mutex<Vec<(u32, u32, u64, u32)>>);

    impl ResultSink for Rows {
        fn send(&self, chunk: ResultChunk) -> Result<()> {
            let mut rows = self.0.lock().unwrap();
            for i in 0..chunk.len() {
                rows.push((
                    chunk.left[i],
                    chunk.right[i],
                    chunk.distance[i].to_bits(),
                    chunk.rank.get(i).copied().unwrap_or(0),
                ));
            }
            Ok(())
        }

        fn chunk_rows(&self) -> usize {
            100
        }
    }

    fn vectors(n: usize, dim: usize, seed: u64) -> Vectors {
        let values = datagen::generate(Distribution::Blobs, n, dim, seed);
        Vectors::new(dim, values)
    }

    /// The tiled run on the CPU backend equals the untiled one: every self-join form, plain joins,
    /// and kNN with ties (a lattice) and k beyond a tile's size.
    #[test]
    fn tiled_runs_equal_one_run() {
        let a = vectors(230, 3, 1);
        let b = vectors(170, 3, 2);
        let eps = datagen::calibrate_threshold(&a.values.to_f64(), 3, 12.0, Metric::L2, 1);
        let run = |r: &JoinRequest, s: &dyn ResultSink| CpuBackend.join(r, s);
        let self_joins = [
            None,
            Some(SelfJoin { include_self: false, ordered: true }),
            Some(SelfJoin { include_self: true, ordered: false }),
        ];
        for self_join in self_joins {
            let right = if self_join.is_some() { &a } else { &b };
            let request = JoinRequest {
                left: &a,
                right,
                metric: Metric::L2,
                threshold: eps,
                self_join,
                index: IndexChoice::Auto,
                grid_dims: 0,
                plan: Default::default(),
            };
            let (whole, tiled) = (Rows::default(), Rows::default());
            CpuBackend.join(&request, &whole).unwrap();
            let stats = tiled_join(&request, &tiled, 64, run).unwrap();
            let (mut whole, mut tiled) = (whole.0.into_inner().unwrap(), tiled.0.into_inner().unwrap());
            whole.sort_unstable();
            tiled.sort_unstable();
            assert!(whole.len() > 200, "{self_join:?}: only {} pairs", whole.len());
            assert_eq!(tiled, whole, "{self_join:?}");
            assert!(stats.candidates > 0);
        }
        let lattice: Vec<f64> = (0..300 * 2).map(|i| ((i * 7919) % 5) as f64).collect();
        let base = Vectors::new(2, lattice);
        let queries = vectors(40, 2, 3);
        for k in [1, 10, 90, 300, 301] {
            let request = KnnRequest {
                base: &base,
                queries: &queries,
                metric: Metric::L1,
                k,
                approx: None,
                index: IndexChoice::Auto,
            };
            let (whole, tiled) = (Rows::default(), Rows::default());
            CpuBackend.knn(&request, &whole).unwrap();
            tiled_knn(&request, &tiled, 16, 70, |r, s| CpuBackend.knn(r, s)).unwrap();
            let whole = whole.0.into_inner().unwrap();
            assert_eq!(tiled.0.into_inner().unwrap(), whole, "k = {k}");
            // The base divided among devices running at once, each part of its own size.
            let divided = Rows::default();
            merged_knn(&request, &divided, 25, &[0..100, 100..130, 130..300], true, |_, r, s| CpuBackend.knn(r, s))
                .unwrap();
            assert_eq!(divided.0.into_inner().unwrap(), whole, "k = {k}, base in parts");
        }
    }
}
