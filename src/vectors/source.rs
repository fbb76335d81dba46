//! Where a table's vectors come from: which column or columns of its schema, checked against the
//! accepted shapes (the module above lists them).

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::{DataFusionError, Result, plan_datafusion_err, plan_err};

use crate::op::Metric;
use crate::vectors::bits::BitsSource;
use crate::vectors::sets::{is_set_list, list_element};

/// Where a table's vectors come from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VectorSource {
    /// One list column (index into the table schema); `dim` is known for fixed-size lists.
    List { index: usize, dim: Option<usize> },
    /// Several numeric columns (indices into the table schema), one coordinate each.
    Columns(Vec<usize>),
    /// One string column (index into the table schema), for a text metric.
    Text { index: usize },
    /// One list column of strings or integers, each row a set (`metric=jaccard`).
    Set { index: usize },
    /// One bit column (`metric=hamming`, or `metric=jaccard` over bits: Tanimoto); `bits` is known
    /// where the type fixes it.
    Bits { index: usize, bits: Option<usize> },
}

impl VectorSource {
    /// Picks the vector column(s) of `schema` for `metric`: the named column, or the numeric
    /// columns named (separated by spaces: `x y z`, any numeric types), else the only list column,
    /// else every floating-point column in order. Under a text metric, the named string column,
    /// else the only one; under `jaccard` and `hamming`, the set or bit column
    /// ([`VectorSource::resolve_sets_or_bits`]). `function`/`argument` name the call in errors.
    pub fn resolve(
        schema: &Schema,
        column: Option<&str>,
        metric: Metric,
        function: &str,
        argument: &str,
    ) -> Result<Self> {
        if metric.is_text() {
            return Self::resolve_text(schema, column, function, argument);
        }
        if metric.is_set_or_bits() {
            return Self::resolve_sets_or_bits(schema, column, metric, function, argument);
        }
        if let Some(names) = column.filter(|c| c.split_whitespace().nth(1).is_some()) {
            let mut indices = Vec::new();
            for name in names.split_whitespace() {
                match Self::resolve(schema, Some(name), metric, function, argument)? {
                    VectorSource::Columns(index) => indices.extend(index),
                    _ => {
                        return plan_err!(
                            "{function}: column '{name}' of argument '{argument}' is a list; \
                             'column={names}' takes numeric columns, one coordinate each"
                        );
                    }
                }
            }
            return Ok(VectorSource::Columns(indices));
        }
        if let Some(name) = column {
            let Some((index, field)) = schema.column_with_name(name) else {
                return Err(no_column(schema, name, function, argument));
            };
            return match field.data_type() {
                t if is_list(t) => Self::list(index, field.name(), t, function, argument),
                t if t.is_numeric() => Ok(VectorSource::Columns(vec![index])),
                t if is_text(t) => plan_err!(
                    "{function}: column '{name}' of argument '{argument}' is text ({t}): a vector \
                     metric cannot compare it; use 'metric=levenshtein'"
                ),
                t if BitsSource::of(t, false).is_some() => plan_err!(
                    "{function}: column '{name}' of argument '{argument}' has type {t}, which is not a \
                     vector; bit strings are compared with 'metric=hamming' or 'metric=jaccard'"
                ),
                t => plan_err!(
                    "{function}: column '{name}' of argument '{argument}' has type {t}, \
                     which is not a vector (expected a list of numbers or numeric columns)"
                ),
            };
        }
        let lists: Vec<usize> = (0..schema.fields().len()).filter(|&i| is_list(schema.field(i).data_type())).collect();
        match lists.as_slice() {
            [index] => {
                let field = schema.field(*index);
                Self::list(*index, field.name(), field.data_type(), function, argument)
            }
            [] => {
                let floats: Vec<usize> =
                    (0..schema.fields().len()).filter(|&i| schema.field(i).data_type().is_floating()).collect();
                let texts = (0..schema.fields().len()).filter(|&i| is_text(schema.field(i).data_type())).count();
                if floats.is_empty() && texts > 0 {
                    return plan_err!(
                        "{function}: argument '{argument}' has no vector column, only text; compare \
                         strings with 'metric=levenshtein'"
                    );
                }
                if floats.is_empty() {
                    return plan_err!(
                        "{function}: argument '{argument}' has no vector column (a list of \
                         numbers, or floating-point columns); name it with 'column=v', or name \
                         numeric columns with 'column=x y z'"
                    );
                }
                Ok(VectorSource::Columns(floats))
            }
            several => {
                let names: Vec<&str> = several.iter().map(|&i| schema.field(i).name().as_str()).collect();
                plan_err!(
                    "{function}: argument '{argument}' has several vector columns ({}); \
                     choose one with 'column=...'",
                    names.join(", ")
                )
            }
        }
    }

    /// The string column of a text metric: the named one, else the only one.
    fn resolve_text(schema: &Schema, column: Option<&str>, function: &str, argument: &str) -> Result<Self> {
        let texts: Vec<usize> = (0..schema.fields().len()).filter(|&i| is_text(schema.field(i).data_type())).collect();
        let index = match column {
            Some(name) => match schema.column_with_name(name) {
                Some((index, field)) if is_text(field.data_type()) => index,
                Some((_, field)) => {
                    return plan_err!(
                        "{function}: column '{name}' of argument '{argument}' has type {}, but metric \
                         levenshtein compares strings (Utf8, LargeUtf8 or Utf8View)",
                        field.data_type()
                    );
                }
                None => return Err(no_column(schema, name, function, argument)),
            },
            None => match texts.as_slice() {
                [index] => *index,
                [] => {
                    return plan_err!(
                        "{function}: argument '{argument}' has no text column for metric levenshtein \
                         (Utf8, LargeUtf8 or Utf8View)"
                    );
                }
                several => {
                    let names: Vec<&str> = several.iter().map(|&i| schema.field(i).name().as_str()).collect();
                    return plan_err!(
                        "{function}: argument '{argument}' has several text columns ({}); choose one \
                         with 'column=...'",
                        names.join(", ")
                    );
                }
            },
        };
        Ok(VectorSource::Text { index })
    }

