//! Joins, range queries, kNN and clusterings within groups of equal keys: `sim_join(a, b, 2,
//! 'metric=levenshtein, keys=zip')`, `knn(docs, questions, 5, 'keys=tenant')`, `dbscan(t, 0.1, 5,
//! 'keys=city')` (each group's clusters named by its first core row, a group's rows kept in scan
//! order by the stable counting sort below), and SQL's `JOIN …
//! ON a.zip = b.zip AND levenshtein(a.name, b.name) <= 2` (functions/rewrite.rs) — the blocking
//! rule of record linkage — or a kNN join ranked per query within a key (functions/knn_join.rs). Each input's vectors are put in key order (a counting sort
//! by group), so that a key's rows are consecutive; then each key's rows of the left input are
//! joined with that key's rows of the right by the backend, as one small join of its own, the
//! groups on the run's worker threads at once. A pair is found iff its keys are equal and its
//! distance within the bound: the groups partition the rows by key, and within a group the
//! backend's join is the exact one. Keys compare as SQL's `=` does (after casting the right
//! input's key to the left's type, as DataFusion coerces `a.k = b.k`): a NULL key matches nothing.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::compute::{cast, concat};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::{HashMap, Result, exec_err};
use rayon::iter::{IntoParallelIterator, ParallelIterator};
use rayon::slice::ParallelSlice;

use crate::backend::cpu::text::Pattern;
use crate::backend::{Backend, PairWriter, ResultSink, RunStats, ShiftedSink};
use crate::exec::run::{ConvertedSide, OddRows, compute, scalar_pair, send_candidates};
use crate::op::{Operation, PairOrder, SimilarityOp};
use crate::vectors::{Row, Vectors};

/// Where each key's rows lie in the inputs' vectors put in key order, and the group of each odd
/// row (rows compared by the scalar formula, `SimilarityOp::scalar_semantics`).
pub(super) struct KeyGroups {
    /// Group `g`'s vectors are positions `left[g]..left[g + 1]` of the left input.
    left: Vec<usize>,
    right: Vec<usize>,
    left_odd: Vec<usize>,
    right_odd: Vec<usize>,
}

impl KeyGroups {
    fn len(&self) -> usize {
        self.left.len() - 1
    }

    fn left_range(&self, group: usize) -> Range<usize> {
        self.left[group]..self.left[group + 1]
    }

    fn right_range(&self, group: usize) -> Range<usize> {
        self.right[group]..self.right[group + 1]
    }

    fn ranges(&self, group: usize) -> (Range<usize>, Range<usize>) {
        (self.left_range(group), self.right_range(group))
    }
}

/// Puts both converted inputs (`right`: `None` for a self-join, whose one input is `left`) in key
/// order: their vectors permuted by group, the vectors and odd rows whose key is NULL or absent
/// from the other input dropped. `inputs` are the collected batches of the left input and of the
/// right.
pub(super) fn order_by_keys(
    op: &SimilarityOp,
    inputs: [(&SchemaRef, &[RecordBatch]); 2],
    left: &mut ConvertedSide,
    right: Option<&mut ConvertedSide>,
) -> Result<KeyGroups> {
    let function = op.function_name();
    let left_keys = key_columns(op, inputs[0], None)?;
    let converter = RowConverter::new(left_keys.iter().map(|k| SortField::new(k.data_type().clone())).collect())?;
    let left_rows = converter.convert_columns(&left_keys)?;
    let null = |keys: &[ArrayRef], i: usize| keys.iter().any(|k| k.is_null(i));
    // DataFusion's map (foldhash): SipHash and rehashing were a quarter of a 10⁶-key join.
    let mut ids = HashMap::with_capacity(left_rows.num_rows());
    let left_groups: Vec<Option<u32>> = (0..left_rows.num_rows())
        .map(|i| {
            let next = ids.len() as u32;
            (!null(&left_keys, i)).then(|| *ids.entry(left_rows.row(i)).or_insert(next))
        })
        .collect();
    let groups = ids.len();
    if groups > u32::MAX as usize - 1 {
        return exec_err!("{function}: option keys: more than 2^32 - 2 distinct keys");
    }
    let (left_order, left_odd) = put_in_order(left, &left_groups, groups);
    let (right_order, right_odd) = match right {
        None => {
            drop(ids);
            (left_order.clone(), left_odd.clone())
        }
        Some(right) => {
            let types: Vec<_> = left_keys.iter().map(|k| k.data_type().clone()).collect();
            let right_keys = key_columns(op, inputs[1], Some(&types))?;
            let right_rows = converter.convert_columns(&right_keys)?;
            let right_groups: Vec<Option<u32>> = (0..right_rows.num_rows())
                .map(|i| if null(&right_keys, i) { None } else { ids.get(&right_rows.row(i)).copied() })
                .collect();
            drop(ids);
            put_in_order(right, &right_groups, groups)
        }
    };
    Ok(KeyGroups { left: left_order, right: right_order, left_odd, right_odd })
}

