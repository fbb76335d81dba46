//! Every function, metric and option against the brute-force f64 oracle: exact equality of ids,
//! ranks and distance bits, at sizes that cross the tile (64 × 1024) and batch (97) edges.

use crate::common::{Shape, check, check_count, ctx, oracle_join, oracle_knn, register, rows, threshold, vectors};

const METRICS: [&str; 6] = ["l2", "l2sq", "cosine", "inner_product", "l1", "linf"];

/// The metrics the List of Clusters serves (the triangle inequality holds, or cosine's chord).
fn is_metric(metric: &str) -> bool {
    !matches!(metric, "l2sq" | "inner_product")
}

#[tokio::test(flavor = "multi_thread")]
async fn self_join_equals_the_oracle_for_every_metric_shape_and_option() {
    let ctx = ctx();
    let cases =
        [(2, 1500, Shape::FixedF32), (3, 700, Shape::ListF64), (9, 600, Shape::Columns), (40, 1100, Shape::FixedF32)];
    for (case, (dim, n, shape)) in cases.into_iter().enumerate() {
        let data = vectors(n, dim, case as u64);
        register(&ctx, "t", &data, dim, shape);
        for metric in METRICS {
            let eps = threshold(metric, &data, 0.01);
            // Every strategy: the cost model's choice, brute force, and the grid on 1..3 dimensions
            // (windowed on the next dimension whenever fewer than all are indexed).
            let mut indexes = vec!["auto", "brute_force"];
            if metric != "inner_product" {
                indexes.extend(["grid", "grid, grid_dims=1", "grid, grid_dims=3", "directory", "directory"]);
            }
            if is_metric(metric) {
                indexes.extend(["list_of_clusters", "list_of_clusters"]);
            }
            for (index, (pairs, include_self)) in
                indexes.into_iter().zip([("ordered", false), ("unordered", true)].into_iter().cycle())
            {
                let sql = format!(
                    "SELECT left_id, right_id, distance FROM sim_join(t, {eps:?}, \
                     'metric={metric}, pairs={pairs}, include_self={include_self}, index={index}')"
                );
                let want = oracle_join(metric, &data, &data, eps, Some((include_self, pairs == "ordered")));
                assert!(!want.is_empty(), "{sql}");
                check(&ctx, &sql, &want).await;
                check_count(&ctx, &sql, want.len()).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_table_join_equals_the_oracle() {
    let ctx = ctx();
    for (dim, shape) in [(2, Shape::FixedF32), (5, Shape::Columns), (33, Shape::ListF64)] {
        let left = vectors(500, dim, 11);
        let right = vectors(1300, dim, 12);
        register(&ctx, "a", &left, dim, shape);
        register(&ctx, "b", &right, dim, shape);
        for metric in METRICS {
            let eps = threshold(metric, &right, 0.02);
            let want = oracle_join(metric, &left, &right, eps, None);
            let indexes: &[&str] = match metric {
                "inner_product" => &["auto"],
                "l2sq" => &["auto", "grid", "grid, grid_dims=1", "directory"],
                _ => &["auto", "grid", "grid, grid_dims=1", "directory", "list_of_clusters"],
            };
            for index in indexes {
                let sql = format!(
                    "SELECT left_id, right_id, distance FROM SIM_JOIN(a, b, {eps:?}, 'metric={metric}, index={index}')"
                );
                check(&ctx, &sql, &want).await;
                check_count(&ctx, &sql, want.len()).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn range_query_equals_the_oracle_for_tables_and_literals() {
    let ctx = ctx();
    let dim = 6;
    let base = vectors(2100, dim, 21);
    let queries = vectors(70, dim, 22);
    register(&ctx, "base", &base, dim, Shape::FixedF32);
    register(&ctx, "queries", &queries, dim, Shape::ListF64);
    for metric in METRICS {
        let r = threshold(metric, &base, 0.03);
        let want = oracle_join(metric, &queries, &base, r, None);
        let indexes: &[&str] = match metric {
            "inner_product" => &["auto", "brute_force"],
            "l2sq" => &["auto", "brute_force", "directory"],
            _ => &["auto", "brute_force", "directory", "list_of_clusters"],
        };
        for index in indexes {
            let sql = format!(
                "SELECT query_id, base_id, distance FROM range_query(base, queries, {r:?}, 'metric={metric}, index={index}')"
            );
            check(&ctx, &sql, &want).await;
            check_count(&ctx, &sql, want.len()).await;
        }
    }
    let q = queries[3].clone().unwrap();
    let literal = format!("{q:?}");
    let r = threshold("l2", &base, 0.05);
    let sql = format!("SELECT base_id AS a, base_id AS b, distance FROM RANGE_QUERY(base, '{literal}', {r:?})");
    let want: Vec<_> =
        oracle_join("l2", &[Some(q)], &base, r, None).into_iter().map(|(_, j, d, _)| (j, j, d, 0)).collect();
    assert!(!want.is_empty());
    check(&ctx, &sql, &want).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn knn_equals_the_oracle_for_every_metric_and_k() {
    let ctx = ctx();
    for (dim, n, shape) in [(4, 1500, Shape::Columns), (48, 2200, Shape::FixedF32)] {
        let base = vectors(n, dim, 31 + dim as u64);
        let queries = vectors(130, dim, 32);
        register(&ctx, "base", &base, dim, shape);
        register(&ctx, "queries", &queries, dim, Shape::ListF64);
        for metric in METRICS {
            for k in [1, 7, 100] {
                let want = oracle_knn(metric, &base, &queries, k);
                let sql =
                    format!("SELECT query_id, base_id, distance, rank FROM knn(base, queries, {k}, 'metric={metric}')");
                check(&ctx, &sql, &want).await;
                if is_metric(metric) {
                    let sql = format!(
                        "SELECT query_id, base_id, distance, rank FROM knn(base, queries, {k}, \
                         'metric={metric}, index=list_of_clusters')"
                    );
                    check(&ctx, &sql, &want).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn session_options_apply_and_calls_override_them() {
    let ctx = ctx();
    let data = vectors(400, 3, 41);
    register(&ctx, "t", &data, 3, Shape::FixedF32);
    ctx.sql("SET simjoin.metric = 'l1'").await.unwrap();
    ctx.sql("SET simjoin.pairs = 'unordered'").await.unwrap();
    let eps = threshold("l1", &data, 0.02);
    let got = rows(&ctx, &format!("SELECT left_id, right_id, distance FROM sim_join(t, {eps:?})")).await;
    assert_eq!(got, oracle_join("l1", &data, &data, eps, Some((false, false))));
    let got = rows(
        &ctx,
        &format!("SELECT left_id, right_id, distance FROM sim_join(t, {eps:?}, 'metric=linf, pairs=ordered')"),
    )
    .await;
    assert_eq!(got, oracle_join("linf", &data, &data, eps, Some((false, true))));
}
