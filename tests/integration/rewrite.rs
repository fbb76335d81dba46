//! Joins on a distance bound planned as `sim_join` (functions/rewrite.rs): every rewritten shape
//! returns what the same SQL returns with the rule switched off (`SET simjoin.rewrite_joins =
//! false`, DataFusion's nested-loop join), and shapes the rule cannot prove equal stay as they are.

use crate::common::{Row, Shape, check, ctx, explain, register, rows, threshold, vectors};

/// `sql`'s rows with the rule switched off, then checked with it on; returns the plan text with it on.
async fn same_with_and_without_rule(ctx: &datafusion::prelude::SessionContext, sql: &str) -> (Vec<Row>, String) {
    ctx.sql("SET simjoin.rewrite_joins = false").await.unwrap();
    let want = rows(ctx, sql).await;
    let plain = explain(ctx, &format!("EXPLAIN {sql}")).await;
    ctx.sql("SET simjoin.rewrite_joins = true").await.unwrap();
    check(ctx, sql, &want).await;
    assert!(!plain.contains("SimilarityExec"), "{plain}");
    (want, explain(ctx, &format!("EXPLAIN {sql}")).await)
}

/// Vectors with a NULL row, a zero vector, NaN and +∞ mixed in: the rows the operator's contract
/// skips, whose scalar distances SQL's `<=` may still keep (a cosine distance of a zero vector,
/// and L2's ∞ − ∞, are NaNs with the sign bit set, which SQL's total order puts first; L∞'s max
/// ignores a NaN coordinate).
fn awkward(n: usize, dim: usize, seed: u64) -> Vec<Option<Vec<f64>>> {
    let mut v = vectors(n, dim, seed);
    v[3] = None;
    v[10] = Some(vec![0.0; dim]);
    v[17].as_mut().unwrap()[1] = f64::NAN;
    v[20].as_mut().unwrap()[0] = f64::INFINITY;
    v
}

#[tokio::test]
async fn every_metric_either_order_and_strictness() {
    let ctx = ctx();
    let (a, b) = (awkward(300, 4, 1), awkward(250, 4, 2));
    register(&ctx, "a", &a, 4, Shape::FixedF32);
    register(&ctx, "b", &b, 4, Shape::ListF64);
    for (function, metric) in [
        ("l2_distance", "l2"),
        ("array_distance", "l2"),
        ("l2sq_distance", "l2sq"),
        ("cosine_distance", "cosine"),
        ("array_cosine_distance", "cosine"),
        ("l1_distance", "l1"),
        ("linf_distance", "linf"),
    ] {
        let eps = threshold(metric, &a, 0.02);
        for condition in [
            format!("{function}(a.vector, b.vector) <= {eps}"),
            format!("{function}(b.vector, a.vector) < {eps}"),
            format!("{eps} >= {function}(a.vector, b.vector)"),
        ] {
            let sql = format!(
                "SELECT a.id, b.id, {function}(a.vector, b.vector) FROM a JOIN b ON {condition} AND a.id % 3 <> b.id % 5"
            );
            let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
            assert!(want.len() > 100, "{sql}: {} rows", want.len());
            if metric == "cosine" {
                // The zero vector (row 10 of each side) is kept with every row by SQL's `<=`.
                assert!(want.iter().filter(|r| r.0 == 10).count() > 150, "{sql}");
            }
            assert!(plan.contains("SimilarityExec: op=sim_join, eps="), "{sql}\n{plan}");
            assert!(plan.contains(&format!("metric={metric}, self_join=false")), "{sql}\n{plan}");
        }
    }
}

#[tokio::test]
async fn dot_products_bounded_from_below_are_inner_product_joins() {
    let ctx = ctx();
    let (a, b) = (awkward(300, 4, 5), awkward(250, 4, 6));
    register(&ctx, "a", &a, 4, Shape::FixedF32);
    register(&ctx, "b", &b, 4, Shape::ListF64);
    for condition in [
        "inner_product(a.vector, b.vector) >= 1.3",
        "1.3 < array_inner_product(b.vector, a.vector)",
        "array_negative_inner_product(a.vector, b.vector) <= -1.3",
    ] {
        let sql = format!("SELECT a.id, b.id, inner_product(a.vector, b.vector) FROM a JOIN b ON {condition}");
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(want.len() > 50, "{sql}: {} rows", want.len());
        assert!(plan.contains("metric=inner_product"), "{sql}\n{plan}");
    }
}

