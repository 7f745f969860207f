/* local.c — the local dispatcher (moe_dispatch.h): one process owns every expert, so
 * dispatch is the experts op itself (the CPU or the CUDA experts, by the call's device).
 * The reference the other dispatchers are held to. */
#include "ops/moe_dispatch/internal.h"

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    const lk_moe_experts_vtable *vt = c.experts->vtable;
    lk_moe_experts_args e = {
        .hidden = a->hidden, .topk_ids = a->topk_ids, .topk_weights = a->topk_weights,
        .gate_up_weight = a->gate_up_weight, .down_weight = a->down_weight, .out = a->out,
    };
    e.saved.bytes = vt->saved_bytes(c.T, c.k, c.E, c.H, c.I, c.dt);
    lk_ep_bump b = {0};
    size_t mark;
    size_t wf = vt->workspace_bytes ? vt->workspace_bytes(&e, 0) : 0, wb = vt->workspace_bytes ? vt->workspace_bytes(&e, 1) : 0;
    size_t need = e.saved.bytes + lk_tensor_bytes(&a->hidden) + (wf > wb ? wf : wb) + 4 * LK_ARENA_ALIGN;
    lk_status s = lk_ep_reserve(&c, &b, need, &mark);
    if (s) return s;
    e.saved.data = lk_ep_take(&b, e.saved.bytes);
    if (!e.saved.data) s = lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little");
    /* the backward needs the forward's saved state: recomputed, as the other dispatchers do */
    if (!s && backward) {
        char *y = lk_ep_take(&b, lk_tensor_bytes(&a->hidden));
        e.out.data = y;
        if (!y) s = lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little");
    }
    if (!s) s = lk_moe_experts_forward(c.experts, &e, ctx);
    if (!s && backward) {
        e.dout = a->dout, e.d_hidden = a->d_hidden, e.d_topk_weights = a->d_topk_weights;
        e.d_gate_up_weight = a->d_gate_up_weight, e.d_down_weight = a->d_down_weight;
        s = lk_moe_experts_backward(c.experts, &e, ctx);
    }
    lk_ctx_workspace_end(ctx, mark);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_local_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
