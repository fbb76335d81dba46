//! The cost model of an approximate kNN (`approx=true`): the cores' search of the Multicurves
//! index (by its curves alone or with its kNN graph), the GPU's search of it, and the exact kNN on the GPU, which `device=auto` weighs
//! (backend/auto/mod.rs). Its constants (in costs.rs) were fitted on the H100 host (docs/approx.md#measured); as
//! the other estimates, it only has to be right where the choices are far apart.

use crate::backend::KnnRequest;
use crate::backend::cpu::approx::walks_graph;
use crate::backend::plan::recall::curves_build_one_core_ns;
use crate::costs::{
    APPROX_CPU_NS_PER_ENTRY, APPROX_GPU_NS_PER_ENTRY, APPROX_GPU_NS_PER_ENTRY_DIM, APPROX_HOST_NS_PER_QUERY,
    APPROX_HOST_NS_PER_QUERY_DIM, GRAPH_BUILD_NS_PER_ROW, GRAPH_NS_PER_POOL_ROW, UPLOAD_BYTES_PER_SECOND,
};
use crate::index::KeptIndexes;
use crate::index::curves::{CURVES, Geometry};

/// How the cores search the index (backend/cpu/approx.rs).
#[derive(Debug, Clone, Copy)]
enum CoresSearch {
    /// By the curves alone.
    Curves,
    /// Through the kNN graph, with a pool of `pool` rows, the graph to `build` first or not.
    Graph { pool: usize, build: bool },
}

/// The cost model of an approximate kNN: one core's time of the whole run on the cores (the
/// index's build included where it is not built yet), the GPU's time of its search of the index
/// with what the host does around it, and the index's build on every core (0 where it is kept).
#[derive(Debug, Clone, Copy)]
pub(super) struct ApproxEstimate {
    pub cpu_ns: f64,
    pub search_ns: f64,
    pub build_ns: f64,
}

impl ApproxEstimate {
    pub fn of(request: &KnnRequest, approx: crate::op::Approx, cores: usize) -> Self {
        let n = request.base.len();
        let geometry = Geometry::of(request.metric);
        let kept = geometry.is_some_and(|g| request.base.curves_kept(g));
        let k = request.k.min(n);
        let per_curve = approx.per_curve(k).min(n);
        let cores_search = if walks_graph(request, approx, k) {
            let build = !geometry.is_some_and(|g| request.base.curves_graph_built(g));
            CoresSearch::Graph { pool: approx.pool(k), build }
        } else {
            CoresSearch::Curves
        };
        Self::for_sizes(n, request.base.dim, request.queries.len(), per_curve, !kept, cores_search, cores)
    }

    /// For `queries` over `n` base rows of `dim` values, `per_curve` entries a curve, the index
    /// to `build` or not, the cores searching as `cores_search` says, `cores` cores.
    fn for_sizes(
        n: usize,
        dim: usize,
        queries: usize,
        per_curve: usize,
        build: bool,
        cores_search: CoresSearch,
        cores: usize,
    ) -> Self {
        let cores = cores.max(1) as f64;
        let entries = (queries * CURVES * per_curve) as f64;
        let build_one_core = if build { curves_build_one_core_ns(n, dim) } else { 0.0 };
        let search = entries * (APPROX_GPU_NS_PER_ENTRY + APPROX_GPU_NS_PER_ENTRY_DIM * dim as f64);
        let host = queries as f64 * (APPROX_HOST_NS_PER_QUERY + APPROX_HOST_NS_PER_QUERY_DIM * dim as f64);
        let upload = (queries * dim * 4) as f64 / (UPLOAD_BYTES_PER_SECOND * 1e-9);
        let cores_search_ns = match cores_search {
            CoresSearch::Curves => entries * APPROX_CPU_NS_PER_ENTRY,
            CoresSearch::Graph { pool, build } => {
                (if build { n as f64 * GRAPH_BUILD_NS_PER_ROW } else { 0.0 })
                    + (queries * pool) as f64 * GRAPH_NS_PER_POOL_ROW
            }
        };
        Self {
            cpu_ns: build_one_core + cores_search_ns,
            search_ns: host / cores + search + upload,
            build_ns: build_one_core / cores,
        }
    }

