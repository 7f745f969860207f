/* norm.cuh — grad_norm.cu's two passes of the global sum of squares, for adamw.cu's plan
 * to launch as well (one definition, launched from both files): per 4096-element chunk
 * in f64 into part[chunk] (two chunks a CUDA block), then one block of FINAL_THREADS sums
 * part[] into *out, both in a fixed order. Included by the .cu files only. */
#ifndef LLMKERN_TRAIN_CUDA_NORM_CUH
#define LLMKERN_TRAIN_CUDA_NORM_CUH

#include "ops/train_cuda/multi_tensor.cuh"

#define FINAL_THREADS 1024

typedef struct {
    void *p;
    int64_t n, block0;
    int bf16;
} ndesc;

__global__ void sumsq_kernel(const ndesc *list, int n_list, int64_t chunks, double *part);
__global__ void final_kernel(const double *part, int64_t n, double *out);

/* sumsq_kernel's grid: a CUDA block takes two chunks. */
static inline unsigned lk_sumsq_grid(int64_t chunks) { return (unsigned)((chunks + 1) / 2); }

#endif
