//! Spatial indexes shared by the CPU and GPU backends.

pub mod grid;

pub use grid::{CostInputs, GridGeometry, GridIndex, JoinStrategy, brute_force_ns, choose_strategy, estimate_strategy};
