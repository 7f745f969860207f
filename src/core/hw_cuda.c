/* hw_cuda.c — the one place the GPU is probed (cudaGetDeviceProperties): device count,
 * and for device 0 its name, compute capability, multiprocessors, opt-in shared memory
 * per block and L2 size. lk_init() calls it once, next to the CPU probe; requirements
 * (min_cc) and `llmkern list` read the lk_hw it fills. Built only with CUDA; a machine
 * with no GPU or no driver leaves cuda_devices = 0 and says why in cuda_why. has_cudnn:
 * the build has the cudnn row (LLMKERN_HAVE_CUDNN) and the library answers cudnnGetVersion.
 * lk_hw_cuda_mem_free: the current GPU's free memory, for lk_hw_mem_available. */
#include <stdio.h>
#include <cuda_runtime_api.h>
#ifdef LLMKERN_HAVE_CUDNN
#include <cudnn.h>
#endif
#include "llmkern/registry.h"

void lk_hw_probe_cuda(lk_hw *hw) {
#ifdef LLMKERN_HAVE_CUDNN
    hw->has_cudnn = cudnnGetVersion() >= 90000;   /* cuDNN 9: what the frontend's SDPA graphs need */
#endif
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        hw->cuda_devices = 0;
        snprintf(hw->cuda_why, sizeof hw->cuda_why, "no CUDA GPU: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        cudaGetLastError();               /* a probe that finds nothing leaves no error behind */
        return;
    }
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
        hw->cuda_devices = 0;
        snprintf(hw->cuda_why, sizeof hw->cuda_why, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }
    hw->cuda_devices = n;
    hw->cuda_cc = p.major * 10 + p.minor;
    hw->cuda_sms = p.multiProcessorCount;
    hw->cuda_smem_per_block = p.sharedMemPerBlockOptin;
    hw->cuda_l2_bytes = (size_t)p.l2CacheSize;
    snprintf(hw->cuda_name, sizeof hw->cuda_name, "%s", p.name);
    hw->cuda_why[0] = '\0';
}

/* The calling thread's current GPU: its free memory now (what an allocation can take). */
uint64_t lk_hw_cuda_mem_free(char *source, size_t n) {
    size_t free_b = 0, total = 0;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaError_t e = cudaMemGetInfo(&free_b, &total);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(source, n, "on GPU %d (cudaMemGetInfo failed: %s)", dev, cudaGetErrorString(e));
        return 0;
    }
    snprintf(source, n, "free on GPU %d (cudaMemGetInfo, of %.1f GiB)", dev, (double)total / 1073741824.0);
    return (uint64_t)free_b;
}
