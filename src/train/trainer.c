/* trainer.c — the training loop behind `llmkern train` (train.h: lk_train_run): per
 * step, gradient accumulation over grad_accum micro-batches, clipping by the global
 * norm, one AdamW update; progress (on a terminal one line rewritten in place every
 * step, elsewhere a line every train.log_every steps), loss.csv and loss.png in the output
 * directory; checkpoints through train_state.c. Under a mesh (opts->mesh): each DP
 * replica reads its shard, its SP ranks split the batch's tokens and EP ranks the
 * experts (lk_model_set_parallel); every rank's gradient share is summed over the world
 * in buckets that travel while the backward still runs, before clipping, so all ranks
 * take the same step; rank 0 alone writes. The model and the optimizer run where
 * train.device says (the CPU here; a GPU per rank through trainer_cuda.c, the buckets
 * then summed over NCCL). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/checked.h"
#include "core/sround.h"
#include "llmkern/config.h"
#include "llmkern/registry.h"
#include "model/device.h"
#include "train/trainer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The processes on this node, as the launchers export it (1 without one): on the CPU
 * each DP rank holds a whole model in the same RAM. */
static int64_t ranks_here(const lk_mesh *mesh) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    if (mesh == NULL) return 1;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        long long n = v ? atoll(v) : 0;
        if (n >= 1 && n <= mesh->world->size) return n;
    }
    return 1;
}

/* The bytes the run may use where: train.memory_limit for the run's device, else what
 * the machine reports now (lk_hw_mem_available). */
static uint64_t available(const lk_train_config *tc, lk_device_type where, char *source, size_t n) {
    if (tc->memory_limit && where == tc->device) {
        snprintf(source, n, "of train.memory_limit");
        return tc->memory_limit;
    }
    return lk_hw_mem_available(where, source, n);
}

static const char *model_name(const lk_qwen3_config *c) { return c->moe ? "Qwen3-MoE" : "Qwen3"; }

/* The header every run prints before its first allocation (so a run that is refused, or
 * killed, is never silent): the model, its parameter count, the estimate and what the
 * device has. */
static void print_header(const lk_train_config *tc, const lk_train_memory *e, int64_t ranks, uint64_t host,
                         const char *host_src, uint64_t dev, const char *dev_src) {
    const lk_qwen3_config *c = &tc->model;
    char a[32], b[32], t[32], h[32], d[32], x[32];
    double p = (double)e->params;
    printf("model %s: %lld parameters (%.3g %s; %lld layers, hidden %lld", model_name(c), (long long)e->params,
           p >= 1e9 ? p / 1e9 : p >= 1e6 ? p / 1e6 : p / 1e3, p >= 1e9 ? "B" : p >= 1e6 ? "M" : "K",
           (long long)c->num_hidden_layers, (long long)c->hidden_size);
    if (c->moe) printf(", %lld experts, top %lld", (long long)c->num_experts, (long long)c->num_experts_per_tok);
    int bf16 = lk_train_dtype(tc) == LK_BF16;
    char mv[32] = "";   /* the moments' dtypes, where not both f32 */
    if (tc->exp_avg_dtype != LK_F32 || tc->exp_avg_sq_dtype != LK_F32)
        snprintf(mv, sizeof mv, " (%s, %s)", lk_dtype_name(tc->exp_avg_dtype), lk_dtype_name(tc->exp_avg_sq_dtype));
    const char *copy = tc->main_params_dtype == LK_BF16 ? " (the weights in bf16 alone)"
                       : bf16 ? ", the weights' bf16 copy" : "";
    printf("); memory: needs %s (%s weights, gradients%s, AdamW m and v%s%s + %s activations%s)",
           lk_bytes_str(e->state_bytes + e->activation_bytes, t, sizeof t), lk_bytes_str(e->state_bytes, a, sizeof a),
           tc->main_grads_dtype == LK_BF16 ? " in bf16" : "", mv, copy, lk_bytes_str(e->activation_bytes, b, sizeof b),
           bf16 ? " in bf16" : "");
    if (tc->device == LK_DEVICE_CPU) {
        printf("%s on cpu, %s %s\n", ranks > 1 ? " a rank" : "", host ? lk_bytes_str(host, h, sizeof h) : "unknown",
               host_src);
    } else {
        printf(" on %s, %s %s; host RAM %s, %s %s\n", lk_device_name(tc->device),
               dev ? lk_bytes_str(dev, d, sizeof d) : "unknown", dev_src, lk_bytes_str(e->host_bytes, x, sizeof x),
               host ? lk_bytes_str(host, h, sizeof h) : "unknown", host_src);
    }
    fflush(stdout);
}

/* What cannot fit is refused before anything is allocated or created, with both numbers
 * and the field that makes it large (estimate.c): on the CPU everything against the
 * host's available RAM (times the ranks on this node); on a GPU the weights, gradients,
 * moments and activations against its free memory (read after the rank's GPU is picked)
 * and the host copy of the weights against the host's. */
static lk_status check_memory(const lk_train_config *tc, const lk_train_memory *e, const lk_mesh *mesh, int header) {
    char need_s[32], have_s[32], a_s[32], b_s[32], host_src[160], dev_src[160] = "";
    int64_t ranks = tc->device == LK_DEVICE_CPU ? ranks_here(mesh) : 1;
    uint64_t host = available(tc, LK_DEVICE_CPU, host_src, sizeof host_src), dev = 0;
    if (tc->device != LK_DEVICE_CPU) dev = available(tc, tc->device, dev_src, sizeof dev_src);
    if (header) print_header(tc, e, ranks, host, host_src, dev, dev_src);
    lk_bytes_str(host, have_s, sizeof have_s);
    if (host && e->history_bytes > host)
        return lk_error(LK_ENOMEM, "train: train.steps %lld: the loss history needs %s (%d bytes a step), more than "
                        "the %s %s", (long long)tc->steps, lk_bytes_str(e->history_bytes, need_s, sizeof need_s),
                        (int)(LK_HIST_COLS * sizeof(float)), have_s, host_src);
    uint64_t need = tc->device == LK_DEVICE_CPU ? e->host_bytes : e->device_bytes, have = host;
    const char *src = host_src;
    if (tc->device != LK_DEVICE_CPU) {
        if (host && e->host_bytes > host)
            return lk_error(LK_ENOMEM, "train: model: %.3g parameters: the host copy of the weights (4 bytes each) and "
                            "the loss history need %s, more than the %s %s", (double)e->params,
                            lk_bytes_str(e->host_bytes, need_s, sizeof need_s), have_s, host_src);
        have = dev, src = dev_src;
        lk_bytes_str(have, have_s, sizeof have_s);
    }
    if (have && need > have / (uint64_t)ranks) {
        const lk_qwen3_config *c = &tc->model;
        char moe[96] = "", per[64] = "";
        if (c->moe) snprintf(moe, sizeof moe, ", num_experts %lld x moe_intermediate_size %lld",
                             (long long)c->num_experts, (long long)c->moe_intermediate_size);
        if (ranks > 1) snprintf(per, sizeof per, " a rank x %lld ranks on this node", (long long)ranks);
        return lk_error(LK_ENOMEM, "train: model (hidden_size %lld, num_hidden_layers %lld, intermediate_size %lld, "
                        "vocab_size %lld%s): %.3g parameters need %s (weights, gradients, AdamW m and v: %lld bytes "
                        "each) + %s of activations for train.batch_size %lld x train.seq_len %lld = %s%s on %s, more "
                        "than the %s %s", (long long)c->hidden_size, (long long)c->num_hidden_layers,
                        (long long)c->intermediate_size, (long long)c->vocab_size, moe, (double)e->params,
                        lk_bytes_str(e->state_bytes, a_s, sizeof a_s),
                        (long long)(e->params ? e->state_bytes / (uint64_t)e->params : 0),
                        lk_bytes_str(e->activation_bytes, b_s, sizeof b_s),
                        (long long)tc->batch_size, (long long)tc->seq_len,
                        lk_bytes_str(need, need_s, sizeof need_s), per, lk_device_name(tc->device), have_s, src);
    }
    return LK_OK;
}

