//! Token sets, the rows of `metric=jaccard` over a list column: each row is the set of its
//! distinct non-NULL elements (strings, or integers compared by value), kept as ids into the
//! input's own dictionary, ascending. A NULL list never matches (it is skipped); an empty list,
//! or one of NULL elements only, is the empty set.
//!
//! The ids are the input's own: a join of two inputs maps both onto one dictionary and orders
//! its tokens rarest first (backend/cpu/sets.rs), so nothing here depends on the other input.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, UInt64Type};
use datafusion::common::{Result, exec_err};

/// The distinct tokens of one input, by id.
#[derive(Debug, Clone, PartialEq)]
pub enum Dictionary {
    /// Integer elements, by value (every integer type; 64-bit unsigned values stay distinct).
    Integers(Vec<i128>),
    /// String elements.
    Strings(Vec<Box<str>>),
}

impl Default for Dictionary {
    fn default() -> Self {
        Dictionary::Integers(Vec::new())
    }
}

impl Dictionary {
    /// Number of distinct tokens.
    pub fn len(&self) -> usize {
        match self {
            Dictionary::Integers(values) => values.len(),
            Dictionary::Strings(values) => values.len(),
        }
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the two hold the same kind of token (two inputs of one join must).
    pub fn same_kind(&self, other: &Dictionary) -> bool {
        matches!(
            (self, other),
            (Dictionary::Integers(_), Dictionary::Integers(_)) | (Dictionary::Strings(_), Dictionary::Strings(_))
        )
    }

    /// Bytes it takes.
    pub fn bytes(&self) -> usize {
        match self {
            Dictionary::Integers(values) => values.len() * 16,
            Dictionary::Strings(values) => values.iter().map(|s| s.len() + 16).sum(),
        }
    }
}

/// The sets of one input, one after another.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sets {
    /// Where each set starts in `tokens`, and where the last one ends (empty: no set).
    pub offsets: Vec<usize>,
    /// Each set's distinct tokens as ids into `dictionary`, ascending within the set.
    pub tokens: Vec<u32>,
    /// The input's distinct tokens (shared by every slice of these sets).
    pub dictionary: Arc<Dictionary>,
}

