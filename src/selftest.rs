//! The GPU backend checked against the CPU backend (`simjoin selftest`): every operation × metric ×
//! option on seeded random and adversarial data, asserting identical answers (ids, distance bits
//! and kNN ranks). [`run`] prints a table of the cases and fails on any mismatch, and when no GPU
//! is usable (the point is to test one).

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    ArrayRef, AsArray, FixedSizeListArray, Float32Array, Float64Array, Int64Array, RecordBatch,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type};
use datafusion::catalog::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;

use crate::Metric;
use crate::datagen::{self, Distribution};
use crate::op::Checks;
use crate::options::SimJoinOptions;

/// (left or query id, right or base id, distance bits, kNN rank or 0).
type Row = (i64, i64, u64, i64);

async fn rows(ctx: &SessionContext, sql: &str) -> Result<Vec<Row>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out = Vec::new();
    for b in &batches {
        let (l, r, d) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
            b.column(2).as_primitive::<Float64Type>(),
        );
        let rank = (b.num_columns() > 3).then(|| b.column(3).as_primitive::<Int64Type>());
        out.extend(
            (0..b.num_rows()).map(|i| (l.value(i), r.value(i), d.value(i).to_bits(), rank.map_or(0, |c| c.value(i)))),
        );
    }
    out.sort_unstable();
    Ok(out)
}

/// Registers `values` as table `name`: a vector column of f32 (Parquet's layout) where every value
/// is one, else a Float64 column per coordinate (CSV's), which keeps them.
fn register(ctx: &SessionContext, name: &str, values: &[f64], dim: usize) -> Result<()> {
    let f32_values = values.iter().all(|&v| v.is_nan() || v as f32 as f64 == v);
    let batch: RecordBatch =
        if f32_values { datagen::vector_batch(values, dim)? } else { datagen::column_batch(values, dim)? };
    register_batch(ctx, name, batch)
}

/// Registers `batch` as the in-memory table `name`, replacing any table of that name.
fn register_batch(ctx: &SessionContext, name: &str, batch: RecordBatch) -> Result<()> {
    ctx.deregister_table(name)?;
    ctx.register_table(name, Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))?;
    Ok(())
}

/// In a table of `register_with_nulls`: whether row `row`'s vector is NULL (every ninth row).
fn null_vector(row: usize) -> bool {
    row % 9 == 4
}

/// In a table of `register_with_nulls`: whether coordinate `d` of row `row` is NULL (all of a NULL
/// vector's, and one of every seventh row's).
fn null_coordinate(row: usize, d: usize, dim: usize) -> bool {
    null_vector(row) || (row % 7 == 2 && d == row % dim)
}

/// Registers `values` as table `name` with NULLs where `null_vector` and `null_coordinate` say, in
/// the vector column layout (Parquet's) or, with `columns`, one nullable Float64 column per
/// coordinate (CSV's, where a NULL vector is a row of NULLs).
fn register_with_nulls(ctx: &SessionContext, name: &str, values: &[f64], dim: usize, columns: bool) -> Result<()> {
    let n = values.len() / dim;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let batch = if columns {
        let mut fields = vec![("id".to_string(), ids)];
        for d in 0..dim {
            let column: Float64Array =
                (0..n).map(|row| (!null_coordinate(row, d, dim)).then(|| values[row * dim + d])).collect();
            fields.push((format!("x{}", d + 1), Arc::new(column) as ArrayRef));
        }
        RecordBatch::try_from_iter(fields)?
    } else {
        let flat: Float32Array =
            (0..n * dim).map(|i| (!null_coordinate(i / dim, i % dim, dim)).then(|| values[i] as f32)).collect();
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let vectors = NullBuffer::from((0..n).map(|row| !null_vector(row)).collect::<Vec<_>>());
        let list = FixedSizeListArray::try_new(item, dim as i32, Arc::new(flat), Some(vectors))?;
        RecordBatch::try_from_iter([("id", ids), ("vector", Arc::new(list) as ArrayRef)])?
    };
    register_batch(ctx, name, batch)
}

/// Integer points with many duplicates and many pairs at exactly the threshold.
fn lattice(n: usize, dim: usize) -> Vec<f64> {
    (0..n * dim).map(|i| ((i * 7919) % 13) as f64).collect()
}

/// Gaussian points rounded to integers in [lo, lo + 255] (pixel-like bytes, or signed bytes for lo
/// = −128), the first rows repeated (equal distances, ties by position): byte rows on the GPU
/// (brute_join_tc_bytes).
fn bytes(n: usize, dim: usize, lo: f64, seed: u64) -> Vec<f64> {
    let mut values: Vec<f64> = datagen::generate(Distribution::Gaussian, n, dim, seed)
        .into_iter()
        .map(|g| (lo + 128.0 + 40.0 * g).round().clamp(lo, lo + 255.0))
        .collect();
    values.copy_within(0..20 * dim, 20 * dim);
    values
}

/// The lattice halved and moved off the integers (0.25, 0.75, …, 6.25: f32 values, exact
/// differences): its ties, on the f16 rows of brute_join_tc instead of byte rows.
fn half_lattice(n: usize, dim: usize) -> Vec<f64> {
    lattice(n, dim).into_iter().map(|v| v * 0.5 + 0.25).collect()
}

/// Gaussian points whose first 600 rows are one palindromic point, which the query table (the
/// first half reversed, coordinates too) holds 600 times: those queries find 600 base rows at
/// distance 0, more than kNN's first slots hold.
fn duplicates(n: usize, dim: usize) -> Vec<f64> {
    let mut values = datagen::generate(Distribution::Gaussian, n, dim, 10);
    let point: Vec<f64> = (0..dim).map(|i| values[i.min(dim - 1 - i)]).collect();
    for row in values.chunks_mut(dim).take(600) {
        row.copy_from_slice(&point);
    }
    values
}

