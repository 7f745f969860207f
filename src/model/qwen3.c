/* qwen3.c — the Qwen3 / Qwen3-MoE decoder for training in f32 or bf16 with f32 master
 * weights and gradients (model.h), on the CPU or,
 * from a CUDA op table, on the current GPU: create (config checks, every module's
 * implementation resolved once from the op table), the activation buffers for a token
 * count, and the step: embedding gather, the layers (layer.c), final norm, LM head +
 * loss through the cross_entropy op, then the backward in reverse, optionally
 * recomputing each layer from its input. The residual stream and its gradient are f32
 * in one buffer (qwen3_internal.h). Buffers and the model's own moves go through
 * device.h; the batch stays on the host and its per-token arrays are copied over. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/checked.h"
#include "model/qwen3_internal.h"

/* The implementation bound to module (op-wide unless an override names it). */
static lk_status bind(const lk_op_table *t, lk_op op, const char *module, const lk_impl **out) {
    lk_device_type dev = t->device;
    const lk_binding *b = lk_op_table_get(t, op, module);
    const char *name = lk_op_info_get(op)->name;
    if (!b || !b->impl)
        return lk_error(LK_EUNAVAILABLE, "model: %s: op %s has no implementation in this build%s%s%s", module, name,
                        b && b->fallback[0] ? " (" : "", b ? b->fallback : "", b && b->fallback[0] ? ")" : "");
    if (b->impl->device != dev)
        return lk_error(LK_EUNAVAILABLE, "model: %s: %s '%s' runs on %s; the model runs on %s", module, name,
                        b->impl->name, lk_device_name(b->impl->device), lk_device_name(dev));
    *out = b->impl;
    return LK_OK;
}

static lk_status bind_layer(lk_model *m, const lk_op_table *t, int l) {
    lk_layer_ops *o = &m->layers[l].ops;
    struct { lk_op op; const char *suffix; const lk_impl **slot; } want[] = {
        {LK_OP_RMS_NORM, "input_layernorm", &o->in_norm},
        {LK_OP_RMS_NORM, "self_attn.q_norm", &o->q_norm},
        {LK_OP_RMS_NORM, "self_attn.k_norm", &o->k_norm},
        {LK_OP_RMS_NORM, "post_attention_layernorm", &o->post_norm},
        {LK_OP_ROPE, "self_attn.rotary_emb", &o->rope},
        {LK_OP_ATTENTION, "self_attn", &o->attn},
        {LK_OP_LINEAR, "self_attn.q_proj", &o->q_proj},
        {LK_OP_LINEAR, "self_attn.k_proj", &o->k_proj},
        {LK_OP_LINEAR, "self_attn.v_proj", &o->v_proj},
        {LK_OP_LINEAR, "self_attn.o_proj", &o->o_proj},
        {LK_OP_SWIGLU_MLP, "mlp", &o->mlp},
        {LK_OP_MOE_ROUTER, "mlp.gate", &o->router},
        {LK_OP_MOE_EXPERTS, "mlp.experts", &o->experts},
    };
    int moe = m->layers[l].moe;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        lk_op op = want[i].op;
        if ((op == LK_OP_SWIGLU_MLP && moe) || ((op == LK_OP_MOE_ROUTER || op == LK_OP_MOE_EXPERTS) && !moe)) continue;
        char module[96];
        snprintf(module, sizeof module, "layers.%d.%s", l, want[i].suffix);
        lk_status s = bind(t, op, module, want[i].slot);
        if (s) return s;
    }
    /* layer.c runs q, k and v as one GEMM */
    if (o->k_proj != o->q_proj || o->v_proj != o->q_proj)
        return lk_error(LK_EUNAVAILABLE, "model: layers.%d.self_attn: q_proj, k_proj and v_proj run as one GEMM; "
                        "expected one linear implementation for the three, got '%s', '%s' and '%s'", l,
                        o->q_proj->name, o->k_proj->name, o->v_proj->name);
    const lk_attention_entry *e = o->attn->vtable;
    m->flex |= e && e->adapter == LK_ATTN_FLEX;   /* then every batch gets its document BlockMasks */
    return LK_OK;
}

static lk_status make_rope(lk_model *m) {
    const lk_qwen3_config *c = &m->cfg;
    lk_rope_scaling sc = {0}, *scp = NULL;
    if (c->has_rope_scaling && strcmp(c->rope_scaling_type, "default") != 0) {
        lk_status s = lk_rope_scaling_parse(c->rope_scaling_type, &sc.type);
        if (s) return s;
        if (sc.type != LK_ROPE_SCALING_YARN && sc.type != LK_ROPE_SCALING_NONE)
            return lk_error(LK_EUNAVAILABLE, "model: rope_scaling: '%s' needs parameters config.json does not carry "
                            "here; expected default or yarn", c->rope_scaling_type);
        sc.factor = c->rope_scaling_factor;
        sc.original_max_position_embeddings = c->rope_scaling_original_max_position_embeddings;
        scp = &sc;
    }
    m->max_pos = c->max_position_embeddings;
    int64_t n64;
    size_t bytes;
    lk_status cs_ = lk_checked_mul("model: max_position_embeddings x head_dim / 2 (the RoPE tables)", m->max_pos, m->D / 2,
                                   &n64);
    if (!cs_) cs_ = lk_checked_bytes("model: max_position_embeddings (the RoPE tables)", n64, 2 * 4, &bytes);
    if (!cs_) cs_ = lk_check_fits_memory("model: max_position_embeddings (the RoPE tables)", bytes);
    if (cs_) return cs_;
    size_t n = (size_t)n64;
    float *host = malloc(2 * n * 4);   /* built on the host, then placed */
    m->rope_cos = m->dev->alloc(n * 4);
    m->rope_sin = m->dev->alloc(n * 4);
    lk_status s = LK_OK;
    if (!host || !m->rope_cos || !m->rope_sin) s = lk_error(LK_ENOMEM, "model: rope tables: out of memory");
    lk_tensor cs = lk_tensor_2d(host, LK_F32, m->max_pos, m->D / 2);
    lk_tensor sn = lk_tensor_2d(host ? host + n : NULL, LK_F32, m->max_pos, m->D / 2);
    if (!s) s = lk_rope_tables(c->rope_theta, m->D, scp, &cs, &sn);
    if (!s) s = m->dev->put(m->rope_cos, host, n * 4);
    if (!s) s = m->dev->put(m->rope_sin, host + n, n * 4);
    free(host);
    return s;
}

