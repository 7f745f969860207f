/* cross_entropy.c — the cross-entropy facade (include/llmkern/cross_entropy.h): every
 * argument, option, label value and kept index is checked before anything is written;
 * the implementation's workspace is reserved in ctx->arena and given back after the
 * call. Implementations (eager.c, fused.c, chunk_loss.c) may therefore assume
 * well-formed arguments, labels in [0, V) or ignore_index, and H, V >= 1.
 * On CUDA, labels, keep_indices and d_loss are device memory the host does not read:
 * their values are not checked here; the CUDA kernels make a bad label's or index's
 * loss and gradient NaN instead, never reading outside the tensors (fused_cuda.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ops/validate.h"
#include "llmkern/cross_entropy.h"

#define OP "cross_entropy"

lk_cross_entropy_args lk_cross_entropy_args_init(void) {
    lk_cross_entropy_args a = {0};
    a.reduction = LK_CE_MEAN;
    a.ignore_index = LK_CE_IGNORE_INDEX;
    return a;
}

static lk_status check_tensor(const lk_impl *impl, const char *arg, const lk_tensor *t, int need_data,
                              int min_ndim, unsigned dtypes) {
    lk_status s = lk_expect_operand(OP, impl->device, arg, t, need_data, min_ndim);
    return s ? s : lk_expect_dtype(OP, arg, t, dtypes);
}

/* A tensor of `want` elements (any shape: scalars may be [] or [1]). */
static lk_status check_numel(const char *arg, const lk_tensor *t, int64_t want) {
    if (lk_tensor_numel(t) != want)
        return lk_error(LK_ESHAPE, OP ": %s: expected %lld element%s, got %lld", arg, (long long)want,
                        want == 1 ? "" : "s", (long long)lk_tensor_numel(t));
    return LK_OK;
}

static lk_status check_options(const lk_cross_entropy_args *a) {
    if ((unsigned)a->reduction >= LK_CE_REDUCTION_COUNT)
        return lk_error(LK_EINVAL, OP ": reduction: expected mean, sum or none, got %d", (int)a->reduction);
    if (!(a->label_smoothing >= 0.0 && a->label_smoothing < 1.0))
        return lk_error(LK_EINVAL, OP ": label_smoothing: expected a value in [0, 1), got %g", a->label_smoothing);
    if (!(a->z_loss_scale >= 0.0) || !isfinite(a->z_loss_scale))
        return lk_error(LK_EINVAL, OP ": z_loss_scale: expected a finite value >= 0, got %g", a->z_loss_scale);
    if (!(a->softcap >= 0.0) || !isfinite(a->softcap))
        return lk_error(LK_EINVAL, OP ": softcap: expected 0 (none) or a finite value > 0, got %g", a->softcap);
    if (a->logits_to_keep < 0)
        return lk_error(LK_EINVAL, OP ": logits_to_keep: expected >= 0, got %lld", (long long)a->logits_to_keep);
    if (a->logits_to_keep > 0 && a->keep_indices.data)
        return lk_error(LK_EINVAL, OP ": logits_to_keep: expected 0 when keep_indices is given, got %lld",
                        (long long)a->logits_to_keep);
    return LK_OK;
}

/* Shapes, dtypes and options: everything the size queries need; data is not read. */
static lk_status check_shapes(const lk_impl *impl, const lk_cross_entropy_args *a, int need_data,
                              lk_cross_entropy_dims *d) {
    lk_status s;
    const unsigned ints = LK_DTYPE_BIT(LK_I32) | LK_DTYPE_BIT(LK_I64);
    int64_t T, H;
    if ((s = lk_expect_rows(OP, impl->device, "hidden", &a->hidden, need_data, 2, impl->needs.dtypes, &T, &H)))
        return s;
    if ((s = check_tensor(impl, "weight", &a->weight, need_data, 2, impl->needs.dtypes))) return s;
    if (a->weight.ndim != 2 || a->weight.shape[1] != H || a->weight.shape[0] < 1) {
        char b[96];
        return lk_error(LK_ESHAPE, OP ": weight: expected [V, %lld] with V >= 1 (H of hidden), got %s",
                        (long long)H, lk_shape_str(&a->weight, b, sizeof b));
    }
    if ((s = lk_expect_dtype_eq(OP, "weight", &a->weight, a->hidden.dtype))) return s;
    if ((s = check_tensor(impl, "labels", &a->labels, need_data, 1, ints)) || (s = check_numel("labels", &a->labels, T)))
        return s;
    if ((s = check_options(a))) return s;
    int64_t S = a->hidden.ndim >= 3 ? a->hidden.shape[a->hidden.ndim - 2] : T, K = T;
    if (a->keep_indices.data) {
        if ((s = check_tensor(impl, "keep_indices", &a->keep_indices, 1, 1, LK_DTYPE_BIT(LK_I64)))) return s;
        if (a->keep_indices.ndim != 1)
            return lk_error(LK_ESHAPE, OP ": keep_indices: expected 1 dim, got %d", a->keep_indices.ndim);
        K = a->keep_indices.shape[0];
        if (K > T)
            return lk_error(LK_ESHAPE, OP ": keep_indices: expected at most T = %lld indices, got %lld",
                            (long long)T, (long long)K);
    } else if (a->logits_to_keep > 0) {
        if (a->logits_to_keep > S)
            return lk_error(LK_ESHAPE, OP ": logits_to_keep: expected at most the sequence length %lld "
                            "(dim -2 of hidden, or T), got %lld", (long long)S, (long long)a->logits_to_keep);
        K = (S > 0 ? T / S : 0) * a->logits_to_keep;
    }
    int64_t V = a->weight.shape[0];
    size_t budget = a->chunk_bytes                         ? a->chunk_bytes
                    : impl->device == LK_DEVICE_CUDA ? LK_CE_DEFAULT_CHUNK_BYTES_CUDA
                                                     : LK_CE_DEFAULT_CHUNK_BYTES;
    int64_t C = (int64_t)(budget / ((size_t)V * sizeof(float)));
    if (C < 1) C = 1;
    if (C > K) C = K > 0 ? K : 1;
    *d = (lk_cross_entropy_dims){.tokens = T, .hidden = H, .vocab = V, .kept = K, .chunk = C,
                                 .dtype = a->hidden.dtype, .dweight_dtype = a->d_weight.dtype,
                                 .reduction = a->reduction, .fp32_lm_head = a->fp32_lm_head};
    return LK_OK;
}

