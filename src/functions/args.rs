//! Turning the argument expressions of a table-function call into typed values, with errors that
//! name the function, the argument and the value. DataFusion plans the arguments against an empty
//! schema, so a bare table name arrives as a column reference and constants arrive folded.

use std::future::Future;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::catalog::view::ViewTable;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::common::{Result, ScalarValue, TableReference, exec_datafusion_err, plan_datafusion_err, plan_err};
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::{Expr, LogicalPlan};
use futures::FutureExt;

use crate::options::SimJoinOptions;

/// A table argument: a name in the catalog, or a file/directory/URL to read directly.
#[derive(Debug, Clone, PartialEq)]
pub enum TableArg {
    /// `t`, `schema.t` or `'t'`.
    Name(TableReference),
    /// `'data/points.parquet'`, `'s3://bucket/dir/'`.
    Path(String),
    /// A subquery or a CTE's name, planned by the SQL planner (`table_arguments.rs`).
    Plan(Arc<LogicalPlan>),
}

/// Reads argument `argument` of `function` as a table name or path.
pub fn table_arg(function: &str, argument: &str, expr: &Expr) -> Result<TableArg> {
    match expr {
        Expr::Column(c) => Ok(TableArg::Name(match &c.relation {
            None => TableReference::bare(c.name.clone()),
            Some(q) => TableReference::partial(q.table().to_string(), c.name.clone()),
        })),
        Expr::Literal(value, _) => match string_value(value) {
            Some(s) if looks_like_path(s) => Ok(TableArg::Path(s.to_string())),
            Some(s) if !s.trim().is_empty() => Ok(TableArg::Name(TableReference::from(s))),
            _ => plan_err!("{function}: argument '{argument}' must be a table name or a file path, got {value}"),
        },
        Expr::ScalarSubquery(subquery) => Ok(TableArg::Plan(subquery.subquery.clone())),
        other => plan_err!("{function}: argument '{argument}' must be a table name or a file path, got {other}"),
    }
}

fn string_value(value: &ScalarValue) -> Option<&str> {
    match value {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => Some(s),
        _ => None,
    }
}

/// A quoted argument names a file when it has a scheme, a slash, or a data-file extension.
fn looks_like_path(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    s.contains("://")
        || s.contains('/')
        || s.contains('\\')
        || [".parquet", ".csv", ".tsv", ".json", ".ndjson"].iter().any(|e| lower.ends_with(e))
}

/// Whether `expr` is a numeric constant.
pub fn is_number(expr: &Expr) -> bool {
    matches!(expr, Expr::Literal(v, _) if v.data_type().is_numeric())
}

/// Reads a numeric constant.
pub fn number_arg(function: &str, argument: &str, expr: &Expr) -> Result<f64> {
    if let Expr::Literal(value, _) = expr
        && value.data_type().is_numeric()
        && !value.is_null()
        && let Ok(ScalarValue::Float64(Some(v))) = value.cast_to(&DataType::Float64)
    {
        return Ok(v);
    }
    plan_err!("{function}: argument '{argument}' must be a number, got {expr}")
}

/// Reads a positive integer constant.
pub fn count_arg(function: &str, argument: &str, expr: &Expr) -> Result<usize> {
    if let Expr::Literal(value, _) = expr
        && value.data_type().is_integer()
        && let Ok(ScalarValue::Int64(Some(v))) = value.cast_to(&DataType::Int64)
    {
        return match usize::try_from(v) {
            Ok(v) if v >= 1 => Ok(v),
            _ => plan_err!("{function}: argument '{argument}' must be a positive integer, got {v}"),
        };
    }
    plan_err!("{function}: argument '{argument}' must be a positive integer, got {expr}")
}

/// The session's `simjoin.*` options, overridden by an optional trailing options string.
pub fn options(session: &dyn Session, function: &str, rest: &[Expr]) -> Result<SimJoinOptions> {
    let defaults = SimJoinOptions::of(session.config_options());
    match rest {
        [] => Ok(defaults),
        [Expr::Literal(value, _)] if string_value(value).is_some() => {
            defaults.with_call_options(function, string_value(value).unwrap_or_default())
        }
        [other] => plan_err!("{function}: argument 'options' must be a string such as 'metric=cosine', got {other}"),
        extra => plan_err!("{function}: too many arguments: {} after the last expected one", extra.len()),
    }
}

/// A constant query vector: `'[0.1, 0.2]'`, or an array literal such as `[0.1, 0.2]`.
pub fn vector_literal(function: &str, argument: &str, expr: &Expr) -> Result<Option<Vec<f64>>> {
    let Expr::Literal(value, _) = expr else { return Ok(None) };
    let values: Vec<f64> = match value {
        ScalarValue::List(a) => list_values(a.value(0))?,
        ScalarValue::LargeList(a) => list_values(a.value(0))?,
        ScalarValue::FixedSizeList(a) => list_values(a.value(0))?,
        v => match string_value(v) {
            Some(s) if s.trim_start().starts_with('[') => parse_vector_text(s).ok_or_else(|| {
                plan_datafusion_err!("{function}: argument '{argument}' is not a vector literal of numbers: '{s}'")
            })?,
            _ => return Ok(None),
        },
    };
    if values.is_empty() {
        return plan_err!("{function}: argument '{argument}' is an empty vector");
    }
    if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
        return plan_err!("{function}: argument '{argument}' holds a non-finite value {bad}");
    }
    Ok(Some(values))
}

