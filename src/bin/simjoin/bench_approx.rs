//! `simjoin bench --approx`: the approximate kNN (`approx=true`) against the exact one on the same
//! in-memory data and queries, in one process: recall@k and queries per second at several efforts
//! and recall targets, with the index's build (the first approximate run on each device) timed
//! apart; then, as a user's first query runs, the base read from its file for the run (exact, and
//! `approx=true` at its default target, the index built and the effort chosen within the run). The exact path
//! runs on the session's device; the approximate one on the CPU cores and, under `--device gpu`, on
//! the GPU too (its search of the index, even where the cost model would run the exact kNN
//! instead). Results go to `approx.json` in `--dir`, which benches/approx.py adds FAISS's indexes to.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use simjoin::datagen::{self, Distribution};

use super::bench::{BenchArgs, load};

/// Neighbours per query.
const K: usize = 10;
/// The efforts measured.
const EFFORTS: [f64; 6] = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0];
/// The recall targets measured (`approx_recall`).
const TARGETS: [f64; 3] = [0.9, 0.95, 0.99];

/// One dataset: its files and sizes.
struct Dataset {
    name: String,
    base: PathBuf,
    queries: PathBuf,
    n: usize,
    dim: usize,
    queries_n: usize,
}

pub async fn run(args: &BenchArgs, ctx: &SessionContext, gpu: bool) -> Result<()> {
    let scale = |n: usize| if args.quick { n / 10 } else { n };
    let mut datasets = Vec::new();
    if args.fashion_mnist.exists() {
        let (base, queries) =
            (args.dir.join("fashion-mnist-base.parquet"), args.dir.join("fashion-mnist-queries.parquet"));
        if !base.exists() {
            datagen::write_labelled(&datagen::read_fashion_mnist(&args.fashion_mnist, "train")?, 784, &base)?;
            datagen::write_labelled(&datagen::read_fashion_mnist(&args.fashion_mnist, "t10k")?, 784, &queries)?;
        }
        datasets.push(Dataset { name: "fashion-mnist".into(), base, queries, n: 60_000, dim: 784, queries_n: 10_000 });
    } else {
        eprintln!("fashion-mnist: skipped (install Debian's dataset-fashion-mnist)");
    }
    for (distribution, n) in [(Distribution::Blobs, scale(200_000)), (Distribution::Gaussian, scale(1_000_000))] {
        let (dim, queries_n) = (128, 1000);
        let base = args.dir.join(format!("{distribution}-{n}-{dim}d.parquet"));
        let queries = args.dir.join(format!("{distribution}-{n}-{dim}d-queries-{queries_n}.parquet"));
        if !base.exists() || !queries.exists() {
            // One draw split in two, so that the queries come from the same clusters as the base.
            let values = datagen::generate(distribution, n + queries_n, dim, 1);
            let (base_values, query_values) = values.split_at(n * dim);
            datagen::write(base_values, dim, &base)?;
            datagen::write(query_values, dim, &queries)?;
        }
        datasets.push(Dataset { name: format!("{distribution}-{dim}d"), base, queries, n, dim, queries_n });
    }
    for spec in &args.approx_data {
        let parts = spec.split_once('=').and_then(|(name, files)| Some((name, files.split_once(',')?)));
        let Some((name, (base, queries))) = parts else {
            return Err(DataFusionError::Plan(format!("--approx-data: expected NAME=BASE,QUERIES, got '{spec}'")));
        };
        let (base, queries) = (args.dir.join(base), args.dir.join(queries));
        let (n, dim) = shape(ctx, &base).await?;
        let (queries_n, _) = shape(ctx, &queries).await?;
        datasets.push(Dataset { name: name.into(), base, queries, n, dim, queries_n });
    }
    datasets.retain(|d| args.only.as_ref().is_none_or(|o| d.name.contains(o.as_str())));

    let mut records = Vec::new();
    let mut table = String::from(
        "| data | n × d | queries | method | setting | recall@10 | queries/s | × exact | first run (s) | index build (s) |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for d in &datasets {
        load(ctx, "base", &d.base).await?;
        load(ctx, "queries", &d.queries).await?;
        let exact_sql = format!("SELECT query_id, base_id FROM knn(base, queries, {K})");
        let (exact_s, exact_first, truth) = best_of(ctx, &exact_sql, args.repeat).await?;
        let exact_qps = d.queries_n as f64 / exact_s;
        // `seconds`: the best run's; `first`: the first run's (which builds the index, or
        // calibrates a recall target, for the later ones).
        let mut row = |method: &str,
                       setting: &str,
                       effort: Option<f64>,
                       (seconds, first): (f64, f64),
                       recall: f64,
                       build: Option<f64>| {
            let qps = d.queries_n as f64 / seconds;
            let build_text = build.map_or("–".to_string(), |b| format!("{b:.2}"));
            table.push_str(&format!(
                    "| {} | {} × {} | {} | {method} | {setting} | {recall:.4} | {qps:.0} | {:.1} | {first:.3} | {build_text} |\n",
                    d.name,
                    d.n,
                    d.dim,
                    d.queries_n,
                    qps / exact_qps
                ));
            records.push(serde_json::json!({
                "data": d.name, "n": d.n, "dim": d.dim, "queries": d.queries_n, "k": K,
                "base_file": d.base.file_name().and_then(|f| f.to_str()),
                "queries_file": d.queries.file_name().and_then(|f| f.to_str()),
                "method": method, "setting": setting, "effort": effort, "seconds": seconds, "first_seconds": first,
            "queries_per_s": qps,
                "recall": recall, "build_s": build,
            }));
        };
        row("simjoin exact", "exact", None, (exact_s, exact_first), 1.0, None);
        for (i, effort) in EFFORTS.into_iter().enumerate() {
            let sql = format!(
                "SELECT query_id, base_id FROM knn(base, queries, {K}, 'approx=true, approx_effort={effort}, device=cpu')"
            );
            let (seconds, first, found) = best_of(ctx, &sql, args.repeat.max(2)).await?;
            // The first approximate run builds the index (kept for the later ones, the base being
            // in memory): its extra time over a later run is the build.
            let build = (i == 0).then_some(first - seconds);
            let setting = format!("approx_effort={effort}");
            row("simjoin multicurves", &setting, Some(effort), (seconds, first), recall(&found, &truth), build);
            if effort == 1.0 {
                print_metrics(ctx, &d.name, &sql).await?;
            }
        }
        // The effort chosen for each target within each run, from a sample of its queries.
        for (setting, times, recall) in at_targets(ctx, &d.name, "cpu", args.repeat, &truth).await? {
            row("simjoin recall target", &setting, None, times, recall, None);
        }
        // As a user's first query: the base read from its file for this run alone.
        let file = d.base.display().to_string().replace('\'', "''");
        for (setting, options) in [("exact", "device=cpu"), ("approx=true", "approx=true, device=cpu")] {
            let sql = format!("SELECT query_id, base_id FROM knn('{file}', queries, {K}, '{options}')");
            let (seconds, first, found) = best_of(ctx, &sql, args.repeat).await?;
            row("simjoin, base from its file", setting, None, (seconds, first), recall(&found, &truth), None);
            print_metrics(ctx, &d.name, &sql).await?;
        }
        if gpu {
            // The base loaded again, without the cores' index: the GPU's first run builds its own,
            // with the curves ordered on the device.
            load(ctx, "base", &d.base).await?;
            let forced = simjoin::internal::Checks { approx_search_on_gpu: true, ..Default::default() };
            simjoin::SimJoinOptions::set_checks(ctx, forced);
            for (i, effort) in EFFORTS.into_iter().enumerate() {
                let sql = format!(
                    "SELECT query_id, base_id FROM knn(base, queries, {K}, 'approx=true, approx_effort={effort}, device=gpu')"
                );
                let (seconds, first, found) = best_of(ctx, &sql, args.repeat.max(2)).await?;
                let build = (i == 0).then_some(first - seconds);
                let setting = format!("approx_effort={effort}");
                row(
                    "simjoin multicurves (gpu)",
                    &setting,
                    Some(effort),
                    (seconds, first),
                    recall(&found, &truth),
                    build,
                );
                if effort == 1.0 {
                    print_metrics(ctx, &d.name, &sql).await?;
                }
            }
            simjoin::SimJoinOptions::set_checks(ctx, Default::default());
            // The GPU's search (or its exact kNN, where the sample finds that faster) to a target.
            for (setting, times, recall) in at_targets(ctx, &d.name, "gpu", args.repeat, &truth).await? {
                row("simjoin recall target (gpu)", &setting, None, times, recall, None);
            }
        }
        eprintln!("{}: done", d.name);
    }
    let json = serde_json::to_string_pretty(&records)
        .map_err(|e| DataFusionError::Execution(format!("results as JSON: {e}")))?;
    std::fs::write(args.dir.join("approx.json"), json)?;
    println!("{table}");
    Ok(())
}

