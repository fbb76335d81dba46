//! A base read from files is searched part by part as it is decoded (exec/base_by_parts.rs): kNN,
//! range queries and the plain SQL they come from answer exactly as over the same rows held whole
//! in memory — ties broken by the same scan order, NULL, NaN and zero rows treated the same —
//! and EXPLAIN says which way a base is read.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::prelude::SessionContext;

use crate::common::{Row, Shape, check, ctx, error, explain, oracle_join, oracle_knn, random, register};

/// Rows per file: four files over three partitions give each partition more rows than a part
/// holds (65,536), so every partition is searched in several parts.
const FILE_ROWS: usize = 60_000;

/// Four Parquet files of 3-dimensional f32 vectors on a coarse grid (every point repeats ~240
/// times: ties within and across parts and partitions), with NULL vectors, NaN and zero rows, in
/// `id` order; read back as files (`filed`, and by path) and as an in-memory table (`whole`).
/// Returns the base's and the queries' values.
async fn files(ctx: &SessionContext, dir: &std::path::Path) -> [Vec<Option<Vec<f64>>>; 2] {
    let n = 4 * FILE_ROWS;
    let coordinates = random(n * 3, 41);
    let values: Vec<Option<Vec<f64>>> = (0..n)
        .map(|i| match i % 9973 {
            17 => None,
            29 => Some(vec![f64::NAN, 0.5, 0.5]),
            31 => Some(vec![0.0, 0.0, 0.0]),
            _ => {
                Some(coordinates[i * 3..i * 3 + 3].iter().map(|x| ((x * 10.0).floor() / 10.0) as f32 as f64).collect())
            }
        })
        .collect();
    register(ctx, "source", &values, 3, Shape::FixedF32);
    std::fs::create_dir_all(dir).unwrap();
    for file in 0..4 {
        let path = dir.join(format!("part-{file}.parquet"));
        let (from, to) = (file * FILE_ROWS, (file + 1) * FILE_ROWS);
        let copy = format!(
            "COPY (SELECT * FROM source WHERE id >= {from} AND id < {to} ORDER BY id) TO '{}' STORED AS PARQUET",
            path.display()
        );
        ctx.sql(&copy).await.unwrap().collect().await.unwrap();
    }
    ctx.register_parquet("filed", format!("{}/", dir.display()), Default::default()).await.unwrap();
    ctx.sql("CREATE TABLE whole AS SELECT * FROM filed").await.unwrap().collect().await.unwrap();
    let queries: Vec<Option<Vec<f64>>> = random(40 * 3, 43).chunks(3).map(|c| Some(c.to_vec())).collect();
    register(ctx, "queries", &queries, 3, Shape::FixedF32);
    [values, queries]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_base_searched_part_by_part_answers_as_one_held_whole() {
    let dir = std::env::temp_dir().join(format!("simjoin-streamed-{}", std::process::id()));
    let ctx = ctx();
    let [base, queries] = files(&ctx, &dir).await;
    let path = format!("{}/", dir.display());
    const PARTS: &str = "base=streamed";

    // Against the f64 oracle, whose ties go by base row: the files' scan order is `id` order.
    for (function, metric, parameter) in [
        ("knn", "l2", 10.0),
        ("knn", "l1", 300.0),
        ("knn", "cosine", 350.0),
        ("range_query", "l2", 0.08),
        ("range_query", "linf", 0.2),
    ] {
        let (columns, want): (&str, Vec<Row>) = if function == "knn" {
            ("query_id, base_id, distance, rank", oracle_knn(metric, &base, &queries, parameter as usize))
        } else {
            ("query_id, base_id, distance", oracle_join(metric, &queries, &base, parameter, None))
        };
        let arguments = format!("{parameter}, 'metric={metric}'");
        let from_files = format!("SELECT {columns} FROM {function}('{path}', queries, {arguments})");
        let from_memory = format!("SELECT {columns} FROM {function}(whole, queries, {arguments})");
        assert!(explain(&ctx, &format!("EXPLAIN {from_files}")).await.contains(PARTS), "{from_files}");
        assert!(!explain(&ctx, &format!("EXPLAIN {from_memory}")).await.contains(PARTS), "{from_memory}");
        assert!(want.len() >= 400, "{from_files}: {} rows", want.len());
        check(&ctx, &from_files, &want).await;
    }

    // The plain SQL of a kNN over a file: the rows the operator skips (NULL vectors first here)
    // take the places SQL's order gives them, as over the table held whole.
    ctx.sql("SET simjoin.rewrite_scans = true").await.unwrap().collect().await.unwrap();
    let plain = |from: &str| {
        format!("SELECT id, l2_distance(vector, [0.5, 0.5, 0.5]) AS d FROM {from} ORDER BY d NULLS FIRST LIMIT 300")
    };
    let from_files = plain("filed");
    assert!(explain(&ctx, &format!("EXPLAIN {from_files}")).await.contains(PARTS), "{from_files}");
    let answer = |sql: String| {
        let ctx = &ctx;
        async move {
            let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            batches
                .iter()
                .flat_map(|b| {
                    let ids = b.column(0).as_primitive::<Int64Type>().clone();
                    let d = b.column(1).as_primitive::<Float64Type>().clone();
                    (0..b.num_rows()).map(move |i| (ids.value(i), d.is_null(i), d.value(i).to_bits()))
                })
                .collect::<Vec<_>>()
        }
    };
    let (streamed, whole) = (answer(from_files).await, answer(plain("whole")).await);
    assert_eq!(streamed.len(), 300);
    assert!(streamed.iter().any(|&(_, null, _)| null), "the NULL rows come first");
    // SQL leaves the order of equal distances open: the ids must agree below the 300th distance.
    let last = streamed.last().map(|&(_, _, bits)| bits);
    let decided = |rows: &[(i64, bool, u64)]| -> Vec<(i64, bool, u64)> {
        rows.iter().copied().filter(|&(_, null, bits)| null || Some(bits) != last).collect()
    };
    let distances = |rows: &[(i64, bool, u64)]| rows.iter().map(|&(_, null, bits)| (null, bits)).collect::<Vec<_>>();
    assert_eq!(distances(&streamed), distances(&whole));
    assert_eq!(decided(&streamed), decided(&whole));

    // The plain SQL of a range query over a file: the rows the operator skips are compared by the
    // scalar formula part by part, and the answer is the table's held whole, distance bits included.
    let within = |from: &str| {
        format!(
            "SELECT id, l2_distance(vector, [0.5, 0.5, 0.5]) AS d FROM {from} \
             WHERE l2_distance(vector, [0.5, 0.5, 0.5]) <= 0.3 ORDER BY id"
        )
    };
    let from_files = within("filed");
    assert!(explain(&ctx, &format!("EXPLAIN {from_files}")).await.contains(PARTS), "{from_files}");
    let (streamed, whole) = (answer(from_files).await, answer(within("whole")).await);
    assert!(streamed.len() >= 50, "{} rows", streamed.len());
    assert_eq!(streamed, whole);

    // A kNN join written with a window, its queries holding a NULL vector and a NaN: each such
    // query is a candidate with every row of the file (its distances are NULL or NaN, which SQL
    // still ranks), and the row numbers and distances are the table's held whole.
    let mut odd_queries: Vec<Option<Vec<f64>>> = random(4 * 3, 47).chunks(3).map(|c| Some(c.to_vec())).collect();
    odd_queries[1] = None;
    odd_queries[2].as_mut().unwrap()[0] = f64::NAN;
    register(&ctx, "odd_queries", &odd_queries, 3, Shape::ListF64);
    let ranked = |from: &str| {
        let d = "l2_distance(q.vector, b.vector)";
        format!(
            "SELECT q.id * 100 + CAST(ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d}) AS BIGINT), {d} \
             FROM odd_queries q, {from} b QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY {d}) <= 6 ORDER BY 1"
        )
    };
    let from_files = ranked("filed");
    let plan = explain(&ctx, &format!("EXPLAIN {from_files}")).await;
    assert!(plan.contains("op=knn") && plan.contains(PARTS), "{from_files}\n{plan}");
    let (streamed, whole) = (answer(from_files).await, answer(ranked("whole")).await);
    assert_eq!(streamed.len(), 24);
    assert_eq!(streamed, whole);

    // Vectors of another dimension fail as they do held whole.
    register(&ctx, "flat", &[Some(vec![0.5, 0.5])], 2, Shape::FixedF32);
    let mismatch = error(&ctx, &format!("SELECT * FROM knn('{path}', flat, 3)")).await;
    assert_eq!(mismatch, error(&ctx, "SELECT * FROM knn(whole, flat, 3)").await);
    assert!(mismatch.contains("dimension mismatch"), "{mismatch}");
    std::fs::remove_dir_all(&dir).unwrap();
}
