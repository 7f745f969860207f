/* common.cuh — what the CUDA RMSNorm implementations (fused.cu, eager_fp32.cu)
 * share: the column sum that turns f32 partial rows into dweight, and the dispatch on
 * dtype. Included by those .cu files only. */
#ifndef LLMKERN_RMS_NORM_COMMON_CUH
#define LLMKERN_RMS_NORM_COMMON_CUH

#include "core/cuda_check.h"
#include "llmkern/rms_norm.h"
#include "ops/cuda_util.cuh"

/* dw[c] = Σ_p partial[p, c], summed in f32 in a fixed order (deterministic) and rounded
 * once. Block (32, 8): 32 columns, 8 strided slices of the parts, then a shared sum. */
template <typename T>
__global__ void lk_rms_dw_reduce(const float *__restrict__ partial, int64_t parts, int n, T *__restrict__ dw) {
    __shared__ float s[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < n)
        for (int64_t p = threadIdx.y; p < parts; p += 8) acc += partial[p * n + c];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        float t = 0.0f;
#pragma unroll
        for (int y = 0; y < 8; y++) t += s[y][threadIdx.x];
        dw[c] = lk_from_f32<T>(t);
    }
}

static inline lk_status lk_rms_dw_finish(const float *partial, int64_t parts, int n, void *dw, lk_dtype dt,
                                         cudaStream_t st) {
    dim3 block(32, 8), grid((unsigned)lk_cdiv(n, 32));
    if (dt == LK_F32) lk_rms_dw_reduce<float><<<grid, block, 0, st>>>(partial, parts, n, (float *)dw);
    else lk_rms_dw_reduce<lk_bf16_t><<<grid, block, 0, st>>>(partial, parts, n, (lk_bf16_t *)dw);
    LK_CUDA_LAUNCHED("rms_norm: dweight column sum");
    return LK_OK;
}

/* rows == 0 (the facade lets the CUDA implementations handle it): dweight = 0. */
static inline lk_status lk_rms_dw_zero(const lk_rms_norm_args *a, cudaStream_t st) {
    if (a->weight.data && a->dweight.data)
        LK_CUDA_TRY(cudaMemsetAsync(a->dweight.data, 0, lk_tensor_bytes(&a->dweight), st));
    return LK_OK;
}

#endif