/// The rows of the Parquet file at `path` and the length of its `vector` column's lists.
async fn shape(ctx: &SessionContext, path: &Path) -> Result<(usize, usize)> {
    load(ctx, "shape", path).await?;
    let table = ctx.table("shape").await?;
    let dim = match table.schema().field_with_unqualified_name("vector")?.data_type() {
        DataType::FixedSizeList(_, size) => *size as usize,
        other => {
            return Err(DataFusionError::Plan(format!(
                "--approx-data: {}'s vector column is {other}, not a fixed-size list",
                path.display()
            )));
        }
    };
    let rows = table.count().await?;
    ctx.deregister_table("shape")?;
    Ok((rows, dim))
}

/// Prints (to stderr) the operator's line of `EXPLAIN ANALYZE` for `sql`: where its time went
/// (build, probe, transfers, kernels) and the candidates it took and measured.
async fn print_metrics(ctx: &SessionContext, name: &str, sql: &str) -> Result<()> {
    let batches = ctx.sql(&format!("EXPLAIN ANALYZE {sql}")).await?.collect().await?;
    for batch in &batches {
        let Some(plans) = batch.column(1).as_string_opt::<i32>() else { continue };
        for line in plans.iter().flatten().flat_map(str::lines).filter(|l| l.contains("SimilarityExec")) {
            eprintln!("{name}: {}", line.trim());
        }
    }
    Ok(())
}

