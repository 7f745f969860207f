/* allgather.c — the allgather dispatcher (moe_dispatch.h): every rank gathers all
 * tokens with their routing, runs its own experts on the routes it owns, adds the
 * weighted rows into an f32 [P·T, H] buffer and a reduce-scatter sums each token's
 * outputs back to its rank. More bytes than alltoall, no count exchange; T must be
 * equal on every rank (checked with one small all-gather). The backward gathers dout
 * the same way and reduce-scatters d_hidden and d_topk_weights. */
#include <string.h>
#include "ops/moe_dispatch/internal.h"

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    int64_t Ts[LK_EP_MAX_RANKS], T = c.T, k = c.k, H = c.H, P = c.P;
    lk_status s = lk_comm_all_gather(c.comm, &T, Ts, sizeof T);
    if (s) return s;
    for (int p = 0; p < P; p++)
        if (Ts[p] != T)
            return lk_error(LK_ECOMM, "moe_dispatch: hidden: expected the same T on every rank for allgather, got %lld "
                            "here and %lld on rank %d", (long long)T, (long long)Ts[p], p);
    int64_t N = P * T, NR = N * k;
    size_t row = (size_t)H * c.es;
    lk_ep_bump b = {0};
    char *xa = NULL, *xl, *y, *da = NULL, *dl = NULL, *dx = NULL;
    int32_t *ida, *lid, *route;
    float *wa, *w, *acc, *dw = NULL, *dwa = NULL;
    size_t mark = 0;
    /* routes this rank owns: counted before the workspace, from the gathered ids... which
     * need the workspace; so the bound N·k rows is reserved for them */
    for (int pass = 0; pass < 2; pass++) {
        xa = lk_ep_take(&b, row * (size_t)N), ida = lk_ep_take(&b, 4 * (size_t)NR), wa = lk_ep_take(&b, 4 * (size_t)NR);
        route = lk_ep_take(&b, 4 * (size_t)NR), lid = lk_ep_take(&b, 4 * (size_t)NR), w = lk_ep_take(&b, 4 * (size_t)NR);
        xl = lk_ep_take(&b, row * (size_t)NR), y = lk_ep_take(&b, row * (size_t)NR);
        acc = lk_ep_take(&b, 4 * (size_t)(N * H));
        if (backward) {
            da = lk_ep_take(&b, row * (size_t)N), dl = lk_ep_take(&b, row * (size_t)NR);
            dx = lk_ep_take(&b, row * (size_t)NR), dw = lk_ep_take(&b, 4 * (size_t)NR), dwa = lk_ep_take(&b, 4 * (size_t)NR);
        }
        if (pass == 0 && (s = lk_ep_reserve(&c, &b, lk_ep_experts_bytes(&c, NR), &mark))) return s;
    }
    if (b.short_) {
        lk_ctx_workspace_end(ctx, mark);
        return lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little");
    }
    if ((s = lk_comm_all_gather(c.comm, a->hidden.data, xa, row * (size_t)T)) ||
        (s = lk_comm_all_gather(c.comm, a->topk_ids.data, ida, 4 * (size_t)(T * k))) ||
        (s = lk_comm_all_gather(c.comm, a->topk_weights.data, wa, 4 * (size_t)(T * k))) ||
        (backward && (s = lk_comm_all_gather(c.comm, a->dout.data, da, row * (size_t)T))))
        goto done;
    int64_t Rl = 0, e0 = c.r * c.El;
    for (int64_t r = 0; r < NR; r++)
        if (ida[r] >= e0 && ida[r] < e0 + c.El) {
            route[Rl] = (int32_t)r, lid[Rl] = ida[r] - (int32_t)e0, w[Rl] = wa[r];
            memcpy(xl + (size_t)Rl * row, xa + (size_t)(r / k) * row, row);
            if (backward) memcpy(dl + (size_t)Rl * row, da + (size_t)(r / k) * row, row);
            Rl++;
        }
    if ((s = lk_ep_experts(&c, &b, Rl, xl, lid, w, y, backward ? dl : NULL, dx, dw))) goto done;
    /* each owned route's row added into its token, then summed across the ranks */
    const char *rows = backward ? dx : y;
    memset(acc, 0, 4 * (size_t)(N * H));
    for (int64_t i = 0; i < Rl; i++) {
        float *dst = acc + (route[i] / k) * H;
        const char *src = rows + (size_t)i * row;
        for (int64_t h = 0; h < H; h++)
            dst[h] += c.dt == LK_F32 ? ((const float *)src)[h] : lk_bf16_to_f32(((const uint16_t *)src)[h]);
    }
    if ((s = lk_comm_reduce_scatter(c.comm, acc, acc, T * H, LK_COMM_F32))) goto done;
    lk_convert(acc, LK_F32, backward ? a->d_hidden.data : a->out.data, c.dt, T * H);
    if (backward && a->d_topk_weights.data) {
        memset(dwa, 0, 4 * (size_t)NR);
        for (int64_t i = 0; i < Rl; i++) dwa[route[i]] = dw[i];
        s = lk_comm_reduce_scatter(c.comm, dwa, a->d_topk_weights.data, T * k, LK_COMM_F32);
    }
done:
    lk_ctx_workspace_end(ctx, mark);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
