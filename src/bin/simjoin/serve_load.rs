//! `simjoin bench --serve-load`: a `simjoin serve` process under concurrent Flight SQL clients.
//! Each client runs a mix of sim_join / range_query / knn statements over its own connection and
//! checks every answer against the embedded library's; the report gives queries/s, latency
//! percentiles (of all queries, and of the small and the large ones) and the server's peak
//! resident memory (from /proc), for each device the server runs with and each offered rate.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::error::{DataFusionError, Result};
use futures::TryStreamExt;
use simjoin::Metric;
use simjoin::datagen::{self, Distribution};
use tonic::transport::{Channel, Endpoint};

/// The bearer token of the benchmark's server (loopback only, for the life of the run).
const TOKEN: &str = "serve-load";

/// Which latency class a statement of the mix belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// kNN and range queries of a few hundred queries, small joins.
    Small,
    /// A join of a million points.
    Large,
}

/// The statement mix (aggregates are order-independent: min/max/count, not floating-point sums), over `base` (20,000 × 8), `queries` (100 × 8, or 300 with the large join) and `points` (20,000 × 2), and with `big_eps` a self-join count of `big` (1,000,000 × 2).
fn statements(points_eps: f64, range_r: f64, big_eps: Option<f64>) -> Vec<(Class, String)> {
    let mut mix = vec![
        (Class::Small, "SELECT * FROM knn(base, queries, 10) ORDER BY query_id, rank".to_string()),
        (
            Class::Small,
            format!(
                "SELECT query_id, count(*) AS hits, max(distance) AS farthest FROM range_query(base, queries, {range_r:?}) \
                 GROUP BY query_id ORDER BY query_id"
            ),
        ),
        (
            Class::Small,
            "SELECT * FROM knn(base, '[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]', 100, 'metric=l1') ORDER BY rank"
                .to_string(),
        ),
        (
            Class::Small,
            format!("SELECT count(*) AS pairs, min(distance) AS nearest, max(distance) AS farthest FROM sim_join(points, {points_eps:?}, 'pairs=unordered')"),
        ),
        (
            Class::Small,
            "SELECT query_id, min(distance) AS nearest FROM knn(base, queries, 1, 'metric=cosine') GROUP BY query_id ORDER BY query_id"
                .to_string(),
        ),
    ];
    if let Some(eps) = big_eps {
        mix.push((
            Class::Large,
            format!("SELECT count(*) AS pairs, min(distance) AS nearest, max(distance) AS farthest FROM sim_join(big, {eps:?}, 'pairs=unordered')"),
        ));
    }
    mix
}

/// What a load test runs: `clients` concurrent clients of `rounds` queries each, against a
/// server run with each of `devices`; with `rates` (queries per second over all clients), an open
/// loop at each rate in turn (client `i` sends its `j`-th query at `(j · clients + i) / rate`
/// seconds, or once its previous one is answered, whichever is later; latencies count from the
/// scheduled send), else each client sends its next query when its last is answered. `rates` adds
/// the large join to the mix, and an unmeasured query of each statement before the first rate.
pub struct LoadSpec {
    pub clients: usize,
    pub rounds: usize,
    pub devices: Vec<String>,
    pub rates: Vec<f64>,
    /// The server reads its tables into memory at start (`--in-memory`).
    pub in_memory: bool,
}

/// One (device, rate) of a load test.
pub struct LoadReport {
    pub device: String,
    /// Queries per second offered (`None`: closed loop).
    pub rate: Option<f64>,
    pub queries: usize,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// p50 and p99 of each class (ms; 0 where the class did not run).
    pub small_ms: (f64, f64),
    pub large_ms: (f64, f64),
    pub server_peak_mib: u64,
    /// Each statement with its p50 and p99 latency (ms).
    pub per_statement: Vec<(String, f64, f64)>,
}

