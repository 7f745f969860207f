/* ops.c — the catalog: every op the design names, its config field, every
 * implementation name users of the described system write (built here or not), its
 * reference implementation and its built-in defaults. A name in `known` that no
 * registered implementation carries is "not available in this build", never "unknown". */
#include <string.h>
#include "llmkern/registry.h"

#define NAMES(...) (const char *const[]){__VA_ARGS__, NULL}

static const lk_op_info ops[LK_OP_COUNT] = {
    [LK_OP_ATTENTION] = {
        .op = LK_OP_ATTENTION, .name = "attention", .field = "attn_implementation",
        .known = NAMES("eager", "sdpa", "flash_attention_2", "flash_attention_3",
                       "flash_attention_4", "flex_attention", "cudnn", "native-sparse",
                       "llmkern_flash_attention_2_with_sp", "llmkern_flash_attention_3_with_sp",
                       "llmkern_flash_attention_4_with_sp", "llmkern_flex_attention_with_sp"),
        .reference = "eager", .default_fused = "flash_attention_2", .default_plain = "flash_attention_2",
        .gpu_defaults = (const lk_gpu_default[]){{90, "flash_attention_3"}, {80, "flash_attention_2"}, {0, NULL}},
    },
    [LK_OP_CROSS_ENTROPY] = {
        .op = LK_OP_CROSS_ENTROPY, .name = "cross_entropy",
        .field = "cross_entropy_loss_implementation",
        .known = NAMES("eager", "fused", "chunk_loss"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_RMS_NORM] = {
        .op = LK_OP_RMS_NORM, .name = "rms_norm", .field = "rms_norm_implementation",
        .known = NAMES("eager", "eager_fp32", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_ROPE] = {
        .op = LK_OP_ROPE, .name = "rope", .field = "rotary_pos_emb_implementation",
        .known = NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_SWIGLU_MLP] = {
        .op = LK_OP_SWIGLU_MLP, .name = "swiglu_mlp", .field = "swiglu_mlp_implementation",
        .known = NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_MOE_EXPERTS] = {
        .op = LK_OP_MOE_EXPERTS, .name = "moe_experts", .field = "moe_implementation",
        .known = NAMES("eager", "fused", "fused_triton", "fused_sm90", "fused_quack", "fused_cublas"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    [LK_OP_MOE_ROUTER] = {
        .op = LK_OP_MOE_ROUTER, .name = "moe_router", .field = "moe.router",
        .known = NAMES("softmax_topk", "sigmoid_bias", "fake_balanced"),
        .reference = "softmax_topk", .default_fused = "softmax_topk", .default_plain = "softmax_topk",
    },
    [LK_OP_MOE_DISPATCH] = {
        .op = LK_OP_MOE_DISPATCH, .name = "moe_dispatch", .field = "moe.dispatcher",
        .known = NAMES("local", "alltoall", "allgather"),
        .reference = "local", .default_fused = "local", .default_plain = "local",
    },
    [LK_OP_LINEAR] = {
        .op = LK_OP_LINEAR, .name = "linear", .field = "linear_implementation",
        .known = NAMES("blas", "cublaslt"),
        .reference = "blas", .default_fused = "blas", .default_plain = "blas",
    },
};

/* What the names this build may lack need, so a request for one can say so. */
static const struct { lk_op op; const char *name, *needs; } requirements[] = {
    {LK_OP_ATTENTION, "flash_attention_3", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_ATTENTION, "llmkern_flash_attention_3_with_sp", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_ATTENTION, "flash_attention_4", "a Blackwell GPU (sm_100) and CUDA"},
    {LK_OP_ATTENTION, "llmkern_flash_attention_4_with_sp", "a Blackwell GPU (sm_100) and CUDA"},
    {LK_OP_ATTENTION, "cudnn", "a CUDA GPU, cuDNN 9 and the cudnn-frontend headers at build time"},
    {LK_OP_MOE_EXPERTS, "fused_sm90", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_MOE_EXPERTS, "fused_quack", "a Hopper GPU (sm_90) and CUDA"},
    {LK_OP_MOE_EXPERTS, "fused_cublas", "a CUDA GPU and cuBLAS"},
    {LK_OP_LINEAR, "cublaslt", "a CUDA GPU and cuBLASLt"},
};

const char *lk_op_name_needs(lk_op op, const char *name) {
    for (size_t i = 0; name && i < sizeof requirements / sizeof *requirements; i++)
        if (requirements[i].op == op && strcmp(requirements[i].name, name) == 0) return requirements[i].needs;
    return NULL;
}

const lk_op_info *lk_op_info_get(lk_op op) {
    return (unsigned)op < LK_OP_COUNT ? &ops[op] : NULL;
}

lk_status lk_op_parse(const char *name, lk_op *out) {
    for (int i = 0; name && i < LK_OP_COUNT; i++)
        if (strcmp(name, ops[i].name) == 0 || strcmp(name, ops[i].field) == 0) {
            *out = (lk_op)i;
            return LK_OK;
        }
    return lk_error(LK_EINVAL, "op: expected one of attention, cross_entropy, rms_norm, rope, "
                    "swiglu_mlp, moe_experts, moe_router, moe_dispatch, linear (or their config "
                    "fields), got '%s'", name ? name : "(null)");
}

const char *lk_source_name(lk_source s) {
    static const char *const n[] = {"default", "env", "config", "override"};
    return (unsigned)s < 4 ? n[s] : "?";
}

const char *lk_stage_name(lk_stage s) {
    static const char *const n[] = {"init", "model_register", "config_finalize", "model_build",
                                    "runtime"};
    return (unsigned)s < 5 ? n[s] : "?";
}
