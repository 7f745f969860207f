/* router.cu — the kernels of the `softmax_topk` MoE router on CUDA (cuda_router.h), and
 * those the learned routers share (the aux loss, the expert counts, d_logits for softmax
 * and sigmoid, dtype conversions; sigmoid_bias.cu holds sigmoid_bias's own per-token
 * kernel), launched by router_cuda.c around its GEMMs. The per-token kernels give each
 * token a warp: the softmax and the k picks are warp reductions, and a row of up to 512 experts
 * stays in registers (16 a lane); longer rows are read back from the saved scores. The
 * aux loss and the expert counts are summed in an order that depends on T and E only
 * (integer atomics for the counts, per-block f64 partials for the scores), so a run
 * repeats bit for bit. */
#include <limits.h>
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/cuda_router.h"
#include "ops/moe/router.cuh"

#define FULL LK_ROUTER_FULL
#define WARPS LK_ROUTER_WARPS
#define AUX_TOKENS 256      /* tokens one partial of the aux loss covers */
#define AUX_LANES 8         /* token lanes of a partial's block (x 32 experts) */
#define AUX_THREADS 256     /* the final sum's block */
#define HIST_MAX 8192       /* experts a shared-memory histogram holds */

/* p = softmax of the token's logits into vr, and into r when N > 0; returns Σ p. Lane
 * elements are x = lane + 32m; with N = 0 each lane reads back only what it wrote. */
template <int N>
static __device__ __forceinline__ float softmax_row(const lk_router_cuda_dims &d, const float *zr, float *vr,
                                                    float *r, int lane) {
    const int M = N > 0 ? N : (int)((d.e + 31) / 32), E = (int)d.e;
    float mx = -INFINITY, sum = 0.0f, vs = 0.0f;
#pragma unroll
    for (int m = 0; m < M; m++) {
        int x = lane + 32 * m;
        if (x >= E) continue;
        float q = lk_router_logit(zr, x, d.round_bf16);
        if (N > 0) r[m] = q;
        mx = fmaxf(mx, q);
    }
    mx = lk_router_warp_max(mx);
#pragma unroll
    for (int m = 0; m < M; m++) {
        int x = lane + 32 * m;
        if (x >= E) continue;
        float q = expf((N > 0 ? r[m] : lk_router_logit(zr, x, d.round_bf16)) - mx);
        if (N > 0) r[m] = q;
        else vr[x] = q;
        sum += q;
    }
    sum = lk_warp_sum(sum);
#pragma unroll
    for (int m = 0; m < M; m++) {
        int x = lane + 32 * m;
        if (x >= E) continue;
        float q = (N > 0 ? r[m] : vr[x]) / sum;   /* a division, as on the CPU */
        if (N > 0) r[m] = q;
        vr[x] = q;
        vs += q;
    }
    return lk_warp_sum(vs);
}

/* The lane's first-ranked element among those ranked after the previous pick (pv, pi). */
template <int N>
static __device__ __forceinline__ void lane_next(const lk_router_cuda_dims &d, const float *vr, const float *r,
                                                 int lane, float pv, int pi, float &bv, int &bi) {
    const int M = N > 0 ? N : (int)((d.e + 31) / 32), E = (int)d.e;
    bv = -INFINITY, bi = INT_MAX;   /* no candidate */
#pragma unroll
    for (int m = 0; m < M; m++) {
        int x = lane + 32 * m;
        if (x >= E) continue;
        float q = N > 0 ? r[m] : vr[x];
        if (lk_router_before(pv, pi, q, x) && lk_router_before(q, x, bv, bi)) bv = q, bi = x;
    }
}

/* A warp a token: softmax, then k picks, each the best ranked after the one before (no
 * marking, so the row is only read); the weights' sum in pick order, as on the CPU. */
template <int N>
__global__ void __launch_bounds__(WARPS * 32) softmax_topk(lk_router_cuda_dims d, const float *z, float *v,
                                                           int32_t *sids, int32_t *ids, float *w, float *vsum) {
    int64_t t = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (t >= d.t) return;   /* the whole warp: t is the warp's */
    int lane = threadIdx.x & 31;
    float *vr = v + t * d.e, r[N > 0 ? N : 1];
    float vs = softmax_row<N>(d, z + t * d.e, vr, r, lane);
    if (vsum && lane == 0) vsum[t] = vs;
    int32_t *si = sids + t * d.k, *oi = ids + t * d.k;
    float *wr = w + t * d.k, pv = INFINITY, S = 0.0f;
    int pi = -1;
    for (int j = 0; j < d.k; j++) {
        float bv;
        int bi;
        lane_next<N>(d, vr, r, lane, pv, pi, bv, bi);
        lk_router_warp_best(bv, bi);
        if (lane == 0) si[j] = bi, oi[j] = bi, wr[j] = bv;
        S += bv, pv = bv, pi = bi;
    }
    __syncwarp();   /* lane 0's weights, read by every lane */
    float mul = d.norm ? d.scale / S : d.scale;
    for (int j = lane; j < d.k; j += 32) wr[j] *= mul;
}

