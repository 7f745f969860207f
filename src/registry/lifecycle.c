/* lifecycle.c — the five stages that bind implementations, as the described system
 * does: import (lk_init), model registration, config post-init, model build, and
 * runtime through the bound op table. Each binding records the stage that made it.
 * lk_init reads the environment table once (lk_env_reload again); the first two stages
 * bind under it, and the config stages under the environment defaults of the config
 * they are handed (lk_ops_config.env). */
#include <stdio.h>
#include <string.h>
#include "ops/op_def.h"
#include "registry/registry_internal.h"

const lk_op lk_family_ops[LK_FAMILY_OPS] = {LK_OP_RMS_NORM, LK_OP_ROPE, LK_OP_SWIGLU_MLP};

static int registered, env_read;

lk_status lk_init(void) {
    if (!registered) {
        lk_hw_probe_cpu(&lk_reg.hw);
#ifdef LLMKERN_HAVE_CUDA
        lk_hw_probe_cuda(&lk_reg.hw);
#else
        snprintf(lk_reg.hw.cuda_why, sizeof lk_reg.hw.cuda_why, "built without CUDA");
#endif
        for (int op = 0; op < LK_OP_COUNT; op++) {
            const lk_op_def *def = lk_op_def_get((lk_op)op);
            if (def == NULL || def->info.op != (lk_op)op || def->info.name == NULL)
                return lk_error(LK_EINTERNAL, "registry: defs[%d]: expected the descriptor of op %d, got %s", op, op,
                                def ? "another op's" : "none");
            for (const lk_impl *impl = def->impls; impl && impl->name; impl++) {
                lk_status s = lk_impl_register(impl);
                if (s) return s;
            }
        }
        registered = 1;
    }
    if (!env_read) {
        lk_status s = lk_env_read(lk_reg.env);
        if (s) return s;
        env_read = 1;
        return lk_bind_init_stage();
    }
    return LK_OK;
}

const lk_env_value *lk_env(lk_env_id id) {
    lk_init();
    return (unsigned)id < LK_ENV_COUNT ? &lk_reg.env[id] : NULL;
}

lk_status lk_env_reload(void) {
    lk_env_value saved[LK_ENV_COUNT];
    memcpy(saved, lk_reg.env, sizeof saved);
    env_read = 0;
    lk_status s = lk_init();
    for (int i = 0; !s && i < lk_reg.n_families; i++) s = lk_bind_family(i);
    if (s) {                                   /* a bad variable changes nothing */
        memcpy(lk_reg.env, saved, sizeof saved);
        env_read = 1;
    }
    return s;
}

/* Stage 1 binds the loss slot; the attention facade's SP names are rows of the
 * attention table, so registering the built-ins registered them. */
static lk_status bind_loss_slot(lk_device_type d, const lk_env_value *env, lk_binding *b) {
    lk_request r = {.op = LK_OP_CROSS_ENTROPY, .device = d};
    return lk_select_in(&r, env, LK_STAGE_INIT, b);
}

lk_status lk_bind_init_stage(void) {
    for (int d = 0; d < LK_DEVICE_COUNT; d++) {
        lk_status s = bind_loss_slot((lk_device_type)d, lk_reg.env, &lk_reg.loss_slot[d]);
        if (s) return s;
    }
    return LK_OK;
}

const lk_binding *lk_loss_slot(void) {
    return lk_init() == LK_OK ? &lk_reg.loss_slot[LK_DEVICE_CPU] : NULL;
}

/* Stage 2: the fused replacements a family declares take the environment's default;
 * the ops it does not declare keep their reference modules. */
static lk_status bind_family_op(const lk_model_family *f, int k, lk_device_type d, const lk_env_value *env,
                                lk_binding *b) {
    lk_op op = lk_family_ops[k];
    int fused = (f->fused_ops >> op) & 1u;
    lk_request r = {.op = op, .device = d, .name = fused ? NULL : lk_op_info_get(op)->reference,
                    .source = LK_SOURCE_DEFAULT, .source_detail = fused ? NULL : "family has no fused replacement"};
    lk_status s = lk_select_in(&r, env, LK_STAGE_MODEL_REGISTER, b);
    if (s == LK_EUNAVAILABLE && !fused) {       /* the reference is not built for d */
        memset(b, 0, sizeof *b);
        b->op = op;
        b->stage = LK_STAGE_MODEL_REGISTER;
        snprintf(b->fallback, sizeof b->fallback, "no implementation on %s in this build", lk_device_name(d));
        s = LK_OK;
    }
    return s;
}

