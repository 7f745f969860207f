/* fused_cuda.c — `fused` cross-entropy on CUDA: the LM head and the loss together, chunk
 * by chunk, as the CPU fused.c (same saved layout, same semantics). Per chunk of kept
 * tokens:
 *   logits [n, V] = rows · Wᵀ         cuBLASLt (cached plan), f32 accumulation
 *   ONE kernel (fused.cu, ce_rows)    softcap, online softmax, loss, z-loss, label
 *                                     smoothing, and the gradient over the logits in place
 *   dh [n, H] f32 = dlogits · W       cuBLASLt, into the saved block
 *   dW [V, H] f32 += dlogitsᵀ · rows  cuBLASLt, beta 1 after the first chunk (saved block)
 * all in the FORWARD at d_loss = 1; the backward scales (d_hidden = d_loss·dh,
 * d_weight += d_loss·dW). Reduction none recomputes each chunk in the backward with the
 * per-token d_loss, like the CPU (gradients made at 1 cannot be reweighted per token).
 *
 * Precision: bf16 storage keeps the logits chunk in bf16 (the GEMM rounds its f32 sum
 * once, as the op's default "rounded as a bf16 framework would" says) and the gradient
 * in bf16 over it, which the two gradient GEMMs need as tensor-core operands anyway; all
 * softmax math is f32. fp32_lm_head keeps f32 logits (a second [n, V] bf16 buffer takes
 * the gradient: on the GPU that gradient is still rounded to bf16 for the GEMMs, unlike
 * the CPU's f32 one). f32 storage is f32 throughout (exact f32 GEMMs, no TF32).
 *
 * Device memory (beyond the caller's tensors): saved = 64 B + dh K·H·4 + dW V·H·4;
 * workspace = cuBLASLt's + the chunk's logits C·V·(2 or 4) (+ its gradient for
 * fp32_lm_head, + gathered rows when logits_to_keep / keep_indices) + 2·K·4. The chunk C
 * comes from chunk_bytes (a budget in f32 logits, so bf16 logits use half of it): on the
 * GPU the default is LK_CE_DEFAULT_CHUNK_BYTES_CUDA (4 GiB: the three-GEMM path below).
 *
 * The LEAN path, chosen by the budget: when the f32 dW accumulator (V·H·4) does not fit
 * the budget (C·V·4, i.e. when C < H), nothing of size V·H is kept. Pass 1, in the
 * forward, over token chunks: logits GEMM, ce_rows (loss, lse saved, dlogits at d_loss =
 * 1) and the dh GEMM over full vocab rows (dh complete, f32 inside the GEMM). Pass 2, in
 * the backward, over vocab blocks of Vb columns (K·Vb <= C·V, so the same logits buffer):
 * the block's logits for ALL kept tokens again (GEMM), their gradient from the saved lse
 * with d_loss folded in (ce_block), and d_weight[block] += dlogitsᵀ·rows with K = every
 * kept token (f32 inside cuBLASLt, d_weight read and written once, rounded once when it
 * is bf16: the contract's one rounding per call). Four GEMMs instead of three, exact f32
 * accumulation, saved = 64 B + dh K·H·4 + lse K·4. Reduction none saves only the lse; its
 * backward runs pass 1 with the per-token d_loss (dh per chunk, scattered) and then pass
 * 2. The workspace is the chunk's as above (+ the kept rows gathered whole, K·H, when
 * fewer than T are kept, + a C·H·4 dh chunk for none).
 * Labels and keep_indices are device memory the facade does not read: a bad label or
 * index makes that token's loss and gradient NaN (never an out-of-range read). */
#include <cuda_runtime_api.h>
#include "core/cublaslt_util.h"
#include "core/cuda_check.h"
#include "ops/cross_entropy/cuda_ce.h"
#include "llmkern/cross_entropy.h"

#define HEAD 64   /* the saved block's head: n_valid (int64) on the device */

typedef struct {
    lk_ce_cuda_plan p;
    int64_t H, C;
    int64_t Vb;            /* lean path: vocab columns per block of pass 2; 0 = the accumulating path */
    lk_dtype dt, zt, gt;   /* storage, logits, logits gradient */
    int gather;            /* rows must be gathered (logits_to_keep / keep_indices) */
    size_t es;
} cplan;

