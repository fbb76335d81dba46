//! Range searches through the List of Clusters (kernels/clusters.cu).

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::cuda::abi::{JoinParams, MetricCode};
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::allow_shared;
use crate::cuda::launch::text::{DeviceStrings, PairOutput, TEXT_MAX_WORDS, text_join_shared_bytes};
use crate::cuda::{Error, Result};

/// Static shared memory of the List of Clusters' kernels (kernels/clusters.cu: one u32).
const CLUSTERS_STATIC_BYTES: usize = 4;

/// Threads per block: one block per left row.
const CLUSTERS_BLOCK: u32 = 128;
/// Most blocks of a launch (each loops over further left rows).
const CLUSTERS_BLOCKS: u32 = 1 << 16;

/// The List of Clusters over the right input on the device (`index::list_of_clusters::ListOfClusters`):
/// cluster `c`'s centre `centres[c]` and covering radius `radii[c]`, its members
/// `members[starts[c]..starts[c + 1]]` with their distances to the centre (`offsets`), and the
/// rounding slack of its bounds.
#[derive(Debug)]
pub struct DeviceClusterList {
    pub centres: CudaSlice<u32>,
    pub radii: CudaSlice<f64>,
    pub starts: CudaSlice<u32>,
    pub members: CudaSlice<u32>,
    pub offsets: CudaSlice<f64>,
    pub relative: f64,
    pub absolute: f64,
}

impl DeviceClusterList {
    fn clusters(&self) -> usize {
        self.centres.len()
    }

    /// The kernel arguments of its `CLUSTER_LIST_PARAMS` (kernels/clusters.cu); `clusters` is its
    /// number of clusters.
    fn push_args<'a>(&'a self, builder: &mut cudarc::driver::LaunchArgs<'a>, clusters: &'a u32) {
        builder
            .arg(&self.centres)
            .arg(&self.radii)
            .arg(&self.starts)
            .arg(&self.members)
            .arg(&self.offsets)
            .arg(clusters)
            .arg(&self.relative)
            .arg(&self.absolute);
    }

    /// Whether the arrays agree with each other (the kernel reads them by these lengths).
    fn consistent(&self) -> bool {
        self.clusters() > 0
            && self.radii.len() == self.clusters()
            && self.starts.len() == self.clusters() + 1
            && self.offsets.len() == self.members.len()
    }
}

/// A vector search's inputs: the index's space (`space_metric`, a `METRIC_*` code, over the
/// `*_space` rows) and the answer's (`params`: dimension, metric, threshold, self-join; the
/// `*_exact` rows and cosine's Σx² norms, one per row or a single 0 otherwise).
#[derive(Debug)]
pub struct ClusterVectorInputs<'a> {
    pub list: &'a DeviceClusterList,
    pub params: JoinParams,
    pub space_metric: u32,
    /// The search radius in the index's space.
    pub radius: f64,
    pub left_space: &'a CudaSlice<f64>,
    pub right_space: &'a CudaSlice<f64>,
    pub left_exact: &'a CudaSlice<f64>,
    pub right_exact: &'a CudaSlice<f64>,
    pub left_norms: &'a CudaSlice<f64>,
    pub right_norms: &'a CudaSlice<f64>,
}

/// A string search's inputs (strings coded as for text_join, the right ones in input order).
#[derive(Debug)]
pub struct ClusterTextInputs<'a> {
    pub list: &'a DeviceClusterList,
    pub tau: u32,
    pub self_join: bool,
    pub left: &'a DeviceStrings,
    pub right: &'a DeviceStrings,
    pub alphabet: u32,
    pub words: u32,
}