/// Uniform points with zero vectors (NaN cosine distances), NaN rows (skipped) and a far outlier.
fn special(n: usize, dim: usize) -> Vec<f64> {
    let mut values = datagen::generate(Distribution::Uniform, n, dim, 6);
    for row in [5, 6, 7, 200] {
        values[row * dim..(row + 1) * dim].fill(0.0);
    }
    for row in [10, 11, 300] {
        values[row * dim] = f64::NAN;
    }
    values[400 * dim] = 1e6;
    values
}

/// A batch of `id` (0..) and text column `w`.
fn text_batch(words: &[Option<String>]) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("w", DataType::Utf8, true)]));
    let ids = Int64Array::from_iter_values(0..words.len() as i64);
    Ok(RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(StringArray::from(words.to_vec()))])?)
}

/// The table of the cases run, and which run: a case is named by its data and its query
/// (`uniform | 3000 × 2 | knn(a, b, 10, 'metric=l1')`), and runs when its name contains `only`.
struct Cases {
    table: String,
    only: Option<String>,
    /// How many cases ran.
    ran: usize,
}

impl Cases {
    fn new(only: Option<&str>) -> Self {
        let table = "| data | n × d | query | rows | cpu ms | gpu ms | result |\n|---|---|---|---|---|---|---|\n";
        Self { table: table.to_string(), only: only.map(str::to_string), ran: 0 }
    }

    /// Whether the case `name` runs (counted when it does).
    fn runs(&mut self, name: &str) -> bool {
        let runs = self.only.as_deref().is_none_or(|only| name.contains(only));
        self.ran += usize::from(runs);
        runs
    }
}

/// Runs `sql` (its options string last) on the CPU and on the GPU and adds a row to `cases`;
/// 1 when the answers differ or the GPU failed, else 0.
async fn compare(ctx: &SessionContext, sql: &str, data: &str, cases: &mut Cases) -> Result<usize> {
    compare_with(ctx, sql, data, cases, "gpu").await
}

/// [`compare`] with `device` (gpu, or auto) for the second run.
async fn compare_with(ctx: &SessionContext, sql: &str, data: &str, cases: &mut Cases, device: &str) -> Result<usize> {
    let query = sql.split(" FROM ").nth(1).unwrap_or_default();
    if !cases.runs(&format!("{data} | {query}")) {
        return Ok(0);
    }
    let started = Instant::now();
    // The CPU reference runs without the GPU selection (`, devices=0,1`).
    let cpu_sql = match sql.find(", devices=") {
        Some(at) => {
            let value = &sql[at + ", devices=".len()..];
            let mut end = 0;
            while let Some(c) = value[end..].chars().next()
                && (c.is_ascii_digit() || (c == ',' && value[end + 1..].starts_with(|d: char| d.is_ascii_digit())))
            {
                end += 1;
            }
            format!("{}{}", &sql[..at], &value[end..])
        }
        None => sql.to_string(),
    };
    let cpu = rows(ctx, &format!("{}, device=cpu')", cpu_sql.trim_end_matches("')"))).await?;
    let cpu_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let gpu = rows(ctx, &format!("{}, device={device}')", sql.trim_end_matches("')"))).await;
    let gpu_ms = started.elapsed().as_secs_f64() * 1e3;
    let (verdict, failed) = match &gpu {
        Ok(g) if *g == cpu => ("ok".to_string(), 0),
        Ok(g) => {
            let missing = cpu.iter().filter(|r| g.binary_search(r).is_err()).count();
            let extra = g.iter().filter(|r| cpu.binary_search(r).is_err()).count();
            (format!("MISMATCH: gpu {} rows, {missing} missing, {extra} extra", g.len()), 1)
        }
        Err(e) => (format!("GPU ERROR: {}", e.strip_backtrace()), 1),
    };
    cases.table.push_str(&format!("| {data} | {query} | {} | {cpu_ms:.1} | {gpu_ms:.1} | {verdict} |\n", cpu.len()));
    Ok(failed)
}

