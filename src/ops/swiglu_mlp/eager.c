/* eager.c — `eager` SwiGLU MLP: what a framework without fusion runs, i.e. autograd of
 *   down(silu(gate(x)) * up(x))
 * with gate and up as two GEMMs into two [T, I] tensors, and every elementwise step its
 * own pass into its own tensor in the storage dtype. It saves what autograd keeps:
 * gate and up (the inputs of silu and of the clamps), silu(gate) and the product h (the
 * operands of the mul and of the down projection), 4·T·I elements. The backward goes
 * step by step: dh, then d_silu = dh·up, d_up = dh·silu, d_gate = d_silu·silu'(gate),
 * each materialized, and one GEMM per product. It is the baseline fused.c must beat
 * and a second opinion for the checks, not a fast path.
 *
 * Reached through lk_swiglu_mlp_forward / _backward (swiglu_mlp.c), which validated every
 * argument and reserved workspace_bytes in ctx->arena. */
#include "ops/swiglu_mlp/internal.h"
#include "ops/swiglu_mlp/act.h"

#define PAR_MIN ((int64_t)1 << 15)

static size_t saved_bytes(int64_t t, int64_t h, int64_t i, lk_dtype dt) {
    return 4 * (size_t)t * (size_t)i * lk_dtype_size(dt);
}


static size_t workspace_bytes(const lk_swiglu_mlp_args *a, int backward) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    int64_t T = s.t, H = s.h, I = s.i;
    lk_dtype dt = s.dt;
    /* one f32 result buffer for the GEMMs of a bf16 run, sized for the larger of [T, I], [T, H] */
    size_t t32 = dt == LK_F32 ? 0 : lk_dense_piece((size_t)(T * (H > I ? H : I)) * 4);
    size_t gemm = lk_dense_max(lk_gemm_workspace_bytes(T, I, H, dt, dt), lk_gemm_workspace_bytes(T, H, I, dt, dt));
    if (!backward) return t32 + gemm;
    size_t held = 4 * lk_dense_piece((size_t)(T * I) * s.es);       /* dh, d_silu, d_up, d_gate */
    size_t dgu = a->d_gate_up_weight.data ? lk_dense_gemm_acc_bytes(I, H, T, dt, dt, a->d_gate_up_weight.dtype) : 0;
    size_t dd = a->d_down_weight.data ? lk_dense_gemm_acc_bytes(H, I, T, dt, dt, a->d_down_weight.dtype) : 0;
    return held + t32 + lk_dense_max(gemm, lk_dense_max(dgu, dd));
}

static void *at(const void *base, size_t esz, int64_t elems) { return (char *)base + elems * (int64_t)esz; }

/* C [m, n] in dtype dt (+)= A · B through the f32 buffer c32 when dt is bf16 (C itself
 * when f32); store = 0 leaves a bf16 result in c32 for a second GEMM to add to. */
static lk_status gemm_to(lk_arena *ar, lk_dtype dt, int64_t m, int64_t n, int64_t k, lk_gemm_operand A,
                         lk_gemm_operand B, float beta, float *c32, void *c, int store) {
    lk_status st = lk_gemm(m, n, k, 1.0f, A, B, beta, dt == LK_F32 ? c : c32, n, ar);
    if (!st && store && dt != LK_F32) lk_dense_store(c, dt, c32, m, n, NULL);
    return st;
}

/* --- the elementwise steps, one pass each, dtype dt in and out ---------------------- */

typedef enum { SILU, MUL_UP, D_SILU, D_UP, D_GATE } step;

/* out = f(p, q) elementwise over n, with L the clamp limit. */
static void ew(step k, const void *p, const void *q, const void *r, void *out, int64_t n, lk_dtype dt, float L) {
    #pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float a = lk_dense_ld(p, dt, i), b = q ? lk_dense_ld(q, dt, i) : 0.0f, v;
        switch (k) {
        case SILU: { float g = lk_act_clamp_gate(a, L); v = g * lk_act_sigmoid(g); break; }      /* p gate */
        case MUL_UP: v = a * lk_act_clamp_up(b, L); break;                                      /* p silu, q up */
        case D_SILU: v = a * lk_act_clamp_up(b, L); break;                                      /* p dh, q up */
        case D_UP: v = a * b * lk_act_pass_up(lk_dense_ld(r, dt, i), L); break;                 /* p dh, q silu, r up */
        default: {                                                          /* D_GATE: p d_silu, q gate */
            float g = lk_act_clamp_gate(b, L), sg = lk_act_sigmoid(g);
            v = a * sg * (1.0f + g * (1.0f - sg)) * lk_act_pass_gate(b, L);
        }
        }
        lk_dense_st(out, dt, i, v);
    }
}

#define NOMEM() lk_error(LK_ENOMEM, "swiglu_mlp: arena: expected the reserved workspace, got too little")

