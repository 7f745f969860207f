/* attention.c — the attention facade (include/llmkern/attention.h). Every registry row
 * of the op points at an lk_attention_entry naming its adapter; the facade checks
 * every argument before anything is written, then resolves the adapter through the
 * private dispatch table below (never the public registry: no recursion, and each
 * adapter is testable alone), reserves its workspace and runs it. The table's entries
 * are slots a test may swap (lk_attention_set_backend).
 *
 * A row on a GPU names the CUDA backend it runs in its entry (fa2.cu, fa3.cu,
 * sdpa_cudnn.cpp) and keeps its adapter's rules and checks: cu_seqlens and a dense mask
 * stay host memory (read here and to plan), every other tensor is the row's device memory.
 *
 * The SP-aware rows (llmkern_*_with_sp) enter the same adapters through sp_run: with
 * no communicator, a group of one or skip_ulysses it is the identity; otherwise the
 * Ulysses exchange (ulysses.c) surrounds the adapter, and masks and cu_seqlens are
 * checked against the full sequence the adapter sees. */
#include <math.h>
#include "ops/validate.h"
#include "ops/attention/ulysses.h"

#define OP "attention"

static const lk_attention_vtable *const defaults[LK_ATTN_ADAPTER_COUNT] = {
    [LK_ATTN_EAGER] = &lk_attention_eager_backend,
    [LK_ATTN_FLASH] = &lk_attention_flash_backend,
    [LK_ATTN_FLEX] = &lk_attention_flex_backend,
};
static const lk_attention_vtable *slots[LK_ATTN_ADAPTER_COUNT] = {
    [LK_ATTN_EAGER] = &lk_attention_eager_backend,
    [LK_ATTN_FLASH] = &lk_attention_flash_backend,
    [LK_ATTN_FLEX] = &lk_attention_flex_backend,
};
static const char *const adapter_names[LK_ATTN_ADAPTER_COUNT] = {"eager", "flash", "flex"};

const lk_attention_vtable *lk_attention_set_backend(lk_attn_adapter adapter, const lk_attention_vtable *vt) {
    if ((unsigned)adapter >= LK_ATTN_ADAPTER_COUNT) return NULL;
    const lk_attention_vtable *prev = slots[adapter];
    slots[adapter] = vt ? vt : defaults[adapter];
    return prev;
}

typedef struct {
    const lk_attention_entry *entry;
    const lk_attention_vtable *vt;
    lk_attn_dims d;     /* the caller's tensors */
    lk_ulysses u;       /* u.in: what the adapter sees (= d without the exchange) */
} call;

static lk_status resolve(const lk_impl *impl, call *c) {
    lk_status s = lk_impl_check(OP, impl, LK_OP_ATTENTION);
    if (s) return s;
    c->entry = impl->vtable;
    if ((unsigned)c->entry->adapter >= LK_ATTN_ADAPTER_COUNT)
        return lk_error(LK_EINVAL, OP ": impl: expected an adapter of eager, flash or flex in '%s', got %d",
                        impl->name, (int)c->entry->adapter);
    c->vt = impl->device != LK_DEVICE_CUDA ? slots[c->entry->adapter] : c->entry->version >= 2 ? c->entry->cuda : NULL;
    if (!c->vt)
        return lk_error(LK_EUNAVAILABLE, OP ": impl: the %s adapter has no %s backend ('%s')",
                        adapter_names[c->entry->adapter], lk_device_name(impl->device), impl->name);
    if (c->vt->version < 1 || !c->vt->saved_bytes || !c->vt->forward || !c->vt->backward)
        return lk_error(LK_EINVAL, OP ": impl: the %s adapter's backend lacks saved_bytes, forward or backward",
                        adapter_names[c->entry->adapter]);
    return LK_OK;
}

