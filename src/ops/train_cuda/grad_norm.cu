/* grad_norm.cu — the global gradient norm and clipping on CUDA (cuda_train.h). Two
 * passes, both in a fixed order so the norm has the same bits on every run: each
 * 4096-element block (multi_tensor.cuh; two of them a CUDA block) sums its squares in f64
 * (a thread's 16 elements in order: four runs of four consecutive ones where the block is
 * whole and aligned, else 16 strided by the block; then the block's tree) into part[block];
 * one block of 1024 threads then sums part[] the same way. f64 throughout: the norm's
 * squares of large gradients neither overflow nor lose the small ones, and the GPU's f64
 * rate is far above what the memory delivers here. */
#include <math.h>
#include <stdlib.h>
#include "llmkern/cuda_train.h"
#include "llmkern/train.h"
#include "ops/train_cuda/norm.cuh"

static __device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The block's sum to thread 0 (fixed order: warp trees, then warps in order). */
static __device__ __forceinline__ double block_sum_f64(double v, double *scratch) {
    v = warp_sum_f64(v);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += scratch[w];
    return s;
}

/* A thread's four runs of four (x[k], in order) squared and summed: one expression for every
 * path that loads them, so each chunk's sum has the same bits however its block found it. */
static __device__ __forceinline__ double sq_runs(const float4 *x) {
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < LK_MT_PER_THREAD / 4; k++)
        s += (double)x[k].x * x[k].x + (double)x[k].y * x[k].y + (double)x[k].z * x[k].z + (double)x[k].w * x[k].w;
    return s;
}

/* Whether the chunk from start of d is whole and aligned for four-element loads. */
static __device__ __forceinline__ bool vec_chunk(const ndesc &d, int64_t start) {
    const uintptr_t at = d.bf16 ? (uintptr_t)(static_cast<const lk_bf16_t *>(d.p) + start)
                                : (uintptr_t)(static_cast<const float *>(d.p) + start);
    return lk_mt_vec(start, d.n, d.bf16 ? 0 : at, d.bf16 ? at : 0);
}

static __device__ __forceinline__ void ld_runs(const ndesc &d, int64_t start, float4 *x) {
#pragma unroll
    for (int k = 0; k < LK_MT_PER_THREAD / 4; k++)
        x[k] = lk_mt_ld4(d.p, d.bf16, start + 4 * ((int64_t)k * LK_MT_THREADS + threadIdx.x));
}

/* The thread's part of one chunk: four runs where whole and aligned, else strided. */
static __device__ __forceinline__ double chunk_sumsq(const ndesc &d, int64_t start) {
    if (vec_chunk(d, start)) {
        float4 x[LK_MT_PER_THREAD / 4];
        ld_runs(d, start, x);
        return sq_runs(x);
    }
    double s = 0.0;
#pragma unroll 4
    for (int k = 0; k < LK_MT_PER_THREAD; k++) {
        int64_t i = start + (int64_t)k * LK_MT_THREADS + threadIdx.x;
        if (i >= d.n) break;
        double x = lk_mt_ld(d.p, d.bf16, i);
        s += x * x;
    }
    return s;
}

/* Two consecutive chunks a block (chunks 2b and 2b + 1 into part[] as one block a chunk
 * wrote them: the same order, the same bits): where both are whole and aligned in one
 * tensor, all eight loads of a thread issue before either sum, twice the bytes in flight of
 * a block a chunk (8 KB, at ~1M blocks a MoE step, each with its lookup and its tree: 2.9
 * TB/s, bench/NOTES.md, thirty-sixth session); elsewhere each chunk on its own. */
