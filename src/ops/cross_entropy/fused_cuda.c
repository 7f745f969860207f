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
 * GPU pass a large one (e.g. 4096 tokens' worth); the 32 MiB default is a CPU-sized chunk.
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
    lk_dtype dt, zt, gt;   /* storage, logits, logits gradient */
    int gather;            /* rows must be gathered (logits_to_keep / keep_indices) */
    size_t es;
} cplan;

static size_t piece(size_t b) { return (b + LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1); }
static int liger(const lk_cross_entropy_dims *d) { return d->reduction != LK_CE_NONE; }

static void plan_of(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, cplan *c) {
    int64_t S = a->hidden.ndim >= 3 ? a->hidden.shape[a->hidden.ndim - 2] : d->tokens;
    c->p = (lk_ce_cuda_plan){.T = d->tokens, .V = d->vocab, .K = d->kept, .S = S,
                             .keep_n = a->keep_indices.data ? 0 : a->logits_to_keep, .idx = a->keep_indices.data,
                             .labels = a->labels.data, .labels_i32 = a->labels.dtype == LK_I32,
                             .ignore = a->ignore_index, .eps = (float)a->label_smoothing,
                             .zs = (float)a->z_loss_scale, .cap = (float)a->softcap, .reduction = (int)d->reduction};
    c->H = d->hidden, c->C = d->chunk, c->dt = d->dtype, c->es = lk_dtype_size(d->dtype);
    c->gt = d->dtype;
    c->zt = d->dtype == LK_BF16 && !a->fp32_lm_head ? LK_BF16 : LK_F32;
    c->gather = c->p.idx != NULL || c->p.keep_n > 0;
}

/* Sizes from the dims alone (the queries have no args); the gathered rows are counted
 * whether or not they are needed (C·H, small beside C·V). */
static size_t chunk_bytes(const lk_cross_entropy_dims *d) {
    size_t C = (size_t)d->chunk, V = (size_t)d->vocab, H = (size_t)d->hidden, es = lk_dtype_size(d->dtype);
    int bf16_logits = d->dtype == LK_BF16 && !d->fp32_lm_head;
    size_t logits = bf16_logits ? piece(C * V * 2) : piece(C * V * 4) + (d->dtype == LK_BF16 ? piece(C * V * 2) : 0);
    return LK_LT_WORKSPACE_BYTES + logits + piece(C * H * es) + 2 * piece((size_t)d->kept * 4);
}

static size_t saved_bytes(const lk_cross_entropy_dims *d) {
    if (!liger(d)) return HEAD;
    return HEAD + piece((size_t)(d->kept * d->hidden) * 4) + (size_t)(d->vocab * d->hidden) * 4;
}

static size_t workspace_bytes(const lk_cross_entropy_dims *d, int backward) {
    size_t f32_dw = d->dweight_dtype == LK_F32 ? 0 : piece((size_t)(d->vocab * d->hidden) * 4);
    if (liger(d)) return backward ? 0 : chunk_bytes(d);
    if (!backward) return chunk_bytes(d);
    return chunk_bytes(d) + piece((size_t)(d->chunk * d->hidden) * 4) + f32_dw;
}

/* The arena pieces of one pass, in the order chunk_bytes counts them. */
typedef struct {
    void *lt, *logits, *dz, *rows;
    float *loss, *zl;
} bufs;

static lk_status take(lk_arena *ar, const cplan *c, bufs *b) {
    size_t CV = (size_t)c->C * (size_t)c->p.V;
    b->lt = lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES);
    b->logits = lk_arena_alloc(ar, CV * lk_dtype_size(c->zt));
    b->dz = c->zt == c->gt ? b->logits : lk_arena_alloc(ar, CV * lk_dtype_size(c->gt));
    b->rows = c->gather ? lk_arena_alloc(ar, (size_t)(c->C * c->H) * c->es) : NULL;
    b->loss = lk_arena_alloc(ar, (size_t)c->p.K * 4);
    b->zl = lk_arena_alloc(ar, (size_t)c->p.K * 4);
    if (!b->lt || !b->logits || !b->dz || (c->gather && !b->rows) || !b->loss || !b->zl)
        return lk_error(LK_EINTERNAL, "cross_entropy: fused (cuda): the workspace was not reserved");
    return LK_OK;
}

