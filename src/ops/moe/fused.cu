/* fused.cu — `fused` MoE experts on CUDA: the CPU fused.c's algorithm and saved layout
 * (offsets, order, pos, the [T·k, 2I] pre-activations in the storage dtype) with
 * cuBLASLt GEMMs per expert over expert-sorted rows (f32 accumulation; bf16 operands
 * on tensor cores for bf16 storage).
 *
 *   forward   topk_ids to the host (checked there, nothing written on a bad id), the
 *             stable counting sort (permute.c) and its arrays up into saved; the token
 *             rows gathered in expert order; per expert gate_up = rows · Wguᵀ (f32); one
 *             kernel h = w · silu(gate) · up (the routing weight folded in, as on the CPU)
 *             writing the saved pre-activations; per expert y = h · Wdᵀ (f32); the
 *             un-permute sums each token's k rows in route order, rounds once.
 *   backward  the offsets back to the host; dout rows gathered unweighted; per expert
 *             dh' = dout · Wd; one warp a row recomputes the activation: d_topk_weights =
 *             dh'·h, d_gate_up and w·h; per expert d_down += doutᵀ·(w·h), d_rows =
 *             d_gate_up · Wgu, d_gate_up_weight += d_gate_upᵀ·rows — each expert's
 *             gradient slice read and written by one GEMM with beta 1, so a bf16
 *             gradient is rounded once per call; the un-permute sums d_rows into d_hidden.
 *
 * The expert loop runs on the host (one GEMM per expert with tokens: the offsets come
 * back from the device once a pass). Reached through lk_moe_experts_forward / _backward
 * (experts.c), which validated everything but the ids (device memory: checked here). */
#include <stdlib.h>
#include <string.h>
#include "core/cublaslt_util.h"
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/permute.h"

#define FULL 0xffffffffu
#define NOMEM lk_error(LK_ENOMEM, "moe_experts: arena: expected the reserved workspace, got too little")

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* dst[p, :] = src[order[p] / k, :], p < n rows of h elements. */
template <typename T>
__global__ void gather_rows(T *dst, const T *src, const int32_t *order, int64_t n, int64_t h, int64_t k) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * h) return;
    int64_t p = e / h, c = e - p * h;
    dst[e] = src[(order[p] / k) * h + c];
}

/* h = w · silu(gate) · up per sorted row; keep (bf16: the saved copy of gate_up) too. */
template <typename T>
__global__ void act_forward(const float *gu, T *keep, T *h, const float *w, const int32_t *order, int64_t n,
                            int64_t I) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * I) return;
    int64_t p = e / I, j = e - p * I;
    float g = gu[p * 2 * I + j], u = gu[p * 2 * I + I + j];
    if (keep) keep[p * 2 * I + j] = lk_from_f32<T>(g), keep[p * 2 * I + I + j] = lk_from_f32<T>(u);
    h[e] = lk_from_f32<T>(w[order[p]] * g * sigmoid(g) * u);
}

/* dst[t, :] = Σ_j src[pos[t·k + j], :] in route order, f32, rounded once. */
template <typename T>
__global__ void unpermute_sum(T *dst, const float *src, const int32_t *pos, int64_t t, int64_t k, int64_t h) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= t * h) return;
    int64_t tok = e / h, c = e - tok * h;
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) s += src[(int64_t)pos[tok * k + j] * h + c];
    dst[e] = lk_from_f32<T>(s);
}

/* A warp a sorted row: from dh' (hb) and the saved pre-activations, d_gate_up, w·h and
 * d_topk_weights = Σ dh'·h (h unweighted). */
