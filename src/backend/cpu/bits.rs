//! Hamming and Tanimoto joins, range queries and kNN over bit strings (`metric=hamming`, and
//! `metric=jaccard` over a bit column) on every core. Distances are counts of bits, exact by
//! construction, so every filter here is an integer bound.
//!
//! * Hamming ε-join / range query within `r` bits: multi-index hashing (Norouzi, Punjani and
//!   Fleet, "Fast exact search in Hamming space with multi-index hashing", TPAMI 2014) where the
//!   cost model expects it to beat comparing every pair: the bits are cut into `m` blocks, and two
//!   strings within `r` bits differ by at most `s = ⌊r / m⌋` bits in some block (if every block
//!   differed by `s + 1` or more, the whole would by `m(s + 1) > r`). Each block of the right side is
//!   indexed by its value; each left row looks up every value within `s` bits of its own block, and
//!   a pair is taken from the first block within `s` only (so from one block once) and kept when its
//!   whole distance is within `r`. Otherwise (or with `index=brute_force`) every pair is compared.
//! * Tanimoto ε-join: two strings of `a` and `b` set bits are at best `1 − min(a, b) / max(a, b)`
//!   apart, so each left row is compared only with the right rows whose popcount lies in its window
//!   ([`size_window`], the sets' own bound), the right side in popcount order.
//! * kNN: Hamming by every distance of the query, the k smallest picked by counting (distances are
//!   at most the bits); Tanimoto by popcount order outwards from the query's, stopping once the
//!   popcount bound alone exceeds the k-th distance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use datafusion::common::Result;
use multiversion::multiversion;
use rayon::iter::{IntoParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;

use crate::backend::plan::bounds::{hamming_radius, jaccard_of_counts, jaccard_of_union, size_window};
use crate::backend::plan::topk::{KSmallest, Neighbour, rank_in_waves, rank_in_waves_with};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::op::{IndexChoice, Metric};
use crate::vectors::Bits;
use crate::vectors::bits::{and_or_counts, hamming};

/// Left rows per unit of parallel work.
const BLOCK: usize = 1024;
/// Widest block indexed by a table of every value (2²² offsets, 16 MiB); wider blocks by a sorted
/// list of values.
pub(crate) const TABLE_BITS: usize = 22;
/// What a Hamming join's strategies cost on a unit, in nanoseconds: comparing a pair a word, looking
/// up a block value (a cache miss), reading a candidate a word; and the widest block it indexes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BitsCosts {
    pub(crate) pair_word: f64,
    pub(crate) lookup: f64,
    pub(crate) candidate: f64,
    pub(crate) widest_block: usize,
}

/// One CPU core's (the 2-core machine's AVX2: ~0.35 ns a pair a word, XOR, popcount and the test).
pub(crate) const CPU_BITS_COSTS: BitsCosts =
    BitsCosts { pair_word: 0.35, lookup: 25.0, candidate: 4.0, widest_block: 64 };
/// Left rows whose lookups the cost model samples.
const COST_SAMPLE: usize = 256;

/// Every (left, right) pair within the threshold.
pub fn join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let JoinRequest { left, right, metric, .. } = *request;
    let stats = RunStats::default();
    if left.is_empty() || right.is_empty() {
        return Ok(stats);
    }
    if left.bits.bits != right.bits.bits {
        return datafusion::common::exec_err!(
            "{}: bit strings of different lengths: {} bits on the left, {} on the right",
            if request.self_join.is_some() { "sim_join" } else { "the two inputs" },
            left.bits.bits,
            right.bits.bits
        );
    }
    match metric {
        Metric::Hamming => hamming_join(request, sink),
        _ => tanimoto_join(request, sink),
    }
}

/// How a Hamming join finds its pairs.
#[derive(Debug, Clone)]
pub(crate) enum BitsStrategy {
    /// Every pair in the window.
    BruteForce,
    /// Multi-index hashing over these blocks (bit ranges), each pair within `s` bits of a block.
    Blocks { blocks: Vec<std::ops::Range<usize>>, s: u32 },
}

