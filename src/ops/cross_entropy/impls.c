/* impls.c — the registry rows of cross-entropy on the CPU (and CUDA when built with it):
 * one row per implementation, each pointing at the vtable its own file defines.
 * lk_init() registers this table. */
#include "llmkern/cross_entropy.h"

extern const lk_cross_entropy_vtable lk_cross_entropy_eager_vtable;
extern const lk_cross_entropy_vtable lk_cross_entropy_fused_vtable;
extern const lk_cross_entropy_vtable lk_cross_entropy_chunk_loss_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_cross_entropy_vtable lk_cross_entropy_cuda_fused_vtable;   /* fused_cuda.c + fused.cu */
#endif

#define CE_CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_cross_entropy_impls[] = {
    {
        .op = LK_OP_CROSS_ENTROPY,
        .name = "eager",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CE_CPU_DTYPES},
        .vtable = &lk_cross_entropy_eager_vtable,
        .summary = "autograd of the unfused composition: [T, V] logits, log-softmax and dlogits materialized",
    },
    {
        .op = LK_OP_CROSS_ENTROPY,
        .name = "fused",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CE_CPU_DTYPES},
        .vtable = &lk_cross_entropy_fused_vtable,
        .summary = "LM head + CE by chunks (memory budget), gradients made in the forward (Liger-style)",
    },
    {
        .op = LK_OP_CROSS_ENTROPY,
        .name = "chunk_loss",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = CE_CPU_DTYPES},
        .vtable = &lk_cross_entropy_chunk_loss_vtable,
        .summary = "LM head + CE by chunks, saves the log-sum-exp only, backward recomputes each chunk",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_CROSS_ENTROPY,
        .name = "fused",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = CE_CPU_DTYPES},
        .vtable = &lk_cross_entropy_cuda_fused_vtable,
        .summary = "cuBLASLt LM head by chunks, one online-softmax + loss + gradient kernel per chunk, f32 dW",
    },
#endif
    {.name = NULL},
};
