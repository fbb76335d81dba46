//! The graph over a Multicurves index's rows, which the cores' approximate search walks from the
//! curves' candidates (the design of EFANNA: Fu and Cai, "EFANNA: An Extremely Fast Approximate
//! Nearest Neighbor Search Algorithm Based on kNN Graph", whose seeds come from trees where ours
//! come from the curves).
//!
//! Why a graph. The curves alone find a query's neighbours only where one of their few dimensions
//! keeps them near it: on Fashion-MNIST 2,560 entries a query reach recall@10 0.95, and within a
//! cluster of isotropic noise (the blobs) no curve orders the points. A row's nearest rows are
//! near the query too wherever the row is, so once the curves have led a search to the query's
//! neighbourhood, following the graph's edges from the nearest found reaches the rest in a few
//! hundred distances (docs/approx.md#measured).
//!
//! How it is built, in three steps:
//!
//! 1. **A kNN graph** by NN-descent (Dong, Charikar and Li, "Efficient k-nearest neighbor graph
//!    construction for generic similarity measures") started from the curves: each row's first
//!    candidates are its [`WINDOW`] neighbours on either side along every curve (rows adjacent on
//!    a curve are near in its dimensions); a round then offers every row its neighbours'
//!    neighbours and keeps the nearest [`DEGREE`]; every row also lists up to [`DEGREE`] of the
//!    rows that list it. Each round reads the previous round's lists and writes new ones, so the
//!    rows are processed in parallel without locks.
//! 2. **Each row's own edges chosen for diversity** ([`diverse`]): the row is searched for as a
//!    query through the previous graph from the row itself, keeping a pool of [`BUILD_POOLS`]
//!    rows, and of those the [`OUT_DEGREE`] that no nearer kept row already leads to (the
//!    relative-neighbourhood rule of HNSW and NSG, with Vamana's slack [`ALPHA`]). A kNN list
//!    holds a row's nearest, often all on one side of it and within its own cluster; the diverse
//!    edges point every way, so a walk reaches the query's neighbourhood in fewer steps (GloVe:
//!    recall@10 0.96 against 0.71 at the same effort; docs/approx.md#measured).
//! 3. **The edges into each row** join its own ([`NeighbourGraph::with_edges_into`]), up to
//!    [`WIDTH`] in all, so a walk can leave a row the way it came.
//!
//! Steps 2 and 3 run once for each of [`BUILD_POOLS`], each pass searching the graph the last one
//! made (Subramanya et al.'s passes of Vamana). Every pass reads the previous graph alone, so the
//! graph is the same on any number of cores. A GPU search of an index without a graph builds the
//! kNN graph on the device by the same rounds ([`NeighbourGraph::build_by`], each row's
//! candidates measured there: backend/gpu/approx.rs) and walks that.

use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use super::curves::Multicurves;
use super::pages::huge_filled;

/// Nearest rows each row keeps.
pub const DEGREE: usize = 16;
/// Edges a row has in the searched graph: its [`DEGREE`] nearest and up to as many rows that
/// list it.
pub const WIDTH: usize = 2 * DEGREE;
/// Neighbours on either side along each curve a row starts from.
pub const WINDOW: usize = 2;
/// Rounds of NN-descent.
const ROUNDS: usize = 1;
/// Rows a row's search keeps in each pass of the search-and-choose build over the kNN graph (the
/// candidates of its own edges): every pass's search reads the last pass's graph (the first pass,
/// the kNN graph). A third pass, its first of 32 rows: GloVe recall@10 0.930 / 0.969 at efforts
/// 2 / 4 for 31.7 s, against 0.921 / 0.960 for two of 64 in 26.8 s (docs/approx.md#measured).
pub const BUILD_POOLS: [usize; 3] = [32, 64, 64];
/// Edges a row chooses from its own search, before the edges into it join them.
pub const OUT_DEGREE: usize = 24;
/// The slack of [`diverse`]'s rule: a candidate is dropped only where a kept row is nearer to it
/// than this fraction of its distance to the row.
const ALPHA: f32 = 1.1;
/// An empty slot of a row's edges.
pub const NONE: u32 = u32::MAX;

/// The graph's parameters, one string (part of a stored index's key, index/stored.rs).
pub fn build_parameters() -> String {
    format!(
        "degree={DEGREE} width={WIDTH} window={WINDOW} rounds={ROUNDS} start=row pools={BUILD_POOLS:?} \
         out={OUT_DEGREE} alpha={ALPHA} measure=codes8"
    )
}

