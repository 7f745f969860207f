/* flash.cu — the flash adapter of attention on CUDA (the `sdpa` and `flash_attention_2`
 * rows on a GPU): the FA-2 algorithm — online softmax over the visible keys, only the
 * LSE kept, the backward recomputing P from it — with one warp per row, on CUDA cores in
 * f32 (bf16 or f32 storage). Correct for every option the flash adapter takes (causal,
 * sliding window, varlen documents, GQA, softcap, sinks, any D up to 256), not yet fast:
 * each warp reads its keys from L2, no tensor cores; the tiled tensor-core kernel is
 * still to come and will take these rows over.
 *
 *   forward   warp per query row (b, h, i): lanes take 32 keys at a time, each a full
 *             q·k dot; running max and sum over the warp; each lane owns D/32 columns
 *             of the output and accumulates p·v for the 32 keys.
 *   backward  dq_rows, warp per query row: delta = dout·out, then dS over the row's keys
 *             and dq = Σ dS·k, as the forward walks them. dkv_rows, warp per key row
 *             (b, h_kv, j): the query rows of every q head of the group that see key j,
 *             32 at a time, dv = Σ P·dout, dk = Σ dS·q. No atomics: the same bits on
 *             every run. Sinks: each row's share −exp(sink − lse)·delta, summed per head
 *             in a fixed order.
 *
 * Visibility is the CPU's (lk_attn_row_intervals, on the host from the host cu_seqlens):
 * query row i sees keys [lo_i, hi_i); the backward's per-key row range comes from the
 * same intervals. Reached through lk_attention_forward / _backward, which validated
 * every argument. */
#include <math.h>
#include <stdlib.h>
#include "core/cuda_check.h"
#include "ops/attention/internal.h"
#include "ops/cuda_util.cuh"

#define WARPS 4               /* warps (rows) a block */
#define MAXD 256
#define PER (MAXD / 32)       /* columns of a row a lane owns */
#define FULL 0xffffffffu

typedef struct {
    int64_t B, Hq, Hkv, G, Sq, Skv;
    int D;
    float scale, cap;
    const int32_t *lo, *hi;   /* [Sq]: keys query row i sees */
    const int32_t *qlo, *qhi; /* [Skv]: the query rows that may see key j (backward) */
    const float *sink;        /* [Hq] or NULL */
} geom;

static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL, x, o));
    return x;
}

static __device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

/* x (f32, shared) · row (D elements of T). */
template <typename T>
static __device__ __forceinline__ float dot(const float *x, const T *row, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += x[d] * lk_to_f32(row[d]);
    return s;
}

/* The score of a visible pair and d(score)/d(q·k). */
static __device__ __forceinline__ float score(float qk, const geom &g, float *gfac) {
    float s = qk * g.scale;
    *gfac = g.scale;
    if (g.cap > 0.0f) {
        float t = tanhf(s / g.cap);
        s = g.cap * t;
        *gfac = g.scale * (1.0f - t * t);
    }
    return s;
}

/* acc[c] += w · row[lane + 32c] over the lane's columns. */
template <typename T>
static __device__ __forceinline__ void axpy_row(float *acc, float w, const T *row, int lane, int D) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        int d = lane + 32 * c;
        if (d < D) acc[c] += w * lk_to_f32(row[d]);
    }
}

