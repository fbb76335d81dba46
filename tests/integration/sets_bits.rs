//! `metric=jaccard` over sets and bits and `metric=hamming` over bits: every function against the
//! scalar `jaccard_distance` / `hamming_distance` evaluated by plain SQL over the same tables
//! (whose formula a brute force below checks too), the plain-SQL join rewrite, the token
//! functions, and the errors of bad input.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::ListBuilder;
use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, FixedSizeBinaryArray, Int64Array, ListArray, RecordBatch, StringArray, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::{check, check_count, ctx, error, explain, rows};

/// Sets of words: near-duplicates of a few templates (so near pairs exist), some NULL, some
/// empty, some with repeated words.
fn word_sets(n: usize, seed: u64) -> Vec<Option<Vec<String>>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let templates: Vec<Vec<String>> =
        (0..12).map(|t| (0..rng.random_range(3..14)).map(|w| format!("w{}", (t * 7 + w * 3) % 40)).collect()).collect();
    (0..n)
        .map(|_| match rng.random_range(0..25) {
            0 => None,
            1 => Some(vec![]),
            _ => {
                let mut set = templates[rng.random_range(0..templates.len())].clone();
                for _ in 0..rng.random_range(0..3) {
                    let at = rng.random_range(0..set.len());
                    set[at] = format!("w{}", rng.random_range(0..60));
                }
                if rng.random_range(0..4) == 0 {
                    set.push(set[0].clone());
                }
                Some(set)
            }
        })
        .collect()
}

/// Registers `name` with `id` (0..n) and a List<Utf8> column `s`, over three partitions.
fn register_sets(ctx: &SessionContext, name: &str, sets: &[Option<Vec<String>>]) {
    let field = Field::new("s", DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))), true);
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), field]));
    let part = sets.len().div_ceil(3).max(1);
    let partitions = sets
        .chunks(part)
        .enumerate()
        .map(|(p, chunk)| {
            let first = (p * part) as i64;
            let mut builder = ListBuilder::new(StringBuilder::new());
            for set in chunk {
                match set {
                    Some(set) => {
                        set.iter().for_each(|w| builder.values().append_value(w));
                        builder.append(true);
                    }
                    None => builder.append(false),
                }
            }
            let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(first..first + chunk.len() as i64));
            vec![RecordBatch::try_new(schema.clone(), vec![ids, Arc::new(builder.finish())]).unwrap()]
        })
        .collect();
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, partitions).unwrap())).unwrap();
}

/// `n` 64-bit hashes around a few centres, some NULL.
fn hashes(n: usize, seed: u64) -> Vec<Option<i64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let centres: Vec<i64> = (0..10).map(|_| rng.random()).collect();
    (0..n)
        .map(|_| {
            (rng.random_range(0..30) != 0).then(|| {
                let mut h = centres[rng.random_range(0..centres.len())];
                for _ in 0..rng.random_range(0..7) {
                    h ^= 1 << rng.random_range(0..64);
                }
                h
            })
        })
        .collect()
}

/// Registers `name` with `id`, the hashes as Int64 `h`, as FixedSizeBinary(8) `fb` and as Binary
/// `b` (the same bytes, little-endian).
fn register_bits(ctx: &SessionContext, name: &str, hashes: &[Option<i64>]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("h", DataType::Int64, true),
        Field::new("fb", DataType::FixedSizeBinary(8), true),
        Field::new("b", DataType::Binary, true),
    ]));
    let bytes: Vec<Option<Vec<u8>>> = hashes.iter().map(|h| h.map(|h| h.to_le_bytes().to_vec())).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(0..hashes.len() as i64)),
        Arc::new(Int64Array::from(hashes.to_vec())),
        Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(bytes.clone().into_iter(), 8).unwrap()),
        Arc::new(BinaryArray::from(bytes.iter().map(|b| b.as_deref()).collect::<Vec<_>>())),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
}

/// The rows of `sql` planned as written (the rewrite rule off), the oracle's way.
async fn plain(ctx: &SessionContext, sql: &str) -> Vec<crate::common::Row> {
    ctx.sql("SET simjoin.rewrite_joins = false").await.unwrap();
    let out = rows(ctx, sql).await;
    ctx.sql("SET simjoin.rewrite_joins = true").await.unwrap();
    out
}

