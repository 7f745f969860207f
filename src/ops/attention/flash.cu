/* flash.cu — the flash adapter of attention on CUDA (the `sdpa`, `flash_attention_2` and
 * SP rows on a GPU): the FA-2 algorithm — online softmax over the visible keys, only the
 * LSE kept, the backward recomputing P from it — on CUDA cores in f32 (bf16 or f32
 * storage). Correct for every option the flash adapter takes (causal, sliding window,
 * varlen documents, GQA, softcap, sinks, any D up to 256), not yet fast: ~5 TFLOP/s at
 * B 2, H 32, S 8192, D 128 against SDPA's ~650 (bench/NOTES.md run 19); the tensor-core
 * kernel is still to write and will take these rows over.
 *
 *   fwd_tiles  a block takes 16 query rows of one (b, h), a warp 4; tiles of 32 keys
 *              (K, V as f32 in shared memory) staged once for the block; lane j scores
 *              key j of the tile for each of its warp's rows, running max and sum over
 *              the warp, each lane owning D/32 columns of the output.
 *   dq_tiles   the same walk: delta = dout·out, dS = P·(dout·v − delta), dq = Σ dS·k.
 *   dkv_tiles  a block takes 16 key rows of one (b, h_kv); for each q head of the group,
 *              tiles of 32 query rows (q, dout, LSE, delta) among the rows that may see
 *              the keys; dv = Σ P·dout, dk = Σ dS·q. No atomics: the same bits on every
 *              run. Sinks: each row's share −exp(sink − lse)·delta, summed per head in a
 *              fixed order.
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

#define WARPS 4               /* warps a block */
#define RW 4                  /* rows a warp owns (query rows; key rows in dkv_tiles) */
#define RB (WARPS * RW)       /* rows a block owns */
#define TK 32                 /* rows of a staged tile: keys (forward, dq) or queries (dkv) */
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
/* x · y over D floats, both in shared memory. */
static __device__ __forceinline__ float dot(const float *x, const float *y, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += x[d] * y[d];
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

/* acc[c] += w · row[lane + 32c] over the lane's columns (row in shared memory). */
static __device__ __forceinline__ void axpy_row(float *acc, float w, const float *row, int lane, int D) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        int d = lane + 32 * c;
        if (d < D) acc[c] += w * row[d];
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

/* n rows of D elements (row stride `stride` elements) into shared f32 rows `ld` apart,
 * by the whole block; rows past n are zero. */
template <typename T>
static __device__ __forceinline__ void stage(float *dst, int ld, const T *src, int64_t stride, int n, int rows,
                                             int D) {
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
        int r = e / D, d = e - r * D;
        dst[r * ld + d] = r < n ? lk_to_f32(src[r * stride + d]) : 0.0f;
    }
}

/* Forward: a block takes RB query rows of one (b, h), a warp RW of them. Key tiles of
 * TK rows (K padded to D + 1 floats a row: lane j reading key j's row meets no bank
 * conflict) are staged once for the block; in a tile lane j scores key j for each of the
 * warp's rows, then every lane adds the tile's p·v to its D/32 output columns. */
