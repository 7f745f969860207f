/* rng.h — a counter-based generator: number i of a stream is a pure function of
 * (seed, offset + i), so a fill gives the same numbers whatever the thread count. */
#ifndef LLMKERN_RNG_H
#define LLMKERN_RNG_H

#include <stdint.h>
#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t seed;
    uint64_t offset;   /* counters already used; every fill advances it */
} lk_rng;

LK_API lk_rng lk_rng_make(uint64_t seed);
/* 64 random bits for one counter value. */
LK_API uint64_t lk_rng_bits(uint64_t seed, uint64_t counter);
/* Uniform in [lo, hi), and normal(mean, std); threaded, deterministic. */
LK_API void lk_rng_uniform(lk_rng *r, float *out, int64_t n, float lo, float hi);
LK_API void lk_rng_normal(lk_rng *r, float *out, int64_t n, float mean, float std);

#ifdef __cplusplus
}
#endif
#endif