template <typename T>
static __device__ __forceinline__ void store_row(T *row, const float *acc, float mul, int lane, int D) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        int d = lane + 32 * c;
        if (d < D) row[d] = lk_from_f32<T>(acc[c] * mul);
    }
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32) fwd_rows(const T *q, const T *k, const T *v, T *out, float *lse,
                                                      geom g) {
    __shared__ float qs[WARPS][MAXD];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, D = g.D;
    const int64_t row = (int64_t)blockIdx.x * WARPS + w;   /* (b, h, i), the LSE's order */
    if (row >= g.B * g.Hq * g.Sq) return;                  /* whole warps: no block barrier below */
    const int64_t i = row % g.Sq, h = row / g.Sq % g.Hq, b = row / (g.Sq * g.Hq);
    const int64_t kv = (b * g.Hkv + h / g.G) * g.Skv;
    for (int d = lane; d < D; d += 32) qs[w][d] = lk_to_f32(q[row * D + d]);
    __syncwarp();
    float m = -INFINITY, l = 0.0f, o[PER] = {0};
    const int lo = g.lo[i], hi = g.hi[i];
    for (int j0 = lo; j0 < hi; j0 += 32) {
        const int j = j0 + lane, n = min(32, hi - j0);
        float gf, s = j < hi ? score(dot(qs[w], k + (kv + j) * D, D), g, &gf) : -INFINITY;
        const float mn = fmaxf(m, warp_max(s)), alpha = expf(m - mn), p = j < hi ? expf(s - mn) : 0.0f;
        l = l * alpha + warp_sum(p);
#pragma unroll
        for (int c = 0; c < PER; c++) o[c] *= alpha;
        for (int kk = 0; kk < n; kk++) axpy_row(o, __shfl_sync(FULL, p, kk), v + (kv + j0 + kk) * D, lane, D);
        m = mn;
    }
    if (g.sink) {   /* one more logit in the softmax, with no value */
        const float sk = g.sink[h], mn = fmaxf(m, sk), alpha = expf(m - mn);
        l = l * alpha + expf(sk - mn);
#pragma unroll
        for (int c = 0; c < PER; c++) o[c] *= alpha;
        m = mn;
    }
    store_row(out + ((b * g.Sq + i) * g.Hq + h) * D, o, l > 0.0f ? 1.0f / l : 0.0f, lane, D);
    if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32) dq_rows(const T *q, const T *k, const T *v, const T *out,
                                                     const T *dout, const float *lse, T *dq, float *delta,
                                                     float *sink_part, geom g) {
    __shared__ float qs[WARPS][MAXD], gs[WARPS][MAXD];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, D = g.D;
    const int64_t row = (int64_t)blockIdx.x * WARPS + w;
    if (row >= g.B * g.Hq * g.Sq) return;
    const int64_t i = row % g.Sq, h = row / g.Sq % g.Hq, b = row / (g.Sq * g.Hq);
    const int64_t kv = (b * g.Hkv + h / g.G) * g.Skv, orow = ((b * g.Sq + i) * g.Hq + h) * D;
    float part = 0.0f;
    for (int d = lane; d < D; d += 32) {
        const float x = lk_to_f32(dout[orow + d]);
        gs[w][d] = x;
        qs[w][d] = lk_to_f32(q[row * D + d]);
        part += x * lk_to_f32(out[orow + d]);
    }
    const float dl = warp_sum(part), L = lse[row];
    __syncwarp();
    if (lane == 0) {
        delta[row] = dl;
        if (sink_part) sink_part[row] = L > -INFINITY ? -expf(g.sink[h] - L) * dl : 0.0f;
    }
    float acc[PER] = {0};
    const int lo = g.lo[i], hi = g.hi[i];
    for (int j0 = lo; j0 < hi; j0 += 32) {
        const int j = j0 + lane, n = min(32, hi - j0);
        float ds = 0.0f;
        if (j < hi) {
            float gf, s = score(dot(qs[w], k + (kv + j) * D, D), g, &gf);
            ds = expf(s - L) * (dot(gs[w], v + (kv + j) * D, D) - dl) * gf;
        }
        for (int kk = 0; kk < n; kk++) axpy_row(acc, __shfl_sync(FULL, ds, kk), k + (kv + j0 + kk) * D, lane, D);
    }
    store_row(dq + row * D, acc, 1.0f, lane, D);
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32) dkv_rows(const T *q, const T *k, const T *v, const T *dout,
                                                      const float *lse, const float *delta, T *dk, T *dv,
                                                      geom g) {
    __shared__ float ks[WARPS][MAXD], vs[WARPS][MAXD];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, D = g.D;
    const int64_t krow = (int64_t)blockIdx.x * WARPS + w;   /* (b, h_kv, j) */
    if (krow >= g.B * g.Hkv * g.Skv) return;
    const int64_t j = krow % g.Skv, hk = krow / g.Skv % g.Hkv, b = krow / (g.Skv * g.Hkv);
    for (int d = lane; d < D; d += 32) ks[w][d] = lk_to_f32(k[krow * D + d]), vs[w][d] = lk_to_f32(v[krow * D + d]);
    __syncwarp();
    float adk[PER] = {0}, adv[PER] = {0};
    const int qlo = g.qlo[j], qhi = g.qhi[j];
    for (int64_t h = hk * g.G; h < (hk + 1) * g.G; h++) {
        const int64_t rows = (b * g.Hq + h) * g.Sq;
        for (int i0 = qlo; i0 < qhi; i0 += 32) {
            const int i = i0 + lane, n = min(32, qhi - i0);
            float p = 0.0f, ds = 0.0f;
            if (i < qhi && g.lo[i] <= j && j < g.hi[i]) {
                float gf, s = score(dot(ks[w], q + (rows + i) * D, D), g, &gf);
                p = expf(s - lse[rows + i]);
                ds = p * (dot(vs[w], dout + ((b * g.Sq + i) * g.Hq + h) * D, D) - delta[rows + i]) * gf;
            }
            for (int kk = 0; kk < n; kk++) {
                const float pk = __shfl_sync(FULL, p, kk), dsk = __shfl_sync(FULL, ds, kk);
                if (pk == 0.0f && dsk == 0.0f) continue;   /* the same for every lane */
                axpy_row(adv, pk, dout + ((b * g.Sq + i0 + kk) * g.Hq + h) * D, lane, D);
                axpy_row(adk, dsk, q + (rows + i0 + kk) * D, lane, D);
            }
        }
    }
    store_row(dk + krow * D, adk, 1.0f, lane, D);
    store_row(dv + krow * D, adv, 1.0f, lane, D);
}