/* Rows k0 .. k0+n of the kept hidden states, contiguous [n, H]. */
static lk_status rows_of(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, int64_t k0, int64_t n,
                         void *stream, const void **out) {
    if (!c->gather) {
        *out = (const char *)a->hidden.data + (size_t)(k0 * c->H) * c->es;
        return LK_OK;
    }
    *out = b->rows;
    return lk_ce_cuda_gather(&c->p, c->dt, a->hidden.data, c->H, k0, n, b->rows, stream);
}

static lk_status logits_gemm(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, const void *rows,
                             int64_t n, lk_ctx *ctx) {
    lk_lt_gemm_args g = {.trans_b = 1, .m = n, .n = c->p.V, .k = c->H, .ab_dt = c->dt, .a = rows, .lda = c->H,
                         .b = a->weight.data, .ldb = c->H, .alpha = 1.0f, .c_dt = c->zt, .c = b->logits,
                         .ldc = c->p.V};
    return lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g);
}

/* dh [n, H] f32 = dz · W, and dW f32 (+)= dzᵀ · rows. */
static lk_status grad_gemms(const lk_cross_entropy_args *a, const cplan *c, const bufs *b, const void *rows,
                            int64_t n, float *dh, float *dw, float dw_beta, lk_ctx *ctx) {
    lk_lt_gemm_args g1 = {.m = n, .n = c->H, .k = c->p.V, .ab_dt = c->gt, .a = b->dz, .lda = c->p.V,
                          .b = a->weight.data, .ldb = c->H, .alpha = 1.0f, .c_dt = LK_F32, .c = dh, .ldc = c->H};
    lk_lt_gemm_args g2 = {.trans_a = 1, .m = c->p.V, .n = c->H, .k = n, .ab_dt = c->gt, .a = b->dz, .lda = c->p.V,
                          .b = rows, .ldb = c->H, .alpha = 1.0f, .beta = dw_beta, .c_dt = LK_F32, .c = dw,
                          .ldc = c->H};
    lk_status s = lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g1);
    return s ? s : lk_lt_gemm(ctx->device.index, ctx->stream, b->lt, LK_LT_WORKSPACE_BYTES, &g2);
}

static lk_status forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    cplan c;
    plan_of(a, d, &c);
    bufs b;
    lk_status s = take(ctx->arena, &c, &b);
    if (s) return s;
    void *st = ctx->stream;
    int64_t *nv = a->saved.data, K = c.p.K, V = c.p.V, H = c.H;
    float *dh = (float *)((char *)a->saved.data + HEAD);
    float *dw = (float *)((char *)dh + piece((size_t)(K * H) * 4));
    int none = !liger(d);
    if ((s = lk_ce_cuda_count_valid(&c.p, nv, st))) return s;
    if (none) {
        LK_CUDA_TRY(cudaMemsetAsync(a->loss.data, 0, (size_t)c.p.T * 4, (cudaStream_t)st));
        if (a->z_loss.data) LK_CUDA_TRY(cudaMemsetAsync(a->z_loss.data, 0, (size_t)c.p.T * 4, (cudaStream_t)st));
    } else if (K == 0) {
        LK_CUDA_TRY(cudaMemsetAsync(dw, 0, (size_t)(V * H) * 4, (cudaStream_t)st));
    }
    for (int64_t k0 = 0; k0 < K; k0 += c.C) {
        int64_t n = K - k0 < c.C ? K - k0 : c.C;
        const void *rows;
        if ((s = rows_of(a, &c, &b, k0, n, st, &rows)) || (s = logits_gemm(a, &c, &b, rows, n, ctx))) return s;
        if (none) {
            s = lk_ce_cuda_rows(&c.p, c.zt, b.logits, c.gt, NULL, k0, n, nv, NULL, a->loss.data, a->z_loss.data, 1,
                                st);
            if (s) return s;
            continue;
        }
        if ((s = lk_ce_cuda_rows(&c.p, c.zt, b.logits, c.gt, b.dz, k0, n, nv, NULL, b.loss, b.zl, 0, st)) ||
            (s = grad_gemms(a, &c, &b, rows, n, dh + k0 * H, dw, k0 == 0 ? 0.0f : 1.0f, ctx)))
            return s;
    }
    if (none) {
        if (a->n_valid.data)
            LK_CUDA_TRY(cudaMemcpyAsync(a->n_valid.data, nv, 8, cudaMemcpyDeviceToDevice, (cudaStream_t)st));
        return LK_OK;
    }
    return lk_ce_cuda_finish(&c.p, b.loss, b.zl, nv, a->loss.data, a->z_loss.data, a->n_valid.data, st);
}

