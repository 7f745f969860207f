/* impls.c — the registry rows of RoPE on the CPU, and on CUDA when built with it: one
 * row per implementation, each pointing at the vtable its own file defines. lk_init()
 * registers this table (the registry's builtin list names it); adding a kernel is one
 * file and one row here. */
#include "llmkern/rope.h"

extern const lk_rope_vtable lk_rope_eager_vtable;
extern const lk_rope_vtable lk_rope_fused_vtable;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_rope_vtable lk_rope_cuda_fused_vtable;   /* fused.cu */
#endif

#define ROPE_CPU_DTYPES (LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16))

const lk_impl lk_rope_impls[] = {
    {
        .op = LK_OP_ROPE,
        .name = "eager",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = ROPE_CPU_DTYPES},
        .vtable = &lk_rope_eager_vtable,
        .summary = "HF's unfused steps: gathered cos/sin, rotate_half, products, sum; one pass each",
    },
    {
        .op = LK_OP_ROPE,
        .name = "fused",
        .device = LK_DEVICE_CPU,
        .needs = {.dtypes = ROPE_CPU_DTYPES},
        .vtable = &lk_rope_fused_vtable,
        .summary = "one pass over q and k each way, f32 table lookups, OpenMP + AVX-512",
    },
#ifdef LLMKERN_HAVE_CUDA
    {
        .op = LK_OP_ROPE,
        .name = "fused",
        .device = LK_DEVICE_CUDA,
        .needs = {.min_cc = 80, .dtypes = ROPE_CPU_DTYPES},
        .vtable = &lk_rope_cuda_fused_vtable,
        .summary = "one pass over q and k each way, cos/sin read once per token, 16-byte accesses",
    },
#endif
    {.name = NULL},
};