static lk_status check_qkv(const lk_impl *impl, const lk_attention_args *a, int need_data, call *c) {
    static const char *const names[3] = {"q", "k", "v"};
    const lk_tensor *t[3] = {&a->q, &a->k, &a->v};
    lk_status s;
    for (int i = 0; i < 3; i++) {
        if ((s = lk_expect_view(OP, impl->device, names[i], t[i], need_data, 4)) ||
            (s = lk_expect_dtype(OP, names[i], t[i], impl->needs.dtypes)))
            return s;
        if (t[i]->ndim != 4)
            return lk_error(LK_ESHAPE, OP ": %s: expected rank 4 [B, H, S, D], got rank %d", names[i], t[i]->ndim);
        if (i && (s = lk_expect_dtype_eq(OP, names[i], t[i], a->q.dtype))) return s;
    }
    const int64_t *q = a->q.shape, *k = a->k.shape;
    if (q[0] < 1 || q[1] < 1 || q[2] < 1 || q[3] < 1 || k[1] < 1 || k[2] < 1)
        return lk_error(LK_ESHAPE, OP ": q: expected every dim of q and k >= 1, got q [%lld, %lld, %lld, %lld]",
                        (long long)q[0], (long long)q[1], (long long)q[2], (long long)q[3]);
    if (k[0] != q[0] || k[3] != q[3])
        return lk_error(LK_ESHAPE, OP ": k: expected [B=%lld, H_kv, S_kv, D=%lld], got [%lld, %lld, %lld, %lld]",
                        (long long)q[0], (long long)q[3], (long long)k[0], (long long)k[1], (long long)k[2],
                        (long long)k[3]);
    if (q[1] % k[1] != 0)
        return lk_error(LK_ESHAPE, OP ": k: expected H_kv dividing H_q = %lld, got H_kv = %lld", (long long)q[1],
                        (long long)k[1]);
    if ((s = lk_expect_shape(OP, "v", &a->v, 4, k))) return s;
    c->d = lk_attn_dims_of(a);
    return LK_OK;
}

/* cu_seqlens: i32 [n + 1], 0 first, non-decreasing, ending at len; the longest document
 * is returned. */
static lk_status check_cu(const char *arg, const lk_tensor *t, int64_t n, int64_t len, int64_t *longest) {
    lk_status s;
    if ((s = lk_expect_operand(OP, LK_DEVICE_CPU, arg, t, 1, 1)) || (s = lk_expect_dtype_eq(OP, arg, t, LK_I32)))
        return s;
    if (t->ndim != 1 || t->shape[0] < 2 || (n && t->shape[0] != n))
        return lk_error(LK_ESHAPE, OP ": %s: expected a 1-D tensor of %s entries, got %lld", arg,
                        n ? "the same number of" : ">= 2", (long long)t->shape[0]);
    const int32_t *c = t->data;
    if (c[0] != 0) return lk_error(LK_EINVAL, OP ": %s: expected 0 first, got %d", arg, c[0]);
    *longest = 0;
    for (int64_t i = 1; i < t->shape[0]; i++) {
        if (c[i] < c[i - 1])
            return lk_error(LK_EINVAL, OP ": %s: expected non-decreasing offsets, got %d after %d at %lld", arg,
                            c[i], c[i - 1], (long long)i);
        if (c[i] - c[i - 1] > *longest) *longest = c[i] - c[i - 1];
    }
    if (c[t->shape[0] - 1] != len)
        return lk_error(LK_EINVAL, OP ": %s: expected the last offset to be the total length %lld, got %d", arg,
                        (long long)len, c[t->shape[0] - 1]);
    return LK_OK;
}

