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
        // Keys compared as NULL-safe equality.
        "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM a JOIN b ON (a.id IS NOT DISTINCT FROM b.id) AND l2_distance(a.vector, b.vector) <= 0.5",
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

/// The kNN join `SELECT … FROM q, b` ranked per query: as the window above it, `QUALIFY`, or a
/// subquery with `WHERE rn …`. Rows are (query id, row number, distance): rows tied at the k-th
/// distance (every base row of a NULL query) are SQL's to choose, their numbers and distances not.
fn knn_join(distance: &str, order: &str, partition: &str, bound: &str, filter: &str) -> [String; 2] {
    let window = format!("ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {distance} {order})");
    [
        format!(
            "SELECT q.id, CAST({window} AS BIGINT), coalesce({distance}, -1.0) FROM q, b {filter} QUALIFY {window} {bound}"
        ),
        format!(
            "SELECT qid, CAST(rn AS BIGINT), coalesce(d, -1.0) FROM (SELECT q.id AS qid, {distance} AS d, {window} AS rn \
             FROM b CROSS JOIN q {filter}) WHERE rn {bound}"
        ),
    ]
}

#[tokio::test]
async fn row_number_per_query_is_a_knn_join() {
    let ctx = ctx();
    register(&ctx, "q", &awkward(30, 4, 11), 4, Shape::ListF64);
    register(&ctx, "b", &awkward(400, 4, 12), 4, Shape::FixedF32);
    for (distance, order, partition, bound, filter) in [
        ("l2_distance(q.vector, b.vector)", "", "q.id", "<= 3", ""),
        ("array_distance(b.vector, q.vector)", "ASC", "q.id", "< 6", ""),
        ("l1_distance(q.vector, b.vector)", "", "q.id", "= 1", ""),
        ("linf_distance(q.vector, b.vector)", "", "q.id", "BETWEEN 2 AND 5", ""),
        // The zero query's cosine distances are NaNs with the sign bit set, which come first.
        ("cosine_distance(q.vector, b.vector)", "", "q.id", "<= 4", ""),
        ("inner_product(q.vector, b.vector)", "DESC", "q.id", "<= 4", ""),
        // The k nearest among the base rows a filter keeps, fewer than k for some.
        ("l2_distance(q.vector, b.vector)", "", "q.id", "<= 7", "WHERE b.id % 3 = 0 AND q.id < 20"),
        ("l2_distance(q.vector, b.vector)", "", "q.id", "<= 9", "WHERE b.id < 5"),
        // Partitions of several queries (k nearest pairs of each), and one of all.
        ("l2sq_distance(q.vector, b.vector)", "", "q.id % 4", "<= 5", ""),
        ("l2_distance(q.vector, b.vector)", "", "q.id % 4, q.id % 3", "<= 2", ""),
    ] {
        for sql in knn_join(distance, order, partition, bound, filter) {
            let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
            assert!(plan.contains("SimilarityExec: op=knn"), "{sql}\n{plan}");
            assert!(!want.is_empty(), "{sql}");
        }
    }
    // No partition: the k nearest pairs of the whole cross join.
    let sql = "SELECT q.id, b.id, l2_distance(q.vector, b.vector) AS d FROM q, b \
               QUALIFY ROW_NUMBER() OVER (ORDER BY l2_distance(q.vector, b.vector)) <= 8";
    let (want, plan) = same_with_and_without_rule(&ctx, sql).await;
    assert!(plan.contains("SimilarityExec: op=knn, k=8"), "{plan}");
    assert_eq!(want.len(), 8);
    // Without ties the base rows themselves are the same.
    register(&ctx, "q", &vectors(25, 5, 13), 5, Shape::FixedF32);
    register(&ctx, "b", &vectors(300, 5, 14), 5, Shape::ListF64);
    let sql = "SELECT q.id, b.id, l2_distance(q.vector, b.vector) FROM q JOIN b ON true \
               QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY l2_distance(q.vector, b.vector)) <= 4";
    assert_eq!(same_with_and_without_rule(&ctx, sql).await.0.len(), 100);
}

