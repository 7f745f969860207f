/* adamw.cu — multi-tensor AdamW on CUDA (cuda_train.h): every parameter tensor of a
 * step in one launch (multi_tensor.cuh cuts them into 4096-element blocks). 16 elements a
 * thread: runs of consecutive ones (16-byte loads: four f32 state, eight bf16) where the block
 * is whole and aligned, else strided by the block, so each load is coalesced either way;
 * memory-bound (a bf16 parameter with f32 master and bf16 grad moves 2+2+4·3 read and
 * 2+4·3 written bytes an element; bf16 moments 4 fewer each way; a bf16 param without a
 * master 4 fewer each way again), so the math is the CPU trainer's, in f32, and a bf16
 * moment, or a bf16 param without a master, is rounded stochastically as the CPU's is
 * (sround.h). */
#include <math.h>
#include <stdlib.h>
#include "core/sround.h"
#include "llmkern/cuda_train.h"
#include "ops/train_cuda/norm.cuh"

static const char *FN = "adamw (cuda)";

typedef struct {
    void *p;
    const void *g;
    void *m, *v;
    float *master;
    int64_t n, block0;
    int p_bf16, g_bf16, no_decay, m_bf16, v_bf16;
    int tensor;                       /* the index in the list: the stochastic rounding's */
} adesc;

typedef struct {
    float b1, b2, eps, step, vcorr;   /* step = lr/(1-b1^t), vcorr = 1/sqrt(1-b2^t) */
    float decay;                      /* 1 - lr·wd (a no_decay tensor takes 1) */
    double max_norm;                  /* the plan's clipping (> 0: on) */
    uint64_t sround_key;              /* lk_sround_step_key(seed, t) */
} ascal;

/* Block b's elements of its tensor, the gradient times gscale (1, or the clip). Every
 * operation rounded on its own (the _rn intrinsics): left to itself, ptxas contracted
 * these products into FMAs one way in adamw_kernel (whose gscale was then the constant 1)
 * and another in the plan's kernel, so an eager step and a CUDA graph's replay of it
 * updated the weights a few ulps apart (bench/NOTES.md, issue 17's graph test). */
static __device__ __forceinline__ float adamw_one(float g, float &m, float &v, float w, const ascal &s, float decay) {
    m = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(1.0f - s.b1, g));
    v = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(1.0f - s.b2, g), g));
    const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.vcorr), s.eps);
    return __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(s.step, m), den));
}

/* W (4 or 8) consecutive f32 or bf16 elements from i, by 16-byte loads (four bf16: 8 bytes);
 * aligned by the caller. */
template <int W>
static __device__ __forceinline__ void ldw(const void *p, int bf16, int64_t i, float *o) {
    if (!bf16) {
#pragma unroll
        for (int h = 0; h < W; h += 4) {
            const float4 f = *reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i + h);
            o[h] = f.x, o[h + 1] = f.y, o[h + 2] = f.z, o[h + 3] = f.w;
        }
        return;
    }
    uint32_t u[W / 2];
    if (W == 8) *reinterpret_cast<uint4 *>(u) = *reinterpret_cast<const uint4 *>(static_cast<const lk_bf16_t *>(p) + i);
    else *reinterpret_cast<uint2 *>(u) = *reinterpret_cast<const uint2 *>(static_cast<const lk_bf16_t *>(p) + i);
#pragma unroll
    for (int h = 0; h < W / 2; h++) o[2 * h] = __uint_as_float(u[h] << 16), o[2 * h + 1] = __uint_as_float(u[h] & 0xffff0000u);
}

/* W moments (or masterless bf16 weights) of elements i.. back to memory: f32, or bf16
 * rounded with bits >> shift of each element's r (m takes bits 0-15, v 16-31, p 32-47). */
