/* fused.c — `fused` cross-entropy: the LM head and the loss together, chunk by chunk,
 * so the [T, V] logits never exist (Liger-Kernel's fused linear cross-entropy on the
 * CPU). For each chunk of tokens: the logits chunk by one GEMM, then per row (OpenMP)
 * softcap, softmax, loss, z-loss and the dlogits in place, at d_loss = 1; then the two
 * gradient GEMMs of the chunk, dh rows into the saved block and dW accumulated in the
 * saved f32 [V, H]. All of it happens in the FORWARD; the backward only scales by the
 * scalar d_loss: d_hidden = d_loss·dh, d_weight += d_loss·dW. At chunks of up to 1024
 * tokens the logits and dh GEMMs read W where it lies (lk_gemm_wide) instead of BLAS
 * packing all of W twice a chunk.
 *
 * Reduction none is the exception: per-token d_loss weighs each token's dlogits before
 * they are summed into dW, so gradients made at d_loss = 1 cannot be rescaled into the
 * right dW. There the forward keeps only the log-sum-exp and the backward recomputes
 * each chunk (chunk_loss.c's loop): correct for any d_loss, one GEMM dearer. */
#include "common.h"

#include <string.h>

static int liger(const lk_cross_entropy_dims *d) { return d->reduction != LK_CE_NONE; }

/* Tokens per chunk: the fewest chunks the budget (d->chunk) allows, made equal. Every
 * chunk costs the GEMMs a fixed cost (reading and writing the f32 dW once; with BLAS,
 * packing W twice), so the count matters and a short last chunk buys nothing: 4096
 * tokens at a budget of 376 run as 11 chunks of 373. */
static int64_t chunk_rows(const lk_cross_entropy_dims *d) {
    int64_t n = (d->kept + d->chunk - 1) / d->chunk;
    return n > 1 ? (d->kept + n - 1) / n : d->chunk;
}

/* saved: head, dh [K, H] f32, dW [V, H] f32 */
static size_t saved_bytes(const lk_cross_entropy_dims *d) {
    if (!liger(d)) return lk_ce_chunked_saved_bytes(d);
    size_t f = sizeof(float);
    return CE_HEAD_BYTES + lk_arena_piece((size_t)(d->kept * d->hidden) * f) + (size_t)(d->vocab * d->hidden) * f;
}

/* Mirrors the ce_take calls of forward, in order; the backward needs none. */
static size_t workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    if (!liger(d)) return lk_ce_chunked_workspace_bytes(d, backward);
    if (backward) return 0;
    size_t f = sizeof(float), C = (size_t)chunk_rows(d), V = (size_t)d->vocab, H = (size_t)d->hidden;
    size_t w = d->dtype == LK_F32 ? 0 : lk_arena_piece(V * H * f);
    return w + 3 * lk_arena_piece((size_t)d->kept * f) + lk_arena_piece(C * V * f) + lk_arena_piece(C * H * f) +
           ce_xpack_bytes((int64_t)C, (int64_t)H);
}

static lk_status forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    if (!liger(d)) return lk_ce_chunked_forward(a, d, ctx);
    ce_plan p;
    ce_plan_make(a, d, &p);
    p.C = chunk_rows(d);
    size_t f = sizeof(float);
    lk_arena *ar = ctx->arena;
    lk_status s = LK_OK;
    float *wbuf = p.dt == LK_F32 ? NULL : ce_take(ar, (size_t)(p.V * p.H) * f, &s);
    float *loss = ce_take(ar, (size_t)p.K * f, &s), *zl = ce_take(ar, (size_t)p.K * f, &s);
    float *g = ce_take(ar, (size_t)p.K * f, &s);
    float *logits = ce_take(ar, (size_t)(p.C * p.V) * f, &s), *rbuf = ce_take(ar, (size_t)(p.C * p.H) * f, &s);
    ce_take_xpack(&p, ar, &s);
    if (s) return s;
    ce_saved_head *head = a->saved.data;
    float *dh = (float *)((char *)a->saved.data + CE_HEAD_BYTES);
    float *dw = (float *)((char *)dh + lk_arena_piece((size_t)(p.K * p.H) * f));

    head->n_valid = ce_count_valid(&p);
    ce_token_weights(&p, head->n_valid, 1, g);
    const float *w = ce_weight_f32(&p, wbuf);
    if (p.K == 0) memset(dw, 0, (size_t)(p.V * p.H) * f);
    for (int64_t k0 = 0; k0 < p.K && !s; k0 += p.C) {
        int64_t n = p.K - k0 < p.C ? p.K - k0 : p.C;
        const float *rows = ce_rows(&p, k0, n, rbuf);
        if ((s = ce_gemm_logits(&p, rows, w, n, logits))) break;
        ce_chunk_forward(&p, logits, k0, n, loss, zl, NULL, g);
        if ((s = ce_gemm_dh(&p, logits, w, n, dh + k0 * p.H)) ||
            (s = ce_gemm_dw(&p, logits, rows, n, k0 == 0 ? 0.0f : 1.0f, dw)))
            break;
    }
    if (s) return s;
    ce_write_outputs(&p, loss, zl, head->n_valid);
    return LK_OK;
}

static lk_status backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    if (!liger(d)) return lk_ce_chunked_backward(a, d, ctx);
    ce_plan p;
    ce_plan_make(a, d, &p);
    const float *dh = (const float *)((const char *)a->saved.data + CE_HEAD_BYTES);
    const float *dw = (const float *)((const char *)dh + lk_arena_piece((size_t)(p.K * p.H) * sizeof(float)));
    float dl = ((const float *)a->d_loss.data)[0];
    ce_dh_zero_unkept(&p);
    ce_dh_store(&p, dh, 0, p.K, dl);
    ce_dw_add(&p, dw, dl);
    return LK_OK;
}

const lk_cross_entropy_vtable lk_cross_entropy_fused_vtable = {
    .version = LK_CROSS_ENTROPY_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
