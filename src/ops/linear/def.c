/* def.c — linear's descriptor (lk_linear_def, src/ops/op_def.h): its catalog entry, its
 * registry rows (blas on the CPU; cublaslt on CUDA when built with it, each pointing at
 * the vtable its own file defines), its harness and the members its vtables must have. */
#include "llmkern/linear.h"
#include "ops/op_def.h"

extern const lk_linear_vtable lk_linear_blas_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_linear_vtable lk_linear_cublaslt_vtable;   /* cublaslt_cuda.c + cublaslt.cu */
#endif
extern const lk_harness lk_linear_harness;

static const lk_impl rows[] = {
    {.op = LK_OP_LINEAR, .name = "blas", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_linear_blas_vtable,
     .summary = "one CBLAS GEMM per product, bf16 widened to f32, f32 gradients accumulated"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_LINEAR, .name = "cublaslt", .device = LK_DEVICE_CUDA, .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_linear_cublaslt_vtable,
     .summary = "cuBLASLt matmuls with a cached heuristic plan per shape, bias epilogue, f32 accumulation"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(lacks, lk_linear_vtable)

const lk_op_def lk_linear_def = {
    .info = {
        .op = LK_OP_LINEAR, .name = "linear", .field = "linear_implementation",
        .known = LK_NAMES("blas", "cublaslt"),
        .reference = "blas", .default_fused = "blas", .default_plain = "blas",
        .aliases = LK_ALIASES(
            {.name = "torch", .origin = LK_NEMO, .same_as = LK_BY_DEVICE("blas", "cublaslt")},
            LK_NEMO_NOT_HERE("te", "Transformer Engine's Linear", LK_BY_DEVICE("blas", "cublaslt")),
            LK_NEMO_NOT_HERE("quack", "QuACK's CuTe DSL GEMM", LK_BY_DEVICE("blas", "cublaslt"))),
    },
    .impls = rows, .harness = &lk_linear_harness,
    .name_needs = LK_NEEDS({"cublaslt", "a CUDA GPU and cuBLASLt"}),
    .vtable_lacks = lacks,
};
