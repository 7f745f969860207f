/* reference.c — float64 attention (reference.h): one query row at a time, every key
 * tested by the contract's visibility rule, softmax with the sink, and the gradient
 * dS = P ∘ (dP − Σ P·dP) chained through score_mod and softcap. O(S²·D), for tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/attention/reference.h"

static int64_t doc_index(const int32_t *cu, int64_t n_docs, int64_t i) {
    for (int64_t d = 0; d < n_docs; d++)
        if (i >= cu[d] && i < cu[d + 1]) return d;
    return -1;
}

static int visible(const lk_attn_ref *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    int64_t li = i, lj = j, lq = p->Sq, lk = p->Skv;
    if (p->cu_q) {
        int64_t dq = doc_index(p->cu_q, p->n_docs, i), dk = doc_index(p->cu_k, p->n_docs, j);
        if (dq != dk || dq < 0) return 0;
        li = i - p->cu_q[dq]; lj = j - p->cu_k[dk];
        lq = p->cu_q[dq + 1] - p->cu_q[dq]; lk = p->cu_k[dk + 1] - p->cu_k[dk];
    }
    int64_t pos = li + lk - lq;     /* bottom-right alignment */
    if (p->causal && lj > pos) return 0;
    if (p->window_left && !(pos - lj < p->window_left)) return 0;
    if (p->window_right && !(lj - pos < p->window_right)) return 0;
    if (p->bm && !p->bm->mask_mod(b, h, i, j, p->bm->mask_ctx)) return 0;
    if (p->mask && p->mask->dtype == LK_BOOL) {
        const lk_tensor *m = p->mask;
        int64_t at = (((m->shape[0] == 1 ? 0 : b) * m->shape[1] + (m->shape[1] == 1 ? 0 : h)) * p->Sq + i) * p->Skv + j;
        if (!((const uint8_t *)m->data)[at]) return 0;
    }
    return 1;
}

/* Score of (i, j) and d(score)/d(q·k); -inf when hidden. */
static double score(const lk_attn_ref *p, const double *qi, const double *kj, int64_t b, int64_t h, int64_t i,
                    int64_t j, double *g) {
    if (!visible(p, b, h, i, j)) { *g = 0.0; return -INFINITY; }
    double s = 0.0;
    for (int64_t c = 0; c < p->D; c++) s += qi[c] * kj[c];
    s *= p->scale;
    *g = p->scale;
    if (p->softcap > 0.0) {
        double t = tanh(s / p->softcap);
        s = p->softcap * t;
        *g *= 1.0 - t * t;
    }
    if (p->mod.fn) {
        float gm = 1.0f;
        s = p->mod.fn((float)s, b, h, i, j, p->mod.ctx, &gm);
        *g *= gm;
    }
    if (p->mask && p->mask->dtype == LK_F32) {
        const lk_tensor *m = p->mask;
        int64_t at = (((m->shape[0] == 1 ? 0 : b) * m->shape[1] + (m->shape[1] == 1 ? 0 : h)) * p->Sq + i) * p->Skv + j;
        s += ((const float *)m->data)[at];
    }
    return s;
}

/* Probabilities of row (b, h, i) into pr[Skv], chain factors into g; returns the LSE
 * and the sink's probability in *psink. */
static double row_probs(const lk_attn_ref *p, const double *q, const double *k, int64_t b, int64_t h, int64_t i,
                        double *pr, double *g, double *psink) {
    const double *qi = q + ((b * p->Hq + h) * p->Sq + i) * p->D;
    const double *kb = k + (b * p->Hkv + h / (p->Hq / p->Hkv)) * p->Skv * p->D;
    double mx = p->sink ? p->sink[h] : -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < p->Skv; j++) {
        pr[j] = score(p, qi, kb + j * p->D, b, h, i, j, &g[j]);
        if (pr[j] > mx) mx = pr[j];
    }
    *psink = 0.0;
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < p->Skv; j++) pr[j] = 0.0;
        return -INFINITY;
    }
    for (int64_t j = 0; j < p->Skv; j++) sum += exp(pr[j] - mx);
    if (p->sink) sum += exp(p->sink[h] - mx);
    for (int64_t j = 0; j < p->Skv; j++) pr[j] = exp(pr[j] - mx) / sum;
    if (p->sink) *psink = exp(p->sink[h] - mx) / sum;
    return mx + log(sum);
}

void lk_attention_ref_forward(const lk_attn_ref *p, const double *q, const double *k, const double *v, double *out,
                              double *lse) {
    double *pr = malloc(sizeof(double) * 2 * (size_t)p->Skv), *g = pr + p->Skv, ps;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            const double *vb = v + (b * p->Hkv + h / (p->Hq / p->Hkv)) * p->Skv * p->D;
            for (int64_t i = 0; i < p->Sq; i++) {
                lse[(b * p->Hq + h) * p->Sq + i] = row_probs(p, q, k, b, h, i, pr, g, &ps);
                double *o = out + ((b * p->Sq + i) * p->Hq + h) * p->D;
                for (int64_t c = 0; c < p->D; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < p->Skv; j++) acc += pr[j] * vb[j * p->D + c];
                    o[c] = acc;
                }
            }
        }
    free(pr);
}

void lk_attention_ref_backward(const lk_attn_ref *p, const double *q, const double *k, const double *v,
                               const double *dout, double *dq, double *dk, double *dv, double *dsink) {
    int64_t D = p->D, G = p->Hq / p->Hkv;
    double *pr = malloc(sizeof(double) * 3 * (size_t)p->Skv), *g = pr + p->Skv, *dp = g + p->Skv, ps;
    memset(dq, 0, sizeof(double) * (size_t)(p->B * p->Hq * p->Sq * D));
    memset(dk, 0, sizeof(double) * (size_t)(p->B * p->Hkv * p->Skv * D));
    memset(dv, 0, sizeof(double) * (size_t)(p->B * p->Hkv * p->Skv * D));
    if (dsink) memset(dsink, 0, sizeof(double) * (size_t)p->Hq);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->Hq; h++) {
            int64_t kvo = (b * p->Hkv + h / G) * p->Skv * D;
            for (int64_t i = 0; i < p->Sq; i++) {
                row_probs(p, q, k, b, h, i, pr, g, &ps);
                const double *doi = dout + ((b * p->Sq + i) * p->Hq + h) * D;
                const double *qi = q + ((b * p->Hq + h) * p->Sq + i) * D;
                double *dqi = dq + ((b * p->Hq + h) * p->Sq + i) * D, di = 0.0;
                for (int64_t j = 0; j < p->Skv; j++) {
                    dp[j] = 0.0;
                    for (int64_t c = 0; c < D; c++) dp[j] += doi[c] * v[kvo + j * D + c];
                    di += pr[j] * dp[j];
                }
                if (dsink) dsink[h] -= ps * di;
                for (int64_t j = 0; j < p->Skv; j++) {
                    if (pr[j] == 0.0) continue;
                    double ds = pr[j] * (dp[j] - di) * g[j];
                    for (int64_t c = 0; c < D; c++) {
                        dqi[c] += ds * k[kvo + j * D + c];
                        dk[kvo + j * D + c] += ds * qi[c];
                        dv[kvo + j * D + c] += pr[j] * doi[c];
                    }
                }
            }
        }
    free(pr);
}
