//! Shared helpers: sessions, seeded tables in every accepted shape, and the brute-force f64 oracle
//! (written independently of the library from the definitions in docs/sql.md).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array, ListArray, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};

/// A session with a small batch size, so that results cross many batch edges.
pub fn ctx() -> SessionContext {
    let ctx = simjoin::session_context_with_config(SessionConfig::new().with_batch_size(97).with_target_partitions(3));
    // The tests' indexes stay out of the user's store (approx.rs tests the store in a folder of its own).
    ctx.state_ref().write().config_mut().options_mut().set("simjoin.index_store", "off").expect("a simjoin option");
    ctx
}

/// Deterministic pseudo-random values in [0, 1) (SplitMix64), rounded to f32.
pub fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0xD1B54A32D192ED03;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64) as f32 as f64
        })
        .collect()
}

/// How a test table stores its vectors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// `vector` FixedSizeList<Float32>.
    FixedF32,
    /// `vector` List<Float64>.
    ListF64,
    /// One Float64 column per coordinate (`x0`, `x1`, …).
    Columns,
}

/// Registers table `name` with columns `id` (0..n) and the vectors of `values` in `shape`, split
/// over several partitions of several batches. `None` rows are NULL vectors.
pub fn register(ctx: &SessionContext, name: &str, values: &[Option<Vec<f64>>], dim: usize, shape: Shape) {
    let n = values.len();
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let (fields, vector_columns): (Vec<Field>, Vec<ArrayRef>) = match shape {
        Shape::FixedF32 => {
            let item = Arc::new(Field::new("item", DataType::Float32, true));
            let flat: Float32Array = values
                .iter()
                .flat_map(|v| match v {
                    Some(v) => v.iter().map(|&x| Some(x as f32)).collect::<Vec<_>>(),
                    None => vec![None; dim],
                })
                .collect();
            let nulls = values.iter().map(Option::is_some).collect::<Vec<_>>();
            let list =
                FixedSizeListArray::try_new(item.clone(), dim as i32, Arc::new(flat), Some(nulls.into())).unwrap();
            (vec![Field::new("vector", DataType::FixedSizeList(item, dim as i32), true)], vec![Arc::new(list)])
        }
        Shape::ListF64 => {
            let list = ListArray::from_iter_primitive::<Float64Type, _, _>(
                values.iter().map(|v| v.as_ref().map(|v| v.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
            );
            (vec![Field::new("vector", list.data_type().clone(), true)], vec![Arc::new(list)])
        }
        Shape::Columns => (0..dim)
            .map(|d| {
                let column: Float64Array = values.iter().map(|v| v.as_ref().map(|v| v[d])).collect();
                (Field::new(format!("x{d}"), DataType::Float64, true), Arc::new(column) as ArrayRef)
            })
            .unzip(),
    };
    let mut all_fields = vec![Field::new("id", DataType::Int64, false)];
    all_fields.extend(fields);
    let schema = Arc::new(Schema::new(all_fields));
    let mut columns = vec![ids];
    columns.extend(vector_columns);
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    // Uneven batches over three partitions, in order: partition 0 holds the first rows, so the
    // scan order (the row order that breaks ties) is the `id` order.
    let mut slices = Vec::new();
    let mut start = 0;
    while start < n {
        let len = ((37 + 113 * slices.len()) % 250 + 1).min(n - start);
        slices.push(batch.slice(start, len));
        start += len;
    }
    let mut partitions = vec![vec![], vec![], vec![]];
    let count = slices.len();
    for (i, slice) in slices.into_iter().enumerate() {
        partitions[i * 3 / count].push(slice);
    }
    if n == 0 {
        partitions[0].push(batch);
    }
    let table = MemTable::try_new(schema, partitions).unwrap();
    ctx.deregister_table(name).unwrap();
    ctx.register_table(name, Arc::new(table)).unwrap();
}

/// `n` random `dim`-dimensional vectors.
pub fn vectors(n: usize, dim: usize, seed: u64) -> Vec<Option<Vec<f64>>> {
    random(n * dim, seed).chunks(dim).map(|c| Some(c.to_vec())).collect()
}

/// The distance of docs/sql.md, written out: sums in order, one term at a time.
pub fn distance(metric: &str, a: &[f64], b: &[f64]) -> f64 {
    let mut acc = 0.0;
    match metric {
        "l2" | "l2sq" => {
            for i in 0..a.len() {
                acc += (a[i] - b[i]) * (a[i] - b[i]);
            }
            if metric == "l2" { acc.sqrt() } else { acc }
        }
        "l1" => {
            for i in 0..a.len() {
                acc += (a[i] - b[i]).abs();
            }
            acc
        }
        "linf" => {
            for i in 0..a.len() {
                acc = f64::max(acc, (a[i] - b[i]).abs());
            }
            acc
        }
        "inner_product" => {
            for i in 0..a.len() {
                acc += a[i] * b[i];
            }
            -acc
        }
        "cosine" => {
            let (mut na, mut nb) = (0.0, 0.0);
            for i in 0..a.len() {
                acc += a[i] * b[i];
                na += a[i] * a[i];
                nb += b[i] * b[i];
            }
            1.0 - acc / (f64::sqrt(na) * f64::sqrt(nb))
        }
        other => panic!("unknown metric {other}"),
    }
}

/// Whether a row can match: not NULL, finite, and not the zero vector under cosine.
fn usable<'a>(metric: &str, v: &'a Option<Vec<f64>>) -> Option<&'a [f64]> {
    let v = v.as_deref()?;
    let finite = v.iter().all(|x| x.is_finite());
    let zero = metric == "cosine" && v.iter().all(|&x| x == 0.0);
    (finite && !zero).then_some(v)
}

