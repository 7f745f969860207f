/* dist_train.c — training over the MPI world (train.h: lk_train_run with opts.mesh,
 * lk_train_mesh; model.h: lk_model_set_parallel), each run against one process running
 * the same data as micro-batches (grad_accum = the DP size) on rank 0: the same
 * gradients up to summation order, so losses and gradient norms agree within f32
 * tolerance.
 *   - dense Qwen3, dp = P: 10 steps, 1e-5; again with train.grad_reduce_dtype bf16 (the
 *     gradients summed in bf16 on the wire): 5e-3, and not the f32 run's bits; again with
 *     bf16 AdamW moments: 1e-4; in bf16 with bf16 gradients (train.main_grads_dtype) against
 *     one bf16 process with f32 ones: 2e-2.
 *   - tiny Qwen3-MoE, sp = 2, ep = 2, dp = P/2 (at -np 4 the dp 2 x sp 2, ep 2):
 *     20 steps; each SP rank runs half of every sequence through Ulysses attention,
 *     each EP rank half of the experts through the all-to-all dispatcher (and again
 *     through the all-gather one, and with flex_attention on the model's document
 *     BlockMask), and the aux loss spans the SP group; again with every layer made again
 *     in the backward (train.recompute) on the mesh alone.
 * Also the rejections: meshes that do not divide the world, a config that does not
 * match the mesh, heads or experts the groups do not divide, an attention without an SP
 * path, an explicit local dispatcher under EP, bad parallel: YAML.
 * Run: mpirun -np 2|4 ./dist_train. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"

#define STEPS_DP 10
#define STEPS_MOE 20
#define TOL_DP 1e-5    /* f32: the P micro-batch gradients summed in another order */
/* f32 over 20 AdamW steps: SP sums each loss and aux statistic over two halves, EP sums
 * each token's expert outputs in another order; the differences grow a little with each
 * step (measured ~1e-6 .. 1e-5), far below what a wrong scale or a lost gradient moves */
#define TOL_MOE 1e-4
/* bf16 all-reduce: each bucket rounded to bf16 (2^-9 relative) before the sum and the
 * partial sums rounded again; the loss and the norm moved by 5e-4 (4 ranks) and 8e-4 (2)
 * over 10 steps, a wrong scale (1/P) or a lost bucket moves them by > 30% */
#define TOL_BF16 5e-3
/* bf16 gradients against f32 ones: the losses moved by <= 7e-5 and the norms by <= 3e-4, but
 * by 6.3e-3 at 4 ranks' step 7, a spike (norm 2.4 where its neighbours are 1.3-1.7) that
 * bf16 compute alone moves by 3.5% from f32: that norm hangs on a few large elements */
#define TOL_BF16_GRADS 2e-2

static lk_train_config tc;
static lk_ops_config ops;
static lk_dtype moments = LK_F32;   /* the runs' train.exp_avg_dtype and exp_avg_sq_dtype */
/* bf16: the runs compute in bf16, and one micro-batch (the mesh's) keeps bf16 gradients
 * (train.main_grads_dtype; the single process sums dp micro-batches in f32 ones) */
static lk_dtype grads = LK_F32;
/* the mesh's run makes its layers again in the backward (train.recompute; the one process
 * keeps them): under EP a layer made again skips the dispatcher, which keeps nothing */
static int recompute;

static void tiny(const char *out, int moe, int64_t steps, int64_t grad_accum) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, moe);
    c->hidden_size = 32; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 8; c->intermediate_size = 64; c->vocab_size = 320; c->tie_word_embeddings = 1;
    if (moe) {
        c->moe = 1; c->num_experts = 4; c->num_experts_per_tok = 2; c->moe_intermediate_size = 32;
        c->decoder_sparse_step = 1; c->router_aux_loss_coef = 0.01;
        snprintf(c->model_type, sizeof c->model_type, "qwen3_moe");
    }
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = steps; tc.warmup_steps = 2; tc.batch_size = 2; tc.seq_len = 32; tc.grad_accum = grad_accum;
    tc.lr = 3e-3; tc.min_lr = 3e-4; tc.corpus_docs = 64;
    tc.exp_avg_dtype = tc.exp_avg_sq_dtype = moments;
    if (grads == LK_BF16) tc.dtype = LK_BF16, tc.main_grads_dtype = grad_accum == 1 ? LK_BF16 : LK_F32;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

