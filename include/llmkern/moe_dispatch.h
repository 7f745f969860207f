/* moe_dispatch.h — expert parallelism: the MoE experts of a layer split over the ranks
 * of an expert-parallel group (ctx->comm; NULL = one process), each rank owning experts
 * [r·E/P, (r+1)·E/P), and every token's k routes carried to the owners and back.
 *
 *   out[t] = Σ_j w[t, j] · expert_{ids[t, j]}(hidden[t])      (as moe_experts computes it)
 *
 * Implementations (op moe_dispatch, config field moe.dispatcher):
 *   local     one process: the experts op on all experts, no communication.
 *   alltoall  routes counted per owner and the counts exchanged first; each route's row
 *             (and its local expert id and weight) sent to its owner in one variable
 *             all-to-all; the owner runs the experts op on what it received (k = 1 per
 *             row, weighted); the weighted rows come back and are summed per token in f32.
 *   allgather every rank gathers all tokens, runs its experts on the routes it owns,
 *             and a reduce-scatter sums each token's outputs back to its rank (more
 *             bytes; no count exchange; T equal on every rank, or on CUDA within
 *             max_tokens).
 * alltoall and allgather take any communicator: with the single-process one (or NULL)
 * they run on one process too, which is how the tests hold them against `local`, so
 * they need no MPI in the registry. Backward: d_hidden, d_topk_weights WRITTEN; the
 * local experts' d_gate_up_weight, d_down_weight ACCUMULATED (moe.h). The backward
 * redoes the forward exchange and the local experts' forward (for their saved state):
 * nothing is held between the passes (saved_bytes is 0), at the price of one more
 * exchange and expert forward. Workspace is reserved in ctx->arena: on the host-planned
 * rows after the counts are known, on the CUDA alltoall by the bound; every rank of the
 * group makes the same call.
 *
 * Each comes as a CPU and a CUDA row. The CUDA rows take CUDA tensors, a device arena
 * and the CUDA experts (`fused` by default); across ranks the group must be NCCL (its
 * collectives take device memory: a host-memory group is refused with LK_EDEVICE, and
 * so is NCCL with CPU tensors), with one rank any comm or NULL. The CUDA rows make no
 * host read and no synchronization (a forward and a backward can be captured in a CUDA
 * graph): `alltoall` counts the routes per owner on the device, exchanges the counts over
 * NCCL and sends every peer a slot of B = max(T, max_tokens)·k rows, the most one rank can
 * route to one owner, so no token is dropped; the rows past a peer's count are zero
 * padding the experts run as zeros (memory and compute of P·B rows a rank;
 * src/ops/moe_dispatch/alltoall_cuda.c says what it costs). `allgather` gathers every
 * rank's slot of max(T, max_tokens) tokens with their routes and counts, so T may differ
 * between ranks within the bound, and runs all P·max(T, max_tokens)·k routes, the ones
 * it does not own as zero rows (allgather_cuda.c says what it costs). Their ids are never
 * read on the host: an id outside [0, E) makes out (forward) and d_hidden and
 * d_topk_weights (backward) NaN, as the CUDA experts op does, instead of an error status
 * (the allgather's on every rank of the group, each of which sees every id). */
#ifndef LLMKERN_MOE_DISPATCH_H
#define LLMKERN_MOE_DISPATCH_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_tensor hidden;           /* [T, H] this rank's tokens, f32 or bf16 */
    lk_tensor topk_ids;         /* [T, k] i32, global expert ids in [0, n_experts) */
    lk_tensor topk_weights;     /* [T, k] f32 */
    lk_tensor gate_up_weight;   /* [E/P, 2I, H], dtype of hidden: this rank's experts */
    lk_tensor down_weight;      /* [E/P, H, I] */
    lk_tensor out;              /* forward output [T, H] */
    lk_tensor dout;             /* backward input [T, H] */
    lk_tensor d_hidden;         /* WRITTEN [T, H] */
    lk_tensor d_topk_weights;   /* WRITTEN [T, k] f32; data NULL = not wanted */
    lk_tensor d_gate_up_weight; /* ACCUMULATED, like gate_up_weight (f32 or its dtype); NULL = not wanted */
    lk_tensor d_down_weight;    /* ACCUMULATED; NULL = not wanted */
    int n_experts;              /* E over the group; a multiple of the group size */
    const lk_impl *experts;     /* the moe_experts implementation run locally; NULL = "fused" */
    int64_t max_tokens;         /* CUDA alltoall and allgather over a group: the most tokens any rank passes,
                                   the same on every rank (their slots' bound); 0 = T, then T must be equal on
                                   every rank. 0 or >= T; the other rows check it and ignore it */
} lk_moe_dispatch_args;

#define LK_MOE_DISPATCH_VTABLE_VERSION 1

typedef struct {
    int version;
    lk_status (*forward)(const lk_moe_dispatch_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_moe_dispatch_args *a, lk_ctx *ctx);
} lk_moe_dispatch_vtable;

/* Facade: every argument checked (expert ids in range where the plan is on the host,
 * max_tokens 0 or >= T, E divisible by the group size,
 * the weights' expert count E/P, every tensor, the arena, the experts and the group on
 * the implementation's device) before any collective or write. Errors LK_EINVAL,
 * LK_ESHAPE, LK_EDTYPE, LK_EDEVICE, LK_ECOMM. */
LK_API lk_status lk_moe_dispatch_forward(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx);
LK_API lk_status lk_moe_dispatch_backward(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
