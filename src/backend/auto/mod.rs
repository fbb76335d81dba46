//! `device=auto`: each run goes where it is expected to finish first — the GPU or every CPU
//! core — counting what the GPU has not paid yet (opening the device and loading kernels, which
//! planning started on a background thread), copying the inputs to it, and the work other runs
//! have queued on each (the process's scheduler, backend/auto/scheduler.rs, which also corrects the
//! estimates by measured times and starts waiting runs shortest first). `device=gpu` takes the
//! same path without the choice, so that its device too opens while the inputs are read, and
//! queues on the GPU.
//!
//! The estimate is the sampled cost model both backends plan with (index/grid.rs: the absolute
//! time of the whole run on one CPU core), divided by the cores plus a fixed cost for the CPU, and
//! by a factor for the GPU plus its fixed costs. It only has to be right where the two are far
//! apart; where they are close either choice costs little.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::common::{DataFusionError, Result, exec_datafusion_err, exec_err};

use crate::backend::auto::estimate::ApproxEstimate;
use crate::backend::auto::scheduler::{Choice, Scheduler, Ticket, Unit, Work};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::GpuBackend;
use crate::backend::gpu::{MultiGpuBackend, open_devices};
use crate::backend::plan::gemm_form;
use crate::backend::request::{join_rows, knn_rows};
use crate::backend::{
    Backend, DividedRun, JoinRequest, KnnRequest, KnownSizes, MapSink, ResultChunk, ResultSink, RunStats,
};
use crate::costs::exact_knn_gpu_ns;
use crate::costs::{CPU_RUN, GPU_OVER_ONE_CORE_BRUTE, GPU_OVER_ONE_CORE_GRID, GPU_RUN, UPLOAD_BYTES_PER_SECOND};
use crate::cuda::kernels::KernelModule;
use crate::cuda::startup::{cached_startup, startup_left, warm_up};
use crate::cuda::{GpuDevice, MAX_DEVICES, ResidentKey};
use crate::index::KeptIndexes;
use crate::index::{JoinStrategy, brute_force_run_ns};
use crate::op::{Checks, Devices};
use crate::vectors::Vectors;

mod estimate;
mod scheduler;

/// A join's inputs (rows × values per row) from which its plan starts the GPU's start-up before
/// the sample has chosen the device: 2²⁴ f32 values take ~40 ms to decode on the H100 host's 16
/// cores (the 1M × 128 base, 2²⁷ values, 0.22 s), so below this, waiting for the sample loses
/// little of what overlapping start-up with decoding would save.
const WARM_UP_VALUES: usize = 1 << 24;

/// The kernel modules a join may launch (the grid's when the cost model picks it) and kNN's.
pub(super) const JOIN_MODULES: [KernelModule; 6] = [
    KernelModule::GridJoin,
    KernelModule::GridJoinWide,
    KernelModule::BruteJoin,
    KernelModule::Rows,
    KernelModule::TcJoin,
    KernelModule::Grid,
];
pub(super) const KNN_MODULES: [KernelModule; 5] =
    [KernelModule::BruteJoin, KernelModule::Rows, KernelModule::TcJoin, KernelModule::TcSampleKeys, KernelModule::Knn];
/// An approximate kNN's: the Multicurves index's keys and search (and the radix sort of its
/// curves), and the exact kNN's where that is estimated faster.
pub(super) const APPROX_MODULES: [KernelModule; 7] = [
    KernelModule::Approx,
    KernelModule::Grid,
    KernelModule::BruteJoin,
    KernelModule::Rows,
    KernelModule::TcJoin,
    KernelModule::TcSampleKeys,
    KernelModule::Knn,
];
/// A join through the quantile directory (`index=directory`): its kernel, the filter rows, and
/// the gathers into leaf order.
pub(super) const DIRECTORY_MODULES: [KernelModule; 3] =
    [KernelModule::DirectoryJoin, KernelModule::Rows, KernelModule::Grid];
