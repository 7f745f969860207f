/* rows.h — the CUDA side of the dispatchers' moves (rows.cu), called by rows.c for CUDA
 * tensors; each is the lk_ep_* of internal.h of the same name, on device pointers, queued
 * on `stream`. Built only with CUDA. */
#ifndef LLMKERN_MOE_DISPATCH_ROWS_H
#define LLMKERN_MOE_DISPATCH_ROWS_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* row: bytes a row (H elements). */
lk_status lk_ep_cuda_gather(void *dst, const void *src, const int32_t *order, int64_t n, int64_t k, size_t row,
                            void *stream);
lk_status lk_ep_cuda_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order, int64_t n,
                          int64_t El, void *stream);
lk_status lk_ep_cuda_unmeta(const int32_t *meta, int32_t *ids, float *w, int64_t n, void *stream);
lk_status lk_ep_cuda_combine(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt, const int32_t *pos,
                             int64_t n, int64_t k, int64_t H, void *stream);
lk_status lk_ep_cuda_pick(float *dst, const float *src, const int32_t *pos, int64_t n, void *stream);
/* Any direction (unified addressing tells); wait: the stream synchronized after. */
lk_status lk_ep_cuda_copy(void *dst, const void *src, size_t bytes, int wait, void *stream);
lk_status lk_ep_cuda_sync(void *stream);

#ifdef __cplusplus
}
#endif
#endif
