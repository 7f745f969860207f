/* moe_dispatch.c — the expert-parallel dispatch facade (include/llmkern/moe_dispatch.h):
 * every argument checked before any collective or write, then the implementation; and
 * the pieces the dispatchers share (common sizes, workspace layout, the local experts
 * over received rows). The ids are checked on the host for the rows that plan there (the
 * CPU rows); the CUDA rows never read them on the host (a bad id turns their outputs NaN
 * on the device). CUDA tensors need a group that takes device memory (NCCL) when it has
 * more than one rank. */
#include <stdlib.h>
#include <string.h>
#include "core/checked.h"
#include "ops/validate.h"
#include "ops/moe_dispatch/internal.h"

#define OP "moe_dispatch"

static lk_status check_t(lk_device_type dev, const char *arg, const lk_tensor *t, int ndim, const int64_t *shape,
                         unsigned dtypes) {
    lk_status s;
    if ((s = lk_expect_present(OP, arg, t)) || (s = lk_expect_device(OP, arg, t, dev)) ||
        (s = lk_expect_contiguous(OP, arg, t, ndim)) || (s = lk_expect_dtype(OP, arg, t, dtypes)) ||
        (s = lk_expect_shape(OP, arg, t, ndim, shape)))
        return s;
    return LK_OK;
}

int lk_ep_comm_on_device(const lk_comm *comm) { return comm->backend && strcmp(comm->backend, "nccl") == 0; }

static const lk_impl *experts_of(const lk_moe_dispatch_args *a, lk_device_type dev) {
    return a->experts ? a->experts : lk_impl_find(LK_OP_MOE_EXPERTS, "fused", dev);
}

lk_status lk_ep_call_of(const lk_moe_dispatch_args *a, lk_ctx *ctx, lk_ep_call *c) {
    memset(c, 0, sizeof *c);
    c->a = a, c->ctx = ctx;
    c->comm = ctx->comm ? ctx->comm : lk_comm_self();
    c->P = c->comm->size, c->r = c->comm->rank;
    c->dev = ctx->device.type == LK_DEVICE_CUDA;
    c->direct = lk_ep_comm_on_device(c->comm) != c->dev;   /* the facade allows it for P = 1 only */
    c->experts = experts_of(a, ctx->device.type);
    c->T = a->hidden.shape[0], c->H = a->hidden.shape[1], c->k = a->topk_ids.shape[1];
    c->E = a->n_experts, c->El = a->gate_up_weight.shape[0], c->I = a->gate_up_weight.shape[1] / 2;
    c->dt = a->hidden.dtype, c->es = lk_dtype_size(c->dt);
    c->Tb = a->max_tokens > c->T ? a->max_tokens : c->T;
    /* The largest workspace a dispatcher sizes is every rank's routes' rows (the CPU
     * allgather's P x T x k rows of H, the CUDA rows' P x Tb x k): checked once here, so
     * no product below can wrap. */
    int64_t f[5] = {c->P, c->Tb, c->k, c->H, (int64_t)c->es + 8}, n;
    return lk_checked_prod(OP ": ranks x T x k x H x (element size + 8)", f, 5, &n);
}

