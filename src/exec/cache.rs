//! Converted vectors kept across queries (`simjoin.cache_size`). An input whose arrays outlive the
//! query — an in-memory table's (`MemTable`, `CREATE TABLE … AS`) — is converted once (to f32 where
//! its type fits f32 exactly, else f64); its later queries start from the same vectors, and on the
//! GPU from the same rows still on the device (copying a 1M × 128 base over the bus takes longer
//! than the tensor cores' whole kNN, so resident vectors are a requirement). The cache is the session's
//! ([`VectorCache`], added by `simjoin::register`): its `cache_size` bounds its own entries, and a
//! table of one session is never found through another. Its entries carry the indexes built over
//! them (grid, List of Clusters, Multicurves) and keep their rows resident on the GPU, whose
//! memory the device governs for the whole process (cuda/device.rs).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayData, ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::Result;

use crate::vectors::{VectorSource, Vectors};

/// Which arrays vectors were converted from: for each array its type, and its offset, length and
/// every buffer's address and length, its children's too. An entry holds the arrays themselves,
/// so these buffers stay allocated while it lives, and Arrow buffers are never written: arrays of
/// an equal identity hold equal values.
#[derive(Debug, PartialEq)]
struct InputIdentity {
    source: VectorSource,
    reject_zero: bool,
    types: Vec<DataType>,
    layout: Vec<usize>,
}

struct Entry {
    identity: InputIdentity,
    /// Keeps the identity's buffers allocated.
    _arrays: Vec<ArrayRef>,
    vectors: Arc<Vectors>,
    bytes: usize,
    last_used: u64,
}

#[derive(Default)]
struct Cache {
    entries: Vec<Entry>,
    clock: u64,
}

/// One session's converted vectors kept across its queries, shared by the copies of its
/// configuration that each query's tasks get (a `SessionConfig` extension).
#[derive(Default)]
pub struct VectorCache {
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for VectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("VectorCache").field("entries", &cache.entries.len()).finish()
    }
}

/// The vectors of one input's collected `batches` (see [`Vectors::from_batches`]) and whether they
/// came from the cache. Inputs whose buffers nothing outside this query holds (a file's, decoded
/// for this query alone) are converted and not kept: no later query could present the same
/// arrays. Kept vectors take at most `capacity` bytes of the session's `cache` in all, the least
/// recently used going first; 0 (or no cache) keeps none.
pub(super) fn vectors(
    cache: Option<&VectorCache>,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    source: &VectorSource,
    reject_zero: bool,
    describe: &str,
    capacity: usize,
) -> Result<(Arc<Vectors>, bool)> {
    let columns = source_columns(batches, source);
    let keepable = capacity > 0 && !columns.is_empty() && columns.iter().all(|c| held_elsewhere(c));
    let Some(VectorCache { cache }) = cache.filter(|_| keepable) else {
        return Ok((Arc::new(Vectors::from_batches(schema, batches, source, reject_zero, describe)?), false));
    };
    let arrays: Vec<ArrayRef> = columns.into_iter().cloned().collect();
    let identity = input_identity(&arrays, source, reject_zero);
    {
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.clock += 1;
        let now = cache.clock;
        if let Some(entry) = cache.entries.iter_mut().find(|e| e.identity == identity) {
            entry.last_used = now;
            return Ok((entry.vectors.clone(), true));
        }
    }
    // Converted outside the lock: two queries converting the same input at once both convert.
    let mut vectors = Vectors::from_batches(schema, batches, source, reject_zero, describe)?;
    // The arrays count too: the entry keeps them allocated, even once their table is gone.
    let bytes = vectors.bytes() + vectors.rows.len() * 4 + buffer_bytes(&arrays);
    if bytes > capacity {
        return Ok((Arc::new(vectors), false));
    }
    vectors.mark_resident();
    let vectors = Arc::new(vectors);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if !cache.entries.iter().any(|e| e.identity == identity) {
        let last_used = cache.clock;
        cache.entries.push(Entry { identity, _arrays: arrays, vectors: vectors.clone(), bytes, last_used });
        evict(&mut cache.entries, capacity);
    }
    Ok((vectors, false))
}

/// Bytes of the distinct buffers of `arrays` (slices of one batch share theirs).
fn buffer_bytes(arrays: &[ArrayRef]) -> usize {
    fn add(data: &ArrayData, seen: &mut HashSet<usize>, total: &mut usize) {
        let buffers = data.buffers().iter().chain(data.nulls().map(|n| n.buffer()));
        for buffer in buffers {
            if seen.insert(buffer.data_ptr().as_ptr() as usize) {
                *total += buffer.capacity();
            }
        }
        data.child_data().iter().for_each(|c| add(c, seen, total));
    }
    let (mut seen, mut total) = (HashSet::new(), 0);
    arrays.iter().for_each(|a| add(&a.to_data(), &mut seen, &mut total));
    total
}

/// Drops the least recently used entries until the rest take at most `capacity` bytes.
fn evict(entries: &mut Vec<Entry>, capacity: usize) {
    while entries.iter().map(|e| e.bytes).sum::<usize>() > capacity {
        let Some(oldest) = entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i) else { return };
        entries.swap_remove(oldest);
    }
}

/// The columns `source` reads, of every batch.
fn source_columns<'a>(batches: &'a [RecordBatch], source: &VectorSource) -> Vec<&'a ArrayRef> {
    let indices = match source {
        VectorSource::List { index, .. }
        | VectorSource::Text { index }
        | VectorSource::Set { index }
        | VectorSource::Bits { index, .. } => std::slice::from_ref(index),
        VectorSource::Columns(indices) => indices.as_slice(),
    };
    batches.iter().flat_map(|b| indices.iter().map(|&i| b.column(i))).collect()
}

/// Whether something other than this query's collected batch holds the column's values: an
/// in-memory table's scans yield its own arrays (clones of its batches) or slices of them (the
/// same buffers); a file's arrays are decoded for this query alone.
fn held_elsewhere(column: &ArrayRef) -> bool {
    Arc::strong_count(column) > 1 || buffers_shared(&column.to_data())
}

/// Whether every buffer of `data` (a copy of an array's data: each buffer has one reference from
/// the array and one from the copy), children included, has a third holder.
fn buffers_shared(data: &ArrayData) -> bool {
    let parts = data.buffers().len() + data.child_data().len();
    parts > 0 && data.buffers().iter().all(|b| b.strong_count() > 2) && data.child_data().iter().all(buffers_shared)
}

fn input_identity(arrays: &[ArrayRef], source: &VectorSource, reject_zero: bool) -> InputIdentity {
    let mut identity = InputIdentity { source: source.clone(), reject_zero, types: Vec::new(), layout: Vec::new() };
    for array in arrays {
        identity.types.push(array.data_type().clone());
        layout(&array.to_data(), &mut identity.layout);
    }
    identity
}

fn layout(data: &ArrayData, out: &mut Vec<usize>) {
    out.extend([data.offset(), data.len(), data.buffers().len(), data.child_data().len()]);
    match data.nulls() {
        Some(nulls) => out.extend([nulls.buffer().as_ptr() as usize, nulls.offset(), nulls.len()]),
        None => out.extend([0, 0, 0]),
    }
    for buffer in data.buffers() {
        out.extend([buffer.as_ptr() as usize, buffer.len()]);
    }
    for child in data.child_data() {
        layout(child, out);
    }
}