/// The candidates a round of the build offers each row.
pub enum Offer<'a> {
    /// The rows [`WINDOW`] either side of it along every curve (itself among them).
    Curves,
    /// The rows its list and its reverse list name, and the rows their lists name (each
    /// [`DEGREE`] slots a row, [`NONE`] after the last).
    Neighbours { nearest: &'a [u32], reverse: &'a [u32] },
}

/// The graph: every row's edges, [`WIDTH`] slots a row, the unused ones [`NONE`] at the end.
#[derive(Debug)]
pub struct NeighbourGraph {
    edges: Vec<u32>,
}

impl NeighbourGraph {
    /// Builds the graph of `index`'s rows on every core, `distances(i, rows, out)` appending to
    /// `out` the distance from row `i` to each of `rows` by the measure the search ranks by
    /// (symmetric). Deterministic: the same index gives the same graph.
    pub fn build(index: &Multicurves, distances: impl Fn(usize, &[u32], &mut Vec<(f32, u32)>) + Sync) -> Self {
        let n = index.len();
        let ranks: Vec<Vec<u32>> = (0..index.curve_count())
            .into_par_iter()
            .map(|c| {
                let mut rank = vec![0u32; n];
                for (r, &p) in index.curve(c).1.iter().enumerate() {
                    rank[p as usize] = r as u32;
                }
                rank
            })
            .collect();
        let Ok(graph) = Self::build_by(n, |offer| {
            Ok::<_, std::convert::Infallible>(match offer {
                Offer::Curves => nearest_of(n, &distances, |i, candidates| {
                    for (c, rank) in ranks.iter().enumerate() {
                        let r = rank[i] as usize;
                        let window = r.saturating_sub(WINDOW)..(r + WINDOW + 1).min(n);
                        candidates.extend(index.curve(c).1[window].iter().copied());
                    }
                }),
                Offer::Neighbours { nearest, reverse } => nearest_of(n, &distances, |i, candidates| {
                    let near = listed(&nearest[i * DEGREE..][..DEGREE]).chain(listed(&reverse[i * DEGREE..][..DEGREE]));
                    for j in near {
                        candidates.push(j);
                        candidates.extend(listed(&nearest[j as usize * DEGREE..][..DEGREE]));
                    }
                }),
            })
        });
        graph
    }

    /// The graph of `n` rows from `nearest_of(offer)`, which returns every row's [`DEGREE`]
    /// nearest (`DEGREE` slots a row, nearest first, [`NONE`] after the last; repeats and the row
    /// itself dropped, ties by row) among the candidates `offer` names: first the curves' windows,
    /// then each round's neighbours' neighbours. The cores ([`NeighbourGraph::build`]) and the GPU
    /// (src/backend/gpu/approx.rs) each measure the candidates their way; the rounds and the
    /// reverse edges are the same.
    pub fn build_by<E>(n: usize, mut nearest_of: impl FnMut(Offer) -> Result<Vec<u32>, E>) -> Result<Self, E> {
        let mut nearest = nearest_of(Offer::Curves)?;
        for _ in 0..ROUNDS {
            let reverse = reverse_edges(&nearest, n);
            nearest = nearest_of(Offer::Neighbours { nearest: &nearest, reverse: &reverse })?;
        }
        let reverse = reverse_edges(&nearest, n);
        let mut edges = huge_filled(n * WIDTH, NONE);
        edges.par_chunks_mut(WIDTH).enumerate().for_each(|(i, out)| {
            let own = &nearest[i * DEGREE..][..DEGREE];
            let mut slots = out.iter_mut();
            for (slot, j) in slots.by_ref().zip(listed(own)) {
                *slot = j;
            }
            let added = listed(&reverse[i * DEGREE..][..DEGREE]).filter(|j| !own.contains(j));
            for (slot, j) in slots.zip(added) {
                *slot = j;
            }
        });
        Ok(Self { edges })
    }