/// The module of edit-distance joins and kNN.
pub(super) const TEXT_MODULES: [KernelModule; 1] = [KernelModule::Text];
/// The List of Clusters' searches (`index=list_of_clusters` under `device=gpu`).
pub(super) const CLUSTER_MODULES: [KernelModule; 1] = [KernelModule::Clusters];

/// The modules `op`'s runs may launch.
pub(super) fn modules_of(op: &crate::op::SimilarityOp) -> &'static [KernelModule] {
    match op.operation {
        _ if op.index == crate::op::IndexChoice::ListOfClusters => &CLUSTER_MODULES,
        _ if op.index == crate::op::IndexChoice::Directory && !op.metric.is_text() => &DIRECTORY_MODULES,
        _ if op.metric.is_text() => &TEXT_MODULES,
        crate::op::Operation::Knn { .. } if op.approx.is_some() => &APPROX_MODULES,
        crate::op::Operation::Knn { .. } => &KNN_MODULES,
        _ => &JOIN_MODULES,
    }
}

/// The GPU or the CPU, chosen per run (or the GPU alone).
#[derive(Debug)]
pub struct AutoBackend {
    /// Device bytes a GPU run may use on each GPU (0: all that is available).
    memory_limit: usize,
    /// The GPUs a GPU run uses.
    devices: Devices,
    /// `device=gpu`: no choice, only the deferred opening.
    gpu_only: bool,
    /// The kernel modules its runs launch ([`modules_of`]).
    modules: &'static [KernelModule],
    /// What the last run chose, for EXPLAIN ANALYZE.
    last_choice: Mutex<Option<String>>,
    /// The self-test's and benchmarks' switches (a forced share for the GPU, a forced search).
    checks: Checks,
}

impl AutoBackend {
    /// The backend that decides per run between the GPU (launching `modules`) and the CPU. The
    /// GPU's start-up begins when the plan is made ([`Backend::for_inputs`]), where it can pay.
    pub fn new(memory_limit: usize, devices: Devices, modules: &'static [KernelModule], checks: Checks) -> Self {
        Self { memory_limit, devices, gpu_only: false, modules, last_choice: Mutex::new(None), checks }
    }

    /// Edit-distance joins under `device=auto`: opens nothing (a one-query process would pay the
    /// GPU's start-up, which these joins do not recover); see [`AutoBackend::text_join`].
    pub fn text_joins(memory_limit: usize, devices: Devices) -> Self {
        Self::new(memory_limit, devices, &TEXT_MODULES, Checks::default())
    }

