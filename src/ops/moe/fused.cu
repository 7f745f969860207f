/* fused.cu — `fused` MoE experts on CUDA: the CPU fused.c's algorithm and saved layout
 * (offsets, order, pos, the [T·k, 2I] pre-activations in the storage dtype) with the
 * routing and every GEMM on the device, and no host read: the forward and the backward
 * queue kernels only (capturable in a CUDA graph; tests/cuda/test_moe_experts.c captures
 * both). Buffers are sized by the route bound R = T·k.
 *
 *   forward   route.cu's counting sort (counts, offsets, the stable order and pos) into
 *             saved; gate_up = x[order / k] · Wguᵀ per expert by grouped.cu (the gather
 *             fused into the A load), bf16: the SwiGLU in its epilogue, h = w · silu(gate)
 *             · up (routing weight folded in, as on the CPU) and the saved pre-activations
 *             written from the f32 accumulators; f32: gate_up straight into saved (f32),
 *             then the activation kernel; y = h · Wdᵀ in the storage dtype (bf16: each row
 *             rounded once, as torch's grouped_mm gives it; f32 rows would be 1 GB at
 *             PEERS-H200.md's shape); the un-permute sums each token's k rows in route order
 *             in f32, rounds once.
 *   backward  dh' = dout[order / k] · Wd, bf16: the activation's backward in that GEMM's
 *             epilogue (d_gate_up and w·h from dh' and the saved gate/up; d_topk_weights =
 *             dh'·h from per-tile partials summed in order); f32: dh' in f32, then a warp a
 *             row recomputes the activation; d_down += dout[order / k]ᵀ·(w·h),
 *             d_gate_up_weight += d_gate_upᵀ·x[order / k] (x's rows gathered first, into the
 *             buffer d_rows = d_gate_up · Wgu (storage dtype, as y) then takes)
 *             — each expert's gradient slice read and written by one CTA a tile, so a
 *             bf16 gradient is rounded once per call; the un-permute sums d_rows into
 *             d_hidden.
 *
 * The grouped GEMMs are grouped.cu's: on an sm_90 GPU its forward GEMMs and the
 * backward's data-gradient GEMMs run on grouped_sm90.cu's wgmma kernel (the `fused` row
 * there, and the `fused_sm90` row, below, by name), the weight gradients on mma.sync.
 *
 * Expert ids are device memory the host never reads: an id outside [0, E) raises a
 * device flag (route.cu) and the activation kernels then write NaN, so out (forward)
 * and d_hidden, d_topk_weights and the touched weight gradients (backward) are NaN
 * instead of plausible numbers. Reached through lk_moe_experts_forward / _backward
 * (experts.c), which validated everything else. */
#include <stdlib.h>
#include <string.h>
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/moe_cuda.h"

#define FULL 0xffffffffu
#define NOMEM lk_error(LK_ENOMEM, "moe_experts: arena: expected the reserved workspace, got too little")

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float qnan() { return __int_as_float(0x7fffffff); }

/* h = w · silu(gate) · up per sorted row; keep (bf16: the saved copy of gate_up) too.
 * The path where the GEMM's epilogue does not (f32, or bf16 without tensor cores). */
template <typename T>
__global__ void act_forward(const float *gu, T *keep, T *h, const float *w, const int32_t *order, int64_t n,
                            int64_t I, const int *flag) {
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * I) return;
    int64_t p = e / I, j = e - p * I;
    float g = gu[p * 2 * I + j], u = gu[p * 2 * I + I + j];
    if (keep) keep[p * 2 * I + j] = lk_from_f32<T>(g), keep[p * 2 * I + I + j] = lk_from_f32<T>(u);
    h[e] = lk_from_f32<T>(*flag ? qnan() : w[order[p]] * g * sigmoid(g) * u);
}