/// Runs the approximate kNN of `a`'s rows over `b` under `metric` on the cores and on the GPU and
/// adds a row to `cases`; 1 when the GPU failed, a distance it returned differs from the exact
/// kNN's for the same pair, its ranks are not 1, 2, … by distance, it finds fewer of the exact
/// neighbours than the cores searching by the curves alone at the same effort (by more than 1 %),
/// or, asked for the default recall target, it falls short of that by more than 0.02, else 0.
async fn check_approx(ctx: &SessionContext, metric: Metric, data: &str, cases: &mut Cases) -> Result<usize> {
    let query = format!("knn(a, b, 10, 'metric={metric}, approx=true')");
    if !cases.runs(&format!("{data} | {query}")) {
        return Ok(0);
    }
    let sql = |options: &str| {
        format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, 10, 'metric={metric}{options}')")
    };
    let exact = rows(ctx, &sql(", device=cpu")).await?;
    let truth: std::collections::HashMap<(i64, i64), u64> = exact.iter().map(|r| ((r.0, r.1), r.2)).collect();
    let recall =
        |found: &[Row]| found.iter().filter(|r| truth.contains_key(&(r.0, r.1))).count() as f64 / truth.len() as f64;
    // One effort on both: a recall target would let each choose its own.
    let started = Instant::now();
    let cpu = rows(ctx, &sql(", approx=true, approx_effort=1, device=cpu")).await?;
    let cpu_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let gpu = rows(ctx, &sql(", approx=true, approx_effort=1, device=gpu")).await;
    let gpu_ms = started.elapsed().as_secs_f64() * 1e3;
    let targeted = rows(ctx, &sql(", approx=true, device=gpu")).await;
    let (verdict, failed) = match &gpu {
        Err(e) => (format!("GPU ERROR: {}", e.strip_backtrace()), 1),
        Ok(gpu) => {
            let wrong = gpu.iter().filter(|r| truth.get(&(r.0, r.1)).is_some_and(|&d| d != r.2)).count();
            let mut ranked = gpu.clone();
            ranked.sort_unstable_by_key(|r| (r.0, r.3));
            let misranked = ranked
                .windows(2)
                .filter(|w| {
                    let same = w[0].0 == w[1].0;
                    (same && (w[1].3 != w[0].3 + 1 || f64::from_bits(w[1].2) < f64::from_bits(w[0].2)))
                        || (!same && w[1].3 != 1)
                })
                .count();
            let (cpu_recall, gpu_recall) = (recall(&cpu), recall(gpu));
            let target_recall = targeted.as_deref().map_or(0.0, recall);
            let verdict =
                format!("recall cpu {cpu_recall:.3}, gpu {gpu_recall:.3}; to the default target {target_recall:.3}");
            let short = target_recall < crate::op::DEFAULT_APPROX_RECALL - 0.02;
            if wrong > 0 || misranked > 0 || gpu.len() != exact.len() || gpu_recall < cpu_recall - 0.01 || short {
                (format!("MISMATCH: {verdict}, {} rows, {wrong} wrong distances, {misranked} misranked", gpu.len()), 1)
            } else {
                (verdict, 0)
            }
        }
    };
    cases.table.push_str(&format!(
        "| {data} | {query} | {} | {cpu_ms:.1} | {gpu_ms:.1} | {verdict} |
",
        exact.len()
    ));
    Ok(failed)
}

/// The Multicurves index with its curves ordered on the device (`build_on_device`) against the
/// one ordered on the cores: every curve's keys and positions the same, and the queries keyed the
/// same (the bounds the same); with the time each build took. Returns the failures.
fn check_device_curves(device: &Arc<crate::cuda::GpuDevice>, datasets: &[(&str, Vec<f64>, usize)]) -> usize {
    use crate::index::curves::{Geometry, Multicurves};
    let large = ("blobs", datagen::generate(Distribution::Blobs, 200_000, 128, 21), 128);
    let cases = [(&datasets[2], Geometry::Raw), (&datasets[8], Geometry::Unit), (&large, Geometry::Raw)];
    let mut failures = 0;
    for ((name, values, dim), geometry) in cases {
        let base = crate::vectors::Vectors::new(*dim, values.clone());
        let started = Instant::now();
        let cores = Multicurves::build(&base, geometry);
        let cores_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let (on_device, lists) = crate::backend::gpu::build_on_device(device, &base, geometry);
        let device_ms = started.elapsed().as_secs_f64() * 1e3;
        let what = format!("{name} {} × {dim} ({geometry:?}): the curves ordered on the GPU", base.len());
        let same_lists = (0..cores.curve_count()).all(|c| cores.curve(c) == on_device.curve(c));
        let rows = 0..base.len().min(64);
        let same_keys = cores.query_keys(&base, rows.clone()).1 == on_device.query_keys(&base, rows).1;
        match lists {
            Err(e) => {
                failures += 1;
                println!("selftest: GPU ERROR: {what}: {e}");
            }
            Ok(_) if same_lists && same_keys => {
                println!("selftest: {what} are the cores' (build {device_ms:.0} ms, on the cores {cores_ms:.0} ms)")
            }
            Ok(_) => {
                failures += 1;
                println!("selftest: MISMATCH: {what}: lists the same {same_lists}, query keys the same {same_keys}");
            }
        }
    }
    failures
}

