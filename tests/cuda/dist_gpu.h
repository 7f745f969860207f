/* dist_gpu.h — what the multi-GPU tests (tests/cuda/dist_*.c) share beside
 * tests/dist/util.h: a GPU a rank or skip, and host buffers to and
 * from the rank's GPU. */
#ifndef LLMKERN_TESTS_CUDA_DIST_GPU_H
#define LLMKERN_TESTS_CUDA_DIST_GPU_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#include "util.h"

/* 1 when every rank has a GPU of its own and the world has at most max_ranks ranks;
 * otherwise rank 0 says why, the world is torn down, and the caller returns 77 (ctest's
 * skipped). Call right after dist_begin. */
static inline int dist_gpus_enough(const char *test, int max_ranks) {
    int ndev = 0, P = dist_world->size;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (ndev >= P && P <= max_ranks) return 1;
    if (dist_world->rank == 0) {
        printf("%s: SKIPPED, %d ranks need %d GPUs (one each", test, P, P);
        if (max_ranks < INT_MAX) printf(", at most %d", max_ranks);
        printf("), found %d\n", ndev);
    }
    lk_comm_destroy(dist_world);
    lk_comm_mpi_finalize();
    return 0;
}

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
