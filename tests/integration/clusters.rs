//! `dbscan(t, eps, min_points)`: every row's cluster and core flag against a brute-force DBSCAN
//! written here from the definitions in docs/sql.md (core rows by their count within ε, itself
//! included; clusters as the components of core rows within ε, named by their first core row;
//! border rows in their nearest core row's cluster, ties to the earlier row; the rest noise), over
//! vectors, text, sets and bits, with NULL rows; and the errors of bad input.

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;

use crate::common::{Shape, ctx, distance, error, explain, register};

/// (id, cluster_id, core) of every row, by id.
async fn labels(ctx: &SessionContext, sql: &str) -> Vec<(i64, Option<i64>, bool)> {
    let batches = ctx
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = Vec::new();
    for b in batches {
        let id = b.column(0).as_primitive::<Int64Type>();
        let cluster = b.column(1).as_primitive::<Int64Type>();
        let core = b.column(2).as_any().downcast_ref::<BooleanArray>().unwrap();
        for i in 0..b.num_rows() {
            out.push((id.value(i), cluster.is_valid(i).then(|| cluster.value(i)), core.value(i)));
        }
    }
    out.sort();
    out
}

/// DBSCAN by brute force over rows `0..n` (`None`: a row that never matches), `d(i, j)` their
/// distance: the definitions, one by one.
fn brute_dbscan(
    n: usize,
    valid: impl Fn(usize) -> bool,
    d: impl Fn(usize, usize) -> f64,
    eps: f64,
    min_points: usize,
) -> Vec<(i64, Option<i64>, bool)> {
    let rows: Vec<usize> = (0..n).filter(|&i| valid(i)).collect();
    let within = |i: usize| -> Vec<usize> { rows.iter().copied().filter(|&j| d(i, j) <= eps).collect() };
    let neighbours: Vec<Vec<usize>> = (0..n).map(|i| if valid(i) { within(i) } else { Vec::new() }).collect();
    let core: Vec<bool> = (0..n).map(|i| valid(i) && neighbours[i].len() >= min_points).collect();
    let mut cluster: Vec<Option<i64>> = vec![None; n];
    for &start in &rows {
        if !core[start] || cluster[start].is_some() {
            continue;
        }
        // `start` is the first core row of its component (rows in order).
        let mut queue = VecDeque::from([start]);
        cluster[start] = Some(start as i64);
        while let Some(i) = queue.pop_front() {
            for &j in &neighbours[i] {
                if core[j] && cluster[j].is_none() {
                    cluster[j] = Some(start as i64);
                    queue.push_back(j);
                }
            }
        }
    }
    (0..n)
        .map(|i| {
            if core[i] || !valid(i) {
                return (i as i64, cluster[i], core[i]);
            }
            let nearest = neighbours[i]
                .iter()
                .copied()
                .filter(|&j| core[j])
                .min_by(|&a, &b| d(i, a).total_cmp(&d(i, b)).then(a.cmp(&b)));
            (i as i64, nearest.and_then(|j| cluster[j]), false)
        })
        .collect()
}

/// 2-D points: three blobs, a chain between two of them, scattered noise, and NULL rows.
fn points() -> Vec<Option<Vec<f64>>> {
    let mut out = Vec::new();
    let mut state = 7u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 11) as f64 / (1u64 << 53) as f64) as f32 as f64
    };
    for i in 0..900 {
        let row = match i % 10 {
            0 => vec![next(), next()],
            1 if i % 3 == 0 => vec![0.5 + 0.3 * (i as f64 / 900.0), 0.5],
            _ => {
                let c = [(0.2, 0.2), (0.5, 0.5), (0.8, 0.3)][i % 3];
                vec![c.0 + 0.05 * (next() - 0.5), c.1 + 0.05 * (next() - 0.5)]
            }
        };
        out.push(if i % 97 == 5 { None } else { Some(row) });
    }
    out
}

/// With `keys`, two rows are within ε only where their keys are equal; a row of a NULL key is
/// noise; clusters keep their first core row's position in the whole input.
#[tokio::test]
async fn clusters_within_blocking_keys_equal_a_brute_force_dbscan_per_key() {
    let ctx = ctx();
    let values = points();
    register(&ctx, "p", &values, 2, Shape::ListF64);
    ctx.sql("CREATE TABLE pk AS SELECT id, vector, CASE WHEN id % 11 = 3 THEN NULL ELSE id % 3 END AS k FROM p")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let key = |i: usize| (i % 11 != 3).then_some(i % 3);
    for (eps, min_points) in [(0.02, 4), (0.02, 1), (0.05, 10)] {
        let sql = format!("SELECT id, cluster_id, core FROM dbscan(pk, {eps}, {min_points}, 'keys=k')");
        let want = brute_dbscan(
            values.len(),
            |i| values[i].is_some() && key(i).is_some(),
            |i, j| match key(i) == key(j) {
                true => distance("l2", values[i].as_ref().unwrap(), values[j].as_ref().unwrap()),
                false => f64::INFINITY,
            },
            eps,
            min_points,
        );
        assert_eq!(labels(&ctx, &sql).await, want, "{sql}");
    }
}

