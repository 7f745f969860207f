/* rows_sm90.cu — fused.cu's ce_rows on Hopper (sm_90a): each row of a chunk of logits read
 * from HBM once. ce_rows reads a row twice (the max and sum, then the gradient) and counts
 * on L2 for the second read; a 151936-column bf16 row is 297 KiB, a SM runs four of them at
 * once, so 528 rows (157 MiB) are in flight against a 50 MiB L2 and both reads come from
 * HBM: three row-passes of traffic (read, read, write) at ~3.8 TB/s, 1.30 ms for 5461 rows
 * (bench/NOTES.md, twenty-first session). Keeping fewer rows in flight so the second read
 * hits L2 made it slower (branch wip-ce-l2, twenty-second session).
 *
 * Here a row is split over a cluster of C CTAs (C = 2, 4 or 8: the fewest that leave each at
 * most SLICE_SMALL bytes, so four CTAs of 256 threads fit a SM and their loads overlap the
 * others' arithmetic and stores; a row too long for eight such slices, f32 logits past ~98k
 * columns, takes eight of up to SLICE_MAX). Two CTAs of 512 threads a SM, each a slice of up
 * to 100 KB (four at Qwen3's vocab in bf16), ran the dense step's chunks (2,048 rows of
 * 151936) at 568 us, 2.19 TB/s on an H100; four of 256 with eight 37 KB slices a row, 493 us,
 * 2.53 TB/s (bench/NOTES.md, fifty-eighth session).
 * CTA r brings its slice [r·Vc, r·Vc + Vc) into shared memory with bulk copies (one
 * mbarrier), sums its (max, Σexp, Σz) from there, and hands the triple to every CTA of
 * the cluster through distributed shared memory; after one cluster barrier each merges the
 * C triples in rank order (fused.cu's merge), so all hold the same lse. Rank 0 writes the
 * row's loss (row_math.cuh's row_loss) from the label's logit it read before that barrier;
 * every CTA writes its slice's gradient from shared memory, over the logits when dz is z.
 * Two row-passes of traffic, not three. The arithmetic of every element is row_math.cuh's;
 * only the order of the sums differs from ce_rows (a fixed order: the same bits every run).
 *
 * Taken (lk_ce_cuda_rows_sm90) on an sm_90 GPU when the row is at least SMEM_MIN bytes (a
 * shorter row's two reads hit L2 anyway), fits 8 slices, and every row and slice starts
 * 16-byte aligned (V · sizeof(TZ) and V · sizeof(TG) multiples of 16, z and dz aligned);
 * otherwise fused.cu's ce_rows runs. */
#include "core/cuda_check.h"
#include "llmkern/registry.h"
#include "ops/attention/hopper.cuh"
#include "ops/cross_entropy/row_math.cuh"

#define SM_THREADS 256
#define SLICE_SMALL (48 * 1024)  /* four CTAs a SM with their barrier and scratch */
#define SLICE_MAX (100 * 1024)   /* two: only for rows longer than eight small slices */
#define SMEM_MIN (64 * 1024)
#define COPY_MAX (32 * 1024)     /* bytes a bulk copy: several in flight from the start */

#if FA3_ARCH

/* v into the float at `at`'s offset of cluster CTA `cta`'s shared memory. */
static __device__ __forceinline__ void st_cluster(float *at, uint32_t cta, float v) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nst.shared::cluster.f32 [ra], %2;\n}" ::"r"(
                     smem_u32(at)),
                 "r"(cta), "f"(v)
                 : "memory");
}

static __device__ __forceinline__ uint32_t cluster_size() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}

/* W elements of T from shared memory (16 bytes) as f32; W f32 into global memory as T
 * (16 or 8 bytes). */
template <typename T, int W>
static __device__ __forceinline__ void ld_smem(const T *p, float *f) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int j = 0; j < W; j++) f[j] = lk_to_f32(e[j]);
}
template <typename T, int W>
static __device__ __forceinline__ void st_global(T *p, const float *f) {
    T e[W];
#pragma unroll
    for (int j = 0; j < W; j++) e[j] = lk_from_f32<T>(f[j]);
    if (sizeof e == 16) *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(e);
    else *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(e);
}

