//! Arrow → dense row-major vectors: the accepted column shapes, and which rows never match.
//!
//! Accepted shapes: one `FixedSizeList`, `List` or `LargeList` column of any numeric element type
//! (Float16/32/64, integers), or one or more numeric columns read as the coordinates of one vector
//! (a CSV of `x1..xn` works without options). Values are kept as f32 when the input's type fits
//! f32 exactly (Float32, Float16, 8- and 16-bit integers: half the memory of f64, and no widening
//! pass), else widened to f64, which is exact for every accepted type except 64-bit integers beyond
//! 2⁵³. Comparisons widen the two rows they compare to f64 ([`Row`]), so the answers are the same
//! bits whichever way the values are kept.
//!
//! A row never matches (and is counted as skipped) when its vector is NULL, contains a NULL, NaN or
//! ±Inf, or — under the cosine metric — is the zero vector, whose cosine distance is undefined.
//!
//! Under a text metric (`metric=levenshtein`) the column is a string column (Utf8, LargeUtf8,
//! Utf8View) and each row is kept as its Unicode scalar values ([`Strings`]); NULL strings never
//! match, the empty string does.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_empty_array};
use datafusion::arrow::compute::{cast, concat};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type, SchemaRef};
use datafusion::common::{Result, exec_err};

pub mod bits;
pub mod sets;
mod source;
mod values;

pub use bits::Bits;
use rayon::iter::{IntoParallelRefIterator, ParallelExtend, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};
pub use sets::{Dictionary, Sets};
pub use source::VectorSource;
pub use values::{Coord, Coords, Row, Values};

/// Strings as Unicode scalar values, one after another (the rows of a text metric).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Strings {
    /// Where each string starts in `chars`, and where the last one ends.
    pub offsets: Vec<usize>,
    /// The scalar values of every string.
    pub chars: Vec<u32>,
}

impl Strings {
    /// The `i`-th string.
    #[inline]
    pub fn get(&self, i: usize) -> &[u32] {
        &self.chars[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Appends `s`.
    pub fn push(&mut self, s: &str) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.chars.extend(s.chars().map(u32::from));
        self.offsets.push(self.chars.len());
    }

    /// The strings at `positions`, in that order.
    fn select(&self, positions: &[u32]) -> Strings {
        if self.offsets.is_empty() {
            return Strings::default();
        }
        let mut out = Strings { offsets: Vec::with_capacity(positions.len() + 1), chars: Vec::new() };
        out.offsets.push(0);
        for &p in positions {
            out.chars.extend_from_slice(self.get(p as usize));
            out.offsets.push(out.chars.len());
        }
        out
    }

    /// The strings at `positions`.
    fn slice(&self, positions: std::ops::Range<usize>) -> Strings {
        let mut out = Strings::default();
        if self.offsets.is_empty() || positions.is_empty() {
            return out;
        }
        let base = self.offsets[positions.start];
        out.offsets = self.offsets[positions.start..=positions.end].iter().map(|o| o - base).collect();
        out.chars = self.chars[base..self.offsets[positions.end]].to_vec();
        out
    }
}

/// The usable vectors of one input, dense and row-major.
#[derive(Debug, Default)]
pub struct Vectors {
    /// Dimension of every vector.
    pub dim: usize,
    /// `len() × dim` values, row-major, as kept.
    pub values: Values,
    /// For each vector, its row in the input batch.
    pub rows: Vec<u32>,
    /// Input rows that never match (NULL/NaN/±Inf, or zero vectors under cosine; NULL strings).
    pub skipped: usize,
    /// Text metrics: the strings (`dim` is 0 and `values` empty).
    pub strings: Strings,
    /// `metric=jaccard` over a list column: the sets (`dim` is 0 and `values` empty).
    pub sets: Sets,
    /// Bit columns (`metric=hamming`, `metric=jaccard` over bits): the bit strings (`dim` is 0).
    pub bits: Bits,
    /// Set on vectors the conversion cache keeps across queries (exec/cache.rs), which nobody
    /// changes while it lives: the GPU keeps their rows resident under it.
    resident: Option<Arc<ResidentMark>>,
    /// [`Vectors::mean`], computed on first use (kept vectors keep it across queries).
    mean: OnceLock<Vec<f64>>,
    /// [`Vectors::extent`], computed on first use (kept vectors keep it across queries).
    extent: OnceLock<(Vec<f64>, Vec<f64>)>,
    /// [`Vectors::unit_rows`], computed on first use.
    unit: OnceLock<Vec<f64>>,
    /// [`Vectors::rows_are_positions`], computed on first use.
    rows_are_positions: OnceLock<bool>,
    /// [`Vectors::kept`]: what other layers built over these vectors, by type.
    kept: Kept,
}

/// The values of [`Vectors::kept`], one of each type.
#[derive(Default)]
struct Kept(std::sync::Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Kept").field("values", &kept.len()).finish()
    }
}

