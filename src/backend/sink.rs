//! How a backend hands results back: chunks through a [`ResultSink`], so results never need to
//! fit in memory, the sinks that shift or map a part's chunks, and the writer that fills chunks
//! of pairs (or counts them where the consumer wants no rows).

use datafusion::common::Result;

/// A piece of the result: parallel columns of vector positions (not input rows), distances and,
/// for kNN, ranks. `left` is the query side of range and kNN results.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ResultChunk {
    /// Position of the left (query) vector in its [`Vectors`].
    pub left: Vec<u32>,
    /// Position of the right (base) vector in its [`Vectors`].
    pub right: Vec<u32>,
    /// Exact distance of the pair.
    pub distance: Vec<f64>,
    /// kNN only: 1 for the nearest neighbour of the query.
    pub rank: Vec<u32>,
    /// A clustering (`dbscan`) only: each row's cluster as the position of its root, the cluster's
    /// first core row ([`NOISE`] for a row of none), beside `left`, the row's own position.
    pub cluster: Vec<u32>,
    /// A clustering only: whether the row is a core row.
    pub core: Vec<bool>,
    /// Result rows counted but not listed, beyond those listed: sent only to a sink that wants
    /// less than the rows ([`ResultSink::wants`]).
    pub counted: u64,
    /// The smallest and largest distance of the counted rows, in IEEE 754's total order (as
    /// Arrow's `min`/`max` order floats), where the sink wants them ([`Wanted::CountAndRange`]).
    pub counted_range: Option<(f64, f64)>,
}

/// The cluster of a row in no cluster (DBSCAN's noise).
pub const NOISE: u32 = u32::MAX;

impl ResultChunk {
    /// Number of result rows.
    pub fn len(&self) -> usize {
        self.left.len()
    }

    /// Whether the chunk holds no row.
    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// Widens `counted_range` to take in `distance`.
    #[inline]
    pub fn widen_range(&mut self, distance: f64) {
        self.counted_range = Some(widened(self.counted_range, distance));
    }

    pub(crate) fn with_capacity(rows: usize) -> Self {
        Self {
            left: Vec::with_capacity(rows),
            right: Vec::with_capacity(rows),
            distance: Vec::with_capacity(rows),
            ..Self::default()
        }
    }
}

/// `range` (smallest, largest) widened to take in `distance`, in IEEE 754's total order.
#[inline]
pub fn widened(range: Option<(f64, f64)>, distance: f64) -> (f64, f64) {
    match range {
        None => (distance, distance),
        Some((low, high)) => (
            if distance.total_cmp(&low).is_lt() { distance } else { low },
            if distance.total_cmp(&high).is_gt() { distance } else { high },
        ),
    }
}

/// What the consumer of a run's results needs of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Every result row.
    Rows,
    /// How many result rows there are (the output projects no column: `SELECT count(*) FROM
    /// sim_join(…)`): a join may count its pairs ([`ResultChunk::counted`]) instead of listing
    /// them, decided by the same exact test.
    Count,
    /// How many, and the smallest and largest distance among them (`count(*)`, `min(distance)`,
    /// `max(distance)` over a join, computed in the operator: exec/summary.rs): a join may count
    /// its pairs and widen [`ResultChunk::counted_range`] instead of listing them.
    CountAndRange,
}

/// Where a backend sends results. Implementations block while the consumer is behind (so memory
/// stays bounded) and fail once the consumer is gone (so cancelled queries stop working).
pub trait ResultSink: Sync {
    /// Hands one chunk downstream.
    fn send(&self, chunk: ResultChunk) -> Result<()>;
    /// Rows per chunk the consumer wants.
    fn chunk_rows(&self) -> usize;
    /// What the consumer needs of the results; a backend may always list rows instead.
    fn wants(&self) -> Wanted {
        Wanted::Rows
    }
    /// Announces how many units of work (cells, query blocks) the run has.
    fn start(&self, _total_units: u64) {}
    /// Reports units of work done.
    fn advance(&self, _units: u64) {}
}