    /// An edit-distance join under `device=auto`: on the GPU when an earlier query left it open
    /// and the threshold is at least 2 edits (from there a warm H100 measured 3.5–8× faster than
    /// 16 cores' segment filter; within 1 edit they are even: BENCHMARKS.md, "Text on the H100
    /// host"), else on the cores. A GPU run that fails before sending a row runs on the cores.
    /// Not scheduled (text runs on the cores unscheduled).
    fn text_join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let open = matches!(GpuDevice::opened(), Some(Ok(_)));
        let gpu = if open && request.threshold >= 2.0 { self.gpu().ok() } else { None };
        let on_gpu = gpu.is_some();
        let chosen: Arc<dyn Backend> = gpu.unwrap_or_else(|| Arc::new(CpuBackend));
        if let Ok(mut last) = self.last_choice.lock() {
            *last = Some(format!("{} (edit distance: the GPU when open and eps ≥ 2)", chosen.name()));
        }
        let sent = AtomicBool::new(false);
        let recording = MapSink {
            inner: sink,
            map: |chunk| {
                sent.store(true, Ordering::Relaxed);
                Some(chunk)
            },
            passes_counts: true,
        };
        match chosen.join(request, &recording) {
            Err(_) if on_gpu && !sent.load(Ordering::Relaxed) => {
                let mut stats = CpuBackend.join(request, sink)?;
                stats.gpu_fallbacks = 1;
                Ok(stats)
            }
            outcome => outcome,
        }
    }

    /// As [`AutoBackend::new`], for `device=gpu`: every run on the GPU, or the error saying why
    /// it cannot be used.
    /// Its start-up begins at once, on a background thread, while the inputs are read.
    pub fn gpu_only(memory_limit: usize, devices: Devices, modules: &'static [KernelModule], checks: Checks) -> Self {
        warm_up(modules);
        Self { gpu_only: true, ..Self::new(memory_limit, devices, modules, checks) }
    }

    /// The GPU backend over the selected devices: GPUs named are opened at once (each on a thread
    /// of its own), so a bad ordinal is an error before anything runs; of every visible GPU, the
    /// first now and the others when a run divides (`MultiGpuBackend`).
    fn gpu(&self) -> Result<Arc<dyn Backend>> {
        let no_gpu = |reason| exec_datafusion_err!("option device=gpu, but no GPU can be used: {reason}");
        let named = match &self.devices {
            Devices::All => {
                let count = crate::cuda::device_count().map_err(no_gpu)?.min(MAX_DEVICES);
                let first = GpuDevice::at(0).map_err(no_gpu)?;
                return Ok(match count {
                    1 => Arc::new(GpuBackend::new(first, self.memory_limit)),
                    _ => Arc::new(MultiGpuBackend::visible(first, (1..count).collect(), self.memory_limit)),
                });
            }
            Devices::List(list) if list.is_empty() => {
                return exec_err!("option devices='': no GPU selected (devices=all, or ordinals such as 0,1)");
            }
            Devices::List(list) => list,
        };
        let mut devices = open_devices(named)
            .into_iter()
            .map(|device| device.map_err(|reason| exec_datafusion_err!("option devices={}: {reason}", self.devices)))
            .collect::<Result<Vec<_>>>()?;
        Ok(match devices.len() {
            1 => Arc::new(GpuBackend::new(devices.remove(0), self.memory_limit)),
            _ => Arc::new(MultiGpuBackend::named(devices, self.memory_limit)),
        })
    }

    /// Runs `call` where the scheduler sends `work` of `cpu_ns` (one core's estimate of the whole
    /// run) and `gpu_over_one_core` (the GPU's speed against one core on this work) on `inputs`,
    /// once its unit is free (backend/auto/scheduler.rs). A GPU run that fails before sending anything
    /// (out of memory, a launch error) runs again on the CPU, counted in `gpu_fallbacks`. `rows`:
    /// the left rows (queries) `call` can run in parts (`call(backend, sink, Some(range))`), which
    /// the GPU and the CPU then share when that finishes first ([`Choice::gpu_share`]).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        work: Work,
        cpu_ns: f64,
        gpu_over_one_core: f64,
        inputs: &[&Vectors],
        modules: &[KernelModule],
        rows: Option<usize>,
        sink: &dyn ResultSink,
        call: impl Fn(&dyn Backend, &dyn ResultSink, Option<Range<usize>>) -> Result<RunStats> + Sync,
    ) -> Result<RunStats> {
        let scheduler = Scheduler::global();
        let cpu = on_cores(cpu_ns, rayon::current_num_threads());
        // What the GPU pays whatever its share: start-up left, uploads and the run's own overhead.
        let gpu_fixed = startup_left(modules).map(|startup| {
            let upload_bytes: usize = inputs.iter().filter(|v| !resident_on_device(v)).map(|v| v.values.bytes()).sum();
            startup + GPU_RUN + Duration::from_secs_f64(upload_bytes as f64 / UPLOAD_BYTES_PER_SECOND)
        });
        let gpu = gpu_fixed.map(|fixed| fixed + Duration::from_secs_f64(cpu_ns * 1e-9 / gpu_over_one_core));
        if self.gpu_only {
            let gpu_backend = self.gpu()?;
            let raw = gpu.unwrap_or(cpu);
            let predicted = scheduler.choose(work, cpu, Some(raw)).gpu.unwrap_or(raw);
            let on_gpu = Scheduled { work, unit: Unit::Gpu, raw, predicted, cpu_fallback: None, rows: None };
            return on_gpu.run(gpu_backend.as_ref(), sink, &call);
        }
        let choice = scheduler.choose(work, cpu, gpu);
        if let (Some(rows), Some(raw_gpu), Some(fixed), Some(corrected)) = (rows, gpu, gpu_fixed, choice.gpu) {
            // The fixed part corrected as the whole GPU estimate is.
            let fixed = fixed.mul_f64(corrected.as_secs_f64() / raw_gpu.as_secs_f64().max(1e-12));
            // The self-test's forced share (answers must not depend on the division).
            let forced = self.checks.gpu_share.map(|s| s.clamp(0.0, 1.0));
            let share = forced.or_else(|| choice.gpu_share(fixed));
            if let Some(share) = share.filter(|_| rows >= 2)
                && let Ok(gpu_backend) = self.gpu()
            {
                let divided = Divided { share, rows, work, choice, raw: (cpu, raw_gpu), fixed };
                return self.run_divided(gpu_backend, &divided, sink, &call);
            }
        }
        // Only a run that goes to the GPU waits for the device to be open.
        let gpu_backend = match choice.unit {
            Unit::Gpu => self.gpu().ok(),
            Unit::Cpu => None,
        };
        let (unit, raw, predicted) = match (gpu_backend.is_some(), gpu, choice.gpu) {
            (true, Some(raw), Some(predicted)) => (Unit::Gpu, raw, predicted),
            _ => (Unit::Cpu, cpu, choice.cpu),
        };
        let chosen: Arc<dyn Backend> = gpu_backend.unwrap_or_else(|| Arc::new(CpuBackend));
        let estimate = match choice.gpu_finish {
            Some(gpu_finish) => format!(
                "expected to finish: gpu {:.3} s, cpu {:.3} s, counting queued work",
                gpu_finish.as_secs_f64(),
                choice.cpu_finish.as_secs_f64()
            ),
            None => "no usable GPU".to_string(),
        };
        if let Ok(mut last) = self.last_choice.lock() {
            *last = Some(format!("{} ({estimate})", chosen.name()));
        }
        let cpu_fallback = (unit == Unit::Gpu).then_some((cpu, choice.cpu));
        Scheduled { work, unit, raw, predicted, cpu_fallback, rows: None }.run(chosen.as_ref(), sink, &call)
    }

    /// Runs `call` over the first `share` of the left rows on the GPU and the rest on the CPU
    /// cores at once, each part queued on its unit; a GPU part that fails before sending a row
    /// runs again on the CPU.
    fn run_divided(
        &self,
        gpu_backend: Arc<dyn Backend>,
        divided: &Divided,
        sink: &dyn ResultSink,
        call: &(impl Fn(&dyn Backend, &dyn ResultSink, Option<Range<usize>>) -> Result<RunStats> + Sync),
    ) -> Result<RunStats> {
        let Divided { share, rows, work, choice, raw: (raw_cpu, raw_gpu), fixed } = *divided;
        let cut = ((rows as f64 * share).round() as usize).clamp(1, rows - 1);
        let share = cut as f64 / rows as f64;
        let gpu_all = choice.gpu.unwrap_or(choice.cpu);
        let gpu_predicted = fixed + gpu_all.saturating_sub(fixed).mul_f64(share);
        let raw_gpu_part = gpu_predicted.mul_f64(raw_gpu.as_secs_f64() / gpu_all.as_secs_f64().max(1e-12));
        let cpu_predicted = choice.cpu.mul_f64(1.0 - share);
        if let Ok(mut last) = self.last_choice.lock() {
            *last = Some(format!(
                "divided: {} rows 0..{cut} (predicted {:.3} s), cpu rows {cut}..{rows} (predicted {:.3} s)",
                gpu_backend.name(),
                gpu_predicted.as_secs_f64(),
                cpu_predicted.as_secs_f64()
            ));
        }
        let started = Instant::now();
        let gpu_part = Scheduled {
            work,
            unit: Unit::Gpu,
            raw: raw_gpu_part,
            predicted: gpu_predicted,
            cpu_fallback: Some((raw_cpu.mul_f64(share), choice.cpu.mul_f64(share))),
            rows: Some(0..cut),
        };
        let raw_cpu_part = raw_cpu.mul_f64(1.0 - share);
        let cpu_part = Scheduled {
            work,
            unit: Unit::Cpu,
            raw: raw_cpu_part,
            predicted: cpu_predicted,
            cpu_fallback: None,
            rows: Some(cut..rows),
        };
        // Each part's statistics and when it ended.
        let timed =
            |part: Scheduled, backend: &dyn Backend| part.run(backend, sink, call).map(|s| (s, started.elapsed()));
        let (gpu_part, cpu_part) = std::thread::scope(|scope| {
            let gpu = scope.spawn(|| timed(gpu_part, gpu_backend.as_ref()));
            let cpu = timed(cpu_part, &CpuBackend);
            let gpu = gpu
                .join()
                .unwrap_or_else(|_| Err(DataFusionError::Internal("the GPU part of a divided run panicked".into())));
            (gpu, cpu)
        });
        let ((mut stats, gpu_time), (cpu_stats, cpu_time)) = (gpu_part?, cpu_part?);
        let queue_time = stats.queue_time.max(cpu_stats.queue_time);
        stats.add(&cpu_stats);
        (stats.predicted_time, stats.queue_time) = (gpu_predicted.max(cpu_predicted), queue_time);
        stats.divided =
            Some(DividedRun { gpu_rows: cut, gpu_predicted, gpu_time, cpu_rows: rows - cut, cpu_predicted, cpu_time });
        Ok(stats)
    }
}