/// A clone is a new value that its owner may change: it carries no resident mark.
impl Clone for Vectors {
    fn clone(&self) -> Self {
        Vectors {
            dim: self.dim,
            values: self.values.clone(),
            rows: self.rows.clone(),
            skipped: self.skipped,
            strings: self.strings.clone(),
            sets: self.sets.clone(),
            bits: self.bits.clone(),
            ..Default::default()
        }
    }
}

/// The mark of vectors kept across queries: while one lives, the values of the vectors that carry
/// it stay as they are (they are shared, behind an `Arc`, and never written), so the GPU's copy of
/// their rows stays valid (gpu::GpuDevice::resident_rows, which holds it weakly).
#[derive(Debug, Default)]
pub struct ResidentMark;

impl Vectors {
    /// Number of usable vectors.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no vector is usable.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The `i`-th vector.
    #[inline]
    pub fn row(&self, i: usize) -> Row<'_> {
        let range = i * self.dim..(i + 1) * self.dim;
        match &self.values {
            Values::F64(v) => Row::F64(&v[range]),
            Values::F32(v) => Row::F32(&v[range]),
        }
    }

    /// A copy of the vectors at `positions` (a tile; its position 0 is `positions.start` here).
    pub fn slice(&self, positions: std::ops::Range<usize>) -> Vectors {
        Vectors {
            dim: self.dim,
            values: self.values.slice(positions.start * self.dim..positions.end * self.dim),
            strings: self.strings.slice(positions.clone()),
            sets: self.sets.slice(positions.clone()),
            bits: self.bits.slice(positions.clone()),
            rows: self.rows[positions].to_vec(),
            skipped: 0,
            ..Default::default()
        }
    }

    /// A copy of the vectors at `positions`, in that order (its position i is `positions[i]` here).
    pub fn select(&self, positions: &[u32]) -> Vectors {
        Vectors {
            dim: self.dim,
            values: self.values.select(self.dim, positions),
            strings: self.strings.select(positions),
            sets: self.sets.select(positions),
            bits: self.bits.select(positions),
            rows: positions.iter().map(|&p| self.rows[p as usize]).collect(),
            skipped: self.skipped,
            ..Default::default()
        }
    }

    /// `dim`-dimensional vectors of `values` (row-major), numbered 0.. in input order.
    pub fn new(dim: usize, values: Vec<f64>) -> Vectors {
        Self::of(dim, Values::F64(values))
    }

    /// [`Vectors::new`] of values kept as they are, in f64 or f32.
    pub fn of(dim: usize, values: Values) -> Vectors {
        let rows = (0..values.len().checked_div(dim).unwrap_or(0) as u32).collect();
        Vectors { dim, values, rows, ..Default::default() }
    }

    /// No values, only the input row of each position (for mapping result positions to rows).
    pub fn numbering(rows: Vec<u32>) -> Vectors {
        Vectors { rows, ..Default::default() }
    }

    /// The input rows (of `num_rows`) that were skipped, ascending, whatever order the positions
    /// hold the rows in (keys put them in key order: exec/keyed.rs).
    pub fn skipped_rows(&self, num_rows: usize) -> Vec<u32> {
        let mut usable = vec![false; num_rows];
        for &row in &self.rows {
            if let Some(seen) = usable.get_mut(row as usize) {
                *seen = true;
            }
        }
        (0..num_rows as u32).filter(|&r| !usable[r as usize]).collect()
    }

    /// The `i`-th string (text metrics).
    #[inline]
    pub fn string(&self, i: usize) -> &[u32] {
        self.strings.get(i)
    }

    /// Whether these are bit strings (a bit column), not sets, strings or vectors.
    pub fn holds_bits(&self) -> bool {
        self.bits.words > 0
    }

    /// Bytes the rows take, whatever their kind.
    pub fn bytes(&self) -> usize {
        self.values.bytes()
            + self.strings.chars.len() * 4
            + self.strings.offsets.len() * 8
            + self.sets.bytes()
            + self.bits.bytes()
    }

    /// The mark these vectors are kept across queries under, if they are.
    pub fn resident(&self) -> Option<&Arc<ResidentMark>> {
        self.resident.as_ref()
    }

    /// What the layer of type `T` keeps built over these vectors for as long as they live (the
    /// indexes of index/kept.rs), made by `T::default()` on first use. These vectors do not know
    /// what is kept: a layer above stores its own type here, as a DataFusion session keeps its
    /// extensions by type.
    pub fn kept<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut kept = self.kept.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = kept.iter().find_map(|k| k.clone().downcast::<T>().ok()) {
            return found;
        }
        let made = Arc::new(T::default());
        kept.push(made.clone());
        made
    }

    /// The vectors scaled to unit length (row-major; cosine's chord space), computed once: the
    /// values must not change after the first call.
    pub fn unit_rows(&self) -> &[f64] {
        self.unit.get_or_init(|| self.unit_values())
    }

    /// A copy of the vectors scaled to unit length, each row divided by `√(Σx²)` summed in order
    /// (cosine's filter space, `backend::plan::FilterSpaces`, and [`Vectors::unit_rows`]).
    pub fn unit_values(&self) -> Vec<f64> {
        let mut values = self.values.to_f64().into_owned();
        values.par_chunks_mut(self.dim.max(1)).for_each(|row| {
            let norm = crate::op::dot(row, row).sqrt();
            row.iter_mut().for_each(|x| *x /= norm);
        });
        values
    }

    /// Whether each vector's input row is its position (no row skipped, none reordered), so the
    /// output takes a pair's columns at its positions without looking up `rows`; computed once:
    /// `rows` must not change after the first call.
    pub fn rows_are_positions(&self) -> bool {
        *self.rows_are_positions.get_or_init(|| self.rows.iter().enumerate().all(|(i, &row)| row as usize == i))
    }

    /// Per-dimension minimum and maximum of the vectors ([`Coords::extent`]; the grid's cost model
    /// reads it for every join), computed once: the values must not change after the first call.
    pub fn extent(&self) -> &(Vec<f64>, Vec<f64>) {
        self.extent.get_or_init(|| self.values.coords().extent(self.dim))
    }

    /// The mean of the vectors, per dimension (the GEMM-form filter's centre), computed once: the
    /// values must not change after the first call.
    pub fn mean(&self) -> &[f64] {
        self.mean.get_or_init(|| {
            if self.dim == 0 {
                return Vec::new();
            }
            // Sums of 4096-row blocks in parallel, added in block order: the same mean on any
            // number of threads.
            fn block_sums<T: Coord>(values: &[T], dim: usize) -> Vec<Vec<f64>> {
                values
                    .par_chunks(dim * 4096)
                    .map(|block| {
                        let mut sum = vec![0.0; dim];
                        for row in block.chunks_exact(dim) {
                            sum.iter_mut().zip(row).for_each(|(s, x)| *s += x.f64());
                        }
                        sum
                    })
                    .collect()
            }
            let blocks = match &self.values {
                Values::F64(v) => block_sums(v, self.dim),
                Values::F32(v) => block_sums(v, self.dim),
            };
            let mut sum = vec![0.0; self.dim];
            for block in blocks {
                sum.iter_mut().zip(block).for_each(|(s, b)| *s += b);
            }
            sum.iter().map(|s| s / self.len().max(1) as f64).collect()
        })
    }

    /// Marks these vectors as kept across queries: their values must not change from now on.
    pub(crate) fn mark_resident(&mut self) {
        self.resident = Some(Arc::new(ResidentMark));
    }

    /// Builds vectors from rows of already collected `batch` (one concatenated batch of the input),
    /// with `source` resolved against that batch's schema. `describe` names the input in errors,
    /// e.g. "sim_join: argument 'left'".
    pub fn from_batch(batch: &RecordBatch, source: &VectorSource, reject_zero: bool, describe: &str) -> Result<Self> {
        Self::from_source(batch.num_rows(), |i| Ok(batch.column(i).clone()), source, reject_zero, describe)
    }

    /// Builds vectors from the collected `batches` of one input, rows numbered across them in
    /// order. The common case, a dense list column (see [`dense_fixed_size_lists`]), is widened
    /// batch by batch straight into the result; anything else concatenates the source's columns
    /// (only those) first.
    pub fn from_batches(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        source: &VectorSource,
        reject_zero: bool,
        describe: &str,
    ) -> Result<Self> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if let VectorSource::List { index, .. } = source {
            let columns: Vec<ArrayRef> = batches.iter().map(|b| b.column(*index).clone()).collect();
            if rows <= u32::MAX as usize
                && let Some(mut vectors) = dense_fixed_size_lists(&columns)?
            {
                if reject_zero {
                    vectors.skip_zero_vectors();
                }
                return Ok(vectors);
            }
        }
        let column = |i: usize| -> Result<ArrayRef> {
            Ok(match batches {
                [] => new_empty_array(schema.field(i).data_type()),
                _ => concat(&batches.iter().map(|b| b.column(i).as_ref()).collect::<Vec<_>>())?,
            })
        };
        Self::from_source(rows, column, source, reject_zero, describe)
    }

    /// Vectors of `rows` rows from the input columns `column(i)` that `source` names.
    fn from_source(
        rows: usize,
        column: impl Fn(usize) -> Result<ArrayRef>,
        source: &VectorSource,
        reject_zero: bool,
        describe: &str,
    ) -> Result<Self> {
        if rows > u32::MAX as usize {
            return exec_err!("{describe}: {rows} rows exceed the limit of 2^32 - 1");
        }
        let mut vectors = match source {
            VectorSource::List { index, .. } => from_list(&column(*index)?, describe)?,
            VectorSource::Columns(indices) => {
                let columns = indices
                    .iter()
                    .map(|&i| Ok(cast(&column(i)?, &DataType::Float64)?))
                    .collect::<Result<Vec<ArrayRef>>>()?;
                from_columns(&columns, rows)
            }
            VectorSource::Text { index } => from_text(&column(*index)?, describe)?,
            VectorSource::Set { index } => {
                let (sets, rows, skipped) = sets::from_list(&column(*index)?, describe)?;
                Vectors { sets, rows, skipped, ..Default::default() }
            }
            VectorSource::Bits { index, .. } => {
                let (bits, rows, skipped) = bits::from_column(&column(*index)?, describe)?;
                Vectors { bits, rows, skipped, ..Default::default() }
            }
        };
        if reject_zero {
            vectors.skip_zero_vectors();
        }
        Ok(vectors)
    }

    /// Skips zero vectors (cosine has no direction for them).
    fn skip_zero_vectors(&mut self) {
        fn retain_nonzero<T: Coord>(values: &mut Vec<T>, rows: &mut Vec<u32>, dim: usize) {
            let mut kept = 0;
            for i in 0..rows.len() {
                if values[i * dim..(i + 1) * dim].iter().any(|x| x.f64() != 0.0) {
                    values.copy_within(i * dim..(i + 1) * dim, kept * dim);
                    rows[kept] = rows[i];
                    kept += 1;
                }
            }
            values.truncate(kept * dim);
            rows.truncate(kept);
        }
        self.mean = OnceLock::new();
        self.extent = OnceLock::new();
        let before = self.len();
        match &mut self.values {
            Values::F64(v) => retain_nonzero(v, &mut self.rows, self.dim),
            Values::F32(v) => retain_nonzero(v, &mut self.rows, self.dim),
        }
        self.skipped += before - self.len();
    }
}

