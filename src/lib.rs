//! # simjoin
//!
//! Exact similarity joins, range queries and k-nearest-neighbour searches as SQL table functions
//! on [DataFusion](https://datafusion.apache.org): `sim_join(t, eps)`, `range_query(base, query, r)`
//! and `knn(base, query, k)`, on every CPU core (and on the GPU when there is one), with answers
//! equal to an f64 brute force.
//!
//! ```no_run
//! # async fn example() -> datafusion::error::Result<()> {
//! use datafusion::prelude::{ParquetReadOptions, SessionContext};
//!
//! let ctx = SessionContext::new();
//! simjoin::register(&ctx);
//! ctx.register_parquet("points", "points.parquet", ParquetReadOptions::default()).await?;
//! ctx.sql("SELECT left_id, right_id, distance FROM sim_join(points, 0.05)").await?.show().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The API:
//! - [`register`] adds everything to a session; [`session_context`] and its variants make one;
//!   [`table_functions`] and [`distance_functions`] are the functions alone, for a host that
//!   registers them itself.
//! - [`SimJoinOptions`] holds the `simjoin.*` options as typed values ([`Metric`], [`Device`],
//!   [`Devices`], [`IndexChoice`], [`PairOrder`]), to put in a `SessionConfig` or `SET` in SQL.
//! - [`SimilarityExec`] is the one physical operator (EXPLAIN's `SimilarityExec`); a
//!   [`Progress`] extension of the session hears how far a long run is ([`ProgressListener`]).
//! - [`datagen`] writes the seeded datasets the benchmarks and examples use.
//! - With the `gpu` feature, [`selftest`] checks the GPU's answers against the cores'; with
//!   `server`, `server` serves a session over Arrow Flight SQL; with `cluster`, `cluster` runs
//!   and connects to Apache DataFusion Ballista processes; with `cloud`, `stores` reaches
//!   `s3://`, `gs://`, `az://` and `http(s)://` paths.
//!
//! Cargo features (all on by default): `gpu`, `server`, `cluster`, `cloud`, and `cli` (the `simjoin`
//! binary, which brings the others). A program that only embeds the engine takes
//! `default-features = false, features = ["gpu"]`; without `gpu`, `device=gpu` is an error that
//! says so and `device=auto` runs on the cores.
//!
//! Inside, dependencies point one way: `functions → table → exec → backend → cuda`; `cluster`
//! (Ballista's processes and the codecs carrying the table and the operator) and `server` sit
//! above them.

mod backend;
mod costs;
#[cfg(feature = "gpu")]
mod cuda;
pub mod datagen;
mod exec;
mod functions;
mod index;
mod op;
mod options;
mod results;
#[cfg(feature = "gpu")]
pub mod selftest;
mod table;
mod vectors;

#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "cloud")]
pub mod stores;

use std::sync::Arc;

use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::optimizer::OptimizerRule;
use datafusion::prelude::SessionConfig;

pub use exec::{Progress, ProgressListener, SimilarityExec};
pub use op::{Device, Devices, IndexChoice, Metric, PairOrder};
pub use options::{SimJoinOptions, available_memory};

/// Hooks of the `simjoin` binary's benchmarks and process exit; not part of the API.
#[doc(hidden)]
pub mod internal {
    #[cfg(feature = "gpu")]
    pub use crate::cuda::probe as gpu_probe;
    #[cfg(feature = "gpu")]
    pub use crate::cuda::startup::in_flight as gpu_startup_in_flight;
    pub use crate::op::Checks;
}

