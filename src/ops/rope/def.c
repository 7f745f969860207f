/* def.c — RoPE's descriptor (lk_rope_def, src/ops/op_def.h): its catalog entry, its
 * registry rows on the CPU and, built with CUDA, on the GPU (each pointing at the vtable
 * its own file defines), its harness and the members its vtables must have. Adding a
 * kernel is one file and one row here. */
#include "llmkern/rope.h"
#include "ops/op_def.h"

extern const lk_rope_vtable lk_rope_eager_vtable;
extern const lk_rope_vtable lk_rope_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_rope_vtable lk_rope_cuda_fused_vtable;   /* fused.cu */
#endif
extern const lk_harness lk_rope_harness;

static const lk_impl rows[] = {
    {.op = LK_OP_ROPE, .name = "eager", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_rope_eager_vtable,
     .summary = "HF's unfused steps: gathered cos/sin, rotate_half, products, sum; one pass each"},
    {.op = LK_OP_ROPE, .name = "fused", .device = LK_DEVICE_CPU, .needs = {.dtypes = LK_F32_BF16},
     .vtable = &lk_rope_fused_vtable, .summary = "one pass over q and k each way, f32 table lookups, OpenMP + AVX-512"},
#ifdef LLMKERN_HAVE_CUDA
    {.op = LK_OP_ROPE, .name = "fused", .device = LK_DEVICE_CUDA, .needs = {.min_cc = 80, .dtypes = LK_F32_BF16},
     .vtable = &lk_rope_cuda_fused_vtable,
     .summary = "one pass over q and k each way, cos/sin read once per token, 16-byte accesses"},
#endif
    {.name = NULL},
};

LK_DEFINE_LACKS_PASSES(lacks, lk_rope_vtable)

const lk_op_def lk_rope_def = {
    .info = {
        .op = LK_OP_ROPE, .name = "rope", .field = "rotary_pos_emb_implementation",
        .known = LK_NAMES("eager", "fused"),
        .reference = "eager", .default_fused = "fused", .default_plain = "eager",
        /* NeMo's rope_fusion: true (TE's fused RoPE) is read as `fused` by the loader */
        .aliases = LK_ALIASES(
            LK_NEMO_SAME("torch", "eager"),
            LK_NEMO_NOT_HERE("quack", "QuACK's rotary embedding", LK_EVERYWHERE("fused")),
            LK_NEMO_NOT_HERE("triton", "the fused Triton rotation of DeepSeek V4", LK_EVERYWHERE("fused"))),
    },
    .impls = rows, .harness = &lk_rope_harness, .vtable_lacks = lacks,
};
