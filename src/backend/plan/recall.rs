//! The recall target of an approximate kNN (`approx_recall`, and `approx=true` alone, whose
//! target is 0.95): the backend chooses the search's effort on a sample of queries, then answers
//! every query at it.
//!
//! How the effort is chosen. A sample of [`SAMPLE_QUERIES`] queries is answered exactly, then by
//! the backend's own approximate search (the same search the whole run makes: on the cores
//! through the kNN graph or by the curves alone as the whole run's queries decide) at effort 1,
//! halved while the sample still meets the target (down to 1/8), or doubled until it does (up to
//! 64), then three quarters of the effort found where half of it misses. A query's recall is the
//! share of its k true neighbours the search returned — a returned row at or within the k-th true
//! distance counts, so ties at the k-th cannot lower it — and the sample meets the target when
//! the lower end of the one-sided 95 % confidence interval of their mean (the mean less 1.645
//! standard errors) is at or above it. Where the search at the effort
//! needed takes as long a query as the exact kNN did on the same sample, or no effort up to 64
//! meets the target, the exact kNN answers every query (recall 1).
//!
//! Its error. The sample's queries are taken evenly through the request's (every Q/256-th), so a
//! query file sorted by cluster is sampled across its clusters. With 256 queries the standard
//! error of the mean recall is σ/16, where σ, the spread of one query's recall, is about 0.1 at a
//! mean of 0.95 and k = 10 (Fashion-MNIST): the bound sits ~0.01 below the sample's mean, and the
//! whole run's recall is below the target by more than that only where the sample misrepresents
//! the queries (docs/approx.md gives the measured recalls).
//!
//! When to calibrate at all. The calibration costs the index's build (where it is not built) and
//! the sample's exact kNN. Over a base read for this run alone, the exact kNN answers instead
//! where it costs no more than that, and always for fewer than [`OWN_SAMPLE_QUERIES`] queries
//! (the exact answer of 512 queries costs no more than the sample's and the build). Over a kept
//! base — vectors kept across queries: an in-memory table, or a file's kept by the conversion
//! cache — the exact kNN answers until what its answers have cost reaches what the calibration
//! would (ski rental: a base searched once or twice pays for neither, one searched often at most
//! twice the better choice). Then many queries are their own sample, and fewer are stood for by
//! base rows used as queries — each row's own entry dropped from both answers, so that finding
//! itself does not count.
//!
//! Over a kept base the choice is kept with the index, and later batches with the same k, metric
//! and target take it without a sample: the sample's exact kNN costs about what the search of
//! 10,000 queries does (Fashion-MNIST, 256 queries: 0.5 s on 2 cores, of which 0.19 s prepares
//! the base for the matrix products), which a batch would otherwise pay every time. Later
//! queries from another distribution than the sample's can fall below the target.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::common::Result;

use crate::backend::plan::topk::Collector;
use crate::backend::{KnnRequest, ResultSink, RunStats};
use crate::costs::{APPROX_BUILD_NS_PER_FLOP, APPROX_BUILD_NS_PER_KEY};
use crate::index::KeptIndexes;
use crate::index::curves::{CURVES, Calibration, Geometry, PCA_SAMPLE, PRINCIPAL_DIMS};
use crate::op::Approx;
use crate::vectors::Vectors;

/// Queries a calibration answers exactly and approximately.
const SAMPLE_QUERIES: usize = 256;
/// Queries from which a request is its own sample; fewer are answered exactly over a base read
/// for the run, and stood for by base rows over a kept base.
const OWN_SAMPLE_QUERIES: usize = 2 * SAMPLE_QUERIES + 1;
/// The one-sided 95 % quantile of the normal distribution: the sample's mean recall less this
/// many standard errors must reach the target.
const CONFIDENCE_Z: f64 = 1.645;
/// The efforts a calibration may choose: powers of two from 1/8 to 64.
const LOWEST_EFFORT: f64 = 0.125;
const HIGHEST_EFFORT: f64 = 64.0;

