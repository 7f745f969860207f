/* mix.h — splitmix64's finalizer and llmkern's counter-based draw, one definition for the
 * host and the device: core/rng.c (lk_rng_bits is lk_mix_bits), the fake_balanced router's
 * draws (ops/moe/fake_gate.h) and the bf16 AdamW moments' rounding bits (core/sround.h),
 * so a CPU row and its CUDA row draw the same numbers. Not installed. */
#ifndef LLMKERN_CORE_MIX_H
#define LLMKERN_CORE_MIX_H

#include <stdint.h>

#ifdef __CUDACC__
#define LK_MIX_FN static __host__ __device__ __forceinline__
#else
#define LK_MIX_FN static inline
#endif

#define LK_MIX_PHI 0x9e3779b97f4a7c15ull   /* 2^64 / the golden ratio */

LK_MIX_FN uint64_t lk_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64 random bits for (seed, counter): two rounds of the finalizer (the second
 * decorrelates neighbouring counters of neighbouring seeds). */
LK_MIX_FN uint64_t lk_mix_bits(uint64_t seed, uint64_t counter) {
    return lk_mix64(lk_mix64(seed * LK_MIX_PHI ^ (counter + 0x632be59bd9b4e019ull)));
}

#endif
