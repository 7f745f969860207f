/* cuda_check.h — every CUDA runtime and cuBLAS call is checked through these, and the
 * error text (call, runtime message, file:line) goes into lk_last_error() as LK_EDEVICE.
 * For host code that talks to the GPU (.cu files and *_cuda.c): built only with CUDA.
 *
 *   LK_CUDA_TRY(cudaMemsetAsync(p, 0, n, stream));     returns from the caller on error
 *   kernel<<<g, b, 0, stream>>>(...); LK_CUDA_LAUNCHED("rms_norm: fused forward");
 *
 * A launch reports configuration errors at once; a fault inside a kernel shows up at the
 * next synchronizing call, which is checked the same way. */
#ifndef LLMKERN_CUDA_CHECK_H
#define LLMKERN_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include "llmkern/status.h"

#ifdef __cplusplus
extern "C" {
#endif

static inline lk_status lk_cuda_fail(cudaError_t e, const char *what, const char *file, int line) {
    return lk_error(LK_EDEVICE, "%s: %s (%s) at %s:%d", what, cudaGetErrorString(e), cudaGetErrorName(e),
                    file, line);
}

#define LK_CUDA_TRY(call)                                                                  \
    do {                                                                                   \
        cudaError_t lk_e_ = (call);                                                        \
        if (lk_e_ != cudaSuccess) return lk_cuda_fail(lk_e_, #call, __FILE__, __LINE__);   \
    } while (0)

#define LK_CUDA_LAUNCHED(what)                                                             \
    do {                                                                                   \
        cudaError_t lk_e_ = cudaGetLastError();                                            \
        if (lk_e_ != cudaSuccess) return lk_cuda_fail(lk_e_, what, __FILE__, __LINE__);    \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