template <typename T>
__global__ void __launch_bounds__(WARPS * 32) fwd_tiles(const T *q, const T *k, const T *v, T *out, float *lse,
                                                       geom g) {
    extern __shared__ float sm[];
    const int D = g.D, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *qs = sm, *ks = qs + RB * D, *vs = ks + TK * (D + 1);
    const int64_t nrb = (g.Sq + RB - 1) / RB, bh = blockIdx.x / nrb, h = bh % g.Hq, b = bh / g.Hq;
    const int i0 = (int)(blockIdx.x % nrb) * RB, n = (int)min((int64_t)RB, g.Sq - i0);
    const int64_t kv = (b * g.Hkv + h / g.G) * g.Skv;
    stage(qs, D, q + (bh * g.Sq + i0) * D, D, n, RB, D);
    int klo = INT32_MAX, khi = 0;
    for (int r = 0; r < n; r++) klo = min(klo, g.lo[i0 + r]), khi = max(khi, g.hi[i0 + r]);
    float m[RW], l[RW], o[RW][PER];
    int lo[RW], hi[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int i = w * RW + r;
        m[r] = -INFINITY, l[r] = 0.0f, lo[r] = i < n ? g.lo[i0 + i] : 0, hi[r] = i < n ? g.hi[i0 + i] : 0;
#pragma unroll
        for (int c = 0; c < PER; c++) o[r][c] = 0.0f;
    }
    for (int t0 = klo; t0 < khi; t0 += TK) {
        const int nt = min(TK, khi - t0);
        __syncthreads();   /* the previous tile is read by every warp */
        stage(ks, D + 1, k + (kv + t0) * D, D, nt, TK, D);
        stage(vs, D, v + (kv + t0) * D, D, nt, TK, D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (t0 >= hi[r] || t0 + nt <= lo[r]) continue;   /* the same for the whole warp */
            const int j = t0 + lane;
            const bool vis = lane < nt && j >= lo[r] && j < hi[r];
            float gf, s = vis ? score(dot(qs + (w * RW + r) * D, ks + lane * (D + 1), D), g, &gf) : -INFINITY;
            const float mn = fmaxf(m[r], warp_max(s)), alpha = expf(m[r] - mn), p = vis ? expf(s - mn) : 0.0f;
            l[r] = l[r] * alpha + warp_sum(p);
#pragma unroll
            for (int c = 0; c < PER; c++) o[r][c] *= alpha;
            for (int kk = 0; kk < nt; kk++) axpy_row(o[r], __shfl_sync(FULL, p, kk), vs + kk * D, lane, D);
            m[r] = mn;
        }
    }
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int i = w * RW + r;
        if (i >= n) continue;
        float mr = m[r], lr = l[r];
        if (g.sink) {   /* one more logit in the softmax, with no value */
            const float sk = g.sink[h], mn = fmaxf(mr, sk), alpha = expf(mr - mn);
            lr = lr * alpha + expf(sk - mn);
#pragma unroll
            for (int c = 0; c < PER; c++) o[r][c] *= alpha;
            mr = mn;
        }
        store_row(out + ((b * g.Sq + i0 + i) * g.Hq + h) * D, o[r], lr > 0.0f ? 1.0f / lr : 0.0f, lane, D);
        if (lane == 0) lse[bh * g.Sq + i0 + i] = lr > 0.0f ? mr + logf(lr) : -INFINITY;
    }
}

/* dq, as the forward walks keys: per tile, lane j forms dS for key j of each of the
 * warp's rows (P from the LSE, dP = dout·v), then dq += Σ dS·k over the tile. delta =
 * dout·out and the sinks' share are written per row for dkv_tiles and lk_attn_cuda_sink_sum. */
template <typename T>
__global__ void __launch_bounds__(WARPS * 32) dq_tiles(const T *q, const T *k, const T *v, const T *out,
                                                      const T *dout, const float *lse, T *dq, float *delta,
                                                      float *sink_part, geom g) {
    extern __shared__ float sm[];
    const int D = g.D, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *qs = sm, *gs = qs + RB * D, *ks = gs + RB * D, *vs = ks + TK * (D + 1);
    const int64_t nrb = (g.Sq + RB - 1) / RB, bh = blockIdx.x / nrb, h = bh % g.Hq, b = bh / g.Hq;
    const int i0 = (int)(blockIdx.x % nrb) * RB, n = (int)min((int64_t)RB, g.Sq - i0);
    const int64_t kv = (b * g.Hkv + h / g.G) * g.Skv;
    stage(qs, D, q + (bh * g.Sq + i0) * D, D, n, RB, D);
    stage(gs, D, dout + ((b * g.Sq + i0) * g.Hq + h) * D, g.Hq * D, n, RB, D);
    int klo = INT32_MAX, khi = 0;
    for (int r = 0; r < n; r++) klo = min(klo, g.lo[i0 + r]), khi = max(khi, g.hi[i0 + r]);
    __syncthreads();
    float L[RW], dl[RW], acc[RW][PER];
    int lo[RW], hi[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int i = w * RW + r;
        float part = 0.0f;
        if (i < n) {
            const T *orow = out + ((b * g.Sq + i0 + i) * g.Hq + h) * D;
            for (int d = lane; d < D; d += 32) part += gs[i * D + d] * lk_to_f32(orow[d]);
        }
        dl[r] = warp_sum(part);
        L[r] = i < n ? lse[bh * g.Sq + i0 + i] : -INFINITY;
        lo[r] = i < n ? g.lo[i0 + i] : 0, hi[r] = i < n ? g.hi[i0 + i] : 0;
        if (i < n && lane == 0) {
            delta[bh * g.Sq + i0 + i] = dl[r];
            if (sink_part) sink_part[bh * g.Sq + i0 + i] = L[r] > -INFINITY ? -expf(g.sink[h] - L[r]) * dl[r] : 0.0f;
        }
#pragma unroll
        for (int c = 0; c < PER; c++) acc[r][c] = 0.0f;
    }
    for (int t0 = klo; t0 < khi; t0 += TK) {
        const int nt = min(TK, khi - t0);
        __syncthreads();
        stage(ks, D + 1, k + (kv + t0) * D, D, nt, TK, D);
        stage(vs, D + 1, v + (kv + t0) * D, D, nt, TK, D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (t0 >= hi[r] || t0 + nt <= lo[r]) continue;
            const int j = t0 + lane, i = w * RW + r;
            float ds = 0.0f;
            if (lane < nt && j >= lo[r] && j < hi[r]) {
                float gf, s = score(dot(qs + i * D, ks + lane * (D + 1), D), g, &gf);
                ds = expf(s - L[r]) * (dot(gs + i * D, vs + lane * (D + 1), D) - dl[r]) * gf;
            }
            for (int kk = 0; kk < nt; kk++) axpy_row(acc[r], __shfl_sync(FULL, ds, kk), ks + kk * (D + 1), lane, D);
        }
    }
#pragma unroll
    for (int r = 0; r < RW; r++)
        if (w * RW + r < n) store_row(dq + (bh * g.Sq + i0 + w * RW + r) * D, acc[r], 1.0f, lane, D);
}

