//! `simjoin bench`: the benchmark workloads, on files that peers (benches/peers.py) read too.
//! Datasets are generated once with fixed seeds into `--dir`, with `workloads.json` describing them
//! (thresholds calibrated there, so every system answers the same question); inputs are loaded into
//! memory before timing, and each query runs `--repeat` times (the best time is reported, and the
//! first, which converts the inputs and on a GPU uploads them).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use simjoin::Metric;
use simjoin::datagen::{self, Distribution};

use super::SessionArgs;

#[derive(Args)]
pub struct BenchArgs {
    /// Where datasets, workloads.json and results go.
    #[arg(long, default_value = "bench-out")]
    pub(super) dir: PathBuf,
    /// Run only workloads whose name contains this.
    #[arg(long)]
    pub(super) only: Option<String>,
    /// Times each query runs; the best is reported.
    #[arg(long, default_value_t = 2)]
    pub(super) repeat: usize,
    /// Smaller sizes (a tenth), for a quick look.
    #[arg(long)]
    pub(super) quick: bool,
    /// The scaling curves (time against n and against d) instead of the CPU set.
    #[arg(long)]
    curves: bool,
    /// A few thousand points per workload (the tooling's own test).
    #[arg(long)]
    tiny: bool,
    /// The GPU workloads of BENCHMARKS.md's GPU section (P1–P2: kNN of 10k queries over 1M×128 and over
    /// Fashion-MNIST; P3–P6: 1M points in 2, 8 and 32 dimensions, 10k range queries over 1M×128)
    /// instead of the CPU set.
    #[arg(long)]
    gpu_workloads: bool,
    /// Where the Fashion-MNIST IDX files are (Debian's dataset-fashion-mnist puts them here).
    #[arg(long, default_value = datagen::FASHION_MNIST_DIR)]
    pub(super) fashion_mnist: PathBuf,
    /// Each workload as a user runs it instead: `simjoin sql` in a new process over Parquet files
    /// (the first process with an empty kernel cache, later ones on the GPU, the CPU and auto),
    /// with the time to decode the same files as the floor.
    #[arg(long)]
    e2e: bool,
    /// The approximate kNN against the exact one instead: recall@10 and queries per second at
    /// several `approx_effort`s on Fashion-MNIST, clustered blobs and Gaussian data.
    #[arg(long)]
    approx: bool,
    /// With --approx, also a dataset of one's own: NAME=BASE,QUERIES, two Parquet files in --dir
    /// with a `vector` column of fixed-size f32 lists (benches/glove.py writes GloVe's).
    #[arg(long = "approx-data", value_name = "NAME=BASE,QUERIES")]
    pub(super) approx_data: Vec<String>,
    /// Load-test `simjoin serve` instead: concurrent Flight SQL clients running a query mix, every
    /// answer checked against the embedded library's.
    #[arg(long)]
    serve_load: bool,
    /// Concurrent clients of --serve-load.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Queries each client of --serve-load runs (at each rate).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// --serve-load: offered rates in queries per second over all clients (e.g. 20,80,320), each
    /// an open loop in turn, with a large join added to the mix; without it each client sends its
    /// next query when its last is answered.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// --serve-load: the devices the server runs with, one after another (e.g. gpu,cpu,auto);
    /// without it, --device.
    #[arg(long, value_delimiter = ',')]
    load_devices: Vec<String>,
    #[command(flatten)]
    session: SessionArgs,
}

/// Where a workload's vectors come from.
#[derive(Clone, Copy)]
enum Source {
    /// Seeded synthetic data.
    Generated(Distribution),
    /// Fashion-MNIST from Debian's dataset-fashion-mnist (60k base, 10k queries, 784-D).
    FashionMnist,
}

/// One benchmark workload.
struct Workload {
    name: &'static str,
    /// "self_join", "range" or "knn".
    kind: &'static str,
    source: Source,
    n: usize,
    dim: usize,
    queries: usize,
    /// Neighbours per point the join/range threshold is calibrated for.
    neighbours: f64,
    k: usize,
    output: Output,
}

/// What a workload does with its result rows.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// `count(*)`: the pairs are counted, not listed.
    Count,
    /// The count and the sums of the three columns, which read every listed row in memory.
    Summed,
    /// `COPY … TO` a Parquet file in `--dir` (DataFusion's writer, the session's codec).
    Parquet,
}

impl Output {
    fn name(self) -> &'static str {
        match self {
            Output::Count => "count",
            Output::Summed => "summed",
            Output::Parquet => "parquet",
        }
    }
}