lk_status lk_bind_family(int index) {
    const lk_model_family *f = lk_reg.families[index].family;
    for (int d = 0; d < LK_DEVICE_COUNT; d++)
        for (int k = 0; k < LK_FAMILY_OPS; k++) {
            lk_status s = bind_family_op(f, k, (lk_device_type)d, lk_reg.env, &lk_reg.families[index].bound[d][k]);
            if (s) return s;
        }
    return LK_OK;
}

lk_status lk_model_register(const lk_model_family *family) {
    lk_status s = lk_init();
    if (s) return s;
    if (family == NULL || family->name == NULL || family->modules == NULL)
        return lk_error(LK_EINVAL, "model_register: family: expected a name and modules, got NULL");
    int i = 0;
    while (i < lk_reg.n_families && strcmp(lk_reg.families[i].family->name, family->name) != 0) i++;
    if (i == LK_MAX_FAMILIES)
        return lk_error(LK_ENOMEM, "model_register: more than %d families", LK_MAX_FAMILIES);
    lk_reg.families[i].family = family;
    if (i == lk_reg.n_families) lk_reg.n_families++;
    return lk_bind_family(i);
}

const lk_model_family *lk_model_family_find(const char *name) {
    for (int i = 0; name && i < lk_reg.n_families; i++)
        if (strcmp(lk_reg.families[i].family->name, name) == 0) return lk_reg.families[i].family;
    return NULL;
}

static int family_index(const lk_model_family *f) {
    for (int i = 0; i < lk_reg.n_families; i++)
        if (lk_reg.families[i].family == f) return i;
    return -1;
}

/* The environment defaults cfg resolves with: its own, an entry left empty (a config not
 * made by lk_ops_config_init) taking the value in force. */
static void config_env(const lk_ops_config *cfg, lk_env_value env[LK_ENV_COUNT]) {
    for (int i = 0; i < LK_ENV_COUNT; i++) env[i] = cfg->env[i].value[0] ? cfg->env[i] : lk_reg.env[i];
}

static int env_equal(const lk_env_value *a, const lk_env_value *b) {
    for (int i = 0; i < LK_ENV_COUNT; i++)
        if (strcmp(a[i].value, b[i].value) || strcmp(a[i].set_by, b[i].set_by) || strcmp(a[i].raw, b[i].raw))
            return 0;
    return 1;
}

/* The request a config makes for op: its field, or the defaults. */
static lk_request field_request(const lk_ops_config *cfg, lk_op op) {
    const lk_config_value *v = &cfg->field[op];
    lk_request r = {.op = op, .device = cfg->device};
    if (v->value[0]) {
        r.name = v->value;
        r.source = LK_SOURCE_CONFIG;
        r.source_detail = v->where[0] ? v->where : "set from code";
    }
    return r;
}

/* Stage 3. The MoE experts field is validated here and bound at build (deferred); the
 * router's options are parsed and checked against the router bindings. */
lk_status lk_ops_config_finalize(lk_ops_config *cfg) {
    lk_status s = lk_init();
    if (s) return s;
    lk_binding bound[LK_OP_COUNT], module_bound[LK_MAX_OVERRIDES];
    lk_env_value env[LK_ENV_COUNT];
    config_env(cfg, env);
    unsigned mask = 0;
    for (int op = 0; op < LK_OP_COUNT; op++) {
        lk_request r = field_request(cfg, (lk_op)op);
        if (!r.name && op != LK_OP_ATTENTION) continue;
        if ((s = lk_select_in(&r, env, LK_STAGE_CONFIG_FINALIZE, &bound[op]))) return s;
        if (op != LK_OP_MOE_EXPERTS) mask |= 1u << op;
    }
    for (int i = 0; i < cfg->n_overrides; i++) {
        const lk_override *o = &cfg->overrides[i];
        lk_request r = {.op = o->op, .module = o->module, .name = o->v.value, .device = cfg->device,
                        .source = LK_SOURCE_OVERRIDE,
                        .source_detail = o->v.where[0] ? o->v.where : "set from code"};
        if ((s = lk_select_in(&r, env, LK_STAGE_CONFIG_FINALIZE, &module_bound[i]))) return s;
    }
    lk_router_options router;
    if ((s = lk_ops_config_router_options(cfg, cfg->field[LK_OP_MOE_ROUTER].value[0] ? &bound[LK_OP_MOE_ROUTER] : NULL,
                                          module_bound, cfg->n_overrides, &router)))
        return s;
    cfg->router = router;
    memcpy(cfg->bound, bound, sizeof bound);
    memcpy(cfg->module_bound, module_bound, sizeof(lk_binding) * (size_t)cfg->n_overrides);
    cfg->bound_mask = mask;
    cfg->finalized = 1;
    return LK_OK;
}

