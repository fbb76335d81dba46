//! Bounded selection of the k smallest (distance, position) pairs, ties by position.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

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

/// The k smallest neighbours seen so far.
#[derive(Debug)]
pub struct KSmallest {
    k: usize,
    heap: BinaryHeap<Neighbour>,
}

impl KSmallest {
    /// An empty selection of at most `k` neighbours.
    pub fn new(k: usize) -> Self {
        Self { k, heap: BinaryHeap::with_capacity(k.min(1 << 16) + 1) }
    }

    /// Offers a neighbour.
    #[inline]
    pub fn push(&mut self, n: Neighbour) {
        if self.heap.len() < self.k {
            self.heap.push(n);
        } else if let Some(mut top) = self.heap.peek_mut()
            && n < *top
        {
            *top = n;
        }
    }

    /// The current k-th smallest distance, or +∞ while fewer than k were offered.
    #[inline]
    pub fn bound(&self) -> f64 {
        if self.heap.len() < self.k { f64::INFINITY } else { self.heap.peek().map_or(f64::INFINITY, |n| n.distance) }
    }

    /// The selection, nearest first.
    pub fn into_sorted(self) -> Vec<Neighbour> {
        self.heap.into_sorted_vec()
    }
}

/// Sends the neighbour lists of queries `first..` in query order, each ranked from 1 (the order
/// [`super::Backend::knn`] promises), in chunks of the sink's size.
pub(crate) fn send_ranked(sink: &dyn super::ResultSink, first: usize, lists: Vec<Vec<Neighbour>>) -> datafusion::common::Result<()> {
    let mut chunk = super::ResultChunk::default();
    for (q, list) in lists.into_iter().enumerate() {
        push_ranked(&mut chunk, first + q, list);
        if chunk.len() >= sink.chunk_rows() {
            sink.send(std::mem::take(&mut chunk))?;
        }
    }
    if chunk.is_empty() { Ok(()) } else { sink.send(chunk) }
}

/// Appends `query`'s neighbours, nearest first, to `chunk` with ranks from 1.
pub(crate) fn push_ranked(chunk: &mut super::ResultChunk, query: usize, list: Vec<Neighbour>) {
    for (rank, neighbour) in list.into_iter().enumerate() {
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
    use super::*;

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
}
