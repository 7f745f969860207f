/* ulysses.cu — the device side of the Ulysses exchange (ulysses.c) for CUDA
 * tensors: a box of a [n0, n1, n2, n3] tensor packed into or unpacked from the staging
 * buffer with one strided copy per dim-0 index, the KV-repeat sum of boxes into an f32
 * accumulator and its conversion back, zeroing, and host<->device copies of the small
 * metadata. Everything on the caller's stream; `sync` waits for it (a collective on
 * another stream reads what it wrote). */
#include "core/cuda_check.h"
#include "ops/attention/ulysses.h"
#include "ops/cuda_util.cuh"

extern "C" lk_status lk_ulysses_cuda_box(char *base, const int64_t n[4], int64_t o1, int64_t o2, int64_t m1,
                                         int64_t m2, char *buf, size_t es, int pack, void *stream) {
    size_t run = (size_t)(m2 * n[3]) * es, pitch = (size_t)(n[2] * n[3]) * es;
    for (int64_t i0 = 0; i0 < n[0]; i0++) {
        char *t = base + (size_t)(((i0 * n[1] + o1) * n[2] + o2) * n[3]) * es, *b = buf + (size_t)(i0 * m1) * run;
        cudaError_t e = pack ? cudaMemcpy2DAsync(b, run, t, pitch, run, (size_t)m1, cudaMemcpyDeviceToDevice,
                                                 (cudaStream_t)stream)
                             : cudaMemcpy2DAsync(t, pitch, b, run, run, (size_t)m1, cudaMemcpyDeviceToDevice,
                                                 (cudaStream_t)stream);
        if (e != cudaSuccess) return lk_cuda_fail(e, "attention: ulysses: box copy", __FILE__, __LINE__);
    }
    return LK_OK;
}

template <typename T>
__global__ void acc_box(float *acc, int64_t n1, int64_t n2, int64_t n3, int64_t o1, int64_t o2, int64_t m1,
                        int64_t run, int64_t total, const T *buf) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= total) return;
    int64_t j = e % run, i1 = e / run % m1, i0 = e / (run * m1);
    acc[((i0 * n1 + o1 + i1) * n2 + o2) * n3 + j] += lk_to_f32(buf[e]);
}

extern "C" lk_status lk_ulysses_cuda_acc(float *acc, const int64_t n[4], int64_t o1, int64_t o2, int64_t m1,
                                         int64_t m2, const char *buf, lk_dtype dt, void *stream) {
    int64_t run = m2 * n[3], total = n[0] * m1 * run;
    if (total == 0) return LK_OK;
    unsigned blocks = (unsigned)((total + 255) / 256);
    if (dt == LK_F32)
        acc_box<float><<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, n[1], n[2], n[3], o1, o2, m1, run, total,
                                                                 (const float *)buf);
    else
        acc_box<lk_bf16_t><<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, n[1], n[2], n[3], o1, o2, m1, run, total,
                                                                     (const lk_bf16_t *)buf);
    LK_CUDA_LAUNCHED("attention: ulysses: KV-repeat sum");
    return LK_OK;
}

template <typename T>
__global__ void from_f32(const float *acc, T *dst, int64_t n) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e < n) dst[e] = lk_from_f32<T>(acc[e]);
}

extern "C" lk_status lk_ulysses_cuda_convert(const float *acc, void *dst, lk_dtype dt, int64_t n, void *stream) {
    if (n == 0) return LK_OK;
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (dt == LK_F32) from_f32<float><<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, (float *)dst, n);
    else from_f32<lk_bf16_t><<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, (lk_bf16_t *)dst, n);
    LK_CUDA_LAUNCHED("attention: ulysses: KV-repeat sum back to storage");
    return LK_OK;
}

extern "C" lk_status lk_ulysses_cuda_zero(void *p, size_t bytes, void *stream) {
    LK_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream));
    return LK_OK;
}

extern "C" lk_status lk_ulysses_cuda_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream) {
    LK_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                (cudaStream_t)stream));
    LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}

extern "C" lk_status lk_ulysses_cuda_sync(void *stream) {
    LK_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return LK_OK;
}
