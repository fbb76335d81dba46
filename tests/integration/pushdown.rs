//! Filters on one input's columns run below the operator where that cannot change the answer
//! (table.rs): the answers equal the filtered full results, and `input_rows` shows what was read.

use crate::common::{Row, Shape, ctx, operator_metrics, register, rows, vectors};

/// The rows of `full` that `keep` accepts.
fn restricted(full: &[Row], keep: impl Fn(&Row) -> bool) -> Vec<Row> {
    full.iter().filter(|r| keep(r)).cloned().collect()
}

#[tokio::test]
async fn knn_pushes_query_filters_and_never_base_filters() {
    let ctx = ctx();
    register(&ctx, "base", &vectors(600, 4, 1), 4, Shape::FixedF32);
    register(&ctx, "queries", &vectors(100, 4, 2), 4, Shape::FixedF32);
    let full = rows(&ctx, "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 5)").await;

    let on_queries = "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 5) WHERE query_id < 3";
    assert_eq!(rows(&ctx, on_queries).await, restricted(&full, |r| r.0 < 3));
    // 600 base rows and the 3 queries left.
    assert_eq!(operator_metrics(&ctx, on_queries).await["input_rows"], 603);

    // The 5 nearest among the whole base, then filtered: not the 5 nearest of base rows ≥ 300.
    let on_base = "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 5) WHERE base_id >= 300";
    assert_eq!(rows(&ctx, on_base).await, restricted(&full, |r| r.1 >= 300));
    assert_eq!(operator_metrics(&ctx, on_base).await["input_rows"], 700);
}

#[tokio::test]
async fn range_queries_and_joins_of_two_tables_push_either_side() {
    let ctx = ctx();
    register(&ctx, "a", &vectors(400, 3, 3), 3, Shape::ListF64);
    register(&ctx, "b", &vectors(300, 3, 4), 3, Shape::Columns);
    // range_query(base, query, r) reads `b` as its queries (100 ids divisible by 3) and `a` as its
    // base (100 ids below 100); sim_join(a, b, eps) has `a` on the left (134) and `b` on the right.
    for (function, left, right, read) in
        [("range_query", "query_id", "base_id", 200), ("sim_join", "left_id", "right_id", 234)]
    {
        let call = format!("{function}(a, b, 0.2)");
        let full = rows(&ctx, &format!("SELECT {left}, {right}, distance FROM {call}")).await;
        assert!(full.len() > 100, "{function}: {}", full.len());
        let both = format!("SELECT {left}, {right}, distance FROM {call} WHERE {left} % 3 = 0 AND {right} < 100");
        assert_eq!(rows(&ctx, &both).await, restricted(&full, |r| r.0 % 3 == 0 && r.1 < 100), "{function}");
        assert_eq!(operator_metrics(&ctx, &both).await["input_rows"], read, "{function}");
        // A condition across both sides stays above the operator.
        let across = format!("SELECT {left}, {right}, distance FROM {call} WHERE {left} < {right}");
        assert_eq!(rows(&ctx, &across).await, restricted(&full, |r| r.0 < r.1), "{function}");
        assert_eq!(operator_metrics(&ctx, &across).await["input_rows"], 700, "{function}");
    }
}

#[tokio::test]
async fn self_joins_filter_above_the_operator() {
    let ctx = ctx();
    register(&ctx, "t", &vectors(500, 2, 5), 2, Shape::FixedF32);
    let full = rows(&ctx, "SELECT left_id, right_id, distance FROM sim_join(t, 0.05)").await;
    let sql = "SELECT left_id, right_id, distance FROM sim_join(t, 0.05) WHERE left_id < 50";
    // The one input is both sides: filtering it would drop the pairs (i < 50, j ≥ 50).
    assert_eq!(rows(&ctx, sql).await, restricted(&full, |r| r.0 < 50));
    assert!(full.iter().any(|r| r.0 < 50 && r.1 >= 50));
    assert_eq!(operator_metrics(&ctx, sql).await["input_rows"], 500);
}
