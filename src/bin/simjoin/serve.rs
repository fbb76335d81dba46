//! `simjoin serve`: the session over Arrow Flight SQL until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use simjoin::server::{Credentials, FlightSqlServer};

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
    /// Memory for query inputs, shared by all queries (e.g. 512M, 8G); a query that needs more fails
    /// with a resources error instead of exhausting the machine.
    #[arg(long, value_parser = parse_bytes)]
    memory_limit: Option<usize>,
    #[command(flatten)]
    session: SessionArgs,
}

fn parse_bytes(s: &str) -> Result<usize, String> {
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

    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(bytes) = args.memory_limit {
        runtime = runtime.with_memory_limit(bytes, 1.0);
    }
    let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime.build_arc()?);
    simjoin::register(&ctx);
    let ctx = super::sql::register_tables(ctx, &args.session).await?;

    let mut server = FlightSqlServer::new(&ctx).with_credentials(credentials.clone());
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
    println!("simjoin Flight SQL server listening on {scheme}://{address} (authentication: {auth}, tables: {tables})");
    std::io::stdout().flush()?;

    server.serve(listener, shutdown_signal()).await?;
    // Whoever started the server may have closed its stdout by now.
    let _ = writeln!(std::io::stdout(), "simjoin Flight SQL server stopped");
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
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

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("-1G").is_err());
    }
}
