/* hf_config.h — the Hugging Face config.json of Qwen3 and Qwen3-MoE, and the tensor
 * names of their published checkpoints, so a directory written by llmkern
 * (config.json + model.safetensors) loads in transformers and theirs load here.
 *
 *   lk_qwen3_config c;
 *   if (lk_qwen3_config_read("ckpt/config.json", &c)) puts(lk_last_error());
 *   char name[128];
 *   lk_qwen3_tensor_name(LK_QW_EXPERT_GATE_PROJ, 3, 17, name, sizeof name);
 *   // "model.layers.3.mlp.experts.17.gate_proj.weight"
 */
#ifndef LLMKERN_HF_CONFIG_H
#define LLMKERN_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_QWEN3_MAX_LIST 512   /* entries of mlp_only_layers and layer_types */

typedef struct {
    int moe;                           /* 1: Qwen3MoeForCausalLM / qwen3_moe; 0: Qwen3ForCausalLM / qwen3 */
    char architectures[64];            /* the first (only) entry of "architectures" */
    char model_type[32];
    int64_t hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim;
    int64_t intermediate_size;         /* dense MLP width (also the mlp_only layers of a MoE model) */
    int64_t vocab_size, max_position_embeddings;
    double rope_theta, rms_norm_eps, initializer_range, attention_dropout;
    int has_rope_scaling;              /* rope_scaling is an object (0: null) */
    char rope_scaling_type[32];        /* its "rope_type" (or legacy "type") */
    double rope_scaling_factor;
    int64_t rope_scaling_original_max_position_embeddings;   /* 0 when absent */
    int tie_word_embeddings, attention_bias, use_cache, use_sliding_window;
    char torch_dtype[16];              /* "bfloat16", "float32" */
    char hidden_act[16];               /* "silu" */
    int64_t bos_token_id, eos_token_id;   /* -1: null or absent */
    int64_t sliding_window;            /* -1: null */
    int64_t max_window_layers;
    int n_layer_types;                 /* layer_types when config.json has it (0: absent) */
    unsigned char sliding_layer[LK_QWEN3_MAX_LIST];   /* its entries: 1 "sliding_attention", 0 "full_attention" */
    /* MoE (read and written only when moe) */
    int64_t moe_intermediate_size, num_experts, num_experts_per_tok, decoder_sparse_step;
    int norm_topk_prob, output_router_logits;
    double router_aux_loss_coef;
    int n_mlp_only_layers;
    int mlp_only_layers[LK_QWEN3_MAX_LIST];
} lk_qwen3_config;

/* The defaults of transformers' Qwen3Config / Qwen3MoeConfig for the optional keys,
 * with the given family; the required ones (sizes) left 0 for the caller to set. */
LK_API void lk_qwen3_config_init(lk_qwen3_config *c, int moe);

/* Reads and validates path. Unknown keys are ignored. Required: model_type (or
 * architectures), hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, intermediate_size, vocab_size, rms_norm_eps,
 * rope_theta, and for MoE moe_intermediate_size, num_experts, num_experts_per_tok.
 * Errors: LK_EIO (unreadable, bad JSON, a missing key or a wrong type, naming the key
 * and the file), LK_EINVAL (values that make no model, e.g. heads not a multiple of
 * kv heads, hidden_act not silu, attention_bias true). *c is set only on success. */
LK_API lk_status lk_qwen3_config_read(const char *path, lk_qwen3_config *c);
/* The same from JSON text; `what` names the source in errors. */
LK_API lk_status lk_qwen3_config_parse(const char *json, size_t len, const char *what, lk_qwen3_config *c);
/* The checks of read on a config built in code. */
LK_API lk_status lk_qwen3_config_validate(const lk_qwen3_config *c, const char *what);
/* Writes config.json as transformers' save_pretrained does: two-space indent, keys
 * sorted; atomically (tmp file, fsync, rename). Validates first. */
LK_API lk_status lk_qwen3_config_write(const char *path, const lk_qwen3_config *c);
/* The same text into a malloc'ed NUL-terminated string (*out; free() it). */
LK_API lk_status lk_qwen3_config_to_json(const lk_qwen3_config *c, char **out);

/* 1 when layer i has a MoE block, 0 for a dense MLP: transformers' rule, i not in
 * mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0. */
LK_API int lk_qwen3_layer_is_moe(const lk_qwen3_config *c, int64_t layer);

