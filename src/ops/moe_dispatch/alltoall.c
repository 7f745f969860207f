/* alltoall.c — the alltoall dispatcher (moe_dispatch.h): routes sorted by owner rank,
 * the per-owner counts exchanged first, rows and their (local id, weight) sent in one
 * variable all-to-all each, the owner's experts run on what arrived, the weighted rows
 * sent back and summed per token in f32. The backward repeats the dispatch, sends dout
 * the same way, and returns d_hidden rows and d_topk_weights along the reverse path. */
#include <string.h>
#include "ops/moe_dispatch/internal.h"

typedef struct {
    int64_t scnt[LK_EP_MAX_RANKS], rcnt[LK_EP_MAX_RANKS];       /* routes to / from each rank */
    int64_t bs[LK_EP_MAX_RANKS], bsd[LK_EP_MAX_RANKS], br[LK_EP_MAX_RANKS], brd[LK_EP_MAX_RANKS];
    int64_t R, Rr;                                              /* routes sent, received */
    int32_t *order, *pos;       /* sorted position p holds route order[p]; route r sits at pos[r] */
} plan;

/* Byte counts of an exchange of `unit` bytes per route, forward (to owners) or back. */
static lk_status move(const lk_ep_call *c, plan *pl, int back, const void *send, void *recv, size_t unit) {
    int64_t os = 0, orr = 0;
    for (int p = 0; p < c->P; p++) {
        int64_t s = (back ? pl->rcnt[p] : pl->scnt[p]) * (int64_t)unit, r = (back ? pl->scnt[p] : pl->rcnt[p]) * (int64_t)unit;
        pl->bs[p] = s, pl->bsd[p] = os, pl->br[p] = r, pl->brd[p] = orr;
        os += s, orr += r;
    }
    return lk_comm_all_to_all(c->comm, send, pl->bs, pl->bsd, recv, pl->br, pl->brd);
}

static lk_status counts(const lk_ep_call *c, plan *pl) {
    const int32_t *ids = c->a->topk_ids.data;
    memset(pl->scnt, 0, sizeof(int64_t) * (size_t)c->P);
    pl->R = c->T * c->k;
    for (int64_t r = 0; r < pl->R; r++) pl->scnt[ids[r] / c->El]++;
    for (int p = 0; p < c->P; p++) pl->bs[p] = pl->br[p] = 8, pl->bsd[p] = pl->brd[p] = 8 * p;
    lk_status s = lk_comm_all_to_all(c->comm, pl->scnt, pl->bs, pl->bsd, pl->rcnt, pl->br, pl->brd);
    pl->Rr = 0;
    for (int p = 0; p < c->P; p++) pl->Rr += pl->rcnt[p];
    return s;
}

