/* moe.h — the mixture-of-experts block of Qwen3-MoE / DeepSeek-V3: the router (which
 * experts each token takes, with what weight, and the auxiliary load-balancing loss)
 * and the experts (a SwiGLU MLP per expert, each token's k outputs summed with the
 * routing weights), both on the CPU and on CUDA.
 *
 * Router (op moe_router, config field moe.router), T tokens, hidden H, E experts:
 *   logits = hidden · gate_weightᵀ                               [T, E]
 *   softmax_topk:  p = softmax(logits); ids = top-k of p; w = p[ids]
 *                  (norm_topk_prob: w /= Σw — Qwen3-MoE; softmax_after_topk: softmax of
 *                  the k chosen logits, which is the same function)
 *   sigmoid_bias:  s = sigmoid(logits); the choice uses s + e_bias (DeepSeek-V3's
 *                  correction bias: it changes which experts, never the weights) within
 *                  the topk_group best of n_group groups; w = s[ids] (normalized if asked)
 *   fake_balanced: no weight at all. noise 0: token t takes experts (t·k + j) mod E with
 *                  weight 1/k. noise > 0: weights (1-noise)/k + noise·r/Σr, experts the
 *                  top-k of uniform scores plus a per-expert bias N(0, 1)·0.1·noise, all
 *                  drawn from a generator seeded by a hash of the whole hidden tensor, so
 *                  the same input (a recompute) always routes the same way.
 *   every weight is then multiplied by route_scale.
 *   aux_loss = E/(T·k) · Σ_e count_e · P_e, count_e = routes to e, P_e = the mean over
 *   tokens of the per-token normalized scores (softmax p; s/Σs for sigmoid; the routing
 *   fractions for fake_balanced). 1 at perfect balance. The caller scales it (its
 *   coefficient goes into d_aux_loss). T, count_e and P_e are over the tokens of every
 *   rank of ctx->comm (the sequence-parallel group, whose ranks hold slices of the same
 *   sequences; NULL = this call's tokens), so an SP rank's aux loss and gradient are the
 *   single-process ones; every rank of the group makes the same call.
 * Backward: from d_topk_weights (and d_aux_loss) through the selected weights and the
 *   softmax / sigmoid to the logits, then d_hidden is WRITTEN and d_gate_weight is
 *   ACCUMULATED. The choice itself has no gradient; fake_balanced writes d_hidden = 0.
 *
 * Experts (op moe_experts, config field moe_implementation): route r = (t, j) sends
 *   hidden[t] to expert e = ids[t, j]:  y_r = (silu(x Wg_eᵀ) · x Wu_eᵀ) · Wd_eᵀ
 *   out[t] = Σ_j w[t, j] · y_(t, j)
 * Weights stacked (the transformers 5 layout): gate_up_weight [E, 2I, H] (rows 0..I-1 of
 *   expert e are gate_proj, I..2I-1 up_proj), down_weight [E, H, I]. lk_moe_stack_weights
 *   and lk_moe_unstack_weights convert from and to the per-expert tensors of the hub
 *   checkpoints (mlp.experts.{e}.{gate,up,down}_proj.weight).
 * Backward: d_hidden and d_topk_weights WRITTEN; d_gate_up_weight, d_down_weight
 *   ACCUMULATED (+=) into f32 or the weights' dtype, as linear.h and swiglu_mlp.h do —
 *   or, with write_weight_grads, WRITTEN (every expert's slice; zeros for an expert
 *   without a route), as PyTorch's first backward into a .grad of None: a trainer's
 *   first micro-batch, whose gradients then need no zeroing pass (most of a MoE model's
 *   parameters are its experts) and no read of the old values.
 *   Experts with no token and a token routed twice to one expert are ordinary input.
 * Implementations: eager (a loop over experts: find, gather, two GEMMs, scatter-add, as
 *   the per-expert modules run under autograd), fused (one stable counting-sort
 *   permutation into expert-sorted rows, grouped GEMMs over each expert's rows, weights
 *   folded into the activation, one f32 un-permute sum over the k routes). */
#ifndef LLMKERN_MOE_H
#define LLMKERN_MOE_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- router ---------------------------------------------------------------------- */

typedef struct {
    lk_tensor hidden;           /* [T, H], contiguous, f32 or bf16 */
    lk_tensor gate_weight;      /* [E, H], f32 or dtype of hidden; data may be NULL for fake_balanced (E from n_experts) */
    lk_tensor e_bias;           /* [E] f32, sigmoid_bias only; data NULL = no bias */
    lk_tensor topk_ids;         /* forward output [T, k] i32 */
    lk_tensor topk_weights;     /* forward output [T, k] f32 */
    lk_tensor aux_loss;         /* forward output [1] f32; data NULL = not wanted */
    lk_tensor d_topk_weights;   /* backward input [T, k] f32 */
    float d_aux_loss;           /* backward input: d loss / d aux_loss (the aux coefficient) */
    lk_tensor d_hidden;         /* backward output, WRITTEN: shape and dtype of hidden */
    lk_tensor d_gate_weight;    /* ACCUMULATED: [E, H], f32 or dtype of gate_weight; data NULL = not wanted */
    lk_saved saved;             /* written by forward, read by backward: lk_moe_router_saved_bytes */
    int n_experts;              /* E: must equal gate_weight's rows when it is given */
    int top_k;                  /* 1 <= k <= E */
    int norm_topk_prob;         /* renormalize the k weights to sum 1 */
    int softmax_after_topk;     /* softmax_topk: softmax over the k chosen logits */
    int n_group, topk_group;    /* sigmoid_bias: 0/0 or 1/1 = no groups; else E % n_group == 0,
                                   1 <= topk_group <= n_group, k <= topk_group·E/n_group */
    float route_scale;          /* 0 means 1 */
    float noise;                /* fake_balanced: in [0, 1] */
    int gate_f32;               /* gate_precision f32: logits kept in f32 (else rounded to hidden's dtype) */
} lk_moe_router_args;

