//! The one integration-test binary (DataFusion links once); each module is one area.

#[path = "integration/approx.rs"]
mod approx;
#[cfg(feature = "cluster")]
#[path = "integration/cluster.rs"]
mod cluster;
#[path = "integration/clusters.rs"]
mod clusters;
#[path = "integration/common.rs"]
mod common;
#[path = "integration/directory.rs"]
mod directory;
#[path = "integration/distance_functions.rs"]
mod distance_functions;
#[path = "integration/edge_cases.rs"]
mod edge_cases;
#[path = "integration/embedding.rs"]
mod embedding;
#[path = "integration/errors.rs"]
mod errors;
#[path = "integration/explain.rs"]
mod explain;
#[path = "integration/files.rs"]
mod files;
#[cfg(feature = "server")]
#[path = "integration/flight.rs"]
mod flight;
#[cfg(feature = "server")]
#[path = "integration/flight_access.rs"]
mod flight_access;
#[path = "integration/gpu_selftest.rs"]
mod gpu_selftest;
#[path = "integration/oracle.rs"]
mod oracle;
#[path = "integration/pushdown.rs"]
mod pushdown;
#[path = "integration/rewrite.rs"]
mod rewrite;
#[path = "integration/sets_bits.rs"]
mod sets_bits;
#[path = "integration/sql_examples.rs"]
mod sql_examples;
#[path = "integration/streamed_base.rs"]
mod streamed_base;
#[path = "integration/streaming.rs"]
mod streaming;
#[path = "integration/summary.rs"]
mod summary;
#[path = "integration/text.rs"]
mod text;
