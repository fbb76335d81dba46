//! The backend strategy behind the one operator: what a backend is given, how it hands results
//! back (chunks through a [`ResultSink`], so results never need to fit in memory), and which
//! backend a query gets.

use std::fmt::Debug;
use std::sync::Arc;

use datafusion::common::Result;

use crate::op::SimilarityOp;

#[cfg(feature = "gpu")]
pub mod auto;
mod choose;
pub mod clusters;
pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod plan;
pub mod request;
pub mod sink;
pub mod stats;

#[cfg(all(feature = "gpu", feature = "server"))]
pub use choose::start_gpu;
pub use choose::{choose, on_executor};
pub use clusters::ClusterRequest;
pub use request::{JoinRequest, KnnRequest, KnownSizes, SelfJoin};
pub(crate) use sink::{MapSink, PairWriter, ShiftedSink};
pub use sink::{NOISE, ResultChunk, ResultSink, Wanted, widened};
pub use stats::RunStats;
#[cfg(feature = "gpu")]
pub use stats::{DeviceRun, DividedRun};

/// A way to compute the operations.
pub trait Backend: Debug + Send + Sync {
    /// Short name shown by EXPLAIN (`cpu`, `gpu(sm_90a)`).
    fn name(&self) -> String;
    /// Every pair within the threshold (ε-join, range query).
    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats>;
    /// The `k` nearest base vectors of every query, in query order, each query's neighbours by rank.
    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats>;
    /// DBSCAN over the ε-graph (`dbscan`): each row's cluster and whether it is a core row, in row
    /// order. By default from two of this backend's self-joins (backend/clusters.rs).
    fn clusters(&self, request: &ClusterRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        clusters::by_joins(|pairs, sink| self.join(pairs, sink), request, sink)
    }
    /// Whether every search runs on the CPU cores, so that a base searched part by part
    /// (exec/base_by_parts.rs) gives the same answer as a whole one at no extra cost.
    fn searches_parts_on_cpu(&self) -> bool {
        false
    }
    /// Told, when the plan is made and before any input is read, what the plan knows of the
    /// inputs' sizes: the backend to run with instead of this one, if any. `device=auto` starts
    /// the GPU's start-up here, or settles on the CPU cores when they finish before the GPU
    /// could even start (`auto::AutoBackend`).
    fn for_inputs(&self, _op: &SimilarityOp, _sizes: &KnownSizes) -> Option<Arc<dyn Backend>> {
        None
    }
}
