/* def.c — cross-entropy's descriptor (lk_cross_entropy_def, src/ops/op_def.h): its
 * catalog entry, its registry rows on the CPU and, built with CUDA, on the GPU (each
 * pointing at the vtable its own file defines), its harness and the members its vtables
 * must have. */
#include "llmkern/cross_entropy.h"
#include "ops/op_def.h"

extern const lk_cross_entropy_vtable lk_cross_entropy_eager_vtable;
extern const lk_cross_entropy_vtable lk_cross_entropy_fused_vtable;
extern const lk_cross_entropy_vtable lk_cross_entropy_chunk_loss_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_cross_entropy_vtable lk_cross_entropy_cuda_fused_vtable;   /* fused_cuda.c + fused.cu */
#endif
extern const lk_harness lk_cross_entropy_harness;

static const lk_impl rows[] = {
    {.op = LK_OP_CROSS_ENTROPY, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_cross_entropy_eager_vtable,
     .summary = "autograd of the unfused composition: [T, V] logits, log-softmax and dlogits materialized"},
    {.op = LK_OP_CROSS_ENTROPY, .name = "fused", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_cross_entropy_fused_vtable,
     .summary = "LM head + CE by chunks (memory budget), gradients made in the forward (Liger-style)"},
    {.op = LK_OP_CROSS_ENTROPY, .name = "chunk_loss", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_cross_entropy_chunk_loss_vtable,
     .summary = "LM head + CE by chunks, saves the log-sum-exp only, backward recomputes each chunk"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_CROSS_ENTROPY, .name = "fused", .device = LK_DEVICE_CUDA,
     .needs = {.min_cc = 80, .dtypes = LK_F32_BF16}, .vtable = &lk_cross_entropy_cuda_fused_vtable,
     .summary = "cuBLASLt LM head by chunks, one online-softmax + loss + gradient kernel per chunk, f32 dW"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(lacks, lk_cross_entropy_vtable)

const lk_op_def lk_cross_entropy_def = {
    .info = {
        .op = LK_OP_CROSS_ENTROPY, .name = "cross_entropy", .field = "cross_entropy_loss_implementation",
        .known = LK_NAMES("eager", "fused", "chunk_loss"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
    },
    .impls = rows, .harness = &lk_cross_entropy_harness, .vtable_lacks = lacks,
};