/* The run of (dp, sp, ep) over the world, experts through `dispatcher` and attention
 * through `attn` (NULL: the default, flash_attention_2), against one process with
 * grad_accum dp and the default attention. */
static void matches_single(int moe, const char *dispatcher, const char *attn, int64_t steps, int dp, int sp, int ep,
                           double tol, lk_dtype reduce) {
    int r = dist_world->rank;
    char dir[64] = "/tmp/llmkern_dist_train_XXXXXX";
    /* grad norms too: AdamW is nearly blind to a gradient's scale, so a DP average taken
     * over the wrong count would barely move the loss; the norm shows it at once */
    float ref[STEPS_MOE] = {0}, got[STEPS_MOE] = {0}, ref_norm[STEPS_MOE] = {0}, got_norm[STEPS_MOE] = {0};
    if (r == 0) {
        DIST_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        char single[128];
        snprintf(single, sizeof single, "%s/single", dir);
        tiny(single, moe, steps, dp);
        lk_train_opts o = {.quiet = 1, .loss_log = ref, .grad_norm_log = ref_norm, .loss_log_cap = steps};
        DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, NULL) == LK_OK, "single-process run");
    }
    DIST_CHECK(lk_comm_broadcast(dist_world, dir, sizeof dir, 0) == LK_OK, "broadcast dir");
    char out[128];
    snprintf(out, sizeof out, "%s/mesh", dir);
    tiny(out, moe, steps, 1);
    tc.dp = dp, tc.sp = sp, tc.ep = ep;
    tc.grad_reduce_dtype = reduce;
    tc.recompute = recompute;
    if (moe) lk_ops_config_set(&ops, "moe.dispatcher", dispatcher, "test");
    if (attn) lk_ops_config_set(&ops, "attention", attn, "test");
    lk_mesh mesh;
    DIST_CHECK(lk_train_mesh(&tc, dist_world, &mesh) == LK_OK && mesh.dp_size == dp && mesh.sp_size == sp &&
               mesh.ep_size == ep, "mesh dp %d sp %d ep %d", dp, sp, ep);
    /* 8 KiB buckets: the tiny model's gradients travel in many, most of them while its
     * backward still runs */
    lk_train_opts o = {.quiet = 1, .loss_log = got, .grad_norm_log = got_norm, .loss_log_cap = steps, .mesh = &mesh,
                       .bucket_bytes = 8 << 10};
    lk_train_result res;
    DIST_CHECK(lk_train_run(&tc, &ops, NULL, &o, &res) == LK_OK, "mesh run dp %d sp %d ep %d", dp, sp, ep);
    DIST_CHECK(res.buckets > steps && res.buckets_early * 2 >= res.buckets, "buckets %lld, %lld during the backward",
               (long long)res.buckets, (long long)res.buckets_early);
    lk_mesh_destroy(&mesh);
    if (r == 0) {
        double worst = 0;
        for (int i = 0; i < steps; i++) {
            double e = dist_rel_err(&got[i], &ref[i], 1), en = dist_rel_err(&got_norm[i], &ref_norm[i], 1);
            worst = e > worst ? e : en > worst ? en : worst;
            DIST_CHECK(e <= tol, "dp %d sp %d ep %d step %d: loss %.9g vs single %.9g (relative %.3g)", dp, sp, ep,
                       i + 1, got[i], ref[i], e);
            DIST_CHECK(en <= tol, "dp %d sp %d ep %d step %d: grad norm %.9g vs single %.9g (relative %.3g)", dp, sp,
                       ep, i + 1, got_norm[i], ref_norm[i], en);
        }
        if (reduce == LK_BF16 || grads == LK_BF16)
            DIST_CHECK(worst > 0, "bf16 gradients on the wire: the f32 run's bits, the bf16 path not taken");
        printf("dist_train: dp %d sp %d ep %d %s%s%s%s%s%s%s, %lld steps: loss %.5f -> %.5f, worst relative difference "
               "from one process %.2g (loss or grad norm); %lld all-reduce buckets, %lld started during the "
               "backward\n", dp, sp, ep, moe ? "MoE " : "dense", moe ? dispatcher : "", attn ? " " : "",
               attn ? attn : "", reduce == LK_BF16 ? " (bf16 all-reduce)" : grads == LK_BF16 ? " (bf16 gradients)" : "",
               moments == LK_BF16 ? " (bf16 AdamW moments)" : "", recompute ? " (recompute)" : "", (long long)steps, got[0],
               got[steps - 1], worst, (long long)res.buckets, (long long)res.buckets_early);
        DIST_CHECK(ref[steps - 1] < ref[0], "the loss falls: %g -> %g", ref[0], ref[steps - 1]);
        char path[200];
        snprintf(path, sizeof path, "%s/loss.csv", out);
        DIST_CHECK(access(path, F_OK) == 0, "rank 0 wrote %s", path);
    }
    /* every rank reports the same (world-mean) loss */
    float r0[STEPS_MOE];
    memcpy(r0, got, sizeof r0);
    DIST_CHECK(lk_comm_broadcast(dist_world, r0, sizeof r0, 0) == LK_OK, "broadcast losses");
    DIST_CHECK(memcmp(r0, got, sizeof r0) == 0, "rank %d's losses equal rank 0's", r);
    DIST_CHECK(lk_comm_barrier(dist_world) == LK_OK, "barrier");
    if (r == 0) dist_rm_rf(dir);
}