/* partial[b, e] = Σ v[t, e] / vsum[t] over the tokens of block b, in f64: AUX_LANES token
 * lanes a column, summed in lane order. Blocks: x = token block, y = 32 experts. */
__global__ void aux_partials(int64_t T, int64_t E, const float *v, const float *vsum, double *partial) {
    __shared__ double sh[AUX_LANES][32];
    int64_t e = blockIdx.y * 32 + threadIdx.x, b = blockIdx.x, t0 = b * AUX_TOKENS;
    int64_t t1 = t0 + AUX_TOKENS < T ? t0 + AUX_TOKENS : T;
    double s = 0.0;
    for (int64_t t = t0 + threadIdx.y; e < E && t < t1; t += AUX_LANES) s += (double)v[t * E + e] / (double)vsum[t];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y || e >= E) return;
    for (int y = 1; y < AUX_LANES; y++) s += sh[y][threadIdx.x];
    partial[b * E + e] = s;
}

/* *aux = scale · Σ_e counts_e · Σ_b partial[b, e]: one block, a fixed tree. */
__global__ void __launch_bounds__(AUX_THREADS) aux_final(int64_t nb, int64_t E, double scale, const double *partial,
                                                         const int32_t *counts, float *aux) {
    __shared__ double sh[AUX_THREADS];
    double s = 0.0;
    for (int64_t e = threadIdx.x; e < E; e += AUX_THREADS) {
        double P = 0.0;
        for (int64_t b = 0; b < nb; b++) P += partial[b * E + e];
        s += (double)counts[e] * P;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = AUX_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *aux = (float)(sh[0] * scale);
}

/* Over a group (router_cuda.c): this rank's sums into g [2E + 1] f64, which the group then
 * adds up: g[e] = Σ_b partial[b, e] (aux_final's order), g[E + e] = counts_e, g[2E] = T. */
__global__ void aux_pack(int64_t nb, int64_t E, int64_t T, const double *partial, const int32_t *counts, double *g) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e <= E; e += (int64_t)gridDim.x * blockDim.x) {
        if (e == E) {
            g[2 * E] = (double)T;
            continue;
        }
        double P = 0.0;
        for (int64_t b = 0; b < nb; b++) P += partial[b * E + e];
        g[e] = P, g[E + e] = (double)counts[e];
    }
}

/* *aux = E/(T²k) · Σ_e g[E + e] · g[e] from the group's sums (T = g[2E]; none: 0), the
 * tree of aux_final. */
__global__ void __launch_bounds__(AUX_THREADS) aux_from_sums(int64_t E, int k, const double *g, float *aux) {
    __shared__ double sh[AUX_THREADS];
    double s = 0.0;
    for (int64_t e = threadIdx.x; e < E; e += AUX_THREADS) s += g[E + e] * g[e];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = AUX_THREADS / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    const double T = g[2 * E];
    if (threadIdx.x == 0) *aux = T > 0 ? (float)(sh[0] * ((double)E / (T * T * k))) : 0.0f;
}

/* The backward's counts and T as f64 for the group's sum: g[e] = counts_e, g[E] = T. */
__global__ void count_pack(int64_t E, int64_t T, const int32_t *counts, double *g) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e <= E; e += (int64_t)gridDim.x * blockDim.x)
        g[e] = e == E ? (double)T : (double)counts[e];
}

/* Integer counts (exact in any order). Up to HIST_MAX experts a block counts in shared
 * memory first, so the global atomics are one per block and expert. */
__global__ void count_routes(const int32_t *ids, int64_t n, int64_t e, int32_t *counts) {
    extern __shared__ int32_t hist[];
    bool shared = e <= HIST_MAX;
    for (int64_t x = threadIdx.x; shared && x < e; x += blockDim.x) hist[x] = 0;
    __syncthreads();
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < n; r += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(shared ? hist + ids[r] : counts + ids[r], 1);
    __syncthreads();
    for (int64_t x = threadIdx.x; shared && x < e; x += blockDim.x)
        if (hist[x]) atomicAdd(counts + x, hist[x]);
}