/* 8 columns of a row added into s / stored from s, 16 bytes an access (16-byte aligned) */
static __device__ __forceinline__ void add8(float *s, const float *r) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(r)), b = __ldg(reinterpret_cast<const float4 *>(r) + 1);
    s[0] += a.x, s[1] += a.y, s[2] += a.z, s[3] += a.w, s[4] += b.x, s[5] += b.y, s[6] += b.z, s[7] += b.w;
}
static __device__ __forceinline__ void add8(float *s, uint4 v) {   /* 8 bf16 */
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) s[2 * i] += __uint_as_float(w[i] << 16), s[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
}
static __device__ __forceinline__ void add8(float *s, const lk_bf16_t *r) {
    add8(s, __ldg(reinterpret_cast<const uint4 *>(r)));
}
static __device__ __forceinline__ void put8(float *d, const float *s) {
    reinterpret_cast<float4 *>(d)[0] = make_float4(s[0], s[1], s[2], s[3]);
    reinterpret_cast<float4 *>(d)[1] = make_float4(s[4], s[5], s[6], s[7]);
}
static __device__ __forceinline__ void put8(lk_bf16_t *d, const float *s) {
    *reinterpret_cast<uint4 *>(d) = make_uint4(lk_pack_bf16x2(s[0], s[1]), lk_pack_bf16x2(s[2], s[3]),
                                               lk_pack_bf16x2(s[4], s[5]), lk_pack_bf16x2(s[6], s[7]));
}

/* dst[t, :] = Σ_j src[pos[t·k + j], :] in route order, in f32, rounded once; src is the
 * GEMM's rows in the storage dtype (bf16 halves the 1 GB that y and d_rows are in f32 at
 * PEERS-H200.md's MoE shape). V8: 8 columns a thread (h a multiple of 8, both 16-byte aligned). */
template <typename T, bool V8>
__global__ void unpermute_sum(T *dst, const T *src, const int32_t *pos, int64_t t, int64_t k, int64_t h) {
    const int64_t e = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * (V8 ? 8 : 1);
    if (e >= t * h) return;
    const int64_t tok = e / h, c = e - tok * h;
    if constexpr (V8) {
        /* four rows' loads in flight at once, added in route order: one at a time, the
         * kernel waited out a gather's latency per route (0.15 ms a call at PEERS-H200.md's
         * MoE shape, ~half the memory's rate) */
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        const int32_t *p = pos + tok * k;
        int64_t j = 0;
        if constexpr (sizeof(T) == 2) {
            for (; j + 4 <= k; j += 4) {
                const int4 q = (uintptr_t)(p + j) % 16 == 0 ? __ldg(reinterpret_cast<const int4 *>(p + j))
                                                            : make_int4(p[j], p[j + 1], p[j + 2], p[j + 3]);
                const uint4 a0 = __ldg(reinterpret_cast<const uint4 *>(src + (int64_t)q.x * h + c)),
                            a1 = __ldg(reinterpret_cast<const uint4 *>(src + (int64_t)q.y * h + c)),
                            a2 = __ldg(reinterpret_cast<const uint4 *>(src + (int64_t)q.z * h + c)),
                            a3 = __ldg(reinterpret_cast<const uint4 *>(src + (int64_t)q.w * h + c));
                add8(s, a0), add8(s, a1), add8(s, a2), add8(s, a3);
            }
        }
        for (; j < k; j++) add8(s, src + (int64_t)p[j] * h + c);
        put8(dst + e, s);
    } else {
        float s = 0.0f;
        for (int64_t j = 0; j < k; j++) s += lk_to_f32(src[(int64_t)pos[tok * k + j] * h + c]);
        dst[e] = lk_from_f32<T>(s);
    }
}

/* dst[p, :] = src[order[p] / k, :] for the n sorted rows: the tokens' rows in expert order,
 * an element a thread. */
template <typename T>
__global__ void gather_rows(T *dst, const T *src, const int32_t *order, int64_t n, int64_t k, int64_t h) {
    const int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (e >= n * h) return;
    const int64_t p = e / h, c = e - p * h;
    dst[e] = src[(int64_t)(order[p] / k) * h + c];
}

/* The same, rows of h16 16-byte chunks (both 16-byte aligned): a warp a row, order[] and
 * the division read once a row, each lane's four chunks loaded before any is stored. (The
 * thread-a-chunk gather before it ran ~2.3 TB/s, 130 us a call at e2e_peers' MoE shape;
 * the MoE layer alone timed the same with either, bench/NOTES.md twentieth session.) */
__global__ void gather_rows16(uint4 *dst, const uint4 *src, const int32_t *order, int64_t n, int64_t k, int64_t h16) {
    const int64_t p = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (p >= n) return;
    const uint4 *s = src + (int64_t)(order[p] / k) * h16;
    uint4 *d = dst + p * h16;
    for (int64_t c = lane; c < h16; c += 128) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + 32 * u < h16) v[u] = __ldg(s + c + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + 32 * u < h16) d[c + 32 * u] = v[u];
    }
}

/* A warp a sorted row: from dh' (hb) and the saved pre-activations, d_gate_up, w·h and
 * d_topk_weights = Σ dh'·h (h unweighted); NaN everywhere when the ids were bad. */
