//! The data the self-test's cases run on: seeded random and adversarial vector sets, text, and
//! their registration as in-memory tables (f32 vectors, Float64 columns, NULLs).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::catalog::MemTable;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;

use crate::datagen::{self, Distribution};

/// A dataset of the selftest: its name, its values and their dimension.
pub(super) type Dataset = (&'static str, Vec<f64>, usize);

/// The vector sets the cases run on (the sections below pick some by position).
pub(super) fn datasets() -> Vec<Dataset> {
    vec![
        ("uniform", datagen::generate(Distribution::Uniform, 3000, 2, 1), 2),
        ("exponential", datagen::generate(Distribution::Exponential, 4000, 3, 2), 3),
        ("blobs", datagen::generate(Distribution::Blobs, 2500, 8, 3), 8),
        ("gaussian", datagen::generate(Distribution::Gaussian, 1200, 33, 4), 33),
        // Coordinates that are not f32 values (registered as Float64 columns, which keep them):
        // every other set is f32 input.
        (
            "gaussian f64",
            datagen::generate(Distribution::Gaussian, 1200, 33, 4)
                .into_iter()
                .map(|v| v * (1.0 + 2f64.powi(-40)))
                .collect(),
            33,
        ),
        ("lattice", lattice(700, 4), 4),
        ("special", special(900, 3), 3),
        // More base rows than kNN's 4096-row sample: sampled radii, not exact ones.
        ("gaussian", datagen::generate(Distribution::Gaussian, 9000, 16, 5), 16),
        // Integer coordinates in one window of 256: rows of three chunks of 128 bytes (the last
        // part-filled), and signed bytes.
        ("bytes", bytes(1500, 300, 0.0, 8), 300),
        ("signed bytes", bytes(1200, 40, -128.0, 9), 40),
        // kNN's first pass keeps the filter's scores where brute_join_tc runs on f16 rows (L2, k
        // ≤ 32): ties, and slots that overflow.
        ("half lattice", half_lattice(700, 4), 4),
        ("duplicates", duplicates(6000, 8), 8),
    ]
}

/// Registers `values` as table `name`: a vector column of f32 (Parquet's layout) where every value
/// is one, else a Float64 column per coordinate (CSV's), which keeps them.
pub(super) fn register(ctx: &SessionContext, name: &str, values: &[f64], dim: usize) -> Result<()> {
    let f32_values = values.iter().all(|&v| v.is_nan() || v as f32 as f64 == v);
    let batch: RecordBatch =
        if f32_values { datagen::vector_batch(values, dim)? } else { datagen::column_batch(values, dim)? };
    register_batch(ctx, name, batch)
}

/// Registers `batch` as the in-memory table `name`, replacing any table of that name.
pub(super) fn register_batch(ctx: &SessionContext, name: &str, batch: RecordBatch) -> Result<()> {
    ctx.deregister_table(name)?;
    ctx.register_table(name, Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))?;
    Ok(())
}

/// In a table of `register_with_nulls`: whether row `row`'s vector is NULL (every ninth row).
pub(super) fn null_vector(row: usize) -> bool {
    row % 9 == 4
}

/// In a table of `register_with_nulls`: whether coordinate `d` of row `row` is NULL (all of a NULL
/// vector's, and one of every seventh row's).
pub(super) fn null_coordinate(row: usize, d: usize, dim: usize) -> bool {
    null_vector(row) || (row % 7 == 2 && d == row % dim)
}

