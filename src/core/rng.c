/* rng.c — counter-based random numbers: a splitmix64-style finalizer over
 * (seed, counter), so element i never depends on how the work was split. */
#include <math.h>
#include "core/mix.h"
#include "llmkern/rng.h"

lk_rng lk_rng_make(uint64_t seed) { return (lk_rng){.seed = seed, .offset = 0}; }

uint64_t lk_rng_bits(uint64_t seed, uint64_t counter) { return lk_mix_bits(seed, counter); }

/* (0, 1]: never 0, so log() in Box-Muller is finite. */
static double unit(uint64_t bits) { return ((double)(bits >> 11) + 1.0) * 0x1.0p-53; }

void lk_rng_uniform(lk_rng *r, float *out, int64_t n, float lo, float hi) {
    const uint64_t seed = r->seed, base = r->offset;
    #pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++)
        out[i] = lo + (hi - lo) * (float)(unit(lk_rng_bits(seed, base + (uint64_t)i)) - 0x1.0p-53);
    r->offset += (uint64_t)n;
}

void lk_rng_normal(lk_rng *r, float *out, int64_t n, float mean, float std) {
    const uint64_t seed = r->seed, base = r->offset;
    #pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        uint64_t c = base + 2 * (uint64_t)i;
        double u1 = unit(lk_rng_bits(seed, c)), u2 = unit(lk_rng_bits(seed, c + 1));
        out[i] = mean + std * (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    r->offset += 2 * (uint64_t)n;
}