/// The kNN graph built on the device (graph_nearest) against the cores' (index/graph.rs): every
/// row lists distinct rows other than itself, and the rows' own nearest hold as many of their
/// true nearest (by f32 distance over the index's rows, on every 50th row) as the cores' less
/// 0.02; with the time each build took. Returns the failures.
fn check_device_graph(device: &Arc<crate::cuda::GpuDevice>, datasets: &[Dataset]) -> usize {
    use crate::index::curves::{Geometry, Multicurves};
    use crate::index::graph::{DEGREE, NeighbourGraph};
    let large = ("blobs", datagen::generate(Distribution::Blobs, 200_000, 128, 21), 128);
    let cases =
        [(&datasets[7], Metric::L2), (&datasets[7], Metric::Cosine), (&datasets[11], Metric::L1), (&large, Metric::L2)];
    let mut failures = 0;
    for ((name, values, dim), metric) in cases {
        let base = crate::vectors::Vectors::new(*dim, values.clone());
        let index = Multicurves::build(&base, Geometry::of(metric).expect("an approximate metric"));
        let started = Instant::now();
        let cores = crate::backend::build_graph(&index);
        let cores_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let built = crate::backend::gpu::graph_built_on_device(device, &index, *dim, metric);
        let device_ms = started.elapsed().as_secs_f64() * 1e3;
        let what = format!("{name} {} × {dim} ({metric}): the kNN graph built on the GPU", base.len());
        let on_device = match built {
            Ok(graph) => graph,
            Err(e) => {
                failures += 1;
                println!("selftest: GPU ERROR: {what}: {e}");
                continue;
            }
        };
        let n = index.len();
        let rows = index.all_values();
        let score = |i: usize, j: usize| -> f32 {
            let (a, b) = (&rows[i * dim..][..*dim], &rows[j * dim..][..*dim]);
            let terms = a.iter().zip(b).map(|(x, y)| (x - y).abs());
            match metric {
                Metric::L1 => terms.sum(),
                _ => terms.map(|t| t * t).sum(),
            }
        };
        let sample: Vec<usize> = (0..n).step_by(50).collect();
        let recall = |graph: &NeighbourGraph| {
            use rayon::prelude::*;
            let found: usize = sample
                .par_iter()
                .map(|&i| {
                    let mut all: Vec<(f32, usize)> = (0..n).filter(|&j| j != i).map(|j| (score(i, j), j)).collect();
                    all.select_nth_unstable_by(DEGREE - 1, |a, b| a.0.total_cmp(&b.0));
                    let own: Vec<u32> = graph.neighbours(i).take(DEGREE).collect();
                    all[..DEGREE].iter().filter(|(_, j)| own.contains(&(*j as u32))).count()
                })
                .sum();
            found as f64 / (sample.len() * DEGREE) as f64
        };
        let malformed = (0..n)
            .filter(|&i| {
                let mut edges: Vec<u32> = on_device.neighbours(i).collect();
                let listed = edges.len();
                edges.sort_unstable();
                edges.dedup();
                edges.len() != listed || edges.contains(&(i as u32)) || edges.last().is_some_and(|&j| j as usize >= n)
            })
            .count();
        let (cores_recall, device_recall) = (recall(&cores), recall(&on_device));
        let verdict = format!(
            "recall of the {DEGREE} nearest {device_recall:.3}, the cores' {cores_recall:.3} (build {device_ms:.0} ms, on the cores {cores_ms:.0} ms)"
        );
        if malformed > 0 || device_recall < cores_recall - 0.02 {
            failures += 1;
            println!("selftest: MISMATCH: {what}: {verdict}, {malformed} rows with repeated, own or missing rows");
        } else {
            println!("selftest: {what}: {verdict}");
        }
    }
    failures
}

/// The joins of table `a` and range queries of `b` run with `options`: a self-join with ordered
/// pairs, one with unordered pairs and each row with itself, `a` against `b`, and `a`'s rows as
/// range queries over `b`.
fn join_queries(eps: f64, options: &str) -> [String; 4] {
    [
        format!("SELECT left_id, right_id, distance FROM sim_join(a, {eps:?}, '{options}')"),
        format!(
            "SELECT left_id, right_id, distance FROM sim_join(a, {eps:?}, '{options}, pairs=unordered, include_self=true')"
        ),
        format!("SELECT left_id, right_id, distance FROM sim_join(a, b, {eps:?}, '{options}')"),
        format!("SELECT query_id, base_id, distance FROM range_query(a, b, {eps:?}, '{options}')"),
    ]
}

/// Registers `values` as table `a` and the reverse of its first half as table `b`; `a`'s rows.
fn register_pair(ctx: &SessionContext, values: &[f64], dim: usize) -> Result<usize> {
    register(ctx, "a", values, dim)?;
    register(ctx, "b", &reversed_half(values, dim), dim)?;
    Ok(values.len() / dim)
}

/// The query side of the A/B cases: `values`' rows in reverse order, coordinates too, as many as
/// half of them (so the two sides share rows and distances 0 but differ in order).
fn reversed_half(values: &[f64], dim: usize) -> Vec<f64> {
    values.iter().rev().copied().take((values.len() / dim / 2) * dim).collect()
}