fn from_text(column: &ArrayRef, describe: &str) -> Result<Vectors> {
    let mut out = Vectors::default();
    let mut add = |row: usize, s: Option<&str>| match s {
        Some(s) => {
            out.strings.push(s);
            out.rows.push(row as u32);
        }
        None => out.skipped += 1,
    };
    match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().iter().enumerate().for_each(|(r, s)| add(r, s)),
        DataType::LargeUtf8 => column.as_string::<i64>().iter().enumerate().for_each(|(r, s)| add(r, s)),
        DataType::Utf8View => column.as_string_view().iter().enumerate().for_each(|(r, s)| add(r, s)),
        other => return exec_err!("{describe}: column of type {other} is not text"),
    }
    Ok(out)
}

fn from_list(column: &ArrayRef, describe: &str) -> Result<Vectors> {
    if let Some(vectors) = dense_fixed_size_lists(std::slice::from_ref(column))? {
        return Ok(vectors);
    }
    // (start, end) of each row's values inside the flat child array.
    let (child, bounds): (ArrayRef, Vec<(usize, usize)>) = match column.data_type() {
        DataType::FixedSizeList(_, n) => {
            let list = column.as_fixed_size_list();
            let n = *n as usize;
            let offset = list.offset();
            let bounds = (0..list.len()).map(|i| ((offset + i) * n, (offset + i + 1) * n));
            (list.values().clone(), bounds.collect())
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
        other => return exec_err!("{describe}: column of type {other} is not a list"),
    };
    if fits_f32(child.data_type()) {
        let child = cast(&child, &DataType::Float32)?;
        let child = child.as_primitive::<Float32Type>();
        let (values, out) = list_rows(column, &bounds, child.values(), |j| child.is_valid(j), describe)?;
        return Ok(Vectors { values: Values::F32(values), ..out });
    }
    let child = cast(&child, &DataType::Float64)?;
    let child = child.as_primitive::<Float64Type>();
    let (values, out) = list_rows(column, &bounds, child.values(), |j| child.is_valid(j), describe)?;
    Ok(Vectors { values: Values::F64(values), ..out })
}

/// Whether every value of `t` is exactly an f32 (those inputs are kept in f32).
fn fits_f32(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Float32 | DataType::Float16 | DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16
    )
}

