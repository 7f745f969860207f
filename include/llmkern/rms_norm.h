/* rms_norm.h — RMSNorm, forward and backward:
 *   y = x · rstd · (offset + w),   rstd = 1 / sqrt(mean(x²) + eps)   over the last dim.
 * Implementations: eager (each step its own pass, in the input dtype), eager_fp32 (the
 * same steps in f32), fused (one pass each way). All share this calling convention.
 *
 * The residual mode (residual.data set): the pre-norm residual stream of a decoder
 * carried in f32 while the activations are bf16 (Liger's and vLLM's fused_add_rms_norm,
 * with the backward's half too):
 *   forward:  residual += delta (f32 sum; no delta: nothing added); x = residual rounded
 *             to x's dtype (x is WRITTEN: the copy the backward reads); then the norm of
 *             the f32 residual itself, y = round(residual · rstd · (offset + w)) with rstd
 *             of the f32 values, as autocast's norm reads the f32 stream (issue 17: the
 *             norm of the rounded x was the last known difference). With norm_of_x set,
 *             the norm of the written x instead: the bits a plain forward on the kept x
 *             gives, which a recompute from x runs (the model sets it when it recomputes).
 *   backward: reads only the kept x and the saved rstd: dx and dweight are the formulas
 *             above at x̂ = x·rstd, i.e. the forward's rstd (of the f32 stream, unless
 *             norm_of_x) with the rounded x — the exact gradient of the norm of x only
 *             with norm_of_x; without it the f32 values the forward normalized are gone
 *             (the residual then holds the gradient stream). dx is kept in f32, then
 *             residual += dx (the stream's f32 gradient); dx = residual rounded to x's
 *             dtype (the copy the next GEMM reads as its dy).
 * Every implementation runs it: the fused rows in their one pass, the eager rows as a
 * pass of their own before the forward's steps and after the backward's (dx rounded to
 * the intermediate dtype before it is added). The eager rows' steps take the stream in
 * their intermediate dtype: eager_fp32 the f32 residual, eager in x's dtype its
 * rounding, which is x (bf16 steps cannot see the f32 bits). In f32 the residual and x
 * are the same values: the mode is the plain norm of x, bit for bit, either way.
 *
 * The stream in x's dtype (residual bf16 beside bf16 x: what a bf16 model carries, and
 * Megatron without fp32_residual_connection; the trainer's
 * train.fp32_residual_connection: false):
 * the stream is x itself and the residual is only READ, never written:
 *   forward:  x = round(residual + delta) (an f32 add, rounded once; no delta: x = residual),
 *             then the plain norm of that x (norm_of_x is implied);
 *   backward: dx = round(residual + dx_norm) with dx_norm the norm's dx in f32.
 * residual may be x itself (forward) or dx itself (backward): each element is read
 * before the same element is written. Six bytes an element less than the f32 stream
 * each way (the f32 stream read and written, beside x or dx).
 *
 * The weight may be f32 while x is bf16 (the f32 master weight of bf16 training, as
 * autocast multiplies by it; issue 17: the bf16 rounding of a norm weight near 1 moved
 * a whole channel of every token, most of the bf16-vs-f32 loss gap). The product
 * x̂·(offset + w) is then f32 and y rounded once; dweight is f32 too (the weight's
 * dtype), summed over the rows in f32 and never rounded to bf16. Every implementation
 * runs it (eager: x̂ in bf16 as its steps keep it, times the f32 weight).
 *
 * RoPE after the norm (rope set; Qwen3's q_norm / k_norm and then its rotary embedding,
 * one pass over q and k each way where two were: issue 17): x is [T, H, n] (token, head,
 * head dim) and every head of token t is rotated over all n dims (rotate-half, rope.h) by
 * the angle of position_ids[t]. y is the norm's output rounded to x's dtype, then rotated
 * and rounded again: the bits of this forward followed by the `fused` RoPE of the same
 * device. The backward rotates dy back first (rounded to its dtype, as that RoPE's
 * backward stores it), then runs the norm's. Taken by the implementations
 * lk_rms_norm_takes_rope names (the fused rows; CUDA's for rows of 2-32 16-byte accesses
 * a power of two, a head's 64-256 bf16); not in the residual mode. */
