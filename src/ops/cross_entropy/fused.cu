/* fused.cu — the kernels of cross-entropy `fused` on CUDA (cuda_ce.h). The one that
 * matters is ce_rows: ONE kernel per chunk of logits, a block per token, doing softcap,
 * the online softmax (a running max and rescaled sum per thread, merged over the block),
 * loss, z-loss and label smoothing, then the gradient written over the logits in place.
 * It reads the row twice and writes it once; a long row's second read comes from HBM again
 * (rows_sm90.cu says why), so on Hopper lk_ce_cuda_rows hands such rows to rows_sm90.cu's
 * kernel, which reads each once into the shared memory of a cluster.
 * The lean path (fused_cuda.c) adds ce_block: a block of vocab columns for every kept
 * token, turned into its gradient with the saved lse (the same per-element arithmetic).
 * The rest are small: counting valid labels, gathering kept rows, the final reduction
 * (double, fixed order: deterministic), and the backward's scatter and axpy. */
#include <math.h>
#include "ops/cuda_util.cuh"
#include "core/cuda_check.h"
#include "ops/cross_entropy/cuda_ce.h"
#include "ops/cross_entropy/row_math.cuh"

#define ROW_THREADS 512
#define RED_THREADS 1024
#define BLOCK_THREADS 256

__global__ void count_valid(lk_ce_cuda_plan p, int64_t *out) {
    __shared__ float scratch[32];
    float c = 0.0f;   /* counts below 2^24 per thread are exact in f32 */
    for (int64_t k = threadIdx.x; k < p.K; k += blockDim.x) c += label_of(p, token_of(p, k)) != p.ignore;
    c = lk_block_sum(c, scratch);
    if (threadIdx.x == 0) *out = (int64_t)c;
}

template <typename T>
__global__ void gather(lk_ce_cuda_plan p, const T *__restrict__ h, int64_t H, int64_t k0, T *__restrict__ out) {
    int64_t t = token_of(p, k0 + blockIdx.x);
    T *o = out + (int64_t)blockIdx.x * H;
    bool bad = t < 0 || t >= p.T;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) o[c] = bad ? lk_from_f32<T>(NAN) : h[t * H + c];
}

template <typename TZ, typename TG, int W>
__global__ void __launch_bounds__(ROW_THREADS) ce_rows(lk_ce_cuda_plan p, const TZ *z, TG *dz, int64_t k0,
                                                       const int64_t *nv, const float *d_loss, float *loss,
                                                       float *zl, float *lse_out, int by_token) {
    __shared__ float sm[32], ss[32], ssz[32], res[2];
    const int64_t V = p.V, k = k0 + blockIdx.x;
    const TZ *zr = z + (int64_t)blockIdx.x * V;
    const int units = (int)(V / W);
    float m = -INFINITY, s = 0.0f, sz = 0.0f;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float f[W];
        lk_ldw<TZ, W>(zr + (int64_t)u * W, f, false);
        fold<W>(f, p.cap, m, s, sz);
    }
    warp_merge(m, s, sz);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sm[warp] = m, ss[warp] = s, ssz[warp] = sz;
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
        m = lane < warps ? sm[lane] : -INFINITY, s = lane < warps ? ss[lane] : 0.0f;
        sz = lane < warps ? ssz[lane] : 0.0f;
        warp_merge(m, s, sz);
        if (lane == 0) res[0] = row_loss(p, k, label_logit(p, k, zr), m + logf(s), sz, loss, zl, lse_out, by_token);
    }
    if (dz == NULL) return;
    __syncthreads();
    const float lse = res[0];
    const grad_coef gc = coef_of(p, k, lse, nv, d_loss);
    TG *dr = dz + (int64_t)blockIdx.x * V;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float f[W];
        lk_ldw<TZ, W>(zr + (int64_t)u * W, f, false);
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = grad_at(gc, f[j], (int64_t)u * W + j, lse, p.cap);
        lk_stw<TG, W>(dr + (int64_t)u * W, f, false);
    }
}

