//! The inputs of a run: each partition collected under the memory reservation, the columns the
//! output takes rows from, and each side's vectors (from the session's conversion cache where kept).

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, new_empty_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{Result, exec_err};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::TryStreamExt;

use super::OddRows;
use crate::exec::InputSide;
use crate::exec::cache::{self, VectorCache};
use crate::op::{Metric, Operation, SimilarityOp};
use crate::results::{InputColumn, OutputColumn, SideData};
use crate::vectors::{Vectors, skipped_values};

/// One partition of an input collected, its batches counted against the reservation.
pub(in crate::exec) async fn collect_partition(
    stream: SendableRecordBatchStream,
    reservation: Arc<MemoryReservation>,
) -> Result<Vec<RecordBatch>> {
    stream
        .and_then(|batch| {
            let grown = reservation.try_grow(batch.get_array_memory_size());
            async move { grown.map(|_| batch) }
        })
        .try_collect()
        .await
}

/// The two sides' vectors have one dimension (either may be empty).
pub(in crate::exec) fn check_dimensions(
    op: &SimilarityOp,
    (left, lv): (&InputSide, &Vectors),
    (right, rv): (&InputSide, &Vectors),
) -> Result<()> {
    if !lv.is_empty() && !rv.is_empty() && lv.dim != rv.dim {
        return exec_err!(
            "{}: dimension mismatch: {} has {}-dimensional vectors, {} has {}",
            op.function_name(),
            left.describe,
            lv.dim,
            right.describe,
            rv.dim
        );
    }
    if !lv.is_empty() && !rv.is_empty() && lv.bits.bits != rv.bits.bits {
        return exec_err!(
            "{}: bit strings of different lengths: {} has {} bits, {} has {}",
            op.function_name(),
            left.describe,
            lv.bits.bits,
            right.describe,
            rv.bits.bits
        );
    }
    Ok(())
}

/// Which columns of `input`'s schema the output takes rows from.
pub(in crate::exec) fn projected_columns(
    output_columns: &[OutputColumn],
    left: &InputSide,
    right: &InputSide,
    input: &InputSide,
    schema: &SchemaRef,
) -> Vec<bool> {
    (0..schema.fields().len())
        .map(|i| {
            output_columns.iter().any(|c| match *c {
                OutputColumn::Left(j) => j == i && left.child == input.child,
                OutputColumn::Right(j) => j == i && right.child == input.child,
                _ => false,
            })
        })
        .collect()
}

/// One input's collected batches converted: its vectors (from the session's `cache` where they
/// are kept), the columns the output projects (`projected`), each in one array, and the rows the
/// conversion skipped that SQL's semantics still compare.
pub(in crate::exec) fn convert_side(
    op: &SimilarityOp,
    cache: Option<&VectorCache>,
    schema: &SchemaRef,
    parts: &[RecordBatch],
    input: &InputSide,
    projected: &[bool],
) -> Result<ConvertedSide> {
    let reject_zero = op.metric == Metric::Cosine;
    let describe = format!("{}: {}", op.function_name(), input.describe);
    let (vectors, cached) = cache::vectors(cache, schema, parts, &input.source, reject_zero, &describe, op.cache_size)?;
    let column = |i: usize| -> Result<Option<InputColumn>> {
        Ok(match parts {
            _ if !projected[i] => None,
            [] => Some(InputColumn::Whole(new_empty_array(schema.field(i).data_type()))),
            _ => Some(InputColumn::of(parts.iter().map(|b| b.column(i).clone()).collect())),
        })
    };
    let columns = (0..schema.fields().len()).map(column).collect::<Result<Vec<_>>>()?;
    let num_rows = parts.iter().map(|b| b.num_rows()).sum();
    let odd = match (op.scalar_semantics && vectors.skipped > 0, &op.operation) {
        (false, _) => Vec::new(),
        // Every skipped base row is a candidate of the sort above a rewritten kNN.
        (true, Operation::Knn { .. }) => vectors.skipped_rows(num_rows).into_iter().map(|r| (r, Vec::new())).collect(),
        (true, _) => skipped_values(parts, &input.source, &vectors.skipped_rows(num_rows))?,
    };
    Ok((SideData { columns, num_rows, vectors }, cached, odd))
}

/// One converted input: its data, whether its vectors came from the cache, and its odd rows.
pub(in crate::exec) type ConvertedSide = (SideData, bool, OddRows);