/// Vectors of few distinct coordinates (multiples of ½ in [0, 2]), so that many base rows tie at
/// each distance, with [`awkward`]'s rows the operator skips.
fn tied(n: usize, dim: usize, seed: u64) -> Vec<Option<Vec<f64>>> {
    let mut v: Vec<_> = vectors(n, dim, seed)
        .into_iter()
        .map(|v| v.map(|v| v.iter().map(|x| (x * 4.0).floor() / 2.0).collect()))
        .collect();
    v[3] = None;
    v[10] = Some(vec![0.0; dim]);
    v[17].as_mut().unwrap()[1] = f64::NAN;
    v
}

#[tokio::test]
async fn tie_broken_rank_and_dense_rank_windows_are_knn_joins_with_their_ties() {
    let ctx = ctx();
    register(&ctx, "q", &tied(24, 3, 41), 3, Shape::ListF64);
    register(&ctx, "b", &tied(300, 3, 42), 3, Shape::FixedF32);
    let d = "l2_distance(q.vector, b.vector)";
    for (window, ties) in [
        // A tie-break of the SQL's own: every row it can choose is a candidate.
        (format!("ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d}, b.id)"), "ties=kth"),
        (format!("ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d} ASC, b.id DESC)"), "ties=kth"),
        (format!("RANK() OVER (PARTITION BY q.id ORDER BY {d})"), "ties=kth"),
        (format!("RANK() OVER (PARTITION BY q.id ORDER BY {d}, b.id % 3)"), "ties=kth"),
        (format!("DENSE_RANK() OVER (PARTITION BY q.id ORDER BY {d})"), "ties=distinct_distances"),
        (format!("DENSE_RANK() OVER (PARTITION BY q.id ORDER BY {d}, b.id % 2 DESC)"), "ties=distinct_distances"),
        // Partitions of several queries; a dot product, largest first.
        (format!("RANK() OVER (PARTITION BY q.id % 5 ORDER BY l1_distance(q.vector, b.vector), b.id)"), "ties=kth"),
        (
            "DENSE_RANK() OVER (PARTITION BY q.id ORDER BY inner_product(q.vector, b.vector) DESC)".to_string(),
            "ties=distinct",
        ),
    ] {
        for bound in ["<= 1", "<= 4", "< 9"] {
            for sql in [
                format!(
                    "SELECT q.id, b.id, coalesce({d}, -1.0), CAST({window} AS BIGINT) FROM q, b QUALIFY {window} {bound}"
                ),
                format!(
                    "SELECT qid, bid, coalesce(dist, -1.0), CAST(r AS BIGINT) FROM (SELECT q.id AS qid, b.id AS bid, {d} AS dist, \
                     {window} AS r FROM q CROSS JOIN b) WHERE r {bound}"
                ),
            ] {
                let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
                assert!(plan.contains("SimilarityExec: op=knn") && plan.contains(ties), "{sql}\n{plan}");
                assert!(!want.is_empty(), "{sql}");
            }
        }
    }
    // ORDER BY the distance then another key, LIMIT: every row at the limit's distance is a candidate.
    let q = "[1.0, 0.5, 1.5]";
    for sql in [
        format!("SELECT id, id AS same_id, l2_distance(vector, {q}) AS d FROM b ORDER BY d, id LIMIT 7"),
        format!("SELECT id, id AS same_id, l1_distance(vector, {q}) AS d FROM b ORDER BY d, id DESC LIMIT 5 OFFSET 3"),
    ] {
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(plan.contains("ties=kth") && want.len() >= 5, "{sql}\n{plan}");
    }
}

#[tokio::test]
async fn other_windows_stay_as_planned() {
    let ctx = ctx();
    register(&ctx, "q", &vectors(20, 3, 15), 3, Shape::FixedF32);
    register(&ctx, "b", &vectors(60, 3, 16), 3, Shape::FixedF32);
    let d = "l2_distance(q.vector, b.vector)";
    for window in [
        // A partition key of the base side.
        format!("ROW_NUMBER() OVER (PARTITION BY q.id, b.id % 2 ORDER BY {d})"),
        // Farthest first.
        format!("ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d} DESC)"),
        format!("RANK() OVER (PARTITION BY q.id ORDER BY b.id, {d})"),
    ] {
        let sql = format!("SELECT q.id, b.id, {d} FROM q, b QUALIFY {window} <= 3");
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        assert!(!plan.contains("SimilarityExec"), "{sql}\n{plan}");
    }
    // A condition between the two inputs; a bound from below only.
    for sql in [
        format!(
            "SELECT q.id, b.id, {d} FROM q, b WHERE q.id <> b.id QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d}) <= 3"
        ),
        format!("SELECT q.id, b.id, {d} FROM q, b QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d}) > 3"),
    ] {
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        assert!(!plan.contains("SimilarityExec"), "{sql}\n{plan}");
    }
}