/// The key columns of one input, all rows in one array each, cast to `types` where given (the
/// left input's key types, for the right input).
fn key_columns(
    op: &SimilarityOp,
    (schema, batches): (&SchemaRef, &[RecordBatch]),
    types: Option<&[datafusion::arrow::datatypes::DataType]>,
) -> Result<Vec<ArrayRef>> {
    let function = op.function_name();
    op.keys
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let Ok(index) = schema.index_of(name) else {
                return exec_err!("{function}: option keys: no column '{name}' in an input");
            };
            let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(index).as_ref()).collect();
            let column = match parts.as_slice() {
                [] => datafusion::arrow::array::new_empty_array(schema.field(index).data_type()),
                parts => concat(parts)?,
            };
            match types {
                Some(types) if column.data_type() != &types[k] => Ok(cast(&column, &types[k])?),
                _ => Ok(column),
            }
        })
        .collect()
}

/// `side`'s vectors permuted into group order (a counting sort; `groups_of[row]` is an input
/// row's group) and its odd rows without a group dropped: where each group starts, and the group
/// of each odd row kept.
fn put_in_order(side: &mut ConvertedSide, groups_of: &[Option<u32>], groups: usize) -> (Vec<usize>, Vec<usize>) {
    let (data, _, odd) = side;
    let vectors = &data.vectors;
    let mut starts = vec![0usize; groups + 1];
    for &row in &vectors.rows {
        if let Some(g) = groups_of[row as usize] {
            starts[g as usize + 1] += 1;
        }
    }
    for g in 0..groups {
        starts[g + 1] += starts[g];
    }
    let mut next = starts.clone();
    let mut positions = vec![0u32; starts[groups]];
    for (position, &row) in vectors.rows.iter().enumerate() {
        if let Some(g) = groups_of[row as usize] {
            positions[next[g as usize]] = position as u32;
            next[g as usize] += 1;
        }
    }
    data.vectors = Arc::new(vectors.select(&positions));
    let kept: OddRows = std::mem::take(odd).into_iter().filter(|(row, _)| groups_of[*row as usize].is_some()).collect();
    let odd_groups = kept.iter().map(|(row, _)| groups_of[*row as usize].unwrap_or_default() as usize).collect();
    *odd = kept;
    (starts, odd_groups)
}

/// The backend's run (join, range query or kNN) of each group's left rows with its right rows
/// (`same`: a self-join within each group), the results at the inputs' positions; the groups at once on the run's worker
/// threads where the backend runs on the cores, one after another on a GPU.
///
/// A group of at most [`DIRECT_PAIRS`] pairs is compared pair by pair instead, by the same exact
/// test, many such groups to a task: the backend's costs per call (its cost model, index and
/// threads) are fixed, and under one key per row (`ON a.id = b.id AND …`, 10⁶ groups of one row)
/// they made the join 5.0 s against DataFusion's 0.19 s hash join on 2 cores.
pub(super) fn compute_by_keys(
    op: &SimilarityOp,
    backend: &dyn Backend,
    (left, right): (&Vectors, &Vectors),
    same: bool,
    groups: &KeyGroups,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let (include_self, ordered) = match op.operation {
        Operation::SimJoin { include_self, pairs, .. } => (include_self, pairs == PairOrder::Ordered),
        _ => (false, false),
    };
    let pairs = |g: usize| groups.left_range(g).len() * groups.right_range(g).len();
    // kNN's lists and a clustering's labels come from the backend alone.
    let direct_pairs = match op.operation {
        Operation::SimJoin { .. } | Operation::RangeQuery { .. } => DIRECT_PAIRS,
        Operation::Knn { .. } | Operation::Clusters { .. } => 0,
    };
    let (direct, indexed): (Vec<usize>, Vec<usize>) =
        (0..groups.len()).filter(|&g| pairs(g) > 0).partition(|&g| pairs(g) <= direct_pairs);
    let run = |group: usize| -> Result<RunStats> {
        let (l, r) = (groups.left_range(group), groups.right_range(group));
        let left_part = left.slice(l.clone());
        let right_part = (!same).then(|| right.slice(r.clone()));
        let shifted = ShiftedSink { inner: sink, left: l.start as u32, right: r.start as u32 };
        compute(op, backend, &left_part, right_part.as_ref().unwrap_or(&left_part), same, &shifted)
    };
    let compare = |chunk: &[usize]| -> Result<RunStats> {
        let mut stats = RunStats::default();
        let mut writer = PairWriter::new(sink, same && ordered);
        let self_join = same.then_some(include_self);
        for &group in chunk {
            stats.candidates += compare_pairs(op, (left, right), self_join, groups.ranges(group), &mut writer)?;
        }
        writer.flush()?;
        Ok(stats)
    };
    let runs: Vec<RunStats> = if backend.searches_parts_on_cpu() {
        let direct = direct.par_chunks(1024).map(compare);
        direct.chain(indexed.into_par_iter().map(run)).collect::<Result<_>>()?
    } else {
        let direct = direct.par_chunks(1024).map(compare).collect::<Result<Vec<_>>>()?;
        direct.into_iter().map(Ok).chain(indexed.into_iter().map(run)).collect::<Result<_>>()?
    };
    let mut stats = RunStats::default();
    runs.iter().for_each(|run| stats.add(run));
    Ok(stats)
}

