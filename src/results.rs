//! Result chunks → Arrow record batches: only the projected columns, taken from the inputs by row,
//! at most `batch_size` rows each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::{concat, interleave, take};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_err};

use crate::backend::{NOISE, ResultChunk, Wanted, widened};
use crate::vectors::Vectors;

/// One column of an operator whose output is a summary of its result rows (exec/summary.rs):
/// what DataFusion's `count`, `min` and `max` of the distance would give over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SummaryColumn {
    /// How many result rows (Int64).
    Count,
    /// The smallest distance (Float64, NULL without rows).
    MinDistance,
    /// The largest distance (Float64, NULL without rows).
    MaxDistance,
}

/// The result rows' count and distance range, gathered chunk by chunk (`range` in IEEE 754's
/// total order, as Arrow's `min`/`max` order floats).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowSummary {
    pub rows: u64,
    pub range: Option<(f64, f64)>,
}

impl RowSummary {
    /// Takes in `other`'s rows.
    pub fn merge(&mut self, other: RowSummary) {
        self.rows += other.rows;
        if let Some((low, high)) = other.range {
            self.range = Some(widened(Some(widened(self.range, low)), high));
        }
    }

    /// The summary of one chunk: its listed rows and its counted ones.
    fn of_chunk(chunk: &ResultChunk, wanted: Wanted) -> Result<Self> {
        if chunk.counted > 0 && chunk.counted_range.is_none() && wanted == Wanted::CountAndRange {
            return internal_err!("{} result rows were counted without their distances", chunk.counted);
        }
        let range = chunk.distance.iter().fold(chunk.counted_range, |range, &d| Some(widened(range, d)));
        Ok(Self { rows: chunk.len() as u64 + chunk.counted, range })
    }

    /// The one row of `columns` in `schema`.
    pub fn batch(&self, columns: &[SummaryColumn], schema: &SchemaRef) -> Result<RecordBatch> {
        let arrays = columns
            .iter()
            .map(|c| -> ArrayRef {
                match c {
                    SummaryColumn::Count => Arc::new(Int64Array::from(vec![self.rows as i64])),
                    SummaryColumn::MinDistance => Arc::new(Float64Array::from(vec![self.range.map(|r| r.0)])),
                    SummaryColumn::MaxDistance => Arc::new(Float64Array::from(vec![self.range.map(|r| r.1)])),
                }
            })
            .collect();
        Ok(RecordBatch::try_new(schema.clone(), arrays)?)
    }
}

/// One output column and where its values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutputColumn {
    /// Column `i` of the left (join left / query) input batch.
    Left(usize),
    /// Column `i` of the right (join right / base) input batch.
    Right(usize),
    /// The exact distance (Float64).
    Distance,
    /// kNN rank, 1 = nearest (Int64).
    Rank,
    /// On a cluster, for the merge of kNN lists (`exec::KnnMergeExec`): the query's row in the
    /// query input (UInt32).
    QueryRow,
    /// On a cluster, for the merge of kNN lists: the base row's place in the base's scan order,
    /// its task's share in the high 32 bits and its row within the share in the low (UInt64).
    ScanOrder,
    /// `dbscan`: the row's cluster, the input row of its first core row in scan order (Int64; NULL
    /// for noise).
    Cluster,
    /// `dbscan`: whether the row is a core row (Boolean).
    Core,
}

/// One column of an input that the output takes rows from: one array, or the arrays of the
/// input's batches as they came (rows numbered across them), taken from with Arrow's `interleave`.
/// Concatenating the batches first copied the whole column to output a few of its rows: a kNN join
/// written in SQL projects the base's vector column (a 1M × 128 f32 base: 512 MB) for the window
/// above the operator (docs/design.md#results). A column of fixed-width primitives (ids: 8
/// bytes a row) is concatenated once the rows taken from it reach a quarter of its rows, and taken
/// from with Arrow's `take` after: finding each output row's batch and interleaving took a third
/// of a 5·10⁷-pair join's listing (docs/design.md#results), while a few rows (a small kNN over a large base) would
/// not repay the copy.
#[derive(Debug, Clone)]
pub enum InputColumn {
    Whole(ArrayRef),
    /// The batches' arrays, the input row each starts at, and the arrays joined into one once
    /// enough rows were taken (primitive columns only).
    Parts(Vec<ArrayRef>, Vec<usize>, Arc<JoinedParts>),
}

