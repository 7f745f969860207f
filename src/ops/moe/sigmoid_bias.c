/* sigmoid_bias.c — `sigmoid_bias` router (DeepSeek-V3): s = sigmoid(logits); the
 * choice ranks s + e_bias (the load-balancing correction bias: it moves which experts
 * win, never the weights), limited to the topk_group groups (of n_group) whose two best
 * biased scores sum highest; weights s of the chosen (renormalized with
 * norm_topk_prob) times route_scale. Reached through lk_moe_router_forward / _backward. */
#include "ops/moe/router_core.h"
#include "ops/swiglu_mlp/act.h"

/* s = sigmoid(z); the choice is the group-limited top-k (lk_router_group_topk) of s + e_bias. */
static void row(const lk_moe_router_args *a, const float *z, int64_t e, float *v, int32_t *ids, float *sel,
                unsigned char *allowed) {
    const float *bias = a->e_bias.data;
    for (int64_t x = 0; x < e; x++) v[x] = lk_act_sigmoid(z[x]);
    for (int64_t x = 0; x < e; x++) sel[x] = v[x] + (bias ? bias[x] : 0.0f);
    lk_router_group_topk(sel, e, a->top_k, a->n_group, a->topk_group, allowed, ids);
}

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx) { return lk_router_forward(a, ctx, row); }

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
