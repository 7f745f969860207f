/* chunk_loss.c — `chunk_loss` cross-entropy: the loss split along the tokens. The
 * forward projects one chunk of tokens at a time (chunk from the chunk_bytes budget),
 * and keeps only the log-sum-exp of each scored token [K] f32. The backward recomputes
 * each chunk's logits, turns them into dlogits in place at the token weights of d_loss,
 * and runs the two gradient GEMMs on the chunk: dh rows straight into d_hidden, dW
 * accumulated in f32 (d_weight itself, or an f32 temporary for a bf16 d_weight).
 * Cost: one LM-head GEMM more than fused; memory: one chunk of logits, never [T, V]. */
#include "common.h"

typedef struct {
    lk_arena *arena;
    lk_status status;
} taker;

static void *take(taker *tk, size_t bytes) { return ce_take(tk->arena, bytes, &tk->status); }

size_t lk_ce_chunked_saved_bytes(const lk_cross_entropy_dims *d) {
    return CE_HEAD_BYTES + lk_arena_piece((size_t)d->kept * sizeof(float));
}

/* Mirrors the take() calls below, in order. */
size_t lk_ce_chunked_workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    size_t f = sizeof(float), C = (size_t)d->chunk, V = (size_t)d->vocab, H = (size_t)d->hidden;
    size_t w = d->dtype == LK_F32 ? 0 : lk_arena_piece(V * H * f);
    size_t per_tok = lk_arena_piece((size_t)d->kept * f);
    size_t chunk = lk_arena_piece(C * V * f) + lk_arena_piece(C * H * f) + ce_xpack_bytes((int64_t)C, (int64_t)H);
    if (!backward) return w + 2 * per_tok + chunk;
    size_t dw = d->dweight_dtype == LK_F32 ? 0 : lk_arena_piece(V * H * f);
    return w + per_tok + chunk + lk_arena_piece(C * H * f) + dw;
}

lk_status lk_ce_chunked_forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    ce_plan p;
    ce_plan_make(a, d, &p);
    taker tk = {ctx->arena, LK_OK};
    float *wbuf = p.dt == LK_F32 ? NULL : take(&tk, (size_t)(p.V * p.H) * sizeof(float));
    float *loss = take(&tk, (size_t)p.K * sizeof(float)), *zl = take(&tk, (size_t)p.K * sizeof(float));
    float *logits = take(&tk, (size_t)(p.C * p.V) * sizeof(float)), *rbuf = take(&tk, (size_t)(p.C * p.H) * sizeof(float));
    ce_take_xpack(&p, tk.arena, &tk.status);
    if (tk.status) return tk.status;
    float *lse = (float *)((char *)a->saved.data + CE_HEAD_BYTES);
    const float *w = ce_weight_f32(&p, wbuf);
    lk_status s = LK_OK;
    for (int64_t k0 = 0; k0 < p.K && !s; k0 += p.C) {
        int64_t n = p.K - k0 < p.C ? p.K - k0 : p.C;
        if ((s = ce_gemm_logits(&p, ce_rows(&p, k0, n, rbuf), w, n, logits))) break;
        ce_chunk_forward(&p, logits, k0, n, loss, zl, lse, NULL);
    }
    if (s) return s;
    ce_saved_head *head = a->saved.data;
    head->n_valid = ce_count_valid(&p);
    ce_write_outputs(&p, loss, zl, head->n_valid);
    return LK_OK;
}

lk_status lk_ce_chunked_backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    ce_plan p;
    ce_plan_make(a, d, &p);
    taker tk = {ctx->arena, LK_OK};
    size_t f = sizeof(float);
    float *wbuf = p.dt == LK_F32 ? NULL : take(&tk, (size_t)(p.V * p.H) * f);
    float *g = take(&tk, (size_t)p.K * f);
    float *logits = take(&tk, (size_t)(p.C * p.V) * f), *rbuf = take(&tk, (size_t)(p.C * p.H) * f);
    ce_take_xpack(&p, tk.arena, &tk.status);
    float *dh = take(&tk, (size_t)(p.C * p.H) * f);
    float *dw = a->d_weight.dtype == LK_F32 ? a->d_weight.data : take(&tk, (size_t)(p.V * p.H) * f);
    if (tk.status) return tk.status;
    const ce_saved_head *head = a->saved.data;
    const float *lse = (const float *)((const char *)a->saved.data + CE_HEAD_BYTES);
    const float *w = ce_weight_f32(&p, wbuf);
    ce_token_weights(&p, head->n_valid, 0, g);
    ce_dh_zero_unkept(&p);
    float beta = a->d_weight.dtype == LK_F32 ? 1.0f : 0.0f;   /* the temporary starts from 0 */
    lk_status s = LK_OK;
    if (beta == 0.0f && p.K == 0) return LK_OK;
    for (int64_t k0 = 0; k0 < p.K && !s; k0 += p.C) {
        int64_t n = p.K - k0 < p.C ? p.K - k0 : p.C;
        const float *rows = ce_rows(&p, k0, n, rbuf);
        if ((s = ce_gemm_logits(&p, rows, w, n, logits))) break;
        ce_chunk_backward(&p, logits, k0, n, lse, g);
        if ((s = ce_gemm_dh(&p, logits, w, n, dh)) || (s = ce_gemm_dw(&p, logits, rows, n, beta, dw))) break;
        ce_dh_store(&p, dh, k0, n, 1.0f);
        beta = 1.0f;
    }
    if (!s && dw != a->d_weight.data) ce_dw_add(&p, dw, 1.0f);
    return s;
}

static size_t saved_bytes(const lk_cross_entropy_dims *d) { return lk_ce_chunked_saved_bytes(d); }
static size_t workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    return lk_ce_chunked_workspace_bytes(d, backward);
}

const lk_cross_entropy_vtable lk_cross_entropy_chunk_loss_vtable = {
    .version = LK_CROSS_ENTROPY_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = lk_ce_chunked_forward,
    .backward = lk_ce_chunked_backward,
};