fn gpu_workloads(quick: bool) -> Vec<Workload> {
    let scale = |n: usize| if quick { n / 10 } else { n };
    let join = |name, dim| uniform_self_join(name, dim, scale(1_000_000), 100.0);
    vec![
        join("P3-join-2d-uniform-1m", 2),
        // The same pairs listed: summed in memory, and written to Parquet.
        Workload { name: "P3-join-2d-uniform-1m-summed", output: Output::Summed, ..join("", 2) },
        Workload { name: "P3-join-2d-uniform-1m-to-parquet", output: Output::Parquet, ..join("", 2) },
        join("P4-join-8d-uniform-1m", 8),
        join("P5-join-32d-uniform-1m", 32),
        Workload { name: "P1-knn-128d-gaussian-1m-10k-k10", ..gpu_knn(scale(1_000_000), 10) },
        Workload { name: "P1-knn-128d-gaussian-1m-10k-k1", ..gpu_knn(scale(1_000_000), 1) },
        Workload { name: "P1-knn-128d-gaussian-1m-10k-k100", ..gpu_knn(scale(1_000_000), 100) },
        Workload { name: "P1-knn-128d-gaussian-1m-10k-k1000", ..gpu_knn(scale(1_000_000), 1000) },
        Workload {
            name: "P1-knn-128d-gaussian-1m-10k-k1000-to-parquet",
            output: Output::Parquet,
            ..gpu_knn(scale(1_000_000), 1000)
        },
        Workload { name: "P1-knn-128d-gaussian-1m-10k-k10000", ..gpu_knn(scale(1_000_000), 10_000) },
        // Low-d kNN (k ≤ 32, d ≤ 32): the case of a fused top-k kernel (docs/design.md#gpu-knn, #gpu-brute).
        Workload { name: "knn-16d-gaussian-1m-10k-k10", dim: 16, ..gpu_knn(scale(1_000_000), 10) },
        Workload { name: "knn-16d-gaussian-1m-10k-k32", dim: 16, ..gpu_knn(scale(1_000_000), 32) },
        Workload {
            name: "P2-knn-fashion-mnist-10k-k10",
            source: Source::FashionMnist,
            n: 60_000,
            dim: 784,
            ..gpu_knn(0, 10)
        },
        Workload {
            name: "P6-range-128d-gaussian-1m-10k",
            kind: "range",
            source: Source::Generated(Distribution::Gaussian),
            n: scale(1_000_000),
            dim: 128,
            queries: 10_000,
            neighbours: 200.0,
            k: 0,
            output: Output::Count,
        },
    ]
}

fn workloads(quick: bool) -> Vec<Workload> {
    let scale = |n: usize| if quick { n / 10 } else { n };
    let join = |name, dim, n| uniform_self_join(name, dim, scale(n), 100.0);
    vec![
        join("join-2d-uniform", 2, 1_000_000),
        // The same pairs listed: summed in memory, and written to Parquet.
        Workload { name: "join-2d-uniform-summed", output: Output::Summed, ..join("", 2, 1_000_000) },
        Workload { name: "join-2d-uniform-to-parquet", output: Output::Parquet, ..join("", 2, 1_000_000) },
        join("join-3d-uniform", 3, 1_000_000),
        join("join-8d-uniform", 8, 1_000_000),
        join("join-8d-uniform-200k", 8, 200_000),
        join("join-16d-uniform", 16, 100_000),
        join("join-32d-uniform", 32, 100_000),
        Workload {
            name: "join-8d-exponential",
            source: Source::Generated(Distribution::Exponential),
            ..join("", 8, 1_000_000)
        },
        // DuckDB's SQL self-join (a nested-loop join on array_distance) is the peer here.
        Workload { name: "sql-join-8d-uniform-20k", neighbours: 0.0, ..join("", 8, 20_000) },
        Workload {
            name: "range-128d-gaussian",
            kind: "range",
            source: Source::Generated(Distribution::Gaussian),
            n: scale(100_000),
            dim: 128,
            queries: 1_000,
            neighbours: 100.0,
            k: 0,
            output: Output::Count,
        },
        Workload {
            name: "knn-128d-gaussian-k10",
            kind: "knn",
            source: Source::Generated(Distribution::Gaussian),
            n: scale(100_000),
            dim: 128,
            queries: 1_000,
            neighbours: 0.0,
            k: 10,
            output: Output::Count,
        },
        Workload { name: "knn-128d-gaussian-k100", k: 100, ..workload_knn(scale(100_000)) },
        Workload { name: "knn-128d-gaussian-k1", k: 1, ..workload_knn(scale(100_000)) },
        Workload { name: "knn-128d-gaussian-k1000", k: 1000, ..workload_knn(scale(100_000)) },
        Workload {
            name: "knn-128d-gaussian-k1000-to-parquet",
            k: 1000,
            output: Output::Parquet,
            ..workload_knn(scale(100_000))
        },
        Workload {
            name: "knn-fashion-mnist-k10",
            source: Source::FashionMnist,
            n: 60_000,
            dim: 784,
            queries: 10_000,
            ..workload_knn(0)
        },
    ]
}