template <int W>
static __device__ __forceinline__ void stw_moment(void *p, int bf16, int64_t i, const float *x, const uint64_t *r,
                                                  int shift) {
    if (!bf16) {
#pragma unroll
        for (int h = 0; h < W; h += 4)
            *reinterpret_cast<float4 *>(static_cast<float *>(p) + i + h) = make_float4(x[h], x[h + 1], x[h + 2], x[h + 3]);
        return;
    }
    uint32_t u[W / 2];
#pragma unroll
    for (int h = 0; h < W / 2; h++)
        u[h] = lk_sround_bf16(x[2 * h], (uint32_t)(r[2 * h] >> shift)) |
               (uint32_t)lk_sround_bf16(x[2 * h + 1], (uint32_t)(r[2 * h + 1] >> shift)) << 16;
    if (W == 8) *reinterpret_cast<uint4 *>(static_cast<lk_bf16_t *>(p) + i) = *reinterpret_cast<const uint4 *>(u);
    else *reinterpret_cast<uint2 *>(static_cast<lk_bf16_t *>(p) + i) = *reinterpret_cast<const uint2 *>(u);
}

/* W f32 weights rounded to nearest into bf16 (a master's copy). */
template <int W>
static __device__ __forceinline__ void stw_bf16_rn(lk_bf16_t *p, const float *x) {
    uint32_t u[W / 2];
#pragma unroll
    for (int h = 0; h < W / 2; h++) u[h] = lk_pack_bf16x2(x[2 * h], x[2 * h + 1]);
    if (W == 8) *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(u);
    else *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(u);
}

static __device__ __forceinline__ void st_moment(void *p, int bf16, int64_t i, float x, uint64_t r, int shift) {
    if (bf16) static_cast<uint16_t *>(p)[i] = lk_sround_bf16(x, (uint32_t)(r >> shift));
    else static_cast<float *>(p)[i] = x;
}

/* LEAN: a list with bf16 state (moments, or weights without a master) runs its vector loop one
 * run of eight at a time (16-byte bf16 loads) at 4 blocks an SM, where the roundings' integer
 * work wants warps (9.50 ms where 4 unrolled runs at 4 blocks took 10.62 on the MoE step);
 * runs of four, one at a time, at 5 blocks an SM left the SM's memory pipe idle while a run's
 * arithmetic issued: 72 KB in flight an SM, 2.9 TB/s (bench/NOTES.md, thirty-fifth session);
 * runs of eight took 9.77 ms where they took 10.60 (H100, thirty-eighth session).
 * f32 state, bound by memory alone, keeps four runs of four unrolled (14.48 ms against 14.81
 * lean: twenty-ninth and thirtieth sessions). */