/// Tables `ak` and `bk`: `a` and `b` with keys `k` (Int64 in `ak`, Int32 in `bk`; NULL for some
/// rows) and `k2` (text).
async fn register_keyed(ctx: &datafusion::prelude::SessionContext) {
    for sql in [
        "CREATE OR REPLACE TABLE ak AS SELECT id, vector, CASE WHEN id % 17 = 0 THEN NULL ELSE id % 7 END AS k, \
         CAST(id % 3 AS VARCHAR) AS k2 FROM a",
        "CREATE OR REPLACE TABLE bk AS SELECT id, vector, CAST(CASE WHEN id % 13 = 0 THEN NULL ELSE id % 5 END AS INT) AS k, \
         CAST(id % 2 AS VARCHAR) AS k2 FROM b",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
}

#[tokio::test]
async fn equality_keys_and_a_distance_bound_are_a_join_within_keys() {
    let ctx = ctx();
    let (a, b) = (awkward(300, 4, 21), awkward(250, 4, 22));
    register(&ctx, "a", &a, 4, Shape::FixedF32);
    register(&ctx, "b", &b, 4, Shape::ListF64);
    register_keyed(&ctx).await;
    for (function, metric) in [("l2_distance", "l2"), ("cosine_distance", "cosine"), ("linf_distance", "linf")] {
        let t = threshold(metric, &a, 0.2);
        for sql in [
            format!(
                "SELECT a.id, b.id, {function}(a.vector, b.vector) FROM ak a JOIN bk b ON a.k = b.k AND {function}(a.vector, b.vector) <= {t}"
            ),
            // Either order, two keys, another condition kept as a filter, a self-join.
            format!(
                "SELECT a.id, b.id, {function}(b.vector, a.vector) FROM bk b JOIN ak a ON b.k2 = a.k2 AND a.k = b.k AND {function}(b.vector, a.vector) < {t} AND a.id < b.id"
            ),
            format!(
                "SELECT a.id, b.id, {function}(a.vector, b.vector) FROM ak a, ak b WHERE a.k = b.k AND {function}(a.vector, b.vector) <= {t}"
            ),
            // A key computed from the rows.
            format!(
                "SELECT a.id, b.id, {function}(a.vector, b.vector) FROM ak a JOIN bk b ON a.id % 4 = b.id % 4 AND {function}(a.vector, b.vector) <= {t}"
            ),
        ] {
            let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
            assert!(plan.contains("op=sim_join") && plan.contains("keys=["), "{sql}\n{plan}");
            assert!(want.len() >= 20, "{sql}: {} rows", want.len());
        }
    }
    // Text within keys, a NULL string and the empty string among them.
    register_words(&ctx, true);
    ctx.sql("CREATE TABLE wk AS SELECT id, w, id % 3 AS g FROM words").await.unwrap().collect().await.unwrap();
    let sql = "SELECT a.id, b.id, CAST(levenshtein(a.w, b.w) AS DOUBLE) FROM wk a JOIN wk b ON a.g = b.g AND levenshtein(a.w, b.w) <= 2";
    let (want, plan) = same_with_and_without_rule(&ctx, sql).await;
    assert!(plan.contains("metric=levenshtein") && plan.contains("keys=[simjoin_key_0]"), "{plan}");
    assert!(want.len() > 10, "{} rows", want.len());
}

#[tokio::test]
async fn the_keys_option_joins_within_equal_keys() {
    let ctx = ctx();
    let (a, b) = (vectors(400, 3, 23), vectors(300, 3, 24));
    register(&ctx, "a", &a, 3, Shape::FixedF32);
    register(&ctx, "b", &b, 3, Shape::FixedF32);
    register_keyed(&ctx).await;
    let t = threshold("l2", &a, 0.1);
    ctx.sql("SET simjoin.rewrite_joins = false").await.unwrap();
    for (call, plain) in [
        (
            format!("SELECT left_id, right_id, distance FROM sim_join(ak, bk, {t}, 'keys=k')"),
            format!(
                "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM ak a JOIN bk b ON a.k = b.k AND l2_distance(a.vector, b.vector) <= {t}"
            ),
        ),
        (
            format!(
                "SELECT left_id, right_id, distance FROM sim_join(ak, {t}, 'keys=k k2, pairs=unordered, device=cpu')"
            ),
            format!(
                "SELECT a.id, b.id, l2_distance(a.vector, b.vector) FROM ak a JOIN ak b ON a.k = b.k AND a.k2 = b.k2 AND a.id < b.id AND l2_distance(a.vector, b.vector) <= {t}"
            ),
        ),
    ] {
        let want = rows(&ctx, &plain).await;
        assert!(want.len() >= 20, "{plain}: {} rows", want.len());
        check(&ctx, &call, &want).await;
        let plan = explain(&ctx, &format!("EXPLAIN {call}")).await;
        assert!(plan.contains("keys=[k"), "{plan}");
    }
    let got = crate::common::error(&ctx, &format!("SELECT * FROM sim_join(ak, bk, {t}, 'keys=zip')")).await;
    assert!(got.contains("sim_join: option keys=zip: argument 'left' has no column 'zip'"), "{got}");
}

#[tokio::test]
async fn knn_joins_and_range_queries_within_equal_keys() {
    let ctx = ctx();
    register(&ctx, "a", &awkward(40, 4, 31), 4, Shape::ListF64);
    register(&ctx, "b", &awkward(300, 4, 32), 4, Shape::FixedF32);
    register_keyed(&ctx).await;
    let d = "l2_distance(q.vector, b.vector)";
    let window = format!("ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d})");
    for sql in [
        format!(
            "SELECT q.id, CAST({window} AS BIGINT), coalesce({d}, -1.0) FROM ak q JOIN bk b ON q.k = b.k QUALIFY {window} <= 4"
        ),
        // More than some groups hold; two keys; the keys written in WHERE.
        format!(
            "SELECT q.id, CAST({window} AS BIGINT), coalesce({d}, -1.0) FROM ak q JOIN bk b ON q.k = b.k AND q.k2 = b.k2 QUALIFY {window} <= 30"
        ),
        format!(
            "SELECT qid, CAST(rn AS BIGINT), coalesce(dist, -1.0) FROM (SELECT q.id AS qid, {d} AS dist, {window} AS rn \
             FROM bk b, ak q WHERE b.k = q.k) WHERE rn <= 3"
        ),
    ] {
        let (want, plan) = same_with_and_without_rule(&ctx, &sql).await;
        assert!(plan.contains("op=knn") && plan.contains("keys=[simjoin_key_0"), "{sql}\n{plan}");
        assert!(!want.is_empty(), "{sql}");
    }

    // The table functions' option, against the same SQL as DataFusion plans it (no ties here).
    register(&ctx, "a", &vectors(60, 3, 33), 3, Shape::FixedF32);
    register(&ctx, "b", &vectors(400, 3, 34), 3, Shape::ListF64);
    register_keyed(&ctx).await;
    let r = threshold("l2", &vectors(400, 3, 34), 0.1);
    ctx.sql("SET simjoin.rewrite_joins = false").await.unwrap();
    for (call, plain) in [
        (
            "SELECT query_id, base_id, distance, rank FROM knn(bk, ak, 3, 'keys=k')".to_string(),
            format!(
                "SELECT q.id, b.id, {d}, CAST({window} AS BIGINT) FROM ak q JOIN bk b ON q.k = b.k QUALIFY {window} <= 3"
            ),
        ),
        (
            format!("SELECT query_id, base_id, distance FROM range_query(bk, ak, {r}, 'keys=k k2')"),
            format!("SELECT q.id, b.id, {d} FROM ak q JOIN bk b ON q.k = b.k AND q.k2 = b.k2 AND {d} <= {r}"),
        ),
    ] {
        let want = rows(&ctx, &plain).await;
        assert!(want.len() >= 20, "{plain}: {} rows", want.len());
        check(&ctx, &call, &want).await;
    }
    let got = crate::common::error(&ctx, "SELECT * FROM knn(bk, [0.5, 0.5, 0.5], 3, 'keys=k')").await;
    assert!(got.contains("knn: option keys=k: argument 'query' has no column 'k'"), "{got}");
}
