//! Every bad input gets an error that names the function, the argument and the value.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, ListArray, RecordBatch};
use datafusion::arrow::datatypes::Float64Type;
use datafusion::catalog::MemTable;

use crate::common::{Shape, ctx, error, register, vectors};

#[tokio::test(flavor = "multi_thread")]
async fn planning_errors_name_function_argument_and_value() {
    let ctx = ctx();
    register(&ctx, "t", &vectors(10, 3, 1), 3, Shape::FixedF32);
    register(&ctx, "flat", &vectors(10, 2, 2), 2, Shape::FixedF32);
    let cases = [
        (
            "SELECT * FROM sim_join(nope, 0.1)",
            "Error during planning: sim_join: argument 'table': table 'nope' not found",
        ),
        (
            "SELECT * FROM sim_join(t, -0.1)",
            "Error during planning: sim_join: argument 'eps' must be >= 0 for metric l2, got -0.1",
        ),
        (
            "SELECT * FROM sim_join(t, 'NaN'::double)",
            "Error during planning: sim_join: argument 'eps' must be a finite number, got NaN",
        ),
        (
            "SELECT * FROM sim_join(t)",
            "Error during planning: sim_join: expected sim_join(table, eps [, options]) or sim_join(left, right, eps [, options]), got 1 arguments",
        ),
        (
            "SELECT * FROM sim_join(t, t, 'x')",
            "Error during planning: sim_join: argument 'eps' must be a number, got Utf8(\"x\")",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'metric=hammer')",
            "Error during planning: sim_join: options string 'metric=hammer': unknown metric 'hammer' (expected one of l2, l2sq, cosine, inner_product, l1, linf, levenshtein, jaccard, hamming)",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'metrc=l1')",
            "Error during planning: sim_join: options string 'metrc=l1': unknown option 'metrc' (expected one of metric, device, include_self, pairs, column, keys, index, grid_dims, gpu_memory_limit, devices, cache_size, rewrite_joins, rewrite_scans, tasks, approx, approx_recall, approx_effort, index_store)",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'gpu_memory_limit=2X')",
            "Error during planning: sim_join: options string 'gpu_memory_limit=2X': gpu_memory_limit must be a size such as 512M or 4G (units K, M, G), or 0 for no limit, got '2X'",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'devices=0;1')",
            "Error during planning: sim_join: options string 'devices=0;1': unknown devices '0;1' (expected all, or GPU ordinals such as 0,1)",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'devices=0,1, device=cpu')",
            "Error during planning: knn: option devices=0,1 selects GPUs, but device=cpu runs on the CPU",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'pairs=some')",
            "Error during planning: sim_join: options string 'pairs=some': unknown pairs 'some' (expected ordered or unordered)",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'include_self=maybe')",
            "Error during planning: sim_join: options string 'include_self=maybe': include_self must be true or false, got 'maybe'",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'metric=l1', 'x')",
            "Error during planning: sim_join: too many arguments: 2 after the last expected one",
        ),
        ("SELECT * FROM knn(t, t, 0)", "Error during planning: knn: argument 'k' must be a positive integer, got 0"),
        (
            "SELECT * FROM knn(t, t, 2.5)",
            "Error during planning: knn: argument 'k' must be a positive integer, got Float64(2.5)",
        ),
        (
            "SELECT * FROM knn(t, t)",
            "Error during planning: knn: expected knn(base, query, k [, options]), got 2 arguments",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'column=emb')",
            "Error during planning: knn: argument 'base' has no column 'emb' (columns: id, vector)",
        ),
        (
            "SELECT * FROM knn(t, flat, 3)",
            "Error during planning: knn: dimension mismatch: argument 'query' has 2-dimensional vectors, argument 'base' has 3",
        ),
        (
            "SELECT * FROM range_query(t, '[1, 2]', 0.5)",
            "Error during planning: range_query: dimension mismatch: argument 'query' has 2-dimensional vectors, argument 'base' has 3",
        ),
        (
            "SELECT * FROM range_query(t, '[1, x]', 0.5)",
            "Error during planning: range_query: argument 'query' is not a vector literal of numbers: '[1, x]'",
        ),
        (
            "SELECT * FROM range_query(t, t, -1, 'metric=cosine')",
            "Error during planning: range_query: argument 'r' must be >= 0 for metric cosine, got -1",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'device=tpu')",
            "Error during planning: sim_join: options string 'device=tpu': unknown device 'tpu' (expected one of auto, gpu, cpu)",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'index=kd_tree')",
            "Error during planning: sim_join: options string 'index=kd_tree': unknown index 'kd_tree' (expected one of auto, grid, brute_force, directory, list_of_clusters)",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'grid_dims=9')",
            "Error during planning: sim_join: options string 'grid_dims=9': grid_dims must be a whole number from 0 to 8, got '9'",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'index=grid, metric=inner_product')",
            "Error during planning: sim_join: option index=grid needs a metric that bounds coordinates (l2, l2sq, cosine, l1, linf), not inner_product",
        ),
        (
            "SELECT * FROM sim_join(t, 0.1, 'index=list_of_clusters, metric=l2sq')",
            "Error during planning: sim_join: option index=list_of_clusters needs a metric with the triangle inequality (l2, l1, linf, cosine, levenshtein), not l2sq",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'index=list_of_clusters, metric=inner_product')",
            "Error during planning: knn: option index=list_of_clusters needs a metric with the triangle inequality (l2, l1, linf, cosine, levenshtein), not inner_product",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'index=list_of_clusters, approx=true')",
            "Error during planning: knn: option index=list_of_clusters finds the exact neighbours; approx=true searches the Multicurves index instead (use one or the other)",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'index=list_of_clusters, device=gpu')",
            "Error during planning: knn: option device=gpu is not available with index=list_of_clusters: kNN through the List of Clusters runs on every CPU core (device=auto or cpu; joins and range queries search it on the GPU)",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'index=grid')",
            "Error during planning: knn: option index=grid is not available: kNN always scans every base row (index=auto, brute_force or list_of_clusters)",
        ),
        (
            "SELECT * FROM knn(t, t, 3, 'index=directory')",
            "Error during planning: knn: option index=directory is not available: kNN always scans every base row (index=auto, brute_force or list_of_clusters)",
        ),
        (
            "SELECT * FROM range_query(t, t, 0.5, 'index=directory, metric=inner_product')",
            "Error during planning: range_query: option index=directory needs a metric that bounds coordinates (l2, l2sq, cosine, l1, linf), not inner_product",
        ),
        (
            "SELECT * FROM sim_join(1, 0.1)",
            "Error during planning: sim_join: argument 'table' must be a table name or a file path, got 1",
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(error(&ctx, sql).await, want, "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn set_rejects_bad_option_values() {
    let ctx = ctx();
    let err = ctx.sql("SET simjoin.metric = 'hammer'").await.unwrap_err().strip_backtrace();
    assert_eq!(
        err,
        "Invalid or Unsupported Configuration: simjoin.metric: unknown metric 'hammer' (expected one of l2, l2sq, cosine, inner_product, l1, linf, levenshtein, jaccard, hamming)"
    );
    let err = ctx.sql("SET simjoin.colour = 'red'").await.unwrap_err().strip_backtrace();
    assert!(err.contains("unknown option 'colour'"), "{err}");
}

#[cfg(feature = "gpu")]
#[tokio::test(flavor = "multi_thread")]
async fn gpu_requests_without_a_gpu_say_why() {
    if simjoin::internal::gpu_probe().is_ok() {
        return; // a GPU machine: covered by `simjoin selftest`
    }
    let ctx = ctx();
    register(&ctx, "t", &vectors(10, 3, 1), 3, Shape::FixedF32);
    for (function, sql) in [
        ("sim_join", "SELECT * FROM sim_join(t, 0.1, 'device=gpu')"),
        ("range_query", "SELECT * FROM range_query(t, '[0, 0, 0]', 0.1, 'device=gpu')"),
        ("knn", "SELECT * FROM knn(t, t, 3, 'device=gpu')"),
    ] {
        let err = error(&ctx, sql).await;
        let expected = format!("Error during planning: {function}: option device=gpu, but no GPU can be used: ");
        assert!(err.starts_with(&expected), "{err}");
    }
    // `auto` falls back to the CPU.
    let batches =
        ctx.sql("SELECT count(*) FROM sim_join(t, 0.1, 'device=auto')").await.unwrap().collect().await.unwrap();
    assert_eq!(batches.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn ragged_lists_and_runtime_dimension_mismatch_are_execution_errors() {
    let ctx = ctx();
    let ragged = ListArray::from_iter_primitive::<Float64Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0)]),
        Some(vec![Some(1.0), Some(2.0), Some(3.0)]),
    ]);
    let batch = RecordBatch::try_from_iter([("v", Arc::new(ragged) as ArrayRef)]).unwrap();
    ctx.register_table("ragged", Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap())).unwrap();
    assert_eq!(
        error(&ctx, "SELECT * FROM knn(ragged, '[1, 2]', 1)").await,
        "Execution error: knn: argument 'base': vectors of different lengths: row 0 has 2 values, row 1 has 3"
    );
    register(&ctx, "lists", &vectors(5, 3, 1), 3, Shape::ListF64);
    register(&ctx, "pairs", &vectors(5, 2, 1), 2, Shape::ListF64);
    assert_eq!(
        error(&ctx, "SELECT * FROM sim_join(lists, pairs, 0.5)").await,
        "Execution error: sim_join: dimension mismatch: argument 'left' has 3-dimensional vectors, argument 'right' has 2"
    );
}
