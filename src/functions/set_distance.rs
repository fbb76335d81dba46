//! The scalar distances of sets and bit strings, with exactly the table functions' formulas:
//! `jaccard_distance(a, b)` — `1 − |A ∩ B| / |A ∪ B|` of two list columns (each row the set of its
//! distinct non-NULL elements; 0 between two empty sets), or Tanimoto over two bit columns — and
//! `hamming_distance(a, b)`, the bits two bit strings differ in (binary columns of one length,
//! 64-bit integer hashes, or lists of bytes). A NULL argument gives NULL. Each argument is read by
//! the same conversion as the table functions' inputs (vectors/sets.rs, vectors/bits.rs), so a
//! plain-SQL join on these functions and its rewrite into `sim_join` give the same rows.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float64Builder};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::backend::cpu::bits::tanimoto;
use crate::backend::cpu::sets::{in_global_order, overlap_at_least};
use crate::backend::plan::bounds::jaccard_of_counts;
use crate::vectors::bits::{BitsSource, from_column, hamming};
use crate::vectors::sets::{from_list, is_set_list};
use crate::vectors::{Bits, Sets};

/// The scalar functions of sets and bits.
pub fn all() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::new_from_impl(SetDistance::new("jaccard_distance")),
        ScalarUDF::new_from_impl(SetDistance::new("hamming_distance")),
    ]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SetDistance {
    name: &'static str,
    signature: Signature,
}

impl SetDistance {
    fn new(name: &'static str) -> Self {
        Self { name, signature: Signature::any(2, Volatility::Immutable) }
    }

    fn hamming(&self) -> bool {
        self.name == "hamming_distance"
    }

    /// Whether an argument of type `t` is a set (`Some(true)`), bits (`Some(false)`) or neither.
    fn kind(&self, t: &DataType) -> Option<bool> {
        if !self.hamming() && is_set_list(t) {
            return Some(true);
        }
        BitsSource::of(t, self.hamming()).map(|_| false)
    }
}

/// One argument's rows: the values of its non-NULL rows, and for each input row its position
/// among them.
struct Argument<T> {
    rows: T,
    position: Vec<Option<u32>>,
}

fn positions(count: usize, rows: &[u32]) -> Vec<Option<u32>> {
    let mut position = vec![None; count];
    for (p, &r) in rows.iter().enumerate() {
        position[r as usize] = Some(p as u32);
    }
    position
}

impl ScalarUDFImpl for SetDistance {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let expected = if self.hamming() {
            "a bit column (binary of one length, Int64/UInt64 hashes, or a list of bytes)"
        } else {
            "a set (a list of strings or integers) or a bit column (binary, Int64/UInt64)"
        };
        let kinds: Vec<Option<bool>> =
            arg_types.iter().map(|t| if *t == DataType::Null { Some(true) } else { self.kind(t) }).collect();
        for (i, (t, kind)) in arg_types.iter().zip(&kinds).enumerate() {
            if kind.is_none() {
                return plan_err!("{}: argument {} has type {t}, expected {expected}", self.name, i + 1);
            }
        }
        if arg_types.iter().all(|t| *t != DataType::Null) && kinds[0] != kinds[1] {
            return plan_err!(
                "{}: a set and a bit string do not compare ({} and {})",
                self.name,
                arg_types[0],
                arg_types[1]
            );
        }
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return exec_err!("{}: expected 2 arguments, got {}", self.name, args.args.len());
        };
        let constant = matches!((a, b), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
        let (a, b) = (a.to_array(rows)?, b.to_array(rows)?);
        let mut out = Float64Builder::with_capacity(rows);
        if *a.data_type() == DataType::Null || *b.data_type() == DataType::Null {
            out.append_nulls(rows);
        } else if self.kind(a.data_type()) == Some(true) {
            let (a, b) = (self.sets(&a, 1)?, self.sets(&b, 2)?);
            let (left, right) = in_global_order(&a.rows, Some(&b.rows))?;
            let right = right.expect("two inputs");
            for row in 0..rows {
                match (a.position[row], b.position[row]) {
                    (Some(x), Some(y)) => {
                        let (x, y) = (left.set(x as usize), right.set(y as usize));
                        let common = overlap_at_least(x, y, 0).unwrap_or(0);
                        out.append_value(jaccard_of_counts(common, x.len() as u32, y.len() as u32));
                    }
                    _ => out.append_null(),
                }
            }
        } else {
            let (a, b) = (self.bits(&a, 1)?, self.bits(&b, 2)?);
            if a.rows.bits != b.rows.bits && !a.rows.is_empty() && !b.rows.is_empty() {
                return exec_err!(
                    "{}: bit strings of different lengths: {} and {} bits",
                    self.name,
                    a.rows.bits,
                    b.rows.bits
                );
            }
            for row in 0..rows {
                match (a.position[row], b.position[row]) {
                    (Some(x), Some(y)) => {
                        let (x, y) = (a.rows.get(x as usize), b.rows.get(y as usize));
                        out.append_value(if self.hamming() { hamming(x, y) as f64 } else { tanimoto(x, y) });
                    }
                    _ => out.append_null(),
                }
            }
        }
        let result: ArrayRef = Arc::new(out.finish());
        if constant {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?));
        }
        Ok(ColumnarValue::Array(result))
    }
}

impl SetDistance {
    fn sets(&self, array: &ArrayRef, position: usize) -> Result<Argument<Sets>> {
        let (sets, rows, _) = from_list(array, &format!("{}: argument {position}", self.name))?;
        Ok(Argument { position: positions(array.len(), &rows), rows: sets })
    }

    fn bits(&self, array: &ArrayRef, position: usize) -> Result<Argument<Bits>> {
        let (bits, rows, _) = from_column(array, &format!("{}: argument {position}", self.name))?;
        Ok(Argument { position: positions(array.len(), &rows), rows: bits })
    }
}