    /// Whether the GPU searches the index rather than run the exact kNN (`exact_ns`), the runs
    /// over this base without the index having cost `forgone` beyond its search so far. Where the
    /// index is built, whenever its search is estimated faster. Where it is not, only once what
    /// the runs without it have cost beyond its search reaches its build (ski rental: at most twice
    /// the best choice in hindsight, whatever the number of queries to come, where a base read
    /// for one query would otherwise pay a build it never recovers and a kept base never build one).
    pub fn searches_on_gpu(&self, exact_ns: f64, forgone: f64) -> bool {
        let saving = exact_ns - self.search_ns;
        saving > 0.0 && (self.build_ns == 0.0 || forgone + saving >= self.build_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::{ApproxEstimate, CoresSearch};
    use crate::costs::exact_knn_gpu_ns;

    #[test]
    fn an_approximate_knn_searches_the_index_on_the_gpu_only_where_that_beats_the_exact_knn() {
        // Measured on the H100 (docs/approx.md#measured): 1,000 queries over the 200,000 blobs
        // of 128 dimensions, index kept, effort 1: the index's search at 2.3× the exact kNN's
        // throughput; 10,000 Fashion-MNIST queries over 60,000 of 784: the exact kNN at 11×.
        let exact = exact_knn_gpu_ns;
        let blobs = ApproxEstimate::for_sizes(200_000, 128, 1000, 160, false, CoresSearch::Curves, 16);
        assert!(blobs.searches_on_gpu(exact(1000, 200_000, 128), 0.0), "{blobs:?}");
        let fashion = ApproxEstimate::for_sizes(60_000, 784, 10_000, 160, false, CoresSearch::Curves, 16);
        assert!(!fashion.searches_on_gpu(exact(10_000, 60_000, 784), 0.0), "{fashion:?}");
        // Not built yet: the exact kNN runs until the time it took beyond the index's search
        // reaches the build's, then the index is built.
        let unbuilt = ApproxEstimate::for_sizes(200_000, 128, 1000, 160, true, CoresSearch::Curves, 16);
        let saving = exact(1000, 200_000, 128) - unbuilt.search_ns;
        assert!(!unbuilt.searches_on_gpu(exact(1000, 200_000, 128), 0.0), "{unbuilt:?}");
        let runs = (unbuilt.build_ns / saving).ceil();
        assert!(unbuilt.searches_on_gpu(exact(1000, 200_000, 128), (runs - 1.0) * saving), "{unbuilt:?}");
        assert!(unbuilt.cpu_ns > blobs.cpu_ns && blobs.cpu_ns > 0.0);
    }

    #[test]
    fn the_graph_search_is_priced_below_the_curves_once_its_graph_is_built() {
        // Fashion-MNIST's 10,000 queries at effort 1 (docs/approx.md#measured): the walk with a pool of 32 against
        // 160 entries a curve; its graph's build (60,000 rows) costs more than it saves in one run.
        let fashion = |cores_search| ApproxEstimate::for_sizes(60_000, 784, 10_000, 160, false, cores_search, 2);
        let curves = fashion(CoresSearch::Curves);
        let built = fashion(CoresSearch::Graph { pool: 32, build: false });
        let unbuilt = fashion(CoresSearch::Graph { pool: 32, build: true });
        assert!(built.cpu_ns < curves.cpu_ns, "{built:?} against {curves:?}");
        assert!(unbuilt.cpu_ns > curves.cpu_ns, "{unbuilt:?} against {curves:?}");
        // The GPU's side does not change with the cores' search.
        assert_eq!(built.search_ns, curves.search_ns);
    }
}
