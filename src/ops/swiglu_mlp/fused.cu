/* fused.cu — the kernels of the CUDA `fused` SwiGLU MLP beside its cuBLAS GEMMs
 * (fused_cuda.c): the SwiGLU activation and its backward (cuda_act.h), one thread per
 * group of W elements of a row, 16-byte accesses when every row length, leading dimension
 * and pointer allows, else W = 1. The same function as act.h on the CPU, with the
 * hardware's exp: sigmoid(g) = 1 / (1 + e^−g). */
#include "core/cuda_check.h"
#include "cuda_act.h"
#include "ops/cuda_util.cuh"

#define THREADS 256

typedef struct {
    int64_t rows, cols;
    float limit;
} shape;

static __device__ __forceinline__ float clamp_gate(float g, float L) { return L > 0.0f ? fminf(g, L) : g; }
static __device__ __forceinline__ float clamp_up(float u, float L) { return L > 0.0f ? fminf(fmaxf(u, -L), L) : u; }
static __device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

/* One group of W a thread. Tried on the H200: two groups a thread (u and u + the grid's
 * threads, loads of both issued first) fell from 95-97% of the copy rate to 78%. */
template <typename T, int W>
__global__ void __launch_bounds__(THREADS) act_fwd(shape sh, const T *g, int64_t ldg, const T *u, int64_t ldu,
                                                  T *h, int64_t ldh) {
    int64_t upr = sh.cols / W, gid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (gid >= sh.rows * upr) return;
    int64_t r = gid / upr, c = (gid - r * upr) * W;
    float gv[W], uv[W], o[W];
    lk_ldw<T, W>(g + r * ldg + c, gv);
    lk_ldw<T, W>(u + r * ldu + c, uv);
#pragma unroll
    for (int j = 0; j < W; j++) {
        float gc = clamp_gate(gv[j], sh.limit);
        o[j] = gc * sigmoid(gc) * clamp_up(uv[j], sh.limit);
    }
    lk_stw<T, W>(h + r * ldh + c, o);
}

template <typename T, int W>
__global__ void __launch_bounds__(THREADS) act_bwd(shape sh, const T *dh, int64_t lddh, const T *g, int64_t ldg,
                                                  const T *u, int64_t ldu, T *dg, int64_t lddg, T *du,
                                                  int64_t lddu, T *h, int64_t ldh) {
    int64_t upr = sh.cols / W, gid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (gid >= sh.rows * upr) return;
    int64_t r = gid / upr, c = (gid - r * upr) * W;
    float dv[W], gv[W], uv[W], og[W], ou[W], oh[W];
    lk_ldw<T, W>(dh + r * lddh + c, dv);
    lk_ldw<T, W>(g + r * ldg + c, gv);
    lk_ldw<T, W>(u + r * ldu + c, uv);
    const float L = sh.limit;
#pragma unroll
    for (int j = 0; j < W; j++) {
        float gc = clamp_gate(gv[j], L), uc = clamp_up(uv[j], L), s = sigmoid(gc), silu = gc * s;
        float pass_g = L > 0.0f && gv[j] > L ? 0.0f : 1.0f, pass_u = L > 0.0f && fabsf(uv[j]) > L ? 0.0f : 1.0f;
        og[j] = dv[j] * uc * s * (1.0f + gc * (1.0f - s)) * pass_g;
        ou[j] = dv[j] * silu * pass_u;
        oh[j] = silu * uc;
    }
    lk_stw<T, W>(dg + r * lddg + c, og);
    lk_stw<T, W>(du + r * lddu + c, ou);
    if (h) lk_stw<T, W>(h + r * ldh + c, oh, false);   /* read back at once by a GEMM */
}

/* 16-byte groups when the row length, every leading dimension and every pointer allow. */
static int vector_ok(lk_dtype dt, int64_t cols, const int64_t *lds, const void *const *ptrs, int n) {
    int64_t w = dt == LK_F32 ? 4 : 8;
    int ok = cols % w == 0;
    for (int i = 0; i < n; i++) ok &= (ptrs[i] == NULL || lk_aligned16(ptrs[i])) && lds[i] % w == 0;
    return ok;
}

static unsigned blocks_of(int64_t rows, int64_t cols, int w) { return (unsigned)lk_cdiv(rows * (cols / w), THREADS); }

static lk_status check_args(lk_dtype dt, int64_t rows, int64_t cols) {
    if (dt != LK_F32 && dt != LK_BF16)
        return lk_error(LK_EDTYPE, "swiglu act (cuda): dt: expected f32 or bf16, got %s", lk_dtype_name(dt));
    if (rows < 0 || cols < 0 || lk_cdiv(rows * cols, THREADS) > INT32_MAX)
        return lk_error(LK_ESHAPE, "swiglu act (cuda): expected 0 <= rows x cols < 2^39, got %lld x %lld",
                        (long long)rows, (long long)cols);
    return LK_OK;
}