#[tokio::test]
async fn vector_clusters_equal_a_brute_force_dbscan() {
    let ctx = ctx();
    let values = points();
    register(&ctx, "p", &values, 2, Shape::ListF64);
    for metric in ["l2", "l1", "linf"] {
        for (eps, min_points) in [(0.01, 4), (0.02, 4), (0.02, 1), (0.005, 2), (0.05, 30)] {
            let sql = format!("SELECT id, cluster_id, core FROM dbscan(p, {eps}, {min_points}, 'metric={metric}')");
            let want = brute_dbscan(
                values.len(),
                |i| values[i].is_some(),
                |i, j| distance(metric, values[i].as_ref().unwrap(), values[j].as_ref().unwrap()),
                eps,
                min_points,
            );
            assert_eq!(labels(&ctx, &sql).await, want, "{sql}");
        }
    }
    // The same labels whatever the index (the grid, brute force).
    let grid = labels(&ctx, "SELECT id, cluster_id, core FROM dbscan(p, 0.02, 4, 'index=grid')").await;
    let brute = labels(&ctx, "SELECT id, cluster_id, core FROM dbscan(p, 0.02, 4, 'index=brute_force')").await;
    assert_eq!(grid, brute);
    // Past 8 pairs a row the degree pass keeps no pairs and the components join again; below,
    // it keeps them and one pass over them unites the cores.
    let plan = explain(&ctx, "EXPLAIN ANALYZE SELECT count(*) FROM dbscan(p, 0.02, 4)").await;
    assert!(plan.contains("op=dbscan, eps=0.02, min_points=4") && plan.contains("union_passes=2"), "{plan}");
    let plan = explain(&ctx, "EXPLAIN ANALYZE SELECT count(*) FROM dbscan(p, 0.004, 2)").await;
    assert!(plan.contains("union_passes=1"), "{plan}");
}

#[tokio::test]
async fn text_set_and_bit_clusters_equal_a_brute_force_dbscan() {
    // One partition: the view below keeps its table's scan order, so that a row's number in it
    // (a cluster's id) is its `id`.
    let ctx = simjoin::session_context_with_config(datafusion::prelude::SessionConfig::new().with_target_partitions(1));
    let words = simjoin::datagen::words(500, 12, 3);
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("w", DataType::Utf8, true)]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(Int64Array::from_iter_values(0..words.len() as i64)), Arc::new(StringArray::from(words.clone()))],
    )
    .unwrap();
    ctx.register_table("w", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    let lev = |a: &str, b: &str| -> f64 {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut prev = row[0];
            row[0] = i;
            for j in 1..=b.len() {
                let keep = row[j];
                row[j] = (row[j] + 1).min(row[j - 1] + 1).min(prev + usize::from(a[i - 1] != b[j - 1]));
                prev = keep;
            }
        }
        row[b.len()] as f64
    };
    for (eps, min_points) in [(1.0, 1), (1.0, 3), (2.0, 5)] {
        let sql = format!("SELECT id, cluster_id, core FROM dbscan(w, {eps}, {min_points}, 'metric=levenshtein')");
        let want = brute_dbscan(
            words.len(),
            |i| words[i].is_some(),
            |i, j| lev(words[i].as_ref().unwrap(), words[j].as_ref().unwrap()),
            eps,
            min_points,
        );
        assert_eq!(labels(&ctx, &sql).await, want, "{sql}");
    }
    // Sets of word shingles and their Jaccard distance; bits as 64-bit hashes of the words.
    ctx.sql("CREATE VIEW s AS SELECT id, qgrams(w, 2) AS g, CAST(length(w) * 2654435761 AS BIGINT) AS h FROM w")
        .await
        .unwrap();
    let grams: Vec<Option<std::collections::BTreeSet<String>>> = words
        .iter()
        .map(|w| {
            w.as_ref().map(|w| {
                let c: Vec<char> = w.chars().collect();
                if c.is_empty() {
                    Default::default()
                } else if c.len() < 2 {
                    [w.clone()].into()
                } else {
                    c.windows(2).map(|p| p.iter().collect()).collect()
                }
            })
        })
        .collect();
    let jaccard = |i: usize, j: usize| {
        let (a, b) = (grams[i].as_ref().unwrap(), grams[j].as_ref().unwrap());
        let union = a.union(b).count();
        if union == 0 { 0.0 } else { 1.0 - a.intersection(b).count() as f64 / union as f64 }
    };
    let sql = "SELECT id, cluster_id, core FROM dbscan(s, 0.4, 3, 'metric=jaccard, column=g')";
    assert_eq!(labels(&ctx, sql).await, brute_dbscan(words.len(), |i| grams[i].is_some(), jaccard, 0.4, 3), "{sql}");
    let hashes: Vec<Option<i64>> =
        words.iter().map(|w| w.as_ref().map(|w| (w.chars().count() as i64).wrapping_mul(2654435761))).collect();
    let hamming = |i: usize, j: usize| (hashes[i].unwrap() ^ hashes[j].unwrap()).count_ones() as f64;
    let sql = "SELECT id, cluster_id, core FROM dbscan(s, 6, 2, 'metric=hamming, column=h')";
    assert_eq!(labels(&ctx, sql).await, brute_dbscan(words.len(), |i| hashes[i].is_some(), hamming, 6.0, 2), "{sql}");
}

#[tokio::test]
async fn bad_dbscan_calls_are_errors_naming_the_argument() {
    let ctx = ctx();
    register(&ctx, "p", &points(), 2, Shape::ListF64);
    for (sql, expected) in [
        ("SELECT * FROM dbscan(p, 0.1)", "dbscan: expected dbscan(table, eps, min_points [, options])"),
        ("SELECT * FROM dbscan(p, -0.1, 3)", "dbscan: argument 'eps' must be >= 0"),
        ("SELECT * FROM dbscan(p, 0.1, 0)", "dbscan: argument 'min_points' must be a positive integer, got 0"),
        ("SELECT * FROM dbscan(p, 0.1, 3, 'approx=true')", "is for knn only"),
    ] {
        let message = error(&ctx, sql).await;
        assert!(message.contains(expected), "{sql}: {message}");
    }
}
