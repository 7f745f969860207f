/* train_yaml.c — the training sections of a YAML config (train.h), entered from yaml.c's
 * top level and walked with yaml_walk.c's helpers, so every error carries file:line:column:
 *
 *   model:
 *     config_json: tiny.json        # or inline keys (they override config_json's)
 *     hidden_size: 64
 *     num_experts: 8                # > 0 makes it Qwen3-MoE
 *     init_from: Qwen3-0.6B          # or: a Hugging Face directory, its config.json and weights
 *   train: { steps: 200, lr: 3e-3, betas: [0.9, 0.95], batch_size: 4, seq_len: 128 }
 *   data:  { corpus: builtin }      # or text: file.txt, or tokens: file.lktok
 *   parallel: { dp: 2, sp: 1, ep: 1 }   # under mpirun; dp 0 (the default) = every rank
 *   # train.comm_timeout_s: 300 (the default): a collective stuck longer ends the job
 *   # train.max_shard_size: 5GB, train.memory_limit: 16GiB (sizes: B, KB, MB, GB, KiB, MiB, GiB, TiB)
 *   # train.log_every: 50 (0, the default: from the run's length)
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "config/yaml_loader.h"
#include "llmkern/checkpoint.h"
#include "llmkern/data.h"

void lk_train_config_init(lk_train_config *tc) {
    memset(tc, 0, sizeof *tc);
    lk_qwen3_config_init(&tc->model, 0);
    tc->steps = 100; tc->warmup_steps = 10;
    tc->batch_size = 4; tc->seq_len = 128; tc->grad_accum = 1;
    tc->lr = 1e-3; tc->min_lr = 1e-4; tc->weight_decay = 0.1;
    tc->beta1 = 0.9; tc->beta2 = 0.95; tc->eps = 1e-8; tc->grad_clip = 1.0;
    tc->seed = 1234;
    snprintf(tc->out, sizeof tc->out, "out");
    tc->data = LK_DATA_BUILTIN;
    tc->corpus_docs = LK_CORPUS_DEFAULT_DOCS;
    tc->eos_id = LK_EOS_FROM_FILE;   /* a version-2 token file's own; none for version 1 */
    tc->dp = 0; tc->sp = 1; tc->ep = 1;
    tc->comm_timeout_s = 300;
    tc->fp32_residual_connection = 1;
    tc->max_shard_size = LK_ST_DEFAULT_MAX_SHARD;
    tc->dtype = LK_DTYPE_COUNT;
    tc->grad_reduce_dtype = LK_F32;
    tc->exp_avg_dtype = tc->exp_avg_sq_dtype = LK_F32;
    tc->main_params_dtype = LK_F32;
    tc->main_grads_dtype = LK_F32;
}

lk_dtype lk_train_dtype(const lk_train_config *tc) {
    if (tc->dtype != LK_DTYPE_COUNT) return tc->dtype;
    return tc->device == LK_DEVICE_CPU ? LK_F32 : LK_BF16;
}