/* train.out must be a directory or creatable as one; nothing is created until the run
 * is known to start (lk_train_run), so a refusal leaves the file system as it was. */
static lk_status check_out(const char *out) {
    char p[1024];
    struct stat st;
    if (snprintf(p, sizeof p, "%s", out) >= (int)sizeof p) return lk_error(LK_EINVAL, "train: train.out: path too long");
    for (;;) {   /* the deepest part of the path that exists must be a directory we may write in */
        if (stat(p, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return lk_error(LK_EINVAL, "train: train.out '%s': '%s' exists and is not a directory", out, p);
            if (access(p, W_OK | X_OK) != 0)
                return lk_error(LK_EIO, "train: train.out '%s': cannot write in '%s': %s", out, p, strerror(errno));
            return LK_OK;
        }
        char *slash = strrchr(p, '/');
        while (slash && slash > p && slash[1] == '\0') { *slash = '\0'; slash = strrchr(p, '/'); }   /* "a/b/" */
        if (slash == NULL) { snprintf(p, sizeof p, "."); continue; }
        if (slash == p) { p[1] = '\0'; continue; }   /* "/" */
        *slash = '\0';
    }
}

static lk_status check_config(const lk_train_config *tc, lk_train_memory *e) {
    if (!tc->has_model)
        return lk_error(LK_EINVAL, "train: config: expected a model (model.config_json, model.init_from or inline keys)");
    if (tc->steps < 1 || tc->batch_size < 1 || tc->seq_len < 2 || tc->grad_accum < 1 || tc->save_every < 0 ||
        tc->warmup_steps < 0 || tc->log_every < 0)
        return lk_error(LK_EINVAL, "train: config: expected steps, batch_size, grad_accum >= 1, seq_len >= 2, "
                        "save_every, warmup_steps and log_every >= 0");
    if (tc->max_shard_size == 0)
        return lk_error(LK_EINVAL, "train: train.max_shard_size: expected at least 1 byte, got 0");
    const lk_dtype kept[4] = {tc->exp_avg_dtype, tc->exp_avg_sq_dtype, tc->main_params_dtype, tc->main_grads_dtype};
    static const char *const kept_keys[4] = {"exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype",
                                             "main_grads_dtype"};
    for (int k = 0; k < 4; k++)
        if (kept[k] != LK_F32 && kept[k] != LK_BF16)
            return lk_error(LK_EDTYPE, "train: train.%s: expected f32 or bf16, got %s", kept_keys[k],
                            lk_dtype_name(kept[k]));
    if (tc->main_params_dtype == LK_BF16 && lk_train_dtype(tc) != LK_BF16)
        return lk_error(LK_EDTYPE, "train: train.main_params_dtype bf16: expected train.dtype bf16 (the bf16 weights "
                        "are what the ops read), got %s", lk_dtype_name(lk_train_dtype(tc)));
    if (tc->recompute_num_layers && (!tc->recompute || tc->recompute_num_layers < 0 ||
                                     (tc->has_model && tc->recompute_num_layers > tc->model.num_hidden_layers)))
        return lk_error(LK_EINVAL, "train: train.recompute_num_layers: expected 0 .. num_hidden_layers (%lld) with "
                        "train.recompute true, got %lld%s", (long long)tc->model.num_hidden_layers,
                        (long long)tc->recompute_num_layers, tc->recompute ? "" : " without it");
    static const char *const modules[LK_RECOMPUTE_MODULES] = LK_RECOMPUTE_MODULE_NAMES;
    for (int i = 0; i < LK_RECOMPUTE_MODULES; i++)
        if (tc->recompute_module_layers[i] < 0 ||
            (tc->has_model && tc->recompute_module_layers[i] > tc->model.num_hidden_layers))
            return lk_error(LK_EINVAL, "train: train.recompute_modules: %s:N: expected N in 1 .. num_hidden_layers "
                            "(%lld), got %lld", modules[i], (long long)tc->model.num_hidden_layers,
                            (long long)tc->recompute_module_layers[i]);
    if (tc->main_grads_dtype == LK_BF16 && lk_train_dtype(tc) != LK_BF16)
        return lk_error(LK_EDTYPE, "train: train.main_grads_dtype bf16: expected train.dtype bf16 (the ops write bf16 "
                        "weight gradients of bf16 activations), got %s", lk_dtype_name(lk_train_dtype(tc)));
    if (tc->main_grads_dtype == LK_BF16 && tc->grad_accum != 1)
        return lk_error(LK_EINVAL, "train: train.main_grads_dtype bf16: expected train.grad_accum 1 (micro-batches "
                        "are summed in f32 gradients), got %lld", (long long)tc->grad_accum);
    lk_status s = lk_train_memory_estimate(tc, e);   /* first: it checks the products the checks below take */
    if (s) return s;
    if (tc->batch_size * tc->seq_len > INT32_MAX)   /* the product fits: the estimate checked it */
        return lk_error(LK_EINVAL, "train: train.batch_size x train.seq_len: expected at most 2^31 - 1 tokens a "
                        "micro-batch, got %lld x %lld", (long long)tc->batch_size, (long long)tc->seq_len);
    if (!(tc->lr >= 0) || !(tc->min_lr >= 0) || !(tc->beta1 >= 0 && tc->beta1 < 1) || !(tc->beta2 >= 0 && tc->beta2 < 1))
        return lk_error(LK_EINVAL, "train: config: expected lr, min_lr >= 0 and betas in [0, 1)");
    if (tc->sp < 1 || tc->ep < 1 || (tc->batch_size * tc->seq_len) % tc->sp)
        return lk_error(LK_EINVAL, "train: parallel: expected sp, ep >= 1 and sp dividing batch_size x seq_len "
                        "(%lld tokens), got sp %lld, ep %lld", (long long)(tc->batch_size * tc->seq_len),
                        (long long)tc->sp, (long long)tc->ep);
    if (tc->model.vocab_size < LK_TOK_VOCAB && tc->data != LK_DATA_TOKENS)
        return lk_error(LK_EINVAL, "train: model.vocab_size: expected at least %d (the byte tokenizer), got %lld",
                        LK_TOK_VOCAB, (long long)tc->model.vocab_size);
    if (!(tc->comm_timeout_s >= 0))
        return lk_error(LK_EINVAL, "train: train.comm_timeout_s: expected >= 0 seconds, got %g", tc->comm_timeout_s);
    if (tc->cuda_graph && (tc->device != LK_DEVICE_CUDA || tc->grad_accum != 1 || tc->dp > 1 || tc->sp > 1 || tc->ep > 1))
        return lk_error(LK_EINVAL, "train: train.cuda_graph: expected train.device cuda, train.grad_accum 1 and one "
                        "process (a graph replays one staged batch; the all-reduce is not captured yet), got %s, %lld%s",
                        lk_device_name(tc->device), (long long)tc->grad_accum,
                        tc->dp > 1 || tc->sp > 1 || tc->ep > 1 ? " and a parallel mesh" : "");
    return LK_OK;
}

static lk_status load_data(const lk_train_config *tc, lk_dataset *ds) {
    switch (tc->data) {
    case LK_DATA_TEXT: return lk_dataset_load_text(tc->data_path, ds);
    case LK_DATA_TOKENS: return lk_dataset_load_tokens(tc->data_path, tc->model.vocab_size, tc->eos_id, ds);
    default: return lk_corpus_generate(tc->seed, tc->corpus_docs, ds);
    }
}

static lk_status build_model(const lk_train_config *tc, const lk_ops_config *ops, lk_model **out) {
    const lk_model_family *fam = tc->model.moe ? &lk_family_qwen3_moe : &lk_family_qwen3;
    lk_status s = lk_model_family_find(fam->name) ? LK_OK : lk_model_register(fam);
    lk_ops_config *cfg = malloc(sizeof *cfg);
    lk_op_table *table = malloc(sizeof *table);
    if (cfg == NULL || table == NULL) s = lk_error(LK_ENOMEM, "train: op table");
    if (!s) {   /* selected for the run's device */
        *cfg = *ops;
        cfg->device = tc->device;
        if (!cfg->finalized || ops->device != tc->device) s = lk_ops_config_finalize(cfg);
    }
    if (!s) s = lk_model_build(cfg, fam->name, table);
    if (!s) s = lk_model_create(&tc->model, table, tc->seed, tc->recompute, out);
    if (!s && ((s = lk_model_set_dtype(*out, lk_train_dtype(tc))) ||
               (s = lk_model_set_master_dtype(*out, tc->main_params_dtype)))) {
        lk_model_free(*out);
        *out = NULL;
    }
    if (!s) lk_model_set_deterministic(*out, tc->deterministic);
    if (!s) s = lk_model_set_keep_qk(*out, tc->keep_qk);   /* before any activation exists: cannot fail */
    if (!s) s = lk_model_set_fp32_residual(*out, tc->fp32_residual_connection);
    /* the counts were checked by check_config; 0: all the layers */
    int n[1 + LK_RECOMPUTE_MODULES];
    lk_train_recompute_layers(tc, n);
    if (!s) s = lk_model_set_recompute_layers(*out, n[0]);
    if (!s) s = lk_model_set_recompute_norms(*out, n[1]);
    if (!s) s = lk_model_set_recompute_moe(*out, n[2]);
    if (!s) s = lk_model_set_recompute_qkv(*out, n[3]);
    if (!s) s = lk_model_set_lm_head_chunk_bytes(*out, (size_t)tc->lm_head_chunk_bytes);
    if (!s) s = lk_model_set_grad_dtype(*out, tc->main_grads_dtype);
    free(cfg);
    free(table);
    return s;
}

/* --- the optimizer on the CPU ---------------------------------------------------------- */

static lk_status cpu_pick(const lk_comm *world) { (void)world; return LK_OK; }

static lk_status cpu_grads_comm(lk_comm *world, lk_comm **out) {
    *out = world;
    return LK_OK;
}

static lk_status cpu_scale(trainer *t, void *x, lk_dtype dt, int64_t n, float scale) {
    (void)t;
    float *f = x;
    uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) {
        if (dt == LK_BF16) h[i] = lk_f32_to_bf16(lk_bf16_to_f32(h[i]) * scale);
        else f[i] *= scale;
    }
    return LK_OK;
}