/* ds_aux[h] = Σ_{b, i} part[b, h, i], a block per head, in a fixed order. */
__global__ void sink_sum(const float *part, float *ds, int64_t B, int64_t Hq, int64_t Sq) {
    __shared__ double red[256];
    const int64_t h = blockIdx.x;
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < B * Sq; r += blockDim.x) s += part[((r / Sq) * Hq + h) * Sq + r % Sq];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) ds[h] = (float)red[0];
}

/* --- host ---------------------------------------------------------------------------- */

static size_t up(size_t b) { return (b + LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1); }

static size_t saved_bytes(const lk_attention_args *a) { return lk_attn_lse_bytes(a); }

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    size_t Sq = (size_t)a->q.shape[2], Skv = (size_t)a->k.shape[2], rows = lk_attn_lse_bytes(a);
    return 2 * up(Sq * 4) + (backward ? 2 * up(Skv * 4) + 2 * up(rows) : 0);
}

static lk_status check_dims(const lk_attn_dims *d) {
    if (d->D > MAXD)
        return lk_error(LK_ESHAPE, "attention: q: expected head dim D <= %d on CUDA, got %lld", MAXD,
                        (long long)d->D);
    if (d->Sq >= INT32_MAX || d->Skv >= INT32_MAX)
        return lk_error(LK_ESHAPE, "attention: q: expected S_q and S_kv below 2^31 on CUDA, got %lld and %lld",
                        (long long)d->Sq, (long long)d->Skv);
    return LK_OK;
}

/* The row intervals (and, for the backward, each key's row range) on the device. The
 * ranges are exact when lo and hi grow with the row, as causal, window and documents
 * make them; otherwise every row is a candidate (the kernel checks each one). */
static lk_status intervals(const lk_attention_args *a, const lk_attn_dims *d, lk_arena *ar, cudaStream_t st,
                           int backward, geom *g) {
    int64_t Sq = d->Sq, Skv = d->Skv, n = Sq + (backward ? Skv : 0);
    int32_t *dev = (int32_t *)lk_arena_alloc(ar, up((size_t)Sq * 4));
    int32_t *dev_hi = (int32_t *)lk_arena_alloc(ar, up((size_t)Sq * 4));
    int32_t *dev_q = backward ? (int32_t *)lk_arena_alloc(ar, up((size_t)Skv * 4)) : NULL;
    int32_t *dev_qhi = backward ? (int32_t *)lk_arena_alloc(ar, up((size_t)Skv * 4)) : NULL;
    int64_t *lo = (int64_t *)malloc((size_t)Sq * 16);
    int32_t *h32 = (int32_t *)malloc((size_t)n * 8);
    if (!dev || !dev_hi || (backward && (!dev_q || !dev_qhi)) || !lo || !h32) {
        free(lo), free(h32);
        return lk_error(LK_ENOMEM, "attention: flash (cuda): no room for the row intervals");
    }
    int64_t *hi = lo + Sq;
    lk_attn_row_intervals(a, d, lo, hi);
    int32_t *l32 = h32, *u32 = h32 + Sq, *ql = h32 + 2 * Sq, *qh = h32 + 2 * Sq + Skv;
    int mono = 1;
    for (int64_t i = 0; i < Sq; i++) {
        l32[i] = (int32_t)lo[i], u32[i] = (int32_t)hi[i];
        if (i && (lo[i] < lo[i - 1] || hi[i] < hi[i - 1])) mono = 0;
    }
    if (backward) {
        int64_t first = 0, last = 0;   /* rows with hi > j start at first; rows with lo <= j end at last */
        for (int64_t j = 0; j < Skv; j++) {
            while (first < Sq && hi[first] <= j) first++;
            while (last < Sq && lo[last] <= j) last++;
            ql[j] = mono ? (int32_t)first : 0;
            qh[j] = mono ? (int32_t)(last > first ? last : first) : (int32_t)Sq;
        }
    }
    /* In stream order (the arena's bytes may still be read by earlier work); from pageable
     * memory the copy is staged before the call returns, so the host arrays can go. */
    cudaError_t e = cudaMemcpyAsync(dev, l32, (size_t)Sq * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dev_hi, u32, (size_t)Sq * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && backward) e = cudaMemcpyAsync(dev_q, ql, (size_t)Skv * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && backward) e = cudaMemcpyAsync(dev_qhi, qh, (size_t)Skv * 4, cudaMemcpyHostToDevice, st);
    free(lo), free(h32);
    if (e != cudaSuccess) return lk_cuda_fail(e, "attention: flash (cuda): row intervals", __FILE__, __LINE__);
    g->lo = dev, g->hi = dev_hi, g->qlo = dev_q, g->qhi = dev_qhi;
    return LK_OK;
}

