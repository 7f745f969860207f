/* impls.c — the registry row of linear on the CPU, pointing at the vtable blas.c
 * defines. lk_init() registers this table (the registry's builtin list names it). */
#include "llmkern/linear.h"

extern const lk_linear_vtable lk_linear_blas_vtable;

const lk_impl lk_linear_impls[] = {
    {
        .op = LK_OP_LINEAR,
        .name = "blas",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16)},
        .vtable = &lk_linear_blas_vtable,
        .summary = "one CBLAS GEMM per product, bf16 widened to f32, f32 gradients accumulated",
    },
    {.name = NULL},
};
