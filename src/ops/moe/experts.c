/* experts.c — the MoE experts facade (include/llmkern/moe.h): every argument, the expert
 * ids included, is checked before anything is written; the implementation's workspace
 * is reserved in ctx->arena and given back after the call. Implementations (eager.c,
 * fused.c) may assume well-formed, non-overlapping arguments and T >= 1 (a GPU row's
 * backward is also called with T = 0 under write_weight_grads: zeros to write). */
#include <string.h>
#include "ops/validate.h"
#include "ops/moe/internal.h"

#define OP "moe_experts"

static lk_status check_tensor(const lk_impl *impl, const char *arg, const lk_tensor *t, int ndim,
                              const int64_t *shape, unsigned dtypes) {
    return lk_expect_tensor(OP, impl->device, arg, t, ndim, shape, dtypes);
}

/* hidden and the two weights fix T, H, E, I; topk_ids fixes k; ids must lie in [0, E). */
static lk_status check_common(const lk_impl *impl, const lk_moe_experts_args *a, const lk_ctx *ctx,
                              const lk_moe_experts_vtable **vt, lk_moe_dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_MOE_EXPERTS);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    *vt = impl->vtable;
    const lk_tensor *x = &a->hidden, *gu = &a->gate_up_weight;
    char buf[96];
    int64_t T, H;
    if ((s = lk_expect_rows(OP, impl->device, "hidden", x, 1, 2, impl->needs.dtypes, &T, &H))) return s;
    if (x->ndim != 2)
        return lk_error(LK_ESHAPE, OP ": hidden: expected shape [T, H], got %s", lk_shape_str(x, buf, sizeof buf));
    if ((s = lk_expect_present(OP, "gate_up_weight", gu)) || (s = lk_expect_device(OP, "gate_up_weight", gu, impl->device)) ||
        (s = lk_expect_contiguous(OP, "gate_up_weight", gu, 3)))
        return s;
    if (gu->ndim != 3 || gu->shape[0] < 1 || gu->shape[1] < 2 || gu->shape[1] % 2 || gu->shape[2] != H)
        return lk_error(LK_ESHAPE, OP ": gate_up_weight: expected shape [E, 2I, %lld] (E, I >= 1, H = hidden's), got %s",
                        (long long)H, lk_shape_str(gu, buf, sizeof buf));
    if ((s = lk_expect_dtype_eq(OP, "gate_up_weight", gu, x->dtype))) return s;
    const lk_tensor *ids = &a->topk_ids;
    if ((s = lk_expect_present(OP, "topk_ids", ids)) || (s = lk_expect_device(OP, "topk_ids", ids, impl->device)) ||
        (s = lk_expect_contiguous(OP, "topk_ids", ids, 2)) || (s = lk_expect_dtype_eq(OP, "topk_ids", ids, LK_I32)))
        return s;
    if (ids->ndim != 2 || ids->shape[0] != T || ids->shape[1] < 1)
        return lk_error(LK_ESHAPE, OP ": topk_ids: expected shape [%lld, k] (k >= 1), got %s",
                        (long long)T, lk_shape_str(ids, buf, sizeof buf));
    *d = lk_moe_dims_of(a);
    if (d->k > d->e)
        return lk_error(LK_ESHAPE, OP ": topk_ids: expected k <= E = %lld routes per token, got k = %lld",
                        (long long)d->e, (long long)d->k);
    int64_t dws[3] = {d->e, d->h, d->i}, tk[2] = {d->t, d->k};
    if ((s = check_tensor(impl, "down_weight", &a->down_weight, 3, dws, LK_DTYPE_BIT(x->dtype))) ||
        (s = check_tensor(impl, "topk_weights", &a->topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32))))
        return s;
    /* On a GPU the ids are device memory the facade does not read: the CUDA experts check
     * them on the device and poison their outputs with NaN on a bad one (moe.h). */
    const int32_t *id = ids->data;
    for (int64_t r = 0; impl->device == LK_DEVICE_CPU && r < d->r; r++)
        if (id[r] < 0 || id[r] >= d->e)
            return lk_error(LK_EINVAL, OP ": topk_ids: expected expert ids in [0, %lld), got %d at [%lld, %lld]",
                            (long long)d->e, id[r], (long long)(r / d->k), (long long)(r % d->k));
    return lk_expect_saved(OP, "lk_moe_experts_saved_bytes", &a->saved,
                           (*vt)->saved_bytes(d->t, d->k, d->e, d->h, d->i, d->dt));
}

/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const lk_moe_experts_vtable *vt, int backward, const lk_moe_experts_args *a, lk_ctx *ctx) {
    size_t mark, ws = vt->workspace_bytes ? vt->workspace_bytes(a, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? vt->backward(a, ctx) : vt->forward(a, ctx));
}

