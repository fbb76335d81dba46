//! Bounded selection of the k smallest (distance, position) pairs, ties by position, and the sink
//! that keeps a part's chunks for such a merge.

use std::cmp::Ordering;
use std::sync::Mutex;

use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};

use crate::backend::{ResultChunk, ResultSink};

/// Keeps the chunks of a kNN over a part of the base for merging.
pub(crate) struct Collector {
    pub(crate) chunks: Mutex<Vec<ResultChunk>>,
    pub(crate) chunk_rows: usize,
}

impl ResultSink for Collector {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner()).push(chunk);
        Ok(())
    }

    fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }
}

/// A neighbour candidate ordered by distance, then by position (base row order breaks ties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    /// Exact distance.
    pub distance: f64,
    /// Position of the base vector.
    pub position: u32,
}

impl Eq for Neighbour {}

impl Ord for Neighbour {
    fn cmp(&self, other: &Self) -> Ordering {
        self.distance.total_cmp(&other.distance).then(self.position.cmp(&other.position))
    }
}

impl PartialOrd for Neighbour {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The k smallest neighbours seen so far: those offered below the k-th smallest of the last
/// compaction, unordered, compacted (select the k smallest, linear time) whenever k + k/4 + 8 are
/// kept — the buffered selection of Hanák, kNN on GPU accelerators, §4.1, at about five comparisons per neighbour kept.
/// A binary heap replaced its top and sifted it down log₂ k levels per improvement, each level a
/// cache miss once the heaps of a block of queries outgrew the caches: 81 % of a 1,000-query kNN
/// at k = 10,000 (8.5 s, now 1.7–2.0 s; docs/design.md#cpu-knn). A smaller buffer keeps the bound that
/// filters rows tighter (k = 100: 0.19 s against 0.25 s with 2k).
#[derive(Debug)]
pub struct KSmallest {
    k: usize,
    kept: Vec<Neighbour>,
    /// The k-th smallest at the last compaction that kept k: nothing offered later that is not
    /// below it can be among the k smallest (k are below or equal to it already).
    limit: Option<Neighbour>,
}

impl KSmallest {
    /// An empty selection of at most `k` neighbours.
    pub fn new(k: usize) -> Self {
        Self { k, kept: Vec::new(), limit: None }
    }

    /// Offers a neighbour.
    #[inline]
    pub fn push(&mut self, n: Neighbour) {
        if self.k == 0 || self.limit.is_some_and(|limit| n >= limit) {
            return;
        }
        self.kept.push(n);
        if self.kept.len() >= self.k + self.k / 4 + 8 {
            self.compact();
        }
    }

    /// Keeps the k smallest and makes the k-th the limit (once k were kept).
    fn compact(&mut self) {
        if self.k > 0 && self.kept.len() >= self.k {
            self.kept.select_nth_unstable(self.k - 1);
            self.kept.truncate(self.k);
            self.limit = Some(self.kept[self.k - 1]);
        }
    }

    /// A distance at least the k-th smallest offered so far (the k-th smallest as of the last
    /// compaction), or +∞ while fewer than k were kept.
    #[inline]
    pub fn bound(&self) -> f64 {
        self.limit.map_or(f64::INFINITY, |limit| limit.distance)
    }

    /// The k-th smallest distance offered so far, or +∞ while fewer than k were offered.
    pub fn kth(&mut self) -> f64 {
        self.compact();
        self.bound()
    }

    /// The selection, nearest first.
    pub fn into_sorted(mut self) -> Vec<Neighbour> {
        self.compact();
        self.kept.sort_unstable();
        self.kept
    }
}

/// A query's neighbours, nearest first.
#[derive(Debug)]
pub(crate) enum Ranked<'a> {
    /// A list of its own.
    List(Vec<Neighbour>),
    /// Entries of arrays that hold many queries' lists (the GPU's, ranked on the device: without a
    /// list per query, P1's 10⁴ lists of 10 took 0.6–2.5 ms to build, docs/design.md#gpu-knn).
    #[cfg_attr(not(feature = "gpu"), allow(dead_code))]
    Arrays { distances: &'a [f64], positions: &'a [u32] },
}

impl Ranked<'_> {
    fn len(&self) -> usize {
        match self {
            Ranked::List(list) => list.len(),
            Ranked::Arrays { distances, .. } => distances.len(),
        }
    }
}