/* The gradients are clipped as AdamW reads them (g_scale), not scaled in place: a bf16
 * gradient is rounded once, and the GPU's eager step and its graph's agree. */
static lk_status cpu_update(trainer *t, double lr, double *norm) {
    const lk_train_config *tc = t->tc;
    *norm = lk_grad_norm((const void *const *)t->grads, t->lens, t->n_params, t->gdt);
    if (!isfinite(*norm)) return LK_OK;
    const float clip = lk_clip_scale(*norm, tc->grad_clip);
    const uint64_t step_key = lk_sround_step_key(tc->seed, t->step + 1);   /* bf16 moments' and weights' rounding */
    for (int i = 0; i < t->n_params; i++) {
        lk_param *p = lk_model_param(t->model, i);
        /* Decay matrices only: norms' gains decaying toward 0 would fight the model. */
        lk_adamw_hparams h = {tc->beta1, tc->beta2, tc->eps, p->value.ndim >= 2 ? tc->weight_decay : 0.0,
                              tc->exp_avg_dtype, tc->exp_avg_sq_dtype,
                              lk_sround_tensor_key(step_key, i), p->value.dtype, t->gdt, clip};
        lk_adamw_update(p->value.data, t->grads[i], t->m[i], t->v[i], t->lens[i], &h, lr, t->step + 1);
    }
    return LK_OK;
}