static geom geom_of(const lk_attention_args *a, const lk_attn_dims *d) {
    geom g = {d->B, d->Hq, d->Hkv, d->G, d->Sq, d->Skv, (int)d->D, d->scale, a->softcap,
              NULL, NULL, NULL, NULL, (const float *)a->s_aux.data};
    return g;
}

static unsigned blocks(int64_t rows) { return (unsigned)((rows + WARPS - 1) / WARPS); }

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_dims d = lk_attn_dims_of(a);
    lk_status s = check_dims(&d);
    geom g = geom_of(a, &d);
    if (s || (s = intervals(a, &d, ctx->arena, (cudaStream_t)ctx->stream, 0, &g))) return s;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    unsigned nb = blocks(d.B * d.Hq * d.Sq);
    if (d.dt == LK_F32)
        fwd_rows<float><<<nb, WARPS * 32, 0, st>>>((const float *)a->q.data, (const float *)a->k.data,
                                                   (const float *)a->v.data, (float *)a->out.data,
                                                   (float *)a->saved.data, g);
    else
        fwd_rows<lk_bf16_t><<<nb, WARPS * 32, 0, st>>>((const lk_bf16_t *)a->q.data, (const lk_bf16_t *)a->k.data,
                                                       (const lk_bf16_t *)a->v.data, (lk_bf16_t *)a->out.data,
                                                       (float *)a->saved.data, g);
    LK_CUDA_LAUNCHED("attention: flash (cuda) forward");
    return LK_OK;
}

template <typename T>
static void backward_kernels(const lk_attention_args *a, const lk_attn_dims *d, const geom &g, float *delta,
                             float *part, cudaStream_t st) {
    const T *q = (const T *)a->q.data, *k = (const T *)a->k.data, *v = (const T *)a->v.data;
    const T *out = (const T *)a->out.data, *dout = (const T *)a->dout.data;
    const float *lse = (const float *)a->saved.data;
    dq_rows<T><<<blocks(d->B * d->Hq * d->Sq), WARPS * 32, 0, st>>>(q, k, v, out, dout, lse, (T *)a->dq.data,
                                                                      delta, part, g);
    dkv_rows<T><<<blocks(d->B * d->Hkv * d->Skv), WARPS * 32, 0, st>>>(q, k, v, dout, lse, delta, (T *)a->dk.data,
                                                                        (T *)a->dv.data, g);
}

static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_dims d = lk_attn_dims_of(a);
    lk_status s = check_dims(&d);
    geom g = geom_of(a, &d);
    if (s || (s = intervals(a, &d, ctx->arena, (cudaStream_t)ctx->stream, 1, &g))) return s;
    size_t rows = lk_attn_lse_bytes(a);
    float *delta = (float *)lk_arena_alloc(ctx->arena, up(rows)), *part = (float *)lk_arena_alloc(ctx->arena, up(rows));
    if (!delta || !part) return lk_error(LK_ENOMEM, "attention: flash (cuda): no room for delta");
    int sinks = a->s_aux.data && a->ds_aux.data;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (d.dt == LK_F32) backward_kernels<float>(a, &d, g, delta, sinks ? part : NULL, st);
    else backward_kernels<lk_bf16_t>(a, &d, g, delta, sinks ? part : NULL, st);
    if (sinks) sink_sum<<<(unsigned)d.Hq, 256, 0, st>>>(part, (float *)a->ds_aux.data, d.B, d.Hq, d.Sq);
    LK_CUDA_LAUNCHED("attention: flash (cuda) backward");
    return LK_OK;
}

extern "C" const lk_attention_vtable lk_attention_flash_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward,
};