/// The most pairs of a group compared pair by pair (see [`compute_by_keys`]).
const DIRECT_PAIRS: usize = 1024;

/// Every pair of one group (left positions `l`, right positions `r`) by the exact test: the f64
/// formula of the metric, or the edit distance. A self-join (`self_join`: whether a row pairs
/// with itself) compares each pair once, the writer mirroring it where pairs are ordered. Returns
/// the pairs compared.
fn compare_pairs(
    op: &SimilarityOp,
    (left, right): (&Vectors, &Vectors),
    self_join: Option<bool>,
    (l, r): (Range<usize>, Range<usize>),
    writer: &mut PairWriter,
) -> Result<u64> {
    let Some(threshold) = op.threshold() else { return Ok(0) };
    let mut compared = 0;
    for i in l {
        let r = match self_join {
            Some(true) => i..r.end,
            Some(false) => i + 1..r.end,
            None => r.clone(),
        };
        compared += r.len() as u64;
        if op.metric.is_text() {
            // Whole edits: within `threshold` is within its floor.
            let pattern = Pattern::new(left.string(i));
            for j in r {
                if let Some(d) = pattern.distance_within(right.string(j), threshold as u32) {
                    writer.push(i as u32, j as u32, d as f64)?;
                }
            }
        } else {
            for j in r {
                let distance = op.metric.row_distance(left.row(i), right.row(j));
                if distance <= threshold {
                    writer.push(i as u32, j as u32, distance)?;
                }
            }
        }
    }
    Ok(compared)
}

/// [`crate::exec::run::scalar_pairs`] within groups: each odd row of one side against the rows of
/// its group on the other side (vectors, then odd rows), numbered as there.
pub(super) fn scalar_pairs_by_keys(
    op: &SimilarityOp,
    threshold: f64,
    [(left, left_odd), (right, right_odd)]: [(&Vectors, &OddRows); 2],
    groups: &KeyGroups,
    sink: &dyn ResultSink,
) -> Result<()> {
    let mut writer = PairWriter::new(sink, false);
    let mut pair =
        |a: Row, b: Row, pa: usize, pb: usize| scalar_pair(op.metric, threshold, &mut writer, (a, b), (pa, pb));
    for (i, (_, a)) in left_odd.iter().enumerate() {
        let group = groups.left_odd[i];
        for j in groups.right_range(group) {
            pair(Row::F64(a), right.row(j), left.len() + i, j)?;
        }
        for (j, (_, b)) in right_odd.iter().enumerate().filter(|(j, _)| groups.right_odd[*j] == group) {
            pair(Row::F64(a), Row::F64(b), left.len() + i, right.len() + j)?;
        }
    }
    for (j, (_, b)) in right_odd.iter().enumerate() {
        for i in groups.left_range(groups.right_odd[j]) {
            pair(left.row(i), Row::F64(b), i, right.len() + j)?;
        }
    }
    writer.flush()
}

/// [`crate::exec::run::odd_candidates`] within groups: each query with the skipped base rows of its
/// group, and each skipped query with every base row of its group; the skipped base rows are
/// numbered from `base` on, as the output numbers them.
pub(super) fn odd_candidates_by_keys(
    queries: usize,
    base: usize,
    groups: &KeyGroups,
    sink: &dyn ResultSink,
) -> Result<()> {
    let mut skipped_in: Vec<Vec<u32>> = vec![Vec::new(); groups.len()];
    for (j, &group) in groups.right_odd.iter().enumerate() {
        skipped_in[group].push((base + j) as u32);
    }
    let skipped_in = &skipped_in;
    let normal = (0..groups.len())
        .flat_map(|g| groups.left_range(g).flat_map(move |q| skipped_in[g].iter().map(move |&b| (q as u32, b))));
    let odd = groups.left_odd.iter().enumerate().flat_map(|(i, &g)| {
        let base_rows = groups.right_range(g).map(|b| b as u32).chain(skipped_in[g].iter().copied());
        base_rows.map(move |b| ((queries + i) as u32, b))
    });
    send_candidates(normal.chain(odd), sink)
}
