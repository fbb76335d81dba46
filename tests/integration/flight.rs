//! The Flight SQL server with a real client (arrow-flight's `FlightSqlServiceClient`): answers
//! equal to the embedded library's, prepared statements with parameters, metadata, credentials,
//! TLS with a self-signed certificate generated here; and the `simjoin serve` process: a
//! 10,000,000-row result streamed in bounded server memory, a disconnecting client stopping the
//! work, SIGTERM shutting down cleanly.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::sql::CommandGetTables;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use futures::{StreamExt, TryStreamExt};
use simjoin::datagen::{self, Distribution};
use simjoin::server::{Credentials, FlightSqlServer, ServerStats};
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::common::{Shape, ctx, register, vectors};

/// An in-process server on a free loopback port; dropping the guard shuts it down.
pub(crate) struct Running {
    pub(crate) address: SocketAddr,
    pub(crate) stats: Arc<ServerStats>,
    _stop: oneshot::Sender<()>,
}

pub(crate) async fn start(server: FlightSqlServer) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stats = server.stats();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.serve(listener, async move {
        let _ = stopped.await;
    }));
    Running { address, stats, _stop: stop }
}

async fn connect(url: String, tls: Option<&str>) -> Result<FlightSqlServiceClient<Channel>, tonic::transport::Error> {
    let mut endpoint = Endpoint::from_shared(url)?.connect_timeout(Duration::from_secs(10));
    if let Some(ca) = tls {
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost"))?;
    }
    Ok(FlightSqlServiceClient::new(endpoint.connect().await?))
}

pub(crate) async fn client(address: SocketAddr) -> FlightSqlServiceClient<Channel> {
    connect(format!("http://{address}"), None).await.unwrap()
}

/// Runs `sql` over Flight SQL and collects every endpoint's batches.
pub(crate) async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let info = client.execute(sql.to_string(), None).await.map_err(|e| e.to_string())?;
    fetch(client, info).await
}

async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: arrow_flight::FlightInfo,
) -> Result<Vec<RecordBatch>, String> {
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.ok_or("an endpoint without a ticket")?;
        let stream = client.do_get(ticket).await.map_err(|e| e.to_string())?;
        batches.extend(stream.try_collect::<Vec<_>>().await.map_err(|e| e.to_string())?);
    }
    Ok(batches)
}

async fn embedded(ctx: &SessionContext, sql: &str) -> String {
    pretty_format_batches(&ctx.sql(sql).await.unwrap().collect().await.unwrap()).unwrap().to_string()
}

fn pretty(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches).unwrap().to_string()
}

pub(crate) fn served_ctx() -> SessionContext {
    let ctx = ctx();
    register(&ctx, "points", &vectors(300, 3, 11), 3, Shape::FixedF32);
    register(&ctx, "queries", &vectors(20, 3, 12), 3, Shape::ListF64);
    ctx
}

