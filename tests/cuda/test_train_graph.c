/* test_train_graph.c (GPU) — train.cuda_graph (issue 17, item 2): the step captured in a
 * CUDA graph and replayed. Capture fails on any host sync inside the step (a
 * device-to-host read, a synchronize, a copy from pageable memory: tests/cuda/test_model.c
 * shows it failing on the loss read), so a model that captures proves its forward,
 * backward and update make none; the replayed steps run the very kernels of the eager
 * ones, so 8 steps with the graph give the eager run's losses and final master weights
 * and AdamW moments bit for bit, dense and MoE (the builtin corpus changes the documents'
 * count between batches: the step is captured again for each new shape), both with
 * train.deterministic (without it, fa3's dQ atomics differ run to run). A config the
 * graph cannot run is refused before any step. Prints both runs' tokens/s (speed belongs
 * to bench/e2e_peers.py). Skipped (77) where there is no GPU.
 *
 *   build-h200/cuda_test_train_graph */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "cuda_util.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;

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
    tc.deterministic = 1;   /* attention's ordered dQ: at D 64 fa3's two warpgroups add dQ in either order */
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static void replays_the_eager_steps(int moe) {
    enum { N = 8 };
    float loss[2][N];
    char *d[2] = {tmpdir(), tmpdir()}, pa[600], pb[600];
    double tps[2];
    for (int graph = 0; graph < 2; graph++) {
        memset(loss[graph], 0, sizeof loss[graph]);
        tiny_config(d[graph], moe, graph);
        lk_train_opts o = {.quiet = 1, .loss_log = loss[graph], .loss_log_cap = N};
        lk_train_result r;
        lk_status s = lk_train_run(&tc, &ops, NULL, &o, &r);
        if (s) print_error("%s\n", lk_last_error());
        assert_int_equal(s, LK_OK);
        assert_int_equal(r.steps_done, N);
        tps[graph] = r.tokens_per_s;
    }
    print_message("  %s, 8 steps: eager %.0f tokens/s, cuda_graph %.0f tokens/s (captures included); losses %.5f -> "
                  "%.5f\n", moe ? "moe" : "dense", tps[0], tps[1], loss[1][0], loss[1][N - 1]);
    assert_memory_equal(loss[0], loss[1], sizeof loss[0]);   /* every loss, bit for bit */
    assert_true(loss[1][N - 1] < loss[1][0]);
    snprintf(pa, sizeof pa, "%s/checkpoint-%d/optimizer.safetensors", d[0], N);
    snprintf(pb, sizeof pb, "%s/checkpoint-%d/optimizer.safetensors", d[1], N);
    assert_same_weights(pa, pb);
    rm_rf(d[0]);
    rm_rf(d[1]);
}

static void dense_replays_the_eager_steps(void **state) {
    (void)state;
    replays_the_eager_steps(0);
}

static void moe_replays_the_eager_steps(void **state) {
    (void)state;
    replays_the_eager_steps(1);
}

static void refused_before_a_step(void **state) {
    (void)state;
    char *d = tmpdir();
    tiny_config(d, 0, 1);
    tc.grad_accum = 2;
    lk_train_opts o = {.quiet = 1};
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.cuda_graph: expected train.device cuda, train.grad_accum 1"));
    rm_rf(d);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_graph")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_replays_the_eager_steps),
        cmocka_unit_test(moe_replays_the_eager_steps),
        cmocka_unit_test(refused_before_a_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
