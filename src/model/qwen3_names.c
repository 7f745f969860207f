/* qwen3_names.c — the tensor names and shapes of the published Qwen3 / Qwen3-MoE
 * checkpoints (hf_config.h), and the list of every tensor a config's checkpoint holds,
 * so loaders and writers agree with transformers on one table. */
#include <stdio.h>
#include "core/checked.h"
#include "llmkern/hf_config.h"

enum { GLOBAL, LAYER, EXPERT };   /* which indices the name takes */
static const struct { const char *fmt; int scope; } kinds[LK_QW_KIND_COUNT] = {
    [LK_QW_EMBED] = {"model.embed_tokens.weight", GLOBAL},
    [LK_QW_INPUT_NORM] = {"model.layers.%lld.input_layernorm.weight", LAYER},
    [LK_QW_Q_PROJ] = {"model.layers.%lld.self_attn.q_proj.weight", LAYER},
    [LK_QW_K_PROJ] = {"model.layers.%lld.self_attn.k_proj.weight", LAYER},
    [LK_QW_V_PROJ] = {"model.layers.%lld.self_attn.v_proj.weight", LAYER},
    [LK_QW_O_PROJ] = {"model.layers.%lld.self_attn.o_proj.weight", LAYER},
    [LK_QW_Q_NORM] = {"model.layers.%lld.self_attn.q_norm.weight", LAYER},
    [LK_QW_K_NORM] = {"model.layers.%lld.self_attn.k_norm.weight", LAYER},
    [LK_QW_POST_ATTN_NORM] = {"model.layers.%lld.post_attention_layernorm.weight", LAYER},
    [LK_QW_MLP_GATE_PROJ] = {"model.layers.%lld.mlp.gate_proj.weight", LAYER},
    [LK_QW_MLP_UP_PROJ] = {"model.layers.%lld.mlp.up_proj.weight", LAYER},
    [LK_QW_MLP_DOWN_PROJ] = {"model.layers.%lld.mlp.down_proj.weight", LAYER},
    [LK_QW_ROUTER] = {"model.layers.%lld.mlp.gate.weight", LAYER},
    [LK_QW_EXPERT_GATE_PROJ] = {"model.layers.%lld.mlp.experts.%lld.gate_proj.weight", EXPERT},
    [LK_QW_EXPERT_UP_PROJ] = {"model.layers.%lld.mlp.experts.%lld.up_proj.weight", EXPERT},
    [LK_QW_EXPERT_DOWN_PROJ] = {"model.layers.%lld.mlp.experts.%lld.down_proj.weight", EXPERT},
    [LK_QW_FINAL_NORM] = {"model.norm.weight", GLOBAL},
    [LK_QW_LM_HEAD] = {"lm_head.weight", GLOBAL},
};

lk_status lk_qwen3_tensor_name(lk_qwen3_tensor_kind kind, int64_t layer, int64_t expert, char *buf, size_t n) {
    if ((unsigned)kind >= LK_QW_KIND_COUNT || !buf)
        return lk_error(LK_EINVAL, "qwen3 tensor name: kind: expected 0..%d and a buffer, got %d", LK_QW_KIND_COUNT - 1,
                        (int)kind);
    int scope = kinds[kind].scope;
    if ((scope >= LAYER && layer < 0) || (scope == EXPERT && expert < 0))
        return lk_error(LK_EINVAL, "qwen3 tensor name: layer %lld / expert %lld: expected non-negative indices",
                        (long long)layer, (long long)expert);
    int k = scope == GLOBAL ? snprintf(buf, n, "%s", kinds[kind].fmt)
          : scope == LAYER ? snprintf(buf, n, kinds[kind].fmt, (long long)layer)
                           : snprintf(buf, n, kinds[kind].fmt, (long long)layer, (long long)expert);
    if (k < 0 || (size_t)k >= n)
        return lk_error(LK_EINVAL, "qwen3 tensor name: buf: %zu bytes, need %d", n, k + 1);
    return LK_OK;
}