/// A primitive column's batches joined into one array, and the rows taken before it was.
#[derive(Debug, Default)]
pub struct JoinedParts {
    taken: AtomicUsize,
    array: OnceLock<ArrayRef>,
}

impl InputColumn {
    /// The column of `arrays`, one batch's each, in order (at least one).
    pub fn of(mut arrays: Vec<ArrayRef>) -> InputColumn {
        if arrays.len() == 1 {
            return InputColumn::Whole(arrays.remove(0));
        }
        let starts = arrays
            .iter()
            .scan(0, |row, a| {
                let start = *row;
                *row += a.len();
                Some(start)
            })
            .collect();
        InputColumn::Parts(arrays, starts, Arc::default())
    }

    /// The rows `rows`, in that order.
    pub fn take(&self, rows: &UInt32Array) -> Result<ArrayRef> {
        match self {
            InputColumn::Whole(array) => Ok(take(array, rows, None)?),
            InputColumn::Parts(arrays, starts, joined) => {
                if let Some(array) = joined.array.get() {
                    return Ok(take(array, rows, None)?);
                }
                let total = starts.last().zip(arrays.last()).map_or(0, |(s, a)| s + a.len());
                // Batches are built on many threads at once: the one whose rows reach a quarter
                // joins the column; the others interleave until it has.
                let before = joined.taken.fetch_add(rows.len(), Ordering::Relaxed);
                if arrays[0].data_type().is_primitive() && before < total / 4 && before + rows.len() >= total / 4 {
                    let array = concat(&arrays.iter().map(|a| a.as_ref()).collect::<Vec<_>>())?;
                    return Ok(take(joined.array.get_or_init(|| array), rows, None)?);
                }
                let at: Vec<(usize, usize)> = (rows.values().iter())
                    .map(|&row| {
                        let part = starts.partition_point(|&s| s <= row as usize) - 1;
                        (part, row as usize - starts[part])
                    })
                    .collect();
                let arrays: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
                Ok(interleave(&arrays, &at)?)
            }
        }
    }

    /// All rows in one array.
    pub fn whole(&self) -> Result<ArrayRef> {
        match self {
            InputColumn::Whole(array) => Ok(array.clone()),
            InputColumn::Parts(arrays, ..) => Ok(concat(&arrays.iter().map(|a| a.as_ref()).collect::<Vec<_>>())?),
        }
    }

    /// Bytes its arrays take.
    pub fn memory_size(&self) -> usize {
        match self {
            InputColumn::Whole(array) => array.get_array_memory_size(),
            InputColumn::Parts(arrays, ..) => arrays.iter().map(|a| a.get_array_memory_size()).sum(),
        }
    }
}

/// One side of the output: the input's columns the output takes rows from and its vectors
/// (positions → rows).
#[derive(Debug, Clone)]
pub struct SideData {
    /// Column `i` of the input where the output projects it; else `None`.
    pub columns: Vec<Option<InputColumn>>,
    /// Rows of the input.
    pub num_rows: usize,
    /// The usable vectors of the input.
    pub vectors: Arc<Vectors>,
}

impl SideData {
    fn column(&self, i: usize) -> Result<&InputColumn> {
        match self.columns.get(i) {
            Some(Some(column)) => Ok(column),
            _ => internal_err!("output column {i} was not collected from its input"),
        }
    }
}

/// Builds output batches for a fixed projection.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    /// Schema of the batches built (the projected output schema).
    pub schema: SchemaRef,
    /// Source of each output column.
    pub columns: Vec<OutputColumn>,
    /// Largest number of rows per batch.
    pub batch_size: usize,
    /// On a cluster, the task's share of the divided input ([`OutputColumn::ScanOrder`]).
    pub share: u32,
    /// Where not empty, the output is a summary of the rows (`columns` is then empty): each
    /// chunk gives one row of these columns, which exec/summary.rs folds into one.
    pub summary: Vec<SummaryColumn>,
}

