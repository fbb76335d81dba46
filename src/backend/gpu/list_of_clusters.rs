//! Joins and range queries through the List of Clusters on the GPU (`index=list_of_clusters`
//! with `device=gpu`, kernels/clusters.cu): the index over the right input is built on the host
//! (the same one, kept with the vectors, that the CPU searches: `backend::cpu::list_of_clusters`), its arrays
//! are uploaded, and one block per left row runs Barrientos et al.'s search. The index's space is
//! the CPU's (the rows under L2, L1 or L∞, cosine's unit rows under L2, the strings under the edit
//! distance) with its rounding slack, and the exact test decides every candidate, so the pairs are
//! the CPU's and the scan's, bit for bit.

use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IntoParallelIterator, ParallelIterator};

use super::appended::appended_pairs;
use super::text::{alphabet_of, coded, pattern_words};
use crate::backend::cpu::list_of_clusters::index_of;
use crate::backend::gpu::filter::metric_code;
use crate::backend::gpu::sides::ExactRows;
use crate::backend::gpu::{GpuBackend, RunResult};
use crate::backend::plan::bounds::radius;
use crate::backend::plan::exact::{ExactCheck, write_self_pairs};
use crate::backend::{JoinRequest, PairWriter, ResultSink, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::abi::JoinParams;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{
    ClusterTextInputs, ClusterVectorInputs, DeviceClusterList, DeviceStrings, clusters_range_text,
    clusters_range_vectors,
};
use crate::cuda::memory::upload;
use crate::op::{Metric, row_norm};
use crate::vectors::Vectors;

impl GpuBackend {
    pub(super) fn gpu_clusters_join(
        &self,
        request: &JoinRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> RunResult<RunStats> {
        let JoinRequest { left, right, metric, threshold, self_join, .. } = *request;
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if left.is_empty() || right.is_empty() {
            return Ok(stats);
        }
        let kernel = if metric.is_text() { Kernel::ClustersRangeText } else { Kernel::ClustersRangeVectors };
        self.device.function(kernel)?;
        let start = Instant::now();
        let (index, kept) = index_of(right, metric);
        stats.kept_indexes = kept.into();
        let arrays = index.arrays();
        let starts: Vec<u32> = arrays.starts.iter().map(|&s| s as u32).collect();
        let rounding = index.rounding();
        stats.build_time = start.elapsed();
        let uploading = Instant::now();
        let list = DeviceClusterList {
            centres: upload(&self.device, arrays.centres)?,
            radii: upload(&self.device, arrays.radii)?,
            starts: upload(&self.device, &starts)?,
            members: upload(&self.device, arrays.members)?,
            offsets: upload(&self.device, arrays.offsets)?,
            relative: rounding.relative,
            absolute: rounding.absolute,
        };
        stats.transfer_time += uploading.elapsed();

        let probe = Instant::now();
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        let mut send = |l: &[u32], r: &[u32], d: &[f64]| writer.push_slices(l, r, d, false);
        let rows = left.len() as u32;
        if metric.is_text() {
            let sides = [left, right];
            let alphabet = alphabet_of(if self_join.is_some() { &sides[..1] } else { &sides })?;
            let words = pattern_words(left, 0..left.len())?;
            let uploading = Instant::now();
            let strings = |v: &Vectors| -> Result<DeviceStrings, GpuError> {
                let (chars, offsets) = coded(v, 0..v.len(), &alphabet);
                Ok(DeviceStrings { chars: upload(&self.device, &chars)?, offsets: upload(&self.device, &offsets)? })
            };
            let left_strings = strings(left)?;
            let right_strings = if self_join.is_some() { None } else { Some(strings(right)?) };
            stats.transfer_time += uploading.elapsed();
            let inputs = ClusterTextInputs {
                list: &list,
                tau: threshold as u32,
                self_join: self_join.is_some(),
                left: &left_strings,
                right: right_strings.as_ref().unwrap_or(&left_strings),
                alphabet: alphabet.len() as u32,
                words: words as u32,
            };
            appended_pairs(
                &self.device,
                rows,
                budget,
                &mut stats,
                |part, out| clusters_range_text(&self.device, &inputs, part, out),
                &mut send,
            )?
        } else {
            let dim = left.dim;
            let cosine = metric == Metric::Cosine;
            let uploading = Instant::now();
            let rows_of = |v: &Vectors| ExactRows::Kept(&v.values).upload(&self.device);
            let unit_of = |v: &Vectors| upload(&self.device, v.unit_rows());
            let norms_of = |v: &Vectors| {
                let norms: Vec<f64> =
                    if cosine { (0..v.len()).into_par_iter().map(|i| row_norm(v.row(i))).collect() } else { vec![0.0] };
                upload(&self.device, &norms)
            };
            let same = self_join.is_some();
            let left_exact = rows_of(left)?;
            let right_exact = if same { None } else { Some(rows_of(right)?) };
            let left_unit = if cosine { Some(unit_of(left)?) } else { None };
            let right_unit = if cosine && !same { Some(unit_of(right)?) } else { None };
            let left_norms = norms_of(left)?;
            let right_norms = if same { None } else { Some(norms_of(right)?) };
            stats.transfer_time += uploading.elapsed();
            let right_exact = right_exact.as_ref().unwrap_or(&left_exact);
            let left_space = left_unit.as_ref().unwrap_or(&left_exact);
            let right_space = right_unit.as_ref().or(left_unit.as_ref().filter(|_| same)).unwrap_or(right_exact);
            let params = JoinParams {
                dim: dim as u32,
                metric: metric_code(metric),
                self_join: u32::from(same),
                threshold,
                ..Default::default()
            };
            let inputs = ClusterVectorInputs {
                list: &list,
                params,
                // Cosine's index holds the chords between unit rows: L2.
                space_metric: metric_code(if cosine { Metric::L2 } else { metric }),
                radius: radius(metric, threshold, dim),
                left_space,
                right_space,
                left_exact: &left_exact,
                right_exact,
                left_norms: &left_norms,
                right_norms: right_norms.as_ref().unwrap_or(&left_norms),
            };
            appended_pairs(
                &self.device,
                rows,
                budget,
                &mut stats,
                |part, out| clusters_range_vectors(&self.device, &inputs, part, out),
                &mut send,
            )?
        };
        if self_join.is_some_and(|s| s.include_self) {
            if metric.is_text() {
                (0..rows).try_for_each(|a| writer.push(a, a, 0.0))?;
            } else {
                write_self_pairs(&ExactCheck::new(metric, threshold, left, left), left, 0..left.len(), &mut writer)?;
            }
        }
        writer.flush()?;
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }
}
