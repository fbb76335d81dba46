//! # simjoin
//!
//! Exact similarity joins, range queries and k-nearest-neighbour searches as SQL table functions
//! on [DataFusion](https://datafusion.apache.org): `sim_join(t, eps)`, `range_query(base, query, r)`
//! and `knn(base, query, k)`, on every CPU core (and on the GPU when there is one), with answers
//! equal to an f64 brute force.
//!
//! ```no_run
//! # async fn example() -> datafusion::error::Result<()> {
//! use datafusion::prelude::*;
//!
//! let ctx = SessionContext::new();
//! simjoin::register(&ctx);
//! ctx.register_parquet("points", "points.parquet", ParquetReadOptions::default()).await?;
//! ctx.sql("SELECT left_id, right_id, distance FROM sim_join(points, 0.05)").await?.show().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Dependencies point one way: `functions → table → exec → backend → gpu`; `cluster` (Ballista's
//! processes and the codecs carrying the table and the operator) sits above them.

pub mod backend;
pub mod cluster;
pub mod datagen;
pub mod exec;
pub mod functions;
pub mod gpu;
pub mod index;
pub mod op;
pub mod options;
pub mod results;
pub mod server;
pub mod stores;
pub mod table;
pub mod vectors;

use std::sync::Arc;

use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::SessionConfig;

pub use exec::{Progress, ProgressListener, SimilarityExec};
pub use op::{Device, Metric, PairOrder};
pub use options::SimJoinOptions;

/// Adds the simjoin functions (`sim_join`, `range_query`, `knn` and their upper-case spellings; the
/// scalar distance functions `l2_distance`, `cosine_distance`, `inner_product`, …), the
/// `simjoin.*` options, the optimizer rule that plans joins on a distance bound as `sim_join`
/// (functions/rewrite.rs) and the physical rule that computes `count(*)`, `min(distance)` and
/// `max(distance)` over a join in the operator (exec/summary.rs) to `ctx`.
pub fn register(ctx: &SessionContext) {
    // First: rebuilding the state registers DataFusion's own functions again, over ours of the
    // same name (`inner_product`).
    let state = ctx.state();
    if !state.physical_optimizers().iter().any(|rule| rule.name() == exec::SummariseAggregates::NAME) {
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(state)
            .with_physical_optimizer_rule(Arc::new(exec::SummariseAggregates))
            .build();
        *ctx.state_ref().write() = state;
    }
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        let options = state.config_mut().options_mut();
        if options.extensions.get::<SimJoinOptions>().is_none() {
            options.extensions.insert(SimJoinOptions::default());
        }
    }
    for (name, function) in functions::all() {
        ctx.register_udtf(name, function);
    }
    for function in functions::distance::all() {
        ctx.register_udf(function);
    }
    ctx.add_optimizer_rule(Arc::new(functions::rewrite::SimilarityJoinRewrite));
}

/// A new session with the simjoin functions and options registered.
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
    let ctx = SessionContext::new_with_config_rt(config.with_option_extension(SimJoinOptions::default()), runtime);
    register(&ctx);
    ctx
}
