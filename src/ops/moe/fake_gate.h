/* fake_gate.h — the draws of the `fake_balanced` router at noise > 0, one definition
 * for its CPU row (fake_balanced.c) and its CUDA row (fake_balanced.cu), so both route a
 * given input the same way, bit for bit.
 *
 *   seed      a hash of every byte of hidden: word i (8 bytes, little-endian; the last
 *             n mod 8 bytes zero-padded into one more word) contributes
 *             mix(word + (i + 1)·φ), the contributions are added mod 2^64 (so the sum
 *             can be split over threads and blocks in any order) and the sum is mixed
 *             with the byte count.
 *   bias[x]   N(0, 1)·0.1·noise by Box-Muller from draws 2x and 2x + 1, in double and
 *             rounded once to f32 (the CPU's libm and CUDA's agree on that rounding
 *             but for a ~1e-8 chance per expert).
 *   scores    uniform(seed, 2E + t·E + x) + bias[x], f32; the top k, ties to the lower
 *             index.
 *   weights   r_j = uniform(seed, 2E + T·E + t·k + j) + 2^-24, summed in order j;
 *             route_scale · ((1 - noise)/k + noise·r_j/Σr), f32, no contraction.
 * uniform(seed, c) is the top 24 bits of lk_mix_bits(seed, c) (core/mix.h: lk_rng_bits
 * on the host and the device alike) as a multiple of 2^-24 in [0, 1). Not installed. */
#ifndef LLMKERN_MOE_FAKE_GATE_H
#define LLMKERN_MOE_FAKE_GATE_H

#include <math.h>
#include <stdint.h>
#include "core/mix.h"

#ifdef __CUDACC__
#define LK_FAKE_FN static __host__ __device__ __forceinline__
#else
#define LK_FAKE_FN static inline
#endif

/* Word i's share of the content hash. */
LK_FAKE_FN uint64_t lk_fake_word(uint64_t v, uint64_t i) { return lk_mix64(v + (i + 1) * LK_MIX_PHI); }

/* The n % 8 bytes after the last whole word, little-endian, zero-padded. */
LK_FAKE_FN uint64_t lk_fake_tail(const unsigned char *p, uint64_t bytes) {
    uint64_t v = 0;
    for (uint64_t b = 0; b < bytes; b++) v |= (uint64_t)p[b] << (8 * b);
    return v;
}

/* The seed from the sum of every word's share and the byte count. */
LK_FAKE_FN uint64_t lk_fake_seed(uint64_t sum, uint64_t bytes) {
    return lk_mix64(sum ^ lk_mix64(bytes ^ 0x632be59bd9b4e019ull));
}

LK_FAKE_FN float lk_fake_uniform(uint64_t seed, uint64_t counter) {
    return (float)(lk_mix_bits(seed, counter) >> 40) * 0x1p-24f;
}

LK_FAKE_FN float lk_fake_bias(uint64_t seed, int64_t x, float noise) {
    double u1 = (double)lk_fake_uniform(seed, 2 * (uint64_t)x) + 0x1p-25, u2 = lk_fake_uniform(seed, 2 * (uint64_t)x + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * 0.1 * (double)noise);
}

/* First counters of the scores and of the weights' draws. */
LK_FAKE_FN uint64_t lk_fake_score0(int64_t e) { return 2 * (uint64_t)e; }
LK_FAKE_FN uint64_t lk_fake_weight0(int64_t t, int64_t e) { return 2 * (uint64_t)e + (uint64_t)(t * e); }

LK_FAKE_FN float lk_fake_weight(float scale, float noise, int k, float r, float sum) {
    float even = (1.0f - noise) / (float)k, share = noise * r / sum;
    return scale * (even + share);
}

#endif
