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

#endif
