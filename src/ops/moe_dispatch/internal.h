/* internal.h — what the expert-parallel dispatchers share (src/ops/moe_dispatch): the
 * call's sizes, a two-pass workspace layout (sum, reserve, then carve the same list),
 * and the local experts run over rows received from other ranks. Not installed. */
#ifndef LLMKERN_MOE_DISPATCH_INTERNAL_H
#define LLMKERN_MOE_DISPATCH_INTERNAL_H

#include "llmkern/comm.h"
#include "llmkern/moe.h"
#include "llmkern/moe_dispatch.h"

/* Group sizes above this are refused: the count exchange lives on the stack, because
 * the workspace it sizes cannot be reserved before it. */
#define LK_EP_MAX_RANKS 512

typedef struct {
    const lk_moe_dispatch_args *a;
    lk_ctx *ctx;
    lk_comm *comm;              /* never NULL: lk_comm_self() for one process */
    const lk_impl *experts;
    int P, r;
    int64_t T, k, H, I, E, El;
    lk_dtype dt;
    size_t es;
} lk_ep_call;

/* Sum mode (carve 0) adds each request, 64-byte rounded; carve mode hands it out. */
typedef struct {
    lk_arena *ar;
    size_t total;
    int carve, short_;
} lk_ep_bump;
void *lk_ep_take(lk_ep_bump *b, size_t bytes);

/* Workspace of the local experts over `rows` rows (k = 1): saved + the larger pass. */
size_t lk_ep_experts_bytes(const lk_ep_call *c, int64_t rows);
/* The local experts over rows rows: x [rows, H], local ids and weights [rows, 1]; the
 * forward writes y (weighted); with dy the backward follows it and writes dx, dw
 * (NULL = not wanted) and accumulates the weight gradients of c->a. */
lk_status lk_ep_experts(const lk_ep_call *c, lk_ep_bump *b, int64_t rows, void *x, int32_t *ids, float *w, void *y,
                        const void *dy, void *dx, float *dw);

/* Reserves b's total plus extra in the arena and switches b to carving. */
lk_status lk_ep_reserve(const lk_ep_call *c, lk_ep_bump *b, size_t extra, size_t *mark);

extern const lk_moe_dispatch_vtable lk_moe_dispatch_local_vtable;
extern const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_vtable;
extern const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_vtable;

lk_status lk_ep_call_of(const lk_moe_dispatch_args *a, lk_ctx *ctx, lk_ep_call *c);

#endif