lk_status lk_model_create(const lk_qwen3_config *cfg, const lk_op_table *ops, uint64_t seed, int recompute,
                          lk_model **out) {
    if (!cfg || !ops || !out) return lk_error(LK_EINVAL, "model_create: expected a config, an op table and an output");
    *out = NULL;
    lk_status s = lk_qwen3_config_validate(cfg, "model_create: cfg");
    if (s) return s;
    if (cfg->head_dim % 2 || cfg->max_position_embeddings < 1)
        return lk_error(LK_EINVAL, "model_create: cfg: head_dim: expected even (RoPE) and max_position_embeddings >= 1, "
                        "got %lld and %lld", (long long)cfg->head_dim, (long long)cfg->max_position_embeddings);
    if (cfg->attention_dropout != 0.0)   /* transformers drops attention probabilities in training then */
        return lk_error(LK_EUNAVAILABLE, "model_create: cfg: attention_dropout: expected 0 (llmkern's attention has no "
                        "dropout), got %g", cfg->attention_dropout);
    const lk_model_device *dev = ops->device == LK_DEVICE_CPU ? &lk_model_device_cpu : NULL;
#ifdef LLMKERN_HAVE_CUDA
    if (ops->device == LK_DEVICE_CUDA) dev = &lk_model_device_cuda;
#endif
    if (!dev)
        return lk_error(LK_EUNAVAILABLE, "model_create: ops: expected a CPU%s op table, got %s",
#ifdef LLMKERN_HAVE_CUDA
                        " or CUDA",
#else
                        " (this build has no CUDA)",
#endif
                        lk_device_name(ops->device));
    const char *fam = cfg->moe ? "qwen3_moe" : "qwen3";
    if (ops->family && strcmp(ops->family->name, fam) != 0)
        return lk_error(LK_EINVAL, "model_create: ops: expected a table built for family '%s' (model_type %s), got '%s'",
                        fam, cfg->model_type, ops->family->name);
    lk_model *m = calloc(1, sizeof *m);
    if (!m) return lk_error(LK_ENOMEM, "model_create: out of memory");
    m->cfg = *cfg;
    m->recompute = recompute ? (int)cfg->num_hidden_layers : 0;
    m->norm_of_x = m->recompute > 0;   /* the first forward's norms as the recompute's (qwen3_internal.h) */
    m->fp32_residual = 1;
    m->dt = LK_F32, m->es = 4;
    m->d_loss_put = NAN;   /* scal[1] holds no d_loss yet */
    m->H = cfg->hidden_size; m->Hq = cfg->num_attention_heads; m->Hk = cfg->num_key_value_heads;
    m->D = cfg->head_dim; m->I = cfg->intermediate_size; m->V = cfg->vocab_size;
    m->E = cfg->moe ? cfg->num_experts : 0; m->K = cfg->moe ? cfg->num_experts_per_tok : 0;
    m->Ie = cfg->moe ? cfg->moe_intermediate_size : 0;
    int N = (int)cfg->num_hidden_layers;
    m->layers = calloc((size_t)N, sizeof *m->layers);
    m->dev = dev;
    m->router = ops->router;
    m->arena.device = dev->type;
    m->ctx = dev->type == LK_DEVICE_CPU ? lk_ctx_cpu(&m->arena) : lk_ctx_cuda(&m->arena, NULL, dev->current());
    m->scal = dev->alloc(64);
    if (!m->scal) s = lk_error(LK_ENOMEM, "model_create: out of memory");
    if (!m->layers) s = lk_error(LK_ENOMEM, "model_create: out of memory");
    for (int l = 0; l < N && !s; l++) {
        m->layers[l].moe = cfg->moe && lk_qwen3_layer_is_moe(cfg, l);
        m->n_moe_layers += m->layers[l].moe;
        s = bind_layer(m, ops, l);
    }
    if (!s && cfg->moe) {
        const lk_binding *d = lk_op_table_get(ops, LK_OP_MOE_DISPATCH, "mlp.experts");
        m->dispatch = d ? d->impl : NULL;
        /* a dispatcher nobody chose is `local`; under EP the all-to-all one is meant */
        if (m->dispatch && d->source == LK_SOURCE_DEFAULT && strcmp(m->dispatch->name, "local") == 0)
            m->dispatch = lk_impl_find(LK_OP_MOE_DISPATCH, "alltoall", dev->type);
    }
    if (!s) s = bind(ops, LK_OP_RMS_NORM, "norm", &m->final_norm_impl);
    if (!s) s = bind(ops, LK_OP_CROSS_ENTROPY, "lm_head", &m->ce_impl);
    if (!s) s = make_rope(m);
    if (!s) s = lk_qwen3_params_init(m, seed);
    if (s) { lk_model_free(m); return s; }
    m->wc = m->w;   /* f32 until lk_model_set_dtype */
    *out = m;
    return LK_OK;
}

static void free_acts(lk_model *m) {
    lk_qwen3_doc_mask_free(m, 0);
    m->dev->free(m->act_block); m->dev->free(m->scratch_block); m->dev->free(m->dev_tokens);
    m->dev->host_free(m->stage);
    free(m->acts); free(m->inputs); free(m->x2s);
    m->x2s = NULL;
    m->act_block = m->scratch_block = NULL;
    m->dev_tokens = m->stage = NULL;
    m->acts = NULL;
    m->inputs = NULL;
    m->T = 0;
}

static int group_size(const lk_comm *c) { return c ? c->size : 1; }

