//! Hamming and Tanimoto joins and Hamming kNN over bit strings on the GPU (kernels/bits.cu).
//!
//! Joins compare every pair of a window, a tile of left rows per block against the right rows
//! streaming past: for Hamming every right row (a self-join's window starts after the row
//! itself, so each unordered pair is met once), for Tanimoto the right rows in popcount order
//! whose popcount lies in the left row's window ([`size_window`], the bound the cores use); the
//! left rows go in popcount order too, so a tile's windows overlap. kNN is two passes over the
//! base for a block of queries: the histogram of each query's distances (at most the bits), from
//! which the host takes the smallest distance `D` with `k` rows within it, then every row within
//! `D`, of which the host keeps those nearer than `D` and the first rows at `D` by position — the
//! cores' answer, ties to the earlier base position. Distances are counts of bits (Tanimoto's
//! divided in f64 as the host divides), so answers equal the CPU's.

use std::time::Instant;

use datafusion::common::Result;
use rayon::iter::{IntoParallelRefIterator, ParallelIterator};

use crate::backend::cpu::bits::{BitsCosts, BitsStrategy, BlockIndex, ByPopcount};
use crate::backend::gpu::appended::appended_pairs;
use crate::backend::gpu::{GpuBackend, RunResult, copy_failed};
use crate::backend::plan::bounds::{hamming_radius, size_window};
use crate::backend::plan::topk::{Neighbour, Ranked, send_ranked};
use crate::backend::{JoinRequest, KnnRequest, PairWriter, ResultSink, RunStats};
use crate::cuda::Error as GpuError;
use crate::cuda::kernels::Kernel;
use crate::cuda::launch::{
    BITS_MAX_WORDS, BLOCKS_MAX_WIDTH, BitsJoinInputs, DeviceBits, DeviceBlocks, bits_blocks_join, bits_join,
    bits_knn_fits, bits_knn_histogram, bits_knn_within,
};
use crate::cuda::memory::{upload, zeroed};
use crate::op::Metric;
use crate::vectors::Bits;

/// Queries the kNN runs through both passes at once (their histograms on the device).
const KNN_QUERY_BLOCK: usize = 1 << 14;

/// The device's costs for the Hamming join's choice (nanoseconds of the whole device): a pair a
/// word at ~2·10¹² a second, a block lookup and a candidate at the rate of random reads.
const GPU_BITS_COSTS: BitsCosts =
    BitsCosts { pair_word: 0.0005, lookup: 0.05, candidate: 0.02, widest_block: BLOCKS_MAX_WIDTH as usize };

impl GpuBackend {
    /// `bits` on the device.
    fn upload_bits(&self, bits: &Bits, stats: &mut RunStats) -> Result<DeviceBits, GpuError> {
        if bits.words > BITS_MAX_WORDS {
            return Err(GpuError::Device(format!(
                "GPU bit strings: {} bits a row (at most {})",
                bits.bits,
                64 * BITS_MAX_WORDS
            )));
        }
        let uploading = Instant::now();
        let data = upload(&self.device, &bits.data)?;
        stats.transfer_time += uploading.elapsed();
        Ok(DeviceBits { data, words: bits.words as u32, rows: bits.len() as u32 })
    }

