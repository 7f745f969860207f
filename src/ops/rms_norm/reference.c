/* reference.c — the float64 RMSNorm oracle (see reference.h). Written as the textbook
 * formulas so that a reader can check it against the math in one look:
 *   x̂ = x·rstd,  y = x̂·(offset + w)
 *   g = dy·(offset + w),  dx = rstd·(g − x̂·mean(g·x̂)),  dw = Σ_rows dy·x̂ */
#include "reference.h"

#include <math.h>
#include <stddef.h>

static double row_rstd(const double *xr, int64_t n, double eps) {
    double ss = 0.0;
    for (int64_t j = 0; j < n; j++) ss += xr[j] * xr[j];
    return 1.0 / sqrt(ss / (double)n + eps);
}

void lk_rms_norm_ref_forward(const double *x, const double *w, double offset, double eps,
                             int64_t rows, int64_t n, double *y, double *rstd) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n;
        double s = row_rstd(xr, n, eps);
        if (rstd) rstd[r] = s;
        for (int64_t j = 0; j < n; j++)
            y[r * n + j] = xr[j] * s * (w ? offset + w[j] : 1.0);
    }
}

void lk_rms_norm_ref_backward(const double *x, const double *w, double offset, double eps,
                              const double *dy, int64_t rows, int64_t n, double *dx, double *dw) {
    lk_rms_norm_ref_backward_at(x, NULL, w, offset, eps, dy, rows, n, dx, dw);
}

void lk_rms_norm_ref_backward_at(const double *x, const double *rstd, const double *w, double offset, double eps,
                                 const double *dy, int64_t rows, int64_t n, double *dx, double *dw) {
    int want_dw = w != NULL && dw != NULL;
    if (want_dw)
        for (int64_t j = 0; j < n; j++) dw[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n, *dyr = dy + r * n;
        double s = rstd ? rstd[r] : row_rstd(xr, n, eps), dot = 0.0;
        for (int64_t j = 0; j < n; j++)
            dot += dyr[j] * (w ? offset + w[j] : 1.0) * xr[j] * s;
        dot /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xhat = xr[j] * s, g = dyr[j] * (w ? offset + w[j] : 1.0);
            dx[r * n + j] = s * (g - xhat * dot);
            if (want_dw) dw[j] += dyr[j] * xhat;
        }
    }
}
