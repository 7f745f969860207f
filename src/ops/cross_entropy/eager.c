/* eager.c — `eager` cross-entropy: what autograd runs for the unfused composition
 *   logits = h·Wᵀ; [bf16 round, .float()]; [cap·tanh(·/cap)]; logp = log_softmax;
 *   loss = nll(logp) with smoothing, + s·lse²
 * Every step is its own pass into its own [K, V] intermediate from ctx->arena, and the
 * forward saves what autograd keeps: log_softmax's output logp [K, V] f32 and lse [K].
 * The backward materializes nll's dense gradient G [K, V], then log_softmax's
 * dlogits = G − p·ΣG (+ the z-loss branch 2s·lse·p, × 1 − tanh² under the cap), and
 * runs the two GEMMs over the whole [K, V]. It is the baseline fused and chunk_loss are
 * measured against (and the registry's reference), not a fast path. */
#include "common.h"

#include <math.h>

typedef struct {
    lk_arena *arena;
    lk_status status;
} taker;

static void *take(taker *tk, size_t bytes) { return ce_take(tk->arena, bytes, &tk->status); }

static size_t saved_bytes(const lk_cross_entropy_dims *d) {
    return CE_HEAD_BYTES + lk_arena_piece((size_t)d->kept * sizeof(float)) +
           (size_t)(d->kept * d->vocab) * sizeof(float);
}

/* An upper bound of the take() calls below (the bf16 and softcap steps may not run). */
static size_t workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    size_t f = sizeof(float), K = (size_t)d->kept, V = (size_t)d->vocab, H = (size_t)d->hidden;
    size_t w = d->dtype == LK_F32 ? 0 : lk_arena_piece(V * H * f), rows = lk_arena_piece(K * H * f),
           kv = lk_arena_piece(K * V * f);
    if (!backward) return w + rows + kv + lk_arena_piece(K * V * 2) + kv + 2 * lk_arena_piece(K * f);
    return w + rows + lk_arena_piece(K * f) + 2 * kv + lk_arena_piece(K * H * f) + lk_arena_piece(V * H * f);
}

/* What both passes take first: the plan, and from the arena the f32 copy of a bf16 weight
 * [V, H] and of the kept rows [K, H] (unless they are read where they lie). */
static void begin(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, ce_plan *p, taker *tk,
                  float **wbuf, float **rbuf) {
    ce_plan_make(a, d, p);
    *wbuf = p->dt == LK_F32 ? NULL : take(tk, (size_t)(p->V * p->H) * sizeof(float));
    *rbuf = ce_rows_direct(p, 0, p->K) ? NULL : take(tk, (size_t)(p->K * p->H) * sizeof(float));
}

static lk_status forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    ce_plan p;
    taker tk = {ctx->arena, LK_OK};
    float *wbuf, *rbuf;
    begin(a, d, &p, &tk, &wbuf, &rbuf);
    int64_t K = p.K, V = p.V;
    size_t f = sizeof(float);
    float *logits = take(&tk, (size_t)(K * V) * f);
    if (tk.status) return tk.status;
    ce_saved_head *head = a->saved.data;
    float *lse = (float *)((char *)a->saved.data + CE_HEAD_BYTES);
    float *logp = (float *)((char *)lse + lk_arena_piece((size_t)K * f));

    lk_status s = ce_gemm_logits(&p, ce_rows(&p, 0, K, rbuf), ce_weight_f32(&p, wbuf), K, logits);
    if (s) return s;
    float *z = logits;
    if (p.round_bf16) {                                    /* the bf16 logits, then .float() */
        uint16_t *zb = take(&tk, (size_t)(K * V) * 2);
        if (tk.status) return tk.status;
        lk_convert(z, LK_F32, zb, LK_BF16, K * V);
        lk_convert(zb, LK_BF16, z, LK_F32, K * V);
    }
    if (p.cap > 0.0f) {                                    /* softcap into its own tensor */
        float *zc = take(&tk, (size_t)(K * V) * f);
        if (tk.status) return tk.status;
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < K * V; i++) zc[i] = p.cap * tanhf(z[i] / p.cap);
        z = zc;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {                      /* log_softmax */
        const float *zr = z + k * V;
        float m = -INFINITY;
        double sum = 0.0;   /* the row sums in f64: V terms, vectorized or not (an -O0 build) */
        #pragma omp simd reduction(max : m)
        for (int64_t v = 0; v < V; v++) m = zr[v] > m ? zr[v] : m;
        #pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; v++) sum += ce_exp(zr[v] - m);
        lse[k] = m + (float)log(sum);
        float *lp = logp + k * V;
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) lp[v] = zr[v] - lse[k];
    }
    float *loss = take(&tk, (size_t)K * f), *zl = take(&tk, (size_t)K * f);
    if (tk.status) return tk.status;
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {                      /* nll with smoothing, z-loss */
        int64_t y = ce_label(&p, ce_token(&p, k));
        const float *lp = logp + k * V;
        double sum = 0.0;
        #pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; v++) sum += lp[v];
        zl[k] = y < 0 ? 0.0f : p.zs * lse[k] * lse[k];
        loss[k] = y < 0 ? 0.0f : -(1.0f - p.eps) * lp[y] - p.eps * (float)(sum / (double)V) + zl[k];
    }
    head->n_valid = ce_count_valid(&p);
    ce_write_outputs(&p, loss, zl, head->n_valid);
    return LK_OK;
}

