//! `sim_join`, `range_query` and `knn` on an [Apache DataFusion Ballista](https://datafusion.apache.org/ballista/)
//! cluster: a scheduler, executors on any number of machines, and clients that send SQL.
//!
//! The client expands the table functions and sends the logical plan; the scheduler plans it
//! (an input given by path becomes a scan that the executors run themselves) and divides the
//! operator's work into `tasks` shares (the option; by default `target_partitions`); each task reads the
//! inputs whole and answers for its share of the left (join left, query) rows on the executor's
//! own device (exec/share.rs says why the answer is the single process's, row for row). Every
//! process links the same codecs ([`codec`]), which carry simjoin's table and operator.
//!
//! ```no_run
//! # async fn example() -> datafusion::error::Result<()> {
//! let ctx = simjoin::cluster::connect("df://127.0.0.1:50050").await?;
//! ctx.sql("SELECT count(*) FROM sim_join('points.parquet', 0.05)").await?.show().await?;
//! # Ok(())
//! # }
//! ```

pub mod codec;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::SessionContextExt;
use ballista_core::config::{
    BALLISTA_SCHEDULER_MAX_PARTITIONS_PER_TASK, BALLISTA_SHUFFLE_SORT_BASED_MEMORY_LIMIT_PER_TASK_BYTES,
    TaskSchedulingPolicy,
};
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service_with_listener};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use crate::op::Device;
use crate::options::SimJoinOptions;

pub use codec::{LogicalCodec, PhysicalCodec, Role};

/// The configuration every process of a cluster starts from: Ballista's, simjoin's options and
/// the codecs of a process in `role`.
pub fn session_config(role: Role) -> SessionConfig {
    SessionConfig::new_with_ballista()
        // One share per task: Ballista would otherwise pack as many of a stage's partitions into
        // one task as the first executor has free slots, and a call's two shares for two GPU
        // executors ran one after the other on one of them.
        .set_usize(BALLISTA_SCHEDULER_MAX_PARTITIONS_PER_TASK, 1)
        // A divided kNN shuffles each task's lists (20 bytes a query and neighbour, plus the
        // columns asked for: 200 MB for 10⁶ queries at k = 10). Ballista's sort shuffle spilled
        // them to disk above its default of 256 MB a task, which cost a 10⁶-query kNN over two
        // GPU executors 0.6 s a task; 1 GiB holds them.
        .set_usize(BALLISTA_SHUFFLE_SORT_BASED_MEMORY_LIMIT_PER_TASK_BYTES, 1 << 30)
        .with_option_extension(SimJoinOptions::default())
        .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::new(role)))
}

/// A runtime reaching `s3://`, `gs://`, `az://` and `http(s)://` paths with credentials from the
/// environment (see `stores`; with the `cloud` feature), spilling under `temp` when given.
fn runtime(temp: Option<&PathBuf>) -> Result<Arc<RuntimeEnv>> {
    let mut builder = RuntimeEnvBuilder::new();
    #[cfg(feature = "cloud")]
    {
        builder = builder.with_object_store_registry(Arc::new(crate::stores::RemoteStoreRegistry::new()));
    }
    if let Some(temp) = temp {
        builder = builder.with_temp_file_path(temp);
    }
    builder.build_arc()
}

/// A session state from `config` with Ballista's defaults, the simjoin functions, options and
/// optimizer rule, and remote object stores.
pub fn session_state(config: SessionConfig) -> Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(config)?;
    let state = SessionStateBuilder::new_from_existing(state).with_runtime_env(runtime(None)?).build();
    let ctx = SessionContext::new_with_state(state);
    crate::register(&ctx);
    Ok(ctx.state())
}