#ifndef LLMKERN_RMS_NORM_H
#define LLMKERN_RMS_NORM_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_tensor cos, sin;     /* f32 [max_pos, n/2], contiguous: lk_rope_tables with rotary_dim n */
    lk_tensor position_ids; /* [T], i32 or i64, each in [0, max_pos). On CUDA the facade cannot read
                             * them: a token whose id is out of range gets NaN (as the fused RoPE) */
} lk_rms_norm_rope;

typedef struct {
    lk_tensor x;            /* [..., n], f32 or bf16: contiguous, or a view whose last dim is
                             * contiguous and whose leading dims fold into at most two strided
                             * levels (a decoder's heads read out of the q/k/v projection, or
                             * written head-major); not in the residual mode */
    lk_tensor weight;       /* [n], dtype of x or f32; data NULL = no weight */
    lk_tensor y;            /* forward output: shape and dtype of x; a view as x may be */
    lk_tensor dy;           /* backward input: shape and dtype of x; a view as x may be */
    lk_tensor dx;           /* backward output: shape and dtype of x; a view; may be dy (inplace_dx) */
    lk_tensor dweight;      /* backward output [n], dtype of weight; data NULL = not wanted */
    lk_saved saved;         /* written by forward, read by backward: lk_rms_norm_saved_bytes */
    double eps;             /* > 0 */
    float weight_offset;    /* 0: y = x̂·w;  1: y = x̂·(1 + w), Gemma's convention */
    int inplace_dx;         /* 1: dx is written over dy, and dx.data must equal dy.data */
    lk_tensor residual;     /* the residual mode: f32, shape of x, read and written; or of x's dtype
                             * when x is bf16 (the stream in x's dtype, above: read only); data NULL = off */
    lk_tensor delta;        /* the residual mode's forward: shape and dtype of x, added into residual
                             * first; data NULL = nothing added */
    int norm_of_x;          /* the residual mode's forward: 1 = normalize the written x (the stream
                             * rounded), as a recompute from the kept x does; 0 = the f32 stream */
    const lk_rms_norm_rope *rope;   /* RoPE after the norm (above); NULL = none */
} lk_rms_norm_args;

#define LK_RMS_NORM_VTABLE_VERSION 4

typedef struct {
    int version;
    /* Bytes the forward keeps for the backward. */
    size_t (*saved_bytes)(int64_t rows, int64_t n, lk_dtype dt);
    /* Scratch bytes a pass needs from ctx->arena (given back when it returns). */
    size_t (*workspace_bytes)(int64_t rows, int64_t n, lk_dtype dt, int backward);
    lk_status (*forward)(const lk_rms_norm_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_rms_norm_args *a, lk_ctx *ctx);
    /* Version 2: 1 when x, y, dy and dx may be strided views (lk_rms_norm_args.x); the
     * facade refuses a view to an implementation without it. */
    int takes_views;
    /* Version 3: 1 when it takes rope (lk_rms_norm_args.rope); the facade refuses rope
     * to an implementation without it. */
    int takes_rope;
    /* Version 4: with takes_rope, whether it rotates rows of n elements of dt (x's rows
     * 16-byte aligned); NULL: every row. A caller that may fall back (the model's separate
     * RoPE) asks before it passes rope, so no run fails on a head dim the kernels lack. */
    int (*takes_rope_rows)(int64_t n, lk_dtype dt);
} lk_rms_norm_vtable;

/* The facade: validates every argument before anything is written, reserves the
 * workspace in ctx->arena, and calls impl. */
LK_API lk_status lk_rms_norm_saved_bytes(const lk_impl *impl, const lk_tensor *x, size_t *bytes);
/* 1 when impl (an rms_norm implementation) takes strided views of x, y, dy and dx: the
 * fused rows do; the eager ones, the unfused baseline, take contiguous tensors. */
LK_API int lk_rms_norm_takes_views(const lk_impl *impl);
/* 1 when impl rotates its output by RoPE (lk_rms_norm_args.rope): the fused rows. */
LK_API int lk_rms_norm_takes_rope(const lk_impl *impl);
/* 1 when impl rotates rows of n elements of dt by RoPE (16-byte aligned rows): the CPU's
 * fused row every n, CUDA's rows of 2-32 16-byte accesses a power of two. */
LK_API int lk_rms_norm_takes_rope_rows(const lk_impl *impl, int64_t n, lk_dtype dt);
LK_API lk_status lk_rms_norm_forward(const lk_impl *impl, const lk_rms_norm_args *a, lk_ctx *ctx);
LK_API lk_status lk_rms_norm_backward(const lk_impl *impl, const lk_rms_norm_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
