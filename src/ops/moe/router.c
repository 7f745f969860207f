/* router.c — the MoE router facade (include/llmkern/moe.h): every argument and option
 * is checked before anything is written, the implementation's workspace is reserved in
 * ctx->arena and given back after the call. Implementations (softmax_topk.c,
 * sigmoid_bias.c, fake_balanced.c) may assume well-formed arguments and T >= 1. */
#include <math.h>
#include <string.h>
#include "ops/validate.h"
#include "ops/moe/router_core.h"

#define OP "moe_router"

static lk_status check_tensor(const lk_impl *impl, const char *arg, const lk_tensor *t, int ndim,
                              const int64_t *shape, unsigned dtypes) {
    return lk_expect_tensor(OP, impl->device, arg, t, ndim, shape, dtypes);
}

static int is_fake(const lk_impl *impl) { return strcmp(impl->name, "fake_balanced") == 0; }

static lk_status check_common(const lk_impl *impl, const lk_moe_router_args *a, const lk_ctx *ctx,
                              const lk_moe_router_vtable **vt, int64_t *T, int64_t *E) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_MOE_ROUTER);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    *vt = impl->vtable;
    const lk_tensor *x = &a->hidden, *g = &a->gate_weight;
    char buf[96];
    int64_t H;
    if ((s = lk_expect_rows(OP, impl->device, "hidden", x, 1, 2, impl->needs.dtypes, T, &H))) return s;
    if (x->ndim != 2)
        return lk_error(LK_ESHAPE, OP ": hidden: expected shape [T, H], got %s", lk_shape_str(x, buf, sizeof buf));
    if (g->data || !is_fake(impl)) {
        if ((s = lk_expect_present(OP, "gate_weight", g)) || (s = lk_expect_device(OP, "gate_weight", g, impl->device)) ||
            (s = lk_expect_contiguous(OP, "gate_weight", g, 2)) ||
            (s = lk_expect_dtype(OP, "gate_weight", g, LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(x->dtype))))
            return s;
        if (g->ndim != 2 || g->shape[0] < 1 || g->shape[1] != H)
            return lk_error(LK_ESHAPE, OP ": gate_weight: expected shape [E, %lld] (H = hidden's), got %s",
                            (long long)H, lk_shape_str(g, buf, sizeof buf));
        if (a->n_experts != 0 && a->n_experts != g->shape[0])
            return lk_error(LK_ESHAPE, OP ": n_experts: expected 0 or gate_weight's %lld rows, got %d",
                            (long long)g->shape[0], a->n_experts);
        *E = g->shape[0];
    } else {
        if (a->n_experts < 1)
            return lk_error(LK_EINVAL, OP ": n_experts: expected E >= 1 (fake_balanced without a gate_weight), got %d",
                            a->n_experts);
        *E = a->n_experts;
    }
    if (a->top_k < 1 || a->top_k > *E)
        return lk_error(LK_EINVAL, OP ": top_k: expected 1 <= k <= E = %lld, got %d", (long long)*E, a->top_k);
    if (!(a->noise >= 0.0f && a->noise <= 1.0f))
        return lk_error(LK_EINVAL, OP ": noise: expected a value in [0, 1], got %g", (double)a->noise);
    if (!(a->route_scale >= 0.0f) || !isfinite(a->route_scale))
        return lk_error(LK_EINVAL, OP ": route_scale: expected a finite value >= 0 (0 = 1), got %g",
                        (double)a->route_scale);
    if (a->n_group > 1) {
        if (*E % a->n_group || a->topk_group < 1 || a->topk_group > a->n_group ||
            (int64_t)a->top_k > a->topk_group * (*E / a->n_group))
            return lk_error(LK_EINVAL, OP ": n_group: expected E = %lld divisible by n_group, 1 <= topk_group <= "
                            "n_group and k <= topk_group·E/n_group, got n_group %d topk_group %d k %d",
                            (long long)*E, a->n_group, a->topk_group, a->top_k);
    } else if (a->n_group < 0 || a->topk_group < 0 || a->topk_group > 1) {
        return lk_error(LK_EINVAL, OP ": n_group: expected 0 or 1 groups with topk_group 0 or 1, got %d and %d",
                        a->n_group, a->topk_group);
    }
    if (a->e_bias.data) {
        int64_t es[1] = {*E};
        if ((s = check_tensor(impl, "e_bias", &a->e_bias, 1, es, LK_DTYPE_BIT(LK_F32)))) return s;
    }
    return lk_expect_saved(OP, "lk_moe_router_saved_bytes", &a->saved, (*vt)->saved_bytes(*T, *E, a->top_k));
}

