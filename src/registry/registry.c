/* registry.c — registration (each row checked by its op's descriptor, as every facade
 * checks the row it is called with: lk_impl_check), lookup and the requirement check of
 * implementations, and the probed hardware. */
#include <stdio.h>
#include <string.h>
#include "ops/op_def.h"
#include "registry/registry_internal.h"

lk_registry lk_reg;

lk_status lk_impl_check(const char *caller, const lk_impl *impl, lk_op want) {
    const lk_op_def *def = lk_op_def_get(want);
    const char *name = impl && impl->name ? impl->name : "(unnamed)";
    if (impl == NULL) return lk_error(LK_EINVAL, "%s: impl: expected an implementation, got NULL", caller);
    if (impl->op != want || def == NULL) {
        const lk_op_info *got = lk_op_info_get(impl->op);
        return lk_error(LK_EINVAL, "%s: impl: expected an implementation of %s, got '%s' of %s", caller,
                        def ? def->info.name : "a known op", name, got ? got->name : "no known op");
    }
    if (impl->vtable == NULL || *(const int *)impl->vtable < 1)
        return lk_error(LK_EINVAL, "%s: impl: expected a vtable of version >= 1 in '%s', got %s", caller, name,
                        impl->vtable ? "version < 1" : "NULL");
    const char *lacks = def->vtable_lacks ? def->vtable_lacks(impl->vtable) : NULL;
    if (lacks) return lk_error(LK_EINVAL, "%s: impl: expected %s in '%s', got a NULL member", caller, lacks, name);
    return LK_OK;
}

lk_status lk_impl_register(const lk_impl *impl) {
    if (impl == NULL || impl->name == NULL || (unsigned)impl->op >= LK_OP_COUNT)
        return lk_error(LK_EINVAL, "registry: impl: expected an entry with an op and a name, got an incomplete one");
    lk_status s = lk_impl_check("registry", impl, impl->op);
    if (s) return s;
    if (lk_impl_find(impl->op, impl->name, impl->device))
        return lk_error(LK_EINVAL, "registry: impl: %s '%s' on %s is already registered",
                        lk_op_info_get(impl->op)->name, impl->name, lk_device_name(impl->device));
    if (lk_reg.n_impls == LK_MAX_IMPLS)
        return lk_error(LK_ENOMEM, "registry: more than %d implementations", LK_MAX_IMPLS);
    lk_reg.impls[lk_reg.n_impls++] = impl;
    return LK_OK;
}

int lk_impl_count(void) { return lk_reg.n_impls; }

const lk_impl *lk_impl_at(int i) { return i >= 0 && i < lk_reg.n_impls ? lk_reg.impls[i] : NULL; }

static int impl_has_name(const lk_impl *impl, const char *name) {
    if (strcmp(impl->name, name) == 0) return 1;
    for (const char *const *a = impl->aliases; a && *a; a++)
        if (strcmp(*a, name) == 0) return 1;
    return 0;
}

const lk_impl *lk_impl_find(lk_op op, const char *name, lk_device_type dev) {
    for (int i = 0; name && i < lk_reg.n_impls; i++) {
        const lk_impl *impl = lk_reg.impls[i];
        if (impl->op == op && impl->device == dev && impl_has_name(impl, name)) return impl;
    }
    return NULL;
}

int lk_impl_available(const lk_impl *impl, const lk_hw *hw, char *why, size_t n) {
    const lk_requirements *r = &impl->needs;
    if (impl->device == LK_DEVICE_CUDA && hw->cuda_devices == 0)
        return snprintf(why, n, "needs a CUDA GPU (%s)", hw->cuda_why[0] ? hw->cuda_why : "none found"), 0;
    if (r->min_cc && hw->cuda_cc < r->min_cc)
        return snprintf(why, n, "needs compute capability %d.%d, this GPU has %d.%d",
                        r->min_cc / 10, r->min_cc % 10, hw->cuda_cc / 10, hw->cuda_cc % 10), 0;
    if ((r->needs & LK_NEED_CUDNN) && !hw->has_cudnn) return snprintf(why, n, "needs cuDNN"), 0;
    if ((r->needs & LK_NEED_MPI) && !hw->has_mpi) return snprintf(why, n, "needs MPI"), 0;
    if ((r->needs & LK_NEED_NCCL) && !hw->has_nccl) return snprintf(why, n, "needs NCCL"), 0;
    if (impl->supported && !impl->supported(hw, why, n)) return 0;
    if (n) why[0] = '\0';
    return 1;
}

int lk_impl_is_reference(const lk_impl *impl) {
    return strcmp(impl->name, lk_op_info_get(impl->op)->reference) == 0;
}

const lk_hw *lk_hw_get(void) {
    if (lk_init() != LK_OK && lk_reg.hw.cpu_cores == 0) lk_hw_probe_cpu(&lk_reg.hw);
    return &lk_reg.hw;
}
