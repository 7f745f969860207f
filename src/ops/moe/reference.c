/* reference.c — the float64 MoE oracles (see reference.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/moe/reference.h"

static double silu_ref(double g) { return g / (1.0 + exp(-g)); }

/* The pre-activations and h of route (tok, e). */
static void expert_mlp(const double *xr, const double *wgu, int64_t e, int64_t h, int64_t i, double *g, double *u) {
    const double *W = wgu + e * 2 * i * h;
    for (int64_t j = 0; j < 2 * i; j++) {
        double s = 0;
        for (int64_t c = 0; c < h; c++) s += xr[c] * W[j * h + c];
        if (j < i) g[j] = s;
        else u[j - i] = s;
    }
}

void lk_moe_experts_ref_forward(const double *x, const int32_t *ids, const double *w, const double *wgu,
                                const double *wd, int64_t t, int64_t k, int64_t e, int64_t h, int64_t i,
                                double *out) {
    double *g = malloc(sizeof(double) * (size_t)(2 * i)), *u = g + i;
    memset(out, 0, sizeof(double) * (size_t)(t * h));
    for (int64_t r = 0; r < t * k; r++) {
        int64_t tok = r / k, ex = ids[r];
        expert_mlp(x + tok * h, wgu, ex, h, i, g, u);
        for (int64_t j = 0; j < i; j++) g[j] = silu_ref(g[j]) * u[j];
        const double *D = wd + ex * h * i;
        for (int64_t c = 0; c < h; c++) {
            double s = 0;
            for (int64_t j = 0; j < i; j++) s += D[c * i + j] * g[j];
            out[tok * h + c] += w[r] * s;
        }
    }
    free(g);
}

void lk_moe_experts_ref_backward(const double *x, const int32_t *ids, const double *w, const double *wgu,
                                 const double *wd, const double *dout, int64_t t, int64_t k, int64_t e, int64_t h,
                                 int64_t i, double *dx, double *dw, double *dwgu, double *dwd) {
    double *g = malloc(sizeof(double) * (size_t)(5 * i)), *u = g + i, *hh = u + i, *dh = hh + i, *dg = dh + i;
    memset(dx, 0, sizeof(double) * (size_t)(t * h));
    for (int64_t r = 0; r < t * k; r++) {
        int64_t tok = r / k, ex = ids[r];
        const double *xr = x + tok * h, *dy = dout + tok * h, *D = wd + ex * h * i, *W = wgu + ex * 2 * i * h;
        expert_mlp(xr, wgu, ex, h, i, g, u);
        for (int64_t j = 0; j < i; j++) hh[j] = silu_ref(g[j]) * u[j];
        double dot = 0;
        for (int64_t j = 0; j < i; j++) {
            double s = 0;
            for (int64_t c = 0; c < h; c++) s += dy[c] * D[c * i + j];
            dh[j] = w[r] * s;
            dot += s * hh[j];
        }
        dw[r] = dot;
        for (int64_t c = 0; c < h; c++)
            for (int64_t j = 0; j < i; j++) dwd[ex * h * i + c * i + j] += w[r] * dy[c] * hh[j];
        for (int64_t j = 0; j < i; j++) {
            double sg = 1.0 / (1.0 + exp(-g[j]));
            dg[j] = dh[j] * u[j] * sg * (1.0 + g[j] * (1.0 - sg));
            dh[j] = dh[j] * g[j] * sg;                         /* now d_up */
        }
        for (int64_t j = 0; j < 2 * i; j++) {
            double d = j < i ? dg[j] : dh[j - i];
            for (int64_t c = 0; c < h; c++) {
                dx[tok * h + c] += d * W[j * h + c];
                dwgu[ex * 2 * i * h + j * h + c] += d * xr[c];
            }
        }
    }
    free(g);
}

void lk_moe_router_ref_scores(const double *x, const double *wg, const double *bias, int64_t t, int64_t h,
                              int64_t e, lk_moe_score_kind kind, double *z, double *v, double *sel) {
    for (int64_t tok = 0; tok < t; tok++) {
        double *zr = z + tok * e, *vr = v + tok * e, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < e; j++) {
            double s = 0;
            for (int64_t c = 0; c < h; c++) s += x[tok * h + c] * wg[j * h + c];
            zr[j] = s;
            if (s > mx) mx = s;
        }
        for (int64_t j = 0; j < e; j++) {
            vr[j] = kind == LK_MOE_SOFTMAX ? exp(zr[j] - mx) : 1.0 / (1.0 + exp(-zr[j]));
            sum += vr[j];
        }
        for (int64_t j = 0; j < e; j++) {
            if (kind == LK_MOE_SOFTMAX) vr[j] /= sum;
            sel[tok * e + j] = vr[j] + (kind == LK_MOE_SIGMOID && bias ? bias[j] : 0.0);
        }
    }
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Best sum of k scores of row s (length e) under the group limit. */
static double best_sum(const lk_moe_router_args *o, const double *s, int64_t e, int k, double *tmp) {
    int ng = o->n_group > 1 ? o->n_group : 1, tg = o->n_group > 1 ? o->topk_group : 1, gs = (int)(e / ng);
    double *gscore = tmp + e;
    int *keep = (int *)(gscore + ng);
    for (int g = 0; g < ng; g++) {            /* group score: the sum of its top two (top one if one) */
        memcpy(tmp, s + g * gs, sizeof(double) * (size_t)gs);
        qsort(tmp, (size_t)gs, sizeof(double), cmp_desc);
        gscore[g] = tmp[0] + (gs > 1 && ng > 1 ? tmp[1] : 0.0);
        keep[g] = 0;
    }
    for (int n = 0; n < tg; n++) {
        int best = -1;
        for (int g = 0; g < ng; g++)
            if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = 1;
    }
    int m = 0;
    for (int64_t j = 0; j < e; j++)
        if (ng == 1 || keep[j / gs]) tmp[m++] = s[j];
    qsort(tmp, (size_t)m, sizeof(double), cmp_desc);
    double sum = 0;
    for (int j = 0; j < k && j < m; j++) sum += tmp[j];
    return sum;
}