/// The usable rows of a list column whose row `r` holds `values[bounds[r].0..bounds[r].1]`
/// (`valid(j)`: value j is not NULL): their values, and the vectors' dimension, rows and skips.
fn list_rows<T: Coord>(
    column: &ArrayRef,
    bounds: &[(usize, usize)],
    values: &[T],
    valid: impl Fn(usize) -> bool,
    describe: &str,
) -> Result<(Vec<T>, Vectors)> {
    let mut kept = Vec::new();
    let mut out = Vectors::default();
    let mut first: Option<(usize, usize)> = None; // (row, len) of the first non-null vector
    for (row, &(start, end)) in bounds.iter().enumerate() {
        if column.is_null(row) {
            out.skipped += 1;
            continue;
        }
        let len = end - start;
        match first {
            None => {
                if len == 0 {
                    return exec_err!("{describe}: row {row} holds an empty vector");
                }
                first = Some((row, len));
                out.dim = len;
            }
            Some((first_row, first_len)) if first_len != len => {
                return exec_err!(
                    "{describe}: vectors of different lengths: row {first_row} has {first_len} \
                     values, row {row} has {len}"
                );
            }
            Some(_) => {}
        }
        let usable = (start..end).all(|j| valid(j) && values[j].f64().is_finite());
        if usable {
            kept.extend_from_slice(&values[start..end]);
            out.rows.push(row as u32);
        } else {
            out.skipped += 1;
        }
    }
    Ok((kept, out))
}

