/* dist_train.c — data-parallel training over the MPI world (train.h: lk_train_run with
 * opts.dp_comm, lk_train_mesh): 10 steps of a tiny dense Qwen3 with dp = P, each rank a
 * batch of B, against one process running the same P shards as P micro-batches of B
 * (grad_accum P) on rank 0: the same gradients up to summation order, so the losses
 * agree within 1e-5 relative. Also the rejections: a mesh that does not divide the
 * world, sp or ep other than 1 (in the mesh and in the YAML parallel: section).
 * Run: mpirun -np 2|4 ./dist_train. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"

#define STEPS 10
#define TOL 1e-5   /* f32: the P micro-batch gradients summed in another order */

static lk_train_config tc;
static lk_ops_config ops;

static void tiny_dense(const char *out, int64_t grad_accum) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 0);
    c->hidden_size = 32; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 8; c->intermediate_size = 64; c->vocab_size = 320; c->tie_word_embeddings = 1;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = STEPS; tc.warmup_steps = 2; tc.batch_size = 2; tc.seq_len = 32; tc.grad_accum = grad_accum;
    tc.lr = 3e-3; tc.min_lr = 3e-4; tc.corpus_docs = 64;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static void rm_rf(const char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", d);
}

static void dp_matches_grad_accum(void) {
    int P = dist_world->size, r = dist_world->rank;
    char dir[64] = "/tmp/llmkern_dist_train_XXXXXX";
    /* grad norms too: AdamW is nearly blind to a gradient's scale, so a DP average taken
     * over the wrong count would barely move the loss; the norm shows it at once */
    float ref[STEPS] = {0}, dp[STEPS] = {0}, ref_norm[STEPS] = {0}, dp_norm[STEPS] = {0};
    if (r == 0) {
        DIST_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        char single[128];
        snprintf(single, sizeof single, "%s/single", dir);
        tiny_dense(single, P);
        lk_train_opts o = {.quiet = 1, .loss_log = ref, .grad_norm_log = ref_norm, .loss_log_cap = STEPS};
        DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, NULL) == LK_OK, "single-process run");
    }
    DIST_CHECK(lk_comm_broadcast(dist_world, dir, sizeof dir, 0) == LK_OK, "broadcast dir");
    char out[128];
    snprintf(out, sizeof out, "%s/dp", dir);
    tiny_dense(out, 1);
    lk_mesh mesh;
    DIST_CHECK(lk_train_mesh(&tc, dist_world, &mesh) == LK_OK && mesh.dp_size == P, "mesh of dp %d", P);
    lk_train_opts o = {.quiet = 1, .loss_log = dp, .grad_norm_log = dp_norm, .loss_log_cap = STEPS,
                       .dp_comm = mesh.dp};
    DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, NULL) == LK_OK, "dp run");
    lk_mesh_destroy(&mesh);
    if (r == 0) {
        for (int i = 0; i < STEPS; i++) {
            double e = dist_rel_err(&dp[i], &ref[i], 1);
            DIST_CHECK(e <= TOL, "step %d: dp loss %.9g vs single %.9g (relative %.3g)", i + 1, dp[i], ref[i], e);
            double en = dist_rel_err(&dp_norm[i], &ref_norm[i], 1);
            DIST_CHECK(en <= TOL, "step %d: dp grad norm %.9g vs single %.9g (relative %.3g)", i + 1, dp_norm[i],
                       ref_norm[i], en);
        }
        DIST_CHECK(ref[STEPS - 1] < ref[0], "the loss falls: %g -> %g", ref[0], ref[STEPS - 1]);
        char path[200];
        snprintf(path, sizeof path, "%s/loss.csv", out);
        DIST_CHECK(access(path, F_OK) == 0, "rank 0 wrote %s", path);
    }
    /* every rank reports the same (group-mean) loss */
    float r0[STEPS];
    memcpy(r0, dp, sizeof r0);
    DIST_CHECK(lk_comm_broadcast(dist_world, r0, sizeof r0, 0) == LK_OK, "broadcast losses");
    DIST_CHECK(memcmp(r0, dp, sizeof r0) == 0, "rank %d's losses equal rank 0's", r);
    DIST_CHECK(lk_comm_barrier(dist_world) == LK_OK, "barrier");
    if (r == 0) rm_rf(dir);
}

static void rejections(void) {
    int P = dist_world->size;
    lk_mesh mesh;
    tiny_dense("/tmp/unused", 1);
    tc.dp = P + 1;   /* does not divide the world: refused before any collective */
    lk_status s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "parallel.dp"), "dp %d of %d: %s", P + 1, P, lk_status_name(s));
    tc.dp = 1;       /* divides it, but dp x 1 x 1 is not the world */
    s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "world size"), "dp 1 of %d: %s", P, lk_status_name(s));
    tc.dp = 0, tc.sp = 2;
    s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "not yet supported"), "sp 2: %s", lk_status_name(s));
    /* the YAML section: sp, ep other than 1 and unknown keys, with file:line:column */
    const char *bad[3] = {"parallel: {dp: 2, sp: 2}\n", "parallel:\n  ep: 4\n", "parallel: {dp: 2, tp: 2}\n"};
    const char *want[3] = {":1:", ":2:", ":1:"};
    const char *what[3] = {"not yet supported", "not yet supported", "tp"};
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/llmkern_dist_train_%d_%d.yaml", (int)getpid(), i);
        FILE *f = fopen(path, "w");
        DIST_CHECK(f != NULL, "%s", path);
        if (f == NULL) continue;
        fputs(bad[i], f);
        fclose(f);
        lk_train_config_init(&tc);
        lk_ops_config_init(&ops);
        s = lk_train_config_load_yaml(path, &tc, &ops);
        const char *e = lk_last_error();
        DIST_CHECK(s == LK_EINVAL && strstr(e, want[i]) && strstr(e, what[i]), "yaml %d: %s", i, lk_status_name(s));
        remove(path);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/llmkern_dist_train_%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    DIST_CHECK(f != NULL, "%s", path);
    if (f) {
        fputs("parallel: {dp: 3, sp: 1, ep: 1}\n", f);
        fclose(f);
        lk_train_config_init(&tc);
        s = lk_train_config_load_yaml(path, &tc, &ops);
        DIST_CHECK(s == LK_OK && tc.dp == 3 && tc.sp == 1 && tc.ep == 1, "good yaml: %s", lk_status_name(s));
        remove(path);
    }
}

int main(void) {
    dist_begin();
    rejections();
    dp_matches_grad_accum();
    return dist_end("dist_train");
}
