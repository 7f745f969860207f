/* test_train_resume.c (GPU) — the trainer on a GPU (train.device: cuda) stopped and
 * resumed: N steps straight against N/2 steps, a stop, --resume from the output directory
 * and N/2 more, on a tiny Qwen3-MoE. The GPU's kernels are deterministic (test_model.c's
 * recompute check), so every loss and every f32 master weight and AdamW moment of the
 * final checkpoint must match bit for bit, as tests/test_train_loop.c asks of the CPU
 * trainer: the checkpoint's host copies of the device state and their way back are
 * what is tested. Skipped (77) where there is no GPU.
 *
 *   build-h200/cuda_test_train_resume */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cuda_util.h"
#include "llmkern/checkpoint.h"
#include "llmkern/train.h"

static lk_train_config tc;
static lk_ops_config ops;

/* Two MoE layers of 64 wide, 2 x 32-token micro-batches twice a step, on the GPU. */
static void tiny_config(const char *out, int64_t steps, int64_t save_every) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 1);
    c->hidden_size = 64; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 16; c->intermediate_size = 128; c->vocab_size = 320; c->num_experts = 4;
    c->num_experts_per_tok = 2; c->moe_intermediate_size = 64; c->tie_word_embeddings = 1;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = steps; tc.save_every = save_every; tc.warmup_steps = 2;
    tc.batch_size = 2; tc.seq_len = 32; tc.grad_accum = 2; tc.lr = 3e-3; tc.min_lr = 3e-4;
    tc.corpus_docs = 64;
    tc.device = LK_DEVICE_CUDA;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static char *tmpdir(void) {
    char *d = strdup("/tmp/llmkern_cuda_resume_XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rm_rf(char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

/* Every tensor of two optimizer files but the trainer's history (its tokens/s differ):
 * same names, same bits. Returns how many were parameters. */
static int assert_same_state(const char *a_path, const char *b_path) {
    lk_st_file *a, *b;
    assert_int_equal(lk_st_open(a_path, &a), LK_OK);
    assert_int_equal(lk_st_open(b_path, &b), LK_OK);
    assert_int_equal(lk_st_count(a), lk_st_count(b));
    int n_params = 0;
    for (size_t i = 0; i < lk_st_count(a); i++) {
        const lk_st_tensor *x = lk_st_at(a, i), *y = lk_st_find(b, x->name);
        assert_non_null(y);
        assert_int_equal(x->nbytes, y->nbytes);
        if (strcmp(x->name, "trainer/history") == 0) continue;
        if (memcmp(x->data, y->data, x->nbytes) != 0) print_error("%s differs\n", x->name);
        assert_memory_equal(x->data, y->data, x->nbytes);
        n_params += strncmp(x->name, "param/", 6) == 0;
    }
    lk_st_close(a);
    lk_st_close(b);
    return n_params;
}

static void resume_is_bit_identical(void **state) {
    (void)state;
    enum { N = 6 };
    char *da = tmpdir(), *db = tmpdir(), pa[600], pb[600];
    float la[N], lb[N];
    lk_train_opts o = {.quiet = 1, .loss_log = la, .loss_log_cap = N};
    lk_train_result r;
    tiny_config(da, N, 3);
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, N);
    assert_true(r.last_loss < r.first_loss);

    memset(lb, 0, sizeof lb);
    o.loss_log = lb;
    o.stop_at = N / 2;             /* as if killed after step 3 (checkpoint-3 written) */
    tiny_config(db, N, 3);
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, N / 2);
    o.stop_at = 0;
    assert_int_equal(lk_train_run(&tc, &ops, db, &o, &r), LK_OK);   /* resume from the output dir */
    assert_int_equal(r.first_step, N / 2);
    assert_int_equal(r.steps_done, N);
    for (int i = 0; i < N; i++) printf("  step %d: loss %.7f straight, %.7f resumed\n", i + 1, la[i], lb[i]);
    assert_memory_equal(la, lb, sizeof la);   /* every loss, bit for bit */
    snprintf(pa, sizeof pa, "%s/checkpoint-%d/optimizer.safetensors", da, N);
    snprintf(pb, sizeof pb, "%s/checkpoint-%d/optimizer.safetensors", db, N);
    assert_true(assert_same_state(pa, pb) > 10);
    rm_rf(da);
    rm_rf(db);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_resume")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_is_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
