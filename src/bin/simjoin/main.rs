//! `simjoin`: run similarity SQL from the shell or a REPL, generate datasets, try the demo.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use simjoin::datagen::{self, Distribution};
use simjoin::{Device, Metric};

mod bench;
mod bench_approx;
mod cluster;
mod demo;
mod e2e;
mod progress;
mod serve;
mod serve_load;
mod sql;

/// Exact similarity joins, range queries and kNN from SQL, on the GPU or every CPU core.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run SQL: a query, a file of statements, or (with neither) an interactive prompt.
    Sql(SqlArgs),
    /// Write a synthetic dataset (Parquet with `id` and `vector`, or CSV with `id, x1..xd`).
    Gen(GenArgs),
    /// Convert Fashion-MNIST (Debian's dataset-fashion-mnist IDX files) to Parquet: the 60,000
    /// training images as the base, the 10,000 test images as queries (`id`, `label`, `vector`).
    FashionMnist {
        /// Folder for fashion-mnist-base.parquet and fashion-mnist-queries.parquet.
        out: PathBuf,
        /// Folder with the IDX files.
        #[arg(long, default_value = datagen::FASHION_MNIST_DIR)]
        source: PathBuf,
    },
    /// Generate a small dataset and run one query of each function, with timings.
    Demo(SessionArgs),
    /// Run the benchmark workloads (datasets shared with benches/peers.py).
    Bench(bench::BenchArgs),
    /// Serve SQL over Arrow Flight SQL (ADBC, JDBC, any Flight SQL client) until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
    /// Run a cluster's scheduler (Apache DataFusion Ballista) until SIGINT/SIGTERM.
    Scheduler(cluster::SchedulerArgs),
    /// Run a cluster's executor, which runs the tasks its scheduler hands it, until SIGINT/SIGTERM.
    Executor(cluster::ExecutorArgs),
    /// Check the GPU backend against the CPU backend on every operation, metric and option.
    Selftest {
        /// Run even without a usable GPU (the GPU cases then report errors).
        #[arg(long)]
        allow_cpu_only: bool,
        /// Run only the cases whose name (data and query, as the table prints them) contains this.
        #[arg(long)]
        only: Option<String>,
    },
}

/// Options shared by everything that opens a session.
#[derive(Args, Clone)]
struct SessionArgs {
    /// Register a table: NAME=PATH (.parquet, .csv, .tsv, .json, or a directory of Parquet files).
    #[arg(long = "table", short = 't', value_name = "NAME=PATH")]
    tables: Vec<String>,
    /// Where to run (the default of `simjoin.device`).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: Device,
    /// Run the queries on the cluster whose scheduler is at this URL (df://HOST:PORT); table
    /// paths must then name files every executor can read.
    #[arg(long, value_name = "URL")]
    cluster: Option<String>,
    /// Read each --table into memory once, at start: queries then skip reading its files, and
    /// its vectors stay converted (and, once a GPU run has used them, on the device) across
    /// queries.
    #[arg(long, conflicts_with = "cluster")]
    in_memory: bool,
    /// The codec of Parquet files that --output and COPY … TO write: uncompressed, snappy, lz4_raw,
    /// zstd(LEVEL), gzip(LEVEL) or brotli(LEVEL) (`datafusion.execution.parquet.compression`,
    /// default zstd(3)).
    #[arg(long, value_name = "CODEC", value_parser = parse_compression)]
    compression: Option<String>,
    /// The most rows of a Parquet row group that --output and COPY … TO write
    /// (`datafusion.execution.parquet.max_row_group_size`, default 1048576). Row groups are
    /// encoded on every core, so smaller groups spread a small file over more cores.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u64).range(1..))]
    row_group_size: Option<u64>,
    /// Memory that the queries of this process may hold at once (e.g. 512M, 8G; default three
    /// quarters of the machine's, or of the container's limit): sorts and joins spill to disk past
    /// it where they can, and a query that cannot fails with a resources error naming the limit,
    /// instead of exhausting the machine.
    #[arg(long, value_name = "SIZE", value_parser = serve::parse_bytes)]
    memory_limit: Option<usize>,
}