lk_status lk_train_config_init_from(lk_train_config *tc, const char *dir) {
    if (!tc || !dir || !dir[0])
        return lk_error(LK_EINVAL, "train: --init: expected a checkpoint directory, got %s", dir ? "''" : "NULL");
    static lk_qwen3_config c;   /* large (its lists): not on the stack */
    char path[600];
    if (strlen(dir) >= sizeof tc->init_from || (size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return lk_error(LK_EINVAL, "train: --init %s: expected a path of at most %zu bytes", dir, sizeof tc->init_from - 1);
    lk_status s = lk_qwen3_config_read(path, &c);
    if (s) {
        char why[512];
        snprintf(why, sizeof why, "%s", lk_last_error());
        return lk_error(s, "train: --init %s: %s", dir, why);
    }
    tc->model = c;
    tc->has_model = 1;
    snprintf(tc->init_from, sizeof tc->init_from, "%s", dir);
    return LK_OK;
}

/* --- typed scalars ------------------------------------------------------------------ */

static lk_status get_i64(const loader *l, const yaml_node_t *v, const char *key, int64_t min, int64_t *out) {
    if (v->type != YAML_SCALAR_NODE) return bad_value(l, v, key, "an integer");
    char *end;
    errno = 0;
    long long x = strtoll(scalar(v), &end, 10);
    if (end == scalar(v) || *end || errno || x < min) {
        char want[64];
        snprintf(want, sizeof want, "an integer >= %lld", (long long)min);
        return bad_value(l, v, key, want);
    }
    *out = x;
    return LK_OK;
}

static lk_status get_f64(const loader *l, const yaml_node_t *v, const char *key, double min, double *out) {
    if (v->type != YAML_SCALAR_NODE) return bad_value(l, v, key, "a number");
    char *end;
    double x = strtod(scalar(v), &end);
    if (end == scalar(v) || *end || !isfinite(x) || x < min) {
        char want[64];
        snprintf(want, sizeof want, "a finite number >= %g", min);
        return bad_value(l, v, key, want);
    }
    *out = x;
    return LK_OK;
}

static lk_status get_bool(const loader *l, const yaml_node_t *v, const char *key, int *out) {
    const char *t = v->type == YAML_SCALAR_NODE ? scalar(v) : "";
    if (strcmp(t, "true") == 0 || strcmp(t, "1") == 0) *out = 1;
    else if (strcmp(t, "false") == 0 || strcmp(t, "0") == 0) *out = 0;
    else return bad_value(l, v, key, "true or false");
    return LK_OK;
}

/* bf16 or f32, by our names or torch's (as config.json's torch_dtype). */
static lk_status get_float_dtype(const loader *l, const yaml_node_t *v, const char *key, lk_dtype *out) {
    const char *d = v->type == YAML_SCALAR_NODE ? scalar(v) : "";
    if (strcmp(d, "bf16") == 0 || strcmp(d, "bfloat16") == 0) *out = LK_BF16;
    else if (strcmp(d, "f32") == 0 || strcmp(d, "float32") == 0) *out = LK_F32;
    else return bad_value(l, v, key, "bf16 (bfloat16) or f32 (float32)");
    return LK_OK;
}

/* A size in bytes: an integer, or a number with a unit as transformers' max_shard_size
 * takes them (B, KB, MB, GB, TB decimal; KiB, MiB, GiB, TiB binary; any case), >= 1. */
static lk_status get_bytes(const loader *l, const yaml_node_t *v, const char *key, uint64_t *out) {
    static const struct { const char *unit; double scale; } units[] = {
        {"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    };
    const char *want = "a size in bytes (e.g. 5GB, 512MiB, 1000000)";
    if (v->type != YAML_SCALAR_NODE) return bad_value(l, v, key, want);
    char *end;
    errno = 0;
    double x = strtod(scalar(v), &end);
    if (end == scalar(v) || errno || !isfinite(x) || x < 0) return bad_value(l, v, key, want);
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strcasecmp(end, units[i].unit) != 0) continue;
        double b = x * units[i].scale;
        if (b < 1 || b >= 9.2e18 || (i == 0 && b != (double)(uint64_t)b)) return bad_value(l, v, key, want);
        *out = (uint64_t)b;
        return LK_OK;
    }
    return bad_value(l, v, key, want);
}

/* A path: relative ones are taken from the YAML file's directory. */
static lk_status get_path(const loader *l, const yaml_node_t *v, const char *key, char *out, size_t n) {
    if (v->type != YAML_SCALAR_NODE || scalar(v)[0] == '\0') return bad_value(l, v, key, "a path");
    const char *slash = strrchr(l->path, '/');
    int dir = scalar(v)[0] == '/' || slash == NULL ? 0 : (int)(slash - l->path + 1);
    if ((size_t)snprintf(out, n, "%.*s%s", dir, l->path, scalar(v)) >= n) return bad_value(l, v, key, "a shorter path");
    return LK_OK;
}

/* --- model: ------------------------------------------------------------------------- */
typedef enum { T_I64, T_F64, T_BOOL, T_STR } kind;
typedef struct { const char *name; kind type; size_t off; double min; } field;
#define I(n, m) {#n, T_I64, offsetof(lk_qwen3_config, n), m}
#define D(n, m) {#n, T_F64, offsetof(lk_qwen3_config, n), m}
#define B(n) {#n, T_BOOL, offsetof(lk_qwen3_config, n), 0}
static const field arch_fields[] = {
    I(hidden_size, 1), I(num_hidden_layers, 1), I(num_attention_heads, 1), I(num_key_value_heads, 1),
    I(head_dim, 1), I(intermediate_size, 1), I(vocab_size, 1), I(max_position_embeddings, 1),
    I(num_experts, 0), I(num_experts_per_tok, 0), I(moe_intermediate_size, 0), I(decoder_sparse_step, 1),
    I(sliding_window, 1), I(max_window_layers, 0), B(use_sliding_window),
    D(rope_theta, 1e-9), D(rms_norm_eps, 1e-30), D(initializer_range, 0), D(router_aux_loss_coef, 0),
    B(tie_word_embeddings), B(norm_topk_prob),
    {"torch_dtype", T_STR, offsetof(lk_qwen3_config, torch_dtype), 0},
    {NULL, 0, 0, 0},
};
#undef I
#undef D
#undef B
static const char *const model_keys[] = {"ops_implementation", "moe", "backend", "config_json", "init_from", "hidden_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "vocab_size", "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "decoder_sparse_step", "sliding_window", "max_window_layers", "use_sliding_window", "rope_theta", "rms_norm_eps",
    "initializer_range", "router_aux_loss_coef", "tie_word_embeddings", "norm_topk_prob", "torch_dtype", NULL};

lk_status lk_yaml_model_begin(loader *l, const yaml_node_t *model) {
    lk_status s = expect(l, model, YAML_MAPPING_NODE, "model");
    int seen = 0;
    for (yaml_node_pair_t *p = model->data.mapping.pairs.start; !s && p < model->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(l->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(l->doc, p->value);
        if (k->type != YAML_SCALAR_NODE) continue;
        int init = strcmp(scalar(k), "init_from") == 0;
        if (!init && strcmp(scalar(k), "config_json") != 0) continue;
        char path[512], w[192];
        where(l, k, w, sizeof w);
        if (seen++)   /* the other of the two came first */
            return lk_error(LK_EINVAL, "%s: model.%s: expected one of config_json and init_from (init_from reads "
                            "the directory's config.json), got both", w, scalar(k));
        if ((s = get_path(l, v, init ? "model.init_from" : "model.config_json", path, sizeof path))) return s;
        if (init) {
            snprintf(l->train->init_from, sizeof l->train->init_from, "%s", path);
            if ((size_t)snprintf(path, sizeof path, "%s/config.json", l->train->init_from) >= sizeof path)
                return bad_value(l, v, "model.init_from", "a shorter path");
        }
        if ((s = lk_qwen3_config_read(path, &l->train->model))) {
            char why[512];
            snprintf(why, sizeof why, "%s", lk_last_error());   /* lk_error rewrites that buffer */
            where(l, v, w, sizeof w);
            return lk_error(s, "%s: model.%s: %s", w, init ? "init_from" : "config_json", why);
        }
        l->train->has_model = 1;
    }
    return s;
}

lk_status lk_yaml_model_arch_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    if (strcmp(scalar(k), "config_json") == 0 || strcmp(scalar(k), "init_from") == 0)
        return LK_OK;   /* read by lk_yaml_model_begin */
    char key[96];
    snprintf(key, sizeof key, "model.%s", scalar(k));
    char *c = (char *)&l->train->model;
    for (const field *f = arch_fields; f->name; f++) {
        if (strcmp(scalar(k), f->name) != 0) continue;
        l->arch_keys++;
        switch (f->type) {
        case T_I64: return get_i64(l, v, key, (int64_t)f->min, (int64_t *)(c + f->off));
        case T_F64: return get_f64(l, v, key, f->min, (double *)(c + f->off));
        case T_BOOL: return get_bool(l, v, key, (int *)(c + f->off));
        case T_STR:
            if (v->type != YAML_SCALAR_NODE || strlen(scalar(v)) >= 16) return bad_value(l, v, key, "bfloat16 or float32");
            snprintf(c + f->off, 16, "%s", scalar(v));
            return LK_OK;
        }
    }
    return unknown_key(l, k, "model", model_keys);
}

/* --- train: ------------------------------------------------------------------------- */
static const char *const train_keys[] = {"steps", "lr", "min_lr", "warmup_steps", "weight_decay", "betas",
    "eps", "grad_clip", "batch_size", "seq_len", "grad_accum", "seed", "save_every", "out", "recompute", "device",
    "comm_timeout_s", "max_shard_size", "log_every", "memory_limit", "dtype", "cuda_graph", "deterministic", "keep_qk",
    "grad_reduce_dtype", "profile_step", "exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype", "main_grads_dtype",
    "lm_head_chunk_bytes", "recompute_modules", "recompute_num_layers", "fp32_residual_connection",
    NULL};

lk_status lk_yaml_train_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    lk_train_config *t = l->train;
    const char *n = scalar(k);
    if (strcmp(n, "steps") == 0) return get_i64(l, v, "train.steps", 1, &t->steps);
    if (strcmp(n, "lr") == 0) return get_f64(l, v, "train.lr", 0, &t->lr);
    if (strcmp(n, "min_lr") == 0) return get_f64(l, v, "train.min_lr", 0, &t->min_lr);
    if (strcmp(n, "warmup_steps") == 0) return get_i64(l, v, "train.warmup_steps", 0, &t->warmup_steps);
    if (strcmp(n, "weight_decay") == 0) return get_f64(l, v, "train.weight_decay", 0, &t->weight_decay);
    if (strcmp(n, "eps") == 0) return get_f64(l, v, "train.eps", 0, &t->eps);
    if (strcmp(n, "grad_clip") == 0) return get_f64(l, v, "train.grad_clip", 0, &t->grad_clip);
    if (strcmp(n, "batch_size") == 0) return get_i64(l, v, "train.batch_size", 1, &t->batch_size);
    if (strcmp(n, "seq_len") == 0) return get_i64(l, v, "train.seq_len", 2, &t->seq_len);
    if (strcmp(n, "grad_accum") == 0) return get_i64(l, v, "train.grad_accum", 1, &t->grad_accum);
    if (strcmp(n, "save_every") == 0) return get_i64(l, v, "train.save_every", 0, &t->save_every);
    if (strcmp(n, "recompute") == 0) return get_bool(l, v, "train.recompute", &t->recompute);
    if (strcmp(n, "recompute_num_layers") == 0)
        return get_i64(l, v, "train.recompute_num_layers", 0, &t->recompute_num_layers);
    if (strcmp(n, "cuda_graph") == 0) return get_bool(l, v, "train.cuda_graph", &t->cuda_graph);
    if (strcmp(n, "deterministic") == 0) return get_bool(l, v, "train.deterministic", &t->deterministic);
    if (strcmp(n, "keep_qk") == 0) return get_bool(l, v, "train.keep_qk", &t->keep_qk);
    if (strcmp(n, "fp32_residual_connection") == 0)
        return get_bool(l, v, "train.fp32_residual_connection", &t->fp32_residual_connection);
    if (strcmp(n, "lm_head_chunk_bytes") == 0)
        return get_bytes(l, v, "train.lm_head_chunk_bytes", &t->lm_head_chunk_bytes);
    if (strcmp(n, "grad_reduce_dtype") == 0)
        return get_float_dtype(l, v, "train.grad_reduce_dtype", &t->grad_reduce_dtype);
    if (strcmp(n, "exp_avg_dtype") == 0) return get_float_dtype(l, v, "train.exp_avg_dtype", &t->exp_avg_dtype);
    if (strcmp(n, "exp_avg_sq_dtype") == 0)
        return get_float_dtype(l, v, "train.exp_avg_sq_dtype", &t->exp_avg_sq_dtype);
    if (strcmp(n, "main_params_dtype") == 0)
        return get_float_dtype(l, v, "train.main_params_dtype", &t->main_params_dtype);
    if (strcmp(n, "main_grads_dtype") == 0)
        return get_float_dtype(l, v, "train.main_grads_dtype", &t->main_grads_dtype);
    if (strcmp(n, "profile_step") == 0) return get_i64(l, v, "train.profile_step", 0, &t->profile_step);
    if (strcmp(n, "dtype") == 0) return get_float_dtype(l, v, "train.dtype", &t->dtype);
    if (strcmp(n, "comm_timeout_s") == 0) return get_f64(l, v, "train.comm_timeout_s", 0, &t->comm_timeout_s);
    if (strcmp(n, "max_shard_size") == 0) return get_bytes(l, v, "train.max_shard_size", &t->max_shard_size);
    if (strcmp(n, "memory_limit") == 0) return get_bytes(l, v, "train.memory_limit", &t->memory_limit);
    if (strcmp(n, "log_every") == 0) return get_i64(l, v, "train.log_every", 0, &t->log_every);
    if (strcmp(n, "seed") == 0) {
        int64_t seed;
        lk_status s = get_i64(l, v, "train.seed", 0, &seed);
        if (!s) t->seed = (uint64_t)seed;
        return s;
    }
    if (strcmp(n, "device") == 0) {
        const char *d = v->type == YAML_SCALAR_NODE ? scalar(v) : "";
        if (strcmp(d, "cpu") != 0 && strcmp(d, "cuda") != 0) return bad_value(l, v, "train.device", "cpu or cuda");
        t->device = strcmp(d, "cuda") == 0 ? LK_DEVICE_CUDA : LK_DEVICE_CPU;
        return LK_OK;
    }
    if (strcmp(n, "out") == 0) {
        if (v->type != YAML_SCALAR_NODE || scalar(v)[0] == '\0' || strlen(scalar(v)) >= sizeof t->out)
            return bad_value(l, v, "train.out", "a directory");
        snprintf(t->out, sizeof t->out, "%s", scalar(v));
        return LK_OK;
    }
    if (strcmp(n, "betas") == 0) {
        yaml_node_item_t *it = v->type == YAML_SEQUENCE_NODE ? v->data.sequence.items.start : NULL;
        if (it == NULL || v->data.sequence.items.top - it != 2) return bad_value(l, v, "train.betas", "a list of two numbers");
        double b[2];
        for (int i = 0; i < 2; i++) {
            lk_status s = get_f64(l, yaml_document_get_node(l->doc, it[i]), "train.betas", 0, &b[i]);
            if (s) return s;
            if (b[i] >= 1.0) return bad_value(l, yaml_document_get_node(l->doc, it[i]), "train.betas", "a number below 1");
        }
        t->beta1 = b[0];
        t->beta2 = b[1];
        return LK_OK;
    }
    if (strcmp(n, "recompute_modules") == 0) {   /* Megatron's names, each alone or name:N (the first N layers) */
        static const char *const names[LK_RECOMPUTE_MODULES] = LK_RECOMPUTE_MODULE_NAMES;
        static const char *const want = "layernorm, moe or qkv, alone or name:N (the first N layers: moe:6); "
                                        "Megatron's core_attn, mlp, moe_act and the rest are not made again apart: "
                                        "train.recompute makes the whole layer again";
        if (v->type != YAML_SEQUENCE_NODE)
            return bad_value(l, v, "train.recompute_modules", "a list (of: layernorm, moe, qkv; name:N for the "
                             "first N layers)");
        unsigned bits = 0;
        int64_t layers[LK_RECOMPUTE_MODULES] = {0};
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
            const yaml_node_t *e = yaml_document_get_node(l->doc, *it);
            const char *name = e->type == YAML_SCALAR_NODE ? scalar(e) : "", *colon = strchr(name, ':');
            size_t len = colon ? (size_t)(colon - name) : strlen(name);
            int b = -1;
            for (int i = 0; i < LK_RECOMPUTE_MODULES; i++)
                if (strlen(names[i]) == len && strncmp(name, names[i], len) == 0) b = i;
            char *end = NULL;
            long long count = colon ? strtoll(colon + 1, &end, 10) : 0;
            if (b < 0 || (colon && (end == colon + 1 || *end || count < 1)))
                return bad_value(l, e, "train.recompute_modules", want);
            bits |= 1u << b;
            layers[b] = count;
        }
        t->recompute_modules = bits;
        memcpy(t->recompute_module_layers, layers, sizeof layers);
        return LK_OK;
    }
    return unknown_key(l, k, "train", train_keys);
}

