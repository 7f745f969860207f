/* model.h — the model families llmkern builds. Register one with lk_model_register()
 * before lk_model_build(cfg, "qwen3", &table). */
#ifndef LLMKERN_MODEL_H
#define LLMKERN_MODEL_H

#include "data.h"
#include "hf_config.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

LK_API extern const lk_model_family lk_family_qwen3;       /* dense Qwen3 */
LK_API extern const lk_model_family lk_family_qwen3_moe;   /* Qwen3-MoE */


/* --- the Qwen3 / Qwen3-MoE model (src/model/qwen3.c) ------------------------------
 *
 *   lk_model *m;
 *   lk_model_create(&cfg, &table, seed, 0, &m);      // table from lk_model_build
 *   lk_model_zero_grad(m);
 *   lk_model_forward_backward(m, &batch, 1.0f, &st);  // grads += d(loss)
 *   for (int i = 0; i < lk_model_param_count(m); i++) lk_model_param(m, i)->grad ...
 *
 * f32, or bf16 with f32 master weights (lk_model_set_dtype), on the CPU or a GPU.
 * Attention runs over the batch's B*S tokens as one varlen row (B = 1) with its
 * cu_seqlens: causal within each packed document. The loss is the mean
 * cross-entropy over the labels that are not -100, plus router_aux_loss_coef times the
 * MoE aux loss (the mean over MoE layers of the router op's per-layer loss, 1 at
 * perfect balance). Parameters are the tensors of the published checkpoints, in the
 * order of lk_qwen3_tensor_list; gate/up projections (and a MoE layer's experts) are
 * views into the fused buffers the ops take. */


typedef struct {                 /* one trainable tensor, f32 master copy on the CPU */
    char name[128];              /* the Hugging Face tensor name, e.g. "model.layers.0.mlp.gate_proj.weight" */
    lk_tensor value;             /* f32, contiguous */
    lk_tensor grad;              /* f32, same shape; accumulated by lk_model_forward_backward */
} lk_param;

typedef struct {
    double loss;                 /* mean cross-entropy over the batch's valid tokens (not including aux) */
    double aux_loss;             /* MoE load-balancing loss (0 for dense) */
    int64_t n_tokens;            /* valid (non-ignored) label tokens */
} lk_step_stats;

typedef struct lk_model lk_model;   /* opaque */

/* Builds a model for cfg whose modules call the implementations bound in ops
 * (lk_model_build's table for family "qwen3" or "qwen3_moe" as cfg->moe says: a module
 * with an override uses its own binding). Weights initialised from seed (normal, std
 * cfg->initializer_range; norms at 1). recompute: 1 = recompute each layer's
 * activations in the backward instead of keeping them. Errors: LK_EINVAL (a bad
 * config, a table of the other family), LK_EUNAVAILABLE (a module whose op has no
 * implementation in this build, or one the model cannot drive), LK_ENOMEM. */
LK_API lk_status lk_model_create(const lk_qwen3_config *cfg, const lk_op_table *ops, uint64_t seed,
                          int recompute, lk_model **out);
LK_API void lk_model_free(lk_model *m);
/* 1 when a layer bound to these rotates q and k inside their norms (rms_norm.h's rope: one
 * pass over q and k each way where two were, the bits of the norms and then RoPE): both
 * norms take views and rope on rows of head_dim elements of dt (lk_rms_norm_takes_rope_rows;
 * head_dim 0: not asked), and RoPE is the `fused` row, whose arithmetic theirs is. Else the
 * layer runs RoPE on its own. `llmkern explain` says so under its table. */
LK_API int lk_model_rope_in_norms(const lk_impl *q_norm, const lk_impl *k_norm, const lk_impl *rope, int64_t head_dim,
                                  lk_dtype dt);
/* The compute dtype (f32 at create): LK_BF16 runs every op on bf16 weights and
 * activations (mixed precision) while the parameters' values stay the f32 master
 * (lk_param) and the gradients f32 (or bf16: lk_model_set_grad_dtype): each forward first
 * rounds the master into a bf16 copy of the weights (one pass, skipped where an optimizer
 * wrote the copy as well: lk_model_copy_is_current below), the ops keep norms, softmax and the loss in f32 inside their kernels and accumulate
 * the weight gradients in f32. Call before the first step (or between steps: the
 * activations are re-made). Errors (the model unchanged): LK_EDTYPE (not f32 or bf16, a
 * module whose implementation does not take it, named, or f32 under a bf16 master), LK_ENOMEM. */
