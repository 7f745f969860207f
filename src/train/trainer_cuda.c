/* trainer_cuda.c — the training loop's optimizer on a GPU (trainer.h: lk_train_device):
 * one GPU per rank (the node-local rank's, modulo the GPUs there), the gradient buckets
 * summed over an NCCL communicator of the world's ranks, and each step's clipping and
 * update as the multi-tensor kernels of cuda_train.h (a deterministic norm, one AdamW
 * launch over every parameter). Built with CUDA only. The math is the CPU optimizer's
 * (trainer.c), so a GPU run follows a CPU run's loss curve to f32 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include "core/cuda_check.h"
#include "llmkern/cuda_train.h"
#include "llmkern/model.h"
#include "train/trainer.h"

/* The rank's index among the processes on its node, as the launchers export it. */
static int local_rank(const lk_comm *world) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return world ? world->rank : 0;
}

static lk_status pick(const lk_comm *world) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return lk_error(LK_EUNAVAILABLE, "train: device cuda: no GPU here (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    LK_CUDA_TRY(cudaSetDevice(local_rank(world) % n));
    return LK_OK;
}

static lk_status grads_comm(lk_comm *world, lk_comm **out) {
    int dev = 0;
    LK_CUDA_TRY(cudaGetDevice(&dev));
    return lk_comm_nccl_create(world, dev, out);
}

static lk_status scale(trainer *t, void *x, lk_dtype dt, int64_t n, float s) {
    lk_cuda_buf b = {x, n, dt};
    return lk_cuda_scale_bufs(&b, 1, s, &t->ctx);
}

/* Every parameter's AdamW tensor (a calloc'd list; NULL when out of memory), and the
 * hyperparameters at lr for update number step. */
static lk_cuda_adamw_tensor *adamw_tensors(trainer *t) {
    lk_cuda_adamw_tensor *p = calloc((size_t)t->n_params, sizeof *p);
    for (int i = 0; p && i < t->n_params; i++) {
        const lk_param *q = lk_model_param(t->model, i);
        /* bf16 with an f32 master: AdamW writes the ops' copy too; without (a bf16 value): rounds it */
        void *copy = lk_model_param_copy(t->model, i);
        /* Decay matrices only, as on the CPU. */
        p[i] = (lk_cuda_adamw_tensor){.param = copy ? copy : q->value.data, .grad = t->grads[i], .m = t->m[i],
                                      .v = t->v[i], .master = copy ? q->value.data : NULL, .n = t->lens[i],
                                      .param_dtype = copy ? LK_BF16 : q->value.dtype, .grad_dtype = t->gdt,
                                      .no_decay = q->value.ndim < 2, .m_dtype = t->tc->exp_avg_dtype,
                                      .v_dtype = t->tc->exp_avg_sq_dtype};
    }
    return p;
}

static lk_cuda_adamw_hparams hparams(const trainer *t, double lr, int64_t step) {
    const lk_train_config *tc = t->tc;
    return (lk_cuda_adamw_hparams){.lr = lr, .beta1 = tc->beta1, .beta2 = tc->beta2, .eps = tc->eps,
                                   .weight_decay = tc->weight_decay, .step = step, .seed = tc->seed};
}

/* Clipped as AdamW reads the gradients (grad_scale), not scaled in place first: one pass
 * less, a bf16 gradient rounded once, and the bits of the graph's plan (which clips so). */
static lk_status update(trainer *t, double lr, double *norm) {
    int n = t->n_params;
    lk_cuda_buf *g = calloc((size_t)n, sizeof *g);
    lk_cuda_adamw_tensor *p = adamw_tensors(t);
    lk_status s = g && p ? LK_OK : lk_error(LK_ENOMEM, "train: optimizer step: out of memory");
    for (int i = 0; !s && i < n; i++) g[i] = (lk_cuda_buf){t->grads[i], t->lens[i], t->gdt};
    if (!s) s = lk_cuda_grad_norm(g, n, norm, &t->ctx);
    if (!s && isfinite(*norm)) {
        lk_cuda_adamw_hparams h = hparams(t, lr, t->step + 1);
        h.grad_scale = lk_clip_scale(*norm, t->tc->grad_clip);
        s = lk_cuda_adamw_step(p, n, &h, &t->ctx);
    }
    free(g);
    free(p);
    return s;
}