template <typename TZ, typename TG>
__global__ void __launch_bounds__(SM_THREADS, 4) ce_rows_smem(lk_ce_cuda_plan p, const TZ *z, TG *dz, int64_t k0,
                                                              int64_t vc, const int64_t *nv, const float *d_loss,
                                                              float *loss, float *zl, float *lse_out, int by_token) {
    constexpr int W = 16 / sizeof(TZ);
    extern __shared__ __align__(128) uint8_t smem_raw[];
    __shared__ uint64_t full;
    __shared__ float part[8][3], red[SM_THREADS / 32][3], res;
    const uint32_t C = cluster_size(), r = cluster_rank();
    const int64_t V = p.V, i = blockIdx.x / C, k = k0 + i, c0 = (int64_t)r * vc;
    const int64_t nc = c0 < V ? (V - c0 < vc ? V - c0 : vc) : 0;
    const TZ *zr = z + i * V;
    const TZ *row = reinterpret_cast<const TZ *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* the label's logit, read before the cluster barrier below: past it the CTA whose slice
     * holds the label may already be writing the gradient over it (dz is z in place) */
    const float zy = r == 0 && tid == 0 ? label_logit(p, k, zr) : 0.0f;
    if (tid == 0) {
        mbar_init(&full, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* the peers must be running before this CTA writes into their shared memory: arrive now,
     * wait just before the writes, so the barrier's latency hides behind the loads */
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
    const uint32_t bytes = (uint32_t)(nc * (int64_t)sizeof(TZ));
    if (tid == 0) {
        mbar_expect_tx(&full, bytes);
        for (uint32_t o = 0; o < bytes; o += COPY_MAX)
            bulk_load(smem_raw + o, reinterpret_cast<const uint8_t *>(zr + c0) + o,
                      bytes - o < COPY_MAX ? bytes - o : COPY_MAX, &full);
    }
    mbar_wait(&full, 0);

    const int units = (int)(nc / W);
    float m = -INFINITY, s = 0.0f, sz = 0.0f;
    for (int u = tid; u < units; u += SM_THREADS) {
        float f[W];
        ld_smem<TZ, W>(row + (int64_t)u * W, f);
        fold<W>(f, p.cap, m, s, sz);
    }
    warp_merge(m, s, sz);
    if (lane == 0) red[warp][0] = m, red[warp][1] = s, red[warp][2] = sz;
    __syncthreads();
    asm volatile("barrier.cluster.wait;" ::: "memory");   /* every peer has started */
    if (warp == 0) {
        constexpr int WARPS = SM_THREADS / 32;
        m = lane < WARPS ? red[lane][0] : -INFINITY, s = lane < WARPS ? red[lane][1] : 0.0f;
        sz = lane < WARPS ? red[lane][2] : 0.0f;
        warp_merge(m, s, sz);
        if (lane < (int)C) {   /* this CTA's triple into slot r of CTA `lane` */
            st_cluster(&part[r][0], (uint32_t)lane, m);
            st_cluster(&part[r][1], (uint32_t)lane, s);
            st_cluster(&part[r][2], (uint32_t)lane, sz);
        }
    }
    cluster_sync();   /* every slot written (release / acquire); no remote access after it */
    if (tid == 0) {
        m = part[0][0], s = part[0][1], sz = part[0][2];
        for (uint32_t q = 1; q < C; q++) merge(m, s, part[q][0], part[q][1]), sz += part[q][2];
        const float lse = m + logf(s);
        res = r == 0 ? row_loss(p, k, zy, lse, sz, loss, zl, lse_out, by_token) : lse;
    }
    if (dz == NULL) return;
    __syncthreads();
    const float lse = res;
    const grad_coef gc = coef_of(p, k, lse, nv, d_loss);
    TG *dr = dz + i * V + c0;
    for (int u = tid; u < units; u += SM_THREADS) {
        float f[W];
        ld_smem<TZ, W>(row + (int64_t)u * W, f);
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = grad_at(gc, f[j], c0 + (int64_t)u * W + j, lse, p.cap);
        st_global<TG, W>(dr + (int64_t)u * W, f);
    }
}

#else

template <typename TZ, typename TG>
__global__ void ce_rows_smem(lk_ce_cuda_plan, const TZ *, TG *, int64_t, int64_t, const int64_t *, const float *,
                             float *, float *, float *, int) {
    __trap();
}

#endif

template <typename TZ, typename TG>
static lk_status launch(const lk_ce_cuda_plan &p, const void *z, void *dz, int64_t k0, int64_t n, const int64_t *nv,
                        const float *d_loss, float *loss, float *zl, float *lse, int by_token, cudaStream_t st,
                        int *taken) {
    const int64_t es = sizeof(TZ), w = 16 / es;
    const bool aligned = (p.V * es) % 16 == 0 && (p.V * (int64_t)sizeof(TG)) % 16 == 0 && lk_aligned16(z) &&
                         (dz == NULL || lk_aligned16(dz));
    if (!aligned || p.V * es < SMEM_MIN || n > INT32_MAX / 8) return LK_OK;
    auto slice = [&](int c) { return lk_cdiv(lk_cdiv(p.V, c), w) * w; };   /* elements: whole 16-byte groups */
    int c = 1;
    while (c < 8 && slice(c) * es > SLICE_SMALL) c *= 2;
    if (slice(c) * es > SLICE_MAX) return LK_OK;   /* past SLICE_SMALL only at eight: a long f32 row */
    const int64_t vc = slice(c);
    const int bytes = (int)(vc * es);
    static int ready[2][2];   /* the shared-memory attribute, set once an instantiation */
    int &rd = ready[sizeof(TZ) == 4][sizeof(TG) == 4];
    if (!rd) {
        LK_CUDA_TRY(cudaFuncSetAttribute(ce_rows_smem<TZ, TG>, cudaFuncAttributeMaxDynamicSharedMemorySize, SLICE_MAX));
        rd = 1;
    }
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = (unsigned)c, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(n * c)), cfg.blockDim = dim3(SM_THREADS), cfg.dynamicSmemBytes = (size_t)bytes;
    cfg.stream = st, cfg.attrs = &at, cfg.numAttrs = 1;
    LK_CUDA_TRY(cudaLaunchKernelEx(&cfg, ce_rows_smem<TZ, TG>, p, (const TZ *)z, (TG *)dz, k0, vc, nv, d_loss, loss,
                                   zl, lse, by_token));
    *taken = 1;
    return LK_OK;
}

extern "C" lk_status lk_ce_cuda_rows_sm90(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt,
                                          void *dz, int64_t k0, int64_t n, const int64_t *n_valid,
                                          const float *d_loss, float *loss, float *zl, float *lse, int by_token,
                                          void *stream, int *taken) {
    *taken = 0;
    if (lk_hw_get()->cuda_cc != 90 || n == 0) return LK_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (zt == LK_BF16 && gt == LK_BF16)
        return launch<lk_bf16_t, lk_bf16_t>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st, taken);
    if (zt == LK_F32 && gt == LK_BF16)
        return launch<float, lk_bf16_t>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st, taken);
    if (zt == LK_F32 && gt == LK_F32)
        return launch<float, float>(*p, z, dz, k0, n, n_valid, d_loss, loss, zl, lse, by_token, st, taken);
    return LK_OK;   /* fused.cu names the pair it has not built */
}
