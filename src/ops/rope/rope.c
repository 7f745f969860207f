/* rope.c — the RoPE facade (include/llmkern/rope.h): every argument, each position id
 * included, is checked before anything is written; the implementation's workspace is
 * reserved in ctx->arena and given back after the call. Implementations (eager.c,
 * fused.c) may therefore assume well-formed arguments, positions inside the tables (on
 * the CPU; CUDA kernels check them themselves, see check_positions), outputs that are
 * their inputs exactly or apart from them, and B·S >= 1. */
#include <stdint.h>
#include "ops/validate.h"
#include "internal.h"

#define OP "rope"

typedef struct {
    const lk_rope_vtable *vt;
    lk_rope_dims d;
} call_info;

/* After lk_impl_check: q and k shapes, dtype and rotary_dim: all the queries need. Data is not looked at. */
static lk_status check_dims(const lk_impl *impl, const lk_rope_args *a, call_info *ci) {
    lk_status s;
    const lk_tensor *q = &a->q, *k = &a->k;
    if ((s = lk_expect_operand(OP, impl->device, "q", q, 0, 4)) ||
        (s = lk_expect_dtype(OP, "q", q, impl->needs.dtypes)))
        return s;
    if (q->ndim != 4 || q->shape[1] < 1 || q->shape[3] < 2) {
        char b[96];
        return lk_error(LK_ESHAPE, OP ": q: expected [B, Hq >= 1, S, D >= 2], got %s", lk_shape_str(q, b, sizeof b));
    }
    if ((s = lk_expect_operand(OP, impl->device, "k", k, 0, 4)) || (s = lk_expect_dtype_eq(OP, "k", k, q->dtype)))
        return s;
    if (k->ndim != 4 || k->shape[0] != q->shape[0] || k->shape[2] != q->shape[2] || k->shape[3] != q->shape[3] ||
        k->shape[1] < 1 || q->shape[1] % k->shape[1] != 0) {
        char b[96];
        return lk_error(LK_ESHAPE, OP ": k: expected [%lld, Hk, %lld, %lld] with Hk dividing Hq = %lld, got %s",
                        (long long)q->shape[0], (long long)q->shape[2], (long long)q->shape[3],
                        (long long)q->shape[1], lk_shape_str(k, b, sizeof b));
    }
    int64_t D = q->shape[3], R = a->rotary_dim ? a->rotary_dim : D;
    if (R < 2 || R > D || R % 2)
        return lk_error(LK_EINVAL, OP ": rotary_dim: expected an even value in [2, D = %lld] (0 means D), got %lld%s",
                        (long long)D, (long long)R, a->rotary_dim ? "" : " (D)");
    ci->d = lk_rope_dims_of(a);
    ci->vt = impl->vtable;
    return LK_OK;
}

/* A tensor shaped and typed like `like`, with data, on the impl's device. */
static lk_status check_like(const lk_impl *impl, const char *arg, const lk_tensor *t, const lk_tensor *like) {
    return lk_expect_tensor_like(OP, impl->device, arg, t, like, 1);
}

static lk_status check_table(const lk_impl *impl, const char *arg, const lk_tensor *t, int64_t half) {
    lk_status s;
    if ((s = lk_expect_operand(OP, impl->device, arg, t, 1, 2)) || (s = lk_expect_dtype_eq(OP, arg, t, LK_F32)))
        return s;
    if (t->ndim != 2 || t->shape[0] < 1 || t->shape[1] != half) {
        char b[96];
        return lk_error(LK_ESHAPE, OP ": %s: expected [max_pos >= 1, rotary_dim/2 = %lld] (lk_rope_tables), got %s",
                        arg, (long long)half, lk_shape_str(t, b, sizeof b));
    }
    return LK_OK;
}

/* Every position id in [0, max_pos), read before anything is written. */
static lk_status check_positions(const lk_impl *impl, const lk_tensor *ids, const lk_rope_dims *d, int64_t max_pos) {
    if (ids->data == NULL) {
        if (d->seq > max_pos)
            return lk_error(LK_EINVAL, OP ": position_ids: absent means 0..S-1 = %lld, expected < max_pos = %lld "
                            "(the tables' rows)", (long long)(d->seq - 1), (long long)max_pos);
        return LK_OK;
    }
    lk_status s;
    int64_t shape[2] = {d->batch, d->seq};
    if ((s = lk_expect_operand(OP, impl->device, "position_ids", ids, 0, 2)) ||
        (s = lk_expect_dtype(OP, "position_ids", ids, LK_DTYPE_BIT(LK_I32) | LK_DTYPE_BIT(LK_I64))) ||
        (s = lk_expect_shape(OP, "position_ids", ids, 2, shape)))
        return s;
    /* On the GPU the ids are device memory the host does not read: the CUDA kernels check
     * each one and write NaN over a token whose id lies outside the tables (never reading
     * outside them), so a bad id cannot pass for a valid result. */
    if (impl->device != LK_DEVICE_CPU) return LK_OK;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t t = 0; t < d->seq; t++) {
            int64_t p = lk_rope_pos(ids, b, t, d->seq);
            if (p < 0 || p >= max_pos)
                return lk_error(LK_EINVAL, OP ": position_ids: expected values in [0, max_pos = %lld), got %lld "
                                "at [%lld, %lld]", (long long)max_pos, (long long)p, (long long)b, (long long)t);
        }
    return LK_OK;
}

