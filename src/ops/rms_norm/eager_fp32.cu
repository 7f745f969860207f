/* eager_fp32.cu — `eager_fp32` RMSNorm on CUDA: the steps a framework's norm runs after
 * `x.float()`, each its own kernel and its own pass over memory, every intermediate an
 * f32 tensor in the workspace (upcast, mean of squares, scale, weight, cast back; the
 * backward likewise, dweight as a column sum of the materialized dy·x̂). The baseline
 * the fused kernels are measured against, not a fast path. Saves rstd, f32 [rows].
 * The residual mode (rms_norm.h) is one more kernel each way: the add into the f32
 * residual and the cast to x before the forward, which then normalizes the f32 residual
 * (a copy in place of the upcast; with norm_of_x the upcast of x), and after the backward
 * the add of the f32 dx into the residual and the cast of the sum to dx (in place of the
 * downcast). The backward makes x̂ from x and the saved rstd, as rms_norm.h says. The
 * stream in x's dtype (a residual of T) is read and not written: x = the sum's rounding,
 * normalized as x; dx = the rounding of residual + dx.
 * An f32 weight beside bf16 x (rms_norm.h) is read as f32 by the weight kernel (TW), and
 * dweight's column sum is stored in f32. */
#include "common.cuh"
#include <type_traits>

#define THREADS 256

static unsigned grid_of(int64_t count) {
    int64_t g = lk_cdiv(count, THREADS);
    return (unsigned)(g < 65536 * 8 ? g : 65536 * 8);   /* the loops stride over the rest */
}

#define GRID_STRIDE(i, count) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (count); i += (int64_t)gridDim.x * blockDim.x)

template <typename T> __global__ void upcast(const T *in, float *out, int64_t count) {
    GRID_STRIDE(i, count) out[i] = lk_to_f32(in[i]);
}

/* One block per row: out[r] = rsqrt(mean(a²) + eps) (rstd), or mean(a·b) when b is set. */
__global__ void row_reduce(const float *a, const float *b, float *out, int n, float eps, int rstd) {
    __shared__ float scratch[32];
    const float *ar = a + (int64_t)blockIdx.x * n, *br = b ? b + (int64_t)blockIdx.x * n : ar;
    float s = 0.0f;
    for (int c = threadIdx.x; c < n; c += blockDim.x) s = fmaf(ar[c], br[c], s);
    s = lk_block_sum(s, scratch) / (float)n;
    if (threadIdx.x == 0) out[blockIdx.x] = rstd ? rsqrtf(s + eps) : s;
}

/* a[r, c] *= per_row[r] */
__global__ void scale_rows(float *a, const float *per_row, int64_t count, int n) {
    GRID_STRIDE(i, count) a[i] *= per_row[i / n];
}

/* out = a·b elementwise (f32) */
__global__ void mul(const float *a, const float *b, float *out, int64_t count) {
    GRID_STRIDE(i, count) out[i] = a[i] * b[i];
}

/* a[r, c] *= off + w[c] (no weight: nothing to do) */
template <typename T> __global__ void mul_weight(float *a, const T *w, float off, int64_t count, int n) {
    GRID_STRIDE(i, count) a[i] *= lk_to_f32(w[i % n]) + off;
}

/* The residual mode: res += add (NULL: nothing), out = res rounded to T. A residual of T
 * (the stream in x's dtype) is only read; it may be out. */
template <typename T, typename A, typename R> __global__ void residual_step(R *res, const A *add, T *out, int64_t count) {
    GRID_STRIDE(i, count) {
        float r = add ? __fadd_rn(lk_to_f32(res[i]), lk_to_f32(add[i])) : lk_to_f32(res[i]);
        if constexpr (std::is_same<R, float>::value) res[i] = r;
        out[i] = lk_from_f32<T>(r);
    }
}

template <typename T, typename A>
static void residual_kernel(const lk_rms_norm_args *a, const A *add, T *out, int64_t count, cudaStream_t st) {
    if (a->residual.dtype == LK_F32)
        residual_step<T, A, float><<<grid_of(count), THREADS, 0, st>>>((float *)a->residual.data, add, out, count);
    else
        residual_step<T, A, T><<<grid_of(count), THREADS, 0, st>>>((T *)a->residual.data, add, out, count);
}

template <typename T> __global__ void downcast(const float *in, T *out, int64_t count) {
    GRID_STRIDE(i, count) out[i] = lk_from_f32<T>(in[i]);
}

/* dx = rstd·(g − x̂·m), into g (f32) */
__global__ void dx_of(float *g, const float *xh, const float *m, const float *rstd, int64_t count, int n) {
    GRID_STRIDE(i, count) g[i] = rstd[i / n] * (g[i] - xh[i] * m[i / n]);
}

static size_t saved_bytes(int64_t rows, int64_t n, lk_dtype dt) { return (size_t)rows * sizeof(float); }

/* forward: x as f32; backward: x̂, g and dy·x̂ as f32, and m [rows] */
static size_t workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    size_t t = (size_t)rows * (size_t)n * sizeof(float);
    return backward ? 3 * t + (size_t)rows * sizeof(float) + 4 * LK_ARENA_ALIGN : t;
}