extern "C" lk_status lk_cuda_swiglu_act_forward(lk_dtype dt, int64_t rows, int64_t cols, float limit,
                                                const void *gate, int64_t ld_gate, const void *up, int64_t ld_up,
                                                void *h, int64_t ld_h, void *stream) {
    lk_status s = check_args(dt, rows, cols);
    if (s || rows * cols == 0) return s;
    cudaStream_t st = (cudaStream_t)stream;
    shape sh = {rows, cols, limit};
    const int64_t lds[] = {ld_gate, ld_up, ld_h};
    const void *ptrs[] = {gate, up, h};
    int vec = vector_ok(dt, cols, lds, ptrs, 3);
    if (dt == LK_F32) {
        if (vec) act_fwd<float, 4><<<blocks_of(rows, cols, 4), THREADS, 0, st>>>(
            sh, (const float *)gate, ld_gate, (const float *)up, ld_up, (float *)h, ld_h);
        else act_fwd<float, 1><<<blocks_of(rows, cols, 1), THREADS, 0, st>>>(
            sh, (const float *)gate, ld_gate, (const float *)up, ld_up, (float *)h, ld_h);
    } else {
        if (vec) act_fwd<lk_bf16_t, 8><<<blocks_of(rows, cols, 8), THREADS, 0, st>>>(
            sh, (const lk_bf16_t *)gate, ld_gate, (const lk_bf16_t *)up, ld_up, (lk_bf16_t *)h, ld_h);
        else act_fwd<lk_bf16_t, 1><<<blocks_of(rows, cols, 1), THREADS, 0, st>>>(
            sh, (const lk_bf16_t *)gate, ld_gate, (const lk_bf16_t *)up, ld_up, (lk_bf16_t *)h, ld_h);
    }
    LK_CUDA_LAUNCHED("swiglu act (cuda) forward");
    return LK_OK;
}

template <typename T, int W>
static void launch_bwd(shape sh, const void *dh, int64_t a, const void *g, int64_t b, const void *u, int64_t c,
                       void *dg, int64_t d, void *du, int64_t e, void *h, int64_t f, cudaStream_t st) {
    act_bwd<T, W><<<blocks_of(sh.rows, sh.cols, W), THREADS, 0, st>>>(sh, (const T *)dh, a, (const T *)g, b,
                                                                     (const T *)u, c, (T *)dg, d, (T *)du, e,
                                                                     (T *)h, f);
}

extern "C" lk_status lk_cuda_swiglu_act_backward(lk_dtype dt, int64_t rows, int64_t cols, float limit,
                                                 const void *dh, int64_t ld_dh, const void *gate, int64_t ld_gate,
                                                 const void *up, int64_t ld_up, void *dgate, int64_t ld_dgate,
                                                 void *dup, int64_t ld_dup, void *h, int64_t ld_h, void *stream) {
    lk_status s = check_args(dt, rows, cols);
    if (s || rows * cols == 0) return s;
    cudaStream_t st = (cudaStream_t)stream;
    shape sh = {rows, cols, limit};
    const int64_t lds[] = {ld_dh, ld_gate, ld_up, ld_dgate, ld_dup, h ? ld_h : 0};
    const void *ptrs[] = {dh, gate, up, dgate, dup, h};
    int vec = vector_ok(dt, cols, lds, ptrs, 6);
    if (dt == LK_F32) {
        if (vec) launch_bwd<float, 4>(sh, dh, ld_dh, gate, ld_gate, up, ld_up, dgate, ld_dgate, dup, ld_dup,
                                   h, ld_h, st);
        else launch_bwd<float, 1>(sh, dh, ld_dh, gate, ld_gate, up, ld_up, dgate, ld_dgate, dup, ld_dup,
                                   h, ld_h, st);
    } else {
        if (vec) launch_bwd<lk_bf16_t, 8>(sh, dh, ld_dh, gate, ld_gate, up, ld_up, dgate, ld_dgate, dup, ld_dup,
                                       h, ld_h, st);
        else launch_bwd<lk_bf16_t, 1>(sh, dh, ld_dh, gate, ld_gate, up, ld_up, dgate, ld_dgate, dup, ld_dup,
                                       h, ld_h, st);
    }
    LK_CUDA_LAUNCHED("swiglu act (cuda) backward");
    return LK_OK;
}