/// Scaling curves: the 2-D join against n, the join of 100k points against d, and the 2-D join of
/// 100k points against eps (10 to 3,000 neighbours per point).
fn curve_workloads(quick: bool) -> Vec<Workload> {
    let scale = |n: usize| if quick { n / 10 } else { n };
    let join = |name, dim, n| uniform_self_join(name, dim, scale(n), 100.0);
    vec![
        join("curve-n-2d-10k", 2, 10_000),
        join("curve-n-2d-30k", 2, 30_000),
        join("curve-n-2d-100k", 2, 100_000),
        join("curve-n-2d-300k", 2, 300_000),
        join("curve-n-2d-1m", 2, 1_000_000),
        join("curve-n-2d-3m", 2, 3_000_000),
        join("curve-d-2-100k", 2, 100_000),
        join("curve-d-3-100k", 3, 100_000),
        join("curve-d-4-100k", 4, 100_000),
        join("curve-d-8-100k", 8, 100_000),
        join("curve-d-16-100k", 16, 100_000),
        join("curve-d-32-100k", 32, 100_000),
        join("curve-d-64-100k", 64, 100_000),
        Workload { name: "curve-eps-2d-100k-10nbrs", neighbours: 10.0, ..join("", 2, 100_000) },
        Workload { name: "curve-eps-2d-100k-30nbrs", neighbours: 30.0, ..join("", 2, 100_000) },
        Workload { name: "curve-eps-2d-100k-100nbrs", neighbours: 100.0, ..join("", 2, 100_000) },
        Workload { name: "curve-eps-2d-100k-300nbrs", neighbours: 300.0, ..join("", 2, 100_000) },
        Workload { name: "curve-eps-2d-100k-1000nbrs", neighbours: 1000.0, ..join("", 2, 100_000) },
        Workload { name: "curve-eps-2d-100k-3000nbrs", neighbours: 3000.0, ..join("", 2, 100_000) },
    ]
}

/// A few thousand points per workload: what the tooling's own test runs.
fn tiny_workloads() -> Vec<Workload> {
    let join = |name, dim, n| uniform_self_join(name, dim, n, 20.0);
    vec![
        join("tiny-join-2d", 2, 3_000),
        join("tiny-join-8d", 8, 2_000),
        Workload { name: "tiny-sql-join-8d", ..join("", 8, 1_000) },
        Workload { name: "tiny-knn-32d-k10", n: 3_000, dim: 32, queries: 100, ..workload_knn(0) },
    ]
}

/// An ε self-join of uniform points, eps calibrated for `neighbours` per point.
fn uniform_self_join(name: &'static str, dim: usize, n: usize, neighbours: f64) -> Workload {
    Workload {
        name,
        kind: "self_join",
        source: Source::Generated(Distribution::Uniform),
        n,
        dim,
        queries: 0,
        neighbours,
        k: 0,
        output: Output::Count,
    }
}

/// kNN of 10,000 Gaussian queries over `n` 128-D Gaussian points (P1 of BENCHMARKS.md's GPU section).
fn gpu_knn(n: usize, k: usize) -> Workload {
    Workload { name: "", queries: 10_000, k, ..workload_knn(n) }
}

fn workload_knn(n: usize) -> Workload {
    Workload {
        name: "",
        kind: "knn",
        source: Source::Generated(Distribution::Gaussian),
        n,
        dim: 128,
        queries: 1_000,
        neighbours: 0.0,
        k: 10,
        output: Output::Count,
    }
}

