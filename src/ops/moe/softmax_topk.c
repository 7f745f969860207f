/* softmax_topk.c — `softmax_topk` router (Qwen3-MoE, Mixtral): p = softmax(logits) in
 * f32, the k largest p, weights p (renormalized with norm_topk_prob, or the softmax of
 * the k chosen logits — the same numbers — with softmax_after_topk) times route_scale.
 * Reached through lk_moe_router_forward / _backward (router.c). */
#include <math.h>
#include "ops/moe/router_core.h"

/* p = softmax(z) in f32, and the k largest. */
static void row(const lk_moe_router_args *a, const float *z, int64_t e, float *v, int32_t *ids, float *sel,
                unsigned char *allowed) {
    (void)sel, (void)allowed;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t x = 0; x < e; x++) mx = fmaxf(mx, z[x]);
    for (int64_t x = 0; x < e; x++) sum += v[x] = expf(z[x] - mx);
    for (int64_t x = 0; x < e; x++) v[x] /= sum;
    lk_router_topk(v, NULL, e, a->top_k, ids);
}

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx) { return lk_router_forward(a, ctx, row); }

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
