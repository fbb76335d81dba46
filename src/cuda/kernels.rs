//! The kernel sources build.rs embeds, and the entry points the Rust side launches.

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// A CUDA source file compiled as one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelModule {
    /// `kernels/grid_join.cu`: the ε-grid join of 2 to 4 dimensions.
    GridJoin,
    /// `kernels/grid_join_wide.cu`: the ε-grid join of other dimensions, and its work estimate.
    GridJoinWide,
    /// `kernels/directory_join.cu`: the quantile directory's join (Böhm et al.).
    DirectoryJoin,
    /// `kernels/brute_join.cu`: brute force on CUDA cores.
    BruteJoin,
    /// `kernels/rows.cu`: the filter rows and their packings for the tensor cores, and kNN's
    /// settle step.
    Rows,
    /// `kernels/tc_join.cu`: brute-force joins on tensor cores (f16 and byte rows).
    TcJoin,
    /// `kernels/tc_sample_keys.cu`: kNN's sample keys through the tensor-core join's pipeline.
    TcSampleKeys,
    /// `kernels/knn.cu`: kNN's sampled radii (the candidates come from `brute_join`) and the
    /// ranking of candidate slots and of the write passes' lists.
    Knn,
    /// `kernels/grid.cu`: the ε-grid built on the device (radix sort of the points by cell, the
    /// cells' bounds, rows gathered into slot order).
    Grid,
    /// `kernels/text.cu`: edit-distance joins, range queries and kNN (Myers' bit-parallel
    /// algorithm).
    Text,
    /// `kernels/clusters.cu`: range searches through the List of Clusters (vectors and strings).
    Clusters,
    /// `kernels/approx.cu`: the Multicurves index's keys, and approximate kNN from it.
    Approx,
    /// `kernels/bits.cu`: Hamming and Tanimoto joins and Hamming kNN over bit strings.
    Bits,
}

impl KernelModule {
    /// Every module.
    pub const ALL: [KernelModule; 13] = [
        KernelModule::GridJoin,
        KernelModule::GridJoinWide,
        KernelModule::DirectoryJoin,
        KernelModule::BruteJoin,
        KernelModule::Rows,
        KernelModule::TcJoin,
        KernelModule::TcSampleKeys,
        KernelModule::Knn,
        KernelModule::Grid,
        KernelModule::Text,
        KernelModule::Clusters,
        KernelModule::Approx,
        KernelModule::Bits,
    ];

    /// The module's position in [`KernelModule::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The flattened source.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::GridJoin => GRID_JOIN,
            KernelModule::GridJoinWide => GRID_JOIN_WIDE,
            KernelModule::DirectoryJoin => DIRECTORY_JOIN,
            KernelModule::BruteJoin => BRUTE_JOIN,
            KernelModule::Rows => ROWS,
            KernelModule::TcJoin => TC_JOIN,
            KernelModule::TcSampleKeys => TC_SAMPLE_KEYS,
            KernelModule::Knn => KNN,
            KernelModule::Grid => GRID,
            KernelModule::Text => TEXT,
            KernelModule::Clusters => CLUSTERS,
            KernelModule::Approx => APPROX,
            KernelModule::Bits => BITS,
        }
    }

    /// The file name NVRTC reports errors against.
    pub fn file_name(self) -> &'static str {
        match self {
            KernelModule::GridJoin => "grid_join.cu",
            KernelModule::GridJoinWide => "grid_join_wide.cu",
            KernelModule::DirectoryJoin => "directory_join.cu",
            KernelModule::BruteJoin => "brute_join.cu",
            KernelModule::Rows => "rows.cu",
            KernelModule::TcJoin => "tc_join.cu",
            KernelModule::TcSampleKeys => "tc_sample_keys.cu",
            KernelModule::Knn => "knn.cu",
            KernelModule::Grid => "grid.cu",
            KernelModule::Text => "text.cu",
            KernelModule::Clusters => "clusters.cu",
            KernelModule::Approx => "approx.cu",
            KernelModule::Bits => "bits.cu",
        }
    }
}

