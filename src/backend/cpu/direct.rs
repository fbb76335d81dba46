//! The brute-force joins and kNN units of L1 and L∞, and of the few left rows whose dot products
//! are computed directly: the vectorised f32 filter at the threshold's bound, then the exact check.

use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::common::Result;
use rayon::iter::{IndexedParallelIterator, IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::cpu::context::{JoinContext, TILE_QUERIES};
use crate::backend::plan::bounds::FilterLimit;
use crate::backend::plan::exact::ExactCheck;
use crate::backend::plan::exact::offer_exact;
use crate::backend::plan::simd::{Columns, LANES, SureCount, tile_hits};
use crate::backend::plan::topk::{KSmallest, Neighbour};
use crate::backend::{JoinRequest, KnnRequest};
use crate::vectors::Vectors;

/// Brute force for L1 and L∞: each right tile through the vectorised f32 filter for a block of
/// left rows at the threshold's FilterLimit (no pair within the threshold is lost), the pairs that
/// pass by the exact check; without f32 columns (values beyond f32), the exact check on every pair.
pub(super) fn direct_join(ctx: &JoinContext, columns: Option<&DirectColumns>) -> Result<()> {
    let JoinRequest { left, right, metric, threshold, self_join, .. } = *ctx.request;
    let blocks = left.len().div_ceil(TILE_QUERIES);
    ctx.sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = ctx.writer();
        let rows = b * TILE_QUERIES..((b + 1) * TILE_QUERIES).min(left.len());
        let mut tested = 0u64;
        match columns {
            Some(columns) => {
                let limit = FilterLimit::new(metric, threshold, left.dim, columns.extent);
                let left_columns = Columns { values: &columns.queries, len: left.len() };
                let tile_rows = columns.tile_rows;
                let mut hits = Vec::new();
                // Self-joins: only tiles with a right row after the block's first left row.
                let first_tile = if self_join.is_some() { (rows.start + 1) / tile_rows } else { 0 };
                for t in first_tile..right.len().div_ceil(tile_rows) {
                    let tile = &columns.base[t * tile_rows * left.dim..(t + 1) * tile_rows * left.dim];
                    let tile_columns = Columns { values: tile, len: tile_rows };
                    tile_hits(
                        limit.kind,
                        left.dim,
                        left_columns,
                        rows.clone(),
                        tile_columns,
                        0..tile_rows,
                        limit.limit,
                        SureCount::NONE,
                        &mut hits,
                    );
                    for &(row, offset) in &hits {
                        let (i, j) = (rows.start + row as usize, t * tile_rows + offset as usize);
                        if j >= right.len() || (self_join.is_some() && j <= i) {
                            continue;
                        }
                        tested += 1;
                        if let Some(d) = ctx.exact.within(left.row(i), right.row(j), i, j) {
                            ctx.push(&mut writer, i as u32, j as u32, d)?;
                        }
                    }
                }
            }
            None => {
                for i in rows.clone() {
                    let from = if self_join.is_some() { i + 1 } else { 0 };
                    for j in from..right.len() {
                        tested += 1;
                        if let Some(d) = ctx.exact.within(left.row(i), right.row(j), i, j) {
                            ctx.push(&mut writer, i as u32, j as u32, d)?;
                        }
                    }
                }
            }
        }
        ctx.candidates.fetch_add(tested, Ordering::Relaxed);
        ctx.self_pairs(rows, &mut writer)?;
        ctx.sink.advance(1);
        writer.flush()
    })
}

/// Both sides of a direct kNN or brute-force join (L1, L∞) as f32 columns for the vectorised
/// filter: offsets from the base's (right side's) mean, dimension-major; the base in tiles of
/// `tile_rows` rows (a multiple of LANES, about 32 KB), each tile's columns contiguous, so that a
/// tile stays in the L1 cache while every query of a block passes over it. (One column per dimension across the whole base put a 128-d lane
/// block's values on 128 pages: 2.5× slower than computing every exact distance, docs/design.md#cpu-knn.)
pub(super) struct DirectColumns {
    queries: Vec<f32>,
    base: Vec<f32>,
    tile_rows: usize,
    /// The largest |offset| of either side: FilterLimit's M.
    extent: f64,
}

