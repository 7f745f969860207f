/* eager.c — `eager` MoE experts: what the per-expert modules run under autograd
 * (transformers' Qwen3MoeExperts loop). For each expert in turn: find its routes by a
 * scan of all T·k expert ids (torch.where on the expert mask), gather those token rows,
 * the gate_up GEMM, the activation, the down GEMM, multiply by the routing weights and
 * index_add into the output. Every tensor autograd keeps is saved in the storage dtype:
 * the gathered rows, gate_up, h and the down output y (the operand of the weight
 * multiply), 2H + 3I elements per route, and each intermediate is rounded to the
 * storage dtype as a framework's tensors are. The backward walks the experts again:
 * dy = w·dout, d_topk_weights = dout·y, dh = dy·W_down, the activation's backward,
 * d_rows = d_gate_up·W_gate_up index_added into d_hidden. The baseline fused.c must
 * beat and a second opinion for the checks.
 *
 * Reached through lk_moe_experts_forward / _backward (experts.c). */
#include <string.h>
#include "ops/moe/internal.h"
#include "ops/swiglu_mlp/act.h"

#define OP "moe_experts"

typedef struct {
    int64_t *offs;
    int32_t *routes;            /* per expert, in token order */
    void *x, *gu, *h, *y;       /* [R, H], [R, 2I], [R, I], [R, H] in the storage dtype, expert order */
} saved_view;

static size_t saved_bytes(int64_t t, int64_t k, int64_t e, int64_t h, int64_t i, lk_dtype dt) {
    size_t r = (size_t)(t * k), esz = lk_dtype_size(dt);
    return lk_arena_piece(sizeof(int64_t) * (size_t)(e + 1)) + lk_arena_piece(sizeof(int32_t) * r) +
           lk_arena_piece(r * (size_t)h * esz) + lk_arena_piece(r * (size_t)(2 * i) * esz) +
           lk_arena_piece(r * (size_t)i * esz) + r * (size_t)h * esz;
}

static saved_view view_of(const lk_moe_experts_args *a, const lk_moe_dims *d) {
    size_t r = (size_t)d->r, esz = lk_dtype_size(d->dt);
    char *p = a->saved.data;
    saved_view v;
    v.offs = (int64_t *)p;       p += lk_arena_piece(sizeof(int64_t) * (size_t)(d->e + 1));
    v.routes = (int32_t *)p;     p += lk_arena_piece(sizeof(int32_t) * r);
    v.x = p;                     p += lk_arena_piece(r * (size_t)d->h * esz);
    v.gu = p;                    p += lk_arena_piece(r * (size_t)(2 * d->i) * esz);
    v.h = p;                     p += lk_arena_piece(r * (size_t)d->i * esz);
    v.y = p;
    return v;
}

static size_t f32s(int64_t n) { return lk_dense_piece((size_t)n * sizeof(float)); }

static size_t workspace_bytes(const lk_moe_experts_args *a, int backward) {
    lk_moe_dims d = lk_moe_dims_of(a);
    /* lk_gemm's widening of one bf16 operand at a time: a weight slice or saved rows */
    size_t wide = d.dt == LK_F32 ? 0 : f32s(d.r * d.h > 2 * d.i * d.h ? d.r * d.h : 2 * d.i * d.h) + LK_ARENA_ALIGN;
    size_t common = f32s(d.t * d.h) + 2 * f32s(d.r * d.h) + f32s(d.r * 2 * d.i) + f32s(d.r * d.i) + wide;
    if (!backward) return common;
    return common + (a->d_gate_up_weight.data ? lk_grad_acc_bytes(a->d_gate_up_weight.dtype, d.e * 2 * d.i * d.h) : 0) +
           (a->d_down_weight.data ? lk_grad_acc_bytes(a->d_down_weight.dtype, d.e * d.h * d.i) : 0);
}

static void *at(const void *p, lk_dtype dt, int64_t n) { return (char *)p + n * (int64_t)lk_dtype_size(dt); }

/* A tensor autograd would hold in dt: f32 values rounded through dt, and the copy in dt
 * where it is saved (dst may be NULL). */
static void materialize(float *v, int64_t n, lk_dtype dt, void *dst) {
    if (dt != LK_F32)
        for (int64_t i = 0; i < n; i++) v[i] = lk_bf16_to_f32(lk_f32_to_bf16(v[i]));
    if (dst) lk_convert(v, LK_F32, dst, dt, n);
}