/// Sends neighbour lists, each (query, list nearest first), in the order given, ranked from 1 (the
/// order [`crate::backend::Backend::knn`] promises), in chunks of about the sink's size filled on every
/// core, a wave of one chunk per worker at a time. Filled one row after another, the 10⁸ rows of
/// a k = 10,000 kNN over 10⁴ queries held up the run for most of its 1.6 s of emission
/// (docs/design.md#gpu-transfers).
pub(crate) fn send_ranked(sink: &dyn ResultSink, mut lists: Vec<(usize, Ranked)>) -> datafusion::common::Result<()> {
    let chunk_rows = sink.chunk_rows().max(1);
    let mut chunks = Vec::new(); // (lists, rows) per chunk
    let (mut begin, mut rows) = (0, 0);
    for (i, (_, ranked)) in lists.iter().enumerate() {
        rows += ranked.len();
        if rows >= chunk_rows {
            chunks.push((begin..i + 1, rows));
            (begin, rows) = (i + 1, 0);
        }
    }
    if rows > 0 {
        chunks.push((begin..lists.len(), rows));
    }
    for wave in chunks.chunks(rayon::current_num_threads().max(1)) {
        let filled: Vec<ResultChunk> = wave
            .par_iter()
            .map(|(range, rows)| {
                let mut chunk = ResultChunk::with_capacity(*rows);
                chunk.rank.reserve(*rows);
                for (query, ranked) in &lists[range.clone()] {
                    match ranked {
                        Ranked::List(list) => push_ranked(&mut chunk, *query, list),
                        Ranked::Arrays { distances, positions } => {
                            chunk.left.extend(std::iter::repeat_n(*query as u32, distances.len()));
                            chunk.right.extend_from_slice(positions);
                            chunk.distance.extend_from_slice(distances);
                            chunk.rank.extend(1..=distances.len() as u32);
                        }
                    }
                }
                chunk
            })
            .collect();
        // The wave's lists are no longer needed: free them while the chunks go out.
        for (range, _) in wave {
            lists[range.clone()].iter_mut().for_each(|(_, ranked)| *ranked = Ranked::List(Vec::new()));
        }
        for chunk in filled {
            sink.send(chunk)?;
        }
    }
    Ok(())
}

/// Finds each of `queries` queries' neighbours (`nearest(q)`, nearest first) on every core, in
/// blocks of `block` queries, a wave of a few blocks per core at a time, and sends them ranked, in
/// query order, one chunk per block.
pub(crate) fn rank_in_waves(
    sink: &dyn ResultSink,
    queries: usize,
    block: usize,
    nearest: impl Fn(usize) -> Vec<Neighbour> + Sync,
) -> datafusion::common::Result<()> {
    rank_in_waves_with(sink, queries, block, || (), |_, q| nearest(q))
}

/// [`rank_in_waves`] with a scratch space for each block, made by `scratch()` and lent to every
/// `nearest(scratch, q)` of the block.
pub(crate) fn rank_in_waves_with<S>(
    sink: &dyn ResultSink,
    queries: usize,
    block: usize,
    scratch: impl Fn() -> S + Sync,
    nearest: impl Fn(&mut S, usize) -> Vec<Neighbour> + Sync,
) -> datafusion::common::Result<()> {
    let blocks = queries.div_ceil(block);
    sink.start(blocks as u64);
    let wave = 4 * rayon::current_num_threads().max(1);
    for first in (0..blocks).step_by(wave) {
        let chunks: Vec<ResultChunk> = (first..(first + wave).min(blocks))
            .into_par_iter()
            .map(|b| {
                let mut chunk = ResultChunk::default();
                let mut space = scratch();
                for q in b * block..((b + 1) * block).min(queries) {
                    push_ranked(&mut chunk, q, &nearest(&mut space, q));
                }
                chunk
            })
            .collect();
        for chunk in chunks {
            sink.send(chunk)?;
            sink.advance(1);
        }
    }
    Ok(())
}

/// Appends `query`'s neighbours, nearest first, to `chunk` with ranks from 1.
pub(crate) fn push_ranked(chunk: &mut ResultChunk, query: usize, list: &[Neighbour]) {
    for (rank, neighbour) in list.iter().enumerate() {
        chunk.left.push(query as u32);
        chunk.right.push(neighbour.position);
        chunk.distance.push(neighbour.distance);
        chunk.rank.push(rank as u32 + 1);
    }
}

/// Keeps the `k` smallest of `all`, nearest first.
pub fn k_smallest(mut all: Vec<Neighbour>, k: usize) -> Vec<Neighbour> {
    if all.len() > k && k > 0 {
        all.select_nth_unstable(k - 1);
        all.truncate(k);
    }
    all.sort_unstable();
    all.truncate(k);
    all
}