/// The backend's own kNN, which a calibration calls for the sample's exact and approximate
/// answers and then for the whole request.
pub(super) type KnnRun<'a> = &'a dyn Fn(&KnnRequest, &dyn ResultSink) -> Result<RunStats>;

/// Answers `request` (its approximate search asked to reach `target`) by `run` at the effort a
/// calibration chooses, or exactly where that is the cheaper way to the target. `searcher` names
/// the backend's search (a kept calibration is its own), `exact_ns` estimates the exact kNN of the
/// whole request on that backend.
pub(crate) fn knn_to_recall(
    request: &KnnRequest,
    approx: Approx,
    target: f64,
    searcher: &str,
    exact_ns: f64,
    run: KnnRun,
    sink: &dyn ResultSink,
) -> Result<RunStats> {
    let start = Instant::now();
    let (n, queries) = (request.base.len(), request.queries.len());
    let k = request.k.min(n);
    let at = |effort: f64| Approx { effort, recall: None, planned_queries: Some(queries), ..approx };
    if k == 0 || queries == 0 {
        return run(&KnnRequest { approx: Some(at(approx.effort)), ..*request }, sink);
    }
    let geometry = Geometry::of(request.metric).expect("approx metrics are checked at planning (functions::table)");
    let kept = request.base.resident().is_some();
    let key = format!("{searcher}, {}, k={k}, recall={target}", request.metric);
    // The index's build on the cores, where it is not built (the GPU's is faster; the cores'
    // bounds it).
    let built = request.base.curves_kept(geometry);
    let build_ns =
        if built { 0.0 } else { curves_build_one_core_ns(n, request.base.dim) / rayon::current_num_threads() as f64 };
    // An index keeps the choices made for it: one kept with a kept base, or loaded from the index
    // store (exec/run/stored.rs, which stores it again with the new choice).
    let kept_choice = || built.then(|| request.base.curves(geometry).0.calibration(&key)).flatten();
    let keep = |choice: Calibration| {
        // The calibration built the index where it searched at all.
        if request.base.curves_kept(geometry) {
            request.base.curves(geometry).0.keep_calibration(key.clone(), choice);
        }
    };
    let own = queries >= OWN_SAMPLE_QUERIES;
    // What the calibration costs beyond the search: the index's build and the sample's exact kNN.
    let calibration_ns = build_ns + exact_ns * SAMPLE_QUERIES as f64 / queries as f64;
    // Answered exactly: over a base read for this run alone, where the exact answer costs no more
    // than the calibration would; over a kept base (ski rental), until what its exact answers have
    // cost reaches that, so that a base searched once or twice pays for neither the build nor the
    // sample, and one searched often at most twice the better choice.
    let exact_is_cheaper = || {
        if kept { request.base.forgo_curves(exact_ns) < calibration_ns } else { !own || exact_ns <= calibration_ns }
    };
    let calibration = if target >= 1.0 {
        None
    } else if let Some(choice) = kept_choice() {
        Some(choice)
    } else if exact_is_cheaper() {
        None
    } else {
        // Many queries are their own sample; fewer stand for later ones by base rows.
        let positions = evenly(if own { queries } else { n }, SAMPLE_QUERIES.min(n));
        let (sample, rows) = if own {
            (request.queries.select(&positions), None)
        } else {
            (request.base.select(&positions), Some(positions.as_slice()))
        };
        let choice = calibrate(request, &sample, rows, target, approx.effort, &at, run)?;
        keep(choice);
        Some(choice)
    };
    // Answered exactly without a sample: every true neighbour of every query.
    let every = (queries * k) as u64;
    let calibration = calibration.unwrap_or(Calibration { effort: None, found: every, truth: every });
    let chosen = KnnRequest { approx: calibration.effort.map(at), ..*request };
    let mut stats = run(&chosen, sink)?;
    // The calibration is part of choosing the strategy.
    stats.build_time += start.elapsed().saturating_sub(stats.build_time + stats.probe_time);
    stats.exact_queries = if calibration.effort.is_none() { queries as u64 } else { 0 };
    stats.chosen_effort = calibration.effort;
    stats.recall_sample = (calibration.found, calibration.truth);
    Ok(stats)
}

