/* fused.c — `fused` SwiGLU MLP on the CPU.
 *
 * Forward, per chunk of tokens: ONE GEMM x·W_gate_upᵀ into [n, 2I] f32 (straight into
 * `saved` when the dtype is f32), one pass computing h = silu(gate)·up into an f32
 * [n, I] buffer, the down GEMM. Saved: only the [T, 2I] pre-activations, in the storage
 * dtype (bf16 rounded once; the forward's h comes from the exact f32 values, the
 * backward recomputes it from the rounded ones, as autocast's bf16 tensors would).
 * Backward, per chunk: dh = dout·W_down (GEMM), one pass that recomputes the activation
 * from gate_up and writes d_gate_up [n, 2I] and h (over dh), then d_down_weight +=
 * doutᵀ·h, dx = d_gate_up·W_gate_up and d_gate_up_weight += d_gate_upᵀ·x, one GEMM each.
 * Chunking keeps every temporary at CHUNK tokens instead of T; the weight gradients stay
 * one f32 sum across chunks (rounded once at the end when they are bf16). bf16 weights
 * are widened to f32 once per call rather than once per chunk and GEMM.
 *
 * Reached through lk_swiglu_mlp_forward / _backward (swiglu_mlp.c), which validated every
 * argument and reserved workspace_bytes in ctx->arena. */
#include "ops/swiglu_mlp/internal.h"
#include "ops/swiglu_mlp/act.h"

/* Tokens per chunk: large enough that the weight-gradient GEMMs (k = CHUNK) run at the
 * full GEMM rate, small enough that the temporaries stay below eager's. Measured at
 * 4096x1024x2816 f32 on 2 cores: 1024 ran 3% slower than eager, 4096 ran 5% faster with
 * 220 MiB against eager's 352 (bench/NOTES.md). */
#define CHUNK 4096
#define PAR_MIN ((int64_t)1 << 15)

/* Tokens a chunk holds: CHUNK, or every token when there are fewer. */
static int64_t chunk_of(const lk_swiglu_mlp_dims *s) { return s->t < CHUNK ? s->t : CHUNK; }

static size_t f32_bytes(int64_t n) { return lk_dense_piece((size_t)n * sizeof(float)); }
static size_t f32_if_bf16(lk_dtype dt, int64_t n) { return dt == LK_F32 ? 0 : f32_bytes(n); }

static size_t saved_bytes(int64_t t, int64_t h, int64_t i, lk_dtype dt) {
    return (size_t)t * (size_t)(2 * i) * lk_dtype_size(dt);
}

static size_t workspace_bytes(const lk_swiglu_mlp_args *a, int backward) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    int64_t c = chunk_of(&s);
    size_t weights = f32_if_bf16(s.dt, 2 * s.i * s.h) + f32_if_bf16(s.dt, s.h * s.i);
    size_t x_wide = lk_gemm_workspace_bytes(c, 1, s.h, s.dt, LK_F32);  /* a chunk of x or dout */
    if (!backward)
        return weights + f32_if_bf16(s.dt, c * 2 * s.i) + f32_bytes(c * s.i) + f32_if_bf16(s.dt, c * s.h) + x_wide;
    size_t acc = (a->d_gate_up_weight.data ? lk_grad_acc_bytes(a->d_gate_up_weight.dtype, 2 * s.i * s.h) : 0) +
                 (a->d_down_weight.data ? lk_grad_acc_bytes(a->d_down_weight.dtype, s.h * s.i) : 0);
    return weights + acc + f32_bytes(c * s.i) + f32_bytes(c * 2 * s.i) + f32_if_bf16(s.dt, c * s.h) + x_wide;
}

/* w as f32: itself, or a copy widened into the arena. */
static const float *widen(const void *w, lk_dtype dt, int64_t n, lk_arena *arena) {
    if (dt == LK_F32) return w;
    float *f = lk_arena_alloc(arena, (size_t)n * sizeof(float));
    if (f) lk_convert(w, dt, f, LK_F32, n);
    return f;
}

static void *alloc_if(int cond, lk_arena *arena, int64_t n) {
    return cond ? lk_arena_alloc(arena, (size_t)n * sizeof(float)) : NULL;
}

#define NOMEM() lk_error(LK_ENOMEM, "swiglu_mlp: arena: expected the reserved workspace, got too little")

