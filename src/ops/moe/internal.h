/* internal.h — what the MoE files share inside src/ops/moe: the experts' dimensions,
 * the expert-sorted permutation of the routes (permute.c) and the per-expert GEMM loop
 * both implementations run (grouped.c). Not installed. */
#ifndef LLMKERN_MOE_INTERNAL_H
#define LLMKERN_MOE_INTERNAL_H

#include "llmkern/moe.h"
#include "ops/dense.h"
#include "ops/moe/permute.h"

/* Fewer elements than this run on one thread. */
#define LK_MOE_PAR_MIN ((int64_t)1 << 15)

/* dst[p, :] (f32) = src[order[p] / k, :] widened from dt, for p in [0, n). */
void lk_moe_gather_rows(float *dst, const void *src, lk_dtype dt, int64_t h, const int32_t *order, int64_t n,
                        int64_t k);
/* dst[t, :] = Σ_j src[pos[t·k + j], :] summed in f32, rounded once into dt. */
void lk_moe_unpermute_sum(void *dst, lk_dtype dt, const float *src, int64_t h, const int32_t *pos, int64_t t,
                          int64_t k);

/* A gradient buffer of n elements accumulated over experts: lk_grad_acc whose f32
 * accumulator starts at zero, so experts without a token leave their slice unchanged
 * and every expert's GEMM adds with beta 1. write (write_weight_grads): dst is zeroed
 * first, so every slice is written. */
lk_status lk_moe_grad_begin(lk_grad_acc *g, const lk_tensor *dst, int64_t n, int write, lk_arena *arena);

#define LK_MOE_NOMEM(op) lk_error(LK_ENOMEM, op ": arena: expected the reserved workspace, got too little")

#endif
