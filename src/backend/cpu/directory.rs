//! The directory join on every core (`index=directory`): Böhm, Noll, Plant and Zherdin,
//! "Index-supported Similarity Join on Graphics Processors", Fig. 5, with rayon in place of thread
//! groups. The right input is sorted into the quantile directory of `index::directory`, the left
//! one into its own (for a self-join, the same); each block of [`DIRECTORY_BLOCK`] consecutive
//! left slots walks the right directory once with its bounding box, and its rows are scored
//! against every visited leaf's rows by the vectorised f32 filter of the grid join, then decided
//! by the exact check.

use std::sync::atomic::Ordering;
use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use crate::backend::RunStats;
use crate::backend::cpu::context::JoinContext;
use crate::backend::cpu::grid_join::{SlotFilter, exact_pair};
use crate::backend::plan::bounds::FilterLimit;
use crate::backend::plan::simd::{LANES, SureCount, tile_hits};
use crate::backend::plan::{gather, lower_corner};
use crate::index::{DIRECTORY_BLOCK, DirectoryShape, GridIndex, JoinDirectories};
use crate::vectors::Coords;

/// The join of `ctx`'s request through directories of `shape` (the right side's; a separate left
/// side gets a directory of its own size), over the filter spaces `left` and `right`.
pub(super) fn join(
    ctx: &JoinContext,
    shape: &DirectoryShape,
    left: Coords,
    right: Coords,
    stats: &mut RunStats,
) -> Result<()> {
    let start = Instant::now();
    let request = ctx.request;
    let dim = request.left.dim;
    let same = request.self_join.is_some();
    let dirs = JoinDirectories::build(shape, left, right, dim, same);
    let (left_dir, right_dir) = (dirs.left(), &dirs.right);
    // The rows as groups the slot filters pad: the left side by blocks, the right by leaves.
    let blocks = dirs.blocks();
    let left_groups = GridIndex::from_groups(
        left_dir.order.clone(),
        (0..blocks).map(|b| b * DIRECTORY_BLOCK).chain([left_dir.order.len()]).collect(),
    );
    let right_groups = GridIndex::from_groups(right_dir.order.clone(), right_dir.leaf_start.clone());
    let left_values = gather(request.left, &left_groups.order);
    let right_values = if same { None } else { Some(gather(request.right, &right_groups.order)) };
    let right_values = right_values.as_deref().unwrap_or(&left_values);
    let origin = lower_corner(left, right, dim);
    let left_slots = SlotFilter::new(left, &left_groups, dim, &origin);
    let right_slots = SlotFilter::new(right, &right_groups, dim, &origin);
    let limit = FilterLimit::new(request.metric, request.threshold, dim, left_slots.extent.max(right_slots.extent));
    stats.build_time = start.elapsed();
    stats.directory = Some((shape.levels, shape.fanout));

    let probe = Instant::now();
    let pages = std::sync::atomic::AtomicU64::new(0);
    ctx.sink.start(blocks as u64);
    let ranges: Vec<_> = (0..blocks).step_by(16).map(|b| b..(b + 16).min(blocks)).collect();
    ranges.into_par_iter().try_for_each(|range| -> Result<()> {
        let mut writer = ctx.writer();
        let (mut hits, mut leaves) = (Vec::new(), Vec::new());
        let (mut tested, mut visited) = (0u64, 0u64);
        // A count of pairs needs no exact check of those the filter proves within the threshold.
        let sure_limit = if writer.counts_only() { limit.sure } else { f32::NEG_INFINITY };
        let mut counted = 0u64;
        for b in range.clone() {
            let sources = left_groups.slots(b);
            leaves.clear();
            let from = if same { sources.start + 1 } else { 0 };
            let (lo, hi) = dirs.block_box(b);
            right_dir.visit(lo, hi, from, |l| leaves.push(l));
            visited += leaves.len() as u64;
            let rows = left_slots.start[b]..left_slots.start[b] + sources.len();
            for &l in &leaves {
                let targets = right_groups.slots(l);
                let padded = right_slots.start[l]..right_slots.start[l] + targets.len().next_multiple_of(LANES);
                // A self-join's pair counts from its earlier slot: `targets.start + column` after
                // `sources.start + row`.
                let after = if same { sources.start as i64 - targets.start as i64 } else { i64::MIN };
                let sure = SureCount { limit: sure_limit, from: 0, to: targets.len(), after };
                counted += tile_hits(
                    limit.kind,
                    dim,
                    left_slots.columns(),
                    rows.clone(),
                    right_slots.columns(),
                    padded,
                    limit.limit,
                    sure,
                    &mut hits,
                );
                tested += (sources.len() * targets.len()) as u64;
                for &(row, column) in &hits {
                    let (sa, sb) = (sources.start + row as usize, targets.start + column as usize);
                    // A self-join meets each unordered pair from its earlier slot only.
                    if sb < targets.end && !(same && sb <= sa) {
                        exact_pair(
                            ctx,
                            &mut writer,
                            (sa, &left_values, &left_groups),
                            (sb, right_values, &right_groups),
                        )?;
                    }
                }
            }
            if same {
                ctx.self_pairs(sources.map(|s| left_groups.order[s] as usize), &mut writer)?;
            }
        }
        if counted > 0 {
            writer.count(counted, counted);
        }
        ctx.candidates.fetch_add(tested, Ordering::Relaxed);
        pages.fetch_add(visited, Ordering::Relaxed);
        ctx.sink.advance(range.len() as u64);
        writer.flush()
    })?;
    stats.pages_visited = pages.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(())
}
