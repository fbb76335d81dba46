//! The cost model's fitted constants, in one place: what the choices between strategies and
//! devices are priced with. Each says what it was measured on and where the measurement is
//! recorded (docs/design.md); a constant refitted on another machine changes only here.
//! The GPU's start-up (opening a device, loading and compiling modules) is priced in
//! cuda/startup.rs, beside what it times.

#[cfg(feature = "gpu")]
use std::time::Duration;

// The CPU ε-join's strategies: the grid (and its dimensions) against brute force
// (index/grid.rs, Gowanlock & Karsin's cost model, GPU-Join, §5.6).

/// Cost-model weights, in nanoseconds of one core, measured on the 2-core build machine (AMD
/// EPYC, AVX-512) with `simjoin bench` on uniform data: finding one neighbour cell (table lookup or
/// binary search step), one `±r` window search per point and neighbour cell, one candidate pair
/// plus one dimension of the vectorised f32 filter, and one brute-force pair plus dimension (f32
/// GEMM tile, then its vectorised bound). At d = 8 both come to about 1.2 ns per pair.
pub(crate) const NS_PROBE: f64 = 6.0;
pub(crate) const NS_LOOKUP_STEP: f64 = 3.0;
pub(crate) const NS_WINDOW: f64 = 25.0;
pub(crate) const NS_PAIR: f64 = 0.4;
pub(crate) const NS_DIM: f64 = 0.1;
pub(crate) const NS_BRUTE_PAIR: f64 = 0.55;
pub(crate) const NS_BRUTE_DIM_GEMM: f64 = 0.08;
pub(crate) const NS_BRUTE_DIM_DIRECT: f64 = 0.6;

/// Absolute weights of a whole CPU run, in nanoseconds of one core of the same machine, fitted to
/// the build and probe times of grid joins of 20,000 to 1,000,000 rows (docs/design.md,
/// docs/design.md#scheduling). The weights above compare strategies, and price a candidate at what the vectorised
/// filter costs; a run also indexes its rows (cell keys, sorts, the cost model's own sample),
/// visits each neighbour cell of each probing cell (finding it, and its rows' first cache
/// misses), and checks and emits every candidate. The scheduler of `device=auto` compares these
/// times with the GPU's, so they must be right in size, not only in order: the weights above
/// alone put a 1M-row join at 1/50 of its time.
pub(crate) const NS_RUN_ROW: f64 = 170.0;
pub(crate) const NS_RUN_CELL_VISIT: f64 = 330.0;
pub(crate) const NS_RUN_CANDIDATE: f64 = 10.0;
pub(crate) const NS_RUN_CANDIDATE_DIM: f64 = 0.5;
/// A brute-force run against the brute-force weights above (a kNN of 300 × 20,000 rows in 8
/// dimensions: 7.1 ms estimated, 16 ms of core time measured, the top-k and the exact re-rank being
/// the difference).
pub(crate) const BRUTE_RUN_FACTOR: f64 = 2.2;

// The List of Clusters against the scan (backend/cpu/list_of_clusters.rs, `pays`).

/// Relative costs per distance, in units of one distance of the exact-f64 scan (L1, L∞ kNN),
/// measured on 200k × 16 blobs (benches/clusters.sh): the build's distances cost 12 (a pass per
/// centre over the remaining rows, with the selection of its cluster), the search's 8 (bounds,
/// the k-nearest selection and less regular memory access).
pub(crate) const BUILD_COST: f64 = 12.0;
pub(crate) const SEARCH_COST: f64 = 8.0;

// The device a run goes to under `device=auto` (backend/auto/mod.rs).

/// One GPU against one CPU core on a brute-force run (kNN, or a join without the grid). On the H100
/// host P1's whole GPU operator (0.17 s) against its CPU operator on 16 cores (2.9 s) is ~270
/// cores, its kernels alone ~6,000; the choice only has to be right where the two are far apart
/// (docs/design.md#startup and #scheduling).
#[cfg(feature = "gpu")]
pub(crate) const GPU_OVER_ONE_CORE_BRUTE: f64 = 880.0;
/// ... on a grid join, whose GPU run is bound by what it does on the host around its kernels
/// (building the grid, emitting the pairs): the 1M × 2 self-join of 4.6M pairs takes ~40 ms on
/// the H100 (kernels 1.5 ms) against ~0.8 s of one core's estimate (docs/design.md#scheduling).
#[cfg(feature = "gpu")]
pub(crate) const GPU_OVER_ONE_CORE_GRID: f64 = 30.0;
/// A CPU run's own fixed cost, not divided among the cores: the cost model's sample, the threads'
/// fan-out and the merge of their results (1–5 ms on the 2-core machine beyond the estimate).
#[cfg(feature = "gpu")]
pub(crate) const CPU_RUN: Duration = Duration::from_millis(2);
/// A GPU run's own fixed cost: allocations, launches, synchronisations.
#[cfg(feature = "gpu")]
pub(crate) const GPU_RUN: Duration = Duration::from_millis(15);
/// Host-to-device copy rate of exact rows (as kept: f64, or f32 widened on the device) through the
/// page-locked staging buffers.
#[cfg(feature = "gpu")]
pub(crate) const UPLOAD_BYTES_PER_SECOND: f64 = 8e9;

// An approximate kNN's searches and the exact kNN it is weighed against
// (backend/auto/estimate.rs; fitted on the H100 host, docs/approx.md#measured).