template <typename T>
__global__ void act_backward(const T *gu, const float *hb, T *wh, T *dgu, const float *w, const int32_t *order,
                             float *dw, int64_t n, int64_t I) {
    int64_t p = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (p >= n) return;
    float wr = w[order[p]], dot = 0.0f;
    for (int64_t j = lane; j < I; j += 32) {
        float g = lk_to_f32(gu[p * 2 * I + j]), u = lk_to_f32(gu[p * 2 * I + I + j]), dhp = hb[p * I + j];
        float s = sigmoid(g), silu = g * s, hv = silu * u, dh = wr * dhp;
        dgu[p * 2 * I + j] = lk_from_f32<T>(dh * u * s * (1.0f + g * (1.0f - s)));
        dgu[p * 2 * I + I + j] = lk_from_f32<T>(dh * silu);
        wh[p * I + j] = lk_from_f32<T>(wr * hv);
        dot += dhp * hv;
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(FULL, dot, o);
    if (dw && lane == 0) dw[order[p]] = dot;
}

/* --- host ---------------------------------------------------------------------------- */

static size_t al(size_t b) { return (b + LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1); }
static unsigned grid(int64_t n) { return (unsigned)((n + 255) / 256); }

static size_t workspace_bytes(const lk_moe_experts_args *a, int backward) {
    lk_moe_dims d = lk_moe_dims_of(a);
    size_t es = lk_dtype_size(d.dt), R = (size_t)d.r, H = (size_t)d.h, I = (size_t)d.i;
    if (!backward)   /* rows, gate_up f32, h, y f32 */
        return LK_LT_WORKSPACE_BYTES + al(R * H * es) + al(R * 2 * I * 4) + al(R * I * es) + al(R * H * 4);
    /* dout rows, x rows, dh' f32, w·h, d_gate_up, d_rows f32 */
    return LK_LT_WORKSPACE_BYTES + 2 * al(R * H * es) + al(R * I * 4) + al(R * I * es) + al(R * 2 * I * es) +
           al(R * H * 4);
}

typedef struct {
    int dev;
    void *stream, *lt;
} gemm_ctx;

/* C[m, n] (c_dt, ldc) = beta·C + op(A)·op(B), row-major, f32 accumulation. */
static lk_status gemm(const gemm_ctx *g, int ta, int tb, int64_t m, int64_t n, int64_t k, lk_dtype dt, const void *a,
                      int64_t lda, const void *b, int64_t ldb, float beta, lk_dtype c_dt, void *c, int64_t ldc) {
    lk_lt_gemm_args x = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .ab_dt = dt, .a = a, .lda = lda,
                         .b = b, .ldb = ldb, .alpha = 1.0f, .beta = beta, .c_dt = c_dt, .c = c, .ldc = ldc};
    return lk_lt_gemm(g->dev, g->stream, g->lt, LK_LT_WORKSPACE_BYTES, &x);
}

static const char *at(const void *base, int64_t elems, size_t es) { return (const char *)base + (size_t)elems * es; }

