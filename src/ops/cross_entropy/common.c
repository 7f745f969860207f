/* common.c — the pieces eager.c, fused.c and chunk_loss.c share (see common.h): the
 * plan of scored tokens, row gathering, the GEMMs of the LM head, the per-row softmax,
 * loss and gradient on f32 logits, and the reductions into the outputs.
 *
 * Row math, for logits z (after bf16 rounding and softcap), label y, ε, z-loss s:
 *   lse = m + log Σ exp(z − m),  p = exp(z − lse)
 *   loss = (1−ε)(lse − z_y) + ε(lse − mean z) + s·lse²
 *   ∂loss/∂z_v = p_v(1 + 2s·lse) − (1−ε)[v = y] − ε/V,  times 1 − tanh² under the cap. */
#include "common.h"

#include <math.h>
#include <string.h>

void ce_plan_make(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, ce_plan *p) {
    memset(p, 0, sizeof *p);
    p->a = a;
    p->T = d->tokens; p->H = d->hidden; p->V = d->vocab; p->K = d->kept; p->C = d->chunk;
    p->S = a->hidden.ndim >= 3 ? a->hidden.shape[a->hidden.ndim - 2] : d->tokens;
    p->keep_n = a->keep_indices.data ? 0 : a->logits_to_keep;
    p->idx = a->keep_indices.data;
    p->dt = d->dtype;
    p->round_bf16 = d->dtype == LK_BF16 && !a->fp32_lm_head;
    p->cap = (float)a->softcap;
    p->eps = (float)a->label_smoothing;
    p->zs = (float)a->z_loss_scale;
}

int64_t ce_count_valid(const ce_plan *p) {
    int64_t n = 0;
    for (int64_t k = 0; k < p->K; k++) n += ce_label(p, ce_token(p, k)) >= 0;
    return n;
}

int ce_rows_direct(const ce_plan *p, int64_t k0, int64_t n) {
    return p->dt == LK_F32 && (n == 0 || ce_token(p, k0 + n - 1) - ce_token(p, k0) == n - 1);
}

const float *ce_rows(const ce_plan *p, int64_t k0, int64_t n, float *buf) {
    if (ce_rows_direct(p, k0, n))
        return (const float *)p->a->hidden.data + (n > 0 ? ce_token(p, k0) : 0) * p->H;
    #pragma omp parallel for schedule(static) if (n * p->H >= (1 << 16))
    for (int64_t i = 0; i < n; i++)
        lk_convert((const char *)p->a->hidden.data + (size_t)(ce_token(p, k0 + i) * p->H) * lk_dtype_size(p->dt),
                   p->dt, buf + i * p->H, LK_F32, p->H);
    return buf;
}

const float *ce_weight_f32(const ce_plan *p, float *buf) {
    if (p->dt == LK_F32) return p->a->weight.data;
    const uint16_t *w = p->a->weight.data;
    int64_t n = p->V * p->H;
    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) buf[i] = lk_bf16_to_f32(w[i]);
    return buf;
}

static lk_gemm_operand op(const float *data, int64_t ld, int trans) {
    return (lk_gemm_operand){.data = data, .dtype = LK_F32, .ld = ld, .trans = trans};
}

size_t ce_xpack_bytes(int64_t C, int64_t H) {
    return lk_gemm_wide_wins(C, H) ? lk_arena_piece(lk_gemm_wide_scratch_bytes(C, H)) : 0;
}

void ce_take_xpack(ce_plan *p, lk_arena *arena, lk_status *st) {
    size_t bytes = ce_xpack_bytes(p->C, p->H);
    if (bytes) p->xpack = ce_take(arena, bytes, st);
}

lk_status ce_gemm_logits(const ce_plan *p, const float *rows, const float *w, int64_t n, float *logits) {
    if (p->xpack) {
        lk_gemm_wide_xwt(n, p->V, p->H, rows, p->H, w, p->H, logits, p->V, p->xpack);
        return LK_OK;
    }
    return lk_gemm(n, p->V, p->H, 1.0f, op(rows, p->H, 0), op(w, p->H, 1), 0.0f, logits, p->V, NULL);
}