/// One core's time per entry a query takes from a curve in the cores' Multicurves search (the
/// entry, its proxy, and its share of the re-ranks): 72 ns on Fashion-MNIST and 90 on the blobs at
/// effort 1 (2,560 entries a query) on the H100 host's 16 cores (docs/approx.md#measured).
#[cfg(feature = "gpu")]
pub(crate) const APPROX_CPU_NS_PER_ENTRY: f64 = 80.0;
/// One core's time per row of the pool in the cores' graph search (its share of the seeds, the
/// rows reached through its edges, and the re-ranks): 3.5 µs on Fashion-MNIST and 4.1 on the blobs
/// at effort 1 (a pool of 32) on the 2-core build machine (docs/approx.md#measured).
#[cfg(feature = "gpu")]
pub(crate) const GRAPH_NS_PER_POOL_ROW: f64 = 3_800.0;
/// One core's time per row of the kNN graph's build: 33 µs on Fashion-MNIST, 54 on the blobs on
/// the 2-core build machine (docs/approx.md#measured).
#[cfg(feature = "gpu")]
pub(crate) const GRAPH_BUILD_NS_PER_ROW: f64 = 45_000.0;
/// The GPU's time per curve entry in approx_knn (kernels/approx.cu): a share of the block's two
/// sorts, and per dimension its share of reading the candidate's row (repeats are not read, and
/// rows of near queries meet in the L2 cache). Fitted on the H100: 0.42 ns an entry at 128
/// dimensions, 0.81 at 784 (docs/approx.md#measured).
#[cfg(feature = "gpu")]
pub(crate) const APPROX_GPU_NS_PER_ENTRY: f64 = 0.34;
#[cfg(feature = "gpu")]
pub(crate) const APPROX_GPU_NS_PER_ENTRY_DIM: f64 = 0.0006;
/// One core's time per query around the GPU's search: its keys, its upload and download, and the
/// exact measure of its best; fitted as 21 µs at 128 dimensions and 83 at 784 (docs/approx.md#measured).
#[cfg(feature = "gpu")]
pub(crate) const APPROX_HOST_NS_PER_QUERY: f64 = 9_000.0;
#[cfg(feature = "gpu")]
pub(crate) const APPROX_HOST_NS_PER_QUERY_DIM: f64 = 95.0;
/// One core's share of the index's build, per multiply-add of its projections (its sample's
/// covariance, the base onto up to 192 axes) and per key (the Hilbert key, its share of the sorts):
/// fitted to the builds of Fashion-MNIST (0.55 s), the blobs (0.35 s) and the Gaussian set (1.41 s)
/// on 16 cores (docs/approx.md#measured).
/// (The same per core on the 2-core build machine: the Gaussian set's build there takes 11 s.)
pub(crate) const APPROX_BUILD_NS_PER_FLOP: f64 = 0.3;
pub(crate) const APPROX_BUILD_NS_PER_KEY: f64 = 800.0;
/// The exact kNN's time on the GPU, to weigh the index's search against, per query × base row ×
/// dimension: 10,000 queries over 1M × 128 took 54 ms on the H100 (BENCHMARKS.md, P1), 1,000 of
/// them 5.4 ms; and at least the time of its passes (sampled radii, counts, ranking) whatever the
/// sizes: 1,000 queries over the 200,000 blobs took 10 ms for 1 ms of brute force (docs/approx.md#measured).
/// Fashion-MNIST's bytes run faster still (10,000 queries over 60,000 × 784: 6 ms).
#[cfg(feature = "gpu")]
pub(crate) const EXACT_KNN_GPU_NS_PER_PAIR_DIM: f64 = 4.2e-5;
#[cfg(feature = "gpu")]
pub(crate) const EXACT_KNN_GPU_PASSES_NS: f64 = 5e6;

// A kNN divided among several GPUs (backend/gpu/multi.rs).

/// kNN work (queries × base rows × dimensions) below which the first GPU runs it alone: two
/// H200s took longer than one for 100k queries over 1M × 128 (1.3·10¹³) and 1.27× less time over
/// 4M × 128 (5.1·10¹³).
#[cfg(feature = "gpu")]
pub(crate) const KNN_SPLIT_WORK: f64 = 3e13;

/// Left rows of a join below which the first GPU runs it alone (unless the GPUs were named): two
/// H100s joined 1M × 8 (8.7·10⁷ pairs) in 0.27 s against one's 0.33 s, while a join of a few
/// thousand rows takes milliseconds on one GPU, less than a second device's upload and launches,
/// and far less than its context in a new process (a 2,000-row join with `devices=all` on four
/// H200s took 2.1 s of query time against 0.86 s on one, when every context was opened).
#[cfg(feature = "gpu")]
pub(crate) const JOIN_SPLIT_ROWS: usize = 1 << 18;

#[cfg(feature = "gpu")]
/// [`EXACT_KNN_GPU_NS_PER_PAIR_DIM`]'s estimate of `queries` over `n` rows of `dim` values.
pub fn exact_knn_gpu_ns(queries: usize, n: usize, dim: usize) -> f64 {
    (queries as f64 * n as f64 * dim as f64 * EXACT_KNN_GPU_NS_PER_PAIR_DIM).max(EXACT_KNN_GPU_PASSES_NS)
}
