/* fused.cu — `fused` RoPE on CUDA: one pass over q and k each way, f32 math, f32 or
 * bf16 storage. A thread owns one token and one group of W dims in the first half of
 * the rotary dims (with its partner group R/2 further on, so both halves of each
 * rotate-half pair are in one thread), reads that token's cos and sin once (16-byte
 * loads), and rotates HB heads of q or of k with them, all HB heads' loads in flight
 * together: a grid row (blockIdx.y) per group of HB heads, so a thread loads once and
 * exits and the GPU streams through a few heads at a time (the shape of the SwiGLU kernel
 * that reaches 95-98% of copy; the table is read once per HB heads, from L2). Dims past
 * rotary_dim are copied (nothing to do in place). The backward is the same kernel
 * rotating by −angle.
 *
 * Measured on the H200 at the peers' shape (bench/NOTES.md): per call, run 6: HB 4 86.6%
 * of copy, 2: 86.4%, 8: 85.9%, 1: 80.5%; one thread walking all of its token's heads 8 at
 * a time (runs 2-5): 79-83%. Kernel against kernel (run 28, a stripped copy of this
 * kernel launched from C): HB 2 171.1 us, 4: 173.8, 8: 177.4; a block walking all heads
 * with the table in registers 179-182; one head a thread, the table read per row, 176.5.
 * HB 2 keeps 40 registers (six blocks an SM), HB 4 74.
 *
 * The pair's arithmetic is rotate.cuh's, pinned (one fma on a rounded product each), which
 * RMSNorm's rope (rms_norm/fused.cu) rotates with too: a norm that rotates its output has
 * this kernel's bits. Before it the compiler chose which product to contract.
 *
 * Position ids are device memory the facade does not read: a token whose id lies
 * outside [0, max_pos) gets NaN in its rotated dims instead of a read outside the tables.
 * Reached through lk_rope_forward / _backward (rope.c), which validated every argument. */
#include <math.h>
#include "core/cuda_check.h"
#include "internal.h"
#include "ops/cuda_util.cuh"
#include "rotate.cuh"

#define THREADS 256
/* Heads a thread rotates, all their loads issued before the first store (the stores may
 * alias the loads when in place, so nothing later is hoisted above them). */
#define HB 2

