/* impls.c — the registry rows of the MoE router and experts on the CPU, and the CUDA
 * `softmax_topk` router and `fused` experts in a CUDA build, one per implementation, each
 * pointing at the vtable its own file defines. lk_init() registers both tables. The
 * design's other CUDA experts (fused_sm90 alias fused_quack, fused_cublas) and CUDA
 * routers (sigmoid_bias, fake_balanced) do not exist yet: asked for, they are "not
 * available in this build". */
#include "llmkern/moe.h"

extern const lk_moe_router_vtable lk_moe_router_softmax_topk_vtable;
extern const lk_moe_router_vtable lk_moe_router_sigmoid_bias_vtable;
extern const lk_moe_router_vtable lk_moe_router_fake_balanced_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_eager_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_moe_router_vtable lk_moe_router_cuda_softmax_topk_vtable;   /* router_cuda.c */
extern const lk_moe_experts_vtable lk_moe_experts_cuda_fused_vtable;   /* fused.cu */
#endif

#define MOE_CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_moe_router_impls[] = {
    {
        .op = LK_OP_MOE_ROUTER, .name = "softmax_topk", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_router_softmax_topk_vtable,
        .summary = "softmax over experts then top-k (Qwen3-MoE), optionally renormalized",
    },
    {
        .op = LK_OP_MOE_ROUTER, .name = "sigmoid_bias", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_router_sigmoid_bias_vtable,
        .summary = "sigmoid scores, selection-only bias, group-limited top-k (DeepSeek-V3)",
    },
    {
        .op = LK_OP_MOE_ROUTER, .name = "fake_balanced", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_router_fake_balanced_vtable,
        .summary = "benchmark gate: (t*k+j) mod E, or content-seeded noisy routing",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_MOE_ROUTER, .name = "softmax_topk", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_router_cuda_softmax_topk_vtable,
        .summary = "the CPU softmax_topk on the GPU: cuBLASLt logits, a warp a token, deterministic aux loss",
    },
#endif
    {.name = NULL},
};

const lk_impl lk_moe_experts_impls[] = {
    {
        .op = LK_OP_MOE_EXPERTS, .name = "eager", .device = LK_DEVICE_CPU,
        .needs = {.dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_experts_eager_vtable,
        .summary = "per-expert loop: scan, gather, gate_up and down GEMMs, weighted index_add",
    },
    {
        .op = LK_OP_MOE_EXPERTS, .name = "fused", .aliases = (const char *const[]){"fused_triton", NULL},
        .device = LK_DEVICE_CPU, .needs = {.dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_experts_fused_vtable,
        .summary = "one counting-sort permutation, grouped GEMMs over expert-sorted rows, f32 un-permute",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_MOE_EXPERTS, .name = "fused", .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = MOE_CPU_DTYPES}, .vtable = &lk_moe_experts_cuda_fused_vtable,
        .summary = "the CPU fused layout on the GPU: one permutation, a cuBLASLt GEMM per expert, f32 un-permute",
    },
#endif
    {.name = NULL},
};
