/* backend_yaml.c — NeMo AutoModel's `backend:` section, read where NeMo users write it
 * (under model:) with NeMo's field names, each mapped onto an llmkern op field:
 *
 *   model:
 *     backend:
 *       _target_: nemo_automodel.components.models.common.BackendConfig   # ignored
 *       attn: flex                  # attn_implementation    (flex = flex_attention)
 *       linear: torch               # linear_implementation  (blas / cublaslt by device)
 *       rms_norm: torch_fp32        # rms_norm_implementation (eager_fp32)
 *       rope: torch                 # rotary_pos_emb_implementation (eager)
 *       rope_fusion: true           # ... fused (TE's fused RoPE; with rope: torch or alone)
 *       experts: torch_mm           # moe_implementation     (fused)
 *       dispatcher: torch           # moe.dispatcher         (allgather)
 *       fake_balanced_gate: true    # moe.router: fake_balanced, every MoE layer
 *       fake_gate_noise: 0.3        # in [0, 1]
 *       gate_precision: float32     # the router's GEMM and softmax in f32
 *
 * The names are the registry's: NeMo's are aliases in the ops' catalogs (src/ops/<op>/def.c),
 * so `torch` is resolved by the field it is written in, and a NeMo name llmkern does not
 * implement (te, quack, deepep, ...) is refused when the config is finalized, naming the
 * nearest llmkern implementation. NeMo options llmkern has no counterpart for are errors
 * that say so, not unknown keys and not silently ignored. */
#include <stdio.h>
#include <string.h>
#include "config/yaml_loader.h"

/* NeMo's field -> llmkern's op field. */
static const struct { const char *key, *field; } name_keys[] = {
    {"attn", "attn_implementation"},
    {"linear", "linear_implementation"},
    {"rms_norm", "rms_norm_implementation"},
    {"rope", "rotary_pos_emb_implementation"},
    {"experts", "moe_implementation"},
    {"dispatcher", "moe.dispatcher"},
};
#define N_NAME_KEYS (sizeof name_keys / sizeof *name_keys)

static const char *const backend_keys[] = {"_target_", "attn", "linear", "rms_norm", "rope", "rope_fusion",
    "experts", "dispatcher", "fake_balanced_gate", "fake_gate_noise", "gate_precision",
    "enable_hf_state_dict_adapter", NULL};

/* BackendConfig fields with no llmkern counterpart: named as such when given. */
static const char *const nemo_only_keys[] = {"te_fp8", "enable_deepep", "enable_fsdp_optimizations",
    "compile_attn", "cuda_graph", "dispatcher_num_sms", "dispatcher_share_token_dispatcher",
    "dispatcher_async_dispatch", NULL};

static int is_null(const yaml_node_t *v) {
    const char *t = scalar(v);
    return v->type == YAML_SCALAR_NODE && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (t[0] == '\0' || strcmp(t, "null") == 0 || strcmp(t, "~") == 0 || strcmp(t, "None") == 0);
}

/* true/false as YAML (and Python's repr) write them; -1 for anything else. */
static int as_bool(const yaml_node_t *v) {
    const char *t = v->type == YAML_SCALAR_NODE ? scalar(v) : "";
    if (!strcmp(t, "true") || !strcmp(t, "True") || !strcmp(t, "1")) return 1;
    if (!strcmp(t, "false") || !strcmp(t, "False") || !strcmp(t, "0")) return 0;
    return -1;
}

static lk_status bad(const loader *l, const yaml_node_t *v, const char *key, const char *want) {
    char k[96];
    snprintf(k, sizeof k, "model.backend.%s", key);
    return bad_value(l, v, k, want);
}

/* "cfg.yaml:5:11 (model.backend.attn)", or with the value it was read from when that is
 * not an implementation name: "(model.backend.rope_fusion: true)". */
static void where_key(const loader *l, const yaml_node_t *v, const char *key, const char *as, char *buf,
                      size_t n) {
    char w[192];
    where(l, v, w, sizeof w);
    snprintf(buf, n, "%s (model.backend.%s%s%s)", w, key, as ? ": " : "", as ? as : "");
}

_Static_assert(sizeof backend_keys / sizeof *backend_keys - 1 <= LK_YAML_BACKEND_KEYS, "loader.backend is too short");

static int key_index(const char *k) {
    for (int i = 0; backend_keys[i]; i++)
        if (strcmp(backend_keys[i], k) == 0) return i;
    return -1;
}

static const yaml_node_t *get(const loader *l, const char *key) { return l->backend[key_index(key)]; }

static lk_status set_name(loader *l, const yaml_node_t *v, const char *key, const char *field) {
    char w[256];
    if (v->type != YAML_SCALAR_NODE || scalar(v)[0] == '\0') return bad(l, v, key, "an implementation name");
    where_key(l, v, key, NULL, w, sizeof w);
    return lk_yaml_set_op(l, field, scalar(v), w);
}

