//! `simjoin bench --e2e`: each workload as a user runs it — `simjoin sql` in a new process over
//! Parquet files on disk — timed as whole processes: the first process on a machine (an empty
//! kernel cache), later processes on the GPU, on the CPU and on `device=auto`, and as floors the
//! time to decode the same files (DataFusion alone, in the same CLI, and pyarrow). Every
//! process's answer is checked against the others'.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use datafusion::error::{DataFusionError, Result};
use simjoin::Metric;
use simjoin::datagen::{self, Distribution};

use super::bench::BenchArgs;

/// One end-to-end workload: a query over files.
struct Workload {
    name: String,
    /// The statement, with `{base}`, `{queries}` and `{eps}` filled in.
    sql: String,
    base: PathBuf,
    queries: Option<PathBuf>,
    /// Write the result here with `--output` instead of printing a count.
    output: Option<PathBuf>,
}

/// What one workload measured (seconds; `None`: not run).
struct Timings {
    first_gpu: Option<f64>,
    later_gpu: Option<f64>,
    later_cpu: f64,
    later_auto: f64,
    decode_datafusion: f64,
    decode_pyarrow: Option<f64>,
    answer: String,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let dir = args.dir.join("e2e");
    std::fs::create_dir_all(&dir)?;
    let exe = std::env::current_exe()?;
    let scale = |n: usize| if args.quick { n / 10 } else { n };
    let file = |distribution: Distribution, n: usize, dim: usize, seed: u64| -> Result<(PathBuf, Vec<f64>)> {
        let path = dir.join(format!("{distribution}-{n}-{dim}d-seed{seed}.parquet"));
        let values = datagen::generate(distribution, n, dim, seed);
        if !path.exists() {
            datagen::write(&values, dim, &path)?;
        }
        Ok((path, values))
    };
    let (base_128, _) = file(Distribution::Gaussian, scale(1_000_000), 128, 1)?;
    let (queries_128, _) = file(Distribution::Gaussian, 10_000, 128, 2)?;
    let (queries_10, _) = file(Distribution::Gaussian, 10, 128, 2)?;
    let (points_2d, values_2d) = file(Distribution::Uniform, scale(1_000_000), 2, 1)?;
    let eps = datagen::calibrate_threshold(&values_2d, 2, 100.0, Metric::L2, 3);
    let knn = |k: usize| format!("SELECT count(*) FROM knn('{{base}}', '{{queries}}', {k})");
    let mut workloads = vec![
        Workload {
            name: format!("P1 kNN {}×128, 10k queries, k=10", count(scale(1_000_000))),
            sql: knn(10),
            base: base_128.clone(),
            queries: Some(queries_128),
            output: None,
        },
        Workload {
            name: format!("kNN {}×128, 10 queries, k=10", count(scale(1_000_000))),
            sql: knn(10),
            base: base_128,
            queries: Some(queries_10),
            output: None,
        },
        Workload {
            name: format!("P3 self-join {}×2 (count)", count(scale(1_000_000))),
            sql: format!("SELECT count(*) FROM sim_join('{{base}}', {eps:?}, 'pairs=unordered')"),
            base: points_2d.clone(),
            queries: None,
            output: None,
        },
        Workload {
            name: format!("P3 self-join {}×2 (--output pairs.parquet)", count(scale(1_000_000))),
            sql: format!("SELECT left_id, right_id, distance FROM sim_join('{{base}}', {eps:?}, 'pairs=unordered')"),
            base: points_2d,
            queries: None,
            output: Some(dir.join("pairs.parquet")),
        },
    ];
    if args.fashion_mnist.exists() {
        let (base, queries) = (dir.join("fashion-mnist-base.parquet"), dir.join("fashion-mnist-queries.parquet"));
        if !base.exists() {
            datagen::write_labelled(&datagen::read_fashion_mnist(&args.fashion_mnist, "train")?, 784, &base)?;
            datagen::write_labelled(&datagen::read_fashion_mnist(&args.fashion_mnist, "t10k")?, 784, &queries)?;
        }
        workloads.push(Workload {
            name: "P2 kNN Fashion-MNIST, 10k queries, k=10".to_string(),
            sql: knn(10),
            base,
            queries: Some(queries),
            output: None,
        });
    }
    workloads.retain(|w| args.only.as_ref().is_none_or(|o| w.name.contains(o.as_str())));

