//! EXPLAIN shows what the operator will do; EXPLAIN ANALYZE what it did; unused columns are never read.

use crate::common::{check, Shape, ctx, explain, operator_metrics, oracle_join, register, vectors};

#[tokio::test(flavor = "multi_thread")]
async fn explain_shows_the_operator_and_reads_only_needed_columns() {
    let ctx = ctx();
    register(&ctx, "t", &vectors(100, 2, 1), 2, Shape::Columns);
    let dir = std::env::temp_dir().join(format!("simjoin-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("t.csv");
    simjoin::datagen::write(&simjoin::datagen::generate(simjoin::datagen::Distribution::Uniform, 50, 2, 1), 2, &csv).unwrap();
    let text = explain(&ctx, &format!("EXPLAIN SELECT distance FROM sim_join('{}', 0.1, 'pairs=unordered')", csv.display())).await;
    assert!(
        text.contains(
            "SimilarityExec: op=sim_join, eps=0.1, metric=l2, self_join=true, pairs=unordered, include_self=false, \
             device=auto, backend=cpu, index=grid or brute_force by sampled cost model"
        ),
        "{text}"
    );
    // Only the vector columns are scanned: `id` is not in the scan's projection.
    assert!(text.contains("projection=[x1, x2]"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
    let text = explain(&ctx, "EXPLAIN SELECT * FROM knn(t, t, 5, 'metric=cosine')").await;
    assert!(text.contains("SimilarityExec: op=knn, k=5, metric=cosine, device=auto, backend=cpu, index=brute_force(f32 filter + exact f64 re-rank)"), "{text}");
    let text = explain(&ctx, "EXPLAIN SELECT * FROM range_query(t, '[0.5, 0.5]', 0.2)").await;
    assert!(text.contains("SimilarityExec: op=range_query, r=0.2, metric=l2"), "{text}");
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