/// Registers `values` as table `name` with NULLs where `null_vector` and `null_coordinate` say, in
/// the vector column layout (Parquet's) or, with `columns`, one nullable Float64 column per
/// coordinate (CSV's, where a NULL vector is a row of NULLs).
pub(super) fn register_with_nulls(
    ctx: &SessionContext,
    name: &str,
    values: &[f64],
    dim: usize,
    columns: bool,
) -> Result<()> {
    let n = values.len() / dim;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let batch = if columns {
        let mut fields = vec![("id".to_string(), ids)];
        for d in 0..dim {
            let column: Float64Array =
                (0..n).map(|row| (!null_coordinate(row, d, dim)).then(|| values[row * dim + d])).collect();
            fields.push((format!("x{}", d + 1), Arc::new(column) as ArrayRef));
        }
        RecordBatch::try_from_iter(fields)?
    } else {
        let flat: Float32Array =
            (0..n * dim).map(|i| (!null_coordinate(i / dim, i % dim, dim)).then(|| values[i] as f32)).collect();
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let vectors = NullBuffer::from((0..n).map(|row| !null_vector(row)).collect::<Vec<_>>());
        let list = FixedSizeListArray::try_new(item, dim as i32, Arc::new(flat), Some(vectors))?;
        RecordBatch::try_from_iter([("id", ids), ("vector", Arc::new(list) as ArrayRef)])?
    };
    register_batch(ctx, name, batch)
}

/// Integer points with many duplicates and many pairs at exactly the threshold.
pub(super) fn lattice(n: usize, dim: usize) -> Vec<f64> {
    (0..n * dim).map(|i| ((i * 7919) % 13) as f64).collect()
}

/// Gaussian points rounded to integers in [lo, lo + 255] (pixel-like bytes, or signed bytes for lo
/// = −128), the first rows repeated (equal distances, ties by position): byte rows on the GPU
/// (brute_join_tc_bytes).
pub(super) fn bytes(n: usize, dim: usize, lo: f64, seed: u64) -> Vec<f64> {
    let mut values: Vec<f64> = datagen::generate(Distribution::Gaussian, n, dim, seed)
        .into_iter()
        .map(|g| (lo + 128.0 + 40.0 * g).round().clamp(lo, lo + 255.0))
        .collect();
    values.copy_within(0..20 * dim, 20 * dim);
    values
}

/// The lattice halved and moved off the integers (0.25, 0.75, …, 6.25: f32 values, exact
/// differences): its ties, on the f16 rows of brute_join_tc instead of byte rows.
pub(super) fn half_lattice(n: usize, dim: usize) -> Vec<f64> {
    lattice(n, dim).into_iter().map(|v| v * 0.5 + 0.25).collect()
}

/// Gaussian points whose first 600 rows are one palindromic point, which the query table (the
/// first half reversed, coordinates too) holds 600 times: those queries find 600 base rows at
/// distance 0, more than kNN's first slots hold.
pub(super) fn duplicates(n: usize, dim: usize) -> Vec<f64> {
    let mut values = datagen::generate(Distribution::Gaussian, n, dim, 10);
    let point: Vec<f64> = (0..dim).map(|i| values[i.min(dim - 1 - i)]).collect();
    for row in values.chunks_mut(dim).take(600) {
        row.copy_from_slice(&point);
    }
    values
}

/// Uniform points with zero vectors (NaN cosine distances), NaN rows (skipped) and a far outlier.
pub(super) fn special(n: usize, dim: usize) -> Vec<f64> {
    let mut values = datagen::generate(Distribution::Uniform, n, dim, 6);
    for row in [5, 6, 7, 200] {
        values[row * dim..(row + 1) * dim].fill(0.0);
    }
    for row in [10, 11, 300] {
        values[row * dim] = f64::NAN;
    }
    values[400 * dim] = 1e6;
    values
}

/// A batch of `id` (0..) and text column `w`.
pub(super) fn text_batch(words: &[Option<String>]) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("w", DataType::Utf8, true)]));
    let ids = Int64Array::from_iter_values(0..words.len() as i64);
    Ok(RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(StringArray::from(words.to_vec()))])?)
}

/// Registers `values` as table `a` and the reverse of its first half as table `b`; `a`'s rows.
pub(super) fn register_pair(ctx: &SessionContext, values: &[f64], dim: usize) -> Result<usize> {
    register(ctx, "a", values, dim)?;
    register(ctx, "b", &reversed_half(values, dim), dim)?;
    Ok(values.len() / dim)
}

/// The query side of the A/B cases: `values`' rows in reverse order, coordinates too, as many as
/// half of them (so the two sides share rows and distances 0 but differ in order).
pub(super) fn reversed_half(values: &[f64], dim: usize) -> Vec<f64> {
    values.iter().rev().copied().take((values.len() / dim / 2) * dim).collect()
}
