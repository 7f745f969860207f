/* gemm.h — the CPU GEMM every dense op uses: C = alpha · op(A) · op(B) + beta · C
 * through CBLAS, with A and B stored in f32 or bf16 (bf16 is widened to f32 in arena
 * scratch first) and C always f32. Row-major; lda/ldb are the stored row lengths. */
#ifndef LLMKERN_GEMM_H
#define LLMKERN_GEMM_H

#include "llmkern/llmkern.h"

typedef struct {
    const void *data;
    lk_dtype dtype;      /* LK_F32 or LK_BF16 */
    int64_t ld;          /* elements between rows as stored */
    int trans;           /* 1: use the transpose of the stored matrix */
} lk_gemm_operand;

/* C[m, n] (f32, row stride ldc) = alpha · A[m, k] · B[k, n] + beta · C.
 * Scratch for widening bf16 comes from arena (lk_gemm_workspace_bytes tells how much). */
lk_status lk_gemm(int64_t m, int64_t n, int64_t k, float alpha, lk_gemm_operand a, lk_gemm_operand b,
                  float beta, float *c, int64_t ldc, lk_arena *arena);
size_t lk_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, lk_dtype a, lk_dtype b);

/* The chunked LM head's two GEMMs against a wide f32 weight W read where it lies, never
 * packed as a whole (gemm_wide.c says why): for m rows (tokens), n or k in the tens of
 * thousands (vocab). Use them where lk_gemm_wide_wins(m, hidden) says they beat lk_gemm.
 *   xwt: C[m, n] = X[m, k] · W[n, k]ᵀ    (logits; scratch: lk_gemm_wide_scratch_bytes(m, k),
 *                                        64-byte aligned, for Xᵀ packed)
 *   gw:  C[m, n] = G[m, k] · W[k, n]     (d_hidden; W's rows are the vocab)
 * C is written, not accumulated. */
int lk_gemm_wide_wins(int64_t m, int64_t hidden);
size_t lk_gemm_wide_scratch_bytes(int64_t m, int64_t k);
void lk_gemm_wide_xwt(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                      float *c, int64_t ldc, float *scratch);
void lk_gemm_wide_gw(int64_t m, int64_t n, int64_t k, const float *g, int64_t ldg, const float *w, int64_t ldw,
                     float *c, int64_t ldc);

#endif
