/* rms_norm.c — the RMSNorm facade (include/llmkern/rms_norm.h): every argument is
 * checked before anything is written, the implementation's workspace is reserved in
 * ctx->arena and given back after the call. Implementations (eager.c: eager and
 * eager_fp32; fused.c) may therefore assume well-formed, non-overlapping arguments,
 * rows >= 1, and a weight of x's dtype or f32 (dweight of the weight's). x, y, dy and dx
 * may be strided views whose rows lie as src/ops/rows.h says (each its own; every
 * implementation walks them with lk_row_at), except in the residual mode. In the residual
 * mode (rms_norm.h) x is an output of the forward and the f32 residual an output of both
 * passes: they stand apart from everything else. A residual of x's dtype (the stream in
 * x's dtype) is an input, apart from the outputs except that it may be x (forward) or dx
 * (backward, not over dy) itself; implementations tell the modes by residual's dtype. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ops/rope/internal.h"
#include "ops/validate.h"
#include "llmkern/rms_norm.h"

#define OP "rms_norm"

typedef struct {
    const lk_rms_norm_vtable *vt;
    int64_t rows, n;
} shape_info;

/* After lk_impl_check: x is the tensor the others are measured against; its data is
 * needed unless querying. x, y, dy and dx may be strided views (rows.h). */
static lk_status check_x(const lk_impl *impl, const lk_tensor *x, int need_data, shape_info *si) {
    lk_rows m;
    lk_status s;
    si->vt = impl->vtable;
    if ((s = lk_expect_row_view(OP, impl->device, "x", x, need_data, 1, &m)) ||
        (s = lk_expect_dtype(OP, "x", x, impl->needs.dtypes)))
        return s;
    si->n = x->shape[x->ndim - 1];
    if (si->n < 1) return lk_error(LK_ESHAPE, OP ": x: expected a last dim >= 1, got %lld", (long long)si->n);
    si->rows = lk_tensor_numel(x) / si->n;
    return LK_OK;
}

/* A tensor shaped and typed like x, on x's device; a view of rows like x may be. */
static lk_status check_like_x(const lk_impl *impl, const char *arg, const lk_tensor *t, const lk_tensor *x) {
    lk_rows m;
    lk_status s = lk_expect_row_view(OP, impl->device, arg, t, 1, 1, &m);
    return s ? s : lk_expect_like(OP, arg, t, x);
}

int lk_rms_norm_takes_views(const lk_impl *impl) {
    const lk_rms_norm_vtable *vt = impl && impl->op == LK_OP_RMS_NORM ? impl->vtable : NULL;
    return vt && vt->version >= 2 && vt->takes_views;
}

int lk_rms_norm_takes_rope(const lk_impl *impl) {
    const lk_rms_norm_vtable *vt = impl && impl->op == LK_OP_RMS_NORM ? impl->vtable : NULL;
    return vt && vt->version >= 3 && vt->takes_rope;
}

int lk_rms_norm_takes_rope_rows(const lk_impl *impl, int64_t n, lk_dtype dt) {
    if (!lk_rms_norm_takes_rope(impl)) return 0;
    const lk_rms_norm_vtable *vt = impl->vtable;
    return vt->version < 4 || vt->takes_rope_rows == NULL || vt->takes_rope_rows(n, dt);
}

/* RoPE after the norm (rms_norm.h): an implementation that takes it, x [T, H, n] with n
 * even, the tables f32 [max_pos, n/2], position_ids [T] (on the CPU each in range); not
 * with the residual mode. */