impl BitsStrategy {
    /// The cheapest exact strategy for a join of `left` and `right` within `r` bits by the cost
    /// model: every pair compared, against multi-index hashing with each block count `m` whose
    /// blocks fit a word, its lookups and candidates counted over a sample of left rows.
    pub(crate) fn choose(
        left: &Bits,
        right: &Bits,
        r: u32,
        self_join: bool,
        index: IndexChoice,
        costs: BitsCosts,
    ) -> Self {
        let bits = left.bits;
        let pairs = left.len() as f64 * right.len() as f64 * if self_join { 0.5 } else { 1.0 };
        let brute = pairs * costs.pair_word * left.words as f64;
        if index == IndexChoice::BruteForce || bits == 0 {
            return BitsStrategy::BruteForce;
        }
        let mut best = (brute, BitsStrategy::BruteForce);
        // m blocks, each within s = r / m: every m from r + 1 (s = 0) down to where s reaches 3.
        for m in (1..=(r as usize + 1).min(bits)).rev() {
            let s = r / m as u32;
            if s > 3 || bits.div_ceil(m) > costs.widest_block {
                continue;
            }
            let blocks = cut(bits, m);
            let lookups: f64 = blocks.iter().map(|b| values_within(b.len(), s)).sum();
            let candidates = sampled_candidates(left, right, &blocks, s);
            let cost = left.len() as f64 * (lookups * costs.lookup + candidates * costs.candidate * left.words as f64)
                + (right.len() * m) as f64 * costs.lookup / 4.0;
            if cost < best.0 {
                best = (cost, BitsStrategy::Blocks { blocks, s });
            }
        }
        best.1
    }
}

/// `bits` cut into `m` consecutive blocks of sizes differing by at most one.
fn cut(bits: usize, m: usize) -> Vec<std::ops::Range<usize>> {
    (0..m).map(|j| j * bits / m..(j + 1) * bits / m).collect()
}

/// The number of `width`-bit values within `s` bits of one: `Σ_{e ≤ s} C(width, e)`.
fn values_within(width: usize, s: u32) -> f64 {
    let mut total = 0.0;
    let mut choose = 1.0;
    for e in 0..=s as usize {
        if e > width {
            break;
        }
        total += choose;
        choose = choose * (width - e) as f64 / (e + 1) as f64;
    }
    total
}

/// Bits `block` of a row (`words`), as a number.
#[inline]
fn block_value(words: &[u64], block: &std::ops::Range<usize>) -> u64 {
    let (start, len) = (block.start, block.len());
    let (w, offset) = (start / 64, start % 64);
    let mut value = words[w] >> offset;
    if offset + len > 64 {
        value |= words[w + 1] << (64 - offset);
    }
    if len < 64 { value & ((1u64 << len) - 1) } else { value }
}

/// The right rows of each block's values: a table of every value for narrow blocks, else the
/// values sorted with their rows.
pub(crate) enum BlockIndex {
    Table { starts: Vec<u32>, rows: Vec<u32> },
    Sorted { values: Vec<u64>, rows: Vec<u32> },
}

impl BlockIndex {
    pub(crate) fn build(bits: &Bits, block: &std::ops::Range<usize>) -> Self {
        let n = bits.len();
        let value = |i: usize| block_value(bits.get(i), block);
        if block.len() <= TABLE_BITS {
            // (value, row) in one word, sorted on every core: the rows by value, each value's
            // rows ascending (a counting sort on one core took 0.4 s a block of 10⁷ rows).
            let mut keys: Vec<u64> = (0..n).into_par_iter().map(|i| (value(i) << 32) | i as u64).collect();
            keys.par_sort_unstable();
            let size = 1usize << block.len();
            let mut starts = vec![0u32; size + 1];
            for &key in &keys {
                starts[(key >> 32) as usize + 1] += 1;
            }
            for v in 0..size {
                starts[v + 1] += starts[v];
            }
            let rows = keys.par_iter().map(|&key| key as u32).collect();
            return BlockIndex::Table { starts, rows };
        }
        let mut pairs: Vec<(u64, u32)> = (0..n).map(|i| (value(i), i as u32)).collect();
        pairs.par_sort_unstable();
        BlockIndex::Sorted { values: pairs.iter().map(|p| p.0).collect(), rows: pairs.iter().map(|p| p.1).collect() }
    }

