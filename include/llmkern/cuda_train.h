/* cuda_train.h — the training-step kernels on CUDA beside the operators: the token
 * embedding (gather forward, deterministic scatter-add backward), multi-tensor AdamW
 * with f32 master weights for bf16 parameters, and the global gradient norm with
 * clipping. Only in builds with CUDA (LLMKERN_HAVE_CUDA); every pointer is device memory.
 *
 *   lk_arena ws = {.device = LK_DEVICE_CUDA};  lk_ctx ctx = lk_ctx_cuda(&ws, stream, 0);
 *   lk_cuda_embedding_forward(&wte, &ids, &x, &ctx);         ...  backward into dwte
 *   lk_cuda_clip_grad_norm(grads, n, 1.0, &norm, &ctx);
 *   lk_cuda_adamw_step(params, n, &hp, &ctx);
 *
 * Work is queued on ctx->stream and the workspace (small: see each function) comes
 * from ctx->arena. The embedding calls and the norm synchronize the stream once to
 * bring a result or an error flag back to the host; AdamW and the scaling do not. */
#ifndef LLMKERN_CUDA_TRAIN_H
#define LLMKERN_CUDA_TRAIN_H

#include <stdint.h>
#include "context.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- embedding ----------------------------------------------------------------------------
 * weight [V, H] f32|bf16, ids any shape of T tokens, i32|i64, out T·H elements of the
 * weight's dtype (e.g. [B, S, H]); all contiguous CUDA tensors.
 * Forward: out[t, :] = weight[ids[t], :]. An id outside [0, V) is found on the device:
 * that token's row becomes NaN and the call returns LK_EINVAL naming the first such token
 * and its id (after the stream is synchronized to read the flag). */
LK_API lk_status lk_cuda_embedding_forward(const lk_tensor *weight, const lk_tensor *ids, lk_tensor *out, lk_ctx *ctx);

/* Backward: dweight[ids[t], :] += dout[t, :], dweight [V, H] f32 or bf16 (accumulated in
 * f32 and rounded once), dout of the shape and dtype of the forward's out.
 * Deterministic: the tokens are sorted by id (a stable device radix sort), then one
 * thread per (distinct id, column group) sums its tokens in token order in f32 and adds
 * the sum to dweight once — no atomics, the same bits on every run. Bad ids are checked
 * before anything is written: LK_EINVAL and dweight untouched.
 * Workspace: 16·T bytes + the sort's temporary storage (lk_cuda_embedding_backward_workspace). */
LK_API lk_status lk_cuda_embedding_backward(const lk_tensor *dout, const lk_tensor *ids, lk_tensor *dweight, lk_ctx *ctx);
LK_API lk_status lk_cuda_embedding_backward_workspace(int64_t tokens, int64_t vocab, size_t *bytes);
/* Both without the device-side id check, which reads a flag back (a sync): for a caller
 * that checked every id itself (lk_model does, on the host), so the calls can be captured
 * in a CUDA graph. An id out of range still writes a NaN row (forward) and is left out of
 * the sums (backward); nothing names it. */
LK_API lk_status lk_cuda_embedding_forward_unchecked(const lk_tensor *weight, const lk_tensor *ids, lk_tensor *out,
                                                     lk_ctx *ctx);
LK_API lk_status lk_cuda_embedding_backward_unchecked(const lk_tensor *dout, const lk_tensor *ids, lk_tensor *dweight,
                                                      lk_ctx *ctx);

/* --- AdamW, many tensors in one launch -----------------------------------------------------
 * The math of the CPU trainer's lk_adamw_update (train.h; torch.optim.AdamW): for step t
 * >= 1, with the bias corrections folded into two scalars computed once in f64,
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;
 *   p = p (1 - lr wd) - lr/(1-b1^t) · m / (sqrt(v)/sqrt(1-b2^t) + eps)     (f32 math)
 * A bf16 parameter is updated through its f32 master copy (master updated, then rounded
 * to nearest even into param), or, with master NULL, in place by stochastic rounding
 * (train.main_params_dtype bf16); an f32 parameter in place, with master NULL. A bf16
 * moment is computed in f32 and stored by stochastic rounding, with the bits of
 * lk_sround_bits(lk_sround_tensor_key(lk_sround_step_key(hp.seed, hp.step), tensor), i, masterless)
 * (src/core/sround.h; tensor = the index in the list; m bits 0-15, v 16-31, a masterless
 * param 32-47): the CPU's lk_adamw_update draws the same. */
