/* linear.h — a dense layer, forward and backward:
 *   y[T, O] = x[T, I] · W[O, I]ᵀ (+ b[O])          x may have leading dims: T is their product
 *   dx = dy · W  (written),  dW += dyᵀ · x,  db += Σ_rows dy  (ACCUMULATED)
 * Gradients of the parameters are added to what the caller's buffers hold, as a
 * framework's .grad is: zero them before the first micro-batch. They may be f32 (the
 * usual master-gradient buffer) or the parameter's dtype; a bf16 gradient is summed in
 * an f32 temporary and rounded once per call. Implementation: blas (the CPU GEMM). */
#ifndef LLMKERN_LINEAR_H
#define LLMKERN_LINEAR_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_tensor x;            /* [..., I], contiguous, f32 or bf16 */
    lk_tensor weight;       /* [O, I], dtype of x */
    lk_tensor bias;         /* [O], dtype of x; data NULL = no bias */
    lk_tensor y;            /* forward output [..., O] (x's leading dims), dtype of x */
    lk_tensor dy;           /* backward input: shape and dtype of y */
    lk_tensor dx;           /* backward output, WRITTEN: shape and dtype of x; data NULL = not wanted */
    lk_tensor dweight;      /* backward output, ACCUMULATED: [O, I], f32 or dtype of weight; NULL = not wanted */
    lk_tensor dbias;        /* backward output, ACCUMULATED: [O], f32 or dtype of bias; NULL data unless
                               there is a bias and its gradient is wanted */
    lk_saved saved;         /* linear keeps nothing (x and weight are the caller's): 0 bytes */
} lk_linear_args;

#define LK_LINEAR_VTABLE_VERSION 1

typedef struct {
    int version;
    /* Bytes the forward keeps for the backward. */
    size_t (*saved_bytes)(int64_t rows, int64_t in, int64_t out, lk_dtype dt);
    /* Scratch bytes a pass needs from ctx->arena (given back when it returns); depends
     * on the dtypes and on which gradients are wanted, hence the whole args. */
    size_t (*workspace_bytes)(const lk_linear_args *a, int backward);
    lk_status (*forward)(const lk_linear_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_linear_args *a, lk_ctx *ctx);
} lk_linear_vtable;

/* The facade: validates every argument before anything is written, reserves the
 * workspace in ctx->arena, and calls impl. Errors: LK_EINVAL (impl, NULL data, options,
 * overlapping outputs), LK_ESHAPE, LK_EDTYPE, LK_EDEVICE; lk_last_error() names the argument. */
LK_API lk_status lk_linear_saved_bytes(const lk_impl *impl, const lk_tensor *x, const lk_tensor *weight, size_t *bytes);
/* The arena bytes a pass of these args needs (the facade reserves them itself). */
LK_API lk_status lk_linear_workspace_bytes(const lk_impl *impl, const lk_linear_args *a, int backward, size_t *bytes);
LK_API lk_status lk_linear_forward(const lk_impl *impl, const lk_linear_args *a, lk_ctx *ctx);
LK_API lk_status lk_linear_backward(const lk_impl *impl, const lk_linear_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