static int liger(const lk_cross_entropy_dims *d) { return d->reduction != LK_CE_NONE; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The budget holds C tokens' f32 logits (C·V·4 bytes); the f32 dW accumulator takes
 * V·H·4. It fits when H <= C. (C is capped at the kept tokens, so K < H is always lean:
 * then all K tokens' logits are smaller than the accumulator anyway.) */
static int lean(const lk_cross_entropy_dims *d) { return d->chunk < d->hidden; }

/* Pass 2's vocab block: at most C·V/K columns, so that K tokens' block is no larger than
 * one chunk's logits; the blocks balanced and a multiple of 128 columns where that stays
 * within the bound (16-byte rows, whole GEMM tiles). */
static int64_t vblock(const lk_cross_entropy_dims *d) {
    int64_t V = d->vocab, K = d->kept > 0 ? d->kept : 1, most = d->chunk * V / K;
    if (most >= V) return V;
    if (most < 1) most = 1;
    int64_t vb = cdiv(V, cdiv(V, most)), up = cdiv(vb, 128) * 128;
    return up <= most ? up : vb;
}

/* Logits elements the buffer holds: a chunk's, or pass 2's block of every kept token. */
static size_t logits_elems(const lk_cross_entropy_dims *d) {
    size_t cv = (size_t)d->chunk * (size_t)d->vocab, kb = lean(d) ? (size_t)d->kept * (size_t)vblock(d) : 0;
    return cv > kb ? cv : kb;
}

static void plan_of(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, cplan *c) {
    int64_t S = a->hidden.ndim >= 3 ? a->hidden.shape[a->hidden.ndim - 2] : d->tokens;
    c->p = (lk_ce_cuda_plan){.T = d->tokens, .V = d->vocab, .K = d->kept, .S = S,
                             .keep_n = a->keep_indices.data ? 0 : a->logits_to_keep, .idx = a->keep_indices.data,
                             .labels = a->labels.data, .labels_i32 = a->labels.dtype == LK_I32,
                             .ignore = a->ignore_index, .eps = (float)a->label_smoothing,
                             .zs = (float)a->z_loss_scale, .cap = (float)a->softcap, .reduction = (int)d->reduction};
    c->H = d->hidden, c->C = d->chunk, c->dt = d->dtype, c->es = lk_dtype_size(d->dtype);
    c->Vb = lean(d) ? vblock(d) : 0;
    c->gt = d->dtype;
    c->zt = d->dtype == LK_BF16 && !a->fp32_lm_head ? LK_BF16 : LK_F32;
    c->gather = c->p.idx != NULL || c->p.keep_n > 0;
}

/* Sizes from the dims alone (the queries have no args); the gathered rows are counted
 * whether or not they are needed (C·H, small beside C·V). */
static size_t chunk_bytes(const lk_cross_entropy_dims *d) {
    size_t L = logits_elems(d), C = (size_t)d->chunk, H = (size_t)d->hidden, es = lk_dtype_size(d->dtype);
    int bf16_logits = d->dtype == LK_BF16 && !d->fp32_lm_head;
    size_t logits = bf16_logits ? lk_arena_piece(L * 2)
                                : lk_arena_piece(L * 4) + (d->dtype == LK_BF16 ? lk_arena_piece(L * 2) : 0);
    return LK_LT_WORKSPACE_BYTES + logits + lk_arena_piece(C * H * es) + 2 * lk_arena_piece((size_t)d->kept * 4);
}

/* Where the saved block keeps dh (mean/sum) and, on the lean path, the lse [K]. */
static size_t dh_bytes(const lk_cross_entropy_dims *d) {
    return liger(d) ? lk_arena_piece((size_t)(d->kept * d->hidden) * 4) : 0;
}

static size_t saved_bytes(const lk_cross_entropy_dims *d) {
    if (lean(d)) return HEAD + dh_bytes(d) + lk_arena_piece((size_t)d->kept * 4);
    if (!liger(d)) return HEAD;
    return HEAD + dh_bytes(d) + (size_t)(d->vocab * d->hidden) * 4;
}

static size_t workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    if (!backward) return chunk_bytes(d);
    size_t es = lk_dtype_size(d->dtype), dh_chunk = lk_arena_piece((size_t)(d->chunk * d->hidden) * 4);
    if (lean(d))
        return chunk_bytes(d) + (d->kept < d->tokens ? lk_arena_piece((size_t)(d->kept * d->hidden) * es) : 0) +
               (liger(d) ? 0 : dh_chunk);
    if (liger(d)) return 0;
    size_t f32_dw = d->dweight_dtype == LK_F32 ? 0 : lk_arena_piece((size_t)(d->vocab * d->hidden) * 4);
    return chunk_bytes(d) + dh_chunk + f32_dw;
}

/* The arena pieces of one pass, in the order chunk_bytes counts them. */
typedef struct {
    void *lt, *logits, *dz, *rows;
    float *loss, *zl;
} bufs;

static lk_status take(lk_arena *ar, const cplan *c, const lk_cross_entropy_dims *d, bufs *b) {
    size_t L = logits_elems(d);
    b->lt = lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES);
    b->logits = lk_arena_alloc(ar, L * lk_dtype_size(c->zt));
    b->dz = c->zt == c->gt ? b->logits : lk_arena_alloc(ar, L * lk_dtype_size(c->gt));
    b->rows = c->gather ? lk_arena_alloc(ar, (size_t)(c->C * c->H) * c->es) : NULL;
    b->loss = lk_arena_alloc(ar, (size_t)c->p.K * 4);
    b->zl = lk_arena_alloc(ar, (size_t)c->p.K * 4);
    if (!b->lt || !b->logits || !b->dz || (c->gather && !b->rows) || !b->loss || !b->zl)
        return lk_error(LK_EINTERNAL, "cross_entropy: fused (cuda): the workspace was not reserved");
    return LK_OK;
}

