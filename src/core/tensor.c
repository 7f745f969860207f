/* tensor.c — building and describing lk_tensor views. */
#include <stdio.h>
#include "llmkern/tensor.h"

lk_tensor lk_tensor_view(void *data, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor t = {.data = data, .dtype = dt, .device = {LK_DEVICE_CPU, 0}, .ndim = ndim};
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = stride;
        stride *= shape[i];
    }
    return t;
}

lk_tensor lk_tensor_1d(void *data, lk_dtype dt, int64_t n) {
    return lk_tensor_view(data, dt, 1, &n);
}

lk_tensor lk_tensor_2d(void *data, lk_dtype dt, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return lk_tensor_view(data, dt, 2, shape);
}

int64_t lk_tensor_numel(const lk_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t lk_tensor_bytes(const lk_tensor *t) {
    return (size_t)lk_tensor_numel(t) * lk_dtype_size(t->dtype);
}

size_t lk_tensor_span_bytes(const lk_tensor *t) {
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return (size_t)(last + 1) * lk_dtype_size(t->dtype);
}

int lk_tensor_is_contiguous(const lk_tensor *t) {
    int64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != stride) return 0;
        stride *= t->shape[i];
    }
    return 1;
}

int lk_tensor_same_shape(const lk_tensor *a, const lk_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *lk_shape_str(const lk_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}
