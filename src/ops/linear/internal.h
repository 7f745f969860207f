/* internal.h — what linear's implementations (blas.c, cublaslt_cuda.c) share: the call's
 * dims, read from args the facade (linear.c) has validated. */
#ifndef LLMKERN_LINEAR_INTERNAL_H
#define LLMKERN_LINEAR_INTERNAL_H

#include "llmkern/linear.h"

typedef struct {
    int64_t rows, in, out;   /* x [rows, in] (its leading dims flattened), weight [out, in] */
    lk_dtype dt;             /* x's, and every operand's storage */
} lk_linear_dims;

static inline lk_linear_dims lk_linear_dims_of(const lk_linear_args *a) {
    lk_linear_dims d = {.in = a->x.shape[a->x.ndim - 1], .out = a->weight.shape[0], .dt = a->x.dtype};
    d.rows = lk_tensor_numel(&a->x) / d.in;
    return d;
}

#endif
