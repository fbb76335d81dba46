//! `index=directory` (Böhm et al.'s quantile directory): EXPLAIN and EXPLAIN ANALYZE name it and
//! its shape, and its answers equal the oracle's where quantile cuts fall among equal values, on
//! skewed data, with NULL and NaN rows, for self-joins, two-table joins and range queries.

use crate::common::{Shape, check, check_count, ctx, explain, operator_metrics, oracle_join, register};

/// Skewed values with many ties: coordinates `round(8·Exp(1)) / 8`, so that quantile cuts fall
/// inside runs of equal values.
fn tied(n: usize, dim: usize, seed: u64) -> Vec<Option<Vec<f64>>> {
    let mut state = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            Some(
                (0..dim)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let u = (state >> 11) as f64 / (1u64 << 53) as f64;
                        (-(1.0 - u).ln()).mul_add(8.0, 0.0).round() / 8.0
                    })
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_names_the_directory_and_analyze_reports_its_shape_and_pages() {
    let ctx = ctx();
    let data = tied(20_000, 3, 5);
    register(&ctx, "t", &data, 3, Shape::FixedF32);
    let text = explain(&ctx, "EXPLAIN SELECT count(*) FROM sim_join(t, 0.05, 'index=directory')").await;
    assert!(text.contains("index=directory,"), "{text}");
    let text = explain(&ctx, "EXPLAIN VERBOSE SELECT count(*) FROM sim_join(t, 0.05, 'index=directory')").await;
    assert!(text.contains("index=directory(quantile cuts"), "{text}");
    let metrics = operator_metrics(&ctx, "SELECT count(*) FROM sim_join(t, 0.05, 'index=directory')").await;
    // 20,000 rows: 312 pages of 64 → 3 levels of fanout 7 (343 leaves).
    assert_eq!((metrics["directory_levels"], metrics["directory_fanout"]), (3, 7), "{metrics:?}");
    let blocks = 20_000usize.div_ceil(64);
    assert!(metrics["pages_visited"] > 0 && metrics["pages_visited"] < blocks * 343 / 4, "{metrics:?}");
    assert!(metrics["candidate_pairs"] >= metrics["output_rows"], "{metrics:?}");
    let grid = operator_metrics(&ctx, "SELECT count(*) FROM sim_join(t, 0.05, 'index=grid')").await;
    assert_eq!(grid["pages_visited"], 0, "{grid:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ties_at_the_cuts_skew_and_odd_rows_lose_no_pair() {
    let ctx = ctx();
    for (dim, n, shape) in [(1, 3000, Shape::FixedF32), (2, 5000, Shape::ListF64), (5, 4000, Shape::Columns)] {
        let mut data = tied(n, dim, dim as u64);
        // Rows the operator skips: NULL, and NaN in one coordinate.
        data[17] = None;
        if let Some(row) = data[40].as_mut() {
            row[0] = f64::NAN;
        }
        register(&ctx, "t", &data, dim, shape);
        let queries = tied(300, dim, 99);
        register(&ctx, "q", &queries, dim, Shape::FixedF32);
        for (metric, eps) in [("l2", 0.25), ("l1", 0.3), ("linf", 0.125), ("l2sq", 0.0625), ("cosine", 0.01)] {
            for (pairs, include_self) in [("ordered", false), ("unordered", true)] {
                let sql = format!(
                    "SELECT left_id, right_id, distance FROM sim_join(t, {eps}, \
                     'index=directory, metric={metric}, pairs={pairs}, include_self={include_self}')"
                );
                let want = oracle_join(metric, &data, &data, eps, Some((include_self, pairs == "ordered")));
                assert!(!want.is_empty(), "{sql}");
                check(&ctx, &sql, &want).await;
                check_count(&ctx, &sql, want.len()).await;
            }
            let sql = format!(
                "SELECT query_id, base_id, distance FROM range_query(t, q, {eps}, 'index=directory, metric={metric}')"
            );
            let want = oracle_join(metric, &queries, &data, eps, None);
            assert!(!want.is_empty(), "{sql}");
            check(&ctx, &sql, &want).await;
        }
    }
}
