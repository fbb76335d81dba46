//! `simjoin serve`: the session over Arrow Flight SQL until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use simjoin::server::{Access, Credentials, DEFAULT_MAX_CONCURRENT_QUERIES, FlightSqlServer};
use url::Url;

use super::SessionArgs;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    bind: SocketAddr,
    /// Allow a --bind address other than loopback, i.e. serve other machines.
    #[arg(long)]
    allow_remote: bool,
    /// Require `authorization: Bearer TOKEN` on every call.
    #[arg(long, env = "SIMJOIN_TOKEN", hide_env_values = true, conflicts_with_all = ["user", "password"])]
    token: Option<String>,
    /// Require this user name (with --password): Flight handshake or Basic auth.
    #[arg(long, requires = "password")]
    user: Option<String>,
    /// The password for --user.
    #[arg(long, env = "SIMJOIN_PASSWORD", hide_env_values = true, requires = "user")]
    password: Option<String>,
    /// Serve TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Let clients run DDL, DML, COPY and SET: tables a client creates or drops are those every
    /// client sees, and COPY writes files inside the --data-dir directories. Without it the
    /// server answers queries only.
    #[arg(long)]
    allow_writes: bool,
    /// A directory whose files queries may name (path arguments, CREATE EXTERNAL TABLE, COPY);
    /// repeatable. Without it, clients reach only the served --table files.
    #[arg(long = "data-dir", value_name = "DIR")]
    data_dirs: Vec<PathBuf>,
    /// Cancel a query still running after this long (e.g. 30s, 5m, 1h; plain numbers are seconds).
    #[arg(long, value_parser = parse_duration)]
    query_timeout: Option<Duration>,
    /// The most queries that run at once; more are answered "busy".
    #[arg(long, default_value_t = DEFAULT_MAX_CONCURRENT_QUERIES)]
    max_concurrent_queries: usize,
    #[command(flatten)]
    session: SessionArgs,
}

pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let (number, unit) = s.trim().split_at(s.trim().find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.trim().len()));
    let scale: usize = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
        _ => return Err(format!("unknown unit '{unit}' (use K, M, G or T)")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("'{s}' is not a size such as 512M or 8G"))?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("'{s}' must be a positive size"));
    }
    Ok((value * scale as f64) as usize)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("unknown unit '{unit}' (use ms, s, m or h)")),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("'{s}' is not a duration such as 30s or 5m"))?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("'{s}' must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

pub async fn run(args: ServeArgs) -> Result<()> {
    let ip = args.bind.ip();
    if !ip.is_loopback() && !args.allow_remote {
        return Err(DataFusionError::Configuration(format!(
            "simjoin serve: --bind {} is not a loopback address; add --allow-remote to serve other machines",
            args.bind
        )));
    }
    let credentials = match (args.token, args.user, args.password) {
        (Some(token), _, _) if token.is_empty() => {
            return Err(DataFusionError::Configuration("simjoin serve: --token must not be empty".into()));
        }
        (Some(token), _, _) => Credentials::Token(token),
        (None, Some(user), Some(password)) => Credentials::Password { user, password },
        _ => Credentials::None,
    };
    if !ip.is_loopback() {
        if credentials == Credentials::None {
            eprintln!(
                "warning: serving {} without authentication: anyone who can reach it can read every table",
                args.bind
            );
        } else if args.tls_cert.is_none() {
            eprintln!(
                "warning: serving {} without TLS: credentials and results cross the network in clear text",
                args.bind
            );
        }
    }

    let runtime = RuntimeEnvBuilder::new().with_memory_limit(args.session.memory_limit(), 1.0);
    // On a cluster the executors compute; the server plans, checks and streams the answers.
    let ctx = match &args.session.cluster {
        Some(url) => simjoin::cluster::connect(url).await?,
        None => simjoin::session_context_with_config_rt(SessionConfig::new(), runtime.build_arc()?),
    };
    // Remote object stores are reachable only as the server names them: the buckets (containers,
    // hosts) of the --table and --data-dir URLs, with credentials from the environment.
    let mut local_dirs = Vec::new();
    for dir in &args.data_dirs {
        match remote_url(&dir.to_string_lossy()) {
            Some(url) => register_remote_store(&ctx, &url)?,
            None => local_dirs.push(dir.clone()),
        }
    }
    for spec in &args.session.tables {
        if let Some(url) = spec.split_once('=').and_then(|(_, path)| remote_url(path.trim())) {
            register_remote_store(&ctx, &url)?;
        }
    }
    let ctx = super::sql::register_tables(ctx, &args.session).await?;

    if args.max_concurrent_queries == 0 {
        return Err(DataFusionError::Configuration(
            "simjoin serve: --max-concurrent-queries must be at least 1".into(),
        ));
    }
    let access = if args.allow_writes { Access::ReadWrite } else { Access::ReadOnly };
    let mut server = FlightSqlServer::new(&ctx)
        .with_credentials(credentials.clone())
        .with_access(access)
        .with_max_concurrent_queries(args.max_concurrent_queries);
    for dir in &local_dirs {
        server = server.with_data_dir(dir);
    }
    if let Some(timeout) = args.query_timeout {
        server = server.with_query_timeout(timeout);
    }
    let scheme = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |path: &PathBuf| {
                std::fs::read(path).map_err(|e| {
                    DataFusionError::Configuration(format!("simjoin serve: cannot read {}: {e}", path.display()))
                })
            };
            server = server.with_tls(read(cert)?, read(key)?);
            "grpc+tls"
        }
        _ => "grpc",
    };
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| DataFusionError::Configuration(format!("simjoin serve: cannot listen on {}: {e}", args.bind)))?;
    let address = listener.local_addr()?;
    let auth = match credentials {
        Credentials::None => "none",
        Credentials::Token(_) => "bearer token",
        Credentials::Password { .. } => "user and password",
    };
    let tables = args.session.tables.len();
    let access = if args.allow_writes { "read-write" } else { "read-only" };
    let files = match args.data_dirs.len() {
        0 => "served tables only".to_string(),
        n => format!("{n} data director{}", if n == 1 { "y" } else { "ies" }),
    };
    println!(
        "simjoin Flight SQL server listening on {scheme}://{address} \
         (authentication: {auth}, tables: {tables}, {access}, files: {files})"
    );
    std::io::stdout().flush()?;

    server.serve(listener, shutdown_signal()).await?;
    // Whoever started the server may have closed its stdout by now.
    let _ = writeln!(std::io::stdout(), "simjoin Flight SQL server stopped");
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(e) => {
            eprintln!("warning: cannot watch for SIGTERM ({e}); stop the server with Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// `path` as the URL of a remote object store (`s3://…`, `https://…`), if it is one.
fn remote_url(path: &str) -> Option<Url> {
    Url::parse(path).ok().filter(simjoin::stores::is_remote)
}

fn register_remote_store(ctx: &SessionContext, url: &Url) -> Result<()> {
    let store = simjoin::stores::store_for_url(url)
        .map_err(|e| DataFusionError::Configuration(format!("simjoin serve: {}", e.strip_backtrace())))?;
    ctx.register_object_store(url, store);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{parse_bytes, parse_duration};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("-1G").is_err());
    }
}