    /// The searched graph from every row's own edges (`out`: [`OUT_DEGREE`] slots a row, chosen by
    /// [`diverse`] from a search of the kNN graph for the row, [`NONE`] after the last) and the
    /// edges into it (the rows whose own edges name it): where the two together fit in [`WIDTH`]
    /// slots, all of them, own first; elsewhere the diverse [`WIDTH`] of them by `distance(i, j)`
    /// (symmetric, the measure the lists were chosen by). Every own edge gets a way back unless
    /// its target has more diverse edges nearer: the search can leave a row the way it came,
    /// which a directed kNN graph's one-sided relations do not allow (NSG's and Vamana's last
    /// step).
    pub fn with_edges_into(out: &[u32], n: usize, distance: impl Fn(u32, u32) -> f32 + Sync) -> Self {
        // The rows naming each row, in row order (so the graph does not depend on the threads).
        let mut starts = vec![0u32; n + 1];
        for &j in out.iter().filter(|&&j| j != NONE) {
            starts[j as usize + 1] += 1;
        }
        for i in 0..n {
            starts[i + 1] += starts[i];
        }
        let mut into = vec![NONE; starts[n] as usize];
        let mut filled = starts.clone();
        for (i, list) in out.chunks_exact(OUT_DEGREE).enumerate() {
            for j in listed(list) {
                into[filled[j as usize] as usize] = i as u32;
                filled[j as usize] += 1;
            }
        }
        let mut edges = huge_filled(n * WIDTH, NONE);
        edges.par_chunks_mut(WIDTH).enumerate().with_min_len(256).for_each_init(Vec::new, |scored, (i, slots)| {
            let own = &out[i * OUT_DEGREE..][..OUT_DEGREE];
            let named_by = &into[starts[i] as usize..starts[i + 1] as usize];
            let added = named_by.iter().copied().filter(|j| !own.contains(j));
            if listed(own).count() + added.clone().count() <= WIDTH {
                for (slot, j) in slots.iter_mut().zip(listed(own).chain(added)) {
                    *slot = j;
                }
                return;
            }
            scored.clear();
            scored.extend(listed(own).chain(added).map(|j| (distance(i as u32, j), j)));
            diverse(i as u32, scored, |a, b| distance(a, b), slots);
        });
        Self { edges }
    }

    /// Every row's edges, [`WIDTH`] slots a row, the unused ones `u32::MAX` at the end (the GPU's
    /// copy, and a stored index's).
    pub fn edges(&self) -> &[u32] {
        &self.edges
    }

    /// The graph of `n` rows with `edges` ([`NeighbourGraph::edges`]' layout), where every edge
    /// names a row below `n` or is empty.
    pub fn from_edges(edges: Vec<u32>, n: usize) -> Option<Self> {
        let sound = edges.len() == n * WIDTH && edges.iter().all(|&j| j == NONE || (j as usize) < n);
        sound.then(|| {
            let mut walked = huge_filled(edges.len(), NONE);
            walked.copy_from_slice(&edges);
            Self { edges: walked }
        })
    }

    /// Row `i`'s [`WIDTH`] slots of edges as stored (the unused ones [`NONE`] at the end): what
    /// a walk fetches ahead of following them.
    #[inline]
    pub fn slots(&self, i: usize) -> &[u32] {
        &self.edges[i * WIDTH..][..WIDTH]
    }

    /// Row `i`'s edges: its own (a kNN graph's: its nearest), then rows that list it.
    #[inline]
    pub fn neighbours(&self, i: usize) -> impl Iterator<Item = u32> + '_ {
        listed(&self.edges[i * WIDTH..][..WIDTH])
    }
}

/// Writes to `out` (its length the edges to keep, [`NONE`] after the last kept) a diverse choice
/// among row `p`'s `candidates` (their `distance` to it): nearest first, a candidate is kept unless
/// a row already kept is nearer to it, by the factor [`ALPHA`], than `p` is (the
/// relative-neighbourhood rule of Malkov and Yashunin's HNSW heuristic and Fu et al.'s NSG, with
/// the slack of Subramanya et al.'s Vamana, "DiskANN: Fast Accurate Billion-point Nearest Neighbor
/// Search on a Single Node"). A candidate so dropped is reached through the nearer kept row, so
/// the edge is spent on a direction the kept ones do not cover; the slack keeps some shortcuts,
/// which shorten the walk between clusters. Repeats and `p` itself are dropped; ties by row.
pub fn diverse(p: u32, candidates: &mut [(f32, u32)], distance: impl Fn(u32, u32) -> f32, out: &mut [u32]) {
    candidates.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    out.fill(NONE);
    let mut kept = 0;
    for (at, &(d, c)) in candidates.iter().enumerate() {
        if kept == out.len() {
            break;
        }
        if c == p || (at > 0 && candidates[at - 1].1 == c) {
            continue;
        }
        // Scores are squared distances: the factor applies squared.
        if out[..kept].iter().all(|&s| ALPHA * ALPHA * distance(s, c) > d) {
            out[kept] = c;
            kept += 1;
        }
    }
}