/* The lean path's second pass: one block per kept row k of a block of raw logits z [K, wb]
 * (vocab columns v0 .. v0+wb), turned into the gradient with the row's saved lse. The
 * same arithmetic as ce_rows' second half (coef_of, grad_at), so both paths agree. */
template <typename TZ, typename TG, int W>
__global__ void __launch_bounds__(BLOCK_THREADS) ce_block(lk_ce_cuda_plan p, const TZ *z, TG *dz, int64_t v0,
                                                          int64_t wb, const float *__restrict__ lse_in,
                                                          const int64_t *nv, const float *d_loss) {
    const int64_t k = blockIdx.x;
    const float lse = lse_in[k];
    const grad_coef gc = coef_of(p, k, lse, nv, d_loss);
    const TZ *zr = z + k * wb;
    TG *dr = dz + k * wb;
    const int units = (int)(wb / W);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float f[W];
        lk_ldw<TZ, W>(zr + (int64_t)u * W, f);
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = grad_at(gc, f[j], v0 + (int64_t)u * W + j, lse, p.cap);
        lk_stw<TG, W>(dr + (int64_t)u * W, f, false);   /* read back at once by the dW GEMM */
    }
}

/* Sums in double over RED_THREADS threads in a fixed pattern: the same bits every run. */
__global__ void __launch_bounds__(RED_THREADS) finish(lk_ce_cuda_plan p, const float *loss, const float *zl,
                                                      const int64_t *nv, float *loss_out, float *z_out,
                                                      int64_t *nv_out) {
    __shared__ double a[RED_THREADS], b[RED_THREADS];
    double sl = 0.0, sz = 0.0;
    for (int64_t k = threadIdx.x; k < p.K; k += RED_THREADS) sl += loss[k], sz += zl ? zl[k] : 0.0f;
    a[threadIdx.x] = sl, b[threadIdx.x] = sz;
    __syncthreads();
    for (int w = RED_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) a[threadIdx.x] += a[threadIdx.x + w], b[threadIdx.x] += b[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int64_t n = *nv;
        double div = p.reduction == 0 && n > 0 ? (double)n : 1.0;
        if (loss_out) loss_out[0] = (float)(a[0] / div);
        if (z_out) z_out[0] = (float)(b[0] / div);
        if (nv_out) nv_out[0] = n;
    }
}

template <typename T>
__global__ void scatter_rows(lk_ce_cuda_plan p, const float *__restrict__ src, int64_t k0, int64_t H,
                             const float *d_loss, T *__restrict__ dst) {
    int64_t t = token_of(p, k0 + blockIdx.x);
    if (t < 0 || t >= p.T) return;
    float sc = d_loss ? d_loss[0] : 1.0f;
    const float *s = src + (int64_t)blockIdx.x * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[t * H + c] = lk_from_f32<T>(sc * s[c]);
}

/* W elements a thread-step: 16-byte accesses of dst, the matching f32 of src. */
template <typename T, int W>
__global__ void axpy(int64_t n, const float *__restrict__ src, const float *d_loss, T *__restrict__ dst) {
    float sc = d_loss ? d_loss[0] : 1.0f;
    int64_t units = n / W;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (int64_t)gridDim.x * blockDim.x) {
        float d[W], s[W];
        lk_ldw<T, W>(dst + u * W, d);
        if (W % 4 == 0) {
#pragma unroll
            for (int q = 0; q < W / 4; q++) lk_ldw<float, 4>(src + u * W + 4 * q, s + 4 * q);
        } else {
#pragma unroll
            for (int j = 0; j < W; j++) s[j] = src[u * W + j];
        }
#pragma unroll
        for (int j = 0; j < W; j++) d[j] += sc * s[j];
        lk_stw<T, W>(dst + u * W, d);
    }
}

/* ---- launchers ---------------------------------------------------------------- */