#[tokio::test]
async fn comma_joins_self_joins_limits_and_offsets() {
    let ctx = ctx();
    let t = awkward(400, 3, 3);
    register(&ctx, "t", &t, 3, Shape::FixedF32);
    let eps = threshold("l2", &t, 0.01);
    for sql in [
        format!(
            "SELECT x.id, y.id, l2_distance(x.vector, y.vector) FROM t x, t y WHERE l2_distance(x.vector, y.vector) <= {eps}"
        ),
        format!(
            "SELECT x.id, y.id, l2_distance(x.vector, y.vector) FROM t x JOIN t y ON l2_distance(x.vector, y.vector) <= {eps} AND x.id < y.id"
        ),
        format!(
            "SELECT x.id, y.id, l2_distance(x.vector, y.vector) FROM t x JOIN t y ON l2_distance(x.vector, y.vector) <= {eps} \
             AND x.id <> y.id ORDER BY x.id, y.id LIMIT 40 OFFSET 7"
        ),
    ] {
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(want.len() >= 40, "{sql}: {} rows", want.len());
        assert!(plan.contains("SimilarityExec"), "{sql}\n{plan}");
    }
}

#[tokio::test]
async fn text_joins_on_levenshtein() {
    let ctx = ctx();
    let words = ["colour", "color", "flavour", "flavor", "kolor", "cooler", "dolour", "", "c"];
    let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![
        (
            "id",
            std::sync::Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(0..words.len() as i64 + 1))
                as datafusion::arrow::array::ArrayRef,
        ),
        (
            "w",
            std::sync::Arc::new(datafusion::arrow::array::StringArray::from(
                words.iter().map(|w| Some(*w)).chain([None]).collect::<Vec<_>>(),
            )),
        ),
    ])
    .unwrap();
    ctx.register_batch("words", batch).unwrap();
    for condition in ["levenshtein(a.w, b.w) <= 2", "levenshtein(b.w, a.w) < 2", "3 > levenshtein(a.w, b.w)"] {
        let sql = format!(
            "SELECT a.id, b.id, CAST(levenshtein(a.w, b.w) AS DOUBLE) FROM words a JOIN words b ON {condition}"
        );
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(want.len() > 10, "{sql}");
        assert!(plan.contains("metric=levenshtein"), "{sql}\n{plan}");
    }
}

#[tokio::test]
async fn shapes_the_rule_cannot_prove_equal_stay_as_planned() {
    let ctx = ctx();
    let (a, b) = (vectors(100, 3, 4), vectors(100, 3, 5));
    register(&ctx, "a", &a, 3, Shape::FixedF32);
    register(&ctx, "b", &b, 3, Shape::ListF64);
    for sql in [
        // An equality key: a hash join with a filter.
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON a.id = b.id AND l2_distance(a.vector, b.vector) <= 0.5",
        // A dot product bounded from above (a distance from below).
        "SELECT a.id, b.id, inner_product(a.vector, b.vector) FROM a JOIN b ON inner_product(a.vector, b.vector) <= 0.9",
        // A disjunction, a bound from below, an outer join, a narrowing cast.
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON l2_distance(a.vector, b.vector) <= 0.1 OR a.id = 3",
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON l2_distance(a.vector, b.vector) >= 1.2",
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a LEFT JOIN b ON l2_distance(a.vector, b.vector) <= 0.1",
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON l2_distance(CAST(a.vector AS FLOAT[]), b.vector) <= 0.2",
        // A negative threshold: no pair, as DataFusion plans it.
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON l2_distance(a.vector, b.vector) <= -1",
    ] {
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        assert!(!plan.contains("SimilarityExec"), "{sql}\n{plan}");
        let got = ctx.sql(sql).await.unwrap().collect().await;
        assert!(got.is_ok(), "{sql}: {got:?}");
    }
}
