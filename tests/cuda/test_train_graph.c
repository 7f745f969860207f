/* test_train_graph.c (GPU) — train.cuda_graph (issue 17, item 2): the step captured in a
 * CUDA graph and replayed. Capture fails on any host sync inside the step (a
 * device-to-host read, a synchronize, a copy from pageable memory: tests/cuda/test_model.c
 * shows it failing on the loss read), so a model that captures proves its forward,
 * backward and update make none. 8 steps, dense and MoE (the builtin corpus changes the
 * documents' count between batches: the step is captured again for each new shape), all
 * with train.deterministic: two eager runs, and the graph's run, give the same losses and
 * final optimizer file bit for bit. (Until the AdamW kernels rounded every operation on
 * its own, the graph's run parted from the eager one by a few ulps from step 3: ptxas had
 * contracted the eager kernel's and the plan kernel's products into different FMAs.) A
 * config the graph cannot run is refused before any step. The graph's losses are read every
 * 3 steps and before each checkpoint (every 4): the checkpoints match the eager run's too;
 * a NaN weight set as step 6 is queued stops the run at step 6 once the 5-8 block is read,
 * with checkpoint-4 the last good one. bf16 gradients (train.main_grads_dtype) replay too;
 * flex_attention replays too, each batch's document
 * mask staged on the host and copied inside the graph. Prints the runs' tokens/s (speed belongs to
 * bench/e2e_peers.py). Skipped (77) where there is no GPU.
 *
 *   build-h200/cuda_test_train_graph */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "cuda_util.h"
#include "train_util.h"
#include <cuda_runtime_api.h>
#include <string.h>
#include <unistd.h>

static lk_train_config tc;
static lk_ops_config ops;
static lk_dtype grads = LK_F32;   /* train.main_grads_dtype */

static void tiny_config(const char *out, int moe, int graph) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, moe);
    c->hidden_size = 64; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 64; c->intermediate_size = 128; c->vocab_size = 320; c->tie_word_embeddings = 1;
    if (moe) c->num_experts = 4, c->num_experts_per_tok = 2, c->moe_intermediate_size = 64;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
    tc.has_model = 1;
    tc.steps = 8; tc.warmup_steps = 2; tc.batch_size = 2; tc.seq_len = 64; tc.lr = 3e-3; tc.min_lr = 3e-4;
    tc.corpus_docs = 64;
    tc.device = LK_DEVICE_CUDA;   /* bf16, a GPU's default */
    tc.cuda_graph = graph;
    tc.log_every = 3;    /* a graph's losses are read every 3 steps, and before each checkpoint */
    tc.save_every = 4;
    tc.deterministic = 1;   /* attention's ordered dQ: at D 64 fa3's two warpgroups add dQ in either order */
    tc.main_grads_dtype = grads;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

/* One run of N steps into a new directory; its losses, tokens/s and directory. flex:
 * flex_attention, on rows of 320 tokens (each batch's document mask 5 tiles of 128 a side,
 * the last ragged: staged by the host, its copy and bits replayed by the graph). */
static char *run(int moe, int flex, int graph, int n, float *loss, double *tps) {
    char *d = tmpdir();
    memset(loss, 0, sizeof(float) * (size_t)n);
    tiny_config(d, moe, graph);
    if (flex) {
        assert_int_equal(lk_ops_config_set(&ops, "attn_implementation", "flex_attention", NULL), LK_OK);
        tc.seq_len = 320;
    }
    lk_train_opts o = {.quiet = 1, .loss_log = loss, .loss_log_cap = n};
    lk_train_result r;
    lk_status s = lk_train_run(&tc, &ops, NULL, &o, &r);
    if (s) print_error("%s\n", lk_last_error());
    assert_int_equal(s, LK_OK);
    assert_int_equal(r.steps_done, n);
    *tps = r.tokens_per_s;
    return d;
}

