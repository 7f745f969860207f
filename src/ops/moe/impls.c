/* impls.c — the registry rows of the MoE router and experts on the CPU, one per
 * implementation, each pointing at the vtable its own file defines. lk_init() registers
 * both tables. The CUDA experts (fused_sm90 alias fused_quack, fused_cublas) are rows of
 * the CUDA build, not of this one: asked for here, they are "not available in this build". */
#include "llmkern/moe.h"

extern const lk_moe_router_vtable lk_moe_router_softmax_topk_vtable;
extern const lk_moe_router_vtable lk_moe_router_sigmoid_bias_vtable;
extern const lk_moe_router_vtable lk_moe_router_fake_balanced_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_eager_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_fused_vtable;

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
    {.name = NULL},
};
