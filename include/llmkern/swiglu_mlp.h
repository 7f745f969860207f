/* swiglu_mlp.h — the SwiGLU MLP of Qwen3 / Llama (no biases), forward and backward:
 *   gate, up = x · W_gateᵀ, x · W_upᵀ          (W_gate, W_up stored fused: gate_up_weight)
 *   out      = (silu(gate) · up) · W_downᵀ
 * With swiglu_limit L > 0 (GPT-OSS's clamp): gate = min(gate, L), up = clamp(up, −L, L),
 * and the gradient through a clamped element is zero.
 * Backward: dx is WRITTEN; d_gate_up_weight and d_down_weight are ACCUMULATED (+=) into
 * the caller's buffers, f32 or the weights' dtype (bf16 summed in an f32 temporary and
 * rounded once per call), as linear.h does. Implementations: eager (two GEMMs and every
 * intermediate materialized, as autograd runs it), fused (one gate_up GEMM, activation
 * fused, only the pre-activations saved, tokens in chunks). */
#ifndef LLMKERN_SWIGLU_MLP_H
#define LLMKERN_SWIGLU_MLP_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_tensor x;                /* [..., H], contiguous, f32 or bf16; T = product of the leading dims */
    lk_tensor gate_up_weight;   /* [2I, H], dtype of x: rows 0..I-1 gate_proj.weight, I..2I-1 up_proj.weight */
    lk_tensor down_weight;      /* [H, I], dtype of x */
    lk_tensor out;              /* forward output: shape and dtype of x; data NULL = the saved block alone
                                 * (a recompute's forward again: the backward never reads out) */
    lk_tensor dout;             /* backward input: shape and dtype of x */
    lk_tensor dx;               /* backward output, WRITTEN: shape and dtype of x */
    lk_tensor d_gate_up_weight; /* ACCUMULATED: [2I, H], f32 or dtype of x; data NULL = not wanted */
    lk_tensor d_down_weight;    /* ACCUMULATED: [H, I], f32 or dtype of x; data NULL = not wanted */
    lk_saved saved;             /* written by forward, read by backward: lk_swiglu_mlp_saved_bytes */
    float swiglu_limit;         /* 0 = off; > 0 clamps gate above and up on both sides */
} lk_swiglu_mlp_args;

#define LK_SWIGLU_MLP_VTABLE_VERSION 1

typedef struct {
    int version;
    /* Bytes the forward keeps for the backward (T tokens, hidden H, intermediate I). */
    size_t (*saved_bytes)(int64_t tokens, int64_t hidden, int64_t inter, lk_dtype dt);
    /* Scratch bytes a pass needs from ctx->arena (given back when it returns); depends on
     * the gradient dtypes and which are wanted, hence the whole args. */
    size_t (*workspace_bytes)(const lk_swiglu_mlp_args *a, int backward);
    lk_status (*forward)(const lk_swiglu_mlp_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_swiglu_mlp_args *a, lk_ctx *ctx);
} lk_swiglu_mlp_vtable;

/* The facade: validates every argument before anything is written, reserves the
 * workspace in ctx->arena, and calls impl. Errors: LK_EINVAL (impl, NULL data, a bad
 * swiglu_limit, saved too small, overlapping outputs), LK_ESHAPE, LK_EDTYPE, LK_EDEVICE;
 * lk_last_error() names the argument. */
LK_API lk_status lk_swiglu_mlp_saved_bytes(const lk_impl *impl, const lk_tensor *x, const lk_tensor *gate_up_weight,
                                    size_t *bytes);
/* The arena bytes a pass of these args needs (the facade reserves them itself). */
LK_API lk_status lk_swiglu_mlp_workspace_bytes(const lk_impl *impl, const lk_swiglu_mlp_args *a, int backward,
                                        size_t *bytes);
LK_API lk_status lk_swiglu_mlp_forward(const lk_impl *impl, const lk_swiglu_mlp_args *a, lk_ctx *ctx);
LK_API lk_status lk_swiglu_mlp_backward(const lk_impl *impl, const lk_swiglu_mlp_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