lk_status lk_model_set_parallel(lk_model *m, lk_comm *sp, lk_comm *ep) {
    if (!m) return lk_error(LK_EINVAL, "model_set_parallel: expected a model");
    lk_status s;
    if ((sp && (s = lk_comm_check("model_set_parallel", "sp", sp))) ||
        (ep && (s = lk_comm_check("model_set_parallel", "ep", ep))))
        return s;
    int P = group_size(sp), Q = group_size(ep);
    if (P > 1) {
        if (m->Hq % P || (m->Hk % P && P % m->Hk))
            return lk_error(LK_EINVAL, "model_set_parallel: sp %d: expected it to divide num_attention_heads %lld and "
                            "num_key_value_heads %lld to divide it or be divisible by it", P, (long long)m->Hq,
                            (long long)m->Hk);
        for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
            const lk_attention_entry *e = m->layers[l].ops.attn->vtable;
            if (!e || !e->sp)
                return lk_error(LK_EINVAL, "model_set_parallel: sp %d: layers.%d.self_attn: '%s' has no sequence-"
                                "parallel path; expected flash_attention_2, flash_attention_3 or "
                                "flex_attention under the llmkern backend (they enter llmkern_*_with_sp)", P, l,
                                m->layers[l].ops.attn->name);
        }
    }
    /* a GPU model's groups exchange device memory, the SP loss on the stream */
    if (P > 1 && m->dev->type != LK_DEVICE_CPU && strcmp(sp->backend, "nccl") != 0)
        return lk_error(LK_EUNAVAILABLE, "model_set_parallel: sp %d: a GPU model exchanges device memory; expected an "
                        "NCCL group, got '%s'", P, sp->backend);
    if (Q > 1 && m->dev->type != LK_DEVICE_CPU && strcmp(ep->backend, "nccl") != 0)
        return lk_error(LK_EUNAVAILABLE, "model_set_parallel: ep %d: a GPU model exchanges device memory; expected an "
                        "NCCL group, got '%s'", Q, ep->backend);
    if (Q > 1) {
        if (!m->cfg.moe)
            return lk_error(LK_EINVAL, "model_set_parallel: ep %d: expected a MoE model, got a dense one", Q);
        if (m->E % Q)
            return lk_error(LK_EINVAL, "model_set_parallel: ep %d: expected it to divide num_experts %lld", Q,
                            (long long)m->E);
        if (!m->dispatch || strcmp(m->dispatch->name, "local") == 0)
            return lk_error(LK_EINVAL, "model_set_parallel: ep %d: moe.dispatcher '%s' runs every expert on one "
                            "process; expected alltoall or allgather", Q, m->dispatch ? m->dispatch->name : "(none)");
    }
    free_acts(m);   /* the token count and the saved sizes change */
    m->d_loss_put = NAN;   /* the SP forward writes scal[1] */
    m->sp = P > 1 ? sp : NULL;
    m->ep = Q > 1 ? ep : NULL;
    return LK_OK;
}

/* Every module's implementation must store dt (its descriptor's dtypes). */
static lk_status check_dtype(const lk_model *m, lk_dtype dt) {
    const char *dn = lk_dtype_name(dt);
    for (int l = 0; l < (int)m->cfg.num_hidden_layers; l++) {
        const lk_layer_ops *o = &m->layers[l].ops;
        const lk_impl *all[] = {o->in_norm, o->q_norm, o->k_norm, o->post_norm, o->rope, o->attn, o->q_proj,
                                o->k_proj, o->v_proj, o->o_proj, o->mlp, o->router, o->experts};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i] && !(all[i]->needs.dtypes & LK_DTYPE_BIT(dt)))
                return lk_error(LK_EDTYPE, "model_set_dtype: %s: layers.%d: %s '%s' does not take %s", dn, l,
                                lk_op_info_get(all[i]->op)->name, all[i]->name, dn);
    }
    const lk_impl *tail[] = {m->final_norm_impl, m->ce_impl, m->ep ? m->dispatch : NULL};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
        if (tail[i] && !(tail[i]->needs.dtypes & LK_DTYPE_BIT(dt)))
            return lk_error(LK_EDTYPE, "model_set_dtype: %s: %s '%s' does not take %s", dn,
                            lk_op_info_get(tail[i]->op)->name, tail[i]->name, dn);
    return LK_OK;
}

lk_status lk_model_set_dtype(lk_model *m, lk_dtype dt) {
    if (!m) return lk_error(LK_EINVAL, "model_set_dtype: expected a model");
    if (dt != LK_F32 && dt != LK_BF16)
        return lk_error(LK_EDTYPE, "model_set_dtype: expected f32 or bf16, got %s", lk_dtype_name(dt));
    if (dt == m->dt) return LK_OK;
    if (!m->w)
        return lk_error(LK_EDTYPE, "model_set_dtype: %s: the weights are bf16 alone (lk_model_set_master_dtype): set "
                        "the master to f32 first", lk_dtype_name(dt));
    if (m->gdt != LK_F32)
        return lk_error(LK_EDTYPE, "model_set_dtype: %s: the gradients are bf16 (lk_model_set_grad_dtype): set them "
                        "to f32 first", lk_dtype_name(dt));
    lk_status s = check_dtype(m, dt);
    if (s) return s;
    void *wc = m->w;
    if (dt != LK_F32 && !(wc = m->dev->alloc((size_t)m->n_floats * lk_dtype_size(dt))))
        return lk_error(LK_ENOMEM, "model_set_dtype: a %s copy of %lld parameters: out of %s memory", lk_dtype_name(dt),
                        (long long)m->n_floats, lk_device_name(m->dev->type));
    free_acts(m);   /* every buffer's size changes */
    if (m->wc != m->w) m->dev->free(m->wc);
    m->dt = dt, m->es = lk_dtype_size(dt), m->wc = wc, m->copy_current = 0;
    return LK_OK;
}

lk_dtype lk_model_dtype(const lk_model *m) { return m ? m->dt : LK_F32; }

lk_status lk_model_set_master_dtype(lk_model *m, lk_dtype dt) {
    if (!m) return lk_error(LK_EINVAL, "model_set_master_dtype: expected a model");
    if (dt != LK_F32 && dt != LK_BF16)
        return lk_error(LK_EDTYPE, "model_set_master_dtype: expected f32 or bf16, got %s", lk_dtype_name(dt));
    if (dt == lk_model_master_dtype(m)) return LK_OK;
    if (dt == LK_BF16 && m->dt != LK_BF16)
        return lk_error(LK_EDTYPE, "model_set_master_dtype: bf16: expected a bf16 model (lk_model_set_dtype), got %s",
                        lk_dtype_name(m->dt));
    lk_status s = lk_qwen3_params_move_master(m, dt);
    if (s) return s;
    m->copy_current = 0;
    return LK_OK;
}

