/* cublaslt_util.h — row-major GEMMs through cuBLASLt with a cached plan per problem, for
 * the CUDA ops whose matrix products dominate (linear `cublaslt`, cross-entropy `fused`).
 * Built only with CUDA.
 *
 * Where the plans live: beside the library's per-device GPU handles (cublas_cuda.c keeps
 * one cuBLAS handle per device the same way). Each device gets, on first use, one
 * cublasLtHandle_t and a fixed table of LK_LT_PLANS plans; a plan is the matmul
 * descriptor, the three matrix layouts and the algorithm cublasLtMatmulAlgoGetHeuristic
 * chose, keyed by everything the choice depends on: M, N, K, leading dims, transposes,
 * dtypes, bias, beta = 0 or not, the operands' pointer alignment and the workspace size.
 * A miss asks the heuristic once and replaces the oldest plan (round robin); nothing is
 * allocated on a hit. With LLMKERN_GEMM_TUNE=1 a shape's first call picks among the
 * heuristic's offers by timing them at the power cap (cublaslt_cuda.c), and the choice is
 * kept beside the table. Both are process state like the handles (freed at exit by the
 * driver): no other hidden state. A lock covers lookup and enqueue, so several host
 * threads may call it; the cuBLASLt workspace is the caller's (an arena piece). */
#ifndef LLMKERN_CUBLASLT_UTIL_H
#define LLMKERN_CUBLASLT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_LT_PLANS 32
/* Workspace the heuristic may use: Hopper's fastest kernels want up to 32 MiB. */
#define LK_LT_WORKSPACE_BYTES ((size_t)32 << 20)

/* Row-major C[M, N] = alpha·op(A)·op(B) + beta·C (+ bias[N] on every row), f32 accumulation.
 * op(A) is [M, K]: A stored [M, K] (lda >= K) or, trans_a, [K, M] (lda >= M); op(B) is
 * [K, N] likewise. A and B in ab_dt (f32 or bf16); C in c_dt (f32, or bf16 when ab_dt is
 * bf16: read when beta != 0 and rounded once); bias in c_dt or NULL. f32 operands use
 * exact f32 math (no TF32). */
typedef struct {
    int trans_a, trans_b;
    int64_t m, n, k;
    lk_dtype ab_dt;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    float alpha, beta;
    lk_dtype c_dt;
    void *c;
    int64_t ldc;
    const void *bias;
} lk_lt_gemm_args;

/* Queued on stream (a cudaStream_t) with device's handle; workspace: ws_bytes of device
 * memory (LK_LT_WORKSPACE_BYTES is what the heuristic is offered at most). */
lk_status lk_lt_gemm(int device, void *stream, void *workspace, size_t ws_bytes, const lk_lt_gemm_args *g);

/* Plan-cache counters of a device since start (for tests: a repeat call must hit), and the
 * shapes LLMKERN_GEMM_TUNE has timed (timed may be NULL). */
void lk_lt_cache_stats(int device, int64_t *hits, int64_t *misses, int64_t *timed);

#ifdef __cplusplus
}
#endif
#endif
