/* row.h — one row of the CPU's `fused` RoPE (fused.c), for rms_norm's fused row too, which
 * rotates its output by it (rms_norm.h's rope: the bits of the norm and then this RoPE).
 * Not installed. */
#ifndef LLMKERN_ROPE_ROW_H
#define LLMKERN_ROPE_ROW_H

#include "ops/simd.h"

/* y = x rotated by the angle of (c, s·sign) on the first 2h dims; the rest copied. */
static inline __attribute__((always_inline)) void lk_rope_row(const void *x, void *y, const float *c, const float *s,
                                                             lk_v16 sign, lk_dtype dt, int64_t h, int64_t D, int nt) {
    for (int64_t j = 0; j < h; j += 16) {
        int k = h - j < 16 ? (int)(h - j) : 16;
        lk_v16 x1 = lk_v16_load(x, dt, j, k), x2 = lk_v16_load(x, dt, j + h, k);
        lk_v16 vc = lk_v16_load(c, LK_F32, j, k), vs = lk_v16_mul(lk_v16_load(s, LK_F32, j, k), sign);
        lk_v16_store(y, dt, j, lk_v16_fnma(x2, vs, lk_v16_mul(x1, vc)), k, nt);      /* x1·c − x2·s */
        lk_v16_store(y, dt, j + h, lk_v16_fma(x1, vs, lk_v16_mul(x2, vc)), k, nt);   /* x2·c + x1·s */
    }
    if (x == y) return;
    for (int64_t j = 2 * h; j < D; j += 16) {
        int k = D - j < 16 ? (int)(D - j) : 16;
        lk_v16_store(y, dt, j, lk_v16_load(x, dt, j, k), k, nt);
    }
}

#endif