/// A kernel the Rust side launches: its module and its `extern "C" __global__` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    GridJoin,
    GridJoinWide,
    GridJoinWork,
    DirectoryJoin,
    BruteJoin,
    BruteJoinTc,
    BruteJoinTcBytes,
    KnnSettleSlots,
    KnnSampleKeysBytes,
    KnnSampleKeysHalf,
    FilterMaxAbs,
    PackHalfRows,
    IntegerRange,
    PackByteRows,
    FilterRows,
    IdentityOrder,
    WidenRows,
    KnnSampleRows,
    KnnSampleDistances,
    KnnSampleDistancesTc,
    KnnSampleRadius,
    KnnRankSlots,
    KnnSelectSlots,
    KnnRankLists,
    RadixHistogram,
    RadixScatter,
    ScanBlocks,
    AddBlockOffsets,
    CellStarts,
    CellBounds,
    FillU32,
    GatherRows,
    TextJoin,
    ClustersRangeVectors,
    ClustersRangeText,
    ApproxKnn,
    ApproxWalk,
    CurveRanks,
    GraphNearest,
    CurveBounds,
    CurveKeys,
    BitsJoin,
    BitsKnnHistogram,
    BitsKnnWithin,
    BitsBlocksJoin,
}

impl Kernel {
    /// Every kernel (the test that each is defined in its module's source).
    #[cfg(test)]
    pub const ALL: [Kernel; 45] = [
        Kernel::GridJoin,
        Kernel::GridJoinWide,
        Kernel::GridJoinWork,
        Kernel::DirectoryJoin,
        Kernel::BruteJoin,
        Kernel::BruteJoinTc,
        Kernel::BruteJoinTcBytes,
        Kernel::KnnSettleSlots,
        Kernel::KnnSampleKeysBytes,
        Kernel::KnnSampleKeysHalf,
        Kernel::FilterMaxAbs,
        Kernel::PackHalfRows,
        Kernel::IntegerRange,
        Kernel::PackByteRows,
        Kernel::FilterRows,
        Kernel::IdentityOrder,
        Kernel::WidenRows,
        Kernel::KnnSampleRows,
        Kernel::KnnSampleDistances,
        Kernel::KnnSampleDistancesTc,
        Kernel::KnnSampleRadius,
        Kernel::KnnRankSlots,
        Kernel::KnnSelectSlots,
        Kernel::KnnRankLists,
        Kernel::RadixHistogram,
        Kernel::RadixScatter,
        Kernel::ScanBlocks,
        Kernel::AddBlockOffsets,
        Kernel::CellStarts,
        Kernel::CellBounds,
        Kernel::FillU32,
        Kernel::GatherRows,
        Kernel::TextJoin,
        Kernel::ClustersRangeVectors,
        Kernel::ClustersRangeText,
        Kernel::ApproxKnn,
        Kernel::ApproxWalk,
        Kernel::CurveRanks,
        Kernel::GraphNearest,
        Kernel::CurveBounds,
        Kernel::CurveKeys,
        Kernel::BitsJoin,
        Kernel::BitsKnnHistogram,
        Kernel::BitsKnnWithin,
        Kernel::BitsBlocksJoin,
    ];

