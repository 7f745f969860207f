/* def.c — the descriptors of the folder's two ops (src/ops/op_def.h): lk_moe_router_def
 * and lk_moe_experts_def, each with its catalog entry, its registry rows on the CPU and,
 * built with CUDA, every router (softmax_topk, sigmoid_bias, fake_balanced) and the
 * `fused` and `fused_sm90` (alias fused_quack: fused.cu's layer on grouped_sm90.cu's wgmma
 * grouped GEMM, which `fused` also takes on an sm_90 GPU) experts on the GPU (each row
 * pointing at the vtable its own file defines), its harness and the members its vtables
 * must have. The design's fused_cublas experts do not exist yet: asked for, they are "not
 * available in this build". */
#include <stdio.h>
#include "llmkern/moe.h"
#include "ops/op_def.h"

extern const lk_moe_router_vtable lk_moe_router_softmax_topk_vtable;
extern const lk_moe_router_vtable lk_moe_router_sigmoid_bias_vtable;
extern const lk_moe_router_vtable lk_moe_router_fake_balanced_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_eager_vtable;
extern const lk_moe_experts_vtable lk_moe_experts_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_moe_router_vtable lk_moe_router_cuda_softmax_topk_vtable;   /* router_cuda.c */
extern const lk_moe_router_vtable lk_moe_router_cuda_sigmoid_bias_vtable;   /* router_cuda.c */
extern const lk_moe_router_vtable lk_moe_router_cuda_fake_balanced_vtable;  /* fake_balanced.cu */
extern const lk_moe_experts_vtable lk_moe_experts_cuda_fused_vtable;   /* fused.cu */
extern const lk_moe_experts_vtable lk_moe_experts_cuda_fused_sm90_vtable;   /* fused.cu on grouped_sm90.cu */

/* grouped_sm90.cu is sm_90a machine code: it runs on compute capability 9.0 alone. */
static int sm90_exactly(const lk_hw *hw, char *why, size_t n) {
    if (hw->cuda_cc == 90) return 1;
    snprintf(why, n, "needs an sm_90 GPU (its wgmma/TMA code is sm_90a), this one is sm_%d", hw->cuda_cc);
    return 0;
}
#endif
extern const lk_harness lk_moe_router_harness, lk_moe_experts_harness;

static const lk_impl router_rows[] = {
    {.op = LK_OP_MOE_ROUTER, .name = "softmax_topk", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_router_softmax_topk_vtable,
     .summary = "softmax over experts then top-k (Qwen3-MoE), optionally renormalized"},
    {.op = LK_OP_MOE_ROUTER, .name = "sigmoid_bias", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_router_sigmoid_bias_vtable,
     .summary = "sigmoid scores, selection-only bias, group-limited top-k (DeepSeek-V3)"},
    {.op = LK_OP_MOE_ROUTER, .name = "fake_balanced", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_router_fake_balanced_vtable,
     .summary = "benchmark gate: (t*k+j) mod E, or content-seeded noisy routing"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_MOE_ROUTER, .name = "softmax_topk", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_moe_router_cuda_softmax_topk_vtable,
     .summary = "the CPU softmax_topk on the GPU: cuBLASLt logits, a warp a token, deterministic aux loss"},
    {.op = LK_OP_MOE_ROUTER, .name = "sigmoid_bias", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_moe_router_cuda_sigmoid_bias_vtable,
     .summary = "the CPU sigmoid_bias on the GPU: cuBLASLt logits, group-limited top-k a warp a token"},
    {.op = LK_OP_MOE_ROUTER, .name = "fake_balanced", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_moe_router_cuda_fake_balanced_vtable,
     .summary = "the CPU fake_balanced on the GPU, bit for bit: content-seeded noise, no host read"},
#endif
    {.name = NULL},
};

static const lk_impl experts_rows[] = {
    {.op = LK_OP_MOE_EXPERTS, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_moe_experts_eager_vtable,
     .summary = "per-expert loop: scan, gather, gate_up and down GEMMs, weighted index_add"},
    {.op = LK_OP_MOE_EXPERTS, .name = "fused", .aliases = (const char *const[]){"fused_triton", NULL},
     .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16}, .vtable = &lk_moe_experts_fused_vtable,
     .summary = "one counting-sort permutation, grouped GEMMs over expert-sorted rows, f32 un-permute"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_MOE_EXPERTS, .name = "fused", .device = LK_DEVICE_CUDA, .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_moe_experts_cuda_fused_vtable,
     .summary = "the CPU fused layout on the GPU: routing on the device, grouped GEMMs (wgmma on sm_90, else mma.sync), "
                "SwiGLU epilogue, no host sync"},
    {.op = LK_OP_MOE_EXPERTS, .name = "fused_sm90", .aliases = (const char *const[]){"fused_quack", NULL},
     .device = LK_DEVICE_CUDA, .needs = {.min_cc = 90, .dtypes = LK_DTYPE_BIT(LK_BF16)}, .supported = sm90_exactly,
     .vtable = &lk_moe_experts_cuda_fused_sm90_vtable,
     .summary = "fused on Hopper's grouped GEMM by name: TMA + cp.async-gathered rows, wgmma 128x256 tiles, a "
                "persistent walk of the device tile list (weight gradients on mma.sync)"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(router_lacks, lk_moe_router_vtable)
LK_DEFINE_LACKS_PASSES(experts_lacks, lk_moe_experts_vtable)

const lk_op_def lk_moe_router_def = {
    .info = {
        .op = LK_OP_MOE_ROUTER, .name = "moe_router", .field = "moe.router",
        .known = LK_NAMES("softmax_topk", "sigmoid_bias", "fake_balanced"),
        .reference = "softmax_topk", .default_fused = "softmax_topk", .default_plain = "softmax_topk",
    },
    .impls = router_rows, .harness = &lk_moe_router_harness, .vtable_lacks = router_lacks,
};

const lk_op_def lk_moe_experts_def = {
    .info = {
        .op = LK_OP_MOE_EXPERTS, .name = "moe_experts", .field = "moe_implementation",
        .known = LK_NAMES("eager", "fused", "fused_triton", "fused_sm90", "fused_quack", "fused_cublas"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        .aliases = LK_ALIASES(
            LK_NEMO_SAME("torch", "eager"), LK_NEMO_SAME("torch_mm", "fused"), LK_NEMO_SAME("gmm", "fused"),
            LK_NEMO_NOT_HERE("te", "Transformer Engine's GroupedLinear", LK_EVERYWHERE("fused")),
            LK_NEMO_NOT_HERE("torch_mm_mxfp8", "torchao's MXFP8 grouped GEMM", LK_EVERYWHERE("fused"))),
    },
    .impls = experts_rows, .harness = &lk_moe_experts_harness,
    .name_needs = LK_NEEDS({"fused_sm90", "a Hopper GPU (sm_90) and CUDA"},
                           {"fused_quack", "a Hopper GPU (sm_90) and CUDA"},
                           {"fused_cublas", "a CUDA GPU and cuBLAS"}),
    .vtable_lacks = experts_lacks,
};
