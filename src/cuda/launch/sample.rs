//! kNN's sample: each query's distances to evenly spread base rows, and the radii picked from them.

use cudarc::driver::PushKernelArg;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use crate::cuda::abi::JoinParams;
use crate::cuda::buffers::{ByteRows, SideBuffers};
use crate::cuda::device::GpuDevice;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::geometry::{BLOCK, BRUTE_TILE, TensorMap, tc_row_map, tc_run, tc_shared_bytes, warpgroup_mma};
use crate::cuda::launch::pack::{byte_row_words, tc_row_words};
use crate::cuda::launch::primitives::gather_rows;
use crate::cuda::memory::zeroed;
use crate::cuda::{Error, Result};

/// Queries and sample rows per block of knn_sample_distances (`SAMPLE_QUERIES`, `SAMPLE_COLUMNS` in
/// kernels/knn.cu).
pub(super) const SAMPLE_QUERIES: u32 = 64;
pub(super) const SAMPLE_COLUMNS: u32 = 128;

/// The base rows kNN's radii are picked from, as the kernel that takes their distances reads them.
pub enum KnnSample {
    /// f32 filter rows, dimension-major ([`sample_rows`]): knn_sample_distances.
    Filter(CudaSlice<f32>),
    /// brute_join_tc's f16 rows, scaled by 2^`scale_exponent`, and their squared filter norms where
    /// the keys are squared L2 distances (`None`: the inner product's, −x·s):
    /// knn_sample_distances_tc ([`sample_half_rows`]).
    Half { rows: CudaSlice<u32>, sq_norms: Option<CudaSlice<f32>>, scale_exponent: i32 },
    /// brute_join_tc_bytes's byte rows and their squared norms, whose keys are exact squared
    /// distances: knn_sample_keys_bytes ([`sample_byte_rows`]).
    Bytes(ByteRows),
}

/// The sample as knn_sample_distances_tc reads it, where the base has f16 rows (scaled by
/// 2^`scale_exponent`): rows ⌊i·n/sample_len⌋ (knn_sample_rows' choice) of them and, for keys that
/// are `squared_distances` (the GEMM form's metrics), of its squared filter norms, gathered.
pub fn sample_half_rows(
    device: &GpuDevice,
    base: &SideBuffers,
    n: usize,
    dim: usize,
    sample_len: usize,
    scale_exponent: i32,
    squared_distances: bool,
) -> Result<KnnSample> {
    let Some(half_rows) = &base.half_rows else {
        return Err("knn_sample_distances_tc: the base has no f16 rows".into());
    };
    if sample_len == 0 || sample_len > n {
        return Err(Error::Device(format!(
            "knn_sample_distances_tc: a sample of {sample_len} rows of a base of {n} rows"
        )));
    }
    let picked = sample_positions(device, n, sample_len)?;
    let rows = gather_rows(device, half_rows, n, &picked, sample_len, tc_row_words(dim))?;
    let sq_norms = match squared_distances {
        true if base.filter_sq_norms.len() < n => {
            return Err(Error::Device(format!(
                "knn_sample_distances_tc: {} squared norms for a base of {n} rows",
                base.filter_sq_norms.len()
            )));
        }
        true => Some(gather_rows(device, &base.filter_sq_norms, n, &picked, sample_len, 1)?),
        false => None,
    };
    Ok(KnnSample::Half { rows, sq_norms, scale_exponent })
}

/// The base rows a sample of `sample_len` of `n` takes, ⌊i·n/sample_len⌋ (knn_sample_rows' choice),
/// on the device.
pub(super) fn sample_positions(device: &GpuDevice, n: usize, sample_len: usize) -> Result<CudaSlice<u32>> {
    let picked: Vec<u32> = (0..sample_len).map(|i| (i as u64 * n as u64 / sample_len as u64) as u32).collect();
    device.stream.clone_htod(&picked).map_err(|e| Error::Device(format!("GPU copy failed: {e}")))
}

/// The sample as knn_sample_keys_bytes reads it, where the base has byte rows: rows ⌊i·n/sample_len⌋
/// (knn_sample_rows' choice) of them and of their squared norms, gathered.
pub fn sample_byte_rows(
    device: &GpuDevice,
    base: &ByteRows,
    n: usize,
    dim: usize,
    sample_len: usize,
) -> Result<KnnSample> {
    if sample_len == 0 || sample_len > n {
        return Err(Error::Device(format!(
            "knn_sample_keys_bytes: a sample of {sample_len} rows of a base of {n} rows"
        )));
    }
    let picked = sample_positions(device, n, sample_len)?;
    Ok(KnnSample::Bytes(ByteRows {
        rows: gather_rows(device, &base.rows, n, &picked, sample_len, byte_row_words(dim))?,
        sq_norms: gather_rows(device, &base.sq_norms, n, &picked, sample_len, 1)?,
        offset: base.offset,
    }))
}