/// The common case in one parallel pass: FixedSizeList columns (one per batch of an input) of
/// Float32/Float64 with no NULL row or value and only finite values, copied into one row-major
/// buffer of their own type without concatenating the lists first (a 1M × 128 concatenation alone took longer
/// than the widening: docs/design.md#gpu-transfers). `None` sends the input through the general, row-by-row path.
fn dense_fixed_size_lists(columns: &[ArrayRef]) -> Result<Option<Vectors>> {
    let Some(DataType::FixedSizeList(field, n)) = columns.first().map(|c| c.data_type().clone()) else {
        return Ok(None);
    };
    let dim = n as usize;
    let element = field.data_type();
    let dense = |c: &ArrayRef| {
        c.data_type() == columns[0].data_type()
            && c.null_count() == 0
            && c.as_fixed_size_list().values().null_count() == 0
    };
    if dim == 0 || !matches!(element, DataType::Float32 | DataType::Float64) || !columns.iter().all(dense) {
        return Ok(None);
    }
    let values = match element {
        DataType::Float32 => dense_values::<Float32Type>(columns, dim, |x: f32| x.is_finite()).map(Values::F32),
        _ => dense_values::<Float64Type>(columns, dim, |x: f64| x.is_finite()).map(Values::F64),
    };
    Ok(values.map(|values| Vectors::of(dim, values)))
}

