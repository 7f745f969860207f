/* common.h — what the three cross-entropy implementations share: which tokens are
 * scored (the plan), gathering their hidden rows in f32, the per-row softmax / loss /
 * gradient kernels on an f32 logits row, the token weights of the backward, the
 * reductions into the outputs, the saved header, and chunk_loss.c's chunk loop. Only
 * files of this folder use it. */
#ifndef LLMKERN_CROSS_ENTROPY_COMMON_H
#define LLMKERN_CROSS_ENTROPY_COMMON_H

#include "llmkern/cross_entropy.h"
#include "ops/gemm.h"

#include <string.h>

typedef struct {
    const lk_cross_entropy_args *a;
    int64_t T, H, V, K, S, C;      /* tokens, hidden, vocab, kept, sequence length, chunk */
    int64_t keep_n;                /* logits_to_keep */
    const int64_t *idx;            /* keep_indices or NULL */
    lk_dtype dt;
    int round_bf16;                /* bf16 storage without fp32_lm_head: logits and dlogits rounded */
    float cap, eps, zs;
    float *xpack;                  /* set: the chunk's GEMMs run lk_gemm_wide (ce_xpack_bytes) */
} ce_plan;

void ce_plan_make(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, ce_plan *p);

/* The flat token index of kept row k. */
static inline int64_t ce_token(const ce_plan *p, int64_t k) {
    if (p->idx) return p->idx[k];
    if (p->keep_n > 0) return (k / p->keep_n) * p->S + (p->S - p->keep_n) + k % p->keep_n;
    return k;
}

/* The label of token t, or −1 when it is ignore_index. */
static inline int64_t ce_label(const ce_plan *p, int64_t t) {
    int64_t y = p->a->labels.dtype == LK_I32 ? ((const int32_t *)p->a->labels.data)[t]
                                             : ((const int64_t *)p->a->labels.data)[t];
    return y == p->a->ignore_index ? -1 : y;
}

/* exp(x) for x <= ~88 without a libm call, so the loops below vectorize: 2^n · e^r with
 * |r| <= ln2/2 and a degree-6 polynomial (relative error ~2e-7, below f32 rounding of
 * the sums it feeds). Inputs below −87 give ~0 instead of denormals. */
static inline float ce_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;                                  /* 2^n stays a normal float */
    float t = x * 1.44269504089f;
    float big = t + 12582912.0f;                                /* n sits in big's low bits */
    float n = big - 12582912.0f;                                /* round to nearest */
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float q = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666667f +
              r * (0.0083333333f + r * 0.0013888889f)))));
    /* 2^n from big's bits, never a float-to-int conversion: a NaN input (a NaN weight or
     * hidden state) gives garbage here, but q is NaN and so is the result, with no UB */
    uint32_t nb;
    memcpy(&nb, &big, 4);
    uint32_t bits = (nb - 0x4B400000u + 127u) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return q * s;
}

/* Scored tokens that have a label. */
int64_t ce_count_valid(const ce_plan *p);

/* Rows k0 .. k0+n of the kept hidden states as f32 [n, H]: hidden itself when it is f32
 * and those rows are contiguous, otherwise gathered (and widened) into buf. */
const float *ce_rows(const ce_plan *p, int64_t k0, int64_t n, float *buf);
/* 1 when ce_rows(k0, n) needs no buffer. */
int ce_rows_direct(const ce_plan *p, int64_t k0, int64_t n);
/* weight as f32 [V, H]: itself for f32, otherwise widened into buf (V·H floats). */
const float *ce_weight_f32(const ce_plan *p, float *buf);

/* logits[n, V] = rows[n, H] · Wᵀ; dh[n, H] = dz[n, V] · W (ldc = H);
 * dW[V, H] = beta·dW + dzᵀ · rows. With p->xpack the first two read W in place
 * (lk_gemm_wide), otherwise all three are lk_gemm. */
lk_status ce_gemm_logits(const ce_plan *p, const float *rows, const float *w, int64_t n, float *logits);
lk_status ce_gemm_dh(const ce_plan *p, const float *dz, const float *w, int64_t n, float *dh);
lk_status ce_gemm_dw(const ce_plan *p, const float *dz, const float *rows, int64_t n, float beta, float *dw);
/* The workspace p->xpack needs for chunks of C rows; 0 where BLAS is the faster
 * (lk_gemm_wide_wins), and then p->xpack stays NULL; ce_take_xpack sets it from the
 * reserved workspace (ce_take). */
size_t ce_xpack_bytes(int64_t C, int64_t H);
void ce_take_xpack(ce_plan *p, lk_arena *arena, lk_status *st);

/* One logits row z (raw GEMM output), in place: rounded to bf16 if the plan says so,
 * then soft-capped. Returns through the pointers lse, and the loss and z-loss of the
 * row for label y (y < 0: both 0). */
void ce_row_prepare(const ce_plan *p, float *z);
void ce_row_stats(const ce_plan *p, const float *z, int64_t y, float *lse, float *loss, float *zl);
/* z as ce_row_prepare left it, becomes g·∂loss/∂(raw logits) (0 when y < 0). */
void ce_row_grad(const ce_plan *p, float *z, int64_t y, float lse, float g);

/* Rows k0 .. k0+n of a chunk of raw logits [n, V], in parallel over rows. forward:
 * prepare + stats into loss/zl (and lse unless NULL), indexed by k; with g (indexed by
 * k) also the gradient in place. backward: prepare + gradient from the saved lse. */
void ce_chunk_forward(const ce_plan *p, float *logits, int64_t k0, int64_t n, float *loss, float *zl,
                      float *lse, const float *g);
void ce_chunk_backward(const ce_plan *p, float *logits, int64_t k0, int64_t n, const float *lse,
                       const float *g);

/* Every kept row's backward weight into g[K]: d_loss, / n_valid for mean (0 when there
 * is no valid token), per token for none; unit: as if d_loss were 1. */
void ce_token_weights(const ce_plan *p, int64_t n_valid, int unit, float *g);

/* Writes loss, z_loss and n_valid from the per-kept-row loss and zl [K]. */
void ce_write_outputs(const ce_plan *p, const float *loss, const float *zl, int64_t n_valid);

/* d_hidden: the rows of tokens not kept are zeroed; kept row k0+i gets scale·rows[i]
 * (rows [n, H] f32). */
void ce_dh_zero_unkept(const ce_plan *p);
void ce_dh_store(const ce_plan *p, const float *rows, int64_t k0, int64_t n, float scale);
/* d_weight += scale·src (src f32 [V, H]), in d_weight's own dtype. */
void ce_dw_add(const ce_plan *p, const float *src, float scale);

/* A piece of the reserved workspace (never NULL for 0 bytes); on a shortfall records
 * LK_EINTERNAL in *st once and returns NULL. */
void *ce_take(lk_arena *arena, size_t bytes, lk_status *st);

/* The head of every implementation's saved block. */
typedef struct {
    int64_t n_valid;
    int64_t pad[7];
} ce_saved_head;
#define CE_HEAD_BYTES ((size_t)64)

/* The chunk loop of chunk_loss.c, which fused.c also runs for reduction none (where
 * per-token d_loss makes the gradients of the forward unusable; see fused.c). */
size_t lk_ce_chunked_saved_bytes(const lk_cross_entropy_dims *d);
size_t lk_ce_chunked_workspace_bytes(const lk_cross_entropy_dims *d, int backward);
lk_status lk_ce_chunked_forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);
lk_status lk_ce_chunked_backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);

#endif
