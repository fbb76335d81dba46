// Edit-distance joins and range queries on the device (`metric=levenshtein`): one block per left
// string, the pattern. Its threads share the pattern's match masks in shared memory (`peq`, one
// 64-bit word per alphabet code and pattern word, Myers' Peq table) and each measures right
// strings of its window — those whose length is within tau of the pattern's, ordered by length on
// the host so a window is one contiguous run — by Myers' bit-parallel algorithm (myers.cuh), cut
// off at tau.
#include "myers.cuh"

// Left strings first .. first + rows; left string i (codes left_chars[left_offsets[i] .. left_offsets[i + 1]]) against right strings
// window_start[i] .. window_end[i] of the length order (codes right_chars[right_offsets[s] ..
// right_offsets[s + 1]] for the s-th, input position right_positions[s]): every pair within tau
// is appended at an atomicAdd of `count`, written when below `capacity` (the host runs again with
// room for `count` when it is not). `peq` is alphabet · words 64-bit words of shared memory, where
// `words` covers the longest left string of the launch.
extern "C" __global__ void text_join(const u16* left_chars, const u32* left_offsets, u32 first, u32 rows,
                                     const u16* right_chars, const u32* right_offsets, const u32* right_positions,
                                     const u32* window_start, const u32* window_end, u32 alphabet, u32 words,
                                     u32 tau, u32* out_left, u32* out_right, u32* out_distance,
                                     unsigned long long* count, unsigned long long capacity) {
    extern __shared__ u64 peq[];
    for (u32 i = first + blockIdx.x; i < first + rows; i += gridDim.x) {
        const u32 begin = left_offsets[i];
        const u32 m = left_offsets[i + 1] - begin;
        stage_pattern(peq, alphabet, words, left_chars, begin, m);
        for (u32 s = window_start[i] + threadIdx.x; s < window_end[i]; s += blockDim.x) {
            const u32 text = right_offsets[s];
            const u32 distance = myers_distance(peq, words, m, right_chars, text, right_offsets[s + 1] - text, tau);
            if (distance <= tau) {
                const unsigned long long slot = atomicAdd(count, 1ull);
                if (slot < capacity) {
                    out_left[slot] = i;
                    out_right[slot] = right_positions[s];
                    out_distance[slot] = distance;
                }
            }
        }
    }
}
