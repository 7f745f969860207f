/* eager.c — `eager` attention: the whole score matrix of one (batch, head) at a time,
 * masked, softmaxed and multiplied out with lk_gemm — the plain composition every other
 * implementation is tested against. It takes every option: causal, window, varlen, a
 * dense mask (bool or additive), a BlockMask (its predicate, per element), score_mod,
 * softcap and sinks. Memory: three S_q x S_kv f32 matrices in the backward. */
#include <omp.h>
#include <string.h>
#include "ops/attention/internal.h"
#include "ops/gemm.h"

/* Fewer score elements than this are handled on one thread (a parallel region costs more). */
#define PAR_MIN ((int64_t)1 << 15)

typedef struct {
    const lk_attention_args *a;
    lk_attn_dims d;
    const int64_t *lo, *hi;
} eager_call;

static lk_gemm_operand opnd(const void *data, lk_dtype dt, int64_t ld, int trans) {
    return (lk_gemm_operand){.data = data, .dtype = dt, .ld = ld, .trans = trans};
}

static const void *head_rows(const lk_tensor *t, int64_t bh, int64_t S, int64_t D) {
    return (const char *)t->data + (size_t)(bh * S * D) * lk_dtype_size(t->dtype);
}

/* s (raw q·k) becomes the masked, modified score; g[i, j] = d(score)/d(q·k) when set. */
static void scores(const eager_call *c, int64_t b, int64_t h, float *s, float *g) {
    const lk_attention_args *a = c->a;
    const lk_attn_dims *d = &c->d;
    const lk_tensor *mk = &a->mask;
    const lk_block_mask *bm = a->block_mask;
    int64_t mbh = mk->data ? ((mk->shape[0] == 1 ? 0 : b) * mk->shape[1] + (mk->shape[1] == 1 ? 0 : h)) : 0;
    #pragma omp parallel for schedule(static) if (d->Sq * d->Skv >= PAR_MIN)
    for (int64_t i = 0; i < d->Sq; i++)
        for (int64_t j = 0; j < d->Skv; j++) {
            float x = s[i * d->Skv + j] * d->scale, f = d->scale, gm = 1.0f;
            if (a->softcap > 0.0f) {
                float t = tanhf(x / a->softcap);
                x = a->softcap * t;
                f *= 1.0f - t * t;
            }
            if (a->score_mod.fn) x = a->score_mod.fn(x, b, h, i, j, a->score_mod.ctx, &gm);
            int vis = j >= c->lo[i] && j < c->hi[i] && (!bm || bm->mask_mod(b, h, i, j, bm->mask_ctx));
            if (mk->data) {
                int64_t at = (mbh * d->Sq + i) * d->Skv + j;
                if (mk->dtype == LK_BOOL) vis = vis && ((const uint8_t *)mk->data)[at];
                else x += ((const float *)mk->data)[at];
            }
            s[i * d->Skv + j] = vis ? x : -INFINITY;
            if (g) g[i * d->Skv + j] = f * gm;
        }
}

/* Rows of s become probabilities exp(s − lse); lse computed (with the sink) when
 * fresh, else read. A row that sees nothing is all zero with lse −inf. */
static void softmax(const eager_call *c, int64_t h, float *s, float *lse, int fresh) {
    const float *sink = c->a->s_aux.data;
    int64_t n = c->d.Skv;
    #pragma omp parallel for schedule(static) if (c->d.Sq * n >= PAR_MIN)
    for (int64_t i = 0; i < c->d.Sq; i++) {
        float *r = s + i * n;
        if (fresh) {
            float mx = sink ? sink[h] : -INFINITY;
            for (int64_t j = 0; j < n; j++) mx = r[j] > mx ? r[j] : mx;
            float sum = 0.0f;
            if (mx != -INFINITY) {
                for (int64_t j = 0; j < n; j++) sum += expf(r[j] - mx);
                if (sink) sum += expf(sink[h] - mx);
            }
            lse[i] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
        }
        for (int64_t j = 0; j < n; j++) r[j] = lse[i] == -INFINITY ? 0.0f : expf(r[j] - lse[i]);
    }
}

static void store_rows(void *dst, lk_dtype dt, int64_t stride, const float *src, int64_t rows, int64_t D) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < D; c++) lk_store(dst, dt, r * stride + c, src[r * D + c]);
}

static size_t eager_workspace(const lk_attention_args *a, int backward) {
    lk_attn_dims d = lk_attn_dims_of(a);
    size_t ss = (size_t)(d.Sq * d.Skv) * 4, rows = (size_t)(d.Sq > d.Skv ? d.Sq : d.Skv) * (size_t)d.D * 4;
    size_t bytes = (backward ? 3 : 1) * ss + rows * 3 + (size_t)d.Sq * 16 + 2 * rows + 1024;
    if (backward) bytes += (size_t)(d.B * d.Hq * d.Sq) * 4;
    return bytes;
}

