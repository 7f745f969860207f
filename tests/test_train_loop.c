/* test_train_loop.c — the training loop (train.h: lk_train_run) on a tiny Qwen3-MoE:
 * N steps straight equal N/2, a stop, --resume and N/2 more, bit for bit (losses and
 * f32 master weights); a NaN loss stops the run with a message and keeps the last good
 * checkpoint; a checkpoint write failing before its rename leaves the previous one as
 * it was; every op eager and every op fused give the same 30-step loss curve; the
 * output directory holds what `make run` promises; text and token files train. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/checkpoint.h"
#include "llmkern/data.h"
#include "llmkern/train.h"
#include "model/atomic_file.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;

/* A model of a few thousand weights and 2 x 32-token batches: fast under ASan too. */
static void tiny_config(const char *out, int64_t steps, int64_t save_every) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 1);
    c->hidden_size = 32; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 8; c->intermediate_size = 64; c->vocab_size = 320; c->num_experts = 4;
    c->num_experts_per_tok = 2; c->moe_intermediate_size = 32; c->tie_word_embeddings = 1;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
    tc.has_model = 1;
    tc.steps = steps; tc.save_every = save_every; tc.warmup_steps = 2;
    tc.batch_size = 2; tc.seq_len = 32; tc.grad_accum = 2; tc.lr = 3e-3; tc.min_lr = 3e-4;
    tc.corpus_docs = 64;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static void resume_is_bit_identical(void **state) {
    (void)state;
    assert_resume_bit_identical(&tc, &ops, tiny_config);
}

/* train.dtype bf16: the compute copy comes from the f32 master at every forward, so a
 * resumed run is bit-identical too. */
static void tiny_config_bf16(const char *out, int64_t steps, int64_t save_every) {
    tiny_config(out, steps, save_every);
    tc.dtype = LK_BF16;
}

static void resume_is_bit_identical_bf16(void **state) {
    (void)state;
    assert_resume_bit_identical(&tc, &ops, tiny_config_bf16);
}

/* bf16 moments (train.exp_avg_dtype, exp_avg_sq_dtype): the checkpoint keeps them in
 * bf16 and the stochastic rounding's bits hang on (seed, step, tensor, element), so the
 * resumed run is bit-identical as well. */
static void tiny_config_bf16_moments(const char *out, int64_t steps, int64_t save_every) {
    tiny_config_bf16(out, steps, save_every);
    tc.exp_avg_dtype = tc.exp_avg_sq_dtype = LK_BF16;
}

static void resume_is_bit_identical_bf16_moments(void **state) {
    (void)state;
    assert_resume_bit_identical(&tc, &ops, tiny_config_bf16_moments);
}

/* The weights in bf16 alone (train.main_params_dtype) beside bf16 moments: the optimizer
 * file's params are the bf16 values and their rounding draws on the same bits, so a
 * resumed run is bit-identical still. */
static void tiny_config_bf16_main(const char *out, int64_t steps, int64_t save_every) {
    tiny_config_bf16_moments(out, steps, save_every);
    tc.main_params_dtype = LK_BF16;
}

static void resume_is_bit_identical_bf16_main(void **state) {
    (void)state;
    assert_resume_bit_identical(&tc, &ops, tiny_config_bf16_main);
}

/* bf16 gradients (train.main_grads_dtype) beside bf16 moments and weights, one
 * micro-batch: the gradients are not in any file, so a resumed run is bit-identical. */
static void tiny_config_bf16_grads(const char *out, int64_t steps, int64_t save_every) {
    tiny_config_bf16_main(out, steps, save_every);
    tc.main_grads_dtype = LK_BF16;
    tc.grad_accum = 1, tc.batch_size = 4;
}

static void resume_is_bit_identical_bf16_grads(void **state) {
    (void)state;
    assert_resume_bit_identical(&tc, &ops, tiny_config_bf16_grads);
}

/* A checkpoint written by one kind of run resumed by another (set(dt) makes tiny_config_bf16
 * that kind): the state is converted as it is read (f32 from bf16 exactly, bf16 from f32 to
 * nearest even), the run goes on from the same step, the first N/2 losses the straight run's
 * bits and the rest within tol of it, but not its bits (the other kind ran). Both ways. */