impl SessionArgs {
    /// The memory pool's size: `--memory-limit`, or three quarters of the memory this process may
    /// use (8 GiB where that cannot be read).
    fn memory_limit(&self) -> usize {
        self.memory_limit.unwrap_or_else(|| simjoin::available_memory().unwrap_or(8 << 30) / 4 * 3)
    }
}

#[derive(Args)]
struct SqlArgs {
    /// The statement(s) to run; without it (and without --file) an interactive prompt starts.
    query: Option<String>,
    /// Run the statements in this file.
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write the (last) query's result to this file instead (.parquet, .csv or .json).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    #[command(flatten)]
    session: SessionArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Csv,
    Json,
}

#[derive(Args)]
struct GenArgs {
    /// Output file: .parquet or .csv.
    output: PathBuf,
    /// Number of points.
    #[arg(short, default_value_t = 100_000)]
    n: usize,
    /// Dimensions.
    #[arg(short, default_value_t = 2)]
    d: usize,
    /// uniform, exponential (λ = 40), blobs or gaussian.
    #[arg(long, default_value = "uniform")]
    distribution: Distribution,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Also print the eps that gives about this many neighbours per point (l2).
    #[arg(long)]
    neighbours: Option<f64>,
}

fn parse_device(s: &str) -> Result<Device, String> {
    s.parse()
}

/// A Parquet codec as DataFusion's writer names it, checked before any query runs.
fn parse_compression(s: &str) -> Result<String, String> {
    datafusion::common::file_options::parquet_writer::parse_compression_string(s)
        .map(|_| s.to_ascii_lowercase())
        .map_err(|e| e.strip_backtrace())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Sql(args) => sql::run(args).await,
        Command::Gen(args) => generate(args),
        Command::FashionMnist { out, source } => fashion_mnist(&source, &out),
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Scheduler(args) => cluster::scheduler(args).await,
        Command::Executor(args) => cluster::executor(args).await,
        Command::Selftest { allow_cpu_only, only } => simjoin::selftest::run(allow_cpu_only, only.as_deref()).await,
    };
    let code = match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", e.strip_backtrace());
            1
        }
    };
    // A query that ran on the CPU leaves the GPU's start-up running on its thread; exiting
    // normally would tear the driver down under it (see `cuda::startup::in_flight`).
    if simjoin::internal::gpu_startup_in_flight() {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process at once, without exit handlers; everything it wrote is
        // flushed above (files the query wrote were closed before its stream ended).
        unsafe { libc::_exit(code) };
    }
    ExitCode::from(code as u8)
}

fn generate(args: GenArgs) -> datafusion::error::Result<()> {
    let values = datagen::generate(args.distribution, args.n, args.d, args.seed);
    datagen::write(&values, args.d, &args.output)?;
    println!("wrote {} {}-D {} points to {}", args.n, args.d, args.distribution, args.output.display());
    if let Some(target) = args.neighbours {
        let eps = datagen::calibrate_threshold(&values, args.d, target, Metric::L2, args.seed + 1);
        println!("eps for ~{target} neighbours per point (l2): {eps}");
    }
    Ok(())
}

fn fashion_mnist(source: &std::path::Path, out: &std::path::Path) -> datafusion::error::Result<()> {
    std::fs::create_dir_all(out)?;
    for (prefix, name) in [("train", "fashion-mnist-base.parquet"), ("t10k", "fashion-mnist-queries.parquet")] {
        let images = datagen::read_fashion_mnist(source, prefix)?;
        let path = out.join(name);
        datagen::write_labelled(&images, 784, &path)?;
        println!("wrote {} images to {}", images.labels.len(), path.display());
    }
    Ok(())
}