/* The group, the workspace and the experts must take the tensors' memory. */
static lk_status check_place(const lk_impl *impl, const lk_moe_dispatch_args *a, const lk_ctx *ctx) {
    lk_device_type dev = impl->device;
    lk_status s;
    if (ctx->comm && (s = lk_comm_check(OP, "ctx.comm", ctx->comm))) return s;
    int P = ctx->comm ? ctx->comm->size : 1;
    if (P > LK_EP_MAX_RANKS)
        return lk_error(LK_EINVAL, OP ": ctx.comm: expected at most %d ranks, got %d", LK_EP_MAX_RANKS, P);
    if (P > 1 && lk_ep_comm_on_device(ctx->comm) != (dev == LK_DEVICE_CUDA))
        return lk_error(LK_EDEVICE, OP ": ctx.comm: expected %s for %s tensors (the exchange hands it their memory), "
                        "got a '%s' communicator", dev == LK_DEVICE_CUDA ? "an NCCL communicator" :
                        "a host-memory communicator (mpi, single)", lk_device_name(dev),
                        ctx->comm->backend ? ctx->comm->backend : "?");
    if (P > 1 && strcmp(impl->name, "local") == 0)
        return lk_error(LK_EINVAL, OP ": ctx.comm: 'local' runs on one process, got a group of %d (use alltoall "
                        "or allgather)", P);
    if (ctx->arena && ctx->arena->device != (int)dev)
        return lk_error(LK_EDEVICE, OP ": ctx.arena: expected %s memory for a %s call, got %s", lk_device_name(dev),
                        lk_device_name(dev), lk_device_name((lk_device_type)ctx->arena->device));
    const lk_impl *ex = experts_of(a, dev);
    if ((s = lk_impl_check(OP, ex, LK_OP_MOE_EXPERTS)))
        return lk_error(s, OP ": experts: expected a moe_experts implementation, got %s", ex ? ex->name : "NULL");
    if (ex->device != dev)
        return lk_error(LK_EDEVICE, OP ": experts: expected a %s implementation, got '%s' on %s", lk_device_name(dev),
                        ex->name, lk_device_name(ex->device));
    return LK_OK;
}

/* The rows whose plan is made on the host, which read the ids there anyway: the CPU rows.
 * Every CUDA row leaves them on the device. */
static int plans_on_host(const lk_impl *impl) { return impl->device == LK_DEVICE_CPU; }

/* Every id in [0, E), read on the host (a CUDA call's ids come down first). */
static lk_status check_ids(const lk_moe_dispatch_args *a, const lk_ep_call *c) {
    const void *h;
    void *own;
    lk_status s = lk_ep_host(c, a->topk_ids.data, lk_tensor_bytes(&a->topk_ids), &h, &own);
    const int32_t *ids = h;
    for (int64_t i = 0; !s && i < c->T * c->k; i++)
        if (ids[i] < 0 || ids[i] >= a->n_experts)
            s = lk_error(LK_EINVAL, OP ": topk_ids: expected ids in [0, %d), got %d at %lld", a->n_experts, ids[i],
                         (long long)i);
    free(own);
    return s;
}

