// Myers' bit-parallel edit distance (Hyyrö's global form for several words: the top row of the
// first word grows by one per column, the horizontal delta of each word's top row carried into the
// next), the backend/cpu/text/levenshtein.rs recurrence step for step, for text.cu and clusters.cu.
#pragma once
#include "common.cuh"

typedef unsigned short u16;

// Words of a pattern (patterns of up to 64 · TEXT_MAX_WORDS characters).
#define TEXT_MAX_WORDS 8

// Fills `peq` (alphabet · words 64-bit words of shared memory, Myers' Peq table) with the match
// masks of the pattern chars[begin .. begin + m], every thread of the block taking part; the
// block is synchronised before and after.
__device__ __forceinline__ void stage_pattern(u64* peq, u32 alphabet, u32 words, const u16* chars, u32 begin, u32 m) {
    __syncthreads();
    for (u32 w = threadIdx.x; w < alphabet * words; w += blockDim.x) peq[w] = 0;
    __syncthreads();
    for (u32 p = threadIdx.x; p < m; p += blockDim.x) {
        atomicOr((unsigned long long*)&peq[(u32)chars[begin + p] * words + p / 64], 1ull << (p % 64));
    }
    __syncthreads();
}

// The edit distance between the staged pattern (m characters, a table of `words` words a code)
// and the text chars[text .. text + n], or tau + 1 once it must exceed tau: a string is cut off
// once its score minus the columns left exceeds tau (each column moves the last row by at most
// one), so most candidates stop after a few characters.
__device__ __forceinline__ u32 myers_distance(const u64* peq, u32 words, u32 m, const u16* chars, u32 text, u32 n, u32 tau) {
    if (m == 0) return n <= tau ? n : tau + 1;
    const u32 pattern_words = (m + 63) / 64;
    const u64 last = 1ull << ((m - 1) % 64);
    u64 vp[TEXT_MAX_WORDS], vn[TEXT_MAX_WORDS];
    for (u32 w = 0; w < pattern_words; w++) {
        vp[w] = ~0ull;
        vn[w] = 0;
    }
    long long score = m;
    for (u32 j = 0; j < n; j++) {
        const u32 c = chars[text + j];
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
        if (score > (long long)tau + (long long)(n - j - 1)) return tau + 1;
    }
    return (u32)score;
}