static lk_status check_varlen(const lk_attention_args *a, const call *c) {
    int hq = a->cu_seqlens_q.data != NULL, hk = a->cu_seqlens_k.data != NULL;
    if (!hq && !hk) return LK_OK;
    if (c->entry->adapter == LK_ATTN_FLEX)
        return lk_error(LK_EINVAL, OP ": cu_seqlens_q: expected none for flex_attention (documents belong in "
                        "the BlockMask), got varlen metadata");
    if (hq != hk)
        return lk_error(LK_EINVAL, OP ": %s: expected cu_seqlens_q and cu_seqlens_k together, got only one",
                        hq ? "cu_seqlens_k" : "cu_seqlens_q");
    if (c->d.B != 1)
        return lk_error(LK_ESHAPE, OP ": cu_seqlens_q: expected B = 1 (documents packed along S), got B = %lld",
                        (long long)c->d.B);
    int64_t lq, lk;
    lk_status s;
    if ((s = check_cu("cu_seqlens_q", &a->cu_seqlens_q, 0, c->u.in.Sq, &lq)) ||
        (s = check_cu("cu_seqlens_k", &a->cu_seqlens_k, a->cu_seqlens_q.shape[0], c->u.in.Skv, &lk)))
        return s;
    if (a->max_seqlen_q < lq || a->max_seqlen_k < lk)
        return lk_error(LK_EINVAL, OP ": %s: expected >= the longest document, %lld, got %lld",
                        a->max_seqlen_q < lq ? "max_seqlen_q" : "max_seqlen_k", (long long)(a->max_seqlen_q < lq ? lq : lk),
                        (long long)(a->max_seqlen_q < lq ? a->max_seqlen_q : a->max_seqlen_k));
    return LK_OK;
}

static lk_status check_block_mask(const lk_block_mask *m, const call *c) {
    const lk_attn_dims *d = &c->u.in;
    if (m->mask_mod == NULL || !m->kv_num_blocks || !m->kv_indices || !m->q_num_blocks || !m->q_indices ||
        (!m->full_kv_num_blocks != !m->full_kv_indices) || (!m->full_q_num_blocks != !m->full_q_indices))
        return lk_error(LK_EINVAL, OP ": block_mask: expected mask_mod and the kv/q block lists, got NULL members");
    if ((m->B != 1 && m->B != d->B) || (m->H != 1 && m->H != d->Hq) || m->Q_LEN != d->Sq || m->KV_LEN != d->Skv)
        return lk_error(LK_ESHAPE, OP ": block_mask: expected [1 or %lld, 1 or %lld, %lld, %lld], got [%lld, %lld, "
                        "%lld, %lld]", (long long)d->B, (long long)d->Hq, (long long)d->Sq, (long long)d->Skv,
                        (long long)m->B, (long long)m->H, (long long)m->Q_LEN, (long long)m->KV_LEN);
    if (m->Q_BLOCK_SIZE < 1 || m->KV_BLOCK_SIZE < 1 ||
        m->num_q_blocks != (m->Q_LEN + m->Q_BLOCK_SIZE - 1) / m->Q_BLOCK_SIZE ||
        m->num_kv_blocks != (m->KV_LEN + m->KV_BLOCK_SIZE - 1) / m->KV_BLOCK_SIZE)
        return lk_error(LK_EINVAL, OP ": block_mask: expected block sizes >= 1 and ceil(len / block) blocks, got "
                        "%lldx%lld blocks of %lldx%lld", (long long)m->num_q_blocks, (long long)m->num_kv_blocks,
                        (long long)m->Q_BLOCK_SIZE, (long long)m->KV_BLOCK_SIZE);
    /* counts and indices in range, so the kernels can trust them */
    for (int pass = 0; pass < 4; pass++) {
        const int32_t *num = pass == 0 ? m->kv_num_blocks : pass == 1 ? m->full_kv_num_blocks
                           : pass == 2 ? m->q_num_blocks : m->full_q_num_blocks;
        const int32_t *ind = pass == 0 ? m->kv_indices : pass == 1 ? m->full_kv_indices
                           : pass == 2 ? m->q_indices : m->full_q_indices;
        int64_t rows = m->B * m->H * (pass < 2 ? m->num_q_blocks : m->num_kv_blocks);
        int64_t width = pass < 2 ? m->num_kv_blocks : m->num_q_blocks;
        for (int64_t r = 0; num && r < rows; r++) {
            if (num[r] < 0 || num[r] > width)
                return lk_error(LK_EINVAL, OP ": block_mask: expected block counts in [0, %lld], got %d",
                                (long long)width, num[r]);
            for (int32_t i = 0; i < num[r]; i++)
                if (ind[r * width + i] < 0 || ind[r * width + i] >= width)
                    return lk_error(LK_EINVAL, OP ": block_mask: expected block indices in [0, %lld), got %d",
                                    (long long)width, ind[r * width + i]);
        }
    }
    return LK_OK;
}