lk_status lk_qwen3_tensor_shape(const lk_qwen3_config *c, lk_qwen3_tensor_kind kind, int *ndim, int64_t shape[2]) {
    if (!c || !ndim || !shape || (unsigned)kind >= LK_QW_KIND_COUNT)
        return lk_error(LK_EINVAL, "qwen3 tensor shape: expected a config, a valid kind and outputs");
    int64_t h = c->hidden_size, q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
    int64_t r = 0, k = 0;   /* rows, cols of a matrix; k 0 marks a vector */
    switch (kind) {
    case LK_QW_EMBED: case LK_QW_LM_HEAD: r = c->vocab_size; k = h; break;
    case LK_QW_INPUT_NORM: case LK_QW_POST_ATTN_NORM: case LK_QW_FINAL_NORM: r = h; break;
    case LK_QW_Q_NORM: case LK_QW_K_NORM: r = c->head_dim; break;
    case LK_QW_Q_PROJ: r = q; k = h; break;
    case LK_QW_K_PROJ: case LK_QW_V_PROJ: r = kv; k = h; break;
    case LK_QW_O_PROJ: r = h; k = q; break;
    case LK_QW_MLP_GATE_PROJ: case LK_QW_MLP_UP_PROJ: r = c->intermediate_size; k = h; break;
    case LK_QW_MLP_DOWN_PROJ: r = h; k = c->intermediate_size; break;
    case LK_QW_ROUTER: r = c->num_experts; k = h; break;
    case LK_QW_EXPERT_GATE_PROJ: case LK_QW_EXPERT_UP_PROJ: r = c->moe_intermediate_size; k = h; break;
    case LK_QW_EXPERT_DOWN_PROJ: r = h; k = c->moe_intermediate_size; break;
    default: break;
    }
    *ndim = k ? 2 : 1;
    shape[0] = r;
    shape[1] = k;
    return LK_OK;
}

/* Appends one ref when there is room; counts it either way. */
static void add(lk_qwen3_tensor_ref *refs, size_t cap, size_t *n, lk_qwen3_tensor_kind kind, int64_t layer,
                int64_t expert) {
    if (refs && *n < cap) refs[*n] = (lk_qwen3_tensor_ref){kind, layer, expert};
    (*n)++;
}

lk_status lk_qwen3_tensor_list(const lk_qwen3_config *c, lk_qwen3_tensor_ref *refs, size_t cap, size_t *n) {
    if (!c || !n) return lk_error(LK_EINVAL, "qwen3 tensor list: expected a config and a count");
    *n = 0;
    add(refs, cap, n, LK_QW_EMBED, -1, -1);
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        static const lk_qwen3_tensor_kind attn[] = {LK_QW_INPUT_NORM, LK_QW_Q_PROJ, LK_QW_K_PROJ, LK_QW_V_PROJ,
                                                    LK_QW_O_PROJ, LK_QW_Q_NORM, LK_QW_K_NORM, LK_QW_POST_ATTN_NORM};
        for (size_t a = 0; a < sizeof attn / sizeof *attn; a++) add(refs, cap, n, attn[a], i, -1);
        if (lk_qwen3_layer_is_moe(c, i)) {
            add(refs, cap, n, LK_QW_ROUTER, i, -1);
            for (int64_t e = 0; e < c->num_experts; e++)
                for (int p = LK_QW_EXPERT_GATE_PROJ; p <= LK_QW_EXPERT_DOWN_PROJ; p++)
                    add(refs, cap, n, (lk_qwen3_tensor_kind)p, i, e);
        } else {
            for (int p = LK_QW_MLP_GATE_PROJ; p <= LK_QW_MLP_DOWN_PROJ; p++)
                add(refs, cap, n, (lk_qwen3_tensor_kind)p, i, -1);
        }
    }
    add(refs, cap, n, LK_QW_FINAL_NORM, -1, -1);
    if (!c->tie_word_embeddings) add(refs, cap, n, LK_QW_LM_HEAD, -1, -1);
    return LK_OK;
}

