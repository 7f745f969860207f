/* router_core.c — logits, top-k, weights, aux loss and the backward shared by the
 * learned routers (see router_core.h and include/llmkern/moe.h for the math). */
#include <math.h>
#include <string.h>
#include "ops/moe/router_core.h"
#include "llmkern/comm.h"
#include "ops/swiglu_mlp/act.h"

int64_t lk_router_experts(const lk_moe_router_args *a) {
    return a->n_experts > 0 ? a->n_experts : a->gate_weight.shape[0];
}

size_t lk_router_saved_bytes(int64_t t, int64_t e, int64_t k) {
    return lk_arena_piece(sizeof(float) * (size_t)(t * e)) + sizeof(int32_t) * (size_t)(t * k);
}

float *lk_router_saved_v(const lk_moe_router_args *a) { return a->saved.data; }
int32_t *lk_router_saved_ids(const lk_moe_router_args *a) {
    int64_t t = a->hidden.shape[0];
    return (int32_t *)((char *)a->saved.data + lk_arena_piece(sizeof(float) * (size_t)(t * lk_router_experts(a))));
}

size_t lk_router_workspace_bytes(const lk_moe_router_args *a, int backward) {
    int64_t t = a->hidden.shape[0], h = a->hidden.shape[1], e = lk_router_experts(a);
    size_t z = lk_dense_piece(sizeof(float) * (size_t)(t * e));
    size_t g = lk_gemm_workspace_bytes(t, e, h, a->hidden.dtype, a->gate_weight.dtype) + 2 * LK_ARENA_ALIGN;
    if (!backward) return z + g + lk_dense_piece(sizeof(double) * (size_t)(2 * e + 1));
    size_t dx = lk_dense_piece(sizeof(float) * (size_t)(t * h)) + lk_dense_piece(sizeof(double) * (size_t)(e + 1)) +
                lk_dense_piece(sizeof(float) * (size_t)e);
    size_t acc = a->d_gate_weight.data ? lk_dense_gemm_acc_bytes(e, h, t, LK_F32, a->hidden.dtype, a->d_gate_weight.dtype) : 0;
    return z + dx + lk_dense_max(g, acc);
}

lk_status lk_router_logits(const lk_moe_router_args *a, lk_arena *ar, float *z) {
    int64_t t = a->hidden.shape[0], h = a->hidden.shape[1], e = lk_router_experts(a);
    lk_status s = lk_gemm(t, e, h, 1.0f, lk_dense_opnd(a->hidden.data, a->hidden.dtype, h, 0),
                          lk_dense_opnd(a->gate_weight.data, a->gate_weight.dtype, h, 1), 0.0f, z, e, ar);
    if (s || a->gate_f32 || a->hidden.dtype == LK_F32) return s;
    for (int64_t n = 0; n < t * e; n++) z[n] = lk_bf16_to_f32(lk_f32_to_bf16(z[n]));
    return LK_OK;
}

void lk_router_topk(const float *s, const unsigned char *allowed, int64_t e, int k, int32_t *ids) {
    for (int j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t x = 0; x < e; x++) {
            if (allowed && !allowed[x]) continue;
            int taken = 0;
            for (int l = 0; l < j; l++) taken |= ids[l] == x;
            if (!taken && (best < 0 || s[x] > s[best])) best = x;
        }
        ids[j] = (int32_t)best;
    }
}

void lk_router_group_topk(const float *sel, int64_t e, int k, int n_group, int topk_group, unsigned char *allowed,
                          int32_t *ids) {
    if (n_group <= 1) {
        lk_router_topk(sel, NULL, e, k, ids);
        return;
    }
    int64_t gs = e / n_group;
    float gscore[n_group];
    int32_t kept[n_group];
    for (int g = 0; g < n_group; g++) {
        int32_t two[2];
        int m = gs > 1 ? 2 : 1;
        lk_router_topk(sel + g * gs, NULL, gs, m, two);
        gscore[g] = sel[g * gs + two[0]] + (m > 1 ? sel[g * gs + two[1]] : 0.0f);
    }
    lk_router_topk(gscore, NULL, n_group, topk_group, kept);   /* the groups, ties to the lower index */
    memset(allowed, 0, (size_t)e);
    for (int n = 0; n < topk_group; n++) memset(allowed + kept[n] * gs, 1, (size_t)gs);
    lk_router_topk(sel, allowed, e, k, ids);
}