const lk_train_device lk_train_device_cpu = {
    .type = LK_DEVICE_CPU, .bucket_bytes = 4 << 20, .pick = cpu_pick, .grads_comm = cpu_grads_comm,
    .scale = cpu_scale, .update = cpu_update,
};

static const lk_train_device *device_of(lk_device_type d) {
#ifdef LLMKERN_HAVE_CUDA
    if (d == LK_DEVICE_CUDA) return &lk_train_device_cuda;
#endif
    return d == LK_DEVICE_CPU ? &lk_train_device_cpu : NULL;
}

/* --- the loop ------------------------------------------------------------------------- */

/* The AdamW moments, zeroed, where the model's weights are. */
static lk_status state_alloc(trainer *t) {
    const lk_model_device *md = lk_model_device_of(t->model);
    for (int i = 0; i < t->n_params; i++) {
        size_t n = (size_t)t->lens[i];
        if (!(t->m[i] = md->alloc(n * lk_dtype_size(t->tc->exp_avg_dtype))) ||
            !(t->v[i] = md->alloc(n * lk_dtype_size(t->tc->exp_avg_sq_dtype))))
            return lk_error(LK_ENOMEM, "train: optimizer state of %s: out of %s memory",
                            lk_model_param(t->model, i)->name, lk_device_name(md->type));
    }
    return LK_OK;
}

static void state_free(trainer *t) {
    const lk_model_device *md = t->model ? lk_model_device_of(t->model) : NULL;
    for (int i = 0; md && t->m && i < t->n_params; i++) md->free(t->m[i]), md->free(t->v[i]);
}

static void trainer_free(trainer *t) {
    if (t->graph && t->dev->graph_free) t->dev->graph_free(t);
    state_free(t);
    if (t->has_dmesh) lk_mesh_destroy(&t->dmesh);
    if (t->gcomm && t->gcomm != t->world) lk_comm_destroy(t->gcomm);
    if (t->flat_bf16) lk_model_device_of(t->model)->free(t->flat_bf16);
    lk_arena_free(&t->arena);
    free(t->m); free(t->v); free(t->grads); free(t->lens); free(t->hist);
    lk_batch_free(&t->batch);
    lk_batch_free(&t->skip);
    free(t->reqs);
    lk_data_iter_free(&t->it);
    lk_dataset_free(&t->ds);
    if (t->model) lk_model_free(t->model);
}


/* The config's parallel: section must describe the mesh the run is handed. */
static lk_status check_mesh(const lk_train_config *tc, const lk_mesh *m) {
    int sp = m ? m->sp_size : 1, ep = m ? m->ep_size : 1, dp = m ? m->dp_size : 1;
    if ((tc->dp != 0 && tc->dp != dp) || tc->sp != sp || tc->ep != ep)
        return lk_error(LK_EINVAL, "train: parallel: the config says dp %lld, sp %lld, ep %lld; the mesh is dp %d, "
                        "sp %d, ep %d (dp 0 = the rest)", (long long)tc->dp, (long long)tc->sp, (long long)tc->ep,
                        dp, sp, ep);
    return LK_OK;
}

/* The model's SP and EP groups: the mesh's on a CPU; on a GPU the same mesh made again
 * over the NCCL world (gcomm, ncclCommSplit: one unique-id exchange in all), whose groups
 * exchange device memory and queue the SP loss's sums on the stream. */
static lk_status model_groups(trainer *t, const lk_mesh *mesh) {
    if (t->gcomm == t->world) return lk_model_set_parallel(t->model, mesh->sp, mesh->ep);
    lk_status s = lk_mesh_create(t->gcomm, mesh->dp_size, mesh->sp_size, mesh->ep_size, &t->dmesh);
    if (s) return s;
    t->has_dmesh = 1;
    return lk_model_set_parallel(t->model, t->dmesh.sp, t->dmesh.ep);
}

static lk_status trainer_init(trainer *t, const lk_train_config *tc, const lk_ops_config *ops, const lk_mesh *mesh,
                              int64_t bucket_bytes, int quiet) {
    memset(t, 0, sizeof *t);
    t->tc = tc;
    t->writer = 1;
    if (mesh && mesh->world->size == 1) mesh = NULL;
    lk_train_memory est;
    lk_status s = check_config(tc, &est);
    if (!s) s = check_mesh(tc, mesh);
    if (!s && !(t->dev = device_of(tc->device)))
        s = lk_error(LK_EUNAVAILABLE, "train: device: %s: this build cannot train there (no CUDA)",
                     lk_device_name(tc->device));
    t->arena.device = t->dev ? t->dev->type : LK_DEVICE_CPU;
    if (!s && mesh) {
        t->mesh = mesh;
        t->world = mesh->world;
        t->writer = t->world->rank == 0;
    }
    if (!s) s = t->dev->pick(t->world);   /* before anything is written */
    if (!s) s = check_memory(tc, &est, mesh, t->writer && !quiet);   /* before anything is allocated */
    if (!s && mesh) s = lk_batch_alloc(&t->skip, tc->batch_size, tc->seq_len);
    if (!s && t->writer) s = check_out(tc->out);   /* created once the run is known to start */
    if (!s) s = load_data(tc, &t->ds);
    if (!s) s = lk_data_iter_init(&t->it, &t->ds, tc->batch_size, tc->seq_len, tc->seed);
    if (!s) s = lk_batch_alloc(&t->batch, tc->batch_size, tc->seq_len);
    if (!s) s = build_model(tc, ops, &t->model);
    if (!s && mesh) s = t->dev->grads_comm(t->world, &t->gcomm);
    if (!s && mesh) s = model_groups(t, mesh);
    if (!s && tc->cuda_graph && mesh)
        s = lk_error(LK_EINVAL, "train: train.cuda_graph: one process only (the all-reduce is not captured yet), "
                     "got %d ranks", mesh->world->size);
    if (!s && tc->cuda_graph)
        s = t->dev->graph_init ? t->dev->graph_init(t)
                               : lk_error(LK_EUNAVAILABLE, "train: train.cuda_graph: %s has no graphs",
                                          lk_device_name(t->dev->type));
    if (s) return s;
    int index = lk_model_param(t->model, 0)->value.device.index;   /* the GPU pick chose */
    t->ctx = t->dev->type == LK_DEVICE_CPU ? lk_ctx_cpu(&t->arena) : lk_ctx_cuda(&t->arena, NULL, index);
    t->gdt = lk_model_grad_dtype(t->model);
    if (mesh) {
        int64_t es = (int64_t)lk_dtype_size(t->gdt);
        t->flat = lk_model_grads(t->model, &t->n_flat);
        t->bucket = ((bucket_bytes > 0 ? bucket_bytes : t->dev->bucket_bytes) + es - 1) / es;
        t->n_buckets = (t->n_flat + t->bucket - 1) / t->bucket;
        if (!(t->reqs = calloc((size_t)t->n_buckets, sizeof *t->reqs)))
            return lk_error(LK_ENOMEM, "train: all-reduce requests");
        if (tc->grad_reduce_dtype == LK_BF16 && tc->main_grads_dtype != LK_BF16 &&
            !(t->flat_bf16 = lk_model_device_of(t->model)->alloc((size_t)t->n_flat * 2)))
            return lk_error(LK_ENOMEM, "train: train.grad_reduce_dtype bf16: a bf16 copy of %lld gradients: out of %s "
                            "memory", (long long)t->n_flat, lk_device_name(t->dev->type));
    }
    int n = t->n_params = lk_model_param_count(t->model);
    t->m = calloc((size_t)n, sizeof *t->m);
    t->v = calloc((size_t)n, sizeof *t->v);
    t->grads = calloc((size_t)n, sizeof *t->grads);
    t->lens = calloc((size_t)n, sizeof *t->lens);
    t->hist = calloc((size_t)(tc->steps * LK_HIST_COLS), sizeof *t->hist);   /* check_memory checked the product */
    if (!t->m || !t->v || !t->grads || !t->lens || !t->hist) return lk_error(LK_ENOMEM, "train: optimizer state");
    for (int i = 0; i < n; i++) {
        lk_param *p = lk_model_param(t->model, i);
        t->lens[i] = lk_tensor_numel(&p->value);
        t->grads[i] = p->grad.data;
    }
    return state_alloc(t);
}