template <typename T>
__global__ void act_backward(const T *gu, const float *hb, T *wh, T *dgu, const float *w, const int32_t *order,
                             float *dw, int64_t n, int64_t I, const int *flag) {
    int64_t p = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (p >= n) return;
    const bool bad = *flag != 0;
    float wr = w[order[p]], dot = 0.0f;
    for (int64_t j = lane; j < I; j += 32) {
        float g = lk_to_f32(gu[p * 2 * I + j]), u = lk_to_f32(gu[p * 2 * I + I + j]), dhp = hb[p * I + j];
        float s = sigmoid(g), silu = g * s, hv = silu * u, dh = wr * dhp;
        float dg = dh * u * s * (1.0f + g * (1.0f - s)), du = dh * silu, whv = wr * hv;
        if (bad) dg = du = whv = qnan();
        dgu[p * 2 * I + j] = lk_from_f32<T>(dg);
        dgu[p * 2 * I + I + j] = lk_from_f32<T>(du);
        wh[p * I + j] = lk_from_f32<T>(whv);
        dot += dhp * hv;
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(FULL, dot, o);
    if (dw && lane == 0) dw[order[p]] = bad ? qnan() : dot;
}

/* --- host ---------------------------------------------------------------------------- */

static unsigned grid(int64_t n) { return (unsigned)((n + 255) / 256); }

/* flag and the tile list, beside the pass's buffers */
static size_t small_bytes(const lk_moe_dims *d) {
    return lk_arena_piece(sizeof(int)) + lk_arena_piece(sizeof(int32_t) * (size_t)(d->e + 1));
}

static size_t workspace_bytes(const lk_moe_experts_args *a, int backward) {
    lk_moe_dims d = lk_moe_dims_of(a);
    size_t es = lk_dtype_size(d.dt), R = (size_t)d.r, H = (size_t)d.h, I = (size_t)d.i;
    if (!backward) {   /* route scratch, gate_up f32 (bf16 without the fused epilogue), h, y */
        size_t gu32 = d.dt != LK_F32 && !lk_moe_cuda_gg_fuses_swiglu(d.dt) ? lk_arena_piece(R * 2 * I * 4) : 0;
        return small_bytes(&d) + lk_arena_piece(lk_moe_cuda_route_ws_bytes(d.r, d.e)) + gu32 +
               lk_arena_piece(R * I * es) + lk_arena_piece(R * H * es);
    }
    /* dh' f32 (or, fused into its GEMM, the d_topk_weights partials), w·h, d_gate_up, d_rows */
    size_t dh = lk_moe_cuda_gg_fuses_swiglu(d.dt) ? lk_arena_piece(R * (size_t)lk_moe_cuda_dw_tiles(d.i) * 4)
                                                  : lk_arena_piece(R * I * 4);
    return small_bytes(&d) + dh + lk_arena_piece(R * I * es) + lk_arena_piece(R * 2 * I * es) +
           lk_arena_piece(R * H * es);
}

/* An operand: rows of ld elements, expert slices e_stride apart, gathered through order
 * (token rows of the sorted routes) when given. */
static lk_gg_operand opnd(const void *src, int64_t ld, int64_t e_stride, const int32_t *order, int64_t k, int kmajor) {
    lk_gg_operand o = {src, ld, e_stride, order, k, kmajor};
    return o;
}

/* The GEMMs' shared fields: dtype, experts, row bound, offsets, tile list, and whether
 * the row is fused_sm90 (the Hopper kernel asked for by name). */
static lk_gg gg_base(const lk_moe_dims *d, const lk_moe_fused_saved *sv, int32_t *tiles, int hopper) {
    lk_gg g;
    memset(&g, 0, sizeof g);
    g.dt = d->dt, g.experts = d->e, g.rows = d->r, g.offs = sv->offs, g.tiles = tiles, g.hopper = hopper;
    return g;
}

/* C [rows, n] in c_dt = A [rows, k] · B_e, B kmajor (the weight as stored, [n, k]) or not ([k, n]). */
static lk_status rows_gemm(lk_gg g, lk_gg_operand a, lk_gg_operand b, int64_t n, int64_t k, void *c, lk_dtype c_dt,
                           cudaStream_t st) {
    g.mode = LK_GG_ROWS, g.epi = LK_GG_STORE, g.a = a, g.b = b, g.n = n, g.k = k;
    g.c = c, g.c_dt = c_dt, g.ldc = n;
    return lk_moe_cuda_grouped_gemm(&g, st);
}

/* grad_e [m, n] += A_eᵀ · B_e over expert e's rows (A [rows, m], B [rows, n]); write: = (every
 * expert's slice, zeros where an expert has no rows). */
static lk_status wgrad_gemm(lk_gg g, lk_gg_operand a, lk_gg_operand b, int64_t m, int64_t n, const lk_tensor *grad,
                            int write, cudaStream_t st) {
    g.mode = LK_GG_WGRAD, g.epi = write ? LK_GG_STORE : LK_GG_ACCUM, g.a = a, g.b = b, g.m = m, g.n = n;
    g.c = grad->data, g.c_dt = grad->dtype, g.ldc = n, g.c_e_stride = m * n;
    return lk_moe_cuda_grouped_gemm(&g, st);
}

/* dst [R, H] = x[order / k]: the sorted rows of x, in the storage dtype T */
template <typename T>
static void gather_as(void *dst, const void *x, const lk_moe_dims *d, const int32_t *order, cudaStream_t st) {
    const int64_t w = 16 / (int64_t)sizeof(T);
    if (d->h % w == 0 && lk_aligned16(dst) && lk_aligned16(x))
        gather_rows16<<<grid(d->r * 32), 256, 0, st>>>((uint4 *)dst, (const uint4 *)x, order, d->r, d->k, d->h / w);
    else
        gather_rows<T><<<grid(d->r * d->h), 256, 0, st>>>((T *)dst, (const T *)x, order, d->r, d->k, d->h);
}
static void gather(void *dst, const void *x, const lk_moe_dims *d, const int32_t *order, cudaStream_t st) {
    if (d->dt == LK_F32) gather_as<float>(dst, x, d, order, st);
    else gather_as<lk_bf16_t>(dst, x, d, order, st);
}

/* dst [T, H] = the sum of each token's k rows of src [R, H], both in the storage dtype T */
template <typename T>
static void unpermute_as(void *dst, const void *src, const lk_moe_dims *d, const int32_t *pos, cudaStream_t st) {
    const int64_t n = d->t * d->h;
    if (d->h % 8 == 0 && lk_aligned16(dst) && lk_aligned16(src))
        unpermute_sum<T, true><<<grid(n / 8), 256, 0, st>>>((T *)dst, (const T *)src, pos, d->t, d->k, d->h);
    else
        unpermute_sum<T, false><<<grid(n), 256, 0, st>>>((T *)dst, (const T *)src, pos, d->t, d->k, d->h);
}
static void unpermute(void *dst, const void *src, const lk_moe_dims *d, const int32_t *pos, cudaStream_t st) {
    if (d->dt == LK_F32) unpermute_as<float>(dst, src, d, pos, st);
    else unpermute_as<lk_bf16_t>(dst, src, d, pos, st);
}

static lk_status forward_on(const lk_moe_experts_args *a, lk_ctx *ctx, int hopper) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i, R = d.r, K = d.k;
    size_t es = lk_dtype_size(d.dt);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    lk_arena *ar = ctx->arena;
    const int fused_act = lk_moe_cuda_gg_fuses_swiglu(d.dt);
    int *flag = (int *)lk_arena_alloc(ar, sizeof(int));
    int32_t *tiles = (int32_t *)lk_arena_alloc(ar, sizeof(int32_t) * (size_t)(d.e + 1));
    void *rws = lk_arena_alloc(ar, lk_moe_cuda_route_ws_bytes(R, d.e));
    float *gu = d.dt == LK_F32 ? (float *)sv.gu : fused_act ? NULL : (float *)lk_arena_alloc(ar, (size_t)(R * 2 * I) * 4);
    void *h = lk_arena_alloc(ar, (size_t)(R * I) * es);
    void *y = lk_arena_alloc(ar, (size_t)(R * H) * es);
    if (!flag || !tiles || !rws || (!gu && !fused_act) || !h || !y) return NOMEM;
    lk_status s = lk_moe_cuda_route((const int32_t *)a->topk_ids.data, R, d.e, sv.offs, sv.order, sv.pos, flag, rws, st);
    if (s) return s;
    lk_gg g = gg_base(&d, &sv, tiles, hopper);
    lk_gg_operand x = opnd(a->hidden.data, H, 0, sv.order, K, 1);
    lk_gg_operand wgu = opnd(a->gate_up_weight.data, H, 2 * I * H, NULL, 0, 1);
    if (fused_act) {   /* gate_up with the SwiGLU in the epilogue */
        lk_gg f = g;
        f.mode = LK_GG_ROWS, f.epi = LK_GG_SWIGLU, f.a = x, f.b = wgu, f.n = 2 * I, f.k = H;
        f.keep = sv.gu, f.h = h, f.w = (const float *)a->topk_weights.data, f.order = sv.order, f.inter = I;
        f.flag = flag;
        if ((s = lk_moe_cuda_grouped_gemm(&f, st))) return s;
    } else {
        if ((s = rows_gemm(g, x, wgu, 2 * I, H, gu, LK_F32, st))) return s;
        if (!a->out.data && d.dt == LK_F32) return LK_OK;   /* gu is the saved block: no h wanted */
        if (d.dt == LK_F32)
            act_forward<float><<<grid(R * I), 256, 0, st>>>(gu, NULL, (float *)h, (const float *)a->topk_weights.data,
                                                           sv.order, R, I, flag);
        else
            act_forward<lk_bf16_t><<<grid(R * I), 256, 0, st>>>(gu, (lk_bf16_t *)sv.gu, (lk_bf16_t *)h,
                                                               (const float *)a->topk_weights.data, sv.order, R, I,
                                                               flag);
        LK_CUDA_LAUNCHED("moe_experts: fused (cuda): act_forward");
    }
    if (!a->out.data) return LK_OK;   /* the saved block alone: h feeds only out */
    if ((s = rows_gemm(g, opnd(h, I, 0, NULL, 0, 1), opnd(a->down_weight.data, I, H * I, NULL, 0, 1), H, I, y, d.dt,
                       st)))
        return s;
    unpermute(a->out.data, y, &d, sv.pos, st);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda) forward");
    return LK_OK;
}