/// One run (or part of one) queued on a unit of the scheduler.
struct Scheduled {
    work: Work,
    unit: Unit,
    /// Its cost-model time, and that time corrected by earlier runs (what is queued).
    raw: Duration,
    predicted: Duration,
    /// A GPU run that fails before sending a row runs again on the CPU cores, queued with these
    /// (raw, corrected) times; `None`: its error stands (`device=gpu`, and CPU runs).
    cpu_fallback: Option<(Duration, Duration)>,
    /// The left rows it covers (`None`: all).
    rows: Option<Range<usize>>,
}

impl Scheduled {
    /// Runs `call` once the unit is free; the statistics carry the predicted time and the wait.
    fn run(
        self,
        backend: &dyn Backend,
        sink: &dyn ResultSink,
        call: &(impl Fn(&dyn Backend, &dyn ResultSink, Option<Range<usize>>) -> Result<RunStats> + Sync),
    ) -> Result<RunStats> {
        let scheduler = Scheduler::global();
        let ticket = scheduler.admit(self.unit, self.work, self.raw, self.predicted);
        let sent = AtomicBool::new(false);
        let outcome = call(backend, &hand_off(sink, &sent, &ticket), self.rows.clone());
        let mut stats = match (outcome, self.cpu_fallback) {
            (Err(_), Some((raw, predicted))) if !sent.into_inner() => {
                drop(ticket);
                let on_cpu = Scheduled { unit: Unit::Cpu, raw, predicted, cpu_fallback: None, ..self };
                let mut stats = on_cpu.run(&CpuBackend, sink, call)?;
                stats.gpu_fallbacks = 1;
                return Ok(stats);
            }
            (outcome, _) => outcome?,
        };
        (stats.predicted_time, stats.queue_time) = (self.predicted, ticket.waited);
        ticket.finish();
        Ok(stats)
    }
}