/// A result row: (left or query id, right or base id, distance bits, rank).
pub type Row = (i64, i64, u64, i64);

/// Every (a, b) pair within `eps`, as the oracle computes it.
pub fn oracle_join(
    metric: &str,
    left: &[Option<Vec<f64>>],
    right: &[Option<Vec<f64>>],
    eps: f64,
    self_join: Option<(bool, bool)>,
) -> Vec<Row> {
    let mut out = Vec::new();
    for (i, a) in left.iter().enumerate() {
        let Some(a) = usable(metric, a) else { continue };
        for (j, b) in right.iter().enumerate() {
            let Some(b) = usable(metric, b) else { continue };
            if let Some((include_self, ordered)) = self_join {
                if i == j && !include_self {
                    continue;
                }
                if !ordered && j < i {
                    continue;
                }
            }
            let d = distance(metric, a, b);
            if d <= eps {
                out.push((i as i64, j as i64, d.to_bits(), 0));
            }
        }
    }
    out.sort();
    out
}

/// The k nearest base rows of every query, ties by base row.
pub fn oracle_knn(metric: &str, base: &[Option<Vec<f64>>], queries: &[Option<Vec<f64>>], k: usize) -> Vec<Row> {
    let mut out = Vec::new();
    for (i, q) in queries.iter().enumerate() {
        let Some(q) = usable(metric, q) else { continue };
        let mut all: Vec<(f64, usize)> = base
            .iter()
            .enumerate()
            .filter_map(|(j, b)| usable(metric, b).map(|b| (distance(metric, q, b), j)))
            .collect();
        all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        for (rank, (d, j)) in all.into_iter().take(k).enumerate() {
            out.push((i as i64, j as i64, d.to_bits(), rank as i64 + 1));
        }
    }
    out.sort();
    out
}

/// Runs `sql`, whose result has the id columns first, then `distance` (and `rank`), as sorted rows.
pub async fn rows(ctx: &SessionContext, sql: &str) -> Vec<Row> {
    let batches = ctx
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = Vec::new();
    for b in batches {
        let a = b.column(0).as_primitive::<Int64Type>();
        let c = b.column(1).as_primitive::<Int64Type>();
        let d = b.column(2).as_primitive::<Float64Type>();
        let r = (b.num_columns() > 3).then(|| b.column(3).as_primitive::<Int64Type>().clone());
        for i in 0..b.num_rows() {
            out.push((a.value(i), c.value(i), d.value(i).to_bits(), r.as_ref().map_or(0, |r| r.value(i))));
        }
    }
    out.sort();
    out
}