static lk_status backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    ce_plan p;
    taker tk = {ctx->arena, LK_OK};
    float *wbuf, *rbuf;
    begin(a, d, &p, &tk, &wbuf, &rbuf);
    int64_t K = p.K, V = p.V, H = p.H;
    size_t f = sizeof(float);
    float *g = take(&tk, (size_t)K * f), *G = take(&tk, (size_t)(K * V) * f), *D = take(&tk, (size_t)(K * V) * f);
    float *dh = take(&tk, (size_t)(K * H) * f);
    float *dw = a->d_weight.dtype == LK_F32 ? a->d_weight.data : take(&tk, (size_t)(V * H) * f);
    if (tk.status) return tk.status;
    const ce_saved_head *head = a->saved.data;
    const float *lse = (const float *)((const char *)a->saved.data + CE_HEAD_BYTES);
    const float *logp = (const float *)((const char *)lse + lk_arena_piece((size_t)K * f));
    ce_token_weights(&p, head->n_valid, 0, g);

    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {                      /* nll (+ smoothing) backward */
        int64_t y = ce_label(&p, ce_token(&p, k));
        float w = y < 0 ? 0.0f : g[k], *Gr = G + k * V, u = -w * p.eps / (float)V;
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) Gr[v] = u;
        if (y >= 0) Gr[y] -= w * (1.0f - p.eps);
    }
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {                      /* log_softmax and z-loss backward */
        int64_t y = ce_label(&p, ce_token(&p, k));
        const float *Gr = G + k * V, *lp = logp + k * V;
        float *Dr = D + k * V, zt = y < 0 ? 0.0f : 2.0f * p.zs * lse[k] * g[k];
        double sum = 0.0;
        #pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; v++) sum += Gr[v];
        float c = zt - (float)sum;
        #pragma omp simd
        for (int64_t v = 0; v < V; v++) Dr[v] = Gr[v] + c * ce_exp(lp[v]);
        if (p.cap > 0.0f) {                                /* tanh backward: 1 − (z/cap)² */
            #pragma omp simd
            for (int64_t v = 0; v < V; v++) {
                float th = (lp[v] + lse[k]) / p.cap;
                Dr[v] *= 1.0f - th * th;
            }
        }
    }
    if (p.round_bf16) {                                    /* the gradient of bf16 logits */
        #pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < K * V; i++) D[i] = lk_bf16_to_f32(lk_f32_to_bf16(D[i]));
    }
    const float *w = ce_weight_f32(&p, wbuf), *rows = ce_rows(&p, 0, K, rbuf);
    lk_status s;
    if ((s = ce_gemm_dh(&p, D, w, K, dh))) return s;
    ce_dh_zero_unkept(&p);
    ce_dh_store(&p, dh, 0, K, 1.0f);
    int acc = a->d_weight.dtype == LK_F32;
    if ((s = ce_gemm_dw(&p, D, rows, K, acc ? 1.0f : 0.0f, dw))) return s;
    if (!acc) ce_dw_add(&p, dw, 1.0f);
    return LK_OK;
}

const lk_cross_entropy_vtable lk_cross_entropy_eager_vtable = {
    .version = LK_CROSS_ENTROPY_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