/// The value of the operator's metric `name` in the EXPLAIN ANALYZE of `sql` (0 when absent).
async fn explained_metric(ctx: &SessionContext, sql: &str, name: &str) -> Result<u64> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
    let value = text
        .split(&format!(" {name}="))
        .nth(1)
        .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>());
    Ok(value.and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// The operator's metric `name` in the EXPLAIN ANALYZE of `sql`, printed after `what`: 1 (a
/// failure, printed with what was `expected`) where `ok` rejects it, else 0. A case named by
/// `what` and `name`.
async fn check_metric(
    ctx: &SessionContext,
    cases: &mut Cases,
    sql: &str,
    name: &str,
    what: &str,
    ok: impl Fn(u64) -> bool,
    expected: &str,
) -> Result<usize> {
    if !cases.runs(&format!("{what} | {name}")) {
        return Ok(0);
    }
    let value = explained_metric(ctx, sql, name).await?;
    println!("selftest: {what}: {name} = {value}");
    if ok(value) {
        return Ok(0);
    }
    println!("selftest: MISMATCH: {what}: {name} should be {expected}, got {value}");
    Ok(1)
}

/// A dataset of the selftest: its name, its values and their dimension.
type Dataset = (&'static str, Vec<f64>, usize);

/// The vector sets the cases run on (the sections below pick some by position).
fn datasets() -> Vec<Dataset> {
    vec![
        ("uniform", datagen::generate(Distribution::Uniform, 3000, 2, 1), 2),
        ("exponential", datagen::generate(Distribution::Exponential, 4000, 3, 2), 3),
        ("blobs", datagen::generate(Distribution::Blobs, 2500, 8, 3), 8),
        ("gaussian", datagen::generate(Distribution::Gaussian, 1200, 33, 4), 33),
        // Coordinates that are not f32 values (registered as Float64 columns, which keep them):
        // every other set is f32 input.
        (
            "gaussian f64",
            datagen::generate(Distribution::Gaussian, 1200, 33, 4)
                .into_iter()
                .map(|v| v * (1.0 + 2f64.powi(-40)))
                .collect(),
            33,
        ),
        ("lattice", lattice(700, 4), 4),
        ("special", special(900, 3), 3),
        // More base rows than kNN's 4096-row sample: sampled radii, not exact ones.
        ("gaussian", datagen::generate(Distribution::Gaussian, 9000, 16, 5), 16),
        // Integer coordinates in one window of 256: rows of three chunks of 128 bytes (the last
        // part-filled), and signed bytes.
        ("bytes", bytes(1500, 300, 0.0, 8), 300),
        ("signed bytes", bytes(1200, 40, -128.0, 9), 40),
        // kNN's first pass keeps the filter's scores where brute_join_tc runs on f16 rows (L2, k
        // ≤ 32): ties, and slots that overflow.
        ("half lattice", half_lattice(700, 4), 4),
        ("duplicates", duplicates(6000, 8), 8),
    ]
}

/// Runs every case (with `only`, those whose name contains it) on the GPU and on the CPU cores and
/// prints a table of them; `Err` when any answer differs, and (unless `allow_cpu_only`) when no GPU
/// is usable.
pub async fn run(allow_cpu_only: bool, only: Option<&str>) -> Result<()> {
    let gpu = crate::cuda::GpuDevice::shared();
    match &gpu {
        Ok(device) => {
            let kernels = if crate::cuda::compile::embedded_archs().contains(&device.arch) {
                "built into this binary"
            } else {
                "compiled by NVRTC or read from its cache"
            };
            println!("selftest on {} ({} kernels {kernels})", device.info, device.arch)
        }
        Err(reason) if allow_cpu_only => println!("selftest without a GPU ({reason}): GPU runs will fail"),
        Err(reason) => return Err(DataFusionError::Execution(format!("selftest needs a GPU: {reason}"))),
    }
    let ctx = crate::session_context();
    // Several GPUs: every one named, so that every case below is divided among them, as a large
    // run is under `devices=all` (where a small one runs on the first GPU alone).
    let count = crate::cuda::device_count().unwrap_or(0);
    if count > 1 {
        let every = (0..count.min(crate::cuda::MAX_DEVICES)).map(|o| o.to_string()).collect::<Vec<_>>();
        ctx.sql(&format!("SET simjoin.devices = '{}'", every.join(","))).await?;
    }
    let mut failures = 0;
    let mut cases = Cases::new(only);
    let datasets = datasets();
    let device = gpu.as_ref().ok();
    failures += every_metric_and_index(&ctx, &datasets, &mut cases).await?;
    failures += on_each_gpu(&ctx, &datasets, count, &mut cases).await?;
    failures += divided_with_the_cores(&ctx, &datasets, &mut cases).await?;
    failures += approximate(&ctx, &datasets, device, &mut cases).await?;
    failures += text(&ctx, &mut cases).await?;
    failures += large_results(&ctx, &datasets, &mut cases).await?;
    failures += nulls(&ctx, &mut cases).await?;
    failures += tiled(&ctx, &datasets, device, &mut cases).await?;
    // In-memory inputs stay converted and, on the GPU, their rows stay on the device (docs/sql.md:
    // vectors kept across queries): a repeated query uploads neither side again. Every case
    // above after a table's first GPU query ran on such kept rows.
    let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'device=gpu')";
    explained_metric(&ctx, explain, "resident_inputs").await?;
    failures += check_metric(
        &ctx,
        &mut cases,
        explain,
        "resident_inputs",
        "a repeated kNN over in-memory tables",
        |kept| kept == 2,
        "2 (both sides on the GPU)",
    )
    .await?;
    println!("{}", cases.table);
    if let Some(device) = device
        && cases.runs("a 100 MB upload through the staging buffers")
    {
        failures += staged_upload(device);
    }
    if failures > 0 {
        return Err(DataFusionError::Execution(format!("selftest: {failures} case(s) differ between GPU and CPU")));
    }
    if let (0, Some(only)) = (cases.ran, &cases.only) {
        return Err(DataFusionError::Execution(format!("selftest: no case's name contains '{only}'")));
    }
    println!("selftest: every GPU answer equals the CPU answer ({} cases)", cases.ran);
    Ok(())
}

/// Every dataset under every metric and index: joins, range queries, their counts and summaries,
/// a join wider than the count pass collects, and kNN at several k.
async fn every_metric_and_index(ctx: &SessionContext, datasets: &[Dataset], cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    for (name, values, dim) in datasets {
        let n = register_pair(ctx, values, *dim)?;
        for metric in Metric::ALL {
            let eps = datagen::calibrate_threshold(values, *dim, 20.0, metric, 9);
            let eps = if *name == "lattice" && metric != Metric::InnerProduct { eps.round().max(1.0) } else { eps };
            // The List of Clusters (kernels/clusters.cu) under every metric with the triangle
            // inequality; the quantile directory (kernels/directory_join.cu) under every metric
            // that bounds coordinates, as the grid.
            let indexes: &[&str] = match metric {
                Metric::InnerProduct => &["auto"],
                Metric::L2Squared => &["auto", "grid", "directory", "brute_force"],
                _ => &["auto", "grid", "directory", "brute_force", "list_of_clusters"],
            };
            for index in indexes {
                let options = format!("metric={metric}, index={index}");
                let queries = join_queries(eps, &options);
                // k = n and k > n where the result stays small; k beyond the sample's rank range
                // (radii of several levels) on the large set.
                let ks = if n <= 4000 { vec![1, 10, 64, n, n + 7] } else { vec![1, 10, 64, 700] };
                let knn = (*index == "auto").then(|| {
                    ks.iter()
                        .map(|k| {
                            format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, 'metric={metric}')")
                        })
                        .collect::<Vec<_>>()
                });
                // About 700 neighbours per row (350 unordered pairs; every pair of the 700-row
                // lattice): more than the GPU's count pass collects (256 per left row), so these
                // take its write passes.
                let wide = (metric == Metric::L2).then(|| {
                    let eps = datagen::calibrate_threshold(values, *dim, 700.0, metric, 9);
                    format!(
                        "SELECT left_id, right_id, distance FROM sim_join(a, {eps:?}, '{options}, pairs=unordered')"
                    )
                });
                // The same joins counted (no column of the join projected: the GPU's count pass
                // alone, no pair listed), in the (id, id, distance) shape `rows` reads.
                let from = |q: &String| q.split_once(" FROM ").map_or("", |(_, f)| f).to_string();
                let counted: Vec<String> =
                    queries.iter().map(|q| format!("SELECT count(*), 0, 0.0 FROM {}", from(q))).collect();
                // And with their smallest and largest distance, computed in the operator too
                // (exec/summary.rs): the pairs come back to be summarised, none listed.
                let summarised: Vec<String> = match *index {
                    "auto" => queries
                        .iter()
                        .map(|q| format!("SELECT count(*), 0, min(distance) + max(distance) FROM {}", from(q)))
                        .collect(),
                    _ => Vec::new(),
                };
                let all = queries.into_iter().chain(counted).chain(summarised).chain(wide);
                for sql in all.chain(knn.into_iter().flatten()) {
                    failures += compare(ctx, &sql, &format!("{name} | {n} × {dim}"), cases).await?;
                }
            }
        }
    }
    Ok(failures)
}

