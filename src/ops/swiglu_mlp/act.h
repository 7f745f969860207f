/* act.h — the SwiGLU activation and its derivative, per element, shared by eager.c and
 * fused.c so both compute the same function. f32 math; exp is a polynomial the compiler
 * vectorizes (libm's expf is not vectorized without -ffast-math), relative error ~2e-7. */
#ifndef LLMKERN_SWIGLU_ACT_H
#define LLMKERN_SWIGLU_ACT_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ops/dense.h"

/* exp(x) as 2^n · e^g, n = round(x·log2 e), |g| <= ln2/2, g's Taylor series to degree 6
 * (truncation 1.2e-7). x is clamped to [-87, 88] so 2^n stays a normal float. */
LK_DENSE_INLINE float lk_act_exp(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;   /* round to nearest */
    float g = x - n * 0.693145752f - n * 1.42860677e-6f;       /* ln2 in two parts */
    float p = 1.0f / 720;
    p = p * g + 1.0f / 120;
    p = p * g + 1.0f / 24;
    p = p * g + 1.0f / 6;
    p = p * g + 0.5f;
    p = p * g + 1.0f;
    p = p * g + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

LK_DENSE_INLINE float lk_act_sigmoid(float g) { return 1.0f / (1.0f + lk_act_exp(-g)); }

/* The clamps of swiglu_limit L (L = 0: off). The gradient passes where the input lies
 * within the bounds, bounds included, as torch.clamp's does. */
LK_DENSE_INLINE float lk_act_clamp_gate(float g, float L) { return L > 0.0f ? fminf(g, L) : g; }
LK_DENSE_INLINE float lk_act_clamp_up(float u, float L) { return L > 0.0f ? fminf(fmaxf(u, -L), L) : u; }
LK_DENSE_INLINE float lk_act_pass_gate(float g, float L) { return L > 0.0f && g > L ? 0.0f : 1.0f; }
LK_DENSE_INLINE float lk_act_pass_up(float u, float L) { return L > 0.0f && fabsf(u) > L ? 0.0f : 1.0f; }

/* h = silu(clamp(g)) · clamp(u). */
LK_DENSE_INLINE float lk_act_forward(float g, float u, float L) {
    float gc = lk_act_clamp_gate(g, L);
    return gc * lk_act_sigmoid(gc) * lk_act_clamp_up(u, L);
}

/* From dh and the pre-activations: h (for d_down_weight), dg and du. */
LK_DENSE_INLINE void lk_act_backward(float g, float u, float dh, float L, float *h, float *dg, float *du) {
    float gc = lk_act_clamp_gate(g, L), uc = lk_act_clamp_up(u, L);
    float s = lk_act_sigmoid(gc), silu = gc * s;
    *h = silu * uc;
    *dg = dh * uc * s * (1.0f + gc * (1.0f - s)) * lk_act_pass_gate(g, L);
    *du = dh * silu * lk_act_pass_up(u, L);
}

#endif