/// A CPU run's time on `cores` cores, `cpu_ns` being the cost model's time of the whole run on one.
fn on_cores(cpu_ns: f64, cores: usize) -> Duration {
    CPU_RUN + Duration::from_secs_f64(cpu_ns * 1e-9 / cores as f64)
}

/// What `device=auto` does when the plan is made, the inputs' sizes known ([`Backend::for_inputs`]): `cpu`, the
/// cores' time to compare every pair; `startup`, the GPU's start-up still to pay; `values`, the inputs' rows ×
/// values per row. A run whose every pair the cores compare before the GPU could even start (its start-up left,
/// at most a later process's: [`cached_startup`]) runs on the cores, planned so: no start-up competes with it
/// for the host (under `auto` the 1M × 2 count's first batch came 63 ms later while `cuInit` ran beside it),
/// and kNN then searches the base part by part as it is decoded. The cores' time is bounded by comparing every
/// pair, as the run-time estimate does for kNN; a join's index is chosen only where it is cheaper. A join
/// otherwise whose inputs hold fewer than [`WARM_UP_VALUES`] values starts nothing: its cost depends on the
/// pairs, which only the sample taken once the rows are read tells, and decoding so few values would hide
/// little of the start-up, which that run-time choice then counts in full. Every other plan starts opening the
/// device and loading its modules now, while the inputs are read.
fn at_planning(cpu: Duration, startup: Duration, knn: bool, values: usize) -> AtPlanning {
    if cpu < startup {
        AtPlanning::OnCpu
    } else if knn || values >= WARM_UP_VALUES {
        AtPlanning::StartGpu
    } else {
        AtPlanning::AwaitSample
    }
}

