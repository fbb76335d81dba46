//! The SQL surface: `sim_join`, `range_query` and `knn` as table functions (each parses and checks
//! its arguments into a [`SimilarityOp`] and input tables; nothing here executes anything), and the
//! scalar distance functions (`l2_distance`, `cosine_distance`, …) of `distance.rs`.

use std::sync::Arc;

use datafusion::catalog::{Session, TableFunctionImpl};
use datafusion::common::{DataFusionError, Result, plan_err};

use crate::backend;
use crate::op::{Operation, SimilarityOp};
use crate::options::SimJoinOptions;
use crate::table::{SimilarityTable, TableInput};
use crate::vectors::VectorSource;

mod args;
mod dbscan;
pub mod distance;
mod knn;
mod knn_join;
mod range_query;
pub mod rewrite;
pub mod set_distance;
mod sim_join;
pub mod table_arguments;
pub mod tokens;

pub use dbscan::DbscanFunc;
pub use knn::KnnFunc;
pub use range_query::RangeQueryFunc;
pub use sim_join::SimJoinFunc;

/// Every function under each name it is registered as. DataFusion looks table functions up by
/// the name exactly as written, so the upper-case spellings are registered too.
pub fn all() -> Vec<(&'static str, Arc<dyn TableFunctionImpl>)> {
    let sim_join: Arc<dyn TableFunctionImpl> = Arc::new(SimJoinFunc);
    let range_query: Arc<dyn TableFunctionImpl> = Arc::new(RangeQueryFunc);
    let knn: Arc<dyn TableFunctionImpl> = Arc::new(KnnFunc);
    let dbscan: Arc<dyn TableFunctionImpl> = Arc::new(DbscanFunc);
    vec![
        ("dbscan", dbscan.clone()),
        ("DBSCAN", dbscan),
        ("sim_join", sim_join.clone()),
        ("SIM_JOIN", sim_join),
        ("range_query", range_query.clone()),
        ("RANGE_QUERY", range_query),
        ("knn", knn.clone()),
        ("KNN", knn),
    ]
}

/// Every scalar function `register` adds: the vectors' distances, the sets' and bits' distances,
/// and the token functions (`shingles`, `qgrams`).
pub fn scalar_functions() -> Vec<datafusion::logical_expr::ScalarUDF> {
    let mut all = distance::all();
    all.extend(set_distance::all());
    all.extend(tokens::all());
    all
}

/// One input table of a call, with its vector column resolved.
fn input(
    session: &dyn Session,
    function: &str,
    argument: &str,
    table: &args::TableArg,
    options: &SimJoinOptions,
) -> Result<TableInput> {
    let provider = args::resolve_table(session, function, argument, table).map_err(|e| match e {
        DataFusionError::Plan(message) if options.metric.is_text() && argument == "query" => {
            DataFusionError::Plan(format!("{message} (a constant query string is written as an array: ['text'])"))
        }
        e => e,
    })?;
    let source = VectorSource::resolve(&provider.schema(), options.column(), options.metric, function, argument)?;
    Ok(TableInput { provider, source, describe: format!("argument '{argument}'") })
}

/// The table of a call: checks what the schemas alone can (dimensions) and picks the backend (on
/// a `cluster`, each executor picks its own: see `cluster`).
fn table(
    op: SimilarityOp,
    first: TableInput,
    second: Option<TableInput>,
    names: [&str; 2],
    cluster: bool,
) -> Result<Arc<SimilarityTable>> {
    if let Some(second) = &second
        && let (Some(a), Some(b)) = (first.source.static_dim(), second.source.static_dim())
        && a != b
    {
        return plan_err!(
            "{}: dimension mismatch: argument '{}' has {a}-dimensional vectors, argument '{}' has {b}",
            op.function_name(),
            names[0],
            names[1]
        );
    }
    if let Some(second) = &second
        && matches!(
            (&first.source, &second.source),
            (VectorSource::Set { .. }, VectorSource::Bits { .. })
                | (VectorSource::Bits { .. }, VectorSource::Set { .. })
        )
    {
        return plan_err!(
            "{}: argument '{}' and argument '{}' hold a set and a bit string, which metric jaccard does not compare with each other",
            op.function_name(),
            names[0],
            names[1]
        );
    }
    if let Some(second) = &second
        && let (Some(a), Some(b)) = (set_elements(&first), set_elements(second))
        && a != b
    {
        return plan_err!(
            "{}: argument '{}' holds sets of {a} and argument '{}' sets of {b}, which share no element",
            op.function_name(),
            names[0],
            names[1]
        );
    }
    if op.device == crate::op::Device::Gpu && op.metric.is_set_or_bits() {
        let function = op.function_name();
        if matches!(first.source, VectorSource::Set { .. }) {
            return plan_err!(
                "{function}: option device=gpu is not available for sets (metric jaccard over a list column): set joins and kNN run on every CPU core (device=auto or cpu; bit strings run on the GPU)"
            );
        }
        if matches!(op.operation, Operation::Knn { .. }) && op.metric == crate::op::Metric::Jaccard {
            return plan_err!(
                "{function}: option device=gpu is not available for kNN by Tanimoto (metric jaccard over bits): it runs on every CPU core (device=auto or cpu; Hamming kNN and both joins run on the GPU)"
            );
        }
    }
    let mut op = op;
    if !op.keys.is_empty() {
        check_keys(&op, &first, second.as_ref(), names, cluster)?;
        // Each group is a run of its own: on the GPU a launch each, which many small groups
        // do not repay; `device=gpu` still runs them there.
        if op.device == crate::op::Device::Auto {
            op.device = crate::op::Device::Cpu;
        }
    }
    let backend = if cluster { backend::on_executor() } else { backend::choose(&op)? };
    Ok(Arc::new(SimilarityTable::new(op, first, second, backend)))
}