/* The activation's backward as its own kernel (f32, or bf16 without tensor cores). */
static lk_status act_backward_launch(const lk_moe_experts_args *a, const lk_moe_dims *d, const lk_moe_fused_saved *sv,
                                     const float *hb, void *wh, void *dgu, const int *flag, cudaStream_t st) {
    int64_t R = d->r, I = d->i;
    const float *w = (const float *)a->topk_weights.data;
    float *dw = (float *)a->d_topk_weights.data;
    if (d->dt == LK_F32)
        act_backward<float><<<grid(R * 32), 256, 0, st>>>((const float *)sv->gu, hb, (float *)wh, (float *)dgu, w,
                                                          sv->order, dw, R, I, flag);
    else
        act_backward<lk_bf16_t><<<grid(R * 32), 256, 0, st>>>((const lk_bf16_t *)sv->gu, hb, (lk_bf16_t *)wh,
                                                              (lk_bf16_t *)dgu, w, sv->order, dw, R, I, flag);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda): act_backward");
    return LK_OK;
}

static lk_status backward_on(const lk_moe_experts_args *a, lk_ctx *ctx, int hopper) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i, R = d.r, K = d.k;
    size_t es = lk_dtype_size(d.dt);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (d.t == 0) {   /* the facade calls with no token only to have the gradients written: zeros */
        const lk_tensor *g[2] = {&a->d_gate_up_weight, &a->d_down_weight};
        for (int i = 0; i < 2; i++)
            if (g[i]->data)
                LK_CUDA_TRY(cudaMemsetAsync(g[i]->data, 0, (size_t)lk_tensor_numel(g[i]) * lk_dtype_size(g[i]->dtype), st));
        return LK_OK;
    }
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    lk_arena *ar = ctx->arena;
    const int fused_act = lk_moe_cuda_gg_fuses_swiglu(d.dt);
    const int64_t dwt = lk_moe_cuda_dw_tiles(I);
    int *flag = (int *)lk_arena_alloc(ar, sizeof(int));
    int32_t *tiles = (int32_t *)lk_arena_alloc(ar, sizeof(int32_t) * (size_t)(d.e + 1));
    float *hb = (float *)lk_arena_alloc(ar, fused_act ? (size_t)(R * dwt) * 4 : (size_t)(R * I) * 4);
    void *wh = lk_arena_alloc(ar, (size_t)(R * I) * es), *dgu = lk_arena_alloc(ar, (size_t)(R * 2 * I) * es);
    void *dr = lk_arena_alloc(ar, (size_t)(R * H) * es);
    if (!flag || !tiles || !hb || !wh || !dgu || !dr) return NOMEM;
    lk_status s = lk_moe_cuda_check_ids((const int32_t *)a->topk_ids.data, R, d.e, flag, st);
    if (s) return s;
    lk_gg g = gg_base(&d, &sv, tiles, hopper);
    lk_gg_operand dout = opnd(a->dout.data, H, 0, sv.order, K, 1);
    lk_gg_operand wd_kn = opnd(a->down_weight.data, I, H * I, NULL, 0, 0);   /* Wd_e [H, I] read as [k, n] */
    float *dw = (float *)a->d_topk_weights.data;
    if (fused_act) {   /* dh' = dout rows · Wd_e with the activation's backward in the epilogue */
        lk_gg f = g;
        f.mode = LK_GG_ROWS, f.epi = LK_GG_DSWIGLU, f.a = dout, f.b = wd_kn, f.n = I, f.k = H;
        f.gu_saved = sv.gu, f.dgu = dgu, f.wh = wh, f.dw_part = dw ? hb : NULL;
        f.w = (const float *)a->topk_weights.data, f.order = sv.order, f.inter = I, f.flag = flag;
        if ((s = lk_moe_cuda_grouped_gemm(&f, st))) return s;
        if (dw && (s = lk_moe_cuda_dw_reduce(hb, dwt, sv.order, R, dw, st))) return s;
    } else {
        /* dh' = dout rows · Wd_e, then the activation's backward */
        if ((s = rows_gemm(g, dout, wd_kn, I, H, hb, LK_F32, st))) return s;
        if ((s = act_backward_launch(a, &d, &sv, hb, wh, dgu, flag, st))) return s;
    }
    /* d_down_e [H, I] += dout_eᵀ · (w·h)_e: both along the expert's rows, M / N contiguous */
    if (a->d_down_weight.data &&
        (s = wgrad_gemm(g, opnd(a->dout.data, H, 0, sv.order, K, 0), opnd(wh, I, 0, NULL, 0, 0), H, I,
                        &a->d_down_weight, a->write_weight_grads, st)))
        return s;
    /* d_gate_up_e [2I, H] += d_gate_up_eᵀ · x_e, x's rows gathered first into dr's buffer (free
     * until d_rows, below, writes it): both operands contiguous, so the Hopper kernel loads
     * both by TMA (a gathered operand's cp.async copies starved it: bench/NOTES.md) */
    if (a->d_gate_up_weight.data) {
        gather(dr, a->hidden.data, &d, sv.order, st);
        LK_CUDA_LAUNCHED("moe_experts: fused (cuda): gather x");
        if ((s = wgrad_gemm(g, opnd(dgu, 2 * I, 0, NULL, 0, 0), opnd(dr, H, 0, NULL, 0, 0), 2 * I, H,
                            &a->d_gate_up_weight, a->write_weight_grads, st)))
            return s;
    }
    /* d_rows = d_gate_up · Wgu_e ([2I, H] read as [k, n]) */
    if ((s = rows_gemm(g, opnd(dgu, 2 * I, 0, NULL, 0, 1), opnd(a->gate_up_weight.data, H, 2 * I * H, NULL, 0, 0), H,
                       2 * I, dr, d.dt, st)))
        return s;
    unpermute(a->d_hidden.data, dr, &d, sv.pos, st);
    LK_CUDA_LAUNCHED("moe_experts: fused (cuda) backward");
    return LK_OK;
}