/// A part's results with its positions shifted to the whole inputs': left (query) positions by
/// `left`, right (base) positions by `right`.
pub(crate) struct ShiftedSink<'a> {
    pub inner: &'a dyn ResultSink,
    pub left: u32,
    pub right: u32,
}

impl ResultSink for ShiftedSink<'_> {
    fn send(&self, mut chunk: ResultChunk) -> Result<()> {
        chunk.left.iter_mut().for_each(|p| *p += self.left);
        // A clustering's roots are positions of its one input, as `left` is.
        chunk.cluster.iter_mut().filter(|p| **p != NOISE).for_each(|p| *p += self.left);
        if self.right != 0 {
            chunk.right.iter_mut().for_each(|p| *p += self.right);
        }
        self.inner.send(chunk)
    }

    fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows()
    }

    fn wants(&self) -> Wanted {
        self.inner.wants()
    }

    fn advance(&self, units: u64) {
        self.inner.advance(units);
    }
}

/// A sink passing each chunk through `map` on its way to `inner` (`None`: nothing to pass on);
/// the rest of the sink's calls go straight through.
pub(crate) struct MapSink<'a, F> {
    pub inner: &'a dyn ResultSink,
    pub map: F,
    /// Whether `map` passes counted chunks on as they are (it keeps every row): only then may the
    /// backend count instead of listing, where `inner` wants less than the rows.
    pub passes_counts: bool,
}

impl<F: Fn(ResultChunk) -> Option<ResultChunk> + Sync> ResultSink for MapSink<'_, F> {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        match (self.map)(chunk) {
            Some(chunk) => self.inner.send(chunk),
            None => Ok(()),
        }
    }

    fn chunk_rows(&self) -> usize {
        self.inner.chunk_rows()
    }

    fn wants(&self) -> Wanted {
        if self.passes_counts { self.inner.wants() } else { Wanted::Rows }
    }

    fn start(&self, total_units: u64) {
        self.inner.start(total_units)
    }

    fn advance(&self, units: u64) {
        self.inner.advance(units)
    }
}

/// Collects pairs into chunks of the sink's size and sends each full one; where the sink wants
/// less than the rows ([`ResultSink::wants`]), counts them (and widens their distance range) and
/// sends that at the flush.
pub(crate) struct PairWriter<'s> {
    sink: &'s dyn ResultSink,
    chunk: ResultChunk,
    rows: usize,
    /// Also write (b, a) for each (a, b) (ordered self-join).
    mirror: bool,
    wants: Wanted,
}

impl<'s> PairWriter<'s> {
    pub(crate) fn new(sink: &'s dyn ResultSink, mirror: bool) -> Self {
        let wants = sink.wants();
        let rows = if wants == Wanted::Rows { sink.chunk_rows().max(2) } else { 0 };
        Self { sink, chunk: ResultChunk::with_capacity(rows), rows, mirror, wants }
    }

    /// Whether pairs are counted rather than listed, with no distance needed.
    #[inline]
    pub(crate) fn counts_only(&self) -> bool {
        self.wants == Wanted::Count
    }

    /// Counts `pairs` pairs found without their distances (only where [`PairWriter::counts_only`]);
    /// `distinct` of them have two different positions, each also counted the other way round
    /// when mirrored.
    #[inline]
    pub(crate) fn count(&mut self, pairs: u64, distinct: u64) {
        debug_assert!(self.counts_only());
        self.add_counted(pairs, distinct);
    }

    #[inline]
    fn add_counted(&mut self, pairs: u64, distinct: u64) {
        self.chunk.counted += pairs + if self.mirror { distinct } else { 0 };
    }

    /// Writes the pair (and its mirror image when asked and `a != b`).
    #[inline]
    pub(crate) fn push(&mut self, a: u32, b: u32, distance: f64) -> Result<()> {
        match self.wants {
            Wanted::Rows => {}
            Wanted::Count => {
                self.count(1, u64::from(a != b));
                return Ok(());
            }
            Wanted::CountAndRange => {
                self.add_counted(1, u64::from(a != b));
                self.chunk.widen_range(distance);
                return Ok(());
            }
        }
        self.chunk.left.push(a);
        self.chunk.right.push(b);
        self.chunk.distance.push(distance);
        if self.mirror && a != b {
            self.chunk.left.push(b);
            self.chunk.right.push(a);
            self.chunk.distance.push(distance);
        }
        if self.chunk.len() + 1 >= self.rows { self.flush() } else { Ok(()) }
    }