static lk_status forward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i, R = d.r, E = d.e;
    size_t es = lk_dtype_size(d.dt);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    /* the routes to the host, checked, sorted by expert */
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(3 * R + 1));
    int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (size_t)(E + 1));
    if (!ids || !offs) {
        free(ids), free(offs);
        return lk_error(LK_ENOMEM, "moe_experts: fused (cuda): no host room for %lld routes", (long long)R);
    }
    int32_t *order = ids + R, *pos = ids + 2 * R;
    lk_status s = LK_OK;
    cudaError_t e = cudaMemcpyAsync(ids, a->topk_ids.data, sizeof(int32_t) * (size_t)R, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    for (int64_t r = 0; e == cudaSuccess && !s && r < R; r++)
        if (ids[r] < 0 || ids[r] >= E)
            s = lk_error(LK_EINVAL, "moe_experts: topk_ids: expected expert ids in [0, %lld), got %d at [%lld, %lld]",
                         (long long)E, ids[r], (long long)(r / d.k), (long long)(r % d.k));
    if (e == cudaSuccess && !s) {
        lk_moe_permute(ids, R, E, offs, order, pos);
        e = cudaMemcpyAsync(sv.offs, offs, sizeof(int64_t) * (size_t)(E + 1), cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(sv.order, order, sizeof(int32_t) * (size_t)R, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(sv.pos, pos, sizeof(int32_t) * (size_t)R, cudaMemcpyHostToDevice, st);
    }
    free(ids);
    if (e != cudaSuccess) s = lk_cuda_fail(e, "moe_experts: fused (cuda): routes", __FILE__, __LINE__);
    if (s) {
        free(offs);
        return s;
    }
    lk_arena *ar = ctx->arena;
    gemm_ctx g = {ctx->device.index, ctx->stream, lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES)};
    void *rows = lk_arena_alloc(ar, al((size_t)(R * H) * es));
    float *gu = d.dt == LK_F32 ? (float *)sv.gu : (float *)lk_arena_alloc(ar, al((size_t)(R * 2 * I) * 4));
    void *h = lk_arena_alloc(ar, al((size_t)(R * I) * es));
    float *y = (float *)lk_arena_alloc(ar, al((size_t)(R * H) * 4));
    if (!g.lt || !rows || !gu || !h || !y) {
        free(offs);
        return NOMEM;
    }
    if (d.dt == LK_F32)
        gather_rows<float><<<grid(R * H), 256, 0, st>>>((float *)rows, (const float *)a->hidden.data, sv.order, R, H,
                                                         d.k);
    else
        gather_rows<lk_bf16_t><<<grid(R * H), 256, 0, st>>>((lk_bf16_t *)rows, (const lk_bf16_t *)a->hidden.data,
                                                             sv.order, R, H, d.k);
    for (int64_t x = 0; x < E && !s; x++) {
        int64_t p0 = offs[x], n = offs[x + 1] - p0;
        if (n) s = gemm(&g, 0, 1, n, 2 * I, H, d.dt, at(rows, p0 * H, es), H, at(a->gate_up_weight.data, x * 2 * I * H, es),
                        H, 0.0f, LK_F32, gu + p0 * 2 * I, 2 * I);
    }
    if (!s) {
        if (d.dt == LK_F32)
            act_forward<float><<<grid(R * I), 256, 0, st>>>(gu, NULL, (float *)h, (const float *)a->topk_weights.data,
                                                           sv.order, R, I);
        else
            act_forward<lk_bf16_t><<<grid(R * I), 256, 0, st>>>(gu, (lk_bf16_t *)sv.gu, (lk_bf16_t *)h,
                                                               (const float *)a->topk_weights.data, sv.order, R, I);
    }
    for (int64_t x = 0; x < E && !s; x++) {
        int64_t p0 = offs[x], n = offs[x + 1] - p0;
        if (n) s = gemm(&g, 0, 1, n, H, I, d.dt, at(h, p0 * I, es), I, at(a->down_weight.data, x * H * I, es), I, 0.0f,
                        LK_F32, y + p0 * H, H);
    }
    free(offs);
    if (s) return s;
    if (d.dt == LK_F32)
        unpermute_sum<float><<<grid(d.t * H), 256, 0, st>>>((float *)a->out.data, y, sv.pos, d.t, d.k, H);
    else
        unpermute_sum<lk_bf16_t><<<grid(d.t * H), 256, 0, st>>>((lk_bf16_t *)a->out.data, y, sv.pos, d.t, d.k, H);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda) forward");
    return LK_OK;
}

template <typename T>
static void backward_kernels(const lk_moe_experts_args *a, const lk_moe_dims *d, const lk_moe_fused_saved *sv, void *drows,
                             void *xrows, const float *hb, void *wh, void *dgu, cudaStream_t st, int pass) {
    int64_t R = d->r, H = d->h;
    if (pass == 0) {
        gather_rows<T><<<grid(R * H), 256, 0, st>>>((T *)drows, (const T *)a->dout.data, sv->order, R, H, d->k);
        if (xrows)
            gather_rows<T><<<grid(R * H), 256, 0, st>>>((T *)xrows, (const T *)a->hidden.data, sv->order, R, H, d->k);
    } else {
        act_backward<T><<<grid(R * 32), 256, 0, st>>>((const T *)sv->gu, hb, (T *)wh, (T *)dgu,
                                                       (const float *)a->topk_weights.data, sv->order,
                                                       (float *)a->d_topk_weights.data, R, d->i);
    }
}