/// The rows of a list, up to its first empty slot.
#[inline]
fn listed(list: &[u32]) -> impl Iterator<Item = u32> + '_ {
    list.iter().copied().take_while(|&j| j != NONE)
}

/// Every row's [`DEGREE`] nearest (`DEGREE` slots a row) among the candidates `offer(i, out)`
/// appends for row `i`, on every core.
fn nearest_of(
    n: usize,
    distances: &(impl Fn(usize, &[u32], &mut Vec<(f32, u32)>) + Sync),
    offer: impl Fn(usize, &mut Vec<u32>) + Sync,
) -> Vec<u32> {
    let mut nearest = vec![NONE; n * DEGREE];
    nearest.par_chunks_mut(DEGREE).enumerate().with_min_len(256).for_each_init(
        Scratch::default,
        |scratch, (i, out)| {
            scratch.candidates.clear();
            offer(i, &mut scratch.candidates);
            keep_nearest(i, scratch, distances, out);
        },
    );
    nearest
}

/// A thread's working memory of the build.
#[derive(Default)]
struct Scratch {
    candidates: Vec<u32>,
    scored: Vec<(f32, u32)>,
}

/// Writes to `out` the [`DEGREE`] nearest of the candidates to row `i` (repeats and `i` itself
/// dropped; ties by row), nearest first, padded with [`NONE`].
fn keep_nearest(
    i: usize,
    scratch: &mut Scratch,
    distances: &impl Fn(usize, &[u32], &mut Vec<(f32, u32)>),
    out: &mut [u32],
) {
    let Scratch { candidates, scored } = scratch;
    candidates.sort_unstable();
    candidates.dedup();
    candidates.retain(|&j| j as usize != i);
    scored.clear();
    distances(i, candidates, scored);
    let by_distance = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if scored.len() > DEGREE {
        scored.select_nth_unstable_by(DEGREE - 1, by_distance);
        scored.truncate(DEGREE);
    }
    scored.sort_unstable_by(by_distance);
    out.fill(NONE);
    for (slot, &(_, j)) in out.iter_mut().zip(scored.iter()) {
        *slot = j;
    }
}

