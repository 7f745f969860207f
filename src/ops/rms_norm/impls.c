/* impls.c — the registry rows of RMSNorm on the CPU: one row per implementation, each
 * pointing at the vtable its own file defines. lk_init() registers this table (the
 * registry's builtin list names it); adding a kernel is one file and one row here. */
#include "llmkern/rms_norm.h"

extern const lk_rms_norm_vtable lk_rms_norm_eager_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_eager_fp32_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_fused_vtable;

#define RMS_NORM_CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_rms_norm_impls[] = {
    {
        .op = LK_OP_RMS_NORM,
        .name = "eager",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = RMS_NORM_CPU_DTYPES},
        .vtable = &lk_rms_norm_eager_vtable,
        .summary = "unfused composition, one pass per step, intermediates in the input dtype",
    },
    {
        .op = LK_OP_RMS_NORM,
        .name = "eager_fp32",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = RMS_NORM_CPU_DTYPES},
        .vtable = &lk_rms_norm_eager_fp32_vtable,
        .summary = "unfused composition, one pass per step, intermediates in f32",
    },
    {
        .op = LK_OP_RMS_NORM,
        .name = "fused",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = RMS_NORM_CPU_DTYPES},
        .vtable = &lk_rms_norm_fused_vtable,
        .summary = "one pass per row each way, f32 math, OpenMP + AVX-512, streaming stores",
    },
    {.name = NULL},
};