/* loss.csv is rewritten from the history at start (so a resumed run's file holds every
 * step) and then appended to, one flushed line per step. */
static FILE *open_csv(const trainer *t) {
    char path[1100];
    snprintf(path, sizeof path, "%s/loss.csv", t->tc->out);
    FILE *f = fopen(path, "w");
    if (f == NULL) { lk_error(LK_EIO, "train: %s: cannot write", path); return NULL; }
    fprintf(f, "step,loss,lr,grad_norm,tokens_per_s\n");
    for (int64_t i = 0; i < t->step; i++) {
        const float *r = t->hist + i * LK_HIST_COLS;
        fprintf(f, "%lld,%.7g,%.7g,%.7g,%.1f\n", (long long)r[0], r[1], r[2], r[3], r[4]);
    }
    fflush(f);
    return f;
}

static lk_status write_plot(const trainer *t) {
    char path[1100];
    snprintf(path, sizeof path, "%s/loss.png", t->tc->out);
    float *x = malloc(((size_t)t->step + 1) * 2 * sizeof *x), *y = x ? x + t->step + 1 : NULL;
    if (x == NULL) return lk_error(LK_ENOMEM, "train: plot");
    for (int64_t i = 0; i < t->step; i++) {
        x[i] = t->hist[i * LK_HIST_COLS + LK_HIST_STEP];
        y[i] = t->hist[i * LK_HIST_COLS + LK_HIST_LOSS];
    }
    lk_status s = lk_plot_png(path, x, y, t->step, 640, 400);
    free(x);
    return s;
}

int64_t lk_train_log_every(int64_t steps) {
    int64_t want = steps / 20, every = 1;   /* about 20 lines a run */
    for (int64_t p = 1; p <= want; p = p <= INT64_MAX / 10 ? p * 10 : want + 1)   /* p * 5 <= want * 5 fits */
        for (int k = 0; k < 3; k++) {
            static const int m[3] = {1, 2, 5};
            if (p * m[k] <= want) every = p * m[k];
        }
    return every;
}

static void progress(const trainer *t, const float *row, double tokens_per_s, double eta_s, int tty, int last) {
    char line[240], mem[48] = "", b[32];
    if (t->mem_peak) snprintf(mem, sizeof mem, " | peak %s", lk_bytes_str(t->mem_peak, b, sizeof b));
    /* clamped: steps x seconds a step can be any double, and its conversion to an integer
     * out of range is undefined (it overflowed with --steps 3689348814741910324) */
    double e = eta_s >= 0 ? (eta_s < 1e12 ? eta_s : 1e12) : 0;
    long long eta = (long long)(e + 0.5);
    snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s%s | ETA %s%lldm%02ds",
             (long long)row[LK_HIST_STEP], (long long)t->tc->steps, row[LK_HIST_LOSS], row[LK_HIST_LR],
             row[LK_HIST_GRAD_NORM], tokens_per_s, mem, e >= 1e12 ? ">" : "", eta / 60, (int)(eta % 60));
    if (tty) printf("\r%s\033[K%s", line, last ? "\n" : "");
    else printf("%s\n", line);
    fflush(stdout);
}

/* Every rank learns whether any rank failed, so none waits in a collective forever. */
static lk_status dp_agree(trainer *t, lk_status s) {
    if (t->world == NULL) return s;
    int64_t bad = s != LK_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", lk_last_error());
    lk_status cs = lk_comm_all_reduce(t->world, &bad, 1, LK_COMM_I64);
    if (cs) return cs;
    if (s) return lk_error(s, "%s", why);
    return bad ? lk_error(LK_ECOMM, "train: another rank failed (its message says why)") : LK_OK;
}

/* The next micro-batch: DP replica r of P takes batches r, r + P, ... (its SP ranks the
 * same one); every rank advances the iterator alike, so its state (what checkpoints
 * keep) is the same on all of them. */
static lk_status next_batch(trainer *t) {
    if (t->mesh == NULL) return lk_data_iter_next(&t->it, &t->batch);
    lk_status s = LK_OK;
    for (int j = 0; !s && j < t->mesh->dp_size; j++)
        s = lk_data_iter_next(&t->it, j == t->mesh->dp_rank ? &t->batch : &t->skip);
    return s;
}

/* The gradient all-reduce, overlapped with the backward. The flat gradients are cut
 * into a fixed grid of buckets (4 MiB on CPUs, 128 MiB on GPUs), and bucket k starts
 * (from the last) once the model says [k·B, n) is final (lk_model_on_grads_ready): the grid, not the moments the model
 * reports, fixes which all-reduces run in which order, so every rank starts the same
 * ones in the same order, a rank whose backward stopped early included (it starts the
 * rest at once). */
