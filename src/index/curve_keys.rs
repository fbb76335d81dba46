//! How a curve of the Multicurves index (index/curves.rs) orders the rows: a row's coordinates on
//! the curve are its leading principal coordinates times the curve's rotation, quantised to
//! `bits` bits between the lowest and the highest coordinate of the base, and its key is that
//! cell's position on the Hilbert curve; each curve lists the rows by key.
//!
//! The cores compute the keys and sort them here ([`order_on_cores`]); the device does the same
//! (kernels/approx.cu's `curve_bounds` and `curve_keys`, then stable radix passes:
//! backend/gpu/approx_build.rs). Both sum each coordinate's products in the same order with no
//! fused multiply-add and quantise with the same operations, and both break ties between keys by
//! position, so an index is the same bit for bit wherever its curves were ordered.

use rayon::iter::{IndexedParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::{ParallelSlice, ParallelSliceMut};

/// Most dimensions of a curve.
pub const MAX_CURVE_DIMS: usize = 8;

/// What a curve's keys are computed from: the rows' principal coordinates and each curve's
/// rotation of the leading `axes` of them onto its `dims` dimensions, quantised to `bits` bits.
#[derive(Debug, Clone, Copy)]
pub struct KeyInputs<'a> {
    /// Every row's principal coordinates, `stride` floats a row, of which the first `axes` are
    /// rotated.
    pub rows: &'a [f32],
    pub stride: usize,
    pub axes: usize,
    pub dims: usize,
    pub bits: u32,
    /// Each curve's rotation, `axes × dims` row-major.
    pub rotations: &'a [Vec<f32>],
}

impl KeyInputs<'_> {
    /// Rows.
    #[cfg(feature = "gpu")]
    pub fn len(&self) -> usize {
        self.rows.len().checked_div(self.stride).unwrap_or(0)
    }
}

/// One curve's order of the rows: the lowest and highest coordinate of each of its dimensions,
/// and the keys ascending with the position of each (ties by position).
#[derive(Debug, Clone, PartialEq)]
pub struct CurveOrder {
    pub low: Vec<f32>,
    pub high: Vec<f32>,
    pub keys: Vec<u64>,
    pub positions: Vec<u32>,
}

/// A curve's coordinates and their quantisation: what keys a query as the base was keyed.
#[derive(Debug)]
pub struct CurveFrame {
    /// `axes × dims`, row-major: coordinate j of the curve is Σᵢ lead[i]·rotation[i·dims + j].
    pub rotation: Vec<f32>,
    /// Per curve dimension: the smallest base coordinate, the largest and cells per unit.
    pub low: Vec<f32>,
    pub high: Vec<f32>,
    pub scale: Vec<f32>,
}

impl CurveFrame {
    /// The frame of a curve whose base coordinates span `low ..= high` ([`cell_scale`]).
    pub fn new(rotation: Vec<f32>, low: Vec<f32>, high: &[f32], bits: u32) -> Self {
        let scale = cell_scale(&low, high, bits);
        Self { rotation, low, high: high.to_vec(), scale }
    }

    /// The key of a row whose leading principal coordinates are `lead` (`axes` of them).
    pub fn key(&self, lead: &[f32], bits: u32) -> u64 {
        let dims = self.low.len();
        let mut coords = [0f32; MAX_CURVE_DIMS];
        for (out, x) in coords.iter_mut().zip(rotate(lead, &self.rotation, dims)) {
            *out = x;
        }
        cell_key(&coords[..dims], &self.low, &self.scale, bits)
    }
}

/// Cells per unit of each curve dimension whose base coordinates span `low ..= high`: the
/// `2^bits − 1` cells over the span, none where the span is empty.
pub fn cell_scale(low: &[f32], high: &[f32], bits: u32) -> Vec<f32> {
    let cells = ((1u64 << bits) - 1) as f32;
    low.iter().zip(high).map(|(l, h)| if h > l { cells / (h - l) } else { 0.0 }).collect()
}

/// The Hilbert key of curve coordinates `coords`, from `low` at `scale` cells per unit, quantised
/// to `bits` bits each.
fn cell_key(coords: &[f32], low: &[f32], scale: &[f32], bits: u32) -> u64 {
    let top = ((1u64 << bits) - 1) as f32;
    let mut cells = [0u32; MAX_CURVE_DIMS];
    for (j, &x) in coords.iter().enumerate() {
        cells[j] = ((x - low[j]) * scale[j]).clamp(0.0, top) as u32;
    }
    hilbert_key(&mut cells[..coords.len()], bits)
}

