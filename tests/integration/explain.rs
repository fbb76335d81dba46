//! EXPLAIN shows what the operator will do; EXPLAIN ANALYZE what it did; unused columns are never read.

use crate::common::{Shape, check, ctx, explain, operator_metrics, oracle_join, register, vectors};

#[tokio::test(flavor = "multi_thread")]
async fn explain_shows_the_operator_and_reads_only_needed_columns() {
    let ctx = ctx();
    register(&ctx, "t", &vectors(100, 2, 1), 2, Shape::Columns);
    let dir = std::env::temp_dir().join(format!("simjoin-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("t.csv");
    simjoin::datagen::write(&simjoin::datagen::generate(simjoin::datagen::Distribution::Uniform, 50, 2, 1), 2, &csv)
        .unwrap();
    let text =
        explain(&ctx, &format!("EXPLAIN SELECT distance FROM sim_join('{}', 0.1, 'pairs=unordered')", csv.display()))
            .await;
    assert!(
        text.contains(
            "SimilarityExec: op=sim_join, eps=0.1, metric=l2, self_join=true, pairs=unordered, include_self=false, \
             device=auto, backend=cpu, index=auto"
        ),
        "{text}"
    );
    // Only the vector columns are scanned: `id` is not in the scan's projection.
    assert!(text.contains("projection=[x1, x2]"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
    let text = explain(&ctx, "EXPLAIN SELECT * FROM knn(t, t, 5, 'metric=cosine')").await;
    assert!(
        text.contains("SimilarityExec: op=knn, k=5, metric=cosine, device=auto, backend=cpu, index=brute_force\n"),
        "{text}"
    );
    // EXPLAIN VERBOSE says how each part works.
    let text = explain(&ctx, "EXPLAIN VERBOSE SELECT * FROM knn(t, t, 5, 'metric=cosine')").await;
    assert!(text.contains("backend=cpu, index=brute_force(f32 filter + exact f64 re-rank)"), "{text}");
    let text = explain(&ctx, "EXPLAIN SELECT * FROM range_query(t, '[0.5, 0.5]', 0.2)").await;
    assert!(text.contains("SimilarityExec: op=range_query, r=0.2, metric=l2"), "{text}");
    assert!(!text.contains("output=pair_count"), "{text}");
    // Selecting no column of the join: its pairs are counted, not listed.
    let text = explain(&ctx, "EXPLAIN SELECT 1 AS one FROM sim_join(t, 0.1)").await;
    assert!(text.contains("output=pair_count, pairs_listed=false"), "{text}");
    // The count itself, in the operator (tests/integration/summary.rs).
    let text = explain(&ctx, "EXPLAIN SELECT count(*) FROM sim_join(t, 0.1)").await;
    assert!(text.contains("output=[count(*)], output_rows=one, pairs_listed=false"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_analyze_reports_the_index_chosen_and_both_strategies_are_exact() {
    let ctx = ctx();
    let data = vectors(1500, 2, 7);
    register(&ctx, "t", &data, 2, Shape::FixedF32);
    for (eps, grid) in [(0.01, true), (3.0, false)] {
        let metrics = operator_metrics(&ctx, &format!("SELECT count(*) FROM sim_join(t, {eps})")).await;
        assert_eq!(metrics["indexed_dims"] > 0, grid, "eps {eps}: {metrics:?}");
        assert!(metrics["candidate_pairs"] >= metrics["output_rows"] / 2, "{metrics:?}");
        assert_eq!(metrics["input_rows"], 1500, "{metrics:?}");
        let text = explain(&ctx, &format!("EXPLAIN ANALYZE SELECT count(*) FROM sim_join(t, {eps})")).await;
        assert!(text.contains("skipped_rows=0") && text.contains("build_time="), "{text}");
        let sql = format!("SELECT left_id, right_id, distance FROM sim_join(t, {eps})");
        check(&ctx, &sql, &oracle_join("l2", &data, &data, eps, Some((false, true)))).await;
    }
}

/// An in-memory table's vectors are converted once and kept across queries (on a GPU, their rows
/// stay on the device): later queries take them from the cache with the same answers. A file's
/// arrays are decoded for one query, so they are converted every time; `cache_size = 0` keeps
/// nothing; a table replaced under the same name is converted afresh.
#[tokio::test(flavor = "multi_thread")]
async fn in_memory_inputs_are_converted_once_and_files_every_time() {
    let ctx = ctx();
    let (base, queries) = (vectors(900, 4, 11), vectors(60, 4, 12));
    register(&ctx, "cached_base", &base, 4, Shape::FixedF32);
    register(&ctx, "cached_queries", &queries, 4, Shape::FixedF32);
    let sql = "SELECT query_id, base_id, distance, rank FROM knn(cached_base, cached_queries, 4)";
    let count = "SELECT count(*) FROM knn(cached_base, cached_queries, 4)";
    assert_eq!(operator_metrics(&ctx, count).await["cached_inputs"], 0);
    for _ in 0..2 {
        assert_eq!(operator_metrics(&ctx, count).await["cached_inputs"], 2);
        check(&ctx, sql, &crate::common::oracle_knn("l2", &base, &queries, 4)).await;
    }

    // Different vectors under the old name: converted, never the old ones' answers.
    let replaced = vectors(900, 4, 13);
    register(&ctx, "cached_base", &replaced, 4, Shape::FixedF32);
    assert_eq!(operator_metrics(&ctx, count).await["cached_inputs"], 1);
    check(&ctx, sql, &crate::common::oracle_knn("l2", &replaced, &queries, 4)).await;

    let dir = std::env::temp_dir().join(format!("simjoin-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("base.parquet");
    let flat: Vec<f64> = replaced.iter().flatten().flatten().copied().collect();
    simjoin::datagen::write(&flat, 4, &file).unwrap();
    let from_file = format!("SELECT count(*) FROM knn('{}', cached_queries, 4)", file.display());
    for _ in 0..2 {
        assert_eq!(operator_metrics(&ctx, &from_file).await["cached_inputs"], 1, "only the in-memory queries");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    ctx.sql("SET simjoin.cache_size = 0").await.unwrap();
    assert_eq!(operator_metrics(&ctx, count).await["cached_inputs"], 0);
    check(&ctx, sql, &crate::common::oracle_knn("l2", &replaced, &queries, 4)).await;
}

/// The operator reads every partition of its inputs itself, so no repartition is put between it
/// and an input, even a one-partition file of more rows than a batch.
#[tokio::test(flavor = "multi_thread")]
async fn no_repartition_feeds_the_operator() {
    let ctx = ctx();
    let base = vectors(400, 3, 21);
    register(&ctx, "base", &base, 3, Shape::FixedF32);
    let dir = std::env::temp_dir().join(format!("simjoin-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("queries.parquet");
    let flat = simjoin::datagen::generate(simjoin::datagen::Distribution::Uniform, 300, 3, 22);
    simjoin::datagen::write(&flat, 3, &file).unwrap();
    let text = explain(&ctx, &format!("EXPLAIN SELECT count(*) FROM knn(base, '{}', 5)", file.display())).await;
    let below = text.split("SimilarityExec:").nth(1).unwrap_or_else(|| panic!("{text}"));
    assert!(below.contains("queries.parquet") && !below.contains("RepartitionExec"), "{text}");
    let queries: Vec<Option<Vec<f64>>> = flat.chunks(3).map(|v| Some(v.to_vec())).collect();
    let sql = format!("SELECT query_id, base_id, distance, rank FROM knn(base, '{}', 5)", file.display());
    check(&ctx, &sql, &crate::common::oracle_knn("l2", &base, &queries, 5)).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `index=list_of_clusters`: EXPLAIN names the index and its parameters, EXPLAIN ANALYZE the
/// distance computations it saved against a scan; an in-memory table's index is built once.
#[tokio::test(flavor = "multi_thread")]
async fn the_list_of_clusters_shows_its_parameters_and_the_distances_it_saved() {
    let ctx = ctx();
    let data = vectors(3000, 3, 17);
    register(&ctx, "lc", &data, 3, Shape::FixedF32);
    let text = explain(&ctx, "EXPLAIN SELECT * FROM knn(lc, lc, 3, 'index=list_of_clusters, metric=linf')").await;
    assert!(text.contains("backend=cpu, index=list_of_clusters\n"), "{text}");
    let text =
        explain(&ctx, "EXPLAIN VERBOSE SELECT * FROM knn(lc, lc, 3, 'index=list_of_clusters, metric=linf')").await;
    assert!(
        text.contains(
            "index=list_of_clusters(bucket=√n of the base input, centres by largest distance sum, \
             triangle-inequality pruning in the metric, exact check)"
        ),
        "{text}"
    );
    let sql = "SELECT count(*) FROM sim_join(lc, 0.02, 'index=list_of_clusters, metric=l1')";
    let first = operator_metrics(&ctx, sql).await;
    assert_eq!(first["kept_indexes"], 0, "{first:?}");
    // A scan of the self-join computes 3000 · 2999 / 2 distances; at this radius the index rules
    // out most of them.
    assert!(first["saved_distances"] > 3000 * 2999 / 4, "{first:?}");
    assert!(first["candidate_pairs"] >= first["output_rows"], "{first:?}");
    let second = operator_metrics(&ctx, sql).await;
    assert_eq!(second["kept_indexes"], 1, "{second:?}");
}

/// `index=auto` for a kNN under L∞ (whose scan measures every distance in f64): the sampled cost
/// model takes the scan for a few queries over clustered rows, the List of Clusters for many
/// (building it pays), and then for a few too (the index is kept with the table); the answers are
/// the scan's every time.
#[tokio::test(flavor = "multi_thread")]
async fn auto_takes_the_list_of_clusters_where_its_sampled_cost_is_lower() {
    let ctx = ctx();
    let dim = 3;
    let blobs = simjoin::datagen::generate(simjoin::datagen::Distribution::Blobs, 75_000, dim, 5);
    let rows: Vec<Option<Vec<f64>>> = blobs.chunks(dim).map(|r| Some(r.to_vec())).collect();
    register(&ctx, "lc_base", &rows[5000..], dim, Shape::FixedF32);
    register(&ctx, "lc_many", &rows[..5000], dim, Shape::FixedF32);
    register(&ctx, "lc_few", &rows[..50], dim, Shape::FixedF32);
    for (queries, indexed) in [("lc_few", false), ("lc_many", true), ("lc_few", true)] {
        let sql = |index: &str| {
            format!(
                "SELECT query_id, base_id, distance, rank FROM knn(lc_base, {queries}, 5, 'metric=linf, index={index}, device=cpu')"
            )
        };
        let metrics = operator_metrics(&ctx, &sql("auto")).await;
        assert_eq!(metrics["saved_distances"] > 0, indexed, "{queries}: {metrics:?}");
        let want = crate::common::rows(&ctx, &sql("brute_force")).await;
        check(&ctx, &sql("auto"), &want).await;
    }
}
