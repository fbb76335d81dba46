//! `simjoin._simjoin`, the compiled half of the Python package (python/simjoin/ is the other):
//! a session of the engine in process ([`Session`]), and simjoin's tables and distance functions
//! as DataFusion FFI capsules for a datafusion-python 55 session ([`ForeignTable`],
//! [`DistanceFunction`]).
//!
//! Arrow data crosses in both directions through Arrow's C data and stream interfaces, so a numpy or
//! pyarrow buffer is read where it lies and a result is handed to pyarrow without a copy. Every call
//! that runs a query lets go of the GIL while the engine works and checks for Ctrl-C between waits.

use std::future::Future;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow_pyarrow::{FromPyArrow, IntoPyArrow};
use datafusion::arrow::array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ffi_stream::ArrowArrayStreamReader;
use datafusion::catalog::{TableFunctionArgs, TableProvider};
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{Expr, ScalarUDF, lit};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use datafusion_ffi::udf::FFI_ScalarUDF;
use futures::{StreamExt, TryStreamExt};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The tokio runtime every session's queries run on. One per process, as one DataFusion program has
/// one: its threads wait on the engine's work (which runs on the engine's own pools and devices), so
/// sessions gain nothing from runtimes of their own. The tables handed to datafusion-python run on
/// it too: the FFI enters it on this side of each call, since that library's runtime lives in
/// another shared object whose tokio this one's code cannot see.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("simjoin-python")
            .enable_all()
            .build()
            .expect("simjoin: cannot start the tokio runtime")
    })
}

