//! Result chunks → Arrow record batches: only the projected columns, taken from the inputs by row,
//! at most `batch_size` rows each.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_err};

use crate::backend::ResultChunk;
use crate::vectors::Vectors;

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
}

/// One side of the output: the input's columns the output takes rows from and its vectors
/// (positions → rows).
#[derive(Debug, Clone)]
pub struct SideData {
    /// Column `i` of the input, all rows in one array, where the output projects it; else `None`.
    pub columns: Vec<Option<ArrayRef>>,
    /// Rows of the input.
    pub num_rows: usize,
    /// The usable vectors of the input.
    pub vectors: Arc<Vectors>,
}

impl SideData {
    fn column(&self, i: usize) -> Result<&ArrayRef> {
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
}

impl BatchBuilder {
    /// Turns a chunk into batches of at most `batch_size` rows: its listed rows, then its counted
    /// ones (which only a projection of no column may have) as batches of no column.
    pub fn build(&self, chunk: &ResultChunk, left: &SideData, right: &SideData) -> Result<Vec<RecordBatch>> {
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
            positions.iter().map(|&p| side.vectors.rows[p as usize]).collect::<Vec<u32>>().into()
        };
        let mut left_rows = None;
        let mut right_rows = None;
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            arrays.push(match *column {
                OutputColumn::Left(i) => {
                    let idx = left_rows.get_or_insert_with(|| rows(&chunk.left[range.clone()], left));
                    take(left.column(i)?, idx, None)?
                }
                OutputColumn::Right(i) => {
                    let idx = right_rows.get_or_insert_with(|| rows(&chunk.right[range.clone()], right));
                    take(right.column(i)?, idx, None)?
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
            });
        }
        let options = RecordBatchOptions::new().with_row_count(Some(range.len()));
        Ok(RecordBatch::try_new_with_options(self.schema.clone(), arrays, &options)?)
    }
}