static lk_status check_masks(const lk_attention_args *a, const call *c) {
    lk_attn_adapter ad = c->entry->adapter;
    lk_status s;
    if (ad == LK_ATTN_FLEX && a->block_mask == NULL)
        return lk_error(LK_EINVAL, OP ": block_mask: expected a BlockMask for flex_attention, got NULL");
    if (ad == LK_ATTN_FLASH && a->block_mask)
        return lk_error(LK_EINVAL, OP ": block_mask: expected NULL for the flash adapter (use flex_attention), got "
                        "a BlockMask");
    if (ad == LK_ATTN_FLASH && a->score_mod.fn)
        return lk_error(LK_EINVAL, OP ": score_mod: expected none for the flash adapter (use flex_attention or "
                        "softcap), got a function");
    if (a->block_mask && (s = check_block_mask(a->block_mask, c))) return s;
    if (!a->mask.data) return LK_OK;
    if (ad != LK_ATTN_EAGER)
        return lk_error(LK_EINVAL, OP ": mask: expected no dense mask for the %s adapter (eager takes one; "
                        "padding becomes cu_seqlens via lk_attention_varlen_from_padding), got one",
                        adapter_names[ad]);
    const lk_tensor *m = &a->mask;
    if ((s = lk_expect_operand(OP, LK_DEVICE_CPU, "mask", m, 0, 4)) ||
        (s = lk_expect_dtype(OP, "mask", m, LK_DTYPE_BIT(LK_BOOL) | LK_DTYPE_BIT(LK_F32))))
        return s;
    const lk_attn_dims *d = &c->u.in;
    if (m->ndim != 4 || (m->shape[0] != 1 && m->shape[0] != d->B) || (m->shape[1] != 1 && m->shape[1] != d->Hq) ||
        m->shape[2] != d->Sq || m->shape[3] != d->Skv)
        return lk_error(LK_ESHAPE, OP ": mask: expected [1 or %lld, 1 or %lld, %lld, %lld]", (long long)d->B,
                        (long long)d->Hq, (long long)d->Sq, (long long)d->Skv);
    return LK_OK;
}

static lk_status check_vec(const lk_impl *impl, const char *arg, const lk_tensor *t, int64_t n) {
    lk_status s;
    if ((s = lk_expect_operand(OP, impl->device, arg, t, 0, 1)) || (s = lk_expect_dtype_eq(OP, arg, t, LK_F32)) ||
        (s = lk_expect_shape(OP, arg, t, 1, &n)))
        return s;
    return LK_OK;
}

/* Everything both passes read: impl, ctx, q/k/v, options, masks, varlen, sinks, saved. */
static lk_status check_common(const lk_impl *impl, const lk_attention_args *a, const lk_ctx *ctx, call *c) {
    lk_status s = resolve(impl, c);
    if (s) return s;
    if ((s = lk_expect_call(OP, impl, a, ctx))) return s;
    if ((s = check_qkv(impl, a, 1, c))) return s;
    if (!isfinite(a->scale))
        return lk_error(LK_EINVAL, OP ": scale: expected a finite value (0 = 1/sqrt(D)), got %g", (double)a->scale);
    if (!(a->softcap >= 0.0f) || !isfinite(a->softcap))
        return lk_error(LK_EINVAL, OP ": softcap: expected a finite value >= 0, got %g", (double)a->softcap);
    if (a->causal != 0 && a->causal != 1)
        return lk_error(LK_EINVAL, OP ": causal: expected 0 or 1, got %d", a->causal);
    if (a->window_left < 0 || a->window_right < 0)
        return lk_error(LK_EINVAL, OP ": %s: expected >= 0 (0 = unbounded), got %lld",
                        a->window_left < 0 ? "window_left" : "window_right",
                        (long long)(a->window_left < 0 ? a->window_left : a->window_right));
    if (a->skip_ulysses != 0 && a->skip_ulysses != 1)
        return lk_error(LK_EINVAL, OP ": skip_ulysses: expected 0 or 1, got %d", a->skip_ulysses);
    if (a->deterministic != 0 && a->deterministic != 1)
        return lk_error(LK_EINVAL, OP ": deterministic: expected 0 or 1, got %d", a->deterministic);
    if ((s = lk_ulysses_plan(a, c->entry->sp ? ctx->comm : NULL, impl->device, &c->d, &c->u))) return s;
    if ((s = check_varlen(a, c)) || (s = check_masks(a, c))) return s;
    if (a->s_aux.data && (s = check_vec(impl, "s_aux", &a->s_aux, c->d.Hq))) return s;
    return lk_expect_saved(OP, "lk_attention_saved_bytes", &a->saved, c->vt->saved_bytes(a));
}

