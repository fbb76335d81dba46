// kNN's settle step after a scores pass: exact distances only for the pairs that can be among
// the k nearest. Included by brute_join.cu.

// The rest of kNN's first count pass under PASS_SCORES (brute_join_tc on f16 rows, L2 and L2²,
// k ≤ 32), a warp per left slot s of [slot_begin, slot_end). brute_join_tc's drain computed the
// exact distance of every pair that passed the filter: at P1 (k = 10) ~450 a query at its sample
// radius, 1.9 ms of its ~12 (docs/design.md#gpu-knn), of which the k nearest need few. Under
// PASS_SCORES every such pair (s, t) has in the slot (keep_scores)
//     a = v,   b = v + 2w(t),   v = −2x̂·ŷ + [‖ỹ‖²] − w(t)   (all scaled by 2^2a, w = tc_widening),
// and tensor_core_margin's bound |score − D| ≤ W (D the pair's scaled squared distance, score =
// [‖x̃‖²] + [‖ỹ‖²] − 2x̂·ŷ, W = w(s) + w(t) + floor, the filter's own widening) gives
//     L = a + [‖x̃‖²] − w(s) − floor  ≤  D  ≤  b + [‖x̃‖²] + w(s) + floor = U.
// (v is rounded down: its f32 roundings, a few 2⁻²³ of the squared norms it adds, lie far inside
// the half of W's relative part that the bound leaves unused, m·(n(x̃) + n(ỹ))²/2 ≥
// 2⁻¹¹·(n(x̃) + n(ỹ))²; L is rounded down, U up.) Let T be the k-th smallest U of the slot. k of its pairs have D ≤
// T, so the slot's k-th smallest exact distance δ_k has δ_k² ≤ T (up to the f64 sums' relative
// rounding ε ≤ d·2⁻⁵³, scaled), and any pair among its k nearest (δ ≤ δ_k, ties included) has L ≤
// D ≤ T·(1 + 3ε). So the pairs with L ≤ T·(1 + 2⁻²⁰) hold the slot's k nearest, and only they are
// checked exactly. Those within the radius are compacted to the slot's front with their exact
// distance and base position, and their number replaces the count. The slot holds every pair
// within the radius (the filter passes them all), so if at least k rows are within it, the k
// nearest of the base are, and are in the slot and checked: a count of k or more means the slot
// is ranked as before (knn_select_slots), and one below k means fewer than k rows are within the
// radius, a short query as with exact counts. A count below k is short already (the filter's
// count bounds the exact one); one above the slot's room is left as it is, and the host counts
// that query again in an exact pass.
extern "C" __global__ void __launch_bounds__(256) knn_settle_slots(JoinParams p, u32 slot_begin, u32 slot_end, u32 k,
        const double* lx, const double* rx, const float* lfnorm, const float* lfsq, const u32* right_order,
        const double* row_threshold, u32* counts, u32* out_right, double* out_distance) {
    const u32 s = slot_begin + (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (s >= slot_end) return;
    const u32 found = counts[s - slot_begin];
    if (found < k || found > p.slot_capacity) return;
    const u64 first = (u64)(s - slot_begin) * p.slot_capacity;
    const float2* scores = (const float2*)(out_distance + first);
    // T: the k-th smallest b, by keys (b's order, index), which are distinct; each round the lane
    // that held the warp's smallest looks for its next.
    auto smallest_above = [&](u64 floor, bool bounded) {
        u64 best = ~0ull;
        for (u32 j = lane; j < found; j += 32) {
            const u64 key = (u64)f32_order_key(scores[j].y) << 32 | j;
            if ((!bounded || key > floor) && key < best) best = key;
        }
        return best;
    };
    u64 mine = smallest_above(0, false), kth = 0;
    for (u32 r = 0; r < k; ++r) {
        kth = mine;
#pragma unroll
        for (u32 d = 16; d > 0; d >>= 1) kth = min(kth, (u64)__shfl_xor_sync(0xffffffffu, kth, d));
        if (mine == kth) mine = smallest_above(kth, true);
    }
    const float squared_scale = p.tc_scale * p.tc_scale;
    const float widening = __fadd_ru(tc_widening(p, __fmul_ru(lfnorm[s], p.tc_scale)), p.dot_floor);
    const float upper = __fadd_ru(__fadd_ru(from_f32_order_key((u32)(kth >> 32)), __fmul_ru(lfsq[s], squared_scale)), widening);
    const float most = __fadd_ru(upper, __fmul_ru(fabsf(upper), 0x1p-20f));
    const float sq_down = __fmul_rd(lfsq[s], squared_scale);
    // The pairs to check, their right slots compacted to the slot's front. Each round's loads come
    // before its stores (__syncwarp), which land at or below the round's indices; later rounds
    // read above them.
    u32 checked = 0;
    for (u32 j0 = 0; j0 < found; j0 += 32) {
        const u32 j = j0 + lane;
        const bool check = j < found && __fsub_rd(__fadd_rd(scores[j].x, sq_down), widening) <= most;
        const u32 t = check ? out_right[first + j] : 0;
        __syncwarp();
        const u32 mask = __ballot_sync(0xffffffffu, check);
        if (check) out_right[first + checked + __popc(mask & ((1u << lane) - 1))] = t;
        checked += __popc(mask);
    }
    // Their exact distances; those within the radius compacted likewise, as record_pair keeps them.
    const double* x = lx + (u64)s * p.dim;
    u32 kept = 0;
    for (u32 j0 = 0; j0 < checked; j0 += 32) {
        const u32 j = j0 + lane;
        bool keep = false;
        u32 t = 0;
        double dist = 0.0;
        if (j < checked) {
            t = out_right[first + j];
            dist = exact_distance(p, x, rx + (u64)t * p.dim, 0.0, 0.0);
            keep = dist <= row_threshold[s] || takes_every_row(p, row_threshold, s);
        }
        __syncwarp();
        const u32 mask = __ballot_sync(0xffffffffu, keep);
        if (keep) {
            const u64 at = first + kept + __popc(mask & ((1u << lane) - 1));
            out_right[at] = right_order[t];
            out_distance[at] = dist;
        }
        kept += __popc(mask);
    }
    if (lane == 0) counts[s - slot_begin] = kept;
}
