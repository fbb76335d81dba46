//! kNN lists that keep the rows tied with their k nearest ([`KnnTies`]), by any backend's kNN: a
//! list of more than k rows is asked for, and a query whose longer list still ends in a tie is
//! asked again with a list four times as long, until each list ends past its tie or holds the
//! whole base.
//!
//! Why a longer list decides: a backend's list of `m` rows is the `m` smallest distances of the
//! query, in order (ties by base row). Let `d_k` be its k-th distance. Every base row nearer than
//! the list's last distance is in the list; so when the last distance exceeds `d_k`, every row at
//! `d_k` or nearer is in it ([`KnnTies::Kth`]), and when the list holds more than `k` distinct
//! distances, every row at one of the `k` smallest is ([`KnnTies::Distinct`]). A list shorter than
//! asked for, or asked for as many rows as the base has, holds every row the kNN can return. The
//! first request asks for k + 1 rows, which settles every query whose (k + 1)-th distance is not
//! its k-th — all of them, where distances rarely tie.

use std::sync::Mutex;

use datafusion::common::Result;

use crate::backend::plan::topk::Collector;
use crate::backend::{Backend, KnnRequest, ResultChunk, ResultSink, RunStats};
use crate::op::KnnTies;

/// How much longer each further request's lists are.
const GROWTH: usize = 4;

/// Runs `request` on `backend` with each query's list widened to its ties, as `ties` says, and
/// sends the lists to `sink` (ranks 1, 2, … in the order of distance, then base row).
pub(crate) fn knn_with_ties(
    backend: &dyn Backend,
    request: &KnnRequest,
    ties: KnnTies,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let (k, base_rows) = (request.k, request.base.len());
    if ties == KnnTies::None || base_rows <= k {
        return backend.knn(request, sink);
    }
    let mut stats = RunStats::default();
    // The queries not yet settled (positions in `request.queries`), and the list length asked for.
    let mut pending: Option<Vec<u32>> = None;
    let mut asked = k + 1;
    loop {
        asked = asked.min(base_rows);
        let selected = pending.as_ref().map(|positions| request.queries.select(positions));
        let queries = selected.as_ref().unwrap_or(request.queries);
        let collector = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: sink.chunk_rows() };
        stats.add(&backend.knn(&KnnRequest { queries, k: asked, ..*request }, &collector)?);
        let mut lists: Vec<Vec<(u32, f64, u32)>> = vec![Vec::new(); queries.len()];
        for chunk in collector.chunks.into_inner().unwrap_or_else(|e| e.into_inner()) {
            for i in 0..chunk.len() {
                lists[chunk.left[i] as usize].push((chunk.rank[i], chunk.distance[i], chunk.right[i]));
            }
        }
        let whole_base = asked >= base_rows;
        let mut out = ResultChunk::with_capacity(sink.chunk_rows());
        let mut unsettled = Vec::new();
        for (at, mut list) in lists.into_iter().enumerate() {
            let query = pending.as_ref().map_or(at as u32, |positions| positions[at]);
            list.sort_unstable_by_key(|&(rank, ..)| rank);
            let Some(keep) = kept_rows(&list, k, ties, whole_base || list.len() < asked) else {
                unsettled.push(query);
                continue;
            };
            for (rank, &(_, distance, base)) in list[..keep].iter().enumerate() {
                out.left.push(query);
                out.right.push(base);
                out.distance.push(distance);
                out.rank.push(rank as u32 + 1);
                if out.len() >= sink.chunk_rows() {
                    sink.send(std::mem::replace(&mut out, ResultChunk::with_capacity(sink.chunk_rows())))?;
                }
            }
        }
        if !out.is_empty() {
            sink.send(out)?;
        }
        if unsettled.is_empty() || whole_base {
            return Ok(stats);
        }
        pending = Some(unsettled);
        asked = asked.saturating_mul(GROWTH);
    }
}

/// How many of a ranked list's first rows the query keeps, or `None` when the list may end
/// before its ties do (`complete`: the list holds every row the kNN can return).
fn kept_rows(list: &[(u32, f64, u32)], k: usize, ties: KnnTies, complete: bool) -> Option<usize> {
    let distance = |i: usize| list[i].1;
    // The last distance kept: the k-th (or, for distinct distances, the k-th distinct one).
    let last = match ties {
        KnnTies::None => return Some(list.len().min(k)),
        KnnTies::Kth => (list.len() >= k).then(|| distance(k - 1)),
        KnnTies::Distinct => {
            let mut distinct = 0;
            (0..list.len())
                .find(|&i| {
                    distinct += usize::from(i == 0 || distance(i) != distance(i - 1));
                    distinct == k
                })
                .map(distance)
        }
    };
    let Some(last) = last else {
        // Fewer rows (or distinct distances) than k: complete lists keep them all.
        return complete.then_some(list.len());
    };
    let keep = list.iter().take_while(|&&(_, d, _)| d <= last).count();
    (keep < list.len() || complete).then_some(keep)
}

#[cfg(test)]
mod tests {
    use super::kept_rows;
    use crate::op::KnnTies;

    fn list(distances: &[f64]) -> Vec<(u32, f64, u32)> {
        distances.iter().enumerate().map(|(i, &d)| (i as u32 + 1, d, i as u32)).collect()
    }

    #[test]
    fn a_list_settles_once_it_ends_past_its_ties() {
        // k = 2: the 2nd distance is 1.0; a 3rd row at 2.0 ends the ties.
        assert_eq!(kept_rows(&list(&[0.5, 1.0, 2.0]), 2, KnnTies::Kth, false), Some(2));
        // Tied to the end of the list: unknown unless the list holds the whole base.
        assert_eq!(kept_rows(&list(&[0.5, 1.0, 1.0]), 2, KnnTies::Kth, false), None);
        assert_eq!(kept_rows(&list(&[0.5, 1.0, 1.0]), 2, KnnTies::Kth, true), Some(3));
        assert_eq!(kept_rows(&list(&[1.0, 1.0, 1.0, 3.0]), 2, KnnTies::Kth, false), Some(3));
        // Distinct distances: the 2 smallest values are 1.0 and 2.0, every row at them.
        assert_eq!(kept_rows(&list(&[1.0, 1.0, 2.0, 2.0, 3.0]), 2, KnnTies::Distinct, false), Some(4));
        assert_eq!(kept_rows(&list(&[1.0, 1.0, 2.0, 2.0]), 2, KnnTies::Distinct, false), None);
        assert_eq!(kept_rows(&list(&[1.0, 1.0, 1.0]), 2, KnnTies::Distinct, true), Some(3));
        assert_eq!(kept_rows(&list(&[1.0, 1.0, 1.0]), 2, KnnTies::Distinct, false), None);
        // A short list (fewer base rows than asked for) keeps what it has.
        assert_eq!(kept_rows(&list(&[1.0]), 2, KnnTies::Kth, true), Some(1));
        assert_eq!(kept_rows(&list(&[0.5, 1.0, 2.0]), 2, KnnTies::None, false), Some(2));
    }
}