static int blocks_for(int64_t units, int threads) {
    int64_t b = lk_cdiv(units, threads), cap = 132 * 16;
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

extern "C" lk_status lk_ce_cuda_count_valid(const lk_ce_cuda_plan *p, int64_t *n_valid, void *stream) {
    count_valid<<<1, RED_THREADS, 0, (cudaStream_t)stream>>>(*p, n_valid);
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): count valid labels");
    return LK_OK;
}

extern "C" lk_status lk_ce_cuda_gather(const lk_ce_cuda_plan *p, lk_dtype dt, const void *hidden, int64_t H,
                                       int64_t k0, int64_t n, void *out, void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == LK_F32) gather<float><<<(unsigned)n, 256, 0, st>>>(*p, (const float *)hidden, H, k0, (float *)out);
    else gather<lk_bf16_t><<<(unsigned)n, 256, 0, st>>>(*p, (const lk_bf16_t *)hidden, H, k0, (lk_bf16_t *)out);
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): gather kept rows");
    return LK_OK;
}

template <typename TZ, typename TG>
static void rows_launch(const lk_ce_cuda_plan &p, const void *z, void *dz, int64_t k0, int64_t n, const int64_t *nv,
                        const float *d_loss, float *loss, float *zl, float *lse, int by_token, cudaStream_t st) {
    const int w = lk_vec<TZ>::N;
    bool vec = p.V % w == 0 && lk_aligned16(z) && (dz == NULL || lk_aligned16(dz)) &&
               (sizeof(TG) == sizeof(TZ) || p.V % lk_vec<TG>::N == 0);
    if (vec)
        ce_rows<TZ, TG, lk_vec<TZ>::N><<<(unsigned)n, ROW_THREADS, 0, st>>>(p, (const TZ *)z, (TG *)dz, k0, nv, d_loss,
                                                                          loss, zl, lse, by_token);
    else
        ce_rows<TZ, TG, 1><<<(unsigned)n, ROW_THREADS, 0, st>>>(p, (const TZ *)z, (TG *)dz, k0, nv, d_loss, loss, zl,
                                                              lse, by_token);
}

extern "C" lk_status lk_ce_cuda_rows(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt, void *dz,
                                     int64_t k0, int64_t n, const int64_t *n_valid, const float *d_loss, float *loss,
                                     float *zl, float *lse, int by_token, void *stream) {
    if (n == 0) return LK_OK;
    if (p->V > INT32_MAX) return lk_error(LK_ESHAPE, "cross_entropy: fused (cuda): vocab above 2^31");
    int taken;   /* on Hopper each row read once (rows_sm90.cu) where its shape allows */
    lk_status s = lk_ce_cuda_rows_sm90(p, zt, z, gt, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, stream, &taken);
    if (s || taken) {
        if (!s) LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): softmax + loss + gradient rows (sm90)");
        return s;
    }
    cudaStream_t st = (cudaStream_t)stream;
    if (zt == LK_BF16 && gt == LK_BF16)
        rows_launch<lk_bf16_t, lk_bf16_t>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st);
    else if (zt == LK_F32 && gt == LK_BF16)
        rows_launch<float, lk_bf16_t>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st);
    else if (zt == LK_F32 && gt == LK_F32)
        rows_launch<float, float>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st);
    else
        return lk_error(LK_EDTYPE, "cross_entropy: fused (cuda): logits %s with gradient %s not built",
                        lk_dtype_name(zt), lk_dtype_name(gt));
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): softmax + loss + gradient rows");
    return LK_OK;
}

template <typename TZ, typename TG>
static void block_launch(const lk_ce_cuda_plan &p, const void *z, void *dz, int64_t v0, int64_t wb, const float *lse,
                         const int64_t *nv, const float *d_loss, cudaStream_t st) {
    const int w = lk_vec<TZ>::N;
    bool vec = wb % w == 0 && lk_aligned16(z) && lk_aligned16(dz) &&
               (sizeof(TG) == sizeof(TZ) || wb % lk_vec<TG>::N == 0);
    if (vec)
        ce_block<TZ, TG, lk_vec<TZ>::N><<<(unsigned)p.K, BLOCK_THREADS, 0, st>>>(p, (const TZ *)z, (TG *)dz, v0, wb,
                                                                               lse, nv, d_loss);
    else
        ce_block<TZ, TG, 1><<<(unsigned)p.K, BLOCK_THREADS, 0, st>>>(p, (const TZ *)z, (TG *)dz, v0, wb, lse, nv,
                                                                   d_loss);
}