static void assert_resume_converts(void (*set)(lk_dtype), double tol) {
    enum { N = 6 };
    for (int to_bf16 = 1; to_bf16 >= 0; to_bf16--) {
        const lk_dtype from = to_bf16 ? LK_F32 : LK_BF16, to = to_bf16 ? LK_BF16 : LK_F32;
        char *d = tmpdir(), *ds = tmpdir();
        float straight[N], got[N];
        lk_train_opts o = {.quiet = 1, .loss_log = straight, .loss_log_cap = N};
        tiny_config_bf16(ds, N, 0), set(from);
        assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
        memset(got, 0, sizeof got);
        o.loss_log = got, o.stop_at = N / 2;
        tiny_config_bf16(d, N, N / 2), set(from);
        assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
        o.stop_at = 0;
        tiny_config_bf16(d, N, N / 2), set(to);
        lk_train_result r;
        lk_status rs = lk_train_run(&tc, &ops, d, &o, &r);
        if (rs) print_error("resume: %s\n", lk_last_error());
        assert_int_equal(rs, LK_OK);
        assert_int_equal(r.first_step, N / 2);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double e = fabs((double)got[i] - straight[i]) / fabs((double)straight[i]);
            if (!(i < N / 2 ? e == 0 : e <= tol)) print_error("step %d: %g resumed, %g straight\n", i + 1, got[i], straight[i]);
            assert_true(i < N / 2 ? e == 0 : e <= tol);
            worst = fmax(worst, e);
        }
        assert_true(worst > 0);
        rm_rf(d), rm_rf(ds);
    }
}

static void set_moments(lk_dtype dt) { tc.exp_avg_dtype = tc.exp_avg_sq_dtype = dt; }
static void set_main_params(lk_dtype dt) { tc.main_params_dtype = dt; }

/* The moments f32 <-> bf16: losses within 1e-3 (bf16 moments moved them by <= 1.6e-5 relative). */
static void resume_converts_the_moments(void **state) {
    (void)state;
    assert_resume_converts(set_moments, 1e-3);
}

/* The weights in bf16 alone <-> an f32 master (train.main_params_dtype): within 1e-2. */
static void resume_converts_the_weights(void **state) {
    (void)state;
    assert_resume_converts(set_main_params, 1e-2);
}

/* Through the loss hook rather than a NaN weight: the cross-entropy kernels' exp
 * converts a NaN logit to an integer, which UBSan rejects (reported to their owner). */
static void poison(void *user, int64_t step, double *loss) {
    if (step == *(int64_t *)user) *loss = NAN;
}

static void poison_inf(void *user, int64_t step, double *loss) {
    if (step == *(int64_t *)user) *loss = -INFINITY;
}

static void nan_loss_stops_and_keeps_checkpoint(void **state) {
    (void)state;
    char *d = tmpdir(), p[600];
    int64_t at = 5;
    lk_train_opts o = {.quiet = 1, .after_loss = poison, .user = &at};
    tiny_config(d, 8, 2);
    lk_train_result r;
    lk_status s = lk_train_run(&tc, &ops, NULL, &o, &r);
    assert_int_equal(s, LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "step 6: loss is NaN"));
    assert_non_null(strstr(lk_last_error(), "checkpoint-4"));
    assert_int_equal(r.steps_done, 5);
    assert_latest(d, "checkpoint-4\n");
    /* The last good checkpoint loads and its weights are finite. */
    snprintf(p, sizeof p, "%s/checkpoint-4/optimizer.safetensors", d);
    lk_st_file *f;
    assert_int_equal(lk_st_open(p, &f), LK_OK);
    for (size_t i = 0; i < lk_st_count(f); i++) {
        const lk_st_tensor *t = lk_st_at(f, i);
        if (t->dtype != LK_F32) continue;
        for (size_t k = 0; k < t->nbytes / 4; k++) assert_true(isfinite(((const float *)t->data)[k]));
    }
    lk_st_close(f);
    snprintf(p, sizeof p, "%s/checkpoint-6", d);
    assert_true(access(p, F_OK) != 0);
    o.after_loss = poison_inf;   /* Inf too, before any checkpoint */
    at = 1;
    char *d2 = tmpdir();
    tiny_config(d2, 4, 2);
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "step 2: loss is Inf"));
    assert_non_null(strstr(lk_last_error(), "no checkpoint was written yet"));
    rm_rf(d2);
    tiny_config(d, 8, 2);
    /* And the run resumes from it. */
    o.after_loss = NULL;
    assert_int_equal(lk_train_run(&tc, &ops, d, &o, &r), LK_OK);
    assert_int_equal(r.first_step, 4);
    rm_rf(d);
}

static void fail_commit(void *user, int64_t step, struct lk_model *m) {
    (void)m;
    if (step == *(int64_t *)user) lk_atomic_file_fail_next_commit();
}