static lk_status rope(loader *l) {
    const yaml_node_t *fusion = get(l, "rope_fusion"), *name = get(l, "rope");
    if (!fusion) return name ? set_name(l, name, "rope", "rotary_pos_emb_implementation") : LK_OK;
    int on = as_bool(fusion);
    if (on < 0) return bad(l, fusion, "rope_fusion", "true or false");
    if (!on) {   /* NeMo's unfused rotation: rope's backend, torch when not given */
        if (name) return set_name(l, name, "rope", "rotary_pos_emb_implementation");
        char w[256];
        where_key(l, fusion, "rope_fusion", "false", w, sizeof w);
        return lk_yaml_set_op(l, "rotary_pos_emb_implementation", "eager", w);
    }
    if (name && (name->type != YAML_SCALAR_NODE || strcmp(scalar(name), "torch") != 0))
        return bad(l, name, "rope", "torch (or no rope:) with rope_fusion: true, which is llmkern's fused RoPE");
    char w[256];
    where_key(l, fusion, "rope_fusion", "true", w, sizeof w);
    return lk_yaml_set_op(l, "rotary_pos_emb_implementation", "fused", w);
}

static lk_status gate(loader *l) {
    const yaml_node_t *fake = get(l, "fake_balanced_gate"), *noise = get(l, "fake_gate_noise");
    const yaml_node_t *prec = get(l, "gate_precision");
    char w[256];
    lk_status st;
    if (fake) {
        int on = as_bool(fake);
        if (on < 0) return bad(l, fake, "fake_balanced_gate", "true or false");
        where_key(l, fake, "fake_balanced_gate", on ? "true" : "false", l->fake_gate_at, sizeof l->fake_gate_at);
        l->fake_gate = on;
        if (on && (st = lk_yaml_set_op(l, "moe.router", "fake_balanced", l->fake_gate_at))) return st;
    }
    if (noise && !is_null(noise)) {
        if (noise->type != YAML_SCALAR_NODE) return bad(l, noise, "fake_gate_noise", "a number in [0, 1]");
        where_key(l, noise, "fake_gate_noise", NULL, w, sizeof w);
        if ((st = lk_ops_config_set_option(l->cfg, "fake_gate_noise", scalar(noise), w))) return st;
    }
    if (prec && !is_null(prec)) {
        if (prec->type != YAML_SCALAR_NODE) return bad(l, prec, "gate_precision", "float32 or null");
        where_key(l, prec, "gate_precision", NULL, w, sizeof w);
        if ((st = lk_ops_config_set_option(l->cfg, "gate_precision", scalar(prec), w))) return st;
    }
    return LK_OK;
}

static lk_status collect(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    int i = key_index(scalar(k));
    if (i >= 0) {
        l->backend[i] = v;
        return LK_OK;
    }
    for (const char *const *n = nemo_only_keys; *n; n++)
        if (strcmp(*n, scalar(k)) == 0) {
            char w[192];
            where(l, k, w, sizeof w);
            return lk_error(LK_EINVAL, "%s: model.backend.%s: a NeMo AutoModel option llmkern has no counterpart "
                            "for; expected it removed", w, scalar(k));
        }
    return unknown_key(l, k, "model.backend", backend_keys);
}

lk_status lk_yaml_backend(loader *l, const yaml_node_t *map) {
    memset(l->backend, 0, sizeof l->backend);
    lk_status st = each_entry(l, map, "model.backend", collect);
    if (st) return st;
    const yaml_node_t *t = get(l, "_target_");
    if (t && t->type != YAML_SCALAR_NODE) return bad(l, t, "_target_", "a class path");
    const yaml_node_t *hf = get(l, "enable_hf_state_dict_adapter");
    if (hf && as_bool(hf) != 1)   /* llmkern always reads and writes the Hugging Face layout */
        return bad(l, hf, "enable_hf_state_dict_adapter", "true (llmkern's checkpoints are always in the "
                   "Hugging Face layout)");
    for (size_t i = 0; i < N_NAME_KEYS; i++) {
        const yaml_node_t *v = get(l, name_keys[i].key);
        if (v && strcmp(name_keys[i].key, "rope") != 0 && (st = set_name(l, v, name_keys[i].key, name_keys[i].field)))
            return st;
    }
    if ((st = rope(l))) return st;
    return gate(l);
}

lk_status lk_yaml_backend_finish(loader *l) {
    if (l->fake_gate < 0) return LK_OK;
    const lk_ops_config *c = l->cfg;
    if (l->fake_gate == 0 && strcmp(c->field[LK_OP_MOE_ROUTER].value, "fake_balanced") == 0)
        return lk_error(LK_EINVAL, "%s: asks for the learned gate, but moe.router is fake_balanced at %s; expected "
                        "one of them", l->fake_gate_at, c->field[LK_OP_MOE_ROUTER].where);
    for (int i = 0; l->fake_gate == 1 && i < c->n_overrides; i++) {
        const lk_override *o = &c->overrides[i];
        if (o->op == LK_OP_MOE_ROUTER && strcmp(o->v.value, "fake_balanced") != 0)
            return lk_error(LK_EINVAL, "%s: override '%s': moe.router '%s', but %s routes every MoE layer with "
                            "fake_balanced; expected one of them",
                            o->v.where, o->module, o->v.value, l->fake_gate_at);
    }
    return LK_OK;
}
