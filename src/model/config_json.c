/* config_json.c — config.json of Qwen3 / Qwen3-MoE: read (jansson through json.h; strict
 * types, a repeated key refused, unknown keys ignored; transformers 5's names too:
 * get_key), validate, and write as transformers' save_pretrained does (indent 2, keys
 * sorted). One table of plain keys drives both directions; the few keys with structure
 * (architectures, model_type, layer_types, mlp_only_layers, rope_scaling) are handled
 * beside it. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/checkpoint.h"
#include "llmkern/hf_config.h"
#include "json.h"

#define MAX_CONFIG_BYTES (16u << 20)

typedef enum { F_INT, F_INT_OR_NULL, F_NUM, F_BOOL, F_STR, F_SPECIAL } ftype;
enum { BOTH = 0, MOE_ONLY = 1 };
typedef struct { const char *key; ftype type; size_t off, size; int required, moe_only; } field;

#define F(k, t, req, moe) {#k, t, offsetof(lk_qwen3_config, k), sizeof(((lk_qwen3_config *)0)->k), req, moe}
#define S(k, moe) {#k, F_SPECIAL, 0, 0, 0, moe}
/* In sorted order: the writer walks it as it is. */
static const field fields[] = {
    S(architectures, BOTH),
    F(attention_bias, F_BOOL, 0, BOTH),
    F(attention_dropout, F_NUM, 0, BOTH),
    F(bos_token_id, F_INT_OR_NULL, 0, BOTH),
    F(decoder_sparse_step, F_INT, 0, MOE_ONLY),
    F(eos_token_id, F_INT_OR_NULL, 0, BOTH),
    F(head_dim, F_INT, 1, BOTH),
    F(hidden_act, F_STR, 0, BOTH),
    F(hidden_size, F_INT, 1, BOTH),
    F(initializer_range, F_NUM, 0, BOTH),
    F(intermediate_size, F_INT, 1, BOTH),
    S(layer_types, BOTH),
    F(max_position_embeddings, F_INT, 0, BOTH),
    F(max_window_layers, F_INT, 0, BOTH),
    S(mlp_only_layers, MOE_ONLY),
    S(model_type, BOTH),
    F(moe_intermediate_size, F_INT, 1, MOE_ONLY),
    F(norm_topk_prob, F_BOOL, 0, MOE_ONLY),
    F(num_attention_heads, F_INT, 1, BOTH),
    F(num_experts, F_INT, 1, MOE_ONLY),
    F(num_experts_per_tok, F_INT, 1, MOE_ONLY),
    F(num_hidden_layers, F_INT, 1, BOTH),
    F(num_key_value_heads, F_INT, 1, BOTH),
    F(output_router_logits, F_BOOL, 0, MOE_ONLY),
    F(rms_norm_eps, F_NUM, 1, BOTH),
    S(rope_scaling, BOTH),
    F(rope_theta, F_NUM, 1, BOTH),
    F(router_aux_loss_coef, F_NUM, 0, MOE_ONLY),
    F(sliding_window, F_INT_OR_NULL, 0, BOTH),
    F(tie_word_embeddings, F_BOOL, 0, BOTH),
    F(torch_dtype, F_STR, 0, BOTH),
    S(transformers_version, BOTH),
    F(use_cache, F_BOOL, 0, BOTH),
    F(use_sliding_window, F_BOOL, 0, BOTH),
    F(vocab_size, F_INT, 1, BOTH),
};
#define N_FIELDS (sizeof fields / sizeof *fields)
/* The oldest transformers with Qwen3 and Qwen3-MoE. */
#define TRANSFORMERS_VERSION "4.51.0"

static const struct { const char *model_type, *arch; } families[2] = {
    {"qwen3", "Qwen3ForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"}};

void lk_qwen3_config_init(lk_qwen3_config *c, int moe) {
    memset(c, 0, sizeof *c);
    c->moe = moe ? 1 : 0;
    snprintf(c->model_type, sizeof c->model_type, "%s", families[c->moe].model_type);
    snprintf(c->architectures, sizeof c->architectures, "%s", families[c->moe].arch);
    snprintf(c->hidden_act, sizeof c->hidden_act, "silu");
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
    c->max_position_embeddings = 32768;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-6;
    c->initializer_range = 0.02;
    c->use_cache = 1;
    c->bos_token_id = c->eos_token_id = c->sliding_window = -1;
    c->max_window_layers = 28;
    c->decoder_sparse_step = 1;
    c->router_aux_loss_coef = 0.001;
}

