/* impls.c — the registry rows of RMSNorm on the CPU, and on CUDA when built with it:
 * one row per implementation, each pointing at the vtable its own file defines.
 * lk_init() registers this table (the registry's builtin list names it); adding a
 * kernel is one file and one row here. */
#include "llmkern/rms_norm.h"

extern const lk_rms_norm_vtable lk_rms_norm_eager_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_eager_fp32_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_rms_norm_vtable lk_rms_norm_cuda_fused_vtable;       /* fused.cu */
extern const lk_rms_norm_vtable lk_rms_norm_cuda_eager_fp32_vtable;  /* eager_fp32.cu */
#endif

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
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_RMS_NORM,
        .name = "fused",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = RMS_NORM_CPU_DTYPES},
        .vtable = &lk_rms_norm_cuda_fused_vtable,
        .summary = "one pass each way, row in registers, 16-byte accesses, deterministic f32 dweight",
    },
    {
        .op = LK_OP_RMS_NORM,
        .name = "eager_fp32",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = RMS_NORM_CPU_DTYPES},
        .vtable = &lk_rms_norm_cuda_eager_fp32_vtable,
        .summary = "one kernel per step, every intermediate an f32 tensor (the unfused baseline)",
    },
#endif
    {.name = NULL},
};
