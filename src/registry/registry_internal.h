/* registry_internal.h — the registry's state, shared by the files of src/registry/
 * only. This is the one piece of global state in llmkern. */
#ifndef LLMKERN_REGISTRY_INTERNAL_H
#define LLMKERN_REGISTRY_INTERNAL_H

#include "llmkern/config.h"

#define LK_MAX_IMPLS 256
#define LK_MAX_FAMILIES 16
/* The ops a model family may replace with fused modules at registration. */
#define LK_FAMILY_OPS 3
extern const lk_op lk_family_ops[LK_FAMILY_OPS];

typedef struct {
    const lk_impl *impls[LK_MAX_IMPLS];
    int n_impls;
    lk_hw hw;
    lk_env_value env[LK_ENV_COUNT];
    lk_binding loss_slot[LK_DEVICE_COUNT];
    struct {
        const lk_model_family *family;
        lk_binding bound[LK_DEVICE_COUNT][LK_FAMILY_OPS];
    } families[LK_MAX_FAMILIES];
    int n_families;
} lk_registry;

extern lk_registry lk_reg;

void lk_hw_probe_cpu(lk_hw *hw);
void lk_hw_probe_cuda(lk_hw *hw);   /* hw_cuda.c, built with CUDA only */
/* lk_select with the environment defaults env (LK_ENV_COUNT values): the registry's own
 * for the stages before any config (init, model registration), a config's for the rest. */
lk_status lk_select_in(const lk_request *req, const lk_env_value *env, lk_stage stage, lk_binding *out);
/* Binds what the init and model-register stages own, for every device kind. */
lk_status lk_bind_init_stage(void);
lk_status lk_bind_family(int index);
/* src/config/ops_config.c: cfg's router options parsed; a noise above 0 is LK_EINVAL
 * unless the op-wide router binding (NULL: the default) or a module's is fake_balanced. */
lk_status lk_ops_config_router_options(const lk_ops_config *cfg, const lk_binding *router,
                                       const lk_binding *modules, int n_modules, lk_router_options *out);

#endif
