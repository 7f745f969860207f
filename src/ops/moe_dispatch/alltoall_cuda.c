/* alltoall_cuda.c — the CUDA alltoall dispatcher (moe_dispatch.h) with device counts: no
 * host read and no synchronization, so a forward and a backward can be captured in a CUDA
 * graph (tests/cuda/test_moe_dispatch.c captures both on a group of one). The CPU row
 * stays alltoall.c (the host plan and lk_comm's blocking all-to-all-v).
 *
 * Plan, on the call's stream: each route's owner (ids / El), route.cu's stable counting
 * sort of the routes by owner (the experts op's own, with P "experts"), and each route's
 * slot row spos = o·B + its rank among owner o's routes, in P slots of B rows. The
 * per-peer counts [P] (i64) go out in one all-to-all of 8 bytes a peer; the token rows and
 * their (local id, weight) are scattered into the slots and exchanged slot for slot, B
 * rows to every peer whatever its count (lk_comm_all_to_all_on: NCCL send/recv on the
 * stream). On arrival the rows of slot p past rcnt[p] are padding: zero rows, local id 0,
 * weight 0, which the experts run as zeros (their out rows 0, every gradient contribution
 * exactly 0), so the experts op takes all P·B received rows as they are. The weighted
 * rows go back slot for slot (route r's row lands at spos[r]) and are summed per token in
 * f32. Backward: the same plan and exchange with dout in the same slots, the experts'
 * backward, d_hidden rows and d_topk_weights back the same way.
 *
 * Why a bound and not a capacity: NCCL's send and receive take host counts, and the host
 * never sees the device counts. B = Tb·k, Tb = max(T, args.max_tokens) — every rank's
 * bound the same (max_tokens: the most tokens any rank of the group passes; 0 means T,
 * then equal on every rank) — is the most one rank can send one peer (every route to one
 * owner), so no routing drops a token; a capacity factor below it would drop the overflow.
 * Memory per rank and pass, S = P·B rows: the send, receive and expert-output slots (the
 * returned rows reuse the send slots) are 3 × S·H·es forward, 5 × backward (dout's send
 * slots take the returned d_hidden rows), plus 16 bytes of meta and 8 of weights a slot
 * row, and the experts' saved state and workspace over S rows (their [S, 2I]
 * pre-activations the largest). On the wire each pass sends S rows each way. The experts
 * compute over the padding too (zero rows, sorted to local expert 0): S rows of GEMM for
 * ~T·k real ones on balanced routing, P times the work at P ranks. With one rank B = T·k
 * and nothing is padding. An experts op that stops at a device row count would take the
 * compute back (bench/NOTES.md, issue 18 item 4).
 *
 * Bad ids: the host never reads them (moe_dispatch.c skips its check for this row). An id
 * outside [0, E) raises a device flag (route.cu) and this rank's out, or d_hidden and
 * d_topk_weights, come out NaN; the route travels as local id -1, so its owner's experts
 * op NaNs what it touches (moe.h). A peer count outside [0, B] (ranks that disagree on
 * the bound) raises the same flag. Built with CUDA only (the _cuda.c suffix). */
#include <string.h>
#include "ops/moe/moe_cuda.h"
#include "ops/moe_dispatch/internal.h"
#include "ops/moe_dispatch/rows.h"

#define NOMEM lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little")

typedef struct {
    int64_t R, B, S;            /* routes here, slot rows a peer, slot rows in all (P·B) */
} dims;

/* One pass's workspace, all device memory. */
typedef struct {
    int32_t *owner, *order, *pos, *spos;        /* [R] */
    int64_t *offs, *scnt, *rcnt;                /* [P + 1], [P], [P] */
    int *flag;
    void *route_ws;
    char *xs, *xr, *y, *ds, *dr, *dx;           /* [S] rows; xs takes the returned y, ds the returned dx */
    int32_t *meta_s, *meta_r, *lid;             /* [2S], [2S], [S] */
    float *w, *dw, *dwr;                        /* [S] */
} bufs;

static void layout(const lk_ep_call *c, const dims *d, int backward, lk_ep_bump *b, bufs *u) {
    size_t R = (size_t)d->R, S = (size_t)d->S, P = (size_t)c->P, row = (size_t)c->H * c->es;
    u->owner = lk_ep_take(b, 4 * R), u->order = lk_ep_take(b, 4 * R);
    u->pos = lk_ep_take(b, 4 * R), u->spos = lk_ep_take(b, 4 * R);
    u->offs = lk_ep_take(b, 8 * (P + 1)), u->scnt = lk_ep_take(b, 8 * P), u->rcnt = lk_ep_take(b, 8 * P);
    u->flag = lk_ep_take(b, sizeof(int));
    u->route_ws = lk_ep_take(b, lk_moe_cuda_route_ws_bytes(d->R, c->P));
    u->xs = lk_ep_take(b, row * S), u->xr = lk_ep_take(b, row * S), u->y = lk_ep_take(b, row * S);
    u->meta_s = lk_ep_take(b, 8 * S), u->meta_r = lk_ep_take(b, 8 * S);
    u->lid = lk_ep_take(b, 4 * S), u->w = lk_ep_take(b, 4 * S);
    if (backward) {
        u->ds = lk_ep_take(b, row * S), u->dr = lk_ep_take(b, row * S), u->dx = lk_ep_take(b, row * S);
        u->dw = lk_ep_take(b, 4 * S), u->dwr = lk_ep_take(b, 4 * S);
    }
}

