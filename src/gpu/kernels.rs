//! The kernel sources build.rs embeds, and the entry points the Rust side launches.

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// A CUDA source file compiled as one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelModule {
    /// `kernels/sim_join.cu`: ε-join and range-query kernels.
    SimJoin,
    /// `kernels/knn.cu`: kNN's sampled radii (the candidates come from `brute_join`) and the
    /// ranking of candidate slots and of the write passes' lists.
    Knn,
    /// `kernels/grid.cu`: the ε-grid built on the device (radix sort of the points by cell, the
    /// cells' bounds, rows gathered into slot order).
    Grid,
}

impl KernelModule {
    /// Every module.
    pub const ALL: [KernelModule; 3] = [KernelModule::SimJoin, KernelModule::Knn, KernelModule::Grid];

    /// The flattened source.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::SimJoin => SIM_JOIN,
            KernelModule::Knn => KNN,
            KernelModule::Grid => GRID,
        }
    }

    /// The file name NVRTC reports errors against.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelModule::SimJoin => "sim_join.cu",
            KernelModule::Knn => "knn.cu",
            KernelModule::Grid => "grid.cu",
        }
    }

    /// The `extern "C" __global__` entry points the Rust side launches from this module.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            KernelModule::SimJoin => &[
                "grid_join",
                "brute_join",
                "brute_join_tc",
                "brute_join_tc_bytes",
                "knn_settle_slots",
                "knn_sample_keys_bytes",
                "knn_sample_keys_half",
                "filter_max_abs",
                "pack_half_rows",
                "integer_range",
                "pack_byte_rows",
                "filter_rows",
                "identity_order",
            ],
            KernelModule::Knn => &[
                "knn_sample_rows",
                "knn_sample_distances",
                "knn_sample_distances_tc",
                "knn_sample_radius",
                "knn_rank_slots",
                "knn_select_slots",
                "knn_rank_lists",
            ],
            KernelModule::Grid => &[
                "radix_histogram",
                "radix_scatter",
                "scan_blocks",
                "add_block_offsets",
                "cell_starts",
                "cell_bounds",
                "fill_u32",
                "gather_rows",
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_launched_kernel_is_defined_in_its_source() {
        for module in KernelModule::ALL {
            for name in module.entry_points() {
                // `extern "C" __global__ void [attributes] name(` on one line.
                let call = format!(" {name}(");
                let declared = module
                    .source()
                    .lines()
                    .any(|line| line.starts_with("extern \"C\" __global__ void") && line.contains(&call));
                assert!(declared, "{name} missing from {}", module.file_name());
            }
        }
    }

    #[test]
    fn includes_are_inlined_with_line_markers() {
        let source = KernelModule::SimJoin.source();
        assert!(source.contains("struct JoinParams"), "common.cuh was not inlined");
        assert!(!source.contains("#include \"common.cuh\""));
        assert!(source.contains("#line 1 \"kernels/common.cuh\""));
    }
}
