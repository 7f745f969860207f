/* allgather_cuda.c — the CUDA allgather dispatcher (moe_dispatch.h) with device counts: no
 * host read and no synchronization, so a forward and a backward can be captured in a CUDA
 * graph (tests/cuda/test_moe_dispatch.c captures both on a group of one). The CPU row
 * stays allgather.c (the host plan, lk_comm's blocking collectives, T equal everywhere).
 *
 * Plan, on the call's stream. Every rank sends one slot of Tb = max(T, args.max_tokens)
 * tokens: its T rows of hidden (copied into a Tb-row buffer when Tb > T), its T·k routes
 * packed as (id, weight bits) and its T (i64). Three all-gathers (lk_comm_all_gather_on:
 * NCCL on the stream) give every rank the group's N = P·Tb tokens in P slots, their
 * NR = N·k routes and the P counts; tokens of slot p past cnt[p] are padding. Route q
 * (token q / k) is owned here when its token is real and its id is one of this rank's
 * experts [r·El, (r+1)·El): it keeps its row, local id and weight; every other route (a
 * peer's expert, a padding token) becomes a zero row with local id 0 and weight 0, which
 * the experts run as exact zeros (every gradient contribution 0 too), so the experts op
 * takes all NR rows as they are (k = 1 a row, as the alltoall's slots). Each gathered
 * token's k rows are summed in f32 (its owned routes' partial sum) and one reduce-scatter
 * (lk_comm_reduce_scatter_on, f32) adds the ranks' partial sums into each token's own
 * rank, rounded once into out. Backward: the same plan, dout gathered and spread the same
 * way, the experts' forward (their saved state) and backward, d_hidden summed back as out
 * was, d_topk_weights (the owned routes', 0 elsewhere) by a reduce-scatter of its own.
 * One rank over a host comm (NULL, lk_comm_self()): every collective a copy on the stream.
 *
 * Why a bound: as in alltoall_cuda.c, NCCL takes host sizes and the host never sees the
 * device counts, so every rank sends Tb tokens and ranks may pass different T (max_tokens:
 * the most any rank passes, the same on every rank; 0 = T, then T must be equal on every
 * rank, which nothing checks: a mismatch breaks the NCCL call, as with alltoall). So,
 * unlike the CPU row, there is no T exchange.
 *
 * Cost per rank and pass, N = P·Tb tokens, NR = N·k routes, es the element size. Memory:
 * the gathered rows N·H·es, the spread rows and the experts' output 2 × NR·H·es, the f32
 * per-token sums N·H·4 and the received Tb·H·4, the send copy Tb·H·es (Tb > T); backward
 * the same again for dout and d_hidden (4 × NR·H·es in all, the f32 sums reused); 8 bytes
 * a route gathered (id, weight) plus 12 of the plan (local id, weight, owner mark), 12
 * more backward (d_topk_weights masked and received); and the experts' saved state and
 * workspace over NR rows (their [NR, 2I] pre-activations the largest). The wire, a rank
 * and a pass: (P-1)·Tb rows gathered and (P-1)·Tb·H·4 bytes reduce-scattered, (P-1)·Tb·H·
 * (es + 4) (backward dout's rows and d_topk_weights' too), against the alltoall's
 * 2·(P-1)·Tb·k·H·es: fewer for every k >= 2. Compute: the experts run all NR rows, P times
 * the ~T·k real ones on balanced routing, the same bound as the alltoall's; an experts op
 * that skipped the zero-weight rows on the device would take it back (bench/NOTES.md,
 * issue 18 item 4).
 *
 * Bad ids: never read on the host. Every rank sees every route, so an id outside [0, E)
 * anywhere in the group (or a count outside [0, Tb]: ranks that disagree on the bound)
 * raises a device flag on every rank, and each rank's out, or d_hidden and
 * d_topk_weights, come out NaN. The bad route runs as a zero row, so the weight gradients
 * stay finite (the CUDA local and alltoall NaN the ones it touches). Built with CUDA only
 * (the _cuda.c suffix). */
#include "ops/moe_dispatch/internal.h"
#include "ops/moe_dispatch/rows.h"

#define NOMEM lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little")

typedef struct {
    int64_t N, NR;              /* tokens and routes gathered: P·Tb, P·Tb·k */
} dims;

