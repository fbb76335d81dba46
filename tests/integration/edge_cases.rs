//! Hand-checkable cases: exact boundaries, eps = 0, duplicates, ties, k > n, empty inputs, NULL and
//! NaN vectors.

use crate::common::{Shape, check, ctx, operator_metrics, oracle_join, oracle_knn, register, rows};

fn points(coords: &[(f64, f64)]) -> Vec<Option<Vec<f64>>> {
    coords.iter().map(|&(x, y)| Some(vec![x, y])).collect()
}

/// `sim_join(t, t, eps)` is a join of two tables that happen to be one: every pair, each row with
/// itself included, although both sides share one set of kept vectors.
#[tokio::test]
async fn a_table_joined_with_itself_as_two_tables_pairs_each_row_with_itself() {
    let ctx = ctx();
    let data = crate::common::vectors(300, 3, 9);
    register(&ctx, "t", &data, 3, Shape::FixedF32);
    let eps = crate::common::threshold("l2", &data, 0.01);
    for _ in 0..2 {
        let sql = format!("SELECT left_id, right_id, distance FROM sim_join(t, t, {eps})");
        check(&ctx, &sql, &oracle_join("l2", &data, &data, eps, None)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pairs_exactly_at_eps_are_included() {
    let ctx = ctx();
    // 3-4-5 triangles: several pairs at distance exactly 5, others just beyond.
    let data = points(&[(0.0, 0.0), (3.0, 4.0), (6.0, 8.0), (0.0, 5.0), (5.0, 0.0), (8.0, 6.0), (5.0, 0.5)]);
    register(&ctx, "t", &data, 2, Shape::FixedF32);
    let got = rows(&ctx, "SELECT left_id, right_id, distance FROM sim_join(t, 5, 'pairs=unordered')").await;
    let want = oracle_join("l2", &data, &data, 5.0, Some((false, false)));
    assert!(want.iter().any(|r| f64::from_bits(r.2) == 5.0));
    assert_eq!(got, want);
    for metric in ["l1", "linf", "l2sq"] {
        let eps = if metric == "l2sq" {
            25.0
        } else if metric == "l1" {
            7.0
        } else {
            4.0
        };
        let indexes: &[&str] = if metric == "l2sq" {
            &["auto", "grid", "brute_force"]
        } else {
            &["auto", "grid", "brute_force", "list_of_clusters"]
        };
        for index in indexes {
            let sql =
                format!("SELECT left_id, right_id, distance FROM sim_join(t, {eps}, 'metric={metric}, index={index}')");
            check(&ctx, &sql, &oracle_join(metric, &data, &data, eps, Some((false, true)))).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn eps_zero_finds_exact_duplicates_only() {
    let ctx = ctx();
    let data = points(&[(1.0, 1.0), (2.0, 2.0), (1.0, 1.0), (1.0, 1.0), (2.0, 2.0000001)]);
    register(&ctx, "t", &data, 2, Shape::ListF64);
    let got = rows(&ctx, "SELECT left_id, right_id, distance FROM sim_join(t, 0.0, 'pairs=unordered')").await;
    assert_eq!(got.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), vec![(0, 2), (0, 3), (2, 3)]);
    let got = rows(&ctx, "SELECT left_id, right_id, distance FROM sim_join(t, 0, 'include_self=true')").await;
    assert_eq!(got.len(), 6 + 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn knn_ties_go_to_the_earlier_base_row_and_k_beyond_n_returns_everything() {
    let ctx = ctx();
    let base = points(&[(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0), (2.0, 0.0), (1.0, 0.0)]);
    let queries = points(&[(0.0, 0.0), (1.0, 0.0)]);
    register(&ctx, "base", &base, 2, Shape::Columns);
    register(&ctx, "queries", &queries, 2, Shape::FixedF32);
    let got = rows(&ctx, "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 3)").await;
    assert_eq!(got, oracle_knn("l2", &base, &queries, 3));
    let ranks: Vec<(i64, i64)> = got.iter().filter(|r| r.0 == 0).map(|r| (r.3, r.1)).collect();
    assert_eq!(ranks, vec![(1, 0), (2, 1), (3, 2)]);
    let got = rows(&ctx, "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 1000)").await;
    assert_eq!(got.len(), 12);
    assert_eq!(got, oracle_knn("l2", &base, &queries, 1000));
    // L1 and L∞ through their f32 filter: the same ties, decided the same way.
    for metric in ["l1", "linf"] {
        for k in [1, 3, 1000] {
            let sql =
                format!("SELECT query_id, base_id, distance, rank FROM knn(base, queries, {k}, 'metric={metric}')");
            assert_eq!(rows(&ctx, &sql).await, oracle_knn(metric, &base, &queries, k), "{metric}, k = {k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_inputs_give_empty_results_with_the_right_schema() {
    let ctx = ctx();
    register(&ctx, "empty", &[], 3, Shape::FixedF32);
    register(
        &ctx,
        "some",
        &points(&[(1.0, 2.0)])
            .into_iter()
            .map(|p| {
                p.map(|mut v| {
                    v.push(0.0);
                    v
                })
            })
            .collect::<Vec<_>>(),
        3,
        Shape::FixedF32,
    );
    for sql in [
        "SELECT * FROM sim_join(empty, 0.5)",
        "SELECT * FROM sim_join(empty, some, 0.5)",
        "SELECT * FROM range_query(some, empty, 1)",
        "SELECT * FROM knn(empty, some, 3)",
    ] {
        let df = ctx.sql(sql).await.unwrap();
        let names: Vec<String> = df.schema().fields().iter().map(|f| f.name().clone()).collect();
        let batches = df.collect().await.unwrap();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 0, "{sql}");
        assert!(names.last().unwrap() == "distance" || names.last().unwrap() == "rank", "{sql}: {names:?}");
    }
    let names: Vec<String> = ctx
        .sql("SELECT * FROM knn(empty, some, 3)")
        .await
        .unwrap()
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, vec!["query_id", "query_vector", "base_id", "base_vector", "distance", "rank"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn null_nan_and_infinite_vectors_never_match_and_are_counted() {
    let ctx = ctx();
    let mut data = points(&[(0.0, 0.0), (0.125, 0.0), (0.0, 0.125), (0.0625, 0.0625)]);
    data.push(None);
    data.push(Some(vec![f64::NAN, 0.0]));
    data.push(Some(vec![0.0, f64::INFINITY]));
    data.push(Some(vec![0.0, 0.0]));
    for shape in [Shape::FixedF32, Shape::ListF64, Shape::Columns] {
        register(&ctx, "t", &data, 2, shape);
        let got = rows(&ctx, "SELECT left_id, right_id, distance FROM sim_join(t, 0.2)").await;
        assert_eq!(got, oracle_join("l2", &data, &data, 0.2, Some((false, true))), "{shape:?}");
        assert!(got.iter().all(|r| r.0 < 4 || r.0 == 7));
        let metrics = operator_metrics(&ctx, "SELECT count(*) FROM sim_join(t, 0.2)").await;
        assert_eq!((metrics["skipped_rows"], metrics["input_rows"]), (3, 8), "{shape:?}");
    }
    // Under cosine the zero vectors (rows 0 and 7) are skipped too.
    let got = rows(&ctx, "SELECT query_id, base_id, distance, rank FROM knn(t, t, 2, 'metric=cosine')").await;
    assert_eq!(got, oracle_knn("cosine", &data, &data, 2));
    assert!(got.iter().all(|r| ![0, 7].contains(&r.0) && ![0, 7].contains(&r.1)));
}

#[tokio::test(flavor = "multi_thread")]
async fn values_far_from_the_origin_and_beyond_f32_stay_exact() {
    let ctx = ctx();
    // Offset data: the f32 filter works on centred values; huge values skip it altogether.
    for offset in [1e6, 1e30, 1e100] {
        let data: Vec<Option<Vec<f64>>> = crate::common::vectors(300, 12, 5)
            .into_iter()
            .map(|v| v.map(|v| v.iter().map(|x| offset + x * offset * 1e-6).collect()))
            .collect();
        register(&ctx, "t", &data, 12, Shape::ListF64);
        let eps = crate::common::threshold("l2", &data, 0.02);
        let sql = format!("SELECT left_id, right_id, distance FROM sim_join(t, {eps:?})");
        check(&ctx, &sql, &oracle_join("l2", &data, &data, eps, Some((false, true)))).await;
        for metric in ["l2", "l1", "linf"] {
            let sql = format!("SELECT query_id, base_id, distance, rank FROM knn(t, t, 4, 'metric={metric}')");
            check(&ctx, &sql, &oracle_knn(metric, &data, &data, 4)).await;
        }
    }
}

/// A CTE's name, a view and a subquery are table arguments of every function, each meaning the
/// rows its query gives, as a table of those rows would.
#[tokio::test]
async fn cte_names_views_and_subqueries_are_table_arguments() {
    let ctx = ctx();
    let base = crate::common::vectors(200, 3, 51);
    register(&ctx, "b", &base, 3, Shape::ListF64);
    register(&ctx, "q", &crate::common::vectors(6, 3, 52), 3, Shape::FixedF32);
    ctx.sql("CREATE TABLE even AS SELECT * FROM b WHERE id % 2 = 0").await.unwrap().collect().await.unwrap();
    ctx.sql("CREATE VIEW even_view AS SELECT * FROM b WHERE id % 2 = 0").await.unwrap().collect().await.unwrap();
    for (with_table, with_argument) in [
        (
            "SELECT query_id, base_id, distance, rank FROM knn(even, q, 4)",
            [
                "WITH e AS (SELECT * FROM b WHERE id % 2 = 0) SELECT query_id, base_id, distance, rank FROM knn(e, q, 4)",
                "SELECT query_id, base_id, distance, rank FROM knn((SELECT * FROM b WHERE id % 2 = 0), q, 4)",
                "SELECT query_id, base_id, distance, rank FROM knn(even_view, q, 4)",
            ],
        ),
        (
            "SELECT left_id, right_id, distance FROM sim_join(even, 0.2)",
            [
                "WITH e AS (SELECT * FROM b WHERE id % 2 = 0) SELECT left_id, right_id, distance FROM sim_join(e, 0.2)",
                "SELECT left_id, right_id, distance FROM sim_join((SELECT id, vector FROM b WHERE id % 2 = 0), 0.2)",
                "WITH e AS (SELECT * FROM b WHERE id % 2 = 0) SELECT left_id, right_id, distance FROM sim_join((SELECT * FROM e), 0.2)",
            ],
        ),
        (
            "SELECT query_id, base_id, distance FROM range_query(even, q, 0.3)",
            [
                "WITH e AS (SELECT * FROM b WHERE id % 2 = 0), w AS (SELECT * FROM q) SELECT query_id, base_id, distance FROM range_query(e, w, 0.3)",
                "SELECT query_id, base_id, distance FROM range_query((SELECT * FROM b WHERE id % 2 = 0), (SELECT * FROM q), 0.3)",
                "SELECT query_id, base_id, distance FROM range_query(even_view, q, 0.3)",
            ],
        ),
        (
            "SELECT id, coalesce(cluster_id, -1), CAST(core AS DOUBLE) FROM dbscan(even, 0.2, 2)",
            [
                "WITH e AS (SELECT * FROM b WHERE id % 2 = 0) SELECT id, coalesce(cluster_id, -1), CAST(core AS DOUBLE) FROM dbscan(e, 0.2, 2)",
                "SELECT id, coalesce(cluster_id, -1), CAST(core AS DOUBLE) FROM dbscan((SELECT * FROM b WHERE id % 2 = 0), 0.2, 2)",
                "SELECT id, coalesce(cluster_id, -1), CAST(core AS DOUBLE) FROM dbscan(even_view, 0.2, 2)",
            ],
        ),
    ] {
        let want = rows(&ctx, with_table).await;
        assert!(!want.is_empty(), "{with_table}");
        for sql in with_argument {
            check(&ctx, sql, &want).await;
        }
    }
    // A CTE shadows a table of the same name, as SQL resolves names.
    let shadowed = rows(
        &ctx,
        "WITH b AS (SELECT * FROM b WHERE id % 2 = 0) SELECT query_id, base_id, distance, rank FROM knn(b, q, 4)",
    )
    .await;
    assert_eq!(shadowed, rows(&ctx, "SELECT query_id, base_id, distance, rank FROM knn(even, q, 4)").await);
    // A name nothing defines still names the function and the argument.
    let err = ctx.sql("WITH e AS (SELECT 1) SELECT * FROM knn(nowhere, q, 2)").await.unwrap_err().to_string();
    assert!(err.contains("knn: argument 'base': table 'nowhere' not found"), "{err}");
}