static void failed_checkpoint_keeps_previous(void **state) {
    (void)state;
    char *d = tmpdir(), p[600];
    static const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors"};
    int64_t at = 3;   /* before the step whose checkpoint-4 then fails to commit */
    lk_train_opts o = {.quiet = 1, .before_step = fail_commit, .user = &at};
    tiny_config(d, 8, 2);
    lk_train_result r;
    /* A first run writes checkpoint-2 and stops: keep its bytes. */
    lk_train_opts first = {.quiet = 1, .stop_at = 2};
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &first, &r), LK_OK);
    uint8_t *before[3];
    size_t nbefore[3];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/checkpoint-2/%s", d, files[i]);
        assert_non_null(before[i] = slurp(p, &nbefore[i]));
    }
    assert_int_equal(lk_train_run(&tc, &ops, d, &o, &r), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "checkpoint at step 4 not written"));
    assert_non_null(strstr(lk_last_error(), "checkpoint-2"));
    assert_latest(d, "checkpoint-2\n");
    for (int i = 0; i < 3; i++) {
        size_t n;
        snprintf(p, sizeof p, "%s/checkpoint-2/%s", d, files[i]);
        uint8_t *after = slurp(p, &n);
        assert_int_equal(n, nbefore[i]);
        assert_memory_equal(after, before[i], n);
        free(after);
        free(before[i]);
    }
    rm_rf(d);
}

static void set_all(lk_ops_config *c, int fused) {
    static const char *fields[][2] = {
        {"attn_implementation", "flash_attention_2"}, {"cross_entropy_loss_implementation", "fused"},
        {"rms_norm_implementation", "fused"}, {"rotary_pos_emb_implementation", "fused"},
        {"swiglu_mlp_implementation", "fused"}, {"moe_implementation", "fused"},
    };
    lk_ops_config_init(c);
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        assert_int_equal(lk_ops_config_set(c, fields[i][0], fused ? fields[i][1] : "eager", "test"), LK_OK);
}

