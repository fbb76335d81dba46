//! The partition filter of Li, Deng, Wang and Feng ("PASS-JOIN: A Partition-based Method for
//! Similarity Joins") for edit-distance thresholds: cut each indexed string into `τ + 1`
//! segments; a string within `τ` edits of it must contain one of them unchanged, near where it
//! stood.
//!
//! Why no pair is lost: an alignment with at most `τ` edits touches at most `τ` of the `τ + 1`
//! disjoint segments, so one segment `i` (start `p`) is copied unchanged into the probe. With `e₁`
//! edits before it and `e₂` after (`e₁ + e₂ ≤ τ`), its copy starts at `p + s`, where the shift `s`
//! (insertions minus deletions before it) has `|s| ≤ e₁` and `|Δ − s| ≤ e₂` for the length
//! difference `Δ = |probe| − |indexed|`. So `|s| + |Δ − s| ≤ τ`: `s` lies in
//! `[min(0, Δ) − h, max(0, Δ) + h]` with `h = ⌊(τ − |Δ|) / 2⌋` (the position-aware window of the
//! paper). Strings shorter than `τ + 1` cannot be cut into non-empty segments; they are kept in a
//! list every probe checks by length alone.
//!
//! Segments are looked up by a 64-bit hash of (length, segment number, characters); a collision
//! only adds a candidate, and every candidate is verified with the exact distance.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The segments of every indexed string of at least `τ + 1` characters, by hash.
#[derive(Debug)]
pub struct SegmentIndex {
    tau: usize,
    segments: HashMap<u64, Vec<u32>, BuildHasherDefault<PassThrough>>,
    /// (length, position) of the strings too short to cut, by length.
    short: Vec<(usize, u32)>,
    /// Lengths of the indexed strings that were cut (for the probe's length loop).
    lengths: std::ops::RangeInclusive<usize>,
}

impl SegmentIndex {
    /// Indexes `strings` (position `i` is `strings(i)`) for threshold `tau`.
    pub fn build<'a>(count: usize, string: impl Fn(usize) -> &'a [u32], tau: usize) -> Self {
        let mut segments: HashMap<u64, Vec<u32>, BuildHasherDefault<PassThrough>> = HashMap::default();
        let mut short = Vec::new();
        let (mut shortest, mut longest) = (usize::MAX, 0);
        for position in 0..count {
            let s = string(position);
            if s.len() <= tau {
                short.push((s.len(), position as u32));
                continue;
            }
            shortest = shortest.min(s.len());
            longest = longest.max(s.len());
            for (i, (start, len)) in cuts(s.len(), tau).enumerate() {
                segments.entry(key(s.len(), i, &s[start..start + len])).or_default().push(position as u32);
            }
        }
        short.sort_unstable();
        SegmentIndex { tau, segments, short, lengths: shortest..=longest }
    }

    /// Appends to `out` the position of every indexed string that may be within `τ` edits of
    /// `probe` (each possibly several times; none is missed).
    pub fn candidates(&self, probe: &[u32], out: &mut Vec<u32>) {
        let (tau, n) = (self.tau as isize, probe.len() as isize);
        let from = (probe.len().saturating_sub(self.tau)).max(*self.lengths.start());
        let to = (probe.len() + self.tau).min(*self.lengths.end());
        for len in from..=to {
            let delta = n - len as isize;
            let half = (tau - delta.abs()) / 2;
            let (low, high) = (delta.min(0) - half, delta.max(0) + half);
            for (i, (start, seg)) in cuts(len, self.tau).enumerate() {
                let first = (start as isize + low).max(0);
                let last = (start as isize + high).min(n - seg as isize);
                for at in first..=last {
                    let at = at as usize;
                    if let Some(found) = self.segments.get(&key(len, i, &probe[at..at + seg])) {
                        out.extend_from_slice(found);
                    }
                }
            }
        }
        let shortest = probe.len().saturating_sub(self.tau);
        let begin = self.short.partition_point(|&(len, _)| len < shortest);
        for &(len, position) in &self.short[begin..] {
            if len > probe.len() + self.tau {
                break;
            }
            out.push(position);
        }
    }
}

/// (start, length) of the `tau + 1` segments of a string of `len > tau` characters: the last
/// `len mod (tau + 1)` one character longer than the others.
fn cuts(len: usize, tau: usize) -> impl Iterator<Item = (usize, usize)> {
    let parts = tau + 1;
    let (short, longer) = (len / parts, len % parts);
    (0..parts).map(move |i| {
        let shorter_before = i.min(parts - longer);
        let start = shorter_before * short + (i - shorter_before) * (short + 1);
        (start, if i < parts - longer { short } else { short + 1 })
    })
}

/// The hash of segment `i` of a string of length `len`.
#[inline]
fn key(len: usize, i: usize, segment: &[u32]) -> u64 {
    let mut h = (len as u64) << 32 | i as u64;
    for &c in segment {
        h = (h.rotate_left(5) ^ c as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^ (h >> 29)
}

/// The keys are hashes already.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{SegmentIndex, cuts};
    use crate::backend::cpu::text::levenshtein;

    #[test]
    fn segments_cover_the_string() {
        for len in 1..40 {
            for tau in 0..len {
                let cut: Vec<_> = cuts(len, tau).collect();
                assert_eq!(cut.len(), tau + 1);
                assert_eq!(cut[0].0, 0);
                for w in cut.windows(2) {
                    assert_eq!(w[0].0 + w[0].1, w[1].0);
                }
                assert_eq!(cut[tau].0 + cut[tau].1, len);
                assert!(cut.iter().all(|&(_, l)| l >= 1));
            }
        }
    }

    /// Every pair within τ is a candidate, over strings with many near neighbours.
    #[test]
    fn no_pair_within_tau_is_missed() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let strings: Vec<Vec<u32>> = (0..600)
            .map(|_| (0..rng.random_range(0..12)).map(|_| rng.random_range(0..3u32) + 'a' as u32).collect())
            .collect();
        for tau in 0..5 {
            let index = SegmentIndex::build(strings.len(), |i| &strings[i], tau);
            let mut found = Vec::new();
            for probe in &strings {
                found.clear();
                index.candidates(probe, &mut found);
                found.sort_unstable();
                for (j, s) in strings.iter().enumerate() {
                    if levenshtein(probe, s) as usize <= tau {
                        assert!(found.binary_search(&(j as u32)).is_ok(), "tau {tau}: {probe:?} {s:?}");
                    }
                }
            }
        }
    }
}