/// [`at_planning`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AtPlanning {
    /// Run on the cores; start nothing.
    OnCpu,
    /// Start opening the GPU and loading the modules now.
    StartGpu,
    /// Start nothing; the run-time choice decides.
    AwaitSample,
}

/// A run that `device=auto` settled on the CPU cores when the plan was made
/// ([`AutoBackend::for_inputs`]).
#[derive(Debug)]
struct PlannedOnCpu {
    /// Why, for EXPLAIN.
    why: String,
}

impl Backend for PlannedOnCpu {
    fn name(&self) -> String {
        format!("cpu ({})", self.why)
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        CpuBackend.join(request, sink)
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        CpuBackend.knn(request, sink)
    }

    fn searches_parts_on_cpu(&self) -> bool {
        true
    }
}

/// A run about to be divided between the GPU and the CPU (see [`AutoBackend::run_divided`]).
#[derive(Debug, Clone, Copy)]
struct Divided {
    /// The GPU's share of the left rows, of `rows`.
    share: f64,
    rows: usize,
    work: Work,
    choice: Choice,
    /// The cost model's times of the whole run on the CPU and the GPU, before correction.
    raw: (Duration, Duration),
    /// The GPU's fixed costs, corrected.
    fixed: Duration,
}

/// The sink of a scheduled run: its first chunk hands the run's device to the next run (the
/// consumer sets the pace from then on), and `sent` records that anything went through.
fn hand_off<'a>(
    inner: &'a dyn ResultSink,
    sent: &'a AtomicBool,
    ticket: &'a Ticket<'a>,
) -> MapSink<'a, impl Fn(ResultChunk) -> Option<ResultChunk> + Sync + 'a> {
    let map = move |chunk| {
        if !sent.swap(true, Ordering::Relaxed) {
            ticket.detach();
        }
        Some(chunk)
    };
    MapSink { inner, map, passes_counts: true }
}

/// Whether `v`'s exact rows are on the device already (kept from an earlier query).
fn resident_on_device(v: &Vectors) -> bool {
    let Some(mark) = v.resident() else { return false };
    let key: ResidentKey = mark.clone();
    matches!(GpuDevice::opened(), Some(Ok(device)) if device.holds(&key))
}