/// Constant query strings for a text metric: an array literal of strings, `['colour']` or
/// `['colour', 'flavour']` (one query each). A bare quoted string names a table or a file, so it
/// cannot be a query string.
pub fn text_literal(function: &str, argument: &str, expr: &Expr) -> Result<Option<Vec<String>>> {
    let Expr::Literal(value, _) = expr else { return Ok(None) };
    let array = match value {
        ScalarValue::List(a) => a.value(0),
        ScalarValue::LargeList(a) => a.value(0),
        ScalarValue::FixedSizeList(a) => a.value(0),
        _ => return Ok(None),
    };
    if !matches!(array.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
        return Ok(None);
    }
    let array = cast(&array, &DataType::Utf8)?;
    let strings = array.as_string::<i32>();
    if strings.is_empty() {
        return plan_err!("{function}: argument '{argument}' is an empty list of query strings");
    }
    if strings.null_count() > 0 {
        return plan_err!("{function}: argument '{argument}' holds a NULL query string");
    }
    Ok(Some(strings.iter().map(|s| s.unwrap_or_default().to_string()).collect()))
}

/// A constant query of `metric=jaccard` or `hamming`: an array literal of strings or integers is
/// one set (`['red', 'green']`, `[3, 17]`), a binary literal one bit string (`X'0f0a'`), an
/// integer literal one 64-bit hash; the one-row table holding it (column `set` or `bits`).
pub fn set_or_bits_literal(function: &str, argument: &str, expr: &Expr) -> Result<Option<Arc<dyn TableProvider>>> {
    let Expr::Literal(value, _) = expr else { return Ok(None) };
    let column: ArrayRef = match value {
        ScalarValue::List(_) | ScalarValue::LargeList(_) | ScalarValue::FixedSizeList(_) => {
            let array = value.to_array_of_size(1)?;
            let element = crate::vectors::sets::list_element(array.data_type()).cloned();
            match element {
                Some(e) if matches!(e, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) || e.is_integer() => {
                    array
                }
                // Bytes of a bit string written as a list.
                Some(e) if e == DataType::UInt8 => array,
                Some(DataType::Null) => {
                    return plan_err!(
                        "{function}: argument '{argument}' is an empty set literal; write a set such as ['a'] (an empty set matches only empty sets)"
                    );
                }
                Some(e) => {
                    return plan_err!(
                        "{function}: argument '{argument}' is a list of {e}, not a set of strings or integers"
                    );
                }
                None => return Ok(None),
            }
        }
        ScalarValue::Binary(Some(_)) | ScalarValue::LargeBinary(Some(_)) | ScalarValue::FixedSizeBinary(_, Some(_)) => {
            value.to_array_of_size(1)?
        }
        ScalarValue::Int64(Some(_)) | ScalarValue::UInt64(Some(_)) => value.to_array_of_size(1)?,
        _ => return Ok(None),
    };
    let name = if crate::vectors::sets::list_element(column.data_type()).is_some() { "set" } else { "bits" };
    let schema = Arc::new(Schema::new(vec![Field::new(name, column.data_type().clone(), true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![column])?;
    Ok(Some(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?)))
}

/// A table with column `text` holding `strings`, one row each.
pub fn text_table(strings: Vec<String>) -> Result<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(vec![Field::new("text", DataType::Utf8, false)]));
    let column = StringArray::from(strings);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)])?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// The numbers of a vector written as text, `[0.1, 0.2]` (pgvector's spelling), or `None`.
pub(crate) fn parse_vector_text(text: &str) -> Option<Vec<f64>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    inner.split(',').map(|t| t.trim().parse::<f64>().ok()).collect()
}

fn list_values(array: ArrayRef) -> Result<Vec<f64>> {
    let array = cast(&array, &DataType::Float64)?;
    let array = array.as_primitive::<Float64Type>();
    if array.null_count() > 0 {
        return plan_err!("vector literal holds NULL");
    }
    Ok(array.values().to_vec())
}