static float scale_of(const lk_moe_router_args *a) { return a->route_scale > 0 ? a->route_scale : 1.0f; }
static int normed(const lk_moe_router_args *a) { return a->norm_topk_prob || a->softmax_after_topk; }

lk_status lk_router_group_sum(lk_ctx *ctx, double *v, int64_t n) {
    struct lk_comm *c = ctx->comm;
    return c && c->size > 1 ? lk_comm_all_reduce(c, v, n, LK_COMM_F64) : LK_OK;
}

/* From the saved v and ids: topk_weights, topk_ids and aux_loss (if wanted); p_scratch holds
 * 2E + 1 doubles. */
static lk_status finish(const lk_moe_router_args *a, lk_ctx *ctx, double *p_scratch) {
    int64_t t = a->hidden.shape[0], e = lk_router_experts(a);
    int k = a->top_k;
    const float *v = lk_router_saved_v(a);
    const int32_t *ids = lk_router_saved_ids(a);
    float *w = a->topk_weights.data, sc = scale_of(a);
    memcpy(a->topk_ids.data, ids, sizeof(int32_t) * (size_t)(t * k));
    #pragma omp parallel for schedule(static) if (t * e >= LK_MOE_PAR_MIN)
    for (int64_t tok = 0; tok < t; tok++) {
        float S = 0.0f;
        for (int j = 0; j < k; j++) S += v[tok * e + ids[tok * k + j]];
        float m = normed(a) ? sc / S : sc;
        for (int j = 0; j < k; j++) w[tok * k + j] = v[tok * e + ids[tok * k + j]] * m;
    }
    if (!a->aux_loss.data) return LK_OK;
    /* aux = E/(T²k) · Σ_e count_e · Σ_t q[t, e], q = v / Σ v, over the group's tokens:
     * P, count and T in the caller's scratch, summed over the group */
    double *P = p_scratch, *C = P + e;
    memset(P, 0, sizeof(double) * (size_t)(2 * e));
    for (int64_t tok = 0; tok < t; tok++) {
        double V = 0.0;
        for (int64_t y = 0; y < e; y++) V += v[tok * e + y];
        for (int64_t y = 0; y < e; y++) P[y] += v[tok * e + y] / V;
    }
    for (int64_t r = 0; r < t * k; r++) C[ids[r]] += 1.0;
    C[e] = (double)t;
    lk_status s = lk_router_group_sum(ctx, P, 2 * e + 1);
    if (s) return s;
    double aux = 0.0, T = C[e];
    for (int64_t x = 0; x < e; x++) aux += C[x] * P[x];
    *(float *)a->aux_loss.data = T > 0 ? (float)(aux * (double)e / (T * T * k)) : 0.0f;
    return LK_OK;
}

lk_status lk_router_forward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_row_fn row) {
    int64_t t = a->hidden.shape[0], e = lk_router_experts(a);
    int k = a->top_k;
    float *z = lk_arena_alloc(ctx->arena, sizeof(float) * (size_t)(t * e));
    double *p = lk_arena_alloc(ctx->arena, sizeof(double) * (size_t)(2 * e + 1));
    if (!z || !p) return LK_MOE_NOMEM("moe_router");
    lk_status s = lk_router_logits(a, ctx->arena, z);
    if (s) return s;
    float *v = lk_router_saved_v(a);
    int32_t *ids = lk_router_saved_ids(a);
    #pragma omp parallel if (t * e >= LK_MOE_PAR_MIN)
    {
        float sel[e];
        unsigned char allowed[e];
        #pragma omp for schedule(static)
        for (int64_t tok = 0; tok < t; tok++) row(a, z + tok * e, e, v + tok * e, ids + tok * k, sel, allowed);
    }
    return finish(a, ctx, p);
}