/* A tiny model (dense or MoE) with ops.moe.dispatcher or attention set to value (NULL:
 * the defaults); NULL after a failure, which is counted. */
static lk_model *tiny_model(int moe, const char *field, const char *value) {
    const lk_model_family *fam = moe ? &lk_family_qwen3_moe : &lk_family_qwen3;
    tiny("/tmp/unused", moe, 1, 1);
    lk_status s = value ? lk_ops_config_set(&ops, field, value, "test") : LK_OK;
    if (!s && !lk_model_family_find(fam->name)) s = lk_model_register(fam);
    if (!s) s = lk_ops_config_finalize(&ops);
    lk_op_table table;
    lk_model *m = NULL;
    if (!s) s = lk_model_build(&ops, fam->name, &table);
    if (!s) s = lk_model_create(&tc.model, &table, 1, 0, &m);
    DIST_CHECK(s == LK_OK, "model moe %d %s %s: %s", moe, field ? field : "", value ? value : "", lk_status_name(s));
    return s ? NULL : m;
}

/* lk_model_set_parallel's rejections, in pairs of consecutive ranks (and, at 4 ranks, a
 * group of 3). */
static void model_rejections(void) {
    int P = dist_world->size, r = dist_world->rank;
    lk_comm *pair;
    DIST_CHECK(lk_comm_split(dist_world, r / 2, r, &pair) == LK_OK, "pairs");
    lk_model *m = tiny_model(0, NULL, NULL);   /* a dense model under EP; its attention under SP */
    if (m) {
        lk_status s = lk_model_set_parallel(m, NULL, pair);
        DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "dense"), "dense ep: %s", lk_status_name(s));
        s = lk_model_set_parallel(m, pair, NULL);
        DIST_CHECK(s == LK_OK, "sp with flash_attention_2: %s", lk_status_name(s));
        lk_model_free(m);
    }
    if ((m = tiny_model(0, "attn_implementation", "eager"))) {   /* eager has no SP path */
        lk_status s = lk_model_set_parallel(m, pair, NULL);
        DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "eager"), "sp with eager: %s", lk_status_name(s));
        lk_model_free(m);
    }
    if ((m = tiny_model(1, "moe.dispatcher", "local"))) {        /* local, set explicitly, under EP */
        lk_status s = lk_model_set_parallel(m, NULL, pair);
        DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "local"), "local ep: %s", lk_status_name(s));
        lk_model_free(m);
    }
    lk_comm_destroy(pair);
    if (P == 4) {   /* a group of 3 divides neither 4 heads nor 4 experts */
        lk_comm *three;
        DIST_CHECK(lk_comm_split(dist_world, r < 3 ? 0 : 1, r, &three) == LK_OK, "three");
        if ((m = tiny_model(1, "moe.dispatcher", "alltoall")) && r < 3) {
            lk_status s = lk_model_set_parallel(m, three, NULL);
            DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "num_attention_heads"), "sp 3: %s", lk_status_name(s));
            s = lk_model_set_parallel(m, NULL, three);
            DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "num_experts"), "ep 3: %s", lk_status_name(s));
        }
        lk_model_free(m);
        lk_comm_destroy(three);
    }
}