lk_dtype lk_model_master_dtype(const lk_model *m) { return !m || m->w ? LK_F32 : m->dt; }

lk_status lk_model_set_grad_dtype(lk_model *m, lk_dtype dt) {
    if (!m) return lk_error(LK_EINVAL, "model_set_grad_dtype: expected a model");
    if (dt != LK_F32 && dt != LK_BF16)
        return lk_error(LK_EDTYPE, "model_set_grad_dtype: expected f32 or bf16, got %s", lk_dtype_name(dt));
    if (dt == m->gdt) return LK_OK;
    if (dt == LK_BF16 && m->dt != LK_BF16)
        return lk_error(LK_EDTYPE, "model_set_grad_dtype: bf16: expected a bf16 model (lk_model_set_dtype), got %s",
                        lk_dtype_name(m->dt));
    return lk_qwen3_params_move_grads(m, dt);
}

lk_dtype lk_model_grad_dtype(const lk_model *m) { return m ? m->gdt : LK_F32; }

void lk_model_set_deterministic(lk_model *m, int on) {
    if (!m) return;
    if (m->deterministic != (on != 0)) free_acts(m);   /* v's place may change (lk_qwen3_v_in_place) */
    m->deterministic = on != 0;
}

lk_status lk_model_set_keep_qk(lk_model *m, int on) {
    if (!m) return lk_error(LK_EINVAL, "model_set_keep_qk: expected a model");
    if (m->keep_qk != (on != 0)) free_acts(m);   /* every layer's block changes size */
    m->keep_qk = on != 0;
    return LK_OK;
}

lk_status lk_model_set_fp32_residual(lk_model *m, int on) {
    if (!m) return lk_error(LK_EINVAL, "model_set_fp32_residual: expected a model");
    if (m->fp32_residual != (on != 0)) free_acts(m);   /* the scratch holds the f32 stream or not */
    m->fp32_residual = on != 0;
    return LK_OK;
}

/* One of the recompute counts (the first n layers) set to n; the blocks' layout changes. */
static lk_status set_recompute(lk_model *m, int *count, int n, const char *fn) {
    if (!m) return lk_error(LK_EINVAL, "%s: expected a model", fn);
    if (n < 0 || n > m->cfg.num_hidden_layers)
        return lk_error(LK_EINVAL, "%s: expected 0 .. %lld layers (num_hidden_layers), got %d", fn,
                        (long long)m->cfg.num_hidden_layers, n);
    if (*count != n) free_acts(m);
    *count = n;
    m->norm_of_x = m->recompute > 0 || m->recompute_norms > 0;   /* the first forward's norms as the backward's */
    return LK_OK;
}

lk_status lk_model_set_recompute_layers(lk_model *m, int n) {
    return set_recompute(m, m ? &m->recompute : NULL, n, "model_set_recompute_layers");
}

lk_status lk_model_set_recompute_norms(lk_model *m, int n) {
    return set_recompute(m, m ? &m->recompute_norms : NULL, n, "model_set_recompute_norms");
}

lk_status lk_model_set_recompute_moe(lk_model *m, int n) {
    return set_recompute(m, m ? &m->recompute_moe : NULL, n, "model_set_recompute_moe");
}

lk_status lk_model_set_recompute_qkv(lk_model *m, int n) {
    return set_recompute(m, m ? &m->recompute_qkv : NULL, n, "model_set_recompute_qkv");
}

int lk_model_recompute_layers(const lk_model *m) { return m ? m->recompute : 0; }

lk_status lk_model_set_lm_head_chunk_bytes(lk_model *m, size_t bytes) {
    if (!m) return lk_error(LK_EINVAL, "model_set_lm_head_chunk_bytes: expected a model");
    if (m->ce_chunk_bytes != bytes) free_acts(m);   /* the loss's saved block may change size */
    m->ce_chunk_bytes = bytes;
    return LK_OK;
}

void lk_model_free(lk_model *m) {
    if (!m) return;
    if (m->dev) {
        free_acts(m);
        if (m->wc != m->w) m->dev->free(m->wc);
        m->dev->free(m->w); m->dev->free(m->g); m->dev->free(m->rope_cos); m->dev->free(m->rope_sin);
        m->dev->free(m->scal);
    }
    free(m->params); free(m->layers);
    lk_qwen3_doc_mask_free(m, 1);
    lk_arena_free(&m->arena);
    free(m);
}

/* The loss op's arguments; loss and n_valid are the device scalars scal[0] and scal[4]
 * (f32 [1] d_loss, [2] a router's aux loss, [3] their sum over the MoE layers; i64 at [4]). */
static lk_cross_entropy_args ce_args(lk_model *m) {
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    a.hidden = lk_on(m, lk_tensor_2d(m->hf, m->dt, m->T, m->H));
    a.weight = lk_on(m, lk_tensor_2d(lk_wc(m, m->lm_head), m->dt, m->V, m->H));
    a.labels = lk_on(m, lk_tensor_1d((void *)m->labels, LK_I64, m->T));
    a.loss = lk_on(m, lk_tensor_1d(m->scal, LK_F32, 1));
    a.n_valid = lk_on(m, lk_tensor_1d(m->scal + 4, LK_I64, 1));
    a.saved = (lk_saved){m->s_ce, m->s_ce_bytes};
    a.reduction = m->sp ? LK_CE_SUM : LK_CE_MEAN;   /* under SP the mean is over the group */
    a.chunk_bytes = m->ce_chunk_bytes;
    return a;
}

/* A stage slot's 8-byte words: [3, T] i64 tokens, then [T + 1] i32 cu_seqlens. */
static size_t stage_words(int64_t T) { return (size_t)(3 * T) + (size_t)(T + 2) / 2; }
static int64_t *stage_of(const lk_model *m) { return m->stage + (size_t)m->stage_slot * stage_words(m->T); }

/* Every op's saved bytes for T tokens (a layer's attention and rope queries read the
 * q/k/v shapes only), then one block for what the backward keeps and one for scratch. */