/* One pass's workspace, all device memory. */
typedef struct {
    int64_t *cnt_s, *cnt;                       /* [1], [P] */
    int *flag;
    int32_t *meta_s, *meta;                     /* [2·Tb·k], [2·NR] */
    int32_t *lid, *own;                         /* [NR]: local id; q where route q is owned here, else -1 */
    float *w;                                   /* [NR] */
    char *xs, *xa, *xl, *y;                     /* [Tb] rows when Tb > T, [N], [NR], [NR] */
    float *acc, *part;                          /* [N, H], [Tb, H] */
    char *ds, *da, *dl, *dx;                    /* backward: dout's, and d_hidden's rows, as xs, xa, xl, y */
    float *dw, *dwa, *dwp;                      /* [NR], [NR], [Tb·k] when Tb > T */
} bufs;

static void layout(const lk_ep_call *c, const dims *d, int backward, lk_ep_bump *b, bufs *u) {
    size_t N = (size_t)d->N, NR = (size_t)d->NR, Tb = (size_t)c->Tb, H = (size_t)c->H, row = H * c->es;
    int pad = c->Tb > c->T;
    u->cnt_s = lk_ep_take(b, 8), u->cnt = lk_ep_take(b, 8 * (size_t)c->P), u->flag = lk_ep_take(b, sizeof(int));
    u->meta_s = lk_ep_take(b, 8 * Tb * (size_t)c->k), u->meta = lk_ep_take(b, 8 * NR);
    u->lid = lk_ep_take(b, 4 * NR), u->own = lk_ep_take(b, 4 * NR), u->w = lk_ep_take(b, 4 * NR);
    u->xs = pad ? lk_ep_take(b, row * Tb) : NULL;
    u->xa = lk_ep_take(b, row * N), u->xl = lk_ep_take(b, row * NR), u->y = lk_ep_take(b, row * NR);
    u->acc = lk_ep_take(b, 4 * N * H), u->part = lk_ep_take(b, 4 * Tb * H);
    if (backward) {
        u->ds = pad ? lk_ep_take(b, row * Tb) : NULL;
        u->da = lk_ep_take(b, row * N), u->dl = lk_ep_take(b, row * NR), u->dx = lk_ep_take(b, row * NR);
        u->dw = lk_ep_take(b, 4 * NR), u->dwa = lk_ep_take(b, 4 * NR);
        u->dwp = pad ? lk_ep_take(b, 4 * Tb * (size_t)c->k) : NULL;
    }
}

/* Rank p's bytes into slot p of recv, queued on the call's stream; one rank over a host
 * comm: a device copy. */
static lk_status gather_on(const lk_ep_call *c, const void *send, void *recv, size_t bytes) {
    if (c->direct) return lk_ep_copy(c, recv, send, bytes, 0);
    return lk_comm_all_gather_on(c->comm, send, recv, bytes, c->ctx->stream);
}

/* recv[Tb·H-sized slice] = Σ over the ranks of their send's slice for this rank (f32). */
static lk_status sum_scatter_on(const lk_ep_call *c, const float *send, float *recv, int64_t count) {
    if (c->direct) return lk_ep_copy(c, recv, send, 4 * (size_t)count, 0);
    return lk_comm_reduce_scatter_on(c->comm, send, recv, count, LK_COMM_F32, c->ctx->stream);
}

/* The routes and counts packed, gathered, and the ones owned here picked out. */
static lk_status plan(const lk_ep_call *c, const bufs *u) {
    const lk_moe_dispatch_args *a = c->a;
    void *st = c->ctx->stream;
    lk_status s;
    if ((s = lk_ep_cuda_pack_routes(u->meta_s, u->cnt_s, u->flag, a->topk_ids.data, a->topk_weights.data,
                                    c->T * c->k, c->T, st)) ||
        (s = gather_on(c, u->cnt_s, u->cnt, 8)) ||
        (s = gather_on(c, u->meta_s, u->meta, 8 * (size_t)(c->Tb * c->k))))
        return s;
    return lk_ep_cuda_own_routes(u->meta, u->cnt, c->P, c->Tb, c->k, c->E, c->r * c->El, c->El, u->lid, u->w, u->own,
                                 u->flag, st);
}

