/* fused.c — `fused` MoE experts on the CPU, the reference layout the GPU kernels follow.
 *
 * Forward: one stable counting sort of the T·k routes by expert (permute.c: order,
 * its inverse pos, the per-expert offsets; O(T·k + E)); the token rows gathered once
 * into expert-sorted f32 rows; per expert ONE GEMM over its row range against its
 * [2I, H] gate_up slice (gate and up together); one pass over every sorted row that
 * computes h = w · silu(gate) · up (the routing weight folded into the activation, as
 * NeMo's WeightedSwiGLU does, so nothing after the down GEMM needs it); the down GEMM per
 * expert into the gather buffer; and the un-permute, one parallel pass over tokens that
 * sums each token's k rows in f32 and rounds once.
 * Saved: the permutation (offs, order, pos) and the [T·k, 2I] pre-activations in the
 * storage dtype — not the gathered input, not h, not the down output.
 * Backward: dout gathered unweighted; dh' = dout·W_down per expert; one pass that
 * recomputes the activation and gives d_topk_weights = dh'·h (no down output needed),
 * d_gate_up and w·h; then per expert d_down += doutᵀ·(w·h), d_rows = d_gate_up·W_gate_up,
 * d_gate_up_weight += d_gate_upᵀ·x_rows; the un-permute sums d_rows into d_hidden.
 *
 * Reached through lk_moe_experts_forward / _backward (experts.c). */
#include <string.h>
#include "ops/moe/internal.h"
#include "ops/swiglu_mlp/act.h"

#define OP "moe_experts"

static size_t f32s(int64_t n) { return lk_dense_piece((size_t)n * sizeof(float)); }

/* Per expert GEMM scratch: one bf16 weight slice widened by lk_gemm. */
static size_t gemm_scratch(const lk_moe_dims *d) {
    return lk_gemm_workspace_bytes(1, 2 * d->i, d->h, LK_F32, d->dt) + LK_ARENA_ALIGN;
}

static size_t workspace_bytes(const lk_moe_experts_args *a, int backward) {
    lk_moe_dims d = lk_moe_dims_of(a);
    size_t rows = f32s(d.r * d.h), hbuf = f32s(d.r * d.i), gu = f32s(d.r * 2 * d.i);
    if (!backward) return rows + (d.dt == LK_F32 ? 0 : gu) + hbuf + gemm_scratch(&d);
    size_t acc = (a->d_gate_up_weight.data ? lk_grad_acc_bytes(a->d_gate_up_weight.dtype, d.e * 2 * d.i * d.h) : 0) +
                 (a->d_down_weight.data ? lk_grad_acc_bytes(a->d_down_weight.dtype, d.e * d.h * d.i) : 0);
    return 2 * rows + hbuf + gu + acc + gemm_scratch(&d);
}

static float *f32_alloc(lk_arena *ar, int64_t n) { return lk_arena_alloc(ar, (size_t)n * sizeof(float)); }

static lk_gemm_operand wslice(const void *w, lk_dtype dt, int64_t e, int64_t rows, int64_t cols, int trans) {
    return lk_dense_opnd((const char *)w + e * rows * cols * (int64_t)lk_dtype_size(dt), dt, cols, trans);
}

static lk_status forward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i;
    lk_arena *ar = ctx->arena;
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    float *rows = f32_alloc(ar, d.r * H), *h = f32_alloc(ar, d.r * I);
    float *gu = d.dt == LK_F32 ? sv.gu : f32_alloc(ar, d.r * 2 * I);
    if (!rows || !h || !gu) return LK_MOE_NOMEM(OP);
    lk_moe_permute(a->topk_ids.data, d.r, d.e, sv.offs, sv.order, sv.pos);
    lk_moe_gather_rows(rows, a->hidden.data, d.dt, H, sv.order, d.r, d.k);
    lk_status st;
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = sv.offs[e + 1] - p0;
        if (n && (st = lk_gemm(n, 2 * I, H, 1.0f, lk_dense_opnd(rows + p0 * H, LK_F32, H, 0),
                               wslice(a->gate_up_weight.data, d.dt, e, 2 * I, H, 1), 0.0f, gu + p0 * 2 * I, 2 * I, ar)))
            return st;
    }
    const float *w = a->topk_weights.data;
    #pragma omp parallel for schedule(static) if (d.r * I >= LK_MOE_PAR_MIN)
    for (int64_t p = 0; p < d.r; p++) {
        const float *g = gu + p * 2 * I;
        float *hr = h + p * I, wr = w[sv.order[p]];
        if (d.dt != LK_F32) {                 /* bf16: the saved copy, rounded once */
            uint16_t *s = (uint16_t *)sv.gu + p * 2 * I;
            #pragma omp simd
            for (int64_t j = 0; j < 2 * I; j++) s[j] = lk_f32_to_bf16(g[j]);
        }
        #pragma omp simd
        for (int64_t j = 0; j < I; j++) hr[j] = wr * lk_act_forward(g[j], g[I + j], 0.0f);
    }
    if (!a->out.data) return LK_OK;   /* the saved block alone */
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = sv.offs[e + 1] - p0;
        if (n && (st = lk_gemm(n, H, I, 1.0f, lk_dense_opnd(h + p0 * I, LK_F32, I, 0),
                               wslice(a->down_weight.data, d.dt, e, H, I, 1), 0.0f, rows + p0 * H, H, ar)))
            return st;
    }
    lk_moe_unpermute_sum(a->out.data, d.dt, rows, H, sv.pos, d.t, d.k);
    return LK_OK;
}