static void start_ready(void *user, int64_t first) {
    trainer *t = user;
    while (t->n_started < t->n_buckets && !t->start_error) {
        int64_t b0 = (t->n_buckets - 1 - t->n_started) * t->bucket;
        if (b0 < first) break;
        int64_t n = t->n_flat - b0 < t->bucket ? t->n_flat - b0 : t->bucket;
        if (t->flat_bf16) {   /* train.grad_reduce_dtype bf16: half the bytes on the wire */
            t->start_error = lk_model_device_of(t->model)->round(t->flat_bf16 + b0, (float *)t->flat + b0, n, LK_BF16,
                                                                 &t->ctx);
            if (!t->start_error)
                t->start_error = lk_comm_all_reduce_start(t->gcomm, t->flat_bf16 + b0, n, LK_COMM_BF16,
                                                          &t->reqs[t->n_started]);
        } else {   /* the gradients where they lie: f32, or bf16 (train.main_grads_dtype) */
            int bf16 = t->gdt == LK_BF16;
            t->start_error = lk_comm_all_reduce_start(t->gcomm, (char *)t->flat + (size_t)b0 * (bf16 ? 2 : 4), n,
                                                      bf16 ? LK_COMM_BF16 : LK_COMM_F32, &t->reqs[t->n_started]);
        }
        if (t->start_error) break;
        t->n_started++;
        t->buckets++;
        t->buckets_early += first > 0;   /* first 0 is the end of the backward */
    }
    /* MPI moves a request along only inside MPI calls: give the ones in flight a turn */
    for (int64_t i = 0; i < t->n_started && !t->start_error; i++) {
        int done;
        t->start_error = lk_comm_test(t->gcomm, &t->reqs[i], &done);
    }
}

/* Starts what is left, waits for all, and divides the world's sum by dp: an SP rank
 * holds the share of its tokens and an EP rank that of its experts, so the world's sum
 * is each replica's gradient summed over the replicas. */
static lk_status finish_grads(trainer *t) {
    start_ready(t, 0);
    lk_status s = t->start_error;
    for (int64_t i = 0; i < t->n_started; i++) {
        lk_status w = lk_comm_wait(t->gcomm, &t->reqs[i]);
        if (!s) s = w;
    }
    if (!s && t->flat_bf16) {   /* the reduced bf16 sums back into the f32 gradients */
        const lk_model_device *md = lk_model_device_of(t->model);
        if (!(s = md->zero(t->flat, (size_t)t->n_flat * 4, &t->ctx)))
            s = md->acc(t->flat, LK_F32, t->flat_bf16, LK_BF16, t->n_flat, &t->ctx);
    }
    lk_status c = t->dev->scale(t, t->flat, t->gdt, t->n_flat, (float)(1.0 / (double)t->mesh->dp_size));
    return s ? s : c;
}

/* train.cuda_graph after the run's first step (run eagerly: it sizes every buffer and
 * workspace the capture then finds in place): step `step` + 1's batch staged and its
 * captured step queued behind the ones before, without waiting; its loss and norm come
 * with the next read (run_loop's flush). */
static lk_status graph_queue(trainer *t, int64_t step, int log_cap, int64_t *tokens) {
    const lk_train_config *tc = t->tc;
    double lr = lk_lr_schedule(step, tc->warmup_steps, tc->steps, tc->lr, tc->min_lr);
    lk_status s = next_batch(t);
    if (!s) s = t->dev->graph_step(t, step, lr, log_cap);
    if (s) return s;
    t->hist[step * LK_HIST_COLS + LK_HIST_LR] = (float)lr;
    *tokens = t->batch.B * t->batch.S;
    return LK_OK;
}

/* One optimizer step; *loss gets the mean of the micro-batch losses (over the DP group). */
static lk_status train_step(trainer *t, const lk_train_opts *o, double *loss, double *grad_norm, int64_t *tokens) {
    const lk_train_config *tc = t->tc;
    lk_model_zero_grad(t->model);
    double sum = 0.0;
    *tokens = 0;
    for (int64_t k = 0; k < tc->grad_accum; k++) {
        lk_step_stats st;
        int last = k == tc->grad_accum - 1 && t->world;
        if (last) {   /* the last micro-batch's backward sends the buckets as they are done */
            t->n_started = 0, t->start_error = LK_OK;
            lk_model_on_grads_ready(t->model, start_ready, t);
        }
        lk_status s = next_batch(t);
        if (!s && t->copy_current) lk_model_copy_is_current(t->model);
        if (!s) s = lk_model_forward_backward(t->model, &t->batch, (float)(1.0 / (double)tc->grad_accum), &st);
        if (!s) t->copy_current = 1;   /* it rounded the master, or was told it need not */
        if (last) {
            lk_model_on_grads_ready(t->model, NULL, NULL);
            lk_status f = finish_grads(t);
            if (!s) s = f;
        } else if (s && t->world) {   /* the others reach the all-reduces later: meet them there */
            t->n_started = 0, t->start_error = LK_OK;
            finish_grads(t);
        }
        if (s) return dp_agree(t, s);
        sum += st.loss;                                     /* the same on the SP ranks of a replica */
        *tokens += t->batch.B * t->batch.S / tc->sp;        /* the tokens this rank ran */
    }
    *loss = sum / (double)tc->grad_accum;
    if (t->world) {
        lk_status s = dp_agree(t, LK_OK);
        double red[2] = {sum, (double)*tokens};
        if (!s) s = lk_comm_all_reduce(t->world, red, 2, LK_COMM_F64);
        if (s) return s;
        *loss = red[0] / ((double)tc->grad_accum * (double)t->world->size);
        *tokens = (int64_t)red[1];
    }
    if (o->after_loss) o->after_loss(o->user, t->step, loss);
    if (!isfinite(*loss)) return LK_OK;   /* the caller stops before touching the weights */
    double lr = lk_lr_schedule(t->step, tc->warmup_steps, tc->steps, tc->lr, tc->min_lr);
    lk_status s = t->dev->update(t, lr, grad_norm);
    t->copy_current = t->dev->updates_copy;
    if (s || !isfinite(*grad_norm)) return s;
    float *row = t->hist + t->step * LK_HIST_COLS;
    row[LK_HIST_LR] = (float)lr;
    return LK_OK;
}

/* The loop's state between steps: the progress line's clock and totals. */
typedef struct {
    FILE *csv;
    int64_t every;   /* a log's line every `every` steps */
    int quiet, tty;
    double t0, tokens_total;
} loop_state;

/* The bookkeeping of step t->step + 1, which ran in dt seconds: a NaN or Inf loss or
 * norm stops the run (the step's update not applied); else its row of the history and
 * loss.csv, the logs, the progress line, the callbacks and a checkpoint when due, and
 * t->step advanced. */