/* Rows k0 .. k0+n of the kept hidden states, contiguous [n, H]. */
static lk_status rows_of(const lk_cross_entropy_args *a, const cplan *c, void *buf, int64_t k0, int64_t n,
                         void *stream, const void **out) {
    if (!c->gather) {
        *out = (const char *)a->hidden.data + (size_t)(k0 * c->H) * c->es;
        return LK_OK;
    }
    *out = buf;
    return lk_ce_cuda_gather(&c->p, c->dt, a->hidden.data, c->H, k0, n, buf, stream);
}

/* z [n, wb] = rows · W[v0 .. v0+wb)ᵀ (ld wb). */
static lk_status logits_gemm(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, const void *rows,
                             int64_t n, int64_t v0, int64_t wb, lk_ctx *ctx) {
    lk_lt_gemm_args g = {.trans_b = 1, .m = n, .n = wb, .k = c->H, .ab_dt = c->dt, .a = rows, .lda = c->H,
                         .b = (const char *)a->weight.data + (size_t)(v0 * c->H) * c->es, .ldb = c->H,
                         .alpha = 1.0f, .c_dt = c->zt, .c = b->logits, .ldc = wb};
    return lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g);
}

/* dh [n, H] f32 = dz [n, V] · W. */
static lk_status dh_gemm(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, int64_t n, float *dh,
                         lk_ctx *ctx) {
    lk_lt_gemm_args g = {.m = n, .n = c->H, .k = c->p.V, .ab_dt = c->gt, .a = b->dz, .lda = c->p.V,
                         .b = a->weight.data, .ldb = c->H, .alpha = 1.0f, .c_dt = LK_F32, .c = dh, .ldc = c->H};
    return lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g);
}

/* dw [m, H] (c_dt) = beta·dw + dzᵀ · rows, dz [n, m] (ld m), rows [n, H]: m vocab rows, n tokens. */
static lk_status dw_gemm(const cplan *c, const bufs *b, const void *rows, int64_t m, int64_t n, void *dw,
                         lk_dtype c_dt, float beta, lk_ctx *ctx) {
    lk_lt_gemm_args g = {.trans_a = 1, .m = m, .n = c->H, .k = n, .ab_dt = c->gt, .a = b->dz, .lda = m, .b = rows,
                         .ldb = c->H, .alpha = 1.0f, .beta = beta, .c_dt = c_dt, .c = dw, .ldc = c->H};
    return lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g);
}