impl Backend for AutoBackend {
    fn name(&self) -> String {
        if self.gpu_only {
            return self.gpu().map_or_else(|_| "gpu (unusable)".to_string(), |gpu| gpu.name());
        }
        match self.last_choice.lock().ok().and_then(|last| last.clone()) {
            Some(last) => format!("auto, last run: {last}"),
            None if self.modules == TEXT_MODULES => "cpu, or the gpu when open and eps ≥ 2".to_string(),
            None => "gpu or cpu, whichever is estimated to finish first".to_string(),
        }
    }

    fn for_inputs(&self, op: &crate::op::SimilarityOp, sizes: &KnownSizes) -> Option<Arc<dyn Backend>> {
        if self.gpu_only || self.modules == TEXT_MODULES {
            return None;
        }
        let knn = matches!(op.operation, crate::op::Operation::Knn { .. });
        let (Some(first), Some(second), Some(dim)) = (sizes.first_rows, sizes.second_rows, sizes.dim) else {
            warm_up(self.modules);
            return None;
        };
        let self_join = sizes.self_join && !knn;
        let every_pair = brute_force_run_ns(first, second, dim, gemm_form(op.metric), self_join);
        let cpu = on_cores(every_pair, rayon::current_num_threads());
        // Not more than a later process pays: a plan that starts nothing also compiles nothing, and
        // a run the cores do in less than a compilation would otherwise leave every later process
        // without the kernels, on the cores (1,000 queries over 1M × 128: ~1.5 s estimated on 16
        // cores, against 2.5 s of start-up with compilation on a machine whose cache is empty).
        let startup = startup_left(self.modules)?.min(cached_startup());
        let values = (first + if self_join { 0 } else { second }).saturating_mul(dim);
        match at_planning(cpu, startup, knn, values) {
            AtPlanning::OnCpu => {
                let why = format!(
                    "planned: every pair on the cores in ~{:.3} s, before the GPU could start (~{:.3} s)",
                    cpu.as_secs_f64(),
                    startup.as_secs_f64()
                );
                return Some(Arc::new(PlannedOnCpu { why }));
            }
            AtPlanning::StartGpu => warm_up(self.modules),
            AtPlanning::AwaitSample => {}
        }
        None
    }

    fn join(&self, request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        if request.metric.is_text() && !self.gpu_only {
            return self.text_join(request, sink);
        }
        let self_join = request.self_join.is_some();
        // The plan the run is priced with is the one the backend that runs it reads.
        let plan = request.plan();
        let cpu_ns = plan.one_core_ns;
        let gpu_over_one_core = match plan.strategy {
            JoinStrategy::Grid(_) | JoinStrategy::Directory(_) => GPU_OVER_ONE_CORE_GRID,
            JoinStrategy::BruteForce => GPU_OVER_ONE_CORE_BRUTE,
        };
        let inputs: &[&Vectors] = if self_join { &[request.left] } else { &[request.left, request.right] };
        // Two inputs divide by left rows, each part joined with the whole right input; a
        // self-join's pairs are found once, from the smaller position, so it stays whole.
        let rows = (!self_join).then_some(request.left.len());
        self.run(Work::Join, cpu_ns, gpu_over_one_core, inputs, self.modules, rows, sink, |backend, sink, rows| {
            match rows {
                None => backend.join(request, sink),
                Some(rows) => join_rows(backend, request, rows, sink),
            }
        })
    }

