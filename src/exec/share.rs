//! One task's share of a run on a cluster (`SimilarityExec` planned with tasks, see
//! `cluster`). Task `p` of `n` reads one input whole and takes the `p`-th of `n` contiguous
//! shares of the other, in scan order — the `p`-th group of that input's partitions, so the task
//! decodes only those, or, when the input has fewer partitions than tasks, the `p`-th range of
//! its rows:
//!
//! - kNN and range queries divide the base and read every query: a range query's pairs stand
//!   alone; kNN finds each query's top k within the share, and `KnnMergeExec` merges the tasks'
//!   lists per query by (distance, share, position in the share) — the base's scan order, since
//!   the shares are contiguous and in order — which is the one process's answer, ties included;
//! - a two-input join divides its left input and reads the right whole; each pair stands alone;
//! - a self-join reads its input whole (each task needs every row as a right side) and takes the
//!   `p`-th range of its rows as the left side of a two-input join, keeping a pair by the rows'
//!   positions in the whole input: `include_self=false` drops the row's pair with itself;
//!   `pairs=unordered` keeps (a, b) only when a precedes b. Every ordered pair (a, b) is found by
//!   the one task whose share holds a, so nothing is lost or repeated.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use super::InputSide;
use crate::backend::ResultChunk;
use crate::op::{Operation, PairOrder, SimilarityOp};

/// Which share of the left rows a task answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// This task's share, `0..count`.
    pub index: usize,
    /// The shares the work is divided into.
    pub count: usize,
}

impl Share {
    /// The left rows of this share among `rows`: the `index`-th of `count` near-equal ranges.
    pub fn range(&self, rows: usize) -> (usize, usize) {
        let at = |i: usize| ((rows as u128 * i as u128) / self.count as u128) as usize;
        (at(self.index), at(self.index + 1))
    }
}

/// Rows `[start, end)` of `batches` taken in order, as slices (no copy).
fn slice_rows(batches: &[RecordBatch], start: usize, end: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut offset = 0;
    for batch in batches {
        let (from, to) = (start.max(offset), end.min(offset + batch.num_rows()));
        if from < to {
            out.push(batch.slice(from - offset, to - from));
        }
        offset += batch.num_rows();
    }
    out
}

/// The input a task takes a share of: a self-join's one input, a two-input join's left input,
/// the base of kNN and range queries.
pub(super) fn divided_child(op: &SimilarityOp, left: &InputSide, right: &InputSide) -> usize {
    match op.operation {
        Operation::SimJoin { .. } | Operation::Clusters { .. } => left.child,
        Operation::RangeQuery { .. } | Operation::Knn { .. } => right.child,
    }
}

/// The partitions of the divided input (of `partitions`) that `share` reads, when it is a
/// two-input run and there are enough partitions to give every share some; `None`: every task
/// reads the input whole and takes its rows by [`take_share`].
pub(super) fn share_partitions(
    left: &InputSide,
    right: &InputSide,
    partitions: usize,
    share: Share,
) -> Option<std::ops::Range<usize>> {
    (left.child != right.child && partitions >= share.count).then(|| {
        let (start, end) = share.range(partitions);
        start..end
    })
}

/// Restricts the collected inputs to `share` of the divided input, unless its partitions were
/// already restricted (`by_partitions`). A self-join's left side becomes an input of its own (the
/// slice), its right side stays the whole input; the returned filter keeps the self-join's pairs
/// from the two-input run.
pub(super) fn take_share(
    op: &SimilarityOp,
    collected: &mut Vec<(SchemaRef, Vec<RecordBatch>)>,
    left: &mut InputSide,
    right: &InputSide,
    share: Share,
    by_partitions: bool,
) -> Option<SelfJoinPairs> {
    if by_partitions {
        return None;
    }
    let divided = divided_child(op, left, right);
    let (schema, batches) = &collected[divided];
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let (start, end) = share.range(rows);
    let sliced = (schema.clone(), slice_rows(batches, start, end));
    if left.child != right.child {
        collected[divided] = sliced;
        return None;
    }
    collected.push(sliced);
    left.child = collected.len() - 1;
    let Operation::SimJoin { include_self, pairs, .. } = op.operation else {
        return None;
    };
    Some(SelfJoinPairs { offset: start as u64, include_self, ordered: pairs == PairOrder::Ordered })
}

/// Which pairs of a share's two-input run belong to the self-join.
#[derive(Debug, Clone, Copy)]
pub(super) struct SelfJoinPairs {
    /// The share's first left row in the whole input.
    offset: u64,
    include_self: bool,
    ordered: bool,
}

impl SelfJoinPairs {
    /// Whether the pair of left row `a` of the share and row `b` of the whole input is reported.
    fn keeps(&self, a: u32, b: u32) -> bool {
        let (a, b) = (self.offset + a as u64, b as u64);
        match (self.ordered, a.cmp(&b)) {
            (_, std::cmp::Ordering::Equal) => self.include_self,
            (true, _) => true,
            (false, order) => order.is_lt(),
        }
    }
}

/// The map of a sink (`backend::MapSink`) passing on only the self-join's pairs of a share's
/// run; positions are vector positions, mapped to input rows by each side's `rows`.
pub(super) fn self_join_pairs_only<'a>(
    pairs: SelfJoinPairs,
    left_rows: &'a [u32],
    right_rows: &'a [u32],
) -> impl Fn(ResultChunk) -> Option<ResultChunk> + Sync + 'a {
    move |chunk| {
        let mut kept = ResultChunk::default();
        for i in 0..chunk.len() {
            let (a, b) = (chunk.left[i], chunk.right[i]);
            if pairs.keeps(left_rows[a as usize], right_rows[b as usize]) {
                kept.left.push(a);
                kept.right.push(b);
                kept.distance.push(chunk.distance[i]);
            }
        }
        (!kept.is_empty()).then_some(kept)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::RecordBatch;

    use super::{SelfJoinPairs, Share, slice_rows};

    #[test]
    fn shares_cover_every_row_once() {
        for rows in [0, 1, 7, 100] {
            for count in [1, 2, 3, 16] {
                let mut next = 0;
                for index in 0..count {
                    let (start, end) = Share { index, count }.range(rows);
                    assert_eq!(start, next);
                    next = end;
                }
                assert_eq!(next, rows);
            }
        }
    }

    #[test]
    fn self_join_pairs_follow_the_options() {
        let pairs = |include_self, ordered| SelfJoinPairs { offset: 10, include_self, ordered };
        // Left row 0 of the share is row 10 of the input.
        assert!(!pairs(false, true).keeps(0, 10));
        assert!(pairs(true, true).keeps(0, 10));
        assert!(pairs(false, true).keeps(0, 3));
        assert!(!pairs(false, false).keeps(0, 3));
        assert!(pairs(false, false).keeps(0, 11));
        assert!(pairs(true, false).keeps(0, 10));
    }

    #[test]
    fn slices_span_batches() {
        use datafusion::arrow::array::Int32Array;
        use std::sync::Arc;
        let batch = |v: Vec<i32>| RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(v)) as _)]).unwrap();
        let batches = [batch(vec![0, 1, 2]), batch(vec![3, 4]), batch(vec![5, 6, 7])];
        let sliced = slice_rows(&batches, 2, 6);
        let values: Vec<i32> = sliced
            .iter()
            .flat_map(|b| b.column(0).as_any().downcast_ref::<Int32Array>().unwrap().values().to_vec())
            .collect();
        assert_eq!(values, vec![2, 3, 4, 5]);
    }
}
