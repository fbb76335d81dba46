//! Bit strings, the rows of `metric=hamming` and of `metric=jaccard` over a bit column: a
//! FixedSizeBinary, Binary, LargeBinary or BinaryView column of equal lengths, a 64-bit integer
//! column (one hash a row), or, under `metric=hamming`, a list of bytes (UInt8). Each row's bytes
//! are packed into 64-bit words in order, byte `i` as bits `8(i mod 8)…` of word `i / 8`, the last
//! word padded with zeros (which no distance counts). A NULL value never matches.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type, UInt8Type, UInt64Type};
use datafusion::common::{Result, exec_err};

/// The bit strings of one input, row after row, `words` 64-bit words a row.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Bits {
    /// Bits of every row.
    pub bits: usize,
    /// Words of every row (`bits` rounded up to whole words).
    pub words: usize,
    /// `len() × words` words, row after row.
    pub data: Vec<u64>,
}

impl Bits {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.words).unwrap_or(0)
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th row's words.
    #[inline]
    pub fn get(&self, i: usize) -> &[u64] {
        &self.data[i * self.words..(i + 1) * self.words]
    }

    /// Bytes they take.
    pub fn bytes(&self) -> usize {
        self.data.len() * 8
    }

    /// The rows at `positions`, in that order.
    pub(crate) fn select(&self, positions: &[u32]) -> Bits {
        let mut data = Vec::with_capacity(positions.len() * self.words);
        for &p in positions {
            data.extend_from_slice(self.get(p as usize));
        }
        Bits { data, ..*self }
    }

    /// The rows at `positions`.
    pub(crate) fn slice(&self, positions: std::ops::Range<usize>) -> Bits {
        Bits { data: self.data[positions.start * self.words..positions.end * self.words].to_vec(), ..*self }
    }

    /// Bits as rows of `bits` bits in `words` words each (`data` empty), for [`Bits::push_bytes`].
    fn with_width(bits: usize) -> Bits {
        Bits { bits, words: bits.div_ceil(64), data: Vec::new() }
    }

    /// Appends a row of `bytes`.
    fn push_bytes(&mut self, bytes: &[u8]) {
        let first = self.data.len();
        self.data.resize(first + self.words, 0);
        for (i, &b) in bytes.iter().enumerate() {
            self.data[first + i / 8] |= u64::from(b) << (8 * (i % 8));
        }
    }
}

/// What kind of bit column a type is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitsSource {
    /// Binary values (all of one length).
    Binary,
    /// One 64-bit integer a row.
    Integer,
    /// A list of bytes (UInt8) a row, all of one length.
    ByteList,
}

impl BitsSource {
    /// The kind of bit column of type `t`, if it is one; lists of bytes only where `byte_lists`
    /// (`metric=hamming`: under `metric=jaccard` a list is a set of its elements).
    pub fn of(t: &DataType, byte_lists: bool) -> Option<BitsSource> {
        match t {
            DataType::FixedSizeBinary(_) | DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                Some(BitsSource::Binary)
            }
            DataType::Int64 | DataType::UInt64 => Some(BitsSource::Integer),
            DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f)
                if byte_lists && *f.data_type() == DataType::UInt8 =>
            {
                Some(BitsSource::ByteList)
            }
            _ => None,
        }
    }

    /// Its bits a row where the type alone fixes them.
    pub fn static_bits(t: &DataType) -> Option<usize> {
        match t {
            DataType::FixedSizeBinary(n) | DataType::FixedSizeList(_, n) => Some(*n as usize * 8),
            DataType::Int64 | DataType::UInt64 => Some(64),
            _ => None,
        }
    }
}