/// One core's time to build the Multicurves index of `n` rows of `dim` values: the projections
/// (the sample's covariance, the base onto up to 192 axes) and the keys (a Hilbert key a row and
/// curve, its share of the sorts).
pub(crate) fn curves_build_one_core_ns(n: usize, dim: usize) -> f64 {
    let axes = dim.min(PRINCIPAL_DIMS);
    let flops = 2.0 * (PCA_SAMPLE * dim * dim) as f64 + 2.0 * (n * dim * axes) as f64;
    flops * APPROX_BUILD_NS_PER_FLOP + (n * CURVES) as f64 * APPROX_BUILD_NS_PER_KEY
}

/// `count` positions taken evenly through `0..len`.
fn evenly(len: usize, count: usize) -> Vec<u32> {
    (0..count).map(|i| (i * len / count) as u32).collect()
}

/// What a search at one effort did on the sample.
struct Trial {
    found: u64,
    truth: u64,
    /// Whether the lower end of the confidence interval of the mean recall reaches the target.
    meets: bool,
    /// The search's time, its index's build left out.
    time: Duration,
}

/// Chooses the effort for `target` on the queries `sample` (`own`: their positions in the base,
/// where they are base rows, whose own entries are dropped from both answers), starting at
/// `start`; `at(effort)` is the search's settings at an effort.
fn calibrate(
    request: &KnnRequest,
    sample: &Vectors,
    own: Option<&[u32]>,
    target: f64,
    start: f64,
    at: &dyn Fn(f64) -> Approx,
    run: KnnRun,
) -> Result<Calibration> {
    let k = request.k.min(request.base.len());
    // Base rows as queries ask for one more, their own entry among them.
    let own = own.filter(|_| k < request.base.len());
    let asked = k + usize::from(own.is_some());
    let ask = |approx: Option<Approx>| {
        let collector = Collector { chunks: Mutex::new(Vec::new()), chunk_rows: 1 << 16 };
        let began = Instant::now();
        let stats = run(&KnnRequest { queries: sample, k: asked, approx, ..*request }, &collector)?;
        let time = began.elapsed().saturating_sub(stats.build_time);
        Ok::<_, datafusion::error::DataFusionError>((lists(collector, sample.len(), own), time))
    };
    let (truth, exact_time) = ask(None)?;
    let trial = |effort: f64| -> Result<Trial> {
        let (found, time) = ask(Some(at(effort)))?;
        let (hits, total, meets) = recall(&truth, &found, k, target);
        Ok(Trial { found: hits, truth: total, meets, time })
    };
    // The exact kNN finds every true neighbour.
    let truths = truth.iter().map(|t| t.len().min(k) as u64).sum();
    let exactly = Calibration { effort: None, found: truths, truth: truths };
    let mut effort = start.clamp(LOWEST_EFFORT, HIGHEST_EFFORT);
    let mut tried = trial(effort)?;
    // Whether half the effort found is known to miss the target.
    let mut half_misses = false;
    if tried.meets {
        // Lower efforts while they still meet it: each is faster.
        while effort / 2.0 >= LOWEST_EFFORT {
            let lower = trial(effort / 2.0)?;
            if !lower.meets {
                half_misses = true;
                break;
            }
            (effort, tried) = (effort / 2.0, lower);
        }
    } else {
        while !tried.meets {
            if tried.time >= exact_time || effort * 2.0 > HIGHEST_EFFORT {
                return Ok(exactly);
            }
            effort *= 2.0;
            half_misses = true;
            tried = trial(effort)?;
        }
    }
    // Between an effort that misses and its double, three quarters of the double: a doubling
    // alone can cost up to twice the search the target needs (GloVe at 0.95: effort 8 answers
    // 5,941 queries/s where effort 4 reached 0.963 but its sample's bound fell short).
    if half_misses {
        let between = trial(effort * 0.75)?;
        if between.meets {
            (effort, tried) = (effort * 0.75, between);
        }
    }
    // The exact kNN where it is as fast as the search that meets the target. One disturbed timing
    // (another process on the cores) must not decide it: a search that looks no faster is timed
    // again, and so is the exact kNN, the faster of each pair counting.
    let search_wins = tried.time < exact_time || {
        let exact_again = ask(None)?.1.min(exact_time);
        trial(effort)?.time.min(tried.time) < exact_again
    };
    Ok(if search_wins { Calibration { effort: Some(effort), found: tried.found, truth: tried.truth } } else { exactly })
}

