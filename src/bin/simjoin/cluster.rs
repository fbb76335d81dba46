//! `simjoin scheduler` and `simjoin executor`: the processes of a cluster (Apache DataFusion
//! Ballista's, with simjoin's codecs linked in), stopped cleanly by SIGINT or SIGTERM.

use std::net::SocketAddr;

use clap::Args;
use datafusion::error::{DataFusionError, Result};
use simjoin::Device;
use simjoin::cluster::ExecutorOptions;

#[derive(Args)]
pub struct SchedulerArgs {
    /// Address to listen on; port 0 picks a free port (printed once listening).
    #[arg(long, default_value = "127.0.0.1:50050")]
    bind: SocketAddr,
}

#[derive(Args)]
pub struct ExecutorArgs {
    /// The scheduler's address, HOST:PORT (or df://HOST:PORT).
    #[arg(long, default_value = "127.0.0.1:50050")]
    scheduler: String,
    /// Address to listen on for the other executors' and the clients' fetches; port 0 picks
    /// free ports, so several executors can share a host.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Device of the tasks whose query leaves device=auto.
    #[arg(long, default_value = "auto", value_parser = super::parse_device)]
    device: Device,
    /// Tasks run at once (0: one per CPU core). Ballista runs the tasks' reading and decoding on
    /// this many threads too, so keep it at the cores even for one GPU (the scheduler hands a
    /// call's shares out one per executor first).
    #[arg(long, default_value_t = 0)]
    concurrent_tasks: usize,
    /// Memory for the tasks' inputs, divided evenly among the concurrent tasks (e.g. 64G); a task
    /// that needs more than its part fails with a resources error. Without it, no limit.
    #[arg(long, value_parser = super::serve::parse_bytes)]
    memory_limit: Option<usize>,
}

pub async fn scheduler(args: SchedulerArgs) -> Result<()> {
    simjoin::cluster::run_scheduler(
        args.bind,
        |address| println!("simjoin scheduler listening on {address}"),
        super::serve::shutdown_signal(),
    )
    .await?;
    println!("simjoin scheduler stopped");
    Ok(())
}

pub async fn executor(args: ExecutorArgs) -> Result<()> {
    let address = args.scheduler.trim_start_matches("df://").trim_start_matches("http://");
    let scheduler = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_string(), port.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            DataFusionError::Configuration(format!("--scheduler expects HOST:PORT, got '{}'", args.scheduler))
        })?;
    let options = ExecutorOptions {
        scheduler,
        bind: args.bind,
        device: args.device,
        concurrent_tasks: args.concurrent_tasks,
        memory_limit: args.memory_limit,
    };
    simjoin::cluster::run_executor(options, |address| {
        println!("simjoin executor listening on {address} (scheduler {address_of})", address_of = args.scheduler)
    })
    .await?;
    println!("simjoin executor stopped");
    Ok(())
}