template <bool LEAN>
static __device__ __forceinline__ void adamw_block(const adesc *list, int n_list, const ascal &s, float gscale) {
    const adesc d = list[lk_mt_find(list, n_list, blockIdx.x)];
    const int64_t start = (blockIdx.x - d.block0) * (int64_t)LK_MT_CHUNK;
    const float decay = d.no_decay ? 1.0f : s.decay;
    /* w: the f32 weights updated (an f32 param, or a bf16 param's master); NULL for a bf16
     * param without a master, read from p and stored by stochastic rounding (bits 32-47) */
    float *w = d.p_bf16 ? d.master : static_cast<float *>(d.p);
    lk_bf16_t *pb = d.p_bf16 ? static_cast<lk_bf16_t *>(d.p) : NULL;
    const int sr = d.m_bf16 | d.v_bf16 | (w == NULL);
    const uint64_t key = sr ? lk_sround_tensor_key(s.sround_key, d.tensor) : 0;
    /* the pieces' addresses by width: f32 ones need 16-byte alignment, bf16 ones 8 */
    const uintptr_t pieces[5] = {w ? (uintptr_t)(w + start) : 0, (uintptr_t)d.m + start * (d.m_bf16 ? 2 : 4),
                                 (uintptr_t)d.v + start * (d.v_bf16 ? 2 : 4),
                                 (uintptr_t)d.g + start * (d.g_bf16 ? 2 : 4), pb ? (uintptr_t)(pb + start) : 0};
    const uintptr_t f32p = pieces[0] | (d.m_bf16 ? 0 : pieces[1]) | (d.v_bf16 ? 0 : pieces[2]) |
                           (d.g_bf16 ? 0 : pieces[3]);
    const uintptr_t bf16p = (d.m_bf16 ? pieces[1] : 0) | (d.v_bf16 ? pieces[2] : 0) | (d.g_bf16 ? pieces[3] : 0) |
                            pieces[4];
    constexpr int W = LEAN ? 8 : 4, runs = LK_MT_PER_THREAD / W, unrolled = LEAN ? 1 : runs;
    if (lk_mt_vec(start, d.n, f32p, bf16p) && bf16p % (2 * W) == 0) {   /* the same arithmetic, element for element */
#pragma unroll unrolled
        for (int k = 0; k < runs; k++) {
            const int64_t i = start + W * ((int64_t)k * LK_MT_THREADS + threadIdx.x);
            float g[W], m[W], v[W], p[W];
            ldw<W>(d.g, d.g_bf16, i, g);
            ldw<W>(d.m, d.m_bf16, i, m);
            ldw<W>(d.v, d.v_bf16, i, v);
            if (w) ldw<W>(w, 0, i, p);
            else ldw<W>(pb, 1, i, p);
#pragma unroll
            for (int e = 0; e < W; e++) p[e] = adamw_one(__fmul_rn(g[e], gscale), m[e], v[e], p[e], s, decay);
            uint64_t r[W];
#pragma unroll
            for (int e = 0; e < W; e++) r[e] = sr ? lk_sround_bits(key, i + e, w == NULL) : 0;
            stw_moment<W>(d.m, d.m_bf16, i, m, r, 0);
            stw_moment<W>(d.v, d.v_bf16, i, v, r, 16);
            if (w) stw_moment<W>(w, 0, i, p, r, 0);
            if (w && pb) stw_bf16_rn<W>(pb + i, p);
            if (!w) stw_moment<W>(pb, 1, i, p, r, 32);
        }
        return;
    }
#pragma unroll 4
    for (int k = 0; k < LK_MT_PER_THREAD; k++) {
        int64_t i = start + (int64_t)k * LK_MT_THREADS + threadIdx.x;
        if (i >= d.n) break;
        float m = lk_mt_ld(d.m, d.m_bf16, i), v = lk_mt_ld(d.v, d.v_bf16, i);
        const float p = adamw_one(__fmul_rn(lk_mt_ld(d.g, d.g_bf16, i), gscale), m, v, w ? w[i] : lk_mt_ld(pb, 1, i),
                                  s, decay);
        const uint64_t r = sr ? lk_sround_bits(key, i, w == NULL) : 0;
        st_moment(d.m, d.m_bf16, i, m, r, 0);
        st_moment(d.v, d.v_bf16, i, v, r, 16);
        if (w) w[i] = p;
        if (w && pb) pb[i] = __float2bfloat16_rn(p);
        if (!w) st_moment(pb, 1, i, p, r, 32);
    }
}

template <bool LEAN>
__global__ void __launch_bounds__(LK_MT_THREADS, LEAN ? 4 : 1) adamw_kernel(const adesc *list, int n_list, ascal s,
                                                                           float gscale) {
    adamw_block<LEAN>(list, n_list, s, gscale);
}

/* The plan's step: the scalars and the sum of squares from device memory. Once a step
 * has logged a NaN or Inf loss or norm (halted), no tensor changes again; above max_norm
 * the gradient is scaled by max_norm / (norm + 1e-6) as it is read
 * (lk_cuda_clip_grad_norm's factor, rounded the same way, so a plan's step has the bits
 * of clip + lk_cuda_adamw_step). */
template <bool LEAN>
__global__ void __launch_bounds__(LK_MT_THREADS, LEAN ? 4 : 1) adamw_plan_kernel(const adesc *list, int n_list,
                                                                                const ascal *sp, const double *sumsq,
                                                                                const int *halted) {
    if (*halted) return;
    const ascal s = *sp;
    const double norm = sqrt(*sumsq);
    const float gscale = s.max_norm > 0.0 && norm > s.max_norm ? (float)(s.max_norm / (norm + 1e-6)) : 1.0f;
    adamw_block<LEAN>(list, n_list, s, gscale);
}

static int is_fp(lk_dtype dt) { return dt == LK_F32 || dt == LK_BF16; }