#[cfg(test)]
mod tests {
    use super::{KSmallest, Neighbour, Ranked, k_smallest, push_ranked, send_ranked};

    #[test]
    fn ties_go_to_the_earlier_position() {
        let mut s = KSmallest::new(2);
        for (distance, position) in [(1.0, 5), (1.0, 3), (0.5, 9), (1.0, 1)] {
            s.push(Neighbour { distance, position });
        }
        let got: Vec<u32> = s.into_sorted().iter().map(|n| n.position).collect();
        assert_eq!(got, vec![9, 1]);
        let all = (0..10).map(|p| Neighbour { distance: (p % 3) as f64, position: p }).collect();
        let got: Vec<u32> = k_smallest(all, 4).iter().map(|n| n.position).collect();
        assert_eq!(got, vec![0, 3, 6, 9]);
    }

    #[test]
    fn selection_equals_a_full_sort_through_many_compactions() {
        // Pseudo-random distances with many ties, offered in an order that improves often.
        let all: Vec<Neighbour> = (0..5000u32)
            .map(|p| Neighbour { distance: ((p.wrapping_mul(2_654_435_761) >> 20) % 97) as f64, position: p })
            .collect();
        for k in [1, 2, 7, 100, 4999, 5000, 6000] {
            let expected = k_smallest(all.clone(), k);
            let kth = if k <= all.len() { expected[k - 1].distance } else { f64::INFINITY };
            let mut s = KSmallest::new(k);
            for n in all.iter().rev() {
                s.push(*n);
                assert!(s.bound() >= kth, "k = {k}: a bound below the k-th smallest would drop neighbours");
            }
            assert_eq!(s.kth(), kth, "k = {k}");
            assert_eq!(s.into_sorted(), expected, "k = {k}");
        }
        let mut none = KSmallest::new(0);
        none.push(Neighbour { distance: 1.0, position: 0 });
        assert!(none.into_sorted().is_empty());
    }

    /// Chunks filled in parallel come out in the lists' order (lists of their own and entries of
    /// shared arrays alike), ranks from 1 per list, every chunk but the last holding at least the
    /// sink's chunk size and ending at a list's end.
    #[test]
    fn ranked_lists_go_out_in_order() {
        struct Chunks(std::sync::Mutex<Vec<crate::backend::ResultChunk>>);
        impl crate::backend::ResultSink for Chunks {
            fn send(&self, chunk: crate::backend::ResultChunk) -> datafusion::common::Result<()> {
                self.0.lock().unwrap().push(chunk);
                Ok(())
            }
            fn chunk_rows(&self) -> usize {
                7
            }
        }
        let lists: Vec<(usize, Vec<Neighbour>)> = (0..200)
            .map(|q| {
                (
                    3 * q + 1,
                    (0..(q * 13) % 11).map(|j| Neighbour { distance: j as f64, position: (q + j) as u32 }).collect(),
                )
            })
            .collect();
        let mut expected = crate::backend::ResultChunk::default();
        for (query, list) in &lists {
            push_ranked(&mut expected, *query, list);
        }
        // Every other list as entries of arrays that hold them all.
        let distances: Vec<f64> = lists.iter().flat_map(|(_, l)| l.iter().map(|n| n.distance)).collect();
        let positions: Vec<u32> = lists.iter().flat_map(|(_, l)| l.iter().map(|n| n.position)).collect();
        let mut start = 0;
        let ranked = lists
            .into_iter()
            .enumerate()
            .map(|(i, (query, list))| {
                let range = start..start + list.len();
                start = range.end;
                match i % 2 {
                    0 => (query, Ranked::List(list)),
                    _ => (query, Ranked::Arrays { distances: &distances[range.clone()], positions: &positions[range] }),
                }
            })
            .collect();
        let sink = Chunks(std::sync::Mutex::new(Vec::new()));
        send_ranked(&sink, ranked).unwrap();
        let chunks = sink.0.into_inner().unwrap();
        assert!(chunks.len() > 20);
        let mut got = crate::backend::ResultChunk::default();
        for (i, chunk) in chunks.iter().enumerate() {
            assert!(i + 1 == chunks.len() || chunk.len() >= 7, "chunk {i} of {} rows", chunk.len());
            assert!(
                i + 1 == chunks.len()
                    || chunk.rank[chunk.len() - 1] as usize == (chunk.left[chunk.len() - 1] as usize / 3 * 13) % 11
            );
            got.left.extend(&chunk.left);
            got.right.extend(&chunk.right);
            got.distance.extend(&chunk.distance);
            got.rank.extend(&chunk.rank);
        }
        assert_eq!(got, expected);
    }
}
