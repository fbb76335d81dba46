//! Jaccard joins, range queries and kNN over token sets (`metric=jaccard` over a list column) on
//! every core.
//!
//! Both inputs' tokens are numbered in one global order, rarest first (ties by first
//! appearance), and every set lists its tokens in that order, so the rare tokens come first.
//!
//! * ε-join / range query: the prefix filter with the length and position filters (AllPairs and
//!   PPJoin, as Mann, Augsten and Bouros evaluate them): each right set is indexed by the tokens of
//!   its prefix ([`prefix_length`]), each left set probes the lists of its own prefix's tokens for
//!   right sets whose size lies in its window ([`size_window`]), a candidate first met at positions
//!   `(i, j)` is dropped when even `1 + min(a − i − 1, b − j − 1)` common tokens would be too few
//!   ([`min_overlap`]), and every other candidate is verified by merging the two sets. A self-join
//!   probes only the sets before it in (size, position) order, so each pair is found once. The
//!   bounds are stated against the computed f64 distance itself (plan/bounds.rs), so the filters
//!   lose no pair the exact test accepts. Empty sets are within 0 of each other and 1 of every
//!   other set; a threshold of 1 or more takes every pair, compared one by one.
//! * kNN: the base indexed by all its tokens; each query reads the lists of its tokens rarest
//!   first, verifying every base set it meets, and stops once the tokens read are as many as the
//!   prefix of its current k-th distance: a set within that distance shares a token with any
//!   `a − α + 1` of the query's tokens. The base sets it never meets share no token with it and are
//!   all at distance 1; where the k nearest reach 1, those fill the list in position order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::{Result, exec_err};
use rayon::iter::{IntoParallelIterator, IntoParallelRefMutIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::plan::bounds::{jaccard_of_counts, min_overlap, prefix_length, size_window};
use crate::backend::plan::topk::{KSmallest, Neighbour, rank_in_waves_with};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::op::IndexChoice;
use crate::vectors::{Dictionary, Sets};

/// Left sets per unit of parallel work.
const BLOCK: usize = 512;

/// Sets with their tokens numbered in the global order (rarest first), each listed ascending.
pub(crate) struct OrderedSets {
    offsets: Vec<usize>,
    tokens: Vec<u32>,
}

impl OrderedSets {
    fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Set `i`'s tokens, rarest first.
    #[inline]
    pub(crate) fn set(&self, i: usize) -> &[u32] {
        &self.tokens[self.offsets[i]..self.offsets[i + 1]]
    }

    #[inline]
    fn size(&self, i: usize) -> u32 {
        (self.offsets[i + 1] - self.offsets[i]) as u32
    }
}

/// Both inputs' sets in one global token order: the right input's tokens mapped onto the left's
/// dictionary (new ones after it), every token ranked by its count in both inputs, rarest first,
/// ties by that joint number. `right` is `None` for a self-join. The order only decides which
/// tokens the prefixes hold; the answers do not depend on it.
pub(crate) fn in_global_order(left: &Sets, right: Option<&Sets>) -> Result<(OrderedSets, Option<OrderedSets>)> {
    let left_len = left.dictionary.len();
    let joint_of_right: Option<Vec<u32>> = match right {
        None => None,
        Some(right) => Some(joint_ids(&left.dictionary, &right.dictionary)?),
    };
    let tokens = joint_of_right
        .as_ref()
        .map_or(left_len, |ids| ids.iter().copied().max().map_or(left_len, |m| (m as usize + 1).max(left_len)));
    let mut counts = vec![0u32; tokens];
    left.tokens.iter().for_each(|&t| counts[t as usize] += 1);
    if let (Some(right), Some(ids)) = (right, &joint_of_right) {
        right.tokens.iter().for_each(|&t| counts[ids[t as usize] as usize] += 1);
    }
    let mut by_count: Vec<u32> = (0..tokens as u32).collect();
    by_count.par_sort_unstable_by_key(|&t| (counts[t as usize], t));
    let mut rank = vec![0u32; tokens];
    for (r, &t) in by_count.iter().enumerate() {
        rank[t as usize] = r as u32;
    }
    let left_ordered = renumbered(left, |t| rank[t as usize]);
    let right_ordered = right.map(|right| {
        let ids = joint_of_right.as_ref().expect("mapped above");
        renumbered(right, |t| rank[ids[t as usize] as usize])
    });
    Ok((left_ordered, right_ordered))
}

/// The joint id of each token of `right`'s dictionary: its id in `left`'s where it is there, else
/// one after `left`'s, in order.
fn joint_ids(left: &Dictionary, right: &Dictionary) -> Result<Vec<u32>> {
    let mut next = left.len() as u32;
    let mut fresh = || {
        next += 1;
        next - 1
    };
    Ok(match (left, right) {
        (Dictionary::Integers(l), Dictionary::Integers(r)) => {
            let ids: HashMap<i128, u32, foldhash::fast::FixedState> =
                l.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
            r.iter().map(|v| ids.get(v).copied().unwrap_or_else(&mut fresh)).collect()
        }
        (Dictionary::Strings(l), Dictionary::Strings(r)) => {
            let ids: HashMap<&str, u32, foldhash::fast::FixedState> =
                l.iter().enumerate().map(|(i, v)| (v.as_ref(), i as u32)).collect();
            r.iter().map(|v| ids.get(v.as_ref()).copied().unwrap_or_else(&mut fresh)).collect()
        }
        _ => return exec_err!("metric jaccard: the two inputs hold sets of different kinds (strings and integers)"),
    })
}

/// `sets` with every token `t` numbered `rank(t)`, each set sorted again.
fn renumbered(sets: &Sets, rank: impl Fn(u32) -> u32 + Sync) -> OrderedSets {
    let mut tokens: Vec<u32> = sets.tokens.iter().map(|&t| rank(t)).collect();
    let offsets = if sets.offsets.is_empty() { vec![0] } else { sets.offsets.clone() };
    // Each set sorted on its own, in parallel over groups of sets.
    let mut pieces: Vec<&mut [u32]> = Vec::with_capacity(offsets.len());
    let mut rest = tokens.as_mut_slice();
    for w in offsets.windows(2) {
        let (set, tail) = rest.split_at_mut(w[1] - w[0]);
        pieces.push(set);
        rest = tail;
    }
    pieces.par_iter_mut().for_each(|set| set.sort_unstable());
    OrderedSets { offsets, tokens }
}

/// The number of tokens `a` and `b` (each ascending) have in common, or `None` once fewer than
/// `need` are possible.
#[inline]
pub(crate) fn overlap_at_least(a: &[u32], b: &[u32], need: u32) -> Option<u32> {
    let (mut i, mut j, mut common) = (0, 0, 0u32);
    while i < a.len() && j < b.len() {
        // What can still be common: the shorter remainder.
        if common + ((a.len() - i).min(b.len() - j) as u32) < need {
            return None;
        }
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
        }
    }
    (common >= need).then_some(common)
}

