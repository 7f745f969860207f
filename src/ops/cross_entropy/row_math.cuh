/* row_math.cuh — what every cross-entropy row kernel on CUDA computes the same way (fused.cu's
 * ce_rows and ce_block, rows_sm90.cu's ce_rows_smem): which token a kept row is and its label,
 * softcap, pass 1's fold and the merge of online-softmax partials, a row's loss from its log-sum-exp, and the
 * gradient's per-element arithmetic. One definition, so the paths agree element for element
 * given the same lse. Built only with CUDA; not installed. */
#ifndef LLMKERN_CROSS_ENTROPY_ROW_MATH_CUH
#define LLMKERN_CROSS_ENTROPY_ROW_MATH_CUH

#include <math.h>
#include "ops/cuda_util.cuh"
#include "ops/cross_entropy/cuda_ce.h"

static __device__ __forceinline__ int64_t token_of(const lk_ce_cuda_plan &p, int64_t k) {
    if (p.idx) return p.idx[k];
    if (p.keep_n > 0) return (k / p.keep_n) * p.S + (p.S - p.keep_n) + k % p.keep_n;
    return k;
}

/* The label of token t (t may be out of range when keep_indices is bad: -2 then). */
static __device__ __forceinline__ int64_t label_of(const lk_ce_cuda_plan &p, int64_t t) {
    if (t < 0 || t >= p.T) return -2;
    return p.labels_i32 ? (int64_t)((const int32_t *)p.labels)[t] : ((const int64_t *)p.labels)[t];
}

static __device__ __forceinline__ float softcap(float v, float cap) { return cap > 0.0f ? cap * tanhf(v / cap) : v; }

/* (m, s) pairs: s = Σ exp(v - m); merging rescales the smaller-max side. */
static __device__ __forceinline__ void merge(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    s = (m == M ? s : s * __expf(m - M)) + (m2 == M ? s2 : s2 * __expf(m2 - M));
    m = M;
}

/* W logits of a row (loaded into f, softcapped in place) folded into a thread's running
 * (m, s) and sz, the sum of the softcapped values: pass 1 of every row kernel. */
template <int W>
static __device__ __forceinline__ void fold(float (&f)[W], float cap, float &m, float &s, float &sz) {
    float vm = -INFINITY;
#pragma unroll
    for (int j = 0; j < W; j++) f[j] = softcap(f[j], cap), vm = fmaxf(vm, f[j]), sz += f[j];
    float M = fmaxf(m, vm), add = 0.0f;
#pragma unroll
    for (int j = 0; j < W; j++) add += __expf(f[j] - M);
    s = (m == M ? s : s * __expf(m - M)) + add;
    m = M;
}

/* A warp's (m, s, sz) merged by shuffles: every lane ends with the warp's. */
static __device__ __forceinline__ void warp_merge(float &m, float &s, float &sz) {
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge(m, s, m2, s2);
        sz += __shfl_xor_sync(0xffffffffu, sz, o);
    }
}

/* What the gradient of kept row k needs besides its logits: the weight g of the row
 * (d_loss, per token for none, / n_valid for mean; 0 when ignored; NaN for a bad label)
 * and the coefficients of ∂loss/∂v = a·softmax(v) − b − gy·[col = y]. */
typedef struct {
    float g, a, b, gy, inv;
    int64_t y;
} grad_coef;

static __device__ __forceinline__ grad_coef coef_of(const lk_ce_cuda_plan &p, int64_t k, float lse,
                                                    const int64_t *nv, const float *d_loss) {
    const int64_t tok = token_of(p, k), y = label_of(p, tok);
    const bool ignored = y == p.ignore, bad = !ignored && (y < 0 || y >= p.V);
    float g = 0.0f;
    if (!ignored) {
        g = d_loss ? d_loss[tok < 0 || tok >= p.T ? 0 : (p.reduction == 2 ? tok : 0)] : 1.0f;
        if (p.reduction == 0) g = *nv > 0 ? g / (float)*nv : 0.0f;
        if (bad) g = NAN;
    }
    grad_coef c = {g, g * (1.0f + 2.0f * p.zs * lse), g * p.eps / (float)p.V, g * (1.0f - p.eps),
                   p.cap > 0.0f ? 1.0f / p.cap : 0.0f, y};
    return c;
}

/* The gradient wrt the raw logit `raw` in column col (softcap's derivative included). */
static __device__ __forceinline__ float grad_at(const grad_coef &c, float raw, int64_t col, float lse, float cap) {
    float v = softcap(raw, cap), d = c.a * __expf(v - lse) - c.b;
    if (col == c.y) d -= c.gy;
    if (cap > 0.0f) d *= 1.0f - (v * c.inv) * (v * c.inv);
    return c.g == 0.0f ? 0.0f : d;
}

/* The raw logit of kept row k's label in its row zr (0 when the label is out of range: ignored
 * or bad). Read before any gradient may be written over the logits in place: a cluster's CTAs
 * write theirs as soon as the lse is merged, so ce_rows_smem reads it before that barrier. */
template <typename TZ>
static __device__ __forceinline__ float label_logit(const lk_ce_cuda_plan &p, int64_t k, const TZ *zr) {
    const int64_t y = label_of(p, token_of(p, k));
    return y >= 0 && y < p.V ? lk_to_f32(zr[y]) : 0.0f;
}

/* Kept row k's loss and z-loss (by token or by row: j) and its lse, from lse, sz = the sum of
 * its softcapped logits and zy = its label's raw logit (label_logit). Returns lse. */
static __device__ __forceinline__ float row_loss(const lk_ce_cuda_plan &p, int64_t k, float zy, float lse, float sz,
                                                 float *loss, float *zl, float *lse_out, int by_token) {
    const int64_t tok = token_of(p, k), y = label_of(p, tok);
    const bool ignored = y == p.ignore, bad = !ignored && (y < 0 || y >= p.V);
    float l = 0.0f, zlv = 0.0f;
    if (bad) {
        l = zlv = NAN;
    } else if (!ignored) {
        zlv = p.zs * lse * lse;
        l = (1.0f - p.eps) * (lse - softcap(zy, p.cap)) + p.eps * (lse - sz / (float)p.V) + zlv;
    }
    int64_t j = by_token ? tok : k;
    if (j >= 0 && j < (by_token ? p.T : p.K)) {
        loss[j] = l;
        if (zl) zl[j] = zlv;
    }
    if (lse_out) lse_out[k] = lse;
    return lse;
}

#endif