/// The values of FixedSizeList `columns` of `dim` elements of type `T`, checked by `finite` and
/// copied in parallel into one row-major buffer; `None` when a value is not finite.
fn dense_values<T: ArrowPrimitiveType>(
    columns: &[ArrayRef],
    dim: usize,
    finite: impl Fn(T::Native) -> bool + Sync,
) -> Option<Vec<T::Native>> {
    let children: Vec<ArrayRef> = columns
        .iter()
        .map(|column| {
            let list = column.as_fixed_size_list();
            list.values().slice(list.offset() * dim, list.len() * dim)
        })
        .collect();
    let sources: Vec<&[T::Native]> = children.iter().map(|child| child.as_primitive::<T>().values().as_ref()).collect();
    // Checked without an early exit within a block, which the compiler vectorises, and before
    // the copy, which then writes into fresh capacity instead of a zeroed buffer (a
    // short-circuiting check of each value, and the zeroing, each took a tenth of the time to
    // decode the column).
    let all_finite = sources
        .par_iter()
        .all(|from| from.par_chunks(1 << 16).all(|block| block.iter().fold(true, |all, &x| all & finite(x))));
    if !all_finite {
        return None;
    }
    let mut values = Vec::with_capacity(sources.iter().map(|s| s.len()).sum());
    for from in sources {
        values.par_extend(from.par_iter().copied());
    }
    Some(values)
}

/// The rows of `batches` (numbered across them) that the conversion skipped although their vector
/// is not NULL and holds no NULL — NaN or ±Inf values, zero vectors under cosine — with their
/// values widened to f64: SQL's scalar distance functions still compare them (see
/// `SimilarityOp::scalar_semantics`). `skipped` is [`Vectors::skipped_rows`].
pub fn skipped_values(batches: &[RecordBatch], source: &VectorSource, skipped: &[u32]) -> Result<Vec<(u32, Vec<f64>)>> {
    let mut out = Vec::new();
    let mut first_row = 0usize;
    let mut rest = skipped;
    for batch in batches {
        let rows = batch.num_rows();
        // This batch's skipped rows, numbered within it.
        let here = rest.partition_point(|&r| (r as usize) < first_row + rows);
        let skipped: Vec<usize> = rest[..here].iter().map(|&r| r as usize - first_row).collect();
        rest = &rest[here..];
        if !skipped.is_empty() {
            match source {
                VectorSource::List { index, .. } => {
                    let column = batch.column(*index);
                    for &i in &skipped {
                        if column.is_null(i) {
                            continue;
                        }
                        let value = match column.data_type() {
                            DataType::FixedSizeList(..) => column.as_fixed_size_list().value(i),
                            DataType::List(_) => column.as_list::<i32>().value(i),
                            _ => column.as_list::<i64>().value(i),
                        };
                        let value = cast(&value, &DataType::Float64)?;
                        if value.null_count() == 0 {
                            out.push(((first_row + i) as u32, value.as_primitive::<Float64Type>().values().to_vec()));
                        }
                    }
                }
                VectorSource::Columns(indices) => {
                    let columns = indices
                        .iter()
                        .map(|&c| cast(batch.column(c), &DataType::Float64))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    let columns: Vec<_> = columns.iter().map(|c| c.as_primitive::<Float64Type>()).collect();
                    for &i in &skipped {
                        if columns.iter().all(|c| c.is_valid(i)) {
                            out.push(((first_row + i) as u32, columns.iter().map(|c| c.value(i)).collect()));
                        }
                    }
                }
                // Only NULL strings, sets and bit strings are skipped, which SQL never compares.
                VectorSource::Text { .. } | VectorSource::Set { .. } | VectorSource::Bits { .. } => {}
            }
        }
        first_row += rows;
    }
    Ok(out)
}

