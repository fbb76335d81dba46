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
//! Dependencies point one way: `functions → table → exec → backend → gpu`.

pub mod backend;
pub mod datagen;
pub mod exec;
pub mod functions;
pub mod gpu;
pub mod index;
pub mod op;
pub mod options;
pub mod results;
pub mod server;
pub mod table;
pub mod vectors;

use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;

pub use exec::{Progress, ProgressListener, SimilarityExec};
pub use op::{Device, Metric, PairOrder};
pub use options::SimJoinOptions;

/// Adds the simjoin functions (`sim_join`, `range_query`, `knn` and their upper-case spellings) and
/// the `simjoin.*` options to `ctx`.
pub fn register(ctx: &SessionContext) {
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
}

/// A new session with the simjoin functions and options registered.
pub fn session_context() -> SessionContext {
    session_context_with_config(SessionConfig::new())
}

/// A new session from `config` with the simjoin functions and options registered.
pub fn session_context_with_config(config: SessionConfig) -> SessionContext {
    let ctx = SessionContext::new_with_config(config.with_option_extension(SimJoinOptions::default()));
    register(&ctx);
    ctx
}
