/* test_train_init.c (GPU) — model.init_from and sharded saves on a GPU (issue 22, item 3):
 * a CPU run writes a sharded checkpoint (train.max_shard_size 20 KB); a GPU run started
 * from it has the CPU run's step-1 loss (same weights, same batch: to the kernels'
 * rounding), and with lr 0 its own sharded save (through the host copy of the device
 * weights) is the checkpoint it started from, byte for byte. Skipped (77) where there is
 * no GPU.
 *
 *   build-h200/cuda_test_train_init */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include "cuda_util.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;

static void tiny_config(const char *out, lk_device_type dev, const char *init) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 1);
    c->hidden_size = 64; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 16; c->intermediate_size = 128; c->vocab_size = 320; c->num_experts = 4;
    c->num_experts_per_tok = 2; c->moe_intermediate_size = 64; c->tie_word_embeddings = 0;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = 2; tc.warmup_steps = 1; tc.batch_size = 2; tc.seq_len = 32; tc.corpus_docs = 64;
    tc.max_shard_size = 20000;
    tc.device = dev;
    tc.dtype = LK_F32;   /* held against the CPU's f32 run */
    if (init) snprintf(tc.init_from, sizeof tc.init_from, "%s", init);
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static double first_loss(const char *out, lk_device_type dev, const char *init, double lr) {
    float log[2];
    tiny_config(out, dev, init);
    tc.lr = lr;
    tc.min_lr = lr < tc.min_lr ? lr : tc.min_lr;
    tc.weight_decay = 0;
    lk_train_opts o = {.quiet = 1, .loss_log = log, .loss_log_cap = 2};
    lk_train_result r;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, 2);
    return log[0];
}

static void same_bytes(const char *a, const char *b, const char *file) {
    char pa[700], pb[700];
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/%s", a, file);
    snprintf(pb, sizeof pb, "%s/%s", b, file);
    uint8_t *x = slurp(pa, &na), *y = slurp(pb, &nb);
    if (!x || !y) print_error("missing %s or %s\n", pa, pb);
    assert_true(x && y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

static void gpu_starts_from_a_sharded_checkpoint(void **state) {
    (void)state;
    char *d = tmpdir(), ckpt[600], cpu[600], gpu[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", d);
    snprintf(cpu, sizeof cpu, "%s/cpu", d);
    snprintf(gpu, sizeof gpu, "%s/gpu", d);
    first_loss(ckpt, LK_DEVICE_CPU, NULL, 3e-3);   /* trained weights, saved sharded */
    double on_cpu = first_loss(cpu, LK_DEVICE_CPU, ckpt, 0), on_gpu = first_loss(gpu, LK_DEVICE_CUDA, ckpt, 0);
    print_message("step-1 loss from the sharded checkpoint: cpu %.7f, gpu %.7f\n", on_cpu, on_gpu);
    assert_true(fabs(on_cpu - on_gpu) <= 1e-4 * fabs(on_cpu));
    /* lr 0: the GPU's final model is the checkpoint it started from, shard for shard */
    same_bytes(ckpt, gpu, "model.safetensors.index.json");
    lk_st_dir *sd;
    assert_int_equal(lk_st_dir_open(ckpt, &sd), LK_OK);
    assert_true(lk_st_dir_file_count(sd) >= 3);
    for (size_t k = 1; k <= lk_st_dir_file_count(sd); k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, lk_st_dir_file_count(sd));
        same_bytes(ckpt, gpu, name);
    }
    lk_st_dir_close(sd);
    rm_rf(d);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_init")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpu_starts_from_a_sharded_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
