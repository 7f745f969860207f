/* rows.cu — the moves of the expert-parallel dispatchers on CUDA tensors (rows.h; called
 * through rows.c): rows gathered by a permutation, the (local id, weight) pairs packed for
 * the exchange and split after it, each token's returned rows summed in f32, a gradient
 * picked back by position, and copies. One thread an element (a row's bytes move in the
 * widest unit its size and pointers allow); everything on the caller's stream. */
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe_dispatch/rows.h"

static unsigned grid(int64_t n) { return (unsigned)((n + 255) / 256); }

/* dst[p, :] = src[order[p] / k, :], rows of w units. */
template <typename U>
__global__ void gather_rows(U *dst, const U *src, const int32_t *order, int64_t n, int64_t w, int64_t k) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * w) return;
    int64_t p = e / w, c = e - p * w;
    dst[e] = src[(int64_t)(order[p] / k) * w + c];
}

template <typename U>
static void gather_as(void *dst, const void *src, const int32_t *order, int64_t n, int64_t k, size_t row,
                      cudaStream_t st) {
    int64_t w = (int64_t)(row / sizeof(U));
    gather_rows<U><<<grid(n * w), 256, 0, st>>>((U *)dst, (const U *)src, order, n, w, k);
}

extern "C" lk_status lk_ep_cuda_gather(void *dst, const void *src, const int32_t *order, int64_t n, int64_t k,
                                       size_t row, void *stream) {
    if (n == 0 || row == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    /* the widest unit that divides the row and both bases (then every row's start) */
    size_t al = row | (size_t)(uintptr_t)dst | (size_t)(uintptr_t)src;
    if (al % 16 == 0) gather_as<uint4>(dst, src, order, n, k, row, st);
    else if (al % 8 == 0) gather_as<uint2>(dst, src, order, n, k, row, st);
    else if (al % 4 == 0) gather_as<uint32_t>(dst, src, order, n, k, row, st);
    else if (al % 2 == 0) gather_as<uint16_t>(dst, src, order, n, k, row, st);
    else gather_as<uint8_t>(dst, src, order, n, k, row, st);
    LK_CUDA_LAUNCHED("moe_dispatch: rows gathered");
    return LK_OK;
}

__global__ void pack_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order, int64_t n,
                          int32_t El) {
    int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (p >= n) return;
    int32_t r = order[p];
    meta[2 * p] = ids[r] % El;
    meta[2 * p + 1] = __float_as_int(w[r]);
}

extern "C" lk_status lk_ep_cuda_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order,
                                     int64_t n, int64_t El, void *stream) {
    if (n == 0) return LK_OK;
    pack_meta<<<grid(n), 256, 0, (cudaStream_t)stream>>>(meta, ids, w, order, n, (int32_t)El);
    LK_CUDA_LAUNCHED("moe_dispatch: routes' expert and weight packed");
    return LK_OK;
}

__global__ void split_meta(const int32_t *meta, int32_t *ids, float *w, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    ids[i] = meta[2 * i];
    w[i] = __int_as_float(meta[2 * i + 1]);
}

extern "C" lk_status lk_ep_cuda_unmeta(const int32_t *meta, int32_t *ids, float *w, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    split_meta<<<grid(n), 256, 0, (cudaStream_t)stream>>>(meta, ids, w, n);
    LK_CUDA_LAUNCHED("moe_dispatch: received expert and weight split");
    return LK_OK;
}

/* dst[t, c] = Σ_j src[pos[t·k + j], c] over pos >= 0 (pos NULL: t·k + j), f32, rounded once. */
template <typename Ti, typename To>
__global__ void combine_rows(To *dst, const Ti *src, const int32_t *pos, int64_t n, int64_t k, int64_t h) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * h) return;
    int64_t t = e / h, c = e - t * h;
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t p = pos ? (int64_t)pos[t * k + j] : t * k + j;
        if (p >= 0) s += lk_to_f32(src[p * h + c]);
    }
    dst[e] = lk_from_f32<To>(s);
}

template <typename Ti>
static void combine_from(void *dst, lk_dtype dst_dt, const void *src, const int32_t *pos, int64_t n, int64_t k,
                         int64_t H, cudaStream_t st) {
    if (dst_dt == LK_F32)
        combine_rows<Ti, float><<<grid(n * H), 256, 0, st>>>((float *)dst, (const Ti *)src, pos, n, k, H);
    else
        combine_rows<Ti, lk_bf16_t><<<grid(n * H), 256, 0, st>>>((lk_bf16_t *)dst, (const Ti *)src, pos, n, k, H);
}

extern "C" lk_status lk_ep_cuda_combine(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt,
                                        const int32_t *pos, int64_t n, int64_t k, int64_t H, void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (src_dt == LK_F32) combine_from<float>(dst, dst_dt, src, pos, n, k, H, st);
    else combine_from<lk_bf16_t>(dst, dst_dt, src, pos, n, k, H, st);
    LK_CUDA_LAUNCHED("moe_dispatch: rows summed per token");
    return LK_OK;
}

__global__ void pick_by_pos(float *dst, const float *src, const int32_t *pos, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = pos[i] >= 0 ? src[pos[i]] : 0.0f;
}

extern "C" lk_status lk_ep_cuda_pick(float *dst, const float *src, const int32_t *pos, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    pick_by_pos<<<grid(n), 256, 0, (cudaStream_t)stream>>>(dst, src, pos, n);
    LK_CUDA_LAUNCHED("moe_dispatch: d_topk_weights picked back");
    return LK_OK;
}

extern "C" lk_status lk_ep_cuda_copy(void *dst, const void *src, size_t bytes, int wait, void *stream) {
    if (bytes && dst != src) LK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    if (wait) LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}

extern "C" lk_status lk_ep_cuda_sync(void *stream) {
    LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}