/// The share of the exact answer's (query, base) pairs that `found` holds.
fn recall(found: &HashSet<(i64, i64)>, truth: &HashSet<(i64, i64)>) -> f64 {
    found.iter().filter(|pair| truth.contains(pair)).count() as f64 / truth.len() as f64
}

/// `approx=true` on `device` at each of [`TARGETS`], best of `repeat` runs (at least 2: the first
/// chooses the effort, the later ones take the choice kept with the index): its setting, its best
/// and first run's seconds, and its recall against `truth`.
async fn at_targets(
    ctx: &SessionContext,
    name: &str,
    device: &str,
    repeat: usize,
    truth: &HashSet<(i64, i64)>,
) -> Result<Vec<(String, (f64, f64), f64)>> {
    let mut measured = Vec::new();
    for target in TARGETS {
        let options = format!("approx=true, approx_recall={target}, device={device}");
        let sql = format!("SELECT query_id, base_id FROM knn(base, queries, {K}, '{options}')");
        let (seconds, first, found) = best_of(ctx, &sql, repeat.max(2)).await?;
        measured.push((format!("approx_recall={target}"), (seconds, first), recall(&found, truth)));
        print_metrics(ctx, name, &sql).await?;
    }
    Ok(measured)
}

/// The best and the first of `repeat` runs of `sql` (seconds), and its (query, base) pairs.
async fn best_of(ctx: &SessionContext, sql: &str, repeat: usize) -> Result<(f64, f64, HashSet<(i64, i64)>)> {
    let (mut times, mut pairs) = (Vec::new(), HashSet::new());
    for _ in 0..repeat.max(1) {
        let started = Instant::now();
        let batches = ctx.sql(sql).await?.collect().await?;
        times.push(started.elapsed().as_secs_f64());
        pairs = batches
            .iter()
            .flat_map(|b| {
                let (q, r) = (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_primitive::<Int64Type>());
                (0..b.num_rows()).map(move |i| (q.value(i), r.value(i)))
            })
            .collect();
    }
    Ok((times.iter().copied().fold(f64::INFINITY, f64::min), times[0], pairs))
}