static lk_status check_rope(const lk_impl *impl, const lk_rms_norm_args *a) {
    const lk_rms_norm_rope *r = a->rope;
    lk_status s;
    if (r == NULL) return LK_OK;
    if (!lk_rms_norm_takes_rope(impl))
        return lk_error(LK_EINVAL, OP ": rope: %s does not rotate its output (the fused rows do)", impl->name);
    if (a->residual.data) return lk_error(LK_EINVAL, OP ": rope: not with the residual mode (residual set)");
    int64_t n = a->x.shape[a->x.ndim - 1];
    if (a->x.ndim != 3 || n % 2)
        return lk_error(LK_ESHAPE, OP ": x: rope expects [T, H, n] with n even, got %d dims, n = %lld", a->x.ndim,
                        (long long)n);
    if ((s = lk_expect_operand(OP, impl->device, "rope.cos", &r->cos, 1, 2))) return s;
    int64_t table[2] = {r->cos.shape[0], n / 2}, T = a->x.shape[0];
    const unsigned ids = LK_DTYPE_BIT(LK_I32) | LK_DTYPE_BIT(LK_I64);
    if ((s = lk_expect_tensor(OP, impl->device, "rope.cos", &r->cos, 2, table, LK_DTYPE_BIT(LK_F32))) ||
        (s = lk_expect_tensor(OP, impl->device, "rope.sin", &r->sin, 2, table, LK_DTYPE_BIT(LK_F32))) ||
        (s = lk_expect_tensor(OP, impl->device, "rope.position_ids", &r->position_ids, 1, &T, ids)))
        return s;
    if (impl->device != LK_DEVICE_CPU) return LK_OK;   /* device memory: the kernel makes NaN of a bad id */
    for (int64_t t = 0; t < T; t++) {
        int64_t p = lk_rope_pos(&r->position_ids, 0, t, T);
        if (p < 0 || p >= table[0])
            return lk_error(LK_EINVAL, OP ": rope.position_ids: expected values in [0, max_pos = %lld), got %lld at "
                            "token %lld", (long long)table[0], (long long)p, (long long)t);
    }
    return LK_OK;
}

/* Views only for an implementation that takes them. */
static lk_status check_views(const lk_impl *impl, const lk_tensor *const *t, const char *const *names, int n) {
    if (lk_rms_norm_takes_views(impl)) return LK_OK;
    for (int i = 0; i < n; i++)
        if (!lk_tensor_is_contiguous(t[i]))
            return lk_error(LK_ESHAPE, OP ": %s: %s takes contiguous tensors, got a strided view (the fused rows "
                            "take views)", names[i], impl->name);
    return LK_OK;
}

/* An [n] vector of dtype dt (dweight: the weight's), or with dt < 0 of x's dtype or
 * f32 (weight: bf16 x may take the f32 master weight, rms_norm.h). */
static lk_status check_vector(const lk_impl *impl, const char *arg, const lk_tensor *t, const lk_tensor *x,
                              int64_t n, int dt) {
    lk_status s;
    if ((s = lk_expect_operand(OP, impl->device, arg, t, 0, 1)) || (s = lk_expect_shape(OP, arg, t, 1, &n)))
        return s;
    return lk_expect_dtype(OP, arg, t, dt >= 0 ? LK_DTYPE_BIT(dt) : LK_DTYPE_BIT(x->dtype) | LK_DTYPE_BIT(LK_F32));
}

/* The residual mode's tensors: residual f32 (or of bf16 x's dtype) shaped like x; delta
 * (forward, optional) shaped and typed like x. *rb: residual's bytes (0 when the mode is
 * off). */
static lk_status check_residual(const lk_impl *impl, const lk_rms_norm_args *a, int forward, size_t *rb) {
    lk_status s;
    *rb = 0;
    if (!a->residual.data) {
        if (forward && a->delta.data)
            return lk_error(LK_EINVAL, OP ": delta: expected residual too (delta is added into it), got residual NULL");
        return LK_OK;
    }
    /* the stream's rows are the tensors' own: no views there */
    const lk_tensor *rows[] = {&a->x, forward ? &a->y : &a->dy, forward ? &a->y : &a->dx, &a->delta};
    const char *names[] = {"x", forward ? "y" : "dy", forward ? "y" : "dx", "delta"};
    for (int i = 0; i < 4; i++)
        if (rows[i]->data && !lk_tensor_is_contiguous(rows[i]))
            return lk_error(LK_ESHAPE, OP ": %s: expected a contiguous tensor in the residual mode, got a strided view",
                            names[i]);
    if ((s = lk_expect_operand(OP, impl->device, "residual", &a->residual, 1, 1)) ||
        (s = lk_expect_shape(OP, "residual", &a->residual, a->x.ndim, a->x.shape)) ||
        (s = lk_expect_dtype(OP, "residual", &a->residual,
                             LK_DTYPE_BIT(LK_F32) | (a->x.dtype == LK_BF16 ? LK_DTYPE_BIT(LK_BF16) : 0))))
        return s;
    if (forward && a->delta.data && (s = check_like_x(impl, "delta", &a->delta, &a->x))) return s;
    *rb = lk_tensor_bytes(&a->residual);
    return LK_OK;
}