    /// The rows whose block holds `value`, ascending.
    #[inline]
    fn rows(&self, value: u64) -> &[u32] {
        match self {
            BlockIndex::Table { starts, rows } => {
                let v = value as usize;
                &rows[starts[v] as usize..starts[v + 1] as usize]
            }
            BlockIndex::Sorted { values, rows } => {
                let from = values.partition_point(|&x| x < value);
                let to = from + values[from..].partition_point(|&x| x == value);
                &rows[from..to]
            }
        }
    }
}

/// Calls `visit(v)` for every `width`-bit value `v` within `s` bits of `value`.
fn for_values_within(value: u64, width: usize, s: u32, visit: &mut impl FnMut(u64)) {
    fn flips(value: u64, from: usize, width: usize, left: u32, visit: &mut impl FnMut(u64)) {
        visit(value);
        if left == 0 {
            return;
        }
        for bit in from..width {
            flips(value ^ (1 << bit), bit + 1, width, left - 1, visit);
        }
    }
    flips(value, 0, width, s, visit);
}

/// The mean number of right rows a left row meets over `blocks` within `s`, over a sample of
/// left rows.
fn sampled_candidates(left: &Bits, right: &Bits, blocks: &[std::ops::Range<usize>], s: u32) -> f64 {
    let step = left.len().div_ceil(COST_SAMPLE).max(1);
    let sample: Vec<usize> = (0..left.len()).step_by(step).collect();
    let right_step = right.len().div_ceil(1 << 16).max(1);
    let mut met = 0usize;
    for block in blocks {
        // A sorted sample of the right side's values stands in for the index.
        let mut values: Vec<u64> =
            (0..right.len()).step_by(right_step).map(|i| block_value(right.get(i), block)).collect();
        values.sort_unstable();
        for &i in &sample {
            for_values_within(block_value(left.get(i), block), block.len(), s, &mut |v| {
                let from = values.partition_point(|&x| x < v);
                met += values[from..].partition_point(|&x| x == v);
            });
        }
    }
    met as f64 * right_step as f64 / sample.len().max(1) as f64
}