impl BatchBuilder {
    /// What the consumer of the run's results needs of them.
    pub fn wants(&self) -> Wanted {
        match self.summary.as_slice() {
            [] if self.columns.is_empty() => Wanted::Count,
            [] => Wanted::Rows,
            summary if summary.iter().all(|c| *c == SummaryColumn::Count) => Wanted::Count,
            _ => Wanted::CountAndRange,
        }
    }

    /// Turns a chunk into batches of at most `batch_size` rows: its listed rows, then its counted
    /// ones (which only a projection of no column may have) as batches of no column.
    pub fn build(&self, chunk: &ResultChunk, left: &SideData, right: &SideData) -> Result<Vec<RecordBatch>> {
        if !self.summary.is_empty() {
            let summary = RowSummary::of_chunk(chunk, self.wants())?;
            return Ok(if summary.rows == 0 { Vec::new() } else { vec![summary.batch(&self.summary, &self.schema)?] });
        }
        let size = self.batch_size.max(1);
        let counted = usize::try_from(chunk.counted).unwrap_or(usize::MAX);
        if counted > 0 && !self.columns.is_empty() {
            return internal_err!("{counted} result rows were counted for an output with columns");
        }
        let mut out = Vec::with_capacity(chunk.len().div_ceil(size) + counted.div_ceil(size));
        let mut start = 0;
        while start < chunk.len() {
            let end = (start + size).min(chunk.len());
            out.push(self.build_range(chunk, start..end, left, right)?);
            start = end;
        }
        for first in (0..counted).step_by(size) {
            let rows = RecordBatchOptions::new().with_row_count(Some(size.min(counted - first)));
            out.push(RecordBatch::try_new_with_options(self.schema.clone(), Vec::new(), &rows)?);
        }
        Ok(out)
    }

    fn build_range(
        &self,
        chunk: &ResultChunk,
        range: std::ops::Range<usize>,
        left: &SideData,
        right: &SideData,
    ) -> Result<RecordBatch> {
        let rows = |positions: &[u32], side: &SideData| -> UInt32Array {
            if side.vectors.rows_are_positions() {
                return positions.to_vec().into();
            }
            positions.iter().map(|&p| side.vectors.rows[p as usize]).collect::<Vec<u32>>().into()
        };
        let mut left_rows = None;
        let mut right_rows = None;
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            arrays.push(match *column {
                OutputColumn::Left(i) => {
                    let idx = left_rows.get_or_insert_with(|| rows(&chunk.left[range.clone()], left));
                    left.column(i)?.take(idx)?
                }
                OutputColumn::Right(i) => {
                    let idx = right_rows.get_or_insert_with(|| rows(&chunk.right[range.clone()], right));
                    right.column(i)?.take(idx)?
                }
                OutputColumn::Distance => Arc::new(Float64Array::from(chunk.distance[range.clone()].to_vec())),
                OutputColumn::Rank => {
                    Arc::new(chunk.rank[range.clone()].iter().map(|&r| r as i64).collect::<Int64Array>())
                }
                OutputColumn::QueryRow => {
                    Arc::new(left_rows.get_or_insert_with(|| rows(&chunk.left[range.clone()], left)).clone())
                }
                OutputColumn::ScanOrder => {
                    let idx = right_rows.get_or_insert_with(|| rows(&chunk.right[range.clone()], right));
                    let share = (self.share as u64) << 32;
                    Arc::new(idx.values().iter().map(|&r| share | r as u64).collect::<UInt64Array>())
                }
                OutputColumn::Cluster => Arc::new(
                    chunk.cluster[range.clone()]
                        .iter()
                        .map(|&root| (root != NOISE).then(|| left.vectors.rows[root as usize] as i64))
                        .collect::<Int64Array>(),
                ),
                OutputColumn::Core => Arc::new(BooleanArray::from(chunk.core[range.clone()].to_vec())),
            });
        }
        let options = RecordBatchOptions::new().with_row_count(Some(range.len()));
        Ok(RecordBatch::try_new_with_options(self.schema.clone(), arrays, &options)?)
    }
}