/* --- data: -------------------------------------------------------------------------- */
static const char *const data_keys[] = {"corpus", "docs", "text", "tokens", "eos_id", NULL};

lk_status lk_yaml_data_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    lk_train_config *t = l->train;
    const char *n = scalar(k);
    if (strcmp(n, "docs") == 0) return get_i64(l, v, "data.docs", 1, &t->corpus_docs);
    if (strcmp(n, "eos_id") == 0) return get_i64(l, v, "data.eos_id", -1, &t->eos_id);
    int is_corpus = strcmp(n, "corpus") == 0, is_text = strcmp(n, "text") == 0, is_tokens = strcmp(n, "tokens") == 0;
    if (!is_corpus && !is_text && !is_tokens) return unknown_key(l, k, "data", data_keys);
    if (l->data_sources++) {
        char w[192];
        where(l, k, w, sizeof w);
        return lk_error(LK_EINVAL, "%s: data.%s: expected one source (corpus, text or tokens), got a second", w, n);
    }
    if (is_corpus) {
        if (v->type != YAML_SCALAR_NODE || strcmp(scalar(v), "builtin") != 0) return bad_value(l, v, "data.corpus", "builtin");
        t->data = LK_DATA_BUILTIN;
        return LK_OK;
    }
    t->data = is_text ? LK_DATA_TEXT : LK_DATA_TOKENS;
    return get_path(l, v, is_text ? "data.text" : "data.tokens", t->data_path, sizeof t->data_path);
}

