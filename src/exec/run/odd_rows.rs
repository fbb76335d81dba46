//! SQL's semantics for the rows the operator's contract skips (NaN, NULL, a wrong length) in a
//! join planned from SQL (`SimilarityOp::scalar_semantics`): they are compared by the scalar
//! formula, as the distance functions compare them.

use std::sync::Arc;

use datafusion::common::{Result, exec_err};

use crate::backend::{ResultChunk, ResultSink};
use crate::op::Metric;
use crate::results::SideData;
use crate::vectors::{Row, Vectors};

/// Rows skipped by the conversion but compared under `SimilarityOp::scalar_semantics`: (input
/// row, values).
pub(in crate::exec) type OddRows = Vec<(u32, Vec<f64>)>;

/// `side` as the output numbers it when its odd rows are paired too: a position past its vectors
/// is an odd row (in `odd`'s order), as [`scalar_pairs`] numbers them.
pub(in crate::exec) fn numbered_with_odd_rows(side: &SideData, odd: &OddRows) -> SideData {
    let mut numbered = side.clone();
    if !odd.is_empty() {
        let rows = side.vectors.rows.iter().copied().chain(odd.iter().map(|(row, _)| *row)).collect();
        numbered.vectors = Arc::new(Vectors::numbering(rows));
    }
    numbered
}

/// The pairs of a join planned from SQL (`SimilarityOp::scalar_semantics`) that involve a row the
/// operator's contract skips: each side's `odd` rows against every row of the other side, by the
/// scalar formula (the distance functions' own), kept when SQL's `<=` keeps the value, which
/// orders floats totally (a NaN with its sign bit set precedes every number). An odd row's
/// position is its side's vector count plus its index among the odd rows.
pub(in crate::exec) fn scalar_pairs(
    metric: Metric,
    threshold: f64,
    [(left, left_odd), (right, right_odd)]: [(&Vectors, &OddRows); 2],
    sink: &dyn ResultSink,
) -> Result<()> {
    let mut writer = crate::backend::PairWriter::new(sink, false);
    let mut pair = |a: Row, b: Row, pa: usize, pb: usize| scalar_pair(metric, threshold, &mut writer, (a, b), (pa, pb));
    let right_rows = (0..right.len()).map(|j| (right.row(j), j));
    let right_all: Vec<(Row, usize)> =
        right_rows.chain(right_odd.iter().enumerate().map(|(j, (_, b))| (Row::F64(b), right.len() + j))).collect();
    for (i, (_, a)) in left_odd.iter().enumerate() {
        for &(b, pb) in &right_all {
            pair(Row::F64(a), b, left.len() + i, pb)?;
        }
    }
    for i in 0..left.len() {
        for (j, (_, b)) in right_odd.iter().enumerate() {
            pair(left.row(i), Row::F64(b), i, right.len() + j)?;
        }
    }
    writer.flush()
}

/// One pair of [`scalar_pairs`]: rows `a` and `b` at output positions `pa` and `pb`, written when
/// SQL's `<=` keeps their distance.
pub(in crate::exec) fn scalar_pair(
    metric: Metric,
    threshold: f64,
    writer: &mut crate::backend::PairWriter,
    (a, b): (Row, Row),
    (pa, pb): (usize, usize),
) -> Result<()> {
    if a.len() != b.len() {
        return exec_err!("sim_join: dimension mismatch: {}-dimensional and {}-dimensional vectors", a.len(), b.len());
    }
    let distance = metric.row_distance(a, b);
    if distance.total_cmp(&threshold).is_le() { writer.push(pa as u32, pb as u32, distance) } else { Ok(()) }
}

/// A rewritten kNN's candidates beyond its lists, each with a NaN distance and rank 0 (the sort or
/// window above computes their distances itself, functions/rewrite.rs and knn_join.rs): each of
/// the `queries` queries with the skipped base rows at positions `skipped`, and each skipped query
/// (positions `queries..queries + odd_queries`, as [`numbered_with_odd_rows`] numbers them) with
/// every one of the `base` base positions — their distances are NULL or NaN, which SQL still orders.
pub(in crate::exec) fn odd_candidates(
    (queries, odd_queries): (usize, usize),
    skipped: impl Iterator<Item = u32> + Clone,
    base: usize,
    sink: &dyn ResultSink,
) -> Result<()> {
    let normal = (0..queries as u32).flat_map(|q| skipped.clone().map(move |b| (q, b)));
    let odd = (queries as u32..(queries + odd_queries) as u32).flat_map(|q| (0..base as u32).map(move |b| (q, b)));
    send_candidates(normal.chain(odd), sink)
}

/// Sends the (query, base) position pairs `candidates` as result rows with a NaN distance and
/// rank 0, in chunks of the sink's size.
pub(in crate::exec) fn send_candidates(
    candidates: impl Iterator<Item = (u32, u32)>,
    sink: &dyn ResultSink,
) -> Result<()> {
    let mut chunk = ResultChunk::default();
    for (q, position) in candidates {
        chunk.left.push(q);
        chunk.right.push(position);
        chunk.distance.push(f64::NAN);
        chunk.rank.push(0);
        if chunk.len() >= sink.chunk_rows() {
            sink.send(std::mem::take(&mut chunk))?;
        }
    }
    if chunk.is_empty() { Ok(()) } else { sink.send(chunk) }
}