fn from_columns(columns: &[ArrayRef], num_rows: usize) -> Vectors {
    let columns: Vec<_> = columns.iter().map(|c| c.as_primitive::<Float64Type>()).collect();
    let mut out = Vectors { dim: columns.len(), ..Default::default() };
    let mut values = Vec::with_capacity(num_rows * columns.len());
    for row in 0..num_rows {
        let usable = columns.iter().all(|c| c.is_valid(row) && c.value(row).is_finite());
        if usable {
            values.extend(columns.iter().map(|c| c.value(row)));
            out.rows.push(row as u32);
        } else {
            out.skipped += 1;
        }
    }
    out.values = Values::F64(values);
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, RecordBatch};
    use datafusion::arrow::array::{Float32Array, Float64Array, ListArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{DataType, Float32Type};
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::Vectors;
    use crate::vectors::source::VectorSource;
    use crate::vectors::values::Values;

    #[test]
    fn lists_skip_null_and_non_finite_rows() {
        let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            None,
            Some(vec![Some(3.0), None]),
            Some(vec![Some(f32::NAN), Some(1.0)]),
            Some(vec![Some(5.0), Some(6.0)]),
        ]);
        let batch = RecordBatch::try_from_iter([("v", Arc::new(list) as ArrayRef)]).unwrap();
        let source = VectorSource::resolve(&batch.schema(), None, crate::op::Metric::L2, "knn", "base").unwrap();
        let v = Vectors::from_batch(&batch, &source, false, "knn: argument 'base'").unwrap();
        assert_eq!((v.dim, v.rows.clone(), v.skipped), (2, vec![0, 4], 3));
        assert_eq!(v.values, Values::F32(vec![1.0, 2.0, 5.0, 6.0]));
    }

    #[test]
    fn float16_lists_are_kept_exactly_in_f32_and_32_bit_integers_in_f64() {
        let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(0.5), Some(-2.0)]),
            Some(vec![Some(1.25), Some(65504.0)]),
        ]);
        let half = DataType::new_list(DataType::Float16, true);
        let column = cast(&(Arc::new(list) as ArrayRef), &half).unwrap();
        let batch = RecordBatch::try_from_iter([("v", column)]).unwrap();
        let source = VectorSource::resolve(&batch.schema(), None, crate::op::Metric::L2, "knn", "base").unwrap();
        let v = Vectors::from_batch(&batch, &source, false, "knn: argument 'base'").unwrap();
        assert_eq!(v.values, Values::F32(vec![0.5, -2.0, 1.25, 65504.0]));
        let ints =
            datafusion::arrow::array::ListArray::from_iter_primitive::<datafusion::arrow::datatypes::Int32Type, _, _>(
                vec![Some(vec![Some(16_777_217), Some(-3)])],
            );
        let batch = RecordBatch::try_from_iter([("v", Arc::new(ints) as ArrayRef)]).unwrap();
        let v = Vectors::from_batch(&batch, &source, false, "knn: argument 'base'").unwrap();
        assert_eq!(v.values, Values::F64(vec![16_777_217.0, -3.0]));
    }

    #[test]
    fn ragged_lists_are_an_error() {
        let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(1.0)]),
        ]);
        let batch = RecordBatch::try_from_iter([("v", Arc::new(list) as ArrayRef)]).unwrap();
        let source = VectorSource::resolve(&batch.schema(), None, crate::op::Metric::L2, "knn", "base").unwrap();
        let err = Vectors::from_batch(&batch, &source, false, "knn: argument 'base'").unwrap_err();
        assert!(err.to_string().contains("vectors of different lengths: row 0 has 2 values, row 1 has 1"), "{err}");
    }

    #[test]
    fn batches_are_widened_in_order_with_rows_numbered_across_them() {
        use datafusion::arrow::array::FixedSizeListArray;
        let list = |rows: Vec<Option<Vec<Option<f32>>>>| {
            let array = FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(rows, 2);
            RecordBatch::try_from_iter_with_nullable([("v", Arc::new(array) as ArrayRef, true)]).unwrap()
        };
        let whole = list((0..7).map(|i| Some(vec![Some(i as f32), Some(-(i as f32))])).collect());
        // Slices (offsets into one child array), as a scan hands them over.
        let parts = [whole.slice(0, 3), whole.slice(3, 0), whole.slice(3, 4)];
        let source = VectorSource::resolve(&whole.schema(), None, crate::op::Metric::L2, "knn", "base").unwrap();
        let dense = Vectors::from_batches(&whole.schema(), &parts, &source, false, "knn").unwrap();
        assert_eq!(dense.values, Values::F32((0..7).flat_map(|i| [i as f32, -(i as f32)]).collect()));
        assert_eq!((dense.rows, dense.skipped), ((0..7).collect(), 0));
        // A NULL row in a later batch: the general path, rows still numbered across the batches.
        let with_null =
            [list(vec![Some(vec![Some(1.0), Some(2.0)])]), list(vec![None, Some(vec![Some(0.0), Some(0.0)])])];
        let general = Vectors::from_batches(&whole.schema(), &with_null, &source, true, "knn").unwrap();
        assert_eq!((general.values, general.rows, general.skipped), (Values::F32(vec![1.0, 2.0]), vec![0], 2));
    }

    #[test]
    fn float_columns_form_the_vector_and_zero_vectors_can_be_rejected() {
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(datafusion::arrow::array::Int64Array::from(vec![1, 2])) as ArrayRef),
            ("x", Arc::new(Float32Array::from(vec![0.0, 1.5])) as ArrayRef),
            ("y", Arc::new(Float64Array::from(vec![0.0, 2.5])) as ArrayRef),
        ])
        .unwrap();
        let source = VectorSource::resolve(&batch.schema(), None, crate::op::Metric::L2, "sim_join", "t").unwrap();
        assert_eq!(source, VectorSource::Columns(vec![1, 2]));
        let v = Vectors::from_batch(&batch, &source, true, "sim_join: argument 't'").unwrap();
        assert_eq!((v.rows.clone(), v.skipped, v.values.clone()), (vec![1], 1, Values::F64(vec![1.5, 2.5])));
        // The same rows in two batches (only the source's columns are concatenated), and none.
        let parts = [batch.slice(0, 1), batch.slice(1, 1)];
        let split = Vectors::from_batches(&batch.schema(), &parts, &source, true, "sim_join: argument 't'").unwrap();
        assert_eq!((split.rows, split.skipped, split.values), (vec![1], 1, Values::F64(vec![1.5, 2.5])));
        let empty = Vectors::from_batches(&batch.schema(), &[], &source, true, "sim_join: argument 't'").unwrap();
        assert!(empty.is_empty() && empty.skipped == 0);
    }

    #[test]
    fn unknown_and_ambiguous_columns_are_planning_errors() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::new_list(DataType::Float32, true), true),
            Field::new("b", DataType::new_list(DataType::Float32, true), true),
        ]);
        let err = VectorSource::resolve(&schema, None, crate::op::Metric::L2, "knn", "base").unwrap_err();
        assert!(err.to_string().contains("has several vector columns (a, b)"), "{err}");
        let err = VectorSource::resolve(&schema, Some("c"), crate::op::Metric::L2, "knn", "base").unwrap_err();
        assert!(err.to_string().contains("has no column 'c' (columns: a, b)"), "{err}");
    }
}