/* --- train.cuda_graph ------------------------------------------------------------------
 * Two captured steps, one per stage slot (the model's pinned token arrays and the plan's
 * scalars): step t runs slot t % 2, so the host stages step t + 1 while step t runs and
 * waits only for step t - 1 (the slot's previous user) to complete. Each step's loss and
 * norm go to the plan's log on the device, read once per log interval (graph_read). */

typedef struct {
    cudaGraphExec_t exec;            /* NULL until the slot's first capture */
    int64_t T, n_segs, max_seqlen;   /* the batch shape exec was captured for */
    cudaEvent_t done;                /* recorded after the slot's last launch */
} graph_slot;

typedef struct {
    cudaStream_t stream;          /* the model's and the captured steps' */
    graph_slot slot[LK_CUDA_PLAN_SLOTS];
    lk_cuda_adamw_plan *plan;     /* the update without the host, and the step log */
} graph_state;

static void graph_free(trainer *t) {
    graph_state *g = t->graph;
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    for (int i = 0; i < LK_CUDA_PLAN_SLOTS; i++) {
        if (g->slot[i].exec) cudaGraphExecDestroy(g->slot[i].exec);
        if (g->slot[i].done) cudaEventDestroy(g->slot[i].done);
    }
    lk_cuda_adamw_plan_free(g->plan);
    if (t->model) lk_model_set_stream(t->model, NULL), lk_model_set_stage_slot(t->model, 0);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
    t->graph = NULL;
}

static lk_status graph_init(trainer *t) {
    graph_state *g = calloc(1, sizeof *g);
    if (!g) return lk_error(LK_ENOMEM, "train: train.cuda_graph: out of memory");
    t->graph = g;
    /* a blocking stream: the legacy stream's copies (checkpoints, the log's read) wait for it */
    LK_CUDA_TRY(cudaStreamCreateWithFlags(&g->stream, cudaStreamDefault));
    for (int i = 0; i < LK_CUDA_PLAN_SLOTS; i++) {
        LK_CUDA_TRY(cudaEventCreateWithFlags(&g->slot[i].done, cudaEventDisableTiming));
        LK_CUDA_TRY(cudaEventRecord(g->slot[i].done, g->stream));
    }
    lk_model_set_stream(t->model, g->stream);
    return LK_OK;
}

/* The plan over every parameter, the tensors update() steps; its log holds a log interval. */
static lk_status make_plan(trainer *t, graph_state *g, int log_cap) {
    lk_cuda_adamw_tensor *p = adamw_tensors(t);
    if (!p) return lk_error(LK_ENOMEM, "train: train.cuda_graph: out of memory");
    lk_cuda_adamw_hparams h = hparams(t, 0.0, 1);   /* lr and step: set each step */
    lk_status s = lk_cuda_adamw_plan_create(p, t->n_params, &h, t->tc->grad_clip, log_cap, &g->plan);
    free(p);
    return s;
}

/* Records the staged step into slot i's exec: instantiated the first time, updated in
 * place after (cudaGraphExecUpdate: the same kernels with other arguments, far cheaper
 * than a new instantiation when a batch has another documents' count). A host sync inside
 * the step (a device-to-host read, a synchronize, a copy from pageable memory) makes the
 * capture fail: the error says so. */
