/* allgather.c — the allgather dispatcher (moe_dispatch.h): every rank gathers all
 * tokens with their routing, runs its own experts on the routes it owns, sums each
 * token's owned rows into an f32 [P·T, H] buffer and a reduce-scatter sums each token's
 * outputs back to its rank. More bytes than alltoall, no count exchange; T must be
 * equal on every rank (checked with one small all-gather). The backward gathers dout
 * the same way and reduce-scatters d_hidden and d_topk_weights.
 *
 * The CPU row: the gathered ids are read on the host, which picks the owned routes; the
 * moves go through rows.c. (Its device branches would run this plan for CUDA tensors too,
 * the ids brought down and route and pos uploaded; the CUDA row is allgather_cuda.c
 * instead, which keeps the plan on the device.) */
#include <stdlib.h>
#include <string.h>
#include "ops/moe_dispatch/internal.h"

#define NOMEM lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little")

typedef struct {
    int64_t N, NR, Rl;          /* tokens and routes over the group, routes owned here */
    int32_t *route, *pos;       /* host: owned route i is route[i]; route r's row is pos[r] (-1: not here) */
} plan;

/* One pass's workspace, in the call's memory. */
typedef struct {
    char *xa, *da, *xl, *dl, *y, *dx;
    int32_t *ida, *route, *pos, *meta, *lid;
    float *wa, *w, *acc, *part, *dw, *dwa;
} bufs;

static lk_status same_T(const lk_ep_call *c) {
    int64_t Ts[LK_EP_MAX_RANKS];
    lk_status s = lk_ep_exchange_i64(c, &c->T, Ts, 0);
    for (int p = 0; !s && p < c->P; p++)
        if (Ts[p] != c->T)
            return lk_error(LK_ECOMM, "moe_dispatch: hidden: expected the same T on every rank for allgather, got %lld "
                            "here and %lld on rank %d", (long long)c->T, (long long)Ts[p], p);
    return s;
}

/* Sum or carve; the routes owned here are not known before the ids are gathered into this
 * workspace, so the owned rows take the bound N·k. */
static void layout(const lk_ep_call *c, const plan *pl, int backward, lk_ep_bump *b, bufs *u) {
    size_t N = (size_t)pl->N, NR = (size_t)pl->NR, row = (size_t)c->H * c->es, TH = (size_t)(c->T * c->H);
    u->xa = lk_ep_take(b, row * N), u->ida = lk_ep_take(b, 4 * NR), u->wa = lk_ep_take(b, 4 * NR);
    u->route = c->dev ? lk_ep_take(b, 4 * NR) : pl->route, u->pos = c->dev ? lk_ep_take(b, 4 * NR) : pl->pos;
    u->meta = lk_ep_take(b, 8 * NR), u->lid = lk_ep_take(b, 4 * NR), u->w = lk_ep_take(b, 4 * NR);
    u->xl = lk_ep_take(b, row * NR), u->y = lk_ep_take(b, row * NR);
    u->acc = lk_ep_take(b, 4 * N * (size_t)c->H), u->part = lk_ep_take(b, 4 * TH);
    if (backward) {
        u->da = lk_ep_take(b, row * N), u->dl = lk_ep_take(b, row * NR);
        u->dx = lk_ep_take(b, row * NR), u->dw = lk_ep_take(b, 4 * NR), u->dwa = lk_ep_take(b, 4 * NR);
    }
}

/* Everything gathered; the owned routes picked on the host, their rows and (local id,
 * weight) gathered for the experts. */
