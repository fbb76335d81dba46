//! The ε-grid join on every core (Gowanlock & Karsin, GPU-Join, §3.2.1, §4): each left cell
//! against its neighbour cells on the right, the `±r` window of the sort dimension (sortidu), the
//! vectorised f32 filter of the slots, and the exact check; the slot filter and the exact pair
//! check are shared with the directory join (backend/cpu/directory.rs).

use std::sync::atomic::Ordering;

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::PairWriter;
use crate::backend::cpu::context::JoinContext;
use crate::backend::plan::bounds::FilterLimit;
use crate::backend::plan::simd::{Columns, LANES, SureCount, tile_hits};
use crate::backend::plan::{gather, lower_corner};
use crate::index::{GridGeometry, GridIndex};
use crate::on_coords;
use crate::vectors::{Coord, Coords};

/// Splits `0..n` items (weighted by `weight(i)`) into about `parts` contiguous ranges of similar
/// weight.
fn balanced_ranges(n: usize, parts: usize, weight: impl Fn(usize) -> usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = (0..n).map(&weight).sum();
    let target = total.div_ceil(parts.max(1)).max(1);
    let mut ranges = Vec::with_capacity(parts + 1);
    let (mut start, mut acc) = (0, 0);
    for i in 0..n {
        acc += weight(i);
        if acc >= target {
            ranges.push(start..i + 1);
            start = i + 1;
            acc = 0;
        }
    }
    if start < n {
        ranges.push(start..n);
    }
    ranges
}

/// The grid join: for every left cell, its 3^k neighbour cells on the right (for a self-join only
/// the cells with a larger id, and the later slots of its own cell, so each pair is met once).
/// Inside a neighbour cell only the `±r` window on the sort dimension is scanned, first by the
/// vectorised f32 [`SlotFilter`], then by the exact check for the pairs it cannot rule out.
pub(super) fn grid_join(
    ctx: &JoinContext,
    g: &GridGeometry,
    left: &GridIndex,
    right: Option<&GridIndex>,
    left_filter: Coords,
    right_filter: Coords,
) -> Result<()> {
    let request = ctx.request;
    let dim = request.left.dim;
    let same = right.is_none();
    let right = right.unwrap_or(left);
    let left_values = gather(request.left, &left.order);
    let right_values = if same { None } else { Some(gather(request.right, &right.order)) };
    let right_values = right_values.as_deref().unwrap_or(&left_values);
    let origin = lower_corner(left_filter, right_filter, dim);
    let left_slots = SlotFilter::new(left_filter, left, dim, &origin);
    let right_slots = if same { None } else { Some(SlotFilter::new(right_filter, right, dim, &origin)) };
    let right_slots = right_slots.as_ref().unwrap_or(&left_slots);
    let limit = FilterLimit::new(request.metric, request.threshold, dim, left_slots.extent.max(right_slots.extent));
    let window = g.window();
    let windowed = g.window_prunes();

    let ranges = balanced_ranges(left.num_cells(), rayon::current_num_threads() * 32, |c| left.slots(c).len());
    ctx.sink.start(left.num_cells() as u64);
    ranges.into_par_iter().try_for_each(|cells| -> Result<()> {
        let mut writer = ctx.writer();
        let mut neighbours = Vec::with_capacity(27);
        let mut hits = Vec::new();
        let mut tested = 0u64;
        // A count of pairs needs no exact check of those the filter proves within the threshold.
        let sure_limit = if writer.counts_only() { limit.sure } else { f32::NEG_INFINITY };
        let mut counted = 0u64;
        for c in cells.clone() {
            let id = left.cell_ids[c];
            neighbours.clear();
            g.for_each_neighbour(id, |nid| {
                if (!same || nid >= id)
                    && let Some(nc) = right.find(nid)
                {
                    neighbours.push(nc);
                }
            });
            let sources = left.slots(c);
            let source_start = left_slots.start[c];
            for &nc in &neighbours {
                let targets = right.slots(nc);
                let base = right_slots.start[nc];
                if !windowed {
                    // Every slot of `c` against the whole (padded) cell `nc` in one tile.
                    let block = base..base + targets.len().next_multiple_of(LANES);
                    let rows = source_start..source_start + sources.len();
                    let after = if same && nc == c { 0 } else { i64::MIN };
                    let sure = SureCount { limit: sure_limit, from: 0, to: targets.len(), after };
                    counted += tile_hits(
                        limit.kind,
                        dim,
                        left_slots.columns(),
                        rows,
                        right_slots.columns(),
                        block,
                        limit.limit,
                        sure,
                        &mut hits,
                    );
                    tested += if same && nc == c {
                        (sources.len() * sources.len().saturating_sub(1) / 2) as u64
                    } else {
                        (sources.len() * targets.len()) as u64
                    };
                    for &(row, column) in &hits {
                        let (sa, sb) = (sources.start + row as usize, targets.start + column as usize);
                        if sb < targets.end && !(same && nc == c && sb <= sa) {
                            exact_pair(ctx, &mut writer, (sa, &left_values, left), (sb, right_values, right))?;
                        }
                    }
                    continue;
                }
                let keys = &right.sort_keys[targets.clone()];
                for sa in sources.clone() {
                    let u = left.sort_keys[sa];
                    let mut lo = targets.start + keys.partition_point(|&key| key - u < -window);
                    let hi = lo + right.sort_keys[lo..targets.end].partition_point(|&key| key - u <= window);
                    if same && nc == c {
                        lo = lo.max(sa + 1);
                    }
                    if lo >= hi {
                        continue;
                    }
                    tested += (hi - lo) as u64;
                    // Score whole lane blocks around [lo, hi); lanes outside it are skipped.
                    let block_start = base + ((lo - targets.start) / LANES) * LANES;
                    let block_end = base + (hi - targets.start).next_multiple_of(LANES);
                    let row = source_start + (sa - sources.start);
                    let first = targets.start + (block_start - base);
                    let sure = SureCount { limit: sure_limit, from: lo - first, to: hi - first, after: i64::MIN };
                    counted += tile_hits(
                        limit.kind,
                        dim,
                        left_slots.columns(),
                        row..row + 1,
                        right_slots.columns(),
                        block_start..block_end,
                        limit.limit,
                        sure,
                        &mut hits,
                    );
                    for &(_, column) in &hits {
                        let sb = first + column as usize;
                        if (lo..hi).contains(&sb) {
                            exact_pair(ctx, &mut writer, (sa, &left_values, left), (sb, right_values, right))?;
                        }
                    }
                }
            }
        }
        if counted > 0 {
            writer.count(counted, counted);
        }
        ctx.candidates.fetch_add(tested, Ordering::Relaxed);
        if same {
            let positions = cells.clone().flat_map(|c| left.slots(c)).map(|s| left.order[s] as usize);
            ctx.self_pairs(positions, &mut writer)?;
        }
        ctx.sink.advance(cells.len() as u64);
        writer.flush()
    })
}