/// Every pair of `a` × `b` whose scalar `function(x.col, y.col)` is within `eps`, `extra` a further
/// condition on the ids.
fn oracle(function: &str, column: &str, a: &str, b: &str, eps: f64, extra: &str) -> String {
    format!(
        "SELECT x.id, y.id, {function}(x.{column}, y.{column}) FROM {a} x CROSS JOIN {b} y \
         WHERE {function}(x.{column}, y.{column}) <= {eps} {extra}"
    )
}

#[tokio::test]
async fn the_scalar_distances_follow_their_definitions() {
    let ctx = ctx();
    let sets = word_sets(80, 1);
    register_sets(&ctx, "t", &sets);
    let got = rows(&ctx, "SELECT x.id, y.id, jaccard_distance(x.s, y.s) FROM t x CROSS JOIN t y WHERE jaccard_distance(x.s, y.s) IS NOT NULL").await;
    let mut want = Vec::new();
    for (i, x) in sets.iter().enumerate() {
        for (j, y) in sets.iter().enumerate() {
            if let (Some(x), Some(y)) = (x, y) {
                let (x, y): (BTreeSet<&String>, BTreeSet<&String>) = (x.iter().collect(), y.iter().collect());
                let union = x.union(&y).count();
                let d = if union == 0 { 0.0 } else { 1.0 - x.intersection(&y).count() as f64 / union as f64 };
                want.push((i as i64, j as i64, d.to_bits(), 0));
            }
        }
    }
    want.sort();
    assert_eq!(got, want);
    let h = hashes(50, 2);
    register_bits(&ctx, "h", &h);
    let got = rows(&ctx, "SELECT x.id, y.id, hamming_distance(x.h, y.h) FROM h x CROSS JOIN h y WHERE x.h IS NOT NULL AND y.h IS NOT NULL").await;
    let mut want = Vec::new();
    for (i, x) in h.iter().enumerate() {
        for (j, y) in h.iter().enumerate() {
            if let (Some(x), Some(y)) = (x, y) {
                want.push((i as i64, j as i64, ((x ^ y).count_ones() as f64).to_bits(), 0));
            }
        }
    }
    want.sort();
    assert_eq!(got, want);
    // The same bytes as binary give the same distances; Tanimoto over bits.
    let a = rows(&ctx, "SELECT x.id, y.id, hamming_distance(x.fb, y.b) FROM h x CROSS JOIN h y WHERE x.h IS NOT NULL AND y.h IS NOT NULL").await;
    assert_eq!(a, want);
    let t =
        rows(&ctx, "SELECT x.id, y.id, jaccard_distance(x.h, y.h) FROM h x CROSS JOIN h y WHERE x.id = 0 AND y.id = 1")
            .await;
    if let (Some(x), Some(y)) = (h[0], h[1]) {
        let d = 1.0 - (x & y).count_ones() as f64 / (x | y).count_ones() as f64;
        assert_eq!(t, vec![(0, 1, d.to_bits(), 0)]);
    }
}

#[tokio::test]
async fn set_joins_equal_sql_jaccard_distance() {
    let ctx = ctx();
    register_sets(&ctx, "t", &word_sets(400, 3));
    register_sets(&ctx, "u", &word_sets(300, 4));
    for eps in [0.0, 0.2, 0.25, 0.5, 0.8, 1.0] {
        for index in ["auto", "brute_force"] {
            let call = |more: &str| {
                format!(
                    "SELECT left_id, right_id, distance FROM sim_join(t, {eps}, 'metric=jaccard, index={index}{more}')"
                )
            };
            let want = plain(&ctx, &oracle("jaccard_distance", "s", "t", "t", eps, "AND x.id <> y.id")).await;
            check(&ctx, &call(""), &want).await;
            let want = plain(&ctx, &oracle("jaccard_distance", "s", "t", "t", eps, "AND x.id < y.id")).await;
            check(&ctx, &call(", pairs=unordered"), &want).await;
            let want = plain(&ctx, &oracle("jaccard_distance", "s", "t", "t", eps, "AND x.id <= y.id")).await;
            check(&ctx, &call(", pairs=unordered, include_self=true"), &want).await;
            let want = plain(&ctx, &oracle("jaccard_distance", "s", "t", "u", eps, "")).await;
            let two = format!(
                "SELECT left_id, right_id, distance FROM sim_join(t, u, {eps}, 'metric=jaccard, index={index}')"
            );
            check(&ctx, &two, &want).await;
            check_count(&ctx, &two, want.len()).await;
            let range = format!(
                "SELECT query_id, base_id, distance FROM range_query(u, t, {eps}, 'metric=jaccard, index={index}')"
            );
            check(&ctx, &range, &want).await;
        }
    }
    assert!(
        explain(&ctx, "EXPLAIN SELECT * FROM sim_join(t, 0.3, 'metric=jaccard')").await.contains("index=prefix_filter")
    );
}