/* Shapes, dtypes and devices of every tensor; P is the group size. */
static lk_status check_tensors(lk_device_type dev, unsigned dtypes, const lk_moe_dispatch_args *a, int P,
                               int backward) {
    lk_status s;
    const lk_tensor *x = &a->hidden;
    if ((s = lk_expect_present(OP, "hidden", x)) || (s = lk_expect_device(OP, "hidden", x, dev)) ||
        (s = lk_expect_contiguous(OP, "hidden", x, 2)) || (s = lk_expect_dtype(OP, "hidden", x, dtypes)))
        return s;
    if (x->ndim != 2 || x->shape[0] < 1 || x->shape[1] < 1)
        return lk_error(LK_ESHAPE, OP ": hidden: expected [T, H] with T, H >= 1, got rank %d", x->ndim);
    int64_t T = x->shape[0], H = x->shape[1];
    if (a->topk_ids.ndim != 2 || a->topk_ids.shape[1] < 1)
        return lk_error(LK_ESHAPE, OP ": topk_ids: expected [%lld, k] with k >= 1", (long long)T);
    int64_t tk[2] = {T, a->topk_ids.shape[1]};
    if ((s = check_t(dev, "topk_ids", &a->topk_ids, 2, tk, LK_DTYPE_BIT(LK_I32))) ||
        (s = check_t(dev, "topk_weights", &a->topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32))))
        return s;
    if (a->max_tokens < 0 || (a->max_tokens > 0 && a->max_tokens < T))
        return lk_error(LK_EINVAL, OP ": max_tokens: expected 0 or at least T = %lld, got %lld", (long long)T,
                        (long long)a->max_tokens);
    if (a->n_experts < 1 || a->n_experts % P)
        return lk_error(LK_EINVAL, OP ": n_experts: expected a multiple >= 1 of the group size %d, got %d", P,
                        a->n_experts);
    const lk_tensor *gu = &a->gate_up_weight;
    int64_t El = a->n_experts / P;
    if (gu->ndim != 3 || gu->shape[1] < 2 || gu->shape[1] % 2)
        return lk_error(LK_ESHAPE, OP ": gate_up_weight: expected [%lld, 2I, %lld]", (long long)El, (long long)H);
    int64_t I = gu->shape[1] / 2, gus[3] = {El, 2 * I, H}, dws[3] = {El, H, I};
    unsigned xdt = LK_DTYPE_BIT(x->dtype), gdt = xdt | LK_DTYPE_BIT(LK_F32);
    if ((s = check_t(dev, "gate_up_weight", gu, 3, gus, xdt)) ||
        (s = check_t(dev, "down_weight", &a->down_weight, 3, dws, xdt)))
        return s;
    if (!backward) return check_t(dev, "out", &a->out, 2, x->shape, xdt);
    if ((s = check_t(dev, "dout", &a->dout, 2, x->shape, xdt)) ||
        (s = check_t(dev, "d_hidden", &a->d_hidden, 2, x->shape, xdt)) ||
        (a->d_topk_weights.data &&
         (s = check_t(dev, "d_topk_weights", &a->d_topk_weights, 2, tk, LK_DTYPE_BIT(LK_F32)))) ||
        (a->d_gate_up_weight.data && (s = check_t(dev, "d_gate_up_weight", &a->d_gate_up_weight, 3, gus, gdt))) ||
        (a->d_down_weight.data && (s = check_t(dev, "d_down_weight", &a->d_down_weight, 3, dws, gdt))))
        return s;
    return LK_OK;
}

static lk_status check(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx, int backward,
                       const lk_moe_dispatch_vtable **vt) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_MOE_DISPATCH);
    if (s) return s;
    *vt = impl->vtable;
    if ((s = lk_expect_call(OP, impl, a, ctx)) || (s = check_place(impl, a, ctx))) return s;
    const unsigned fl = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16);
    lk_ep_call c;
    if ((s = check_tensors(impl->device, impl->needs.dtypes & fl, a, ctx->comm ? ctx->comm->size : 1, backward)) ||
        (s = lk_ep_call_of(a, ctx, &c)) || (plans_on_host(impl) && (s = check_ids(a, &c))) || !backward)
        return s;
    lk_region outs[4] = {{"d_hidden", a->d_hidden.data, lk_tensor_bytes(&a->d_hidden)},
                         lk_tensor_region("d_topk_weights", &a->d_topk_weights),
                         lk_tensor_region("d_gate_up_weight", &a->d_gate_up_weight),
                         lk_tensor_region("d_down_weight", &a->d_down_weight)};
    lk_region ins[3] = {lk_tensor_region("hidden", &a->hidden), lk_tensor_region("dout", &a->dout),
                        lk_tensor_region("gate_up_weight", &a->gate_up_weight)};
    return lk_expect_apart(OP, outs, 4, ins, 3);
}

lk_status lk_moe_dispatch_forward(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx) {
    const lk_moe_dispatch_vtable *vt;
    lk_status s = check(impl, a, ctx, 0, &vt);
    if (s) return s;
    lk_region outs[1] = {{"out", a->out.data, lk_tensor_bytes(&a->out)}};
    lk_region ins[3] = {{"hidden", a->hidden.data, lk_tensor_bytes(&a->hidden)},
                        {"topk_weights", a->topk_weights.data, lk_tensor_bytes(&a->topk_weights)},
                        {"gate_up_weight", a->gate_up_weight.data, lk_tensor_bytes(&a->gate_up_weight)}};
    if ((s = lk_expect_apart(OP, outs, 1, ins, 3))) return s;
    return vt->forward(a, ctx);
}