lk_status ce_gemm_dh(const ce_plan *p, const float *dz, const float *w, int64_t n, float *dh) {
    if (p->xpack) {
        lk_gemm_wide_gw(n, p->H, p->V, dz, p->V, w, p->H, dh, p->H);
        return LK_OK;
    }
    return lk_gemm(n, p->H, p->V, 1.0f, op(dz, p->V, 0), op(w, p->H, 0), 0.0f, dh, p->H, NULL);
}

lk_status ce_gemm_dw(const ce_plan *p, const float *dz, const float *rows, int64_t n, float beta, float *dw) {
    if (n == 0) {                     /* an empty sum: lk_gemm would scale garbage by beta = 0 */
        if (beta == 0.0f) memset(dw, 0, (size_t)(p->V * p->H) * sizeof(float));
        return LK_OK;
    }
    return lk_gemm(p->V, p->H, n, 1.0f, op(dz, p->V, 1), op(rows, p->H, 0), beta, dw, p->H, NULL);
}

static inline float round_bf16(float v) { return lk_bf16_to_f32(lk_f32_to_bf16(v)); }

void ce_row_prepare(const ce_plan *p, float *z) {
    int64_t V = p->V;
    if (p->round_bf16) {
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) z[v] = round_bf16(z[v]);
    }
    if (p->cap > 0.0f) {
        float cap = p->cap, inv = 1.0f / p->cap;
        for (int64_t v = 0; v < V; v++) z[v] = cap * tanhf(z[v] * inv);
    }
}

void ce_row_stats(const ce_plan *p, const float *z, int64_t y, float *lse, float *loss, float *zl) {
    int64_t V = p->V;
    float m = -INFINITY, s = 0.0f, sz = 0.0f;
    #pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
    #pragma omp simd reduction(+ : s, sz)
    for (int64_t v = 0; v < V; v++) {
        s += ce_exp(z[v] - m);
        sz += z[v];
    }
    float l = m + logf(s);
    *lse = l;
    if (y < 0) {
        *loss = 0.0f; *zl = 0.0f;
        return;
    }
    float z_loss = p->zs * l * l;
    *zl = z_loss;
    *loss = (1.0f - p->eps) * (l - z[y]) + p->eps * (l - sz / (float)V) + z_loss;
}

void ce_row_grad(const ce_plan *p, float *z, int64_t y, float lse, float g) {
    int64_t V = p->V;
    if (y < 0 || g == 0.0f) {
        memset(z, 0, (size_t)V * sizeof(float));
        return;
    }
    float a = g * (1.0f + 2.0f * p->zs * lse), b = g * p->eps / (float)V;
    float zy = z[y];
    if (p->cap > 0.0f) {
        float inv = 1.0f / p->cap;
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) {
            float th = z[v] * inv;
            z[v] = (a * ce_exp(z[v] - lse) - b) * (1.0f - th * th);
        }
        float th = zy * inv;
        z[y] -= g * (1.0f - p->eps) * (1.0f - th * th);
    } else {
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) z[v] = a * ce_exp(z[v] - lse) - b;
        z[y] -= g * (1.0f - p->eps);
    }
    if (p->round_bf16) {
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) z[v] = round_bf16(z[v]);
    }
}

void ce_chunk_forward(const ce_plan *p, float *logits, int64_t k0, int64_t n, float *loss, float *zl,
                      float *lse, const float *g) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; i++) {
        int64_t k = k0 + i, y = ce_label(p, ce_token(p, k));
        float *z = logits + i * p->V, l;
        ce_row_prepare(p, z);
        ce_row_stats(p, z, y, &l, &loss[k], &zl[k]);
        if (lse) lse[k] = l;
        if (g) ce_row_grad(p, z, y, l, g[k]);
    }
}

void ce_chunk_backward(const ce_plan *p, float *logits, int64_t k0, int64_t n, const float *lse,
                       const float *g) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; i++) {
        int64_t k = k0 + i;
        float *z = logits + i * p->V;
        ce_row_prepare(p, z);
        ce_row_grad(p, z, ce_label(p, ce_token(p, k)), lse[k], g[k]);
    }
}