#[tokio::test]
async fn set_knn_equals_the_scalar_ranking_ties_by_position() {
    let ctx = ctx();
    register_sets(&ctx, "base", &word_sets(500, 5));
    register_sets(&ctx, "q", &word_sets(40, 6));
    for k in [1, 3, 25, 600] {
        let sql = format!("SELECT query_id, base_id, distance, rank FROM knn(base, q, {k}, 'metric=jaccard')");
        let oracle = format!(
            "SELECT qid, bid, d, CAST(r AS BIGINT) FROM (SELECT x.id AS qid, y.id AS bid, jaccard_distance(x.s, y.s) AS d, \
             ROW_NUMBER() OVER (PARTITION BY x.id ORDER BY jaccard_distance(x.s, y.s), y.id) AS r \
             FROM q x CROSS JOIN base y WHERE x.s IS NOT NULL AND y.s IS NOT NULL) WHERE r <= {k}"
        );
        let want = plain(&ctx, &oracle).await;
        check(&ctx, &sql, &want).await;
    }
    // One literal set as the query.
    let got = rows(
        &ctx,
        "SELECT CAST(0 AS BIGINT), base_id, distance, rank FROM knn(base, ['w3', 'w10', 'w17'], 4, 'metric=jaccard')",
    )
    .await;
    assert_eq!(got.len(), 4);
    let mut by_rank: Vec<(i64, f64)> = got.iter().map(|r| (r.3, f64::from_bits(r.2))).collect();
    by_rank.sort_by_key(|r| r.0);
    assert!(by_rank.windows(2).all(|w| w[0].1 <= w[1].1), "{by_rank:?}");
}

#[tokio::test]
async fn hamming_and_tanimoto_joins_equal_sql_over_every_bit_column() {
    let ctx = ctx();
    register_bits(&ctx, "h", &hashes(900, 7));
    register_bits(&ctx, "g", &hashes(500, 8));
    for r in [0, 1, 3, 4, 9] {
        for (column, index) in [("h", "auto"), ("fb", "auto"), ("b", "brute_force")] {
            let want = plain(&ctx, &oracle("hamming_distance", column, "h", "h", r as f64, "AND x.id < y.id")).await;
            let sql = format!(
                "SELECT left_id, right_id, distance FROM sim_join(h, {r}, 'metric=hamming, column={column}, pairs=unordered, index={index}')"
            );
            check(&ctx, &sql, &want).await;
            let want = plain(&ctx, &oracle("hamming_distance", column, "h", "g", r as f64, "")).await;
            let sql = format!(
                "SELECT left_id, right_id, distance FROM sim_join(h, g, {r}, 'metric=hamming, column={column}, index={index}')"
            );
            check(&ctx, &sql, &want).await;
        }
    }
    for eps in [0.0, 0.05, 0.12, 0.3] {
        let want = plain(&ctx, &oracle("jaccard_distance", "fb", "h", "g", eps, "")).await;
        let sql = format!("SELECT left_id, right_id, distance FROM sim_join(h, g, {eps}, 'metric=jaccard, column=fb')");
        check(&ctx, &sql, &want).await;
    }
    for (metric, k) in [("hamming", 1), ("hamming", 10), ("jaccard", 7)] {
        let sql = format!("SELECT query_id, base_id, distance, rank FROM knn(h, g, {k}, 'metric={metric}, column=h')");
        let oracle = format!(
            "SELECT qid, bid, d, CAST(r AS BIGINT) FROM (SELECT x.id AS qid, y.id AS bid, {metric}_distance(x.h, y.h) AS d, \
             ROW_NUMBER() OVER (PARTITION BY x.id ORDER BY {metric}_distance(x.h, y.h), y.id) AS r \
             FROM g x CROSS JOIN h y WHERE x.h IS NOT NULL AND y.h IS NOT NULL) WHERE r <= {k}"
        );
        check(&ctx, &sql, &plain(&ctx, &oracle).await).await;
    }
    // A binary column is found without column=; an integer column only where named.
    let metrics = explain(&ctx, "EXPLAIN SELECT * FROM sim_join(g, 2, 'metric=hamming, column=fb')").await;
    assert!(metrics.contains("index=hamming_blocks"), "{metrics}");
}

