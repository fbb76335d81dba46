//! The Multicurves index's builds on the device (its curves' order, its kNN graph) against the
//! cores' builds of the same index.

use std::sync::Arc;
use std::time::Instant;

use super::data::Dataset;
use crate::Metric;
use crate::datagen::{self, Distribution};

/// The Multicurves index with its curves ordered on the device (`build_on_device`) against the
/// one ordered on the cores: every curve's keys and positions the same, and the queries keyed the
/// same (the bounds the same); with the time each build took. Returns the failures.
pub(super) fn check_device_curves(device: &Arc<crate::cuda::GpuDevice>, datasets: &[Dataset]) -> usize {
    use crate::index::curves::{Geometry, Multicurves};
    let large = ("blobs", datagen::generate(Distribution::Blobs, 200_000, 128, 21), 128);
    let cases = [(&datasets[2], Geometry::Raw), (&datasets[8], Geometry::Unit), (&large, Geometry::Raw)];
    let mut failures = 0;
    for ((name, values, dim), geometry) in cases {
        let base = crate::vectors::Vectors::new(*dim, values.clone());
        let started = Instant::now();
        let cores = Multicurves::build(&base, geometry);
        let cores_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let (on_device, lists) = crate::backend::gpu::build_on_device(device, &base, geometry);
        let device_ms = started.elapsed().as_secs_f64() * 1e3;
        let what = format!("{name} {} × {dim} ({geometry:?}): the curves ordered on the GPU", base.len());
        let same_lists = (0..cores.curve_count()).all(|c| cores.curve(c) == on_device.curve(c));
        let rows = 0..base.len().min(64);
        let same_keys = cores.query_keys(&base, rows.clone()).1 == on_device.query_keys(&base, rows).1;
        match lists {
            Err(e) => {
                failures += 1;
                println!("selftest: GPU ERROR: {what}: {e}");
            }
            Ok(_) if same_lists && same_keys => {
                println!("selftest: {what} are the cores' (build {device_ms:.0} ms, on the cores {cores_ms:.0} ms)")
            }
            Ok(_) => {
                failures += 1;
                println!("selftest: MISMATCH: {what}: lists the same {same_lists}, query keys the same {same_keys}");
            }
        }
    }
    failures
}

/// The kNN graph built on the device (graph_nearest) against the cores' (index/graph.rs): every
/// row lists distinct rows other than itself, and the rows' own nearest hold as many of their
/// true nearest (by f32 distance over the index's rows, on every 50th row) as the cores' less
/// 0.02; with the time each build took. Returns the failures.
pub(super) fn check_device_graph(device: &Arc<crate::cuda::GpuDevice>, datasets: &[Dataset]) -> usize {
    use crate::index::curves::{Geometry, Multicurves};
    use crate::index::graph::{DEGREE, NeighbourGraph};
    let large = ("blobs", datagen::generate(Distribution::Blobs, 200_000, 128, 21), 128);
    let cases =
        [(&datasets[7], Metric::L2), (&datasets[7], Metric::Cosine), (&datasets[11], Metric::L1), (&large, Metric::L2)];
    let mut failures = 0;
    for ((name, values, dim), metric) in cases {
        let base = crate::vectors::Vectors::new(*dim, values.clone());
        let index = Multicurves::build(&base, Geometry::of(metric).expect("an approximate metric"));
        let started = Instant::now();
        let cores = crate::backend::cpu::approx::nearest_graph(&index);
        let cores_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let built = crate::backend::gpu::graph_built_on_device(device, &index, *dim, metric);
        let device_ms = started.elapsed().as_secs_f64() * 1e3;
        let what = format!("{name} {} × {dim} ({metric}): the kNN graph built on the GPU", base.len());
        let on_device = match built {
            Ok(graph) => graph,
            Err(e) => {
                failures += 1;
                println!("selftest: GPU ERROR: {what}: {e}");
                continue;
            }
        };
        let n = index.len();
        let rows = index.all_values();
        let score = |i: usize, j: usize| -> f32 {
            let (a, b) = (&rows[i * dim..][..*dim], &rows[j * dim..][..*dim]);
            let terms = a.iter().zip(b).map(|(x, y)| (x - y).abs());
            match metric {
                Metric::L1 => terms.sum(),
                _ => terms.map(|t| t * t).sum(),
            }
        };
        let sample: Vec<usize> = (0..n).step_by(50).collect();
        let recall = |graph: &NeighbourGraph| {
            use rayon::iter::{IntoParallelRefIterator, ParallelIterator};
            let found: usize = sample
                .par_iter()
                .map(|&i| {
                    let mut all: Vec<(f32, usize)> = (0..n).filter(|&j| j != i).map(|j| (score(i, j), j)).collect();
                    all.select_nth_unstable_by(DEGREE - 1, |a, b| a.0.total_cmp(&b.0));
                    let own: Vec<u32> = graph.neighbours(i).take(DEGREE).collect();
                    all[..DEGREE].iter().filter(|(_, j)| own.contains(&(*j as u32))).count()
                })
                .sum();
            found as f64 / (sample.len() * DEGREE) as f64
        };
        let malformed = (0..n)
            .filter(|&i| {
                let mut edges: Vec<u32> = on_device.neighbours(i).collect();
                let listed = edges.len();
                edges.sort_unstable();
                edges.dedup();
                edges.len() != listed || edges.contains(&(i as u32)) || edges.last().is_some_and(|&j| j as usize >= n)
            })
            .count();
        let (cores_recall, device_recall) = (recall(&cores), recall(&on_device));
        let verdict = format!(
            "recall of the {DEGREE} nearest {device_recall:.3}, the cores' {cores_recall:.3} (build {device_ms:.0} ms, on the cores {cores_ms:.0} ms)"
        );
        if malformed > 0 || device_recall < cores_recall - 0.02 {
            failures += 1;
            println!("selftest: MISMATCH: {what}: {verdict}, {malformed} rows with repeated, own or missing rows");
        } else {
            println!("selftest: {what}: {verdict}");
        }
    }
    failures
}