/* d aux / d q[t, e]: this rank's counts times coef, or from the group's sums g (counts,
 * then T at g[E]) with coef = d_aux·E/k. */
static __device__ __forceinline__ float aux_grad(const int32_t *counts, const double *g, double coef, int64_t E,
                                                 int x) {
    if (g) {
        const double T = g[E];
        return T > 0 ? (float)(coef * g[x] / (T * T)) : 0.0f;
    }
    return counts ? (float)(coef * counts[x]) : 0.0f;
}

/* A warp a token: the CPU lk_router_backward, row in dz (d.sigmoid: its sigmoid case).
 * The k chosen experts are distinct, so their lanes add into dz without a race. */
__global__ void __launch_bounds__(WARPS * 32) d_logits(lk_router_cuda_dims d, const float *v, const int32_t *ids,
                                                       const float *dw, const int32_t *counts, const double *group,
                                                       double coef, float *dz) {
    int64_t t = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (t >= d.t) return;
    int lane = threadIdx.x & 31, E = (int)d.e;
    const float *vr = v + t * d.e, *dwr = dw + t * d.k;
    const int32_t *ir = ids + t * d.k;
    float *g = dz + t * d.e, S = 0.0f, sdw = 0.0f, V = 0.0f, gq = 0.0f, dot = 0.0f;
    for (int j = lane; j < d.k; j += 32) {
        float p = vr[ir[j]];
        S += p, sdw += dwr[j] * p;
    }
    for (int x = lane; x < E; x += 32) V += vr[x];
    S = lk_warp_sum(S), sdw = lk_warp_sum(sdw), V = lk_warp_sum(V);
    for (int x = lane; (counts || group) && x < E; x += 32) gq += aux_grad(counts, group, coef, d.e, x) * vr[x] / V;
    gq = lk_warp_sum(gq);
    for (int x = lane; x < E; x += 32) g[x] = (aux_grad(counts, group, coef, d.e, x) - gq) / V;
    __syncwarp();
    for (int j = lane; j < d.k; j += 32) {
        float gj = dwr[j] * d.scale;
        g[ir[j]] += d.norm ? gj / S - sdw * d.scale / (S * S) : gj;
    }
    __syncwarp();
    for (int x = lane; x < E; x += 32) dot += g[x] * vr[x];
    dot = lk_warp_sum(dot);
    for (int x = lane; x < E; x += 32)
        g[x] = d.sigmoid ? g[x] * vr[x] * (1.0f - vr[x]) : vr[x] * (g[x] - dot);
}

template <typename S, typename D>
__global__ void convert(int64_t n, const S *src, D *dst, int add) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float f = lk_to_f32(src[i]);
        dst[i] = lk_from_f32<D>(add ? lk_to_f32(dst[i]) + f : f);
    }
}

__global__ void split_bf16(int64_t t, int64_t e, const float *dz, lk_bf16_t *dz2) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < t * e; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / e, c = i - r * e;
        float f = dz[i];
        lk_bf16_t hi = lk_from_f32<lk_bf16_t>(f);
        dz2[r * 2 * e + c] = hi;
        dz2[r * 2 * e + e + c] = lk_from_f32<lk_bf16_t>(f - lk_to_f32(hi));
    }
}

/* --- launchers ------------------------------------------------------------------------ */

static unsigned token_blocks(int64_t t) { return (unsigned)lk_cdiv(t, WARPS); }
static unsigned flat_blocks(int64_t n) { return (unsigned)(n < ((int64_t)1 << 20) * 256 ? lk_cdiv(n, 256) : 1 << 20); }

extern "C" lk_status lk_router_cuda_softmax_topk(const lk_router_cuda_dims *d, const float *z, float *v,
                                                 int32_t *saved_ids, int32_t *topk_ids, float *w, float *vsum,
                                                 void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    unsigned g = token_blocks(d->t), b = WARPS * 32;
    lk_router_by_width(d->e, [&](auto n) {
        softmax_topk<decltype(n)::value><<<g, b, 0, st>>>(*d, z, v, saved_ids, topk_ids, w, vsum);
    });
    LK_CUDA_LAUNCHED("moe_router: softmax_topk (cuda): softmax and top-k");
    return LK_OK;
}

extern "C" int64_t lk_router_cuda_aux_scratch(int64_t t, int64_t e) { return lk_cdiv(t, AUX_TOKENS) * e; }

