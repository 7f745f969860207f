/* select.c — selection: the one function that turns a request (or none) into a bound
 * implementation, and says why. Order: an explicit request (per-module override or
 * per-op field; the caller passes whichever applies) must be met or it is an error
 * (another system's name is first resolved to the llmkern one it equals, per op and
 * device, or refused with the nearest one named); otherwise the environment default,
 * then the built-in default, may fall back. The environment defaults are the ones it is
 * handed (lk_select_in): a config's own for the stages that have one, never read here. */
#include <stdio.h>
#include <string.h>
#include "registry/registry_internal.h"

int lk_impl_name_known(lk_op op, const char *name) {
    const lk_op_info *info = lk_op_info_get(op);
    for (const char *const *k = info->known; *k; k++)
        if (strcmp(*k, name) == 0) return 1;
    if (lk_op_alias_find(op, name)) return 1;
    for (int d = 0; d < LK_DEVICE_COUNT; d++)
        if (lk_impl_find(op, name, (lk_device_type)d)) return 1;
    return 0;
}

/* "fused, eager" — the implementations of op that run on dev here. */
static void list_available(lk_op op, lk_device_type dev, char *buf, size_t n) {
    size_t k = 0;
    char why[160];
    buf[0] = '\0';
    for (int i = 0; i < lk_impl_count() && k < n; i++) {
        const lk_impl *impl = lk_impl_at(i);
        if (impl->op == op && impl->device == dev && lk_impl_available(impl, &lk_reg.hw, why, sizeof why))
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", impl->name);
    }
    if (k == 0) snprintf(buf, n, "none in this build");
}

/* The GPU default the probed device meets first (index into info->gpu_defaults), or -1. */
static int gpu_default(const lk_op_info *info, lk_device_type dev) {
    if (dev != LK_DEVICE_CUDA || !info->gpu_defaults || lk_reg.hw.cuda_devices == 0) return -1;
    for (int i = 0; info->gpu_defaults[i].name; i++)
        if (lk_reg.hw.cuda_cc >= info->gpu_defaults[i].min_cc) return i;
    return -1;
}

/* The value the environment or the built-in defaults ask for, and where it came from. */
static const char *default_name(const lk_op_info *info, lk_device_type dev, const lk_env_value *env, lk_source *src,
                                char *detail, size_t n) {
    const lk_env_value *backend = &env[LK_ENV_BACKEND];
    const lk_env_value *fused = &env[LK_ENV_USE_FUSED];
    const lk_env_value *chunk = &env[LK_ENV_ENABLE_CHUNK_LOSS];
    const lk_env_value *group = &env[LK_ENV_USE_GROUP_GEMM];
    const lk_env_value *by = NULL;
    const char *name = info->default_fused;

    if (strcmp(backend->value, "reference") == 0) {
        by = backend;
        name = info->reference;
    } else if (info->op == LK_OP_CROSS_ENTROPY && strcmp(chunk->value, "1") == 0) {
        by = chunk;
        name = "chunk_loss";
    } else if (info->op == LK_OP_MOE_EXPERTS) {
        by = group;
        name = strcmp(group->value, "1") == 0 ? info->default_fused : info->default_plain;
    } else if (info->default_fused != info->default_plain) {   /* the ops LLMKERN_USE_FUSED governs */
        by = fused;
        name = strcmp(fused->value, "1") == 0 ? info->default_fused : info->default_plain;
    }
    if (by && by->set_by[0]) {
        *src = LK_SOURCE_ENV;
        snprintf(detail, n, "%s=%s", by->set_by, by->raw);
        return name;
    }
    *src = LK_SOURCE_DEFAULT;
    int g = by == backend ? -1 : gpu_default(info, dev);
    if (g < 0) {
        snprintf(detail, n, "built-in");
        return name;
    }
    snprintf(detail, n, "built-in for sm_%d (%s)", lk_reg.hw.cuda_cc, lk_reg.hw.cuda_name);
    return info->gpu_defaults[g].name;
}

/* With the llmkern backend, the flash and flex names enter the SP-aware attention
 * facade: flash_attention_2 -> llmkern_flash_attention_2_with_sp. */
static const char *sp_rewrite(lk_op op, const char *name, const lk_env_value *env, char *buf, size_t n) {
    static const char *const rewritten[] = {"flash_attention_2", "flash_attention_3",
                                            "flash_attention_4", "flex_attention", NULL};
    if (op != LK_OP_ATTENTION || strcmp(env[LK_ENV_BACKEND].value, "llmkern") != 0) return name;
    for (const char *const *r = rewritten; *r; r++)
        if (strcmp(name, *r) == 0) {
            snprintf(buf, n, "llmkern_%s_with_sp", name);
            return buf;
        }
    return name;
}

/* An explicit request that cannot be met. name is the llmkern name it resolved to; alias,
 * when the request was another system's name, says which. */