static lk_gemm_operand wslice(const void *w, lk_dtype dt, int64_t e, int64_t rows, int64_t cols, int trans) {
    return lk_dense_opnd(at(w, dt, e * rows * cols), dt, cols, trans);
}

/* The routes of expert e, found the way torch.where(mask[e]) finds them: a scan of all. */
static int64_t find_routes(const int32_t *ids, int64_t r, int64_t e, int32_t *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < r; i++)
        if (ids[i] == e) out[n++] = (int32_t)i;
    return n;
}

/* dst[t] += src[p] (· w[route]) for the n routes of one expert: index_add_. */
static void index_add(float *dst, const float *src, const int32_t *routes, int64_t n, int64_t k, int64_t h,
                      const float *w) {
    #pragma omp parallel for schedule(static) if (n * h >= LK_MOE_PAR_MIN)
    for (int64_t c0 = 0; c0 < h; c0 += 64) {      /* columns split: two routes may share a token */
        int64_t c1 = c0 + 64 < h ? c0 + 64 : h;
        for (int64_t p = 0; p < n; p++) {
            float s = w ? w[routes[p]] : 1.0f, *d = dst + (routes[p] / k) * h;
            const float *v = src + p * h;
            #pragma omp simd
            for (int64_t c = c0; c < c1; c++) d[c] += s * v[c];
        }
    }
}

static float *f32_alloc(lk_arena *ar, int64_t n) { return lk_arena_alloc(ar, (size_t)n * sizeof(float)); }

static lk_status forward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i;
    lk_arena *ar = ctx->arena;
    saved_view sv = view_of(a, &d);
    float *out32 = f32_alloc(ar, d.t * H), *x32 = f32_alloc(ar, d.r * H), *y32 = f32_alloc(ar, d.r * H);
    float *g32 = f32_alloc(ar, d.r * 2 * I), *h32 = f32_alloc(ar, d.r * I);
    if (!out32 || !x32 || !y32 || !g32 || !h32) return LK_MOE_NOMEM(OP);
    memset(out32, 0, sizeof(float) * (size_t)(d.t * H));
    lk_status st;
    sv.offs[0] = 0;
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = find_routes(a->topk_ids.data, d.r, e, sv.routes + p0);
        sv.offs[e + 1] = p0 + n;
        if (!n) continue;
        const int32_t *rt = sv.routes + p0;
        lk_moe_gather_rows(x32, a->hidden.data, d.dt, H, rt, n, d.k);
        lk_convert(x32, LK_F32, at(sv.x, d.dt, p0 * H), d.dt, n * H);
        if ((st = lk_gemm(n, 2 * I, H, 1.0f, lk_dense_opnd(x32, LK_F32, H, 0),
                          wslice(a->gate_up_weight.data, d.dt, e, 2 * I, H, 1), 0.0f, g32, 2 * I, ar)))
            return st;
        materialize(g32, n * 2 * I, d.dt, at(sv.gu, d.dt, p0 * 2 * I));
        #pragma omp parallel for schedule(static) if (n * I >= LK_MOE_PAR_MIN)
        for (int64_t p = 0; p < n; p++)
            for (int64_t j = 0; j < I; j++) h32[p * I + j] = lk_act_forward(g32[p * 2 * I + j], g32[p * 2 * I + I + j], 0.0f);
        materialize(h32, n * I, d.dt, at(sv.h, d.dt, p0 * I));
        if ((st = lk_gemm(n, H, I, 1.0f, lk_dense_opnd(h32, LK_F32, I, 0),
                          wslice(a->down_weight.data, d.dt, e, H, I, 1), 0.0f, y32, H, ar)))
            return st;
        materialize(y32, n * H, d.dt, at(sv.y, d.dt, p0 * H));
        if (a->out.data) index_add(out32, y32, rt, n, d.k, H, a->topk_weights.data);
    }
    if (a->out.data) lk_dense_store(a->out.data, d.dt, out32, d.t, H, NULL);   /* else the saved block alone */
    return LK_OK;
}

