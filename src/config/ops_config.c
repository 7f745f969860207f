/* ops_config.c — the ops configuration set from code: fields, per-module overrides and
 * the MoE router's options, each checked as it is set. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/config.h"
#include "registry/registry_internal.h"

void lk_ops_config_init(lk_ops_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->device = LK_DEVICE_CPU;
    for (int i = 0; i < LK_ENV_COUNT; i++) {
        const lk_env_value *e = lk_env((lk_env_id)i);   /* all "" when the environment is bad: */
        if (e) cfg->env[i] = *e;                         /* finalize then says why */
    }
}

/* Unknown value: LK_EINVAL with the field, a did-you-mean and the valid names. */
static lk_status check_value(lk_op op, const char *value, const char *where) {
    if (value && lk_impl_name_known(op, value)) return LK_OK;
    const lk_op_info *info = lk_op_info_get(op);
    const char *hint = lk_op_suggest(op, value);
    char valid[512];
    lk_op_names_text(op, valid, sizeof valid);
    return lk_error(LK_EINVAL, "%s%s%s: unknown implementation '%s'%s%s%s; valid: %s",
                    where ? where : "", where && where[0] ? ": " : "", info->field,
                    value ? value : "(null)", hint ? " (did you mean '" : "", hint ? hint : "",
                    hint ? "'?)" : "", valid);
}

static lk_status parse_field(const char *field, const char *where, lk_op *op) {
    if (lk_op_parse(field, op) == LK_OK) return LK_OK;
    const char *fields[LK_OP_COUNT + 1];
    for (int i = 0; i < LK_OP_COUNT; i++) fields[i] = lk_op_info_get((lk_op)i)->field;
    fields[LK_OP_COUNT] = NULL;
    const char *hint = lk_suggest(field, fields);
    return lk_error(LK_EINVAL, "%s%sunknown field '%s'%s%s%s", where ? where : "",
                    where && where[0] ? ": " : "", field ? field : "(null)",
                    hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "");
}

static void set_value(lk_config_value *v, const char *value, const char *where) {
    snprintf(v->value, sizeof v->value, "%s", value);
    snprintf(v->where, sizeof v->where, "%s", where ? where : "");
}

lk_status lk_ops_config_set(lk_ops_config *cfg, const char *field, const char *value,
                            const char *where) {
    lk_op op;
    lk_status s = parse_field(field, where, &op);
    if (s || (s = check_value(op, value, where))) return s;
    set_value(&cfg->field[op], value, where);
    cfg->finalized = 0;
    return LK_OK;
}

lk_status lk_ops_config_set_override(lk_ops_config *cfg, const char *module, const char *field,
                                     const char *value, const char *where) {
    lk_op op;
    lk_status s = parse_field(field, where, &op);
    if (s || (s = check_value(op, value, where))) return s;
    if (module == NULL || module[0] == '\0' || strlen(module) >= sizeof cfg->overrides[0].module)
        return lk_error(LK_EINVAL, "%s%soverride: module: expected a module name of 1 to %zu "
                        "characters", where ? where : "", where && where[0] ? ": " : "",
                        sizeof cfg->overrides[0].module - 1);
    int i = 0;
    while (i < cfg->n_overrides &&
           !(cfg->overrides[i].op == op && strcmp(cfg->overrides[i].module, module) == 0)) i++;
    if (i == LK_MAX_OVERRIDES)
        return lk_error(LK_EINVAL, "%s%soverride: more than %d overrides", where ? where : "",
                        where && where[0] ? ": " : "", LK_MAX_OVERRIDES);
    lk_override *o = &cfg->overrides[i];
    snprintf(o->module, sizeof o->module, "%s", module);
    o->op = op;
    set_value(&o->v, value, where);
    if (i == cfg->n_overrides) cfg->n_overrides++;
    cfg->finalized = 0;
    return LK_OK;
}

/* "0.3" -> 0.3 when it is a finite number in [0, 1]. */
static int parse_noise(const char *v, float *out) {
    char *end;
    double x = v && v[0] ? strtod(v, &end) : NAN;
    if (!isfinite(x) || *end || x < 0.0 || x > 1.0) return 0;
    *out = (float)x;
    return 1;
}

lk_status lk_ops_config_set_option(lk_ops_config *cfg, const char *option, const char *value,
                                   const char *where) {
    const char *w = where ? where : "", *sep = where && where[0] ? ": " : "";
    const char *v = value ? value : "(null)";
    float noise;
    if (option && strcmp(option, "fake_gate_noise") == 0) {
        if (!parse_noise(value, &noise))
            return lk_error(LK_EINVAL, "%s%sfake_gate_noise: expected a number in [0, 1], got '%s'", w, sep, v);
        set_value(&cfg->fake_gate_noise, value, where);
    } else if (option && strcmp(option, "gate_precision") == 0) {
        if (!value || (strcmp(value, "float32") != 0 && strcmp(value, "torch.float32") != 0 &&
                       strcmp(value, "fp32") != 0))
            return lk_error(LK_EINVAL, "%s%sgate_precision: expected float32 (or torch.float32, fp32): the "
                            "router otherwise runs in the hidden states' dtype, got '%s'", w, sep, v);
        set_value(&cfg->gate_precision, "float32", where);
    } else {
        const char *hint = option ? lk_suggest(option, (const char *const[]){"fake_gate_noise", "gate_precision",
                                                                             NULL}) : NULL;
        return lk_error(LK_EINVAL, "%s%sunknown option '%s'%s%s%s; valid: fake_gate_noise, gate_precision", w, sep,
                        option ? option : "(null)", hint ? " (did you mean '" : "", hint ? hint : "",
                        hint ? "'?)" : "");
    }
    cfg->finalized = 0;
    return LK_OK;
}

lk_status lk_ops_config_router_options(const lk_ops_config *cfg, const lk_binding *router,
                                       const lk_binding *modules, int n_modules, lk_router_options *out) {
    lk_router_options r = {0};
    const lk_config_value *nv = &cfg->fake_gate_noise;
    if (nv->value[0] && !parse_noise(nv->value, &r.noise))
        return lk_error(LK_EINVAL, "%s%sfake_gate_noise: expected a number in [0, 1], got '%s'", nv->where,
                        nv->where[0] ? ": " : "", nv->value);
    r.gate_f32 = cfg->gate_precision.value[0] != '\0';
    int fake = router && router->impl && strcmp(router->impl->name, "fake_balanced") == 0;
    for (int i = 0; i < n_modules; i++)
        fake |= modules[i].op == LK_OP_MOE_ROUTER && modules[i].impl &&
                strcmp(modules[i].impl->name, "fake_balanced") == 0;
    if (r.noise > 0.0f && !fake)
        return lk_error(LK_EINVAL, "%s%sfake_gate_noise: %s is used only by the fake balanced router, but "
                        "moe.router is '%s'; expected fake_balanced_gate: true (model.backend) or moe.router: "
                        "fake_balanced", nv->where, nv->where[0] ? ": " : "", nv->value,
                        router && router->requested[0] ? router->requested : lk_op_info_get(LK_OP_MOE_ROUTER)->default_fused);
    *out = r;
    return LK_OK;
}