/// kNN's radius sample (knn_sample_rows in kernels/knn.cu): `sample_len` evenly spread rows of the
/// base's f32 filter rows (`base_filter`, `n` rows of `dim` in input order), dimension-major.
pub fn sample_rows(
    device: &GpuDevice,
    base_filter: &CudaSlice<f32>,
    n: usize,
    dim: usize,
    sample_len: usize,
) -> Result<CudaSlice<f32>> {
    if sample_len == 0 || sample_len > n || base_filter.len() < n * dim {
        return Err(Error::Device(format!(
            "knn_sample_rows: a sample of {sample_len} rows of a base of {n} rows of {dim} values"
        )));
    }
    let function = device.function(Kernel::KnnSampleRows)?;
    let mut sample = zeroed::<f32>(&device.stream, sample_len * dim)?;
    let blocks = (sample_len * dim).div_ceil(BLOCK as usize).clamp(1, 65_536) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let (n32, dim32, len32) = (n as u32, dim as u32, sample_len as u32);
    let mut builder = device.stream.launch_builder(&function);
    builder.arg(base_filter).arg(&n32).arg(&dim32).arg(&len32).arg(&mut sample);
    // SAFETY: the arguments match knn_sample_rows's parameter list one for one. It writes indices
    // < sample_len·dim, the sample's length, and reads row ⌊i·n/sample_len⌋ < n (i < sample_len),
    // values < n·dim ≤ the filter's length (checked above).
    unsafe { builder.launch(config) }.map_err(|e| Error::Device(format!("knn_sample_rows launch failed: {e}")))?;
    Ok(sample)
}

/// A kNN sample's keys on brute_join_tc's pipeline (sm_90a): knn_sample_keys_bytes or
/// knn_sample_keys_half, the dynamic shared memory it was allowed, and the TMA maps of the
/// queries' and the sample's rows.
pub(super) struct SampleKeys {
    function: CudaFunction,
    shared_mem_bytes: u32,
    query_map: TensorMap,
    sample_map: TensorMap,
}