static void eager_and_fused_train_alike(void **state) {
    (void)state;
    enum { N = 30 };
    float loss[2][N];
    char *d = tmpdir();
    for (int fused = 0; fused < 2; fused++) {
        lk_train_opts o = {.quiet = 1, .loss_log = loss[fused], .loss_log_cap = N};
        tiny_config(d, N, 0);
        set_all(&ops, fused);
        assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
    }
    for (int i = 0; i < N; i++) {
        /* Same math, other summation orders: f32 rounding differences that 30 Adam
         * steps carry along (measured ~1e-6), far below the curve's own movement. */
        if (fabsf(loss[0][i] - loss[1][i]) > 1e-4f * loss[0][i])
            fprintf(stderr, "step %d: eager %.7g fused %.7g\n", i, loss[0][i], loss[1][i]);
        assert_true(fabsf(loss[0][i] - loss[1][i]) <= 1e-4f * loss[0][i]);
    }
    assert_true(loss[1][N - 1] < 0.8f * loss[1][0]);
    /* What the output directory holds after a finished run. */
    static const char *files[] = {"config.json", "model.safetensors", "loss.csv", "loss.png", "latest",
                                  "checkpoint-30/optimizer.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", d, files[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    rm_rf(d);
}

/* Mixed precision follows f32 from the same weights on the same batches: bf16
 * activations move each step's loss by ~1e-3 and 30 Adam steps carry it along; the
 * mean |difference| over the run is held to 5e-3 (measured 5.5e-4), and
 * bf16 learns as f32 does; with bf16 moments, and with the weights in bf16 alone too
 * (train.main_params_dtype: measured 2.4e-3 when written). */
static void bf16_trains_like_f32(void **state) {
    (void)state;
    enum { N = 30, RUNS = 4 };
    static const char *const what[RUNS] = {"", "", " + bf16 moments", " + bf16 moments and weights alone"};
    float loss[RUNS][N];
    char *d = tmpdir();
    for (int run = 0; run < RUNS; run++) {   /* f32; bf16; bf16 with bf16 AdamW moments; and bf16 weights */
        lk_train_opts o = {.quiet = 1, .loss_log = loss[run], .loss_log_cap = N};
        tiny_config(d, N, 0);
        set_all(&ops, 1);
        tc.dtype = run ? LK_BF16 : LK_F32;
        tc.exp_avg_dtype = tc.exp_avg_sq_dtype = run >= 2 ? LK_BF16 : LK_F32;
        tc.main_params_dtype = run == 3 ? LK_BF16 : LK_F32;
        assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
    }
    for (int run = 1; run < RUNS; run++) {
        double mad = 0;
        for (int i = 0; i < N; i++) mad += fabs((double)loss[0][i] - loss[run][i]) / N;
        print_message("  f32 %.4f -> %.4f, bf16%s %.4f -> %.4f, mean |diff| %.2e\n", loss[0][0], loss[0][N - 1],
                      what[run], loss[run][0], loss[run][N - 1], mad);
        assert_true(mad <= 5e-3);
        assert_true(mad > 0);
        assert_true(loss[run][N - 1] < 0.8f * loss[run][0]);
    }
    rm_rf(d);
}

/* bf16 gradients (train.main_grads_dtype) follow f32 gradients from the same weights on the
 * same batches (one micro-batch of 4: grad_accum 1), both with bf16 moments and weights
 * alone, as bf16_trains_like_f32 holds each kind to f32: mean |difference| over 30 steps
 * within 5e-3 of the f32 run's losses, and not its bits. Clipping is on (grad_clip 1: the
 * tiny model's early norms are above it), so the clip's factor as AdamW reads a bf16
 * gradient runs. */
static void bf16_grads_train_like_f32(void **state) {
    (void)state;
    enum { N = 30, RUNS = 3 };
    static const char *const what[RUNS] = {"f32", "bf16, f32 grads", "bf16, bf16 grads"};
    float loss[RUNS][N], norm[RUNS][N];
    char *d = tmpdir();
    for (int run = 0; run < RUNS; run++) {
        lk_train_opts o = {.quiet = 1, .loss_log = loss[run], .grad_norm_log = norm[run], .loss_log_cap = N};
        tiny_config(d, N, 0);
        set_all(&ops, 1);
        tc.grad_accum = 1, tc.batch_size = 4, tc.grad_clip = 1.0;
        tc.dtype = run ? LK_BF16 : LK_F32;
        tc.exp_avg_dtype = tc.exp_avg_sq_dtype = tc.main_params_dtype = run ? LK_BF16 : LK_F32;
        tc.main_grads_dtype = run == 2 ? LK_BF16 : LK_F32;
        lk_status s = lk_train_run(&tc, &ops, NULL, &o, NULL);
        if (s) print_error("%s\n", lk_last_error());
        assert_int_equal(s, LK_OK);
    }
    assert_true(norm[2][0] > 1.0f);   /* clipped */
    for (int run = 1; run < RUNS; run++) {
        double mad = 0, mad1 = 0;
        for (int i = 0; i < N; i++) {
            mad += fabs((double)loss[0][i] - loss[run][i]) / N;
            mad1 += fabs((double)loss[1][i] - loss[run][i]) / N;
        }
        print_message("  %s %.4f -> %.4f, mean |diff| %.2e to f32, %.2e to f32 grads\n", what[run], loss[run][0],
                      loss[run][N - 1], mad, mad1);
        assert_true(mad <= 5e-3);
        assert_true(mad > 0);
        assert_true(run == 1 || mad1 > 0);   /* the bf16 gradients ran */
        assert_true(loss[run][N - 1] < 0.8f * loss[run][0]);
    }
    rm_rf(d);
}

/* A text file and a token file train as the corpus does; recomputing activations in
 * the backward (every layer, or the first and the other's norms, experts and q, k, v:
 * train.recompute_num_layers, recompute_modules) gives the same losses as keeping them. */
static void data_sources_and_recompute(void **state) {
    (void)state;
    enum { N = 3 };
    char *d = tmpdir(), p[600];
    float keep[N], recompute[N], text[N], tokens[N], some[N];
    static const char doc[] = "the cat sat on the mat.\nthe dog sat on the log.\n\n1 + 2 = 3\n2 + 2 = 4\n\n"
                              "key: value\nname: llmkern\n";
    float *logs[] = {keep, recompute, text, tokens, some};
    for (int run = 0; run < 5; run++) {
        lk_train_opts o = {.quiet = 1, .loss_log = logs[run], .loss_log_cap = N};
        tiny_config(d, N, 0);
        tc.recompute = run == 1 || run == 4;
        if (run == 4)
            tc.recompute_num_layers = 1,
            tc.recompute_modules = LK_RECOMPUTE_LAYERNORM | LK_RECOMPUTE_MOE | LK_RECOMPUTE_QKV;
        if (run == 2) {
            snprintf(tc.data_path, sizeof tc.data_path, "%s/corpus.txt", d);
            FILE *f = fopen(tc.data_path, "w");
            fputs(doc, f);
            fclose(f);
            tc.data = LK_DATA_TEXT;
        } else if (run == 3) {
            int32_t ids[64];
            int64_t n = lk_tok_encode(doc, 60, 1, ids);
            snprintf(tc.data_path, sizeof tc.data_path, "%s/corpus.lktok", d);
            assert_int_equal(lk_tokfile_write(tc.data_path, ids, n, 2), LK_OK);
            tc.data = LK_DATA_TOKENS;
            tc.eos_id = LK_TOK_EOS;
        }
        assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_true(fabsf(keep[i] - recompute[i]) <= 1e-5f * keep[i]);   /* same math, recomputed */
        assert_true(fabsf(keep[i] - some[i]) <= 1e-5f * keep[i]);
        assert_true(isfinite(text[i]) && isfinite(tokens[i]) && text[i] != keep[i]);
    }
    snprintf(p, sizeof p, "%s/corpus.missing", d);
    snprintf(tc.data_path, sizeof tc.data_path, "%s", p);
    tc.data = LK_DATA_TEXT;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "corpus.missing"));
    rm_rf(d);
}

