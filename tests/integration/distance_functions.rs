//! The scalar distance functions: docs/sql.md's formulas bit for bit (the oracle of common.rs), the
//! same distances as the table functions, NULLs, literals in both spellings, and clear errors.

use crate::common::{Shape, ctx, distance, error, register, rows, vectors};

/// (function, oracle metric, sign): the function's value is `sign × distance(metric)`.
const FUNCTIONS: [(&str, &str, f64); 9] = [
    ("l2_distance", "l2", 1.0),
    ("l2sq_distance", "l2sq", 1.0),
    ("cosine_distance", "cosine", 1.0),
    ("array_cosine_distance", "cosine", 1.0),
    ("l1_distance", "l1", 1.0),
    ("linf_distance", "linf", 1.0),
    // The dot product; metric=inner_product (and array_negative_inner_product) is its negation.
    ("inner_product", "inner_product", -1.0),
    ("array_inner_product", "inner_product", -1.0),
    ("array_negative_inner_product", "inner_product", 1.0),
];

#[tokio::test]
async fn every_function_equals_the_formula_bit_for_bit() {
    let ctx = ctx();
    let (a, b) = (vectors(300, 7, 1), vectors(300, 7, 2));
    for shape in [Shape::FixedF32, Shape::ListF64] {
        register(&ctx, "a", &a, 7, shape);
        register(&ctx, "b", &b, 7, shape);
        for (function, metric, sign) in FUNCTIONS {
            let got =
                rows(&ctx, &format!("SELECT a.id, b.id, {function}(a.vector, b.vector) FROM a JOIN b ON a.id = b.id"))
                    .await;
            assert_eq!(got.len(), 300);
            for (i, j, bits, _) in got {
                let (x, y) = (a[i as usize].as_ref().unwrap(), b[j as usize].as_ref().unwrap());
                let want = sign * distance(metric, x, y);
                assert_eq!(f64::from_bits(bits).to_bits(), want.to_bits(), "{function} row {i} ({shape:?})");
            }
        }
    }
}

#[tokio::test]
async fn the_table_functions_report_the_same_distances() {
    let ctx = ctx();
    register(&ctx, "base", &vectors(400, 5, 3), 5, Shape::FixedF32);
    register(&ctx, "queries", &vectors(20, 5, 4), 5, Shape::FixedF32);
    for (function, metric, sign) in FUNCTIONS.into_iter().filter(|f| f.2 > 0.0) {
        let sql = format!(
            "SELECT k.query_id, k.base_id, k.distance, {function}(q.vector, b.vector) AS scalar \
             FROM knn(base, queries, 7, 'metric={metric}') k \
             JOIN queries q ON q.id = k.query_id JOIN base b ON b.id = k.base_id"
        );
        let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
        let mut seen = 0;
        for batch in batches {
            use datafusion::arrow::array::AsArray;
            use datafusion::arrow::datatypes::Float64Type;
            let (table, scalar) =
                (batch.column(2).as_primitive::<Float64Type>(), batch.column(3).as_primitive::<Float64Type>());
            for i in 0..batch.num_rows() {
                assert_eq!(table.value(i).to_bits(), (sign * scalar.value(i)).to_bits(), "{function}");
                seen += 1;
            }
        }
        assert_eq!(seen, 20 * 7, "{function}");
    }
}

#[tokio::test]
async fn order_by_a_distance_with_limit_finds_the_knn_rows() {
    let ctx = ctx();
    register(&ctx, "base", &vectors(500, 4, 5), 4, Shape::ListF64);
    let point = "[0.25, 0.5, 0.75, 0.1]";
    let by_knn = rows(&ctx, &format!("SELECT 0 AS q, base_id, distance FROM knn(base, '{point}', 9)")).await;
    let by_order =
        rows(&ctx, &format!("SELECT 0 AS q, id, l2_distance(vector, '{point}') AS d FROM base ORDER BY d LIMIT 9"))
            .await;
    assert_eq!(by_knn, by_order);
}

#[tokio::test]
async fn nulls_literals_and_errors() {
    let ctx = ctx();
    let mut values = vectors(4, 3, 6);
    values[1] = None;
    register(&ctx, "t", &values, 3, Shape::FixedF32);
    // A NULL vector gives NULL; a constant in either spelling is broadcast.
    let got = rows(
        &ctx,
        "SELECT id, id AS again, l1_distance(vector, [0.0, 0.0, 0.0]) FROM t WHERE l1_distance(vector, '[0, 0, 0]') IS NULL",
    )
    .await;
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1]);
    let sum = rows(&ctx, "SELECT 0 AS a, 0 AS b, l1_distance('[1, 2]', [3.0, 5.0])").await;
    assert_eq!(f64::from_bits(sum[0].2), 5.0);
    // The zero vector's cosine distance is NaN (0/0), as in pgvector.
    let zero = rows(&ctx, "SELECT 0 AS a, 0 AS b, cosine_distance([0.0, 0.0], [1.0, 1.0])").await;
    assert!(f64::from_bits(zero[0].2).is_nan());

    let mismatch = error(&ctx, "SELECT l2_distance(vector, [1.0, 2.0]) FROM t").await;
    assert!(
        mismatch.contains("l2_distance: dimension mismatch in row 0: 3-dimensional and 2-dimensional"),
        "{mismatch}"
    );
    let not_a_vector = error(&ctx, "SELECT cosine_distance(id, vector) FROM t").await;
    assert!(not_a_vector.contains("cosine_distance: argument 1 has type Int64, expected a vector"), "{not_a_vector}");
    let bad_text = error(&ctx, "SELECT inner_product(vector, '[1, two, 3]') FROM t").await;
    assert!(
        bad_text.contains("inner_product: argument 2 is not a vector literal of numbers: '[1, two, 3]'"),
        "{bad_text}"
    );
}