/// The Hamming join within `r = ⌊threshold⌋` bits.
fn hamming_join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let JoinRequest { left, right, threshold, self_join, index, .. } = *request;
    let (lb, rb) = (&left.bits, &right.bits);
    let r = hamming_radius(threshold);
    let same = self_join.is_some();
    let strategy = BitsStrategy::choose(lb, rb, r, same, index, CPU_BITS_COSTS);
    let indexes: Vec<BlockIndex> = match &strategy {
        BitsStrategy::Blocks { blocks, .. } => blocks.par_iter().map(|b| BlockIndex::build(rb, b)).collect(),
        BitsStrategy::BruteForce => Vec::new(),
    };
    let mut stats = RunStats { build_time: start.elapsed(), ..Default::default() };
    if let BitsStrategy::Blocks { blocks, .. } = &strategy {
        stats.indexed_dims = blocks.len();
    }
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    let ordered = self_join.is_some_and(|s| s.ordered);
    let include_self = self_join.is_some_and(|s| s.include_self);
    let blocks_of_rows = left.len().div_ceil(BLOCK);
    sink.start(blocks_of_rows as u64);
    (0..blocks_of_rows).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = PairWriter::new(sink, ordered);
        let mut count = 0u64;
        let mut within = Vec::new();
        for a in b * BLOCK..((b + 1) * BLOCK).min(left.len()) {
            let x = lb.get(a);
            match &strategy {
                BitsStrategy::BruteForce => {
                    // A self-join's pairs from their smaller position.
                    let first = if same { a + 1 } else { 0 };
                    count += (rb.len() - first.min(rb.len())) as u64;
                    within.clear();
                    rows_within(x, rb, first..rb.len(), r, &mut within);
                    for &(p, d) in &within {
                        writer.push(a as u32, p, d as f64)?;
                    }
                }
                BitsStrategy::Blocks { blocks, s } => {
                    let s = *s;
                    let own: Vec<u64> = blocks.iter().map(|block| block_value(x, block)).collect();
                    for (j, (block, index)) in blocks.iter().zip(&indexes).enumerate() {
                        let mut result = Ok(());
                        for_values_within(own[j], block.len(), s, &mut |v| {
                            for &p in index.rows(v) {
                                if result.is_err() || (same && p as usize <= a) {
                                    continue;
                                }
                                let y = rb.get(p as usize);
                                // Taken from the first block within s alone.
                                let earlier = blocks[..j]
                                    .iter()
                                    .zip(&own)
                                    .any(|(bl, &o)| (block_value(y, bl) ^ o).count_ones() <= s);
                                if earlier {
                                    continue;
                                }
                                count += 1;
                                let d = hamming(x, y);
                                if d <= r {
                                    result = writer.push(a as u32, p, d as f64);
                                }
                            }
                        });
                        result?;
                    }
                }
            }
            if include_self {
                writer.push(a as u32, a as u32, 0.0)?;
            }
        }
        checked.fetch_add(count, Ordering::Relaxed);
        sink.advance(1);
        writer.flush()
    })?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The rows of `rows` within `r` bits of `x`, with their distances, into `out`. Compiled for the
/// CPU's popcount instruction where it has one (baseline x86-64 has none: `count_ones` is then a
/// dozen shifts and masks a word), picked at run time.
#[multiversion(targets("x86_64+avx2+popcnt", "x86_64+popcnt", "aarch64+neon"))]
fn rows_within(x: &[u64], rows: &Bits, range: std::ops::Range<usize>, r: u32, out: &mut Vec<(u32, u32)>) {
    for p in range {
        let d = hamming(x, rows.get(p));
        if d <= r {
            out.push((p as u32, d));
        }
    }
}

/// The rows at `ranks` of `order` (after position `after`, where given) within Tanimoto distance
/// `eps` of `x`, with their distances, into `out`; the rows compared. Compiled for the CPU's
/// popcount as [`rows_within`].
#[multiversion(targets("x86_64+avx2+popcnt", "x86_64+popcnt", "aarch64+neon"))]
fn tanimoto_within(
    x: &[u64],
    rows: &Bits,
    order: &ByPopcount,
    ranks: std::ops::Range<usize>,
    after: Option<u32>,
    eps: f64,
    out: &mut Vec<(u32, f64)>,
) -> u64 {
    let mut compared = 0;
    for rank in ranks {
        let p = order.order[rank];
        if after.is_some_and(|a| p <= a) {
            continue;
        }
        compared += 1;
        let d = tanimoto(x, rows.get(p as usize));
        if d <= eps {
            out.push((p, d));
        }
    }
    compared
}