/* The one pass of the backward over the sorted rows: from dh' (unweighted, in hb) and
 * the saved pre-activations, d_topk_weights, d_gate_up (into dgu) and w·h (over hb). */
static void act_backward(const lk_moe_experts_args *a, const lk_moe_dims *d, const lk_moe_fused_saved *sv, float *hb,
                         float *dgu) {
    int64_t I = d->i;
    const float *w = a->topk_weights.data;
    float *dw = a->d_topk_weights.data;
    #pragma omp parallel for schedule(static) if (d->r * I >= LK_MOE_PAR_MIN)
    for (int64_t p = 0; p < d->r; p++) {
        int64_t r = sv->order[p], base = p * 2 * I;
        float wr = w[r], dot = 0.0f, *hr = hb + p * I, *dr = dgu + base;
        #pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < I; j++) {
            float g = lk_dense_ld(sv->gu, d->dt, base + j), u = lk_dense_ld(sv->gu, d->dt, base + I + j), hv;
            float dhp = hr[j];
            lk_act_backward(g, u, wr * dhp, 0.0f, &hv, &dr[j], &dr[I + j]);
            dot += dhp * hv;
            hr[j] = wr * hv;
        }
        if (dw) dw[r] = dot;
    }
}

static lk_status backward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i;
    lk_arena *ar = ctx->arena;
    lk_moe_fused_saved sv = lk_moe_fused_saved_view(a->saved.data, &d);
    lk_grad_acc agu = {0}, ad = {0};
    int want_gu = a->d_gate_up_weight.data != NULL, want_d = a->d_down_weight.data != NULL;
    lk_status st;
    if ((want_gu && (st = lk_moe_grad_begin(&agu, &a->d_gate_up_weight, d.e * 2 * I * H, a->write_weight_grads, ar))) ||
        (want_d && (st = lk_moe_grad_begin(&ad, &a->d_down_weight, d.e * H * I, a->write_weight_grads, ar))))
        return st;
    float *drows = f32_alloc(ar, d.r * H), *xrows = f32_alloc(ar, d.r * H);
    float *hb = f32_alloc(ar, d.r * I), *dgu = f32_alloc(ar, d.r * 2 * I);
    if (!drows || !xrows || !hb || !dgu) return LK_MOE_NOMEM(OP);
    lk_moe_gather_rows(drows, a->dout.data, d.dt, H, sv.order, d.r, d.k);
    if (want_gu) lk_moe_gather_rows(xrows, a->hidden.data, d.dt, H, sv.order, d.r, d.k);
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = sv.offs[e + 1] - p0;
        if (n && (st = lk_gemm(n, I, H, 1.0f, lk_dense_opnd(drows + p0 * H, LK_F32, H, 0),
                               wslice(a->down_weight.data, d.dt, e, H, I, 0), 0.0f, hb + p0 * I, I, ar)))
            return st;
    }
    act_backward(a, &d, &sv, hb, dgu);
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = sv.offs[e + 1] - p0;
        if (!n) continue;
        if (want_d && (st = lk_gemm(H, I, n, 1.0f, lk_dense_opnd(drows + p0 * H, LK_F32, H, 1),
                                    lk_dense_opnd(hb + p0 * I, LK_F32, I, 0), 1.0f, ad.acc + e * H * I, I, ar)))
            return st;
        /* d_rows overwrite the expert's dout rows, read for the last time just above */
        if ((st = lk_gemm(n, H, 2 * I, 1.0f, lk_dense_opnd(dgu + p0 * 2 * I, LK_F32, 2 * I, 0),
                          wslice(a->gate_up_weight.data, d.dt, e, 2 * I, H, 0), 0.0f, drows + p0 * H, H, ar)))
            return st;
        if (want_gu && (st = lk_gemm(2 * I, H, n, 1.0f, lk_dense_opnd(dgu + p0 * 2 * I, LK_F32, 2 * I, 1),
                                     lk_dense_opnd(xrows + p0 * H, LK_F32, H, 0), 1.0f, agu.acc + e * 2 * I * H, H,
                                     ar)))
            return st;
    }
    lk_moe_unpermute_sum(a->d_hidden.data, d.dt, drows, H, sv.pos, d.t, d.k);
    if (want_gu) lk_grad_acc_end(&agu);
    if (want_d) lk_grad_acc_end(&ad);
    return LK_OK;
}

const lk_moe_experts_vtable lk_moe_experts_fused_vtable = {
    .version = LK_MOE_EXPERTS_VTABLE_VERSION,
    .saved_bytes = lk_moe_fused_saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