/// A session whose queries run on the cluster whose scheduler is at `url` (`df://host:port`),
/// with everything simjoin adds registered. Tables given by path are read by the executors, so
/// a local path must name the same file on every executor (a shared directory) — or use an
/// object-store URL.
pub async fn connect(url: &str) -> Result<SessionContext> {
    // Ballista connects at the first query, and then reports a refused connection as an execution
    // error; a scheduler that is not there is said here, naming the URL.
    let parsed = url::Url::parse(url).ok().filter(|u| u.host_str().is_some());
    let Some(parsed) = parsed else {
        return Err(DataFusionError::Configuration(format!("cluster URL '{url}': expected df://HOST:PORT")));
    };
    let endpoint = format!("http://{}:{}", parsed.host_str().unwrap_or_default(), parsed.port().unwrap_or(50050));
    let unreachable = |why: String| {
        DataFusionError::Configuration(format!(
            "the cluster's scheduler at {url} cannot be reached (is `simjoin scheduler` running there?): {why}"
        ))
    };
    match tokio::time::timeout(Duration::from_secs(10), SchedulerGrpcClient::connect(endpoint)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(unreachable(e.to_string())),
        Err(_) => return Err(unreachable("no answer within 10 s".into())),
    }
    let ctx = SessionContext::remote_with_state(url, session_state(session_config(Role::Planner))?).await?;
    Ok(with_distance_functions(ctx))
}

/// `ctx` with simjoin's scalar distance functions, which Ballista's client set-up replaces by
/// its own list of scalar functions.
fn with_distance_functions(ctx: SessionContext) -> SessionContext {
    for function in crate::functions::scalar_functions() {
        ctx.register_udf(function);
    }
    ctx
}

/// A cluster inside this process — a scheduler and `executors` executors on loopback, each
/// with `vcores` task slots and `device` where a query leaves `device=auto` — and a session
/// connected to it. Plans take the whole serialised path of a real cluster (tests, trials).
pub async fn in_process(executors: usize, vcores: usize, device: Device) -> Result<SessionContext> {
    let failed = |e: &dyn std::fmt::Display| DataFusionError::Configuration(format!("starting a cluster: {e}"));
    let (listening, address) = tokio::sync::oneshot::channel();
    // The in-process executors poll for tasks (Ballista's standalone executors do).
    let scheduler = serve_scheduler(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        TaskSchedulingPolicy::PullStaged,
        move |address| {
            let _ = listening.send(address);
        },
        std::future::pending(),
    );
    tokio::spawn(async move {
        if let Err(e) = scheduler.await {
            eprintln!("simjoin: the in-process scheduler stopped: {e}");
        }
    });
    let address = address.await.map_err(|_| failed(&"the scheduler did not start"))?;
    let executor = session_state(session_config(Role::Executor { device }))?;
    for _ in 0..executors {
        let scheduler = SchedulerGrpcClient::connect(format!("http://{address}")).await.map_err(|e| failed(&e))?;
        ballista_executor::new_standalone_executor_from_state(scheduler, vcores, &executor)
            .await
            .map_err(|e| failed(&e))?;
    }
    let planner = session_state(session_config(Role::Planner))?;
    let ctx = SessionContext::remote_with_state(&format!("df://{address}"), planner).await?;
    Ok(with_distance_functions(ctx))
}

/// Runs a scheduler on `bind` (port 0: a free port) until `shutdown` completes; `listening` is
/// told the address once it accepts connections. It pushes tasks to its executors.
pub async fn run_scheduler(
    bind: SocketAddr,
    listening: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    serve_scheduler(bind, TaskSchedulingPolicy::PushStaged, listening, shutdown).await
}

