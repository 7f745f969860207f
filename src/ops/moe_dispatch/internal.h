/* internal.h — what the expert-parallel dispatchers share (src/ops/moe_dispatch): the
 * call's sizes, a two-pass workspace layout (sum, reserve, then carve the same list),
 * the local experts run over rows received from other ranks, and the moves and
 * collectives on the call's memory (rows.c): host loops for CPU tensors, the kernels of
 * rows.cu for CUDA ones, so one algorithm per dispatcher serves both (local; the CPU
 * allgather and alltoall). The CUDA alltoall and allgather are alltoall_cuda.c and
 * allgather_cuda.c, whose plans stay on the device (rows.h). Not installed. */
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
    int64_t Tb;                 /* max(T, a->max_tokens): the tokens a slot is sized for (the *_cuda.c rows) */
    lk_dtype dt;
    size_t es;
    int dev;                    /* CUDA tensors: rows move by kernels, on ctx->stream */
    int direct;                 /* P = 1 over a comm that does not take the tensors' memory (a
                                 * host comm with CUDA tensors, NCCL with CPU ones): every
                                 * exchange is a local copy, the comm is not called */
} lk_ep_call;

/* 1 when comm's collectives take device memory (NCCL), 0 for host ones (single, mpi). */
int lk_ep_comm_on_device(const lk_comm *comm);

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
 * (NULL = not wanted) and accumulates the weight gradients of c->a. All in the call's
 * memory. */
lk_status lk_ep_experts(const lk_ep_call *c, lk_ep_bump *b, int64_t rows, void *x, int32_t *ids, float *w, void *y,
                        const void *dy, void *dx, float *dw);

/* Reserves b's total plus extra in the arena and switches b to carving. */
lk_status lk_ep_reserve(const lk_ep_call *c, lk_ep_bump *b, size_t extra, size_t *mark);

extern const lk_moe_dispatch_vtable lk_moe_dispatch_local_vtable;
extern const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_vtable;
extern const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_vtable;
/* The CUDA alltoall row: device counts, bound-sized slots, no host read (alltoall_cuda.c). */
extern const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_cuda_vtable;
/* The CUDA allgather row: device counts, bound-sized slots, no host read (allgather_cuda.c). */
extern const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_cuda_vtable;

/* The call's sizes and device; the facade has checked a and ctx. */
lk_status lk_ep_call_of(const lk_moe_dispatch_args *a, lk_ctx *ctx, lk_ep_call *c);

/* --- moves in the call's memory (rows.c) -------------------------------------------- */

/* dst[p] = src[order[p] / k], p < n: rows of H elements of c->dt (CUDA: order[p] < 0 gives
 * a zero row). */
lk_status lk_ep_gather(const lk_ep_call *c, void *dst, const void *src, const int32_t *order, int64_t n, int64_t k);
/* meta[2p] = ids[order[p]] % El (the owner's local expert), meta[2p + 1] = the bits of
 * w[order[p]], p < n: what travels with each route's row. */
lk_status lk_ep_meta(const lk_ep_call *c, int32_t *meta, const int32_t *ids, const float *w, const int32_t *order,
                     int64_t n);
/* n received pairs split into ids[n] and w[n], the layout the experts op takes. */
lk_status lk_ep_unmeta(const lk_ep_call *c, const int32_t *meta, int32_t *ids, float *w, int64_t n);
/* dst[t] (dst_dt) = Σ_j src[pos[t·k + j]] over j < k where pos >= 0 (pos NULL: row
 * t·k + j), t < n: rows of H elements, summed in f32 in route order, rounded once. */
lk_status lk_ep_combine(const lk_ep_call *c, void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt,
                        const int32_t *pos, int64_t n, int64_t k);
/* dst[i] = pos[i] >= 0 ? src[pos[i]] : 0, i < n. */
lk_status lk_ep_pick(const lk_ep_call *c, float *dst, const float *src, const int32_t *pos, int64_t n);
/* bytes between host memory and the call's, or within the call's; wait = 1 returns
 * when they have arrived (what a host reader needs). */
lk_status lk_ep_copy(const lk_ep_call *c, void *dst, const void *src, size_t bytes, int wait);
/* src, bytes of the call's memory, readable on the host: src itself on the CPU, else a
 * malloc'd copy, also in *own (the caller frees *own; NULL when nothing to free). */
lk_status lk_ep_host(const lk_ep_call *c, const void *src, size_t bytes, const void **host, void **own);

/* --- collectives over the call's memory (rows.c) ------------------------------------ */
/* lk_comm's, after the call's stream has finished what they read (an NCCL group
 * orders itself after the legacy default stream only); a local copy when c->direct. */
lk_status lk_ep_all_to_all(const lk_ep_call *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                           const int64_t *rc, const int64_t *rd);
lk_status lk_ep_all_gather(const lk_ep_call *c, const void *send, void *recv, size_t bytes);
lk_status lk_ep_reduce_scatter(const lk_ep_call *c, const float *send, float *recv, int64_t count);
/* Host int64s: send[p] to each peer p (spread = 1), or send[0] to every peer (spread =
 * 0, an all-gather), into recv[P]. An NCCL group moves them through a small buffer it
 * reserves in ctx->arena (released before returning). */
lk_status lk_ep_exchange_i64(const lk_ep_call *c, const int64_t *send, int64_t *recv, int spread);

#endif