lk_status lk_router_backward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_kind kind) {
    int64_t t = a->hidden.shape[0], h = a->hidden.shape[1], e = lk_router_experts(a);
    int k = a->top_k;
    lk_arena *ar = ctx->arena;
    const float *v = lk_router_saved_v(a), *dw = a->d_topk_weights.data;
    const int32_t *ids = lk_router_saved_ids(a);
    float *dz = lk_arena_alloc(ar, sizeof(float) * (size_t)(t * e));
    float *dx = lk_arena_alloc(ar, sizeof(float) * (size_t)(t * h));
    double *cnt = lk_arena_alloc(ar, sizeof(double) * (size_t)(e + 1));
    if (!dz || !dx || !cnt) return LK_MOE_NOMEM("moe_router");
    /* ca[e] = d aux / d q[t, e], the same for every token: the group's counts and T */
    memset(cnt, 0, sizeof(double) * (size_t)(e + 1));
    for (int64_t r = 0; r < t * k; r++) cnt[ids[r]] += 1.0;
    cnt[e] = (double)t;
    lk_status s = a->d_aux_loss != 0.0f ? lk_router_group_sum(ctx, cnt, e + 1) : LK_OK;
    if (s) return s;
    float *ca = lk_arena_alloc(ar, sizeof(float) * (size_t)e);
    if (!ca) return LK_MOE_NOMEM("moe_router");
    double T = cnt[e];
    for (int64_t x = 0; x < e; x++) ca[x] = T > 0 ? (float)((double)a->d_aux_loss * cnt[x] * (double)e / (T * T * k)) : 0.0f;
    float sc = scale_of(a);
    #pragma omp parallel for schedule(static) if (t * e >= LK_MOE_PAR_MIN)
    for (int64_t tok = 0; tok < t; tok++) {
        const float *vr = v + tok * e;
        float *d = dz + tok * e, S = 0.0f, V = 0.0f, sdw = 0.0f, gq = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) {
            S += vr[ids[tok * k + j]];
            sdw += dw[tok * k + j] * vr[ids[tok * k + j]];
        }
        for (int64_t x = 0; x < e; x++) V += vr[x];
        for (int64_t x = 0; x < e; x++) gq += ca[x] * vr[x] / V;
        for (int64_t x = 0; x < e; x++) d[x] = (ca[x] - gq) / V;
        for (int j = 0; j < k; j++) {
            float g = dw[tok * k + j] * sc;
            d[ids[tok * k + j]] += normed(a) ? g / S - sdw * sc / (S * S) : g;
        }
        for (int64_t x = 0; x < e; x++) dot += d[x] * vr[x];
        for (int64_t x = 0; x < e; x++)
            d[x] = kind == LK_ROUTER_SOFTMAX ? vr[x] * (d[x] - dot) : d[x] * vr[x] * (1.0f - vr[x]);
    }
    s = lk_gemm(t, h, e, 1.0f, lk_dense_opnd(dz, LK_F32, e, 0),
                          lk_dense_opnd(a->gate_weight.data, a->gate_weight.dtype, h, 0), 0.0f, dx, h, ar);
    if (s) return s;
    lk_dense_store(a->d_hidden.data, a->hidden.dtype, dx, t, h, NULL);
    if (a->d_gate_weight.data)
        s = lk_dense_gemm_acc(e, h, t, lk_dense_opnd(dz, LK_F32, e, 1),
                              lk_dense_opnd(a->hidden.data, a->hidden.dtype, h, 0), a->d_gate_weight.data,
                              a->d_gate_weight.dtype, ar);
    return s;
}
