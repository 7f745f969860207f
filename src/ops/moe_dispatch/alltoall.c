/* alltoall.c — the alltoall dispatcher (moe_dispatch.h): routes sorted by owner rank,
 * the per-owner counts exchanged first, rows and their (local id, weight) sent in one
 * variable all-to-all each, the owner's experts run on what arrived, the weighted rows
 * sent back and summed per token in f32. The backward repeats the dispatch, sends dout
 * the same way, and returns d_hidden rows and d_topk_weights along the reverse path.
 *
 * The CPU row: the plan (counts, the sort of routes by owner) is made on the host from the
 * ids, and the moves go through rows.c's host loops over lk_comm's all-to-all-v. (Its
 * device branches would run this plan for CUDA tensors too, the ids brought down and
 * order and pos uploaded; the CUDA row is alltoall_cuda.c instead, which keeps the plan
 * on the device.) */
#include <stdlib.h>
#include <string.h>
#include "core/checked.h"
#include "ops/moe_dispatch/internal.h"

#define NOMEM lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little")

typedef struct {
    int64_t scnt[LK_EP_MAX_RANKS], rcnt[LK_EP_MAX_RANKS];       /* routes to / from each rank */
    int64_t bs[LK_EP_MAX_RANKS], bsd[LK_EP_MAX_RANKS], br[LK_EP_MAX_RANKS], brd[LK_EP_MAX_RANKS];
    int64_t R, Rr;                                              /* routes sent, received */
    int32_t *order, *pos;       /* host: sorted position p holds route order[p]; route r sits at pos[r] */
} plan;

/* One pass's workspace, in the call's memory. */
typedef struct {
    int32_t *order, *pos;       /* the plan's, where the moves read them (the host's own on the CPU) */
    char *xs, *xr, *y, *ret, *ds, *dr, *dx, *dh;
    int32_t *meta_s, *meta_r, *lid;
    float *w, *dw, *dwr;
} bufs;

/* Byte counts of an exchange of `unit` bytes per route, forward (to owners) or back. */
static lk_status move(const lk_ep_call *c, plan *pl, int back, const void *send, void *recv, size_t unit) {
    int64_t os = 0, orr = 0;
    for (int p = 0; p < c->P; p++) {
        int64_t s = (back ? pl->rcnt[p] : pl->scnt[p]) * (int64_t)unit, r = (back ? pl->scnt[p] : pl->rcnt[p]) * (int64_t)unit;
        pl->bs[p] = s, pl->bsd[p] = os, pl->br[p] = r, pl->brd[p] = orr;
        os += s, orr += r;
    }
    return lk_ep_all_to_all(c, send, pl->bs, pl->bsd, recv, pl->br, pl->brd);
}

static lk_status counts(const lk_ep_call *c, plan *pl, const int32_t *ids) {
    memset(pl->scnt, 0, sizeof(int64_t) * (size_t)c->P);
    pl->R = c->T * c->k;
    for (int64_t r = 0; r < pl->R; r++) pl->scnt[ids[r] / c->El]++;
    lk_status s = lk_ep_exchange_i64(c, pl->scnt, pl->rcnt, 1);
    pl->Rr = 0;
    /* the counts come from the other ranks: checked (core/checked.h) before they size a buffer */
    for (int p = 0; !s && p < c->P; p++) s = lk_checked_add("moe_dispatch: the routes the ranks send here", pl->Rr,
                                                             pl->rcnt[p], &pl->Rr);
    size_t bytes;
    if (!s) s = lk_checked_bytes("moe_dispatch: the rows received", pl->Rr, 4 * (size_t)c->H * c->es + 64, &bytes);
    return s;
}

static void sort_routes(const lk_ep_call *c, plan *pl, const int32_t *ids) {
    int64_t start[LK_EP_MAX_RANKS], o = 0;
    for (int p = 0; p < c->P; p++) start[p] = o, o += pl->scnt[p];
    for (int64_t r = 0; r < pl->R; r++) {
        int64_t p = start[ids[r] / c->El]++;
        pl->order[p] = (int32_t)r, pl->pos[r] = (int32_t)p;
    }
}

/* The host plan: counts exchanged, routes sorted by owner (order, pos malloc'd in *host). */
static lk_status make_plan(const lk_ep_call *c, plan *pl, int32_t **host) {
    const void *ids;
    void *own;
    lk_status s = lk_ep_host(c, c->a->topk_ids.data, 4 * (size_t)(c->T * c->k), &ids, &own);
    if (!s) s = counts(c, pl, ids);
    if (!s && !(*host = malloc(8 * (size_t)pl->R)))
        s = lk_error(LK_ENOMEM, "moe_dispatch: no host room for %lld routes", (long long)pl->R);
    if (!s) {
        pl->order = *host, pl->pos = *host + pl->R;
        sort_routes(c, pl, ids);
    }
    free(own);
    return s;
}