static lk_status backward(const lk_moe_experts_args *a, lk_ctx *ctx) {
    lk_moe_dims d = lk_moe_dims_of(a);
    int64_t H = d.h, I = d.i;
    lk_arena *ar = ctx->arena;
    saved_view sv = view_of(a, &d);
    lk_grad_acc agu = {0}, ad = {0};
    int want_gu = a->d_gate_up_weight.data != NULL, want_d = a->d_down_weight.data != NULL;
    lk_status st;
    if ((want_gu && (st = lk_moe_grad_begin(&agu, &a->d_gate_up_weight, d.e * 2 * I * H, a->write_weight_grads, ar))) ||
        (want_d && (st = lk_moe_grad_begin(&ad, &a->d_down_weight, d.e * H * I, a->write_weight_grads, ar))))
        return st;
    float *dx32 = f32_alloc(ar, d.t * H), *dy = f32_alloc(ar, d.r * H), *v32 = f32_alloc(ar, d.r * H);
    float *dg = f32_alloc(ar, d.r * 2 * I), *dh = f32_alloc(ar, d.r * I);
    if (!dx32 || !dy || !v32 || !dg || !dh) return LK_MOE_NOMEM(OP);
    memset(dx32, 0, sizeof(float) * (size_t)(d.t * H));
    const float *w = a->topk_weights.data;
    float *dw = a->d_topk_weights.data;
    for (int64_t e = 0; e < d.e; e++) {
        int64_t p0 = sv.offs[e], n = sv.offs[e + 1] - p0;
        if (!n) continue;
        const int32_t *rt = sv.routes + p0;
        lk_moe_gather_rows(dy, a->dout.data, d.dt, H, rt, n, d.k);   /* dout rows, then dy = w·dout */
        lk_convert(at(sv.y, d.dt, p0 * H), d.dt, v32, LK_F32, n * H);
        #pragma omp parallel for schedule(static) if (n * H >= LK_MOE_PAR_MIN)
        for (int64_t p = 0; p < n; p++) {
            float dot = 0.0f, wr = w[rt[p]], *row = dy + p * H;
            for (int64_t c = 0; c < H; c++) {
                dot += row[c] * v32[p * H + c];
                row[c] *= wr;
            }
            if (dw) dw[rt[p]] = dot;
        }
        materialize(dy, n * H, d.dt, NULL);
        if ((st = lk_gemm(n, I, H, 1.0f, lk_dense_opnd(dy, LK_F32, H, 0),
                          wslice(a->down_weight.data, d.dt, e, H, I, 0), 0.0f, dh, I, ar)))
            return st;
        materialize(dh, n * I, d.dt, NULL);
        if (want_d && (st = lk_gemm(H, I, n, 1.0f, lk_dense_opnd(dy, LK_F32, H, 1),
                                    lk_dense_opnd(at(sv.h, d.dt, p0 * I), d.dt, I, 0), 1.0f, ad.acc + e * H * I, I, ar)))
            return st;
        #pragma omp parallel for schedule(static) if (n * I >= LK_MOE_PAR_MIN)
        for (int64_t p = 0; p < n; p++)
            for (int64_t j = 0; j < I; j++) {
                int64_t b = (p0 + p) * 2 * I;
                float hv, g = lk_dense_ld(sv.gu, d.dt, b + j), u = lk_dense_ld(sv.gu, d.dt, b + I + j);
                lk_act_backward(g, u, dh[p * I + j], 0.0f, &hv, &dg[p * 2 * I + j], &dg[p * 2 * I + I + j]);
            }
        materialize(dg, n * 2 * I, d.dt, NULL);
        if ((st = lk_gemm(n, H, 2 * I, 1.0f, lk_dense_opnd(dg, LK_F32, 2 * I, 0),
                          wslice(a->gate_up_weight.data, d.dt, e, 2 * I, H, 0), 0.0f, v32, H, ar)))
            return st;
        materialize(v32, n * H, d.dt, NULL);
        index_add(dx32, v32, rt, n, d.k, H, NULL);
        if (want_gu && (st = lk_gemm(2 * I, H, n, 1.0f, lk_dense_opnd(dg, LK_F32, 2 * I, 1),
                                     lk_dense_opnd(at(sv.x, d.dt, p0 * H), d.dt, H, 0), 1.0f, agu.acc + e * 2 * I * H,
                                     H, ar)))
            return st;
    }
    lk_dense_store(a->d_hidden.data, d.dt, dx32, d.t, H, NULL);
    if (want_gu) lk_grad_acc_end(&agu);
    if (want_d) lk_grad_acc_end(&ad);
    return LK_OK;
}

const lk_moe_experts_vtable lk_moe_experts_eager_vtable = {
    .version = LK_MOE_EXPERTS_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
