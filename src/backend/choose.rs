//! Which backend a query gets: the GPU, the cores, or `device=auto`'s choice per run; on a
//! cluster, the one each executor chooses.

use std::sync::Arc;

use datafusion::common::{Result, internal_err, plan_err};

use crate::backend::Backend;
#[cfg(feature = "gpu")]
use crate::backend::auto::{AutoBackend, modules_of};
use crate::backend::cpu::CpuBackend;
use crate::backend::request::{JoinRequest, KnnRequest};
use crate::backend::sink::ResultSink;
use crate::backend::stats::RunStats;
use crate::op::{Device, SimilarityOp};
#[cfg(feature = "gpu")]
use crate::op::{IndexChoice, Operation};

/// The backend for `op`: the GPU under `device=gpu`; under `device=auto`, per run, the GPU or the
/// CPU by estimated time where a GPU may be usable; otherwise (and for text metrics) every CPU
/// core. Under `device=gpu` the device's start-up begins now, on a
/// background thread, while the inputs are read; under `device=auto` when the plan knows the
/// inputs' sizes ([`Backend::for_inputs`]).
#[cfg(feature = "gpu")]
pub fn choose(op: &SimilarityOp) -> Result<Arc<dyn Backend>> {
    let function = op.function_name();
    let knn = matches!(op.operation, Operation::Knn { .. });
    let modules = modules_of(op);
    // Text under device=auto: joins may take a GPU that is already open (AutoBackend::text_join);
    // kNN of strings runs on the cores.
    let text_join = op.metric.is_text() && !knn;
    if text_join && op.device == Device::Auto && crate::cuda::startup::libraries_present() {
        return Ok(Arc::new(AutoBackend::text_joins(op.gpu_memory_limit, op.devices.clone())));
    }
    let text_on_cpu = (op.metric.is_text() || op.metric.is_set_or_bits()) && op.device != Device::Gpu;
    let clusters_on_cpu = op.index == IndexChoice::ListOfClusters && op.device != Device::Gpu;
    if text_on_cpu || clusters_on_cpu {
        return Ok(Arc::new(CpuBackend));
    }
    let devices = op.devices.clone();
    match op.device {
        Device::Cpu => Ok(Arc::new(CpuBackend)),
        Device::Auto if crate::cuda::startup::libraries_present() => {
            Ok(Arc::new(AutoBackend::new(op.gpu_memory_limit, devices, modules, op.checks)))
        }
        Device::Auto => Ok(Arc::new(CpuBackend)),
        Device::Gpu if crate::cuda::startup::libraries_present() => {
            Ok(Arc::new(AutoBackend::gpu_only(op.gpu_memory_limit, devices, modules, op.checks)))
        }
        Device::Gpu => match crate::cuda::probe() {
            Err(reason) => plan_err!("{function}: option device=gpu, but no GPU can be used: {reason}"),
            Ok(_) => plan_err!("{function}: option device=gpu, but the CUDA libraries failed to load"),
        },
    }
}

/// The backend for `op` in a build without the `gpu` feature: every CPU core; `device=gpu` is an
/// error that says why.
#[cfg(not(feature = "gpu"))]
pub fn choose(op: &SimilarityOp) -> Result<Arc<dyn Backend>> {
    match op.device {
        Device::Gpu => plan_err!(
            "{}: option device=gpu, but this build of simjoin has no GPU backend (built without its `gpu` feature)",
            op.function_name()
        ),
        Device::Auto | Device::Cpu => Ok(Arc::new(CpuBackend)),
    }
}

/// Starts opening GPU 0 and loading the vector joins' and kNN's kernel modules on a background
/// thread, where CUDA's libraries are present: for a long-lived process such as `simjoin serve`,
/// which pays the start-up once for all its queries. A one-shot process leaves it to each plan
/// ([`Backend::for_inputs`]), which under `device=auto` starts nothing for a run the cores finish
/// before the start-up would.
#[cfg(all(feature = "gpu", feature = "server"))]
pub fn start_gpu() {
    use crate::backend::auto::{JOIN_MODULES, KNN_MODULES};
    let mut modules = JOIN_MODULES.to_vec();
    modules.extend(KNN_MODULES.iter().filter(|m| !JOIN_MODULES.contains(m)));
    crate::cuda::startup::warm_up(&modules);
}

/// For a plan that runs on a cluster: a backend that only stands for the one each executor
/// chooses when it decodes its part of the plan (`cluster::codec`); this machine opens no GPU.
pub fn on_executor() -> Arc<dyn Backend> {
    Arc::new(OnExecutor)
}

/// The backend of a plan planned for a cluster, before an executor replaces it with its own.
#[derive(Debug)]
pub struct OnExecutor;

impl Backend for OnExecutor {
    fn name(&self) -> String {
        "chosen by each executor".into()
    }

    fn join(&self, _request: &JoinRequest, _sink: &dyn ResultSink) -> Result<RunStats> {
        internal_err!("a plan for a cluster ran outside an executor (its backend is chosen there)")
    }

    fn knn(&self, _request: &KnnRequest, _sink: &dyn ResultSink) -> Result<RunStats> {
        internal_err!("a plan for a cluster ran outside an executor (its backend is chosen there)")
    }
}