lk_status lk_moe_dispatch_backward(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx) {
    const lk_moe_dispatch_vtable *vt;
    lk_status s = check(impl, a, ctx, 1, &vt);
    return s ? s : vt->backward(a, ctx);
}

/* --- shared by the dispatchers ----------------------------------------------------- */

void *lk_ep_take(lk_ep_bump *b, size_t bytes) {
    if (!b->carve) {
        b->total += lk_arena_piece(bytes);
        return NULL;
    }
    void *p = lk_arena_alloc(b->ar, bytes);
    if (!p) b->short_ = 1;
    return p;
}

lk_status lk_ep_reserve(const lk_ep_call *c, lk_ep_bump *b, size_t extra, size_t *mark) {
    lk_status s = lk_ctx_workspace_begin(c->ctx, OP, b->total + extra, mark);
    b->ar = c->ctx->arena, b->carve = 1;
    return s;
}

/* A [rows, cols] workspace view on the call's device. */
static lk_tensor rows_view(const lk_ep_call *c, void *data, lk_dtype dt, int64_t rows, int64_t cols) {
    lk_tensor t = lk_tensor_2d(data, dt, rows, cols);
    t.device = c->a->hidden.device;
    return t;
}

static lk_moe_experts_args experts_args(const lk_ep_call *c, int64_t rows) {
    lk_moe_experts_args e = {0};
    e.hidden = e.out = e.dout = e.d_hidden = rows_view(c, NULL, c->dt, rows, c->H);
    e.topk_ids = rows_view(c, NULL, LK_I32, rows, 1);
    e.topk_weights = rows_view(c, NULL, LK_F32, rows, 1);
    e.gate_up_weight = c->a->gate_up_weight, e.down_weight = c->a->down_weight;
    e.d_gate_up_weight = c->a->d_gate_up_weight, e.d_down_weight = c->a->d_down_weight;
    return e;
}

size_t lk_ep_experts_bytes(const lk_ep_call *c, int64_t rows) {
    const lk_moe_experts_vtable *vt = c->experts->vtable;
    lk_moe_experts_args e = experts_args(c, rows);
    size_t saved = vt->saved_bytes(rows, 1, c->El, c->H, c->I, c->dt);
    size_t f = vt->workspace_bytes ? vt->workspace_bytes(&e, 0) : 0, bw = vt->workspace_bytes ? vt->workspace_bytes(&e, 1) : 0;
    return saved + (f > bw ? f : bw) + 2 * LK_ARENA_ALIGN;
}

lk_status lk_ep_experts(const lk_ep_call *c, lk_ep_bump *b, int64_t rows, void *x, int32_t *ids, float *w, void *y,
                        const void *dy, void *dx, float *dw) {
    if (rows == 0) return LK_OK;    /* no route here: nothing to run, gradients untouched */
    lk_moe_experts_args e = experts_args(c, rows);
    e.hidden.data = x, e.topk_ids.data = ids, e.topk_weights.data = w, e.out.data = y;
    e.saved.bytes = ((const lk_moe_experts_vtable *)c->experts->vtable)->saved_bytes(rows, 1, c->El, c->H, c->I, c->dt);
    e.saved.data = lk_ep_take(b, e.saved.bytes);
    if (!e.saved.data) return lk_error(LK_ENOMEM, OP ": arena: expected the reserved workspace, got too little");
    e.dout.data = NULL, e.d_hidden.data = NULL;
    lk_status s = lk_moe_experts_forward(c->experts, &e, c->ctx);
    if (s || !dy) return s;
    e.dout.data = (void *)dy, e.d_hidden.data = dx;
    if (dw) e.d_topk_weights = rows_view(c, dw, LK_F32, rows, 1);
    return lk_moe_experts_backward(c->experts, &e, c->ctx);
}
