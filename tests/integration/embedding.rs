//! What `simjoin::register` adds to a session an embedder configured, and what it keeps.

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::catalog::MemTable;
use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
use datafusion::prelude::*;
use simjoin::datagen::{self, Distribution};
use simjoin::{Metric, SimJoinOptions};

use crate::common::operator_metrics;

async fn one_i64(ctx: &SessionContext, sql: &str) -> i64 {
    let batches: Vec<RecordBatch> = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn register_keeps_the_sessions_own_state() {
    let options = SimJoinOptions { metric: Metric::L1, ..SimJoinOptions::default() };
    let mut config = SessionConfig::new().with_batch_size(123).with_option_extension(options);
    config.options_mut().execution.parquet.maximum_parallel_row_group_writers = 1;
    let ctx = SessionContext::new_with_config(config);
    let identity = create_udf(
        "my_identity",
        vec![DataType::Int64],
        DataType::Int64,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| Ok(args[0].clone())),
    );
    ctx.register_udf(identity);
    ctx.sql("CREATE TABLE t AS VALUES (1, [0.0, 0.0]), (2, [0.0, 1.0]), (3, [5.0, 5.0])").await.unwrap();
    let session_id = ctx.session_id();

    simjoin::register(&ctx);
    simjoin::register(&ctx);

    let state = ctx.state();
    assert_eq!(ctx.session_id(), session_id);
    assert_eq!(state.config().batch_size(), 123);
    assert_eq!(state.config_options().execution.parquet.maximum_parallel_row_group_writers, 1);
    let kept = state.config_options().extensions.get::<SimJoinOptions>().unwrap();
    assert_eq!(kept.metric, Metric::L1, "options set before register stay");
    assert_eq!(one_i64(&ctx, "SELECT my_identity(column1) FROM t WHERE column1 = 3").await, 3);
    let rules = state.optimizers().iter().filter(|r| r.name() == "simjoin_rewrite_joins").count();
    assert_eq!(rules, 1, "the join rewrite is added once");
    let physical = state.physical_optimizers().iter().filter(|r| r.name() == "simjoin_summarise_aggregates").count();
    assert_eq!(physical, 1, "the summary rule is added once");
    // Under the session's L1: (0,0)–(0,1) at 1 in both orders; (5,5) is 9 and 10 away.
    assert_eq!(one_i64(&ctx, "SELECT count(*) FROM sim_join(t, 1.5)").await, 2);
    assert_eq!(one_i64(&ctx, "SELECT count(*) FROM sim_join(t, 9.5)").await, 4);
}

/// Converted vectors are kept per session: the same in-memory arrays registered in two sessions
/// are converted once in each, and one session's `cache_size` leaves the other's entries alone.
#[tokio::test(flavor = "multi_thread")]
async fn each_session_keeps_its_own_vectors() {
    let values = datagen::generate(Distribution::Uniform, 2000, 4, 3);
    let batch = datagen::vector_batch(&values, 4).unwrap();
    let table = Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap());
    let (first, second) = (simjoin::session_context(), simjoin::session_context());
    first.register_table("t", table.clone()).unwrap();
    second.register_table("t", table).unwrap();
    async fn cached(ctx: &SessionContext) -> usize {
        operator_metrics(ctx, "SELECT count(*) FROM sim_join(t, 0.05)").await["cached_inputs"]
    }

    assert_eq!(cached(&first).await, 0, "converted on the first query");
    assert_eq!(cached(&first).await, 1, "kept for the next");
    assert_eq!(cached(&second).await, 0, "another session converts its own");
    assert_eq!(cached(&second).await, 1);

    second.sql("SET simjoin.cache_size = 0").await.unwrap();
    assert_eq!(cached(&second).await, 0, "cache_size = 0 keeps nothing");
    assert_eq!(cached(&first).await, 1, "nor drops another session's vectors");
}