    /// Every pair within the threshold, Hamming or Tanimoto.
    pub(super) fn gpu_bits_join(
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
        self.device.function(Kernel::BitsJoin)?;
        let start = Instant::now();
        let tanimoto = metric != Metric::Hamming;
        let same = self_join.is_some();
        if !tanimoto
            && let BitsStrategy::Blocks { blocks, s } = BitsStrategy::choose(
                &left.bits,
                &right.bits,
                hamming_radius(threshold),
                same,
                request.index,
                GPU_BITS_COSTS,
            )
        {
            return self.gpu_blocks_join(request, sink, budget, &blocks, s, stats);
        }
        // Tanimoto's right rows in popcount order, each left row's window of it; Hamming's in input
        // order, every row.
        let (left_order, right_order, windows): (Vec<u32>, Vec<u32>, Vec<(u32, u32)>) = if tanimoto {
            let right_order = ByPopcount::new(&right.bits);
            let left_order = if same { right_order.clone() } else { ByPopcount::new(&left.bits) };
            let mut rank = vec![0u32; if same { right.len() } else { 0 }];
            if same {
                right_order.order.iter().enumerate().for_each(|(r, &p)| rank[p as usize] = r as u32);
            }
            let windows = left_order
                .order
                .iter()
                .zip(&left_order.counts)
                .map(|(&p, &ones)| {
                    let (low, high) = size_window(ones, threshold);
                    let from = right_order.counts.partition_point(|&c| c < low) as u32;
                    let to = right_order.counts.partition_point(|&c| c <= high) as u32;
                    // A self-join's window starts after the row itself (each pair once).
                    let from = if same { from.max(rank[p as usize] + 1) } else { from };
                    (from.min(to), to)
                })
                .collect();
            (left_order.order, right_order.order, windows)
        } else {
            let n = right.len() as u32;
            let windows = (0..left.len() as u32).map(|i| if same { ((i + 1).min(n), n) } else { (0, n) }).collect();
            ((0..left.len() as u32).collect(), (0..n).collect(), windows)
        };
        let left_bits = self.upload_bits(&left.bits, &mut stats)?;
        let right_bits = if same { None } else { Some(self.upload_bits(&right.bits, &mut stats)?) };
        let uploading = Instant::now();
        let (window_start, window_end): (Vec<u32>, Vec<u32>) = windows.iter().copied().unzip();
        stats.candidates = windows.iter().map(|(a, b)| (b - a) as u64).sum();
        let (left_order_d, right_order_d) = (upload(&self.device, &left_order)?, upload(&self.device, &right_order)?);
        let (window_start, window_end) = (upload(&self.device, &window_start)?, upload(&self.device, &window_end)?);
        stats.transfer_time += uploading.elapsed();
        let inputs = BitsJoinInputs {
            left: &left_bits,
            left_order: &left_order_d,
            right: right_bits.as_ref().unwrap_or(&left_bits),
            right_order: &right_order_d,
            window_start: &window_start,
            window_end: &window_end,
            tanimoto,
            radius: hamming_radius(threshold),
            eps: threshold,
        };
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        appended_pairs(
            &self.device,
            left_order.len() as u32,
            budget,
            &mut stats,
            |part, out| bits_join(&self.device, &inputs, part, out),
            |l, r, d| {
                for ((&a, &b), &d) in l.iter().zip(r).zip(d) {
                    // A self-join's pair with its smaller position first.
                    let (a, b) = if same && a > b { (b, a) } else { (a, b) };
                    writer.push(a, b, d)?;
                }
                Ok(())
            },
        )?;
        if self_join.is_some_and(|s| s.include_self) {
            for a in 0..left.len() as u32 {
                writer.push(a, a, 0.0)?;
            }
        }
        writer.flush()?;
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }

    /// The Hamming join by multi-index hashing over `blocks`, each pair within `s` bits of one
    /// (backend/cpu/bits.rs has the argument): the right side's block indexes built on the host,
    /// a thread per left row and block on the device.
    fn gpu_blocks_join(
        &self,
        request: &JoinRequest,
        sink: &dyn ResultSink,
        budget: usize,
        blocks: &[std::ops::Range<usize>],
        s: u32,
        mut stats: RunStats,
    ) -> RunResult<RunStats> {
        let JoinRequest { left, right, threshold, self_join, .. } = *request;
        self.device.function(Kernel::BitsBlocksJoin)?;
        let start = Instant::now();
        let same = self_join.is_some();
        let n = right.len();
        let (mut offsets, mut rows, mut offset_base) = (Vec::new(), Vec::with_capacity(n * blocks.len()), Vec::new());
        let indexes: Vec<BlockIndex> = blocks.par_iter().map(|block| BlockIndex::build(&right.bits, block)).collect();
        for (block, index) in blocks.iter().zip(indexes) {
            let BlockIndex::Table { starts, rows: block_rows } = index else {
                return Err(GpuError::Device(format!(
                    "GPU Hamming join: a block of {} bits has no table",
                    block.len()
                ))
                .into());
            };
            offset_base.push(offsets.len() as u64);
            offsets.extend_from_slice(&starts);
            rows.extend_from_slice(&block_rows);
        }
        let left_bits = self.upload_bits(&left.bits, &mut stats)?;
        let right_bits = if same { None } else { Some(self.upload_bits(&right.bits, &mut stats)?) };
        let uploading = Instant::now();
        let widths_host: Vec<u32> = blocks.iter().map(|b| b.len() as u32).collect();
        let device_blocks = DeviceBlocks {
            starts: upload(&self.device, &blocks.iter().map(|b| b.start as u32).collect::<Vec<_>>())?,
            widths: upload(&self.device, &widths_host)?,
            offset_base: upload(&self.device, &offset_base)?,
            offsets: upload(&self.device, &offsets)?,
            rows: upload(&self.device, &rows)?,
            blocks: blocks.len() as u32,
            s,
            widths_host,
        };
        stats.transfer_time += uploading.elapsed();
        stats.indexed_dims = blocks.len();
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        let right_bits = right_bits.as_ref().unwrap_or(&left_bits);
        let radius = hamming_radius(threshold);
        let mut writer = PairWriter::new(sink, self_join.is_some_and(|s| s.ordered));
        appended_pairs(
            &self.device,
            left.len() as u32,
            budget,
            &mut stats,
            |part, out| bits_blocks_join(&self.device, &left_bits, right_bits, &device_blocks, radius, same, part, out),
            |l, r, d| {
                for ((&a, &b), &d) in l.iter().zip(r).zip(d) {
                    writer.push(a, b, d)?;
                }
                Ok(())
            },
        )?;
        if self_join.is_some_and(|s| s.include_self) {
            for a in 0..left.len() as u32 {
                writer.push(a, a, 0.0)?;
            }
        }
        writer.flush()?;
        stats.probe_time = probe.elapsed();
        Ok(stats)
    }