#define LK_MOE_ROUTER_VTABLE_VERSION 1

typedef struct {
    int version;
    size_t (*saved_bytes)(int64_t tokens, int64_t experts, int64_t top_k);
    size_t (*workspace_bytes)(const lk_moe_router_args *a, int backward);
    lk_status (*forward)(const lk_moe_router_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_moe_router_args *a, lk_ctx *ctx);
} lk_moe_router_vtable;

/* Facade: validates every argument (impl, shapes, dtypes, k <= E, noise in [0, 1], the
 * group options, saved size, overlaps) before anything is written, reserves workspace in
 * ctx->arena. Errors LK_EINVAL, LK_ESHAPE, LK_EDTYPE, LK_EDEVICE; lk_last_error() names
 * the argument. */
LK_API lk_status lk_moe_router_saved_bytes(const lk_impl *impl, int64_t tokens, int64_t experts, int64_t top_k,
                                    size_t *bytes);
LK_API lk_status lk_moe_router_forward(const lk_impl *impl, const lk_moe_router_args *a, lk_ctx *ctx);
LK_API lk_status lk_moe_router_backward(const lk_impl *impl, const lk_moe_router_args *a, lk_ctx *ctx);

/* --- experts --------------------------------------------------------------------- */

typedef struct {
    lk_tensor hidden;           /* [T, H], contiguous, f32 or bf16 */
    lk_tensor topk_ids;         /* [T, k] i32, each in [0, E) */
    lk_tensor topk_weights;     /* [T, k] f32 */
    lk_tensor gate_up_weight;   /* [E, 2I, H], dtype of hidden */
    lk_tensor down_weight;      /* [E, H, I], dtype of hidden */
    lk_tensor out;              /* forward output: shape and dtype of hidden; data NULL = the saved block
                                 * alone (a recompute's forward again: the backward never reads out) */
    lk_tensor dout;             /* backward input: shape and dtype of hidden */
    lk_tensor d_hidden;         /* backward output, WRITTEN: shape and dtype of hidden */
    lk_tensor d_topk_weights;   /* backward output, WRITTEN: [T, k] f32; data NULL = not wanted */
    lk_tensor d_gate_up_weight; /* ACCUMULATED: [E, 2I, H], f32 or dtype of hidden; data NULL = not wanted */
    lk_tensor d_down_weight;    /* ACCUMULATED: [E, H, I], f32 or dtype of hidden; data NULL = not wanted */
    lk_saved saved;             /* lk_moe_experts_saved_bytes */
    int write_weight_grads;     /* 1: the two weight gradients WRITTEN instead of accumulated (above) */
} lk_moe_experts_args;

#define LK_MOE_EXPERTS_VTABLE_VERSION 1

typedef struct {
    int version;
    /* T tokens, k routes each, E experts, hidden H, expert FFN I. */
    size_t (*saved_bytes)(int64_t tokens, int64_t top_k, int64_t experts, int64_t hidden, int64_t inter,
                          lk_dtype dt);
    size_t (*workspace_bytes)(const lk_moe_experts_args *a, int backward);
    lk_status (*forward)(const lk_moe_experts_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_moe_experts_args *a, lk_ctx *ctx);
} lk_moe_experts_vtable;

/* Facade: validates every argument (expert ids in range included) before anything is
 * written. Errors LK_EINVAL, LK_ESHAPE, LK_EDTYPE, LK_EDEVICE. On a GPU topk_ids is device
 * memory nothing reads on the host (no sync, so a layer can be captured in a CUDA graph):
 * the CUDA `fused` row checks the ids on the device, and an id outside [0, E) makes out
 * (forward) and d_hidden, d_topk_weights and the touched weight gradients (backward) NaN,
 * every element, instead of an error status. */
LK_API lk_status lk_moe_experts_saved_bytes(const lk_impl *impl, int64_t tokens, int64_t top_k, int64_t experts,
                                     int64_t hidden, int64_t inter, lk_dtype dt, size_t *bytes);
LK_API lk_status lk_moe_experts_forward(const lk_impl *impl, const lk_moe_experts_args *a, lk_ctx *ctx);
LK_API lk_status lk_moe_experts_backward(const lk_impl *impl, const lk_moe_experts_args *a, lk_ctx *ctx);

/* --- weight layouts ---------------------------------------------------------------- */

/* Per-expert tensors (hub naming) into the stacked layout: gate[e], up[e] [I, H] and
 * down[e] [H, I], all of one float dtype, copied into gate_up [E, 2I, H] and down_stacked
 * [E, H, I] of the same dtype. Nothing is written unless every shape and dtype agrees. */
LK_API lk_status lk_moe_stack_weights(int n_experts, const lk_tensor *gate, const lk_tensor *up, const lk_tensor *down,
                               lk_tensor *gate_up, lk_tensor *down_stacked);
/* The reverse: the stacked tensors copied out into per-expert tensors. */
LK_API lk_status lk_moe_unstack_weights(int n_experts, const lk_tensor *gate_up, const lk_tensor *down_stacked,
                                 lk_tensor *gate, lk_tensor *up, lk_tensor *down);

#ifdef __cplusplus
}
#endif
#endif