static lk_status record_step(trainer *t, const lk_train_opts *o, lk_train_result *r, loop_state *ls, double loss,
                             double norm, int64_t tokens, double dt) {
    const lk_train_config *tc = t->tc;
    if (!isfinite(loss) || !isfinite(norm))
        return lk_error(LK_EINVAL, "train: step %lld: %s is %s: training stopped, the weights of this step not "
                        "updated; %s%s", (long long)t->step + 1, isfinite(loss) ? "gradient norm" : "loss",
                        isfinite(loss) ? (isnan(norm) ? "NaN" : "Inf") : (isnan(loss) ? "NaN" : "Inf"),
                        t->last_ckpt[0] ? "last good checkpoint: " : "no checkpoint was written yet", t->last_ckpt);
    ls->tokens_total += (double)tokens;
    uint64_t used = t->dev->mem_used ? t->dev->mem_used() : 0;
    if (used > t->mem_peak) t->mem_peak = used;
    float *row = t->hist + t->step * LK_HIST_COLS;
    row[LK_HIST_STEP] = (float)(t->step + 1);   /* updates done, as the progress line counts */
    row[LK_HIST_LOSS] = (float)loss;
    row[LK_HIST_GRAD_NORM] = (float)norm;
    row[LK_HIST_TOKENS_PER_S] = (float)((double)tokens / (dt > 0 ? dt : 1e-9));
    if (ls->csv) {
        fprintf(ls->csv, "%lld,%.7g,%.7g,%.7g,%.1f\n", (long long)row[0], row[1], row[2], row[3], row[4]);
        fflush(ls->csv);
    }
    if (o->loss_log && t->step < o->loss_log_cap) o->loss_log[t->step] = (float)loss;
    if (o->grad_norm_log && t->step < o->loss_log_cap) o->grad_norm_log[t->step] = (float)norm;
    if (t->step == t->start_step) r->first_loss = loss;
    r->last_loss = loss;
    t->step++;
    double elapsed = now_s() - ls->t0, per_step = elapsed / (double)(t->step - t->start_step);
    double rate = ls->tokens_total / elapsed, eta = per_step * (double)(tc->steps - t->step);
    int due = ls->tty || t->step == t->start_step + 1 || t->step % ls->every == 0 || t->step == tc->steps;
    if (!ls->quiet && due)   /* the run's average rate: steady where one step's is noisy */
        progress(t, row, rate, eta, ls->tty, t->step == tc->steps);
    if (o->on_step && t->writer)
        o->on_step(o->user, &(lk_train_step){.step = t->step, .steps = tc->steps, .loss = loss, .lr = row[LK_HIST_LR],
                                             .grad_norm = norm, .tokens_per_s = rate, .eta_s = eta,
                                             .peak_device_bytes = t->mem_peak});
    lk_status s = LK_OK;
    if (!o->no_save && tc->save_every > 0 && t->step % tc->save_every == 0 && t->step < tc->steps) {
        if (t->world) lk_comm_watchdog_grace(10 * tc->comm_timeout_s);   /* the others wait for rank 0's write */
        if (t->writer && ((s = lk_trainer_save(t)) || (s = write_plot(t)))) {}
        s = dp_agree(t, s);
        if (t->world) lk_comm_watchdog_grace(0);
    }
    return s;
}

/* train.cuda_graph's steps queued since the last read: their tokens, then their losses
 * and norms once read; the wall clock from the first one's queueing. */
typedef struct {
    int64_t *tokens;
    double *loss, *norm;
    int n, cap;
    double since;
} queue;

/* Whether the queued step `done` ends a log interval: the losses are read there, before a
 * checkpoint (which must not hold a step not yet checked) and at the run's end. */
static int flush_after(const trainer *t, const lk_train_opts *o, const loop_state *ls, const queue *q, int64_t done) {
    const lk_train_config *tc = t->tc;
    return done % ls->every == 0 || q->n >= q->cap || done == tc->steps || (o->stop_at > 0 && done >= o->stop_at) ||
           (tc->save_every > 0 && done % tc->save_every == 0);
}

/* The queued steps' losses and norms read at once, each recorded in order; the interval's
 * wall time shared out among them. */
static lk_status flush(trainer *t, const lk_train_opts *o, lk_train_result *r, loop_state *ls, queue *q) {
    int n = 0, queued = q->n;
    q->n = 0;
    lk_status s = t->dev->graph_read(t, q->loss, q->norm, q->cap, &n);
    if (!s && n != queued)
        s = lk_error(LK_EINTERNAL, "train: train.cuda_graph: %d steps queued, %d logged", queued, n);
    double dt = (now_s() - q->since) / (queued > 0 ? queued : 1);
    for (int i = 0; !s && i < n; i++) s = record_step(t, o, r, ls, q->loss[i], q->norm[i], q->tokens[i], dt);
    return s;
}

static lk_status run_loop(trainer *t, const lk_train_opts *o, lk_train_result *r) {
    const lk_train_config *tc = t->tc;
    lk_status s0;
    loop_state ls = {.quiet = o->quiet || !t->writer};
    ls.tty = !ls.quiet && isatty(STDOUT_FILENO);
    /* a terminal's line is rewritten every step; a log gets one every `every` steps */
    ls.every = tc->log_every > 0 ? tc->log_every : lk_train_log_every(tc->steps);
    ls.csv = t->writer ? open_csv(t) : NULL;
    if (t->writer && ls.csv == NULL) return dp_agree(t, LK_EIO);
    if ((s0 = dp_agree(t, LK_OK))) return s0;
    queue q = {0};
    if (tc->cuda_graph) {   /* at most a log interval queued (4096 steps) */
        ls.every = q.cap = ls.every < 4096 ? (int)ls.every : 4096;
        q.tokens = malloc((size_t)q.cap * (sizeof *q.tokens + 2 * sizeof *q.loss));
        if (!q.tokens) return lk_error(LK_ENOMEM, "train: train.cuda_graph: out of memory");
        q.loss = (double *)(q.tokens + q.cap), q.norm = q.loss + q.cap;
    }
    lk_status s = LK_OK;
    ls.t0 = now_s();
    for (;;) {
        int64_t step = t->step + q.n;   /* the step to run next, from 0 */
        if (step >= tc->steps || (o->stop_at > 0 && step >= o->stop_at)) break;
        if (t->world) lk_comm_watchdog_step(step + 1);   /* the step a stuck collective's message names */
        if (o->before_step) o->before_step(o->user, step, t->model);
        int profiled = t->dev->profile && step + 1 == tc->profile_step;
        if (profiled) t->dev->profile(1);
        if (q.cap && step > t->start_step) {   /* queued; read once per log interval */
            if (q.n == 0) q.since = now_s();
            s = graph_queue(t, step, q.cap, &q.tokens[q.n]);
            if (profiled) t->dev->profile(0);
            if (!s && ++q.n && flush_after(t, o, &ls, &q, step + 1)) s = flush(t, o, r, &ls, &q);
        } else {
            double ts = now_s(), loss = NAN, norm = NAN;
            int64_t tokens;
            s = train_step(t, o, &loss, &norm, &tokens);
            if (profiled) t->dev->profile(0);
            if (!s) s = record_step(t, o, r, &ls, loss, norm, tokens, now_s() - ts);
        }
        if (s) break;
    }
    if (q.n) {   /* a step failed to queue: the ones before it still count */
        lk_status f = flush(t, o, r, &ls, &q);
        if (!s) s = f;
    }
    free(q.tokens);
    if (ls.csv) fclose(ls.csv);
    if (ls.tty && s) printf("\n");   /* end the in-place line before the error is printed */
    r->seconds = now_s() - ls.t0;
    r->tokens_per_s = ls.tokens_total / (r->seconds > 0 ? r->seconds : 1e-9);
    r->steps_done = t->step;
    return s;
}

