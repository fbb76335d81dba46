//! The same queries on a Ballista cluster inside the test (a scheduler and two executors on
//! loopback, plans serialised through simjoin's codecs) and in one process, over multi-file
//! Parquet inputs: every function, metric family and option gives the same rows.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use simjoin::Device;

use crate::common::{Shape, ctx, error, explain, register, rows, vectors};
use crate::text::words;

/// Writes `table` of `source` as `files` Parquet files of consecutive `id` ranges under `dir`.
async fn write_parts(source: &SessionContext, table: &str, dir: &std::path::Path, rows: usize, files: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..files {
        let (from, to) = (rows * f / files, rows * (f + 1) / files);
        let path = dir.join(format!("part-{f}.parquet"));
        let sql = format!(
            "COPY (SELECT * FROM {table} WHERE id >= {from} AND id < {to} ORDER BY id) TO '{}'",
            path.display()
        );
        source.sql(&sql).await.unwrap().collect().await.unwrap();
    }
}

/// The inputs as directories of Parquet files, registered as `base`, `queries`, `words` and
/// `ties` on both sessions.
async fn inputs(dir: &std::path::Path, sessions: [&SessionContext; 2]) {
    let source = ctx();
    register(&source, "b", &vectors(700, 4, 11), 4, Shape::FixedF32);
    register(&source, "q", &vectors(90, 4, 12), 4, Shape::FixedF32);
    // 15 distinct vectors, each in every file: kNN ties across the base's shares.
    let ties: Vec<_> = (0..600).map(|i| Some(vec![(i % 5) as f64, (i % 3) as f64 * 0.25, 0.0, 0.5])).collect();
    register(&source, "t", &ties, 4, Shape::ListF64);
    let texts = words(400, 13);
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("word", DataType::Utf8, true)]));
    let columns: Vec<ArrayRef> =
        vec![Arc::new(Int64Array::from_iter_values(0..texts.len() as i64)), Arc::new(StringArray::from(texts))];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    source.register_table("w", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    write_parts(&source, "b", &dir.join("base"), 700, 3).await;
    write_parts(&source, "q", &dir.join("queries"), 90, 2).await;
    write_parts(&source, "w", &dir.join("words"), 400, 3).await;
    write_parts(&source, "t", &dir.join("ties"), 600, 4).await;
    for ctx in sessions {
        for name in ["base", "queries", "words", "ties"] {
            let path = format!("{}/", dir.join(name).display());
            ctx.register_parquet(name, &path, ParquetReadOptions::default()).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_answers_as_one_process_does() {
    let dir = std::env::temp_dir().join(format!("simjoin-cluster-{}", std::process::id()));
    let local = ctx();
    let cluster = simjoin::cluster::in_process(2, 2, Device::Cpu).await.unwrap();
    // More shares than executors: each executor runs several, a share's rows never split.
    cluster.sql("SET datafusion.execution.target_partitions = 5").await.unwrap();
    inputs(&dir, [&local, &cluster]).await;

    let queries = [
        "SELECT left_id, right_id, distance FROM sim_join(base, 0.3)",
        "SELECT left_id, right_id, distance FROM sim_join(base, 0.3, 'pairs=unordered')",
        "SELECT left_id, right_id, distance FROM sim_join(base, 0.3, 'include_self=true, pairs=unordered')",
        "SELECT left_id, right_id, distance FROM sim_join(base, 0.05, 'metric=cosine, include_self=true')",
        "SELECT left_id, right_id, distance FROM sim_join(base, 0.4, 'metric=l1, index=brute_force')",
        "SELECT left_id, right_id, distance FROM sim_join(queries, base, 0.35)",
        "SELECT left_id, right_id, distance FROM sim_join(queries, base, 0.25, 'metric=linf, index=grid')",
        "SELECT query_id, base_id, distance FROM range_query(base, queries, 0.3)",
        "SELECT query_id, base_id, distance FROM range_query(base, queries, -1.1, 'metric=inner_product')",
        "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 7)",
        "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 5, 'metric=l2sq')",
        "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 4, 'metric=cosine')",
        "SELECT 0 AS q, base_id, distance, rank FROM knn(base, '[0.5, 0.5, 0.5, 0.5]', 6)",
        // With at least as many partitions as tasks, each task reads only its partitions of the
        // divided input (the base; a join's left input); with fewer, its range of the rows.
        "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 7, 'tasks=3')",
        "SELECT query_id, base_id, distance FROM range_query(base, queries, 0.3, 'tasks=2')",
        "SELECT left_id, right_id, distance FROM sim_join(queries, base, 0.35, 'tasks=2')",
        // Ties broken by the base's scan order across the tasks' shares, both ways of dividing.
        "SELECT query_id, base_id, distance, rank FROM knn(ties, queries, 50)",
        "SELECT query_id, base_id, distance, rank FROM knn(ties, queries, 50, 'tasks=2')",
        "SELECT query_id, base_id, distance, rank FROM knn(ties, queries, 9, 'metric=l1, tasks=4')",
        "SELECT query_id, base_id, distance, rank FROM knn(ties, queries, 700, 'tasks=3')",
        "SELECT left_id, right_id, CAST(distance AS DOUBLE) FROM sim_join(words, 1, 'metric=levenshtein')",
        "SELECT left_id, right_id, distance FROM sim_join(words, 2, 'metric=levenshtein, pairs=unordered')",
        "SELECT query_id, base_id, distance, rank FROM knn(words, words, 3, 'metric=levenshtein')",
        "SELECT 0 AS q, base_id, distance, rank FROM knn(words, ['abcde', 'éé字'], 4, 'metric=levenshtein')",
        // Plain SQL, planned as sim_join by the rewrite rule.
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM queries a JOIN base b \
         ON l2_distance(a.vector, b.vector) <= 0.3",
    ];
    for sql in queries {
        let want = rows(&local, sql).await;
        assert!(!want.is_empty(), "{sql} has no rows");
        let got = tokio::time::timeout(Duration::from_secs(120), rows(&cluster, sql)).await.expect(sql);
        assert_eq!(got.len(), want.len(), "{sql}");
        assert!(got == want, "{sql}: the cluster's rows differ");
    }

    // Scan order is file order, part after part (ids ascend through the files), in one process
    // and on the cluster, whichever partition finishes reading first: each unordered pair comes
    // once, the earlier row first.
    for ctx in [&local, &cluster] {
        for _ in 0..3 {
            let pairs =
                rows(ctx, "SELECT left_id, right_id, distance FROM sim_join(base, 0.3, 'pairs=unordered')").await;
            assert!(pairs.iter().all(|p| p.0 < p.1), "a pair with the later row first");
        }
    }

    // Aggregates above the operator combine the tasks' rows.
    let count = |ctx: SessionContext| async move {
        let batches = ctx.sql("SELECT count(*) FROM sim_join(base, 0.3)").await.unwrap().collect().await.unwrap();
        batches[0].column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0)
    };
    assert_eq!(count(local.clone()).await, count(cluster.clone()).await);
    // count(*), min(distance) and max(distance) computed in the operator: a row of partial states
    // a task, merged above.
    let summary = |ctx: SessionContext, sql: &'static str| async move {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let b = batches.iter().find(|b| b.num_rows() == 1).expect("one row");
        let count = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0);
        let low = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap().value(0);
        let high = b.column(2).as_any().downcast_ref::<Float64Array>().unwrap().value(0);
        (count, low.to_bits(), high.to_bits())
    };
    for sql in [
        "SELECT count(*), min(distance), max(distance) FROM sim_join(base, 0.3)",
        "SELECT count(*), min(distance), max(distance) FROM sim_join(base, 0.3, 'pairs=unordered')",
        "SELECT count(*), min(distance), max(distance) FROM sim_join(queries, base, 0.35, 'tasks=2')",
        "SELECT count(*), min(distance), max(distance) FROM range_query(base, queries, 0.3, 'tasks=3')",
    ] {
        let want = summary(local.clone(), sql).await;
        assert!(want.0 > 0, "{sql}");
        assert_eq!(summary(cluster.clone(), sql).await, want, "{sql}");
    }
    let plan = explain(
        &cluster,
        "EXPLAIN SELECT count(*), min(distance), max(distance) FROM sim_join(queries, base, 0.35, 'tasks=2')",
    )
    .await;
    assert!(plan.contains("output=[count(*), min(distance), max(distance)], output_rows=per_task"), "{plan}");

    // The plan says how the work is divided; every input is read whole by every task.
    let plan = explain(&cluster, "EXPLAIN SELECT * FROM knn(base, queries, 3)").await;
    assert!(plan.contains("tasks=") && plan.contains("backend=chosen by each executor"), "{plan}");
    // The query's settings reach the scheduler: as many tasks as target_partitions.
    let analyzed = explain(&cluster, "EXPLAIN ANALYZE SELECT * FROM knn(base, queries, 3)").await;
    assert!(analyzed.contains("tasks=5"), "{analyzed}");
    // Or as many as the `tasks` option says, whatever the partitions of the scans.
    let analyzed = explain(&cluster, "EXPLAIN ANALYZE SELECT * FROM knn(base, queries, 3, 'tasks=2')").await;
    assert!(analyzed.contains("tasks=2"), "{analyzed}");

    // Bad input is refused by the client with the single process's message.
    let message = error(&cluster, "SELECT * FROM knn(base, queries, 3, 'metric=levenshtein')").await;
    assert!(message.contains("knn") && message.contains("levenshtein"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_scheduler_is_a_clear_error_in_bounded_time() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let ctx = simjoin::cluster::connect(&format!("df://127.0.0.1:{port}")).await?;
        ctx.sql("SELECT 1").await?.collect().await
    })
    .await
    .expect("the error comes within a minute");
    let message = outcome.expect_err("no scheduler, no answer").strip_backtrace();
    assert!(message.contains(&port.to_string()) || message.to_lowercase().contains("connect"), "{message}");
    assert!(message.contains("cannot be reached"), "{message}");
}
