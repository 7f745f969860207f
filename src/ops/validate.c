/* validate.c — the argument checks op facades share (see validate.h). */
#include <stdint.h>
#include <stdio.h>
#include "ops/validate.h"

static const char *dtype_list(unsigned mask, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < LK_DTYPE_COUNT && k < n; d++)
        if (mask & LK_DTYPE_BIT(d))
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? "|" : "", lk_dtype_name((lk_dtype)d));
    return buf;
}

lk_status lk_expect_present(const char *op, const char *arg, const lk_tensor *t) {
    if (t->data == NULL) return lk_error(LK_EINVAL, "%s: %s: expected a tensor, got NULL data", op, arg);
    return LK_OK;
}

lk_status lk_expect_dtype(const char *op, const char *arg, const lk_tensor *t, unsigned dtypes) {
    char buf[64];
    if ((unsigned)t->dtype >= LK_DTYPE_COUNT || !(dtypes & LK_DTYPE_BIT(t->dtype)))
        return lk_error(LK_EDTYPE, "%s: %s: expected dtype %s, got %s", op, arg,
                        dtype_list(dtypes, buf, sizeof buf), lk_dtype_name(t->dtype));
    return LK_OK;
}

lk_status lk_expect_dtype_eq(const char *op, const char *arg, const lk_tensor *t, lk_dtype want) {
    return lk_expect_dtype(op, arg, t, LK_DTYPE_BIT(want));
}

static lk_status expect_dims(const char *op, const char *arg, const lk_tensor *t, int min_ndim) {
    if (t->ndim < min_ndim || t->ndim > LK_MAX_DIMS)
        return lk_error(LK_ESHAPE, "%s: %s: expected at least %d dims (at most %d), got %d", op, arg,
                        min_ndim, LK_MAX_DIMS, t->ndim);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0)
            return lk_error(LK_ESHAPE, "%s: %s: expected sizes >= 0, got %lld in dim %d", op, arg,
                            (long long)t->shape[i], i);
    return LK_OK;
}

lk_status lk_expect_contiguous(const char *op, const char *arg, const lk_tensor *t, int min_ndim) {
    lk_status s = expect_dims(op, arg, t, min_ndim);
    if (s) return s;
    if (!lk_tensor_is_contiguous(t))
        return lk_error(LK_ESHAPE, "%s: %s: expected a contiguous row-major tensor, got strides "
                        "that are not", op, arg);
    return LK_OK;
}

lk_status lk_expect_shape(const char *op, const char *arg, const lk_tensor *t, int ndim,
                          const int64_t *shape) {
    lk_tensor want = lk_tensor_view(NULL, t->dtype, ndim, shape);
    if (!lk_tensor_same_shape(t, &want)) {
        char a[96], b[96];
        return lk_error(LK_ESHAPE, "%s: %s: expected shape %s, got %s", op, arg,
                        lk_shape_str(&want, a, sizeof a), lk_shape_str(t, b, sizeof b));
    }
    return LK_OK;
}

lk_status lk_expect_like(const char *op, const char *arg, const lk_tensor *t, const lk_tensor *like) {
    lk_status s = lk_expect_shape(op, arg, t, like->ndim, like->shape);
    return s ? s : lk_expect_dtype_eq(op, arg, t, like->dtype);
}

lk_status lk_expect_device(const char *op, const char *arg, const lk_tensor *t, lk_device_type dev) {
    if (t->device.type != dev)
        return lk_error(LK_EDEVICE, "%s: %s: expected a %s tensor, got %s", op, arg,
                        lk_device_name(dev), lk_device_name(t->device.type));
    return LK_OK;
}

lk_status lk_expect_operand(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                            int min_ndim) {
    lk_status s;
    if ((need_data && (s = lk_expect_present(op, arg, t))) || (s = lk_expect_device(op, arg, t, dev))) return s;
    return lk_expect_contiguous(op, arg, t, min_ndim);
}

lk_status lk_expect_tensor(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int ndim,
                           const int64_t *shape, unsigned dtypes) {
    lk_status s;
    if ((s = lk_expect_operand(op, dev, arg, t, 1, 1)) || (s = lk_expect_shape(op, arg, t, ndim, shape))) return s;
    return lk_expect_dtype(op, arg, t, dtypes);
}

lk_status lk_expect_saved(const char *op, const char *query, const lk_saved *saved, size_t need) {
    if (need == 0 || (saved->data != NULL && saved->bytes >= need)) return LK_OK;
    return lk_error(LK_EINVAL, "%s: saved: expected %zu bytes (%s), got %zu%s", op, need, query, saved->bytes,
                    saved->data ? "" : " and NULL data");
}

lk_status lk_expect_call(const char *op, const lk_impl *impl, const void *args, const lk_ctx *ctx) {
    if (args == NULL) return lk_error(LK_EINVAL, "%s: args: expected arguments, got NULL", op);
    if (ctx == NULL) return lk_error(LK_EINVAL, "%s: ctx: expected a context, got NULL", op);
    if (ctx->device.type != impl->device)
        return lk_error(LK_EDEVICE, "%s: ctx.device: expected %s for '%s', got %s", op, lk_device_name(impl->device),
                        impl->name, lk_device_name(ctx->device.type));
    return LK_OK;
}

lk_status lk_expect_tensor_like(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t,
                                const lk_tensor *like, int min_ndim) {
    lk_status s = lk_expect_operand(op, dev, arg, t, 1, min_ndim);
    return s ? s : lk_expect_like(op, arg, t, like);
}