/* --- parallel: ---------------------------------------------------------------------- */
static const char *const parallel_keys[] = {"dp", "sp", "ep", NULL};

lk_status lk_yaml_parallel_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    lk_train_config *t = l->train;
    const char *n = scalar(k);
    if (strcmp(n, "dp") == 0) return get_i64(l, v, "parallel.dp", 0, &t->dp);
    int is_sp = strcmp(n, "sp") == 0;
    if (!is_sp && strcmp(n, "ep") != 0) return unknown_key(l, k, "parallel", parallel_keys);
    return get_i64(l, v, is_sp ? "parallel.sp" : "parallel.ep", 1, is_sp ? &t->sp : &t->ep);
}

lk_status lk_yaml_finish(loader *l) {
    lk_train_config *t = l->train;
    if (l->arch_keys) {
        lk_qwen3_config *c = &t->model;
        c->moe = c->num_experts > 0;
        snprintf(c->model_type, sizeof c->model_type, "%s", c->moe ? "qwen3_moe" : "qwen3");
        snprintf(c->architectures, sizeof c->architectures, "%s", c->moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM");
        lk_status s = lk_qwen3_config_validate(c, l->path);
        if (s) {
            char why[512];
            snprintf(why, sizeof why, "%s", lk_last_error());
            return lk_error(s, "%s: model: %s", l->path, why);
        }
        t->has_model = 1;
    }
    if (t->min_lr > t->lr)
        return lk_error(LK_EINVAL, "%s: train.min_lr: expected at most lr (%g), got %g", l->path, t->lr, t->min_lr);
    return LK_OK;
}
