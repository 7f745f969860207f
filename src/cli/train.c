/* train.c — `llmkern train --config FILE [--steps N] [--out DIR] [--resume DIR]
 * [--init DIR] [--device cpu|cuda]`: loads
 * the YAML config (model, train, data and ops sections), applies the command-line
 * overrides and runs the training loop (train.h). Exit status 2 on any error, with the
 * message (a NaN loss names the step and the last good checkpoint).
 *
 * Under mpirun (`mpirun -np N llmkern train ...`, an MPI build) the config's parallel:
 * mesh is built over the world before any work (one that does not divide N: exit 2) and
 * the run is data-, sequence- and expert-parallel over it; rank 0 prints and writes.
 * --json: stdout holds one JSON object per step ({step, steps, loss, lr, grad_norm,
 * tokens_per_s, eta_s}, JSON Lines) and the opening and closing lines go to stderr. */
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "core/checked.h"
#include "llmkern/train.h"

/* Launched by mpirun (OpenMPI, or a PMI launcher): only then is MPI initialized, so a
 * plain run stays the single-process path. */
static int under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static int run(const cli_opts *o, const lk_train_config *tc, lk_ops_config *ops, const lk_mesh *mesh);

int cli_train(const cli_opts *o) {
    if (o->config == NULL) {
        fprintf(stderr, "llmkern train: --config FILE is required (e.g. configs/tiny-moe.yaml)\n");
        return 2;
    }
    static lk_train_config tc;   /* large (the model config's lists): not on the stack */
    static lk_ops_config ops;
    lk_train_config_init(&tc);
    lk_ops_config_init(&ops);
    lk_status s = lk_train_config_load_yaml(o->config, &tc, &ops);
    if (s) return cli_fail("train", s);
    if (o->init && (s = lk_train_config_init_from(&tc, o->init))) return cli_fail("train", s);
    if (o->steps > 0) tc.steps = o->steps;
    if (o->out) snprintf(tc.out, sizeof tc.out, "%s", o->out);
    if (o->device && strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0) {
        fprintf(stderr, "llmkern train: --device: expected cpu or cuda, got '%s'\n", o->device);
        return 2;
    }
    if (o->device) tc.device = strcmp(o->device, "cuda") == 0 ? LK_DEVICE_CUDA : LK_DEVICE_CPU;
    if (tc.warmup_steps > tc.steps) tc.warmup_steps = tc.steps;
    lk_comm *world = NULL;
    if (!under_mpirun() || lk_comm_mpi_world(&world) != LK_OK || world->size == 1) {
        if (world) { lk_comm_destroy(world); lk_comm_mpi_finalize(); }
        return run(o, &tc, &ops, NULL);
    }
    lk_mesh mesh;
    int rc;
    if ((s = lk_train_mesh(&tc, world, &mesh))) rc = cli_fail("train", s);
    else {
        rc = run(o, &tc, &ops, &mesh);
        lk_mesh_destroy(&mesh);
    }
    lk_comm_destroy(world);
    lk_comm_mpi_finalize();
    return rc;
}

/* --json: one object per step on stdout (JSON Lines), through the writer of json.c. */
static void json_step(void *user, const lk_train_step *st) {
    cli_json j;
    cli_json_object(&j, stdout);
    cli_json_int(&j, "step", st->step);
    cli_json_int(&j, "steps", st->steps);
    cli_json_num(&j, "loss", "%.6g", st->loss);
    cli_json_num(&j, "lr", "%.6g", st->lr);
    cli_json_num(&j, "grad_norm", "%.6g", st->grad_norm);
    cli_json_num(&j, "tokens_per_s", "%.1f", st->tokens_per_s);
    cli_json_num(&j, "eta_s", "%.1f", st->eta_s);
    if (st->peak_device_bytes) cli_json_int(&j, "peak_device_bytes", (int64_t)st->peak_device_bytes);
    cli_json_close(&j);
    fflush(stdout);
}

static int run(const cli_opts *o, const lk_train_config *tc, lk_ops_config *ops, const lk_mesh *mesh) {
    int rank0 = mesh == NULL || mesh->world->rank == 0;
    FILE *say = o->json ? stderr : stdout;   /* --json: stdout holds the step objects alone */
    if (rank0 && o->save_init)
        fprintf(say, "the initial weights of %s (%lld layers, hidden %lld)%s%s into %s\n",
                tc->model.moe ? "Qwen3-MoE" : "Qwen3", (long long)tc->model.num_hidden_layers,
                (long long)tc->model.hidden_size, tc->init_from[0] ? ", from " : "", tc->init_from, tc->out);
    else if (rank0) fprintf(say, "training %s (%lld layers, hidden %lld, %lld experts) on %s for %lld steps of %lld x %lld tokens",
           tc->model.moe ? "Qwen3-MoE" : "Qwen3", (long long)tc->model.num_hidden_layers, (long long)tc->model.hidden_size,
           (long long)(tc->model.moe ? tc->model.num_experts : 0), lk_device_name(tc->device), (long long)tc->steps,
           (long long)tc->batch_size, (long long)tc->seq_len);
    int run = rank0 && !o->save_init;
    if (run && tc->grad_accum > 1) fprintf(say, " x %lld micro-batches", (long long)tc->grad_accum);
    if (run && mesh)
        fprintf(say, " on %d ranks (dp %d x sp %d, ep %d)", mesh->world->size, mesh->dp_size, mesh->sp_size, mesh->ep_size);
    if (run && tc->init_from[0] && !o->resume) fprintf(say, " from %s", tc->init_from);
    if (run) fprintf(say, " into %s%s%s\n", tc->out, o->resume ? ", resuming from " : "", o->resume ? o->resume : "");
    lk_train_result r;
    lk_train_opts opts = {.mesh = mesh, .quiet = o->json, .on_step = o->json ? json_step : NULL, .no_save = o->no_save,
                          .save_init = o->save_init};
    lk_status s = lk_train_run(tc, ops, o->resume, &opts, &r);
    if (s) return cli_fail("train", s);
    if (o->save_init) {
        if (rank0) fprintf(say, "done: the initial weights (config.json, model.safetensors) in %s, no step\n", tc->out);
        return 0;
    }
    if (rank0) fprintf(say, "done: steps %lld..%lld, loss %.4f -> %.4f (mean of the last %lld steps %.4f), %.1f s, %.0f tokens/s;\n"
           "checkpoint %s; %sloss.csv, loss.png in %s\n", (long long)r.first_step + 1, (long long)r.steps_done,
           r.first_loss, r.last_loss, (long long)(r.steps_done < 10 ? r.steps_done : 10), r.tail_loss, r.seconds,
           r.tokens_per_s, r.last_checkpoint[0] ? r.last_checkpoint : "none", o->no_save ? "" : "model, ", tc->out);
    char b[32];
    if (rank0 && r.peak_device_bytes)
        fprintf(say, "peak GPU memory %s (cudaMemGetInfo: in use after a step, the CUDA context included)\n",
                lk_bytes_str(r.peak_device_bytes, b, sizeof b));
    return 0;
}
