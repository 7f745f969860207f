/* linear.c — the linear facade (include/llmkern/linear.h): every argument is checked
 * before anything is written, the implementation's workspace is reserved in ctx->arena
 * and given back after the call. Implementations (blas.c) may assume well-formed,
 * non-overlapping arguments and rows >= 1. */
#include <string.h>
#include "ops/validate.h"
#include "llmkern/linear.h"
#include "ops/dense.h"

#define OP "linear"

static lk_status check_tensor(const lk_impl *impl, const char *arg, const lk_tensor *t, int ndim,
                              const int64_t *shape, unsigned dtypes) {
    return lk_expect_tensor(OP, impl->device, arg, t, ndim, shape, dtypes);
}

typedef struct {
    const lk_linear_vtable *vt;
    int64_t rows, in, out;
} dims;

/* After lk_impl_check: x and weight fix the dims; their data is needed unless querying. */
static lk_status check_x_w(const lk_impl *impl, const lk_tensor *x, const lk_tensor *w, int need_data, dims *d) {
    d->vt = impl->vtable;
    lk_status s = lk_expect_rows(OP, impl->device, "x", x, need_data, 1, impl->needs.dtypes, &d->rows, &d->in);
    if (s || (s = lk_expect_operand(OP, impl->device, "weight", w, need_data, 2))) return s;
    if (w->ndim != 2 || w->shape[1] != d->in || w->shape[0] < 1) {
        char buf[96];
        return lk_error(LK_ESHAPE, OP ": weight: expected shape [O >= 1, %lld] (x's last dim), got %s",
                        (long long)d->in, lk_shape_str(w, buf, sizeof buf));
    }
    d->out = w->shape[0];
    return lk_expect_dtype_eq(OP, "weight", w, x->dtype);
}

/* y's shape: x's leading dims, then O. */
static void y_shape(const lk_tensor *x, int64_t out, int64_t shape[LK_MAX_DIMS]) {
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = out;
}

static lk_status check_common(const lk_impl *impl, const lk_linear_args *a, const lk_ctx *ctx, dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_LINEAR);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    if ((s = check_x_w(impl, &a->x, &a->weight, 1, d))) return s;
    if (a->bias.data && (s = check_tensor(impl, "bias", &a->bias, 1, &d->out, LK_DTYPE_BIT(a->x.dtype)))) return s;
    return lk_expect_saved(OP, "lk_linear_saved_bytes", &a->saved,
                           d->vt->saved_bytes(d->rows, d->in, d->out, a->x.dtype));
}


/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const dims *d, int backward, const lk_linear_args *a, lk_ctx *ctx) {
    size_t mark, ws = d->vt->workspace_bytes ? d->vt->workspace_bytes(a, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? d->vt->backward(a, ctx) : d->vt->forward(a, ctx));
}

/* Where both size queries begin: impl, somewhere to write the answer, and x and weight,
 * which fix d (their data is not needed). */
static lk_status query(const lk_impl *impl, const lk_tensor *x, const lk_tensor *w, const size_t *bytes, dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_LINEAR);
    if (s) return s;
    if (x == NULL || w == NULL) return lk_error(LK_EINVAL, OP ": %s: expected a tensor, got NULL", x ? "weight" : "x");
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    return check_x_w(impl, x, w, 0, d);
}

lk_status lk_linear_saved_bytes(const lk_impl *impl, const lk_tensor *x, const lk_tensor *weight, size_t *bytes) {
    dims d = {0};
    lk_status s = query(impl, x, weight, bytes, &d);
    if (s) return s;
    *bytes = d.vt->saved_bytes(d.rows, d.in, d.out, x->dtype);
    return LK_OK;
}

lk_status lk_linear_workspace_bytes(const lk_impl *impl, const lk_linear_args *a, int backward, size_t *bytes) {
    if (a == NULL) return lk_error(LK_EINVAL, OP ": args: expected a pointer, got NULL");
    dims d = {0};
    lk_status s = query(impl, &a->x, &a->weight, bytes, &d);
    if (s) return s;
    *bytes = d.vt->workspace_bytes ? d.vt->workspace_bytes(a, backward) : 0;
    return LK_OK;
}

lk_status lk_linear_forward(const lk_impl *impl, const lk_linear_args *a, lk_ctx *ctx) {
    dims d = {0};
    lk_status s = check_common(impl, a, ctx, &d);
    if (s) return s;
    int64_t ys[LK_MAX_DIMS];
    y_shape(&a->x, d.out, ys);
    if ((s = check_tensor(impl, "y", &a->y, a->x.ndim, ys, LK_DTYPE_BIT(a->x.dtype)))) return s;
    const lk_region outs[] = {LK_ARG_REGION(a, y), LK_SAVED_REGION(a)};
    const lk_region ins[] = {LK_ARG_REGION(a, x), LK_ARG_REGION(a, weight), LK_ARG_REGION(a, bias)};
    if ((s = lk_expect_apart(OP, outs, 2, ins, 3))) return s;
    if (d.rows == 0) return LK_OK;
    return run(&d, 0, a, ctx);
}

lk_status lk_linear_backward(const lk_impl *impl, const lk_linear_args *a, lk_ctx *ctx) {
    dims d = {0};
    lk_status s = check_common(impl, a, ctx, &d);
    if (s) return s;
    int64_t ys[LK_MAX_DIMS], ws[2] = {d.out, d.in};
    y_shape(&a->x, d.out, ys);
    unsigned xdt = LK_DTYPE_BIT(a->x.dtype), gdt = xdt | LK_DTYPE_BIT(LK_F32);
    if ((s = check_tensor(impl, "dy", &a->dy, a->x.ndim, ys, xdt))) return s;
    if (a->dx.data && (s = check_tensor(impl, "dx", &a->dx, a->x.ndim, a->x.shape, xdt))) return s;
    if (a->dweight.data && (s = check_tensor(impl, "dweight", &a->dweight, 2, ws, gdt))) return s;
    if (a->dbias.data && a->bias.data == NULL)
        return lk_error(LK_EINVAL, OP ": dbias: expected NULL data without a bias, got a buffer");
    if (a->dbias.data && (s = check_tensor(impl, "dbias", &a->dbias, 1, &d.out, gdt))) return s;
    const lk_region outs[] = {LK_ARG_REGION(a, dx), LK_ARG_REGION(a, dweight), LK_ARG_REGION(a, dbias)};
    const lk_region ins[] = {LK_ARG_REGION(a, x), LK_ARG_REGION(a, weight), LK_ARG_REGION(a, bias),
                             LK_ARG_REGION(a, dy), LK_SAVED_REGION(a)};
    if ((s = lk_expect_apart(OP, outs, 3, ins, 5))) return s;
    if (d.rows == 0) return LK_OK;      /* dx is empty and the gradients gain a sum of nothing */
    return run(&d, 1, a, ctx);
}