/// The error text of a query that must fail (at planning or execution).
pub async fn error(ctx: &SessionContext, sql: &str) -> String {
    let outcome = match ctx.sql(sql).await {
        Ok(df) => df.collect().await.map(|_| ()),
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => panic!("{sql} succeeded, expected an error"),
        Err(e) => e.strip_backtrace(),
    }
}

/// A distance quantile of random pairs, so thresholds give a useful number of matches.
pub fn threshold(metric: &str, values: &[Option<Vec<f64>>], fraction: f64) -> f64 {
    let mut d: Vec<f64> = Vec::new();
    let usable_rows: Vec<&[f64]> = values.iter().filter_map(|v| usable(metric, v)).collect();
    for i in (0..usable_rows.len()).step_by(7) {
        for j in (1..usable_rows.len()).step_by(11) {
            d.push(distance(metric, usable_rows[i], usable_rows[j]));
        }
    }
    d.sort_by(f64::total_cmp);
    d[((d.len() as f64 * fraction) as usize).min(d.len() - 1)]
}

/// Runs `sql` and returns the metrics of its `SimilarityExec` by name (summed over partitions).
pub async fn operator_metrics(ctx: &SessionContext, sql: &str) -> std::collections::HashMap<String, usize> {
    use datafusion::physical_plan::ExecutionPlan;
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await.unwrap();
    fn find(plan: &std::sync::Arc<dyn ExecutionPlan>) -> Option<std::sync::Arc<dyn ExecutionPlan>> {
        if plan.name() == "SimilarityExec" {
            return Some(plan.clone());
        }
        plan.children().into_iter().find_map(find)
    }
    let exec = find(&plan).expect("a SimilarityExec in the plan");
    let metrics = exec.metrics().expect("SimilarityExec has metrics").aggregate_by_name();
    metrics.iter().map(|m| (m.value().name().to_string(), m.value().as_usize())).collect()
}

/// The text of EXPLAIN ANALYZE (or EXPLAIN) for `sql`.
pub async fn explain(ctx: &SessionContext, sql: &str) -> String {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut text = String::new();
    for b in &batches {
        let plans = b.column(1).as_string::<i32>();
        for i in 0..b.num_rows() {
            text.push_str(plans.value(i));
            text.push('\n');
        }
    }
    text
}

/// Asserts that `SELECT count(*)` over the join `sql` (its select list replaced) is `want`: the
/// join's pairs counted (no column projected), not listed.
pub async fn check_count(ctx: &SessionContext, sql: &str, want: usize) {
    let (_, from) = sql.split_once(" FROM ").expect("a query with FROM");
    let counted = format!("SELECT count(*) FROM {from}");
    let batches = ctx.sql(&counted).await.unwrap().collect().await.unwrap_or_else(|e| panic!("{counted}: {e}"));
    let got = batches[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(got, want as i64, "{counted}");
}

/// Asserts that `sql` returns exactly `want`, reporting the first differences rather than both lists.
pub async fn check(ctx: &SessionContext, sql: &str, want: &[Row]) {
    let got = rows(ctx, sql).await;
    if got != want {
        let missing: Vec<_> = want.iter().filter(|r| got.binary_search(r).is_err()).take(5).collect();
        let extra: Vec<_> = got.iter().filter(|r| want.binary_search(r).is_err()).take(5).collect();
        let show = |rows: &[&Row]| {
            rows.iter()
                .map(|r| format!("({}, {}, {}, {})", r.0, r.1, f64::from_bits(r.2), r.3))
                .collect::<Vec<_>>()
                .join(" ")
        };
        panic!(
            "{sql}\n got {} rows, want {}\n missing: {}\n extra: {}",
            got.len(),
            want.len(),
            show(&missing),
            show(&extra)
        );
    }
}