fn config(rows: usize, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.min(CLUSTERS_BLOCKS as usize) as u32, 1, 1),
        block_dim: (CLUSTERS_BLOCK, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// Runs clusters_range_vectors over left rows `rows`, appending to `out` (its count reset first),
/// waits, and returns the pairs found (more than `out` holds when it overflowed).
pub fn clusters_range_vectors(
    device: &GpuDevice,
    inputs: &ClusterVectorInputs,
    rows: std::ops::Range<u32>,
    out: &mut PairOutput<f64>,
) -> Result<u64> {
    let kernel = Kernel::ClustersRangeVectors;
    let list = inputs.list;
    let dim = inputs.params.dim as usize;
    let shared = list.clusters() * std::mem::size_of::<f64>();
    let left_rows = inputs.left_exact.len() / dim.max(1);
    let right_rows = inputs.right_exact.len() / dim.max(1);
    let cosine = inputs.params.metric == MetricCode::Cosine as u32;
    if !list.consistent()
        || shared > device.shared_memory_per_block
        || rows.end as usize > left_rows
        || inputs.left_space.len() < left_rows * dim
        || inputs.right_space.len() < right_rows * dim
        || (cosine && (inputs.left_norms.len() < left_rows || inputs.right_norms.len() < right_rows))
    {
        return Err(Error::Device(format!(
            "{kernel}: {} clusters ({shared} bytes of shared memory, {} allowed) over {right_rows} right rows, left rows {rows:?} of {left_rows}",
            list.clusters(),
            device.shared_memory_per_block
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, kernel)?;
    let function = device.function(kernel)?;
    allow_shared(&function, kernel, shared, CLUSTERS_STATIC_BYTES)?;
    let (first, count, clusters) = (rows.start, rows.len() as u32, list.clusters() as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(&inputs.params).arg(&inputs.space_metric).arg(&inputs.radius);
    list.push_args(&mut builder, &clusters);
    builder
        .arg(inputs.left_space)
        .arg(inputs.right_space)
        .arg(inputs.left_exact)
        .arg(inputs.right_exact)
        .arg(inputs.left_norms)
        .arg(inputs.right_norms)
        .arg(&first)
        .arg(&count);
    out.push_args(&mut builder);
    // SAFETY: clusters_range_vectors(JoinParams, u32, double, const u32*, const double*, const
    // u32*, const u32*, const double*, u32, double, double, const double* ×6, u32, u32, u32*,
    // u32*, double*, u64*, u64): blocks read left rows first .. first + count, below the left
    // rows (checked above) of `dim` values in both left buffers; the list's arrays agree in length
    // (checked), and its centres and members are right positions the host built it from, below
    // the right rows of both right buffers; cosine's norms hold a value per row (checked), and the
    // other metrics never read them; the shared memory asked for holds a double per cluster; pairs
    // are written at slots below the output's capacity, its buffers' length, and `count` holds one
    // value.
    unsafe { builder.launch(config(rows.len(), shared)) }
        .map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    out.found(device, kernel)
}

/// Shared memory clusters_range_text needs: the pattern table, then a double per cluster.
pub fn clusters_text_shared_bytes(alphabet: usize, words: usize, clusters: usize) -> usize {
    text_join_shared_bytes(alphabet, words) + clusters * std::mem::size_of::<f64>()
}

/// Runs clusters_range_text over left strings `rows`, appending to `out` (its count reset first),
/// waits, and returns the pairs found (more than `out` holds when it overflowed).
pub fn clusters_range_text(
    device: &GpuDevice,
    inputs: &ClusterTextInputs,
    rows: std::ops::Range<u32>,
    out: &mut PairOutput<f64>,
) -> Result<u64> {
    let kernel = Kernel::ClustersRangeText;
    let list = inputs.list;
    let shared = clusters_text_shared_bytes(inputs.alphabet as usize, inputs.words as usize, list.clusters());
    let left_rows = inputs.left.offsets.len().saturating_sub(1);
    let right_rows = inputs.right.offsets.len().saturating_sub(1);
    if !list.consistent()
        || shared > device.shared_memory_per_block
        || inputs.words as usize > TEXT_MAX_WORDS
        || rows.end as usize > left_rows
    {
        return Err(Error::Device(format!(
            "{kernel}: {} clusters over {right_rows} right strings, a table of {} codes × {} words ({shared} bytes of shared memory, {} allowed), left strings {rows:?} of {left_rows}",
            list.clusters(),
            inputs.alphabet,
            inputs.words,
            device.shared_memory_per_block
        )));
    }
    if rows.is_empty() {
        return Ok(0);
    }
    out.clear(device, kernel)?;
    let function = device.function(kernel)?;
    allow_shared(&function, kernel, shared, CLUSTERS_STATIC_BYTES)?;
    let (first, count, clusters) = (rows.start, rows.len() as u32, list.clusters() as u32);
    let self_join = u32::from(inputs.self_join);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(&inputs.tau).arg(&self_join);
    list.push_args(&mut builder, &clusters);
    builder
        .arg(&inputs.left.chars)
        .arg(&inputs.left.offsets)
        .arg(&inputs.right.chars)
        .arg(&inputs.right.offsets)
        .arg(&inputs.alphabet)
        .arg(&inputs.words)
        .arg(&first)
        .arg(&count);
    out.push_args(&mut builder);
    // SAFETY: clusters_range_text(u32, u32, const u32*, const double*, const u32*, const u32*,
    // const double*, u32, double, double, const u16*, const u32*, const u16*, const u32*, u32,
    // u32, u32, u32, u32*, u32*, double*, u64*, u64): blocks read left strings first .. first +
    // count, below the left offsets' length minus one (checked above), whose offsets index the
    // left chars they were built from; the list's arrays agree in length (checked) and its
    // centres and members are right positions below the right offsets' length minus one (the
    // host built both from the same strings); every code is below `alphabet` and every left
    // string has at most `words` words (the host built both), so the pattern table and a double
    // per cluster fit the shared memory asked for; pairs are written at slots below the output's capacity,
    // its buffers' length, and `count` holds one value.
    unsafe { builder.launch(config(rows.len(), shared)) }
        .map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    out.found(device, kernel)
}
