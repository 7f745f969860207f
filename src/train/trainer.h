/* trainer.h — internal to src/train: the training loop's state, shared by trainer.c
 * (the loop, progress, loss.csv and plot) and train_state.c (checkpoints and resume). */
#ifndef LLMKERN_TRAIN_TRAINER_H
#define LLMKERN_TRAIN_TRAINER_H

#include "llmkern/context.h"
#include "llmkern/data.h"
#include "llmkern/model.h"
#include "llmkern/train.h"

/* Columns of the loss history (one row per step, step counted from 1), as in loss.csv. */
enum { LK_HIST_STEP, LK_HIST_LOSS, LK_HIST_LR, LK_HIST_GRAD_NORM, LK_HIST_TOKENS_PER_S, LK_HIST_COLS };

struct trainer;

/* Where the optimizer runs: the model's device, one struct per device (trainer.c holds
 * the CPU's; trainer_cuda.c the GPU's, built with CUDA only). The AdamW moments live in
 * the model's memory (model/device.h: allocated, freed and copied for checkpoints by it). */
typedef struct {
    lk_device_type type;
    int64_t bucket_bytes;   /* the gradient all-reduce's default bucket (bench/NOTES.md, run 26) */
    /* Before the model exists: the device this rank uses (one GPU per rank of world, which
     * may be NULL for one process). */
    lk_status (*pick)(const lk_comm *world);
    /* The communicator the gradient buckets are summed over: world itself, or on a GPU an
     * NCCL communicator of world's ranks (device buffers). */
    lk_status (*grads_comm)(lk_comm *world, lk_comm **out);
    /* x[i] *= s, x of dt (f32, or bf16 rounded once) */
    lk_status (*scale)(struct trainer *t, void *x, lk_dtype dt, int64_t n, float s);
    /* *norm = the global gradient norm, grads clipped to grad_clip, then one AdamW step at
     * lr for update number t->step + 1. */
    lk_status (*update)(struct trainer *t, double lr, double *norm);
    /* 1: update (and graph_step's) AdamW writes the model's bf16 compute copy along with the
     * master (lk_model_param_copy), so the next forward need not round it again */
    int updates_copy;
    /* Bytes in use on the device now (NULL: not measured, the CPU). */
    uint64_t (*mem_used)(void);
    /* The device profiler on (1) or off (0) around train.profile_step (NULL: none). */
    void (*profile)(int on);
    /* train.cuda_graph (NULL: the device has none). graph_init before the first step puts
     * the model on a stream of its own; graph_step queues step `step` + 1 of t->batch at
     * lr: zero_grad, forward, backward, clipping and AdamW captured in a CUDA graph the
     * first time for a batch shape (tokens, documents, the longest), then replayed, without
     * waiting for it (log_cap: the most steps queued between two reads); graph_read waits
     * for the queued steps and gives each one's loss and gradient norm before clipping,
     * oldest first. After a step with a NaN or Inf loss or norm no queued step changes the
     * weights. */
    lk_status (*graph_init)(struct trainer *t);
    lk_status (*graph_step)(struct trainer *t, int64_t step, double lr, int log_cap);
    lk_status (*graph_read)(struct trainer *t, double *loss, double *norm, int cap, int *n);
    void (*graph_free)(struct trainer *t);
} lk_train_device;

typedef struct trainer {
    const lk_train_config *tc;
    const lk_train_device *dev;
    lk_model *model;
    int n_params;
    void **m, **v;            /* AdamW state per param (the param's shape; train.exp_avg_dtype, _sq_dtype) */
    void **grads;             /* each param's grad data, for the global norm */
    lk_dtype gdt;             /* their dtype (train.main_grads_dtype) */
    int64_t *lens;            /* each param's element count */
    lk_dataset ds;
    lk_data_iter it;
    lk_batch batch;
    float *hist;              /* [tc->steps][LK_HIST_COLS] */
    int64_t step, start_step; /* the next step to run; the first step of this run */
    char last_ckpt[1100];     /* the last checkpoint written or resumed from, "" if none */
    const lk_mesh *mesh;      /* the DP x SP (x EP) mesh; NULL for one process */
    lk_comm *world;           /* mesh->world; NULL for one process */
    lk_comm *gcomm;           /* the gradients' all-reduce: world, or NCCL over it on a GPU */
    lk_mesh dmesh;            /* a GPU's mesh over gcomm (NCCL groups, device buffers); unused on a CPU */
    int has_dmesh;
    lk_arena arena;           /* the GPU optimizer's workspace */
    lk_ctx ctx;
    int writer;               /* 1 on the rank that writes files and progress (rank 0) */
    lk_batch skip;            /* DP: the other replicas' batches, read past */
    /* the gradient all-reduce, overlapped with the backward (trainer.c: start_ready) */
    void *flat;               /* the model's flat gradients, n_flat elements of gdt */
    uint16_t *flat_bf16;      /* train.grad_reduce_dtype bf16 over f32 gradients: the buckets rounded,
                               * reduced here */
    int64_t n_flat, bucket, n_buckets, n_started;
    int64_t buckets, buckets_early;   /* totals for lk_train_result */
    uint64_t mem_peak;                /* the most dev->mem_used after a step */
    lk_comm_request *reqs;    /* [n_buckets] */
    void *graph;              /* train.cuda_graph: the device's captured step (trainer_cuda.c) */
    int copy_current;         /* the model's compute copy is its master rounded: said before each forward */
    lk_status start_error;
} trainer;

#pragma GCC visibility push(hidden)
extern const lk_train_device lk_train_device_cpu;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_train_device lk_train_device_cuda;
#endif
lk_status lk_mkdirs(const char *path);
/* estimate.c: the layers (the first n) that tc makes again: n[0] whole (train.recompute with
 * recompute_num_layers), n[1] their norms, n[2] their experts, n[3] their q, k, v
 * (train.recompute_modules). */
void lk_train_recompute_layers(const lk_train_config *tc, int n[1 + LK_RECOMPUTE_MODULES]);
/* Writes out/checkpoint-<step>/ and then out/latest. */
lk_status lk_trainer_save(trainer *t);
/* Loads weights, optimizer state, history and the data iterator from a checkpoint (or
 * an output directory's latest); sets step and start_step. */
lk_status lk_trainer_resume(trainer *t, const char *resume);
#pragma GCC visibility pop

#endif