/// The Jaccard distance of `a` and `b` if it is within `eps`.
#[inline]
fn within(a: &[u32], b: &[u32], eps: f64) -> Option<f64> {
    let (la, lb) = (a.len() as u32, b.len() as u32);
    let need = min_overlap(la, lb, eps)?;
    let common = overlap_at_least(a, b, need)?;
    let distance = jaccard_of_counts(common, la, lb);
    (distance <= eps).then_some(distance)
}

/// Positions of a side's sets ordered by (size, position), and the sizes in that order.
struct BySize {
    order: Vec<u32>,
    sizes: Vec<u32>,
}

impl BySize {
    fn new(sets: &OrderedSets) -> Self {
        let mut order: Vec<u32> = (0..sets.len() as u32).collect();
        order.par_sort_unstable_by_key(|&p| (sets.size(p as usize), p));
        let sizes = order.iter().map(|&p| sets.size(p as usize)).collect();
        BySize { order, sizes }
    }

    /// The range of `order` whose sizes lie in `[low, high]`.
    fn window(&self, (low, high): (u32, u32)) -> std::ops::Range<usize> {
        self.sizes.partition_point(|&s| s < low)..self.sizes.partition_point(|&s| s <= high)
    }
}

/// The inverted lists of the sets' prefix tokens (or of all their tokens, `prefix` = `None`):
/// for each token, (rank in [`BySize`] order, the token's position in the set), ascending by rank.
struct PrefixIndex {
    starts: Vec<usize>,
    entries: Vec<(u32, u32)>,
}