#[tokio::test]
async fn plain_sql_joins_on_jaccard_and_hamming_are_planned_as_the_operator() {
    let ctx = ctx();
    register_sets(&ctx, "t", &word_sets(300, 9));
    register_bits(&ctx, "h", &hashes(400, 10));
    for (sql, oracle_sql) in [
        (
            "SELECT a.id, b.id, jaccard_distance(a.s, b.s) FROM t a JOIN t b ON jaccard_distance(a.s, b.s) <= 0.3",
            oracle("jaccard_distance", "s", "t", "t", 0.3, ""),
        ),
        (
            "SELECT a.id, b.id, hamming_distance(a.fb, b.fb) FROM h a JOIN h b ON hamming_distance(a.fb, b.fb) < 3.5 AND a.id <> b.id",
            oracle("hamming_distance", "fb", "h", "h", 3.0, "AND x.id <> y.id"),
        ),
    ] {
        let plan = explain(&ctx, &format!("EXPLAIN {sql}")).await;
        assert!(plan.contains("SimilarityExec"), "{plan}");
        let want = plain(&ctx, &oracle_sql).await;
        assert!(!want.is_empty());
        check(&ctx, sql, &want).await;
    }
}

#[tokio::test]
async fn token_functions_make_sets_of_text() {
    let ctx = ctx();
    let texts = StringArray::from(vec![
        Some("The quick brown fox jumps over the lazy dog"),
        Some("the quick brown fox jumped over the lazy dog"),
        Some("A completely different sentence"),
        None,
    ]);
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("txt", DataType::Utf8, true)]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![0, 1, 2, 3])), Arc::new(texts)])
            .unwrap();
    ctx.register_table("docs", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    ctx.sql("CREATE VIEW shingled AS SELECT id, shingles(txt, 2) AS s, qgrams(txt, 3) AS g FROM docs").await.unwrap();
    let got = rows(
        &ctx,
        "SELECT left_id, right_id, distance FROM sim_join(shingled, 0.7, 'metric=jaccard, column=s, pairs=unordered')",
    )
    .await;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0, got[0].1), (0, 1));
    let got = rows(
        &ctx,
        "SELECT left_id, right_id, distance FROM sim_join(shingled, 0.3, 'metric=jaccard, column=g, pairs=unordered')",
    )
    .await;
    assert_eq!(got.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), vec![(0, 1)]);
    let batches =
        ctx.sql("SELECT qgrams('abcd', 2), shingles('Hello, World!')").await.unwrap().collect().await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
    assert!(text.contains("[ab, bc, cd]") && text.contains("[hello, world]"), "{text}");
}

#[tokio::test]
async fn bad_set_and_bit_inputs_are_errors_naming_the_function_and_argument() {
    let ctx = ctx();
    register_sets(&ctx, "t", &word_sets(20, 11));
    register_bits(&ctx, "h", &hashes(20, 12));
    let integers = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), Some(2)])]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("s", integers.data_type().clone(), true),
    ]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![0])), Arc::new(integers)]).unwrap();
    ctx.register_table("ints", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    for (sql, expected) in [
        (
            "SELECT * FROM sim_join(h, 1.5, 'metric=hamming, column=h')",
            "sim_join: argument 'eps' must be a whole number of bits for metric hamming, got 1.5",
        ),
        (
            "SELECT * FROM sim_join(t, 1, 'metric=hamming')",
            "sim_join: argument 'table' has no column metric hamming can compare",
        ),
        (
            "SELECT * FROM sim_join(t, ints, 0.5, 'metric=jaccard')",
            "sim_join: argument 'left' holds sets of strings and argument 'right' sets of integers",
        ),
        ("SELECT * FROM sim_join(t, h, 0.5, 'metric=jaccard, column=fb')", "has no column 'fb'"),
        (
            "SELECT * FROM sim_join(t, 0.5, 'metric=jaccard, index=grid')",
            "sim_join: option index=grid is not available for metric jaccard",
        ),
        ("SELECT * FROM knn(t, 3, 2, 'metric=jaccard')", "knn: argument 'query'"),
        ("SELECT jaccard_distance(s, h) FROM t, h", "jaccard_distance: a set and a bit string do not compare"),
    ] {
        let message = error(&ctx, sql).await;
        assert!(message.contains(expected), "{sql}: {message}");
    }
}