template <typename T, typename TW>
static lk_status run_forward(const lk_rms_norm_args *a, float *xf, int64_t rows, int n, cudaStream_t st) {
    int64_t count = rows * n;
    float *rstd = (float *)a->saved.data;
    if (a->residual.data) residual_kernel<T, T>(a, (const T *)a->delta.data, (T *)a->x.data, count, st);
    if (a->residual.data && !a->norm_of_x && a->residual.dtype == LK_F32)   /* the f32 stream itself */
        upcast<float><<<grid_of(count), THREADS, 0, st>>>((const float *)a->residual.data, xf, count);
    else
        upcast<T><<<grid_of(count), THREADS, 0, st>>>((const T *)a->x.data, xf, count);
    row_reduce<<<(unsigned)rows, THREADS, 0, st>>>(xf, NULL, rstd, n, (float)a->eps, 1);
    scale_rows<<<grid_of(count), THREADS, 0, st>>>(xf, rstd, count, n);
    if (a->weight.data)
        mul_weight<TW><<<grid_of(count), THREADS, 0, st>>>(xf, (const TW *)a->weight.data, a->weight_offset, count, n);
    downcast<T><<<grid_of(count), THREADS, 0, st>>>(xf, (T *)a->y.data, count);
    LK_CUDA_LAUNCHED("rms_norm: eager_fp32 (cuda) forward");
    return LK_OK;
}

template <typename T, typename TW>
static lk_status run_backward(const lk_rms_norm_args *a, lk_arena *ar, int64_t rows, int n, cudaStream_t st) {
    int64_t count = rows * n;
    size_t t = (size_t)count * sizeof(float);
    float *xh = (float *)lk_arena_alloc(ar, t), *g = (float *)lk_arena_alloc(ar, t);
    float *p = (float *)lk_arena_alloc(ar, t), *m = (float *)lk_arena_alloc(ar, (size_t)rows * sizeof(float));
    if (!xh || !g || !p || !m)
        return lk_error(LK_EINTERNAL, "rms_norm: eager_fp32 (cuda): the workspace was not reserved");
    const float *rstd = (const float *)a->saved.data;
    int want_dw = a->weight.data && a->dweight.data;
    upcast<T><<<grid_of(count), THREADS, 0, st>>>((const T *)a->x.data, xh, count);
    scale_rows<<<grid_of(count), THREADS, 0, st>>>(xh, rstd, count, n);                 /* x̂ */
    upcast<T><<<grid_of(count), THREADS, 0, st>>>((const T *)a->dy.data, g, count);
    if (want_dw) mul<<<grid_of(count), THREADS, 0, st>>>(g, xh, p, count);               /* dy·x̂ */
    if (a->weight.data)
        mul_weight<TW><<<grid_of(count), THREADS, 0, st>>>(g, (const TW *)a->weight.data, a->weight_offset, count, n);
    row_reduce<<<(unsigned)rows, THREADS, 0, st>>>(g, xh, m, n, 0.0f, 0);                /* mean(g·x̂) */
    dx_of<<<grid_of(count), THREADS, 0, st>>>(g, xh, m, rstd, count, n);
    if (a->residual.data)
        residual_kernel<T, float>(a, g, (T *)a->dx.data, count, st);
    else
        downcast<T><<<grid_of(count), THREADS, 0, st>>>(g, (T *)a->dx.data, count);
    LK_CUDA_LAUNCHED("rms_norm: eager_fp32 (cuda) backward");
    return want_dw ? lk_rms_dw_finish(p, rows, n, a->dweight.data, a->dweight.dtype, st) : LK_OK;
}

static lk_status check_dims(int64_t rows, int64_t n) {
    if (rows > INT32_MAX || n > INT32_MAX)
        return lk_error(LK_ESHAPE, "rms_norm: eager_fp32 (cuda): x: expected rows and n below 2^31, got %lld x %lld",
                        (long long)rows, (long long)n);
    return LK_OK;
}

/* bf16 x with the f32 master weight (rms_norm.h): the weight kernel reads it as f32. */
static int f32_weight(const lk_rms_norm_args *a) { return a->weight.data && a->weight.dtype == LK_F32; }

static lk_status forward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    lk_status s = check_dims(rows, n);
    if (s) return s;
    float *xf = (float *)lk_arena_alloc(ctx->arena, workspace_bytes(rows, n, a->x.dtype, 0));
    if (xf == NULL) return lk_error(LK_EINTERNAL, "rms_norm: eager_fp32 (cuda): the workspace was not reserved");
    cudaStream_t st = (cudaStream_t)ctx->stream;
    return a->x.dtype == LK_F32 ? run_forward<float, float>(a, xf, rows, (int)n, st)
           : f32_weight(a)      ? run_forward<lk_bf16_t, float>(a, xf, rows, (int)n, st)
                                : run_forward<lk_bf16_t, lk_bf16_t>(a, xf, rows, (int)n, st);
}

static lk_status backward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    int64_t n = a->x.shape[a->x.ndim - 1], rows = lk_tensor_numel(&a->x) / n;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (rows == 0) return lk_rms_dw_zero(a, st);
    lk_status s = check_dims(rows, n);
    if (s) return s;
    return a->x.dtype == LK_F32 ? run_backward<float, float>(a, ctx->arena, rows, (int)n, st)
           : f32_weight(a)      ? run_backward<lk_bf16_t, float>(a, ctx->arena, rows, (int)n, st)
                                : run_backward<lk_bf16_t, lk_bf16_t>(a, ctx->arena, rows, (int)n, st);
}

extern "C" const lk_rms_norm_vtable lk_rms_norm_cuda_eager_fp32_vtable = {
    LK_RMS_NORM_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward,
};
