/* block_mask.h — FlexAttention's BlockMask: which (q block, kv block) tiles of an
 * attention call have any visible element, which are fully visible, and the predicate
 * that decides per element inside the partial ones. The fields are PyTorch's, so a
 * mask built there can be described here (and the reverse).
 *
 * A mask is built from a predicate, mask(b, h, q_idx, kv_idx, ctx) -> visible, by
 * lk_block_mask_create (evaluated on every element once, at build time), or by one of
 * the ready builders for the standard families: causal, sliding window, prefix-LM,
 * document (packed sequences) and AND/OR of two masks. The predicate is model-owned:
 * flex_attention follows the mask and nothing else. */
#ifndef LLMKERN_BLOCK_MASK_H
#define LLMKERN_BLOCK_MASK_H

#include <stdbool.h>
#include <stdint.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* true: query q_idx of batch b, head h sees key kv_idx. Indices are global positions
 * in the call's (packed) sequences. Must be pure: it runs at build time and again,
 * per element, inside partial blocks. */
typedef bool (*lk_mask_fn)(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);
/* The same predicate over n consecutive keys: out[j] = mask(b, h, q_idx, kv0 + j) for
 * j < n. Optional; the builders set one (a loop the compiler vectorizes, instead of one
 * indirect call per element) and it must agree with mask_mod. */
typedef void (*lk_mask_row_fn)(int64_t b, int64_t h, int64_t q_idx, int64_t kv0, int64_t n, uint8_t *out,
                               const void *ctx);

#define LK_BLOCK_MASK_DEFAULT_BLOCK 128

typedef struct lk_block_mask {
    int64_t B, H;                   /* 1 = broadcast over batches / heads; else the call's B / H_q */
    int64_t Q_LEN, KV_LEN;
    int64_t Q_BLOCK_SIZE, KV_BLOCK_SIZE;
    int64_t num_q_blocks, num_kv_blocks;    /* ceil(len / block): the last block may be short */
    /* Per (b, h, q block): the partial kv blocks (predicate runs per element) and the
     * full ones (no masking), ascending. Shapes [B, H, nq] and [B, H, nq, nkv]. */
    int32_t *kv_num_blocks, *kv_indices;
    int32_t *full_kv_num_blocks, *full_kv_indices;
    /* The transpose, for the backward: per (b, h, kv block) the q blocks, [B, H, nkv]
     * and [B, H, nkv, nq]. */
    int32_t *q_num_blocks, *q_indices;
    int32_t *full_q_num_blocks, *full_q_indices;
    lk_mask_fn mask_mod;
    const void *mask_ctx;           /* passed to mask_mod */
    void *owned;                    /* freed by lk_block_mask_free (a builder's context); may be NULL */
    lk_mask_row_fn mask_row;        /* optional row form of mask_mod (mask_ctx too); NULL = per element */
    /* The mask's copy on a GPU, made by its first flex_attention call there and freed by
     * lk_block_mask_free: a mask used on a GPU must not change afterwards (as a PyTorch
     * BlockMask lives on its device). NULL in a new mask. */
    struct lk_block_mask_gpu *gpu;
} lk_block_mask;

/* Builds mask over [B, H, Q_LEN, KV_LEN] (B and H may be 1 to broadcast) with blocks of
 * q_block x kv_block (0 = 128). Allocates the index arrays; the caller owns *out and
 * frees it with lk_block_mask_free. ctx is borrowed: it must outlive *out.
 * LK_EINVAL for a NULL mask_mod or out, non-positive sizes; LK_ENOMEM. */
LK_API lk_status lk_block_mask_create(lk_mask_fn mask_mod, const void *ctx, int64_t B, int64_t H, int64_t Q_LEN,
                               int64_t KV_LEN, int64_t q_block, int64_t kv_block, lk_block_mask *out);
/* Frees what create or a builder allocated and zeroes *m. NULL or a zeroed mask is fine. */
LK_API void lk_block_mask_free(lk_block_mask *m);
/* Visible elements over all [B, H, Q_LEN, KV_LEN] divided by their number (runs the
 * predicate on partial blocks only). */
LK_API double lk_block_mask_density(const lk_block_mask *m);

/* --- predicates of the standard families (their contexts are caller-owned) -------- */

