// Range searches through the List of Clusters (Chávez & Navarro) on the device, as Barrientos et
// al. run it ("Range query processing in a multi-GPU environment", Algorithm 1): one block per
// left row (a query); its threads measure the query against the centres round-robin, the first
// centre whose ball holds the query's ball ends the list (atomicMin), and the clusters up to it
// whose balls meet the query's are scanned, each member measured only when its stored distance to
// the centre is within r of the query's (the triangle inequality). The bounds are the host's
// (index::clusters::ListOfClusters::search) with the same rounding slack, and every candidate is
// decided by the exact test (common.cuh's exact_distance, or the whole edit distance), so the
// pairs are the CPU's, bit for bit.
#include "myers.cuh"

// The index over the right input: centre c is right object centres[c] with covering radius
// radii[c]; its members are members[starts[c] .. starts[c + 1]] (right objects), ordered by their
// distance to it, offsets[slot].
struct ClusterList {
    const u32* centres;
    const double* radii;
    const u32* starts;
    const u32* members;
    const double* offsets;
    u32 clusters;
    double relative;  // Rounding: slack(scale) = relative · scale + 2 · absolute
    double absolute;
};

// A kernel's parameters for its ClusterList, and the list made of them.
#define CLUSTER_LIST_PARAMS                                                                                 \
    const u32 *centres, const double *radii, const u32 *starts, const u32 *members, const double *offsets, \
        u32 clusters, double relative, double absolute
#define CLUSTER_LIST {centres, radii, starts, members, offsets, clusters, relative, absolute}

__device__ __forceinline__ double slack(const ClusterList& l, double scale) {
    return isfinite(scale) ? l.relative * scale + 2.0 * l.absolute : 0.0;
}

// One left row's search: `distance(object, cutoff)` measures the query against a right object in
// the index's space (above the cutoff it may return any value above it), `consider(object)`
// decides a candidate. `centre_distance` holds l.clusters doubles of shared memory, `last` one u32.
template <class Distance, class Consider>
__device__ __forceinline__ void search_clusters(const ClusterList& l, double r, double* centre_distance, u32* last,
                                                Distance distance, Consider consider) {
    if (threadIdx.x == 0) *last = l.clusters - 1;
    __syncthreads();
    for (u32 c = threadIdx.x; c < l.clusters; c += blockDim.x) {
        const double radius = l.radii[c];
        const double d = distance(l.centres[c], radius + r + slack(l, 2.0 * (radius + r)));
        centre_distance[c] = d;
        // The query's ball inside this cluster's: no later cluster holds a pair (strictly).
        if (d + r + slack(l, d + r + radius) < radius) atomicMin(last, c);
    }
    __syncthreads();
    const u32 end = *last + 1;
    for (u32 c = threadIdx.x; c < end; c += blockDim.x) {
        const double d = centre_distance[c];
        if (d <= r + slack(l, d + r)) consider(l.centres[c]);
    }
    for (u32 c = 0; c < end; c++) {
        const double d = centre_distance[c], radius = l.radii[c];
        if (d > radius + r + slack(l, d + radius + r)) continue;
        // |d − e| ≤ r with the slack of the host's search.
        const double low = d - r - slack(l, 2.0 * d + r);
        for (u32 slot = l.starts[c] + threadIdx.x; slot < l.starts[c + 1]; slot += blockDim.x) {
            const double e = l.offsets[slot];
            if (e >= low && !(e - d > r + slack(l, d + e + r))) consider(l.members[slot]);
        }
    }
    __syncthreads();
}

// Appends pair (i, j, distance) at an atomicAdd of `count` when below `capacity`.
__device__ __forceinline__ void append_pair(u32 i, u32 j, double distance, u32* out_left, u32* out_right,
                                            double* out_distance, unsigned long long* count,
                                            unsigned long long capacity) {
    const unsigned long long slot = atomicAdd(count, 1ull);
    if (slot < capacity) {
        out_left[slot] = i;
        out_right[slot] = j;
        out_distance[slot] = distance;
    }
}