static lk_status forward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    int64_t T = s.t, H = s.h, I = s.i;
    lk_dtype dt = s.dt;
    lk_arena *ar = ctx->arena;
    void *gate = a->saved.data, *up = at(gate, s.es, T * I), *silu = at(gate, s.es, 2 * T * I);
    void *h = at(gate, s.es, 3 * T * I);
    float *t32 = dt == LK_F32 ? NULL : lk_arena_alloc(ar, (size_t)(T * (H > I ? H : I)) * 4);
    if (dt != LK_F32 && !t32) return NOMEM();
    lk_gemm_operand X = lk_dense_opnd(a->x.data, dt, H, 0);
    const void *wg = a->gate_up_weight.data, *wu = at(wg, s.es, I * H);
    lk_status st;
    if ((st = gemm_to(ar, dt, T, I, H, X, lk_dense_opnd(wg, dt, H, 1), 0.0f, t32, gate, 1)) ||
        (st = gemm_to(ar, dt, T, I, H, X, lk_dense_opnd(wu, dt, H, 1), 0.0f, t32, up, 1)))
        return st;
    ew(SILU, gate, NULL, NULL, silu, T * I, dt, a->swiglu_limit);
    ew(MUL_UP, silu, up, NULL, h, T * I, dt, a->swiglu_limit);
    if (!a->out.data) return LK_OK;   /* the saved block alone */
    return gemm_to(ar, dt, T, H, I, lk_dense_opnd(h, dt, I, 0), lk_dense_opnd(a->down_weight.data, dt, I, 1), 0.0f,
                   t32, a->out.data, 1);
}

static lk_status backward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims s = lk_swiglu_mlp_dims_of(a);
    int64_t T = s.t, H = s.h, I = s.i, TI = T * I;
    lk_dtype dt = s.dt;
    lk_arena *ar = ctx->arena;
    const float L = a->swiglu_limit;
    void *gate = a->saved.data, *up = at(gate, s.es, TI), *silu = at(gate, s.es, 2 * TI), *h = at(gate, s.es, 3 * TI);
    void *dh = lk_arena_alloc(ar, (size_t)TI * s.es), *dsilu = lk_arena_alloc(ar, (size_t)TI * s.es);
    void *du = lk_arena_alloc(ar, (size_t)TI * s.es), *dgate = lk_arena_alloc(ar, (size_t)TI * s.es);
    float *t32 = dt == LK_F32 ? NULL : lk_arena_alloc(ar, (size_t)(T * (H > I ? H : I)) * 4);
    if (!dh || !dsilu || !du || !dgate || (dt != LK_F32 && !t32)) return NOMEM();
    const void *wg = a->gate_up_weight.data, *wu = at(wg, s.es, I * H);
    lk_status st;
    if ((st = gemm_to(ar, dt, T, I, H, lk_dense_opnd(a->dout.data, dt, H, 0),
                      lk_dense_opnd(a->down_weight.data, dt, I, 0), 0.0f, t32, dh, 1)))
        return st;
    if (a->d_down_weight.data &&
        (st = lk_dense_gemm_acc(H, I, T, lk_dense_opnd(a->dout.data, dt, H, 1), lk_dense_opnd(h, dt, I, 0),
                                a->d_down_weight.data, a->d_down_weight.dtype, ar)))
        return st;
    ew(D_SILU, dh, up, NULL, dsilu, TI, dt, L);
    ew(D_UP, dh, silu, up, du, TI, dt, L);
    ew(D_GATE, dsilu, gate, NULL, dgate, TI, dt, L);
    if ((st = gemm_to(ar, dt, T, H, I, lk_dense_opnd(dgate, dt, I, 0), lk_dense_opnd(wg, dt, H, 0), 0.0f, t32,
                      a->dx.data, 0)) ||
        (st = gemm_to(ar, dt, T, H, I, lk_dense_opnd(du, dt, I, 0), lk_dense_opnd(wu, dt, H, 0), 1.0f, t32,
                      a->dx.data, 1)))
        return st;
    if (a->d_gate_up_weight.data) {
        lk_dtype gdt = a->d_gate_up_weight.dtype;
        void *dwg = a->d_gate_up_weight.data, *dwu = at(dwg, lk_dtype_size(gdt), I * H);
        lk_gemm_operand X = lk_dense_opnd(a->x.data, dt, H, 0);
        if ((st = lk_dense_gemm_acc(I, H, T, lk_dense_opnd(dgate, dt, I, 1), X, dwg, gdt, ar)) ||
            (st = lk_dense_gemm_acc(I, H, T, lk_dense_opnd(du, dt, I, 1), X, dwu, gdt, ar)))
            return st;
    }
    return LK_OK;
}

const lk_swiglu_mlp_vtable lk_swiglu_mlp_eager_vtable = {
    .version = LK_SWIGLU_MLP_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
