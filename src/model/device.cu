/* device.cu — the model's buffers in GPU memory and its own moves as kernels (device.h):
 * cudaMalloc'd blocks, synchronous copies, the head transpose (one thread per float4 of
 * a head row when D allows), the residual add, and the embedding through the training
 * kernels of cuda_train.h (gather; sorted, atomic-free scatter-add). Built with CUDA only. */
#include <cuda_runtime_api.h>
#include "core/cuda_check.h"
#include "llmkern/cuda_train.h"
#include "model/device.h"

#define THREADS 256

static unsigned blocks(int64_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

static int current(void) {
    int d = 0;
    return cudaGetDevice(&d) == cudaSuccess ? d : 0;
}

static void *alloc(size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? bytes : 64;
    if (cudaMalloc(&p, n) != cudaSuccess) { cudaGetLastError(); return NULL; }
    if (cudaMemset(p, 0, n) != cudaSuccess) { cudaFree(p); cudaGetLastError(); return NULL; }
    return p;
}

static void release(void *p) {
    if (p) cudaFree(p);
}

static lk_status put(void *dst, const void *src, size_t bytes) {
    if (bytes) LK_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return LK_OK;
}

static lk_status get(void *dst, const void *src, size_t bytes) {
    if (bytes) LK_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return LK_OK;
}

static lk_status zero(void *p, size_t bytes, lk_ctx *ctx) {
    if (bytes) LK_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)ctx->stream));
    return LK_OK;
}

/* Element i of the [T, H, D] side, in units of W floats: token t, head h, column c. */
template <typename U>
__global__ void heads_k(const U *src, U *dst, int64_t T, int64_t H, int64_t Dw, int back) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i >= T * H * Dw) return;
    int64_t c = i % Dw, th = i / Dw, h = th % H, t = th / H, j = (h * T + t) * Dw + c;
    if (back) dst[i] = src[j];
    else dst[j] = src[i];
}

static lk_status heads(const float *src, float *dst, int64_t T, int64_t H, int64_t D, int back, lk_ctx *ctx) {
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (D % 4 == 0) {
        heads_k<float4><<<blocks(T * H * D / 4), THREADS, 0, st>>>((const float4 *)src, (float4 *)dst, T, H, D / 4,
                                                                  back);
    } else {
        heads_k<float><<<blocks(T * H * D), THREADS, 0, st>>>(src, dst, T, H, D, back);
    }
    LK_CUDA_LAUNCHED("model: head transpose");
    return LK_OK;
}

__global__ void add_k(float *dst, const float *a, const float *b, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i < n) dst[i] = a[i] + b[i];
}

static lk_status add(float *dst, const float *a, const float *b, int64_t n, lk_ctx *ctx) {
    if (n == 0) return LK_OK;
    add_k<<<blocks(n), THREADS, 0, (cudaStream_t)ctx->stream>>>(dst, a, b, n);
    LK_CUDA_LAUNCHED("model: residual add");
    return LK_OK;
}

static lk_status embed(const float *table, const int64_t *ids, float *x, int64_t T, int64_t H, int64_t V,
                       lk_ctx *ctx) {
    lk_tensor w = lk_tensor_2d((void *)table, LK_F32, V, H), id = lk_tensor_1d((void *)ids, LK_I64, T),
              out = lk_tensor_2d(x, LK_F32, T, H);
    w.device = id.device = out.device = ctx->device;
    return lk_cuda_embedding_forward(&w, &id, &out, ctx);
}

static lk_status embed_backward(float *dtable, const int64_t *ids, const float *dx, int64_t T, int64_t H, int64_t V,
                                lk_ctx *ctx) {
    lk_tensor dw = lk_tensor_2d(dtable, LK_F32, V, H), id = lk_tensor_1d((void *)ids, LK_I64, T),
              d = lk_tensor_2d((void *)dx, LK_F32, T, H);
    dw.device = id.device = d.device = ctx->device;
    return lk_cuda_embedding_backward(&d, &id, &dw, ctx);
}

const lk_model_device lk_model_device_cuda = {
    LK_DEVICE_CUDA, current, alloc, release, put, get, zero, heads, add, embed, embed_backward,
};