static lk_status check(const lk_cuda_adamw_tensor *t, int n, const lk_cuda_adamw_hparams *hp) {
    if (hp == NULL) return lk_error(LK_EINVAL, "%s: hparams: expected a pointer, got NULL", FN);
    if (!(hp->lr >= 0.0 && isfinite(hp->lr)))
        return lk_error(LK_EINVAL, "%s: lr: expected finite >= 0, got %g", FN, hp->lr);
    if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0))
        return lk_error(LK_EINVAL, "%s: beta1: expected [0, 1), got %g", FN, hp->beta1);
    if (!(hp->beta2 >= 0.0 && hp->beta2 < 1.0))
        return lk_error(LK_EINVAL, "%s: beta2: expected [0, 1), got %g", FN, hp->beta2);
    if (!(hp->eps > 0.0)) return lk_error(LK_EINVAL, "%s: eps: expected > 0, got %g", FN, hp->eps);
    if (!(hp->weight_decay >= 0.0 && hp->lr * hp->weight_decay < 1.0))
        return lk_error(LK_EINVAL, "%s: weight_decay: expected >= 0 with lr·wd < 1, got %g", FN, hp->weight_decay);
    if (hp->step < 1) return lk_error(LK_EINVAL, "%s: step: expected >= 1, got %lld", FN, (long long)hp->step);
    if (!(hp->grad_scale >= 0.0f && isfinite(hp->grad_scale)))
        return lk_error(LK_EINVAL, "%s: grad_scale: expected finite >= 0 (0: 1), got %g", FN, (double)hp->grad_scale);
    if (n < 0 || (n > 0 && t == NULL))
        return lk_error(LK_EINVAL, "%s: tensors: expected a list of n_tensors >= 0, got %d", FN, n);
    for (int i = 0; i < n; i++) {
        const lk_cuda_adamw_tensor *x = &t[i];
        if (x->n < 0) return lk_error(LK_EINVAL, "%s: tensors[%d].n: expected >= 0, got %lld", FN, i, (long long)x->n);
        if (x->n == 0) continue;
        if (!x->param || !x->grad || !x->m || !x->v)
            return lk_error(LK_EINVAL, "%s: tensors[%d]: expected param, grad, m and v, got a NULL %s", FN, i,
                            !x->param ? "param" : !x->grad ? "grad" : !x->m ? "m" : "v");
        const lk_dtype dts[4] = {x->param_dtype, x->grad_dtype, x->m_dtype, x->v_dtype};
        static const char *const names[4] = {"param", "grad", "m", "v"};
        for (int k = 0; k < 4; k++)
            if (!is_fp(dts[k]))
                return lk_error(LK_EDTYPE, "%s: tensors[%d].%s_dtype: expected f32 or bf16, got %s", FN, i, names[k],
                                lk_dtype_name(dts[k]));
        if (x->param_dtype == LK_F32 && x->master != NULL)
            return lk_error(LK_EINVAL, "%s: tensors[%d].master: expected NULL for an f32 param (updated in place)",
                            FN, i);
    }
    return LK_OK;
}

/* The descriptors of n checked tensors into h; returns their blocks. *lean: any of them keeps
 * bf16 state (adamw_block's LEAN). */
static int64_t describe(const lk_cuda_adamw_tensor *t, int n, adesc *h, int *lean) {
    int64_t blocks = 0;
    *lean = 0;
    for (int i = 0; i < n; i++) {
        const lk_cuda_adamw_tensor *x = &t[i];
        h[i] = (adesc){x->param, x->grad, x->m, x->v, x->master, x->n, blocks, x->param_dtype == LK_BF16,
                       x->grad_dtype == LK_BF16, x->no_decay, x->m_dtype == LK_BF16, x->v_dtype == LK_BF16, i};
        blocks += lk_cdiv(x->n, LK_MT_CHUNK);
        *lean |= h[i].m_bf16 | h[i].v_bf16 | (h[i].p_bf16 && x->master == NULL);
    }
    return blocks;
}

static ascal scalars(const lk_cuda_adamw_hparams *hp, double max_norm) {
    return (ascal){(float)hp->beta1, (float)hp->beta2, (float)hp->eps,
                   (float)(hp->lr / (1.0 - pow(hp->beta1, (double)hp->step))),
                   (float)(1.0 / sqrt(1.0 - pow(hp->beta2, (double)hp->step))),
                   (float)(1.0 - hp->lr * hp->weight_decay), max_norm, lk_sround_step_key(hp->seed, hp->step)};
}