impl DirectColumns {
    /// `None` when a value is too large for f32 scores: every distance is then exact.
    pub(super) fn new(queries: &Vectors, base: &Vectors) -> Option<Self> {
        let (dim, origin) = (base.dim, base.mean());
        let offset = |v: &Vectors, i: usize, d: usize| (v.row(i).get(d) - origin[d]) as f32;
        let mut query_columns = vec![0f32; dim * queries.len()];
        query_columns.par_chunks_mut(queries.len().max(1)).enumerate().for_each(|(d, column)| {
            column.iter_mut().enumerate().for_each(|(i, c)| *c = offset(queries, i, d));
        });
        let tile_rows = ((32 << 10) / (4 * dim.max(1))).next_multiple_of(LANES).clamp(LANES, 1024);
        let tiles = base.len().div_ceil(tile_rows);
        let mut base_columns = vec![0f32; tiles * tile_rows * dim];
        base_columns.par_chunks_mut(tile_rows * dim).enumerate().for_each(|(t, tile)| {
            for (d, column) in tile.chunks_mut(tile_rows).enumerate() {
                for (p, c) in column.iter_mut().enumerate() {
                    let i = t * tile_rows + p;
                    *c = if i < base.len() { offset(base, i, d) } else { 0.0 };
                }
            }
        });
        let extent =
            query_columns.par_iter().chain(base_columns.par_iter()).map(|v| v.abs() as f64).reduce(|| 0.0, f64::max);
        (extent.is_finite() && extent < 1e30).then_some(Self {
            queries: query_columns,
            base: base_columns,
            tile_rows,
            extent,
        })
    }
}

/// Exact top-k of queries `q` within base rows `r` (L1, L∞): each base tile through the
/// vectorised f32 filter for every query of the block, at the limit of the query's current k-th
/// distance bound (`FilterLimit`: every row within the bound passes, and only such a row can
/// enter the k nearest); the rows that pass by their exact distance. Computing every exact
/// distance took 4–6 ns a pair (docs/design.md#cpu-knn). Without f32 columns, every distance is exact.
#[allow(clippy::too_many_arguments)]
pub(super) fn knn_direct_unit(
    request: &KnnRequest,
    exact: &ExactCheck,
    columns: Option<&DirectColumns>,
    q: std::ops::Range<usize>,
    r: std::ops::Range<usize>,
    k: usize,
    candidates: &AtomicU64,
) -> Vec<Vec<Neighbour>> {
    let Some(columns) = columns else {
        candidates.fetch_add((q.len() * r.len()) as u64, Ordering::Relaxed);
        return q
            .map(|i| {
                let mut best = KSmallest::new(k);
                offer_exact(request, exact, i, r.clone(), &mut best);
                best.into_sorted()
            })
            .collect();
    };
    let (metric, dim, tile_rows) = (request.metric, request.base.dim, columns.tile_rows);
    let query_columns = Columns { values: &columns.queries, len: request.queries.len() };
    let mut bests: Vec<KSmallest> = q.clone().map(|_| KSmallest::new(k)).collect();
    let mut tested = 0u64;
    let mut hits = Vec::new();
    // The tiles that overlap `r`; rows of a tile outside `r` belong to another unit.
    for t in r.start / tile_rows..r.end.div_ceil(tile_rows) {
        let tile_columns =
            Columns { values: &columns.base[t * tile_rows * dim..(t + 1) * tile_rows * dim], len: tile_rows };
        let first = t * tile_rows;
        for (i, best) in q.clone().zip(bests.iter_mut()) {
            let limit = FilterLimit::new(metric, best.bound(), dim, columns.extent);
            tile_hits(
                limit.kind,
                dim,
                query_columns,
                i..i + 1,
                tile_columns,
                0..tile_rows,
                limit.limit,
                SureCount::NONE,
                &mut hits,
            );
            let passing = hits.iter().map(|&(_, offset)| first + offset as usize).filter(|j| r.contains(j));
            tested += offer_exact(request, exact, i, passing, best);
        }
    }
    candidates.fetch_add(tested, Ordering::Relaxed);
    bests.into_iter().map(KSmallest::into_sorted).collect()
}
