//! The edit distance of two strings of Unicode scalar values, bit-parallel: Myers' algorithm ("A
//! fast bit-vector algorithm for approximate string matching based on dynamic programming") in
//! Hyyrö's form for the global distance, one machine word per 64 characters of the pattern, cut
//! off as soon as the threshold can no longer be met.
//!
//! Bit `i` of the vertical delta vectors describes row `i + 1` of the dynamic-programming matrix
//! (pattern prefixes) in the current column (text prefix); the score follows the last row, so
//! after the whole text it is the distance. Rows beyond the pattern (the unused high bits of the
//! last word) only ever receive carries from the rows below them and never send any back, so
//! they cannot change the score.

/// A string prepared for comparisons against many others: for each character, the positions
/// where it occurs, one bit each.
#[derive(Debug, Clone)]
pub struct Pattern {
    len: usize,
    words: usize,
    /// Masks of the characters below 128, `words` per character.
    ascii: Vec<u64>,
    /// The other characters of the pattern, sorted, and their masks, `words` per character.
    others: Vec<u32>,
    other_masks: Vec<u64>,
}

impl Pattern {
    /// Prepares `pattern`.
    pub fn new(pattern: &[u32]) -> Self {
        let words = pattern.len().div_ceil(64).max(1);
        let mut ascii = vec![0u64; 128 * words];
        let mut others: Vec<u32> = pattern.iter().copied().filter(|&c| c >= 128).collect();
        others.sort_unstable();
        others.dedup();
        let mut other_masks = vec![0u64; others.len() * words];
        for (i, &c) in pattern.iter().enumerate() {
            let bit = 1u64 << (i % 64);
            if c < 128 {
                ascii[c as usize * words + i / 64] |= bit;
            } else {
                let slot = others.binary_search(&c).expect("every character of the pattern is listed");
                other_masks[slot * words + i / 64] |= bit;
            }
        }
        Pattern { len: pattern.len(), words, ascii, others, other_masks }
    }

    #[inline]
    fn mask(&self, c: u32, word: usize) -> u64 {
        if c < 128 {
            self.ascii[c as usize * self.words + word]
        } else {
            match self.others.binary_search(&c) {
                Ok(slot) => self.other_masks[slot * self.words + word],
                Err(_) => 0,
            }
        }
    }

    /// The edit distance to `text` when it is at most `max`, else `None`.
    pub fn distance_within(&self, text: &[u32], max: u32) -> Option<u32> {
        let (m, n) = (self.len, text.len());
        if m.abs_diff(n) > max as usize {
            return None;
        }
        if m == 0 {
            return Some(n as u32);
        }
        let distance = if self.words == 1 { self.one_word(text, max) } else { self.blocks(text, max) }?;
        (distance <= max as usize).then_some(distance as u32)
    }

    /// The edit distance to `text`.
    pub fn distance(&self, text: &[u32]) -> u32 {
        self.distance_within(text, u32::MAX).expect("no distance exceeds u32::MAX")
    }

    /// Patterns of at most 64 characters: one word per column. `None` once the distance must
    /// exceed `max`: each later column moves the last row by at most one, so the distance is at
    /// least the score minus the columns left.
    #[inline]
    fn one_word(&self, text: &[u32], max: u32) -> Option<usize> {
        let last = 1u64 << (self.len - 1);
        let (mut vp, mut vn) = (!0u64, 0u64);
        let mut score = self.len;
        let limit = max as usize;
        for (j, &c) in text.iter().enumerate() {
            let eq = self.mask(c, 0);
            let xv = eq | vn;
            let xh = ((eq & vp).wrapping_add(vp) ^ vp) | eq;
            let ph = vn | !(xh | vp);
            let mh = vp & xh;
            if ph & last != 0 {
                score += 1;
            } else if mh & last != 0 {
                score -= 1;
            }
            let ph = (ph << 1) | 1;
            let mh = mh << 1;
            vp = mh | !(xv | ph);
            vn = ph & xv;
            if score > limit + (text.len() - j - 1) {
                return None;
            }
        }
        Some(score)
    }

