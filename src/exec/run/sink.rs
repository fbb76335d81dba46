//! The sink between a run's backend and its output stream.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use tokio::sync::mpsc;

use crate::backend::{ResultChunk, ResultSink, Wanted};
use crate::exec::progress::ProgressListener;
use crate::results::{BatchBuilder, SideData};

/// Turns each chunk into batches on the thread that sends it — the backend's workers, in
/// parallel, rather than the one consumer (docs/design.md#results) — and sends them to the
/// output stream, blocking while it is two chunks behind.
pub(super) struct ChannelSink {
    pub(super) sender: mpsc::Sender<Result<Vec<RecordBatch>>>,
    pub(super) builder: BatchBuilder,
    /// The left and right inputs the batches take their columns from.
    pub(super) sides: (SideData, SideData),
    pub(super) chunk_rows: usize,
    pub(super) wants: Wanted,
    pub(super) progress: Option<Arc<dyn ProgressListener>>,
    pub(super) function: &'static str,
}

impl ResultSink for ChannelSink {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        let batches = self.builder.build(&chunk, &self.sides.0, &self.sides.1)?;
        self.sender
            .blocking_send(Ok(batches))
            .map_err(|_| DataFusionError::Execution(format!("{}: query cancelled", self.function)))
    }

    fn chunk_rows(&self) -> usize {
        self.chunk_rows
    }

    fn wants(&self) -> Wanted {
        self.wants
    }

    fn start(&self, total_units: u64) {
        if let Some(p) = &self.progress {
            p.start(self.function, total_units);
        }
    }

    fn advance(&self, units: u64) {
        if let Some(p) = &self.progress {
            p.advance(units);
        }
    }
}
