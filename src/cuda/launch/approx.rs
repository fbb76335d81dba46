//! Approximate kNN from the Multicurves index (kernels/approx.cu).

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::cuda::abi::FilterCode;
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::allow_shared;
use crate::cuda::launch::primitives::{GRID_BUILD_BLOCK, strided};
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// Threads per block (`APPROX_THREADS` in kernels/approx.cu): one block per query.
const APPROX_THREADS: u32 = 256;
/// Most curves an index may have (`APPROX_MAX_CURVES`).
const APPROX_MAX_CURVES: usize = 32;
/// Most blocks of a launch (each loops over further queries).
const APPROX_BLOCKS: usize = 1 << 16;
/// Bytes of shared memory a candidate takes: its position and its f32 score.
const APPROX_ENTRY_BYTES: usize = 8;

/// The Multicurves index on the device: `curves` lists of `n` keys, ascending, and the base
/// position of each (curve `c`'s at `c·n ..`), and the base's `n` rows of `dim` values in f32.
#[derive(Debug)]
pub struct DeviceCurves {
    pub keys: CudaSlice<u64>,
    pub positions: CudaSlice<u32>,
    pub rows: CudaSlice<f32>,
    pub n: usize,
    pub curves: usize,
    pub dim: usize,
    /// The kNN graph's edges (`WALK_MAX_WIDTH` a row), uploaded by the first search that walks it.
    pub graph: std::sync::OnceLock<CudaSlice<u32>>,
}

impl DeviceCurves {
    /// Device bytes it takes.
    pub fn bytes(&self) -> usize {
        self.keys.len() * 8 + self.positions.len() * 4 + self.rows.len() * 4
    }
}

/// Threads of a walking block (`WALK_THREADS` in kernels/approx.cu).
const WALK_THREADS: u32 = 128;
/// Most edges of a row the walk follows (`WALK_MAX_WIDTH`).
pub const WALK_MAX_WIDTH: usize = 32;
/// Static shared memory of approx_walk: its table of rows reached (`WALK_TABLE` u32), the fresh
/// rows of a step and three counters.
const WALK_STATIC_BYTES: usize = 4096 * 4 + WALK_MAX_WIDTH * 4 + 12;

/// The entries of shared memory a walk's pool of `pool` rows takes: the pool and a step's fresh
/// rows, rounded up to a power of two for the bitonic sort.
pub fn walk_size(pool: usize) -> usize {
    (pool + WALK_MAX_WIDTH).next_power_of_two()
}

/// Whether this device's blocks hold a walk's pool of `pool` rows (12 bytes an entry: a position,
/// a score and whether it was followed) beside its table.
pub fn walk_fits(device: &GpuDevice, pool: usize) -> bool {
    walk_size(pool) * 12 + WALK_STATIC_BYTES <= device.shared_memory_per_block
}

