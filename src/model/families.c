/* families.c — the model families llmkern knows: their modules and which fused
 * replacements apply (as each model's gpu_patch does in the described system).
 * lk_model_register() is called with one of these before a model is built. */
#include "llmkern/model.h"

#define FUSED(op) (1u << (op))

static const lk_module_decl qwen3_modules[] = {
    {"embed_tokens", LK_OP_LINEAR},
    {"layers.*.input_layernorm", LK_OP_RMS_NORM},
    {"layers.*.self_attn", LK_OP_ATTENTION},
    {"layers.*.self_attn.q_norm", LK_OP_RMS_NORM},
    {"layers.*.self_attn.k_norm", LK_OP_RMS_NORM},
    {"layers.*.self_attn.rotary_emb", LK_OP_ROPE},
    {"layers.*.post_attention_layernorm", LK_OP_RMS_NORM},
    {"layers.*.mlp", LK_OP_SWIGLU_MLP},
    {"norm", LK_OP_RMS_NORM},
    {"lm_head", LK_OP_CROSS_ENTROPY},
    {NULL, 0},
};

static const lk_module_decl qwen3_moe_modules[] = {
    {"embed_tokens", LK_OP_LINEAR},
    {"layers.*.input_layernorm", LK_OP_RMS_NORM},
    {"layers.*.self_attn", LK_OP_ATTENTION},
    {"layers.*.self_attn.q_norm", LK_OP_RMS_NORM},
    {"layers.*.self_attn.k_norm", LK_OP_RMS_NORM},
    {"layers.*.self_attn.rotary_emb", LK_OP_ROPE},
    {"layers.*.post_attention_layernorm", LK_OP_RMS_NORM},
    {"layers.*.mlp.gate", LK_OP_MOE_ROUTER},
    {"layers.*.mlp.experts", LK_OP_MOE_EXPERTS},
    {"layers.*.mlp.shared_expert", LK_OP_SWIGLU_MLP},
    {"norm", LK_OP_RMS_NORM},
    {"lm_head", LK_OP_CROSS_ENTROPY},
    {NULL, 0},
};

const lk_model_family lk_family_qwen3 = {
    .name = "qwen3", .modules = qwen3_modules,
    .fused_ops = FUSED(LK_OP_RMS_NORM) | FUSED(LK_OP_ROPE) | FUSED(LK_OP_SWIGLU_MLP),
};

const lk_model_family lk_family_qwen3_moe = {
    .name = "qwen3_moe", .modules = qwen3_moe_modules,
    .fused_ops = FUSED(LK_OP_RMS_NORM) | FUSED(LK_OP_ROPE) | FUSED(LK_OP_SWIGLU_MLP),
};