/// The bit strings of a bit column: (the rows, the input row of each, the rows skipped).
pub(crate) fn from_column(column: &ArrayRef, describe: &str) -> Result<(Bits, Vec<u32>, usize)> {
    let mut rows = Vec::new();
    let mut skipped = 0;
    let bits = match column.data_type() {
        DataType::Int64 | DataType::UInt64 => {
            let values: Vec<Option<u64>> = match column.data_type() {
                DataType::Int64 => column.as_primitive::<Int64Type>().iter().map(|v| v.map(|v| v as u64)).collect(),
                _ => column.as_primitive::<UInt64Type>().iter().collect(),
            };
            let mut bits = Bits::with_width(64);
            for (row, v) in values.into_iter().enumerate() {
                match v {
                    Some(v) => {
                        bits.data.push(v);
                        rows.push(row as u32);
                    }
                    None => skipped += 1,
                }
            }
            bits
        }
        DataType::FixedSizeBinary(_) => {
            let array = column.as_fixed_size_binary();
            byte_rows(describe, array.len(), |r| array.is_valid(r).then(|| array.value(r)), &mut rows, &mut skipped)?
        }
        DataType::Binary => {
            let array = column.as_binary::<i32>();
            byte_rows(describe, array.len(), |r| array.is_valid(r).then(|| array.value(r)), &mut rows, &mut skipped)?
        }
        DataType::LargeBinary => {
            let array = column.as_binary::<i64>();
            byte_rows(describe, array.len(), |r| array.is_valid(r).then(|| array.value(r)), &mut rows, &mut skipped)?
        }
        DataType::BinaryView => {
            let array = column.as_binary_view();
            byte_rows(describe, array.len(), |r| array.is_valid(r).then(|| array.value(r)), &mut rows, &mut skipped)?
        }
        DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f)
            if *f.data_type() == DataType::UInt8 =>
        {
            let lists: Vec<Option<ArrayRef>> = match column.data_type() {
                DataType::FixedSizeList(..) => column.as_fixed_size_list().iter().collect(),
                DataType::List(_) => column.as_list::<i32>().iter().collect(),
                _ => column.as_list::<i64>().iter().collect(),
            };
            // A list holding a NULL byte is not a bit string: the row never matches.
            let bytes: Vec<Option<Vec<u8>>> = lists
                .iter()
                .map(|l| {
                    let l = l.as_ref()?;
                    let l = l.as_primitive::<UInt8Type>();
                    (l.null_count() == 0).then(|| l.values().to_vec())
                })
                .collect();
            byte_rows(describe, bytes.len(), |r| bytes[r].as_deref(), &mut rows, &mut skipped)?
        }
        other => return exec_err!("{describe}: column of type {other} is not a bit column"),
    };
    Ok((bits, rows, skipped))
}

/// The bit strings of `count` rows, row `r` being `value(r)` (`None`: NULL); every row must hold
/// as many bytes as the first.
fn byte_rows<'a>(
    describe: &str,
    count: usize,
    value: impl Fn(usize) -> Option<&'a [u8]>,
    rows: &mut Vec<u32>,
    skipped: &mut usize,
) -> Result<Bits> {
    let mut bits: Option<(Bits, usize)> = None;
    for r in 0..count {
        let Some(bytes) = value(r) else {
            *skipped += 1;
            continue;
        };
        let (out, first_row) = bits.get_or_insert_with(|| (Bits::with_width(bytes.len() * 8), r));
        if bytes.len() * 8 != out.bits {
            return exec_err!(
                "{describe}: bit strings of different lengths: row {first_row} has {} bytes, row {r} has {}",
                out.bits / 8,
                bytes.len()
            );
        }
        out.push_bytes(bytes);
        rows.push(r as u32);
    }
    Ok(bits.map(|(b, _)| b).unwrap_or_default())
}

/// `popcount(a xor b)`: the bits in which `a` and `b` differ.
#[inline]
pub fn hamming(a: &[u64], b: &[u64]) -> u32 {
    a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
}

/// `popcount(a and b)` and `popcount(a or b)`.
#[inline]
pub fn and_or_counts(a: &[u64], b: &[u64]) -> (u32, u32) {
    a.iter().zip(b).fold((0, 0), |(i, u), (x, y)| (i + (x & y).count_ones(), u + (x | y).count_ones()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, BinaryArray, FixedSizeBinaryArray, Int64Array};

    use super::{and_or_counts, from_column, hamming};

    #[test]
    fn bytes_pack_into_words_and_nulls_are_skipped() {
        let values = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
            vec![Some(vec![0xffu8; 9]), None, Some(vec![0u8; 9])].into_iter(),
            9,
        )
        .unwrap();
        let (bits, rows, skipped) = from_column(&(Arc::new(values) as ArrayRef), "t").unwrap();
        assert_eq!((bits.bits, bits.words, bits.len()), (72, 2, 2));
        assert_eq!(bits.get(0), &[u64::MAX, 0xff]);
        assert_eq!((rows, skipped), (vec![0, 2], 1));
        assert_eq!(hamming(bits.get(0), bits.get(1)), 72);
        assert_eq!(and_or_counts(bits.get(0), bits.get(1)), (0, 72));
    }

    #[test]
    fn binary_values_of_other_lengths_are_an_error_naming_the_rows() {
        let values = BinaryArray::from(vec![&b"ab"[..], &b"abc"[..]]);
        let err = from_column(&(Arc::new(values) as ArrayRef), "sim_join: argument 'left'").unwrap_err();
        assert!(err.to_string().contains("row 0 has 2 bytes, row 1 has 3"), "{err}");
        let hashes = Int64Array::from(vec![Some(-1), Some(5)]);
        let (bits, _, _) = from_column(&(Arc::new(hashes) as ArrayRef), "t").unwrap();
        assert_eq!(hamming(bits.get(0), bits.get(1)), 62);
    }
}
