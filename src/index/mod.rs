//! Indexes shared by the backends: the ε-grid over vectors, the segment filter over strings, the
//! List of Clusters over any metric, and the Multicurves index of approximate kNN with its kNN graph.

pub mod codes;
pub mod curve_keys;
pub mod curves;
pub mod directory;
pub mod graph;
pub mod grid;
pub mod kept;
pub mod list_of_clusters;
pub mod pages;
pub mod segments;
pub mod stored;

pub use directory::{DIRECTORY_BLOCK, DirectoryShape, JoinDirectories};
pub use grid::brute_force_run_ns;
pub use grid::{CostInputs, GridGeometry, GridIndex, JoinStrategy, estimate_strategy};
pub use kept::KeptIndexes;
