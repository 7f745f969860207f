/* swiglu_mlp.c — the SwiGLU MLP facade (include/llmkern/swiglu_mlp.h): every argument is
 * checked before anything is written, the implementation's workspace is reserved in
 * ctx->arena and given back after the call. Implementations (eager.c, fused.c) may
 * assume well-formed, non-overlapping arguments and T >= 1. */
#include <math.h>
#include "ops/validate.h"
#include "llmkern/swiglu_mlp.h"
#include "ops/dense.h"

#define OP "swiglu_mlp"

static lk_status check_tensor(const lk_impl *impl, const char *arg, const lk_tensor *t, int ndim,
                              const int64_t *shape, unsigned dtypes) {
    return lk_expect_tensor(OP, impl->device, arg, t, ndim, shape, dtypes);
}

typedef struct {
    const lk_swiglu_mlp_vtable *vt;
    int64_t tokens, hidden, inter;
} dims;

/* After lk_impl_check: x and gate_up_weight fix T, H and I; their data is needed unless
 * querying. */
static lk_status check_x_gu(const lk_impl *impl, const lk_tensor *x, const lk_tensor *gu, int need_data, dims *d) {
    d->vt = impl->vtable;
    lk_status s = lk_expect_rows(OP, impl->device, "x", x, need_data, 1, impl->needs.dtypes, &d->tokens, &d->hidden);
    if (s || (s = lk_expect_operand(OP, impl->device, "gate_up_weight", gu, need_data, 2))) return s;
    if (gu->ndim != 2 || gu->shape[1] != d->hidden || gu->shape[0] < 2 || gu->shape[0] % 2) {
        char buf[96];
        return lk_error(LK_ESHAPE, OP ": gate_up_weight: expected shape [2I, %lld] (I >= 1, H = x's last dim), "
                        "got %s", (long long)d->hidden, lk_shape_str(gu, buf, sizeof buf));
    }
    d->inter = gu->shape[0] / 2;
    return lk_expect_dtype_eq(OP, "gate_up_weight", gu, x->dtype);
}

static lk_status check_common(const lk_impl *impl, const lk_swiglu_mlp_args *a, const lk_ctx *ctx, dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_SWIGLU_MLP);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    if ((s = check_x_gu(impl, &a->x, &a->gate_up_weight, 1, d))) return s;
    int64_t dws[2] = {d->hidden, d->inter};
    if ((s = check_tensor(impl, "down_weight", &a->down_weight, 2, dws, LK_DTYPE_BIT(a->x.dtype)))) return s;
    if (!(a->swiglu_limit >= 0.0f) || !isfinite(a->swiglu_limit))
        return lk_error(LK_EINVAL, OP ": swiglu_limit: expected a finite value >= 0 (0 = off), got %g",
                        (double)a->swiglu_limit);
    return lk_expect_saved(OP, "lk_swiglu_mlp_saved_bytes", &a->saved,
                           d->vt->saved_bytes(d->tokens, d->hidden, d->inter, a->x.dtype));
}


/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const dims *d, int backward, const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    size_t mark, ws = d->vt->workspace_bytes ? d->vt->workspace_bytes(a, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? d->vt->backward(a, ctx) : d->vt->forward(a, ctx));
}

/* Where both size queries begin: impl, somewhere to write the answer, and x and
 * gate_up_weight, which fix d (their data is not needed). */
static lk_status query(const lk_impl *impl, const lk_tensor *x, const lk_tensor *gu, const size_t *bytes, dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_SWIGLU_MLP);
    if (s) return s;
    if (x == NULL || gu == NULL)
        return lk_error(LK_EINVAL, OP ": %s: expected a tensor, got NULL", x ? "gate_up_weight" : "x");
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    return check_x_gu(impl, x, gu, 0, d);
}

lk_status lk_swiglu_mlp_saved_bytes(const lk_impl *impl, const lk_tensor *x, const lk_tensor *gate_up_weight,
                                    size_t *bytes) {
    dims d = {0};
    lk_status s = query(impl, x, gate_up_weight, bytes, &d);
    if (s) return s;
    *bytes = d.vt->saved_bytes(d.tokens, d.hidden, d.inter, x->dtype);
    return LK_OK;
}

lk_status lk_swiglu_mlp_workspace_bytes(const lk_impl *impl, const lk_swiglu_mlp_args *a, int backward,
                                        size_t *bytes) {
    if (a == NULL) return lk_error(LK_EINVAL, OP ": args: expected a pointer, got NULL");
    dims d = {0};
    lk_status s = query(impl, &a->x, &a->gate_up_weight, bytes, &d);
    if (s) return s;
    *bytes = d.vt->workspace_bytes ? d.vt->workspace_bytes(a, backward) : 0;
    return LK_OK;
}

lk_status lk_swiglu_mlp_forward(const lk_impl *impl, const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    dims d = {0};
    lk_status s = check_common(impl, a, ctx, &d);
    if (s || (a->out.data && (s = check_tensor(impl, "out", &a->out, a->x.ndim, a->x.shape, LK_DTYPE_BIT(a->x.dtype)))))
        return s;
    const lk_region outs[] = {LK_ARG_REGION(a, out), LK_SAVED_REGION(a)};
    const lk_region ins[] = {LK_ARG_REGION(a, x), LK_ARG_REGION(a, gate_up_weight), LK_ARG_REGION(a, down_weight)};
    if ((s = lk_expect_apart(OP, outs, 2, ins, 3))) return s;
    if (d.tokens == 0) return LK_OK;
    return run(&d, 0, a, ctx);
}

lk_status lk_swiglu_mlp_backward(const lk_impl *impl, const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    dims d = {0};
    lk_status s = check_common(impl, a, ctx, &d);
    if (s) return s;
    unsigned xdt = LK_DTYPE_BIT(a->x.dtype), gdt = xdt | LK_DTYPE_BIT(LK_F32);
    int64_t gus[2] = {2 * d.inter, d.hidden}, dws[2] = {d.hidden, d.inter};
    if ((s = check_tensor(impl, "dout", &a->dout, a->x.ndim, a->x.shape, xdt)) ||
        (s = check_tensor(impl, "dx", &a->dx, a->x.ndim, a->x.shape, xdt)) ||
        (a->d_gate_up_weight.data && (s = check_tensor(impl, "d_gate_up_weight", &a->d_gate_up_weight, 2, gus, gdt))) ||
        (a->d_down_weight.data && (s = check_tensor(impl, "d_down_weight", &a->d_down_weight, 2, dws, gdt))))
        return s;
    const lk_region outs[] = {LK_ARG_REGION(a, dx), LK_ARG_REGION(a, d_gate_up_weight),
                              LK_ARG_REGION(a, d_down_weight)};
    const lk_region ins[] = {LK_ARG_REGION(a, x), LK_ARG_REGION(a, gate_up_weight), LK_ARG_REGION(a, down_weight),
                             LK_ARG_REGION(a, dout), LK_SAVED_REGION(a)};
    if ((s = lk_expect_apart(OP, outs, 3, ins, 5))) return s;
    if (d.tokens == 0) return LK_OK;
    return run(&d, 1, a, ctx);
}
