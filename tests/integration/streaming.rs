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

/// The operator's rows go straight to the partial aggregates that consume them (exec/lanes.rs):
/// each row to one of them, however they are read.
#[tokio::test(flavor = "multi_thread")]
async fn the_consuming_partitions_read_each_row_once_however_they_are_read() {
    use datafusion::physical_plan::{ExecutionPlan, collect_partitioned};
    use std::sync::Arc;

    let ctx = simjoin::session_context_with_config(SessionConfig::new().with_batch_size(64).with_target_partitions(4));
    register(&ctx, "t", &vectors(1500, 2, 5), 2, Shape::FixedF32);
    // Count and id sums of the rows in `batches` (columns: left_id, right_id).
    let totals = |batches: &[datafusion::arrow::array::RecordBatch]| {
        batches.iter().fold((0i64, 0i64, 0i64), |(n, l, r), b| {
            let ids = |c: usize| b.column(c).as_primitive::<Int64Type>().values().iter().sum::<i64>();
            (n + b.num_rows() as i64, l + ids(0), r + ids(1))
        })
    };
    // The rows as one partition gives them (nothing above the operator to spread them to).
    let join = "sim_join(t, 0.05, 'pairs=unordered')";
    let listed = format!("SELECT left_id, right_id FROM {join}");
    assert!(!crate::common::explain(&ctx, &format!("EXPLAIN {listed}")).await.contains("output_partitions"));
    let want = totals(&ctx.sql(&listed).await.unwrap().collect().await.unwrap());
    assert!(want.0 > 5_000, "{want:?}");

    // The same sums by partial aggregates over 4 partitions: no repartition, the operator's 4 lanes.
    let summed = format!("SELECT count(left_id), sum(left_id), sum(right_id) FROM {join}");
    let plan = crate::common::explain(&ctx, &format!("EXPLAIN {summed}")).await;
    assert!(plan.contains("output_partitions=4") && !plan.contains("RepartitionExec"), "{plan}");
    let plan = ctx.sql(&summed).await.unwrap().create_physical_plan().await.unwrap();
    // Executed twice from the same plan: each execution answers whole.
    for _ in 0..2 {
        let batches = collect_partitioned(plan.clone(), ctx.task_ctx()).await.unwrap().concat();
        let value = |c: usize| batches[0].column(c).as_primitive::<Int64Type>().value(0);
        assert_eq!((value(0), value(1), value(2)), want);
    }
    // The operator's lanes read one after the other: the first takes every row.
    fn find(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        if plan.name() == "SimilarityExec" {
            return Some(plan.clone());
        }
        plan.children().into_iter().find_map(find)
    }
    let exec = find(&plan).unwrap();
    let mut batches = Vec::new();
    for partition in 0..4 {
        let stream = exec.execute(partition, ctx.task_ctx()).unwrap();
        batches.extend(datafusion::physical_plan::common::collect(stream).await.unwrap());
    }
    assert_eq!(totals(&batches), want);
    // Above a filter or a sort, DataFusion's round-robin stays (it decides the order of equal rows).
    for above in [format!("{listed} WHERE left_id >= 0"), format!("{listed} ORDER BY left_id LIMIT 5")] {
        let plan = crate::common::explain(&ctx, &format!("EXPLAIN {above}")).await;
        assert!(!plan.contains("output_partitions"), "{plan}");
    }
}