double lk_moe_router_ref_choice_gap(const lk_moe_router_args *o, const double *sel, const int32_t *ids,
                                    int64_t t, int64_t e) {
    int k = o->top_k;
    double *tmp = malloc(sizeof(double) * (size_t)(2 * e + 2) + sizeof(int) * (size_t)e), gap = 0;
    for (int64_t tok = 0; tok < t && tmp; tok++) {
        double got = 0;
        for (int j = 0; j < k; j++) {
            int32_t id = ids[tok * k + j];
            if (id < 0 || id >= e) { free(tmp); return INFINITY; }
            for (int l = 0; l < j; l++)
                if (ids[tok * k + l] == id) { free(tmp); return INFINITY; }
            got += sel[tok * e + id];
        }
        double g = best_sum(o, sel + tok * e, e, k, tmp) - got;
        if (g > gap) gap = g;
    }
    free(tmp);
    return gap;
}

static double scale_of(const lk_moe_router_args *o) { return o->route_scale > 0 ? o->route_scale : 1.0; }
static int normed(const lk_moe_router_args *o, lk_moe_score_kind kind) {
    return o->norm_topk_prob || (kind == LK_MOE_SOFTMAX && o->softmax_after_topk);
}

void lk_moe_router_ref_forward(const lk_moe_router_args *o, const double *v, const int32_t *ids, int64_t t,
                               int64_t e, lk_moe_score_kind kind, double *w, double *aux) {
    int k = o->top_k;
    double *count = calloc((size_t)e, sizeof(double)), *P = calloc((size_t)e, sizeof(double));
    for (int64_t tok = 0; tok < t; tok++) {
        double S = 0, V = 0;
        for (int j = 0; j < k; j++) S += v[tok * e + ids[tok * k + j]];
        for (int64_t j = 0; j < e; j++) V += v[tok * e + j];
        for (int j = 0; j < k; j++) {
            double x = v[tok * e + ids[tok * k + j]];
            w[tok * k + j] = (normed(o, kind) ? x / S : x) * scale_of(o);
            count[ids[tok * k + j]] += 1;
        }
        for (int64_t j = 0; j < e; j++) P[j] += v[tok * e + j] / V / (double)t;
    }
    double a = 0;
    for (int64_t j = 0; j < e; j++) a += count[j] * P[j];
    *aux = a * (double)e / ((double)t * k);
    free(count);
    free(P);
}

void lk_moe_router_ref_backward(const lk_moe_router_args *o, const double *x, const double *wg, const double *v,
                                const int32_t *ids, const double *dw, double d_aux, int64_t t, int64_t h, int64_t e,
                                lk_moe_score_kind kind, double *dx, double *dwg) {
    int k = o->top_k;
    double *count = calloc((size_t)e, sizeof(double)), *dv = malloc(sizeof(double) * (size_t)e);
    for (int64_t r = 0; r < t * k; r++) count[ids[r]] += 1;
    for (int64_t tok = 0; tok < t; tok++) {
        const double *vr = v + tok * e;
        double S = 0, V = 0, sdw = 0;
        for (int j = 0; j < k; j++) S += vr[ids[tok * k + j]];
        for (int64_t j = 0; j < e; j++) V += vr[j];
        for (int j = 0; j < k; j++) sdw += dw[tok * k + j] * vr[ids[tok * k + j]];
        memset(dv, 0, sizeof(double) * (size_t)e);
        for (int j = 0; j < k; j++) {
            double d = dw[tok * k + j] * scale_of(o);
            dv[ids[tok * k + j]] += normed(o, kind) ? d / S - sdw * scale_of(o) / (S * S) : d;
        }
        /* aux: d/dq[e] = d_aux·E·count_e/(T²k), q = v/V */
        double gq = 0;
        for (int64_t j = 0; j < e; j++) gq += d_aux * (double)e * count[j] / ((double)t * t * k) * vr[j] / V;
        for (int64_t j = 0; j < e; j++)
            dv[j] += (d_aux * (double)e * count[j] / ((double)t * t * k) - gq) / V;
        double dz_dot = 0;
        for (int64_t j = 0; j < e; j++) dz_dot += dv[j] * vr[j];
        for (int64_t j = 0; j < e; j++) {
            double dz = kind == LK_MOE_SOFTMAX ? vr[j] * (dv[j] - dz_dot) : dv[j] * vr[j] * (1.0 - vr[j]);
            for (int64_t c = 0; c < h; c++) {
                if (j == 0) dx[tok * h + c] = 0;
                dx[tok * h + c] += dz * wg[j * h + c];
                dwg[j * h + c] += dz * x[tok * h + c];
            }
        }
    }
    free(count);
    free(dv);
}
