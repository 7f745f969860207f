/* reference.c — the float64 cross-entropy oracle (see reference.h), written from the
 * textbook formulas, one token at a time:
 *   z = cap·tanh((h·Wᵀ)/cap),  lse = log Σ exp z,  logp = z − lse
 *   loss = −(1−ε)·logp_y − ε·mean(logp) + s·lse²
 *   ∂loss/∂z = softmax(z)·(1 + 2s·lse) − (1−ε)·onehot(y) − ε/V, then × (1 − tanh²). */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/cross_entropy.h"

static double bf16(double v) { return lk_bf16_to_f32(lk_f32_to_bf16((float)v)); }

void lk_ce_ref(const lk_ce_ref_problem *p, const double *d_loss, double *loss_tok, double *z_tok, double *loss,
               double *zloss, int64_t *n_valid, double *dh, double *dw) {
    int64_t T = p->T, H = p->H, V = p->V, nv = 0;
    double *z = malloc(sizeof(double) * (size_t)(V > 0 ? V : 1)), sl = 0.0, sz = 0.0;
    for (int64_t t = 0; t < T; t++) nv += (!p->keep || p->keep[t]) && p->labels[t] >= 0;
    if (dh) memset(dh, 0, sizeof(double) * (size_t)(T * H));
    if (dw) memset(dw, 0, sizeof(double) * (size_t)(V * H));
    for (int64_t t = 0; t < T; t++) {
        int64_t y = p->labels[t];
        if (loss_tok) loss_tok[t] = 0.0;
        if (z_tok) z_tok[t] = 0.0;
        if ((p->keep && !p->keep[t]) || y < 0) continue;
        double m = -INFINITY, s = 0.0, mean = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double acc = 0.0;
            for (int64_t j = 0; j < H; j++) acc += p->h[t * H + j] * p->w[v * H + j];
            if (p->round_bf16) acc = bf16(acc);
            z[v] = p->cap > 0 ? p->cap * tanh(acc / p->cap) : acc;
            m = fmax(m, z[v]);
        }
        for (int64_t v = 0; v < V; v++) { s += exp(z[v] - m); mean += z[v]; }
        double lse = m + log(s);
        mean /= (double)V;
        double zl = p->zs * lse * lse, l = -(1 - p->eps) * (z[y] - lse) - p->eps * (mean - lse) + zl;
        if (loss_tok) loss_tok[t] = l;
        if (z_tok) z_tok[t] = zl;
        sl += l;
        sz += zl;
        double g = p->reduction == LK_CE_NONE ? d_loss[t] : d_loss[0];
        if (p->reduction == LK_CE_MEAN) g /= (double)nv;
        for (int64_t v = 0; v < V && (dh || dw); v++) {
            double dz = exp(z[v] - lse) * (1 + 2 * p->zs * lse) - (v == y ? 1 - p->eps : 0.0) - p->eps / (double)V;
            if (p->cap > 0) dz *= 1 - (z[v] / p->cap) * (z[v] / p->cap);
            dz *= g;
            if (p->round_bf16) dz = bf16(dz);
            for (int64_t j = 0; j < H; j++) {
                if (dh) dh[t * H + j] += dz * p->w[v * H + j];
                if (dw) dw[v * H + j] += dz * p->h[t * H + j];
            }
        }
    }
    double div = p->reduction == LK_CE_MEAN && nv > 0 ? (double)nv : 1.0;
    if (loss) *loss = sl / div;
    if (zloss) *zloss = sz / div;
    if (n_valid) *n_valid = nv;
    free(z);
}
