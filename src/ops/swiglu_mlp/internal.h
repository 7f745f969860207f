/* internal.h — what the SwiGLU MLP's implementations (eager.c, fused.c, fused_cuda.c)
 * share: the call's dims, read from args the facade (swiglu_mlp.c) has validated. */
#ifndef LLMKERN_SWIGLU_MLP_INTERNAL_H
#define LLMKERN_SWIGLU_MLP_INTERNAL_H

#include "llmkern/swiglu_mlp.h"

typedef struct {
    int64_t t, h, i;   /* tokens (x's leading dims flattened), hidden, intermediate */
    lk_dtype dt;       /* x's, and every operand's storage */
    size_t es;         /* its element size */
} lk_swiglu_mlp_dims;

static inline lk_swiglu_mlp_dims lk_swiglu_mlp_dims_of(const lk_swiglu_mlp_args *a) {
    lk_swiglu_mlp_dims d = {.h = a->x.shape[a->x.ndim - 1], .i = a->gate_up_weight.shape[0] / 2, .dt = a->x.dtype};
    d.t = lk_tensor_numel(&a->x) / d.h;
    d.es = lk_dtype_size(d.dt);
    return d;
}

#endif
