//! `simjoin bench --serve-load`: a `simjoin serve` process under concurrent Flight SQL clients.
//! Each client runs a mix of sim_join / range_query / knn statements over its own connection and
//! checks every answer against the embedded library's; the report gives queries/s, latency
//! percentiles and the server's peak resident memory (from /proc).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::{DataFusionError, Result};
use futures::TryStreamExt;
use simjoin::Metric;
use simjoin::datagen::{self, Distribution};
use tonic::transport::{Channel, Endpoint};

/// The bearer token of the benchmark's server (loopback only, for the life of the run).
const TOKEN: &str = "serve-load";

/// The statement mix (aggregates are order-independent: min/max/count, not floating-point sums), over `base` (20,000 × 8), `queries` (100 × 8) and `points` (20,000 × 2).
fn statements(points_eps: f64, range_r: f64) -> Vec<String> {
    vec![
        "SELECT * FROM knn(base, queries, 10) ORDER BY query_id, rank".to_string(),
        format!(
            "SELECT query_id, count(*) AS hits, max(distance) AS farthest FROM range_query(base, queries, {range_r:?}) \
             GROUP BY query_id ORDER BY query_id"
        ),
        "SELECT * FROM knn(base, '[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]', 100, 'metric=l1') ORDER BY rank".to_string(),
        format!("SELECT count(*) AS pairs, min(distance) AS nearest, max(distance) AS farthest FROM sim_join(points, {points_eps:?}, 'pairs=unordered')"),
        "SELECT query_id, min(distance) AS nearest FROM knn(base, queries, 1, 'metric=cosine') GROUP BY query_id ORDER BY query_id"
            .to_string(),
    ]
}

pub struct LoadReport {
    pub queries: usize,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub server_peak_mib: u64,
    /// Each statement with its p50 and p99 latency (ms).
    pub per_statement: Vec<(String, f64, f64)>,
}

pub async fn run(dir: &Path, clients: usize, rounds: usize) -> Result<LoadReport> {
    std::fs::create_dir_all(dir)?;
    let files = [("base", 20_000, 8, 11), ("queries", 100, 8, 12), ("points", 20_000, 2, 13)];
    let mut tables = Vec::new();
    let mut points = Vec::new();
    let mut base = Vec::new();
    for (name, n, dim, seed) in files {
        let path = dir.join(format!("load-{name}.parquet"));
        let values = datagen::generate(Distribution::Uniform, n, dim, seed);
        datagen::write(&values, dim, &path)?;
        tables.push(format!("{name}={}", path.display()));
        match name {
            "points" => points = values,
            "base" => base = values,
            _ => {}
        }
    }
    let points_eps = datagen::calibrate_threshold(&points, 2, 10.0, Metric::L2, 1);
    let range_r = datagen::calibrate_threshold(&base, 8, 20.0, Metric::L2, 2);
    let statements = statements(points_eps, range_r);

    // The embedded library's answers.
    let embedded = simjoin::session_context();
    for spec in &tables {
        let (name, path) = spec.split_once('=').unwrap_or_default();
        embedded.register_parquet(name, path, Default::default()).await?;
    }
    let mut expected = Vec::new();
    for sql in &statements {
        expected.push(pretty(&embedded.sql(sql).await?.collect().await?)?);
    }

    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.args(["serve", "--bind", "127.0.0.1:0", "--memory-limit", "2G"]).env("SIMJOIN_TOKEN", TOKEN);
    for spec in &tables {
        command.args(["--table", spec]);
    }
    let mut server = command.stdout(Stdio::piped()).spawn()?;
    let mut first_line = String::new();
    BufReader::new(server.stdout.take().expect("stdout is piped")).read_line(&mut first_line)?;
    let address = first_line
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| DataFusionError::Execution(format!("simjoin serve did not start: '{first_line}'")))?
        .to_string();

    let started = Instant::now();
    let mut tasks = Vec::new();
    for client_index in 0..clients {
        let (address, statements, expected) = (address.clone(), statements.clone(), expected.clone());
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
                let began = Instant::now();
                let answer = pretty(&query(&mut client, &statements[which]).await?)?;
                latencies.push((which, began.elapsed().as_secs_f64()));
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
    let seconds = started.elapsed().as_secs_f64();
    let peak_kib = std::fs::read_to_string(format!("/proc/{}/status", server.id()))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0u64);
    let _ = server.kill();
    let _ = server.wait();
    if let Some(e) = failure {
        return Err(e);
    }
    let all: Vec<f64> = latencies.iter().map(|&(_, t)| t).collect();
    let per_statement = statements
        .iter()
        .enumerate()
        .map(|(i, sql)| {
            let mine: Vec<f64> = latencies.iter().filter(|&&(w, _)| w == i).map(|&(_, t)| t).collect();
            (sql.clone(), percentile_ms(mine.clone(), 0.5), percentile_ms(mine, 0.99))
        })
        .collect();
    Ok(LoadReport {
        queries: all.len(),
        seconds,
        p50_ms: percentile_ms(all.clone(), 0.50),
        p99_ms: percentile_ms(all, 0.99),
        server_peak_mib: peak_kib / 1024,
        per_statement,
    })
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

fn pretty(batches: &[RecordBatch]) -> Result<String> {
    Ok(pretty_format_batches(batches)?.to_string())
}
