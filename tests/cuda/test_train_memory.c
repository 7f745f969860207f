/* test_train_memory.c (GPU) — the trainer refuses what cannot fit on its GPU before it
 * allocates (issue 22, item 5): the estimate (weights, gradients, AdamW moments and
 * activations on the device) against the picked GPU's free memory (cudaMemGetInfo, via
 * lk_hw_mem_available) or train.memory_limit, with both numbers in the message, within
 * a second, and train.out left uncreated; a model that fits still trains. Skipped (77)
 * where there is no GPU.
 *
 *   build-h200/cuda_test_train_memory */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <time.h>
#include "cuda_util.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One dense layer of 64 wide on the GPU, 2 x 32-token batches. */
static void tiny_config(const char *out) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 0);
    c->hidden_size = 64; c->num_hidden_layers = 1; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 16; c->intermediate_size = 128; c->vocab_size = 320; c->tie_word_embeddings = 1;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = 2; tc.warmup_steps = 1; tc.batch_size = 2; tc.seq_len = 32; tc.corpus_docs = 32;
    tc.device = LK_DEVICE_CUDA;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static void gpu_reports_free_memory(void **state) {
    (void)state;
    char src[160];
    uint64_t free_b = lk_hw_mem_available(LK_DEVICE_CUDA, src, sizeof src);
    print_message("GPU: %.1f GiB %s\n", (double)free_b / 1073741824.0, src);
    assert_true(free_b > (64ull << 20));
    assert_true(free_b < (1ull << 50));
    assert_non_null(strstr(src, "free on GPU"));
    assert_non_null(strstr(src, "cudaMemGetInfo"));
}

/* A run whose refusal must name want and the device's number; train.out not created. */
static void expect_refused(const char *want, double *seconds) {
    char *d = tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/run", d);
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_train_opts o = {.quiet = 1};
    double t0 = now_s();
    lk_status s = lk_train_run(&tc, &ops, NULL, &o, NULL);
    *seconds = now_s() - t0;
    print_message("refused in %.3f s: %s\n", *seconds, lk_last_error());
    assert_int_equal(s, LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "on cuda, more than the"));
    assert_non_null(strstr(lk_last_error(), want));
    assert_int_equal(access(out, F_OK), -1);
    rm_rf(d);
}

static void too_big_for_the_gpu(void **state) {
    (void)state;
    char src[160];
    lk_hw_mem_available(LK_DEVICE_CUDA, src, sizeof src);   /* the CUDA context exists: not timed below */
    tiny_config("unused");
    /* small weights (the host copy is tiny) but 2^20 tokens of a 151936-id vocabulary's
     * logits: ~300 GiB of bf16 activations (a GPU's default dtype), more than any GPU's memory */
    tc.model.vocab_size = 151936;
    tc.batch_size = 1;
    tc.seq_len = 1 << 20;
    tc.model.max_position_embeddings = 1 << 20;
    lk_train_memory e;
    assert_int_equal(lk_train_memory_estimate(&tc, &e), LK_OK);
    assert_true(e.device_bytes > (256ull << 30));
    assert_true(e.host_bytes < (1ull << 30));
    double sec;
    expect_refused("free on GPU", &sec);
    assert_true(sec < 1.0);
}

static void memory_limit_is_the_gpus(void **state) {
    (void)state;
    tiny_config("unused");
    tc.memory_limit = 256 << 10;   /* 256 KiB: the tiny model needs ~1.2 MiB (state 0.9, activations 0.3) */
    double sec;
    expect_refused("256.0 KiB of train.memory_limit", &sec);
    /* without the limit it fits and trains */
    char *d = tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/run", d);
    tiny_config(out);
    lk_train_opts o = {.quiet = 1};
    lk_train_result r;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, 2);
    rm_rf(d);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_memory")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpu_reports_free_memory),
        cmocka_unit_test(too_big_for_the_gpu),
        cmocka_unit_test(memory_limit_is_the_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
