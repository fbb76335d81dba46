//! What every worker of a CPU join shares: the request, its exact test, the candidates counter
//! and the sink, with the writes every join strategy makes the same way.

use std::sync::atomic::AtomicU64;

use datafusion::common::Result;

use crate::backend::plan::exact::{ExactCheck, write_self_pairs};
use crate::backend::{JoinRequest, PairWriter, ResultSink};

/// Left rows per join tile (brute-force joins and range queries).
pub(crate) const TILE_QUERIES: usize = 64;

/// Everything a join worker needs.
pub(crate) struct JoinContext<'a> {
    pub(crate) request: &'a JoinRequest<'a>,
    pub(crate) exact: &'a ExactCheck,
    pub(crate) candidates: &'a AtomicU64,
    pub(crate) sink: &'a dyn ResultSink,
}

impl JoinContext<'_> {
    pub(crate) fn writer(&self) -> PairWriter<'_> {
        PairWriter::new(self.sink, self.request.self_join.is_some_and(|s| s.ordered))
    }

    /// Writes a self-join pair with its smaller position first.
    #[inline]
    pub(crate) fn push(&self, writer: &mut PairWriter, a: u32, b: u32, distance: f64) -> Result<()> {
        if self.request.self_join.is_some() && a > b {
            writer.push(b, a, distance)
        } else {
            writer.push(a, b, distance)
        }
    }

    /// Self-join with `include_self`: each vector against itself, by the same exact test.
    pub(crate) fn self_pairs(&self, positions: impl IntoIterator<Item = usize>, writer: &mut PairWriter) -> Result<()> {
        if !self.request.self_join.is_some_and(|s| s.include_self) {
            return Ok(());
        }
        write_self_pairs(self.exact, self.request.left, positions, writer)
    }
}