impl PrefixIndex {
    fn build(sets: &OrderedSets, by_size: &BySize, tokens: usize, prefix: impl Fn(u32) -> u32) -> Self {
        let mut starts = vec![0usize; tokens + 1];
        for &p in &by_size.order {
            let set = sets.set(p as usize);
            for &t in &set[..(prefix(set.len() as u32) as usize).min(set.len())] {
                starts[t as usize + 1] += 1;
            }
        }
        for t in 0..tokens {
            starts[t + 1] += starts[t];
        }
        let mut fill = starts.clone();
        let mut entries = vec![(0u32, 0u32); starts[tokens]];
        for (rank, &p) in by_size.order.iter().enumerate() {
            let set = sets.set(p as usize);
            for (j, &t) in set[..(prefix(set.len() as u32) as usize).min(set.len())].iter().enumerate() {
                entries[fill[t as usize]] = (rank as u32, j as u32);
                fill[t as usize] += 1;
            }
        }
        PrefixIndex { starts, entries }
    }

    #[inline]
    fn list(&self, token: u32) -> &[(u32, u32)] {
        let t = token as usize;
        if t + 1 >= self.starts.len() {
            return &[];
        }
        &self.entries[self.starts[t]..self.starts[t + 1]]
    }
}

/// A probe's candidates: per right rank, the tokens met so far (or [`PRUNED`]), and which were met.
struct Candidates {
    count: Vec<u32>,
    met: Vec<u32>,
}

/// A candidate the position filter has ruled out.
const PRUNED: u32 = u32::MAX;

impl Candidates {
    fn new(n: usize) -> Self {
        Candidates { count: vec![0; n], met: Vec::new() }
    }
}

