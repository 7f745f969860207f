/* rng.c — counter-based random numbers: a splitmix64-style finalizer over
 * (seed, counter), so element i never depends on how the work was split. */
#include <math.h>
#include "llmkern/rng.h"

lk_rng lk_rng_make(uint64_t seed) { return (lk_rng){.seed = seed, .offset = 0}; }

uint64_t lk_rng_bits(uint64_t seed, uint64_t counter) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (counter + 0x632be59bd9b4e019ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    /* a second round decorrelates neighbouring counters of neighbouring seeds */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

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