static lk_status alloc_acts(lk_model *m, int64_t T) {
    free_acts(m);
    m->T = T;
    int N = (int)m->cfg.num_hidden_layers;
    lk_status s = LK_OK;
    for (int l = 0; l < N && !s; l++) {
        lk_layer *L = &m->layers[l];
        lk_tensor x = lk_on(m, lk_tensor_2d(NULL, m->dt, T, m->H)),
                  q = lk_on(m, lk_tensor_2d(NULL, m->dt, m->Hq * T, m->D)),
                  k = lk_on(m, lk_tensor_2d(NULL, m->dt, m->Hk * T, m->D));
        lk_rope_args r = {.q = lk_on(m, lk_tensor_view(NULL, m->dt, 4, (int64_t[]){1, m->Hq, T, m->D})),
                          .k = lk_on(m, lk_tensor_view(NULL, m->dt, 4, (int64_t[]){1, m->Hk, T, m->D}))};
        lk_attention_args at = {.q = r.q, .k = r.k, .v = r.k};
        memset(L->saved, 0, sizeof L->saved);
        if ((s = lk_rms_norm_saved_bytes(L->ops.in_norm, &x, &L->saved[S_IN])) ||
            (s = lk_rms_norm_saved_bytes(L->ops.q_norm, &q, &L->saved[S_QN])) ||
            (s = lk_rms_norm_saved_bytes(L->ops.k_norm, &k, &L->saved[S_KN])) ||
            (s = lk_rms_norm_saved_bytes(L->ops.post_norm, &x, &L->saved[S_POST])) ||
            (s = lk_rope_saved_bytes(L->ops.rope, &r, &L->saved[S_ROPE])) ||
            (s = lk_attention_saved_bytes(L->ops.attn, &at, &L->saved[S_ATTN])))
            break;
        if (L->moe) {
            s = lk_qwen3_moe_saved(m, l, T, &L->saved[S_ROUTER], &L->saved[S_EXPERTS]);
        } else {
            lk_tensor gu = lk_on(m, lk_tensor_2d(NULL, m->dt, 2 * m->I, m->H));
            s = lk_swiglu_mlp_saved_bytes(L->ops.mlp, &x, &gu, &L->saved[S_MLP]);
        }
    }
    lk_tensor hx = lk_on(m, lk_tensor_2d(NULL, m->dt, T, m->H));
    if (!s) s = lk_rms_norm_saved_bytes(m->final_norm_impl, &hx, &m->s_final_bytes);
    lk_cross_entropy_args ce = ce_args(m);
    if (!s) s = lk_cross_entropy_saved_bytes(m->ce_impl, &ce, &m->s_ce_bytes);
    if (s) { free_acts(m); return s; }

    /* kept: layer inputs (and each recomputed layer's x2), per-layer blocks of the kept layers
     * (one shared block for the recomputed ones, the largest of theirs), final (the loss's
     * saved block lies in the scratch, below) */
    size_t es = m->es, TH = (size_t)(T * m->H) * es, shared_max = 0, layers_sum = 0, kept = 0;
    const int R = m->recompute;
    for (int l = 0; l < N; l++) {
        size_t b = lk_qwen3_layer_carve(m, l, NULL, NULL);
        if (lk_recomputed(m, l) && b > shared_max) shared_max = b;
        if (!lk_recomputed(m, l)) layers_sum += b;
    }
    kept = (size_t)(N + 1 + R) * lk_align64(TH) + lk_align64(TH) + lk_align64(m->s_final_bytes);
    m->acts = calloc((size_t)N, sizeof *m->acts);
    m->inputs = calloc((size_t)N + 1, sizeof *m->inputs);
    m->x2s = R ? calloc((size_t)R, sizeof *m->x2s) : NULL;
    m->act_block = m->dev->alloc(lk_align64(kept + shared_max + layers_sum));
    if (!m->acts || !m->inputs || (R && !m->x2s) || !m->act_block) {
        free_acts(m);
        return lk_error(LK_ENOMEM, "model: activations: out of memory");
    }
    unsigned char *base = m->act_block;
    size_t u = 0;
    for (int l = 0; l <= N; l++) m->inputs[l] = lk_carve(base, &u, TH);
    for (int l = 0; l < R; l++) m->x2s[l] = lk_carve(base, &u, TH);
    m->hf = lk_carve(base, &u, TH);
    m->s_final = lk_carve(base, &u, m->s_final_bytes);
    u = lk_align64(u);
    m->shared = base + u;
    u += shared_max;
    for (int l = 0; l < N; l++) {   /* the recomputed layers are carved as they run (carve_layer) */
        if (lk_recomputed(m, l)) m->acts[l].x2 = m->x2s[l];
        else u += lk_qwen3_layer_carve(m, l, base + u, &m->acts[l]);
        m->acts[l].x = m->inputs[l];
    }
    m->activation_bytes = kept + layers_sum;

    /* scratch: tmp is dres, dh2 and dqt lie in dao, dkt in dh when it fits (lk_scratch says why they may);
     * the loss's saved block (its f32 dW, 622 MB at vocab 151,936) lies over all of it but dh and res */
    int64_t Q = T * m->Hq * m->D, Kv = T * m->Hk * m->D, Tk = T * (m->K ? m->K : 1);
    int64_t nw = m->H > m->D ? m->H : m->D;
    int v_moves = 0, vt_again = 0;   /* some layer moves v head-major (sc.dvt); one of recompute_qkv's (sc.vt) */
    for (int l = 0; l < N; l++) {
        const int moves = !lk_qwen3_v_in_place(m, l);
        v_moves |= moves, vt_again |= moves && lk_qkv_again(m, l);
    }
    size_t su = 0;
    for (int pass = 0; pass < 2; pass++) {
        unsigned char *sb = pass ? m->scratch_block : NULL;
        su = 0;
        lk_scratch *c = &m->sc;
        c->dh = lk_carve(sb, &su, TH);
        c->res = lk_stream_in_x(m) ? NULL : lk_carve(sb, &su, (size_t)(T * m->H) * 4);
        const size_t rest = lk_align64(su);
        c->qkv = lk_carve(sb, &su, (Q + 2 * Kv) * es);
        c->tmp = c->dres = lk_carve(sb, &su, TH);
        c->dao = lk_carve(sb, &su, Q * es);
        c->dh2 = (size_t)Q * es >= TH ? c->dao : lk_carve(sb, &su, TH);
        c->dqr = lk_carve(sb, &su, Q * es); c->dkr = lk_carve(sb, &su, Kv * es);
        c->dvt = v_moves ? lk_carve(sb, &su, Kv * es) : NULL;
        c->dqt = c->dao;
        c->dkt = (size_t)Kv * es <= TH ? c->dh : lk_carve(sb, &su, Kv * es);
        c->dtw = lk_carve(sb, &su, Tk * 4);
        c->dw = lk_carve(sb, &su, nw * 4);
        size_t experts = 0;   /* the largest experts' saved block of the layers that make theirs again */
        int norms = 0, qkv = 0;
        for (int l = 0; l < N; l++) {
            norms |= lk_norms_again(m, l);
            qkv |= lk_qkv_again(m, l);
            if (lk_moe_again(m, l) && m->layers[l].saved[S_EXPERTS] > experts) experts = m->layers[l].saved[S_EXPERTS];
        }
        c->hn = norms ? lk_carve(sb, &su, TH) : NULL;
        c->experts = experts ? lk_carve(sb, &su, experts) : NULL;
        c->proj = qkv && !m->keep_qk ? lk_carve(sb, &su, (Q + 2 * Kv) * es) : NULL;
        c->qr = qkv ? lk_carve(sb, &su, Q * es) : NULL;
        c->kr = qkv ? lk_carve(sb, &su, Kv * es) : NULL;
        c->vt = vt_again ? lk_carve(sb, &su, Kv * es) : NULL;
        size_t past = rest;
        m->s_ce = lk_carve(sb, &past, m->s_ce_bytes);
        su = past > su ? past : su;
        if (!pass && !(m->scratch_block = m->dev->alloc(lk_align64(su)))) {
            free_acts(m);
            return lk_error(LK_ENOMEM, "model: scratch: out of memory");
        }
    }
    for (int l = 0; l < N; l++) {
        lk_layer_acts *a = &m->acts[l];
        if (lk_norms_again(m, l)) a->h1 = a->h2 = m->sc.hn;
        if (lk_moe_again(m, l)) a->s[S_EXPERTS] = m->sc.experts;
        if (lk_qkv_again(m, l)) a->qr = m->sc.qr, a->kr = m->sc.kr, a->vt = lk_qwen3_v_in_place(m, l) ? NULL : m->sc.vt;
    }
    if (m->dev->type != LK_DEVICE_CPU && (!(m->dev_tokens = m->dev->alloc((size_t)(3 * T) * 8)) ||
                                          !(m->stage = m->dev->host_alloc(LK_STAGE_SLOTS * stage_words(T) * 8)))) {
        free_acts(m);
        return lk_error(LK_ENOMEM, "model: token arrays: out of device or pinned host memory");
    }
    return LK_OK;
}