/// Every row's Hamming distance to `query` into `distances` (capped at `u16::MAX`) and their
/// histogram into `histogram`; compiled for the CPU's popcount as [`rows_within`]. Common widths
/// (64 to 512 bits) run with the row's words unrolled: four scalar `popcnt`s for a 256-bit row, not
/// a vector popcount and its horizontal sum (1,000 × 100,000 × 256 bits on 2 cores: 0.124 s against
/// 0.226 s for the generic loop, and 0.317 s without the popcount instruction). The histogram is counted four ways and summed, so that consecutive rows at
/// one distance do not wait on each other's increment.
#[multiversion(targets("x86_64+popcnt", "aarch64+neon"))]
fn distances_to(base: &Bits, query: &[u64], distances: &mut [u16], histogram: &mut [u32]) {
    fn fixed<const W: usize>(base: &Bits, query: &[u64], distances: &mut [u16]) {
        let query: [u64; W] = std::array::from_fn(|i| query[i]);
        for (row, d) in base.data.chunks_exact(W).zip(distances.iter_mut()) {
            let mut distance = 0;
            for i in 0..W {
                distance += (row[i] ^ query[i]).count_ones();
            }
            *d = distance.min(u16::MAX as u32) as u16;
        }
    }
    match base.words {
        1 => fixed::<1>(base, query, distances),
        2 => fixed::<2>(base, query, distances),
        4 => fixed::<4>(base, query, distances),
        8 => fixed::<8>(base, query, distances),
        _ => {
            for (p, d) in distances.iter_mut().enumerate() {
                *d = hamming(query, base.get(p)).min(u16::MAX as u32) as u16;
            }
        }
    }
    let bins = histogram.len();
    let mut ways = vec![0u32; 4 * bins];
    let mut quads = distances.chunks_exact(4);
    for quad in &mut quads {
        for (way, &d) in quad.iter().enumerate() {
            ways[way * bins + d as usize] += 1;
        }
    }
    for &d in quads.remainder() {
        ways[d as usize] += 1;
    }
    for (bin, count) in histogram.iter_mut().enumerate() {
        *count += ways[bin] + ways[bins + bin] + ways[2 * bins + bin] + ways[3 * bins + bin];
    }
}

/// Rows ordered by (popcount, position), and the popcounts in that order.
#[derive(Clone)]
pub(crate) struct ByPopcount {
    pub(crate) order: Vec<u32>,
    pub(crate) counts: Vec<u32>,
}

impl ByPopcount {
    pub(crate) fn new(bits: &Bits) -> Self {
        let popcount = |p: u32| bits.get(p as usize).iter().map(|w| w.count_ones()).sum::<u32>();
        let mut order: Vec<u32> = (0..bits.len() as u32).collect();
        order.par_sort_unstable_by_key(|&p| (popcount(p), p));
        let counts = order.iter().map(|&p| popcount(p)).collect();
        ByPopcount { order, counts }
    }

    /// The range of `order` whose popcounts lie in `[low, high]`.
    fn window(&self, (low, high): (u32, u32)) -> std::ops::Range<usize> {
        self.counts.partition_point(|&c| c < low)..self.counts.partition_point(|&c| c <= high)
    }
}

/// Tanimoto's distance of two bit strings: the sets' Jaccard distance over their set bits.
#[inline]
pub(crate) fn tanimoto(a: &[u64], b: &[u64]) -> f64 {
    let (common, union) = and_or_counts(a, b);
    jaccard_of_union(common, union)
}

