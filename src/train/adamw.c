/* adamw.c — the optimizer pieces of the training loop (train.h): the AdamW update,
 * the warmup + cosine schedule and clipping by the global gradient norm. The update is
 * elementwise and the norm is summed over fixed chunks in a fixed order, so results do
 * not depend on the thread count (resume and eager-vs-fused comparisons rely on it); bf16
 * moments and bf16 weights take stochastic rounding whose bits hang on the element, not
 * the thread. */
#include <math.h>
#include <stdlib.h>
#include "core/sround.h"
#include "llmkern/train.h"

/* One element's moments and weight, in f32, as the GPU's adamw_one. */
static inline float adamw_one(float g, float *m, float *v, float w, float b1, float b2, float eps, float step,
                              float vcorr, float decay) {
    *m = b1 * *m + (1.0f - b1) * g;
    *v = b2 * *v + (1.0f - b2) * g * g;
    return w * decay - step * *m / (sqrtf(*v) * vcorr + eps);
}

void lk_adamw_update(void *p, const void *g, void *m, void *v, int64_t n,
                     const lk_adamw_hparams *h, double lr, int64_t t) {
    const float b1 = (float)h->beta1, b2 = (float)h->beta2, eps = (float)h->eps;
    /* Bias corrections folded into two scalars, computed once in f64. */
    const float step = (float)(lr / (1.0 - pow(h->beta1, (double)t)));
    const float vcorr = (float)(1.0 / sqrt(1.0 - pow(h->beta2, (double)t)));
    const float decay = (float)(1.0 - lr * h->weight_decay);
    const int mb = h->m_dtype == LK_BF16, vb = h->v_dtype == LK_BF16, pb = h->p_dtype == LK_BF16,
              gb = h->g_dtype == LK_BF16;
    const float gscale = h->g_scale != 0.0f ? h->g_scale : 1.0f;
    const uint64_t key = h->sround_key;
    float *mf = m, *vf = v, *pf = p;
    const float *gf = g;
    uint16_t *mh = m, *vh = v, *ph = p;
    const uint16_t *gh = g;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float mi = mb ? lk_bf16_to_f32(mh[i]) : mf[i], vi = vb ? lk_bf16_to_f32(vh[i]) : vf[i];
        const float gi = (gb ? lk_bf16_to_f32(gh[i]) : gf[i]) * gscale;
        const float pi = adamw_one(gi, &mi, &vi, pb ? lk_bf16_to_f32(ph[i]) : pf[i], b1, b2, eps, step, vcorr, decay);
        const uint64_t r = mb || vb || pb ? lk_sround_bits(key, i, pb) : 0;
        if (mb) mh[i] = lk_sround_bf16(mi, (uint32_t)r);
        else mf[i] = mi;
        if (vb) vh[i] = lk_sround_bf16(vi, (uint32_t)(r >> 16));
        else vf[i] = vi;
        if (pb) ph[i] = lk_sround_bf16(pi, (uint32_t)(r >> 32));
        else pf[i] = pi;
    }
}

double lk_lr_schedule(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    int64_t span = total - warmup;
    if (span <= 1) return lr;
    double progress = (double)(step - warmup) / (double)(span - 1);
    if (progress > 1.0) progress = 1.0;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress));
}

/* Chunk of the fixed-order norm: partial sums never depend on how threads split work. */
#define NORM_CHUNK 4096

static double sum_squares(const void *x, lk_dtype dt, int64_t n) {
    int64_t n_chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double stack[64], *part = n_chunks <= 64 ? stack : malloc((size_t)n_chunks * sizeof *part);
    if (part == NULL) return NAN;
    const float *xf = x;
    const uint16_t *xh = x;
#pragma omp parallel for schedule(static) if (n_chunks > 8)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t lo = c * NORM_CHUNK, hi = lo + NORM_CHUNK < n ? lo + NORM_CHUNK : n;
        double s = 0.0;
        for (int64_t i = lo; i < hi; i++) {
            const double v = dt == LK_BF16 ? (double)lk_bf16_to_f32(xh[i]) : (double)xf[i];
            s += v * v;
        }
        part[c] = s;
    }
    double total = 0.0;
    for (int64_t c = 0; c < n_chunks; c++) total += part[c];
    if (part != stack) free(part);
    return total;
}

double lk_grad_norm(const void *const *bufs, const int64_t *len, int n_bufs, lk_dtype dt) {
    double ss = 0.0;
    for (int b = 0; b < n_bufs; b++) ss += sum_squares(bufs[b], dt, len[b]);
    return sqrt(ss);
}

float lk_clip_scale(double norm, double max_norm) {
    return max_norm > 0.0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

double lk_clip_grad_norm(float *const *bufs, const int64_t *len, int n_bufs, double max_norm) {
    double norm = lk_grad_norm((const void *const *)bufs, len, n_bufs, LK_F32);
    if (!isfinite(norm) || max_norm <= 0.0 || norm <= max_norm) return norm;
    const float scale = lk_clip_scale(norm, max_norm);
    for (int b = 0; b < n_bufs; b++) {
        float *x = bufs[b];
        int64_t n = len[b];
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) x[i] *= scale;
    }
    return norm;
}