static lk_status check_batch(const lk_model *m, const lk_batch *b) {
    if (!b || b->B < 1 || b->S < 1 || !b->input_ids || !b->labels || !b->position_ids || !b->cu_seqlens)
        return lk_error(LK_EINVAL, "model: batch: expected B, S >= 1 and input_ids, labels, position_ids, cu_seqlens");
    int64_t T = b->B * b->S;
    if (b->n_segs < 1 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_segs] != T)
        return lk_error(LK_EINVAL, "model: batch: cu_seqlens: expected 0 .. %lld over n_segs %lld", (long long)T,
                        (long long)b->n_segs);
    for (int64_t i = 0; i < b->n_segs; i++)   /* the attention facade's rule; a replayed step skips the facade */
        if (b->cu_seqlens[i + 1] < b->cu_seqlens[i] || b->cu_seqlens[i + 1] - b->cu_seqlens[i] > b->max_seqlen)
            return lk_error(LK_EINVAL, "model: batch: cu_seqlens[%lld..%lld] = %d, %d: expected non-decreasing, "
                            "segments of at most max_seqlen %lld", (long long)i, (long long)i + 1, b->cu_seqlens[i],
                            b->cu_seqlens[i + 1], (long long)b->max_seqlen);
    for (int64_t t = 0; t < T; t++)
        if (b->input_ids[t] < 0 || b->input_ids[t] >= m->V)
            return lk_error(LK_EINVAL, "model: batch: input_ids[%lld]: expected 0 <= id < %lld, got %lld", (long long)t,
                            (long long)m->V, (long long)b->input_ids[t]);
    return LK_OK;
}

/* This rank's slice of the batch (all of it without SP) into m->local. */
static lk_status slice_batch(lk_model *m, const lk_batch *b) {
    int64_t all = b->B * b->S, P = group_size(m->sp);
    if (all % P)
        return lk_error(LK_EINVAL, "model: batch: B*S = %lld tokens: expected a multiple of the SP size %lld",
                        (long long)all, (long long)P);
    int64_t T = all / P, off = m->sp ? m->sp->rank * T : 0;
    m->local = *b;
    m->local.input_ids += off;
    m->local.labels += off;
    m->local.position_ids += off;
    return LK_OK;
}

/* Where the ops read this rank's ids, labels and positions and the batch's cu_seqlens:
 * on the CPU the batch's own; on a GPU the token arrays staged in pinned memory, and
 * copied over by copy_tokens (on the stream: a CUDA graph replays the copy, not this). */
static lk_status stage_tokens(lk_model *m, const lk_batch *whole) {
    const lk_batch *b = &m->local;
    m->ids = b->input_ids, m->labels = b->labels, m->pos = b->position_ids, m->cu = whole->cu_seqlens;
    if (!m->dev_tokens) return LK_OK;
    int64_t T = m->T, *h = stage_of(m), *d = m->dev_tokens;
    if (whole->n_segs > T)
        return lk_error(LK_EINVAL, "model: batch: n_segs %lld: expected at most the %lld tokens", (long long)whole->n_segs,
                        (long long)T);
    memcpy(h, b->input_ids, (size_t)T * 8);
    memcpy(h + T, b->labels, (size_t)T * 8);
    memcpy(h + 2 * T, b->position_ids, (size_t)T * 8);
    int32_t *cu = (int32_t *)(h + 3 * T);
    memcpy(cu, whole->cu_seqlens, (size_t)(whole->n_segs + 1) * 4);
    m->ids = d, m->labels = d + T, m->pos = d + 2 * T, m->cu = cu;
    return LK_OK;
}

