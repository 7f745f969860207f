/* multi_tensor.cuh — what the multi-tensor kernels (adamw.cu, grad_norm.cu) share: a
 * list of tensors is cut into fixed blocks of LK_MT_CHUNK elements (a tensor's last block
 * may be short), one CUDA block per piece, all tensors in ONE launch. Each descriptor
 * carries block0, the index of its first block; a block finds its tensor by binary
 * search over the list, which lives in device memory from the workspace arena.
 * The mapping depends only on the sizes, so per-block results come out in a fixed order
 * (the norm's determinism rests on it). Included by the .cu files only. */
#ifndef LLMKERN_TRAIN_CUDA_MULTI_TENSOR_CUH
#define LLMKERN_TRAIN_CUDA_MULTI_TENSOR_CUH

#include <stdint.h>
#include <string.h>
#include "core/cuda_check.h"
#include "llmkern/context.h"
#include "ops/cuda_util.cuh"

#define LK_MT_THREADS 256
#define LK_MT_PER_THREAD 16
#define LK_MT_CHUNK (LK_MT_THREADS * LK_MT_PER_THREAD)

/* The tensor whose blocks hold block b: the last d with d.block0 <= b. */
template <typename D>
static __device__ __forceinline__ int lk_mt_find(const D *d, int n, int64_t b) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (d[mid].block0 <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* f32 or bf16 element i of p (dtype is an lk_dtype). */
static __device__ __forceinline__ float lk_mt_ld(const void *p, int bf16, int64_t i) {
    return bf16 ? __bfloat162float(static_cast<const lk_bf16_t *>(p)[i]) : static_cast<const float *>(p)[i];
}
static __device__ __forceinline__ void lk_mt_st(void *p, int bf16, int64_t i, float v) {
    if (bf16) static_cast<lk_bf16_t *>(p)[i] = __float2bfloat16_rn(v);
    else static_cast<float *>(p)[i] = v;
}

/* Four consecutive f32 or bf16 elements from i (16 or 8 bytes, aligned by the caller). */
static __device__ __forceinline__ float4 lk_mt_ld4(const void *p, int bf16, int64_t i) {
    if (!bf16) return *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
    const uint2 u = *reinterpret_cast<const uint2 *>(static_cast<const lk_bf16_t *>(p) + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

/* Whether block `start`'s LK_MT_CHUNK elements are all there and every pointer's piece of
 * them 16-byte aligned: the blocks take 4 elements a load then (a thread 4 x 4 consecutive
 * elements, a warp's load 512 contiguous bytes), where one 4-byte load each left memory
 * with too few requests in flight (bench/NOTES.md, sixteenth session). bf16 pieces need 8. */
static __device__ __forceinline__ bool lk_mt_vec(int64_t start, int64_t n, uintptr_t f32_ptrs, uintptr_t bf16_ptrs) {
    return start + LK_MT_CHUNK <= n && f32_ptrs % 16 == 0 && bf16_ptrs % 8 == 0;
}

/* A CUDA context with a device arena; the error names fn and the field. */
static inline lk_status lk_mt_check_ctx(const char *fn, const lk_ctx *ctx) {
    if (ctx == NULL) return lk_error(LK_EINVAL, "%s: ctx: expected a CUDA context, got NULL", fn);
    if (ctx->device.type != LK_DEVICE_CUDA)
        return lk_error(LK_EINVAL, "%s: ctx.device: expected cuda, got %s", fn, lk_device_name(ctx->device.type));
    return LK_OK;
}

/* Copies the host list of n descriptors into a piece of the arena, on the stream.
 * A copy from pageable memory has left the host buffer when the call returns. */
template <typename D>
static inline lk_status lk_mt_upload(const char *fn, lk_ctx *ctx, const D *host, int n, D **dev) {
    *dev = static_cast<D *>(lk_arena_alloc(ctx->arena, sizeof(D) * (size_t)n));
    if (*dev == NULL) return lk_error(LK_EINTERNAL, "%s: workspace smaller than its query", fn);
    LK_CUDA_TRY(cudaMemcpyAsync(*dev, host, sizeof(D) * (size_t)n, cudaMemcpyHostToDevice,
                                static_cast<cudaStream_t>(ctx->stream)));
    return LK_OK;
}

#endif