static void rejections(void) {
    int P = dist_world->size;
    lk_mesh mesh;
    tiny("/tmp/unused", 0, 1, 1);
    tc.dp = P + 1;   /* does not divide the world: refused before any collective */
    lk_status s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "parallel.dp"), "dp %d of %d: %s", P + 1, P, lk_status_name(s));
    tc.dp = 1;       /* divides it, but dp x 1 x 1 is not the world */
    s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "world size"), "dp 1 of %d: %s", P, lk_status_name(s));
    tc.dp = 0, tc.sp = 3;
    s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "sp 3 does not divide"), "sp 3: %s", lk_status_name(s));
    tc.sp = 1, tc.ep = 3;
    s = lk_train_mesh(&tc, dist_world, &mesh);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "ep 3 does not divide"), "ep 3: %s", lk_status_name(s));
    /* a config that does not describe the mesh it runs on */
    tc.ep = 1;
    DIST_CHECK(lk_train_mesh(&tc, dist_world, &mesh) == LK_OK, "mesh dp %d", P);
    tc.sp = 2;
    lk_train_opts o = {.quiet = 1, .mesh = &mesh};
    s = lk_train_run(&tc, &ops, NULL, &o, NULL);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "the mesh is dp"), "config sp 2 on sp 1: %s", lk_status_name(s));
    lk_mesh_destroy(&mesh);
    /* the YAML section: sizes below 1 and unknown keys, with file:line:column */
    const char *bad[3] = {"parallel: {dp: 2, sp: 0}\n", "parallel:\n  ep: -1\n", "parallel: {dp: 2, tp: 2}\n"};
    const char *want[3] = {":1:", ":2:", ":1:"};
    const char *what[3] = {"parallel.sp", "parallel.ep", "tp"};
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
        fputs("parallel: {dp: 3, sp: 2, ep: 4}\n", f);
        fclose(f);
        lk_train_config_init(&tc);
        s = lk_train_config_load_yaml(path, &tc, &ops);
        DIST_CHECK(s == LK_OK && tc.dp == 3 && tc.sp == 2 && tc.ep == 4, "good yaml: %s", lk_status_name(s));
        remove(path);
    }
}

int main(void) {
    dist_begin();
    int P = dist_world->size;
    rejections();
    model_rejections();
    matches_single(0, NULL, NULL, STEPS_DP, P, 1, 1, TOL_DP, LK_F32);
    matches_single(0, NULL, NULL, STEPS_DP, P, 1, 1, TOL_BF16, LK_BF16);
    /* bf16 AdamW moments: every replica rounds with the same bits (seed, step, tensor,
     * element: no rank), so the replicas stay one model; against one process whose
     * moments differ by the f32 summation order before they are rounded: MoE's tolerance */
    moments = LK_BF16;
    matches_single(0, NULL, NULL, STEPS_DP, P, 1, 1, TOL_MOE, LK_F32);
    moments = LK_F32;
    /* bf16 gradients (train.main_grads_dtype), all-reduced in bf16 where they lie, against
     * one bf16 process summing its micro-batches in f32 gradients (each gradient rounded as it
     * lands, the sums rounded again) */
    grads = LK_BF16;
    matches_single(0, NULL, NULL, STEPS_DP, P, 1, 1, TOL_BF16_GRADS, LK_F32);
    grads = LK_F32;
    matches_single(1, "alltoall", NULL, STEPS_MOE, P / 2, 2, 2, TOL_MOE, LK_F32);
    matches_single(1, "allgather", NULL, STEPS_MOE, P / 2, 2, 2, TOL_MOE, LK_F32);
    recompute = 1;
    matches_single(1, "alltoall", NULL, STEPS_MOE, P / 2, 2, 2, TOL_MOE, LK_F32);
    recompute = 0;
    /* flex_attention: the document BlockMask */
    matches_single(1, "alltoall", "flex_attention", STEPS_MOE, P / 2, 2, 2, TOL_MOE, LK_F32);
    return dist_end("dist_train");
}