/// Every (left, right) pair within the threshold.
pub fn join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let JoinRequest { left, right, threshold: eps, self_join, index, .. } = *request;
    let mut stats = RunStats::default();
    if left.is_empty() || right.is_empty() {
        return Ok(stats);
    }
    let same = self_join.is_some();
    let (left_sets, right_sets) = in_global_order(&left.sets, (!same).then_some(&right.sets))?;
    let right_sets = right_sets.as_ref().unwrap_or(&left_sets);
    let tokens = left_sets.tokens.iter().chain(&right_sets.tokens).max().map_or(0, |&t| t as usize + 1);
    let by_size = BySize::new(right_sets);
    let brute = index == IndexChoice::BruteForce || eps >= 1.0;
    let prefix =
        PrefixIndex::build(
            right_sets,
            &by_size,
            tokens,
            |size| {
                if brute { 0 } else { prefix_length(size, eps).unwrap_or(0) }
            },
        );
    stats.build_time = start.elapsed();
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    let ordered = self_join.is_some_and(|s| s.ordered);
    let include_self = self_join.is_some_and(|s| s.include_self);
    let blocks = left.len().div_ceil(BLOCK);
    sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = PairWriter::new(sink, ordered);
        let mut candidates = Candidates::new(if brute { 0 } else { right_sets.len() });
        let mut count = 0u64;
        for a in b * BLOCK..((b + 1) * BLOCK).min(left.len()) {
            let set = left_sets.set(a);
            let size = set.len() as u32;
            let window = by_size.window(size_window(size, eps));
            // A self-join's probe meets only the sets before it in (size, position) order.
            let before = |rank: u32| -> bool {
                !same || {
                    let p = by_size.order[rank as usize];
                    (by_size.sizes[rank as usize], p) < (size, a as u32)
                }
            };
            let mut pair = |rank: u32, writer: &mut PairWriter| -> Result<()> {
                let r = by_size.order[rank as usize];
                count += 1;
                if let Some(distance) = within(set, right_sets.set(r as usize), eps) {
                    let (x, y) = if same && r < a as u32 { (r, a as u32) } else { (a as u32, r) };
                    writer.push(x, y, distance)?;
                }
                Ok(())
            };
            match (brute, prefix_length(size, eps)) {
                // Every partner in the window, compared (also every pair needing no common token:
                // empty sets, or a threshold of 1 or more).
                (true, _) | (false, None) => {
                    for rank in window.clone() {
                        if before(rank as u32) {
                            pair(rank as u32, &mut writer)?;
                        }
                    }
                }
                (false, Some(length)) => {
                    for (i, &token) in set[..length as usize].iter().enumerate() {
                        let list = prefix.list(token);
                        let from = list.partition_point(|&(rank, _)| (rank as usize) < window.start);
                        for &(rank, j) in &list[from..] {
                            if rank as usize >= window.end || !before(rank) {
                                break;
                            }
                            let slot = &mut candidates.count[rank as usize];
                            match *slot {
                                PRUNED => {}
                                0 => {
                                    // First met at (i, j): the common tokens are at most this one
                                    // and the shorter remainder.
                                    let other = by_size.sizes[rank as usize];
                                    let most = 1 + (size - i as u32 - 1).min(other - j - 1);
                                    let enough = min_overlap(size, other, eps).is_some_and(|need| most >= need);
                                    *slot = if enough { 1 } else { PRUNED };
                                    candidates.met.push(rank);
                                }
                                _ => *slot += 1,
                            }
                        }
                    }
                    for rank in std::mem::take(&mut candidates.met) {
                        if candidates.count[rank as usize] != PRUNED {
                            pair(rank, &mut writer)?;
                        }
                        candidates.count[rank as usize] = 0;
                    }
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

/// The `k` nearest base sets of every query, ties by base position.
pub fn knn(request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, k, .. } = *request;
    let k = k.min(base.len());
    let mut stats = RunStats::default();
    if k == 0 || queries.is_empty() {
        return Ok(stats);
    }
    let (query_sets, base_sets) = in_global_order(&queries.sets, Some(&base.sets))?;
    let base_sets = base_sets.expect("two inputs");
    let tokens = query_sets.tokens.iter().chain(&base_sets.tokens).max().map_or(0, |&t| t as usize + 1);
    // Every token of every base set, ranks in position order (BySize's order is only the lists').
    let positions = BySize { order: (0..base_sets.len() as u32).collect(), sizes: Vec::new() };
    let index = PrefixIndex::build(&base_sets, &positions, tokens, |size| size);
    let empties: Vec<u32> = (0..base_sets.len() as u32).filter(|&p| base_sets.size(p as usize) == 0).collect();
    stats.build_time = start.elapsed();
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    rank_in_waves_with(
        sink,
        queries.len(),
        BLOCK / 4,
        || vec![u32::MAX; base_sets.len()],
        |seen, q| {
            let mut count = 0;
            let list = nearest(&index, &base_sets, &empties, query_sets.set(q), k, q as u32, seen, &mut count);
            checked.fetch_add(count, Ordering::Relaxed);
            list
        },
    )?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The `k` nearest base sets of `query` (query number `q`: the stamp its visits leave in `seen`),
/// nearest first, ties by position.
#[allow(clippy::too_many_arguments)]
fn nearest(
    index: &PrefixIndex,
    base: &OrderedSets,
    empties: &[u32],
    query: &[u32],
    k: usize,
    q: u32,
    seen: &mut [u32],
    checked: &mut u64,
) -> Vec<Neighbour> {
    let size = query.len() as u32;
    let mut best = KSmallest::new(k);
    if size == 0 {
        // Within 0 of the empty base sets, 1 of every other.
        empties.iter().for_each(|&p| best.push(Neighbour { distance: 0.0, position: p }));
    } else {
        for (read, &token) in query.iter().enumerate() {
            // The tokens a set within the current k-th distance must share one of.
            let bound = best.kth();
            if bound < 1.0 && prefix_length(size, bound).is_some_and(|length| read as u32 >= length) {
                break;
            }
            for &(p, _) in index.list(token) {
                if seen[p as usize] == q {
                    continue;
                }
                seen[p as usize] = q;
                *checked += 1;
                let other = base.set(p as usize);
                if let Some(distance) = within(query, other, best.bound().min(1.0)) {
                    best.push(Neighbour { distance, position: p });
                }
            }
        }
    }
    let mut list = best.into_sorted();
    // The k nearest reach distance 1 (or are too few): every set not met is at 1, tied, and the
    // first positions among them and the met ones at 1 come first.
    if list.len() < k || list.last().is_some_and(|n| n.distance >= 1.0) {
        list.retain(|n| n.distance < 1.0);
        let mut below: Vec<u32> = list.iter().map(|n| n.position).collect();
        below.sort_unstable();
        let taken = |p: u32| below.binary_search(&p).is_ok();
        let fill = (0..base.len() as u32).filter(|&p| !taken(p)).take(k - list.len());
        list.extend(fill.map(|p| Neighbour { distance: 1.0, position: p }).collect::<Vec<_>>());
    }
    list
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, ListArray};
    use datafusion::arrow::datatypes::Int32Type;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{join, knn};
    use crate::backend::plan::bounds::jaccard_of_counts;
    use crate::backend::plan::topk::Collector;
    use crate::backend::{JoinRequest, KnnRequest, SelfJoin};
    use crate::op::{IndexChoice, Metric};
    use crate::vectors::{VectorSource, Vectors};

    /// `n` sets of up to `len` integer tokens drawn from `alphabet` (skewed), with some empty,
    /// some NULL and some repeated.
    fn sets(n: usize, len: usize, alphabet: i32, seed: u64) -> (Vectors, Vec<Option<Vec<i32>>>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let rows: Vec<Option<Vec<i32>>> = (0..n)
            .map(|i| match rng.random_range(0..20) {
                0 => None,
                1 => Some(vec![]),
                2 if i > 0 => None,
                _ => Some(
                    (0..rng.random_range(1..=len))
                        .map(|_| (rng.random::<f64>().powi(3) * alphabet as f64) as i32)
                        .collect(),
                ),
            })
            .collect();
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
            rows.iter().map(|r| r.as_ref().map(|v| v.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        );
        let source = VectorSource::Set { index: 0 };
        let batch =
            datafusion::arrow::array::RecordBatch::try_from_iter(vec![("s", Arc::new(list) as ArrayRef)]).unwrap();
        (Vectors::from_batch(&batch, &source, false, "t").unwrap(), rows)
    }

    fn distance(a: &[i32], b: &[i32]) -> f64 {
        let a: std::collections::BTreeSet<i32> = a.iter().copied().collect();
        let b: std::collections::BTreeSet<i32> = b.iter().copied().collect();
        jaccard_of_counts(a.intersection(&b).count() as u32, a.len() as u32, b.len() as u32)
    }

    fn rows_of(chunks: Vec<crate::backend::ResultChunk>) -> Vec<(u32, u32, u64, u32)> {
        let mut rows: Vec<_> = chunks
            .into_iter()
            .flat_map(|c| {
                let rank = if c.rank.is_empty() { vec![0; c.left.len()] } else { c.rank };
                c.left.into_iter().zip(c.right).zip(c.distance).zip(rank).map(|(((l, r), d), k)| (l, r, d.to_bits(), k))
            })
            .collect();
        rows.sort_unstable();
        rows
    }

    #[test]
    fn joins_equal_the_brute_force_at_every_threshold() {
        let (a, rows_a) = sets(700, 12, 40, 1);
        let (b, rows_b) = sets(500, 12, 40, 2);
        let valid = |rows: &[Option<Vec<i32>>]| -> Vec<Vec<i32>> { rows.iter().flatten().cloned().collect() };
        let (va, vb) = (valid(&rows_a), valid(&rows_b));
        // Thresholds at pairs' own distances too (2/3, 1/2, …).
        for eps in [0.0, 0.2, 1.0 / 3.0, 0.5, 2.0 / 3.0, 0.9, 1.0] {
            for index in [IndexChoice::Auto, IndexChoice::BruteForce] {
                let sink = Collector { chunks: Default::default(), chunk_rows: 1000 };
                let request = JoinRequest {
                    left: &a,
                    right: &b,
                    metric: Metric::Jaccard,
                    threshold: eps,
                    self_join: None,
                    index,
                    grid_dims: 0,
                    plan: Default::default(),
                };
                join(&request, &sink).unwrap();
                let mut expected = Vec::new();
                for (i, x) in va.iter().enumerate() {
                    for (j, y) in vb.iter().enumerate() {
                        let d = distance(x, y);
                        if d <= eps {
                            expected.push((i as u32, j as u32, d.to_bits(), 0));
                        }
                    }
                }
                expected.sort_unstable();
                assert_eq!(rows_of(sink.chunks.into_inner().unwrap()), expected, "eps {eps} {index:?}");
                // The self-join, each pair once with the smaller position first.
                let sink = Collector { chunks: Default::default(), chunk_rows: 1000 };
                let self_join = Some(SelfJoin { include_self: false, ordered: false });
                let request = JoinRequest {
                    left: &a,
                    right: &a,
                    metric: Metric::Jaccard,
                    threshold: eps,
                    self_join,
                    index,
                    grid_dims: 0,
                    plan: Default::default(),
                };
                join(&request, &sink).unwrap();
                let mut expected = Vec::new();
                for (i, x) in va.iter().enumerate() {
                    for (j, y) in va.iter().enumerate().skip(i + 1) {
                        let d = distance(x, y);
                        if d <= eps {
                            expected.push((i as u32, j as u32, d.to_bits(), 0));
                        }
                    }
                }
                expected.sort_unstable();
                assert_eq!(rows_of(sink.chunks.into_inner().unwrap()), expected, "self eps {eps} {index:?}");
            }
        }
    }

    #[test]
    fn knn_equals_the_brute_force_ties_by_position() {
        let (base, rows_base) = sets(900, 8, 30, 3);
        let (queries, rows_q) = sets(60, 8, 30, 4);
        let vb: Vec<Vec<i32>> = rows_base.iter().flatten().cloned().collect();
        let vq: Vec<Vec<i32>> = rows_q.iter().flatten().cloned().collect();
        for k in [1, 5, 40, 2000] {
            let sink = Collector { chunks: Default::default(), chunk_rows: 1000 };
            let request = KnnRequest {
                base: &base,
                queries: &queries,
                metric: Metric::Jaccard,
                k,
                approx: None,
                index: IndexChoice::Auto,
            };
            knn(&request, &sink).unwrap();
            let mut expected = Vec::new();
            for (q, x) in vq.iter().enumerate() {
                let mut all: Vec<(f64, u32)> = vb.iter().enumerate().map(|(p, y)| (distance(x, y), p as u32)).collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                for (rank, (d, p)) in all.into_iter().take(k).enumerate() {
                    expected.push((q as u32, p, d.to_bits(), rank as u32 + 1));
                }
            }
            expected.sort_unstable();
            assert_eq!(rows_of(sink.chunks.into_inner().unwrap()), expected, "k {k}");
        }
    }
}