/* The saved block: n_valid, dh [K, H] f32 (mean/sum), then dW [V, H] f32 or, lean, lse [K]. */
static float *saved_dh(const lk_cross_entropy_args *a) { return (float *)((char *)a->saved.data + HEAD); }
static float *saved_tail(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d) {
    return (float *)((char *)a->saved.data + HEAD + dh_bytes(d));
}

static lk_status forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    cplan c;
    plan_of(a, d, &c);
    bufs b;
    lk_status s = take(ctx->arena, &c, d, &b);
    if (s) return s;
    void *st = ctx->stream;
    int64_t *nv = a->saved.data, K = c.p.K, V = c.p.V, H = c.H;
    float *dh = saved_dh(a), *dw = c.Vb ? NULL : saved_tail(a, d), *lse = c.Vb ? saved_tail(a, d) : NULL;
    int none = !liger(d);
    if ((s = lk_ce_cuda_count_valid(&c.p, nv, st))) return s;
    if (none) {
        LK_CUDA_TRY(cudaMemsetAsync(a->loss.data, 0, (size_t)c.p.T * 4, (cudaStream_t)st));
        if (a->z_loss.data) LK_CUDA_TRY(cudaMemsetAsync(a->z_loss.data, 0, (size_t)c.p.T * 4, (cudaStream_t)st));
    } else if (K == 0 && dw) {
        LK_CUDA_TRY(cudaMemsetAsync(dw, 0, (size_t)(V * H) * 4, (cudaStream_t)st));
    }
    for (int64_t k0 = 0; k0 < K; k0 += c.C) {
        int64_t n = K - k0 < c.C ? K - k0 : c.C;
        const void *rows;
        if ((s = rows_of(a, &c, b.rows, k0, n, st, &rows)) || (s = logits_gemm(a, &c, &b, rows, n, 0, V, ctx)))
            return s;
        if (none) {
            s = lk_ce_cuda_rows(&c.p, c.zt, b.logits, c.gt, NULL, k0, n, nv, NULL, a->loss.data, a->z_loss.data, lse,
                                1, st);
            if (s) return s;
            continue;
        }
        if ((s = lk_ce_cuda_rows(&c.p, c.zt, b.logits, c.gt, b.dz, k0, n, nv, NULL, b.loss, b.zl, lse, 0, st)) ||
            (s = dh_gemm(a, &c, &b, n, dh + k0 * H, ctx)) ||
            (dw && (s = dw_gemm(&c, &b, rows, V, n, dw, LK_F32, k0 == 0 ? 0.0f : 1.0f, ctx))))
            return s;
    }
    if (none) {
        if (a->n_valid.data)
            LK_CUDA_TRY(cudaMemcpyAsync(a->n_valid.data, nv, 8, cudaMemcpyDeviceToDevice, (cudaStream_t)st));
        return LK_OK;
    }
    return lk_ce_cuda_finish(&c.p, b.loss, b.zl, nv, a->loss.data, a->z_loss.data, a->n_valid.data, st);
}

/* Reduction none: each chunk again, its gradient weighted per token by d_loss; d_hidden's
 * rows scattered per chunk, and (not lean) dW accumulated in f32 as it goes. */