/* model.init_from: the published weights over the random ones, every name and shape
 * checked before any weight changes (lk_model_load_weights) and before any step. */
static lk_status init_weights(trainer *t) {
    lk_status s = lk_model_load_weights(t->model, t->tc->init_from);
    if (s) {
        char why[512];
        snprintf(why, sizeof why, "%s", lk_last_error());
        return lk_error(s, "train: model.init_from %s: %s", t->tc->init_from, why);
    }
    return LK_OK;
}

lk_status lk_train_run(const lk_train_config *tc, const lk_ops_config *ops, const char *resume,
                       const lk_train_opts *opts, lk_train_result *result) {
    static const lk_train_opts none = {0};
    lk_train_result r = {0};
    if (tc == NULL || ops == NULL) return lk_error(LK_EINVAL, "train: expected a train config and an ops config");
    const lk_train_opts *o = opts ? opts : &none;
    if (tc->cuda_graph && o->after_loss)   /* the graph's losses are read after their updates */
        return lk_error(LK_EINVAL, "train: train.cuda_graph: an after_loss hook needs each loss before its step's "
                        "update; a graph's are read once per log interval");
    trainer t;
    /* a rank that stops must not leave the others blocked in a collective for ever */
    int watched = o->mesh && o->mesh->world->size > 1 && tc->comm_timeout_s > 0;
    if (watched && lk_comm_watchdog_arm(tc->comm_timeout_s, o->mesh->world->rank)) return lk_error(LK_EINVAL,
        "train: train.comm_timeout_s: expected 0 (off) .. 1e9 seconds, got %g", tc->comm_timeout_s);
    if (watched) lk_comm_watchdog_grace(10 * tc->comm_timeout_s);   /* ranks load and verify at their own pace */
    lk_status s = trainer_init(&t, tc, ops, o->mesh, o->bucket_bytes, o->quiet);
    if (!s && resume) s = lk_trainer_resume(&t, resume);
    else if (!s && tc->init_from[0]) s = init_weights(&t);
    if (!s && t.writer) s = lk_mkdirs(tc->out);   /* the run starts: only now is train.out created */
    if (t.world) s = dp_agree(&t, s);
    if (watched) lk_comm_watchdog_grace(0);
    r.first_step = t.step;
    int run = !o->save_init;
    if (!s && !run && t.writer)   /* the weights the run would start from, and no step */
        s = lk_model_save_sharded(t.model, tc->out, tc->max_shard_size);
    if (!s && run && t.step < tc->steps) s = run_loop(&t, o, &r);
    int finished = run && t.step == tc->steps;
    if (watched) lk_comm_watchdog_grace(10 * tc->comm_timeout_s);   /* rank 0 writes the last checkpoint */
    if (!s && finished && t.writer && !o->no_save) s = lk_trainer_save(&t);
    if (!s && finished && t.writer && !o->no_save)   /* the final model: the output dir loads as one */
        s = lk_model_save_sharded(t.model, tc->out, tc->max_shard_size);
    if (finished) s = dp_agree(&t, s);
    if (t.writer && run && (!s || t.step > 0)) {                   /* a stopped run still plots what it did */
        char why[512];
        snprintf(why, sizeof why, "%s", lk_last_error());
        lk_status ps = write_plot(&t);
        if (!s) s = ps;
        else lk_error(s, "%s", why);                 /* the plot must not hide why the run stopped */
    }
    snprintf(r.last_checkpoint, sizeof r.last_checkpoint, "%s", t.last_ckpt);
    int64_t tail = t.step < 10 ? t.step : 10;
    for (int64_t i = t.step - tail; i < t.step; i++) r.tail_loss += t.hist[i * LK_HIST_COLS + LK_HIST_LOSS] / (double)tail;
    r.steps_done = t.step;
    r.buckets = t.buckets, r.buckets_early = t.buckets_early;
    r.peak_device_bytes = t.mem_peak;
    trainer_free(&t);
    if (watched) {
        lk_comm_watchdog_grace(0);
        lk_comm_watchdog_step(-1);
        lk_comm_watchdog_arm(0, 0);
    }
    if (result) *result = r;
    return s;
}

lk_status lk_train_mesh(const lk_train_config *tc, lk_comm *world, lk_mesh *out) {
    if (tc == NULL || out == NULL) return lk_error(LK_EINVAL, "train: mesh: expected a train config and a mesh");
    lk_status s = lk_comm_check("train: mesh", "world", world);
    if (s) return s;
    if (tc->dp < 0 || tc->dp > world->size || (tc->dp > 0 && world->size % tc->dp))
        return lk_error(LK_EINVAL, "train: parallel.dp: %lld does not divide the world size %d (mpirun -np)",
                        (long long)tc->dp, world->size);
    if (tc->sp < 1 || tc->ep < 1 || tc->sp > INT32_MAX || tc->ep > INT32_MAX)
        return lk_error(LK_EINVAL, "train: parallel: expected sp, ep >= 1, got %lld, %lld", (long long)tc->sp,
                        (long long)tc->ep);
    if ((s = lk_mesh_create(world, (int)tc->dp, (int)tc->sp, (int)tc->ep, out))) {
        char why[512];
        snprintf(why, sizeof why, "%s", lk_last_error());
        return lk_error(s, "train: parallel: dp %lld, sp %lld, ep %lld on world size %d (mpirun -np): %s",
                        (long long)tc->dp, (long long)tc->sp, (long long)tc->ep, world->size, why);
    }
    return LK_OK;
}
