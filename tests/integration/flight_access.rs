//! What a client of the Flight SQL server may do, with a real client (arrow-flight's
//! `FlightSqlServiceClient`) against an in-process server over real files: read-only by default
//! (COPY, CREATE EXTERNAL TABLE, DROP, SET and prepared writes refused, nothing written or
//! dropped), files confined to the data directories (absolute paths, `..` and symbolic links out
//! refused), writes inside them with writes allowed, and the per-query limits (a time limit that
//! cancels the work, a cap on concurrent queries answered "busy").

use std::path::{Path, PathBuf};
use std::time::Duration;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use futures::StreamExt;
use simjoin::datagen::{self, Distribution};
use simjoin::server::{Access, FlightSqlServer};

use crate::flight::{client, query, served_ctx, start};

/// A scratch tree: `data/` (a data directory with `inside.parquet` and a link out), `outside/`
/// (a CSV a client must not read) and `served.parquet` (a served table's file).
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("simjoin-access-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        let points = datagen::generate(Distribution::Uniform, 200, 3, 5);
        datagen::write(&points, 3, &root.join("data/inside.parquet")).unwrap();
        datagen::write(&points, 3, &root.join("served.parquet")).unwrap();
        std::fs::write(root.join("outside/secret.csv"), "x1,x2,x3\n0.1,0.2,0.3\n").unwrap();
        std::os::unix::fs::symlink(root.join("outside/secret.csv"), root.join("data/link.csv")).unwrap();
        Self { root }
    }

    fn path(&self, relative: &str) -> String {
        self.root.join(relative).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

async fn ctx_serving(file: &Path) -> SessionContext {
    let ctx = served_ctx();
    ctx.register_parquet("served", file.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
    ctx
}

fn count(batches: &[RecordBatch]) -> i64 {
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_refuses_writes_ddl_and_set() {
    let scratch = Scratch::new("ro");
    let ctx = ctx_serving(&scratch.root.join("served.parquet")).await;
    let server = start(FlightSqlServer::new(&ctx).with_data_dir(scratch.root.join("data"))).await;
    let mut client = client(server.address).await;

    let pwned = scratch.path("data/pwned.csv");
    for (sql, kind) in [
        (format!("COPY (SELECT 1 AS x) TO '{pwned}' STORED AS CSV"), "COPY"),
        ("CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '/etc/os-release'".to_string(), "CREATE EXTERNAL TABLE"),
        ("CREATE TABLE t AS SELECT 1 AS x".to_string(), "CREATE TABLE"),
        ("DROP TABLE points".to_string(), "DROP"),
        ("INSERT INTO points SELECT * FROM points".to_string(), "INSERT"),
        ("SET datafusion.execution.batch_size = 1".to_string(), "SET"),
        (format!("EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{pwned}' STORED AS CSV"), "COPY"),
    ] {
        let error = query(&mut client, &sql).await.unwrap_err();
        assert!(error.contains("does not have permission"), "{sql}: {error}");
        assert!(error.contains(&format!("{kind} is not allowed")), "{sql}: {error}");
        // A prepared statement is checked the same way.
        let prepared = client.prepare(sql.clone(), None).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(prepared.contains(&format!("{kind} is not allowed")), "prepared {sql}: {prepared}");
    }
    assert!(!Path::new(&pwned).exists());
    // Nothing was dropped or created: the served tables are intact for every client.
    let mut other = crate::flight::client(server.address).await;
    assert_eq!(count(&query(&mut other, "SELECT count(*) FROM points").await.unwrap()), 300);
    assert!(query(&mut other, "SELECT * FROM e").await.unwrap_err().contains("not found"));
    // Reads still work: queries, EXPLAIN, SHOW.
    for sql in ["SELECT count(*) FROM knn(points, queries, 3)", "EXPLAIN SELECT * FROM sim_join(points, 0.1)"] {
        assert!(!query(&mut client, sql).await.unwrap().is_empty(), "{sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_confined_to_the_data_directories() {
    let scratch = Scratch::new("files");
    let served = scratch.root.join("served.parquet");
    let ctx = ctx_serving(&served).await;
    let with_dir = start(FlightSqlServer::new(&ctx).with_data_dir(scratch.root.join("data"))).await;
    let mut client = client(with_dir.address).await;

    let inside = format!("SELECT count(*) FROM knn('{}', queries, 3)", scratch.path("data/inside.parquet"));
    assert_eq!(count(&query(&mut client, &inside).await.unwrap()), 60);
    // A served table's own file is readable by path too.
    let own = format!("SELECT count(*) FROM knn('{}', queries, 2)", served.display());
    assert_eq!(count(&query(&mut client, &own).await.unwrap()), 40);
    for path in [
        scratch.path("outside/secret.csv"),
        format!("{}/../outside/secret.csv", scratch.path("data")),
        scratch.path("data/link.csv"),
        "/etc/os-release.csv".to_string(),
    ] {
        let sql = format!("SELECT * FROM sim_join('{path}', 1.0)");
        let error = query(&mut client, &sql).await.unwrap_err();
        assert!(error.contains("outside the server's data directories"), "{path}: {error}");
        assert!(!error.contains("0.1,0.2"), "{path}: {error}");
    }

    // Without a data directory, only the served tables' files are reachable.
    let without = start(FlightSqlServer::new(&ctx)).await;
    let mut client = crate::flight::client(without.address).await;
    assert_eq!(count(&query(&mut client, &own).await.unwrap()), 40);
    let error = query(&mut client, &inside).await.unwrap_err();
    assert!(error.contains("reads only the files of the tables it serves"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_writes_allowed_copy_writes_inside_the_data_directories_only() {
    let scratch = Scratch::new("rw");
    let ctx = ctx_serving(&scratch.root.join("served.parquet")).await;
    let server =
        start(FlightSqlServer::new(&ctx).with_access(Access::ReadWrite).with_data_dir(scratch.root.join("data"))).await;
    let mut client = client(server.address).await;

    let inside = scratch.path("data/out.csv");
    query(&mut client, &format!("COPY (SELECT 1 AS x) TO '{inside}' STORED AS CSV")).await.unwrap();
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "x\n1\n");
    let outside = scratch.path("outside/out.csv");
    let error = query(&mut client, &format!("COPY (SELECT 1 AS x) TO '{outside}' STORED AS CSV")).await.unwrap_err();
    assert!(error.contains("outside the server's data directories"), "{error}");
    assert!(!Path::new(&outside).exists());
    let error = query(&mut client, "CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '/etc/os-release'").await;
    assert!(error.unwrap_err().contains("outside the server's data directories"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_past_its_time_limit_is_cancelled_and_a_full_server_answers_busy() {
    let ctx = served_ctx();
    let values = datagen::generate(Distribution::Uniform, 40_000, 2, 9);
    let batch = datagen::vector_batch(&values, 2).unwrap();
    ctx.register_batch("big", batch).unwrap();
    // Every pair of 40,000 points: 1.6·10⁹ pairs, far more than a second's work here.
    let slow = "SELECT count(*) FROM sim_join(big, 10.0, 'device=cpu')";

    let server =
        start(FlightSqlServer::new(&ctx).with_query_timeout(Duration::from_millis(500)).with_max_concurrent_queries(1))
            .await;
    let mut client = client(server.address).await;
    let started = std::time::Instant::now();
    let error = query(&mut client, slow).await.unwrap_err();
    assert!(error.contains("query timeout"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert_eq!(server.stats.open_result_streams(), 0);
    assert_eq!(count(&query(&mut client, "SELECT count(*) FROM points").await.unwrap()), 300);

    // One query at a time: while a result stream is open, the next query is refused at once.
    let info = client.execute(slow.to_string(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut running = client.do_get(ticket).await.unwrap();
    let busy = query(&mut crate::flight::client(server.address).await, "SELECT 1").await.unwrap_err();
    assert!(busy.contains("busy"), "{busy}");
    // The open query still ends by its time limit, and its slot comes back.
    let ended = running.next().await;
    assert!(matches!(ended, Some(Err(_))), "{ended:?}");
    drop(running);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(count(&query(&mut client, "SELECT count(*) FROM points").await.unwrap()), 300);
}