/// The Tanimoto join within the threshold, each left row against the right rows of its popcount
/// window.
fn tanimoto_join(request: &JoinRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let JoinRequest { left, right, threshold: eps, self_join, .. } = *request;
    let (lb, rb) = (&left.bits, &right.bits);
    let order = ByPopcount::new(rb);
    let mut stats = RunStats { build_time: start.elapsed(), ..Default::default() };
    let probe = Instant::now();
    let checked = AtomicU64::new(0);
    let same = self_join.is_some();
    let ordered = self_join.is_some_and(|s| s.ordered);
    let include_self = self_join.is_some_and(|s| s.include_self);
    let blocks = left.len().div_ceil(BLOCK);
    sink.start(blocks as u64);
    (0..blocks).into_par_iter().try_for_each(|b| -> Result<()> {
        let mut writer = PairWriter::new(sink, ordered);
        let mut count = 0u64;
        let mut within = Vec::new();
        for a in b * BLOCK..((b + 1) * BLOCK).min(left.len()) {
            let x = lb.get(a);
            let ones: u32 = x.iter().map(|w| w.count_ones()).sum();
            within.clear();
            // A self-join's pairs from their smaller position.
            let after = same.then_some(a as u32);
            count += tanimoto_within(x, rb, &order, order.window(size_window(ones, eps)), after, eps, &mut within);
            for &(p, d) in &within {
                writer.push(a as u32, p, d)?;
            }
            if include_self {
                writer.push(a as u32, a as u32, 0.0)?;
            }
        }
        checked.fetch_add(count, Ordering::Relaxed);
        sink.advance(1);
        writer.flush()
    })?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The `k` nearest base rows of every query, ties by base position.
pub fn knn(request: &KnnRequest, sink: &dyn ResultSink) -> Result<RunStats> {
    let start = Instant::now();
    let KnnRequest { base, queries, k, metric, .. } = *request;
    let k = k.min(base.len());
    let mut stats = RunStats::default();
    if k == 0 || queries.is_empty() {
        return Ok(stats);
    }
    if base.bits.bits != queries.bits.bits {
        return datafusion::common::exec_err!(
            "knn: bit strings of different lengths: {} bits in the base, {} in the queries",
            base.bits.bits,
            queries.bits.bits
        );
    }
    let (bb, qb) = (&base.bits, &queries.bits);
    let checked = AtomicU64::new(0);
    // Distances fit the counting's u16 up to 65,534 bits; longer strings take the selection.
    if metric == Metric::Hamming && bb.bits < u16::MAX as usize {
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        rank_in_waves_with(
            sink,
            queries.len(),
            BLOCK / 8,
            || (vec![0u16; bb.len()], vec![0u32; bb.bits + 2]),
            |(distances, histogram), q| {
                checked.fetch_add(bb.len() as u64, Ordering::Relaxed);
                nearest_by_counting(bb, qb.get(q), k, distances, histogram)
            },
        )?;
        stats.candidates = checked.into_inner();
        stats.probe_time = probe.elapsed();
        return Ok(stats);
    }
    let order = ByPopcount::new(bb);
    stats.build_time = start.elapsed();
    let probe = Instant::now();
    rank_in_waves(sink, queries.len(), BLOCK / 8, |q| {
        let mut count = 0;
        let list = match metric {
            Metric::Hamming => nearest_by_selection(bb, qb.get(q), k, &mut count),
            _ => nearest_tanimoto(&order, bb, qb.get(q), k, &mut count),
        };
        checked.fetch_add(count, Ordering::Relaxed);
        list
    })?;
    stats.candidates = checked.into_inner();
    stats.probe_time = probe.elapsed();
    Ok(stats)
}

/// The `k` nearest rows of `base` to `query` by Hamming distance: every distance, then the
/// smallest `D` with at least `k` rows within it (a histogram of the distances, which are at most
/// the bits), the rows nearer than `D` and the first rows at `D` in position order.
fn nearest_by_counting(
    base: &Bits,
    query: &[u64],
    k: usize,
    distances: &mut [u16],
    histogram: &mut [u32],
) -> Vec<Neighbour> {
    histogram.iter_mut().for_each(|h| *h = 0);
    distances_to(base, query, distances, histogram);
    let (mut below, mut cut) = (0usize, 0usize);
    while below + (histogram[cut] as usize) < k {
        below += histogram[cut] as usize;
        cut += 1;
    }
    let mut at_cut = k - below;
    let mut list = Vec::with_capacity(k);
    for (p, &d) in distances.iter().enumerate() {
        let d = d as usize;
        if d < cut || (d == cut && at_cut > 0) {
            if d == cut {
                at_cut -= 1;
            }
            list.push(Neighbour { distance: d as f64, position: p as u32 });
        }
    }
    list.sort_unstable();
    list
}

/// The `k` nearest rows of `base` to `query` by Hamming distance, by selection (strings too long
/// for the counting's histogram).
fn nearest_by_selection(base: &Bits, query: &[u64], k: usize, checked: &mut u64) -> Vec<Neighbour> {
    let mut best = KSmallest::new(k);
    for p in 0..base.len() {
        best.push(Neighbour { distance: hamming(query, base.get(p)) as f64, position: p as u32 });
    }
    *checked += base.len() as u64;
    best.into_sorted()
}

/// The `k` nearest rows of `base` to `query` by Tanimoto: outwards from the query's popcount in
/// `order`, stopping on a side once its popcount bound exceeds the current k-th distance.
fn nearest_tanimoto(order: &ByPopcount, base: &Bits, query: &[u64], k: usize, checked: &mut u64) -> Vec<Neighbour> {
    let ones: u32 = query.iter().map(|w| w.count_ones()).sum();
    let mut best = KSmallest::new(k);
    // The bound of a row of `c` set bits: 1 − min / max (both 0: 0).
    let bound = |c: u32| jaccard_of_counts(ones.min(c), ones, c);
    let split = order.counts.partition_point(|&c| c < ones);
    let (mut down, mut up) = (split, split);
    loop {
        let next_down = (down > 0).then(|| bound(order.counts[down - 1]));
        let next_up = (up < order.order.len()).then(|| bound(order.counts[up]));
        let (rank, b) = match (next_down, next_up) {
            (Some(d), Some(u)) if d <= u => (down - 1, d),
            (_, Some(u)) => (up, u),
            (Some(d), None) => (down - 1, d),
            (None, None) => break,
        };
        if b > best.bound() {
            break;
        }
        if rank < down {
            down -= 1;
        } else {
            up += 1;
        }
        let p = order.order[rank];
        *checked += 1;
        best.push(Neighbour { distance: tanimoto(query, base.get(p as usize)), position: p });
    }
    best.into_sorted()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, FixedSizeBinaryArray, RecordBatch};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::{BitsStrategy, CPU_BITS_COSTS, join, knn, tanimoto};
    use crate::backend::plan::topk::Collector;
    use crate::backend::{JoinRequest, KnnRequest, ResultChunk, SelfJoin};
    use crate::op::{IndexChoice, Metric};
    use crate::vectors::bits::hamming;
    use crate::vectors::{VectorSource, Vectors};

    /// `n` strings of `bytes` bytes around a few centres (so that near pairs exist), some NULL.
    fn strings(n: usize, bytes: usize, seed: u64) -> Vectors {
        let mut rng = StdRng::seed_from_u64(seed);
        let centres: Vec<Vec<u8>> = (0..8).map(|_| (0..bytes).map(|_| rng.random()).collect()).collect();
        let rows: Vec<Option<Vec<u8>>> = (0..n)
            .map(|_| {
                if rng.random_range(0..30) == 0 {
                    return None;
                }
                let mut row = centres[rng.random_range(0..centres.len())].clone();
                for _ in 0..rng.random_range(0..6) {
                    let bit = rng.random_range(0..bytes * 8);
                    row[bit / 8] ^= 1 << (bit % 8);
                }
                Some(row)
            })
            .collect();
        let array = FixedSizeBinaryArray::try_from_sparse_iter_with_size(rows.into_iter(), bytes as i32).unwrap();
        let batch = RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)]).unwrap();
        let source = VectorSource::Bits { index: 0, bits: Some(bytes * 8) };
        Vectors::from_batch(&batch, &source, false, "t").unwrap()
    }

    fn rows_of(chunks: Vec<ResultChunk>) -> Vec<(u32, u32, u64, u32)> {
        let mut rows: Vec<_> = chunks
            .into_iter()
            .flat_map(|c| {
                let rank = if c.rank.is_empty() { vec![0; c.left.len()] } else { c.rank };
                c.left.into_iter().zip(c.right).zip(c.distance).zip(rank).map(|(((l, r), d), k)| (l, r, d.to_bits(), k))
            })
            .collect();
        rows.sort_unstable();
        rows
    }

    fn distance(metric: Metric, a: &[u64], b: &[u64]) -> f64 {
        if metric == Metric::Hamming { hamming(a, b) as f64 } else { tanimoto(a, b) }
    }

    #[test]
    fn joins_equal_every_pair_compared() {
        for bytes in [8, 9, 32] {
            let (a, b) = (strings(600, bytes, 1), strings(400, bytes, 2));
            for (metric, thresholds) in
                [(Metric::Hamming, vec![0.0, 1.0, 3.0, 4.0, 7.0]), (Metric::Jaccard, vec![0.0, 0.05, 0.1, 0.3, 1.0])]
            {
                for eps in thresholds {
                    for index in [IndexChoice::Auto, IndexChoice::BruteForce] {
                        for (same, right) in [(false, &b), (true, &a)] {
                            let self_join = same.then_some(SelfJoin { include_self: false, ordered: false });
                            let sink = Collector { chunks: Default::default(), chunk_rows: 1000 };
                            let request = JoinRequest {
                                left: &a,
                                right,
                                metric,
                                threshold: eps,
                                self_join,
                                index,
                                grid_dims: 0,
                                plan: Default::default(),
                            };
                            join(&request, &sink).unwrap();
                            let mut expected = Vec::new();
                            for i in 0..a.len() {
                                for j in if same { i + 1 } else { 0 }..right.len() {
                                    let d = distance(metric, a.bits.get(i), right.bits.get(j));
                                    if d <= eps {
                                        expected.push((i as u32, j as u32, d.to_bits(), 0));
                                    }
                                }
                            }
                            expected.sort_unstable();
                            assert_eq!(
                                rows_of(sink.chunks.into_inner().unwrap()),
                                expected,
                                "{bytes} bytes {metric} {eps} {index:?} self {same}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_cost_model_indexes_blocks_at_small_radii() {
        let (a, b) = (strings(20_000, 8, 5), strings(20_000, 8, 6));
        assert!(matches!(
            BitsStrategy::choose(&a.bits, &b.bits, 3, false, IndexChoice::Auto, CPU_BITS_COSTS),
            BitsStrategy::Blocks { .. }
        ));
        assert!(matches!(
            BitsStrategy::choose(&a.bits, &b.bits, 3, false, IndexChoice::BruteForce, CPU_BITS_COSTS),
            BitsStrategy::BruteForce
        ));
    }

    #[test]
    fn knn_equals_every_distance_ranked_ties_by_position() {
        // Widths of 1 to 9 words: the unrolled ones (1, 2, 4, 8) and the generic loop.
        for bytes in [8, 16, 24, 32, 40, 64, 72] {
            knn_at_width(bytes);
        }
    }

    fn knn_at_width(bytes: usize) {
        let (base, queries) = (strings(800, bytes, 3), strings(50, bytes, 4));
        for metric in [Metric::Hamming, Metric::Jaccard] {
            for k in [1, 7, 100, 5000] {
                let sink = Collector { chunks: Default::default(), chunk_rows: 1000 };
                let request =
                    KnnRequest { base: &base, queries: &queries, metric, k, approx: None, index: IndexChoice::Auto };
                knn(&request, &sink).unwrap();
                let mut expected = Vec::new();
                for q in 0..queries.len() {
                    let mut all: Vec<(f64, u32)> = (0..base.len())
                        .map(|p| (distance(metric, queries.bits.get(q), base.bits.get(p)), p as u32))
                        .collect();
                    all.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                    for (rank, (d, p)) in all.into_iter().take(k).enumerate() {
                        expected.push((q as u32, p, d.to_bits(), rank as u32 + 1));
                    }
                }
                expected.sort_unstable();
                assert_eq!(rows_of(sink.chunks.into_inner().unwrap()), expected, "{bytes} bytes {metric} k {k}");
            }
        }
    }
}