/// Several GPUs: each one alone, and the first two together; a kNN divided between GPUs 0 and 1.
async fn on_each_gpu(ctx: &SessionContext, datasets: &[Dataset], count: usize, cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    // Several GPUs: every case above ran divided among all of them; these run on each one alone,
    // and on the first two together.
    if count > 1 {
        let selections = (0..count).map(|o| o.to_string()).chain(["0,1".to_string()]);
        for devices in selections {
            // (The exponential set's dense corner makes slot ranges of equal counts unequal work.)
            for (name, values, dim) in [&datasets[0], &datasets[1], &datasets[7]] {
                let n = register_pair(ctx, values, *dim)?;
                for metric in [Metric::L2, Metric::Cosine] {
                    let eps = datagen::calibrate_threshold(values, *dim, 20.0, metric, 9);
                    let options = format!("metric={metric}, devices={devices}");
                    let knn = format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, 10, '{options}')");
                    for sql in join_queries(eps, &options).into_iter().chain([knn]) {
                        let data = format!("{name} | {n} × {dim} on GPUs {devices}");
                        failures += compare(ctx, &sql, &data, cases).await?;
                    }
                }
            }
        }
    }
    if count > 1 {
        // EXPLAIN ANALYZE gives each GPU's part (the 9000 × 16 pair is registered last).
        let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'device=gpu, devices=0,1')";
        let what = "a kNN divided between GPUs 0 and 1";
        failures += check_metric(ctx, cases, explain, "gpu1_rows", what, |rows| rows > 0, "more than 0").await?;
    }
    Ok(failures)
}

/// Runs divided between the GPU and the cores.
async fn divided_with_the_cores(ctx: &SessionContext, datasets: &[Dataset], cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    // Runs divided between the GPU and the CPU cores (device=auto with a forced share of the
    // left rows for the GPU): the same answers as the CPU alone.
    SimJoinOptions::set_checks(ctx, Checks { gpu_share: Some(0.37), ..Checks::default() });
    for (name, values, dim) in [&datasets[1], &datasets[5], &datasets[7]] {
        let n = register_pair(ctx, values, *dim)?;
        for metric in [Metric::L2, Metric::L1, Metric::Cosine] {
            let eps = datagen::calibrate_threshold(values, *dim, 20.0, metric, 9);
            let options = format!("metric={metric}");
            let [_, _, join, range] = join_queries(eps, &options);
            let knn = format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, 10, '{options}')");
            for sql in [join, range, knn] {
                failures += compare_with(ctx, &sql, &format!("{name} | {n} × {dim} divided"), cases, "auto").await?;
            }
        }
    }
    let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'device=auto')";
    let what = "a kNN divided between the GPU and the CPU";
    failures += check_metric(ctx, cases, explain, "divided_cpu_rows", what, |rows| rows > 0, "more than 0").await?;
    SimJoinOptions::set_checks(ctx, Checks::default());
    Ok(failures)
}

