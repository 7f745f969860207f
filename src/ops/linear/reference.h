/* reference.h — the float64 linear oracle every implementation is held against (by
 * the harness, `llmkern check` and tests/test_linear.c). Triple loops on contiguous
 * double arrays; no threads, nothing clever. */
#ifndef LLMKERN_LINEAR_REFERENCE_H
#define LLMKERN_LINEAR_REFERENCE_H

#include <stdint.h>

/* y[rows, out] = x[rows, in] · w[out, in]ᵀ + b (b may be NULL). */
void lk_linear_ref_forward(const double *x, const double *w, const double *b, int64_t rows, int64_t in,
                           int64_t out, double *y);
/* dx = dy · w (written; dx may be NULL), dw += dyᵀ · x and db += Σ_rows dy (accumulated,
 * as the op does; either may be NULL). */
void lk_linear_ref_backward(const double *x, const double *w, const double *dy, int64_t rows, int64_t in,
                            int64_t out, double *dx, double *dw, double *db);

#endif
