//! The worker threads a run computes on.

use std::sync::Mutex;

use datafusion::common::Result;

/// Worker pools of finished runs, kept for the next: starting a pool's threads took 0.3–0.5 ms of a
/// 19-ms GPU kNN on a 16-core host (docs/design.md#gpu-knn). At most [`IDLE_POOLS`] wait; a run whose
/// backend panicked does not return its pool. The process's, not a session's: threads on the same
/// cores, which a run of any session uses whole.
static IDLE_WORKERS: Mutex<Vec<rayon::ThreadPool>> = Mutex::new(Vec::new());
const IDLE_POOLS: usize = 4;

/// An idle worker pool, or a new one with as many threads as the global pool.
pub(in crate::exec) fn worker_pool() -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    if let Some(pool) = IDLE_WORKERS.lock().unwrap_or_else(|e| e.into_inner()).pop() {
        return Ok(pool);
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("simjoin-run-{i}"))
        .build()
}

pub(in crate::exec) fn return_worker_pool(pool: rayon::ThreadPool) {
    let mut idle = IDLE_WORKERS.lock().unwrap_or_else(|e| e.into_inner());
    if idle.len() < IDLE_POOLS {
        idle.push(pool);
    }
}