    /// Longer patterns: Myers' blocks, the horizontal delta of each word's top row carried into
    /// the next word (the first word's top row is row 0, which grows by one per column).
    fn blocks(&self, text: &[u32], max: u32) -> Option<usize> {
        let words = self.words;
        let mut vp = vec![!0u64; words];
        let mut vn = vec![0u64; words];
        let last = 1u64 << ((self.len - 1) % 64);
        let mut score = self.len;
        let limit = max as usize;
        for (j, &c) in text.iter().enumerate() {
            let mut carry: i32 = 1;
            for w in 0..words {
                let high = if w + 1 == words { last } else { 1u64 << 63 };
                let (p, mv) = (vp[w], vn[w]);
                let mut eq = self.mask(c, w);
                let xv = eq | mv;
                if carry < 0 {
                    eq |= 1;
                }
                let xh = ((eq & p).wrapping_add(p) ^ p) | eq;
                let mut ph = mv | !(xh | p);
                let mut mh = p & xh;
                let out = if ph & high != 0 {
                    1
                } else if mh & high != 0 {
                    -1
                } else {
                    0
                };
                ph <<= 1;
                mh <<= 1;
                if carry < 0 {
                    mh |= 1;
                } else if carry > 0 {
                    ph |= 1;
                }
                vp[w] = mh | !(xv | ph);
                vn[w] = ph & xv;
                carry = out;
            }
            score = (score as i64 + carry as i64) as usize;
            if score > limit + (text.len() - j - 1) {
                return None;
            }
        }
        Some(score)
    }
}

/// The edit distance of `a` and `b` (Unicode scalar values): the tests' oracle.
#[cfg(test)]
pub fn levenshtein(a: &[u32], b: &[u32]) -> u32 {
    Pattern::new(a).distance(b)
}

#[cfg(test)]
mod tests {
    use datafusion::common::utils::datafusion_strsim;
    use rand::{Rng, SeedableRng};

    use super::{Pattern, levenshtein};

    fn chars(s: &str) -> Vec<u32> {
        s.chars().map(u32::from).collect()
    }

    #[test]
    fn known_distances() {
        assert_eq!(levenshtein(&chars("kitten"), &chars("sitting")), 3);
        assert_eq!(levenshtein(&chars(""), &chars("abc")), 3);
        assert_eq!(levenshtein(&chars("abc"), &chars("")), 3);
        assert_eq!(levenshtein(&chars("über"), &chars("uber")), 1);
        assert_eq!(Pattern::new(&chars("kitten")).distance_within(&chars("sitting"), 2), None);
        assert_eq!(Pattern::new(&chars("kitten")).distance_within(&chars("sitting"), 3), Some(3));
    }

    /// Random strings over small alphabets (so that many pairs are close), ASCII and not, up to
    /// three words long, against DataFusion's own `levenshtein()`, with and without cut-offs.
    #[test]
    fn equals_the_dynamic_programme() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let alphabets: [&[char]; 3] = [&['a', 'b'], &['a', 'c', 'g', 't'], &['a', 'é', 'ß', '字', '😀', 'z']];
        for round in 0..3000 {
            let alphabet = alphabets[round % 3];
            let len = |rng: &mut rand::rngs::StdRng| match round % 4 {
                0 => rng.random_range(0..8),
                1 => rng.random_range(50..80),
                2 => rng.random_range(120..200),
                _ => rng.random_range(0..140),
            };
            let a: String = (0..len(&mut rng)).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect();
            let mut b: Vec<char> = a.chars().collect();
            for _ in 0..rng.random_range(0..6) {
                let c = alphabet[rng.random_range(0..alphabet.len())];
                match rng.random_range(0..3) {
                    0 if !b.is_empty() => {
                        let at = rng.random_range(0..b.len());
                        b[at] = c;
                    }
                    1 if !b.is_empty() => {
                        b.remove(rng.random_range(0..b.len()));
                    }
                    _ => b.insert(rng.random_range(0..=b.len()), c),
                }
            }
            let b: String = if round % 7 == 0 {
                (0..len(&mut rng)).map(|_| alphabet[rng.random_range(0..alphabet.len())]).collect()
            } else {
                b.into_iter().collect()
            };
            let expected = datafusion_strsim::levenshtein(&a, &b) as u32;
            let pattern = Pattern::new(&chars(&a));
            assert_eq!(pattern.distance(&chars(&b)), expected, "{a:?} {b:?}");
            for max in [0, 1, 2, 5, expected.saturating_sub(1), expected] {
                let want = (expected <= max).then_some(expected);
                assert_eq!(pattern.distance_within(&chars(&b), max), want, "{a:?} {b:?} max {max}");
            }
        }
    }
}
