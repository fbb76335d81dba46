//! `metric=levenshtein` over text columns: every function and option against DataFusion's own
//! `levenshtein()` evaluated by plain SQL over the same tables, and the errors of bad input.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;

use crate::common::{check, ctx, error, explain, rows};

/// Seeded words (`simjoin::datagen::words`), the long ones of up to 150 characters.
pub fn words(n: usize, seed: u64) -> Vec<Option<String>> {
    simjoin::datagen::words(n, 150, seed)
}

/// Registers `name` with `id` (0..n, the scan order) and text column `w` of `data_type`, over
/// three partitions.
fn register_text(ctx: &SessionContext, name: &str, words: &[Option<String>], data_type: DataType) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("w", data_type.clone(), true)]));
    let part = words.len().div_ceil(3).max(1);
    let partitions: Vec<Vec<RecordBatch>> = words
        .chunks(part)
        .enumerate()
        .map(|(p, chunk)| {
            let first = (p * part) as i64;
            let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + chunk.len() as i64));
            let column: ArrayRef = match data_type {
                DataType::Utf8 => Arc::new(StringArray::from(chunk.to_vec())),
                DataType::LargeUtf8 => Arc::new(LargeStringArray::from(chunk.to_vec())),
                _ => Arc::new(StringViewArray::from(chunk.to_vec())),
            };
            vec![RecordBatch::try_new(schema.clone(), vec![ids, column]).unwrap()]
        })
        .collect();
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, partitions).unwrap())).unwrap();
}

/// Every pair of `a` × `b` within `tau` by DataFusion's `levenshtein()`, with `extra` as a further
/// condition on the ids.
fn oracle_join(a: &str, b: &str, tau: usize, extra: &str) -> String {
    format!(
        "SELECT x.id, y.id, CAST(levenshtein(x.w, y.w) AS DOUBLE) FROM {a} x CROSS JOIN {b} y \
         WHERE levenshtein(x.w, y.w) <= {tau} {extra}"
    )
}

#[tokio::test]
async fn self_joins_equal_sql_levenshtein() {
    let ctx = ctx();
    register_text(&ctx, "t", &words(420, 11), DataType::Utf8);
    for tau in [0, 1, 2, 3, 6] {
        for index in ["auto", "brute_force", "list_of_clusters"] {
            let call = |more: &str| {
                format!(
                    "SELECT left_id, right_id, distance FROM sim_join(t, {tau}, 'metric=levenshtein, index={index}{more}')"
                )
            };
            let want = rows(&ctx, &oracle_join("t", "t", tau, "AND x.id <> y.id")).await;
            assert!(want.len() > 100, "tau {tau}: only {} pairs", want.len());
            check(&ctx, &call(""), &want).await;
            let want = rows(&ctx, &oracle_join("t", "t", tau, "AND x.id < y.id")).await;
            check(&ctx, &call(", pairs=unordered"), &want).await;
            let want = rows(&ctx, &oracle_join("t", "t", tau, "AND x.id <= y.id")).await;
            check(&ctx, &call(", pairs=unordered, include_self=true"), &want).await;
        }
    }
}

#[tokio::test]
async fn joins_and_range_queries_of_two_tables_in_every_string_type() {
    let ctx = ctx();
    let (left, right) = (words(300, 21), words(350, 22));
    register_text(&ctx, "a", &left, DataType::LargeUtf8);
    register_text(&ctx, "b", &right, DataType::Utf8View);
    register_text(&ctx, "a8", &left, DataType::Utf8);
    register_text(&ctx, "b8", &right, DataType::Utf8);
    for tau in [0, 1, 2, 4] {
        let want = rows(&ctx, &oracle_join("a8", "b8", tau, "")).await;
        for index in ["auto", "list_of_clusters"] {
            let sql = format!(
                "SELECT left_id, right_id, distance FROM sim_join(a, b, {tau}, 'metric=levenshtein, index={index}')"
            );
            check(&ctx, &sql, &want).await;
        }
        // range_query(base, query, r): `a` searched for the strings of `b`.
        let want = rows(&ctx, &oracle_join("b8", "a8", tau, "")).await;
        let sql = format!("SELECT query_id, base_id, distance FROM range_query(a, b, {tau}, 'metric=levenshtein')");
        check(&ctx, &sql, &want).await;
    }
}

#[tokio::test]
async fn knn_equals_sql_ranking_with_ties_by_scan_order() {
    let ctx = ctx();
    register_text(&ctx, "base", &words(400, 31), DataType::Utf8);
    register_text(&ctx, "queries", &words(60, 32), DataType::Utf8);
    for k in [1, 4, 25, 1000] {
        let want = rows(
            &ctx,
            &format!(
                "SELECT qid, bid, d, CAST(rk AS BIGINT) FROM (SELECT q.id AS qid, b.id AS bid, \
                 CAST(levenshtein(q.w, b.w) AS DOUBLE) AS d, ROW_NUMBER() OVER (PARTITION BY q.id \
                 ORDER BY levenshtein(q.w, b.w), b.id) AS rk FROM queries q CROSS JOIN base b \
                 WHERE q.w IS NOT NULL AND b.w IS NOT NULL) WHERE rk <= {k}"
            ),
        )
        .await;
        for index in ["auto", "list_of_clusters"] {
            let sql = format!(
                "SELECT query_id, base_id, distance, rank FROM knn(base, queries, {k}, 'metric=levenshtein, index={index}')"
            );
            check(&ctx, &sql, &want).await;
        }
    }
}