static lk_status forward(const lk_moe_experts_args *a, lk_ctx *ctx) { return forward_on(a, ctx, 0); }
static lk_status backward(const lk_moe_experts_args *a, lk_ctx *ctx) { return backward_on(a, ctx, 0); }
static lk_status forward_sm90(const lk_moe_experts_args *a, lk_ctx *ctx) { return forward_on(a, ctx, 1); }
static lk_status backward_sm90(const lk_moe_experts_args *a, lk_ctx *ctx) { return backward_on(a, ctx, 1); }

extern "C" const lk_moe_experts_vtable lk_moe_experts_cuda_fused_vtable = {
    LK_MOE_EXPERTS_VTABLE_VERSION, lk_moe_fused_saved_bytes, workspace_bytes, forward, backward,
};

/* fused_sm90 (alias fused_quack): the same layer with the Hopper grouped GEMM asked for by
 * name, so lk_moe_cuda_gg_sm80_only does not turn it off (def.c keeps the row to bf16 on
 * sm_90). */
extern "C" const lk_moe_experts_vtable lk_moe_experts_cuda_fused_sm90_vtable = {
    LK_MOE_EXPERTS_VTABLE_VERSION, lk_moe_fused_saved_bytes, workspace_bytes, forward_sm90, backward_sm90,
};