/* Sum (b not carving) or carve the pass's buffers. */
static void layout(const lk_ep_call *c, const plan *pl, int backward, lk_ep_bump *b, bufs *u) {
    size_t R = (size_t)pl->R, Rr = (size_t)pl->Rr, row = (size_t)c->H * c->es;
    u->order = c->dev ? lk_ep_take(b, 4 * R) : pl->order, u->pos = c->dev ? lk_ep_take(b, 4 * R) : pl->pos;
    u->xs = lk_ep_take(b, row * R), u->xr = lk_ep_take(b, row * Rr);
    u->meta_s = lk_ep_take(b, 8 * R), u->meta_r = lk_ep_take(b, 8 * Rr);
    u->lid = lk_ep_take(b, 4 * Rr), u->w = lk_ep_take(b, 4 * Rr);
    u->y = lk_ep_take(b, row * Rr), u->ret = lk_ep_take(b, row * R);
    if (backward) {
        u->ds = lk_ep_take(b, row * R), u->dr = lk_ep_take(b, row * Rr);
        u->dx = lk_ep_take(b, row * Rr), u->dh = lk_ep_take(b, row * R);
        u->dw = lk_ep_take(b, 4 * Rr), u->dwr = lk_ep_take(b, 4 * R);
    }
}

/* Each route's row and (local id, weight) to its owner; dout's rows too for the backward. */
static lk_status send_routes(const lk_ep_call *c, plan *pl, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    int64_t R = pl->R;
    size_t row = (size_t)c->H * c->es;
    lk_status s;
    if (c->dev && ((s = lk_ep_copy(c, u->order, pl->order, 4 * (size_t)R, 0)) ||
                   (s = lk_ep_copy(c, u->pos, pl->pos, 4 * (size_t)R, 0))))
        return s;
    if ((s = lk_ep_gather(c, u->xs, a->hidden.data, u->order, R, c->k)) ||
        (s = lk_ep_meta(c, u->meta_s, a->topk_ids.data, a->topk_weights.data, u->order, R)) ||
        (s = move(c, pl, 0, u->xs, u->xr, row)) || (s = move(c, pl, 0, u->meta_s, u->meta_r, 8)) ||
        (s = lk_ep_unmeta(c, u->meta_r, u->lid, u->w, pl->Rr)))
        return s;
    if (!backward) return LK_OK;
    if ((s = lk_ep_gather(c, u->ds, a->dout.data, u->order, R, c->k))) return s;
    return move(c, pl, 0, u->ds, u->dr, row);
}

/* The owners' rows back, each token's k summed in f32 (out, or d_hidden and d_topk_weights). */
static lk_status bring_back(const lk_ep_call *c, plan *pl, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    size_t row = (size_t)c->H * c->es;
    lk_status s;
    if (!backward) {
        if ((s = move(c, pl, 1, u->y, u->ret, row))) return s;
        return lk_ep_combine(c, a->out.data, c->dt, u->ret, c->dt, u->pos, c->T, c->k);
    }
    if ((s = move(c, pl, 1, u->dx, u->dh, row)) || (s = move(c, pl, 1, u->dw, u->dwr, 4)) ||
        (s = lk_ep_combine(c, a->d_hidden.data, c->dt, u->dh, c->dt, u->pos, c->T, c->k)))
        return s;
    return a->d_topk_weights.data ? lk_ep_pick(c, a->d_topk_weights.data, u->dwr, u->pos, pl->R) : LK_OK;
}

static lk_status exchange(const lk_ep_call *c, plan *pl, int backward) {
    lk_ep_bump b = {0};
    bufs u;
    size_t mark;
    layout(c, pl, backward, &b, &u);
    lk_status s = lk_ep_reserve(c, &b, lk_ep_experts_bytes(c, pl->Rr), &mark);
    if (s) return s;
    layout(c, pl, backward, &b, &u);
    if (b.short_) s = NOMEM;
    if (!s) s = send_routes(c, pl, &u, backward);
    if (!s) s = lk_ep_experts(c, &b, pl->Rr, u.xr, u.lid, u.w, u.y, backward ? u.dr : NULL, u.dx, u.dw);
    if (!s) s = bring_back(c, pl, &u, backward);
    lk_ctx_workspace_end(c->ctx, mark);
    return s;
}

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    plan pl;
    int32_t *host = NULL;
    lk_status s = make_plan(&c, &pl, &host);
    if (!s) s = exchange(&c, &pl, backward);
    free(host);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