pub async fn run(args: BenchArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    if args.serve_load {
        return serve_load(&args).await;
    }
    if args.e2e {
        return super::e2e::run(&args);
    }
    let ctx = super::sql::session(&args.session).await?;
    if args.approx {
        return super::bench_approx::run(&args, &ctx, args.session.device == simjoin::Device::Gpu).await;
    }
    let mut records = Vec::new();
    let mut table = String::from(
        "| workload | n | d | queries | threshold / k | result rows | simjoin (s) | first run (s) |\n|---|---|---|---|---|---|---|---|\n",
    );
    let all = if args.tiny {
        tiny_workloads()
    } else if args.curves {
        curve_workloads(args.quick)
    } else if args.gpu_workloads {
        gpu_workloads(args.quick)
    } else {
        workloads(args.quick)
    };
    let selected: Vec<Workload> =
        all.into_iter().filter(|w| args.only.as_ref().is_none_or(|o| w.name.contains(o.as_str()))).collect();
    for w in &selected {
        let (base_file, query_file, base) = match w.source {
            Source::Generated(distribution) => {
                let base_file = args.dir.join(format!("{distribution}-{}-{}d.parquet", w.n, w.dim));
                let base = ensure(&base_file, distribution, w.n, w.dim, 1)?;
                let query_file = args.dir.join(format!("{distribution}-queries-{}-{}d.parquet", w.queries, w.dim));
                if w.queries > 0 {
                    ensure(&query_file, distribution, w.queries, w.dim, 2)?;
                }
                (base_file, query_file, base)
            }
            Source::FashionMnist => {
                let source = args.fashion_mnist.as_path();
                if !source.exists() {
                    eprintln!("{}: skipped (install Debian's dataset-fashion-mnist)", w.name);
                    continue;
                }
                let (base_file, query_file) =
                    (args.dir.join("fashion-mnist-base.parquet"), args.dir.join("fashion-mnist-queries.parquet"));
                let train = datagen::read_fashion_mnist(source, "train")?;
                if !base_file.exists() {
                    datagen::write_labelled(&train, w.dim, &base_file)?;
                    datagen::write_labelled(&datagen::read_fashion_mnist(source, "t10k")?, w.dim, &query_file)?;
                }
                (base_file, query_file, train.pixels)
            }
        };
        let threshold = match w.kind {
            "knn" => 0.0,
            // The SQL-join workloads use a fixed eps, as DuckDB's plain SQL join is measured at one.
            _ if w.neighbours == 0.0 => 0.1,
            _ => datagen::calibrate_threshold(&base, w.dim, w.neighbours, Metric::L2, 3),
        };
        load(&ctx, "base", &base_file).await?;
        if w.queries > 0 {
            load(&ctx, "queries", &query_file).await?;
        }
        let (call, columns) = match w.kind {
            "self_join" => (format!("sim_join(base, {threshold:?}, 'pairs=unordered')"), ["left_id", "right_id"]),
            "range" => (format!("range_query(base, queries, {threshold:?})"), ["query_id", "base_id"]),
            _ => (format!("knn(base, queries, {})", w.k), ["query_id", "base_id"]),
        };
        let [left, right] = columns;
        let output_file = args.dir.join(format!("{}.parquet", w.name));
        let sql = match w.output {
            Output::Count => format!("SELECT count(*) FROM {call}"),
            Output::Summed => format!("SELECT count(*), sum({left}), sum({right}), sum(distance) FROM {call}"),
            Output::Parquet => format!(
                "COPY (SELECT {left}, {right}, distance FROM {call}) TO '{}' STORED AS PARQUET",
                output_file.display()
            ),
        };
        // The first run converts the in-memory inputs (and uploads them to a GPU); later runs find
        // them kept (docs/sql.md: vectors kept across queries), as a service's repeated queries would.
        let (mut times, mut rows) = (Vec::new(), 0);
        for _ in 0..args.repeat.max(1) {
            let started = Instant::now();
            let batches = ctx.sql(&sql).await?.collect().await?;
            times.push(started.elapsed().as_secs_f64());
            // `count(*)` is an Int64, COPY's count a UInt64.
            let count = datafusion::arrow::compute::cast(batches[0].column(0), &DataType::Int64)?;
            rows = count.as_primitive::<Int64Type>().value(0);
        }
        let (first, best) = (times[0], times.iter().copied().fold(f64::INFINITY, f64::min));
        let param = if w.kind == "knn" { format!("k={}", w.k) } else { format!("{threshold:.6}") };
        eprintln!("{}: {rows} rows in {best:.3} s", w.name);
        writeln!(
            table,
            "| {} | {} | {} | {} | {param} | {rows} | {best:.3} | {first:.3} |",
            w.name, w.n, w.dim, w.queries
        )
        .ok();
        records.push(serde_json::json!({
            "name": w.name,
            "kind": w.kind,
            "n": w.n,
            "base": base_file.file_name().and_then(|f| f.to_str()),
            "queries": (w.queries > 0).then(|| query_file.file_name().and_then(|f| f.to_str())).flatten(),
            "queries_n": w.queries,
            "dim": w.dim,
            "threshold": threshold,
            "k": w.k,
            "rows": rows,
            "output": w.output.name(),
            "output_file": (w.output == Output::Parquet).then(|| output_file.file_name().and_then(|f| f.to_str())).flatten(),
            "simjoin_s": best,
            "simjoin_first_s": first,
        }));
    }
    let json = serde_json::to_string_pretty(&records)
        .map_err(|e| DataFusionError::Execution(format!("results as JSON: {e}")))?;
    std::fs::write(args.dir.join("simjoin.json"), json)?;
    println!("{table}");
    Ok(())
}