    /// The entry point's name in its source.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::GridJoin => "grid_join",
            Kernel::GridJoinWide => "grid_join_wide",
            Kernel::GridJoinWork => "grid_join_work",
            Kernel::DirectoryJoin => "directory_join",
            Kernel::BruteJoin => "brute_join",
            Kernel::BruteJoinTc => "brute_join_tc",
            Kernel::BruteJoinTcBytes => "brute_join_tc_bytes",
            Kernel::KnnSettleSlots => "knn_settle_slots",
            Kernel::KnnSampleKeysBytes => "knn_sample_keys_bytes",
            Kernel::KnnSampleKeysHalf => "knn_sample_keys_half",
            Kernel::FilterMaxAbs => "filter_max_abs",
            Kernel::PackHalfRows => "pack_half_rows",
            Kernel::IntegerRange => "integer_range",
            Kernel::PackByteRows => "pack_byte_rows",
            Kernel::FilterRows => "filter_rows",
            Kernel::IdentityOrder => "identity_order",
            Kernel::WidenRows => "widen_rows",
            Kernel::KnnSampleRows => "knn_sample_rows",
            Kernel::KnnSampleDistances => "knn_sample_distances",
            Kernel::KnnSampleDistancesTc => "knn_sample_distances_tc",
            Kernel::KnnSampleRadius => "knn_sample_radius",
            Kernel::KnnRankSlots => "knn_rank_slots",
            Kernel::KnnSelectSlots => "knn_select_slots",
            Kernel::KnnRankLists => "knn_rank_lists",
            Kernel::RadixHistogram => "radix_histogram",
            Kernel::RadixScatter => "radix_scatter",
            Kernel::ScanBlocks => "scan_blocks",
            Kernel::AddBlockOffsets => "add_block_offsets",
            Kernel::CellStarts => "cell_starts",
            Kernel::CellBounds => "cell_bounds",
            Kernel::FillU32 => "fill_u32",
            Kernel::GatherRows => "gather_rows",
            Kernel::TextJoin => "text_join",
            Kernel::ClustersRangeVectors => "clusters_range_vectors",
            Kernel::ClustersRangeText => "clusters_range_text",
            Kernel::ApproxKnn => "approx_knn",
            Kernel::ApproxWalk => "approx_walk",
            Kernel::CurveRanks => "curve_ranks",
            Kernel::GraphNearest => "graph_nearest",
            Kernel::CurveBounds => "curve_bounds",
            Kernel::CurveKeys => "curve_keys",
            Kernel::BitsJoin => "bits_join",
            Kernel::BitsKnnHistogram => "bits_knn_histogram",
            Kernel::BitsKnnWithin => "bits_knn_within",
            Kernel::BitsBlocksJoin => "bits_blocks_join",
        }
    }

    /// The module whose source defines it.
    pub fn module(self) -> KernelModule {
        match self {
            Kernel::GridJoin => KernelModule::GridJoin,
            Kernel::GridJoinWide | Kernel::GridJoinWork => KernelModule::GridJoinWide,
            Kernel::DirectoryJoin => KernelModule::DirectoryJoin,
            Kernel::BruteJoinTc | Kernel::BruteJoinTcBytes => KernelModule::TcJoin,
            Kernel::KnnSampleKeysBytes | Kernel::KnnSampleKeysHalf => KernelModule::TcSampleKeys,
            Kernel::BruteJoin => KernelModule::BruteJoin,
            Kernel::KnnSettleSlots
            | Kernel::FilterMaxAbs
            | Kernel::PackHalfRows
            | Kernel::IntegerRange
            | Kernel::PackByteRows
            | Kernel::FilterRows
            | Kernel::IdentityOrder
            | Kernel::WidenRows => KernelModule::Rows,
            Kernel::KnnSampleRows => KernelModule::Knn,
            Kernel::KnnSampleDistances => KernelModule::Knn,
            Kernel::KnnSampleDistancesTc => KernelModule::Knn,
            Kernel::KnnSampleRadius => KernelModule::Knn,
            Kernel::KnnRankSlots => KernelModule::Knn,
            Kernel::KnnSelectSlots => KernelModule::Knn,
            Kernel::KnnRankLists => KernelModule::Knn,
            Kernel::RadixHistogram => KernelModule::Grid,
            Kernel::RadixScatter => KernelModule::Grid,
            Kernel::ScanBlocks => KernelModule::Grid,
            Kernel::AddBlockOffsets => KernelModule::Grid,
            Kernel::CellStarts => KernelModule::Grid,
            Kernel::CellBounds => KernelModule::Grid,
            Kernel::FillU32 => KernelModule::Grid,
            Kernel::GatherRows => KernelModule::Grid,
            Kernel::TextJoin => KernelModule::Text,
            Kernel::ClustersRangeVectors | Kernel::ClustersRangeText => KernelModule::Clusters,
            Kernel::ApproxKnn
            | Kernel::ApproxWalk
            | Kernel::CurveRanks
            | Kernel::GraphNearest
            | Kernel::CurveBounds
            | Kernel::CurveKeys => KernelModule::Approx,
            Kernel::BitsJoin | Kernel::BitsKnnHistogram | Kernel::BitsKnnWithin | Kernel::BitsBlocksJoin => {
                KernelModule::Bits
            }
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::{Kernel, KernelModule};

    #[test]
    fn every_launched_kernel_is_defined_in_its_source() {
        for kernel in Kernel::ALL {
            // `extern "C" __global__ void [attributes] name(` on one line.
            let call = format!(" {kernel}(");
            let module = kernel.module();
            let declared = module
                .source()
                .lines()
                .any(|line| line.starts_with("extern \"C\" __global__ void") && line.contains(&call));
            assert!(declared, "{kernel} missing from {}", module.file_name());
        }
    }

    #[test]
    fn module_indices_are_positions_in_all() {
        for (position, module) in KernelModule::ALL.into_iter().enumerate() {
            assert_eq!(module.index(), position, "{module:?}");
        }
    }

    #[test]
    fn includes_are_inlined_with_line_markers() {
        let source = KernelModule::BruteJoin.source();
        assert!(source.contains("struct JoinParams"), "common.cuh was not inlined");
        assert!(!source.contains("#include \"common.cuh\""));
        assert!(source.contains("#line 1 \"kernels/common.cuh\""));
    }
}