/// Adds simjoin to `ctx`, keeping what the session already holds (its id, configuration,
/// tables, functions, runtime and Parquet settings). It adds:
/// - the table functions `sim_join`, `range_query` and `knn` (and `SIM_JOIN`, `RANGE_QUERY`, `KNN`);
/// - the scalar distance functions `l2_distance`, `l2sq_distance`, `cosine_distance`,
///   `array_cosine_distance`, `l1_distance`, `linf_distance`, `inner_product`,
///   `array_inner_product`, `array_negative_inner_product`, `jaccard_distance` and
///   `hamming_distance`, replacing functions of the same names (DataFusion's `inner_product`
///   among them), and `shingles` and `qgrams`, which make token sets of text;
/// - the `simjoin.*` options ([`SimJoinOptions`], a `ConfigExtension`), unless the session has
///   them already (options set before stay as they are);
/// - the session's cache of converted vectors kept across its queries (`simjoin.cache_size`; with
///   the indexes built over them and, on a GPU, their rows left on the device);
/// - the logical optimizer rule that plans a join on a distance bound as `sim_join`, a ranked kNN
///   join as `knn` (and, as `simjoin.rewrite_scans` says, a filter or `ORDER BY … LIMIT` on the
///   distance to a constant as `range_query` or `knn`);
/// - the relation planner that makes a CTE's name or a subquery a table argument of the table
///   functions;
/// - the physical optimizer rule that computes `count(*)`, `min(distance)` and `max(distance)`
///   over a join in the operator, and gives the operator's rows straight to the partial
///   aggregates that consume other functions of them on every core, where DataFusion would spread
///   them by a round-robin repartition. DataFusion adds a physical rule to an existing session only by
///   building its state anew from the old one, which keeps everything above, the session id too.
///
/// Calling it again adds nothing twice.
pub fn register(ctx: &SessionContext) {
    // First: rebuilding the state registers each function again under its name and aliases, in
    // no set order, which may put DataFusion's own `inner_product` over ours; ours go in after.
    let state = ctx.state();
    if !state.physical_optimizers().iter().any(|rule| rule.name() == exec::SummariseAggregates::NAME) {
        let session_id = state.session_id().to_string();
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(state)
            .with_session_id(session_id)
            .with_physical_optimizer_rule(Arc::new(exec::SummariseAggregates))
            .build();
        *ctx.state_ref().write() = state;
    }
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let config = state.config_mut();
        if config.options().extensions.get::<SimJoinOptions>().is_none() {
            config.options_mut().extensions.insert(SimJoinOptions::default());
        }
        // The session's own kept vectors: each query's configuration is a copy of the session's,
        // so its tasks share this one cache, and another session has its own.
        if config.get_extension::<exec::VectorCache>().is_none() {
            config.set_extension(Arc::new(exec::VectorCache::default()));
        }
    }
    for (name, function) in functions::all() {
        ctx.register_udtf(name, function);
    }
    if !ctx.state().relation_planners().iter().any(|p| format!("{p:?}") == "TableArgumentPlanner") {
        ctx.register_relation_planner(Arc::new(functions::table_arguments::TableArgumentPlanner))
            .expect("registering a relation planner on a session cannot fail");
    }
    for function in functions::scalar_functions() {
        ctx.register_udf(function);
    }
    let rewrite = functions::rewrite::SimilarityJoinRewrite;
    if !ctx.state().optimizers().iter().any(|rule| rule.name() == rewrite.name()) {
        ctx.add_optimizer_rule(Arc::new(rewrite));
    }
}

/// The table functions `sim_join`, `range_query` and `knn`, each under every name [`register`] gives
/// it (lower and upper case), for a host that registers functions itself: a datafusion-python
/// session through DataFusion's FFI, for one. The plain-SQL join rewrite and the aggregate rule are
/// [`register`]'s alone.
pub fn table_functions() -> Vec<(&'static str, Arc<dyn datafusion::catalog::TableFunctionImpl>)> {
    functions::all()
}

/// The scalar functions [`register`] adds: the distances (`l2_distance`, `cosine_distance`,
/// `jaccard_distance`, `hamming_distance`, …) and the token sets of text (`shingles`, `qgrams`).
pub fn distance_functions() -> Vec<datafusion::logical_expr::ScalarUDF> {
    functions::scalar_functions()
}

/// A new session with simjoin [`register`]ed. As [`session_context_with_config`], it encodes a
/// single Parquet file's row groups on every core.
pub fn session_context() -> SessionContext {
    session_context_with_config(SessionConfig::new())
}

/// A new session from `config` with the simjoin functions and options registered.
/// A single Parquet file written by `COPY … TO` (or the CLI's `--output`) has its row groups
/// encoded on every core rather than one, unless the configuration chose a number.
pub fn session_context_with_config(config: SessionConfig) -> SessionContext {
    session_context_with_config_rt(config, Arc::new(RuntimeEnv::default()))
}

/// [`session_context_with_config`] on `runtime` (its memory pool, object stores, disk manager);
/// `RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(stores::RemoteStoreRegistry::new()))`
/// gives it `s3://`, `gs://`, `az://` and `http(s)://` paths from the environment.
pub fn session_context_with_config_rt(mut config: SessionConfig, runtime: Arc<RuntimeEnv>) -> SessionContext {
    let parquet = &mut config.options_mut().execution.parquet;
    if parquet.maximum_parallel_row_group_writers == 1 {
        parquet.maximum_parallel_row_group_writers = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    // `register` adds the default options where `config` has none of its own.
    let ctx = SessionContext::new_with_config_rt(config, runtime);
    register(&ctx);
    ctx
}