LK_API lk_status lk_model_set_dtype(lk_model *m, lk_dtype dt);
/* The bf16 compute copy of parameter i (device memory, beside the f32 master at the same
 * index), or NULL when the model computes in f32 (the master is the copy) or keeps its
 * weights in bf16 alone (lk_model_set_master_dtype: the values are the copy). An optimizer
 * that writes the copy along with the master (the master rounded to nearest even) calls
 * lk_model_copy_is_current before the next forward, which then skips its rounding pass:
 * for that one forward only, so a master changed any other way is rounded as before. */
LK_API void *lk_model_param_copy(lk_model *m, int i);
/* Where the parameters' values live: LK_F32 (at create), the f32 master above; or LK_BF16
 * (train.main_params_dtype), only in a bf16 model: the compute copy becomes the values
 * themselves and the f32 master is freed, 4 bytes a parameter less (every lk_param's value
 * is then a bf16 view, lk_model_param_copy NULL, norms and the embedding read bf16; an
 * optimizer rounds its updates stochastically, lk_adamw_hparams.p_dtype). The values are
 * kept (rounded to nearest even into bf16; widened exactly back). Saves, loads and inits go
 * through f32 host copies. Errors (the model unchanged): LK_EDTYPE (not f32 or bf16, or bf16
 * on an f32 model), LK_ENOMEM. */
LK_API lk_status lk_model_set_master_dtype(lk_model *m, lk_dtype dt);
LK_API lk_dtype lk_model_master_dtype(const lk_model *m);
/* The gradients' dtype: LK_F32 (at create), or LK_BF16 (train.main_grads_dtype), only in a
 * bf16 model: every op writes or adds its weights' gradient in bf16 (summed in f32 inside
 * the op and rounded once as it lands; two ops adding into one gradient, a tied embedding's
 * loss head and gather, round twice), 2 bytes a parameter less, and the optimizer reads them
 * in bf16. Micro-batches would then sum in bf16 (the trainer refuses grad_accum > 1). The
 * gradients become zero. Errors (the model unchanged): LK_EDTYPE (not f32 or bf16, or bf16
 * on an f32 model), LK_ENOMEM. */
LK_API lk_status lk_model_set_grad_dtype(lk_model *m, lk_dtype dt);
LK_API lk_dtype lk_model_grad_dtype(const lk_model *m);
LK_API void lk_model_copy_is_current(lk_model *m);
LK_API lk_dtype lk_model_dtype(const lk_model *m);
/* On: every attention backward runs its ordered path (lk_attention_args.deterministic), so
 * a step gives the same bits on every run; off (the default): a GPU row may add dQ with
 * atomics. Call between steps: a change lays the activations out again (where v lies may
 * change: lk_model_set_keep_qk). */
LK_API void lk_model_set_deterministic(lk_model *m, int on);
/* On: each layer keeps its q/k/v projection's output ([T, Q + 2K] in the model's dtype) for
 * the backward, whose q_norm / k_norm read q and k there; off (the default): the backward
 * makes q and k again by a GEMM from the kept h1 (layer.c). On spends layers x T x (Q + 2K)
 * elements of activations (v's columns too: one GEMM writes all three) to save that GEMM,
 * 2·T·H·(Q + K) FLOPs a layer; the gradients are the same up to that GEMM's summation order.
 * Where attention takes strided views (lk_attention_takes_views: flash_attention_3 on a
 * Hopper in bf16, not deterministic) it reads v in those columns, and the layer keeps no
 * head-major copy of v: T x K elements of the keep given back. Call between steps: the
 * activations are made again. */
LK_API lk_status lk_model_set_keep_qk(lk_model *m, int on);
/* On (the default): a bf16 model carries its residual stream in f32, as autocast over f32
 * weights does (each norm adds its branch in f32 and normalizes the f32 sum; qwen3_internal.h).
 * Off: in bf16, as transformers' bf16 model and Megatron without fp32_residual_connection
 * carry it: each sum rounded to bf16 where the layer keeps it (x, x2), the gradient's stream
 * bf16 too; ~12 bytes an element a layer less memory traffic each way (issue 17). No effect
 * on an f32 model. Call between steps: the scratch changes. */
