/* train.h — training: the AdamW optimizer, the learning-rate schedule, gradient
 * clipping, the training configuration (the model:/train:/data: sections of a YAML
 * file) and the training loop behind `llmkern train`.
 *
 *   lk_train_config tc;  lk_ops_config ops;
 *   lk_train_config_init(&tc);  lk_ops_config_init(&ops);
 *   if (lk_train_config_load_yaml("configs/tiny-moe.yaml", &tc, &ops)) puts(lk_last_error());
 *   lk_train_run(&tc, &ops, NULL, NULL, &result);       // or a resume dir
 *
 * Everything here is deterministic for a seed, whatever the thread count: the update
 * is elementwise and every reduction runs over fixed chunks summed in a fixed order. On
 * a GPU, attention's backward adds dQ with atomics unless train.deterministic is set. */
#ifndef LLMKERN_TRAIN_H
#define LLMKERN_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "tensor.h"
#include "hf_config.h"
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- AdamW (decoupled weight decay, as torch.optim.AdamW) -------------------------------
 * For step t >= 1 (the number of updates including this one):
 *   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * State m and v are zero before the first step, each f32 or bf16 (m_dtype, v_dtype; zero
 * = f32): a bf16 moment is computed in f32 and stored by stochastic rounding with the
 * random bits of (sround_key, element) (src/core/sround.h; train.exp_avg_dtype and
 * train.exp_avg_sq_dtype, as Megatron's precision-aware optimizer names them). */
typedef struct {
    double beta1, beta2, eps, weight_decay;
    lk_dtype m_dtype, v_dtype;   /* LK_F32 (0) or LK_BF16 */
    uint64_t sround_key;         /* bf16 moments or weights: the tensor's key for this step */
    /* p's: LK_F32 (0), or LK_BF16 (train.main_params_dtype: the weights without an f32
     * master), the update computed in f32 and stored by stochastic rounding too */
    lk_dtype p_dtype;
    lk_dtype g_dtype;   /* g's: LK_F32 (0), or LK_BF16 (train.main_grads_dtype) */
    float g_scale;      /* g times this (f32) as it is read: a clip's factor (lk_clip_scale); 0 = 1 */
} lk_adamw_hparams;

/* p: n elements of h->p_dtype; g of h->g_dtype; m and v: of h->m_dtype / h->v_dtype. The
 * random bits of an element (lk_sround_bits) round m with bits 0-15, v with 16-31, p with
 * 32-47. */
LK_API void lk_adamw_update(void *p, const void *g, void *m, void *v, int64_t n,
                     const lk_adamw_hparams *h, double lr, int64_t t);

/* Linear warmup over warmup steps to lr, then cosine decay to min_lr at total steps.
 * step counts from 0: lr_at(0) = lr / warmup (lr when warmup is 0), lr_at(warmup) = lr,
 * lr_at(total - 1) = min_lr. */
LK_API double lk_lr_schedule(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr);

/* The global L2 norm of n_bufs gradient buffers (buf i holds len[i] floats), summed in
 * f64 over fixed chunks; with max_norm > 0 and the norm above it, every buffer is
 * scaled by lk_clip_scale (torch.nn.utils.clip_grad_norm_). Returns the norm before
 * clipping (NaN or Inf passes through; nothing is scaled then). */
LK_API double lk_clip_grad_norm(float *const *bufs, const int64_t *len, int n_bufs, double max_norm);
/* The same norm of buffers of dt (f32 or bf16), nothing scaled. */
LK_API double lk_grad_norm(const void *const *bufs, const int64_t *len, int n_bufs, lk_dtype dt);
/* The factor clipping to max_norm multiplies a gradient of that norm by: max_norm /
 * (norm + 1e-6) in f64, then f32, when max_norm > 0 and norm > max_norm; else 1. */
LK_API float lk_clip_scale(double norm, double max_norm);

/* --- PNG ------------------------------------------------------------------------------- */
/* Writes an 8-bit RGB image (rgb: h rows of w*3 bytes) as a PNG file (cairo's encoder),
 * atomically. LK_EINVAL for bad sizes, LK_ENOMEM, LK_EIO naming the path. */
LK_API lk_status lk_png_write(const char *path, const uint8_t *rgb, int w, int h);
/* Plots y[0..n) against x[0..n) (an anti-aliased line with axes, labelled ticks and a
 * light grid, on white; drawn with cairo) into a w x h PNG at path; a NaN or Inf point
 * is a gap. n may be 0 (axes only). LK_EINVAL for w, h outside 64..16384. */
LK_API lk_status lk_plot_png(const char *path, const float *x, const float *y, int64_t n, int w, int h);

/* --- configuration ----------------------------------------------------------------------- */
typedef enum { LK_DATA_BUILTIN, LK_DATA_TEXT, LK_DATA_TOKENS } lk_data_kind;

/* train.recompute_modules' bits */
#define LK_RECOMPUTE_LAYERNORM 1u   /* the layers' input and post-attention norms' outputs */
#define LK_RECOMPUTE_MOE 2u         /* a MoE layer's experts' saved block (their gate/up output) */
#define LK_RECOMPUTE_QKV 4u         /* q, k, v after their head norms and RoPE (attention's inputs) */
#define LK_RECOMPUTE_MODULES 3      /* how many: recompute_module_layers' length */
#define LK_RECOMPUTE_MODULE_NAMES {"layernorm", "moe", "qkv"}   /* bit i's YAML name */

typedef struct {
    lk_qwen3_config model;       /* model: config_json or inline keys */
    int has_model;               /* 1 once the file named an architecture */
    /* train: */
    int64_t steps, warmup_steps, batch_size, seq_len, grad_accum, save_every;
    double lr, min_lr, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    int recompute;
    /* train.recompute_num_layers (Megatron's, with its block method): with train.recompute, the
     * first N layers are made again in the backward and the rest keep their activations
     * (lk_model_set_recompute_layers); 0 (the default): every layer. */
    int64_t recompute_num_layers;
    lk_device_type device;       /* where the model and the optimizer run: cpu (default) or cuda
                                  * (one GPU per rank; the ops are selected for it) */
    char out[512];
    /* data: */
    lk_data_kind data;
    char data_path[512];         /* text or tokens file */
    int64_t corpus_docs;         /* builtin: documents to generate */
    int64_t eos_id;              /* tokens: the id ending a document (-1: one document; the default
                                  * LK_EOS_FROM_FILE: the file's, as scripts/tokenize.py writes it) */
    /* parallel: the mesh under mpirun (comm.h: world = dp x sp, ep folded over them).
     * dp 0 = world / sp; sp must divide batch_size x seq_len. */
    int64_t dp, sp, ep;
    /* train.comm_timeout_s: a collective that has not completed after this many seconds
     * ends the job with a message naming it, the rank and the step (comm.h: the
     * watchdog); 0 = wait for ever. Default 300. */
    double comm_timeout_s;
    /* model.init_from (or `llmkern train --init DIR`): a Hugging Face Qwen3 / Qwen3-MoE
     * directory whose config.json is the architecture (inline model: keys override it)
     * and whose weights (model.safetensors or the sharded index, bf16 or f32) the run
     * starts from, names and shapes checked before any step; "" = random weights. A
     * resumed run takes its weights from the checkpoint instead. */
    char init_from[512];
    /* train.max_shard_size: the weights of a checkpoint are saved as shards of at most
     * this many bytes with model.safetensors.index.json when they are larger (default
     * transformers' "5GB", LK_ST_DEFAULT_MAX_SHARD). */
    uint64_t max_shard_size;
    /* train.log_every: a progress line every this many steps where stdout is not a
     * terminal (a terminal's one line is rewritten every step); 0 = from the run's length
     * (lk_train_log_every). The first and the last step always print. */
    int64_t log_every;
    /* train.memory_limit: the bytes the run may use on its device, in place of what the
     * machine reports (host RAM available, or the GPU's free memory); 0 = measure. */
    uint64_t memory_limit;
    /* train.dtype: the model's compute dtype (lk_model_set_dtype): bf16 (bfloat16) with
     * f32 master weights, gradients and AdamW moments, or f32; LK_DTYPE_COUNT = the
     * device's default, bf16 on a GPU and f32 on the CPU (lk_train_dtype). */
    lk_dtype dtype;
    /* train.cuda_graph: on one GPU (one process, grad_accum 1), the step after the first
     * (zero_grad, forward, backward, clipping, AdamW) is captured in a CUDA graph, again for
     * each new batch shape, and replayed; capture fails on any host sync inside it. */
    int cuda_graph;
    /* train.deterministic: the same bits on every run of a seed on a GPU too (as HF's
     * full_determinism): attention's backward sums dQ in a fixed order
     * (lk_attention_args.deterministic; flash_attention_3 then takes fa2's dQ pass, a few
     * percent slower). Off by default: the tensor-core rows add dQ with atomics. The CPU
     * rows are always deterministic. */
    int deterministic;
    /* train.keep_qk: each layer keeps its q/k/v projection for the backward instead of making
     * q and k again there by a GEMM (lk_model_set_keep_qk): ~1-2% of a GPU step for layers x
     * tokens x (q + 2 kv) more activations. Off by default (the leaner memory). */
    int keep_qk;
    /* train.fp32_residual_connection (Megatron's name): a bf16 run's residual stream in f32
     * (true, the default: autocast's numerics), or in bf16 (false: a bf16 transformers model's
     * and Megatron's default; ~12 bytes an element a layer less traffic each way;
     * lk_model_set_fp32_residual). No effect in f32. */
    int fp32_residual_connection;
    /* train.lm_head_chunk_bytes: the fused LM head + loss's budget of f32 logits a chunk of
     * tokens (lk_model_set_lm_head_chunk_bytes; a size as max_shard_size takes it): 0 (the
     * default) = the op's, 4 GiB on a GPU. Smaller takes less memory for more passes over the
     * f32 dW accumulator (bench/NOTES.md, twenty-eighth session). */
    uint64_t lm_head_chunk_bytes;
    /* train.grad_reduce_dtype: the type the data-parallel all-reduce sums the gradients in
     * (as FSDP's MixedPrecision reduce_dtype): f32 (the default), or bf16, half the bytes on
     * the wire, each bucket rounded once before it and the sums added back into the f32
     * gradients after (NCCL's bf16 sum; over MPI an op of llmkern's). No effect in one process. */
    lk_dtype grad_reduce_dtype;
    /* train.exp_avg_dtype, train.exp_avg_sq_dtype: how AdamW keeps its first and second
     * moments (Megatron's --exp-avg-dtype / --exp-avg-sq-dtype): f32 (the default), or bf16,
     * computed in f32 and stored by stochastic rounding (lk_adamw_hparams), 2 bytes a
     * parameter less each and as much less optimizer traffic; DeepSeek-V3 trains with both in
     * bf16. The weights' f32 master and the f32 gradients stay. */
    lk_dtype exp_avg_dtype, exp_avg_sq_dtype;
    /* train.main_params_dtype (Megatron's name for the weights the optimizer updates): f32
     * (the default: an f32 master beside the bf16 copy), or bf16 with train.dtype bf16: the
     * bf16 weights are the only copy (lk_model_set_master_dtype), AdamW computes in f32 and
     * stores them by stochastic rounding (torchao's bf16_stochastic_round), 4 bytes a
     * parameter less and 6 less optimizer traffic; norms and the embedding read bf16. */
    lk_dtype main_params_dtype;
    /* train.main_grads_dtype (Megatron's name for the gradients the optimizer reads): f32 (the
     * default), or bf16 with train.dtype bf16 and train.grad_accum 1: every op writes its
     * weights' gradient in bf16 (lk_model_set_grad_dtype), as a bf16 PyTorch model's autograd
     * does, 2 bytes a parameter less and 2 less optimizer traffic; a data-parallel all-reduce
     * then sums them in bf16 where they lie (train.grad_reduce_dtype does not apply). */
    lk_dtype main_grads_dtype;
    /* train.recompute_modules (Megatron's selective recompute): the modules whose outputs the
     * backward makes again instead of keeping them, LK_RECOMPUTE_* bits: layernorm (the layers'
     * input and post-attention norms: lk_model_set_recompute_norms, two T x H activations a
     * layer less for two norm passes), moe (the experts' saved block: lk_model_set_recompute_moe,
     * T x k x 2I a MoE layer less for the experts' forward again), qkv (attention's inputs:
     * lk_model_set_recompute_qkv, T x (Q + 2K) a layer less for the head norms, RoPE and, without
     * train.keep_qk, v's columns of the GEMM the backward makes q and k again with; the GQA
     * counterpart of Megatron's mla_up_proj). Each in every layer, or, written name:N ("moe:6"),
     * in the first N (recompute_module_layers, by bit index; 0: all). [] (the default): none.
     * train.recompute makes the whole layer again. */
    unsigned recompute_modules;
    int64_t recompute_module_layers[LK_RECOMPUTE_MODULES];
    /* train.profile_step: on a GPU, the CUDA profiler records step N alone (1-based;
     * cudaProfilerStart/Stop around it, for `ncu --profile-from-start off`,
     * bench/step_profile.py); 0 = off. */
    int64_t profile_step;
} lk_train_config;

/* tc's compute dtype, its device's default resolved. */
LK_API lk_dtype lk_train_dtype(const lk_train_config *tc);

/* Defaults: dp 0 (the world), sp 1, ep 1; steps 100, lr 1e-3, min_lr 1e-4, warmup 10, weight_decay 0.1, betas
 * (0.9, 0.95), eps 1e-8, grad_clip 1.0, batch 4 x 128, grad_accum 1, seed 1234,
 * save_every 0 (only at the end), out "out", the builtin corpus, dtype by the device,
 * no CUDA graph; no model. */
LK_API void lk_train_config_init(lk_train_config *tc);

/* Loads a YAML file: model.ops_implementation / model.moe into ops (as
 * lk_config_load_yaml), the architecture keys of model: and the train: and data:
 * sections into tc. Relative paths (config_json, data files) are taken from the YAML
 * file's directory. Errors as lk_config_load_yaml (file:line:column, the key, the
 * valid ones); tc and ops change only when the whole file is good. */
struct lk_ops_config;
LK_API lk_status lk_train_config_load_yaml(const char *path, lk_train_config *tc, struct lk_ops_config *ops);

/* `llmkern train --init DIR`: DIR/config.json becomes tc's model (replacing the YAML's)
 * and DIR the run's model.init_from. LK_EIO / LK_EINVAL naming DIR and the key when
 * config.json is missing or bad; tc unchanged then. */
LK_API lk_status lk_train_config_init_from(lk_train_config *tc, const char *dir);

/* --- the training loop ------------------------------------------------------------------- */
struct lk_model;
/* One step's numbers, the ones its progress line shows (lk_train_opts.on_step). */
typedef struct {
    int64_t step, steps;         /* updates done (1-based) and the run's total */
    double loss, lr, grad_norm;  /* grad_norm before clipping */
    double tokens_per_s;         /* the run's average rate so far */
    double eta_s;                /* the remaining steps at that rate */
    uint64_t peak_device_bytes;  /* GPU: the most memory in use on the rank's GPU after a step so
                                  * far (cudaMemGetInfo: total - free, the CUDA context included);
                                  * CPU: 0 */
} lk_train_step;

typedef struct {
    int quiet;                   /* no progress output */
    int no_save;                 /* no checkpoint and no final model: loss.csv and the plot only */
    int save_init;               /* no step: the weights the run would start from (the seed's, or
                                  * init_from's) saved as the model in out (config.json and the
                                  * safetensors), no optimizer file, no loss.csv */
    /* Called before each step's first forward (tests inject faults through it). */
    void (*before_step)(void *user, int64_t step, struct lk_model *m);
    /* Called with each step's loss before it is checked (tests turn it into NaN); not with
     * train.cuda_graph, whose losses are read after their updates (LK_EINVAL). */
    void (*after_loss)(void *user, int64_t step, double *loss);
    /* Called after each step, on the rank that writes (rank 0), with its numbers
     * (`llmkern train --json` prints them; with quiet set, instead of the line); with
     * train.cuda_graph for each step of a log interval at its end, when the losses are read. */
    void (*on_step)(void *user, const lk_train_step *st);
    void *user;
    float *loss_log;             /* loss_log[step] = that step's loss, for step < loss_log_cap */
    float *grad_norm_log;        /* optional: the step's gradient norm (before clipping), likewise */
    int64_t loss_log_cap;
    int64_t stop_at;             /* > 0: stop before step stop_at as a killed process would (no
                                  * final checkpoint or model): tests of --resume */
    /* The mesh (lk_train_mesh; NULL or a world of one: one process, the path unchanged).
     * DP replica r of P takes every P-th batch from r; its SP ranks split that batch's
     * tokens and the EP ranks the experts (lk_model_set_parallel). After each step's
     * micro-batches the gradients are summed over the world in buckets and divided
     * by P; the loss is the mean over the replicas; every rank holds the whole model and
     * takes the same step; only rank 0 writes (out, loss.csv, plot, checkpoints,
     * progress). The config's parallel: section must match the mesh. */
    const lk_mesh *mesh;
    int64_t bucket_bytes;        /* the all-reduce bucket (torch DDP's bucket_cap_mb); 0 = the
                                  * device's: 4 MiB on CPUs, 128 MiB on GPUs (bench/NOTES.md) */
} lk_train_opts;

typedef struct {
    int64_t first_step, steps_done;   /* the run covered [first_step, steps_done) */
    double first_loss, last_loss;
    double tail_loss;                 /* mean loss of the last (up to) 10 steps run or resumed */
    double seconds, tokens_per_s;
    char last_checkpoint[600];        /* "" when none was written */
    int64_t buckets, buckets_early;   /* gradient all-reduces run, and those started while the
                                       * backward was still running (overlapped) */
    uint64_t peak_device_bytes;       /* as lk_train_step's, over the run */
} lk_train_result;

/* Trains tc.model with ops on tc's data for tc.steps steps, writing into tc.out:
 * loss.csv, loss.png, checkpoint-<step>/ every save_every steps and at the end
 * (config.json, model.safetensors, optimizer.safetensors), the file `latest` naming
 * the last complete checkpoint, and the final config.json + model.safetensors.
 * resume: a checkpoint directory, or an output directory with a `latest` file; the run
 * then continues bit-identically to one that was never stopped. A NaN or Inf loss
 * stops the run with LK_EINVAL and a message naming the step and the last good
 * checkpoint, which is kept. opts and result may be NULL. */
LK_API lk_status lk_train_run(const lk_train_config *tc, const struct lk_ops_config *ops, const char *resume,
                       const lk_train_opts *opts, lk_train_result *result);

/* The progress line's period where stdout is not a terminal when train.log_every is 0:
 * about 20 lines a run, at a round number of steps (1, 2, 5, 10, 20, 50, ...): 1 up to
 * 39 steps, 5 for 100, 20 for 400, 50 for 1000. */
LK_API int64_t lk_train_log_every(int64_t steps);

/* What a run of tc needs in memory, estimated before anything is allocated, on the host
 * and on the run's GPU (the refusal of lk_train_run names the term that does not fit and
 * compares it with lk_hw_mem_available, or train.memory_limit). Every product is checked:
 * LK_EINVAL naming the field when one does not fit in 64 bits. */
typedef struct {
    int64_t params;              /* the model's parameters */
    uint64_t state_bytes;        /* weights, gradients, AdamW m and v: 16 bytes a parameter */
    uint64_t activation_bytes;   /* one micro-batch's forward kept for its backward (a lower bound) */
    uint64_t history_bytes;      /* the loss history: steps x 5 floats */
    uint64_t total_bytes;        /* state + activations + history, wherever they live */
    uint64_t host_bytes;         /* what host RAM holds: everything on the CPU; on a GPU a copy
                                  * of the weights (4 bytes a parameter) and the history */
    uint64_t device_bytes;       /* what the GPU holds (state + activations); 0 on the CPU */
} lk_train_memory;
LK_API lk_status lk_train_memory_estimate(const lk_train_config *tc, lk_train_memory *out);

/* The mesh of `mpirun ... llmkern train`: lk_mesh_create(world, tc->dp, tc->sp, tc->ep);
 * LK_EINVAL naming parallel and the world size when the mesh does not divide it (before
 * any collective). */
LK_API lk_status lk_train_mesh(const lk_train_config *tc, lk_comm *world, lk_mesh *out);

#ifdef __cplusplus
}
#endif
#endif