#[tokio::test]
async fn literal_query_strings_are_arrays() {
    let ctx = ctx();
    let data = ["colour", "color", "flavour", "flavor", "kolor", "cooler", "dolour"];
    let words: Vec<Option<String>> = data.iter().map(|w| Some(w.to_string())).collect();
    register_text(&ctx, "w", &words, DataType::Utf8);
    let got = ctx
        .sql("SELECT query_text, base_w, distance, rank FROM knn(w, ['colour'], 3, 'metric=levenshtein') ORDER BY rank")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&got).unwrap().to_string();
    assert!(text.contains("| colour     | colour | 0.0      | 1    |"), "{text}");
    assert!(text.contains("| colour     | color  | 1.0      | 2    |"), "{text}");
    assert!(text.contains("| colour     | dolour | 1.0      | 3    |"), "{text}");
    // Two query strings, and a range query.
    let sql = "SELECT query_text, base_id, distance FROM range_query(w, ['color', 'flavor'], 1, 'metric=levenshtein')";
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        batches.iter().map(|b| b.num_rows()).sum::<usize>(),
        5,
        "color: color, colour, kolor; flavor: flavor, flavour"
    );
}

#[tokio::test]
async fn explain_names_the_text_filter() {
    let ctx = ctx();
    register_text(&ctx, "t", &words(50, 41), DataType::Utf8);
    let plan = explain(&ctx, "EXPLAIN SELECT * FROM sim_join(t, 2, 'metric=levenshtein')").await;
    assert!(plan.contains("metric=levenshtein"), "{plan}");
    assert!(plan.contains("backend=cpu, index=segments\n"), "{plan}");
    let plan = explain(&ctx, "EXPLAIN ANALYZE SELECT * FROM sim_join(t, 2, 'metric=levenshtein')").await;
    assert!(plan.contains("skipped_rows=3"), "NULL strings are skipped: {plan}");
}

#[tokio::test]
async fn bad_text_input_names_the_function_argument_and_value() {
    let ctx = ctx();
    register_text(&ctx, "t", &words(30, 51), DataType::Utf8);
    crate::common::register(&ctx, "v", &crate::common::vectors(10, 3, 1), 3, crate::common::Shape::FixedF32);
    let cases = [
        (
            "SELECT * FROM sim_join(t, 1.5, 'metric=levenshtein')",
            "sim_join: argument 'eps' must be a whole number of edits for metric levenshtein, got 1.5",
        ),
        (
            "SELECT * FROM sim_join(t, -1, 'metric=levenshtein')",
            "sim_join: argument 'eps' must be >= 0 for metric levenshtein, got -1",
        ),
        (
            "SELECT * FROM sim_join(t, 1)",
            "sim_join: argument 'table' has no vector column, only text; compare strings with 'metric=levenshtein'",
        ),
        (
            "SELECT * FROM sim_join(t, 1, 'column=w')",
            "sim_join: column 'w' of argument 'table' is text (Utf8): a vector metric cannot compare it; use 'metric=levenshtein'",
        ),
        (
            "SELECT * FROM sim_join(v, 1, 'metric=levenshtein')",
            "sim_join: argument 'table' has no text column for metric levenshtein",
        ),
        (
            "SELECT * FROM sim_join(t, 1, 'metric=levenshtein, column=id')",
            "sim_join: column 'id' of argument 'table' has type Int64, but metric levenshtein compares strings",
        ),
        (
            "SELECT * FROM sim_join(t, v, 1, 'metric=levenshtein')",
            "sim_join: argument 'right' has no text column for metric levenshtein",
        ),
        (
            "SELECT * FROM knn(v, ['abc'], 2)",
            "knn: argument 'query' is a list of strings, which metric l2 cannot compare; use 'metric=levenshtein'",
        ),
        (
            "SELECT * FROM knn(t, [0.5, 1.0], 2, 'metric=levenshtein')",
            "knn: argument 'query' is a vector, which metric levenshtein cannot compare",
        ),
        (
            "SELECT * FROM knn(t, 'abc', 2, 'metric=levenshtein')",
            "table 'abc' not found (a constant query string is written as an array: ['text'])",
        ),
        (
            "SELECT * FROM sim_join(t, 1, 'metric=levenshtein, index=grid')",
            "sim_join: option index=grid needs a metric that bounds coordinates (l2, l2sq, cosine, l1, linf), not levenshtein",
        ),
    ];
    for (sql, want) in cases {
        let got = error(&ctx, sql).await;
        assert!(got.contains(want), "{sql}\n got: {got}\nwant: {want}");
    }
}
