/* reference.h — the float64 RMSNorm oracle every implementation is held against (by
 * the harness, `llmkern check` and tests/test_rms_norm.c). Plain loops on double
 * arrays, contiguous [rows, n]; no threads, no workspace, nothing clever. */
#ifndef LLMKERN_RMS_NORM_REFERENCE_H
#define LLMKERN_RMS_NORM_REFERENCE_H

#include <stdint.h>

/* y = x · rstd · (offset + w), rstd[r] = 1 / sqrt(mean(x[r]²) + eps). w may be NULL
 * (no weight: y = x̂); rstd may be NULL when the caller does not want it. */
void lk_rms_norm_ref_forward(const double *x, const double *w, double offset, double eps,
                             int64_t rows, int64_t n, double *y, double *rstd);

/* The exact gradients: dx always, dw (sum over rows of dy · x̂) unless w or dw is NULL.
 * Recomputes rstd from x, so it needs nothing saved. */
void lk_rms_norm_ref_backward(const double *x, const double *w, double offset, double eps,
                              const double *dy, int64_t rows, int64_t n, double *dx, double *dw);

/* The same formulas at a given rstd [rows] (NULL: rstd of x, the call above): what the
 * residual mode's backward computes (rms_norm.h), x̂ = x·rstd with the rounded x and the
 * rstd of the f32 stream the forward normalized. */
void lk_rms_norm_ref_backward_at(const double *x, const double *rstd, const double *w, double offset, double eps,
                                 const double *dy, int64_t rows, int64_t n, double *dx, double *dw);

#endif