/* The backend's own limits (an option it does not take), after every generic check. */
static lk_status check_supported(const call *c, const lk_attention_args *a, int backward) {
    return c->vt->version >= 2 && c->vt->supports ? c->vt->supports(a, backward) : LK_OK;
}

static lk_status check_out(const lk_impl *impl, const char *arg, const lk_tensor *t, const lk_attention_args *a,
                           const call *c) {
    int64_t shape[4] = {c->d.B, c->d.Sq, c->d.Hq, c->d.D};
    lk_status s;
    if ((s = lk_expect_operand(OP, impl->device, arg, t, 1, 4)) || (s = lk_expect_shape(OP, arg, t, 4, shape)))
        return s;
    return lk_expect_dtype_eq(OP, arg, t, a->q.dtype);
}

static lk_status check_like(const lk_impl *impl, const char *arg, const lk_tensor *t, const lk_tensor *like) {
    lk_status s = lk_expect_view(OP, impl->device, arg, t, 1, 4);
    return s ? s : lk_expect_like(OP, arg, t, like);
}

static int pass_takes_views(const call *c, const lk_attention_args *a, int backward) {
    return c->vt->version >= 3 && c->vt->takes_views && c->vt->takes_views(a, backward);
}

/* Strided views only where the pass reads and writes them, and not into the Ulysses
 * exchange (which packs contiguous heads). */
static lk_status check_views(const lk_impl *impl, const call *c, const lk_attention_args *a, int backward) {
    static const char *const names[6] = {"q", "k", "v", "dq", "dk", "dv"};
    const lk_tensor *t[6] = {&a->q, &a->k, &a->v, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < (backward ? 6 : 3); i++) {
        if (lk_tensor_is_contiguous(t[i])) continue;
        if (c->u.comm)
            return lk_error(LK_ESHAPE, OP ": %s: expected a contiguous tensor under Ulysses (the exchange packs "
                            "whole heads), got a strided view", names[i]);
        if (!pass_takes_views(c, a, backward))
            return lk_error(LK_ESHAPE, OP ": %s: '%s' takes contiguous tensors for these arguments, got a strided "
                            "view (lk_attention_takes_views says where views go: flash_attention_3 and "
                            "flex_attention on a Hopper, bf16, D <= 128)", names[i], impl->name);
    }
    return LK_OK;
}

int lk_attention_takes_views(const lk_impl *impl, const lk_attention_args *a) {
    call c;
    if (!a || resolve(impl, &c) || check_qkv(impl, a, 0, &c)) return 0;   /* data may be NULL: asked before it exists */
    lk_attention_args b = *a;   /* the gradients the caller has not set yet stand as their inputs */
    if (!b.dq.data) b.dq = b.q;
    if (!b.dk.data) b.dk = b.k;
    if (!b.dv.data) b.dv = b.v;
    return pass_takes_views(&c, &b, 0) && pass_takes_views(&c, &b, 1);
}

/* One pass of the adapter in its workspace, reserved in ctx->arena and given back after it. */
static lk_status run(const call *c, int backward, const lk_attention_args *a, lk_ctx *ctx) {
    size_t mark, ws = c->vt->workspace_bytes ? c->vt->workspace_bytes(a, backward) : 0;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, ws, &mark);
    return s ? s : lk_workspace_done(ctx, mark, backward ? c->vt->backward(a, ctx) : c->vt->forward(a, ctx));
}