extern "C" lk_status lk_cuda_adamw_step(const lk_cuda_adamw_tensor *tensors, int n_tensors,
                                        const lk_cuda_adamw_hparams *hp, lk_ctx *ctx) {
    lk_status st = lk_mt_check_ctx(FN, ctx);
    if (st == LK_OK) st = check(tensors, n_tensors, hp);
    if (st != LK_OK || n_tensors == 0) return st;
    adesc *h = static_cast<adesc *>(malloc(sizeof(adesc) * (size_t)n_tensors));
    if (h == NULL) return lk_error(LK_ENOMEM, "%s: %d descriptors", FN, n_tensors);
    int lean;
    int64_t blocks = describe(tensors, n_tensors, h, &lean);
    ascal s = scalars(hp, 0.0);
    size_t mark;
    adesc *dev = NULL;
    st = lk_ctx_workspace_begin(ctx, FN, lk_arena_piece(sizeof(adesc) * (size_t)n_tensors), &mark);
    if (st == LK_OK) st = lk_mt_upload(FN, ctx, h, n_tensors, &dev);
    free(h);
    if (st == LK_OK && blocks > 0) {
        cudaStream_t cs = static_cast<cudaStream_t>(ctx->stream);
        const float gscale = hp->grad_scale != 0.0f ? hp->grad_scale : 1.0f;
        if (lean) adamw_kernel<true><<<(unsigned)blocks, LK_MT_THREADS, 0, cs>>>(dev, n_tensors, s, gscale);
        else adamw_kernel<false><<<(unsigned)blocks, LK_MT_THREADS, 0, cs>>>(dev, n_tensors, s, gscale);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = lk_cuda_fail(e, "adamw (cuda): launch", __FILE__, __LINE__);
    }
    lk_ctx_workspace_end(ctx, mark);
    return st;
}

/* --- the plan ----------------------------------------------------------------------------- */

/* The step's loss and norm into the log, in the order the steps ran; the first non-finite
 * one halts every later update. One thread. */
__global__ void log_kernel(const float *loss, const double *sumsq, double *log, int cap, int *count, int *halted) {
    double l = loss ? (double)*loss : 0.0, n = sqrt(*sumsq);
    int i = *count;
    if (i < cap) log[2 * i] = l, log[2 * i + 1] = n;
    *count = i + 1;
    if (!isfinite(l) || !isfinite(n)) *halted = 1;
}

struct lk_cuda_adamw_plan {
    adesc *alist;                 /* device: AdamW's descriptors */
    ndesc *nlist;                 /* device: the norm's, over the same gradients */
    int n;
    int64_t blocks;               /* 4096-element blocks of the tensors: both lists cut alike */
    int lean;                     /* bf16 state: adamw_block's LEAN */
    double *part;                 /* device [blocks + 1]: the blocks' sums of squares, then the total */
    ascal *dev_scal, *host_scal;  /* [LK_CUDA_PLAN_SLOTS] each: the steps' scalars; host_scal pinned */
    double *log;                  /* device [2 * log_cap]: (loss, norm) a step since the last read */
    int *flags;                   /* device: the log's count, halted */
    int log_cap;
    lk_cuda_adamw_hparams hp;
    double max_norm;
};

extern "C" void lk_cuda_adamw_plan_free(lk_cuda_adamw_plan *p) {
    if (p == NULL) return;
    cudaFree(p->alist);
    cudaFree(p->nlist);
    cudaFree(p->part);
    cudaFree(p->dev_scal);
    cudaFree(p->log);
    cudaFree(p->flags);
    cudaFreeHost(p->host_scal);
    free(p);
}

