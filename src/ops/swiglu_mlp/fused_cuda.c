/* fused_cuda.c — `fused` SwiGLU MLP on CUDA: the three products through cuBLAS (f32
 * accumulation, bf16 or f32 storage) and the activation as one fused kernel each way
 * (fused.cu), as the CPU `fused` does: the forward saves only the pre-activations gate_up
 * [T, 2I]; the backward recomputes h from them in the same kernel that writes dgate and
 * dup. Weight gradients are accumulated by the GEMMs themselves (beta = 1): into f32, or
 * into bf16 read and rounded once per call.
 *
 * Forward:  gu = x·W_guᵀ (saved) → h = act(gu) (workspace) → out = h·W_downᵀ
 * Backward: dh = dout·W_down → (dgu, h) = act'(dh, gu) → dW_down += doutᵀ·h,
 *           dW_gu += dguᵀ·x, dx = dgu·W_gu
 * Reached through lk_swiglu_mlp_forward / _backward (swiglu_mlp.c), which validated
 * every argument; the workspace comes from ctx->arena (a device arena). */
#include "core/cublas_util.h"
#include "ops/swiglu_mlp/internal.h"
#include "ops/swiglu_mlp/cuda_act.h"

static size_t saved_bytes(int64_t t, int64_t h, int64_t i, lk_dtype dt) {
    return (size_t)t * (size_t)(2 * i) * lk_dtype_size(dt);
}

/* forward: h [T, I]; backward: dh and h [T, I], dgu [T, 2I]; all in the storage dtype */
static size_t workspace_bytes(const lk_swiglu_mlp_args *a, int backward) {
    lk_swiglu_mlp_dims d = lk_swiglu_mlp_dims_of(a);
    size_t ti = lk_arena_piece((size_t)d.t * (size_t)d.i * d.es);
    return backward ? 2 * ti + lk_arena_piece((size_t)d.t * (size_t)(2 * d.i) * d.es) : ti;
}

static lk_status forward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims d = lk_swiglu_mlp_dims_of(a);
    int dev = ctx->device.index;
    void *st = ctx->stream, *gu = a->saved.data, *h = lk_arena_alloc(ctx->arena, workspace_bytes(a, 0));
    if (h == NULL) return lk_error(LK_EINTERNAL, "swiglu_mlp: fused (cuda): the workspace was not reserved");
    lk_status s = lk_cublas_gemm(dev, st, 0, 1, d.t, 2 * d.i, d.h, d.dt, a->x.data, d.h, a->gate_up_weight.data, d.h,
                                 0.0f, d.dt, gu, 2 * d.i);
    if (s || !a->out.data) return s;   /* the saved block alone: h feeds only out */
    if ((s = lk_cuda_swiglu_act_forward(d.dt, d.t, d.i, a->swiglu_limit, gu, 2 * d.i, (char *)gu + d.i * d.es, 2 * d.i,
                                        h, d.i, st)))
        return s;
    return lk_cublas_gemm(dev, st, 0, 1, d.t, d.h, d.i, d.dt, h, d.i, a->down_weight.data, d.i, 0.0f, d.dt,
                          a->out.data, d.h);
}

static lk_status backward(const lk_swiglu_mlp_args *a, lk_ctx *ctx) {
    lk_swiglu_mlp_dims d = lk_swiglu_mlp_dims_of(a);
    int dev = ctx->device.index;
    void *st = ctx->stream;
    const char *gu = a->saved.data;
    size_t ti = lk_arena_piece((size_t)d.t * (size_t)d.i * d.es);
    char *ws = lk_arena_alloc(ctx->arena, workspace_bytes(a, 1));
    if (ws == NULL) return lk_error(LK_EINTERNAL, "swiglu_mlp: fused (cuda): the workspace was not reserved");
    char *dh = ws, *h = ws + ti, *dgu = ws + 2 * ti;
    lk_status s;
    if ((s = lk_cublas_gemm(dev, st, 0, 0, d.t, d.i, d.h, d.dt, a->dout.data, d.h, a->down_weight.data, d.i, 0.0f,
                            d.dt, dh, d.i)) ||
        (s = lk_cuda_swiglu_act_backward(d.dt, d.t, d.i, a->swiglu_limit, dh, d.i, gu, 2 * d.i, gu + d.i * d.es,
                                         2 * d.i, dgu, 2 * d.i, dgu + d.i * d.es, 2 * d.i, h, d.i, st)))
        return s;
    if (a->d_down_weight.data &&
        (s = lk_cublas_gemm(dev, st, 1, 0, d.h, d.i, d.t, d.dt, a->dout.data, d.h, h, d.i, 1.0f,
                            a->d_down_weight.dtype, a->d_down_weight.data, d.i)))
        return s;
    if (a->d_gate_up_weight.data &&
        (s = lk_cublas_gemm(dev, st, 1, 0, 2 * d.i, d.h, d.t, d.dt, dgu, 2 * d.i, a->x.data, d.h, 1.0f,
                            a->d_gate_up_weight.dtype, a->d_gate_up_weight.data, d.h)))
        return s;
    return lk_cublas_gemm(dev, st, 0, 0, d.t, d.h, 2 * d.i, d.dt, dgu, 2 * d.i, a->gate_up_weight.data, d.h, 0.0f,
                          d.dt, a->dx.data, d.h);
}

const lk_swiglu_mlp_vtable lk_swiglu_mlp_cuda_fused_vtable = {
    .version = LK_SWIGLU_MLP_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