static void sort_routes(const lk_ep_call *c, plan *pl) {
    const int32_t *ids = c->a->topk_ids.data;
    int64_t start[LK_EP_MAX_RANKS], o = 0;
    for (int p = 0; p < c->P; p++) start[p] = o, o += pl->scnt[p];
    for (int64_t r = 0; r < pl->R; r++) {
        int64_t p = start[ids[r] / c->El]++;
        pl->order[p] = (int32_t)r, pl->pos[r] = (int32_t)p;
    }
}

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    plan pl;
    lk_status s = counts(&c, &pl);
    if (s) return s;
    int64_t R = pl.R, Rr = pl.Rr, H = c.H;
    size_t row = (size_t)H * c.es;
    lk_ep_bump b = {0};
    char *xs = NULL, *xr, *y, *ret, *ds = NULL, *dr = NULL, *dx = NULL, *dh = NULL;
    int32_t *meta_s, *meta_r, *lid;
    float *w, *dw = NULL, *dwr = NULL;
    size_t mark = 0;
    for (int pass = 0; pass < 2; pass++) {
        pl.order = lk_ep_take(&b, 4 * (size_t)R), pl.pos = lk_ep_take(&b, 4 * (size_t)R);
        xs = lk_ep_take(&b, row * (size_t)R), xr = lk_ep_take(&b, row * (size_t)Rr);
        meta_s = lk_ep_take(&b, 8 * (size_t)R), meta_r = lk_ep_take(&b, 8 * (size_t)Rr);
        lid = lk_ep_take(&b, 4 * (size_t)Rr), w = lk_ep_take(&b, 4 * (size_t)Rr);
        y = lk_ep_take(&b, row * (size_t)Rr), ret = lk_ep_take(&b, row * (size_t)R);
        if (backward) {
            ds = lk_ep_take(&b, row * (size_t)R), dr = lk_ep_take(&b, row * (size_t)Rr);
            dx = lk_ep_take(&b, row * (size_t)Rr), dh = lk_ep_take(&b, row * (size_t)R);
            dw = lk_ep_take(&b, 4 * (size_t)Rr), dwr = lk_ep_take(&b, 4 * (size_t)R);
        }
        if (pass == 0 && (s = lk_ep_reserve(&c, &b, lk_ep_experts_bytes(&c, Rr), &mark))) return s;
    }
    if (b.short_) {
        lk_ctx_workspace_end(ctx, mark);
        return lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little");
    }
    sort_routes(&c, &pl);
    const int32_t *ids = a->topk_ids.data;
    const float *tw = a->topk_weights.data;
    for (int64_t p = 0; p < R; p++) {
        int64_t r = pl.order[p];
        memcpy(xs + (size_t)p * row, (const char *)a->hidden.data + (size_t)(r / c.k) * row, row);
        meta_s[2 * p] = ids[r] % (int32_t)c.El;
        memcpy(&meta_s[2 * p + 1], &tw[r], 4);
    }
    if ((s = move(&c, &pl, 0, xs, xr, row)) || (s = move(&c, &pl, 0, meta_s, meta_r, 8))) goto done;
    for (int64_t i = 0; i < Rr; i++) lid[i] = meta_r[2 * i], memcpy(&w[i], &meta_r[2 * i + 1], 4);
    if (backward) {
        for (int64_t p = 0; p < R; p++)
            memcpy(ds + (size_t)p * row, (const char *)a->dout.data + (size_t)(pl.order[p] / c.k) * row, row);
        if ((s = move(&c, &pl, 0, ds, dr, row))) goto done;
    }
    if ((s = lk_ep_experts(&c, &b, Rr, xr, lid, w, y, backward ? dr : NULL, dx, dw))) goto done;
    if (!backward) {
        if ((s = move(&c, &pl, 1, y, ret, row))) goto done;
        /* out[t] = Σ_j of its k returned rows, in f32, rounded once */
        float acc[H];
        for (int64_t t = 0; t < c.T; t++) {
            memset(acc, 0, sizeof acc);
            for (int64_t j = 0; j < c.k; j++) {
                const char *src = ret + (size_t)pl.pos[t * c.k + j] * row;
                for (int64_t h = 0; h < H; h++)
                    acc[h] += c.dt == LK_F32 ? ((const float *)src)[h] : lk_bf16_to_f32(((const uint16_t *)src)[h]);
            }
            lk_convert(acc, LK_F32, (char *)a->out.data + (size_t)t * row, c.dt, H);
        }
    } else {
        if ((s = move(&c, &pl, 1, dx, dh, row)) || (s = move(&c, &pl, 1, dw, dwr, 4))) goto done;
        float acc[H];
        for (int64_t t = 0; t < c.T; t++) {
            memset(acc, 0, sizeof acc);
            for (int64_t j = 0; j < c.k; j++) {
                int64_t p = pl.pos[t * c.k + j];
                const char *src = dh + (size_t)p * row;
                for (int64_t h = 0; h < H; h++)
                    acc[h] += c.dt == LK_F32 ? ((const float *)src)[h] : lk_bf16_to_f32(((const uint16_t *)src)[h]);
                if (a->d_topk_weights.data) ((float *)a->d_topk_weights.data)[t * c.k + j] = dwr[p];
            }
            lk_convert(acc, LK_F32, (char *)a->d_hidden.data + (size_t)t * row, c.dt, H);
        }
    }
done:
    lk_ctx_workspace_end(ctx, mark);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_alltoall_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