__global__ void __launch_bounds__(LK_MT_THREADS, 5) sumsq_kernel(const ndesc *list, int n_list, int64_t chunks,
                                                                 double *part) {
    __shared__ double scratch[2][32];
    const int64_t c0 = 2 * (int64_t)blockIdx.x;
    const ndesc d = list[lk_mt_find(list, n_list, c0)];
    const int64_t start = (c0 - d.block0) * (int64_t)LK_MT_CHUNK;
    double s0, s1 = 0.0;
    if (start + 2 * LK_MT_CHUNK <= d.n && vec_chunk(d, start)) {   /* both chunks in d, both aligned */
        float4 x0[LK_MT_PER_THREAD / 4], x1[LK_MT_PER_THREAD / 4];
        ld_runs(d, start, x0);
        ld_runs(d, start + LK_MT_CHUNK, x1);
        s0 = sq_runs(x0), s1 = sq_runs(x1);
    } else {
        s0 = chunk_sumsq(d, start);
        if (c0 + 1 < chunks) {
            const ndesc e = list[lk_mt_find(list, n_list, c0 + 1)];
            s1 = chunk_sumsq(e, (c0 + 1 - e.block0) * (int64_t)LK_MT_CHUNK);
        }
    }
    s0 = block_sum_f64(s0, scratch[0]), s1 = block_sum_f64(s1, scratch[1]);   /* each chunk's own tree */
    if (threadIdx.x == 0) {
        part[c0] = s0;
        if (c0 + 1 < chunks) part[c0 + 1] = s1;
    }
}

__global__ void __launch_bounds__(FINAL_THREADS) final_kernel(const double *part, int64_t n, double *out) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += FINAL_THREADS) s += part[i];
    s = block_sum_f64(s, scratch);
    if (threadIdx.x == 0) *out = s;
}

__global__ void __launch_bounds__(LK_MT_THREADS) scale_kernel(const ndesc *list, int n_list, float scale) {
    const ndesc d = list[lk_mt_find(list, n_list, blockIdx.x)];
    const int64_t base = (blockIdx.x - d.block0) * (int64_t)LK_MT_CHUNK + threadIdx.x;
#pragma unroll 4
    for (int k = 0; k < LK_MT_PER_THREAD; k++) {
        int64_t i = base + (int64_t)k * LK_MT_THREADS;
        if (i >= d.n) break;
        lk_mt_st(d.p, d.bf16, i, lk_mt_ld(d.p, d.bf16, i) * scale);
    }
}

static int64_t count_blocks(const lk_cuda_buf *b, int n) {
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) blocks += lk_cdiv(b[i].n > 0 ? b[i].n : 0, LK_MT_CHUNK);
    return blocks;
}

static lk_status check(const char *fn, const lk_cuda_buf *b, int n, lk_ctx *ctx) {
    lk_status st = lk_mt_check_ctx(fn, ctx);
    if (st != LK_OK) return st;
    if (n < 0 || (n > 0 && b == NULL))
        return lk_error(LK_EINVAL, "%s: bufs: expected a list of n_bufs >= 0, got %d", fn, n);
    for (int i = 0; i < n; i++) {
        if (b[i].n < 0) return lk_error(LK_EINVAL, "%s: bufs[%d].n: expected >= 0, got %lld", fn, i, (long long)b[i].n);
        if (b[i].n > 0 && b[i].data == NULL)
            return lk_error(LK_EINVAL, "%s: bufs[%d].data: expected device memory, got NULL", fn, i);
        if (b[i].dtype != LK_F32 && b[i].dtype != LK_BF16)
            return lk_error(LK_EDTYPE, "%s: bufs[%d].dtype: expected f32 or bf16, got %s", fn, i,
                            lk_dtype_name(b[i].dtype));
    }
    if (count_blocks(b, n) > 0x7fffffff)
        return lk_error(LK_EINVAL, "%s: bufs: more than 2^31 blocks of %d", fn, LK_MT_CHUNK);
    return LK_OK;
}

/* The descriptor list into the workspace (reserved by the caller with room for extra
 * more bytes after it). */
static lk_status upload(const char *fn, const lk_cuda_buf *b, int n, lk_ctx *ctx, ndesc **dev) {
    ndesc *h = static_cast<ndesc *>(malloc(sizeof(ndesc) * (size_t)n));
    if (h == NULL) return lk_error(LK_ENOMEM, "%s: %d descriptors", fn, n);
    int64_t blocks = 0;
    for (int i = 0; i < n; i++) {
        h[i] = (ndesc){b[i].data, b[i].n, blocks, b[i].dtype == LK_BF16};
        blocks += lk_cdiv(b[i].n, LK_MT_CHUNK);
    }
    lk_status st = lk_mt_upload(fn, ctx, h, n, dev);
    free(h);
    return st;
}

