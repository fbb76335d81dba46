//! DBSCAN over the ε-graph of one input (`dbscan`), by any backend's self-join, without listing
//! the graph's edges: the pairs stream through sinks that keep only what each row needs.
//!
//! 1. The degrees: an unordered self-join within ε whose pairs only add one to each end's count;
//!    a row is a core row when its count plus one (itself, as scikit-learn counts) reaches
//!    `min_points`. With `min_points` ≤ 1 every row is a core row and this pass is skipped. While
//!    the pairs number at most [`KEPT_PAIRS_PER_ROW`] a row, the pass also keeps them (16 bytes a
//!    pair: memory linear in the rows, as the degrees'), and step 2 reads them instead of running
//!    the join again; past that bound it drops them and step 2 joins again.
//! 2. The components: the same join's pairs, each pair of core rows united in a concurrent
//!    union-find that always links the larger root under the smaller, so that a component's root
//!    is its smallest position — the cluster's id, whatever order the pairs come in; each pair of
//!    a core and a non-core row offers the core row to the non-core one, which keeps the nearest
//!    (ties to the smaller position).
//! 3. The labels: a core row's cluster is its root; a border row (non-core, with a core row
//!    within ε) takes its nearest core row's; every other row is noise.
//!
//! Every label is a function of the pairs within ε and their exact distances, which every backend
//! gives alike, so the clusters are the same on every backend, division and run. Memory: the
//! degrees, the union-find and the border rows' nearest core rows, a few words a row.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use crate::backend::request::{JoinRequest, SelfJoin};
use crate::backend::sink::{NOISE, ResultChunk, ResultSink};
use crate::backend::stats::RunStats;
use crate::op::{IndexChoice, Metric};
use crate::vectors::Vectors;

/// What a clustering is asked.
#[derive(Debug)]
pub struct ClusterRequest<'a> {
    /// The rows clustered.
    pub rows: &'a Vectors,
    pub metric: Metric,
    /// Largest distance of an edge.
    pub eps: f64,
    /// Rows within `eps` (itself included) that make a core row.
    pub min_points: usize,
    pub index: IndexChoice,
    pub grid_dims: usize,
}

/// Rows of a chunk the passes' sinks take at once.
const PASS_CHUNK_ROWS: usize = 1 << 16;
/// Locks over the border rows' nearest core rows.
const BORDER_SHARDS: usize = 64;
/// Pairs a row, on average, that the degrees' pass keeps for the components' pass: at 16 bytes a
/// pair, 128 bytes a row at most. The join a second pass would repeat costs about as much as the
/// first (P3's 10⁶ points: 140 ms of 520 ms on 2 cores), and a graph this sparse is what DBSCAN's
/// useful ε gives (P3: 4.6 pairs a row).
pub const KEPT_PAIRS_PER_ROW: usize = 8;

/// The clustering of `request` by `join` (a backend's self-join), its labels sent to `sink` as
/// chunks of (row, cluster root or [`NOISE`], core), in row order.
pub fn by_joins(
    join: impl Fn(&JoinRequest, &dyn ResultSink) -> Result<RunStats>,
    request: &ClusterRequest,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let ClusterRequest { rows, metric, eps, min_points, index, grid_dims } = *request;
    let n = rows.len();
    let self_join = Some(SelfJoin { include_self: false, ordered: false });
    let pairs = JoinRequest {
        left: rows,
        right: rows,
        metric,
        threshold: eps,
        self_join,
        index,
        grid_dims,
        plan: Default::default(),
    };
    let mut stats = RunStats::default();
    let mut kept = None;
    let core: Vec<bool> = if min_points <= 1 {
        vec![true; n]
    } else {
        let degrees = Degrees {
            counts: (0..n).map(|_| AtomicU32::new(1)).collect(),
            kept: Mutex::new(Some(Vec::new())),
            kept_pairs: AtomicU64::new(0),
            kept_limit: (n * KEPT_PAIRS_PER_ROW) as u64,
        };
        stats.add(&join(&pairs, &degrees)?);
        stats.union_passes += 1;
        kept = degrees.kept.into_inner().unwrap_or_else(|e| e.into_inner());
        degrees.counts.into_iter().map(|c| c.into_inner() as usize >= min_points).collect()
    };
    stats.cluster_cores = core.iter().filter(|&&c| c).count() as u64;
    let components = Components {
        core: &core,
        parent: (0..n as u32).map(AtomicU32::new).collect(),
        nearest: (0..BORDER_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        edges: AtomicU64::new(0),
    };
    if let Some(chunks) = kept {
        chunks.into_par_iter().try_for_each(|chunk| components.send(chunk))?;
    } else if n > 1 {
        // (A run of one row has no pair to find.)
        let run = join(&pairs, &components)?;
        stats.add(&run);
        stats.union_passes += 1;
    }
    stats.cluster_edges = components.edges.load(Ordering::Relaxed);
    let borders: HashMap<u32, (f64, u32)> = components
        .nearest
        .into_iter()
        .flat_map(|shard| shard.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect();
    let labels: Vec<u32> = (0..n as u32)
        .into_par_iter()
        .map(|p| match (core[p as usize], borders.get(&p)) {
            (true, _) => find(&components.parent, p),
            (false, Some(&(_, nearest))) => find(&components.parent, nearest),
            (false, None) => NOISE,
        })
        .collect();
    sink.start(n.div_ceil(sink.chunk_rows().max(1)) as u64);
    for first in (0..n).step_by(sink.chunk_rows().max(1)) {
        let end = (first + sink.chunk_rows().max(1)).min(n);
        let chunk = ResultChunk {
            left: (first as u32..end as u32).collect(),
            cluster: labels[first..end].to_vec(),
            core: core[first..end].to_vec(),
            ..Default::default()
        };
        sink.send(chunk)?;
        sink.advance(1);
    }
    Ok(stats)
}

/// The first pass's sink: every pair adds one to each end's count, and the chunks are kept while
/// their pairs number at most `kept_limit` (then `kept` is `None`).
struct Degrees {
    counts: Vec<AtomicU32>,
    kept: Mutex<Option<Vec<ResultChunk>>>,
    kept_pairs: AtomicU64,
    kept_limit: u64,
}

impl ResultSink for Degrees {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        for (&a, &b) in chunk.left.iter().zip(&chunk.right) {
            self.counts[a as usize].fetch_add(1, Ordering::Relaxed);
            self.counts[b as usize].fetch_add(1, Ordering::Relaxed);
        }
        let pairs = chunk.left.len() as u64;
        if self.kept_pairs.fetch_add(pairs, Ordering::Relaxed) + pairs <= self.kept_limit {
            if let Some(kept) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                kept.push(chunk);
            }
        } else {
            *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        Ok(())
    }

    fn chunk_rows(&self) -> usize {
        PASS_CHUNK_ROWS
    }
}

/// The second pass's sink: core pairs united, border rows' nearest core rows kept.
struct Components<'c> {
    core: &'c [bool],
    parent: Vec<AtomicU32>,
    /// Each border row's nearest core row (distance, position), in shards by row.
    nearest: Vec<Mutex<HashMap<u32, (f64, u32)>>>,
    /// Pairs of core rows united.
    edges: AtomicU64,
}