/// The engine's error as the Python exception a caller expects: a bad argument, option, query or
/// input row (planning, SQL, configuration and execution errors carry the function, the argument
/// and the value) is a `ValueError`, memory a `MemoryError`, anything else (I/O, a device) a
/// `RuntimeError`; the message is the engine's.
fn python_error(error: DataFusionError) -> PyErr {
    let message = error.to_string();
    match error.find_root() {
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::Configuration(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Execution(_) => PyValueError::new_err(message),
        DataFusionError::ResourcesExhausted(_) => PyMemoryError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// Runs `work` to its end without the GIL, waking every 50 ms to let Python handle its signals:
/// Ctrl-C raises `KeyboardInterrupt` here and drops `work`, which cancels the query.
fn run<T: Send>(py: Python<'_>, work: impl Future<Output = datafusion::error::Result<T>> + Send) -> PyResult<T> {
    py.detach(|| {
        runtime().block_on(async move {
            let mut work = std::pin::pin!(work);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    done = &mut work => return done.map_err(python_error),
                    _ = tick.tick() => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    })
}

/// A query's batches as they come, for pyarrow to pull from: each batch is computed when asked for.
struct BatchesAsAsked {
    stream: SendableRecordBatchStream,
}

impl Iterator for BatchesAsAsked {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = runtime().block_on(self.stream.next())?;
        Some(next.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

impl RecordBatchReader for BatchesAsAsked {
    fn schema(&self) -> SchemaRef {
        self.stream.schema()
    }
}

/// A result as one batch whose columns each lie in one buffer, for numpy to view without a copy.
async fn collect_contiguous(stream: SendableRecordBatchStream) -> datafusion::error::Result<RecordBatch> {
    let schema = stream.schema();
    let batches: Vec<RecordBatch> = stream.try_collect().await?;
    Ok(concat_batches(&schema, &batches)?)
}

/// A session of the engine with simjoin registered: the standalone `simjoin.SessionContext`.
#[pyclass(frozen, module = "simjoin._simjoin")]
struct Session {
    ctx: SessionContext,
}

#[pymethods]
impl Session {
    #[new]
    fn new() -> Self {
        Self { ctx: simjoin::session_context() }
    }

    /// Runs `query` to its end and returns its batches as a `pyarrow.RecordBatchReader` over the
    /// collected result (no copy).
    fn sql<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyAny>> {
        let ctx = &self.ctx;
        let (schema, batches) = run(py, async move {
            let frame = ctx.sql(query).await?;
            let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        })?;
        let reader: Box<dyn RecordBatchReader + Send> =
            Box::new(RecordBatchIterator::new(batches.into_iter().map(Ok), schema));
        reader.into_pyarrow(py)
    }

    /// Runs `query` and returns its result as one batch whose columns each lie in one buffer (a
    /// `pyarrow.RecordBatchReader` of that batch), for numpy to view without a copy.
    fn sql_contiguous<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyAny>> {
        let ctx = &self.ctx;
        let batch = run(py, async move { collect_contiguous(ctx.sql(query).await?.execute_stream().await?).await })?;
        let schema = batch.schema();
        let reader: Box<dyn RecordBatchReader + Send> = Box::new(RecordBatchIterator::new([Ok(batch)], schema));
        reader.into_pyarrow(py)
    }

    /// Plans `query` and returns a `pyarrow.RecordBatchReader` that computes each batch when read.
    fn sql_stream<'py>(&self, py: Python<'py>, query: &str) -> PyResult<Bound<'py, PyAny>> {
        let ctx = &self.ctx;
        let stream = run(py, async move { ctx.sql(query).await?.execute_stream().await })?;
        let reader: Box<dyn RecordBatchReader + Send> = Box::new(BatchesAsAsked { stream });
        reader.into_pyarrow(py)
    }

    /// Registers `data` (anything with `__arrow_c_stream__`: a pyarrow Table or RecordBatchReader,
    /// a polars or pandas DataFrame) as the in-memory table `name`, replacing one of that name. The
    /// batches keep the producer's buffers: nothing is copied.
    fn register_stream(&self, name: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let reader = ArrowArrayStreamReader::from_pyarrow_bound(data)?;
        let schema = reader.schema();
        let batches = reader
            .collect::<Result<Vec<RecordBatch>, ArrowError>>()
            .map_err(|e| PyValueError::new_err(format!("register('{name}'): cannot read the data: {e}")))?;
        let table = MemTable::try_new(schema, vec![batches]).map_err(python_error)?;
        self.ctx.deregister_table(name).map_err(python_error)?;
        self.ctx.register_table(name, Arc::new(table)).map_err(python_error)?;
        Ok(())
    }

    /// Registers the Parquet file or directory at `path` as the table `name`.
    fn register_parquet(&self, py: Python<'_>, name: &str, path: &str) -> PyResult<()> {
        let ctx = &self.ctx;
        run(py, async move { ctx.register_parquet(name, path, ParquetReadOptions::default()).await })
    }

    /// Registers the CSV file at `path` (with a header row) as the table `name`.
    fn register_csv(&self, py: Python<'_>, name: &str, path: &str) -> PyResult<()> {
        let ctx = &self.ctx;
        run(py, async move { ctx.register_csv(name, path, CsvReadOptions::new()).await })
    }

    /// simjoin's table function `function` over `arguments` — (kind, value) pairs, a table of this
    /// session being ("table", its name) — as a table a datafusion-python session can scan.
    fn table_function(&self, function: &str, arguments: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<ForeignTable> {
        let Some((_, implementation)) = simjoin::table_functions().into_iter().find(|(name, _)| *name == function)
        else {
            return Err(PyValueError::new_err(format!(
                "table_function: argument 'function': simjoin has no table function '{function}' (sim_join, range_query, knn)"
            )));
        };
        let exprs = arguments
            .into_iter()
            .enumerate()
            .map(|(position, pair)| argument(function, position + 1, pair))
            .collect::<PyResult<Vec<Expr>>>()?;
        let state = self.ctx.state();
        let provider = implementation.call_with_args(TableFunctionArgs::new(&exprs, &state)).map_err(python_error)?;
        Ok(ForeignTable { provider })
    }

    /// Removes the table `name`; true when there was one.
    fn deregister(&self, name: &str) -> PyResult<bool> {
        Ok(self.ctx.deregister_table(name).map_err(python_error)?.is_some())
    }
}

/// The FFI codec of datafusion-python's session (or the capsule itself).
fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const EXPORT: &str = "__datafusion_logical_extension_codec__";
    let capsule = if session.hasattr(EXPORT)? { session.getattr(EXPORT)?.call0()? } else { session.clone() };
    let capsule = capsule.cast::<PyCapsule>()?;
    let codec: NonNull<FFI_LogicalExtensionCodec> =
        capsule.pointer_checked(Some(c"datafusion_logical_extension_codec"))?.cast();
    // SAFETY: a capsule of that name holds an FFI_LogicalExtensionCodec (datafusion-python's export,
    // checked by name above), alive while `capsule` is; it is cloned out before the capsule goes.
    Ok(unsafe { codec.as_ref() }.clone())
}

/// A simjoin table for a datafusion-python session to scan: `__datafusion_table_provider__` hands it
/// over through DataFusion's FFI with this module's runtime, which the FFI enters on this side
/// whenever the other side plans or reads it.
///
/// Why a table and not the table function itself (`FFI_TableFunction`): datafusion-python 55's side
/// of a foreign table function reads the function's private data as its own build's struct, which
/// another build (this one: another rustc, another tokio) lays out differently, and the process
/// crashes. Tables cross the FFI through function pointers alone.
#[pyclass(frozen, module = "simjoin._simjoin")]
struct ForeignTable {
    provider: Arc<dyn TableProvider>,
}

#[pymethods]
impl ForeignTable {
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = logical_codec(session)?;
        let table =
            FFI_TableProvider::new_with_ffi_codec(self.provider.clone(), true, Some(runtime().handle().clone()), codec);
        PyCapsule::new_with_value(py, table, c"datafusion_table_provider")
    }
}

/// One argument of a table function call from Python: its kind and value.
fn argument(function: &str, position: usize, (kind, value): (String, Bound<'_, PyAny>)) -> PyResult<Expr> {
    Ok(match kind.as_str() {
        "table" => Expr::Column(Column::from_name(value.extract::<String>()?)),
        "integer" => lit(value.extract::<i64>()?),
        "number" => lit(value.extract::<f64>()?),
        "text" => lit(value.extract::<String>()?),
        "floats" => {
            let values: Vec<ScalarValue> = value.extract::<Vec<f64>>()?.into_iter().map(ScalarValue::from).collect();
            lit(ScalarValue::List(ScalarValue::new_list_nullable(&values, &DataType::Float64)))
        }
        "strings" => {
            let values: Vec<ScalarValue> =
                value.extract::<Vec<String>>()?.into_iter().map(|s| ScalarValue::Utf8(Some(s))).collect();
            lit(ScalarValue::List(ScalarValue::new_list_nullable(&values, &DataType::Utf8)))
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "{function}: argument {position}: unknown kind '{other}' (table, integer, number, text, floats, strings)"
            )));
        }
    })
}

/// One of the scalar distance functions for a datafusion-python session.
#[pyclass(frozen, module = "simjoin._simjoin")]
struct DistanceFunction {
    function: Arc<ScalarUDF>,
}

#[pymethods]
impl DistanceFunction {
    #[getter]
    fn name(&self) -> String {
        self.function.name().to_string()
    }

    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        PyCapsule::new_with_value(py, FFI_ScalarUDF::from(self.function.clone()), c"datafusion_scalar_udf")
    }
}

/// The names `sim_join`, `range_query` and `knn` are registered under (lower and upper case).
#[pyfunction]
fn table_function_names() -> Vec<&'static str> {
    simjoin::table_functions().into_iter().map(|(name, _)| name).collect()
}

/// Every scalar distance function.
#[pyfunction]
fn distance_functions() -> Vec<DistanceFunction> {
    simjoin::distance_functions()
        .into_iter()
        .map(|function| DistanceFunction { function: Arc::new(function) })
        .collect()
}

#[pymodule]
fn _simjoin(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Session>()?;
    module.add_class::<ForeignTable>()?;
    module.add_class::<DistanceFunction>()?;
    module.add_function(wrap_pyfunction!(table_function_names, module)?)?;
    module.add_function(wrap_pyfunction!(distance_functions, module)?)?;
    // The datafusion-python major version whose FFI these capsules speak.
    module.add("DATAFUSION_MAJOR", 55)?;
    module.add("GPU", cfg!(feature = "gpu"))?;
    Ok(())
}