extern "C" size_t lk_cuda_grad_norm_workspace(const lk_cuda_buf *bufs, int n_bufs) {
    return lk_arena_piece(sizeof(ndesc) * (size_t)(n_bufs > 0 ? n_bufs : 0)) +
           lk_arena_piece(sizeof(double) * (size_t)(count_blocks(bufs, n_bufs) + 1));
}

extern "C" lk_status lk_cuda_grad_norm(const lk_cuda_buf *bufs, int n_bufs, double *norm, lk_ctx *ctx) {
    static const char *fn = "grad_norm (cuda)";
    lk_status st = check(fn, bufs, n_bufs, ctx);
    if (st != LK_OK) return st;
    if (norm == NULL) return lk_error(LK_EINVAL, "%s: norm: expected a host pointer, got NULL", fn);
    int64_t blocks = count_blocks(bufs, n_bufs);
    if (blocks == 0) return *norm = 0.0, LK_OK;
    cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
    size_t mark;
    ndesc *dev = NULL;
    st = lk_ctx_workspace_begin(ctx, fn, lk_cuda_grad_norm_workspace(bufs, n_bufs), &mark);
    if (st == LK_OK) st = upload(fn, bufs, n_bufs, ctx, &dev);
    double *part = NULL;
    if (st == LK_OK) part = static_cast<double *>(lk_arena_alloc(ctx->arena, sizeof(double) * (size_t)(blocks + 1)));
    if (st == LK_OK && part == NULL) st = lk_error(LK_EINTERNAL, "%s: workspace smaller than its query", fn);
    double total = NAN;
    if (st == LK_OK) {
        sumsq_kernel<<<lk_sumsq_grid(blocks), LK_MT_THREADS, 0, s>>>(dev, n_bufs, blocks, part);
        final_kernel<<<1, FINAL_THREADS, 0, s>>>(part, blocks, part + blocks);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpyAsync(&total, part + blocks, sizeof total, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) st = lk_cuda_fail(e, "grad_norm (cuda): sum of squares", __FILE__, __LINE__);
    }
    lk_ctx_workspace_end(ctx, mark);
    if (st == LK_OK) *norm = sqrt(total);
    return st;
}

extern "C" lk_status lk_cuda_scale_bufs(const lk_cuda_buf *bufs, int n_bufs, float scale, lk_ctx *ctx) {
    static const char *fn = "scale_bufs (cuda)";
    lk_status st = check(fn, bufs, n_bufs, ctx);
    if (st != LK_OK) return st;
    int64_t blocks = count_blocks(bufs, n_bufs);
    if (blocks == 0) return LK_OK;
    size_t mark;
    ndesc *dev = NULL;
    st = lk_ctx_workspace_begin(ctx, fn, lk_arena_piece(sizeof(ndesc) * (size_t)n_bufs), &mark);
    if (st == LK_OK) st = upload(fn, bufs, n_bufs, ctx, &dev);
    if (st == LK_OK) {
        cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
        scale_kernel<<<(unsigned)blocks, LK_MT_THREADS, 0, s>>>(dev, n_bufs, scale);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = lk_cuda_fail(e, "scale_bufs (cuda): launch", __FILE__, __LINE__);
    }
    lk_ctx_workspace_end(ctx, mark);
    return st;
}

extern "C" lk_status lk_cuda_clip_grad_norm(const lk_cuda_buf *bufs, int n_bufs, double max_norm, double *norm,
                                           lk_ctx *ctx) {
    double nrm;
    lk_status st = lk_cuda_grad_norm(bufs, n_bufs, &nrm, ctx);
    if (st != LK_OK) return st;
    if (norm) *norm = nrm;
    if (!isfinite(nrm) || max_norm <= 0.0 || nrm <= max_norm) return LK_OK;
    return lk_cuda_scale_bufs(bufs, n_bufs, lk_clip_scale(nrm, max_norm), ctx);   /* the CPU's factor */
}