void ce_token_weights(const ce_plan *p, int64_t n_valid, int unit, float *g) {
    const float *dl = p->a->d_loss.data;
    for (int64_t k = 0; k < p->K; k++) {
        float w;
        if (p->a->reduction == LK_CE_NONE) w = unit ? 1.0f : dl[ce_token(p, k)];
        else w = unit ? 1.0f : dl[0];
        if (p->a->reduction == LK_CE_MEAN) w = n_valid > 0 ? w / (float)n_valid : 0.0f;
        g[k] = w;
    }
}

void ce_write_outputs(const ce_plan *p, const float *loss, const float *zl, int64_t n_valid) {
    const lk_cross_entropy_args *a = p->a;
    float *lo = a->loss.data, *zo = a->z_loss.data;
    if (a->reduction == LK_CE_NONE) {
        memset(lo, 0, (size_t)p->T * sizeof(float));
        if (zo) memset(zo, 0, (size_t)p->T * sizeof(float));
        for (int64_t k = 0; k < p->K; k++) {
            int64_t t = ce_token(p, k);
            lo[t] = loss[k];
            if (zo) zo[t] = zl[k];
        }
    } else {
        double sl = 0.0, sz = 0.0;                /* in kept order: the same whatever the threads */
        for (int64_t k = 0; k < p->K; k++) { sl += loss[k]; sz += zl[k]; }
        double div = a->reduction == LK_CE_MEAN && n_valid > 0 ? (double)n_valid : 1.0;
        lo[0] = (float)(sl / div);
        if (zo) zo[0] = (float)(sz / div);
    }
    if (a->n_valid.data) ((int64_t *)a->n_valid.data)[0] = n_valid;
}

static void dh_row_zero(const ce_plan *p, int64_t t) {
    size_t esz = lk_dtype_size(p->dt);
    memset((char *)p->a->d_hidden.data + (size_t)(t * p->H) * esz, 0, (size_t)p->H * esz);
}

void ce_dh_zero_unkept(const ce_plan *p) {
    if (p->K == p->T) return;
    if (!p->idx && p->keep_n == 0) return;
    int64_t k = 0;
    for (int64_t t = 0; t < p->T; t++) {          /* kept tokens come in increasing order */
        if (k < p->K && ce_token(p, k) == t) { k++; continue; }
        dh_row_zero(p, t);
    }
}

void ce_dh_store(const ce_plan *p, const float *rows, int64_t k0, int64_t n, float scale) {
    int64_t H = p->H;
    #pragma omp parallel for schedule(static) if (n * H >= (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        int64_t t = ce_token(p, k0 + i);
        const float *src = rows + i * H;
        if (p->dt == LK_F32) {
            float *dst = (float *)p->a->d_hidden.data + t * H;
            #pragma omp simd
            for (int64_t j = 0; j < H; j++) dst[j] = scale * src[j];
        } else {
            uint16_t *dst = (uint16_t *)p->a->d_hidden.data + t * H;
            for (int64_t j = 0; j < H; j++) dst[j] = lk_f32_to_bf16(scale * src[j]);
        }
    }
}

void ce_dw_add(const ce_plan *p, const float *src, float scale) {
    int64_t n = p->V * p->H;
    if (p->a->d_weight.dtype == LK_F32) {
        float *dst = p->a->d_weight.data;
        #pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) dst[i] += scale * src[i];
    } else {
        uint16_t *dst = p->a->d_weight.data;
        #pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) dst[i] = lk_f32_to_bf16(lk_bf16_to_f32(dst[i]) + scale * src[i]);
    }
}

void *ce_take(lk_arena *arena, size_t bytes, lk_status *st) {
    static float empty[16];             /* what an empty piece points at: never read or written */
    if (bytes == 0) return empty;
    void *p = lk_arena_alloc(arena, bytes);
    if (p == NULL && *st == LK_OK) *st = lk_error(LK_EINTERNAL, "cross_entropy: workspace was not reserved");
    return p;
}
