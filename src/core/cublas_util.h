/* cublas_util.h — the library's cuBLAS handles and a row-major GEMM on raw device
 * pointers for the CUDA ops that need matrix products (the SwiGLU MLP today; the
 * cuBLASLt linear with cached plans is still to come). Built only with CUDA. */
#ifndef LLMKERN_CUBLAS_UTIL_H
#define LLMKERN_CUBLAS_UTIL_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C[M, N] = op(A)·op(B) + beta·C, f32 accumulation. op(A) is [M, K]: A stored
 * [M, K] (lda = K) or, transposed, [K, M] (lda = M); op(B) is [K, N] likewise. A and B
 * in ab_dt (f32 or bf16), C in c_dt (f32 or bf16; bf16 C is read and rounded once).
 * Queued on stream with the current device's handle (created on first use: one per
 * device, not for use from several host threads at once). */
lk_status lk_cublas_gemm(int device, void *stream, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                         lk_dtype ab_dt, const void *a, int64_t lda, const void *b, int64_t ldb,
                         float beta, lk_dtype c_dt, void *c, int64_t ldc);

#ifdef __cplusplus
}
#endif
#endif