pub async fn run(dir: &Path, spec: &LoadSpec) -> Result<Vec<LoadReport>> {
    std::fs::create_dir_all(dir)?;
    let open_loop = !spec.rates.is_empty();
    let query_rows = if open_loop { 300 } else { 100 };
    let mut files = vec![("base", 20_000, 8, 11), ("queries", query_rows, 8, 12), ("points", 20_000, 2, 13)];
    if open_loop {
        files.push(("big", 1_000_000, 2, 14));
    }
    let mut tables = Vec::new();
    let (mut points, mut base, mut big) = (Vec::new(), Vec::new(), Vec::new());
    for (name, n, dim, seed) in files {
        let path = dir.join(format!("load-{name}-{n}.parquet"));
        let values = datagen::generate(Distribution::Uniform, n, dim, seed);
        if !path.exists() {
            datagen::write(&values, dim, &path)?;
        }
        tables.push(format!("{name}={}", path.display()));
        match name {
            "points" => points = values,
            "base" => base = values,
            "big" => big = values,
            _ => {}
        }
    }
    let points_eps = datagen::calibrate_threshold(&points, 2, 10.0, Metric::L2, 1);
    let range_r = datagen::calibrate_threshold(&base, 8, 20.0, Metric::L2, 2);
    let big_eps = open_loop.then(|| datagen::calibrate_threshold(&big, 2, 10.0, Metric::L2, 3));
    let mix = statements(points_eps, range_r, big_eps);
    let statements: Vec<String> = mix.iter().map(|(_, sql)| sql.clone()).collect();

    // The embedded library's answers.
    let embedded = simjoin::session_context();
    for spec in &tables {
        let (name, path) = spec.split_once('=').unwrap_or_default();
        embedded.register_parquet(name, path, Default::default()).await?;
    }
    let mut expected = Vec::new();
    for sql in &statements {
        expected.push(whole(&embedded.sql(sql).await?.collect().await?)?);
    }

    let mut reports = Vec::new();
    for device in &spec.devices {
        let mut server = Server::start(&tables, device, spec.in_memory)?;
        // One unmeasured query of each statement first: the device's start-up (and, on a fresh
        // machine, its kernels' compilation) is not what a steady load measures.
        if open_loop && let Err(e) = drive(&server.address, 1, statements.len(), None, &statements, &expected).await {
            server.stop();
            return Err(e);
        }
        let rates: Vec<Option<f64>> =
            if open_loop { spec.rates.iter().map(|&r| Some(r)).collect() } else { vec![None] };
        for rate in rates {
            let (latencies, seconds) =
                match drive(&server.address, spec.clients, spec.rounds, rate, &statements, &expected).await {
                    Ok(done) => done,
                    Err(e) => {
                        server.stop();
                        return Err(e);
                    }
                };
            let all: Vec<f64> = latencies.iter().map(|&(_, t)| t).collect();
            let of = |class: Class| -> Vec<f64> {
                latencies.iter().filter(|&&(w, _)| mix[w].0 == class).map(|&(_, t)| t).collect()
            };
            let (small, large) = (of(Class::Small), of(Class::Large));
            let per_statement = statements
                .iter()
                .enumerate()
                .map(|(i, sql)| {
                    let mine: Vec<f64> = latencies.iter().filter(|&&(w, _)| w == i).map(|&(_, t)| t).collect();
                    (sql.clone(), percentile_ms(mine.clone(), 0.5), percentile_ms(mine, 0.99))
                })
                .collect();
            reports.push(LoadReport {
                device: device.clone(),
                rate,
                queries: all.len(),
                seconds,
                p50_ms: percentile_ms(all.clone(), 0.50),
                p99_ms: percentile_ms(all, 0.99),
                small_ms: (percentile_ms(small.clone(), 0.5), percentile_ms(small, 0.99)),
                large_ms: (percentile_ms(large.clone(), 0.5), percentile_ms(large, 0.99)),
                server_peak_mib: server.peak_mib(),
                per_statement,
            });
        }
        server.stop();
    }
    Ok(reports)
}

/// A `simjoin serve` process on a free loopback port.
struct Server {
    process: std::process::Child,
    address: String,
}