lk_status lk_expect_rows(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                         int min_ndim, unsigned dtypes, int64_t *rows, int64_t *len) {
    lk_status s;
    if ((s = lk_expect_operand(op, dev, arg, t, need_data, min_ndim)) || (s = lk_expect_dtype(op, arg, t, dtypes)))
        return s;
    *len = t->shape[t->ndim - 1];
    if (*len < 1) return lk_error(LK_ESHAPE, "%s: %s: expected a last dim >= 1, got %lld", op, arg, (long long)*len);
    *rows = lk_tensor_numel(t) / *len;
    return LK_OK;
}

static const char *strides_str(const lk_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)t->stride[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

lk_status lk_expect_row_view(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                             int min_ndim, lk_rows *m) {
    lk_status s;
    if ((need_data && (s = lk_expect_present(op, arg, t))) || (s = lk_expect_device(op, arg, t, dev)) ||
        (s = expect_dims(op, arg, t, min_ndim)))
        return s;
    char buf[96];
    for (int i = 0; i < t->ndim; i++)
        if (t->stride[i] < 0 || (t->stride[i] == 0 && t->shape[i] > 1))
            return lk_error(LK_ESHAPE, "%s: %s: expected strides > 0, got %s", op, arg, strides_str(t, buf, sizeof buf));
    if (!lk_rows_of(t, m))
        return lk_error(LK_ESHAPE, "%s: %s: expected rows with a contiguous last dim whose leading dims fold into "
                        "at most two strided levels, got strides %s", op, arg, strides_str(t, buf, sizeof buf));
    /* the rows apart: the level of the smaller step walks past a row, the other past the
     * whole of that level (one level: rows outer apart) */
    const int64_t n = t->shape[t->ndim - 1], rows = n ? lk_tensor_numel(t) / n : 0;
    int64_t small = m->outer, big = 0, count = 0;
    if (m->inner > 1) {
        const int inner_small = m->step < m->outer;
        small = inner_small ? m->step : m->outer, big = inner_small ? m->outer : m->step;
        count = inner_small ? m->inner : rows / m->inner;
    }
    if (rows > 1 && (small < n || big < count * small))
        return lk_error(LK_ESHAPE, "%s: %s: expected rows that do not overlap, got strides %s for rows of %lld", op,
                        arg, strides_str(t, buf, sizeof buf), (long long)n);
    return LK_OK;
}

lk_status lk_expect_view(const char *op, lk_device_type dev, const char *arg, const lk_tensor *t, int need_data,
                         int min_ndim) {
    lk_status s;
    if ((need_data && (s = lk_expect_present(op, arg, t))) || (s = lk_expect_device(op, arg, t, dev)) ||
        (s = expect_dims(op, arg, t, min_ndim)))
        return s;
    if (lk_tensor_is_contiguous(t)) return LK_OK;
    char buf[96];
    const int last = t->ndim - 1;
    if (t->shape[last] > 1 && t->stride[last] != 1)
        return lk_error(LK_ESHAPE, "%s: %s: expected a contiguous last dim (stride 1), got strides %s", op, arg,
                        strides_str(t, buf, sizeof buf));
    /* the dims of more than one element by stride, smallest first: each must step past
     * everything the smaller ones span */
    int order[LK_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 1) continue;
        int j = n++;
        while (j > 0 && t->stride[order[j - 1]] > t->stride[i]) order[j] = order[j - 1], j--;
        order[j] = i;
    }
    int64_t span = 1;   /* elements the smaller dims cover, from the first to one past the last */
    for (int j = 0; j < n; j++) {
        const int i = order[j];
        char sh[96];
        if (t->stride[i] < span)
            return lk_error(LK_ESHAPE, "%s: %s: expected elements apart (each stride at least the extent of the "
                            "smaller ones), got shape %s with strides %s", op, arg, lk_shape_str(t, sh, sizeof sh),
                            strides_str(t, buf, sizeof buf));
        span = t->stride[i] * (t->shape[i] - 1) + span;
    }
    return LK_OK;
}

lk_status lk_workspace_done(lk_ctx *ctx, size_t mark, lk_status pass) {
    lk_ctx_workspace_end(ctx, mark);
    return pass;
}

lk_region lk_tensor_region(const char *name, const lk_tensor *t) {
    return (lk_region){name, t->data, t->data ? lk_tensor_span_bytes(t) : 0};
}

static int overlap(const lk_region *a, const lk_region *b) {
    uintptr_t pa = (uintptr_t)a->p, pb = (uintptr_t)b->p;
    return a->p && b->p && a->bytes && b->bytes && pa < pb + b->bytes && pb < pa + a->bytes;
}

lk_status lk_expect_apart(const char *op, const lk_region *outs, int n_outs, const lk_region *ins, int n_ins) {
    for (int i = 0; i < n_outs; i++) {
        for (int j = i + 1; j < n_outs; j++)
            if (overlap(&outs[i], &outs[j]))
                return lk_error(LK_EINVAL, "%s: %s: expected memory apart from %s, got an overlap", op,
                                outs[i].name, outs[j].name);
        for (int j = 0; j < n_ins; j++)
            if (overlap(&outs[i], &ins[j]))
                return lk_error(LK_EINVAL, "%s: %s: expected memory apart from %s, got an overlap", op,
                                outs[i].name, ins[j].name);
    }
    return LK_OK;
}