static lk_status copy_tokens(lk_model *m) {
    return m->stage ? m->dev->put_async(m->dev_tokens, stage_of(m), (size_t)(3 * m->T) * 8, &m->ctx) : LK_OK;
}

/* The host side of a step: the batch checked, this rank's slice, the buffers for its
 * token count, the token arrays staged. */
static lk_status stage_batch(lk_model *m, const lk_batch *whole) {
    lk_status s = check_batch(m, whole);
    if (s || (s = slice_batch(m, whole))) return s;
    int64_t T = m->local.B * m->local.S / group_size(m->sp);
    if (T != m->T && (s = alloc_acts(m, T))) return s;
    if ((s = stage_tokens(m, whole))) return s;
    return m->flex ? lk_qwen3_doc_mask_stage(m, whole) : LK_OK;
}

lk_status lk_model_stage_batch(lk_model *m, const lk_batch *batch) {
    if (!m) return lk_error(LK_EINVAL, "model_stage_batch: expected a model");
    return stage_batch(m, batch);
}

static lk_rms_norm_args final_norm_args(lk_model *m) {
    int64_t T = m->T, H = m->H, N = (int64_t)m->cfg.num_hidden_layers;
    return (lk_rms_norm_args){.x = lk_on(m, lk_tensor_2d(m->inputs[N], m->dt, T, H)),
                              .weight = lk_master_1d(m, m->final_norm, H),   /* the master's values */
                              .y = lk_on(m, lk_tensor_2d(m->hf, m->dt, T, H)), .saved = {m->s_final, m->s_final_bytes},
                              .eps = m->cfg.rms_norm_eps};
}

/* The last forward's scalars from the device: this rank's loss (the CE op's reduction),
 * its valid tokens, the MoE layers' mean aux loss. */
static lk_status read_scalars(lk_model *m, lk_step_stats *st) {
    float loss = 0, aux = 0;
    int64_t nv = 0;
    lk_status s;
    if ((s = m->dev->get(&loss, m->scal, 4)) || (s = m->dev->get(&nv, m->scal + 4, 8)) ||
        (m->n_moe_layers && (s = m->dev->get(&aux, m->scal + 3, 4))))
        return s;
    *st = (lk_step_stats){.loss = loss, .aux_loss = m->n_moe_layers ? (double)aux / m->n_moe_layers : 0.0,
                          .n_tokens = nv};
    return LK_OK;
}

/* Layer l's activations: a recomputed layer's the shared block carved for l's layout
 * (they differ per layer), and x2 the kept one; always x the kept input. */
static void carve_layer(lk_model *m, int l) {
    if (lk_recomputed(m, l)) {
        lk_qwen3_layer_carve(m, l, m->shared, &m->acts[l]);
        m->acts[l].x2 = m->x2s[l];
    }
    m->acts[l].x = m->inputs[l];
}

/* The forward of the whole model; stats filled (unless deferred). b is m->local
 * (slice_batch). Under SP the loss and its count become the group's on the device, and
 * scal[1] the d_loss of loss_scale times the group's mean. */
static lk_status forward(lk_model *m, const lk_batch *whole, float loss_scale, lk_step_stats *st) {
    lk_status s = stage_batch(m, whole);
    if (s || (s = copy_tokens(m))) return s;
    const lk_batch *b = &m->local;
    int64_t T = m->T, H = m->H;
    if (m->flex && (s = lk_qwen3_doc_mask_put(m))) return s;
    /* the compute copy from the master, which the optimizer (or a load) changed; not when
     * the optimizer wrote both (lk_model_copy_is_current, for this forward alone) */
    const int current = m->copy_current;
    m->copy_current = 0;
    if (m->w && m->wc != m->w && !current && (s = m->dev->round(m->wc, m->w, m->n_floats, m->dt, &m->ctx))) return s;
    /* the stream starts as the f32 embedding (the master's row: what autocast gathers; under
     * a bf16 master the bf16 row, widened into the stream by adding it to -0.0); a bf16
     * stream as the compute copy's row, in the first layer's input */
    if (lk_stream_in_x(m)) {
        if ((s = m->dev->embed(lk_wc(m, m->embed), m->ids, m->inputs[0], T, H, m->V, m->dt, &m->ctx))) return s;
    } else if (m->w) {
        if ((s = m->dev->embed(m->w + m->embed, m->ids, m->sc.res, T, H, m->V, LK_F32, &m->ctx))) return s;
    } else if ((s = m->dev->embed(lk_wc(m, m->embed), m->ids, m->sc.tmp, T, H, m->V, m->dt, &m->ctx)) ||
               (s = m->dev->fill(m->sc.res, -0.0f, T * H, &m->ctx)) ||
               (s = m->dev->acc(m->sc.res, LK_F32, m->sc.tmp, m->dt, T * H, &m->ctx))) {
        return s;
    }
    int N = (int)m->cfg.num_hidden_layers;
    if (m->n_moe_layers && (s = m->dev->zero(m->scal + 3, 4, &m->ctx))) return s;   /* the MoE layers' aux sum */
    for (int l = 0; l < N; l++) {
        carve_layer(m, l);
        if ((s = lk_qwen3_layer_forward(m, l, &m->acts[l], b, 1, 1))) return s;
    }
    lk_rms_norm_args n = final_norm_args(m);   /* + the last MLP's output; writes inputs[N] */
    n.residual = lk_stream_in_x(m) ? lk_on(m, lk_tensor_2d(m->acts[N - 1].x2, m->dt, T, H))
                                   : lk_on(m, lk_tensor_2d(m->sc.res, LK_F32, T, H));
    n.delta = lk_on(m, lk_tensor_2d(m->sc.tmp, m->dt, T, H));
    if ((s = lk_rms_norm_forward(m->final_norm_impl, &n, &m->ctx))) return s;
    lk_cross_entropy_args ce = ce_args(m);
    *st = (lk_step_stats){.loss = NAN};
    if ((s = lk_cross_entropy_forward(m->ce_impl, &ce, &m->ctx)) ||
        (m->sp && (s = m->dev->group_loss(m->scal, loss_scale, m->sp, &m->ctx))))
        return s;
    return m->defer_stats ? LK_OK : read_scalars(m, st);
}

