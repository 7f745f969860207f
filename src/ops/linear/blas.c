/* blas.c — `blas` linear on the CPU: every product is one lk_gemm (CBLAS sgemm, bf16
 * widened to f32 first), f32 results rounded once into the storage dtype.
 *   forward   y = x · Wᵀ (+ b)     one GEMM, bias added in the rounding pass
 *   backward  dx = dy · W          one GEMM (written)
 *             dW += dyᵀ · x        one GEMM, beta 1 into an f32 gradient, else via lk_grad_acc
 *             db += Σ_rows dy      a column sum
 * Reached through lk_linear_forward / lk_linear_backward (linear.c), which validated
 * every argument and reserved workspace_bytes in ctx->arena. */
#include "ops/linear/internal.h"
#include "ops/dense.h"

static size_t f32_temp(lk_dtype dt, int64_t n) { return dt == LK_F32 ? 0 : lk_dense_piece((size_t)n * 4); }

static size_t saved_bytes(int64_t rows, int64_t in, int64_t out, lk_dtype dt) { return 0; }

static size_t workspace_bytes(const lk_linear_args *a, int backward) {
    lk_linear_dims s = lk_linear_dims_of(a);
    if (!backward)
        return f32_temp(s.dt, s.rows * s.out) + lk_gemm_workspace_bytes(s.rows, s.out, s.in, s.dt, s.dt);
    size_t dx = a->dx.data ? f32_temp(s.dt, s.rows * s.in) + lk_gemm_workspace_bytes(s.rows, s.in, s.out, s.dt, s.dt)
                           : 0;
    size_t dw = a->dweight.data ? lk_dense_gemm_acc_bytes(s.out, s.in, s.rows, s.dt, s.dt, a->dweight.dtype) : 0;
    return lk_dense_max(dx, dw);
}

static lk_status forward(const lk_linear_args *a, lk_ctx *ctx) {
    lk_linear_dims s = lk_linear_dims_of(a);
    size_t mark = ctx->arena ? ctx->arena->used : 0;
    float *y32 = s.dt == LK_F32 ? a->y.data : lk_arena_alloc(ctx->arena, (size_t)(s.rows * s.out) * 4);
    if (y32 == NULL) return lk_error(LK_ENOMEM, "linear: arena: expected room for y in f32, got too little");
    lk_status st = lk_gemm(s.rows, s.out, s.in, 1.0f, lk_dense_opnd(a->x.data, s.dt, s.in, 0),
                           lk_dense_opnd(a->weight.data, s.dt, s.in, 1), 0.0f, y32, s.out, ctx->arena);
    if (!st && (s.dt != LK_F32 || a->bias.data)) lk_dense_store(a->y.data, s.dt, y32, s.rows, s.out, a->bias.data);
    if (ctx->arena) lk_arena_release(ctx->arena, mark);
    return st;
}

static lk_status backward(const lk_linear_args *a, lk_ctx *ctx) {
    lk_linear_dims s = lk_linear_dims_of(a);
    lk_status st = LK_OK;
    if (a->dx.data) {
        size_t mark = ctx->arena ? ctx->arena->used : 0;
        float *dx32 = s.dt == LK_F32 ? a->dx.data : lk_arena_alloc(ctx->arena, (size_t)(s.rows * s.in) * 4);
        if (dx32 == NULL) return lk_error(LK_ENOMEM, "linear: arena: expected room for dx in f32, got too little");
        st = lk_gemm(s.rows, s.in, s.out, 1.0f, lk_dense_opnd(a->dy.data, s.dt, s.out, 0),
                     lk_dense_opnd(a->weight.data, s.dt, s.in, 0), 0.0f, dx32, s.in, ctx->arena);
        if (!st && s.dt != LK_F32) lk_dense_store(a->dx.data, s.dt, dx32, s.rows, s.in, NULL);
        if (ctx->arena) lk_arena_release(ctx->arena, mark);
        if (st) return st;
    }
    if (a->dweight.data &&
        (st = lk_dense_gemm_acc(s.out, s.in, s.rows, lk_dense_opnd(a->dy.data, s.dt, s.out, 1),
                                lk_dense_opnd(a->x.data, s.dt, s.in, 0), a->dweight.data, a->dweight.dtype,
                                ctx->arena)))
        return st;
    if (a->dbias.data) lk_dense_colsum_acc(a->dbias.data, a->dbias.dtype, a->dy.data, s.dt, s.rows, s.out);
    return LK_OK;
}

const lk_linear_vtable lk_linear_blas_vtable = {
    .version = LK_LINEAR_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