/* An error of the config.json named what (its path, or where it came from): s and the message fmt. */
#define bad(s, what, ...) lk_json_file_error(s, "config.json", what, __VA_ARGS__)

static lk_status wrong_type(const char *what, const char *key, const char *want, const json_t *v) {
    return bad(LK_EIO, what, "key '%s': expected %s, got %s", key, want, lk_json_type_name(v));
}

static lk_status read_plain(const field *f, const json_t *v, const char *what, lk_qwen3_config *c) {
    char *p = (char *)c + f->off;
    int64_t i;
    double d;
    switch (f->type) {
    case F_INT_OR_NULL:
        if (json_is_null(v)) { *(int64_t *)p = -1; return LK_OK; }
        /* fall through */
    case F_INT:
        if (lk_json_i64(v, &i)) return wrong_type(what, f->key, f->type == F_INT ? "an integer" : "an integer or null", v);
        *(int64_t *)p = i;
        return LK_OK;
    case F_NUM:
        if (lk_json_f64(v, &d)) return wrong_type(what, f->key, "a number", v);
        *(double *)p = d;
        return LK_OK;
    case F_BOOL:
        if (!json_is_boolean(v)) return wrong_type(what, f->key, "true or false", v);
        *(int *)p = json_is_true(v);
        return LK_OK;
    case F_STR:
        if (!json_is_string(v)) return wrong_type(what, f->key, "a string", v);
        if (json_string_length(v) >= f->size)
            return bad(LK_EIO, what, "key '%s': string of %zu bytes is too long", f->key, json_string_length(v));
        memcpy(p, json_string_value(v), json_string_length(v) + 1);
        return LK_OK;
    default:
        return LK_OK;
    }
}

/* model_type and architectures decide the family before anything else is read. */
static lk_status read_family(const json_t *root, const char *what, lk_qwen3_config *c) {
    const json_t *mt = json_object_get(root, "model_type"), *arch = json_object_get(root, "architectures");
    if (mt && !json_is_string(mt)) return wrong_type(what, "model_type", "a string", mt);
    if (arch && (!json_is_array(arch) || json_array_size(arch) != 1 || !json_is_string(json_array_get(arch, 0))))
        return bad(LK_EIO, what, "key 'architectures': expected a list of one string");
    if (!mt && !arch) return bad(LK_EIO, what, "missing required key 'model_type'");
    const char *mt_text = mt ? json_string_value(mt) : NULL, *arch_text = arch ? json_string_value(json_array_get(arch, 0)) : NULL;
    for (int moe = 0; moe < 2; moe++) {
        int mt_ok = mt && strcmp(mt_text, families[moe].model_type) == 0;
        int arch_ok = arch && strcmp(arch_text, families[moe].arch) == 0;
        if ((mt_ok || !mt) && (arch_ok || !arch)) { lk_qwen3_config_init(c, moe); return LK_OK; }
    }
    return bad(LK_EINVAL, what, "model_type '%s' with architectures ['%s']: expected qwen3 with Qwen3ForCausalLM "
               "or qwen3_moe with Qwen3MoeForCausalLM", mt ? mt_text : "(absent)", arch ? arch_text : "(absent)");
}