const QUERIES: [&str; 4] = [
    "SELECT * FROM sim_join(points, 0.2) ORDER BY left_id, right_id",
    "SELECT * FROM range_query(points, queries, 0.3, 'metric=l1') ORDER BY query_id, base_id",
    "SELECT * FROM knn(points, queries, 7) ORDER BY query_id, rank",
    "SELECT count(*) AS pairs, min(distance) AS nearest, max(distance) AS farthest FROM sim_join(points, queries, 0.25, 'metric=cosine')",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_prepared_statements_and_metadata_match_the_embedded_library() {
    let ctx = served_ctx();
    let server = start(FlightSqlServer::new(&ctx)).await;
    let mut client = client(server.address).await;

    for sql in QUERIES {
        let served = query(&mut client, sql).await.unwrap();
        assert!(served.iter().map(RecordBatch::num_rows).sum::<usize>() > 0, "{sql}");
        assert_eq!(pretty(&served), embedded(&ctx, sql).await, "{sql}");
    }

    // A prepared statement with a parameter, bound twice.
    let mut prepared = client
        .prepare(
            "SELECT base_id, distance, rank FROM knn(points, queries, 5) WHERE query_id = $1 ORDER BY rank".into(),
            None,
        )
        .await
        .unwrap();
    for query_id in [3i64, 17] {
        let schema = Arc::new(Schema::new(vec![Field::new("$1", DataType::Int64, false)]));
        let parameters = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![query_id]))]).unwrap();
        prepared.set_parameters(parameters).unwrap();
        let info = prepared.execute().await.unwrap();
        let served = fetch(&mut client, info).await.unwrap();
        let expected = embedded(
            &ctx,
            &format!(
                "SELECT base_id, distance, rank FROM knn(points, queries, 5) WHERE query_id = {query_id} ORDER BY rank"
            ),
        )
        .await;
        assert_eq!(pretty(&served), expected);
        assert_eq!(served.iter().map(RecordBatch::num_rows).sum::<usize>(), 5);
    }
    prepared.close().await.unwrap();

    // Catalog metadata lists the served tables.
    let info = client
        .get_tables(CommandGetTables {
            catalog: None,
            db_schema_filter_pattern: None,
            table_name_filter_pattern: None,
            table_types: vec![],
            include_schema: false,
        })
        .await
        .unwrap();
    let tables = fetch(&mut client, info).await.unwrap();
    let names: Vec<String> = tables
        .iter()
        .flat_map(|b| {
            let column = b.column_by_name("table_name").unwrap().as_string::<i32>();
            column.iter().flatten().map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    assert!(
        names.contains(&"points".to_string()) && names.contains(&"queries".to_string()),
        "{names:?} from {tables:?}"
    );

    // Errors reach the client with the engine's message.
    let error = query(&mut client, "SELECT * FROM sim_join(points, -1)").await.unwrap_err();
    assert!(error.contains("sim_join") && error.contains("-1"), "{error}");
    assert_eq!(server.stats.open_result_streams(), 0);
    assert!(server.stats.result_streams() >= 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_valid_credentials_a_client_is_refused() {
    let ctx = served_ctx();
    let sql = QUERIES[2];
    let expected = embedded(&ctx, sql).await;

    let server = start(FlightSqlServer::new(&ctx).with_credentials(Credentials::Token("open sesame".into()))).await;
    let mut anonymous = client(server.address).await;
    let refused = query(&mut anonymous, sql).await.unwrap_err();
    assert!(refused.contains("Unauthenticated") || refused.contains("no credentials"), "{refused}");
    let mut wrong = client(server.address).await;
    wrong.set_token("open sesam".into());
    assert!(query(&mut wrong, sql).await.unwrap_err().contains("invalid credentials"));
    let mut right = client(server.address).await;
    right.set_token("open sesame".into());
    assert_eq!(pretty(&query(&mut right, sql).await.unwrap()), expected);
    assert_eq!(server.stats.refused_requests(), 2);

    let password = Credentials::Password { user: "ann".into(), password: "correct horse".into() };
    let server = start(FlightSqlServer::new(&ctx).with_credentials(password)).await;
    let mut wrong = client(server.address).await;
    assert!(wrong.handshake("ann", "wrong horse").await.is_err());
    assert!(query(&mut wrong, sql).await.is_err());
    let mut right = client(server.address).await;
    right.handshake("ann", "correct horse").await.unwrap();
    assert!(right.token().is_some(), "the handshake hands out a bearer token");
    assert_eq!(pretty(&query(&mut right, sql).await.unwrap()), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_certificate() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (certificate, key) = (certified.cert.pem(), certified.signing_key.serialize_pem());
    let ctx = served_ctx();
    let server = start(FlightSqlServer::new(&ctx).with_tls(&certificate, &key)).await;
    let url = format!("https://localhost:{}", server.address.port());

    let mut secure = connect(url.clone(), Some(&certificate)).await.unwrap();
    assert_eq!(pretty(&query(&mut secure, QUERIES[0]).await.unwrap()), embedded(&ctx, QUERIES[0]).await);

    // A client that does not trust the certificate, or speaks plain text, gets nothing.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap().cert.pem();
    // (The connection itself may fail, or only the first call.)
    if let Ok(mut untrusting) = connect(url, Some(&other)).await {
        assert!(query(&mut untrusting, QUERIES[0]).await.is_err());
    }
    if let Ok(mut plain) = connect(format!("http://{}", server.address), None).await {
        assert!(query(&mut plain, QUERIES[0]).await.is_err());
    }
}

/// A `simjoin serve` process on a free port, killed if a test fails before stopping it.
struct ServeProcess {
    child: Child,
    address: SocketAddr,
    stdout: BufReader<std::process::ChildStdout>,
}

impl ServeProcess {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_simjoin"))
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let address = line
            .split("://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .parse()
            .unwrap();
        Self { child, address, stdout }
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// CPU seconds (user + system) the server has used.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the command name.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        ticks as f64 / 100.0
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serve_process_streams_ten_million_rows_stops_abandoned_work_and_exits_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("simjoin-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.parquet");
    let queries = dir.join("queries.parquet");
    let big = dir.join("big.parquet");
    datagen::write(&datagen::generate(Distribution::Uniform, 10_000, 4, 1), 4, &base).unwrap();
    datagen::write(&datagen::generate(Distribution::Uniform, 10_000, 4, 2), 4, &queries).unwrap();
    datagen::write(&datagen::generate(Distribution::Uniform, 200_000, 2, 3), 2, &big).unwrap();
    let table = |name: &str, path: &std::path::Path| format!("{name}={}", path.display());
    let mut server = ServeProcess::start(&[
        "--table",
        &table("base", &base),
        "--table",
        &table("queries", &queries),
        "--table",
        &table("big", &big),
        "--memory-limit",
        "256M",
    ]);
    let mut client = client(server.address).await;

    // 10,000 queries × k = 1000: 10,000,000 rows of (query_id, base_id, distance, rank), ~280 MB
    // as Arrow, counted batch by batch and dropped; the server's peak memory stays far below.
    let resident_before = server.status_kib("VmRSS:");
    let info = client.execute("SELECT * FROM knn(base, queries, 1000)".into(), None).await.unwrap();
    let (mut rows, mut batches, mut rank_sum) = (0usize, 0usize, 0u64);
    for endpoint in info.endpoint {
        let mut stream = client.do_get(endpoint.ticket.unwrap()).await.unwrap();
        while let Some(batch) = stream.next().await {
            let batch = batch.unwrap();
            rows += batch.num_rows();
            batches += 1;
            let rank = batch.column_by_name("rank").unwrap();
            rank_sum += datafusion::arrow::compute::cast(rank, &DataType::UInt64)
                .unwrap()
                .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                .values()
                .iter()
                .sum::<u64>();
        }
    }
    assert_eq!(rows, 10_000_000);
    assert_eq!(rank_sum, 10_000 * (1..=1000u64).sum::<u64>());
    assert!(batches > 100, "{batches} batches");
    let peak_mib = server.status_kib("VmHWM:") / 1024;
    let before_mib = resident_before / 1024;
    eprintln!("serve: 10M rows in {batches} batches; server RSS {before_mib} MiB before, peak {peak_mib} MiB");
    // Materialising the result would take at least its 10⁷ × 28 bytes (267 MiB) at once.
    assert!(
        peak_mib - before_mib < 160,
        "the server grew from {before_mib} MiB to {peak_mib} MiB for a 267 MiB result"
    );

    // A client that reads a 4·10^10-row join for a while and goes away stops the work (while it
    // reads, the server computes; a client that only pauses holds the server back, by gRPC flow
    // control and the operator's two-chunk channel).
    let mut leaving = client.clone();
    let info = leaving.execute("SELECT * FROM sim_join(big, 2.0)".into(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let reader = tokio::spawn(async move {
        let mut stream = leaving.do_get(ticket).await.unwrap();
        while let Some(batch) = stream.next().await {
            assert!(batch.unwrap().num_rows() > 0);
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let busy_from = server.cpu_seconds();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(server.cpu_seconds() - busy_from > 0.2, "the join should be running while the client reads");
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let from = server.cpu_seconds();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let used = server.cpu_seconds() - from;
        if used < 0.1 {
            break;
        }
        assert!(Instant::now() < deadline, "the server still uses {used:.2} CPU s/s after the client left");
    }
    // The server still answers after the abandoned query.
    let served = query(&mut client, "SELECT count(*) AS n FROM knn(base, queries, 3)").await.unwrap();
    assert_eq!(served[0].column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>().value(0), 30_000);

    // SIGTERM: a clean exit with status 0.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let mut last = String::new();
    server.stdout.read_line(&mut last).unwrap();
    assert!(last.contains("stopped"), "{last}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_releases_its_result_stream() {
    let ctx = ctx();
    register(&ctx, "big", &vectors(20_000, 2, 5), 2, Shape::FixedF32);
    let server = start(FlightSqlServer::new(&ctx)).await;
    let mut client = client(server.address).await;
    let info = client.execute("SELECT * FROM sim_join(big, 2.0)".into(), None).await.unwrap();
    let mut stream = client.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap();
    assert!(stream.next().await.unwrap().unwrap().num_rows() > 0);
    assert_eq!(server.stats.open_result_streams(), 1);
    drop(stream);
    drop(client);
    // The response stream is dropped with the connection, and with it the query's DataFusion
    // stream, which stops the backend (streaming::limit_stops_early_and_dropping_the_stream_…).
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats.open_result_streams() > 0 {
        assert!(Instant::now() < deadline, "the result stream is still open 10 s after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.stats.result_streams(), 1);
}

#[test]
fn serving_other_machines_needs_an_explicit_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_simjoin")).args(["serve", "--bind", "0.0.0.0:0"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--bind 0.0.0.0:0 is not a loopback address") && stderr.contains("--allow-remote"),
        "{stderr}"
    );

    // With the flag it serves, and says plainly that anyone can read every table.
    let mut child = Command::new(env!("CARGO_BIN_EXE_simjoin"))
        .args(["serve", "--bind", "0.0.0.0:0", "--allow-remote"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("listening on grpc://0.0.0.0:"), "{first}");
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without authentication: anyone who can reach it can read every table"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_does_not_hold_up_the_others() {
    let ctx = ctx();
    register(&ctx, "big", &vectors(20_000, 2, 5), 2, Shape::FixedF32);
    register(&ctx, "points", &vectors(300, 3, 11), 3, Shape::FixedF32);
    let server = start(FlightSqlServer::new(&ctx)).await;
    // Two clients start huge joins and stop reading after one batch each.
    let mut paused = Vec::new();
    for _ in 0..2 {
        let mut client = client(server.address).await;
        let info = client.execute("SELECT * FROM sim_join(big, 2.0)".into(), None).await.unwrap();
        let mut stream = client.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap();
        assert!(stream.next().await.unwrap().unwrap().num_rows() > 0);
        paused.push((client, stream));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut other = client(server.address).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), query(&mut other, QUERIES[2])).await;
    assert!(answer.is_ok(), "a third client's kNN waited 20 s behind two paused clients");
    drop(paused);
}
