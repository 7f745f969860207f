/* sigmoid_bias.c — `sigmoid_bias` router (DeepSeek-V3): s = sigmoid(logits); the
 * choice ranks s + e_bias (the load-balancing correction bias: it moves which experts
 * win, never the weights), limited to the topk_group groups (of n_group) whose two best
 * biased scores sum highest; weights s of the chosen (renormalized with
 * norm_topk_prob) times route_scale. Reached through lk_moe_router_forward / _backward. */
#include <string.h>
#include "ops/moe/router_core.h"
#include "ops/swiglu_mlp/act.h"

/* Group-limited choice for one token (lk_router_group_topk on s + e_bias); sel and
 * allowed are scratch of e entries. */
static void choose(const lk_moe_router_args *a, const float *s, int64_t e, float *sel, unsigned char *allowed,
                   int32_t *ids) {
    const float *bias = a->e_bias.data;
    for (int64_t x = 0; x < e; x++) sel[x] = s[x] + (bias ? bias[x] : 0.0f);
    lk_router_group_topk(sel, e, a->top_k, a->n_group, a->topk_group, allowed, ids);
}

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
    #pragma omp parallel if (t * e >= LK_MOE_PAR_MIN)
    {
        float sel[e];
        unsigned char allowed[e];
        #pragma omp for schedule(static)
        for (int64_t tok = 0; tok < t; tok++) {
            float *vr = v + tok * e;
            for (int64_t x = 0; x < e; x++) vr[x] = lk_act_sigmoid(z[tok * e + x]);
            choose(a, vr, e, sel, allowed, ids + tok * k);
        }
    }
    return lk_router_finish(a, ctx, p);
}

static lk_status backward(const lk_moe_router_args *a, lk_ctx *ctx) {
    return lk_router_backward(a, ctx, LK_ROUTER_SIGMOID);
}

const lk_moe_router_vtable lk_moe_router_sigmoid_bias_vtable = {
    .version = LK_MOE_ROUTER_VTABLE_VERSION,
    .saved_bytes = lk_router_saved_bytes,
    .workspace_bytes = lk_router_workspace_bytes,
    .forward = forward,
    .backward = backward,
};
