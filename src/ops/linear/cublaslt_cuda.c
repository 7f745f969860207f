/* cublaslt_cuda.c — `cublaslt` linear on CUDA: every product one cuBLASLt matmul with a
 * cached plan (core/cublaslt_util.h: heuristic once per shape, dtypes and transposes),
 * f32 accumulation, f32 or bf16 storage (f32 operands in exact f32, no TF32).
 *   forward   y = x · Wᵀ (+ b)     one matmul, the bias as its epilogue
 *   backward  dx = dy · W          one matmul (written)
 *             dW += dyᵀ · x        one matmul, beta 1: into f32, or into bf16 read and
 *                                  rounded once (as the CPU blas's lk_grad_acc)
 *             db += Σ_rows dy      a column-sum kernel (cublaslt.cu), rounded once
 * Workspace: LK_LT_WORKSPACE_BYTES of ctx->arena (a device arena) for cuBLASLt. Reached
 * through lk_linear_forward / _backward (linear.c), which validated every argument. */
#include "core/cublaslt_util.h"
#include "ops/linear/internal.h"
#include "ops/linear/cuda_colsum.h"

static size_t saved_bytes(int64_t rows, int64_t in, int64_t out, lk_dtype dt) { return 0; }

static size_t workspace_bytes(const lk_linear_args *a, int backward) { return LK_LT_WORKSPACE_BYTES; }

static lk_status forward(const lk_linear_args *a, lk_ctx *ctx) {
    lk_linear_dims s = lk_linear_dims_of(a);
    void *ws = lk_arena_alloc(ctx->arena, LK_LT_WORKSPACE_BYTES);
    if (ws == NULL) return lk_error(LK_EINTERNAL, "linear: cublaslt: the workspace was not reserved");
    lk_lt_gemm_args g = {.trans_b = 1, .m = s.rows, .n = s.out, .k = s.in, .ab_dt = s.dt, .a = a->x.data,
                         .lda = s.in, .b = a->weight.data, .ldb = s.in, .alpha = 1.0f, .c_dt = s.dt,
                         .c = a->y.data, .ldc = s.out, .bias = a->bias.data};
    return lk_lt_gemm(ctx->device.index, ctx->stream, ws, LK_LT_WORKSPACE_BYTES, &g);
}

static lk_status backward(const lk_linear_args *a, lk_ctx *ctx) {
    lk_linear_dims s = lk_linear_dims_of(a);
    void *ws = lk_arena_alloc(ctx->arena, LK_LT_WORKSPACE_BYTES);
    if (ws == NULL) return lk_error(LK_EINTERNAL, "linear: cublaslt: the workspace was not reserved");
    int dev = ctx->device.index;
    lk_status st;
    if (a->dx.data) {
        lk_lt_gemm_args g = {.m = s.rows, .n = s.in, .k = s.out, .ab_dt = s.dt, .a = a->dy.data, .lda = s.out,
                             .b = a->weight.data, .ldb = s.in, .alpha = 1.0f, .c_dt = s.dt, .c = a->dx.data,
                             .ldc = s.in};
        if ((st = lk_lt_gemm(dev, ctx->stream, ws, LK_LT_WORKSPACE_BYTES, &g))) return st;
    }
    if (a->dweight.data) {
        lk_lt_gemm_args g = {.trans_a = 1, .m = s.out, .n = s.in, .k = s.rows, .ab_dt = s.dt, .a = a->dy.data,
                             .lda = s.out, .b = a->x.data, .ldb = s.in, .alpha = 1.0f, .beta = 1.0f,
                             .c_dt = a->dweight.dtype, .c = a->dweight.data, .ldc = s.in};
        if ((st = lk_lt_gemm(dev, ctx->stream, ws, LK_LT_WORKSPACE_BYTES, &g))) return st;
    }
    if (a->dbias.data)
        return lk_cuda_colsum_acc(s.dt, a->dy.data, s.rows, s.out, a->dbias.dtype, a->dbias.data, ctx->stream);
    return LK_OK;
}

const lk_linear_vtable lk_linear_cublaslt_vtable = {
    .version = LK_LINEAR_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