impl Sets {
    /// Number of sets.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether there is no set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th set's token ids.
    #[inline]
    pub fn get(&self, i: usize) -> &[u32] {
        &self.tokens[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Bytes they take.
    pub fn bytes(&self) -> usize {
        self.offsets.len() * 8 + self.tokens.len() * 4 + self.dictionary.bytes()
    }

    /// The sets at `positions`, in that order.
    pub(crate) fn select(&self, positions: &[u32]) -> Sets {
        if self.offsets.is_empty() {
            return self.clone();
        }
        let mut out = Sets {
            offsets: Vec::with_capacity(positions.len() + 1),
            dictionary: self.dictionary.clone(),
            ..Default::default()
        };
        out.offsets.push(0);
        for &p in positions {
            out.tokens.extend_from_slice(self.get(p as usize));
            out.offsets.push(out.tokens.len());
        }
        out
    }

    /// The sets at `positions`.
    pub(crate) fn slice(&self, positions: std::ops::Range<usize>) -> Sets {
        if self.offsets.is_empty() || positions.is_empty() {
            return Sets { dictionary: self.dictionary.clone(), ..Default::default() };
        }
        let base = self.offsets[positions.start];
        Sets {
            offsets: self.offsets[positions.start..=positions.end].iter().map(|o| o - base).collect(),
            tokens: self.tokens[base..self.offsets[positions.end]].to_vec(),
            dictionary: self.dictionary.clone(),
        }
    }
}

/// Whether `t` is a list column whose elements a set can hold (strings or integers).
pub fn is_set_list(t: &DataType) -> bool {
    list_element(t).is_some_and(|e| is_string(e) || e.is_integer())
}

/// The element type of a list type.
pub fn list_element(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The sets of a list column: (the sets, the input row of each, the rows skipped).
pub(crate) fn from_list(column: &ArrayRef, describe: &str) -> Result<(Sets, Vec<u32>, usize)> {
    // (start, end) of each row's elements inside the flat child array.
    let (child, bounds): (ArrayRef, Vec<(usize, usize)>) = match column.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = column.as_fixed_size_list();
            let n = *n as usize;
            let offset = list.offset();
            (list.values().clone(), (0..list.len()).map(|i| ((offset + i) * n, (offset + i + 1) * n)).collect())
        }
        DataType::List(_) => {
            let list = column.as_list::<i32>();
            let o = list.value_offsets();
            (list.values().clone(), o.windows(2).map(|w| (w[0] as usize, w[1] as usize)).collect())
        }
        DataType::LargeList(_) => {
            let list = column.as_list::<i64>();
            let o = list.value_offsets();
            (list.values().clone(), o.windows(2).map(|w| (w[0] as usize, w[1] as usize)).collect())
        }
        other => return exec_err!("{describe}: column of type {other} is not a list of set elements"),
    };
    let element = child.data_type().clone();
    if is_string(&element) {
        let child = cast(&child, &DataType::Utf8)?;
        let strings = child.as_string::<i32>();
        let mut ids: HashMap<&str, u32, foldhash::fast::FixedState> = HashMap::default();
        let mut dictionary: Vec<Box<str>> = Vec::new();
        let (sets, rows, skipped) = collect_sets(column, &bounds, |j| {
            if strings.is_null(j) {
                return None;
            }
            let s = strings.value(j);
            Some(*ids.entry(s).or_insert_with(|| {
                dictionary.push(s.into());
                (dictionary.len() - 1) as u32
            }))
        })?;
        drop(ids);
        return Ok((Sets { dictionary: Arc::new(Dictionary::Strings(dictionary)), ..sets }, rows, skipped));
    }
    if element.is_integer() {
        // Every integer type by value: 64-bit unsigned values above i64's range stay apart from
        // the negative values of the signed types.
        let values: Vec<Option<i128>> = if element == DataType::UInt64 {
            child.as_primitive::<UInt64Type>().iter().map(|v| v.map(i128::from)).collect()
        } else {
            cast(&child, &DataType::Int64)?.as_primitive::<Int64Type>().iter().map(|v| v.map(i128::from)).collect()
        };
        let mut ids: HashMap<i128, u32, foldhash::fast::FixedState> = HashMap::default();
        let mut dictionary: Vec<i128> = Vec::new();
        let (sets, rows, skipped) = collect_sets(column, &bounds, |j| {
            let v = values[j]?;
            Some(*ids.entry(v).or_insert_with(|| {
                dictionary.push(v);
                (dictionary.len() - 1) as u32
            }))
        })?;
        return Ok((Sets { dictionary: Arc::new(Dictionary::Integers(dictionary)), ..sets }, rows, skipped));
    }
    exec_err!("{describe}: a set's elements must be strings or integers, not {element}")
}

/// The sets of the rows of `column` whose elements are `bounds[r]` of the child array, each
/// element's id given by `id(j)` (`None`: a NULL element, left out).
fn collect_sets(
    column: &ArrayRef,
    bounds: &[(usize, usize)],
    mut id: impl FnMut(usize) -> Option<u32>,
) -> Result<(Sets, Vec<u32>, usize)> {
    let mut sets = Sets { offsets: vec![0], ..Default::default() };
    let mut rows = Vec::new();
    let mut skipped = 0;
    for (row, &(start, end)) in bounds.iter().enumerate() {
        if column.is_null(row) {
            skipped += 1;
            continue;
        }
        let first = sets.tokens.len();
        sets.tokens.extend((start..end).filter_map(&mut id));
        let set = &mut sets.tokens[first..];
        set.sort_unstable();
        let distinct = dedup_sorted(set);
        sets.tokens.truncate(first + distinct);
        sets.offsets.push(sets.tokens.len());
        rows.push(row as u32);
    }
    Ok((sets, rows, skipped))
}

/// Moves the distinct values of sorted `values` to its front; their number.
fn dedup_sorted(values: &mut [u32]) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut kept = 1;
    for i in 1..values.len() {
        if values[i] != values[kept - 1] {
            values[kept] = values[i];
            kept += 1;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, ListArray, StringArray};
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type};

    use super::{Dictionary, from_list};

    #[test]
    fn a_list_is_the_set_of_its_distinct_non_null_elements() {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(3), Some(1), Some(3), None]),
            None,
            Some(vec![]),
            Some(vec![None]),
            Some(vec![Some(1), Some(7)]),
        ]);
        let (sets, rows, skipped) = from_list(&(Arc::new(list) as ArrayRef), "t").unwrap();
        assert_eq!(rows, vec![0, 2, 3, 4]);
        assert_eq!(skipped, 1);
        let values = |i: usize| -> Vec<i128> {
            let Dictionary::Integers(d) = sets.dictionary.as_ref() else { panic!() };
            sets.get(i).iter().map(|&t| d[t as usize]).collect()
        };
        assert_eq!(values(0), vec![3, 1]);
        assert!(values(1).is_empty() && values(2).is_empty());
        assert_eq!(values(3), vec![1, 7]);
    }

    #[test]
    fn string_elements_share_one_dictionary() {
        let strings = StringArray::from(vec![Some("b"), Some("a"), Some("b"), None, Some("c")]);
        let field = Arc::new(Field::new("item", DataType::Utf8, true));
        let list = ListArray::new(field, OffsetBuffer::from_lengths([3, 2]), Arc::new(strings), None);
        let (sets, rows, _) = from_list(&(Arc::new(list) as ArrayRef), "t").unwrap();
        assert_eq!(rows, vec![0, 1]);
        assert_eq!(sets.get(0), &[0, 1]);
        assert_eq!(sets.get(1), &[2]);
        let unsupported = ListArray::new(
            Arc::new(Field::new("item", DataType::Float64, true)),
            OffsetBuffer::from_lengths([1]),
            Arc::new(datafusion::arrow::array::Float64Array::from(vec![1.0])),
            None,
        );
        let err = from_list(&(Arc::new(unsupported) as ArrayRef), "knn: argument 'base'").unwrap_err();
        assert!(err.to_string().contains("a set's elements must be strings or integers, not Float64"), "{err}");
    }
}