/* What both passes check, data included: the index list and the label values. */
static lk_status check_common(const lk_impl *impl, const lk_cross_entropy_args *a, const lk_ctx *ctx,
                              const lk_cross_entropy_vtable **vt, lk_cross_entropy_dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_CROSS_ENTROPY);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    *vt = impl->vtable;
    if ((s = check_shapes(impl, a, 1, d))) return s;
    const int64_t *idx = a->keep_indices.data;
    int host = impl->device == LK_DEVICE_CPU;   /* values readable here (see the top) */
    for (int64_t k = 0; host && idx && k < d->kept; k++)
        if (idx[k] < 0 || idx[k] >= d->tokens || (k > 0 && idx[k] <= idx[k - 1]))
            return lk_error(LK_EINVAL, OP ": keep_indices: expected strictly increasing indices in [0, %lld), got "
                            "%lld at %lld", (long long)d->tokens, (long long)idx[k], (long long)k);
    /* only the scored tokens' labels are used, and checked */
    int64_t S = a->hidden.ndim >= 3 ? a->hidden.shape[a->hidden.ndim - 2] : d->tokens, N = a->logits_to_keep;
    for (int64_t k = 0; host && k < d->kept; k++) {
        int64_t t = idx ? idx[k] : N > 0 && !idx ? (k / N) * S + (S - N) + k % N : k;
        int64_t y = a->labels.dtype == LK_I32 ? ((const int32_t *)a->labels.data)[t]
                                              : ((const int64_t *)a->labels.data)[t];
        if (y != a->ignore_index && (y < 0 || y >= d->vocab))
            return lk_error(LK_EINVAL, OP ": labels: expected values in [0, %lld) or ignore_index %lld, got %lld "
                            "at token %lld", (long long)d->vocab, (long long)a->ignore_index, (long long)y,
                            (long long)t);
    }
    return lk_expect_saved(OP, "lk_cross_entropy_saved_bytes", &a->saved, (*vt)->saved_bytes(d));
}

/* Output `arg` must not share memory with the inputs, the saved block or another output. */
static lk_status expect_apart(const char *arg, const lk_tensor *t, const lk_cross_entropy_args *a) {
    const lk_region others[] = {
        {"hidden", a->hidden.data, lk_tensor_bytes(&a->hidden)},
        {"weight", a->weight.data, lk_tensor_bytes(&a->weight)},
        {"labels", a->labels.data, lk_tensor_bytes(&a->labels)},
        {"keep_indices", a->keep_indices.data, lk_tensor_bytes(&a->keep_indices)},
        {"saved", a->saved.data, a->saved.bytes},
        {"loss", a->loss.data, lk_tensor_bytes(&a->loss)},
        {"z_loss", a->z_loss.data, lk_tensor_bytes(&a->z_loss)},
        {"n_valid", a->n_valid.data, lk_tensor_bytes(&a->n_valid)},
        {"d_loss", a->d_loss.data, lk_tensor_bytes(&a->d_loss)},
        {"d_hidden", a->d_hidden.data, lk_tensor_bytes(&a->d_hidden)},
        {"d_weight", a->d_weight.data, lk_tensor_bytes(&a->d_weight)},
    };
    const lk_region out = {arg, t->data, lk_tensor_bytes(t)};
    lk_status s = LK_OK;
    for (size_t i = 0; !s && i < sizeof others / sizeof *others; i++)
        if (strcmp(others[i].name, arg) != 0) s = lk_expect_apart(OP, &out, 1, &others[i], 1);
    return s;
}

