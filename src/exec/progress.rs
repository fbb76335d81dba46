//! Progress reporting: a program (the CLI's progress bar) adds a [`Progress`] to the session config
//! (`SessionConfig::with_extension`) and hears how far each running operator is.

use std::fmt::Debug;
use std::sync::Arc;

/// Hears about the progress of a running similarity operator.
pub trait ProgressListener: Debug + Send + Sync {
    /// A run of `function` with `total` units of work (cells or query blocks) starts.
    fn start(&self, function: &str, total: u64);
    /// `units` more are done.
    fn advance(&self, units: u64);
    /// The run ended (finished, failed or cancelled).
    fn finish(&self);
}

/// The session-config extension that carries a [`ProgressListener`].
#[derive(Debug, Clone)]
pub struct Progress(pub Arc<dyn ProgressListener>);
