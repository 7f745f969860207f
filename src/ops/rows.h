/* rows.h — where row r of a [..., n] view lies, for the ops that work along rows (RMSNorm):
 * the last dim contiguous, the leading dims any strides that fold into at most two levels,
 * so row r starts at element (r / inner)·outer + (r % inner)·step. A contiguous tensor is
 * inner 1, outer n. Two levels are what a decoder's heads need without a copy: q as
 * [T, H, D] read out of the [T, Q + 2K] projection (strides Q + 2K, D, 1) and written
 * head-major into [H, T, D] (strides D, T·D, 1). Host C and CUDA device code alike. */
#ifndef LLMKERN_ROWS_H
#define LLMKERN_ROWS_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __CUDACC__
#define LK_ROWS_FN __host__ __device__ __forceinline__
#else
#define LK_ROWS_FN static inline
#endif

typedef struct {
    int64_t inner, outer, step;
} lk_rows;

/* The first element of row r. Past 2^31 rows or an inner count that large the division
 * is 64-bit; below, 32-bit (the common case on the GPU, where it costs ~20 instructions
 * a row against ~70). */
LK_ROWS_FN int64_t lk_row_at(lk_rows m, int64_t r) {
    if (m.inner == 1) return r * m.outer;
    if (r <= INT32_MAX && m.inner <= INT32_MAX) {
        const uint32_t q = (uint32_t)r / (uint32_t)m.inner;
        return (int64_t)q * m.outer + (r - (int64_t)q * m.inner) * m.step;
    }
    return (r / m.inner) * m.outer + (r % m.inner) * m.step;
}

/* t's rows as above: 1 when its last dim is contiguous and its leading dims (those of
 * size 1 dropped, neighbours merged where they lie back to back) are at most two; 0 else. */
static inline int lk_rows_of(const lk_tensor *t, lk_rows *m) {
    int64_t size[LK_MAX_DIMS], stride[LK_MAX_DIMS];
    int k = 0;
    if (t->ndim < 1 || (t->shape[t->ndim - 1] > 1 && t->stride[t->ndim - 1] != 1)) return 0;
    for (int i = 0; i < t->ndim - 1; i++) {
        if (t->shape[i] == 1) continue;
        if (k && stride[k - 1] == t->shape[i] * t->stride[i]) {
            size[k - 1] *= t->shape[i], stride[k - 1] = t->stride[i];
        } else {
            size[k] = t->shape[i], stride[k++] = t->stride[i];
        }
    }
    const int64_t n = t->shape[t->ndim - 1];
    if (k > 2) return 0;
    *m = k == 0 ? (lk_rows){1, n, 0} : k == 1 ? (lk_rows){1, stride[0], 0} : (lk_rows){size[1], stride[0], stride[1]};
    return 1;
}

#endif