/* The SP path: the Ulysses exchange around the adapter, or the identity when the plan
 * has no group to exchange over. */
static lk_status sp_run(call *c, int backward, const lk_attention_args *a, lk_ctx *ctx) {
    if (c->u.comm == NULL) return run(c, backward, a, ctx);
    size_t mark;
    lk_status s = lk_ctx_workspace_begin(ctx, OP, lk_ulysses_workspace(&c->u, c->vt, a, backward), &mark);
    return s ? s : lk_workspace_done(ctx, mark, lk_ulysses_run(&c->u, c->vt, backward, a, ctx));
}

lk_status lk_attention_saved_bytes(const lk_impl *impl, const lk_attention_args *a, size_t *bytes) {
    call c;
    lk_status s = resolve(impl, &c);
    if (s) return s;
    if (a == NULL || bytes == NULL)
        return lk_error(LK_EINVAL, OP ": %s: expected a pointer, got NULL", a ? "bytes" : "args");
    if ((s = check_qkv(impl, a, 0, &c))) return s;
    *bytes = c.vt->saved_bytes(a);
    return LK_OK;
}

lk_status lk_attention_forward(const lk_impl *impl, const lk_attention_args *a, lk_ctx *ctx) {
    call c;
    lk_status s = check_common(impl, a, ctx, &c);
    if (s || (s = check_out(impl, "out", &a->out, a, &c))) return s;
    lk_region outs[2] = {LK_ARG_REGION(a, out), LK_SAVED_REGION(a)};
    lk_region ins[7] = {LK_ARG_REGION(a, q), LK_ARG_REGION(a, k), LK_ARG_REGION(a, v), LK_ARG_REGION(a, s_aux),
                        LK_ARG_REGION(a, mask), LK_ARG_REGION(a, cu_seqlens_q), LK_ARG_REGION(a, cu_seqlens_k)};
    if ((s = lk_expect_apart(OP, outs, 2, ins, 7)) || (s = check_supported(&c, a, 0)) ||
        (s = check_views(impl, &c, a, 0)))
        return s;
    return c.entry->sp ? sp_run(&c, 0, a, ctx) : run(&c, 0, a, ctx);
}

lk_status lk_attention_backward(const lk_impl *impl, const lk_attention_args *a, lk_ctx *ctx) {
    call c;
    lk_status s = check_common(impl, a, ctx, &c);
    if (s || (s = check_out(impl, "out", &a->out, a, &c)) || (s = check_out(impl, "dout", &a->dout, a, &c)) ||
        (s = check_like(impl, "dq", &a->dq, &a->q)) || (s = check_like(impl, "dk", &a->dk, &a->k)) ||
        (s = check_like(impl, "dv", &a->dv, &a->v)))
        return s;
    if (a->ds_aux.data) {
        if (!a->s_aux.data)
            return lk_error(LK_EINVAL, OP ": ds_aux: expected s_aux beside it, got ds_aux without sinks");
        if ((s = check_vec(impl, "ds_aux", &a->ds_aux, c.d.Hq))) return s;
    }
    lk_region outs[4] = {LK_ARG_REGION(a, dq), LK_ARG_REGION(a, dk), LK_ARG_REGION(a, dv), LK_ARG_REGION(a, ds_aux)};
    lk_region ins[10] = {LK_ARG_REGION(a, q), LK_ARG_REGION(a, k), LK_ARG_REGION(a, v), LK_ARG_REGION(a, out),
                         LK_ARG_REGION(a, dout), LK_ARG_REGION(a, s_aux), LK_ARG_REGION(a, mask), LK_SAVED_REGION(a),
                         LK_ARG_REGION(a, cu_seqlens_q), LK_ARG_REGION(a, cu_seqlens_k)};
    if ((s = lk_expect_apart(OP, outs, 4, ins, 10)) || (s = check_supported(&c, a, 1)) ||
        (s = check_views(impl, &c, a, 1)))
        return s;
    return c.entry->sp ? sp_run(&c, 1, a, ctx) : run(&c, 1, a, ctx);
}