static lk_status eager_run(const lk_attention_args *a, lk_ctx *ctx, int backward) {
    eager_call c = {.a = a, .d = lk_attn_dims_of(a)};
    const lk_attn_dims *d = &c.d;
    const int64_t D = d->D, Sq = d->Sq, Skv = d->Skv, ldo = d->Hq * D;
    lk_arena *ar = ctx->arena;
    int64_t *lo = lk_arena_alloc(ar, (size_t)Sq * 16);
    float *s = lk_arena_alloc(ar, (size_t)(Sq * Skv) * 4), *rows = lk_arena_alloc(ar, (size_t)(Sq > Skv ? Sq : Skv) * D * 4);
    float *g = backward ? lk_arena_alloc(ar, (size_t)(Sq * Skv) * 4) : NULL;
    float *dp = backward ? lk_arena_alloc(ar, (size_t)(Sq * Skv) * 4) : NULL;
    float *dkv = backward ? lk_arena_alloc(ar, (size_t)(2 * Skv * D) * 4) : NULL;
    float *delta = backward ? lk_arena_alloc(ar, (size_t)(d->B * d->Hq * Sq) * 4) : NULL;
    if (!lo || !s || !rows || (backward && (!g || !dp || !dkv || !delta)))
        return lk_error(LK_EINTERNAL, "attention: workspace: expected the reserved bytes");
    c.lo = lo;
    c.hi = lo + Sq;
    lk_attn_row_intervals(a, d, lo, lo + Sq);
    float *lse = a->saved.data;
    lk_status st = LK_OK;
    if (backward) lk_attn_delta(a, d, delta);
    for (int64_t b = 0; b < d->B && !st; b++)
        for (int64_t hk = 0; hk < d->Hkv && !st; hk++) {
            const void *k = head_rows(&a->k, b * d->Hkv + hk, Skv, D), *v = head_rows(&a->v, b * d->Hkv + hk, Skv, D);
            if (backward) memset(dkv, 0, (size_t)(2 * Skv * D) * 4);
            for (int64_t h = hk * d->G; h < (hk + 1) * d->G && !st; h++) {
                const void *q = head_rows(&a->q, b * d->Hq + h, Sq, D);
                float *lr = lse + (b * d->Hq + h) * Sq;
                size_t oo = (size_t)((b * Sq * d->Hq + h) * D) * lk_dtype_size(d->dt);
                if ((st = lk_gemm(Sq, Skv, D, 1.0f, opnd(q, d->dt, D, 0), opnd(k, d->dt, D, 1), 0.0f, s, Skv, ar)))
                    break;
                scores(&c, b, h, s, g);
                softmax(&c, h, s, lr, !backward);
                if (!backward) {
                    st = lk_gemm(Sq, D, Skv, 1.0f, opnd(s, LK_F32, Skv, 0), opnd(v, d->dt, D, 0), 0.0f, rows, D, ar);
                    if (!st) store_rows((char *)a->out.data + oo, d->dt, ldo, rows, Sq, D);
                    continue;
                }
                const void *dout = (const char *)a->dout.data + oo;
                if ((st = lk_gemm(Sq, Skv, D, 1.0f, opnd(dout, d->dt, ldo, 0), opnd(v, d->dt, D, 1), 0.0f, dp, Skv, ar)))
                    break;
                const float *dr = delta + (b * d->Hq + h) * Sq;
                #pragma omp parallel for schedule(static) if (Sq * Skv >= PAR_MIN)
                for (int64_t i = 0; i < Sq; i++)
                    for (int64_t j = 0; j < Skv; j++) {
                        int64_t at = i * Skv + j;
                        dp[at] = s[at] * (dp[at] - dr[i]) * g[at];
                    }
                if ((st = lk_gemm(Skv, D, Sq, 1.0f, opnd(s, LK_F32, Skv, 1), opnd(dout, d->dt, ldo, 0), 1.0f,
                                  dkv + Skv * D, D, ar)) ||
                    (st = lk_gemm(Skv, D, Sq, 1.0f, opnd(dp, LK_F32, Skv, 1), opnd(q, d->dt, D, 0), 1.0f, dkv, D, ar)) ||
                    (st = lk_gemm(Sq, D, Skv, 1.0f, opnd(dp, LK_F32, Skv, 0), opnd(k, d->dt, D, 0), 0.0f, rows, D, ar)))
                    break;
                store_rows((char *)a->dq.data + (size_t)((b * d->Hq + h) * Sq * D) * lk_dtype_size(d->dt), d->dt, D,
                           rows, Sq, D);
            }
            if (backward && !st) {
                size_t ko = (size_t)((b * d->Hkv + hk) * Skv * D) * lk_dtype_size(d->dt);
                store_rows((char *)a->dk.data + ko, d->dt, D, dkv, Skv, D);
                store_rows((char *)a->dv.data + ko, d->dt, D, dkv + Skv * D, Skv, D);
            }
        }
    if (backward && !st) lk_attn_sink_grad(a, d, lse, delta);
    return st;
}

static lk_status eager_forward(const lk_attention_args *a, lk_ctx *ctx) { return eager_run(a, ctx, 0); }
static lk_status eager_backward(const lk_attention_args *a, lk_ctx *ctx) { return eager_run(a, ctx, 1); }

const lk_attention_vtable lk_attention_eager_backend = {
    .version = LK_ATTENTION_VTABLE_VERSION,
    .saved_bytes = lk_attn_lse_bytes,
    .workspace_bytes = eager_workspace,
    .forward = eager_forward,
    .backward = eager_backward,
};
