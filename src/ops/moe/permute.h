/* permute.h — the experts' dimensions and the expert-sorted order of their routes
 * (permute.c): what the CPU experts (internal.h) and the CUDA ones (fused.cu) share. Plain
 * declarations, so CUDA C++ can include it. Not installed. */
#ifndef LLMKERN_MOE_PERMUTE_H
#define LLMKERN_MOE_PERMUTE_H

#include "llmkern/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t t, k, e, h, i, r;   /* tokens, routes per token, experts, hidden, expert FFN, routes t·k */
    lk_dtype dt;
} lk_moe_dims;

lk_moe_dims lk_moe_dims_of(const lk_moe_experts_args *a);

/* The routes r = t·k + j sorted by expert, stable (token order within an expert):
 * order[p] is the route at position p, pos[r] the position of route r, offs[e] ..
 * offs[e+1] the positions of expert e. One counting sort, O(R + E). */
void lk_moe_permute(const int32_t *ids, int64_t routes, int64_t experts, int64_t *offs, int32_t *order,
                    int32_t *pos);

/* The fused experts' saved block, the same on the CPU and on CUDA: offs [E + 1] i64,
 * order [R] i32, pos [R] i32 (each piece arena-aligned), then the [R, 2I] pre-activations
 * in the storage dtype. */
typedef struct {
    int64_t *offs;
    int32_t *order, *pos;
    void *gu;
} lk_moe_fused_saved;

size_t lk_moe_fused_saved_bytes(int64_t t, int64_t k, int64_t e, int64_t h, int64_t i, lk_dtype dt);
lk_moe_fused_saved lk_moe_fused_saved_view(void *saved, const lk_moe_dims *d);

#ifdef __cplusplus
}
#endif
#endif