/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const lk_moe_router_vtable *vt, int backward, const lk_moe_router_args *a, lk_ctx *ctx) {
    size_t mark, ws = vt->workspace_bytes ? vt->workspace_bytes(a, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? vt->backward(a, ctx) : vt->forward(a, ctx));
}

lk_status lk_moe_router_saved_bytes(const lk_impl *impl, int64_t tokens, int64_t experts, int64_t top_k,
                                    size_t *bytes) {
    const lk_moe_router_vtable *vt = NULL;
    lk_status s = lk_impl_check(OP, impl, LK_OP_MOE_ROUTER);
    if (s) return s;
    vt = impl->vtable;
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    if (tokens < 0 || top_k < 1 || experts < top_k)
        return lk_error(LK_EINVAL, OP ": sizes: expected T >= 0 and 1 <= k <= E, got T %lld E %lld k %lld",
                        (long long)tokens, (long long)experts, (long long)top_k);
    *bytes = vt->saved_bytes(tokens, experts, top_k);
    return LK_OK;
}

lk_status lk_moe_router_forward(const lk_impl *impl, const lk_moe_router_args *a, lk_ctx *ctx) {
    const lk_moe_router_vtable *vt = NULL;
    int64_t T, E;
    lk_status s = check_common(impl, a, ctx, &vt, &T, &E);
    if (s) return s;
    int64_t tk[2] = {T, a->top_k}, one[1] = {1};
    if ((s = check_tensor(impl, "topk_ids", &a->topk_ids, 2, tk, LK_DTYPE_BIT(LK_I32))) ||
        (s = check_tensor(impl, "topk_weights", &a->topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32))) ||
        (a->aux_loss.data && (s = check_tensor(impl, "aux_loss", &a->aux_loss, 1, one, LK_DTYPE_BIT(LK_F32)))))
        return s;
    const lk_region outs[] = {lk_tensor_region("topk_ids", &a->topk_ids),
                              lk_tensor_region("topk_weights", &a->topk_weights),
                              lk_tensor_region("aux_loss", &a->aux_loss),
                              {"saved", a->saved.data, a->saved.bytes}};
    const lk_region ins[] = {lk_tensor_region("hidden", &a->hidden),
                             lk_tensor_region("gate_weight", &a->gate_weight),
                             lk_tensor_region("e_bias", &a->e_bias)};
    if ((s = lk_expect_apart(OP, outs, 4, ins, 3))) return s;
    if (T == 0 && impl->device != LK_DEVICE_CPU && a->aux_loss.data)   /* device memory: not ours to write */
        return lk_error(LK_EINVAL, OP ": hidden: no tokens on %s with an aux_loss to write; expected T >= 1",
                        lk_device_name(impl->device));
    if (T == 0) {
        if (a->aux_loss.data) *(float *)a->aux_loss.data = 0.0f;
        return LK_OK;
    }
    return run(vt, 0, a, ctx);
}

lk_status lk_moe_router_backward(const lk_impl *impl, const lk_moe_router_args *a, lk_ctx *ctx) {
    const lk_moe_router_vtable *vt = NULL;
    int64_t T, E;
    lk_status s = check_common(impl, a, ctx, &vt, &T, &E);
    if (s) return s;
    int64_t tk[2] = {T, a->top_k}, ws[2] = {E, a->hidden.shape[1]};
    if ((s = check_tensor(impl, "d_topk_weights", &a->d_topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32))) ||
        (s = check_tensor(impl, "d_hidden", &a->d_hidden, 2, a->hidden.shape, LK_DTYPE_BIT(a->hidden.dtype))) ||
        (a->d_gate_weight.data &&
         (s = check_tensor(impl, "d_gate_weight", &a->d_gate_weight, 2, ws,
                           LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(a->gate_weight.data ? a->gate_weight.dtype : LK_F32)))))
        return s;
    if (!isfinite(a->d_aux_loss))
        return lk_error(LK_EINVAL, OP ": d_aux_loss: expected a finite value, got %g", (double)a->d_aux_loss);
    const lk_region outs[] = {lk_tensor_region("d_hidden", &a->d_hidden),
                              lk_tensor_region("d_gate_weight", &a->d_gate_weight)};
    const lk_region ins[] = {lk_tensor_region("hidden", &a->hidden),
                             lk_tensor_region("gate_weight", &a->gate_weight),
                             lk_tensor_region("d_topk_weights", &a->d_topk_weights),
                             {"saved", a->saved.data, a->saved.bytes}};
    if ((s = lk_expect_apart(OP, outs, 2, ins, 4))) return s;
    if (T == 0) return LK_OK;
    return run(vt, 1, a, ctx);
}