    fn knn(&self, request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
        let every_pair = brute_force_run_ns(
            request.queries.len(),
            request.base.len(),
            request.base.dim,
            gemm_form(request.metric),
            false,
        );
        let inputs = [request.base, request.queries];
        let rows = Some(request.queries.len());
        let Some(approx) = request.approx else {
            return self.run(
                Work::Knn,
                every_pair,
                GPU_OVER_ONE_CORE_BRUTE,
                &inputs,
                self.modules,
                rows,
                sink,
                |backend, sink, rows| match rows {
                    None => backend.knn(request, sink),
                    Some(rows) => knn_rows(backend, request, rows, sink),
                },
            );
        };
        // Asked for an approximate answer: the cores search the index; the GPU searches it too,
        // or runs the exact kNN where that is estimated faster (its answer is then exact).
        let estimate = ApproxEstimate::of(request, approx, rayon::current_num_threads());
        let exact_ns = exact_knn_gpu_ns(request.queries.len(), request.base.len(), request.base.dim);
        // Only kept vectors keep an index for later runs: a base read for this run forgoes nothing.
        let forgone = if request.base.resident().is_some() { request.base.forgo_curves(0.0) } else { 0.0 };
        let search = self.checks.approx_search_on_gpu || estimate.searches_on_gpu(exact_ns, forgone);
        if !search && request.base.resident().is_some() {
            request.base.forgo_curves(exact_ns - estimate.search_ns);
        }
        let on_gpu = KnnRequest {
            base: request.base,
            queries: request.queries,
            metric: request.metric,
            k: request.k,
            approx: search.then_some(approx),
            index: request.index,
        };
        let gpu_ns = if search { estimate.build_ns + estimate.search_ns } else { exact_ns };
        let gpu_over_one_core = estimate.cpu_ns / gpu_ns.max(1.0);
        let cpu_ns = estimate.cpu_ns;
        self.run(Work::Knn, cpu_ns, gpu_over_one_core, &inputs, self.modules, rows, sink, |backend, sink, rows| {
            let on_cores = backend.searches_parts_on_cpu();
            let request = if on_cores { request } else { &on_gpu };
            let mut stats = match rows.clone() {
                None => backend.knn(request, sink)?,
                Some(rows) => knn_rows(backend, request, rows, sink)?,
            };
            if !on_cores && !search {
                stats.exact_queries += rows.map_or(request.queries.len(), |rows| rows.len()) as u64;
            }
            Ok(stats)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{AtPlanning, at_planning, on_cores};
    use crate::index::brute_force_run_ns;

    /// The cores' bound of [`AutoBackend::for_inputs`] on 16 cores, L2.
    fn on_16_cores(first: usize, second: usize, dim: usize, self_join: bool) -> Duration {
        on_cores(brute_force_run_ns(first, second, dim, true, self_join), 16)
    }

    #[test]
    fn planning_starts_the_gpu_only_where_it_can_pay() {
        // A later process's start-up: opening the device and loading cached modules.
        let startup = Duration::from_millis(320);
        // 10 queries over 1M × 128 (BENCHMARKS' end-to-end kNN): ~17 ms on 16 cores.
        let few_queries = on_16_cores(10, 1_000_000, 128, false);
        assert_eq!(at_planning(few_queries, startup, true, 1_000_010 * 128), AtPlanning::OnCpu);
        // P1, 10,000 queries: the GPU's start-up overlaps decoding.
        let p1 = on_16_cores(10_000, 1_000_000, 128, false);
        assert_eq!(at_planning(p1, startup, true, 1_010_000 * 128), AtPlanning::StartGpu);
        // P3, the 1M × 2 self-join: bounded only by every pair; the sample decides.
        let p3 = on_16_cores(1_000_000, 1_000_000, 2, true);
        assert_eq!(at_planning(p3, startup, false, 2_000_000), AtPlanning::AwaitSample);
        // 10M × 2 holds enough values to decode while the GPU starts.
        let wide = on_16_cores(10_000_000, 10_000_000, 2, true);
        assert_eq!(at_planning(wide, startup, false, 20_000_000), AtPlanning::StartGpu);
        // A small join is done before any start-up; on an open GPU (nothing left) nothing is planned.
        let small = on_16_cores(2_000, 2_000, 8, true);
        assert_eq!(at_planning(small, startup, false, 16_000), AtPlanning::OnCpu);
        assert_eq!(at_planning(small, Duration::ZERO, false, 16_000), AtPlanning::AwaitSample);
    }
}