/* This rank's T rows of src (hidden or dout) gathered with every rank's (a slot of Tb
 * each, through buf when Tb > T), then one row a route: the token's where the route is
 * owned here, else zero (padding tokens included). */
static lk_status spread(const lk_ep_call *c, const dims *d, const bufs *u, const void *src, void *buf, void *all,
                        void *routes) {
    size_t row = (size_t)c->H * c->es;
    lk_status s;
    if (buf && (s = lk_ep_copy(c, buf, src, row * (size_t)c->T, 0))) return s;
    if ((s = gather_on(c, buf ? buf : src, all, row * (size_t)c->Tb))) return s;
    return lk_ep_gather(c, routes, all, u->own, d->NR, c->k);
}

/* Each gathered token's k rows summed in f32, the ranks' sums added into this rank's
 * tokens, rounded once into dst [T, H]; NaN on a bad id or count. */
static lk_status sum_back(const lk_ep_call *c, const dims *d, const bufs *u, const void *rows, void *dst) {
    lk_status s;
    if ((s = lk_ep_combine(c, u->acc, LK_F32, rows, c->dt, NULL, d->N, c->k)) ||
        (s = sum_scatter_on(c, u->acc, u->part, c->Tb * c->H)) ||
        (s = lk_ep_combine(c, dst, c->dt, u->part, LK_F32, NULL, c->T, 1)))
        return s;
    return lk_ep_cuda_nan_if(u->flag, dst, c->dt, c->T * c->H, c->ctx->stream);
}

/* d_topk_weights: the owned routes' gradients (0 elsewhere) added across the ranks. */
static lk_status weights_back(const lk_ep_call *c, const dims *d, const bufs *u) {
    const lk_moe_dispatch_args *a = c->a;
    float *dst = a->d_topk_weights.data, *recv = u->dwp ? u->dwp : dst;
    lk_status s;
    if ((s = lk_ep_pick(c, u->dwa, u->dw, u->own, d->NR)) || (s = sum_scatter_on(c, u->dwa, recv, c->Tb * c->k)) ||
        (u->dwp && (s = lk_ep_copy(c, dst, u->dwp, 4 * (size_t)(c->T * c->k), 0))))
        return s;
    return lk_ep_cuda_nan_if(u->flag, dst, LK_F32, c->T * c->k, c->ctx->stream);
}

static lk_status run(const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward) {
    lk_ep_call c;
    lk_ep_call_of(a, ctx, &c);
    dims d = {.N = c.P * c.Tb};
    d.NR = d.N * c.k;
    if (d.NR > INT32_MAX)   /* route positions are int32, as in the experts op */
        return lk_error(LK_EINVAL, "moe_dispatch: max_tokens: expected ranks x max(T, max_tokens) x k < 2^31 "
                        "gathered routes, got %d x %lld x %lld", c.P, (long long)c.Tb, (long long)c.k);
    lk_ep_bump b = {0};
    bufs u;
    size_t mark;
    layout(&c, &d, backward, &b, &u);
    lk_status s = lk_ep_reserve(&c, &b, lk_ep_experts_bytes(&c, d.NR), &mark);
    if (s) return s;
    layout(&c, &d, backward, &b, &u);
    float *dw = backward && a->d_topk_weights.data ? u.dw : NULL;
    if (b.short_) s = NOMEM;
    if (!s) s = plan(&c, &u);
    if (!s) s = spread(&c, &d, &u, a->hidden.data, u.xs, u.xa, u.xl);
    if (!s && backward) s = spread(&c, &d, &u, a->dout.data, u.ds, u.da, u.dl);
    if (!s) s = lk_ep_experts(&c, &b, d.NR, u.xl, u.lid, u.w, u.y, backward ? u.dl : NULL, u.dx, dw);
    if (!s) s = backward ? sum_back(&c, &d, &u, u.dx, a->d_hidden.data) : sum_back(&c, &d, &u, u.y, a->out.data);
    if (!s && dw) s = weights_back(&c, &d, &u);
    lk_ctx_workspace_end(ctx, mark);
    return s;
}

static lk_status fwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status bwd(const lk_moe_dispatch_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

const lk_moe_dispatch_vtable lk_moe_dispatch_allgather_cuda_vtable = {
    .version = LK_MOE_DISPATCH_VTABLE_VERSION, .forward = fwd, .backward = bwd,
};
