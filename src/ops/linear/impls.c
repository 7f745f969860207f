/* impls.c — the registry rows of linear: blas on the CPU, and cublaslt on CUDA when built
 * with it, each pointing at the vtable its own file defines. lk_init() registers this
 * table (the registry's builtin list names it). */
#include "llmkern/linear.h"

extern const lk_linear_vtable lk_linear_blas_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_linear_vtable lk_linear_cublaslt_vtable;   /* cublaslt_cuda.c + colsum.cu */
#endif

const lk_impl lk_linear_impls[] = {
    {
        .op = LK_OP_LINEAR,
        .name = "blas",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16)},
        .vtable = &lk_linear_blas_vtable,
        .summary = "one CBLAS GEMM per product, bf16 widened to f32, f32 gradients accumulated",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_LINEAR,
        .name = "cublaslt",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16)},
        .vtable = &lk_linear_cublaslt_vtable,
        .summary = "cuBLASLt matmuls with a cached heuristic plan per shape, bias epilogue, f32 accumulation",
    },
#endif
    {.name = NULL},
};
