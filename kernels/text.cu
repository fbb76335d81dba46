// Edit-distance joins and range queries on the device (`metric=levenshtein`): one block per left
// string, the pattern. Its threads share the pattern's match masks in shared memory (`peq`, one
// 64-bit word per alphabet code and pattern word, Myers' Peq table) and each measures right
// strings of its window — those whose length is within tau of the pattern's, ordered by length on
// the host so a window is one contiguous run — by Myers' bit-parallel algorithm (Hyyrö's global
// form for several words: the top row of the first word grows by one per column, the horizontal
// delta of each word's top row carried into the next), the backend/text/levenshtein.rs recurrence
// step for step. A string is cut off once its score minus the columns left exceeds tau (each
// column moves the last row by at most one), so most candidates stop after a few characters.
#include "common.cuh"

typedef unsigned short u16;

// Words of a pattern (patterns of up to 64 · TEXT_MAX_WORDS characters).
#define TEXT_MAX_WORDS 8

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
        const u32 pattern_words = m == 0 ? 1 : (m + 63) / 64;
        __syncthreads();
        for (u32 w = threadIdx.x; w < alphabet * words; w += blockDim.x) peq[w] = 0;
        __syncthreads();
        for (u32 p = threadIdx.x; p < m; p += blockDim.x) {
            atomicOr((unsigned long long*)&peq[(u32)left_chars[begin + p] * words + p / 64], 1ull << (p % 64));
        }
        __syncthreads();
        const u64 last = m == 0 ? 0 : 1ull << ((m - 1) % 64);
        for (u32 s = window_start[i] + threadIdx.x; s < window_end[i]; s += blockDim.x) {
            const u32 text = right_offsets[s];
            const u32 n = right_offsets[s + 1] - text;
            u32 distance;
            if (m == 0) {
                distance = n;
            } else {
                u64 vp[TEXT_MAX_WORDS], vn[TEXT_MAX_WORDS];
                for (u32 w = 0; w < pattern_words; w++) {
                    vp[w] = ~0ull;
                    vn[w] = 0;
                }
                long long score = m;
                bool cut = false;
                for (u32 j = 0; j < n; j++) {
                    const u32 c = right_chars[text + j];
                    int carry = 1;
                    for (u32 w = 0; w < pattern_words; w++) {
                        const u64 high = w + 1 == pattern_words ? last : 1ull << 63;
                        const u64 p = vp[w], mv = vn[w];
                        u64 eq = peq[c * words + w];
                        const u64 xv = eq | mv;
                        if (carry < 0) eq |= 1;
                        const u64 xh = (((eq & p) + p) ^ p) | eq;
                        u64 ph = mv | ~(xh | p);
                        u64 mh = p & xh;
                        const int out = (ph & high) ? 1 : ((mh & high) ? -1 : 0);
                        ph <<= 1;
                        mh <<= 1;
                        if (carry < 0) {
                            mh |= 1;
                        } else if (carry > 0) {
                            ph |= 1;
                        }
                        vp[w] = mh | ~(xv | ph);
                        vn[w] = ph & xv;
                        carry = out;
                    }
                    score += carry;
                    if (score > (long long)tau + (long long)(n - j - 1)) {
                        cut = true;
                        break;
                    }
                }
                distance = cut ? tau + 1 : (u32)score;
            }
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