/// A one-row table with column `vector` holding `values`.
pub fn vector_table(values: Vec<f64>) -> Result<Arc<dyn TableProvider>> {
    let dim = values.len() as i32;
    let field = Arc::new(Field::new("item", DataType::Float64, false));
    let list = FixedSizeListArray::try_new(field.clone(), dim, Arc::new(Float64Array::from(values)), None)?;
    let schema = Arc::new(Schema::new(vec![Field::new("vector", DataType::FixedSizeList(field, dim), false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list)])?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// Finds the table an argument names, or opens the file it points at.
pub fn resolve_table(
    session: &dyn Session,
    function: &str,
    argument: &str,
    table: &TableArg,
) -> Result<Arc<dyn TableProvider>> {
    match table {
        TableArg::Name(name) => {
            let c = &session.config_options().catalog;
            let resolved = name.clone().resolve(&c.default_catalog, &c.default_schema);
            let schema = session.catalog_list().catalog(&resolved.catalog).and_then(|c| c.schema(&resolved.schema));
            let Some(schema) = schema else {
                return plan_err!("{function}: argument '{argument}': table '{name}' not found");
            };
            let lookup = schema.table(&resolved.table);
            // In-memory catalogs answer at once; others get a short-lived runtime of their own.
            let found = match lookup.now_or_never() {
                Some(found) => found,
                None => block_on_helper(schema.table(&resolved.table))?,
            };
            found?.ok_or_else(|| plan_datafusion_err!("{function}: argument '{argument}': table '{name}' not found"))
        }
        TableArg::Path(path) => open_path(session, function, argument, path),
        TableArg::Plan(plan) => Ok(Arc::new(ViewTable::new(plan.as_ref().clone(), None))),
    }
}

/// A listing table over a Parquet/CSV/JSON file or directory (Parquet when no extension says).
fn open_path(session: &dyn Session, function: &str, argument: &str, path: &str) -> Result<Arc<dyn TableProvider>> {
    let url = ListingTableUrl::parse(path)?;
    let lower = path.to_ascii_lowercase();
    let (format, extension): (Arc<dyn FileFormat>, &str) = if lower.ends_with(".csv") {
        (Arc::new(CsvFormat::default().with_has_header(true)), ".csv")
    } else if lower.ends_with(".tsv") {
        (Arc::new(CsvFormat::default().with_has_header(true).with_delimiter(b'\t')), ".tsv")
    } else if lower.ends_with(".json") || lower.ends_with(".ndjson") {
        let ext = if lower.ends_with(".json") { ".json" } else { ".ndjson" };
        (Arc::new(datafusion::datasource::file_format::json::JsonFormat::default()), ext)
    } else {
        (Arc::new(ParquetFormat::default()), if lower.ends_with(".parquet") { ".parquet" } else { "" })
    };
    let options = ListingOptions::new(format).with_file_extension(extension);
    let schema = block_on_helper(options.infer_schema(session, &url))
        .and_then(|r| r)
        .map_err(|e| plan_datafusion_err!("{function}: argument '{argument}': cannot read '{path}': {e}"))?;
    let config = ListingTableConfig::new(url).with_listing_options(options).with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Runs `future` to completion on a helper thread with its own runtime, so that planning (which is
/// synchronous) can do I/O whatever runtime, if any, the caller runs on.
fn block_on_helper<F: Future + Send>(future: F) -> Result<F::Output>
where
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                Ok(runtime.block_on(future))
            })
            .join()
            .map_err(|_| exec_datafusion_err!("planning I/O thread panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use datafusion::common::Column;
    use datafusion::common::{ScalarValue, TableReference};
    use datafusion::logical_expr::Expr;

    use super::{TableArg, table_arg};
    use crate::functions::args::count_arg;
    use crate::functions::args::number_arg;
    use crate::functions::args::vector_literal;

    #[test]
    fn table_arguments() {
        let col = Expr::Column(Column::new_unqualified("points"));
        assert_eq!(table_arg("knn", "base", &col).unwrap(), TableArg::Name(TableReference::bare("points")));
        let path = Expr::Literal(ScalarValue::Utf8(Some("data/p.parquet".into())), None);
        assert_eq!(table_arg("knn", "base", &path).unwrap(), TableArg::Path("data/p.parquet".into()));
        let num = Expr::Literal(ScalarValue::Float64(Some(1.0)), None);
        let err = table_arg("knn", "base", &num).unwrap_err();
        assert!(err.to_string().contains("knn: argument 'base' must be a table name or a file path, got 1"), "{err}");
    }

    #[test]
    fn numbers_and_counts() {
        let lit = |v| Expr::Literal(v, None);
        assert_eq!(number_arg("f", "eps", &lit(ScalarValue::Int64(Some(2)))).unwrap(), 2.0);
        assert!(number_arg("f", "eps", &lit(ScalarValue::Utf8(Some("x".into())))).is_err());
        assert_eq!(count_arg("knn", "k", &lit(ScalarValue::Int64(Some(3)))).unwrap(), 3);
        let err = count_arg("knn", "k", &lit(ScalarValue::Int64(Some(0)))).unwrap_err();
        assert!(err.to_string().contains("knn: argument 'k' must be a positive integer, got 0"), "{err}");
    }

    #[test]
    fn vector_literals() {
        let lit = Expr::Literal(ScalarValue::Utf8(Some("[1, 2.5, -3]".into())), None);
        assert_eq!(vector_literal("f", "query", &lit).unwrap(), Some(vec![1.0, 2.5, -3.0]));
        let bad = Expr::Literal(ScalarValue::Utf8(Some("[1, x]".into())), None);
        assert!(vector_literal("f", "query", &bad).is_err());
        let name = Expr::Literal(ScalarValue::Utf8(Some("queries".into())), None);
        assert_eq!(vector_literal("f", "query", &name).unwrap(), None);
    }
}