/// Up to [`DEGREE`] rows listing each row (those of the lowest rows, so the result does not depend
/// on the order the lists are read in), `DEGREE` slots a row, [`NONE`] after the last.
fn reverse_edges(nearest: &[u32], n: usize) -> Vec<u32> {
    let mut reverse = vec![NONE; n * DEGREE];
    let mut filled = vec![0u8; n];
    for (i, list) in nearest.chunks_exact(DEGREE).enumerate() {
        for j in listed(list) {
            let j = j as usize;
            if (filled[j] as usize) < DEGREE {
                reverse[j * DEGREE + filled[j] as usize] = i as u32;
                filled[j] += 1;
            }
        }
    }
    reverse
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{DEGREE, NONE, NeighbourGraph, OUT_DEGREE, WIDTH, diverse, listed};
    use crate::index::curves::Geometry;
    use crate::index::curves::Multicurves;
    use crate::vectors::Vectors;

    /// Points of 12 dimensions in 20 tight clusters: nearest neighbours are well defined.
    fn clustered(n: usize) -> Vectors {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let centres: Vec<f64> = (0..20 * 12).map(|_| rng.random::<f64>()).collect();
        let values = (0..n).flat_map(|i| (0..12).map(move |d| (i % 20, d))).map(|(c, d)| centres[c * 12 + d]);
        let noise: Vec<f64> = (0..n * 12).map(|_| 0.05 * rng.random::<f64>()).collect();
        Vectors::new(12, values.zip(noise).map(|(x, e)| x + e).collect())
    }

    fn squared(index: &Multicurves, i: usize, j: usize) -> f32 {
        index.values(i).iter().zip(index.values(j)).map(|(a, b)| (a - b) * (a - b)).sum()
    }

    fn build(index: &Multicurves) -> NeighbourGraph {
        NeighbourGraph::build(index, |i, rows, out| {
            out.extend(rows.iter().map(|&j| (squared(index, i, j as usize), j)))
        })
    }

    #[test]
    fn every_row_lists_distinct_other_rows_most_of_them_its_true_nearest() {
        let n = 4000;
        let index = Multicurves::build(&clustered(n), Geometry::Raw);
        let graph = build(&index);
        let mut found = 0;
        for i in 0..n {
            let mut edges: Vec<u32> = graph.neighbours(i).collect();
            assert!(edges.len() >= DEGREE && edges.len() <= WIDTH, "row {i}: {} edges", edges.len());
            assert!(!edges.contains(&(i as u32)), "row {i} lists itself");
            // Its own nearest come first, nearest first.
            let own = &edges[..DEGREE];
            assert!(own.windows(2).all(|w| squared(&index, i, w[0] as usize) <= squared(&index, i, w[1] as usize)));
            if i % 40 == 0 {
                let mut all: Vec<(f32, usize)> =
                    (0..n).filter(|&j| j != i).map(|j| (squared(&index, i, j), j)).collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                found += all[..DEGREE].iter().filter(|(_, j)| own.contains(&(*j as u32))).count();
            }
            edges.sort_unstable();
            edges.dedup();
            assert!(edges.len() >= DEGREE, "row {i}: repeated edges");
        }
        let recall = found as f64 / (n / 40 * DEGREE) as f64;
        assert!(recall >= 0.8, "the graph's recall of the true {DEGREE} nearest: {recall}");
    }

    #[test]
    fn a_diverse_choice_drops_the_candidates_behind_a_kept_one() {
        // Row 0 at 0 on a line; rows 1..=4 at 1, 2, 3 and -1 (squared distances).
        let at = [0.0f32, 1.0, 2.0, 3.0, -1.0];
        let distance = |a: u32, b: u32| (at[a as usize] - at[b as usize]).powi(2);
        let mut candidates: Vec<(f32, u32)> = [3, 1, 4, 2, 1, 0].iter().map(|&j| (distance(0, j), j)).collect();
        let mut out = [0u32; 4];
        diverse(0, &mut candidates, distance, &mut out);
        // 2 and 3 lie behind 1; -1 is the other way.
        assert_eq!(out, [1, 4, NONE, NONE]);
    }

    #[test]
    fn every_own_edge_has_a_way_back_unless_its_target_is_full() {
        let n = 3000;
        let index = Multicurves::build(&clustered(n), Geometry::Raw);
        let distance = |a: u32, b: u32| squared(&index, a as usize, b as usize);
        // Own edges: the OUT_DEGREE nearest of each row's kNN list and reverse edges, made diverse.
        let nearest = build(&index);
        let mut out = vec![NONE; n * OUT_DEGREE];
        for (i, edges) in out.chunks_exact_mut(OUT_DEGREE).enumerate() {
            let mut candidates: Vec<(f32, u32)> = nearest.neighbours(i).map(|j| (distance(i as u32, j), j)).collect();
            diverse(i as u32, &mut candidates, distance, edges);
        }
        let graph = NeighbourGraph::with_edges_into(&out, n, distance);
        let own = |j: usize| listed(&out[j * OUT_DEGREE..][..OUT_DEGREE]).collect::<Vec<u32>>();
        // Each row's own edges and the other rows naming it: all kept where they fit.
        let mut linked: Vec<std::collections::HashSet<u32>> = (0..n).map(|j| own(j).into_iter().collect()).collect();
        for i in 0..n {
            for j in own(i) {
                linked[j as usize].insert(i as u32);
            }
        }
        for i in 0..n {
            let mut edges: Vec<u32> = graph.neighbours(i).collect();
            assert!(!edges.is_empty() && edges.len() <= WIDTH && !edges.contains(&(i as u32)), "row {i}: {edges:?}");
            for j in own(i) {
                let back = graph.neighbours(j as usize).any(|e| e == i as u32);
                assert!(back || linked[j as usize].len() > WIDTH, "{i} → {j} has no way back");
            }
            if linked[i].len() <= WIDTH {
                assert_eq!(edges.len(), linked[i].len(), "row {i}: every edge kept where they fit");
            }
            edges.sort_unstable();
            edges.dedup();
            assert_eq!(edges.len(), graph.neighbours(i).count(), "row {i}: repeated edges");
        }
    }

    #[test]
    fn one_index_gives_one_graph() {
        let index = Multicurves::build(&clustered(3000), Geometry::Raw);
        assert_eq!(build(&index).edges, build(&index).edges);
    }

    #[test]
    fn a_base_smaller_than_a_row_of_edges_links_every_row_to_every_other() {
        let index = Multicurves::build(&clustered(9), Geometry::Raw);
        let graph = build(&index);
        for i in 0..9 {
            let mut edges: Vec<u32> = graph.neighbours(i).collect();
            edges.sort_unstable();
            assert_eq!(edges, (0..9).filter(|&j| j != i as u32).collect::<Vec<_>>());
        }
    }
}