async fn serve_load(args: &BenchArgs) -> Result<()> {
    if args.clients == 0 || args.rounds == 0 {
        return Err(DataFusionError::Configuration("--serve-load needs --clients and --rounds of at least 1".into()));
    }
    if let Some(rate) = args.rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        return Err(DataFusionError::Configuration(format!(
            "--rates: {rate} is not a positive number of queries per second"
        )));
    }
    let devices = match args.load_devices.is_empty() {
        true => vec![args.session.device.to_string()],
        false => args.load_devices.clone(),
    };
    let spec = super::serve_load::LoadSpec {
        clients: args.clients,
        rounds: args.rounds,
        devices,
        rates: args.rates.clone(),
        in_memory: args.session.in_memory,
    };
    let reports = super::serve_load::run(&args.dir, &spec).await?;
    let records: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            serde_json::json!({
                "device": r.device,
                "rate": r.rate,
                "clients": args.clients,
                "queries": r.queries,
                "seconds": r.seconds,
                "queries_per_s": r.queries as f64 / r.seconds,
                "p50_ms": r.p50_ms,
                "p99_ms": r.p99_ms,
                "small_ms": [r.small_ms.0, r.small_ms.1],
                "large_ms": [r.large_ms.0, r.large_ms.1],
                "server_peak_mib": r.server_peak_mib,
                "per_statement": r.per_statement,
            })
        })
        .collect();
    std::fs::write(args.dir.join("serve-load.json"), serde_json::Value::from(records).to_string())?;
    println!(
        "| server device | offered (queries/s) | queries (all answers checked) | wall (s) | queries/s | p50 (ms) | p99 (ms) | small p50 / p99 (ms) | large p50 / p99 (ms) | server peak RSS (MiB) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &reports {
        let rate = r.rate.map_or("closed loop".to_string(), |rate| format!("{rate}"));
        let large =
            if r.large_ms.0 > 0.0 { format!("{:.1} / {:.1}", r.large_ms.0, r.large_ms.1) } else { "–".into() };
        println!(
            "| {} | {rate} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {large} | {} |",
            r.device,
            r.queries,
            r.seconds,
            r.queries as f64 / r.seconds,
            r.p50_ms,
            r.p99_ms,
            r.small_ms.0,
            r.small_ms.1,
            r.server_peak_mib
        );
    }
    if let Some(last) = reports.last() {
        println!("\n| statement ({}, the last run) | p50 (ms) | p99 (ms) |\n|---|---|---|", last.device);
        for (sql, p50, p99) in &last.per_statement {
            println!("| `{sql}` | {p50:.1} | {p99:.1} |");
        }
    }
    Ok(())
}

/// The dataset at `path`, generated (and written) if it does not exist yet.
fn ensure(path: &Path, distribution: Distribution, n: usize, dim: usize, seed: u64) -> Result<Vec<f64>> {
    let values = datagen::generate(distribution, n, dim, seed);
    if !path.exists() {
        datagen::write(&values, dim, path)?;
    }
    Ok(values)
}

/// Registers `path` as an in-memory table `name`, so timings exclude file reading.
pub(super) async fn load(ctx: &SessionContext, name: &str, path: &Path) -> Result<()> {
    let path = path.to_str().ok_or_else(|| DataFusionError::Execution("non-UTF-8 path".into()))?;
    ctx.deregister_table(name)?;
    ctx.register_parquet(name, path, ParquetReadOptions::default()).await?;
    super::sql::keep_in_memory(ctx, name).await
}