/* W floats of a table row (W >= 4: 16-byte loads; the caller checked alignment). */
template <int W>
static __device__ __forceinline__ void load_table(const float *p, float *f) {
    if (W % 4 == 0) {
#pragma unroll
        for (int j = 0; j < W; j += 4) {
            float4 v = __ldg(reinterpret_cast<const float4 *>(p + j));
            f[j] = v.x, f[j + 1] = v.y, f[j + 2] = v.z, f[j + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = __ldg(p + j);
    }
}

typedef struct {
    const void *pos;      /* [B, S] i32 or i64, or NULL: s */
    int pos64;
    int64_t tokens;       /* B·S */
    int seq, dim, rot, max_pos;
    float sgn;            /* +1 forward, −1 backward */
} rope_geom;

/* Rotates (or copies) one group of W dims for heads [h0, h_end) of one tensor with H
 * heads, h_end - h0 <= HB. */
template <typename T, int W>
static __device__ __forceinline__ void heads(const T *in, T *out, int H, int h0, int h_end, int64_t b, int s,
                                             int i, int half, const float *c, const float *vs, const rope_geom &g,
                                             bool rotate) {
    lk_pack<T, W> x1[HB], x2[HB];
#pragma unroll
    for (int j = 0; j < HB; j++) {
        if (h0 + j >= h_end) break;
        int64_t base = ((b * H + h0 + j) * g.seq + s) * g.dim + i;
        lk_ldp<T, W>(in + base, x1[j]);
        if (rotate) lk_ldp<T, W>(in + base + half, x2[j]);
    }
#pragma unroll
    for (int j = 0; j < HB; j++) {
        if (h0 + j >= h_end) break;
        int64_t base = ((b * H + h0 + j) * g.seq + s) * g.dim + i;
        float o1[W], o2[W];
        if (!rotate) {
#pragma unroll
            for (int e = 0; e < W; e++) o1[e] = x1[j].f(e);
            lk_stw<T, W>(out + base, o1);
            continue;
        }
#pragma unroll
        for (int e = 0; e < W; e++) lk_rope_rotate(x1[j].f(e), x2[j].f(e), c[e], vs[e], &o1[e], &o2[e]);
        lk_stw<T, W>(out + base, o1);
        lk_stw<T, W>(out + base + half, o2);
    }
}

/* blockIdx.y picks HB heads: groups 0 .. ceil(hq/HB)−1 of q, then those of k;
 * blockIdx.z the sequence (b0 + z), blockIdx.x a run of its (token, unit) pairs: one 32-bit
 * division a thread (64-bit ones are emulated, and cost this memory-bound kernel ~4%). */
template <typename T, int W>
__global__ void __launch_bounds__(THREADS) rope_kernel(const T *q, T *qo, int hq, const T *k, T *ko, int hk,
                                                      const float *cos_t, const float *sin_t, rope_geom g,
                                                      int64_t b0) {
    const int half = g.rot / 2, rot_units = half / W, units = rot_units + (g.dim - g.rot) / W;
    int gid = blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= g.seq * units) return;
    int s = gid / units, u = gid - s * units;
    int64_t b = b0 + blockIdx.z, t = b * g.seq + s;
    int q0 = 0, q1 = 0, k0 = 0, k1 = 0, grp = (int)blockIdx.y, nq = (hq + HB - 1) / HB;
    if (grp < nq) q0 = grp * HB, q1 = min(hq, q0 + HB);
    else k0 = (grp - nq) * HB, k1 = min(hk, k0 + HB);
    if (u < rot_units) {
        int i = u * W;
        int64_t p = g.pos == NULL ? s : g.pos64 ? ((const int64_t *)g.pos)[t] : ((const int32_t *)g.pos)[t];
        float c[W], sn[W];
        if (p >= 0 && p < g.max_pos) {
            load_table<W>(cos_t + p * half + i, c);
            load_table<W>(sin_t + p * half + i, sn);
#pragma unroll
            for (int e = 0; e < W; e++) sn[e] *= g.sgn;   /* vs = sign·s (exact), once for all heads */
        } else {
#pragma unroll
            for (int e = 0; e < W; e++) c[e] = sn[e] = __int_as_float(0x7fc00000);   /* NaN */
        }
        heads<T, W>(q, qo, hq, q0, q1, b, s, i, half, c, sn, g, true);
        heads<T, W>(k, ko, hk, k0, k1, b, s, i, half, c, sn, g, true);
    } else {
        int i = g.rot + (u - rot_units) * W;
        if (q != qo) heads<T, W>(q, qo, hq, q0, q1, b, s, i, half, NULL, NULL, g, false);
        if (k != ko) heads<T, W>(k, ko, hk, k0, k1, b, s, i, half, NULL, NULL, g, false);
    }
}

template <typename T, int W>
static void launch(const lk_rope_dims *d, const lk_tensor *in_q, const lk_tensor *out_q, const lk_tensor *in_k,
                   const lk_tensor *out_k, const lk_rope_args *a, const rope_geom *g, cudaStream_t st) {
    int64_t units = d->rotary_dim / 2 / W + (d->head_dim - d->rotary_dim) / W;
    int hq = (int)d->q_heads, hk = (int)d->k_heads;
    if (g->tokens * units == 0 || hq + hk == 0) return;
    for (int64_t b0 = 0; b0 < d->batch; b0 += 65535) {   /* gridDim.z's limit */
        unsigned nb = (unsigned)(d->batch - b0 < 65535 ? d->batch - b0 : 65535);
        dim3 grid((unsigned)lk_cdiv(g->seq * units, THREADS), (unsigned)(lk_cdiv(hq, HB) + lk_cdiv(hk, HB)), nb);
        rope_kernel<T, W><<<grid, THREADS, 0, st>>>((const T *)in_q->data, (T *)out_q->data, hq,
                                                    (const T *)in_k->data, (T *)out_k->data, hk,
                                                    (const float *)a->cos.data, (const float *)a->sin.data, *g, b0);
    }
}

static lk_status pass(const lk_rope_args *a, lk_ctx *ctx, int backward) {
    lk_rope_dims d = lk_rope_dims_of(a);
    const lk_tensor *iq = backward ? &a->dq_out : &a->q, *ik = backward ? &a->dk_out : &a->k;
    const lk_tensor *oq = backward ? &a->dq : &a->q_out, *ok = backward ? &a->dk : &a->k_out;
    if (d.seq * d.head_dim > INT32_MAX || d.q_heads > INT32_MAX || a->cos.shape[0] > INT32_MAX)
        return lk_error(LK_ESHAPE, "rope: fused (cuda): q: expected S·D, Hq and max_pos below 2^31");
    rope_geom g = {a->position_ids.data, a->position_ids.dtype == LK_I64, d.batch * d.seq, (int)d.seq,
                   (int)d.head_dim, (int)d.rotary_dim, (int)a->cos.shape[0], backward ? -1.0f : 1.0f};
    int vw = d.dtype == LK_F32 ? 4 : 8;
    int vec = (d.rotary_dim / 2) % vw == 0 && d.head_dim % vw == 0;
    const void *ptrs[] = {iq->data, ik->data, oq->data, ok->data, a->cos.data, a->sin.data};
    for (int i = 0; i < 6; i++) vec &= lk_aligned16(ptrs[i]);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (d.dtype == LK_F32) {
        if (vec) launch<float, 4>(&d, iq, oq, ik, ok, a, &g, st);
        else launch<float, 1>(&d, iq, oq, ik, ok, a, &g, st);
    } else {
        if (vec) launch<lk_bf16_t, 8>(&d, iq, oq, ik, ok, a, &g, st);
        else launch<lk_bf16_t, 1>(&d, iq, oq, ik, ok, a, &g, st);
    }
    LK_CUDA_LAUNCHED(backward ? "rope: fused (cuda) backward" : "rope: fused (cuda) forward");
    return LK_OK;
}

static size_t saved_bytes(const lk_rope_dims *d) { return 0; }
static lk_status forward(const lk_rope_args *a, lk_ctx *ctx) { return pass(a, ctx, 0); }
static lk_status backward(const lk_rope_args *a, lk_ctx *ctx) { return pass(a, ctx, 1); }

extern "C" const lk_rope_vtable lk_rope_cuda_fused_vtable = {
    LK_ROPE_VTABLE_VERSION, saved_bytes, NULL, forward, backward,
};
