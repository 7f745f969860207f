/* def.c — the SwiGLU MLP's descriptor (lk_swiglu_mlp_def, src/ops/op_def.h): its catalog
 * entry, its registry rows on the CPU and, built with CUDA, on the GPU (each pointing at
 * the vtable its own file defines), its harness and the members its vtables must have. */
#include "llmkern/swiglu_mlp.h"
#include "ops/op_def.h"

extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_eager_vtable;
extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_swiglu_mlp_vtable lk_swiglu_mlp_cuda_fused_vtable;   /* fused_cuda.c + fused.cu */
#endif
extern const lk_harness lk_swiglu_mlp_harness;

static const lk_impl rows[] = {
    {.op = LK_OP_SWIGLU_MLP, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_swiglu_mlp_eager_vtable,
     .summary = "autograd's composition: gate and up GEMMs, every intermediate materialized and saved"},
    {.op = LK_OP_SWIGLU_MLP, .name = "fused", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_swiglu_mlp_fused_vtable,
     .summary = "one gate_up GEMM, fused activation, saves only gate_up, token chunks"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_SWIGLU_MLP, .name = "fused", .device = LK_DEVICE_CUDA, .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_swiglu_mlp_cuda_fused_vtable,
     .summary = "cuBLAS GEMMs (f32 accumulation), fused activation kernel each way, saves only gate_up"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(lacks, lk_swiglu_mlp_vtable)

const lk_op_def lk_swiglu_mlp_def = {
    .info = {
        .op = LK_OP_SWIGLU_MLP, .name = "swiglu_mlp", .field = "swiglu_mlp_implementation",
        .known = LK_NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    .impls = rows, .harness = &lk_swiglu_mlp_harness, .vtable_lacks = lacks,
};
