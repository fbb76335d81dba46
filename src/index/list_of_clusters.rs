//! The List of Clusters (Chávez & Navarro, "A compact space decomposition for effective metric
//! indexing"), the index Barrientos et al. ("Range query processing in a multi-GPU environment")
//! found fastest on the GPU. It needs nothing but a metric — a distance with the triangle
//! inequality — so it serves strings under the edit distance and vectors under L2, L1, L∞ and
//! cosine (through the chord distance between unit vectors, below).
//!
//! **Build.** The first centre is the first object; each later centre is the remaining object
//! with the largest sum of distances to the centres before it. Each centre takes the `bucket`
//! remaining objects nearest to it (ties by position) as its cluster, and its covering radius is
//! the distance to the farthest of them. Every object taken after centre `c` — a later centre or a
//! member of a later cluster — was left by `c`'s selection, so its distance to `c` is at least
//! `c`'s covering radius (the invariant the early stop relies on).
//!
//! **Bucket size.** A search computes the distance to at least every centre (`n / m` of them) and
//! then to the members of each cluster it cannot rule out (`m` each); `n/m + m` is smallest at
//! `m = √n`, and the build's `n² / 2m` distances then grow as `n^1.5`.
//!
//! **Search** for radius `r`, centres in list order (the triangle inequality gives every bound):
//! * a centre at distance `d ≤ r` is a candidate;
//! * its cluster is read only when `d ≤ radius + r`; within it, a member at distance `e` from the
//!   centre can be within `r` of the query only when `|d − e| ≤ r` (members are kept ordered by
//!   `e`, so these form one run found by binary search);
//! * the search stops after the first centre with `d + r < radius` (strict: an object at exactly
//!   the covering radius may sit in a later cluster): the query's ball lies inside that centre's
//!   ball, and every later object is at least `radius` from the centre, so more than `r` from the
//!   query.
//!
//! kNN runs the same search with `r` the current k-th nearest distance, shrinking as neighbours
//! are found; every bound is inclusive, so objects tied with the k-th survive for the tie-break by
//! position. Distances of floating-point vectors carry rounding: each bound is widened by a
//! [`Rounding`] larger than the error of every distance compared, so the index only ever keeps
//! more candidates, and every candidate is decided by the backend's exact test.
//!
//! For vectors the members' rows are copied in list order (the paper's `CLUSTERS` matrix), so a
//! cluster's scan reads memory in order rather than one row per member from a random place.

/// Error bound of the distances an index compares: a computed distance `d` is within
/// `relative · d + absolute` of the true one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rounding {
    pub relative: f64,
    pub absolute: f64,
}

impl Rounding {
    /// Distances without rounding (the edit distance).
    pub const EXACT: Rounding = Rounding { relative: 0.0, absolute: 0.0 };

    /// Slack for a comparison among distances whose sum is `scale`.
    /// (0 for an infinite scale: a comparison with an infinite radius needs none.)
    #[inline]
    fn slack(self, scale: f64) -> f64 {
        if scale.is_finite() { self.relative * scale + 2.0 * self.absolute } else { 0.0 }
    }
}

/// The objects indexed: positions `0..len` with a distance between any two.
pub trait MetricSpace: Sync {
    /// Number of objects.
    fn objects(&self) -> usize;
    /// The distances from object `from` to each object of `to`, in order.
    fn distances(&self, from: usize, to: &[u32]) -> Vec<f64>;
}

/// One query's search: its distance to an indexed object, the current radius, and what to do with
/// each object the index cannot rule out.
pub trait Probe {
    /// The distance from the query to object `i`, or any value above `cutoff` when it is larger
    /// (the centre's cluster is then skipped, so the exact value is not needed).
    fn distance(&mut self, i: usize, cutoff: f64) -> f64;
    /// The search radius now (a kNN query's k-th nearest so far; +∞ before k are found).
    fn radius(&self) -> f64;
    /// Centre `i`, at `distance` from the query, may lie within the radius.
    fn centre(&mut self, i: usize, distance: f64);
    /// Object `i`, the `slot`-th member in list order ([`ListOfClusters::member_rows`]), may lie
    /// within the radius.
    fn member(&mut self, i: usize, slot: usize);
}

/// The index: centres in list order, each with its covering radius and its cluster.
#[derive(Debug, Clone)]
pub struct ListOfClusters {
    centres: Vec<u32>,
    radii: Vec<f64>,
    /// Cluster `c` is `members[starts[c]..starts[c + 1]]`, ordered by distance to its centre.
    starts: Vec<usize>,
    members: Vec<u32>,
    /// Each member's distance to its centre.
    offsets: Vec<f64>,
    rounding: Rounding,
    /// Vectors: the members' rows in list order, `dim` values each, so that a cluster's scan reads
    /// memory in order rather than a row at a random place per member.
    member_rows: Vec<f64>,
}

