/* ops.c — the registry's table of op descriptors, one per lk_op (made from LK_OPS in
 * registry.h, each defined by its folder's def.c: src/ops/op_def.h), and the catalog
 * lookups over them: every op the design names, its config field, every implementation
 * name users of the described system write (built here or not), its reference and its
 * built-in defaults. A name in `known` that no registered implementation carries is "not
 * available in this build", never "unknown". Other systems' names for the same
 * implementations (NeMo AutoModel's) are the ops' `aliases`: each is one llmkern
 * implementation per device, or a name llmkern does not implement, which an explicit
 * request is refused for with the nearest one named. */
#include <stdio.h>
#include <string.h>
#include "llmkern/config.h"
#include "ops/op_def.h"

#define LK_DEF_DECLARE_(NAME, name) extern const lk_op_def lk_##name##_def;
LK_OPS(LK_DEF_DECLARE_)
#undef LK_DEF_DECLARE_

static const lk_op_def *const defs[] = {
#define LK_DEF_SLOT_(NAME, name) [LK_OP_##NAME] = &lk_##name##_def,
    LK_OPS(LK_DEF_SLOT_)
#undef LK_DEF_SLOT_
};
_Static_assert(sizeof defs / sizeof *defs == LK_OP_COUNT, "defs: one descriptor per lk_op, in LK_OPS");

const lk_op_def *lk_op_def_get(lk_op op) {
    return (unsigned)op < LK_OP_COUNT ? defs[op] : NULL;
}

const char *lk_op_name_needs(lk_op op, const char *name) {
    const lk_op_def *def = lk_op_def_get(op);
    for (const lk_name_need *n = def && name ? def->name_needs : NULL; n && n->name; n++)
        if (strcmp(n->name, name) == 0) return n->needs;
    return NULL;
}

const lk_op_info *lk_op_info_get(lk_op op) {
    return (unsigned)op < LK_OP_COUNT ? &defs[op]->info : NULL;
}

const lk_op_alias *lk_op_alias_find(lk_op op, const char *name) {
    const lk_op_info *info = lk_op_info_get(op);
    for (const lk_op_alias *a = info && name ? info->aliases : NULL; a && a->name; a++)
        if (strcmp(a->name, name) == 0) return a;
    return NULL;
}

void lk_op_names_text(lk_op op, char *buf, size_t n) {
    const lk_op_info *info = lk_op_info_get(op);
    size_t k = 0;
    buf[0] = '\0';
    for (const char *const *kn = info ? info->known : NULL; kn && *kn && k < n; kn++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", *kn);
    const char *origin = NULL;
    for (const lk_op_alias *a = info ? info->aliases : NULL; a && a->name && k < n; a++) {
        int first = origin == NULL || strcmp(origin, a->origin) != 0;
        k += (size_t)snprintf(buf + k, n - k, "%s%s%s%s", first && origin ? ")" : "", first ? " (" : ", ",
                              first ? a->origin : "", first ? ": " : "");
        k += k < n ? (size_t)snprintf(buf + k, n - k, "%s", a->name) : 0;
        origin = a->origin;
    }
    if (origin && k < n) snprintf(buf + k, n - k, ")");
}

const char *lk_op_suggest(lk_op op, const char *word) {
    const lk_op_info *info = lk_op_info_get(op);
    const char *names[64];
    size_t k = 0;
    for (const char *const *kn = info ? info->known : NULL; kn && *kn && k + 1 < 64; kn++) names[k++] = *kn;
    for (const lk_op_alias *a = info ? info->aliases : NULL; a && a->name && k + 1 < 64; a++) names[k++] = a->name;
    names[k] = NULL;
    return word ? lk_suggest(word, names) : NULL;
}

lk_status lk_op_parse(const char *name, lk_op *out) {
    char all[256];
    size_t k = 0;
    for (int i = 0; i < LK_OP_COUNT; i++) {
        const lk_op_info *info = &defs[i]->info;
        if (name && (strcmp(name, info->name) == 0 || strcmp(name, info->field) == 0)) {
            *out = (lk_op)i;
            return LK_OK;
        }
        if (k < sizeof all) k += (size_t)snprintf(all + k, sizeof all - k, "%s%s", i ? ", " : "", info->name);
    }
    return lk_error(LK_EINVAL, "op: expected one of %s (or their config fields), got '%s'", all,
                    name ? name : "(null)");
}

const char *lk_source_name(lk_source s) {
    static const char *const n[] = {"default", "env", "config", "override"};
    return (unsigned)s < 4 ? n[s] : "?";
}

const char *lk_stage_name(lk_stage s) {
    static const char *const n[] = {"init", "model_register", "config_finalize", "model_build",
                                    "runtime"};
    return (unsigned)s < 5 ? n[s] : "?";
}