static void replays_the_eager_steps(int moe, int flex) {
    enum { N = 8 };
    float eager[N], again[N], graph[N];
    double tps[3];
    char *d[3], pa[600], pb[600];
    d[0] = run(moe, flex, 0, N, eager, &tps[0]);
    d[1] = run(moe, flex, 0, N, again, &tps[1]);
    d[2] = run(moe, flex, 1, N, graph, &tps[2]);
    int first = N;   /* the first step whose loss the graph's run does not give bit for bit */
    double worst = 0;
    for (int i = N - 1; i >= 0; i--) {
        if (graph[i] != eager[i]) first = i;
        double e = fabs((double)graph[i] - eager[i]) / fabs((double)eager[i]);
        worst = e > worst ? e : worst;
    }
    print_message("  %s, 8 steps: eager %.0f tokens/s, cuda_graph %.0f tokens/s (captures included); losses %.5f -> "
                  "%.5f; eager twice: %s; graph vs eager: %s from step %d, worst relative %.2g\n",
                  flex ? "dense, flex_attention" : !moe ? "dense" : grads == LK_BF16 ? "moe, bf16 gradients" : "moe",
                  tps[0], tps[2], graph[0], graph[N - 1],
                  memcmp(eager, again, sizeof eager) ? "DIFFER" : "bit for bit",
                  first == N ? "bit for bit" : "differ", first + 1, worst);
    assert_memory_equal(eager, again, sizeof eager);   /* train.deterministic: every loss, bit for bit */
    snprintf(pa, sizeof pa, "%s/checkpoint-%d/optimizer.safetensors", d[0], N);
    snprintf(pb, sizeof pb, "%s/checkpoint-%d/optimizer.safetensors", d[1], N);
    assert_same_weights(pa, pb);
    assert_memory_equal(graph, eager, sizeof eager);   /* the replay is the eager step, bit for bit */
    for (int c = 4; c <= N; c += 4) {   /* checkpoint-4 was written with steps 5.. not yet queued */
        snprintf(pa, sizeof pa, "%s/checkpoint-%d/optimizer.safetensors", d[0], c);
        snprintf(pb, sizeof pb, "%s/checkpoint-%d/optimizer.safetensors", d[2], c);
        assert_same_weights(pa, pb);
    }
    assert_true(graph[N - 1] < graph[0]);
    for (int i = 0; i < 3; i++) rm_rf(d[i]);
}

static void dense_replays_the_eager_steps(void **state) {
    (void)state;
    replays_the_eager_steps(0, 0);
}

static void moe_replays_the_eager_steps(void **state) {
    (void)state;
    replays_the_eager_steps(1, 0);
}

/* bf16 gradients (train.main_grads_dtype): the eager step clips them as AdamW reads them,
 * with the factor the plan computes on the device, so the replay is still the eager step
 * bit for bit. */
static void bf16_grads_replay_the_eager_steps(void **state) {
    (void)state;
    grads = LK_BF16;
    replays_the_eager_steps(1, 0);
    grads = LK_F32;
}

/* A NaN master weight from step 6 on (set by the before_step hook as step 6 is queued):
 * with steps 5-8 queued behind one read, the run stops at step 6 with the last good
 * checkpoint named, and writes nothing after it. */
static void poison_weight(void *user, int64_t step, struct lk_model *m) {
    if (step != *(int64_t *)user) return;
    for (int i = 0; i < lk_model_param_count(m); i++)
        if (!strcmp(lk_model_param(m, i)->name, "model.norm.weight")) {
            float nan = NAN;
            assert_int_equal(cudaMemcpy(lk_model_param(m, i)->value.data, &nan, 4, cudaMemcpyHostToDevice), 0);
            return;
        }
    fail_msg("no model.norm.weight");
}

static void nan_stops_the_queued_steps(void **state) {
    (void)state;
    char *d = tmpdir(), p[600];
    tiny_config(d, 0, 1);
    tc.log_every = 8;
    int64_t at = 5;
    float loss[8] = {0};
    lk_train_opts o = {.quiet = 1, .before_step = poison_weight, .user = &at, .loss_log = loss, .loss_log_cap = 8};
    lk_train_result r;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_EINVAL);
    print_message("  %s\n", lk_last_error());
    assert_non_null(strstr(lk_last_error(), "step 6: loss is NaN"));
    assert_non_null(strstr(lk_last_error(), "checkpoint-4"));
    assert_int_equal(r.steps_done, 5);
    for (int i = 0; i < 5; i++) assert_true(isfinite(loss[i]));
    snprintf(p, sizeof p, "%s/checkpoint-8", d);
    assert_true(access(p, F_OK) != 0);
    rm_rf(d);
}

static void no_loss_hook(void *user, int64_t step, double *loss) { (void)user, (void)step, (void)loss; }

static void refused_before_a_step(void **state) {
    (void)state;
    char *d = tmpdir();
    tiny_config(d, 0, 1);
    tc.grad_accum = 2;
    lk_train_opts o = {.quiet = 1};
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.cuda_graph: expected train.device cuda, train.grad_accum 1"));
    tc.grad_accum = 1;
    lk_train_opts h = {.quiet = 1, .after_loss = no_loss_hook};
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &h, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.cuda_graph: an after_loss hook"));
    rm_rf(d);
}

/* flex_attention's document masks, a new one each batch, staged without a sync (the
 * capture used to be refused: the mask was planned and copied inside the step). */
static void flex_replays_the_eager_steps(void **state) {
    (void)state;
    replays_the_eager_steps(0, 1);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_graph")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_replays_the_eager_steps),
        cmocka_unit_test(moe_replays_the_eager_steps),
        cmocka_unit_test(bf16_grads_replay_the_eager_steps),
        cmocka_unit_test(nan_stops_the_queued_steps),
        cmocka_unit_test(refused_before_a_step),
        cmocka_unit_test(flex_replays_the_eager_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