static lk_status capture(trainer *t, graph_state *g, int i, int64_t step) {
    graph_slot *sl = &g->slot[i];
    LK_CUDA_TRY(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeGlobal));
    lk_status s = lk_model_defer_stats(t->model, 1);
    lk_step_stats st;
    lk_model_zero_grad(t->model);
    if (t->copy_current) lk_model_copy_is_current(t->model);   /* the step before wrote it: no rounding captured */
    if (!s) s = lk_model_forward_backward(t->model, &t->batch, 1.0f, &st);   /* grad_accum 1 */
    lk_ctx c = t->ctx;
    c.stream = g->stream;
    if (!s) s = lk_cuda_adamw_plan_step(g->plan, i, lk_model_loss_device(t->model), &c);
    char why[400] = "";
    if (s) snprintf(why, sizeof why, "%s", lk_last_error());
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    lk_model_defer_stats(t->model, 0);
    if (s || e != cudaSuccess) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return lk_error(LK_EUNAVAILABLE, "train: train.cuda_graph: step %lld could not be captured (%s): a host sync "
                        "or a read back inside the step (a module whose implementation waits on the GPU)",
                        (long long)step + 1, s ? why : cudaGetErrorString(e));
    }
    cudaGraphExecUpdateResultInfo info;
    if (sl->exec && cudaGraphExecUpdate(sl->exec, graph, &info) != cudaSuccess) {   /* another shape of graph */
        cudaGetLastError();
        cudaGraphExecDestroy(sl->exec);
        sl->exec = NULL;
    }
    e = sl->exec ? cudaSuccess : cudaGraphInstantiate(&sl->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        sl->exec = NULL;
        return lk_cuda_fail(e, "train: train.cuda_graph: instantiate", __FILE__, __LINE__);
    }
    const lk_batch *b = &t->batch;
    sl->T = b->B * b->S, sl->n_segs = b->n_segs, sl->max_seqlen = b->max_seqlen;
    return LK_OK;
}

/* Step `step` + 1 of t->batch at lr, queued behind the one before: its slot waited for,
 * the batch staged there, the slot's graph captured when the batch's shape is new to it,
 * then launched. */
static lk_status graph_step(trainer *t, int64_t step, double lr, int log_cap) {
    graph_state *g = t->graph;
    const lk_batch *b = &t->batch;
    int i = (int)(step % LK_CUDA_PLAN_SLOTS);
    graph_slot *sl = &g->slot[i];
    lk_status s = g->plan ? LK_OK : make_plan(t, g, log_cap);
    if (s) return s;
    LK_CUDA_TRY(cudaEventSynchronize(sl->done));   /* the step that last read slot i has run */
    if ((s = lk_model_set_stage_slot(t->model, i)) || (s = lk_model_stage_batch(t->model, b)) ||
        (s = lk_cuda_adamw_plan_set(g->plan, i, lr, step + 1)))
        return s;
    /* the kernels' arguments hold the documents' count and the longest one's length */
    if (!sl->exec || sl->T != b->B * b->S || sl->n_segs != b->n_segs || sl->max_seqlen != b->max_seqlen)
        s = capture(t, g, i, step);
    if (s) return s;
    LK_CUDA_TRY(cudaGraphLaunch(sl->exec, g->stream));
    LK_CUDA_TRY(cudaEventRecord(sl->done, g->stream));
    return LK_OK;
}

/* The queued steps' losses and norms, oldest first (waits for them). */
static lk_status graph_read(trainer *t, double *loss, double *norm, int cap, int *n) {
    graph_state *g = t->graph;
    if (!g->plan) return *n = 0, LK_OK;
    return lk_cuda_adamw_plan_read(g->plan, loss, norm, cap, n);
}

static uint64_t mem_used(void) {
    size_t free_b = 0, total = 0;
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? (uint64_t)(total - free_b) : 0;
}

static void profile(int on) {
    cudaDeviceSynchronize();   /* the step's kernels inside the range, and only they */
    if (on) cudaProfilerStart();
    else cudaProfilerStop();
}

const lk_train_device lk_train_device_cuda = {
    /* 128 MiB: on two NVLink H200s, 4 MiB buckets made the step slower than one bucket
     * after the backward (per-call cost and SMs taken from the backward's GEMMs), 128 MiB
     * hid 40% of the exposed all-reduce (bench/NOTES.md, run 26) */
    .type = LK_DEVICE_CUDA, .bucket_bytes = (int64_t)128 << 20, .pick = pick, .grads_comm = grads_comm,
    .scale = scale, .update = update, .updates_copy = 1, .mem_used = mem_used, .profile = profile,
    .graph_init = graph_init, .graph_step = graph_step, .graph_read = graph_read, .graph_free = graph_free,
};