impl Server {
    fn start(tables: &[String], device: &str, in_memory: bool) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut command = Command::new(exe);
        command
            .args(["serve", "--bind", "127.0.0.1:0", "--memory-limit", "2G", "--device", device])
            .env("SIMJOIN_TOKEN", TOKEN);
        if in_memory {
            command.arg("--in-memory");
        }
        for spec in tables {
            command.args(["--table", spec]);
        }
        let mut process = command.stdout(Stdio::piped()).spawn()?;
        let mut first_line = String::new();
        BufReader::new(process.stdout.take().expect("stdout is piped")).read_line(&mut first_line)?;
        let address = first_line.split("://").nth(1).and_then(|rest| rest.split_whitespace().next());
        match address {
            Some(address) => Ok(Server { address: address.to_string(), process }),
            None => {
                let _ = process.kill();
                let _ = process.wait();
                Err(DataFusionError::Execution(format!("simjoin serve did not start: '{first_line}'")))
            }
        }
    }

    /// The server's peak resident memory so far, from /proc.
    fn peak_mib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.process.id()))
            .ok()
            .and_then(|s| {
                s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0u64)
            / 1024
    }

    fn stop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Runs the clients against the server at `address` (see [`LoadSpec`]) and returns every query's
/// (statement, latency in seconds) and the wall time; every answer is checked.
async fn drive(
    address: &str,
    clients: usize,
    rounds: usize,
    rate: Option<f64>,
    statements: &[String],
    expected: &[Answer],
) -> Result<(Vec<(usize, f64)>, f64)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client_index in 0..clients {
        let (address, statements, expected) = (address.to_string(), statements.to_vec(), expected.to_vec());
        tasks.push(tokio::spawn(async move {
            let channel = Endpoint::from_shared(format!("http://{address}"))
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .connect_timeout(Duration::from_secs(10))
                .connect()
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            let mut client = FlightSqlServiceClient::new(channel);
            client.set_token(TOKEN.to_string());
            let mut latencies = Vec::new();
            for round in 0..rounds {
                let which = (client_index + round) % statements.len();
                let scheduled = match rate {
                    Some(rate) => {
                        let at = started + Duration::from_secs_f64((round * clients + client_index) as f64 / rate);
                        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                        at
                    }
                    None => Instant::now(),
                };
                let answer = whole(&query(&mut client, &statements[which]).await?)?;
                latencies.push((which, scheduled.elapsed().as_secs_f64()));
                if answer != expected[which] {
                    return Err(DataFusionError::Execution(format!(
                        "client {client_index}: the served answer to '{}' differs from the embedded library's",
                        statements[which]
                    )));
                }
            }
            Ok::<_, DataFusionError>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    let mut failure = None;
    for task in tasks {
        match task.await.map_err(|e| DataFusionError::External(Box::new(e)))? {
            Ok(l) => latencies.extend(l),
            Err(e) => failure = Some(e),
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok((latencies, started.elapsed().as_secs_f64())),
    }
}

/// The `p` quantile of `seconds`, in milliseconds (0 for none).
fn percentile_ms(mut seconds: Vec<f64>, p: f64) -> f64 {
    if seconds.is_empty() {
        return 0.0;
    }
    seconds.sort_by(f64::total_cmp);
    seconds[((seconds.len() - 1) as f64 * p).round() as usize] * 1e3
}

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>> {
    let flight = |e| DataFusionError::External(Box::new(e));
    let info = client.execute(sql.to_string(), None).await.map_err(flight)?;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let ticket =
            endpoint.ticket.ok_or_else(|| DataFusionError::Execution("an endpoint without a ticket".into()))?;
        let stream = client.do_get(ticket).await.map_err(flight)?;
        batches.extend(stream.try_collect::<Vec<_>>().await.map_err(|e| DataFusionError::External(Box::new(e)))?);
    }
    Ok(batches)
}

/// An answer as one batch, to compare with another by Arrow's equality of names and values —
/// bit for bit, and cheap next to formatting every value as text, so the clients' checks take
/// little of the host the server runs on.
fn whole(batches: &[RecordBatch]) -> Result<Answer> {
    let Some(first) = batches.first() else { return Ok(Answer(None)) };
    let batch = concat_batches(&first.schema(), batches)?;
    if batch.num_rows() == 0 {
        return Ok(Answer(None));
    }
    let names = batch.schema().fields().iter().map(|f| f.name().clone()).collect();
    Ok(Answer(Some((names, batch.columns().to_vec()))))
}

/// A whole answer: its column names and values (`None`: no row).
#[derive(Debug, Clone, PartialEq)]
struct Answer(Option<(Vec<String>, Vec<ArrayRef>)>);