/// Every curve's order of the rows of `inputs`, computed and sorted on every core.
pub fn order_on_cores(inputs: &KeyInputs) -> Vec<CurveOrder> {
    let KeyInputs { rows, stride, axes, dims, bits, rotations } = *inputs;
    rotations
        .par_iter()
        .map(|rotation| {
            let coords: Vec<f32> =
                rows.par_chunks(stride).flat_map_iter(|row| rotate(&row[..axes], rotation, dims)).collect();
            let (mut low, mut high) = (vec![f32::INFINITY; dims], vec![f32::NEG_INFINITY; dims]);
            for row in coords.chunks(dims) {
                for ((l, h), &x) in low.iter_mut().zip(high.iter_mut()).zip(row) {
                    *l = l.min(x);
                    *h = h.max(x);
                }
            }
            let scale = cell_scale(&low, &high, bits);
            let mut keyed: Vec<(u64, u32)> = coords
                .par_chunks(dims)
                .enumerate()
                .map(|(i, row)| (cell_key(row, &low, &scale, bits), i as u32))
                .collect();
            keyed.par_sort_unstable();
            let (keys, positions) = keyed.into_iter().unzip();
            CurveOrder { low, high, keys, positions }
        })
        .collect()
}

/// `x` (the leading axes' coordinates) times `rotation` (`x.len() × dims`), each coordinate summed
/// from the first axis on (the order kernels/approx.cu's `curve_coordinate` keeps).
#[inline]
fn rotate<'a>(x: &'a [f32], rotation: &'a [f32], dims: usize) -> impl Iterator<Item = f32> + 'a {
    (0..dims).map(move |j| x.iter().enumerate().map(|(i, v)| v * rotation[i * dims + j]).sum())
}

/// The position on the `cells.len()`-dimensional Hilbert curve of order `bits` of the cell
/// `cells` (each coordinate below 2^bits), by Skilling's transpose algorithm ("Programming the
/// Hilbert curve", AIP Conf. Proc. 707, 2004): the coordinates become the curve position's
/// "transposed" form, whose bits interleaved most significant first are the key. `cells` is
/// overwritten. kernels/approx.cu's `hilbert_key` is the same algorithm.
pub fn hilbert_key(cells: &mut [u32], bits: u32) -> u64 {
    let n = cells.len();
    if n == 0 || bits == 0 {
        return 0;
    }
    let top = 1u32 << (bits - 1);
    // Inverse undo of the excess work: where bit q of cells[i] is set, cells[0] ^= p; else the
    // bits below q that cells[0] and cells[i] differ in are swapped. Without branches (as masks):
    // the bits are data, and their branches were mispredicted about half the time.
    let mut q = top;
    while q > 1 {
        let p = q - 1;
        for i in 0..n {
            let set = 0u32.wrapping_sub(u32::from(cells[i] & q != 0));
            let t = (cells[0] ^ cells[i]) & p & !set;
            cells[0] ^= (p & set) | t;
            cells[i] ^= t;
        }
        q >>= 1;
    }
    // Gray encode.
    for i in 1..n {
        cells[i] ^= cells[i - 1];
    }
    let mut t = 0;
    let mut q = top;
    while q > 1 {
        if cells[n - 1] & q != 0 {
            t ^= q - 1;
        }
        q >>= 1;
    }
    cells.iter_mut().for_each(|c| *c ^= t);
    let mut key = 0u64;
    for bit in (0..bits).rev() {
        for &c in cells.iter() {
            key = (key << 1) | u64::from((c >> bit) & 1);
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::{CurveFrame, KeyInputs, hilbert_key, order_on_cores};

    #[test]
    fn hilbert_keys_number_every_cell_once_and_neighbours_are_adjacent() {
        // Order 3 in 3 dimensions: 512 cells; consecutive keys are cells one step apart.
        let mut by_key = vec![None; 512];
        for x in 0..8u32 {
            for y in 0..8u32 {
                for z in 0..8u32 {
                    let key = hilbert_key(&mut [x, y, z], 3) as usize;
                    assert!(by_key[key].is_none(), "key {key} given twice");
                    by_key[key] = Some([x, y, z]);
                }
            }
        }
        let cells: Vec<[u32; 3]> = by_key.into_iter().map(|c| c.expect("every key used")).collect();
        for pair in cells.windows(2) {
            let step: u32 = pair[0].iter().zip(&pair[1]).map(|(a, b)| a.abs_diff(*b)).sum();
            assert_eq!(step, 1, "{:?} → {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn a_curve_lists_every_row_once_by_key_and_keys_its_rows_as_a_query() {
        let (axes, dims, stride, n) = (4, 2, 5, 300);
        let rows: Vec<f32> = (0..n * stride).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let rotations =
            vec![vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5, -0.5, 0.5], vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]];
        let inputs = KeyInputs { rows: &rows, stride, axes, dims, bits: 8, rotations: &rotations };
        assert_eq!(inputs.len(), n);
        for (order, rotation) in order_on_cores(&inputs).into_iter().zip(&rotations) {
            let mut seen = order.positions.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
            let frame = CurveFrame::new(rotation.clone(), order.low.clone(), &order.high, 8);
            for (i, (&key, &p)) in order.keys.iter().zip(&order.positions).enumerate() {
                assert_eq!(key, frame.key(&rows[p as usize * stride..][..axes], 8), "entry {i}");
                if i > 0 {
                    assert!((order.keys[i - 1], order.positions[i - 1]) < (key, p), "entry {i} out of order");
                }
            }
        }
    }
}
