/* estimate.c — what a training run needs in memory, from its config alone, so a run
 * that cannot fit is refused before it allocates (issue 20: a 32 GB model on a 24 GiB
 * machine climbed until the OOM killer; train.steps 10^12 failed as "optimizer state").
 * Every product goes through core/checked.h. The activations are a lower bound: what
 * every layer's forward keeps per token whatever the implementations (its inputs, the
 * attention's q, k, v and output, the MLP's hidden), plus the logits, in the compute
 * dtype (train.dtype). On a GPU the
 * weights, gradients, AdamW moments and activations are the device's; the host keeps a
 * copy of the weights (checkpoints go through it) and the loss history. */
#include <stdio.h>
#include "core/checked.h"
#include "llmkern/hf_config.h"
#include "llmkern/train.h"
#include "train/trainer.h"

void lk_train_recompute_layers(const lk_train_config *tc, int n[1 + LK_RECOMPUTE_MODULES]) {
    const int64_t L = tc->model.num_hidden_layers;
    int64_t want[1 + LK_RECOMPUTE_MODULES] = {tc->recompute ? tc->recompute_num_layers : -1};
    for (int i = 0; i < LK_RECOMPUTE_MODULES; i++)   /* module i is bit i */
        want[1 + i] = tc->recompute_modules & (1u << i) ? tc->recompute_module_layers[i] : -1;
    for (int i = 0; i <= LK_RECOMPUTE_MODULES; i++)
        n[i] = (int)(want[i] < 0 ? 0 : want[i] == 0 || want[i] > L ? L : want[i]);
}

lk_status lk_train_memory_estimate(const lk_train_config *tc, lk_train_memory *out) {
    if (!tc || !out) return lk_error(LK_EINVAL, "train: memory estimate: expected a config and an output");
    lk_train_memory r = {0};
    int bf16 = lk_train_dtype(tc) == LK_BF16;
    const lk_qwen3_config *c = &tc->model;
    int64_t hist, state, tokens, per_tok, act, logits, total;
    size_t bytes;
    lk_status s;
    if ((s = lk_checked_mul("train: train.steps (the loss history)", tc->steps, LK_HIST_COLS, &hist)) ||
        (s = lk_checked_bytes("train: train.steps (the loss history)", hist, sizeof(float), &bytes)))
        return s;
    r.history_bytes = bytes;
    if ((s = lk_checked_mul("train: train.batch_size x train.seq_len", tc->batch_size, tc->seq_len, &tokens))) return s;
    if (tc->has_model) {
        /* gradients (f32 or bf16), AdamW m and v (f32 or bf16 each), the f32 master weights; bf16
         * adds the weights' compute copy (which a bf16 main_params_dtype keeps alone) */
        int per_param = (int)lk_dtype_size(tc->main_grads_dtype) + (int)lk_dtype_size(tc->exp_avg_dtype) +
                        (int)lk_dtype_size(tc->exp_avg_sq_dtype) +
                        (tc->main_params_dtype == LK_BF16 ? 0 : 4) + (bf16 ? 2 : 0);
        if ((s = lk_qwen3_param_count(c, "train: model", &r.params, NULL)) ||
            (s = lk_checked_mul("train: model (bytes a parameter)", r.params, per_param, &state)))
            return s;
        r.state_bytes = (uint64_t)state;
        /* per token and layer: 4 x hidden (norm inputs and outputs), q, k, v and the attention's
         * output (train.keep_qk: the projection's q, k, v once more, less v's head-major copy,
         * which a row that takes views never makes: lk_model_set_keep_qk), the MLP's (or the
         * chosen experts') gate, up and product */
        const char *w = "train: model (the activations' width)";
        int64_t q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;   /* checked */
        int64_t width, a, b;
        if ((s = lk_checked_mul(w, 4, c->hidden_size, &width)) || (s = lk_checked_add(w, q, kv, &a)) ||
            (s = lk_checked_mul(w, 2, a, &a)) || (s = lk_checked_add(w, width, a, &width)) ||
            (tc->keep_qk && ((s = lk_checked_add(w, q, kv, &a)) || (s = lk_checked_add(w, width, a, &width)))))
            return s;
        if (c->moe) s = lk_checked_mul(w, 3 * c->num_experts_per_tok, c->moe_intermediate_size, &b);   /* K <= E */
        else s = lk_checked_mul(w, 3, c->intermediate_size, &b);
        if (s || (s = lk_checked_add(w, width, b, &width)) ||
            (s = lk_checked_add(w, width, c->moe ? c->num_experts : 0, &width)))
            return s;
        /* recompute: the kept layers' blocks and one for the R recomputed ones (their x2 aside);
         * recompute_modules: the layers they cover and recompute leaves keep neither norm's
         * output (2 x hidden), nor the experts' (b), nor q, k and v (q + 2 kv) */
        int n[1 + LK_RECOMPUTE_MODULES];
        lk_train_recompute_layers(tc, n);
        const int64_t L = c->num_hidden_layers, R = n[0], norms = n[1] > R ? n[1] - R : 0,
                      experts = c->moe && n[2] > R ? n[2] - R : 0, qkv = n[3] > R ? n[3] - R : 0;
        int64_t units;   /* layers x width, less what the modules make again (each < width) */
        if ((s = lk_checked_mul(w, L - R + (R > 0), width, &units))) return s;
        units -= norms * 2 * c->hidden_size + experts * b + qkv * (q + 2 * kv);
        int64_t f[2] = {tokens / (tc->sp > 0 ? tc->sp : 1), units};
        if ((s = lk_checked_prod("train: the activations (batch_size x seq_len x layers x width)", f, 2, &per_tok)) ||
            (s = lk_checked_mul("train: the logits (batch_size x seq_len x vocab_size)", tokens, c->vocab_size,
                                &logits)) ||
            (s = lk_checked_add("train: the activations", per_tok, logits, &act)) ||
            (s = lk_checked_bytes("train: the activations", act, bf16 ? 2 : sizeof(float), &bytes)))
            return s;
        r.activation_bytes = bytes;
    }
    int64_t dev_bytes, host_copy;
    if ((s = lk_checked_add("train: the memory estimate", (int64_t)r.state_bytes, (int64_t)r.activation_bytes, &total)) ||
        (s = lk_checked_add("train: the memory estimate", total, (int64_t)r.history_bytes, &total)) ||
        (s = lk_checked_add("train: the memory estimate", (int64_t)r.state_bytes, (int64_t)r.activation_bytes,
                            &dev_bytes)) ||
        (s = lk_checked_add("train: the memory estimate", r.params * 4, (int64_t)r.history_bytes,
                            &host_copy)))
        return s;
    r.total_bytes = (uint64_t)total;
    if (tc->device == LK_DEVICE_CPU) {
        r.host_bytes = r.total_bytes;
    } else {   /* on a GPU: weights, gradients, moments and activations there; a host copy of the weights */
        r.device_bytes = (uint64_t)dev_bytes;
        r.host_bytes = (uint64_t)host_copy;
    }
    *out = r;
    return LK_OK;
}