static lk_status read_special(const char *key, const json_t *v, const char *what, lk_qwen3_config *c) {
    if (strcmp(key, "mlp_only_layers") == 0) {
        if (!json_is_array(v)) return wrong_type(what, key, "a list of integers", v);
        if (json_array_size(v) > LK_QWEN3_MAX_LIST)
            return bad(LK_EIO, what, "key '%s': more than %d entries", key, LK_QWEN3_MAX_LIST);
        c->n_mlp_only_layers = 0;
        for (size_t k = 0; k < json_array_size(v); k++) {
            int64_t i;
            if (lk_json_i64(json_array_get(v, k), &i) || i < 0 || i > INT32_MAX)
                return bad(LK_EIO, what, "key '%s': expected a list of non-negative integers", key);
            c->mlp_only_layers[c->n_mlp_only_layers++] = (int)i;
        }
    } else if (strcmp(key, "layer_types") == 0) {
        if (!json_is_array(v)) return wrong_type(what, key, "a list of strings", v);
        if (json_array_size(v) > LK_QWEN3_MAX_LIST)
            return bad(LK_EIO, what, "key '%s': more than %d entries", key, LK_QWEN3_MAX_LIST);
        c->n_layer_types = 0;
        for (size_t k = 0; k < json_array_size(v); k++) {
            const json_t *e = json_array_get(v, k);
            const char *t = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(t, "full_attention") != 0 && strcmp(t, "sliding_attention") != 0)
                return bad(LK_EINVAL, what, "key '%s': entry %zu: expected \"full_attention\" or \"sliding_attention\" "
                           "(Qwen3's kinds), got %s", key, k, json_is_string(e) ? t : "a non-string");
            c->sliding_layer[c->n_layer_types++] = t[0] == 's';
        }
    } else if (strcmp(key, "rope_scaling") == 0) {
        c->has_rope_scaling = !json_is_null(v);
        if (json_is_null(v)) return LK_OK;
        if (!json_is_object(v)) return wrong_type(what, key, "null or an object", v);
        const json_t *t = json_object_get(v, "rope_type");
        if (!t) t = json_object_get(v, "type");
        const json_t *fac = json_object_get(v, "factor"), *orig = json_object_get(v, "original_max_position_embeddings");
        if (!json_is_string(t) || json_string_length(t) >= sizeof c->rope_scaling_type)
            return bad(LK_EIO, what, "key 'rope_scaling': expected a string 'rope_type'");
        memcpy(c->rope_scaling_type, json_string_value(t), json_string_length(t) + 1);
        c->rope_scaling_factor = 1.0;
        if (fac && lk_json_f64(fac, &c->rope_scaling_factor))
            return bad(LK_EIO, what, "key 'rope_scaling': 'factor': expected a number");
        if (orig && lk_json_i64(orig, &c->rope_scaling_original_max_position_embeddings))
            return bad(LK_EIO, what, "key 'rope_scaling': 'original_max_position_embeddings': expected an integer");
    }
    return LK_OK;   /* architectures and model_type: read_family; transformers_version: not kept */
}

/* transformers 5 writes some keys under other names: dtype for torch_dtype,
 * num_local_experts for Qwen3-MoE's num_experts, and rope_theta (with any scaling: a
 * rope_type other than "default") inside rope_parameters. The 4.x name wins where both
 * are there; the writer keeps the 4.x names, which transformers 5 still reads. */
static const json_t *get_key(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    if (v) return v;
    if (strcmp(key, "torch_dtype") == 0) return json_object_get(root, "dtype");
    if (strcmp(key, "num_experts") == 0) return json_object_get(root, "num_local_experts");
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (!json_is_object(rp)) return NULL;
    if (strcmp(key, "rope_theta") == 0) return json_object_get(rp, "rope_theta");
    if (strcmp(key, "rope_scaling") == 0) {
        const json_t *t = json_object_get(rp, "rope_type");
        if (json_is_string(t) && strcmp(json_string_value(t), "default") != 0) return rp;
    }
    return NULL;
}

lk_status lk_qwen3_config_parse(const char *json, size_t len, const char *what, lk_qwen3_config *out) {
    if (!json || !out) return lk_error(LK_EINVAL, "config.json: expected text and a config, got NULL");
    if (!what) what = "(text)";
    lk_qwen3_config *c = malloc(sizeof *c);
    if (!c) return lk_error(LK_ENOMEM, "config.json: %s: out of memory", what);
    lk_status s = LK_OK;
    lk_json_error err;
    json_t *root = lk_json_load(json, len, &err);
    if (!root && err.dup_depth == 1) s = bad(LK_EIO, what, "key '%s' appears twice", err.dup_key);
    else if (!root) s = bad(LK_EIO, what, "not valid JSON: %s", err.message);
    else if (!json_is_object(root)) s = wrong_type(what, "(top level)", "an object", root);
    else s = read_family(root, what, c);
    for (size_t i = 0; !s && i < N_FIELDS; i++) {
        const field *f = &fields[i];
        if (f->moe_only && !c->moe) continue;
        const json_t *v = get_key(root, f->key);
        if (!v && f->required)
            s = bad(LK_EIO, what, "missing required key '%s'%s", f->key,
                    strcmp(f->key, "rope_theta") == 0 ? " (or rope_parameters.rope_theta, as transformers 5 writes it)"
                    : strcmp(f->key, "num_experts") == 0 ? " (or num_local_experts)" : "");
        else if (v) s = f->type == F_SPECIAL ? read_special(f->key, v, what, c) : read_plain(f, v, what, c);
    }
    if (!s) s = lk_qwen3_config_validate(c, what);
    if (!s) *out = *c;
    json_decref(root);
    free(c);
    return s;
}

