/* reference.h — the float64 SwiGLU MLP oracle every implementation is held against (by
 * the harness, `llmkern check` and tests/test_swiglu_mlp.c). Plain loops on contiguous
 * double arrays; no threads, nothing clever. Shapes: x [T, H], wgu [2I, H] (gate rows
 * first), wd [H, I]; L = swiglu_limit (0 = off). */
#ifndef LLMKERN_SWIGLU_MLP_REFERENCE_H
#define LLMKERN_SWIGLU_MLP_REFERENCE_H

#include <stdint.h>

/* gate_up[t, 2I]: the pre-activations, gate then up, before any clamp. */
void lk_swiglu_mlp_ref_preact(const double *x, const double *wgu, int64_t t, int64_t h, int64_t i, double *gate_up);

/* The swiglu_limit to test with near want: the clamp is a step in the gradient, so a
 * pre-activation within a rounding of the limit may be clamped on one side and not on the
 * other (bf16 storage moves gate by up to 2^-9 of itself), an O(1) difference that says
 * nothing about the kernel. Returns the point of [0.8, 1.2]·want farthest from every |gate|
 * and |up| of x, wgu, rounded to float (the op's limit); want if no memory. */
double lk_swiglu_mlp_ref_limit(double want, const double *x, const double *wgu, int64_t t, int64_t h, int64_t i);

void lk_swiglu_mlp_ref_forward(const double *x, const double *wgu, const double *wd, int64_t t, int64_t h,
                               int64_t i, double limit, double *out);

/* dx written; dwgu and dwd ACCUMULATED (as the op does), either may be NULL. Recomputes
 * gate and up from x, so it needs nothing saved. */
void lk_swiglu_mlp_ref_backward(const double *x, const double *wgu, const double *wd, const double *dout,
                                int64_t t, int64_t h, int64_t i, double limit, double *dx, double *dwgu,
                                double *dwd);

#endif
