/* op_def.h — the one descriptor each op folder exports (src/ops/<op>/def.c defines
 * lk_<op>_def): what the project knows of the op (its catalog entry: name, config field,
 * every name, reference, defaults, other systems' aliases), its registry rows, its
 * harness for `llmkern check` and `llmkern bench`, and the rule its vtables follow. The
 * registry holds one per lk_op (src/registry/ops.c, made from LK_OPS in registry.h) and
 * derives everything else from them: the rows lk_init registers, the catalog lookups,
 * lk_harness_get. Adding an op is its folder and its line in LK_OPS. */
#ifndef LLMKERN_OP_DEF_H
#define LLMKERN_OP_DEF_H

#include "llmkern/llmkern.h"
#include "ops/harness.h"

/* What a name of the op needs that a build or machine may lack ("a Hopper GPU (sm_90)
 * and CUDA"), for the names `known` lists that this build may not have. */
typedef struct {
    const char *name;
    const char *needs;
} lk_name_need;

typedef struct lk_op_def {
    lk_op_info info;                /* info.op is the descriptor's slot; checked by lk_init */
    const lk_impl *impls;           /* the built-in rows, ending in a row with a NULL name */
    const lk_harness *harness;      /* NULL: `llmkern check` and `bench` have none for the op */
    const lk_name_need *name_needs; /* ending in a NULL name; or NULL */
    /* The first member a vtable of the op must have and this one lacks ("backward"), or
     * NULL when it is complete. lk_impl_check calls it for every row registered and every
     * facade call, after the version. NULL: nothing beyond the version is required. */
    const char *(*vtable_lacks)(const void *vtable);
} lk_op_def;

/* The descriptor of op, or NULL when op is not one. */
const lk_op_def *lk_op_def_get(lk_op op);

/* impl is an implementation of want whose vtable is of version >= 1 and has every member
 * want's descriptor requires: what lk_impl_register checks of each row, and each facade
 * of the impl it is called with (a row built by hand need not be registered). LK_EINVAL
 * naming caller ("rms_norm", "registry"), the row and expected vs got. */
lk_status lk_impl_check(const char *caller, const lk_impl *impl, lk_op want);

/* For the catalogs in the def.c files. */
#define LK_NAMES(...) (const char *const[]){__VA_ARGS__, NULL}
#define LK_ALIASES(...) (const lk_op_alias[]){__VA_ARGS__, {.name = NULL}}
#define LK_NEEDS(...) (const lk_name_need[]){__VA_ARGS__, {.name = NULL}}
#define LK_EVERYWHERE(n) {[LK_DEVICE_CPU] = n, [LK_DEVICE_CUDA] = n}
#define LK_BY_DEVICE(cpu, cuda) {[LK_DEVICE_CPU] = cpu, [LK_DEVICE_CUDA] = cuda}
/* NeMo AutoModel's BackendConfig names (model.backend.attn, .rms_norm, .rope, .experts,
 * .dispatcher, .linear; src/config/backend_yaml.c), resolved per op: one llmkern
 * implementation on every device, or (NOT_HERE) a name llmkern does not implement, which
 * an explicit request is refused for with the nearest one named. */
#define LK_NEMO "NeMo AutoModel"
#define LK_NEMO_SAME(n, llmkern) {.name = n, .origin = LK_NEMO, .same_as = LK_EVERYWHERE(llmkern)}
#define LK_NEMO_NOT_HERE(n, what_, near) {.name = n, .origin = LK_NEMO, .nearest = near, .what = what_}

/* The storage dtypes most rows take. */
#define LK_F32_BF16 (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

/* Defines fn, the vtable_lacks of an op whose vtables (vt_type) need the members every
 * training op's vtable has: its saved-bytes query, forward and backward. */
#define LK_DEFINE_LACKS_PASSES(fn, vt_type)                                                \
    static const char *fn(const void *vtable) {                                            \
        const vt_type *vt = vtable;                                                        \
        return !vt->saved_bytes ? "saved_bytes"                                            \
             : !vt->forward     ? "forward"                                                \
             : !vt->backward    ? "backward"                                               \
                                : NULL;                                                    \
    }

#endif
