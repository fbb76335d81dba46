//! Joins on a distance bound planned as `sim_join` (functions/rewrite.rs): every rewritten shape
//! returns what the same SQL returns with the rule switched off (`SET simjoin.rewrite_joins =
//! false`, DataFusion's nested-loop join), and shapes the rule cannot prove equal stay as they are.

use crate::common::{Row, Shape, check, ctx, explain, register, rows, threshold, vectors};

/// `sql`'s rows with the rule switched off, then checked with it on (joins, and filters and sorts
/// on one table); returns the plan text with it on.
async fn same_with_and_without_rule(ctx: &datafusion::prelude::SessionContext, sql: &str) -> (Vec<Row>, String) {
    ctx.sql("SET simjoin.rewrite_joins = false").await.unwrap();
    ctx.sql("SET simjoin.rewrite_scans = false").await.unwrap();
    let want = rows(ctx, sql).await;
    let plain = explain(ctx, &format!("EXPLAIN {sql}")).await;
    ctx.sql("SET simjoin.rewrite_joins = true").await.unwrap();
    ctx.sql("SET simjoin.rewrite_scans = true").await.unwrap();
    check(ctx, sql, &want).await;
    assert!(!plain.contains("SimilarityExec"), "{plain}");
    let plan = explain(ctx, &format!("EXPLAIN {sql}")).await;
    // Each operator once: later optimizer passes must not wrap a rewritten plan again.
    assert_eq!(plan.matches("SimilarityExec").count(), 1, "{plan}");
    (want, plan)
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

/// Table `words` (`id`, `w`): a few near spellings, the empty string, and a NULL last when `null`.
fn register_words(ctx: &datafusion::prelude::SessionContext, null: bool) {
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    let mut words: Vec<Option<&str>> =
        ["colour", "color", "flavour", "flavor", "kolor", "cooler", "dolour", "", "c"].map(Some).to_vec();
    if null {
        words.push(None);
    }
    let ids: ArrayRef = std::sync::Arc::new(Int64Array::from_iter_values(0..words.len() as i64));
    let batch = RecordBatch::try_from_iter(vec![("id", ids), ("w", std::sync::Arc::new(StringArray::from(words)))]);
    ctx.register_batch("words", batch.unwrap()).unwrap();
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
    register_words(&ctx, true);
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

#[tokio::test]
async fn where_distance_to_a_constant_is_a_range_query() {
    let ctx = ctx();
    let t = awkward(500, 3, 7);
    register(&ctx, "t", &t, 3, Shape::FixedF32);
    let q = "[0.5, 0.25, 0.75]";
    for (function, metric) in
        [("l2_distance", "l2"), ("array_distance", "l2"), ("cosine_distance", "cosine"), ("linf_distance", "linf")]
    {
        let r = if metric == "cosine" { 0.02 } else { 0.3 };
        for condition in
            [format!("{function}(vector, {q}) <= {r}"), format!("{r} > {function}({q}, vector) AND id % 2 = 0")]
        {
            let sql = format!("SELECT id, id AS same_id, {function}(vector, {q}) FROM t WHERE {condition}");
            let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
            assert!(want.len() > 5, "{sql}: {} rows", want.len());
            assert!(plan.contains("SimilarityExec: op=range_query"), "{sql}\n{plan}");
        }
    }
    // A vector written as text.
    let sql = "SELECT id, id AS same_id, l2_distance(vector, '[0.5, 0.25, 0.75]') FROM t WHERE l2_distance(vector, '[0.5, 0.25, 0.75]') < 0.3";
    assert!(same_with_and_without_rule(&ctx, sql).await.1.contains("op=range_query"));
}

#[tokio::test]
async fn order_by_distance_limit_is_knn() {
    let ctx = ctx();
    let t = awkward(500, 3, 8);
    register(&ctx, "t", &t, 3, Shape::ListF64);
    let q = "[0.5, 0.25, 0.75]";
    for sql in [
        format!("SELECT id, id AS same_id, l2_distance(vector, {q}) FROM t ORDER BY l2_distance(vector, {q}) LIMIT 7"),
        format!(
            "SELECT id, id AS same_id, d FROM (SELECT id, l1_distance(vector, {q}) AS d FROM t) ORDER BY d LIMIT 5 OFFSET 3"
        ),
        format!("SELECT id, id AS same_id, array_distance(vector, {q}) AS d FROM t ORDER BY d ASC LIMIT 12"),
        format!("SELECT id, id AS same_id, inner_product(vector, {q}) AS s FROM t ORDER BY s DESC LIMIT 6"),
        // The zero vector's cosine distance is a NaN that SQL's order puts first.
        format!(
            "SELECT id, id AS same_id, cosine_distance(vector, {q}) FROM t ORDER BY cosine_distance(vector, {q}) LIMIT 4"
        ),
    ] {
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(want.len() >= 4, "{sql}: {} rows", want.len());
        assert!(plan.contains("SimilarityExec: op=knn"), "{sql}\n{plan}");
    }
    // Fewer usable rows than the limit: SQL fills up with the NULL and NaN rows.
    let small = awkward(25, 3, 9);
    register(&ctx, "s", &small, 3, Shape::FixedF32);
    let sql =
        format!("SELECT id, id AS same_id, l2_distance(vector, {q}) FROM s ORDER BY l2_distance(vector, {q}) LIMIT 40");
    let (want, _) = same_with_and_without_rule(&ctx, &sql).await;
    assert_eq!(want.len(), 25);
}

#[tokio::test]
async fn text_filters_and_orders_on_levenshtein() {
    let ctx = ctx();
    register_words(&ctx, false);
    let sql = "SELECT id, id AS same_id, CAST(levenshtein(w, 'colour') AS DOUBLE) FROM words WHERE levenshtein(w, 'colour') <= 2";
    let (want, plan) = same_with_and_without_rule(&ctx, sql).await;
    assert_eq!(want.len(), 4, "colour, color, kolor, dolour");
    assert!(plan.contains("op=range_query"), "{plan}");
    let sql = "SELECT id, id AS same_id, CAST(d AS DOUBLE) FROM (SELECT id, levenshtein(w, 'flavor') AS d FROM words) ORDER BY d LIMIT 2";
    let (want, plan) = same_with_and_without_rule(&ctx, sql).await;
    assert_eq!(want.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 3]);
    assert!(plan.contains("op=knn"), "{plan}");
}