    let gpu = simjoin::internal::gpu_probe().is_ok();
    let repeat = args.repeat.max(1);
    // Each row is printed as soon as it is measured: a whole run takes minutes.
    println!(
        "| workload | first process, GPU (s) | later process, GPU (s) | CPU (s) | auto (s) | decode: simjoin sql (s) | decode: pyarrow (s) |\n|---|---|---|---|---|---|---|"
    );
    for (i, w) in workloads.iter().enumerate() {
        let sql = w
            .sql
            .replace("{base}", &w.base.display().to_string())
            .replace("{queries}", &w.queries.as_ref().map(|q| q.display().to_string()).unwrap_or_default());
        // A fresh kernel cache stands for a fresh machine; later processes share one.
        let fresh_cache = dir.join(format!("kernel-cache-first-{}-{i}", std::process::id()));
        let shared_cache = dir.join("kernel-cache");
        let run = |device: &str, cache: &Path| simjoin_sql(&exe, &sql, device, cache, w.output.as_deref());
        let best = |device: &str| -> Result<(f64, String)> {
            let mut best = (f64::INFINITY, String::new());
            for _ in 0..repeat {
                let (seconds, answer) = run(device, &shared_cache)?;
                if seconds < best.0 {
                    best = (seconds, answer);
                }
            }
            Ok(best)
        };
        let (first_gpu, later_gpu) = if gpu {
            let (first, first_answer) = run("gpu", &fresh_cache)?;
            let _ = std::fs::remove_dir_all(&fresh_cache);
            run("gpu", &shared_cache)?; // fills the shared cache
            let (later, answer) = best("gpu")?;
            same_answer(&w.name, "the first GPU process", &first_answer, &answer)?;
            (Some(first), Some((later, answer)))
        } else {
            (None, None)
        };
        let (later_cpu, answer) = best("cpu")?;
        let (later_auto, auto_answer) = best("auto")?;
        same_answer(&w.name, "device=auto", &auto_answer, &answer)?;
        if let Some((_, gpu_answer)) = &later_gpu {
            same_answer(&w.name, "the GPU", gpu_answer, &answer)?;
        }
        let files: Vec<&Path> = std::iter::once(w.base.as_path()).chain(w.queries.as_deref()).collect();
        let decode_sql = files
            .iter()
            .map(|f| format!("(SELECT sum(vector[1]) FROM '{}')", f.display()))
            .collect::<Vec<_>>()
            .join(" + ");
        let mut decode_datafusion = f64::INFINITY;
        for _ in 0..repeat {
            let (seconds, _) = simjoin_sql(&exe, &format!("SELECT {decode_sql}"), "cpu", &shared_cache, None)?;
            decode_datafusion = decode_datafusion.min(seconds);
        }
        let decode_pyarrow = pyarrow_read(&files, repeat);
        let timings = Timings {
            first_gpu,
            later_gpu: later_gpu.map(|(s, _)| s),
            later_cpu,
            later_auto,
            decode_datafusion,
            decode_pyarrow,
            answer,
        };
        eprintln!("{}: {} (cpu {:.3} s)", w.name, timings.answer, timings.later_cpu);
        let cell = |s: Option<f64>| s.map_or("—".to_string(), |s| format!("{s:.3}"));
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {} |",
            w.name,
            cell(timings.first_gpu),
            cell(timings.later_gpu),
            timings.later_cpu,
            timings.later_auto,
            timings.decode_datafusion,
            cell(timings.decode_pyarrow)
        );
    }
    Ok(())
}

/// Runs `simjoin sql --device DEVICE QUERY` (with `--output` when given) as a new process and
/// returns its wall time and its answer (the printed CSV, or the line reporting rows written).
fn simjoin_sql(exe: &Path, sql: &str, device: &str, cache: &Path, output: Option<&Path>) -> Result<(f64, String)> {
    let mut command = Command::new(exe);
    command.args(["sql", "--device", device, "--format", "csv"]).env("SIMJOIN_CACHE_DIR", cache);
    if cache.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("kernel-cache-first")) {
        // A fresh machine: the CUDA driver's compute cache (~/.nv/ComputeCache) is not read either.
        command.env("CUDA_CACHE_DISABLE", "1");
    }
    if let Some(output) = output {
        command.arg("--output").arg(output);
    }
    let started = Instant::now();
    let out = command.arg(sql).output()?;
    let seconds = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(DataFusionError::Execution(format!(
            "simjoin sql --device {device} '{sql}' failed ({}): {stderr}",
            out.status
        )));
    }
    let answer = match output {
        Some(_) => stderr.lines().find(|l| l.starts_with("wrote ")).unwrap_or_default().to_string(),
        None => String::from_utf8_lossy(&out.stdout).trim().replace('\n', " "),
    };
    Ok((seconds, answer))
}

fn same_answer(workload: &str, what: &str, answer: &str, expected: &str) -> Result<()> {
    if answer == expected {
        return Ok(());
    }
    Err(DataFusionError::Execution(format!("{workload}: {what} answered '{answer}', the CPU '{expected}'")))
}

/// pyarrow's best time to read `files` into memory (inside Python, so the interpreter's start is
/// not counted), or `None` without python3 and pyarrow.
fn pyarrow_read(files: &[&Path], repeat: usize) -> Option<f64> {
    let paths: Vec<String> = files.iter().map(|f| format!("{:?}", f.display().to_string())).collect();
    let script = format!(
        "import time, pyarrow.parquet as pq\nbest = 1e9\nfor _ in range({repeat}):\n    t = time.perf_counter()\n    for f in [{}]:\n        pq.read_table(f)\n    best = min(best, time.perf_counter() - t)\nprint(best)",
        paths.join(", ")
    );
    let out = Command::new("python3").args(["-c", &script]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// `n` as a workload name gives it: 1M, 100k.
fn count(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