static lk_status forward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    const int64_t chunk = chunk_of(&s);
    int64_t I = s.i, H = s.h, esz = (int64_t)lk_dtype_size(s.dt);
    lk_arena *ar = ctx->arena;
    const float *wgu = widen(a->gate_up_weight.data, s.dt, 2 * I * H, ar);
    const float *wd = widen(a->down_weight.data, s.dt, H * I, ar);
    float *gu32 = alloc_if(s.dt != LK_F32, ar, chunk * 2 * I), *h32 = alloc_if(1, ar, chunk * I);
    float *o32 = alloc_if(s.dt != LK_F32, ar, chunk * H);
    if (!wgu || !wd || !h32 || (s.dt != LK_F32 && (!gu32 || !o32))) return NOMEM();
    const float L = a->swiglu_limit;
    for (int64_t c0 = 0; c0 < s.t; c0 += chunk) {
        int64_t n = s.t - c0 < chunk ? s.t - c0 : chunk;
        const char *xc = (const char *)a->x.data + c0 * H * esz;
        char *sv = (char *)a->saved.data + c0 * 2 * I * esz;
        float *g = s.dt == LK_F32 ? (float *)sv : gu32;
        lk_status st = lk_gemm(n, 2 * I, H, 1.0f, lk_dense_opnd(xc, s.dt, H, 0), lk_dense_opnd(wgu, LK_F32, H, 1),
                               0.0f, g, 2 * I, ar);
        if (st) return st;
        #pragma omp parallel for schedule(static) if (n * I >= PAR_MIN)
        for (int64_t r = 0; r < n; r++) {
            const float *gr = g + r * 2 * I;
            float *hr = h32 + r * I;
            if (s.dt == LK_F32) {
                #pragma omp simd
                for (int64_t j = 0; j < I; j++) hr[j] = lk_act_forward(gr[j], gr[I + j], L);
            } else {
                uint16_t *sr = (uint16_t *)sv + r * 2 * I;
                #pragma omp simd
                for (int64_t j = 0; j < I; j++) {
                    uint16_t gb = lk_f32_to_bf16(gr[j]), ub = lk_f32_to_bf16(gr[I + j]);
                    sr[j] = gb;
                    sr[I + j] = ub;
                    hr[j] = lk_act_forward(gr[j], gr[I + j], L);
                }
            }
        }
        if (!a->out.data) continue;   /* the saved block alone */
        char *oc = (char *)a->out.data + c0 * H * esz;
        float *o = s.dt == LK_F32 ? (float *)oc : o32;
        if ((st = lk_gemm(n, H, I, 1.0f, lk_dense_opnd(h32, LK_F32, I, 0), lk_dense_opnd(wd, LK_F32, I, 1), 0.0f, o,
                          H, ar)))
            return st;
        if (s.dt != LK_F32) lk_dense_store(oc, s.dt, o32, n, H, NULL);
    }
    return LK_OK;
}

/* The one pass of the backward over a chunk: h over dh, d_gate_up into dgu. */
static void act_backward(const void *gu, lk_dtype dt, float *dh_h, float *dgu, int64_t n, int64_t I, float L) {
    #pragma omp parallel for schedule(static) if (n * I >= PAR_MIN)
    for (int64_t r = 0; r < n; r++) {
        float *hr = dh_h + r * I, *dr = dgu + r * 2 * I;
        int64_t base = r * 2 * I;
        #pragma omp simd
        for (int64_t j = 0; j < I; j++) {
            float g = lk_dense_ld(gu, dt, base + j), u = lk_dense_ld(gu, dt, base + I + j);
            lk_act_backward(g, u, hr[j], L, &hr[j], &dr[j], &dr[I + j]);
        }
    }
}

static lk_status backward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    const int64_t chunk = chunk_of(&s);
    int64_t I = s.i, H = s.h, esz = (int64_t)lk_dtype_size(s.dt);
    lk_arena *ar = ctx->arena;
    lk_grad_acc agu = {0}, ad = {0};
    int want_gu = a->d_gate_up_weight.data != NULL, want_d = a->d_down_weight.data != NULL;
    lk_status st;
    if ((want_gu && (st = lk_grad_acc_begin(&agu, a->d_gate_up_weight.data, a->d_gate_up_weight.dtype, 2 * I * H, ar))) ||
        (want_d && (st = lk_grad_acc_begin(&ad, a->d_down_weight.data, a->d_down_weight.dtype, H * I, ar))))
        return st;
    const float *wgu = widen(a->gate_up_weight.data, s.dt, 2 * I * H, ar);
    const float *wd = widen(a->down_weight.data, s.dt, H * I, ar);
    float *dh = alloc_if(1, ar, chunk * I), *dgu = alloc_if(1, ar, chunk * 2 * I);
    float *dx32 = alloc_if(s.dt != LK_F32, ar, chunk * H);
    if (!wgu || !wd || !dh || !dgu || (s.dt != LK_F32 && !dx32)) return NOMEM();
    for (int64_t c0 = 0; c0 < s.t; c0 += chunk) {
        int64_t n = s.t - c0 < chunk ? s.t - c0 : chunk;
        lk_gemm_operand dout = lk_dense_opnd((const char *)a->dout.data + c0 * H * esz, s.dt, H, 0);
        lk_gemm_operand xc = lk_dense_opnd((const char *)a->x.data + c0 * H * esz, s.dt, H, 0);
        if ((st = lk_gemm(n, I, H, 1.0f, dout, lk_dense_opnd(wd, LK_F32, I, 0), 0.0f, dh, I, ar))) return st;
        act_backward((const char *)a->saved.data + c0 * 2 * I * esz, s.dt, dh, dgu, n, I, a->swiglu_limit);
        if (want_d) {
            lk_gemm_operand dout_t = dout;
            dout_t.trans = 1;
            if ((st = lk_gemm(H, I, n, 1.0f, dout_t, lk_dense_opnd(dh, LK_F32, I, 0), ad.beta, ad.acc, I, ar)))
                return st;
            ad.beta = 1.0f;
        }
        char *dxc = (char *)a->dx.data + c0 * H * esz;
        float *d = s.dt == LK_F32 ? (float *)dxc : dx32;
        if ((st = lk_gemm(n, H, 2 * I, 1.0f, lk_dense_opnd(dgu, LK_F32, 2 * I, 0), lk_dense_opnd(wgu, LK_F32, H, 0),
                          0.0f, d, H, ar)))
            return st;
        if (s.dt != LK_F32) lk_dense_store(dxc, s.dt, dx32, n, H, NULL);
        if (want_gu) {
            if ((st = lk_gemm(2 * I, H, n, 1.0f, lk_dense_opnd(dgu, LK_F32, 2 * I, 1), xc, agu.beta, agu.acc, H, ar)))
                return st;
            agu.beta = 1.0f;
        }
    }
    lk_grad_acc_end(&agu);      /* a gradient not asked for: never begun, nothing to do */
    lk_grad_acc_end(&ad);
    return LK_OK;
}

const lk_swiglu_mlp_vtable lk_swiglu_mlp_fused_vtable = {
    .version = LK_SWIGLU_MLP_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