LK_API lk_status lk_model_set_fp32_residual(lk_model *m, int on);
/* Recompute, each in the first n layers (0 .. num_hidden_layers; 0: none):
 *   layers  the whole layer made again in the backward from its kept input (Megatron's
 *           recompute_method block with recompute_num_layers n; create's recompute flag:
 *           all of them, or none): one layer block less a recomputed layer (its x2 stays),
 *           for its forward again
 *   norms   the layer keeps neither norm's output (h1 = rms(x), h2 = rms(x2)); the backward
 *           makes each again from the kept x and x2 (Megatron's recompute_modules layernorm):
 *           two T x H activations less for two norm passes
 *   moe     a MoE layer keeps no experts' saved block (their gate/up output, T x k x 2I); the
 *           backward runs their forward again to make it (Megatron's recompute_modules moe; the
 *           routing stays kept): the largest MoE activation, for the experts' forward again.
 *           Nothing under expert parallelism, whose dispatcher keeps nothing anyway.
 *   qkv     the layer keeps no q, k, v after their head norms and RoPE (attention's inputs,
 *           T x (Q + 2K)); the backward makes them again from the q/k/v projection, the kept
 *           one (lk_model_set_keep_qk) or the forward's GEMM again, which the head norms'
 *           backward then reads instead of a GEMM of their own (the GQA counterpart of
 *           Megatron's recompute_modules mla_up_proj): with keep_qk the gradients are bit for
 *           bit the keeping model's, without it those of the model that keeps the projection.
 * A layer made again whole makes its norms, experts and q, k, v again too. Any recompute of layers or
 * norms makes every layer's residual-mode norms normalize the stream's rounding x (so a
 * norm made again from x gives the forward's bits: qwen3_internal.h); the gradients are
 * then bit for bit those of the model that keeps everything and normalizes so. Call between
 * steps: the activations are made again. Errors: LK_EINVAL (n out of range). */
LK_API lk_status lk_model_set_recompute_layers(lk_model *m, int n);
LK_API lk_status lk_model_set_recompute_norms(lk_model *m, int n);
LK_API lk_status lk_model_set_recompute_moe(lk_model *m, int n);
LK_API lk_status lk_model_set_recompute_qkv(lk_model *m, int n);
LK_API int lk_model_recompute_layers(const lk_model *m);
/* The LM head's chunk budget: bytes of f32 logits one chunk of tokens may take
 * (lk_cross_entropy_args.chunk_bytes; 0, the default: the op's, 4 GiB on a GPU). A chunk's
 * logits are the fused loss's largest buffer (bf16 logits take half the budget); a smaller
 * one reads and writes the f32 dW accumulator (V x H x 4 bytes) once more a chunk, and below
 * that accumulator's size the op takes its lean path (the logits made twice). Call between
 * steps: the activations are made again. */
LK_API lk_status lk_model_set_lm_head_chunk_bytes(lk_model *m, size_t bytes);
/* For a step captured in a CUDA graph (the trainer's train.cuda_graph):
 *   lk_model_set_stream     the stream the model's work goes on (a cudaStream_t; NULL: the
 *                           legacy default stream, which cannot be captured)
 *   lk_model_defer_stats    on: a forward reads no scalar back (stats' loss NaN, n_tokens
 *                           0; the MoE layers' aux losses are summed on the device), so a
 *                           step on one GPU makes no host sync at all (the CUDA rows only
 *                           enqueue work). Not with sequence parallelism (LK_EINVAL).
 *   lk_model_read_stats     the last forward's loss and valid tokens (a device-to-host read:
 *                           after the step has run), and its aux loss
 *   lk_model_stage_batch    the host side of a forward alone: the batch checked (every id
 *                           in range, cu_seqlens 0 .. B·S), the buffers for its size, and on
 *                           a GPU its token arrays and cu_seqlens written into the pinned
 *                           memory a captured step copies from: the current stage slot's.
 *   lk_model_set_stage_slot which of two pinned slots the staging writes and the forward
 *                           copies from (0 or 1; 0 at create), so the host can stage one
 *                           step's batch while the step before still reads the other's:
 *                           a slot is written once the step that last read it has completed
 *   lk_model_loss_device    where the forward leaves its loss (a device f32; NULL on the CPU),
 *                           for a step log that reads it later */