static lk_status explicit_error(const lk_request *req, const lk_op_info *info, const char *name,
                                const lk_op_alias *alias) {
    char avail[256], why[160] = "", shown[160];
    list_available(req->op, req->device, avail, sizeof avail);
    const char *where = req->source_detail && req->source_detail[0] ? req->source_detail : "";
    const char *sep = where[0] ? ": " : "";
    if (!lk_impl_name_known(req->op, name)) {
        const char *hint = lk_op_suggest(req->op, name);
        char valid[512];
        lk_op_names_text(req->op, valid, sizeof valid);
        return lk_error(LK_EINVAL, "%s%s%s: unknown implementation '%s'%s%s%s; valid: %s; "
                        "available here: %s", where, sep, info->field, name,
                        hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "",
                        valid, avail);
    }
    if (alias && !alias->same_as[req->device]) {
        const char *near = alias->nearest[req->device];
        return lk_error(LK_EUNAVAILABLE, "%s%s%s: '%s' (%s: %s) is not available in llmkern; the nearest "
                        "llmkern implementation is '%s'; available here: %s", where, sep, info->field,
                        alias->name, alias->origin, alias->what ? alias->what : "no llmkern equivalent",
                        near ? near : info->reference, avail);
    }
    if (alias) snprintf(shown, sizeof shown, "%s' (%s) = '%s", alias->name, alias->origin, name);
    else snprintf(shown, sizeof shown, "%s", name);
    const lk_impl *impl = lk_impl_find(req->op, name, req->device);
    if (impl) lk_impl_available(impl, &lk_reg.hw, why, sizeof why);
    else {
        lk_device_type other = req->device == LK_DEVICE_CPU ? LK_DEVICE_CUDA : LK_DEVICE_CPU;
        if (lk_impl_find(req->op, name, other))
            snprintf(why, sizeof why, "it runs on %s, the model runs on %s", lk_device_name(other),
                     lk_device_name(req->device));
        else if (lk_op_name_needs(req->op, name))
            snprintf(why, sizeof why, "not available in this build (it needs %s)", lk_op_name_needs(req->op, name));
        else
            snprintf(why, sizeof why, "not available in this build");
    }
    return lk_error(LK_EUNAVAILABLE, "%s%s%s: '%s' cannot be used: %s; available here: %s", where, sep,
                    info->field, shown, why, avail);
}

lk_status lk_select(const lk_request *req, lk_stage stage, lk_binding *out) {
    return lk_select_in(req, lk_reg.env, stage, out);
}

lk_status lk_select_in(const lk_request *req, const lk_env_value *env, lk_stage stage, lk_binding *out) {
    lk_status s = lk_init();
    if (s) return s;
    const lk_op_info *info = lk_op_info_get(req->op);
    if (info == NULL) return lk_error(LK_EINVAL, "select: op: expected an lk_op, got %d", (int)req->op);
    if ((unsigned)req->device >= LK_DEVICE_COUNT)
        return lk_error(LK_EINVAL, "select: device: expected cpu or cuda, got %d", (int)req->device);

    lk_binding b = {.op = req->op, .stage = stage};
    snprintf(b.module, sizeof b.module, "%s", req->module ? req->module : "");
    const char *name = req->name;
    char why[160], buf[96];

    if (name) {                                   /* explicit: met exactly, or an error */
        b.source = req->source;
        snprintf(b.source_detail, sizeof b.source_detail, "%s", req->source_detail ? req->source_detail : "");
        /* another system's name is the llmkern one it equals on this device, then as that
         * (the catalog keeps alias names apart from llmkern's: test_registry checks it) */
        const lk_op_alias *alias = lk_op_alias_find(req->op, name);
        const char *as = alias ? alias->same_as[req->device] : name;
        const char *find = as ? sp_rewrite(req->op, as, env, buf, sizeof buf) : NULL;
        const lk_impl *impl = find ? lk_impl_find(req->op, find, req->device) : NULL;
        if (!impl || !lk_impl_available(impl, &lk_reg.hw, why, sizeof why))
            return explicit_error(req, info, as ? as : name, alias);
        b.impl = impl;
    } else {                                      /* a default: may fall back, recorded */
        name = default_name(info, req->device, env, &b.source, b.source_detail, sizeof b.source_detail);
        const lk_impl *impl = lk_impl_find(req->op, sp_rewrite(req->op, name, env, buf, sizeof buf),
                                           req->device);
        if (impl && lk_impl_available(impl, &lk_reg.hw, why, sizeof why)) {
            b.impl = impl;
        } else {
            if (!impl) snprintf(why, sizeof why, "not available in this build");
            /* the GPU's later defaults (under their SP names), then the reference, then the
             * catalog's order */
            const lk_impl *alt = NULL;
            char w2[160], b2[96];
            int g = b.source == LK_SOURCE_DEFAULT ? gpu_default(info, req->device) : -1;
            for (int i = g + 1; g >= 0 && !alt && info->gpu_defaults[i].name; i++) {
                const char *next = sp_rewrite(req->op, info->gpu_defaults[i].name, env, b2, sizeof b2);
                alt = lk_impl_find(req->op, next, req->device);
                if (alt && !lk_impl_available(alt, &lk_reg.hw, w2, sizeof w2)) alt = NULL;
            }
            if (!alt) alt = lk_impl_find(req->op, info->reference, req->device);
            if (alt && !lk_impl_available(alt, &lk_reg.hw, w2, sizeof w2)) alt = NULL;
            for (const char *const *k = info->known; !alt && *k; k++) {
                const lk_impl *c = lk_impl_find(req->op, *k, req->device);
                if (c && lk_impl_available(c, &lk_reg.hw, w2, sizeof w2)) alt = c;
            }
            b.impl = alt;
            snprintf(b.fallback, sizeof b.fallback, "'%s' %s; %s", name, why,
                     alt ? alt->name : "nothing to fall back to");
            if (alt) strncat(b.fallback, " used instead", sizeof b.fallback - strlen(b.fallback) - 1);
        }
    }
    snprintf(b.requested, sizeof b.requested, "%s", name);
    snprintf(b.resolved, sizeof b.resolved, "%s",
             b.impl ? b.impl->name : sp_rewrite(req->op, name, env, buf, sizeof buf));
    *out = b;
    return LK_OK;
}