    /// Writes the pairs `(lefts[i], rights[i])` at `distances[i]`, a self-join's (`lower_first`)
    /// with its smaller position first: the rows that pushing them one by one writes, copied into
    /// the chunk a slice at a time where they are listed unmirrored (the GPU's downloaded pairs:
    /// pushed one by one, they took a third of the emitting workers' time, docs/design.md,
    /// docs/design.md#results).
    #[cfg(any(feature = "gpu", test))]
    pub(crate) fn push_slices(
        &mut self,
        lefts: &[u32],
        rights: &[u32],
        distances: &[f64],
        lower_first: bool,
    ) -> Result<()> {
        let ordered = |(&a, &b): (&u32, &u32)| if lower_first && a > b { (b, a) } else { (a, b) };
        if self.wants != Wanted::Rows || self.mirror {
            for (pair, &d) in lefts.iter().zip(rights).zip(distances) {
                let (a, b) = ordered(pair);
                self.push(a, b, d)?;
            }
            return Ok(());
        }
        let mut at = 0;
        while at < lefts.len() {
            // `push` sends a chunk once it holds `rows - 1` rows (room for a mirrored pair).
            let end = (at + (self.rows - 1).saturating_sub(self.chunk.len()).max(1)).min(lefts.len());
            let (l, r) = (&lefts[at..end], &rights[at..end]);
            if lower_first {
                self.chunk.left.extend(l.iter().zip(r).map(|(&a, &b)| a.min(b)));
                self.chunk.right.extend(l.iter().zip(r).map(|(&a, &b)| a.max(b)));
            } else {
                self.chunk.left.extend_from_slice(l);
                self.chunk.right.extend_from_slice(r);
            }
            self.chunk.distance.extend_from_slice(&distances[at..end]);
            at = end;
            if self.chunk.len() + 1 >= self.rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Sends what is buffered.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.chunk.is_empty() && self.chunk.counted == 0 {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.chunk, ResultChunk::with_capacity(self.rows));
        self.sink.send(full)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::PairWriter;
    use crate::backend::plan::topk::Collector;

    /// Pairs written a slice at a time are sent in the chunks, row for row, that pushing them one
    /// by one sends: mirrored or not, a self-join's smaller position first or not.
    #[test]
    fn pairs_written_by_slices_are_the_pairs_pushed_one_by_one() {
        let n = 1000;
        let lefts: Vec<u32> = (0..n).map(|i| (i * 7919 % 1000) as u32).collect();
        let rights: Vec<u32> = (0..n).map(|i| (i * 104_729 % 997) as u32).collect();
        let distances: Vec<f64> = (0..n).map(|i| i as f64 / 7.0).collect();
        for (mirror, lower_first) in [(false, false), (false, true), (true, true)] {
            let chunks = |by_slices: bool| {
                let sink = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: 64 };
                let mut writer = PairWriter::new(&sink, mirror);
                if by_slices {
                    for at in (0..n).step_by(300) {
                        let end = (at + 300).min(n);
                        let slices = (&lefts[at..end], &rights[at..end], &distances[at..end]);
                        writer.push_slices(slices.0, slices.1, slices.2, lower_first).unwrap();
                    }
                } else {
                    for i in 0..n {
                        let (a, b) = (lefts[i], rights[i]);
                        let (a, b) = if lower_first && a > b { (b, a) } else { (a, b) };
                        writer.push(a, b, distances[i]).unwrap();
                    }
                }
                writer.flush().unwrap();
                let chunks = sink.chunks.into_inner().unwrap();
                chunks.into_iter().map(|c| (c.left, c.right, c.distance)).collect::<Vec<_>>()
            };
            let (sliced, pushed) = (chunks(true), chunks(false));
            assert!(pushed.len() > 10);
            assert_eq!(sliced, pushed, "mirror={mirror}, lower_first={lower_first}");
        }
    }
}