static lk_status gather_routes(const lk_ep_call *c, plan *pl, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    size_t row = (size_t)c->H * c->es, TK = 4 * (size_t)(c->T * c->k);
    lk_status s;
    if ((s = lk_ep_all_gather(c, a->hidden.data, u->xa, row * (size_t)c->T)) ||
        (s = lk_ep_all_gather(c, a->topk_ids.data, u->ida, TK)) ||
        (s = lk_ep_all_gather(c, a->topk_weights.data, u->wa, TK)) ||
        (backward && (s = lk_ep_all_gather(c, a->dout.data, u->da, row * (size_t)c->T))))
        return s;
    const void *h;
    void *own;
    if ((s = lk_ep_host(c, u->ida, 4 * (size_t)pl->NR, &h, &own))) return s;
    const int32_t *ida = h;
    int64_t e0 = c->r * c->El;
    pl->Rl = 0;
    for (int64_t r = 0; r < pl->NR; r++) {
        int owned = ida[r] >= e0 && ida[r] < e0 + c->El;
        pl->pos[r] = owned ? (int32_t)pl->Rl : -1;
        if (owned) pl->route[pl->Rl++] = (int32_t)r;
    }
    free(own);
    if (c->dev && ((s = lk_ep_copy(c, u->route, pl->route, 4 * (size_t)pl->Rl, 0)) ||
                   (s = lk_ep_copy(c, u->pos, pl->pos, 4 * (size_t)pl->NR, 0))))
        return s;
    if ((s = lk_ep_gather(c, u->xl, u->xa, u->route, pl->Rl, c->k)) ||
        (s = lk_ep_meta(c, u->meta, u->ida, u->wa, u->route, pl->Rl)) ||
        (s = lk_ep_unmeta(c, u->meta, u->lid, u->w, pl->Rl)))
        return s;
    return backward ? lk_ep_gather(c, u->dl, u->da, u->route, pl->Rl, c->k) : LK_OK;
}

/* Each token's owned rows summed, then across the ranks: out, or d_hidden and d_topk_weights. */
static lk_status scatter_back(const lk_ep_call *c, const plan *pl, const bufs *u, int backward) {
    const lk_moe_dispatch_args *a = c->a;
    lk_status s;
    if ((s = lk_ep_combine(c, u->acc, LK_F32, backward ? u->dx : u->y, c->dt, u->pos, pl->N, c->k)) ||
        (s = lk_ep_reduce_scatter(c, u->acc, u->part, c->T * c->H)) ||
        (s = lk_ep_combine(c, backward ? a->d_hidden.data : a->out.data, c->dt, u->part, LK_F32, NULL, c->T, 1)))
        return s;
    if (!backward || !a->d_topk_weights.data) return LK_OK;
    if ((s = lk_ep_pick(c, u->dwa, u->dw, u->pos, pl->NR))) return s;
    return lk_ep_reduce_scatter(c, u->dwa, a->d_topk_weights.data, c->T * c->k);
}

static lk_status exchange(const lk_ep_call *c, plan *pl, int backward) {
    lk_ep_bump b = {0};
    bufs u;
    size_t mark;
    layout(c, pl, backward, &b, &u);
    lk_status s = lk_ep_reserve(c, &b, lk_ep_experts_bytes(c, pl->NR), &mark);
    if (s) return s;
    layout(c, pl, backward, &b, &u);
    if (b.short_) s = NOMEM;
    if (!s) s = gather_routes(c, pl, &u, backward);
    if (!s) s = lk_ep_experts(c, &b, pl->Rl, u.xl, u.lid, u.w, u.y, backward ? u.dl : NULL, u.dx, u.dw);
    if (!s) s = scatter_back(c, pl, &u, backward);
    lk_ctx_workspace_end(c->ctx, mark);
    return s;
}

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    lk_status s = same_T(&c);
    if (s) return s;
    plan pl = {.N = c.P * c.T, .NR = c.P * c.T * c.k};
    int32_t *host = malloc(8 * (size_t)pl.NR);
    if (!host) return lk_error(LK_ENOMEM, "moe_dispatch: no host room for %lld routes", (long long)pl.NR);
    pl.route = host, pl.pos = host + pl.NR;
    s = exchange(&c, &pl, backward);
    free(host);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