/* Causal, bottom-right aligned: kv_idx <= q_idx + (KV_LEN - Q_LEN). */
typedef struct { int64_t offset; } lk_causal_ctx;
LK_API bool lk_mask_causal(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* Causal with a window of `window` keys, the diagonal included (HF's sliding_window):
 * q_idx + offset - window < kv_idx <= q_idx + offset. */
typedef struct { int64_t window, offset; } lk_window_ctx;
LK_API bool lk_mask_sliding_window(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* Prefix-LM: the first prefix_len[b] keys are seen by every query, the rest causally.
 * prefix_len has B entries (or one, when n_prefix is 1). */
typedef struct { const int64_t *prefix_len; int64_t n_prefix; } lk_prefix_lm_ctx;
LK_API bool lk_mask_prefix_lm(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* Documents: a query sees keys of its own document only (causally within it when
 * causal). Documents come from per-token ids (q_doc[Q_LEN], kv_doc[KV_LEN], b-th row at
 * b * len when per_batch) or, when q_doc is NULL, from cu_seqlens (n_docs + 1 entries,
 * ascending, shared by q and kv). */
typedef struct {
    const int32_t *q_doc, *kv_doc;
    int64_t q_len, kv_len;          /* row length of the id arrays */
    int per_batch;                  /* ids differ per batch row */
    const int32_t *cu_seqlens;
    int64_t n_docs;
    int causal;
} lk_document_ctx;
LK_API bool lk_mask_document(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* AND / OR of two predicates. */
typedef struct {
    lk_mask_fn a; const void *a_ctx;
    lk_mask_fn b; const void *b_ctx;
} lk_mask_pair_ctx;
LK_API bool lk_mask_and(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);
LK_API bool lk_mask_or(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* --- ready builders: the mask owns a copy of its context (freed with the mask) -------
 * Block sizes 0 mean 128. Errors as lk_block_mask_create. */
LK_API lk_status lk_block_mask_causal(int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN, int64_t q_block,
                               int64_t kv_block, lk_block_mask *out);
LK_API lk_status lk_block_mask_sliding_window(int64_t window, int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN,
                                       int64_t q_block, int64_t kv_block, lk_block_mask *out);
/* prefix_len: B entries (copied). */
LK_API lk_status lk_block_mask_prefix_lm(const int64_t *prefix_len, int64_t B, int64_t H, int64_t Q_LEN,
                                  int64_t KV_LEN, int64_t q_block, int64_t kv_block, lk_block_mask *out);
/* Packed documents of one sequence (B = 1) from cu_seqlens[n_docs + 1] (copied): 0 first,
 * ascending, ending at Q_LEN == KV_LEN. */
LK_API lk_status lk_block_mask_document_cu(const int32_t *cu_seqlens, int64_t n_docs, int causal, int64_t H,
                                    int64_t LEN, int64_t q_block, int64_t kv_block, lk_block_mask *out);
/* From per-token document ids, doc[B * LEN] (copied); self-attention (q and kv share them). */
LK_API lk_status lk_block_mask_document_ids(const int32_t *doc, int causal, int64_t B, int64_t H, int64_t LEN,
                                     int64_t q_block, int64_t kv_block, lk_block_mask *out);
/* A predicate known only element by element: dense [B, H, Q_LEN, KV_LEN] bytes
 * (dims = {B, H, Q_LEN, KV_LEN}; B and H may be 1 to broadcast), nonzero = visible, as
 * another framework's mask evaluates to (a PyTorch BlockMask's mask_mod over every
 * element: python/llmkern). The bytes are copied; the blocks are classified from them. */
LK_API lk_status lk_block_mask_dense(const uint8_t *mask, const int64_t dims[4], int64_t q_block, int64_t kv_block,
                              lk_block_mask *out);
/* x AND y / x OR y over the same [B, H, Q_LEN, KV_LEN] (broadcast dims may differ: the
 * result has the larger). x and y must outlive *out (their predicates are borrowed). */
LK_API lk_status lk_block_mask_and(const lk_block_mask *x, const lk_block_mask *y, lk_block_mask *out);
LK_API lk_status lk_block_mask_or(const lk_block_mask *x, const lk_block_mask *y, lk_block_mask *out);

/* --- score_mod: an optional change of each score before masking ------------------
 * Returns the new score; writes d(new)/d(score) to *grad (the backward needs it). */
typedef float (*lk_score_mod_fn)(float score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx,
                                 const void *ctx, float *grad);
typedef struct { lk_score_mod_fn fn; const void *ctx; } lk_score_mod;

/* Examples. Softcap: cap · tanh(score / cap), ctx = const float *cap. */
LK_API float lk_score_mod_softcap(float score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx,
                           float *grad);
/* ALiBi: score − slope[h] · (q_idx − kv_idx), ctx = const float *slope (one per head). */
LK_API float lk_score_mod_alibi(float score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx,
                         float *grad);

#ifdef __cplusplus
}
#endif
#endif
