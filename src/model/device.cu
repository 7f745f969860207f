/* device.cu — the model's buffers in GPU memory and its own moves as kernels (device.h):
 * cudaMalloc'd blocks, synchronous copies, an f32 fill, the head transpose (one thread
 * per 16 bytes of a head row when D allows), the residual add and the gradient sum (f32
 * math, bf16 rounded once), the weights' bf16 copy, and the embedding through the
 * training kernels of cuda_train.h (gather; sorted, atomic-free scatter-add), and the
 * sequence-parallel group's loss from sums all-reduced on the stream. Built with CUDA only. */
#include <cuda_runtime_api.h>
#include "core/cuda_check.h"
#include "llmkern/cuda_train.h"
#include "model/device.h"
#include "ops/cuda_util.cuh"

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

static void *host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault) != cudaSuccess) { cudaGetLastError(); return NULL; }
    return p;
}

static void host_free(void *p) {
    if (p) cudaFreeHost(p);
}

static lk_status put_async(void *dst, const void *src, size_t bytes, lk_ctx *ctx) {
    if (bytes) LK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)ctx->stream));
    return LK_OK;
}

static lk_status zero(void *p, size_t bytes, lk_ctx *ctx) {
    if (bytes) LK_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)ctx->stream));
    return LK_OK;
}

__global__ void fill_k(float *p, float v, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i < n) p[i] = v;
}

static lk_status fill(float *p, float v, int64_t n, lk_ctx *ctx) {
    if (n == 0) return LK_OK;
    fill_k<<<blocks(n), THREADS, 0, (cudaStream_t)ctx->stream>>>(p, v, n);
    LK_CUDA_LAUNCHED("model: fill");
    return LK_OK;
}

/* Element i of the [T, H, D] side, in units of U (16 bytes when a head row allows): token
 * t, head h, column c; that side's token rows are ldw units apart. */
template <typename U>
__global__ void heads_k(const U *src, U *dst, int64_t T, int64_t H, int64_t Dw, int64_t ldw, int back) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i >= T * H * Dw) return;
    int64_t c = i % Dw, th = i / Dw, h = th % H, t = th / H, j = (h * T + t) * Dw + c, r = t * ldw + h * Dw + c;
    if (back) dst[r] = src[j];
    else dst[j] = src[r];
}

static lk_status heads(const void *src, void *dst, int64_t T, int64_t H, int64_t D, int64_t ld, int back,
                       lk_dtype dt, lk_ctx *ctx) {
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const int64_t es = (int64_t)lk_dtype_size(dt), row = D * es, ldb = ld * es;   /* bytes */
    const uintptr_t at = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)row | (uintptr_t)ldb;
    if (at % 16 == 0) {
        heads_k<uint4><<<blocks(T * H * row / 16), THREADS, 0, st>>>((const uint4 *)src, (uint4 *)dst, T, H, row / 16,
                                                                    ldb / 16, back);
    } else if (at % 4 == 0) {
        heads_k<uint32_t><<<blocks(T * H * row / 4), THREADS, 0, st>>>((const uint32_t *)src, (uint32_t *)dst, T, H,
                                                                      row / 4, ldb / 4, back);
    } else {
        heads_k<uint16_t><<<blocks(T * H * row / 2), THREADS, 0, st>>>((const uint16_t *)src, (uint16_t *)dst, T, H,
                                                                      row / 2, ldb / 2, back);
    }
    LK_CUDA_LAUNCHED("model: head transpose");
    return LK_OK;
}

/* W elements a thread (16 bytes of each input when every pointer allows), the tail one
 * at a time: the residual adds were 15.8 ms of a 0.6B model's 420 ms bf16 step at one
 * bf16 a thread (bench/NOTES.md). */
template <typename T, int W>
__global__ void add_k(T *dst, const T *a, const T *b, int64_t n) {
    int64_t i = (blockIdx.x * (int64_t)THREADS + threadIdx.x) * W;
    if (i + W <= n) {
        float x[W], y[W];
        lk_ldw<T, W>(a + i, x, false);
        lk_ldw<T, W>(b + i, y, false);
#pragma unroll
        for (int j = 0; j < W; j++) x[j] += y[j];
        lk_stw<T, W>(dst + i, x, false);
    } else {
        for (; i < n; i++) dst[i] = lk_from_f32<T>(lk_to_f32(a[i]) + lk_to_f32(b[i]));
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <typename T>
static void add_launch(void *dst, const void *a, const void *b, int64_t n, cudaStream_t st) {
    const int W = lk_vec<T>::N;
    if (aligned16(dst) && aligned16(a) && aligned16(b))
        add_k<T, lk_vec<T>::N><<<blocks(lk_cdiv(n, W)), THREADS, 0, st>>>((T *)dst, (const T *)a, (const T *)b, n);
    else
        add_k<T, 1><<<blocks(n), THREADS, 0, st>>>((T *)dst, (const T *)a, (const T *)b, n);
}

static lk_status add(void *dst, const void *a, const void *b, int64_t n, lk_dtype dt, lk_ctx *ctx) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (dt == LK_BF16) add_launch<lk_bf16_t>(dst, a, b, n, st);
    else add_launch<float>(dst, a, b, n, st);
    LK_CUDA_LAUNCHED("model: residual add");
    return LK_OK;
}

template <typename D, typename T>
__global__ void acc_k(D *dst, const T *src, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i < n) dst[i] = lk_from_f32<D>(lk_to_f32(dst[i]) + lk_to_f32(src[i]));
}

