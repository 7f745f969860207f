/* def.c — RMSNorm's descriptor (lk_rms_norm_def, src/ops/op_def.h): its catalog entry,
 * its registry rows on the CPU and, built with CUDA, on the GPU (each pointing at the
 * vtable its own file defines), its harness and the members its vtables must have.
 * Adding a kernel is one file and one row here. */
#include "llmkern/rms_norm.h"
#include "ops/op_def.h"

extern const lk_rms_norm_vtable lk_rms_norm_eager_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_eager_fp32_vtable;
extern const lk_rms_norm_vtable lk_rms_norm_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_rms_norm_vtable lk_rms_norm_cuda_fused_vtable;       /* fused.cu */
extern const lk_rms_norm_vtable lk_rms_norm_cuda_eager_fp32_vtable;  /* eager_fp32.cu */
#endif
extern const lk_harness lk_rms_norm_harness;

static const lk_impl rows[] = {
    {.op = LK_OP_RMS_NORM, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_rms_norm_eager_vtable,
     .summary = "unfused composition, one pass per step, intermediates in the input dtype"},
    {.op = LK_OP_RMS_NORM, .name = "eager_fp32", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_rms_norm_eager_fp32_vtable,
     .summary = "unfused composition, one pass per step, intermediates in f32"},
    {.op = LK_OP_RMS_NORM, .name = "fused", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_rms_norm_fused_vtable,
     .summary = "one pass per row each way, f32 math, OpenMP + AVX-512, streaming stores; strided views"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_RMS_NORM, .name = "fused", .device = LK_DEVICE_CUDA, .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_rms_norm_cuda_fused_vtable,
     .summary = "one pass each way, row in registers, 16-byte accesses, deterministic f32 dweight; strided views"},
    {.op = LK_OP_RMS_NORM, .name = "eager_fp32", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_rms_norm_cuda_eager_fp32_vtable,
     .summary = "one kernel per step, every intermediate an f32 tensor (the unfused baseline)"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(lacks, lk_rms_norm_vtable)

const lk_op_def lk_rms_norm_def = {
    .info = {
        .op = LK_OP_RMS_NORM, .name = "rms_norm", .field = "rms_norm_implementation",
        .known = LK_NAMES("eager", "eager_fp32", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        .aliases = LK_ALIASES(
            LK_NEMO_SAME("torch", "eager"), LK_NEMO_SAME("torch_fp32", "eager_fp32"),
            LK_NEMO_NOT_HERE("te", "Transformer Engine's fused RMSNorm", LK_EVERYWHERE("fused")),
            LK_NEMO_NOT_HERE("quack", "QuACK's CuTe DSL RMSNorm", LK_EVERYWHERE("fused"))),
    },
    .impls = rows, .harness = &lk_rms_norm_harness, .vtable_lacks = lacks,
};