static lk_status backward_none(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, lk_ctx *ctx) {
    void *st = ctx->stream;
    int64_t K = c->p.K, V = c->p.V, H = c->H;
    float *dh = lk_arena_alloc(ctx->arena, (size_t)(c->C * H) * 4);
    int direct = a->d_weight.dtype == LK_F32 || c->Vb;
    float *dw = direct ? a->d_weight.data : lk_arena_alloc(ctx->arena, (size_t)(V * H) * 4);
    if (dh == NULL || dw == NULL)
        return lk_error(LK_EINTERNAL, "cross_entropy: fused (cuda): the workspace was not reserved");
    lk_status s;
    for (int64_t k0 = 0; k0 < K; k0 += c->C) {
        int64_t n = K - k0 < c->C ? K - k0 : c->C;
        const void *rows;
        if ((s = rows_of(a, c, b->rows, k0, n, st, &rows)) || (s = logits_gemm(a, c, b, rows, n, 0, V, ctx)) ||
            (s = lk_ce_cuda_rows(&c->p, c->zt, b->logits, c->gt, b->dz, k0, n, a->saved.data, a->d_loss.data,
                                 b->loss, NULL, NULL, 0, st)) ||
            (s = dh_gemm(a, c, b, n, dh, ctx)) ||
            (!c->Vb && (s = dw_gemm(c, b, rows, V, n, dw, LK_F32, direct || k0 > 0 ? 1.0f : 0.0f, ctx))) ||
            (s = lk_ce_cuda_scatter_rows(&c->p, dh, k0, n, H, NULL, c->dt, a->d_hidden.data, st)))
            return s;
    }
    if (!direct && K > 0) return lk_ce_cuda_axpy(V * H, dw, NULL, a->d_weight.dtype, a->d_weight.data, st);
    return LK_OK;
}

/* The lean path's pass 2: d_weight[v0 .. v0+wb) += dlogitsᵀ · rows over every kept token,
 * the block's logits recomputed and turned into their gradient with the saved lse. */
static lk_status lean_dweight(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, const cplan *c,
                              const bufs *b, lk_ctx *ctx) {
    void *st = ctx->stream;
    int64_t K = c->p.K, V = c->p.V, H = c->H;
    if (K == 0) return LK_OK;
    const void *rows = a->hidden.data;   /* every token kept: the indices can only be 0 .. T−1 */
    lk_status s;
    if (K < c->p.T) {
        void *all = lk_arena_alloc(ctx->arena, (size_t)(K * H) * c->es);
        if (all == NULL) return lk_error(LK_EINTERNAL, "cross_entropy: fused (cuda): the workspace was not reserved");
        if ((s = lk_ce_cuda_gather(&c->p, c->dt, a->hidden.data, H, 0, K, all, st))) return s;
        rows = all;
    }
    const float *lse = saved_tail(a, d);
    size_t dwes = lk_dtype_size(a->d_weight.dtype);
    for (int64_t v0 = 0; v0 < V; v0 += c->Vb) {
        int64_t wb = V - v0 < c->Vb ? V - v0 : c->Vb;
        if ((s = logits_gemm(a, c, b, rows, K, v0, wb, ctx)) ||
            (s = lk_ce_cuda_block_grad(&c->p, c->zt, b->logits, c->gt, b->dz, v0, wb, lse, a->saved.data,
                                       a->d_loss.data, st)) ||
            (s = dw_gemm(c, b, rows, wb, K, (char *)a->d_weight.data + (size_t)(v0 * H) * dwes, a->d_weight.dtype,
                         1.0f, ctx)))
            return s;
    }
    return LK_OK;
}

static lk_status backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    cplan c;
    plan_of(a, d, &c);
    void *st = ctx->stream;
    int64_t K = c.p.K, H = c.H;
    if (K < c.p.T)   /* tokens not kept get a zero gradient */
        LK_CUDA_TRY(cudaMemsetAsync(a->d_hidden.data, 0, (size_t)(c.p.T * H) * c.es, (cudaStream_t)st));
    lk_status s;
    bufs b;
    if ((!liger(d) || c.Vb) && (s = take(ctx->arena, &c, d, &b))) return s;
    if (!liger(d)) {
        if ((s = backward_none(a, &c, &b, ctx))) return s;
    } else if ((s = lk_ce_cuda_scatter_rows(&c.p, saved_dh(a), 0, K, H, a->d_loss.data, c.dt, a->d_hidden.data,
                                            st))) {
        return s;
    }
    if (c.Vb) return lean_dweight(a, d, &c, &b, ctx);
    if (!liger(d)) return LK_OK;
    return lk_ce_cuda_axpy(c.p.V * H, saved_tail(a, d), a->d_loss.data, a->d_weight.dtype, a->d_weight.data, st);
}

const lk_cross_entropy_vtable lk_cross_entropy_cuda_fused_vtable = {
    .version = LK_CROSS_ENTROPY_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