/* Slot p of send (bytes each) to rank p; rank p's slot for this rank into slot p of recv.
 * Queued on the call's stream; one rank over a host comm: a device copy. */
static lk_status swap_slots(const lk_ep_call *c, const void *send, void *recv, size_t bytes) {
    if (c->direct) return lk_ep_copy(c, recv, send, bytes, 0);
    int64_t cnt[LK_EP_MAX_RANKS], dsp[LK_EP_MAX_RANKS];
    for (int p = 0; p < c->P; p++) cnt[p] = (int64_t)bytes, dsp[p] = (int64_t)bytes * p;
    return lk_comm_all_to_all_on(c->comm, send, cnt, dsp, recv, cnt, dsp, c->ctx->stream);
}

/* Owners, the sort by owner, the slots, and the counts exchanged. */
static lk_status plan(const lk_ep_call *c, const dims *d, const bufs *u) {
    void *st = c->ctx->stream;
    lk_status s;
    if ((s = lk_ep_cuda_owners(c->a->topk_ids.data, d->R, c->E, c->El, u->owner, st)) ||
        (s = lk_moe_cuda_route(u->owner, d->R, c->P, u->offs, u->order, u->pos, u->flag, u->route_ws, st)) ||
        (s = lk_ep_cuda_slots(u->owner, u->pos, u->offs, d->R, c->P, d->B, u->spos, u->scnt, st)))
        return s;
    return swap_slots(c, u->scnt, u->rcnt, 8);
}

/* Each route's row and (local id, weight) into its owner's slot and across; dout's rows
 * too for the backward. The padding cleared on arrival. */
static lk_status send_routes(const lk_ep_call *c, const dims *d, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    void *st = c->ctx->stream;
    size_t row = (size_t)c->H * c->es, B = (size_t)d->B;
    lk_status s;
    if ((s = lk_ep_cuda_scatter(u->xs, a->hidden.data, u->spos, d->R, c->k, row, st)) ||
        (s = lk_ep_cuda_meta_slots(u->meta_s, a->topk_ids.data, a->topk_weights.data, u->spos, d->R, c->E, c->El,
                                   st)) ||
        (s = swap_slots(c, u->xs, u->xr, B * row)) || (s = swap_slots(c, u->meta_s, u->meta_r, B * 8)) ||
        (s = lk_ep_cuda_unmeta_slots(u->meta_r, u->rcnt, c->P, d->B, u->lid, u->w, u->flag, st)) ||
        (s = lk_ep_cuda_clear_padding(u->xr, u->rcnt, c->P, d->B, row, u->flag, st)))
        return s;
    if (!backward) return LK_OK;
    if ((s = lk_ep_cuda_scatter(u->ds, a->dout.data, u->spos, d->R, c->k, row, st)) ||
        (s = swap_slots(c, u->ds, u->dr, B * row)))
        return s;
    return lk_ep_cuda_clear_padding(u->dr, u->rcnt, c->P, d->B, row, u->flag, st);
}

/* The owners' rows back into the slots, each token's k summed in f32; NaN on a bad id. */
static lk_status bring_back(const lk_ep_call *c, const dims *d, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    void *st = c->ctx->stream;
    size_t row = (size_t)c->H * c->es, B = (size_t)d->B;
    int64_t TH = c->T * c->H;
    lk_status s;
    if (!backward) {
        if ((s = swap_slots(c, u->y, u->xs, B * row)) ||
            (s = lk_ep_combine(c, a->out.data, c->dt, u->xs, c->dt, u->spos, c->T, c->k)))
            return s;
        return lk_ep_cuda_nan_if(u->flag, a->out.data, c->dt, TH, st);
    }
    if ((s = swap_slots(c, u->dx, u->ds, B * row)) || (s = swap_slots(c, u->dw, u->dwr, B * 4)) ||
        (s = lk_ep_combine(c, a->d_hidden.data, c->dt, u->ds, c->dt, u->spos, c->T, c->k)) ||
        (s = lk_ep_cuda_nan_if(u->flag, a->d_hidden.data, c->dt, TH, st)))
        return s;
    if (!a->d_topk_weights.data) return LK_OK;
    if ((s = lk_ep_pick(c, a->d_topk_weights.data, u->dwr, u->spos, d->R))) return s;
    return lk_ep_cuda_nan_if(u->flag, a->d_topk_weights.data, LK_F32, d->R, st);
}

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    dims d = {.R = c.T * c.k, .B = c.Tb * c.k};
    d.S = c.P * d.B;
    if (d.S > INT32_MAX)    /* positions are int32, as in the experts op */
        return lk_error(LK_EINVAL, "moe_dispatch: max_tokens: expected ranks x max(T, max_tokens) x k < 2^31 slot "
                        "rows, got %d x %lld x %lld", c.P, (long long)c.Tb, (long long)c.k);
    lk_ep_bump b = {0};
    bufs u;
    size_t mark;
    layout(&c, &d, backward, &b, &u);
    lk_status s = lk_ep_reserve(&c, &b, lk_ep_experts_bytes(&c, d.S), &mark);
    if (s) return s;
    layout(&c, &d, backward, &b, &u);
    if (b.short_) s = NOMEM;
    if (!s) s = plan(&c, &d, &u);
    if (!s) s = send_routes(&c, &d, &u, backward);
    if (!s) s = lk_ep_experts(&c, &b, d.S, u.xr, u.lid, u.w, u.y, backward ? u.dr : NULL, u.dx, u.dw);
    if (!s) s = bring_back(&c, &d, &u, backward);
    lk_ctx_workspace_end(ctx, mark);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_cuda_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