/// What the sets of a set input hold: `strings` or `integers` (`None`: not sets).
fn set_elements(input: &TableInput) -> Option<&'static str> {
    let VectorSource::Set { index } = input.source else { return None };
    let schema = input.provider.schema();
    let element = crate::vectors::sets::list_element(schema.field(index).data_type())?;
    Some(if element.is_integer() { "integers" } else { "strings" })
}

/// Option `keys`: not on a cluster, every key a column of both inputs whose types SQL's `=` can
/// compare (the second's cast to the first's).
fn check_keys(
    op: &SimilarityOp,
    first: &TableInput,
    second: Option<&TableInput>,
    names: [&str; 2],
    cluster: bool,
) -> Result<()> {
    let function = op.function_name();
    let keys = op.keys.join(" ");
    if cluster {
        return plan_err!("{function}: option keys={keys}: joins within equal keys do not run on a cluster");
    }
    let inputs = [(first, names[0]), (second.unwrap_or(first), names[1])];
    for key in &op.keys {
        let mut types = Vec::new();
        for (input, name) in inputs {
            let schema = input.provider.schema();
            let Ok(field) = schema.field_with_name(key) else {
                let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                return plan_err!(
                    "{function}: option keys={keys}: argument '{name}' has no column '{key}' (its columns: {})",
                    columns.join(", ")
                );
            };
            types.push(field.data_type().clone());
        }
        if !datafusion::arrow::compute::can_cast_types(&types[1], &types[0]) {
            return plan_err!(
                "{function}: option keys={keys}: column '{key}' is {} in argument '{}' and {} in argument '{}', which do not compare",
                types[0],
                names[0],
                types[1],
                names[1]
            );
        }
    }
    Ok(())
}

/// The base table and the query table (or constant vector) of `range_query` / `knn`.
fn query_and_base(
    session: &dyn Session,
    function: &str,
    base: &datafusion::logical_expr::Expr,
    query: &datafusion::logical_expr::Expr,
    options: &SimJoinOptions,
) -> Result<(TableInput, TableInput)> {
    let base = input(session, function, "base", &args::table_arg(function, "base", base)?, options)?;
    let literal = if options.metric.is_set_or_bits() {
        args::set_or_bits_literal(function, "query", query)?
    } else {
        vector_or_text_literal(function, query, options)?
    };
    let query = match literal {
        Some(provider) => {
            let source = VectorSource::resolve(&provider.schema(), None, options.metric, function, "query")?;
            TableInput { provider, source, describe: "argument 'query'".to_string() }
        }
        None => input(session, function, "query", &args::table_arg(function, "query", query)?, options)?,
    };
    Ok((base, query))
}

/// A constant query vector or query strings, as a table.
fn vector_or_text_literal(
    function: &str,
    query: &datafusion::logical_expr::Expr,
    options: &SimJoinOptions,
) -> Result<Option<Arc<dyn datafusion::catalog::TableProvider>>> {
    let text = options.metric.is_text();
    Ok(match args::text_literal(function, "query", query)? {
        Some(_) if !text => {
            return plan_err!(
                "{function}: argument 'query' is a list of strings, which metric {} cannot compare; use 'metric=levenshtein' (query strings) or 'metric=jaccard' (one set)",
                options.metric
            );
        }
        Some(strings) => Some(args::text_table(strings)?),
        None => match args::vector_literal(function, "query", query)? {
            Some(_) if text => {
                return plan_err!(
                    "{function}: argument 'query' is a vector, which metric levenshtein cannot compare; \
                     write query strings as an array such as ['text']"
                );
            }
            Some(values) => Some(args::vector_table(values)?),
            None => None,
        },
    })
}
