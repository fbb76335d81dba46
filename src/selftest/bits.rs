//! The self-test's bit strings: Hamming and Tanimoto joins and Hamming kNN on the GPU against the
//! cores, over 64-bit hashes and 256-bit codes near a few centres (so that near pairs exist), with
//! NULL rows.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeBinaryArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::selftest::data::register_batch;
use crate::selftest::{Cases, compare, join_queries};

/// `n` rows of `id`, a 64-bit hash `h` and a 256-bit code `c` (FixedSizeBinary(32)), each a few
/// bits from one of `centres` random centres; every 17th row NULL.
fn bit_batch(n: usize, centres: usize, seed: u64) -> Result<RecordBatch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let centres: Vec<[u8; 32]> = (0..centres).map(|_| rng.random()).collect();
    let mut hashes = Vec::with_capacity(n);
    let mut codes = Vec::with_capacity(n);
    for row in 0..n {
        if row % 17 == 5 {
            hashes.push(None);
            codes.push(None);
            continue;
        }
        let mut code = centres[rng.random_range(0..centres.len())];
        for _ in 0..rng.random_range(0..9) {
            let bit = rng.random_range(0..256);
            code[bit / 8] ^= 1 << (bit % 8);
        }
        hashes.push(Some(i64::from_le_bytes(code[..8].try_into().expect("8 bytes"))));
        codes.push(Some(code.to_vec()));
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("h", DataType::Int64, true),
        Field::new("c", DataType::FixedSizeBinary(32), true),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..n as i64)),
        Arc::new(Int64Array::from(hashes)),
        Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(codes.into_iter(), 32)?),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Hamming joins within 0 to 12 bits, Tanimoto joins, and Hamming kNN up to more than the base.
pub(super) async fn bits(ctx: &SessionContext, cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    register_batch(ctx, "a", bit_batch(6000, 8, 31)?)?;
    register_batch(ctx, "b", bit_batch(2500, 8, 32)?)?;
    for column in ["h", "c"] {
        for r in [0, 1, 3, 6, 12] {
            for sql in join_queries(r as f64, &format!("metric=hamming, column={column}")) {
                failures += compare(ctx, &sql, "bits | 6000 and 2500", cases).await?;
            }
        }
        for eps in [0.0, 0.05, 0.2, 0.6] {
            for sql in join_queries(eps, &format!("metric=jaccard, column={column}")) {
                failures += compare(ctx, &sql, "bits | 6000 and 2500", cases).await?;
            }
        }
        for k in [1, 10, 100, 3000] {
            let sql = format!(
                "SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, 'metric=hamming, column={column}')"
            );
            failures += compare(ctx, &sql, "bits | 6000 and 2500", cases).await?;
        }
    }
    // Hashes enough for multi-index hashing to pay on the device (the cost model's choice).
    register_batch(ctx, "a", bit_batch(60_000, 6000, 33)?)?;
    register_batch(ctx, "b", bit_batch(30_000, 6000, 34)?)?;
    for r in [1, 2, 4] {
        for sql in join_queries(r as f64, "metric=hamming, column=h") {
            failures += compare(ctx, &sql, "bits | 60000 and 30000", cases).await?;
        }
    }
    Ok(failures)
}
