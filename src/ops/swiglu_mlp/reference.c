/* reference.c — the float64 SwiGLU MLP oracle (see reference.h). */
#include <math.h>
#include <stdlib.h>
#include "ops/swiglu_mlp/reference.h"

/* gate and up of token r into g[i], u[i] (before the clamps). */
static void pre(const double *x, const double *wgu, int64_t r, int64_t h, int64_t i, double *g, double *u) {
    for (int64_t j = 0; j < 2 * i; j++) {
        double s = 0.0;
        for (int64_t k = 0; k < h; k++) s += x[r * h + k] * wgu[j * h + k];
        if (j < i) g[j] = s;
        else u[j - i] = s;
    }
}

void lk_swiglu_mlp_ref_preact(const double *x, const double *wgu, int64_t t, int64_t h, int64_t i, double *gate_up) {
    for (int64_t r = 0; r < t; r++) pre(x, wgu, r, h, i, gate_up + r * 2 * i, gate_up + r * 2 * i + i);
}

static double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

void lk_swiglu_mlp_ref_forward(const double *x, const double *wgu, const double *wd, int64_t t, int64_t h,
                               int64_t i, double limit, double *out) {
    double *g = malloc(sizeof(double) * (size_t)(3 * i)), *u = g + i, *a = u + i;
    for (int64_t r = 0; r < t; r++) {
        pre(x, wgu, r, h, i, g, u);
        for (int64_t j = 0; j < i; j++) {
            double gc = limit > 0 ? fmin(g[j], limit) : g[j];
            double uc = limit > 0 ? fmin(fmax(u[j], -limit), limit) : u[j];
            a[j] = gc * sigmoid(gc) * uc;
        }
        for (int64_t k = 0; k < h; k++) {
            double s = 0.0;
            for (int64_t j = 0; j < i; j++) s += a[j] * wd[k * i + j];
            out[r * h + k] = s;
        }
    }
    free(g);
}

void lk_swiglu_mlp_ref_backward(const double *x, const double *wgu, const double *wd, const double *dout,
                                int64_t t, int64_t h, int64_t i, double limit, double *dx, double *dwgu,
                                double *dwd) {
    double *g = malloc(sizeof(double) * (size_t)(6 * i)), *u = g + i, *a = u + i, *dgu = a + i;
    for (int64_t r = 0; r < t; r++) {
        pre(x, wgu, r, h, i, g, u);
        for (int64_t j = 0; j < i; j++) {
            double dh = 0.0;
            for (int64_t k = 0; k < h; k++) dh += dout[r * h + k] * wd[k * i + j];
            int g_in = !(limit > 0) || g[j] <= limit, u_in = !(limit > 0) || fabs(u[j]) <= limit;
            double gc = g_in ? g[j] : limit, uc = u_in ? u[j] : copysign(limit, u[j]);
            double sg = sigmoid(gc), silu = gc * sg;
            a[j] = silu * uc;
            dgu[j] = g_in ? dh * uc * (sg + gc * sg * (1.0 - sg)) : 0.0;
            dgu[i + j] = u_in ? dh * silu : 0.0;
        }
        for (int64_t k = 0; dwd && k < h; k++)
            for (int64_t j = 0; j < i; j++) dwd[k * i + j] += dout[r * h + k] * a[j];
        for (int64_t k = 0; k < h; k++) {
            double s = 0.0;
            for (int64_t j = 0; j < 2 * i; j++) s += dgu[j] * wgu[j * h + k];
            dx[r * h + k] = s;
        }
        for (int64_t j = 0; dwgu && j < 2 * i; j++)
            for (int64_t k = 0; k < h; k++) dwgu[j * h + k] += dgu[j] * x[r * h + k];
    }
    free(g);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lk_swiglu_mlp_ref_limit(double want, const double *x, const double *wgu, int64_t t, int64_t h, int64_t i) {
    int64_t n = t * 2 * i;
    double *v = malloc(sizeof(double) * (size_t)(n + 2));
    if (!v) return want;
    lk_swiglu_mlp_ref_preact(x, wgu, t, h, i, v);
    int64_t m = 0;
    for (int64_t k = 0; k < n; k++)
        if (fabs(v[k]) > 0.8 * want && fabs(v[k]) < 1.2 * want) v[m++] = fabs(v[k]);
    v[m++] = 0.8 * want;
    v[m++] = 1.2 * want;
    qsort(v, (size_t)m, sizeof *v, cmp_double);
    double best = want, gap = -1.0;
    for (int64_t k = 0; k + 1 < m; k++)
        if (v[k + 1] - v[k] > gap) {
            gap = v[k + 1] - v[k];
            best = 0.5 * (v[k] + v[k + 1]);
        }
    free(v);
    return (float)best;
}
