//! Embedding simjoin in a Rust program: a session with typed options, an in-memory table, a kNN
//! read as Arrow batches, and where the search ran.
//!
//! `cargo run --release --example embed`

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::catalog::MemTable;
use datafusion::error::Result;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::*;
use simjoin::datagen::{self, Distribution};
use simjoin::{Device, Metric, PairOrder, SimJoinOptions, SimilarityExec};

#[tokio::main]
async fn main() -> Result<()> {
    // Typed session defaults, as `SET simjoin.metric = 'l1'` would set them; a call's options
    // string still wins.
    let options =
        SimJoinOptions { metric: Metric::L1, pairs: PairOrder::Unordered, device: Device::Auto, ..Default::default() };
    let ctx = simjoin::session_context_with_config(SessionConfig::new().with_option_extension(options));

    // 10,000 seeded 3-D points as an in-memory table with columns `id` and `vector`.
    let values = datagen::generate(Distribution::Blobs, 10_000, 3, 7);
    let batch = datagen::vector_batch(&values, 3)?;
    ctx.register_table("points", Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))?;

    ctx.sql("SELECT count(*) AS pairs FROM sim_join(points, 0.01)").await?.show().await?;

    // The 3 nearest points of a literal query under L1, read column by column from Arrow batches.
    let sql = "SELECT base_id, distance, rank FROM knn(points, '[0.5, 0.5, 0.5]', 3)";
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches: Vec<RecordBatch> = collect(plan.clone(), ctx.task_ctx()).await?;
    for batch in &batches {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let distances = batch.column(1).as_primitive::<Float64Type>();
        let ranks = batch.column(2).as_primitive::<Int64Type>();
        for row in 0..batch.num_rows() {
            println!("rank {}: point {} at {:.6}", ranks.value(row), ids.value(row), distances.value(row));
        }
    }
    if let Some(backend) = similarity_backend(&plan) {
        println!("the kNN ran on: {backend}");
    }
    Ok(())
}

/// Where the plan's similarity operator ran (EXPLAIN ANALYZE's `backend=`).
fn similarity_backend(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    if let Some(exec) = plan.downcast_ref::<SimilarityExec>() {
        return Some(exec.backend_name());
    }
    plan.children().into_iter().find_map(similarity_backend)
}
