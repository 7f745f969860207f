/* dist_gpu.h — what the multi-GPU tests (tests/cuda/dist_*.c) share beside
 * tests/dist/util.h: host buffers to and from the rank's GPU. */
#ifndef LLMKERN_TESTS_CUDA_DIST_GPU_H
#define LLMKERN_TESTS_CUDA_DIST_GPU_H

#include <stdlib.h>
#include <cuda_runtime_api.h>

/* n bytes of h on the GPU; h NULL: NaN poison (0xff bytes). Exits when out of memory. */
static inline void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) exit(1);
    if (h) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    else cudaMemset(d, 0xff, n);
    return d;
}

/* n bytes of d in new host memory (the caller frees it). */
static inline void *host_copy(const void *d, size_t n) {
    void *h = malloc(n ? n : 1);
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    return h;
}

#endif
