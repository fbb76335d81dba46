//! Scalar distance functions on two vectors, with exactly the table functions' f64 formulas
//! (`Metric::distance`): pgvector's names `l2_distance`, `cosine_distance`, `inner_product`,
//! `l1_distance`, simjoin's `l2sq_distance` and `linf_distance`, and DuckDB's
//! `array_cosine_distance`, `array_inner_product` and `array_negative_inner_product`.
//! (DataFusion's own `array_distance` is the L2 distance.)
//!
//! An argument is a list column of any numeric element type (FixedSizeList, List, LargeList;
//! values widened to f64), an array literal (`[0.1, 0.2]`) or a vector written as text
//! (`'[0.1, 0.2]'`, as pgvector spells it). A NULL vector, or one holding a NULL, gives NULL; NaN
//! and ±Inf go through the formula (a NaN distance); two vectors of different dimensions are an
//! error naming the function and the row. `cosine_distance` of a zero vector is NaN (0/0), as in
//! pgvector — the table functions skip such rows instead.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array, Float64Builder, LargeListArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Float64Type};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use super::args::parse_vector_text;
use crate::op::{Metric, dot};
use crate::vectors::Row;

/// What a function computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Formula {
    /// A metric's distance, as the table functions compute it.
    Metric(Metric),
    /// The dot product `a·b` (pgvector's and DuckDB's `inner_product`): minus `metric=inner_product`.
    Dot,
}

/// Every scalar distance function's name and formula.
const FUNCTIONS: [(&str, Formula); 9] = [
    ("l2_distance", Formula::Metric(Metric::L2)),
    ("l2sq_distance", Formula::Metric(Metric::L2Squared)),
    ("cosine_distance", Formula::Metric(Metric::Cosine)),
    ("array_cosine_distance", Formula::Metric(Metric::Cosine)),
    ("l1_distance", Formula::Metric(Metric::L1)),
    ("linf_distance", Formula::Metric(Metric::LInf)),
    ("inner_product", Formula::Dot),
    ("array_inner_product", Formula::Dot),
    ("array_negative_inner_product", Formula::Metric(Metric::InnerProduct)),
];

/// Every scalar distance function, by name.
pub fn all() -> Vec<ScalarUDF> {
    FUNCTIONS
        .into_iter()
        .map(|(name, formula)| ScalarUDF::new_from_impl(DistanceFunction::new(name, formula)))
        .collect()
}

/// What the scalar distance function `name` computes (`None`: not one of them).
pub(crate) fn formula(name: &str) -> Option<Formula> {
    FUNCTIONS.iter().find(|(n, _)| *n == name).map(|(_, formula)| *formula)
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct DistanceFunction {
    name: &'static str,
    formula: Formula,
    signature: Signature,
}

impl DistanceFunction {
    fn new(name: &'static str, formula: Formula) -> Self {
        Self { name, formula, signature: Signature::any(2, Volatility::Immutable) }
    }

    /// The formula over two rows, each value widened to f64 as it is read (exact: the same bits
    /// as over rows widened beforehand).
    fn compute(&self, a: Row, b: Row) -> f64 {
        match self.formula {
            Formula::Metric(metric) => metric.row_distance(a, b),
            Formula::Dot => crate::on_rows!(a, b, |x, y| dot(x, y)),
        }
    }
}

/// Whether `t` can hold a vector argument.
fn accepted(t: &DataType) -> bool {
    match t {
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => f.data_type().is_numeric(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => true,
        _ => false,
    }
}

impl ScalarUDFImpl for DistanceFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        for (i, t) in arg_types.iter().enumerate() {
            if !accepted(t) {
                return plan_err!(
                    "{}: argument {} has type {t}, expected a vector (a list of numbers, or text such as '[0.1, 0.2]')",
                    self.name,
                    i + 1
                );
            }
        }
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return exec_err!("{}: expected 2 arguments, got {}", self.name, args.args.len());
        };
        let (a, b) = (Vectors::new(self.name, 1, a)?, Vectors::new(self.name, 2, b)?);
        let mut out = Float64Builder::with_capacity(rows);
        for row in 0..rows {
            match (a.row(row), b.row(row)) {
                (Some(x), Some(y)) if x.len() != y.len() => {
                    return exec_err!(
                        "{}: dimension mismatch in row {row}: {}-dimensional and {}-dimensional vectors",
                        self.name,
                        x.len(),
                        y.len()
                    );
                }
                (Some(x), Some(y)) => out.append_value(self.compute(x, y)),
                _ => out.append_null(),
            }
        }
        let result: ArrayRef = Arc::new(out.finish());
        if a.is_constant() && b.is_constant() {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?));
        }
        Ok(ColumnarValue::Array(result))
    }
}