/* The aux loss's per-block partials into scratch; returns their count. */
static int64_t partials(const lk_router_cuda_dims *d, const float *v, const float *vsum, double *scratch,
                        cudaStream_t st) {
    int64_t nb = lk_cdiv(d->t, AUX_TOKENS);
    aux_partials<<<dim3((unsigned)nb, (unsigned)lk_cdiv(d->e, 32)), dim3(32, AUX_LANES), 0, st>>>(d->t, d->e, v, vsum,
                                                                                               scratch);
    return nb;
}

extern "C" lk_status lk_router_cuda_aux(const lk_router_cuda_dims *d, const float *v, const float *vsum,
                                        const int32_t *counts, double *scratch, float *aux, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    int64_t nb = partials(d, v, vsum, scratch, st);
    double T = (double)d->t;
    aux_final<<<1, AUX_THREADS, 0, st>>>(nb, d->e, (double)d->e / (T * T * d->k), scratch, counts, aux);
    LK_CUDA_LAUNCHED("moe_router (cuda): aux loss");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_aux_sums(const lk_router_cuda_dims *d, const float *v, const float *vsum,
                                             const int32_t *counts, double *scratch, double *g, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    int64_t nb = partials(d, v, vsum, scratch, st);
    aux_pack<<<(unsigned)lk_cdiv(d->e + 1, 256), 256, 0, st>>>(nb, d->e, d->t, scratch, counts, g);
    LK_CUDA_LAUNCHED("moe_router (cuda): aux loss sums");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_aux_from_sums(const lk_router_cuda_dims *d, const double *g, float *aux,
                                                  void *stream) {
    aux_from_sums<<<1, AUX_THREADS, 0, (cudaStream_t)stream>>>(d->e, d->k, g, aux);
    LK_CUDA_LAUNCHED("moe_router (cuda): aux loss from the group's sums");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_count_pack(int64_t t, int64_t e, const int32_t *counts, double *g, void *stream) {
    count_pack<<<(unsigned)lk_cdiv(e + 1, 256), 256, 0, (cudaStream_t)stream>>>(e, t, counts, g);
    LK_CUDA_LAUNCHED("moe_router (cuda): counts for the group");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_count(const int32_t *ids, int64_t n, int64_t e, int32_t *counts, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    LK_CUDA_TRY(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)e, st));
    int64_t per = 16 * 256;   /* routes a block: enough to pay for its histogram */
    unsigned g = (unsigned)(lk_cdiv(n, per) < (1 << 16) ? lk_cdiv(n, per) : 1 << 16);
    size_t smem = e <= HIST_MAX ? sizeof(int32_t) * (size_t)e : 0;
    count_routes<<<g, 256, smem, st>>>(ids, n, e, counts);
    LK_CUDA_LAUNCHED("moe_router (cuda): expert counts");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_d_logits(const lk_router_cuda_dims *d, const float *v, const int32_t *ids,
                                             const float *dw, const int32_t *counts, const double *group,
                                             double aux_coef, float *dz, void *stream) {
    d_logits<<<token_blocks(d->t), WARPS * 32, 0, (cudaStream_t)stream>>>(*d, v, ids, dw, counts, group, aux_coef, dz);
    LK_CUDA_LAUNCHED("moe_router (cuda): d_logits");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_convert(int64_t n, lk_dtype src_dt, const void *src, lk_dtype dst_dt, void *dst,
                                            int add, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    unsigned g = flat_blocks(n);
    if (src_dt == LK_F32 && dst_dt == LK_F32)
        convert<float, float><<<g, 256, 0, st>>>(n, (const float *)src, (float *)dst, add);
    else if (src_dt == LK_F32)
        convert<float, lk_bf16_t><<<g, 256, 0, st>>>(n, (const float *)src, (lk_bf16_t *)dst, add);
    else if (dst_dt == LK_F32)
        convert<lk_bf16_t, float><<<g, 256, 0, st>>>(n, (const lk_bf16_t *)src, (float *)dst, add);
    else
        convert<lk_bf16_t, lk_bf16_t><<<g, 256, 0, st>>>(n, (const lk_bf16_t *)src, (lk_bf16_t *)dst, add);
    LK_CUDA_LAUNCHED("moe_router (cuda): conversion");
    return LK_OK;
}

extern "C" lk_status lk_router_cuda_split_bf16(int64_t t, int64_t e, const float *dz, void *dz2, void *stream) {
    split_bf16<<<flat_blocks(t * e), 256, 0, (cudaStream_t)stream>>>(t, e, dz, (lk_bf16_t *)dz2);
    LK_CUDA_LAUNCHED("moe_router (cuda): d_logits in two bf16 parts");
    return LK_OK;
}