async fn serve_scheduler(
    bind: SocketAddr,
    policy: TaskSchedulingPolicy,
    listening: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| DataFusionError::Configuration(format!("simjoin scheduler: {e}"));
    let listener =
        tokio::net::TcpListener::bind(bind).await.map_err(|e| failed(&format!("cannot bind {bind}: {e}")))?;
    let address = listener.local_addr().map_err(|e| failed(&e))?;
    let config = SchedulerConfig {
        bind_host: address.ip().to_string(),
        external_host: address.ip().to_string(),
        bind_port: address.port(),
        scheduling_policy: policy,
        // A call's few large shares go one per executor (one per GPU) before any doubles up.
        task_distribution: TaskDistributionPolicy::RoundRobin,
        override_config_producer: Some(Arc::new(|| session_config(Role::Planner))),
        override_session_builder: Some(Arc::new(session_state)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::new(Role::Planner))),
        // A dead executor is noticed within half a minute rather than three.
        executor_timeout_seconds: 30,
        expire_dead_executor_interval_seconds: 5,
        ..Default::default()
    };
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(|e| failed(&e))?;
    let scheduler = create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
        .await
        .map_err(|e| failed(&e))?;
    listening(address);
    tokio::select! {
        served = start_grpc_service_with_listener(listener, scheduler) => served.map_err(|e| failed(&e)),
        _ = shutdown => Ok(()),
    }
}

/// What `simjoin executor` is told.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host and port.
    pub scheduler: (String, u16),
    /// The address to listen on; port 0 picks free ports.
    pub bind: SocketAddr,
    /// The device of tasks whose query left `device=auto`.
    pub device: Device,
    /// Tasks run at once (0: one per CPU core); Ballista also runs the tasks' reading and
    /// decoding on this many threads.
    pub concurrent_tasks: usize,
    /// Bytes of memory for the tasks, divided evenly among the concurrent ones (`None`: no limit,
    /// as in one process, rather than Ballista's share of the host's memory per task slot, which
    /// on a 32-core host left a task 5.5 GB).
    pub memory_limit: Option<usize>,
}

/// Runs an executor until SIGINT or SIGTERM; `listening` is told its address first.
pub async fn run_executor(options: ExecutorOptions, listening: impl FnOnce(SocketAddr)) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| DataFusionError::Configuration(format!("simjoin executor: {e}"));
    let host = options.bind.ip();
    // Ballista binds its ports itself: take free ones first for port 0.
    let free_port = || -> Result<u16> {
        let probe = std::net::TcpListener::bind((host, 0)).map_err(|e| failed(&format!("cannot bind {host}: {e}")))?;
        Ok(probe.local_addr().map_err(|e| failed(&e))?.port())
    };
    let port = if options.bind.port() == 0 { free_port()? } else { options.bind.port() };
    let grpc_port = free_port()?;
    let work_dir = std::env::temp_dir().join(format!("simjoin-executor-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&work_dir).map_err(|e| failed(&format!("cannot create {}: {e}", work_dir.display())))?;
    let role = Role::Executor { device: options.device };
    let functions = BallistaFunctionRegistry::from(&session_state(session_config(role))?);
    let temp = work_dir.clone();
    let config = ExecutorProcessConfig {
        bind_host: host.to_string(),
        external_host: Some(host.to_string()),
        port,
        grpc_port,
        scheduler_host: options.scheduler.0.clone(),
        scheduler_port: options.scheduler.1,
        scheduler_connect_timeout_seconds: 10,
        vcores: options.concurrent_tasks,
        work_dir: Some(work_dir.to_string_lossy().into_owned()),
        executor_heartbeat_interval_seconds: 5,
        task_scheduling_policy: TaskSchedulingPolicy::PushStaged,
        memory_pool_size: Some(options.memory_limit.unwrap_or(0) as u64),
        override_config_producer: Some(Arc::new(move || session_config(role))),
        override_runtime_producer: Some(Arc::new(move |_| runtime(Some(&temp)))),
        override_function_registry: Some(Arc::new(functions)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::new(role))),
        ..Default::default()
    };
    listening(SocketAddr::new(host, port));
    let result = start_executor_process(Arc::new(config)).await.map_err(|e| failed(&e));
    let _ = std::fs::remove_dir_all(&work_dir);
    result
}
