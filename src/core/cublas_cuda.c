/* cublas_cuda.c — cuBLAS handles, one per device created on first use, each with a
 * workspace of its own, and the row-major GEMM of cublas_util.h. Row-major
 * C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so the call swaps the operands and
 * keeps each one's transpose flag.
 *
 * The workspace: without one set, cuBLAS takes its own from a pool, which it cannot do
 * inside a CUDA-graph capture, so a captured GEMM may run another algorithm than the same
 * GEMM run eagerly (other bits). With WORKSPACE_BYTES of our own (PyTorch's size for
 * Hopper), set again after each cublasSetStream (which resets it), both run alike. */
#include <pthread.h>
#include <cublas_v2.h>
#include "core/cublas_util.h"
#include "core/cuda_check.h"

#define MAX_DEVICES 16
#define WORKSPACE_BYTES ((size_t)32 << 20)

static cublasHandle_t handles[MAX_DEVICES];
static void *workspaces[MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static lk_status cublas_fail(cublasStatus_t s, const char *what) {
    return lk_error(LK_EDEVICE, "%s: %s (%s)", what, cublasGetStatusString(s), cublasGetStatusName(s));
}

static lk_status handle_of(int device, cublasHandle_t *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return lk_error(LK_EINVAL, "cublas: device: expected 0..%d, got %d", MAX_DEVICES - 1, device);
    pthread_mutex_lock(&lock);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (handles[device] == NULL) {
        int cur = 0;
        cudaGetDevice(&cur);
        if (cur != device) cudaSetDevice(device);
        s = cublasCreate(&handles[device]);
        if (s == CUBLAS_STATUS_SUCCESS && cudaMalloc(&workspaces[device], WORKSPACE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            cublasDestroy(handles[device]);
            handles[device] = NULL;
            s = CUBLAS_STATUS_ALLOC_FAILED;
        }
        if (cur != device) cudaSetDevice(cur);
    }
    *out = handles[device];
    pthread_mutex_unlock(&lock);
    return s == CUBLAS_STATUS_SUCCESS ? LK_OK : cublas_fail(s, "cublasCreate (and its workspace)");
}

static cudaDataType_t cuda_type(lk_dtype dt) { return dt == LK_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

lk_status lk_cublas_gemm(int device, void *stream, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                         lk_dtype ab_dt, const void *a, int64_t lda, const void *b, int64_t ldb,
                         float beta, lk_dtype c_dt, void *c, int64_t ldc) {
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return lk_error(LK_ESHAPE, "cublas: gemm: expected dims below 2^31, got m %lld n %lld k %lld",
                        (long long)m, (long long)n, (long long)k);
    if (m == 0 || n == 0) return LK_OK;
    cublasHandle_t h = NULL;
    lk_status st = handle_of(device, &h);
    if (st) return st;
    cublasStatus_t s = cublasSetStream(h, (cudaStream_t)stream);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_fail(s, "cublasSetStream");
    if ((s = cublasSetWorkspace(h, workspaces[device], WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS)
        return cublas_fail(s, "cublasSetWorkspace");
    const float alpha = 1.0f;
    s = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
                     (int)k, &alpha, b, cuda_type(ab_dt), (int)ldb, a, cuda_type(ab_dt), (int)lda, &beta, c,
                     cuda_type(c_dt), (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? LK_OK : cublas_fail(s, "cublasGemmEx");
}