lk_status lk_qwen3_config_read(const char *path, lk_qwen3_config *c) {
    if (!path || !c) return lk_error(LK_EINVAL, "config.json: expected a path and a config, got NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) return bad(LK_EIO, path, "cannot open: %s", strerror(errno));
    char *buf = malloc(MAX_CONFIG_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_CONFIG_BYTES + 1, fp) : 0;
    int err = ferror(fp);
    fclose(fp);
    lk_status s;
    if (!buf) s = lk_error(LK_ENOMEM, "config.json: %s: out of memory", path);
    else if (err) s = bad(LK_EIO, path, "read error");
    else if (n > MAX_CONFIG_BYTES) s = bad(LK_EIO, path, "larger than %u bytes", MAX_CONFIG_BYTES);
    else s = lk_qwen3_config_parse(buf, n, path, c);
    free(buf);
    return s;
}

#define NEED(cond, ...) do { if (!(cond)) return bad(LK_EINVAL, what, __VA_ARGS__); } while (0)

lk_status lk_qwen3_config_validate(const lk_qwen3_config *c, const char *what) {
    if (!c) return lk_error(LK_EINVAL, "config.json: expected a config, got NULL");
    if (!what) what = "(config)";
    const int m = c->moe ? 1 : 0;
    NEED(strcmp(c->model_type, families[m].model_type) == 0 && strcmp(c->architectures, families[m].arch) == 0,
         "model_type '%s' / architectures '%s' do not match the %s family", c->model_type, c->architectures,
         families[m].model_type);
    static const char *const sizes[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
                                        "max_window_layers"};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (size_t i = 0; i < N_FIELDS; i++)
            if (strcmp(fields[i].key, sizes[k]) == 0) {
                int64_t v = *(const int64_t *)((const char *)c + fields[i].off);
                NEED(v > 0 || (v == 0 && k == 8), "key '%s': expected a positive integer, got %lld", sizes[k], (long long)v);
            }
    NEED(c->num_attention_heads % c->num_key_value_heads == 0,
         "key 'num_attention_heads': %lld is not a multiple of num_key_value_heads %lld",
         (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    NEED(c->rms_norm_eps > 0, "key 'rms_norm_eps': expected > 0, got %g", c->rms_norm_eps);
    NEED(c->rope_theta > 0, "key 'rope_theta': expected > 0, got %g", c->rope_theta);
    NEED(strcmp(c->hidden_act, "silu") == 0, "key 'hidden_act': expected 'silu', got '%s'", c->hidden_act);
    NEED(!c->attention_bias, "key 'attention_bias': expected false (Qwen3 has no attention bias)");
    NEED(strcmp(c->torch_dtype, "float32") == 0 || strcmp(c->torch_dtype, "bfloat16") == 0 ||
         strcmp(c->torch_dtype, "float16") == 0,
         "key 'torch_dtype': expected float32, bfloat16 or float16, got '%s'", c->torch_dtype);
    NEED(!c->has_rope_scaling || c->rope_scaling_factor > 0, "key 'rope_scaling': factor must be > 0");
    NEED(c->n_mlp_only_layers >= 0 && c->n_mlp_only_layers <= LK_QWEN3_MAX_LIST, "key 'mlp_only_layers': bad count");
    NEED(c->n_layer_types == 0 || c->n_layer_types == c->num_hidden_layers,
         "key 'layer_types': expected one entry a layer (%lld), got %d", (long long)c->num_hidden_layers, c->n_layer_types);
    NEED(!c->use_sliding_window || c->sliding_window != 0,
         "key 'sliding_window': expected a positive integer or null with use_sliding_window, got 0");
    if (!c->moe) return lk_qwen3_param_count(c, what, NULL, NULL);
    NEED(c->num_experts > 0, "key 'num_experts': expected a positive integer, got %lld", (long long)c->num_experts);
    NEED(c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_experts,
         "key 'num_experts_per_tok': expected 1..num_experts (%lld), got %lld", (long long)c->num_experts,
         (long long)c->num_experts_per_tok);
    NEED(c->moe_intermediate_size > 0, "key 'moe_intermediate_size': expected a positive integer, got %lld",
         (long long)c->moe_intermediate_size);
    NEED(c->decoder_sparse_step > 0, "key 'decoder_sparse_step': expected a positive integer, got %lld",
         (long long)c->decoder_sparse_step);
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        NEED(c->mlp_only_layers[i] < c->num_hidden_layers, "key 'mlp_only_layers': layer %d is not below num_hidden_layers %lld",
             c->mlp_only_layers[i], (long long)c->num_hidden_layers);
    return lk_qwen3_param_count(c, what, NULL, NULL);   /* no size below wraps (core/checked.h) */
}

int lk_qwen3_layer_is_moe(const lk_qwen3_config *c, int64_t layer) {
    if (!c->moe || c->num_experts <= 0 || c->decoder_sparse_step <= 0) return 0;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer) return 0;
    return (layer + 1) % c->decoder_sparse_step == 0;
}

int64_t lk_qwen3_layer_window(const lk_qwen3_config *c, int64_t layer) {
    if (!c->use_sliding_window || c->sliding_window <= 0 || layer < 0) return 0;
    if (c->moe) return c->sliding_window;   /* Qwen3MoeAttention reads sliding_window alone */
    const int slides = c->n_layer_types ? layer < c->n_layer_types && c->sliding_layer[layer] : layer >= c->max_window_layers;
    return slides ? c->sliding_window : 0;
}

static void write_special(lk_jw *j, const char *key, const lk_qwen3_config *c) {
    if (strcmp(key, "architectures") == 0) {
        lk_jw_arr_begin(j);
        lk_jw_str(j, c->architectures);
        lk_jw_arr_end(j);
    } else if (strcmp(key, "model_type") == 0) {
        lk_jw_str(j, c->model_type);
    } else if (strcmp(key, "transformers_version") == 0) {
        lk_jw_str(j, TRANSFORMERS_VERSION);
    } else if (strcmp(key, "mlp_only_layers") == 0) {
        lk_jw_arr_begin(j);
        for (int i = 0; i < c->n_mlp_only_layers; i++) lk_jw_i64(j, c->mlp_only_layers[i]);
        lk_jw_arr_end(j);
    } else if (strcmp(key, "layer_types") == 0) {
        lk_jw_arr_begin(j);
        for (int i = 0; i < c->n_layer_types; i++) lk_jw_str(j, c->sliding_layer[i] ? "sliding_attention" : "full_attention");
        lk_jw_arr_end(j);
    } else if (!c->has_rope_scaling) {   /* rope_scaling */
        lk_jw_null(j);
    } else {
        lk_jw_obj_begin(j);
        lk_jw_key(j, "factor");
        lk_jw_f64(j, c->rope_scaling_factor);
        if (c->rope_scaling_original_max_position_embeddings > 0) {
            lk_jw_key(j, "original_max_position_embeddings");
            lk_jw_i64(j, c->rope_scaling_original_max_position_embeddings);
        }
        lk_jw_key(j, "rope_type");
        lk_jw_str(j, c->rope_scaling_type);
        lk_jw_obj_end(j);
    }
}

lk_status lk_qwen3_config_to_json(const lk_qwen3_config *c, char **out) {
    if (!out) return lk_error(LK_EINVAL, "config.json: out: expected a pointer, got NULL");
    *out = NULL;
    lk_status s = lk_qwen3_config_validate(c, "(writing)");
    if (s) return s;
    lk_jw j;
    lk_jw_init(&j, 1);
    lk_jw_obj_begin(&j);
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &fields[i];
        if ((f->moe_only && !c->moe) || (strcmp(f->key, "layer_types") == 0 && !c->n_layer_types)) continue;
        const char *p = (const char *)c + f->off;
        lk_jw_key(&j, f->key);
        switch (f->type) {
        case F_INT: lk_jw_i64(&j, *(const int64_t *)p); break;
        case F_INT_OR_NULL:
            if (*(const int64_t *)p < 0) lk_jw_null(&j); else lk_jw_i64(&j, *(const int64_t *)p);
            break;
        case F_NUM: lk_jw_f64(&j, *(const double *)p); break;
        case F_BOOL: lk_jw_bool(&j, *(const int *)p); break;
        case F_STR: lk_jw_str(&j, p); break;
        case F_SPECIAL: write_special(&j, f->key, c); break;
        }
    }
    lk_jw_obj_end(&j);
    lk_jw_raw(&j, "\n", 1);
    if (j.failed) { lk_jw_free(&j); return lk_error(LK_ENOMEM, "config.json: out of memory"); }
    *out = j.buf;
    return LK_OK;
}

lk_status lk_qwen3_config_write(const char *path, const lk_qwen3_config *c) {
    char *text;
    lk_status s = lk_qwen3_config_to_json(c, &text);
    if (s) return s;
    s = lk_write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}