/* The rope's tables and ids are inputs: apart from the pass's outputs. */
static lk_status rope_apart(const lk_rms_norm_args *a, int backward) {
    if (a->rope == NULL) return LK_OK;
    const lk_rms_norm_rope *r = a->rope;
    const lk_region outs[] = {backward ? (lk_region){"dx", a->dx.data, lk_tensor_span_bytes(&a->dx)}
                                       : (lk_region){"y", a->y.data, lk_tensor_span_bytes(&a->y)},
                              backward ? (lk_region){"dweight", a->dweight.data, a->dweight.data ? lk_tensor_bytes(&a->dweight) : 0}
                                       : (lk_region){"saved", a->saved.data, a->saved.bytes}};
    const lk_region ins[] = {lk_tensor_region("rope.cos", &r->cos), lk_tensor_region("rope.sin", &r->sin),
                             lk_tensor_region("rope.position_ids", &r->position_ids)};
    return lk_expect_apart(OP, outs, 2, ins, 3);
}

static lk_status check_saved(const lk_rms_norm_args *a, const shape_info *si) {
    return lk_expect_saved(OP, "lk_rms_norm_saved_bytes", &a->saved, si->vt->saved_bytes(si->rows, si->n, a->x.dtype));
}

/* What both passes check: impl, args, ctx, x, weight, eps, saved. */
static lk_status check_common(const lk_impl *impl, const lk_rms_norm_args *a, const lk_ctx *ctx,
                              shape_info *si) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_RMS_NORM);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    if ((s = check_x(impl, &a->x, 1, si))) return s;
    if (a->weight.data && (s = check_vector(impl, "weight", &a->weight, &a->x, si->n, -1))) return s;
    if (!(a->eps > 0.0) || !isfinite(a->eps))
        return lk_error(LK_EINVAL, OP ": eps: expected a finite value > 0, got %g", a->eps);
    if (!isfinite(a->weight_offset))
        return lk_error(LK_EINVAL, OP ": weight_offset: expected a finite value, got %g",
                        (double)a->weight_offset);
    return check_saved(a, si);
}

/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const shape_info *si, int backward, const lk_rms_norm_args *a, lk_ctx *ctx) {
    const lk_rms_norm_vtable *vt = si->vt;
    size_t mark, ws = vt->workspace_bytes ? vt->workspace_bytes(si->rows, si->n, a->x.dtype, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? vt->backward(a, ctx) : vt->forward(a, ctx));
}

lk_status lk_rms_norm_saved_bytes(const lk_impl *impl, const lk_tensor *x, size_t *bytes) {
    shape_info si = {0};
    lk_status s = lk_impl_check(OP, impl, LK_OP_RMS_NORM);
    if (s) return s;
    if (x == NULL) return lk_error(LK_EINVAL, OP ": x: expected a tensor, got NULL");
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    if ((s = check_x(impl, x, 0, &si))) return s;
    *bytes = si.vt->saved_bytes(si.rows, si.n, x->dtype);
    return LK_OK;
}

lk_status lk_rms_norm_forward(const lk_impl *impl, const lk_rms_norm_args *a, lk_ctx *ctx) {
    shape_info si = {0};
    lk_status s = check_common(impl, a, ctx, &si);
    size_t rb;
    if (s || (s = check_like_x(impl, "y", &a->y, &a->x)) ||
        (s = check_views(impl, (const lk_tensor *[]){&a->x, &a->y}, (const char *[]){"x", "y"}, 2)) ||
        (s = check_residual(impl, a, 1, &rb)) || (s = check_rope(impl, a)) || (s = rope_apart(a, 0)))
        return s;
    size_t tb = lk_tensor_span_bytes(&a->x), yb = lk_tensor_span_bytes(&a->y);
    size_t wb = a->weight.data ? lk_tensor_bytes(&a->weight) : 0, db = rb && a->delta.data ? tb : 0;
    if (rb) {   /* x is written: an output like the others; an f32 residual too, one of x's dtype is an input (or x itself) */
        const int res_in = a->residual.dtype != LK_F32;
        const lk_region outs[] = {{"y", a->y.data, yb}, {"saved", a->saved.data, a->saved.bytes},
                                  {"x", a->x.data, tb}, {"residual", res_in ? NULL : a->residual.data, rb}};
        const lk_region ins[] = {{"weight", a->weight.data, wb}, {"delta", a->delta.data, db},
                                 {"residual", res_in && a->residual.data != a->x.data ? a->residual.data : NULL, rb}};
        if ((s = lk_expect_apart(OP, outs, 4, ins, 3))) return s;
    } else {
        const lk_region outs[] = {{"y", a->y.data, yb}, {"saved", a->saved.data, a->saved.bytes}};
        const lk_region ins[] = {{"x", a->x.data, tb}, {"weight", a->weight.data, wb}};
        if ((s = lk_expect_apart(OP, outs, 2, ins, 2))) return s;
    }
    if (si.rows == 0) return LK_OK;
    return run(&si, 0, a, ctx);
}