/// The exact check of left slot `sa` against right slot `sb`; writes the pair when it qualifies.
#[inline]
pub(super) fn exact_pair(
    ctx: &JoinContext,
    writer: &mut PairWriter,
    (sa, left_values, left): (usize, &[f64], &GridIndex),
    (sb, right_values, right): (usize, &[f64], &GridIndex),
) -> Result<()> {
    let dim = ctx.request.left.dim;
    let (pa, pb) = (left.order[sa], right.order[sb]);
    let a = &left_values[sa * dim..(sa + 1) * dim];
    let b = &right_values[sb * dim..(sb + 1) * dim];
    if writer.counts_only() {
        if ctx.exact.qualifies_f64(a, b, pa as usize, pb as usize) {
            writer.count(1, u64::from(pa != pb));
        }
        return Ok(());
    }
    match ctx.exact.within_f64(a, b, pa as usize, pb as usize) {
        Some(d) => ctx.push(writer, pa, pb, d),
        None => Ok(()),
    }
}

/// The filter-space coordinates of one input in slot (grid) order, as f32 offsets from a common
/// origin, dimension-major so that scoring one point against a cell vectorises. Each cell starts
/// on a multiple of [`LANES`]; padding lanes hold +∞, whose scores never pass.
pub(super) struct SlotFilter {
    /// `values[d * len + p]`: coordinate `d` at padded position `p`, minus `origin[d]`, in f32.
    values: Vec<f32>,
    /// Padded length of one dimension.
    len: usize,
    /// Padded position of each cell's first slot.
    pub(super) start: Vec<usize>,
    /// Largest |value| (the `M` of the error bound).
    pub(super) extent: f64,
}

impl SlotFilter {
    pub(super) fn new(points: Coords, index: &GridIndex, dim: usize, origin: &[f64]) -> Self {
        let mut start = Vec::with_capacity(index.num_cells() + 1);
        let mut len = 0;
        for c in 0..index.num_cells() {
            start.push(len);
            len += index.slots(c).len().next_multiple_of(LANES);
        }
        let mut values = vec![f32::INFINITY; dim * len];
        on_coords!(points, |points| {
            values.par_chunks_mut(len.max(1)).enumerate().for_each(|(d, column)| {
                for c in 0..index.num_cells() {
                    let slots = index.slots(c);
                    for (v, s) in column[start[c]..].iter_mut().zip(slots) {
                        *v = (points[index.order[s] as usize * dim + d].f64() - origin[d]) as f32;
                    }
                }
            })
        });
        let extent = values.par_iter().filter(|v| v.is_finite()).map(|v| v.abs() as f64).reduce(|| 0.0, f64::max);
        Self { values, len, start, extent }
    }

    /// The values as columns for the SIMD loops.
    pub(super) fn columns(&self) -> Columns<'_> {
        Columns { values: &self.values, len: self.len }
    }
}
