/* ops_config.c — the ops configuration set from code: fields and per-module
 * overrides, each checked against the catalog as it is set. */
#include <stdio.h>
#include <string.h>
#include "llmkern/config.h"

void lk_ops_config_init(lk_ops_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->device = LK_DEVICE_CPU;
}

/* Unknown value: LK_EINVAL with the field, a did-you-mean and the valid names. */
static lk_status check_value(lk_op op, const char *value, const char *where) {
    if (value && lk_impl_name_known(op, value)) return LK_OK;
    const lk_op_info *info = lk_op_info_get(op);
    const char *hint = value ? lk_suggest(value, info->known) : NULL;
    char valid[512];
    size_t k = 0;
    for (const char *const *kn = info->known; *kn && k < sizeof valid; kn++)
        k += (size_t)snprintf(valid + k, sizeof valid - k, "%s%s", k ? ", " : "", *kn);
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