lk_status lk_model_defer_stats(lk_model *m, int on) {
    if (!m) return lk_error(LK_EINVAL, "model_defer_stats: expected a model");
    m->defer_stats = on ? 1 : 0;
    return LK_OK;
}

lk_status lk_model_set_stage_slot(lk_model *m, int slot) {
    if (!m) return lk_error(LK_EINVAL, "model_set_stage_slot: expected a model");
    if (slot != 0 && slot != 1) return lk_error(LK_EINVAL, "model_set_stage_slot: slot: expected 0 or 1, got %d", slot);
    m->stage_slot = slot;
    return LK_OK;
}

const float *lk_model_loss_device(const lk_model *m) { return m && m->dev_tokens ? m->scal : NULL; }

lk_status lk_model_read_stats(lk_model *m, lk_step_stats *st) {
    if (!m || !st) return lk_error(LK_EINVAL, "model_read_stats: expected a model and stats");
    return read_scalars(m, st);
}

void lk_model_set_stream(lk_model *m, void *stream) {
    if (m) m->ctx.stream = stream;
}

lk_status lk_model_loss(lk_model *m, const lk_batch *batch, lk_step_stats *stats) {
    if (!m || !stats) return lk_error(LK_EINVAL, "model_loss: expected a model and stats");
    lk_step_stats st;
    lk_status s = forward(m, batch, 1.0f, &st);
    if (!s) *stats = st;
    return s;
}

/* The recompute block for layer l: the shared one, carved for l's layout. */
static const lk_layer_acts *acts_for_backward(lk_model *m, int l, const lk_batch *b, lk_status *s) {
    if (!lk_recomputed(m, l)) return &m->acts[l];
    carve_layer(m, l);
    *s = lk_qwen3_layer_forward(m, l, &m->acts[l], b, 0, 0);
    return &m->acts[l];
}

void lk_model_on_grads_ready(lk_model *m, void (*fn)(void *user, int64_t first), void *user) {
    if (m) m->grads_ready = fn, m->grads_ready_user = user;
}

static void grads_ready(lk_model *m, int64_t first) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_user, first);
}

lk_status lk_model_forward_backward(lk_model *m, const lk_batch *batch, float loss_scale, lk_step_stats *stats) {
    if (!m || !stats) return lk_error(LK_EINVAL, "model_forward_backward: expected a model and stats");
    if (!(loss_scale == loss_scale) || loss_scale > 1e30f || loss_scale < -1e30f)
        return lk_error(LK_EINVAL, "model_forward_backward: loss_scale: expected a finite value, got %g", (double)loss_scale);
    lk_step_stats st;
    lk_status s = forward(m, batch, loss_scale, &st);
    if (s) return s;
    int N = (int)m->cfg.num_hidden_layers;
    int64_t T = m->T, H = m->H;
    const lk_batch *b = &m->local;   /* this rank's slice, set by the forward */
    lk_cross_entropy_args ce = ce_args(m);
    ce.d_loss = lk_on(m, lk_tensor_1d(m->scal + 1, LK_F32, 1));
    ce.d_hidden = lk_on(m, lk_tensor_2d(m->sc.dh, m->dt, T, H));
    ce.d_weight = lk_on(m, lk_tensor_2d(lk_gc(m, m->lm_head), m->gdt, m->V, H));
    /* a host-to-device copy (a sync on a GPU) only when the scale changes; under SP the
     * forward wrote it */
    if (!m->sp && loss_scale != m->d_loss_put) {
        if ((s = m->dev->put(m->scal + 1, &loss_scale, 4))) return s;
        m->d_loss_put = loss_scale;
    }
    if ((s = lk_cross_entropy_backward(m->ce_impl, &ce, &m->ctx))) return s;
    /* the stream's gradient starts at -0.0 (device.h's fill: x + -0.0 is x, bit for bit) and
     * takes the final norm's dx; dres its rounding. A bf16 stream starts as that dx in dres. */
    const int in_x = lk_stream_in_x(m);
    lk_rms_norm_args n = final_norm_args(m);
    n.dy = lk_on(m, lk_tensor_2d(m->sc.dh, m->dt, T, H));
    n.dx = lk_on(m, lk_tensor_2d(m->sc.dres, m->dt, T, H));
    n.dweight = lk_on(m, lk_tensor_1d(m->sc.dw, n.weight.dtype, H));
    if (!in_x) n.residual = lk_on(m, lk_tensor_2d(m->sc.res, LK_F32, T, H));
    if ((!in_x && (s = m->dev->fill(m->sc.res, -0.0f, T * H, &m->ctx))) ||
        (s = lk_rms_norm_backward(m->final_norm_impl, &n, &m->ctx)) ||
        (s = m->dev->acc(lk_gc(m, m->final_norm), m->gdt, m->sc.dw, n.weight.dtype, H, &m->ctx)))
        return s;
    grads_ready(m, m->final_norm);   /* the final norm and an untied lm_head follow the layers */
    /* the aux loss is the mean over MoE layers, scaled by its coefficient */
    float d_aux = m->n_moe_layers ? (float)(m->cfg.router_aux_loss_coef * loss_scale / m->n_moe_layers) : 0.0f;
    for (int l = N - 1; l >= 0; l--) {
        const lk_layer_acts *a = acts_for_backward(m, l, b, &s);
        if (s || (s = lk_qwen3_layer_backward(m, l, a, b, d_aux))) return s;
        grads_ready(m, m->layers[l].first);
    }
    m->experts_unwritten = 0;   /* every MoE layer wrote its experts' gradients */
    /* embedding: scatter-add by token, repeated ids in one fixed order */
    if ((s = m->dev->embed_backward(lk_gc(m, m->embed), m->gdt, m->ids, in_x ? m->sc.dres : (void *)m->sc.res, T, H,
                                    m->V, in_x ? m->dt : LK_F32, &m->ctx)))
        return s;
    grads_ready(m, 0);
    *stats = st;
    return LK_OK;
}

size_t lk_model_activation_bytes(const lk_model *m) { return m ? m->activation_bytes : 0; }

const lk_model_device *lk_model_device_of(const lk_model *m) { return m->dev; }