/* Layer i's attention window (the attention contract's window_left: a query sees the keys
 * fewer than that many positions back, itself included), 0 for full attention. Transformers'
 * rule: sliding_window when use_sliding_window and sliding_window is set and, for Qwen3, the
 * layer is "sliding_attention" in layer_types or, without layer_types, i >=
 * max_window_layers; Qwen3-MoE slides every layer then (its attention reads sliding_window
 * alone). */
LK_API int64_t lk_qwen3_layer_window(const lk_qwen3_config *c, int64_t layer);

/* Tensor kinds of the published checkpoints. */
typedef enum {
    LK_QW_EMBED,              /* model.embed_tokens.weight            [vocab, hidden] */
    LK_QW_INPUT_NORM,         /* model.layers.{i}.input_layernorm.weight   [hidden] */
    LK_QW_Q_PROJ,             /* ...self_attn.q_proj.weight   [heads*head_dim, hidden] */
    LK_QW_K_PROJ,             /* ...self_attn.k_proj.weight   [kv_heads*head_dim, hidden] */
    LK_QW_V_PROJ,             /* ...self_attn.v_proj.weight   [kv_heads*head_dim, hidden] */
    LK_QW_O_PROJ,             /* ...self_attn.o_proj.weight   [hidden, heads*head_dim] */
    LK_QW_Q_NORM,             /* ...self_attn.q_norm.weight   [head_dim] */
    LK_QW_K_NORM,             /* ...self_attn.k_norm.weight   [head_dim] */
    LK_QW_POST_ATTN_NORM,     /* ...post_attention_layernorm.weight   [hidden] */
    LK_QW_MLP_GATE_PROJ,      /* ...mlp.gate_proj.weight   [intermediate, hidden] (dense layers) */
    LK_QW_MLP_UP_PROJ,        /* ...mlp.up_proj.weight     [intermediate, hidden] */
    LK_QW_MLP_DOWN_PROJ,      /* ...mlp.down_proj.weight   [hidden, intermediate] */
    LK_QW_ROUTER,             /* ...mlp.gate.weight        [num_experts, hidden] (MoE layers) */
    LK_QW_EXPERT_GATE_PROJ,   /* ...mlp.experts.{e}.gate_proj.weight   [moe_intermediate, hidden] */
    LK_QW_EXPERT_UP_PROJ,     /* ...mlp.experts.{e}.up_proj.weight     [moe_intermediate, hidden] */
    LK_QW_EXPERT_DOWN_PROJ,   /* ...mlp.experts.{e}.down_proj.weight   [hidden, moe_intermediate] */
    LK_QW_FINAL_NORM,         /* model.norm.weight   [hidden] */
    LK_QW_LM_HEAD,            /* lm_head.weight      [vocab, hidden]; absent when tie_word_embeddings */
    LK_QW_KIND_COUNT
} lk_qwen3_tensor_kind;

/* Formats the name of kind for layer / expert (ignored where the kind has none) into
 * buf. Errors: LK_EINVAL (bad kind, negative layer/expert where needed, buf too small). */
LK_API lk_status lk_qwen3_tensor_name(lk_qwen3_tensor_kind kind, int64_t layer, int64_t expert, char *buf, size_t n);
/* Its shape under c (ndim 1 or 2, as in the published files). */
LK_API lk_status lk_qwen3_tensor_shape(const lk_qwen3_config *c, lk_qwen3_tensor_kind kind, int *ndim, int64_t shape[2]);

/* Every tensor a checkpoint of c holds, in a fixed order: embed, per layer (norms,
 * attention, then MLP or router + experts), final norm, lm_head unless tied. */
typedef struct { lk_qwen3_tensor_kind kind; int64_t layer, expert; } lk_qwen3_tensor_ref;
/* How many (refs NULL), or fills up to cap refs; *n gets the total either way. */
LK_API lk_status lk_qwen3_tensor_list(const lk_qwen3_config *c, lk_qwen3_tensor_ref *refs, size_t cap, size_t *n);
/* The parameters (elements) and tensors a checkpoint of c holds, every product checked:
 * LK_EINVAL naming the keys (and `what`, the source) when a tensor's or the total's
 * element count does not fit in 64 bits or the tensors number more than 2^31 - 1.
 * lk_qwen3_config_validate calls it, so a validated config sizes no buffer that wraps.
 * Either output may be NULL. */
LK_API lk_status lk_qwen3_param_count(const lk_qwen3_config *c, const char *what, int64_t *n_params, int64_t *n_tensors);

#ifdef __cplusplus
}
#endif
#endif
