/* impls.c — the registry rows of RoPE on the CPU: one row per implementation, each
 * pointing at the vtable its own file defines. lk_init() registers this table (the
 * registry's builtin list names it); adding a kernel is one file and one row here. */
#include "llmkern/rope.h"

extern const lk_rope_vtable lk_rope_eager_vtable;
extern const lk_rope_vtable lk_rope_fused_vtable;

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
    {.name = NULL},
};
