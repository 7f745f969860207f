/* builtin.c — the implementation tables lk_init registers. Adding an op is one line
 * here; adding an implementation is one row in the op's own impls.c. */
#include "registry/registry_internal.h"

extern const lk_impl lk_rms_norm_impls[];

const lk_impl *const lk_builtin_tables[] = {
    lk_rms_norm_impls,
    NULL,
};