/* Sizes from config.json are user input: every product through core/checked.h. */
lk_status lk_qwen3_param_count(const lk_qwen3_config *c, const char *what, int64_t *n_params, int64_t *n_tensors) {
    if (!c) return lk_error(LK_EINVAL, "qwen3 param count: expected a config, got NULL");
    if (!what) what = "(config)";
    char w[256];
    lk_status s;
    int64_t h = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers, q, kv, t;
#define MUL(name, a, b, out) \
    do { snprintf(w, sizeof w, "%s: %s", what, name); if ((s = lk_checked_mul(w, a, b, out))) return s; } while (0)
#define ADD(name, a, b, out) \
    do { snprintf(w, sizeof w, "%s: %s", what, name); if ((s = lk_checked_add(w, a, b, out))) return s; } while (0)
    MUL("num_attention_heads x head_dim", c->num_attention_heads, c->head_dim, &q);
    MUL("num_key_value_heads x head_dim", c->num_key_value_heads, c->head_dim, &kv);
    int64_t embed, attn, mlp = 0, moe = 0, dense_layers = 0, moe_layers = 0;
    MUL("vocab_size x hidden_size", V, h, &embed);
    /* per layer: q_proj and o_proj (q x h each), k_proj and v_proj (kv x h), 2 norms of h, 2 of head_dim */
    int64_t qk;
    ADD("(num_attention_heads + num_key_value_heads) x head_dim", q, kv, &qk);
    MUL("hidden_size x (num_attention_heads + num_key_value_heads) x head_dim", h, qk, &attn);
    MUL("2 x hidden_size x (num_attention_heads + num_key_value_heads) x head_dim", attn, 2, &attn);
    ADD("the attention's parameters", attn, 2 * h + 2 * c->head_dim, &attn);
    for (int64_t i = 0; i < L; i++) {   /* layers are few (<= 2^31 checked below); experts may be many */
        if (lk_qwen3_layer_is_moe(c, i)) moe_layers++;
        else dense_layers++;
        if (i >= (int64_t)1 << 20) { moe_layers = -1; break; }
    }
    if (moe_layers < 0 || L > INT32_MAX)
        return lk_error(LK_EINVAL, "%s: num_hidden_layers: expected at most 2^20, got %lld", what, (long long)L);
    if (dense_layers) {
        MUL("3 x intermediate_size x hidden_size", c->intermediate_size, h, &mlp);
        MUL("3 x intermediate_size x hidden_size", mlp, 3, &mlp);
    }
    if (moe_layers) {
        MUL("num_experts x 3 x moe_intermediate_size x hidden_size", c->moe_intermediate_size, h, &moe);
        MUL("num_experts x 3 x moe_intermediate_size x hidden_size", moe, 3, &moe);
        MUL("num_experts x 3 x moe_intermediate_size x hidden_size", moe, c->num_experts, &moe);
        MUL("num_experts x hidden_size (the router)", c->num_experts, h, &t);
        ADD("a MoE layer's parameters", moe, t, &moe);
    }
    int64_t total = embed, a, b;
    if (!c->tie_word_embeddings) ADD("the parameter count", total, embed, &total);
    ADD("the parameter count", total, h, &total);
    MUL("num_hidden_layers x the attention's parameters", L, attn, &a);
    ADD("the parameter count", total, a, &total);
    MUL("the dense layers' parameters", dense_layers, mlp, &a);
    MUL("the MoE layers' parameters", moe_layers, moe, &b);
    ADD("the parameter count", total, a, &total);
    ADD("the parameter count", total, b, &total);
    /* tensors: embed, final norm, lm_head; 8 a layer, then 3 (MLP) or 1 + 3 x experts */
    int64_t per_moe, tensors = 2 + !c->tie_word_embeddings;
    MUL("3 x num_experts (tensors)", moe_layers ? c->num_experts : 0, 3, &per_moe);
    MUL("num_hidden_layers x num_experts (tensors)", moe_layers, per_moe + 1, &a);
    tensors += 11 * dense_layers + 8 * moe_layers + a;
    if (tensors > INT32_MAX)
        return lk_error(LK_EINVAL, "%s: num_hidden_layers x num_experts: %lld tensors, more than 2^31 - 1", what,
                        (long long)tensors);
    ADD("the parameter count with each tensor's padding", total, 16 * tensors, &a);
#undef MUL
#undef ADD
    if (n_params) *n_params = total;
    if (n_tensors) *n_tensors = tensors;
    return LK_OK;
}