static void bad_config_is_an_error(void **state) {
    (void)state;
    char *d = tmpdir();
    tiny_config(d, 4, 0);
    tc.has_model = 0;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "expected a model"));
    tiny_config(d, 4, 0);
    assert_int_equal(lk_train_run(&tc, &ops, "/nonexistent/ckpt", NULL, NULL), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "/nonexistent/ckpt"));
    tiny_config(d, 4, 0);
    tc.cuda_graph = 1;   /* a graph needs a GPU: refused before any step */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.cuda_graph: expected train.device cuda, train.grad_accum 1 and one "
                                            "process"));
    assert_non_null(strstr(lk_last_error(), "got cpu, 2"));
    tiny_config(d, 4, 0);
    tc.exp_avg_sq_dtype = LK_F16;   /* only f32 and bf16 moments */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "train.exp_avg_sq_dtype: expected f32 or bf16, got f16"));
    tiny_config(d, 4, 0);
    tc.main_params_dtype = LK_BF16;   /* the weights in bf16 alone need the bf16 compute dtype */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "train.main_params_dtype bf16: expected train.dtype bf16"));
    assert_non_null(strstr(lk_last_error(), "got f32"));
    tiny_config(d, 4, 0);
    tc.main_params_dtype = LK_F16;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "train.main_params_dtype: expected f32 or bf16, got f16"));
    tiny_config(d, 4, 0);
    tc.main_grads_dtype = LK_F16;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "train.main_grads_dtype: expected f32 or bf16, got f16"));
    tiny_config(d, 4, 0);
    tc.main_grads_dtype = LK_BF16;   /* bf16 gradients of f32 activations */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "train.main_grads_dtype bf16: expected train.dtype bf16"));
    tiny_config(d, 4, 0);
    tc.dtype = LK_BF16, tc.main_grads_dtype = LK_BF16;   /* micro-batches would sum in bf16 */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.main_grads_dtype bf16: expected train.grad_accum 1"));
    assert_non_null(strstr(lk_last_error(), "got 2"));
    tiny_config(d, 4, 0);
    tc.recompute_num_layers = 1;   /* a count of layers to make again, without train.recompute */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.recompute_num_layers: expected 0 .. num_hidden_layers (2) with "
                                            "train.recompute true, got 1 without it"));
    tc.recompute = 1, tc.recompute_num_layers = 3;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "got 3"));
    tiny_config(d, 4, 0);
    tc.recompute_modules = LK_RECOMPUTE_MOE, tc.recompute_module_layers[1] = 3;   /* moe:3 of 2 layers */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, NULL, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.recompute_modules: moe:N: expected N in 1 .. num_hidden_layers (2), "
                                            "got 3"));
    rm_rf(d);
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(lk_init(), LK_OK);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resume_is_bit_identical),
        cmocka_unit_test(resume_is_bit_identical_bf16),
        cmocka_unit_test(resume_is_bit_identical_bf16_moments),
        cmocka_unit_test(resume_is_bit_identical_bf16_main),
        cmocka_unit_test(resume_is_bit_identical_bf16_grads),
        cmocka_unit_test(resume_converts_the_moments),
        cmocka_unit_test(resume_converts_the_weights),
        cmocka_unit_test(bf16_trains_like_f32),
        cmocka_unit_test(bf16_grads_train_like_f32),
        cmocka_unit_test(nan_loss_stops_and_keeps_checkpoint),
        cmocka_unit_test(failed_checkpoint_keeps_previous),
        cmocka_unit_test(eager_and_fused_train_alike),
        cmocka_unit_test(data_sources_and_recompute),
        cmocka_unit_test(bad_config_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