/* "layers.*.input_layernorm" matches "layers.12.input_layernorm": * is a layer index. */
static int module_matches(const char *pattern, const char *name) {
    for (; *pattern; pattern++) {
        if (*pattern == '*') {
            if (*name < '0' || *name > '9') return 0;
            while (*name >= '0' && *name <= '9') name++;
        } else if (*pattern != *name++) {
            return 0;
        }
    }
    return *name == '\0';
}

static lk_status check_override(const lk_model_family *f, const lk_override *o) {
    char names[512];
    size_t k = 0;
    for (const lk_module_decl *m = f->modules; m->pattern; m++) {
        if (module_matches(m->pattern, o->module)) {
            if (m->op == o->op) return LK_OK;
            return lk_error(LK_EINVAL, "%s: override '%s': %s is not an option of this module "
                            "(it runs %s)", o->v.where[0] ? o->v.where : "config", o->module,
                            lk_op_info_get(o->op)->field, lk_op_info_get(m->op)->field);
        }
        if (k < sizeof names)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", m->pattern);
    }
    return lk_error(LK_EINVAL, "%s: override: %s has no module '%s'; modules: %s",
                    o->v.where[0] ? o->v.where : "config", f->name, o->module, names);
}

/* Stage 4: binds what is deferred to build (MoE experts, and the ops nothing bound
 * earlier) and assembles the op table the model runs with. */
lk_status lk_model_build(const lk_ops_config *cfg, const char *family, lk_op_table *out) {
    lk_status s = lk_init();
    if (s) return s;
    const lk_model_family *f = lk_model_family_find(family);
    if (f == NULL) {
        char names[256] = "";
        size_t k = 0;
        for (int i = 0; i < lk_reg.n_families && k < sizeof names; i++)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "",
                                  lk_reg.families[i].family->name);
        return lk_error(LK_EINVAL, "model_build: family: expected a registered family (%s), got '%s'",
                        k ? names : "none registered", family ? family : "(null)");
    }
    if (cfg == NULL || !cfg->finalized)
        return lk_error(LK_EINVAL, "model_build: cfg: expected a config passed through "
                        "lk_ops_config_finalize, got %s", cfg ? "one that was not" : "NULL");
    for (int i = 0; i < cfg->n_overrides; i++)
        if ((s = check_override(f, &cfg->overrides[i]))) return s;

    lk_op_table t = {.family = f, .device = cfg->device};
    int fi = family_index(f);
    /* The loss slot and the family's replacements were bound at init and registration
     * under the environment in force then; a config made under another one (its env
     * changed, or the variables reloaded since) is bound as those stages bind, under its own. */
    lk_env_value env[LK_ENV_COUNT];
    config_env(cfg, env);
    int same_env = env_equal(env, lk_reg.env);
    for (int op = 0; op < LK_OP_COUNT; op++) {
        if (cfg->bound_mask & (1u << op)) { t.op[op] = cfg->bound[op]; continue; }
        int k = 0;
        while (k < LK_FAMILY_OPS && lk_family_ops[k] != op) k++;
        if (op == LK_OP_CROSS_ENTROPY) {
            if (same_env) t.op[op] = lk_reg.loss_slot[cfg->device];
            else if ((s = bind_loss_slot(cfg->device, env, &t.op[op]))) return s;
        } else if (k < LK_FAMILY_OPS) {
            if (same_env) t.op[op] = lk_reg.families[fi].bound[cfg->device][k];
            else if ((s = bind_family_op(f, k, cfg->device, env, &t.op[op]))) return s;
        } else {
            lk_request r = field_request(cfg, (lk_op)op);
            if ((s = lk_select_in(&r, env, LK_STAGE_MODEL_BUILD, &t.op[op]))) return s;
        }
    }
    memcpy(t.module, cfg->module_bound, sizeof(lk_binding) * (size_t)cfg->n_overrides);
    t.n_module = cfg->n_overrides;
    t.router = cfg->router;
    *out = t;
    return LK_OK;
}

const lk_binding *lk_op_table_get(const lk_op_table *t, lk_op op, const char *module) {
    for (int i = 0; module && i < t->n_module; i++)
        if (t->module[i].op == op && strcmp(t->module[i].module, module) == 0) return &t->module[i];
    return (unsigned)op < LK_OP_COUNT ? &t->op[op] : NULL;
}
