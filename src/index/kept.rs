//! The indexes kept over one input's vectors for as long as the vectors live: the Multicurves
//! index (approximate kNN, by geometry) and the List of Clusters (by metric), each built on first
//! use. Vectors the session's cache keeps across queries (exec/cache.rs) keep these with them, so
//! a later query searches the index an earlier one built; a query's own vectors keep them for
//! that query (a recall target's calibration and its search share one index).
//!
//! They are stored through [`Vectors::kept`], so the data type does not depend on the indexes
//! built over it; [`KeptIndexes`] gives every `Vectors` the methods that reach them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::index::curves::{Geometry, Multicurves};
use crate::index::list_of_clusters::ListOfClusters;
use crate::op::Metric;
use crate::vectors::Vectors;

/// The slots [`KeptIndexes`] fills.
#[derive(Default)]
struct Slots {
    /// The Multicurves index over the vectors as they are, and over their unit vectors (cosine).
    curves: [OnceLock<Arc<Multicurves>>; 2],
    /// [`KeptIndexes::forgo_curves`]: what runs without the index have cost beyond its search (ns).
    curves_forgone: AtomicU64,
    /// The List of Clusters under each metric it serves (L2, L1, L∞, cosine, the edit distance).
    clusters: [OnceLock<Arc<ListOfClusters>>; 5],
}

/// The indexes kept over a `Vectors`. The values must not change after an index is first built.
pub trait KeptIndexes {
    /// The Multicurves index in `geometry`, and whether it was built by an earlier call.
    fn curves(&self, geometry: Geometry) -> (Arc<Multicurves>, bool);

    /// [`KeptIndexes::curves`], built by `build` where it was not built yet.
    fn curves_built_by(&self, geometry: Geometry, build: impl FnOnce() -> Multicurves) -> (Arc<Multicurves>, bool);

    /// Adds `ns` to what runs without the Multicurves index (the exact kNN on the GPU, the index
    /// not built; small batches under a recall target answered exactly) have cost beyond the
    /// index's estimated search, and returns the sum: the scheduler builds the index, and a recall
    /// target's small batches calibrate the search, once that reaches what those cost (kept
    /// vectors only, which keep the index for later runs).
    fn forgo_curves(&self, ns: f64) -> f64;

    /// Whether the Multicurves index in `geometry` was built already with its kNN graph.
    fn curves_graph_built(&self, geometry: Geometry) -> bool;

    /// Whether the Multicurves index in `geometry` was built already.
    fn curves_kept(&self, geometry: Geometry) -> bool;

    /// The List of Clusters under `metric` (one of those the index serves), built by `build` on
    /// first use, and whether it was built by an earlier call.
    fn list_of_clusters(&self, metric: Metric, build: impl FnOnce() -> ListOfClusters) -> (Arc<ListOfClusters>, bool);

    /// Whether the List of Clusters under `metric` was built already.
    fn list_of_clusters_kept(&self, metric: Metric) -> bool;
}

impl KeptIndexes for Vectors {
    fn curves(&self, geometry: Geometry) -> (Arc<Multicurves>, bool) {
        self.curves_built_by(geometry, || Multicurves::build(self, geometry))
    }

    fn curves_built_by(&self, geometry: Geometry, build: impl FnOnce() -> Multicurves) -> (Arc<Multicurves>, bool) {
        let slots = self.kept::<Slots>();
        let slot = &slots.curves[geometry as usize];
        let kept = slot.get().is_some();
        (slot.get_or_init(|| Arc::new(build())).clone(), kept)
    }

    fn forgo_curves(&self, ns: f64) -> f64 {
        let ns = ns.max(0.0) as u64;
        (self.kept::<Slots>().curves_forgone.fetch_add(ns, Ordering::Relaxed) + ns) as f64
    }

    fn curves_graph_built(&self, geometry: Geometry) -> bool {
        self.kept::<Slots>().curves[geometry as usize].get().is_some_and(|index| index.graph_built())
    }

    fn curves_kept(&self, geometry: Geometry) -> bool {
        self.kept::<Slots>().curves[geometry as usize].get().is_some()
    }

    fn list_of_clusters(&self, metric: Metric, build: impl FnOnce() -> ListOfClusters) -> (Arc<ListOfClusters>, bool) {
        let slots = self.kept::<Slots>();
        let slot = &slots.clusters[clusters_slot(metric).expect("the List of Clusters serves metrics only")];
        let kept = slot.get().is_some();
        (slot.get_or_init(|| Arc::new(build())).clone(), kept)
    }

    fn list_of_clusters_kept(&self, metric: Metric) -> bool {
        clusters_slot(metric).is_some_and(|slot| self.kept::<Slots>().clusters[slot].get().is_some())
    }
}

/// The slot of the List of Clusters under `metric`, if the index serves it.
fn clusters_slot(metric: Metric) -> Option<usize> {
    match metric {
        Metric::L2 => Some(0),
        Metric::L1 => Some(1),
        Metric::LInf => Some(2),
        Metric::Cosine => Some(3),
        Metric::Levenshtein => Some(4),
        Metric::L2Squared | Metric::InnerProduct | Metric::Jaccard | Metric::Hamming => None,
    }
}
