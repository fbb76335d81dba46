//! Approximate kNN over a stored index (`simjoin.index_store`, index/stored.rs): the base's
//! Multicurves index loaded from the store before the run where it is not kept already, and
//! stored after the run where the run built it, its graph or a calibration (so the next process
//! over the same vectors loads what this one built).

use std::time::Instant;

use datafusion::common::Result;

use crate::backend::RunStats;
use crate::index::KeptIndexes;
use crate::index::curves::Geometry;
use crate::index::stored::{IndexStore, Loaded, STORE_MIN_ROWS, key as index_key};
use crate::op::SimilarityOp;
use crate::vectors::Vectors;

/// Runs `run` (an approximate kNN over `base`) with `op`'s index store: the index loaded into
/// `base`'s kept indexes first where the store holds it, stored afterwards where the run added
/// to it. A store that cannot be read or written costs only the build.
pub(super) fn with_index_store(
    op: &SimilarityOp,
    base: &Vectors,
    run: impl FnOnce() -> Result<RunStats>,
) -> Result<RunStats> {
    let store = IndexStore::from_setting(&op.index_store);
    let geometry = Geometry::of(op.metric);
    let (Some(store), Some(geometry), Some(_)) = (store, geometry, op.approx) else { return run() };
    if base.len() < STORE_MIN_ROWS {
        return run();
    }
    let started = Instant::now();
    // Hashed once, for the load and the store alike (it reads the whole base); a kept base with
    // its index and no new build or calibration hashes nothing.
    let hashed = std::sync::OnceLock::new();
    let key = || hashed.get_or_init(|| index_key(base, geometry));
    let mut loaded = false;
    if !base.curves_kept(geometry) {
        match store.load(base, geometry, key()) {
            Loaded::Index(index) => {
                base.curves_built_by(geometry, || index);
                loaded = true;
            }
            Loaded::Missing => {}
            Loaded::Unsound(why) => log::warn!("simjoin.index_store: rebuilding an unsound stored index ({why})"),
        }
    }
    let load_time = started.elapsed();
    let before = state(base, geometry);
    let mut stats = run()?;
    stats.build_time += load_time;
    stats.loaded_indexes += usize::from(loaded);
    if state(base, geometry) != before && base.curves_kept(geometry) {
        let index = base.curves(geometry).0;
        match store.save(key(), &index) {
            Ok(()) => stats.stored_indexes += 1,
            Err(e) => log::warn!("simjoin.index_store: could not store an index in {}: {e}", store.dir().display()),
        }
    }
    Ok(stats)
}

/// What the kept index of `base` holds: whether it is built, with its graph, and its calibrations.
fn state(base: &Vectors, geometry: Geometry) -> Option<(bool, usize)> {
    base.curves_kept(geometry).then(|| {
        let index = base.curves(geometry).0;
        (index.graph_built(), index.calibrations().len())
    })
}