/// One argument's vectors: a column of them, or one constant vector for every row.
enum Vectors {
    /// A column of fixed-size Float32 lists (what Parquet writers give embeddings), read in place:
    /// widening every value into a new f64 list column first took more time than the distances
    /// (docs/design.md#results).
    FixedF32(FixedSizeListArray),
    Column(LargeListArray),
    Constant(Option<Vec<f64>>),
}

impl Vectors {
    fn new(function: &str, position: usize, value: &ColumnarValue) -> Result<Self> {
        let as_f64_lists = |array: &ArrayRef| -> Result<LargeListArray> {
            let target = DataType::LargeList(Arc::new(Field::new_list_field(DataType::Float64, true)));
            Ok(cast(array, &target)?.as_list::<i64>().clone())
        };
        Ok(match value {
            ColumnarValue::Array(array) => match array.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                    return exec_err!(
                        "{function}: argument {position} is a text column; vectors as text are accepted as constants ('[0.1, 0.2]')"
                    );
                }
                DataType::FixedSizeList(item, _) if *item.data_type() == DataType::Float32 => {
                    Vectors::FixedF32(array.as_fixed_size_list().clone())
                }
                _ => Vectors::Column(as_f64_lists(array)?),
            },
            ColumnarValue::Scalar(scalar) if scalar.is_null() => Vectors::Constant(None),
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(text)))
            | ColumnarValue::Scalar(ScalarValue::LargeUtf8(Some(text)))
            | ColumnarValue::Scalar(ScalarValue::Utf8View(Some(text))) => match parse_vector_text(text) {
                Some(values) if !values.is_empty() => Vectors::Constant(Some(values)),
                _ => return exec_err!("{function}: argument {position} is not a vector literal of numbers: '{text}'"),
            },
            ColumnarValue::Scalar(scalar) => {
                let lists = as_f64_lists(&scalar.to_array_of_size(1)?)?;
                Vectors::Constant(row_of(&lists, 0).map(<[f64]>::to_vec))
            }
        })
    }

    fn is_constant(&self) -> bool {
        matches!(self, Vectors::Constant(_))
    }

    /// Row `i`'s vector, or `None` when it is NULL or holds a NULL.
    fn row(&self, i: usize) -> Option<Row<'_>> {
        match self {
            Vectors::FixedF32(lists) => {
                if lists.is_null(i) {
                    return None;
                }
                let (start, dim) = (lists.value_offset(i) as usize, lists.value_length() as usize);
                let values = lists.values().as_primitive::<Float32Type>();
                if values.nulls().is_some_and(|nulls| (start..start + dim).any(|j| nulls.is_null(j))) {
                    return None;
                }
                Some(Row::F32(&values.values()[start..start + dim]))
            }
            Vectors::Column(lists) => row_of(lists, i).map(Row::F64),
            Vectors::Constant(values) => values.as_deref().map(Row::F64),
        }
    }
}

fn row_of(lists: &LargeListArray, i: usize) -> Option<&[f64]> {
    if lists.is_null(i) {
        return None;
    }
    let offsets = lists.value_offsets();
    let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
    let values: &Float64Array = lists.values().as_primitive::<Float64Type>();
    if values.nulls().is_some_and(|nulls| (start..end).any(|j| nulls.is_null(j))) {
        return None;
    }
    Some(&values.values()[start..end])
}