LK_API void lk_model_set_stream(lk_model *m, void *stream);
LK_API lk_status lk_model_defer_stats(lk_model *m, int on);
LK_API lk_status lk_model_read_stats(lk_model *m, lk_step_stats *st);
LK_API lk_status lk_model_stage_batch(lk_model *m, const lk_batch *batch);
LK_API lk_status lk_model_set_stage_slot(lk_model *m, int slot);
LK_API const float *lk_model_loss_device(const lk_model *m);
/* Sequence and expert parallelism; call before the first step (NULL or a group of one:
 * none). Every rank of both groups is handed the same calls.
 *   sp: the SP group. Its ranks are handed the same whole batch; rank r runs tokens
 *       [r·T/P, (r+1)·T/P) of the B*S (B*S a multiple of P) through Ulysses attention (the
 *       attention binding must be an SP row: flash_attention_2 or flex_attention, which
 *       the llmkern backend turns into llmkern_*_with_sp), the loss is the group's mean
 *       over its valid tokens and the MoE aux loss the group's (moe.h).
 *   ep: the EP group. A MoE layer's experts run through the moe_dispatch binding
 *       (alltoall or allgather; a defaulted `local` becomes alltoall), rank r running
 *       experts [r·E/P, (r+1)·E/P) for the routes of every rank of the group.
 * Parameters stay whole on every rank; a step's gradients are then this rank's share
 * (its tokens, its experts), which the caller sums over all ranks (the trainer's
 * all-reduce). Errors (the model unchanged): LK_EINVAL (heads or experts not divisible
 * by the group, an attention binding without an SP path, an explicit `local`
 * dispatcher, a dense model with ep > 1). */
struct lk_comm;
LK_API lk_status lk_model_set_parallel(lk_model *m, struct lk_comm *sp, struct lk_comm *ep);
LK_API int lk_model_param_count(const lk_model *m);
LK_API lk_param *lk_model_param(lk_model *m, int i);
/* Forward and backward of one micro-batch: ADDS d(loss * loss_scale) to every param's
 * grad (gradient accumulation is several calls with loss_scale = 1/n_micro), fills
 * stats. The first batch of a new B*S allocates the activation buffers. */
LK_API lk_status lk_model_forward_backward(lk_model *m, const lk_batch *batch, float loss_scale,
                                    lk_step_stats *stats);
/* Forward only: the loss (for evaluation and finite differences). */
LK_API lk_status lk_model_loss(lk_model *m, const lk_batch *batch, lk_step_stats *stats);
/* Every gradient zero. A MoE model's expert stacks (without EP) lazily: the next
 * lk_model_forward_backward writes them instead of adding (no zeroing pass over most of
 * its parameters), and lk_model_grads / lk_model_param zero them first if called before. */
LK_API void lk_model_zero_grad(lk_model *m);
/* Every parameter's gradient lies in one flat buffer of *n elements of lk_model_grad_dtype
 * (f32 unless set; each lk_param's grad a view into it, alignment padding zero): what a
 * data-parallel all-reduce sums. */
LK_API void *lk_model_grads(lk_model *m, int64_t *n);
/* Called by lk_model_forward_backward as the backward goes: fn(user, first) says that
 * the flat gradients [first, n) are final for this call (after the loss head, after
 * each layer from the last, and with first = 0 at the end), so a data-parallel
 * all-reduce of that range can start while the rest of the backward runs. fn NULL
 * removes it. */
LK_API void lk_model_on_grads_ready(lk_model *m, void (*fn)(void *user, int64_t first), void *user);
/* Bytes of activations the last forward kept for its backward (accounted memory). */
LK_API size_t lk_model_activation_bytes(const lk_model *m);
/* Checkpoint I/O in the layouts of the published checkpoints (checkpoint.h: lk_st_dir):
 * config.json + the weights (bf16 or f32 as cfg->torch_dtype says) in dir (created if
 * missing), as one model.safetensors or, when they exceed max_shard_bytes, shards
 * model-0000k-of-0000n.safetensors and model.safetensors.index.json; each file written
 * atomically, config.json last; files of the other layout left by an earlier save are
 * removed. lk_model_save is lk_model_save_sharded at transformers' default "5GB"
 * (LK_ST_DEFAULT_MAX_SHARD). */
LK_API lk_status lk_model_save(const lk_model *m, const char *dir);
LK_API lk_status lk_model_save_sharded(const lk_model *m, const char *dir, uint64_t max_shard_bytes);
/* Reads a checkpoint directory's weights (single or sharded, F32, BF16 or F16) into m's
 * f32 parameters. Every parameter's name and shape, and that the directory holds no
 * tensor the model lacks (a tied model's lm_head.weight aside), are checked before any
 * weight changes: LK_EIO (no tensor, an unexpected one, a bad file), LK_ESHAPE
 * (expected vs got), LK_EDTYPE. lk_model_check_weights makes the same checks and reads
 * nothing. */
LK_API lk_status lk_model_load_weights(lk_model *m, const char *dir);
LK_API lk_status lk_model_check_weights(const lk_model *m, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