/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const lk_cross_entropy_vtable *vt, const lk_cross_entropy_dims *d, int backward,
                     const lk_cross_entropy_args *a, lk_ctx *ctx) {
    size_t mark, ws = vt->workspace_bytes ? vt->workspace_bytes(d, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? vt->backward(a, d, ctx) : vt->forward(a, d, ctx));
}

/* What the size queries check: impl, args, bytes, and the shapes (no data read). */
static lk_status query(const lk_impl *impl, const lk_cross_entropy_args *a, size_t *bytes,
                       const lk_cross_entropy_vtable **vt, lk_cross_entropy_dims *d) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_CROSS_ENTROPY);
    if (s) return s;
    *vt = impl->vtable;
    if (a == NULL) return lk_error(LK_EINVAL, OP ": args: expected arguments, got NULL");
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    return check_shapes(impl, a, 0, d);
}

lk_status lk_cross_entropy_saved_bytes(const lk_impl *impl, const lk_cross_entropy_args *a, size_t *bytes) {
    const lk_cross_entropy_vtable *vt = NULL;
    lk_cross_entropy_dims d;
    lk_status s = query(impl, a, bytes, &vt, &d);
    if (s) return s;
    *bytes = vt->saved_bytes(&d);
    return LK_OK;
}

lk_status lk_cross_entropy_workspace_bytes(const lk_impl *impl, const lk_cross_entropy_args *a, int backward,
                                           size_t *bytes) {
    const lk_cross_entropy_vtable *vt = NULL;
    lk_cross_entropy_dims d;
    lk_status s = query(impl, a, bytes, &vt, &d);
    if (s) return s;
    *bytes = vt->workspace_bytes ? vt->workspace_bytes(&d, backward) : 0;
    return LK_OK;
}

lk_status lk_cross_entropy_forward(const lk_impl *impl, const lk_cross_entropy_args *a, lk_ctx *ctx) {
    const lk_cross_entropy_vtable *vt = NULL;
    lk_cross_entropy_dims d;
    lk_status s = check_common(impl, a, ctx, &vt, &d);
    if (s) return s;
    int64_t per = a->reduction == LK_CE_NONE ? d.tokens : 1;
    if ((s = check_tensor(impl, "loss", &a->loss, 1, 0, LK_DTYPE_BIT(LK_F32))) ||
        (s = check_numel("loss", &a->loss, per)) || (s = expect_apart("loss", &a->loss, a)))
        return s;
    if (a->z_loss.data && ((s = check_tensor(impl, "z_loss", &a->z_loss, 1, 0, LK_DTYPE_BIT(LK_F32))) ||
                           (s = check_numel("z_loss", &a->z_loss, per)) || (s = expect_apart("z_loss", &a->z_loss, a))))
        return s;
    if (a->n_valid.data && ((s = check_tensor(impl, "n_valid", &a->n_valid, 1, 0, LK_DTYPE_BIT(LK_I64))) ||
                            (s = check_numel("n_valid", &a->n_valid, 1)) ||
                            (s = expect_apart("n_valid", &a->n_valid, a))))
        return s;
    lk_tensor sv = lk_tensor_1d(a->saved.data, LK_I32, 0);
    sv.shape[0] = (int64_t)(a->saved.bytes / 4);
    if ((s = expect_apart("saved", &sv, a))) return s;
    return run(vt, &d, 0, a, ctx);
}

lk_status lk_cross_entropy_backward(const lk_impl *impl, const lk_cross_entropy_args *a, lk_ctx *ctx) {
    const lk_cross_entropy_vtable *vt = NULL;
    lk_cross_entropy_dims d;
    lk_status s = check_common(impl, a, ctx, &vt, &d);
    if (s) return s;
    int64_t per = a->reduction == LK_CE_NONE ? d.tokens : 1;
    const int64_t wshape[2] = {d.vocab, d.hidden};
    if ((s = check_tensor(impl, "d_loss", &a->d_loss, 1, 0, LK_DTYPE_BIT(LK_F32))) ||
        (s = check_numel("d_loss", &a->d_loss, per)))
        return s;
    if ((s = check_tensor(impl, "d_hidden", &a->d_hidden, 1, 2, impl->needs.dtypes)) ||
        (s = lk_expect_like(OP, "d_hidden", &a->d_hidden, &a->hidden)) ||
        (s = expect_apart("d_hidden", &a->d_hidden, a)))
        return s;
    if ((s = check_tensor(impl, "d_weight", &a->d_weight, 1, 2,
                          LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(a->weight.dtype))) ||
        (s = lk_expect_shape(OP, "d_weight", &a->d_weight, 2, wshape)) ||
        (s = expect_apart("d_weight", &a->d_weight, a)))
        return s;
    const float *dl = a->d_loss.data;
    for (int64_t i = 0; impl->device == LK_DEVICE_CPU && i < per; i++)
        if (!isfinite(dl[i]))
            return lk_error(LK_EINVAL, OP ": d_loss: expected finite values, got %g at %lld", (double)dl[i],
                            (long long)i);
    return run(vt, &d, 1, a, ctx);
}