template <typename D>
static void acc_launch(D *dst, const void *src, int64_t n, lk_dtype dt, cudaStream_t st) {
    if (dt == LK_BF16) acc_k<<<blocks(n), THREADS, 0, st>>>(dst, (const lk_bf16_t *)src, n);
    else acc_k<<<blocks(n), THREADS, 0, st>>>(dst, (const float *)src, n);
}

static lk_status acc(void *dst, lk_dtype ddt, const void *src, lk_dtype dt, int64_t n, lk_ctx *ctx) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (ddt == LK_BF16) acc_launch((lk_bf16_t *)dst, src, n, dt, st);
    else acc_launch((float *)dst, src, n, dt, st);
    LK_CUDA_LAUNCHED("model: gradient sum");
    return LK_OK;
}

/* Four elements a thread: the whole parameter buffer in one launch (a multiple of 16
 * floats, lk_qwen3's layout). */
__global__ void round_k(lk_bf16_t *dst, const float *src, int64_t n4) {
    int64_t i = blockIdx.x * (int64_t)THREADS + threadIdx.x;
    if (i >= n4) return;
    float4 v = reinterpret_cast<const float4 *>(src)[i];
    uint2 o = {lk_pack_bf16x2(v.x, v.y), lk_pack_bf16x2(v.z, v.w)};
    reinterpret_cast<uint2 *>(dst)[i] = o;
}

static lk_status round_to(void *dst, const float *src, int64_t n, lk_dtype dt, lk_ctx *ctx) {
    if (dt == LK_F32 && dst == (const void *)src) return LK_OK;   /* f32: the master is the copy */
    if (dt != LK_BF16 || n % 4)
        return lk_error(LK_EINTERNAL, "model: the weights' copy: expected bf16 of a multiple of 4 floats, got %s of %lld",
                        lk_dtype_name(dt), (long long)n);
    if (n) round_k<<<blocks(n / 4), THREADS, 0, (cudaStream_t)ctx->stream>>>((lk_bf16_t *)dst, src, n / 4);
    LK_CUDA_LAUNCHED("model: the weights' bf16 copy");
    return LK_OK;
}

static lk_status embed(const void *table, const int64_t *ids, void *x, int64_t T, int64_t H, int64_t V, lk_dtype dt,
                       lk_ctx *ctx) {
    lk_tensor w = lk_tensor_2d((void *)table, dt, V, H), id = lk_tensor_1d((void *)ids, LK_I64, T),
              out = lk_tensor_2d(x, dt, T, H);
    w.device = id.device = out.device = ctx->device;
    return lk_cuda_embedding_forward_unchecked(&w, &id, &out, ctx);   /* check_batch read every id */
}

static lk_status embed_backward(void *dtable, lk_dtype tdt, const int64_t *ids, const void *dx, int64_t T, int64_t H,
                                int64_t V, lk_dtype dt, lk_ctx *ctx) {
    lk_tensor dw = lk_tensor_2d(dtable, tdt, V, H), id = lk_tensor_1d((void *)ids, LK_I64, T),
              d = lk_tensor_2d((void *)dx, dt, T, H);
    dw.device = id.device = d.device = ctx->device;
    return lk_cuda_embedding_backward_unchecked(&d, &id, &dw, ctx);
}

static lk_status flex_attach(lk_block_mask *m, const lk_flex_image *L, const lk_flex_prog *prog, const int32_t *img,
                             uint32_t *bits, lk_ctx *ctx) {
    return lk_attn_flex_attach(m, L, prog, img, bits, ctx->stream);
}

/* The group's sums in scal[0] (f32) and at scal + 4 (i64): the mean and d_loss from them. */
__global__ void group_loss_k(float *scal, float scale) {
    const int64_t n = *reinterpret_cast<const int64_t *>(scal + 4);
    scal[0] = n > 0 ? (float)((double)scal[0] / (double)n) : 0.0f;
    scal[1] = n > 0 ? (float)((double)scale / (double)n) : 0.0f;
}

static lk_status group_loss(float *scal, float scale, lk_comm *sp, lk_ctx *ctx) {
    lk_status s;
    if ((s = lk_comm_all_reduce_on(sp, scal, 1, LK_COMM_F32, ctx->stream)) ||
        (s = lk_comm_all_reduce_on(sp, scal + 4, 1, LK_COMM_I64, ctx->stream)))
        return s;
    group_loss_k<<<1, 1, 0, (cudaStream_t)ctx->stream>>>(scal, scale);
    LK_CUDA_LAUNCHED("model: the sequence-parallel group's loss");
    return LK_OK;
}

const lk_model_device lk_model_device_cuda = {
    .type = LK_DEVICE_CUDA, .current = current, .alloc = alloc, .free = release, .put = put, .get = get,
    .host_alloc = host_alloc, .host_free = host_free, .put_async = put_async,
    .zero = zero, .fill = fill, .heads = heads, .add = add, .acc = acc, .round = round_to, .embed = embed,
    .embed_backward = embed_backward, .flex_attach = flex_attach, .group_loss = group_loss,
};