/* What both passes check: impl, args, ctx, q/k dims, tables, positions, saved. */
static lk_status check_common(const lk_impl *impl, const lk_rope_args *a, const lk_ctx *ctx, call_info *ci) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_ROPE);
    if (s || (s = lk_expect_call(OP, impl, a, ctx))) return s;
    if ((s = check_dims(impl, a, ci))) return s;
    int64_t half = ci->d.rotary_dim / 2;
    if ((s = check_table(impl, "cos", &a->cos, half)) || (s = check_table(impl, "sin", &a->sin, half)))
        return s;
    if (a->sin.shape[0] != a->cos.shape[0])
        return lk_error(LK_ESHAPE, OP ": sin: expected %lld rows like cos, got %lld", (long long)a->cos.shape[0],
                        (long long)a->sin.shape[0]);
    if ((s = check_positions(impl, &a->position_ids, &ci->d, a->cos.shape[0]))) return s;
    return lk_expect_saved(OP, "lk_rope_saved_bytes", &a->saved, ci->vt->saved_bytes(&ci->d));
}

/* Output out may be exactly `self` (in place) or apart from it, and is apart from every
 * other region the call touches. */
static lk_status expect_out(lk_region out, lk_region self, const lk_region *others, int n_others) {
    if (out.p == self.p) self.p = NULL;
    lk_status s = lk_expect_apart(OP, &out, 1, &self, 1);
    return s ? s : lk_expect_apart(OP, &out, 1, others, n_others);
}

/* The two outputs of a pass, each against its own input and everything else. */
static lk_status check_outputs(const lk_rope_args *a, const lk_tensor *in_q, const char *nq,
                               const lk_tensor *in_k, const char *nk, const lk_tensor *out_q,
                               const char *oq, const lk_tensor *out_k, const char *ok) {
    lk_region rq = lk_tensor_region(nq, in_q), rk = lk_tensor_region(nk, in_k);
    lk_region roq = lk_tensor_region(oq, out_q), rok = lk_tensor_region(ok, out_k);
    lk_region common[] = {lk_tensor_region("cos", &a->cos), lk_tensor_region("sin", &a->sin),
                          lk_tensor_region("position_ids", &a->position_ids), {"saved", a->saved.data, a->saved.bytes}};
    lk_region for_q[] = {rk, rok, common[0], common[1], common[2], common[3]};
    lk_region for_k[] = {rq, roq, common[0], common[1], common[2], common[3]};
    lk_status s;
    if ((s = expect_out(roq, rq, for_q, 6)) || (s = expect_out(rok, rk, for_k, 6))) return s;
    return LK_OK;
}

/* One pass in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const call_info *ci, int backward, const lk_rope_args *a, lk_ctx *ctx) {
    if (ci->d.batch * ci->d.seq == 0) return LK_OK;
    const lk_rope_vtable *vt = ci->vt;
    size_t mark, ws = vt->workspace_bytes ? vt->workspace_bytes(&ci->d, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? vt->backward(a, ctx) : vt->forward(a, ctx));
}

static lk_status query(const lk_impl *impl, const lk_rope_args *a, size_t *bytes, call_info *ci) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_ROPE);
    if (s) return s;
    if (a == NULL) return lk_error(LK_EINVAL, OP ": args: expected arguments, got NULL");
    if (bytes == NULL) return lk_error(LK_EINVAL, OP ": bytes: expected somewhere to write, got NULL");
    return check_dims(impl, a, ci);
}

lk_status lk_rope_saved_bytes(const lk_impl *impl, const lk_rope_args *a, size_t *bytes) {
    call_info ci;
    lk_status s = query(impl, a, bytes, &ci);
    if (s) return s;
    *bytes = ci.vt->saved_bytes(&ci.d);
    return LK_OK;
}

lk_status lk_rope_workspace_bytes(const lk_impl *impl, const lk_rope_args *a, int backward, size_t *bytes) {
    call_info ci;
    lk_status s = query(impl, a, bytes, &ci);
    if (s) return s;
    *bytes = ci.vt->workspace_bytes ? ci.vt->workspace_bytes(&ci.d, backward) : 0;
    return LK_OK;
}

lk_status lk_rope_forward(const lk_impl *impl, const lk_rope_args *a, lk_ctx *ctx) {
    call_info ci;
    lk_status s = check_common(impl, a, ctx, &ci);
    if (s || (s = lk_expect_present(OP, "q", &a->q)) || (s = lk_expect_present(OP, "k", &a->k)) ||
        (s = check_like(impl, "q_out", &a->q_out, &a->q)) || (s = check_like(impl, "k_out", &a->k_out, &a->k)) ||
        (s = check_outputs(a, &a->q, "q", &a->k, "k", &a->q_out, "q_out", &a->k_out, "k_out")))
        return s;
    return run(&ci, 0, a, ctx);
}

/* q and k give the shapes; their data is not read and may be NULL. */
lk_status lk_rope_backward(const lk_impl *impl, const lk_rope_args *a, lk_ctx *ctx) {
    call_info ci;
    lk_status s = check_common(impl, a, ctx, &ci);
    if (s || (s = check_like(impl, "dq_out", &a->dq_out, &a->q)) ||
        (s = check_like(impl, "dk_out", &a->dk_out, &a->k)) || (s = check_like(impl, "dq", &a->dq, &a->q)) ||
        (s = check_like(impl, "dk", &a->dk, &a->k)) ||
        (s = check_outputs(a, &a->dq_out, "dq_out", &a->dk_out, "dk_out", &a->dq, "dq", &a->dk, "dk")))
        return s;
    return run(&ci, 1, a, ctx);
}