impl Components<'_> {
    /// Offers core row `c` at `distance` to border row `b`.
    fn offer(&self, b: u32, c: u32, distance: f64) {
        let mut shard = self.nearest[b as usize % BORDER_SHARDS].lock().unwrap_or_else(|e| e.into_inner());
        let entry = shard.entry(b).or_insert((distance, c));
        if (distance, c) < *entry {
            *entry = (distance, c);
        }
    }
}

impl ResultSink for Components<'_> {
    fn send(&self, chunk: ResultChunk) -> Result<()> {
        let mut edges = 0;
        for ((&a, &b), &d) in chunk.left.iter().zip(&chunk.right).zip(&chunk.distance) {
            match (self.core[a as usize], self.core[b as usize]) {
                (true, true) => {
                    union(&self.parent, a, b);
                    edges += 1;
                }
                (true, false) => self.offer(b, a, d),
                (false, true) => self.offer(a, b, d),
                (false, false) => {}
            }
        }
        self.edges.fetch_add(edges, Ordering::Relaxed);
        Ok(())
    }

    fn chunk_rows(&self) -> usize {
        PASS_CHUNK_ROWS
    }
}

/// The root of `x` (halving the path as it goes: each row visited is pointed at its grandparent,
/// which is in its set, so a concurrent union sees a valid forest).
fn find(parent: &[AtomicU32], mut x: u32) -> u32 {
    loop {
        let p = parent[x as usize].load(Ordering::Acquire);
        if p == x {
            return x;
        }
        let grandparent = parent[p as usize].load(Ordering::Acquire);
        if grandparent != p {
            let _ = parent[x as usize].compare_exchange(p, grandparent, Ordering::AcqRel, Ordering::Relaxed);
        }
        x = p;
    }
}

/// Unites the sets of `a` and `b`, the larger root linked under the smaller: a root only ever
/// gains a parent smaller than itself, so a set's root is its smallest member. The link is a
/// compare-and-swap on a root, retried from the roots where another thread linked it first.
fn union(parent: &[AtomicU32], a: u32, b: u32) {
    loop {
        let (ra, rb) = (find(parent, a), find(parent, b));
        if ra == rb {
            return;
        }
        let (low, high) = if ra < rb { (ra, rb) } else { (rb, ra) };
        if parent[high as usize].compare_exchange(high, low, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use rayon::iter::{IntoParallelIterator, ParallelIterator};

    use super::{find, union};

    #[test]
    fn concurrent_unions_leave_each_set_rooted_at_its_smallest_member() {
        let n = 100_000u32;
        let parent: Vec<AtomicU32> = (0..n).map(AtomicU32::new).collect();
        // Two rows of every three united with another row, on every core, in no fixed order.
        (0..n).into_par_iter().for_each(|i| {
            if i % 3 != 0 {
                union(&parent, i, (i * 7 + 13) % n);
            }
        });
        // The reference: the same unions in order, one thread.
        let mut reference: Vec<u32> = (0..n).collect();
        fn root(r: &mut [u32], mut x: u32) -> u32 {
            while r[x as usize] != x {
                x = r[x as usize];
            }
            x
        }
        for i in 0..n {
            if i % 3 != 0 {
                let (a, b) = (root(&mut reference, i), root(&mut reference, (i * 7 + 13) % n));
                if a != b {
                    reference[a.max(b) as usize] = a.min(b);
                }
            }
        }
        for i in 0..n {
            assert_eq!(find(&parent, i), root(&mut reference, i), "row {i}");
        }
    }
}
