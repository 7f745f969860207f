/* builtin.c — the implementation tables lk_init registers. Adding an op is one line
 * here; adding an implementation is one row in the op's own impls.c. */
#include "registry/registry_internal.h"

extern const lk_impl lk_rms_norm_impls[];
extern const lk_impl lk_moe_dispatch_impls[];
extern const lk_impl lk_attention_impls[];
extern const lk_impl lk_moe_router_impls[];
extern const lk_impl lk_moe_experts_impls[];
extern const lk_impl lk_cross_entropy_impls[];
extern const lk_impl lk_swiglu_mlp_impls[];
extern const lk_impl lk_rope_impls[];
extern const lk_impl lk_linear_impls[];

const lk_impl *const lk_builtin_tables[] = {
    lk_rms_norm_impls,
    lk_moe_dispatch_impls,
    lk_attention_impls,
    lk_moe_router_impls,
    lk_moe_experts_impls,
    lk_cross_entropy_impls,
    lk_swiglu_mlp_impls,
    lk_rope_impls,
    lk_linear_impls,
    NULL,
};