/* dk, dv: a block takes RB key rows of one (b, h_kv), a warp RW of them; for every q
 * head of the group, tiles of TQ query rows (q and dout padded like K above, their LSE
 * and delta) within the rows that may see the block's keys; lane i forms P and dS of
 * row i for each of the warp's keys, then dv += Σ P·dout, dk += Σ dS·q over the tile. */
template <typename T>
__global__ void __launch_bounds__(WARPS * 32) dkv_tiles(const T *q, const T *k, const T *v, const T *dout,
                                                       const float *lse, const float *delta, T *dk, T *dv, geom g) {
    extern __shared__ float sm[];
    const int D = g.D, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *ks = sm, *vs = ks + RB * D, *qs = vs + RB * D, *gs = qs + TK * (D + 1), *ls = gs + TK * (D + 1),
          *ds_ = ls + TK;
    const int64_t nkb = (g.Skv + RB - 1) / RB, bhk = blockIdx.x / nkb, hk = bhk % g.Hkv, b = bhk / g.Hkv;
    const int j0 = (int)(blockIdx.x % nkb) * RB, n = (int)min((int64_t)RB, g.Skv - j0);
    stage(ks, D, k + (bhk * g.Skv + j0) * D, D, n, RB, D);
    stage(vs, D, v + (bhk * g.Skv + j0) * D, D, n, RB, D);
    int qlo = INT32_MAX, qhi = 0;
    for (int r = 0; r < n; r++) qlo = min(qlo, g.qlo[j0 + r]), qhi = max(qhi, g.qhi[j0 + r]);
    float adk[RW][PER], adv[RW][PER];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int c = 0; c < PER; c++) adk[r][c] = adv[r][c] = 0.0f;
    for (int64_t h = hk * g.G; h < (hk + 1) * g.G; h++) {
        const int64_t rows = (b * g.Hq + h) * g.Sq;
        for (int t0 = qlo; t0 < qhi; t0 += TK) {
            const int nt = min(TK, qhi - t0);
            __syncthreads();
            stage(qs, D + 1, q + (rows + t0) * D, D, nt, TK, D);
            stage(gs, D + 1, dout + ((b * g.Sq + t0) * g.Hq + h) * D, g.Hq * D, nt, TK, D);
            for (int e = threadIdx.x; e < TK; e += blockDim.x) {
                ls[e] = e < nt ? lse[rows + t0 + e] : 0.0f;
                ds_[e] = e < nt ? delta[rows + t0 + e] : 0.0f;
            }
            __syncthreads();
            const int i = t0 + lane;
            const int rlo = lane < nt ? g.lo[i] : 0, rhi = lane < nt ? g.hi[i] : 0;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const int kr = w * RW + r, j = j0 + kr;
                if (kr >= n) continue;
                float p = 0.0f, ds = 0.0f;
                if (lane < nt && rlo <= j && j < rhi) {
                    float gf, s = score(dot(ks + kr * D, qs + lane * (D + 1), D), g, &gf);
                    p = expf(s - ls[lane]);
                    ds = p * (dot(vs + kr * D, gs + lane * (D + 1), D) - ds_[lane]) * gf;
                }
                for (int ii = 0; ii < nt; ii++) {
                    const float pk = __shfl_sync(FULL, p, ii), dsk = __shfl_sync(FULL, ds, ii);
                    if (pk == 0.0f && dsk == 0.0f) continue;   /* the same for every lane */
                    axpy_row(adv[r], pk, gs + ii * (D + 1), lane, D);
                    axpy_row(adk[r], dsk, qs + ii * (D + 1), lane, D);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RW; r++) {
        const int kr = w * RW + r;
        if (kr >= n) continue;
        store_row(dk + (bhk * g.Skv + j0 + kr) * D, adk[r], 1.0f, lane, D);
        store_row(dv + (bhk * g.Skv + j0 + kr) * D, adv[r], 1.0f, lane, D);
    }
}

/* ds_aux[h] = Σ_{b, i} part[b, h, i], a block per head, in a fixed order. */
static __global__ void sink_sum(const float *part, float *ds, int64_t B, int64_t Hq, int64_t Sq) {
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

extern "C" lk_status lk_attn_cuda_sink_sum(const float *part, float *ds_aux, int64_t B, int64_t Hq, int64_t Sq,
                                           void *stream) {
    sink_sum<<<(unsigned)Hq, 256, 0, (cudaStream_t)stream>>>(part, ds_aux, B, Hq, Sq);
    LK_CUDA_LAUNCHED("attention: sink gradient (cuda)");
    return LK_OK;
}

static size_t saved_bytes(const lk_attention_args *a) { return lk_attn_lse_bytes(a); }

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    size_t Sq = (size_t)a->q.shape[2], Skv = (size_t)a->k.shape[2], rows = lk_attn_lse_bytes(a);
    return 2 * lk_arena_piece(Sq * 4) + (backward ? 2 * lk_arena_piece(Skv * 4) + 2 * lk_arena_piece(rows) : 0);
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
    int32_t *dev_lo = (int32_t *)lk_arena_alloc(ar, lk_arena_piece((size_t)Sq * 4));
    int32_t *dev_hi = (int32_t *)lk_arena_alloc(ar, lk_arena_piece((size_t)Sq * 4));
    int32_t *dev_q = backward ? (int32_t *)lk_arena_alloc(ar, lk_arena_piece((size_t)Skv * 4)) : NULL;
    int32_t *dev_qhi = backward ? (int32_t *)lk_arena_alloc(ar, lk_arena_piece((size_t)Skv * 4)) : NULL;
    int64_t *lo = (int64_t *)malloc((size_t)Sq * 16);
    int32_t *h32 = (int32_t *)malloc((size_t)n * 8);
    if (!dev_lo || !dev_hi || (backward && (!dev_q || !dev_qhi)) || !lo || !h32) {
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
     * memory the copy is staged before the call returns, so the host arrays can go (and
     * the host waits for the stream: a pinned staging buffer would let it run ahead). */
    cudaError_t e = cudaMemcpyAsync(dev_lo, l32, (size_t)Sq * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dev_hi, u32, (size_t)Sq * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && backward) e = cudaMemcpyAsync(dev_q, ql, (size_t)Skv * 4, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess && backward) e = cudaMemcpyAsync(dev_qhi, qh, (size_t)Skv * 4, cudaMemcpyHostToDevice, st);
    free(lo), free(h32);
    if (e != cudaSuccess) return lk_cuda_fail(e, "attention: flash (cuda): row intervals", __FILE__, __LINE__);
    g->lo = dev_lo, g->hi = dev_hi, g->qlo = dev_q, g->qhi = dev_qhi;
    return LK_OK;
}

static geom geom_of(const lk_attention_args *a, const lk_attn_dims *d) {
    geom g = {d->B, d->Hq, d->Hkv, d->G, d->Sq, d->Skv, (int)d->D, d->scale, a->softcap,
              NULL, NULL, NULL, NULL, (const float *)a->s_aux.data};
    return g;
}

/* Blocks for `groups` sequences of `len` rows each, RB rows a block. */
static unsigned blocks(int64_t groups, int64_t len) { return (unsigned)(groups * ((len + RB - 1) / RB)); }

/* Shared bytes of each kernel (f32 rows; staged tiles padded to D + 1). */
static size_t fwd_smem(int D) { return sizeof(float) * (size_t)(RB * D + TK * (D + 1) + TK * D); }
static size_t dq_smem(int D) { return sizeof(float) * (size_t)(2 * RB * D + 2 * TK * (D + 1)); }
static size_t dkv_smem(int D) { return sizeof(float) * (size_t)(2 * RB * D + 2 * TK * (D + 1) + 2 * TK); }

/* Past 48 KiB a kernel must ask for its shared memory (D 256: up to 98 KiB). */
template <typename K>
static lk_status allow_smem(K kernel, size_t bytes) {
    if (bytes > (48u << 10))
        LK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return LK_OK;
}

/* Where both passes begin: the call's dims, checked, and its geometry with the row
 * intervals (for the backward, each key's row range too) on the device. */
static lk_status pass_geom(const lk_attention_args *a, lk_ctx *ctx, int backward, lk_attn_dims *d, geom *g) {
    *d = lk_attn_dims_of(a);
    lk_status s = check_dims(d);
    *g = geom_of(a, d);
    return s ? s : intervals(a, d, ctx->arena, (cudaStream_t)ctx->stream, backward, g);
}

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_dims d;
    geom g;
    lk_status s = pass_geom(a, ctx, 0, &d, &g);
    if (s) return s;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    unsigned nb = blocks(d.B * d.Hq, d.Sq);
    size_t sh = fwd_smem(g.D);
    if (d.dt == LK_F32) {
        if ((s = allow_smem(fwd_tiles<float>, sh))) return s;
        fwd_tiles<float><<<nb, WARPS * 32, sh, st>>>((const float *)a->q.data, (const float *)a->k.data,
                                                     (const float *)a->v.data, (float *)a->out.data,
                                                     (float *)a->saved.data, g);
    } else {
        if ((s = allow_smem(fwd_tiles<lk_bf16_t>, sh))) return s;
        fwd_tiles<lk_bf16_t><<<nb, WARPS * 32, sh, st>>>((const lk_bf16_t *)a->q.data, (const lk_bf16_t *)a->k.data,
                                                         (const lk_bf16_t *)a->v.data, (lk_bf16_t *)a->out.data,
                                                         (float *)a->saved.data, g);
    }
    LK_CUDA_LAUNCHED("attention: flash (cuda) forward");
    return LK_OK;
}

template <typename T>
static lk_status backward_kernels(const lk_attention_args *a, const lk_attn_dims *d, const geom &g, float *delta,
                                  float *part, cudaStream_t st) {
    const T *q = (const T *)a->q.data, *k = (const T *)a->k.data, *v = (const T *)a->v.data;
    const T *out = (const T *)a->out.data, *dout = (const T *)a->dout.data;
    const float *lse = (const float *)a->saved.data;
    size_t sq = dq_smem(g.D), skv = dkv_smem(g.D);
    lk_status s;
    if ((s = allow_smem(dq_tiles<T>, sq)) || (s = allow_smem(dkv_tiles<T>, skv))) return s;
    dq_tiles<T><<<blocks(d->B * d->Hq, d->Sq), WARPS * 32, sq, st>>>(q, k, v, out, dout, lse, (T *)a->dq.data, delta,
                                                                      part, g);
    dkv_tiles<T><<<blocks(d->B * d->Hkv, d->Skv), WARPS * 32, skv, st>>>(q, k, v, dout, lse, delta, (T *)a->dk.data,
                                                                          (T *)a->dv.data, g);
    return LK_OK;
}

static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) {
    lk_attn_dims d;
    geom g;
    lk_status s = pass_geom(a, ctx, 1, &d, &g);
    if (s) return s;
    size_t rows = lk_attn_lse_bytes(a);
    float *delta = (float *)lk_arena_alloc(ctx->arena, lk_arena_piece(rows));
    float *part = (float *)lk_arena_alloc(ctx->arena, lk_arena_piece(rows));
    if (!delta || !part) return lk_error(LK_ENOMEM, "attention: flash (cuda): no room for delta");
    int sinks = a->s_aux.data && a->ds_aux.data;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    s = d.dt == LK_F32 ? backward_kernels<float>(a, &d, g, delta, sinks ? part : NULL, st)
                       : backward_kernels<lk_bf16_t>(a, &d, g, delta, sinks ? part : NULL, st);
    if (s) return s;
    LK_CUDA_LAUNCHED("attention: flash (cuda) backward");
    return sinks ? lk_attn_cuda_sink_sum(part, (float *)a->ds_aux.data, d.B, d.Hq, d.Sq, st) : LK_OK;
}

extern "C" const lk_attention_vtable lk_attention_flash_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward,
};