lk_status lk_moe_experts_saved_bytes(const lk_impl *impl, int64_t tokens, int64_t top_k, int64_t experts,
                                     int64_t hidden, int64_t inter, lk_dtype dt, size_t *bytes) {
    const lk_moe_experts_vtable *vt = NULL;
    lk_status s = lk_impl_check(OP, impl, LK_OP_MOE_EXPERTS);
    if (s) return s;
    vt = impl->vtable;
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    if (tokens < 0 || top_k < 1 || experts < top_k || hidden < 1 || inter < 1)
        return lk_error(LK_EINVAL, OP ": sizes: expected T >= 0, 1 <= k <= E, H, I >= 1, got T %lld k %lld E %lld "
                        "H %lld I %lld", (long long)tokens, (long long)top_k, (long long)experts, (long long)hidden,
                        (long long)inter);
    *bytes = vt->saved_bytes(tokens, top_k, experts, hidden, inter, dt);
    return LK_OK;
}

lk_status lk_moe_experts_forward(const lk_impl *impl, const lk_moe_experts_args *a, lk_ctx *ctx) {
    const lk_moe_experts_vtable *vt = NULL;
    lk_moe_dims d;
    lk_status s = check_common(impl, a, ctx, &vt, &d);
    if (s || (a->out.data && (s = check_tensor(impl, "out", &a->out, 2, a->hidden.shape, LK_DTYPE_BIT(d.dt)))))
        return s;
    const lk_region outs[] = {lk_tensor_region("out", &a->out), {"saved", a->saved.data, a->saved.bytes}};
    const lk_region ins[] = {lk_tensor_region("hidden", &a->hidden),
                             lk_tensor_region("topk_ids", &a->topk_ids),
                             lk_tensor_region("topk_weights", &a->topk_weights),
                             lk_tensor_region("gate_up_weight", &a->gate_up_weight),
                             lk_tensor_region("down_weight", &a->down_weight)};
    if ((s = lk_expect_apart(OP, outs, 2, ins, 5))) return s;
    if (d.t == 0) return LK_OK;
    return run(vt, 0, a, ctx);
}

lk_status lk_moe_experts_backward(const lk_impl *impl, const lk_moe_experts_args *a, lk_ctx *ctx) {
    const lk_moe_experts_vtable *vt = NULL;
    lk_moe_dims d;
    lk_status s = check_common(impl, a, ctx, &vt, &d);
    if (s) return s;
    unsigned xdt = LK_DTYPE_BIT(d.dt), gdt = xdt | LK_DTYPE_BIT(LK_F32);
    int64_t gus[3] = {d.e, 2 * d.i, d.h}, dws[3] = {d.e, d.h, d.i}, tk[2] = {d.t, d.k};
    if ((s = check_tensor(impl, "dout", &a->dout, 2, a->hidden.shape, xdt)) ||
        (s = check_tensor(impl, "d_hidden", &a->d_hidden, 2, a->hidden.shape, xdt)) ||
        (a->d_topk_weights.data && (s = check_tensor(impl, "d_topk_weights", &a->d_topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32)))) ||
        (a->d_gate_up_weight.data && (s = check_tensor(impl, "d_gate_up_weight", &a->d_gate_up_weight, 3, gus, gdt))) ||
        (a->d_down_weight.data && (s = check_tensor(impl, "d_down_weight", &a->d_down_weight, 3, dws, gdt))))
        return s;
    const lk_region outs[] = {lk_tensor_region("d_hidden", &a->d_hidden),
                              lk_tensor_region("d_topk_weights", &a->d_topk_weights),
                              lk_tensor_region("d_gate_up_weight", &a->d_gate_up_weight),
                              lk_tensor_region("d_down_weight", &a->d_down_weight)};
    const lk_region ins[] = {lk_tensor_region("hidden", &a->hidden),
                             lk_tensor_region("topk_ids", &a->topk_ids),
                             lk_tensor_region("topk_weights", &a->topk_weights),
                             lk_tensor_region("gate_up_weight", &a->gate_up_weight),
                             lk_tensor_region("down_weight", &a->down_weight),
                             lk_tensor_region("dout", &a->dout),
                             {"saved", a->saved.data, a->saved.bytes}};
    if ((s = lk_expect_apart(OP, outs, 4, ins, 7))) return s;
    if (a->write_weight_grads != 0 && a->write_weight_grads != 1)
        return lk_error(LK_EINVAL, OP ": write_weight_grads: expected 0 (accumulate) or 1 (write), got %d",
                        a->write_weight_grads);
    if (d.t == 0 && !a->write_weight_grads) return LK_OK;
    if (d.t == 0 && impl->device == LK_DEVICE_CPU) {   /* nothing routed: written means zeros */
        const lk_tensor *g[2] = {&a->d_gate_up_weight, &a->d_down_weight};
        for (int i = 0; i < 2; i++)
            if (g[i]->data) memset(g[i]->data, 0, (size_t)lk_tensor_numel(g[i]) * lk_dtype_size(g[i]->dtype));
        return LK_OK;
    }
    return run(vt, 1, a, ctx);   /* a GPU row writes the zeros of T = 0 itself */
}
