//! Embedding simjoin in a Rust program: register the functions on a session, add a table, run SQL.

use std::sync::Arc;

use datafusion::catalog::MemTable;
use datafusion::error::Result;
use datafusion::prelude::*;
use simjoin::datagen::{self, Distribution};

#[tokio::main]
async fn main() -> Result<()> {
    let ctx = SessionContext::new();
    simjoin::register(&ctx);

    // 10,000 seeded 3-D points as an in-memory table with columns `id` and `vector`.
    let values = datagen::generate(Distribution::Blobs, 10_000, 3, 7);
    let batch = datagen::vector_batch(&values, 3)?;
    ctx.register_table("points", Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))?;

    ctx.sql("SET simjoin.pairs = 'unordered'").await?;
    ctx.sql("SELECT count(*) AS pairs FROM sim_join(points, 0.01)").await?.show().await?;
    ctx.sql("SELECT query_vector, base_id, distance, rank FROM knn(points, '[0.5, 0.5, 0.5]', 3, 'metric=l1')")
        .await?
        .show()
        .await?;
    Ok(())
}
