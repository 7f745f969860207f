/* impls.c — the registry rows of the SwiGLU MLP on the CPU (and CUDA when built with it),
 * each pointing at the vtable its own file defines. lk_init() registers this table. */
#include "llmkern/swiglu_mlp.h"

extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_eager_vtable;
extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_cuda_fused_vtable;   /* fused_cuda.c + act.cu */
#endif

#define SWIGLU_CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_swiglu_mlp_impls[] = {
    {
        .op = LK_OP_SWIGLU_MLP,
        .name = "eager",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = SWIGLU_CPU_DTYPES},
        .vtable = &lk_swiglu_mlp_eager_vtable,
        .summary = "autograd's composition: gate and up GEMMs, every intermediate materialized and saved",
    },
    {
        .op = LK_OP_SWIGLU_MLP,
        .name = "fused",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = SWIGLU_CPU_DTYPES},
        .vtable = &lk_swiglu_mlp_fused_vtable,
        .summary = "one gate_up GEMM, fused activation, saves only gate_up, token chunks",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_SWIGLU_MLP,
        .name = "fused",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = SWIGLU_CPU_DTYPES},
        .vtable = &lk_swiglu_mlp_cuda_fused_vtable,
        .summary = "cuBLAS GEMMs (f32 accumulation), fused activation kernel each way, saves only gate_up",
    },
#endif
    {.name = NULL},
};