typedef struct {
    void *param;           /* n elements of param_dtype (f32 or bf16) */
    const void *grad;      /* n elements of grad_dtype (f32 or bf16) */
    void *m, *v;           /* n elements of m_dtype / v_dtype each: the moments, zero before step 1 */
    float *master;         /* bf16 param: n f32, equal to param before the first step, or NULL (no
                            * master: param rounded stochastically); f32 param: NULL */
    int64_t n;
    lk_dtype param_dtype, grad_dtype;
    int no_decay;          /* 1: no weight decay on this tensor (norm weights, biases) */
    lk_dtype m_dtype, v_dtype;   /* f32 (0) or bf16 */
} lk_cuda_adamw_tensor;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;          /* t >= 1: updates so far including this one */
    uint64_t seed;         /* bf16 moments: the stochastic rounding's (train.seed) */
    float grad_scale;      /* lk_cuda_adamw_step: every gradient times this (f32) as it is read, a clip's
                            * factor (lk_clip_scale: the plan's bits); 0 = 1. The plan clips itself. */
} lk_cuda_adamw_hparams;

/* Workspace: the tensor list on the device, 64·n_tensors bytes (+ alignment). */
LK_API lk_status lk_cuda_adamw_step(const lk_cuda_adamw_tensor *tensors, int n_tensors, const lk_cuda_adamw_hparams *hp,
                             lk_ctx *ctx);

/* --- global gradient norm and clipping ------------------------------------------------------ */
typedef struct {
    void *data;            /* n elements of dtype (f32 or bf16) */
    int64_t n;
    lk_dtype dtype;
} lk_cuda_buf;

/* sqrt of the sum of squares over every buffer, into *norm (host). Deterministic: each
 * block of 4096 elements is summed in f64 in a fixed order (a thread's 16, then the
 * block's tree), the per-block sums in a fixed order by one block: the same bits every run.
 * Workspace: 8 bytes a 4096-element block + the list (lk_cuda_grad_norm_workspace). */
LK_API lk_status lk_cuda_grad_norm(const lk_cuda_buf *bufs, int n_bufs, double *norm, lk_ctx *ctx);
LK_API size_t lk_cuda_grad_norm_workspace(const lk_cuda_buf *bufs, int n_bufs);

/* Every element times scale (f32 math, bf16 rounded once). */
LK_API lk_status lk_cuda_scale_bufs(const lk_cuda_buf *bufs, int n_bufs, float scale, lk_ctx *ctx);

/* torch.nn.utils.clip_grad_norm_ as the CPU's lk_clip_grad_norm: the norm into *norm,
 * and, when max_norm > 0 and norm > max_norm, every buffer scaled by
 * max_norm / (norm + 1e-6). A NaN or Inf norm is returned and nothing is scaled. */
LK_API lk_status lk_cuda_clip_grad_norm(const lk_cuda_buf *bufs, int n_bufs, double max_norm, double *norm, lk_ctx *ctx);

/* --- a whole optimizer step without the host (a CUDA graph's) -----------------------------
 * The plan holds the tensor lists in device memory (uploaded once, at create) and each
 * step's scalars in a pinned host slot copied to the device by the step itself, so
 * lk_cuda_adamw_plan_step enqueues work and never waits: the global gradient norm (the
 * f64 fixed-order sum of lk_cuda_grad_norm), the step's loss and norm appended to a log
 * on the device, then AdamW with the gradient clipped to max_norm as it is read (> 0: on;
 * the factor of lk_cuda_clip_grad_norm). The same bits as lk_cuda_clip_grad_norm then
 * lk_cuda_adamw_step, but the gradients stay unscaled in memory. From the first step whose
 * loss or norm is NaN or Inf on, no tensor changes: the weights stay those of the last good
 * step, however many steps were queued behind it.
 *   create  tensors as lk_cuda_adamw_step's (kept by pointer: they must stay where they are),
 *           hp's betas, eps and weight_decay (its lr and step are set per step), log_cap:
 *           the steps the log holds between two reads
 *   set     step t's lr and t >= 1 into a slot (0 .. LK_CUDA_PLAN_SLOTS - 1) of the pinned
 *           scalars: the slot's previous step must have completed (its copy reads the slot)
 *   step    enqueues on ctx->stream, with that slot's scalars; loss: the step's loss (a
 *           device f32, logged beside the norm; NULL logs 0)
 *   read    waits for the device, then the (loss, norm before clipping) of every step since
 *           the last read, oldest first, into loss[] and norm[] (cap entries), *n of them */
#define LK_CUDA_PLAN_SLOTS 2
typedef struct lk_cuda_adamw_plan lk_cuda_adamw_plan;
LK_API lk_status lk_cuda_adamw_plan_create(const lk_cuda_adamw_tensor *tensors, int n_tensors,
                                           const lk_cuda_adamw_hparams *hp, double max_norm, int log_cap,
                                           lk_cuda_adamw_plan **out);
LK_API lk_status lk_cuda_adamw_plan_set(lk_cuda_adamw_plan *plan, int slot, double lr, int64_t step);
LK_API lk_status lk_cuda_adamw_plan_step(lk_cuda_adamw_plan *plan, int slot, const float *loss, lk_ctx *ctx);
LK_API lk_status lk_cuda_adamw_plan_read(lk_cuda_adamw_plan *plan, double *loss, double *norm, int cap, int *n);
LK_API void lk_cuda_adamw_plan_free(lk_cuda_adamw_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