/// The collected rows as one list per sample query, ranked, each query's own entry dropped where
/// the queries are base rows (`own`).
fn lists(collector: Collector, queries: usize, own: Option<&[u32]>) -> Vec<Vec<(f64, u32)>> {
    let mut lists = vec![Vec::new(); queries];
    for chunk in collector.chunks.into_inner().unwrap_or_else(|e| e.into_inner()) {
        for i in 0..chunk.len() {
            lists[chunk.left[i] as usize].push((chunk.rank[i], chunk.distance[i], chunk.right[i]));
        }
    }
    lists
        .into_iter()
        .enumerate()
        .map(|(q, mut list)| {
            list.sort_unstable_by_key(|&(rank, ..)| rank);
            let own = own.map(|positions| positions[q]);
            list.into_iter().filter(|&(_, _, p)| Some(p) != own).map(|(_, d, p)| (d, p)).collect()
        })
        .collect()
}

/// The true neighbours `found` holds of `truth`'s (each query's first `k`), in all, and whether
/// the lower end of the one-sided 95 % confidence interval of the mean recall reaches `target`.
/// A found row at or within a query's k-th true distance counts (capped at k a query): the exact
/// kNN breaks ties by position, the search may return another of the tied rows.
fn recall(truth: &[Vec<(f64, u32)>], found: &[Vec<(f64, u32)>], k: usize, target: f64) -> (u64, u64, bool) {
    let (mut hits, mut total, mut sum, mut squares, mut counted) = (0u64, 0u64, 0.0, 0.0, 0usize);
    for (want, got) in truth.iter().zip(found) {
        let want = &want[..want.len().min(k)];
        let Some(&(kth, _)) = want.last() else { continue };
        let found = got.iter().take(k).filter(|&&(d, _)| d <= kth).count().min(want.len());
        let share = found as f64 / want.len() as f64;
        (hits, total) = (hits + found as u64, total + want.len() as u64);
        (sum, squares, counted) = (sum + share, squares + share * share, counted + 1);
    }
    if counted == 0 {
        return (0, 0, true);
    }
    let m = counted as f64;
    let mean = sum / m;
    let variance = if counted > 1 { ((squares - m * mean * mean) / (m - 1.0)).max(0.0) } else { 0.0 };
    (hits, total, mean - CONFIDENCE_Z * (variance / m).sqrt() >= target)
}

#[cfg(test)]
mod tests {
    use super::{evenly, recall};

    #[test]
    fn ties_at_the_kth_distance_count_and_the_bound_widens_with_the_spread() {
        let truth = vec![vec![(1.0, 0), (2.0, 1), (2.0, 2)], vec![(0.5, 3), (0.7, 4), (0.9, 5)]];
        // The first query's search returned the other row tied at the k-th distance.
        let found = vec![vec![(1.0, 0), (2.0, 2), (2.0, 7)], vec![(0.5, 3), (0.7, 4), (0.9, 5)]];
        assert_eq!(recall(&truth, &found, 2, 1.0), (4, 4, true));
        // One query in two misses half its neighbours: the mean is 0.75, its bound far below.
        let missed = vec![vec![(1.0, 0), (3.0, 9)], vec![(0.5, 3), (0.7, 4)]];
        let (hits, total, meets) = recall(&truth, &missed, 2, 0.7);
        assert_eq!((hits, total, meets), (3, 4, false));
    }

    #[test]
    fn samples_are_taken_evenly_through_the_queries() {
        assert_eq!(evenly(10, 5), vec![0, 2, 4, 6, 8]);
        assert_eq!(evenly(3, 3), vec![0, 1, 2]);
    }
}