/// Runs approx_walk for `queries` over `index`'s rows and `edges` (the graph, `width` ≤
/// WALK_MAX_WIDTH a row): each query's first `pool` entries of `best` (approx_knn's, ascending)
/// are its seeds, replaced by the walk's best `best.keep`. Returns the rows the walks reached.
#[allow(clippy::too_many_arguments)]
pub fn approx_walk(
    device: &GpuDevice,
    index: &DeviceCurves,
    edges: &CudaSlice<u32>,
    width: usize,
    queries: &ApproxQueries,
    filter: FilterCode,
    pool: usize,
    max_steps: usize,
    best: &mut ApproxBest,
) -> Result<u64> {
    let kernel = Kernel::ApproxWalk;
    let DeviceCurves { n, dim, .. } = *index;
    let size = walk_size(pool);
    let shared = size * 12;
    if n == 0
        || n > u32::MAX as usize
        || width == 0
        || width > WALK_MAX_WIDTH
        || edges.len() < n * width
        || index.rows.len() < n * dim
        || pool == 0
        || pool > best.keep
        || !walk_fits(device, pool)
        || queries.rows.len() < queries.count * dim
        || best.positions.len().min(best.scores.len()) < queries.count * best.keep
        || queries.count > u32::MAX as usize
    {
        return Err(Error::Device(format!(
            "{kernel}: {n} rows of {width} edges (at most {WALK_MAX_WIDTH}) in {}, a pool of {pool} ({shared} bytes of shared memory beside {WALK_STATIC_BYTES}, {} allowed), {} queries keeping {}",
            edges.len(),
            device.shared_memory_per_block,
            queries.count,
            best.keep
        )));
    }
    if queries.count == 0 {
        return Ok(0);
    }
    let function = device.function(kernel)?;
    allow_shared(&function, kernel, shared, WALK_STATIC_BYTES)?;
    let mut reached = zeroed::<u64>(&device.stream, 1)?;
    let (width32, dim32, filter32, count) = (width as u32, dim as u32, filter as u32, queries.count as u32);
    let (pool32, size32, steps32, keep) = (pool as u32, size as u32, max_steps as u32, best.keep as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(edges)
        .arg(&width32)
        .arg(&index.rows)
        .arg(&dim32)
        .arg(&filter32)
        .arg(&queries.rows)
        .arg(&count)
        .arg(&pool32)
        .arg(&size32)
        .arg(&steps32)
        .arg(&keep)
        .arg(&mut best.positions)
        .arg(&mut best.scores)
        .arg(&mut reached);
    let config = LaunchConfig {
        grid_dim: (queries.count.min(APPROX_BLOCKS) as u32, 1, 1),
        block_dim: (WALK_THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: approx_walk(const u32*, u32, const float*, u32, u32, const float*, u32, u32, u32,
    // u32, u32, u32*, float*, unsigned long long*): a block reads query q < count's row (checked)
    // and its `keep` entries of best at q·keep (checked), of which the first `pool` ≤ keep are
    // positions below n or NO_POSITION (approx_knn's output); it reads the edges of rows below n
    // (`width` each, within `edges`: checked), which the graph lists as rows below n or
    // WALK_EMPTY, and the `dim` values of rows below n (within `rows`, checked); it writes its
    // `keep` entries of best and adds to `reached` (one value). The dynamic shared memory holds
    // `size` entries of a u32, an f32 and a u32 (12 bytes), size ≥ pool + width, and with the
    // static table within the device's opt-in limit (walk_fits, checked).
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    let reached =
        device.stream.clone_dtoh(&reached).map_err(|e| Error::Device(format!("{kernel}: copy failed: {e}")))?;
    Ok(reached[0])
}

/// A tile of queries on the device: `count` rows of the index's `dim` values in f32 and their key
/// on each curve (`keys[q·curves + c]`).
#[derive(Debug)]
pub struct ApproxQueries {
    pub rows: CudaSlice<f32>,
    pub keys: CudaSlice<u64>,
    pub count: usize,
}

/// Each query's `keep` best candidates, ascending by f32 score: positions (u32::MAX past its
/// distinct candidates) and scores (+∞ there).
#[derive(Debug)]
pub struct ApproxBest {
    pub positions: CudaSlice<u32>,
    pub scores: CudaSlice<f32>,
    pub keep: usize,
}

/// The entries of shared memory a query's candidates take in approx_knn: `curves` runs of
/// `per_curve` entries (at most `n`), rounded up to a power of two for the bitonic sort.
pub fn approx_capacity(curves: usize, per_curve: usize, n: usize) -> usize {
    (curves * per_curve.min(n)).max(1).next_power_of_two()
}

/// Whether this device's blocks hold the candidates of `capacity` entries.
pub fn approx_fits(device: &GpuDevice, capacity: usize) -> bool {
    capacity * APPROX_ENTRY_BYTES <= device.shared_memory_per_block
}

/// Runs approx_knn for `queries` over `index` (`per_curve` entries a curve, f32 scores of
/// `filter`, a `FilterCode`), writing each query's best into `best`.
pub fn approx_knn(
    device: &GpuDevice,
    index: &DeviceCurves,
    queries: &ApproxQueries,
    per_curve: usize,
    filter: FilterCode,
    best: &mut ApproxBest,
) -> Result<()> {
    let kernel = Kernel::ApproxKnn;
    let DeviceCurves { n, curves, dim, .. } = *index;
    let capacity = approx_capacity(curves, per_curve, n);
    let shared = capacity * APPROX_ENTRY_BYTES;
    if n == 0
        || n > u32::MAX as usize
        || per_curve == 0
        || curves == 0
        || curves > APPROX_MAX_CURVES
        || !approx_fits(device, capacity)
        || index.keys.len() < curves * n
        || index.positions.len() < curves * n
        || index.rows.len() < n * dim
        || queries.rows.len() < queries.count * dim
        || queries.keys.len() < queries.count * curves
        || best.positions.len().min(best.scores.len()) < queries.count * best.keep
        || queries.count > u32::MAX as usize
    {
        return Err(Error::Device(format!(
            "{kernel}: {curves} curves (at most {APPROX_MAX_CURVES}) of {n} rows, {per_curve} entries a curve ({shared} bytes of shared memory, {} allowed), {} queries keeping {}",
            device.shared_memory_per_block, queries.count, best.keep
        )));
    }
    if queries.count == 0 || best.keep == 0 {
        return Ok(());
    }
    let function = device.function(kernel)?;
    allow_shared(&function, kernel, shared, APPROX_MAX_CURVES * 4)?;
    let (n32, curves32, per_curve32, dim32) = (n as u32, curves as u32, per_curve as u32, dim as u32);
    let (filter, count, capacity32, keep) = (filter as u32, queries.count as u32, capacity as u32, best.keep as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&index.keys)
        .arg(&index.positions)
        .arg(&n32)
        .arg(&curves32)
        .arg(&per_curve32)
        .arg(&index.rows)
        .arg(&dim32)
        .arg(&filter)
        .arg(&queries.rows)
        .arg(&queries.keys)
        .arg(&count)
        .arg(&capacity32)
        .arg(&keep)
        .arg(&mut best.positions)
        .arg(&mut best.scores);
    let config = LaunchConfig {
        grid_dim: (queries.count.min(APPROX_BLOCKS) as u32, 1, 1),
        block_dim: (APPROX_THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: approx_knn(const u64*, const u32*, u32, u32, u32, const float*, u32, u32, const
    // float*, const u64*, u32, u32, u32, u32*, float*): each curve's search reads keys c·n ..
    // (c + 1)·n and entries start ≤ n − take of it, within the `curves·n` keys and positions
    // (checked); positions are base rows below n, whose `dim` values lie within `rows` (checked);
    // a block reads query q < count's row and keys (checked) and writes its `keep` outputs at
    // q·keep, below the outputs' lengths (checked); the shared memory asked for holds `capacity`
    // entries of a u32 and an f32, at most the device's opt-in limit (checked), and `capacity`
    // ≥ curves·take (approx_capacity).
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    Ok(())
}

/// Every row's rank on each curve of `index` (`curves·n` entries, curve `c`'s at `c·n`): where a
/// row lies along the curves, the graph's build's first candidates.
pub fn curve_ranks(device: &GpuDevice, index: &DeviceCurves) -> Result<CudaSlice<u32>> {
    let kernel = Kernel::CurveRanks;
    let DeviceCurves { n, curves, .. } = *index;
    if n > u32::MAX as usize || index.positions.len() < curves * n {
        return Err(Error::Device(format!("{kernel}: {curves} curves of {n} rows in {}", index.positions.len())));
    }
    let mut ranks = zeroed::<u32>(&device.stream, (curves * n).max(1))?;
    if n == 0 || curves == 0 {
        return Ok(ranks);
    }
    let function = device.function(kernel)?;
    let (n32, curves32) = (n as u32, curves as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(&index.positions).arg(&n32).arg(&curves32).arg(&mut ranks);
    let config = LaunchConfig {
        grid_dim: ((curves * n).div_ceil(256).min(APPROX_BLOCKS) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: curve_ranks(const u32*, u32, u32, u32*): reads entries below curves·n of
    // `positions` (checked), each curve's a permutation of the rows below n (the index's), and
    // writes ranks[c·n + p] for p < n, within the curves·n entries allocated.
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    Ok(ranks)
}

/// The candidates graph_nearest measures for each row.
pub enum GraphCandidates<'a> {
    /// The rows `window` either side of it along each curve (`ranks`: curve_ranks').
    Curves { ranks: &'a CudaSlice<u32>, window: usize },
    /// The rows its `nearest` and `reverse` lists name (`degree` slots a row each, u32::MAX after
    /// the last), and the rows their `nearest` lists name.
    Neighbours { nearest: &'a [u32], reverse: &'a [u32] },
}

/// Runs graph_nearest: every row of `index`'s `degree` nearest other rows among `candidates` by
/// f32 score (`filter`), nearest first (ties by row), u32::MAX past its distinct candidates.
pub fn graph_nearest(
    device: &GpuDevice,
    index: &DeviceCurves,
    filter: FilterCode,
    candidates: GraphCandidates,
    degree: usize,
) -> Result<CudaSlice<u32>> {
    let kernel = Kernel::GraphNearest;
    let DeviceCurves { n, curves, dim, .. } = *index;
    let listed = |list: &[u32]| list.len() == n * degree && list.iter().all(|&j| j == u32::MAX || (j as usize) < n);
    let (capacity, lists_valid) = match candidates {
        GraphCandidates::Curves { ranks, window } => (curves * (2 * window + 1), ranks.len() >= curves * n),
        GraphCandidates::Neighbours { nearest, reverse } => {
            (2 * degree * (degree + 1), listed(nearest) && listed(reverse))
        }
    };
    let capacity = capacity.max(1).next_power_of_two();
    let shared = capacity * APPROX_ENTRY_BYTES;
    if n > u32::MAX as usize
        || degree == 0
        || !lists_valid
        || index.positions.len() < curves * n
        || index.rows.len() < n * dim
        || shared > device.shared_memory_per_block
    {
        return Err(Error::Device(format!(
            "{kernel}: {n} rows of {degree} nearest, {curves} curves, {shared} bytes of shared memory ({} allowed), or lists that name rows past {n}",
            device.shared_memory_per_block
        )));
    }
    let mut out = zeroed::<u32>(&device.stream, (n * degree).max(1))?;
    if n == 0 {
        return Ok(out);
    }
    let stream = &device.stream;
    let copy = |e: cudarc::driver::DriverError| Error::Device(format!("{kernel}: copy failed: {e}"));
    let (curve_ranks, window, lists) = match candidates {
        GraphCandidates::Curves { ranks, window } => (Some(ranks), window, None),
        GraphCandidates::Neighbours { nearest, reverse } => {
            (None, 0, Some((stream.clone_htod(nearest).map_err(copy)?, stream.clone_htod(reverse).map_err(copy)?)))
        }
    };
    let function = device.function(kernel)?;
    allow_shared(&function, kernel, shared, 0)?;
    let (n32, dim32, filter32, curves32) = (n as u32, dim as u32, filter as u32, curves as u32);
    let (window32, degree32, capacity32) = (window as u32, degree as u32, capacity as u32);
    // A null pointer where the kernel takes the other kind of candidates.
    let null = 0u64;
    let mut builder = stream.launch_builder(&function);
    builder.arg(&index.rows).arg(&n32).arg(&dim32).arg(&filter32).arg(&index.positions);
    match curve_ranks {
        Some(ranks) => builder.arg(ranks),
        None => builder.arg(&null),
    };
    builder.arg(&curves32).arg(&window32);
    match &lists {
        Some((nearest, reverse)) => builder.arg(nearest).arg(reverse),
        None => builder.arg(&null).arg(&null),
    };
    builder.arg(&degree32).arg(&capacity32).arg(&mut out);
    let config = LaunchConfig {
        grid_dim: (n.min(APPROX_BLOCKS) as u32, 1, 1),
        block_dim: (APPROX_THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    // SAFETY: graph_nearest(const float*, u32, u32, u32, const u32*, const u32*, u32, u32, const
    // u32*, const u32*, u32, u32, u32*): with `ranks` (curves·n entries, checked) a block reads row
    // i < n's rank on each curve and the positions at ranks within [0, n) of that curve (within the
    // curves·n positions, checked), which are rows below n; otherwise (`ranks` null) it reads row
    // i's `degree` entries of `nearest` and `reverse` (n·degree each, checked) and the `nearest`
    // entries of the rows they name, each below n or u32::MAX (checked above). It reads the `dim`
    // values of rows below n (within `rows`, checked) and writes out[i·degree ..] (n·degree
    // allocated). The shared memory holds `capacity` entries of a u32 and an f32, within the
    // device's limit (checked), capacity ≥ the candidates a row can have (computed above).
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    Ok(out)
}

/// The rows the index's keys are computed from: `n` rows of `axes` leading principal coordinates
/// (`leads`, packed), and each of `curves` rotations onto `dims` dimensions (`rotations`, `axes ×
/// dims` row-major each, one after the other).
#[derive(Debug)]
pub struct CurveInputs {
    pub leads: CudaSlice<f32>,
    pub n: usize,
    pub axes: usize,
    pub dims: usize,
    pub rotations: CudaSlice<f32>,
    pub curves: usize,
}

/// Most dimensions of a curve (`CURVE_MAX_DIMS` in kernels/approx.cu).
const CURVE_MAX_DIMS: usize = 8;

impl CurveInputs {
    /// Whether the buffers hold what the sizes say, within the kernels' limits.
    fn check(&self, kernel: Kernel) -> Result<()> {
        let CurveInputs { n, axes, dims, curves, .. } = *self;
        if self.leads.len() < n * axes
            || self.rotations.len() < curves * axes * dims
            || dims == 0
            || dims > CURVE_MAX_DIMS
            || n > u32::MAX as usize
            || curves > u16::MAX as usize
        {
            return Err(Error::Device(format!(
                "{kernel}: {n} rows of {axes} coordinates in {} values, {curves} rotations onto {dims} dimensions (at most {CURVE_MAX_DIMS}) in {}",
                self.leads.len(),
                self.rotations.len()
            )));
        }
        Ok(())
    }
}

/// Each curve's lowest and highest coordinate per dimension over the rows (curve_bounds),
/// `curves × dims` each.
pub fn curve_bounds(device: &GpuDevice, inputs: &CurveInputs) -> Result<(Vec<f32>, Vec<f32>)> {
    let kernel = Kernel::CurveBounds;
    inputs.check(kernel)?;
    let CurveInputs { n, axes, dims, curves, .. } = *inputs;
    let stream = &device.stream;
    // +∞ and −∞ as ordered bits (the host's starting bounds, which a curve of no rows keeps).
    let mut low = crate::cuda::memory::upload(device, &vec![0xff80_0000u32; curves * dims])?;
    let mut high = crate::cuda::memory::upload(device, &vec![0x007f_ffffu32; curves * dims])?;
    if n > 0 {
        let function = device.function(kernel)?;
        let (n32, axes32, dims32) = (n as u32, axes as u32, dims as u32);
        let mut builder = stream.launch_builder(&function);
        builder
            .arg(&inputs.leads)
            .arg(&n32)
            .arg(&axes32)
            .arg(&dims32)
            .arg(&inputs.rotations)
            .arg(&mut low)
            .arg(&mut high);
        let blocks = n.div_ceil(GRID_BUILD_BLOCK as usize).min(1024) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, curves as u32, 1),
            block_dim: (GRID_BUILD_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: curve_bounds(const float*, u32, u32, u32, const float*, u32*, u32*): a thread
        // reads rows below n of `axes` values (n·axes ≤ the leads' length, checked), block row
        // y < curves reads rotation y's axes·dims values (checked), and folds into
        // low/high[y·dims + j], j < dims: within their curves·dims values.
        unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    }
    let decode = |bits: Vec<u32>| -> Vec<f32> {
        // ordered_bits's inverse: a set top bit marks a non-negative value.
        bits.into_iter().map(|b| f32::from_bits(if b & 0x8000_0000 != 0 { b & 0x7fff_ffff } else { !b })).collect()
    };
    let copy = |e: cudarc::driver::DriverError| Error::Device(format!("{kernel}: copy from the GPU failed: {e}"));
    Ok((decode(stream.clone_dtoh(&low).map_err(copy)?), decode(stream.clone_dtoh(&high).map_err(copy)?)))
}

/// Curve `curve`'s key of every row (curve_keys): its coordinates from `low` on (`dims` values)
/// at `scale` cells per unit, quantised to `bits` bits, into `keys` (`n` values).
pub fn curve_keys(
    device: &GpuDevice,
    inputs: &CurveInputs,
    curve: usize,
    bits: u32,
    (low, scale): (&CudaSlice<f32>, &CudaSlice<f32>),
    keys: &mut CudaSlice<u64>,
) -> Result<()> {
    let kernel = Kernel::CurveKeys;
    inputs.check(kernel)?;
    let CurveInputs { n, axes, dims, curves, .. } = *inputs;
    if curve >= curves
        || low.len() < dims
        || scale.len() < dims
        || keys.len() < n
        || bits == 0
        || bits * dims as u32 > 64
    {
        return Err(Error::Device(format!(
            "{kernel}: curve {curve} of {curves}, {dims} dimensions of {bits} bits, bounds of {} and {} values, {} keys for {n} rows",
            low.len(),
            scale.len(),
            keys.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let function = device.function(kernel)?;
    let rotation = inputs.rotations.slice(curve * axes * dims..(curve + 1) * axes * dims);
    let (n32, axes32, dims32) = (n as u32, axes as u32, dims as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder
        .arg(&inputs.leads)
        .arg(&n32)
        .arg(&axes32)
        .arg(&dims32)
        .arg(&bits)
        .arg(&rotation)
        .arg(low)
        .arg(scale)
        .arg(keys);
    // SAFETY: curve_keys(const float*, u32, u32, u32, u32, const float*, const float*, const float*,
    // u64*): threads read rows below n of `axes` values (within the leads, checked), the
    // curve's axes·dims rotation values (a view of exactly that many), dims ≤ 8 values of low and
    // scale (checked), and write keys[r], r < n ≤ its length (checked); bits·dims ≤ 64.
    unsafe { builder.launch(strided(n as u64)) }.map_err(|e| Error::Device(format!("{kernel} launch failed: {e}")))?;
    Ok(())
}