/// A [`ListOfClusters`]' arrays: each cluster's centre and covering radius, where its members
/// begin in `members` (one entry more than clusters), the members, and each member's distance to
/// its centre.
#[cfg(feature = "gpu")]
#[derive(Debug, Clone, Copy)]
pub struct ClusterArrays<'a> {
    pub centres: &'a [u32],
    pub radii: &'a [f64],
    pub starts: &'a [usize],
    pub members: &'a [u32],
    pub offsets: &'a [f64],
}

/// Counts of one search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchCounts {
    /// Query–centre distances computed.
    pub centres: u64,
    /// Members handed to [`Probe::member`] (each then measured by the caller).
    pub members: u64,
}

impl ListOfClusters {
    /// The bucket size for `n` objects: `√n` (see the module documentation), at least 16.
    pub fn bucket_for(n: usize) -> usize {
        ((n as f64).sqrt().ceil() as usize).max(16)
    }

    /// The list's arrays, for a search elsewhere (the GPU's).
    #[cfg(feature = "gpu")]
    pub fn arrays(&self) -> ClusterArrays<'_> {
        ClusterArrays {
            centres: &self.centres,
            radii: &self.radii,
            starts: &self.starts,
            members: &self.members,
            offsets: &self.offsets,
        }
    }

    /// How far its distances may be from true ones.
    #[cfg(feature = "gpu")]
    pub fn rounding(&self) -> Rounding {
        self.rounding
    }

    /// Builds the index over every object of `space`, each cluster holding `bucket` objects.
    pub fn build(space: &impl MetricSpace, bucket: usize, rounding: Rounding) -> Self {
        let n = space.objects();
        let bucket = bucket.max(1);
        let mut index = ListOfClusters {
            centres: Vec::with_capacity(n / (bucket + 1) + 1),
            radii: Vec::new(),
            starts: vec![0],
            members: Vec::with_capacity(n),
            offsets: Vec::with_capacity(n),
            rounding,
            member_rows: Vec::new(),
        };
        // The objects not yet taken (in position order), each with its sum of distances to the
        // centres so far.
        let mut remaining: Vec<u32> = (1..n as u32).collect();
        let mut sums = vec![0.0f64; remaining.len()];
        let mut centre = if n == 0 { return index } else { 0u32 };
        loop {
            let from_centre = space.distances(centre as usize, &remaining);
            sums.iter_mut().zip(&from_centre).for_each(|(sum, d)| *sum += d);
            let mut order: Vec<usize> = (0..remaining.len()).collect();
            let nearest = |a: &usize, b: &usize| from_centre[*a].total_cmp(&from_centre[*b]).then(a.cmp(b));
            let take = bucket.min(order.len());
            if take < order.len() {
                order.select_nth_unstable_by(take, nearest);
            }
            let cluster = &mut order[..take];
            cluster.sort_unstable_by(nearest);
            index.centres.push(centre);
            index.radii.push(cluster.last().map_or(0.0, |&m| from_centre[m]));
            index.members.extend(cluster.iter().map(|&m| remaining[m]));
            index.offsets.extend(cluster.iter().map(|&m| from_centre[m]));
            index.starts.push(index.members.len());
            if take == remaining.len() {
                return index;
            }
            let mut taken = vec![false; remaining.len()];
            cluster.iter().for_each(|&m| taken[m] = true);
            // The next centre: the largest sum of distances to the centres so far, ties by position.
            let mut next = None::<usize>;
            for i in (0..remaining.len()).filter(|&i| !taken[i]) {
                if next.is_none_or(|j| sums[i] > sums[j]) {
                    next = Some(i);
                }
            }
            let next = next.expect("objects remain");
            centre = remaining[next];
            taken[next] = true;
            let mut keep = taken.iter().map(|t| !t);
            remaining.retain(|_| keep.next().unwrap_or(false));
            let mut keep = taken.iter().map(|t| !t);
            sums.retain(|_| keep.next().unwrap_or(false));
        }
    }

    /// Copies each member's row (`row(position)`) in list order, in f64.
    pub fn gather_member_rows<'a>(&mut self, dim: usize, row: impl Fn(usize) -> crate::vectors::Row<'a>) {
        self.member_rows = Vec::with_capacity(self.members.len() * dim);
        for &m in &self.members {
            self.member_rows.extend(row(m as usize).iter());
        }
    }

    /// The `slot`-th member's row (after [`ListOfClusters::gather_member_rows`]).
    #[inline]
    pub fn member_row(&self, slot: usize, dim: usize) -> &[f64] {
        &self.member_rows[slot * dim..(slot + 1) * dim]
    }

    /// Hands every object that may lie within `probe`'s radius to `probe` (see the module
    /// documentation for the bounds and why none loses an answer).
    pub fn search(&self, probe: &mut impl Probe) -> SearchCounts {
        let mut counts = SearchCounts::default();
        let rounding = self.rounding;
        for (c, (&centre, &radius)) in self.centres.iter().zip(&self.radii).enumerate() {
            let r = probe.radius();
            // Beyond radius + r the cluster is skipped and no early stop can apply.
            let cutoff = radius + r + rounding.slack(2.0 * (radius + r));
            let d = probe.distance(centre as usize, cutoff);
            counts.centres += 1;
            if d <= r + rounding.slack(d + r) {
                probe.centre(centre as usize, d);
            }
            let r = probe.radius();
            if d > radius + r + rounding.slack(d + radius + r) {
                continue;
            }
            let cluster = self.starts[c]..self.starts[c + 1];
            let offsets = &self.offsets[cluster.clone()];
            // |d − e| ≤ r: e from d − r up to d + r (the radius re-read, as a kNN's shrinks).
            let low = d - r - rounding.slack(2.0 * d + r);
            let first = cluster.start + offsets.partition_point(|&e| e < low);
            for slot in first..cluster.end {
                let (e, r) = (self.offsets[slot], probe.radius());
                if e - d > r + rounding.slack(d + e + r) {
                    break;
                }
                counts.members += 1;
                probe.member(self.members[slot] as usize, slot);
            }
            let r = probe.radius();
            if d + r + rounding.slack(d + r + radius) < radius {
                break;
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::{ListOfClusters, MetricSpace, Probe, Rounding};

    /// Points on a line: the distance is |a − b|.
    struct Line(Vec<f64>);

    impl MetricSpace for Line {
        fn objects(&self) -> usize {
            self.0.len()
        }
        fn distances(&self, from: usize, to: &[u32]) -> Vec<f64> {
            to.iter().map(|&b| (self.0[from] - self.0[b as usize]).abs()).collect()
        }
    }

    struct Range<'a> {
        line: &'a Line,
        query: f64,
        radius: f64,
        found: Vec<usize>,
    }

    impl Probe for Range<'_> {
        fn distance(&mut self, i: usize, _cutoff: f64) -> f64 {
            (self.line.0[i] - self.query).abs()
        }
        fn radius(&self) -> f64 {
            self.radius
        }
        fn centre(&mut self, i: usize, distance: f64) {
            if distance <= self.radius {
                self.found.push(i);
            }
        }
        fn member(&mut self, i: usize, _slot: usize) {
            if (self.line.0[i] - self.query).abs() <= self.radius {
                self.found.push(i);
            }
        }
    }

    fn line(n: usize) -> Line {
        // A deterministic scatter with repeated values (ties at the covering radii).
        Line((0..n).map(|i| ((i * 7919) % 1000) as f64 / 10.0).collect())
    }

    #[test]
    fn every_object_is_in_exactly_one_cluster_or_a_centre() {
        let points = line(1000);
        let index = ListOfClusters::build(&points, 16, Rounding::EXACT);
        let mut seen: Vec<u32> = index.centres.iter().chain(&index.members).copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..1000).collect::<Vec<u32>>());
        assert_eq!(index.centres.len(), 1000usize.div_ceil(17));
    }

    #[test]
    fn range_searches_find_exactly_what_a_scan_finds_including_ties_at_the_radius() {
        let points = line(2000);
        for bucket in [1, 7, 45, 3000] {
            let index = ListOfClusters::build(&points, bucket, Rounding::EXACT);
            for (query, radius) in [(0.0, 0.0), (12.3, 0.5), (50.0, 1.0), (99.9, 10.0), (-5.0, 5.0), (33.3, 200.0)] {
                let mut probe = Range { line: &points, query, radius, found: Vec::new() };
                let counts = index.search(&mut probe);
                let mut found = probe.found;
                found.sort_unstable();
                let expected: Vec<usize> =
                    (0..points.0.len()).filter(|&i| (points.0[i] - query).abs() <= radius).collect();
                assert_eq!(found, expected, "bucket {bucket}, query {query}, radius {radius}");
                if bucket == 45 && radius < 1.0 {
                    assert!(counts.centres + counts.members < 2000 / 2, "the index pruned: {counts:?}");
                }
            }
        }
    }
}