/* Reduction none: each chunk again, its gradient weighted per token by d_loss. */
static lk_status backward_none(const lk_cross_entropy_args *a, const cplan *c, lk_ctx *ctx) {
    bufs b;
    lk_status s = take(ctx->arena, c, &b);
    if (s) return s;
    void *st = ctx->stream;
    int64_t K = c->p.K, V = c->p.V, H = c->H;
    float *dh = lk_arena_alloc(ctx->arena, (size_t)(c->C * H) * 4);
    int direct = a->d_weight.dtype == LK_F32;
    float *dw = direct ? a->d_weight.data : lk_arena_alloc(ctx->arena, (size_t)(V * H) * 4);
    if (dh == NULL || dw == NULL)
        return lk_error(LK_EINTERNAL, "cross_entropy: fused (cuda): the workspace was not reserved");
    for (int64_t k0 = 0; k0 < K; k0 += c->C) {
        int64_t n = K - k0 < c->C ? K - k0 : c->C;
        const void *rows;
        if ((s = rows_of(a, c, &b, k0, n, st, &rows)) || (s = logits_gemm(a, c, &b, rows, n, ctx)) ||
            (s = lk_ce_cuda_rows(&c->p, c->zt, b.logits, c->gt, b.dz, k0, n, a->saved.data, a->d_loss.data, b.loss,
                                 NULL, 0, st)) ||
            (s = grad_gemms(a, c, &b, rows, n, dh, dw, direct || k0 > 0 ? 1.0f : 0.0f, ctx)) ||
            (s = lk_ce_cuda_scatter_rows(&c->p, dh, k0, n, H, NULL, c->dt, a->d_hidden.data, st)))
            return s;
    }
    if (!direct && K > 0) return lk_ce_cuda_axpy(V * H, dw, NULL, a->d_weight.dtype, a->d_weight.data, st);
    return LK_OK;
}

static lk_status backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx) {
    cplan c;
    plan_of(a, d, &c);
    void *st = ctx->stream;
    int64_t K = c.p.K, H = c.H;
    if (K < c.p.T)   /* tokens not kept get a zero gradient */
        LK_CUDA_TRY(cudaMemsetAsync(a->d_hidden.data, 0, (size_t)(c.p.T * H) * c.es, (cudaStream_t)st));
    if (!liger(d)) return backward_none(a, &c, ctx);
    const float *dh = (const float *)((const char *)a->saved.data + HEAD);
    const float *dw = (const float *)((const char *)dh + piece((size_t)(K * H) * 4));
    lk_status s = lk_ce_cuda_scatter_rows(&c.p, dh, 0, K, H, a->d_loss.data, c.dt, a->d_hidden.data, st);
    return s ? s : lk_ce_cuda_axpy(c.p.V * H, dw, a->d_loss.data, a->d_weight.dtype, a->d_weight.data, st);
}

const lk_cross_entropy_vtable lk_cross_entropy_cuda_fused_vtable = {
    .version = LK_CROSS_ENTROPY_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