extern "C" lk_status lk_cuda_adamw_plan_create(const lk_cuda_adamw_tensor *t, int n, const lk_cuda_adamw_hparams *hp,
                                               double max_norm, int log_cap, lk_cuda_adamw_plan **out) {
    static const char *fn = "adamw plan (cuda)";
    if (out == NULL) return lk_error(LK_EINVAL, "%s: out: expected a pointer, got NULL", fn);
    *out = NULL;
    if (hp == NULL) return lk_error(LK_EINVAL, "%s: hparams: expected a pointer, got NULL", fn);
    if (!(max_norm >= 0.0 && isfinite(max_norm)))
        return lk_error(LK_EINVAL, "%s: max_norm: expected finite >= 0 (0: no clipping), got %g", fn, max_norm);
    if (log_cap < 1 || log_cap > (1 << 24))
        return lk_error(LK_EINVAL, "%s: log_cap: expected 1 .. 2^24 steps, got %d", fn, log_cap);
    lk_cuda_adamw_hparams probe = *hp;   /* lr and step come per step: checked there */
    probe.lr = 0.0, probe.step = 1;
    lk_status st = check(t, n, &probe);
    if (st != LK_OK) return st;
    lk_cuda_adamw_plan *p = static_cast<lk_cuda_adamw_plan *>(calloc(1, sizeof *p));
    adesc *ha = static_cast<adesc *>(malloc(sizeof(adesc) * (size_t)(n > 0 ? n : 1)));
    ndesc *hn = static_cast<ndesc *>(malloc(sizeof(ndesc) * (size_t)(n > 0 ? n : 1)));
    if (p == NULL || ha == NULL || hn == NULL) {
        free(p), free(ha), free(hn);
        return lk_error(LK_ENOMEM, "%s: %d descriptors", fn, n);
    }
    p->n = n, p->hp = *hp, p->max_norm = max_norm, p->log_cap = log_cap;
    p->blocks = describe(t, n, ha, &p->lean);
    for (int i = 0; i < n; i++)   /* the norm over the same gradients, cut alike */
        hn[i] = (ndesc){const_cast<void *>(ha[i].g), ha[i].n, ha[i].block0, ha[i].g_bf16};
    const size_t scal = sizeof(ascal) * LK_CUDA_PLAN_SLOTS;
    cudaError_t e = p->blocks > 0x7fffffff ? cudaErrorInvalidValue : cudaSuccess;
    if (e == cudaSuccess) e = cudaMalloc(&p->alist, sizeof(adesc) * (size_t)(n > 0 ? n : 1));
    if (e == cudaSuccess) e = cudaMalloc(&p->nlist, sizeof(ndesc) * (size_t)(n > 0 ? n : 1));
    if (e == cudaSuccess) e = cudaMalloc(&p->part, sizeof(double) * (size_t)(p->blocks + 1));
    if (e == cudaSuccess) e = cudaMalloc(&p->dev_scal, scal);
    if (e == cudaSuccess) e = cudaMalloc(&p->log, sizeof(double) * 2 * (size_t)log_cap);
    if (e == cudaSuccess) e = cudaMalloc(&p->flags, 2 * sizeof(int));
    if (e == cudaSuccess) e = cudaHostAlloc(&p->host_scal, scal, cudaHostAllocDefault);
    if (e == cudaSuccess && n > 0) e = cudaMemcpy(p->alist, ha, sizeof(adesc) * (size_t)n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && n > 0) e = cudaMemcpy(p->nlist, hn, sizeof(ndesc) * (size_t)n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset(p->part, 0, sizeof(double) * (size_t)(p->blocks + 1));
    if (e == cudaSuccess) e = cudaMemset(p->flags, 0, 2 * sizeof(int));
    free(ha), free(hn);
    if (e != cudaSuccess) {
        int too_many = p->blocks > 0x7fffffff;
        cudaGetLastError();
        lk_cuda_adamw_plan_free(p);
        return too_many ? lk_error(LK_EINVAL, "%s: tensors: more than 2^31 blocks of %d", fn, LK_MT_CHUNK)
                        : lk_cuda_fail(e, "adamw plan (cuda): device memory", __FILE__, __LINE__);
    }
    for (int i = 0; i < LK_CUDA_PLAN_SLOTS; i++) p->host_scal[i] = scalars(&probe, max_norm);
    *out = p;
    return LK_OK;
}

static lk_status bad_slot(const char *fn, int slot) {
    return lk_error(LK_EINVAL, "%s: slot: expected 0 .. %d, got %d", fn, LK_CUDA_PLAN_SLOTS - 1, slot);
}

extern "C" lk_status lk_cuda_adamw_plan_set(lk_cuda_adamw_plan *p, int slot, double lr, int64_t step) {
    static const char *fn = "adamw plan (cuda)";
    if (p == NULL) return lk_error(LK_EINVAL, "%s: plan: expected a plan, got NULL", fn);
    if (slot < 0 || slot >= LK_CUDA_PLAN_SLOTS) return bad_slot(fn, slot);
    lk_cuda_adamw_hparams hp = p->hp;
    hp.lr = lr, hp.step = step;
    lk_status st = check(NULL, 0, &hp);   /* lr, step and lr·wd */
    if (st != LK_OK) return st;
    p->host_scal[slot] = scalars(&hp, p->max_norm);
    return LK_OK;
}

extern "C" lk_status lk_cuda_adamw_plan_step(lk_cuda_adamw_plan *p, int slot, const float *loss, lk_ctx *ctx) {
    static const char *fn = "adamw plan (cuda)";
    if (p == NULL) return lk_error(LK_EINVAL, "%s: plan: expected a plan, got NULL", fn);
    if (slot < 0 || slot >= LK_CUDA_PLAN_SLOTS) return bad_slot(fn, slot);
    lk_status st = lk_mt_check_ctx(fn, ctx);
    if (st != LK_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
    cudaError_t e = cudaMemcpyAsync(p->dev_scal + slot, p->host_scal + slot, sizeof(ascal), cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess && p->blocks > 0) {
        sumsq_kernel<<<lk_sumsq_grid(p->blocks), LK_MT_THREADS, 0, s>>>(p->nlist, p->n, p->blocks, p->part);
        final_kernel<<<1, FINAL_THREADS, 0, s>>>(p->part, p->blocks, p->part + p->blocks);
    }
    if (e == cudaSuccess)
        log_kernel<<<1, 1, 0, s>>>(loss, p->part + p->blocks, p->log, p->log_cap, p->flags, p->flags + 1);
    if (e == cudaSuccess && p->blocks > 0)
        (p->lean ? adamw_plan_kernel<true> : adamw_plan_kernel<false>)<<<(unsigned)p->blocks, LK_MT_THREADS, 0, s>>>(
            p->alist, p->n, p->dev_scal + slot, p->part + p->blocks, p->flags + 1);
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? LK_OK : lk_cuda_fail(e, "adamw plan (cuda): step", __FILE__, __LINE__);
}

extern "C" lk_status lk_cuda_adamw_plan_read(lk_cuda_adamw_plan *p, double *loss, double *norm, int cap, int *n) {
    static const char *fn = "adamw plan (cuda)";
    if (p == NULL || n == NULL || (cap > 0 && (loss == NULL || norm == NULL)))
        return lk_error(LK_EINVAL, "%s: read: expected a plan, a count and cap entries of loss and norm", fn);
    int count = 0;
    LK_CUDA_TRY(cudaMemcpy(&count, p->flags, sizeof count, cudaMemcpyDeviceToHost));   /* after every step */
    if (count > p->log_cap || count > cap)
        return lk_error(LK_EINVAL, "%s: read: %d steps logged since the last read, more than the log's %d or the "
                        "caller's %d entries", fn, count, p->log_cap, cap);
    double *h = static_cast<double *>(malloc(sizeof(double) * 2 * (size_t)(count > 0 ? count : 1)));
    if (h == NULL) return lk_error(LK_ENOMEM, "%s: read: %d entries", fn, count);
    cudaError_t e = count ? cudaMemcpy(h, p->log, sizeof(double) * 2 * (size_t)count, cudaMemcpyDeviceToHost)
                          : cudaSuccess;
    if (e == cudaSuccess) e = cudaMemset(p->flags, 0, sizeof(int));
    for (int i = 0; e == cudaSuccess && i < count; i++) loss[i] = h[2 * i], norm[i] = h[2 * i + 1];
    free(h);
    if (e != cudaSuccess) return lk_cuda_fail(e, "adamw plan (cuda): read", __FILE__, __LINE__);
    *n = count;
    return LK_OK;
}
