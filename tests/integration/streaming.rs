//! Results stream in bounded memory: a result far larger than the memory pool completes, batches
//! never exceed `batch_size`, and LIMIT stops the work early.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;

use crate::common::{Shape, register, vectors};

fn limited_ctx(bytes: usize) -> SessionContext {
    let runtime = RuntimeEnvBuilder::new().with_memory_limit(bytes, 1.0).build_arc().unwrap();
    let ctx = SessionContext::new_with_config_rt(SessionConfig::new().with_batch_size(4096), runtime);
    simjoin::register(&ctx);
    ctx
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_larger_than_the_memory_pool_streams_through() {
    // 4,000 points, eps covering everything: 16 million ordered pairs, about 400 MB as
    // (left_id, right_id, distance) rows, through a 32 MB pool.
    let ctx = limited_ctx(32 << 20);
    register(&ctx, "t", &vectors(4000, 2, 3), 2, Shape::FixedF32);
    let mut stream = ctx
        .sql("SELECT left_id, right_id, distance FROM sim_join(t, 2.0)")
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    let (mut count, mut id_sum) = (0usize, 0i64);
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        assert!(batch.num_rows() <= 4096);
        count += batch.num_rows();
        id_sum += batch.column(0).as_primitive::<Int64Type>().values().iter().sum::<i64>();
    }
    assert_eq!(count, 4000 * 3999);
    assert_eq!(id_sum, 3999 * (0..4000).sum::<i64>());
}

#[tokio::test(flavor = "multi_thread")]
async fn inputs_larger_than_the_pool_are_refused_with_a_resources_error() {
    let ctx = limited_ctx(64 << 10);
    register(&ctx, "t", &vectors(20_000, 8, 3), 8, Shape::FixedF32);
    let err = crate::common::error(&ctx, "SELECT count(*) FROM sim_join(t, 0.1)").await;
    assert!(err.contains("Resources exhausted"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn limit_stops_early_and_dropping_the_stream_cancels_the_work() {
    let ctx = limited_ctx(1 << 30);
    register(&ctx, "t", &vectors(6000, 2, 4), 2, Shape::FixedF32);
    let batches = ctx.sql("SELECT * FROM sim_join(t, 2.0) LIMIT 10").await.unwrap().collect().await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 10);
    let mut stream = ctx.sql("SELECT * FROM sim_join(t, 2.0)").await.unwrap().execute_stream().await.unwrap();
    assert!(stream.next().await.unwrap().unwrap().num_rows() > 0);
    drop(stream);
    // The session still answers (the backend thread saw the closed channel and stopped).
    let batches = ctx.sql("SELECT count(*) FROM knn(t, '[0.5, 0.5]', 5)").await.unwrap().collect().await.unwrap();
    assert_eq!(batches[0].column(0).as_primitive::<Int64Type>().value(0), 5);
}