/// The approximate kNN's search on the GPU, and the Multicurves ordered on the device.
async fn approximate(
    ctx: &SessionContext,
    datasets: &[Dataset],
    gpu: Option<&Arc<crate::cuda::GpuDevice>>,
    cases: &mut Cases,
) -> Result<usize> {
    let mut failures = 0;
    // The approximate kNN's search of the Multicurves index on the GPU (forced where the exact kNN
    // would be estimated faster): exact distances and ranks, and the recall of the cores' search
    // of the same candidates (by the curves alone, without the graph) or better.
    SimJoinOptions::set_checks(ctx, Checks { approx_search_on_gpu: true, curves_alone: true, ..Checks::default() });
    for (name, values, dim) in [&datasets[2], &datasets[4], &datasets[7], &datasets[8]] {
        let n = register_pair(ctx, values, *dim)?;
        for metric in [Metric::L2, Metric::Cosine, Metric::L1, Metric::LInf] {
            failures += check_approx(ctx, metric, &format!("{name} | {n} × {dim}"), cases).await?;
        }
    }
    // The kNN graph walked on the GPU (approx_walk) where the cores walk it too (a base of more
    // rows than the curves' search takes, kept in memory): the cores' recall or better, and rows
    // reached through the graph.
    SimJoinOptions::set_checks(ctx, Checks { approx_search_on_gpu: true, ..Checks::default() });
    for (name, values, dim) in [&datasets[7], &datasets[11]] {
        let n = register_pair(ctx, values, *dim)?;
        for metric in [Metric::L2, Metric::Cosine, Metric::L1, Metric::LInf] {
            failures += check_approx(ctx, metric, &format!("{name} | {n} × {dim} graph"), cases).await?;
        }
        let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'approx=true, approx_effort=1, device=gpu')";
        let what = format!("{name} {n} × {dim} approximate kNN walking the graph");
        failures += check_metric(ctx, cases, explain, "graph_rows", &what, |rows| rows > 0, "more than 0").await?;
    }
    SimJoinOptions::set_checks(ctx, Checks::default());
    if let Some(device) = gpu
        && cases.runs("Multicurves ordered on the device")
    {
        failures += check_device_curves(device, &datasets);
    }
    if let Some(device) = gpu
        && cases.runs("kNN graph built on the device")
    {
        failures += check_device_graph(device, &datasets);
    }
    Ok(failures)
}

/// Text under the edit distance: joins, range queries and kNN of seeded words.
async fn text(ctx: &SessionContext, cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    // Text (metric=levenshtein): joins, range queries and kNN of seeded words (`datagen::words`: mutated
    // copies, non-ASCII characters, strings of up to 8 machine words, empty strings, NULLs) on the
    // GPU against the CPU's segment filter.
    let (a, b) = (datagen::words(3000, 450, 12), datagen::words(1500, 450, 13));
    register_batch(ctx, "a", text_batch(&a)?)?;
    register_batch(ctx, "b", text_batch(&b)?)?;
    for tau in [0, 1, 2, 3, 6] {
        for options in ["metric=levenshtein", "metric=levenshtein, index=list_of_clusters"] {
            for sql in join_queries(tau as f64, options) {
                failures += compare(ctx, &sql, "words | 3000 and 1500", cases).await?;
            }
        }
    }
    // kNN of strings: the radius grows from 1 edit by doubling up to the longest string (450
    // characters), ties by base position; k = 2,000 asks for more than the 1,500 base strings.
    for k in [1, 5, 50, 2000] {
        let sql = format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, 'metric=levenshtein')");
        failures += compare(ctx, &sql, "words | 3000 and 1500", cases).await?;
    }
    Ok(failures)
}

/// Results larger than the GPU's buffers: collected pairs in several download batches, write
/// passes, kNN lists ranked on the device after write passes.
async fn large_results(ctx: &SessionContext, datasets: &[Dataset], cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    // More collected pairs (~5·10⁶) than one download batch (2²²): the batches alternate between
    // the two halves of the host buffers, each copied while the one before is emitted.
    let values = datagen::generate(Distribution::Uniform, 50_000, 2, 7);
    register(ctx, "a", &values, 2)?;
    let eps = datagen::calibrate_threshold(&values, 2, 200.0, Metric::L2, 9);
    let sql = format!("SELECT left_id, right_id, distance FROM sim_join(a, {eps:?}, 'pairs=unordered')");
    failures += compare(ctx, &sql, "uniform | 50000 × 2", cases).await?;
    // More pairs (~1.5·10⁷) than the count pass collects (256 per row): write passes in batches of
    // 2²², more batches than pipeline streams, so each stream's buffers are used again.
    let eps = datagen::calibrate_threshold(&values, 2, 600.0, Metric::L2, 9);
    let sql = format!("SELECT left_id, right_id, distance FROM sim_join(a, {eps:?}, 'pairs=unordered')");
    failures += compare(ctx, &sql, "uniform | 50000 × 2", cases).await?;
    // kNN lists ranked on the device after write passes (knn_rank_lists), ties included: under a
    // limit that leaves the first count pass no candidate slots (a quarter of 1 MB holds 21,845
    // values; the lattice's 700 queries at k = 10 want ~82,000), every query's candidates come
    // from write passes. The lattice's 13 values a coordinate make many equal distances (ties by
    // base position); the special set has zero vectors, NaN rows and an outlier.
    for (name, values, dim) in [&datasets[5], &datasets[6]] {
        let n = register_pair(ctx, values, *dim)?;
        for metric in [Metric::L2, Metric::L1, Metric::Cosine] {
            for k in [1, 10, 100, n] {
                let sql = format!(
                    "SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, 'metric={metric}, gpu_memory_limit=1M')"
                );
                failures += compare(ctx, &sql, &format!("{name} | {n} × {dim} write passes"), cases).await?;
            }
        }
        // On one GPU: divided among several, each part's candidates may fit the limit.
        let explain =
            "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'gpu_memory_limit=1M, device=gpu, devices=0')";
        let what = format!("{name} {n} × {dim} kNN under gpu_memory_limit=1M");
        failures += check_metric(ctx, cases, explain, "write_passes", &what, |passes| passes > 0, "at least 1").await?;
    }
    Ok(failures)
}