/// Sampled kNN radii (kernels/knn.cu): for each query of `queries`, `LEVELS` radii into `radii`
/// (indexed by query position), from the f32 distances of the filter rows to the sample's
/// (`sample`: [`sample_rows`] in the query side's filter space, or [`sample_half_rows`] beside the
/// query side's f16 rows): computed for groups of queries at a time (knn_sample_distances or
/// knn_sample_distances_tc) into a scratch row per query, then the radii picked per query
/// (knn_sample_radius), at most `chunk_queries` (≥ 1) queries a round, the scratch's rows.
#[allow(clippy::too_many_arguments)]
pub fn sample_radius_pass(
    device: &GpuDevice,
    params: &JoinParams,
    queries: std::ops::Range<u32>,
    query_side: &SideBuffers,
    sample: &KnnSample,
    sample_len: u32,
    rank: u32,
    chunk_queries: usize,
    radii: &mut CudaSlice<f64>,
) -> Result<()> {
    if queries.is_empty() {
        return Ok(());
    }
    if sample_len as usize > KNN_SAMPLE || sample_len == 0 || rank == 0 || chunk_queries == 0 {
        return Err(Error::Device(format!(
            "knn_sample_radius: a sample of {sample_len} rows (at most {KNN_SAMPLE}) at rank {rank}, {chunk_queries} queries a round"
        )));
    }
    let stream = &device.stream;
    // The f16 kernel's squared L2 distances need both sides' squared norms.
    if let KnnSample::Half { sq_norms: Some(sq_norms), .. } = sample
        && (query_side.filter_sq_norms.len() < queries.end as usize || sq_norms.len() < sample_len as usize)
    {
        return Err("knn_sample_distances_tc: squared filter norms missing".into());
    }
    // Under wgmma the tensor-core keys come from brute_join_tc's pipeline (knn_sample_keys_bytes,
    // knn_sample_keys_half: TMA and wgmma, its shared memory without a queue), over the queries'
    // and the sample's rows by their TMA maps; mma.sync devices keep knn_sample_distances_tc.
    let on_pipeline = |kernel: Kernel,
                       query_rows: &CudaSlice<u32>,
                       sample_rows: &CudaSlice<u32>,
                       row_words: usize|
     -> Result<SampleKeys> {
        let function = device.function(kernel)?;
        let shared_mem_bytes = tc_shared_bytes(device, row_words, 0);
        function
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_mem_bytes as i32,
            )
            .map_err(|e| Error::Device(format!("{kernel}: {shared_mem_bytes} bytes of shared memory refused: {e}")))?;
        Ok(SampleKeys {
            function,
            shared_mem_bytes,
            query_map: tc_row_map(device, query_rows, row_words)?,
            sample_map: tc_row_map(device, sample_rows, row_words)?,
        })
    };
    let dim = params.dim as usize;
    let pipeline = match (sample, &query_side.half_rows, &query_side.byte_rows) {
        (KnnSample::Bytes(sample), _, Some(query))
            if query.offset == sample.offset
                && query.sq_norms.len() >= queries.end as usize
                && sample.sq_norms.len() >= sample_len as usize =>
        {
            Some(on_pipeline(Kernel::KnnSampleKeysBytes, &query.rows, &sample.rows, byte_row_words(dim))?)
        }
        (KnnSample::Bytes(_), ..) => {
            return Err("knn_sample_keys_bytes: the queries have no byte rows shifted as the sample's".into());
        }
        (KnnSample::Half { rows, .. }, Some(query_rows), _) if warpgroup_mma(device) => {
            Some(on_pipeline(Kernel::KnnSampleKeysHalf, query_rows, rows, tc_row_words(dim))?)
        }
        _ => None,
    };
    let distances_kernel = match (sample, &pipeline) {
        (_, Some(keys)) => keys.function.clone(),
        (KnnSample::Filter(_), None) => device.function(Kernel::KnnSampleDistances)?,
        (_, None) => device.function(Kernel::KnnSampleDistancesTc)?,
    };
    let radius_kernel = device.function(Kernel::KnnSampleRadius)?;
    let chunk = chunk_queries.min(queries.len());
    let mut distances = zeroed::<f32>(stream, chunk * KNN_SAMPLE)?;
    for begin in queries.clone().step_by(chunk) {
        let end = (begin as usize + chunk).min(queries.end as usize) as u32;
        queue_sample_distances(
            device,
            params,
            sample,
            query_side,
            pipeline.as_ref(),
            &distances_kernel,
            begin..end,
            sample_len,
            &mut distances,
        )?;
        let config = LaunchConfig { grid_dim: (end - begin, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let mut builder = stream.launch_builder(&radius_kernel);
        builder.arg(&params.metric).arg(&begin).arg(&distances).arg(&sample_len).arg(&rank).arg(&mut *radii);
        // SAFETY: the arguments match knn_sample_radius's parameter list one for one. Block b reads
        // row b < end − begin ≤ chunk of `distances` (its first sample_len entries, written above)
        // and writes LEVELS radii at query position begin + b < queries.end, within `radii`, which
        // holds LEVELS values for every query.
        unsafe { builder.launch(config) }
            .map_err(|e| Error::Device(format!("knn_sample_radius launch failed: {e}")))?;
    }
    stream.synchronize().map_err(|e| Error::Device(format!("knn_sample_radius failed: {e}")))
}

/// Queues the sample distances of queries `rows` (a round of [`sample_radius_pass`]) into
/// `distances`: on brute_join_tc's pipeline where `pipeline` has its keys, else by
/// knn_sample_distances_tc (f16 rows) or knn_sample_distances (filter rows). Its SAFETY
/// arguments rest on `sample_radius_pass`'s checks (the sides' squared norms and byte rows) and on
/// `distances` holding KNN_SAMPLE values for each query of `rows`.
#[allow(clippy::too_many_arguments)]
fn queue_sample_distances(
    device: &GpuDevice,
    params: &JoinParams,
    sample: &KnnSample,
    query_side: &SideBuffers,
    pipeline: Option<&SampleKeys>,
    distances_kernel: &CudaFunction,
    rows: std::ops::Range<u32>,
    sample_len: u32,
    distances: &mut CudaSlice<f32>,
) -> Result<()> {
    let (begin, end) = (rows.start, rows.end);
    let dim = params.dim as usize;
    let groups = (end - begin).div_ceil(SAMPLE_QUERIES);
    let config = LaunchConfig {
        grid_dim: (groups, sample_len.div_ceil(SAMPLE_COLUMNS), 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // On the pipeline: brute_join_tc's grid, a block per left tile and run of right tiles.
    let pipeline_launch = |keys: &SampleKeys| {
        let left_tiles = (end - begin).div_ceil(BRUTE_TILE as u32) as usize;
        let run = tc_run(device, left_tiles, sample_len as usize, 0.0, 0);
        let blocks = left_tiles * (sample_len as usize).div_ceil(BRUTE_TILE * run);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: keys.shared_mem_bytes,
        };
        (JoinParams { tc_run: run as u32, tc_queue: 0, ..*params }, config)
    };
    let mut builder = device.stream.launch_builder(distances_kernel);
    match (sample, &query_side.half_rows, &query_side.byte_rows, pipeline) {
        (KnnSample::Half { rows, sq_norms, scale_exponent }, Some(query_rows), _, pipeline) => {
            let (row_words, unscale) = (tc_row_words(dim) as u32, 2f32.powi(-2 * scale_exponent));
            // Without squared norms (the inner product) the kernel reads none: any buffer will do.
            let (squared, sample_sq) =
                (u32::from(sq_norms.is_some()), sq_norms.as_ref().unwrap_or(&query_side.filter_sq_norms));
            // knn_sample_keys_half takes the launch's JoinParams where knn_sample_distances_tc
            // takes the row's words, and the two maps last.
            let (keys_params, keys_config) = match pipeline {
                Some(keys) => pipeline_launch(keys),
                None => (*params, config),
            };
            match pipeline {
                Some(_) => builder.arg(&keys_params),
                None => builder.arg(&row_words),
            };
            builder
                .arg(&begin)
                .arg(&end)
                .arg(query_rows)
                .arg(&query_side.filter_sq_norms)
                .arg(rows)
                .arg(sample_sq)
                .arg(&sample_len)
                .arg(&unscale)
                .arg(&squared)
                .arg(&mut *distances);
            if let Some(keys) = pipeline {
                builder.arg(&keys.query_map).arg(&keys.sample_map);
            }
            // SAFETY: the arguments match knn_sample_keys_half's parameter list one for one
            // (on the pipeline) or knn_sample_distances_tc's. A block reads f16 rows of query
            // slots in [begin, end) (end ≤ queries.end, within the query side's f16 rows,
            // packed with this `dim`) and of sample rows < sample_len (gathered with this
            // `dim` by sample_half_rows), on the pipeline by TMA maps built over exactly those
            // buffers, and, where `squared`, the squared norms of those rows (checked above to
            // hold them); on the pipeline it gets brute_join_tc's dynamic shared memory
            // without a queue (allowed by the attribute set above). It writes entry
            // (q − begin)·SAMPLE + i for q < end and i < sample_len, within `distances`
            // (chunk ≥ end − begin rows of SAMPLE).
            unsafe { builder.launch(keys_config) }.map_err(|e| {
                format!(
                    "{} launch failed: {e}",
                    if pipeline.is_some() { "knn_sample_keys_half" } else { "knn_sample_distances_tc" }
                )
            })?;
        }
        (KnnSample::Half { .. }, None, ..) => {
            return Err("knn_sample_distances_tc: the queries have no f16 rows".into());
        }
        (KnnSample::Bytes(sample), _, Some(query), Some(keys)) => {
            let (keys_params, config) = pipeline_launch(keys);
            builder
                .arg(&keys_params)
                .arg(&begin)
                .arg(&end)
                .arg(&query.rows)
                .arg(&query.sq_norms)
                .arg(&sample.rows)
                .arg(&sample.sq_norms)
                .arg(&sample_len)
                .arg(&mut *distances)
                .arg(&keys.query_map)
                .arg(&keys.sample_map);
            // SAFETY: the arguments match knn_sample_keys_bytes's parameter list one for one. A
            // block reads byte rows (packed with this `dim`) of query slots in [begin, end),
            // within the query side's byte rows, and of sample rows < sample_len, by TMA maps
            // built over exactly those buffers, and their squared norms (checked above); it gets
            // brute_join_tc_bytes's dynamic shared memory (allowed by the attribute set above)
            // and writes entry (q − begin)·SAMPLE + i for q < end and i < sample_len, within
            // `distances` (chunk ≥ end − begin rows of SAMPLE).
            unsafe { builder.launch(config) }
                .map_err(|e| Error::Device(format!("knn_sample_keys_bytes launch failed: {e}")))?;
        }
        (KnnSample::Bytes(_), ..) => return Err("knn_sample_keys_bytes: the queries have no byte rows".into()),
        (KnnSample::Filter(sample), ..) => {
            builder
                .arg(params)
                .arg(&begin)
                .arg(&end)
                .arg(&query_side.filter)
                .arg(sample)
                .arg(&sample_len)
                .arg(&mut *distances);
            // SAFETY: the arguments match knn_sample_distances's parameter list one for one. A
            // block reads `dim` filter values of query rows in [begin, end) (end ≤ queries.end,
            // within the query side's filter rows) and of sample rows < sample_len ≤ SAMPLE
            // (dimension-major: `dim · sample_len` values, the sample's length), and writes
            // entry (q − begin)·SAMPLE + i for q < end and i < sample_len, within `distances`
            // (chunk ≥ end − begin rows of SAMPLE).
            unsafe { builder.launch(config) }
                .map_err(|e| Error::Device(format!("knn_sample_distances launch failed: {e}")))?;
        }
    }
    Ok(())
}

/// Most sample rows knn_sample_radius selects from (`SAMPLE` in kernels/knn.cu).
pub const KNN_SAMPLE: usize = 4096;
/// Radii per query knn_sample_radius writes (`LEVELS` in kernels/knn.cu): ranks r, 4r, 16r, 64r.
pub const KNN_LEVELS: usize = 4;
