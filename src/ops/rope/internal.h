/* internal.h — what the RoPE facade (rope.c) and implementations (eager.c, fused.c)
 * share: the call's dims as read from validated args, and a token's position. */
#ifndef LLMKERN_ROPE_INTERNAL_H
#define LLMKERN_ROPE_INTERNAL_H

#include "llmkern/rope.h"

/* Only after the facade has validated a: q and k are [B, H, S, D]. */
static inline lk_rope_dims lk_rope_dims_of(const lk_rope_args *a) {
    lk_rope_dims d = {
        .batch = a->q.shape[0], .q_heads = a->q.shape[1], .k_heads = a->k.shape[1],
        .seq = a->q.shape[2], .head_dim = a->q.shape[3],
        .rotary_dim = a->rotary_dim ? a->rotary_dim : a->q.shape[3], .dtype = a->q.dtype,
    };
    return d;
}

/* Position of token (b, s): position_ids[b, s], or s when there are none. */
static inline int64_t lk_rope_pos(const lk_tensor *ids, int64_t b, int64_t s, int64_t S) {
    if (ids->data == NULL) return s;
    return ids->dtype == LK_I64 ? ((const int64_t *)ids->data)[b * S + s]
                                : (int64_t)((const int32_t *)ids->data)[b * S + s];
}

#endif
