//! The GPU backend checked against the CPU backend (`simjoin selftest`): every operation × metric ×
//! option on seeded random and adversarial data, asserting identical answers (ids, distance bits
//! and kNN ranks). [`run`] prints a table of the cases and fails on any mismatch, and when no GPU
//! is usable (the point is to test one).

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Float64Type, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;

use crate::Metric;
use crate::datagen::{self, Distribution};
use crate::op::Checks;
use crate::options::SimJoinOptions;

mod bits;
mod clusters;
mod data;
mod device_index;

use crate::selftest::data::{
    Dataset, datasets, null_coordinate, register, register_batch, register_pair, register_with_nulls, reversed_half,
    text_batch,
};
use crate::selftest::device_index::{check_device_curves, check_device_graph};

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
    failures += bits::bits(&ctx, &mut cases).await?;
    failures += clusters::clusters(&ctx, &mut cases).await?;
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

/// The approximate kNN's search on the GPU, and the index's curves and graph built on the device.
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
