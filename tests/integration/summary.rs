//! `count(*)`, `min(distance)` and `max(distance)` over a join or range query are computed in the
//! operator (one summary row, no pair listed) and equal the aggregates of the rows it would list;
//! any other aggregate still reads the rows.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::prelude::SessionContext;

use crate::common::{Shape, ctx, explain, register, vectors};

/// The listed rows' distances, by SQL.
async fn distances(ctx: &SessionContext, from: &str) -> Vec<f64> {
    let sql = format!("SELECT distance FROM {from}");
    let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    batches.iter().flat_map(|b| b.column(0).as_primitive::<Float64Type>().values().to_vec()).collect()
}

/// The one row of `sql`: each column as an f64's bits, NULL as `None`.
async fn one_row(ctx: &SessionContext, sql: &str) -> Vec<Option<u64>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1, "{sql}");
    let batch = batches.iter().find(|b| b.num_rows() == 1).unwrap();
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            _ if c.is_null(0) => None,
            datafusion::arrow::datatypes::DataType::Int64 => Some(c.as_primitive::<Int64Type>().value(0) as u64),
            _ => Some(c.as_primitive::<Float64Type>().value(0).to_bits()),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn count_min_and_max_over_a_join_are_computed_in_the_operator() {
    let ctx = ctx();
    register(&ctx, "t", &vectors(3000, 2, 5), 2, Shape::FixedF32);
    register(&ctx, "q", &vectors(300, 2, 6), 2, Shape::ListF64);
    register(&ctx, "w", &vectors(400, 5, 7), 5, Shape::Columns);
    let inputs = [
        "sim_join(t, 0.02)",
        "sim_join(t, 0.02, 'pairs=unordered')",
        "sim_join(t, 0.02, 'include_self=true')",
        "sim_join(t, 0.02, 'include_self=true, pairs=unordered')",
        "sim_join(q, t, 0.03)",
        "sim_join(t, 0.05, 'metric=l1, index=brute_force')",
        "sim_join(w, 0.3, 'metric=linf, index=grid')",
        "sim_join(w, 0.02, 'metric=cosine')",
        "range_query(t, q, 0.05)",
        "range_query(t, '[0.5, 0.5]', 0.1)",
        // No pair: a count of 0, no smallest or largest distance.
        "sim_join(q, t, 0.0000001)",
    ];
    for from in inputs {
        let listed = distances(&ctx, from).await;
        let low = listed.iter().copied().min_by(f64::total_cmp).map(f64::to_bits);
        let high = listed.iter().copied().max_by(f64::total_cmp).map(f64::to_bits);
        let sql = format!("SELECT count(*), min(distance), max(distance) FROM {from}");
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        assert!(
            plan.contains("output=[count(*), min(distance), max(distance)], output_rows=one, pairs_listed=false"),
            "{plan}"
        );
        assert!(!plan.contains("mode=Partial") && !plan.contains("mode=Single"), "{plan}");
        assert_eq!(one_row(&ctx, &sql).await, vec![Some(listed.len() as u64), low, high], "{sql}");
        // Any subset, in any order, under any names.
        let sql = format!("SELECT max(distance) AS far, count(distance) AS n FROM {from}");
        assert_eq!(one_row(&ctx, &sql).await, vec![high, Some(listed.len() as u64)], "{sql}");
    }
    let metrics = crate::common::operator_metrics(&ctx, "SELECT count(*), max(distance) FROM sim_join(t, 0.02)").await;
    assert_eq!(metrics["output_rows"], 1, "{metrics:?}");

    // Other aggregates read the rows, with the same answers as before.
    let from = "sim_join(t, 0.02)";
    let listed = distances(&ctx, from).await;
    for sql in [
        format!("SELECT count(*), sum(distance) FROM {from}"),
        format!("SELECT count(DISTINCT left_id) FROM {from}"),
        format!("SELECT left_id, max(distance) FROM {from} GROUP BY left_id"),
        format!("SELECT count(*) FILTER (WHERE distance < 0.01) FROM {from}"),
        format!("SELECT min(distance + 1) FROM {from}"),
        "SELECT count(*), max(distance) FROM knn(t, q, 3)".to_string(),
    ] {
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        let reads_rows = plan.contains("mode=Partial") || plan.contains("mode=Single");
        assert!(reads_rows && !plan.contains("one row, no pair listed"), "{sql}: {plan}");
    }
    let sql = format!("SELECT count(*) FILTER (WHERE distance < 0.01), min(distance + 1) FROM {from}");
    let want_below = listed.iter().filter(|&&d| d < 0.01).count() as u64;
    let want_min = listed.iter().map(|d| d + 1.0).min_by(f64::total_cmp).map(f64::to_bits);
    assert_eq!(one_row(&ctx, &sql).await, vec![Some(want_below), want_min], "{sql}");
}

/// A count alone wants no distance, so the grid and the directory count the pairs their f32 filter
/// proves within the threshold without an exact check: the count still equals the rows listed,
/// on a lattice, whose pairs lie exactly at the thresholds by the thousand, and on random points;
/// self-joins ordered and unordered, two inputs, L2 and L2².
#[tokio::test(flavor = "multi_thread")]
async fn a_count_alone_equals_the_rows_listed_even_with_pairs_on_the_threshold() {
    let ctx = ctx();
    let lattice: Vec<Option<Vec<f64>>> = (0..1600).map(|i| Some(vec![(i % 40) as f64, (i / 40) as f64])).collect();
    register(&ctx, "g", &lattice, 2, Shape::FixedF32);
    register(&ctx, "t", &vectors(3000, 2, 5), 2, Shape::FixedF32);
    register(&ctx, "q", &vectors(300, 2, 6), 2, Shape::ListF64);
    register(&ctx, "w", &vectors(2000, 4, 7), 4, Shape::Columns);
    let inputs = [
        "sim_join(g, 1.0)",
        "sim_join(g, 2.0, 'pairs=unordered')",
        "sim_join(g, 1.4142135623730951, 'index=grid')",
        "sim_join(g, 5.0, 'index=directory')",
        "sim_join(g, 4.0, 'metric=l2sq')",
        "sim_join(t, 0.02)",
        "sim_join(t, 0.02, 'index=directory, pairs=unordered')",
        "sim_join(q, t, 0.03)",
        "sim_join(q, t, 0.03, 'index=directory')",
        "sim_join(w, 0.1, 'index=grid')",
        "range_query(t, q, 0.05)",
    ];
    for from in inputs {
        let listed = distances(&ctx, from).await.len() as u64;
        assert!(listed > 0, "{from}");
        let sql = format!("SELECT count(*) FROM {from}");
        assert_eq!(one_row(&ctx, &sql).await, vec![Some(listed)], "{sql}");
    }
}