    /// The column of `metric=jaccard` (a list of strings or integers is a set; a binary or 64-bit
    /// integer column is bits, compared by Tanimoto) or `metric=hamming` (a binary, 64-bit integer
    /// or byte-list column): the named one, else the only list column (jaccard) or binary column,
    /// else (hamming) the only list of bytes. An integer column of hashes is taken only where named,
    /// so that an `id` column is never compared by mistake.
    fn resolve_sets_or_bits(
        schema: &Schema,
        column: Option<&str>,
        metric: Metric,
        function: &str,
        argument: &str,
    ) -> Result<Self> {
        let hamming = metric == Metric::Hamming;
        let expected = if hamming {
            "a bit column: FixedSizeBinary, Binary, LargeBinary or BinaryView of one length, Int64/UInt64 hashes, or a list of bytes (UInt8)"
        } else {
            "a list of strings or integers (a set), or a bit column: FixedSizeBinary, Binary, LargeBinary or BinaryView, or Int64/UInt64 hashes"
        };
        let of = |index: usize| -> Option<Self> {
            let t = schema.field(index).data_type();
            if !hamming && is_set_list(t) {
                return Some(VectorSource::Set { index });
            }
            BitsSource::of(t, hamming).map(|_| VectorSource::Bits { index, bits: BitsSource::static_bits(t) })
        };
        if let Some(name) = column {
            let Some((index, field)) = schema.column_with_name(name) else {
                return Err(no_column(schema, name, function, argument));
            };
            return match of(index) {
                Some(source) => Ok(source),
                None => {
                    let t = field.data_type();
                    let hint = match list_element(t) {
                        Some(e) if hamming && (is_text(e) || e.is_integer()) => {
                            "; a list of tokens is a set: use 'metric=jaccard'"
                        }
                        Some(_) => "",
                        None if t.is_floating() || matches!(t, DataType::FixedSizeList(..)) => {
                            "; vectors are compared with l2, cosine, …"
                        }
                        None => "",
                    };
                    plan_err!(
                        "{function}: column '{name}' of argument '{argument}' has type {t}, which metric {metric} cannot compare (expected {expected}){hint}"
                    )
                }
            };
        }
        let candidates: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| {
                let t = schema.field(i).data_type();
                !matches!(t, DataType::Int64 | DataType::UInt64) && of(i).is_some()
            })
            .collect();
        // Sets (jaccard) and binary columns before lists of bytes (hamming).
        let preferred: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| {
                !matches!(of(i), Some(VectorSource::Bits { .. })) || list_element(schema.field(i).data_type()).is_none()
            })
            .collect();
        let chosen = if preferred.is_empty() { &candidates } else { &preferred };
        match chosen.as_slice() {
            [index] => Ok(of(*index).expect("a candidate")),
            [] => plan_err!(
                "{function}: argument '{argument}' has no column metric {metric} can compare (expected {expected}); \
                 name it with 'column=…' (an integer column of hashes is taken only where named)"
            ),
            several => {
                let names: Vec<&str> = several.iter().map(|&i| schema.field(i).name().as_str()).collect();
                plan_err!(
                    "{function}: argument '{argument}' has several columns metric {metric} can compare ({}); choose one with 'column=...'",
                    names.join(", ")
                )
            }
        }
    }

    fn list(index: usize, name: &str, t: &DataType, function: &str, argument: &str) -> Result<Self> {
        let (element, dim) = match t {
            DataType::FixedSizeList(f, n) => (f.data_type(), Some(*n as usize)),
            DataType::List(f) | DataType::LargeList(f) => (f.data_type(), None),
            _ => unreachable!("is_list checked the type"),
        };
        if !element.is_numeric() {
            let hint =
                if is_text(element) { "; a list of tokens is compared as a set with 'metric=jaccard'" } else { "" };
            return plan_err!(
                "{function}: column '{name}' of argument '{argument}' is a list of {element}, \
                 expected a list of numbers{hint}"
            );
        }
        if dim == Some(0) {
            return plan_err!("{function}: column '{name}' of argument '{argument}' holds empty vectors");
        }
        Ok(VectorSource::List { index, dim })
    }

    /// The vector dimension when the schema alone fixes it.
    pub fn static_dim(&self) -> Option<usize> {
        match self {
            VectorSource::List { dim, .. } => *dim,
            VectorSource::Columns(c) => Some(c.len()),
            VectorSource::Bits { bits, .. } => *bits,
            VectorSource::Text { .. } | VectorSource::Set { .. } => None,
        }
    }

    /// The schema columns the vectors are read from.
    pub fn columns(&self) -> Vec<usize> {
        match self {
            VectorSource::List { index, .. }
            | VectorSource::Text { index }
            | VectorSource::Set { index }
            | VectorSource::Bits { index, .. } => vec![*index],
            VectorSource::Columns(c) => c.clone(),
        }
    }
}

/// The error for a `column=` that `schema` does not have.
fn no_column(schema: &Schema, name: &str, function: &str, argument: &str) -> DataFusionError {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    plan_datafusion_err!("{function}: argument '{argument}' has no column '{name}' (columns: {})", names.join(", "))
}

fn is_list(t: &DataType) -> bool {
    matches!(t, DataType::FixedSizeList(..) | DataType::List(..) | DataType::LargeList(..))
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}