    /// The `k` nearest base rows of every query by Hamming distance (see the module documentation).
    pub(super) fn gpu_bits_knn(
        &self,
        request: &KnnRequest,
        sink: &dyn ResultSink,
        budget: usize,
    ) -> RunResult<RunStats> {
        let KnnRequest { base, queries, k, .. } = *request;
        let k = k.min(base.len());
        let mut stats = RunStats { tiles: 1, ..Default::default() };
        if k == 0 || queries.is_empty() {
            return Ok(stats);
        }
        let bits = base.bits.bits as u32;
        if !bits_knn_fits(&self.device, base.bits.words as u32, bits) {
            return Err(GpuError::Device(format!(
                "GPU Hamming kNN: {bits}-bit strings need more shared memory for their distance histograms than a block has"
            ))
            .into());
        }
        self.device.function(Kernel::BitsKnnHistogram)?;
        let start = Instant::now();
        let (query_bits, base_bits) =
            (self.upload_bits(&queries.bits, &mut stats)?, self.upload_bits(&base.bits, &mut stats)?);
        stats.build_time = start.elapsed();
        let probe = Instant::now();
        let bins = bits as usize + 1;
        let mut lists: Vec<Vec<Neighbour>> = Vec::with_capacity(queries.len());
        // Each query's cut: the smallest distance with k rows within it.
        let mut cuts = vec![0u32; queries.len()];
        for first in (0..queries.len()).step_by(KNN_QUERY_BLOCK) {
            let rows = first as u32..(first + KNN_QUERY_BLOCK).min(queries.len()) as u32;
            let count = rows.len();
            let mut histograms = zeroed::<u32>(&self.device.stream, count * bins)?;
            let launched = Instant::now();
            bits_knn_histogram(&self.device, &query_bits, &base_bits, bits, rows.clone(), &mut histograms)?;
            let mut counts = vec![0u32; count * bins];
            self.device.stream.memcpy_dtoh(&histograms, &mut counts[..]).map_err(copy_failed)?;
            stats.kernel_time += launched.elapsed();
            for (cut, h) in cuts[first..first + count].iter_mut().zip(counts.chunks(bins)) {
                let (mut within, mut d) = (0usize, 0usize);
                while within + (h[d] as usize) < k {
                    within += h[d] as usize;
                    d += 1;
                }
                *cut = d as u32;
            }
            let cut = upload(&self.device, &cuts)?;
            let mut found: Vec<Vec<Neighbour>> = vec![Vec::new(); count];
            appended_pairs(
                &self.device,
                count as u32,
                budget,
                &mut stats,
                |part, out| {
                    let part = rows.start + part.start..rows.start + part.end;
                    bits_knn_within(&self.device, &query_bits, &base_bits, part, &cut, out)
                },
                |l, r, d| {
                    for ((&q, &p), &d) in l.iter().zip(r).zip(d) {
                        found[q as usize - first].push(Neighbour { distance: d, position: p });
                    }
                    Ok(())
                },
            )?;
            // Every row nearer than the cut, and the first rows at it by position.
            for mut list in found {
                list.sort_unstable();
                list.truncate(k);
                lists.push(list);
            }
            stats.count_passes += 1;
        }
        sink.start(1);
        let sent = send_ranked(sink, lists.into_iter().enumerate().map(|(q, list)| (q, Ranked::List(list))).collect());
        sink.advance(1);
        stats.probe_time = probe.elapsed();
        sent?;
        Ok(stats)
    }
}