extern "C" lk_status lk_ce_cuda_block_grad(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt,
                                           void *dz, int64_t v0, int64_t wb, const float *lse,
                                           const int64_t *n_valid, const float *d_loss, void *stream) {
    if (p->K == 0 || wb == 0) return LK_OK;
    if (wb > INT32_MAX || p->K > INT32_MAX)
        return lk_error(LK_ESHAPE, "cross_entropy: fused (cuda): vocab block or kept tokens above 2^31");
    cudaStream_t st = (cudaStream_t)stream;
    if (zt == LK_BF16 && gt == LK_BF16)
        block_launch<lk_bf16_t, lk_bf16_t>(*p, z, dz, v0, wb, lse, n_valid, d_loss, st);
    else if (zt == LK_F32 && gt == LK_BF16)
        block_launch<float, lk_bf16_t>(*p, z, dz, v0, wb, lse, n_valid, d_loss, st);
    else if (zt == LK_F32 && gt == LK_F32)
        block_launch<float, float>(*p, z, dz, v0, wb, lse, n_valid, d_loss, st);
    else
        return lk_error(LK_EDTYPE, "cross_entropy: fused (cuda): logits %s with gradient %s not built",
                        lk_dtype_name(zt), lk_dtype_name(gt));
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): gradient of a vocab block");
    return LK_OK;
}

extern "C" lk_status lk_ce_cuda_finish(const lk_ce_cuda_plan *p, const float *loss, const float *zl,
                                       const int64_t *n_valid, float *loss_out, float *z_out, int64_t *nv_out,
                                       void *stream) {
    finish<<<1, RED_THREADS, 0, (cudaStream_t)stream>>>(*p, loss, zl, n_valid, loss_out, z_out, nv_out);
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): reduce the loss");
    return LK_OK;
}

extern "C" lk_status lk_ce_cuda_scatter_rows(const lk_ce_cuda_plan *p, const float *src, int64_t k0, int64_t n,
                                             int64_t H, const float *d_loss, lk_dtype dt, void *dst, void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == LK_F32) scatter_rows<float><<<(unsigned)n, 256, 0, st>>>(*p, src, k0, H, d_loss, (float *)dst);
    else scatter_rows<lk_bf16_t><<<(unsigned)n, 256, 0, st>>>(*p, src, k0, H, d_loss, (lk_bf16_t *)dst);
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): d_hidden rows");
    return LK_OK;
}

template <typename T>
static void axpy_launch(int64_t n, const float *src, const float *d_loss, T *dst, cudaStream_t st) {
    const int w = lk_vec<T>::N;
    if (n % w == 0 && lk_aligned16(src) && lk_aligned16(dst))
        axpy<T, lk_vec<T>::N><<<blocks_for(n / w, 256), 256, 0, st>>>(n, src, d_loss, dst);
    else
        axpy<T, 1><<<blocks_for(n, 256), 256, 0, st>>>(n, src, d_loss, dst);
}

extern "C" lk_status lk_ce_cuda_axpy(int64_t n, const float *src, const float *d_loss, lk_dtype dt, void *dst,
                                     void *stream) {
    if (n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dt == LK_F32) axpy_launch<float>(n, src, d_loss, (float *)dst, st);
    else axpy_launch<lk_bf16_t>(n, src, d_loss, (lk_bf16_t *)dst, st);
    LK_CUDA_LAUNCHED("cross_entropy: fused (cuda): d_weight += d_loss * dW");
    return LK_OK;
}