/// NULL vectors and NULL coordinates on either side, in both layouts.
async fn nulls(ctx: &SessionContext, cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    // NULL vectors and NULL coordinates, in both layouts: such rows never match (docs/sql.md), and the
    // GPU must leave out exactly the rows the CPU leaves out, on either side, for every function.
    let (n, dim) = (800, 4);
    let values = datagen::generate(Distribution::Uniform, n, dim, 11);
    let queries = reversed_half(&values, dim);
    let rows_with_nulls =
        |side: &[f64]| (0..side.len() / dim).filter(|&row| (0..dim).any(|d| null_coordinate(row, d, dim))).count();
    let skipped = rows_with_nulls(&values) + rows_with_nulls(&queries);
    for columns in [false, true] {
        register_with_nulls(ctx, "a", &values, dim, columns)?;
        register_with_nulls(ctx, "b", &queries, dim, columns)?;
        let layout = if columns { "x1..x4 columns" } else { "vector column" };
        for metric in [Metric::L2, Metric::Cosine] {
            let eps = datagen::calibrate_threshold(&values, dim, 20.0, metric, 9);
            let options = format!("metric={metric}");
            let knn = [1, 10, n, n + 7]
                .map(|k| format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, '{options}')"));
            for sql in join_queries(eps, &options).into_iter().chain(knn) {
                failures += compare(ctx, &sql, &format!("NULLs, {layout} | {n} × {dim}"), cases).await?;
            }
        }
        let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'device=gpu')";
        let what = format!("kNN with NULLs in the {layout}");
        failures += check_metric(
            &ctx,
            cases,
            explain,
            "skipped_rows",
            &what,
            |rows| rows == skipped as u64,
            &skipped.to_string(),
        )
        .await?;
    }
    Ok(failures)
}

/// Inputs larger than the device memory a run may use, and byte rows on wgmma devices.
async fn tiled(
    ctx: &SessionContext,
    datasets: &[Dataset],
    gpu: Option<&Arc<crate::cuda::GpuDevice>>,
    cases: &mut Cases,
) -> Result<usize> {
    let mut failures = 0;
    // Inputs larger than the device memory a run may use (gpu_memory_limit): tiles of ~1,000 rows
    // (a quarter of the limit at 14·d + 78 bytes a row), with result buffers small enough that
    // most tiles take write passes too.
    // (The integer set's tiles each get byte rows of their own.)
    for (dataset, limit) in [(&datasets[0], "415K"), (&datasets[7], "1M"), (&datasets[8], "5M")] {
        let (name, values, dim) = dataset;
        let n = register_pair(ctx, values, *dim)?;
        for metric in [Metric::L2, Metric::Cosine, Metric::InnerProduct, Metric::L1] {
            let eps = datagen::calibrate_threshold(values, *dim, 20.0, metric, 9);
            let options = format!("metric={metric}, gpu_memory_limit={limit}");
            let knn = [10, 1500]
                .map(|k| format!("SELECT query_id, base_id, distance, rank FROM knn(a, b, {k}, '{options}')"));
            for sql in join_queries(eps, &options).into_iter().chain(knn) {
                failures += compare(ctx, &sql, &format!("{name} | {n} × {dim} tiled"), cases).await?;
            }
        }
        // The limit did split the inputs: EXPLAIN ANALYZE counts the tiles run.
        let explain =
            format!("EXPLAIN ANALYZE SELECT count(*) FROM sim_join(a, 1.0, 'gpu_memory_limit={limit}, device=gpu')");
        let what = format!("{name} {n} × {dim} self-join under gpu_memory_limit={limit}");
        failures += check_metric(ctx, cases, &explain, "tiles", &what, |tiles| tiles >= 3, "at least 3").await?;
        // On several GPUs the kNN's base, too large for each beside its share of the queries, was
        // divided among them.
        if crate::cuda::device_count().unwrap_or(0) > 1 {
            let explain = format!(
                "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'gpu_memory_limit={limit}, device=gpu, devices=0,1')"
            );
            let what = format!("{name} {n} × {dim} kNN under gpu_memory_limit={limit} on GPUs 0 and 1");
            failures +=
                check_metric(ctx, cases, &explain, "gpu1_base_rows", &what, |rows| rows > 0, "more than 0").await?;
        }
    }
    // Byte rows served the integer sets' L2 brute force on devices with wgmma (sm_90a).
    if gpu.is_some_and(|device| device.arch == "sm_90a") {
        for (name, values, dim) in [&datasets[8], &datasets[9]] {
            let n = register_pair(ctx, values, *dim)?;
            let explain = "EXPLAIN ANALYZE SELECT count(*) FROM knn(a, b, 10, 'device=gpu')";
            let what = format!("{name} {n} × {dim} kNN");
            failures +=
                check_metric(ctx, cases, explain, "byte_row_tiles", &what, |tiles| tiles > 0, "at least 1").await?;
        }
    }
    Ok(failures)
}

/// Inputs of 64 MB and more pass through the pinned staging buffers, which the small sets never
/// reach: a round trip of 100 MB that must come back bit for bit. Returns the failures.
fn staged_upload(device: &Arc<crate::cuda::GpuDevice>) -> usize {
    let values: Vec<f64> =
        (0..12_500_000u64).map(|i| (i as f64).sqrt() * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
    let back = crate::cuda::memory::upload(device, &values)
        .and_then(|buffer| device.stream.clone_dtoh(&buffer).map_err(|e| crate::cuda::Error::Device(e.to_string())));
    match back {
        Ok(back) if back.iter().zip(&values).all(|(a, b)| a.to_bits() == b.to_bits()) && back.len() == values.len() => {
            println!("selftest: a 100 MB upload through the staging buffers came back intact");
            0
        }
        Ok(_) => {
            println!("selftest: MISMATCH: a 100 MB upload through the staging buffers came back changed");
            1
        }
        Err(e) => {
            println!("selftest: GPU ERROR: staged upload: {e}");
            1
        }
    }
}