lk_status lk_rms_norm_backward(const lk_impl *impl, const lk_rms_norm_args *a, lk_ctx *ctx) {
    shape_info si = {0};
    lk_status s = check_common(impl, a, ctx, &si);
    if (s || (s = check_like_x(impl, "dy", &a->dy, &a->x)) || (s = check_like_x(impl, "dx", &a->dx, &a->x)) ||
        (s = check_views(impl, (const lk_tensor *[]){&a->x, &a->dy, &a->dx}, (const char *[]){"x", "dy", "dx"}, 3)) ||
        (s = check_rope(impl, a)) || (s = rope_apart(a, 1)))
        return s;
    int want_dw = a->weight.data != NULL && a->dweight.data != NULL;
    if (want_dw && (s = check_vector(impl, "dweight", &a->dweight, &a->x, si.n, (int)a->weight.dtype))) return s;
    size_t rb;
    if ((s = check_residual(impl, a, 0, &rb))) return s;
    size_t tb = lk_tensor_span_bytes(&a->x), dyb = lk_tensor_span_bytes(&a->dy), dxb = lk_tensor_span_bytes(&a->dx);
    size_t wb = a->weight.data ? lk_tensor_bytes(&a->weight) : 0, dwb = want_dw ? wb : 0, sb = a->saved.bytes;
    if (a->inplace_dx && (a->dx.data != a->dy.data || memcmp(a->dx.stride, a->dy.stride, sizeof a->dx.stride)))
        return lk_error(LK_EINVAL, OP ": dx: inplace_dx expects dx to be dy (data and strides), got %p and %p",
                        a->dx.data, a->dy.data);
    /* dx may be dy exactly (inplace_dx), and a residual of x's dtype dx exactly (unless dx is
     * dy); otherwise every output stands apart */
    const int res_in = rb && a->residual.dtype != LK_F32;
    const lk_region outs[] = {{"dx", a->dx.data, dxb}, {"dweight", a->dweight.data, dwb},
                              {"residual", res_in ? NULL : a->residual.data, rb}};
    const lk_region ins[] = {{a->inplace_dx ? "dy" : "dy (set inplace_dx to write over it)",
                              a->inplace_dx ? NULL : a->dy.data, dyb},
                             {"x", a->x.data, tb}, {"weight", a->weight.data, wb}, {"saved", a->saved.data, sb},
                             {"residual", res_in && !(a->residual.data == a->dx.data && !a->inplace_dx) ? a->residual.data : NULL, rb}};
    if ((s = lk_expect_apart(OP, outs, 3, ins, 5))) return s;
    if (a->inplace_dx) {            /* dy is dx: dweight and residual must still stand apart from it */
        const lk_region dy[] = {{"dy", a->dy.data, dyb}};
        if ((s = lk_expect_apart(OP, outs + 1, 2, dy, 1))) return s;
    }
    /* no rows: dx is empty and dweight a sum of nothing. On the GPU dweight is device
     * memory the host must not write: the CUDA implementations zero it themselves. */
    if (si.rows == 0 && impl->device == LK_DEVICE_CPU) {
        for (int64_t j = 0; want_dw && j < si.n; j++) lk_store(a->dweight.data, a->dweight.dtype, j, 0.0);
        return LK_OK;
    }
    return run(&si, 1, a, ctx);
}
