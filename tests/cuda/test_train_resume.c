/* test_train_resume.c (GPU) — the trainer on a GPU (train.device: cuda) stopped and
 * resumed: N steps straight against N/2 steps, a stop, --resume from the output directory
 * and N/2 more, on a tiny Qwen3-MoE, in f32 and in bf16. With train.deterministic (the
 * attention backward's ordered dQ; its default adds dQ with atomics, in any order) every
 * loss and every f32 master weight and AdamW moment of the final checkpoint must match bit
 * for bit: tests/train_util.h's check, the one
 * tests/test_train_loop.c runs on the CPU trainer. What it tests here is the
 * checkpoint's host copies of the device state and their way back. Skipped (77) where
 * there is no GPU.
 *
 *   build-h200/cuda_test_train_resume */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "cuda_util.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;
static lk_dtype dtype;     /* the run's train.dtype */
static lk_dtype moments;   /* its train.exp_avg_dtype and exp_avg_sq_dtype */
static lk_dtype main_params = LK_F32;   /* its train.main_params_dtype */
static lk_dtype main_grads = LK_F32;    /* its train.main_grads_dtype (bf16: one micro-batch of 4) */

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
    tc.dtype = dtype;
    tc.exp_avg_dtype = tc.exp_avg_sq_dtype = moments;
    tc.main_params_dtype = main_params;
    tc.main_grads_dtype = main_grads;
    if (main_grads == LK_BF16) tc.grad_accum = 1, tc.batch_size = 4;
    tc.deterministic = 1;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static void resume_is_bit_identical(void **state) {
    (void)state;
    dtype = LK_F32, moments = LK_F32;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
}

/* bf16 (a GPU's default): the compute copy is rounded from the restored f32 master. */
static void resume_is_bit_identical_bf16(void **state) {
    (void)state;
    dtype = LK_BF16, moments = LK_F32;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
}

/* bf16 AdamW moments: saved in bf16, and the stochastic rounding's bits are a function of
 * (seed, step, tensor, element), so the resumed steps round as the straight run's did. */
static void resume_is_bit_identical_bf16_moments(void **state) {
    (void)state;
    dtype = LK_BF16, moments = LK_BF16;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
}

/* The weights in bf16 alone (train.main_params_dtype): the optimizer file keeps the bf16
 * values, which are the model's own, and their stochastic rounding draws as the moments'. */
static void resume_is_bit_identical_bf16_main(void **state) {
    (void)state;
    dtype = LK_BF16, moments = LK_BF16, main_params = LK_BF16;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
    main_params = LK_F32;
}

/* bf16 gradients (train.main_grads_dtype): in no file, written afresh each step. */
static void resume_is_bit_identical_bf16_grads(void **state) {
    (void)state;
    dtype = LK_BF16, moments = LK_BF16, main_params = LK_BF16, main_grads = LK_BF16;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
    main_params = main_grads = LK_F32;
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_train_resume")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_is_bit_identical),
        cmocka_unit_test(resume_is_bit_identical_bf16),
        cmocka_unit_test(resume_is_bit_identical_bf16_moments),
        cmocka_unit_test(resume_is_bit_identical_bf16_main),
        cmocka_unit_test(resume_is_bit_identical_bf16_grads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