static lk_status backward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i, R = d.r, E = d.e;
    size_t es = lk_dtype_size(d.dt);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    int want_gu = a->d_gate_up_weight.data != NULL, want_d = a->d_down_weight.data != NULL;
    lk_arena *ar = ctx->arena;
    gemm_ctx g = {ctx->device.index, ctx->stream, lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES)};
    void *drows = lk_arena_alloc(ar, al((size_t)(R * H) * es)), *xrows = lk_arena_alloc(ar, al((size_t)(R * H) * es));
    float *hb = (float *)lk_arena_alloc(ar, al((size_t)(R * I) * 4));
    void *wh = lk_arena_alloc(ar, al((size_t)(R * I) * es)), *dgu = lk_arena_alloc(ar, al((size_t)(R * 2 * I) * es));
    float *dr = (float *)lk_arena_alloc(ar, al((size_t)(R * H) * 4));
    int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (size_t)(E + 1));
    if (!g.lt || !drows || !xrows || !hb || !wh || !dgu || !dr || !offs) {
        free(offs);
        return NOMEM;
    }
    cudaError_t e = cudaMemcpyAsync(offs, sv.offs, sizeof(int64_t) * (size_t)(E + 1), cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        free(offs);
        return lk_cuda_fail(e, "moe_experts: fused (cuda): offsets", __FILE__, __LINE__);
    }
    if (d.dt == LK_F32) backward_kernels<float>(a, &d, &sv, drows, want_gu ? xrows : NULL, hb, wh, dgu, st, 0);
    else backward_kernels<lk_bf16_t>(a, &d, &sv, drows, want_gu ? xrows : NULL, hb, wh, dgu, st, 0);
    lk_status s = LK_OK;
    for (int64_t x = 0; x < E && !s; x++) {
        int64_t p0 = offs[x], n = offs[x + 1] - p0;
        if (n) s = gemm(&g, 0, 0, n, I, H, d.dt, at(drows, p0 * H, es), H, at(a->down_weight.data, x * H * I, es), I,
                        0.0f, LK_F32, hb + p0 * I, I);
    }
    if (!s) {
        if (d.dt == LK_F32) backward_kernels<float>(a, &d, &sv, drows, NULL, hb, wh, dgu, st, 1);
        else backward_kernels<lk_bf16_t>(a, &d, &sv, drows, NULL, hb, wh, dgu, st, 1);
    }
    lk_dtype ddt = a->d_down_weight.dtype, gdt = a->d_gate_up_weight.dtype;
    size_t des = want_d ? lk_dtype_size(ddt) : 0, ges = want_gu ? lk_dtype_size(gdt) : 0;
    for (int64_t x = 0; x < E && !s; x++) {
        int64_t p0 = offs[x], n = offs[x + 1] - p0;
        if (!n) continue;
        if (want_d && (s = gemm(&g, 1, 0, H, I, n, d.dt, at(drows, p0 * H, es), H, at(wh, p0 * I, es), I, 1.0f, ddt,
                                (char *)a->d_down_weight.data + (size_t)(x * H * I) * des, I)))
            break;
        if ((s = gemm(&g, 0, 0, n, H, 2 * I, d.dt, at(dgu, p0 * 2 * I, es), 2 * I,
                      at(a->gate_up_weight.data, x * 2 * I * H, es), H, 0.0f, LK_F32, dr + p0 * H, H)))
            break;
        if (want_gu && (s = gemm(&g, 1, 0, 2 * I, H, n, d.dt, at(dgu, p0 * 2 * I, es), 2 * I, at(xrows, p0 * H, es), H,
                                 1.0f, gdt, (char *)a->d_gate_up_weight.data + (size_t)(x * 2 * I * H) * ges, H)))
            break;
    }
    free(offs);
    if (s) return s;
    if (d.dt == LK_F32)
        unpermute_sum<float><<<grid(d.t * H), 256, 0, st>>>((float *)a->d_hidden.data, dr, sv.pos, d.t, d.k, H);
    else
        unpermute_sum<lk_bf16_t><<<grid(d.t * H), 256, 0, st>>>((lk_bf16_t *)a->d_hidden.data, dr, sv.pos, d.t, d.k,
                                                                H);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda) backward");
    return LK_OK;
}

extern "C" const lk_moe_experts_vtable lk_moe_experts_cuda_fused_vtable = {
    LK_MOE_EXPERTS_VTABLE_VERSION, lk_moe_fused_saved_bytes, workspace_bytes, forward, backward,
};
