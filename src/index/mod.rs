//! Indexes shared by the backends: the ε-grid over vectors, the segment filter over strings.

pub mod grid;
pub mod segments;

pub use grid::{CostInputs, GridGeometry, GridIndex, JoinStrategy, brute_force_ns, choose_strategy, estimate_strategy};
