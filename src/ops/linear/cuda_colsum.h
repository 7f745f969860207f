/* cuda_colsum.h — the bias gradient of linear `cublaslt` on CUDA: dst[c] += Σ_r src[r, c]
 * (cublaslt.cu). Built only with CUDA. */
#ifndef LLMKERN_LINEAR_CUDA_COLSUM_H
#define LLMKERN_LINEAR_CUDA_COLSUM_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* src [rows, cols] in src_dt (f32/bf16), dst [cols] in dst_dt (f32/bf16): the column sums
 * in f32, in a fixed order (deterministic), added to dst and rounded once. */
lk_status lk_cuda_colsum_acc(lk_dtype src_dt, const void *src, int64_t rows, int64_t cols, lk_dtype dst_dt,
                             void *dst, void *stream);

#ifdef __cplusplus
}
#endif
#endif