// The index's distance between two rows: L2, L1 or L∞ (cosine's chords are L2 over unit rows).
__device__ __forceinline__ double space_distance(u32 metric, const double* a, const double* b, u32 dim) {
    switch (metric) {
    case METRIC_L2: return sqrt(exact_sum<METRIC_L2>(a, b, dim));
    case METRIC_L1: return exact_sum<METRIC_L1>(a, b, dim);
    default: return exact_sum<METRIC_LINF>(a, b, dim);
    }
}

// Vectors: left rows first .. first + rows against the index over the right rows. The index's
// space is `space_metric` over `left_space`/`right_space` (the rows, or cosine's unit rows), the
// answer's `p.metric` over the exact rows (with cosine's Σx² norms) within p.threshold; a
// self-join (p.self_join) keeps the pairs whose right position is the larger. r is the radius in
// the index's space. Dynamic shared memory: l.clusters doubles.
extern "C" __global__ void __launch_bounds__(128) clusters_range_vectors(
    JoinParams p, u32 space_metric, double r, CLUSTER_LIST_PARAMS, const double* left_space, const double* right_space,
    const double* left_exact, const double* right_exact, const double* left_norms, const double* right_norms,
    u32 first, u32 rows, u32* out_left, u32* out_right, double* out_distance, unsigned long long* count,
    unsigned long long capacity) {
    extern __shared__ double centre_distance[];
    __shared__ u32 last;
    const ClusterList l = CLUSTER_LIST;
    for (u32 i = first + blockIdx.x; i < first + rows; i += gridDim.x) {
        const double* query = left_space + (u64)i * p.dim;
        const double* exact = left_exact + (u64)i * p.dim;
        const double norm = cosine_norm(p, left_norms, i);
        search_clusters(
            l, r, centre_distance, &last,
            [&](u32 j, double) { return space_distance(space_metric, query, right_space + (u64)j * p.dim, p.dim); },
            [&](u32 j) {
                if (p.self_join && j <= i) return;
                const double d = exact_distance(p, exact, right_exact + (u64)j * p.dim, norm, cosine_norm(p, right_norms, j));
                if (d <= p.threshold) append_pair(i, j, d, out_left, out_right, out_distance, count, capacity);
            });
    }
}

// Strings: left strings first .. first + rows (alphabet codes, as text_join's) against the index
// over the right strings (right_offsets in input order), within tau edits; a self-join keeps the
// pairs whose right position is the larger. Dynamic shared memory: the pattern table (alphabet ·
// words u64), then l.clusters doubles.
extern "C" __global__ void __launch_bounds__(128) clusters_range_text(
    u32 tau, u32 self_join, CLUSTER_LIST_PARAMS, const u16* left_chars, const u32* left_offsets, const u16* right_chars,
    const u32* right_offsets, u32 alphabet, u32 words, u32 first, u32 rows, u32* out_left, u32* out_right,
    double* out_distance, unsigned long long* count, unsigned long long capacity) {
    extern __shared__ u64 peq[];
    double* centre_distance = reinterpret_cast<double*>(peq + alphabet * words);
    __shared__ u32 last;
    const ClusterList l = CLUSTER_LIST;
    for (u32 i = first + blockIdx.x; i < first + rows; i += gridDim.x) {
        const u32 begin = left_offsets[i];
        const u32 m = left_offsets[i + 1] - begin;
        stage_pattern(peq, alphabet, words, left_chars, begin, m);
        const auto edits = [&](u32 j, u32 cutoff) {
            return myers_distance(peq, words, m, right_chars, right_offsets[j], right_offsets[j + 1] - right_offsets[j], cutoff);
        };
        search_clusters(
            l, (double)tau, centre_distance, &last,
            // Cut off at the whole edits within `cutoff`: beyond it the distance is cutoff + 1.
            [&](u32 j, double cutoff) { return (double)edits(j, cutoff >= 4e9 ? 4000000000u : (u32)cutoff); },
            [&](u32 j) {
                if (self_join && j <= i) return;
                const u32 d = edits(j, tau);
                if (d <= tau) append_pair(i, j, (double)d, out_left, out_right, out_distance, count, capacity);
            });
    }
}
