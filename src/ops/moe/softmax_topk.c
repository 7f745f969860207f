/* softmax_topk.c — `softmax_topk` router (Qwen3-MoE, Mixtral): p = softmax(logits) in
 * f32, the k largest p, weights p (renormalized with norm_topk_prob, or the softmax of
 * the k chosen logits — the same numbers — with softmax_after_topk) times route_scale.
 * Reached through lk_moe_router_forward / _backward (router.c). */
#include <math.h>
#include "ops/moe/router_core.h"

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx) {
    int64_t t = a->hidden.shape[0], e = lk_router_experts(a);
    int k = a->top_k;
    float *z = lk_arena_alloc(ctx->arena, sizeof(float) * (size_t)(t * e));
    double *p = lk_arena_alloc(ctx->arena, sizeof(double) * (size_t)(2 * e + 1));
    if (!z || !p) return LK_MOE_NOMEM("moe_router");
    lk_status s = lk_router_logits(a, ctx->arena, z);
    if (s) return s;
    float *v = lk_router_saved_v(a);
    int32_t *ids = lk_router_saved_ids(a);
    #pragma omp parallel for schedule(static) if (t * e >= LK_MOE_PAR_MIN)
    for (int64_t tok = 0; tok < t; tok++) {
        const float *zr = z + tok * e;
        float *vr = v + tok * e, mx = -INFINITY, sum = 0.0f;
        for (int64_t x = 0; x < e; x++) mx = fmaxf(mx, zr[x]);
        for (int64_t x = 0; x < e; x++) sum += vr[x] = expf(zr[x] - mx);
        for (int64_t x = 0; x < e; x++) vr[x] /= sum;
        lk_router_topk(vr, NULL, e, k, ids + tok * k);
    }
    return lk_router_finish(a, ctx, p);
}

static lk_status backward(const lk_moe_router_args *a, lk_ctx *ctx) {
    return lk_router_backward(a, ctx, LK_ROUTER_SOFTMAX);
}

const lk_moe_router_vtable lk_moe_router_softmax_topk_vtable = {
    .version = LK_MOE_ROUTER_VTABLE_VERSION,
    .saved_bytes = lk_router_saved_bytes,
    .workspace_bytes = lk_router_workspace_bytes,
    .forward = forward,
    .backward = backward,
};
