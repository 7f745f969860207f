/* test_model.c — the Qwen3 / Qwen3-MoE model (model.h) on tiny configs: whole-model
 * finite-difference gradients, eager-everything vs fused-everything op tables,
 * recompute on/off, gradient accumulation, save -> load round trips (f32 exact, bf16
 * rounded), per-module overrides reaching their module only, sliding-window layers, and bad
 * configs, tables and batches rejected. Run: ctest -R test_model, or ./build/test_model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/checkpoint.h"
#include "llmkern/config.h"
#include "llmkern/llmkern.h"
#include "model/qwen3_internal.h"

static int64_t sliding;   /* > 0: tiny()'s layer 1 slides with this window (sliding_window_layers) */
static int all_moe;       /* 1: tiny(1)'s layer 1 is a MoE layer too (recompute_moe_identical) */

static lk_qwen3_config tiny(int moe) {
    lk_qwen3_config c;
    lk_qwen3_config_init(&c, moe);
    if (sliding) c.use_sliding_window = 1, c.sliding_window = sliding, c.max_window_layers = 1;
    c.hidden_size = 32;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.intermediate_size = 48;
    c.vocab_size = 320;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1;   /* larger than 0.02 so gradients stand above f32 noise */
    c.torch_dtype[0] = 0;
    strcpy(c.torch_dtype, "float32");
    if (moe) {
        c.num_experts = 4;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 16;
        c.norm_topk_prob = 1;
        c.router_aux_loss_coef = 0.1;   /* large enough that its gradient shows in the check */
        if (!all_moe) c.mlp_only_layers[c.n_mlp_only_layers++] = 1;   /* layer 1 dense: both kinds of block */
    }
    return c;
}

/* mode "eager", "fused", "flex" (fused with flex_attention) or NULL (defaults); an
 * override of layers.0.input_layernorm. */
static void table(int moe, const char *mode, const char *override, lk_op_table *t) {
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    if (mode) {
        int flex = strcmp(mode, "flex") == 0, fused = flex || strcmp(mode, "fused") == 0;
        const char *f[][2] = {{"rms_norm", fused ? "fused" : "eager"},      {"rope", fused ? "fused" : "eager"},
                              {"swiglu_mlp", fused ? "fused" : "eager"},    {"cross_entropy", fused ? "fused" : "eager"},
                              {"attention", flex ? "flex_attention" : fused ? "flash_attention_2" : "eager"},
                              {"moe_experts", fused ? "fused" : "eager"}};
        for (size_t i = 0; i < sizeof f / sizeof *f; i++)
            assert_int_equal(lk_ops_config_set(&cfg, f[i][0], f[i][1], "test"), LK_OK);
    }
    if (override)
        assert_int_equal(lk_ops_config_set_override(&cfg, "layers.0.input_layernorm", "rms_norm_implementation",
                                                    override, "test"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, moe ? "qwen3_moe" : "qwen3", t), LK_OK);
}

/* B = 2 rows of S = 12: row 0 packs documents of 7 and 5 tokens, row 1 one of 12; the
 * last token of each segment has no label. */
static void make_batch(lk_batch *b, uint64_t seed) {
    assert_int_equal(lk_batch_alloc(b, 2, 12), LK_OK);
    static const int32_t cu[] = {0, 7, 12, 24};
    b->n_segs = 3;
    b->max_seqlen = 12;
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int d = 0; d < 3; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b->input_ids[t] = (int64_t)((x >> 33) % 300);
            b->position_ids[t] = t - cu[d];
            b->doc_ids[t] = d;
        }
    b->n_labels = 0;
    for (int d = 0; d < 3; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) {
            b->labels[t] = t + 1 < cu[d + 1] ? b->input_ids[t + 1] : LK_LABEL_IGNORE;
            b->n_labels += b->labels[t] != LK_LABEL_IGNORE;
        }
    memcpy(b->cu_seqlens, cu, sizeof cu);
}

static lk_model *create(int moe, const char *mode, int recompute, uint64_t seed) {
    lk_qwen3_config c = tiny(moe);
    lk_op_table t;
    table(moe, mode, NULL, &t);
    lk_model *m = NULL;
    lk_status s = lk_model_create(&c, &t, seed, recompute, &m);
    if (s) print_error("%s\n", lk_last_error());
    assert_int_equal(s, LK_OK);
    return m;
}

static double total_loss(lk_model *m, const lk_batch *b) {
    lk_step_stats st;
    lk_status s = lk_model_loss(m, b, &st);
    if (s) print_error("%s\n", lk_last_error());
    assert_int_equal(s, LK_OK);
    return st.loss + m->cfg.router_aux_loss_coef * st.aux_loss;
}

static void fwd_bwd(lk_model *m, const lk_batch *b, float scale, lk_step_stats *st) {
    lk_status s = lk_model_forward_backward(m, b, scale, st);
    if (s) print_error("%s\n", lk_last_error());
    assert_int_equal(s, LK_OK);
}

static int setup(void **state) {
    (void)state;
    if (lk_init() || lk_model_register(&lk_family_qwen3) || lk_model_register(&lk_family_qwen3_moe)) return -1;
    return 0;
}

/* Central differences on a sample of each parameter (its largest-gradient element and
 * two others), the model in f32 and the loss read as double. With h = 1e-2 on weights
 * of std 0.1 the truncation error is O(h²) ~ 1e-4 of the slope and the f32 rounding of
 * a ~6.0 loss (~1e-6) becomes ~1e-4 in the difference quotient, so the tolerance is
 * 3e-4 absolute + 1% relative. MoE: top-k routing is a step function, so an element
 * whose ±h changes some token's choice (the loss jumps) has no derivative to check
 * there; the next element is taken instead (flips are counted and bounded). */
/* Copies every MoE layer's routing of the last forward into ids (NULL: compares). */
static int routing_same(const lk_model *m, int32_t *ids, int save) {
    int64_t n = m->T * m->K, k = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (!m->layers[l].moe) continue;
        if (save) memcpy(ids + k, m->acts[l].ids, (size_t)n * 4);
        else if (memcmp(ids + k, m->acts[l].ids, (size_t)n * 4) != 0) return 0;
        k += n;
    }
    return 1;
}

static void grad_check(int moe, const char *mode) {
    lk_model *m = create(moe, mode, 0, 7);
    lk_batch b;
    make_batch(&b, 3);
    lk_step_stats st;
    lk_model_zero_grad(m);
    fwd_bwd(m, &b, 1.0f, &st);
    assert_int_equal(st.n_tokens, b.n_labels);
    assert_true(fabs(st.loss - log(320.0)) < 1.0);    /* near uniform at init */
    if (moe) assert_true(st.aux_loss > 0.5 && st.aux_loss < 2.0);
    const double h = 1e-2;
    double worst = 0;
    int checked = 0, flips = 0;
    int32_t *ids = malloc((size_t)(m->T * (m->K + 1) * m->cfg.num_hidden_layers) * 4);
    routing_same(m, ids, 1);
    for (int i = 0; i < lk_model_param_count(m); i++) {
        lk_param *p = lk_model_param(m, i);
        float *w = p->value.data;
        const float *g = p->grad.data;
        int64_t n = lk_tensor_numel(&p->value), big = 0;
        for (int64_t j = 1; j < n; j++)
            if (fabsf(g[j]) > fabsf(g[big])) big = j;
        int64_t picks[3] = {big, (i * 7919 + 13) % n, (i * 104729 + n / 2) % n};
        for (int k = 0; k < 3; k++) {
            int64_t j = picks[k];
            float keep;
            double lp, lm;
            for (;;) {
                keep = w[j];
                w[j] = keep + (float)h;
                lp = total_loss(m, &b);
                int same = routing_same(m, ids, 0);
                w[j] = keep - (float)h;
                lm = total_loss(m, &b);
                same = same && routing_same(m, ids, 0);
                w[j] = keep;
                if (same) break;
                flips++;
                j = (j + 1) % n;
            }
            double fd = (lp - lm) / (2 * h), an = g[j], err = fabs(fd - an), tol = 3e-4 + 1e-2 * fabs(an);
            if (err / tol > worst) worst = err / tol;
            if (err > tol)
                print_error("%s[%lld]: analytic %.6e, finite difference %.6e\n", p->name, (long long)j, an, fd);
            assert_true(err <= tol);
            checked++;
        }
    }
    print_message("  %s %s: %d gradients checked, worst error %.2f of tolerance, %d routing flips stepped over\n",
                  moe ? "moe" : "dense", mode ? mode : "default", checked, worst, flips);
    assert_true(flips <= checked / 4);
    free(ids);
    lk_batch_free(&b);
    lk_model_free(m);
}

static void grad_check_dense(void **state) { (void)state; grad_check(0, "eager"); grad_check(0, "fused"); }
static void grad_check_moe(void **state) { (void)state; grad_check(1, "eager"); grad_check(1, "fused"); }

/* Max |a - b| over every grad, and the largest |grad| for scale. */
static double grad_diff(lk_model *a, lk_model *b, double *scale) {
    double d = 0, mx = 0;
    for (int i = 0; i < lk_model_param_count(a); i++) {
        const float *ga = lk_model_param(a, i)->grad.data, *gb = lk_model_param(b, i)->grad.data;
        for (int64_t j = 0; j < lk_tensor_numel(&lk_model_param(a, i)->grad); j++) {
            d = fmax(d, fabs((double)ga[j] - gb[j]));
            mx = fmax(mx, fabs(ga[j]));
        }
    }
    *scale = mx;
    return d;
}

/* Eager and fused tables differ in summation order only: the loss agrees to f32
 * rounding (1e-5 relative) and every gradient to 1e-4 of the largest. */
static void eager_matches_fused(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *e = create(moe, "eager", 0, 11), *f = create(moe, "fused", 0, 11);
        lk_batch b;
        make_batch(&b, 5);
        lk_step_stats se, sf;
        fwd_bwd(e, &b, 1.0f, &se);
        fwd_bwd(f, &b, 1.0f, &sf);
        double scale, d = grad_diff(e, f, &scale);
        print_message("  %s: loss eager %.7f fused %.7f, aux %.6f / %.6f, grad diff %.2e of %.2e\n",
                      moe ? "moe" : "dense", se.loss, sf.loss, se.aux_loss, sf.aux_loss, d, scale);
        assert_true(fabs(se.loss - sf.loss) <= 1e-5 * fabs(se.loss));
        assert_true(fabs(se.aux_loss - sf.aux_loss) <= 1e-5);
        assert_int_equal(se.n_tokens, sf.n_tokens);
        assert_true(d <= 1e-4 * scale);
        lk_batch_free(&b);
        lk_model_free(e);
        lk_model_free(f);
    }
}

/* flex_attention runs on the document BlockMask the model builds from each batch's
 * cu_seqlens; flash_attention_2 takes the cu_seqlens themselves: the same attention, so
 * the same loss and gradients up to summation order — for two batches with different
 * documents (the mask is rebuilt per batch). */
static void flex_matches_flash(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *fl = create(moe, "fused", 0, 13), *fx = create(moe, "flex", 0, 13);
        lk_batch b;
        make_batch(&b, 9);
        for (int round = 0; round < 2; round++) {
            if (round == 1) {   /* documents of 3, 9 and 12 tokens instead of 7, 5, 12 */
                b.cu_seqlens[1] = 3;
                for (int t = 0; t < 24; t++)
                    b.labels[t] = t + 1 == 3 || t + 1 == 12 || t + 1 == 24 ? LK_LABEL_IGNORE : b.input_ids[t + 1];
                for (int t = 0; t < 24; t++) {
                    int doc0 = t < 3 ? 0 : t < 12 ? 3 : 12;
                    b.position_ids[t] = t - doc0;
                }
            }
            lk_model_zero_grad(fl);
            lk_model_zero_grad(fx);
            lk_step_stats sa, sb;
            fwd_bwd(fl, &b, 1.0f, &sa);
            fwd_bwd(fx, &b, 1.0f, &sb);
            double scale, d = grad_diff(fl, fx, &scale);
            print_message("  %s batch %d: loss flash %.7f flex %.7f, grad diff %.2e of %.2e\n", moe ? "moe" : "dense",
                          round, sa.loss, sb.loss, d, scale);
            assert_true(fabs(sa.loss - sb.loss) <= 1e-5 * fabs(sa.loss));   /* f32 sums in another order */
            assert_true(d <= 1e-4 * scale);
        }
        lk_batch_free(&b);
        lk_model_free(fl);
        lk_model_free(fx);
    }
}

/* Sliding-window layers (transformers' rule: layer 1 of 2 with max_window_layers 1 in the
 * dense model, both layers of the MoE one), a window of 4 over documents of 5-12 tokens: the finite differences hold, eager and fused
 * tables agree, the window binds (the loss moves off full attention's), a window as long
 * as the longest document changes nothing, and flex_attention (the documents' BlockMask
 * ANDed with the window's) gives flash_attention_2's loss and gradients. */
static void sliding_window_layers(void **state) {
    sliding = 4;
    grad_check(0, "eager");
    grad_check(1, "fused");
    eager_matches_fused(state);
    double loss[3];
    const int64_t windows[3] = {0, 4, 12};
    for (int i = 0; i < 3; i++) {
        sliding = windows[i];
        lk_model *m = create(0, "fused", 0, 17);
        lk_batch b;
        make_batch(&b, 5);
        loss[i] = total_loss(m, &b);
        lk_batch_free(&b);
        lk_model_free(m);
    }
    print_message("  loss: full attention %.7f, window 4 %.7f, window 12 %.7f\n", loss[0], loss[1], loss[2]);
    assert_true(fabs(loss[1] - loss[0]) > 1e-4 * fabs(loss[0]));
    assert_true(fabs(loss[2] - loss[0]) <= 1e-6 * fabs(loss[0]));   /* f32: the same elements, maybe another order */
    sliding = 4;
    flex_matches_flash(state);   /* flex's sliding layers follow the documents within the window */
    sliding = 0;
}

/* Recompute reruns the same deterministic kernels on the same inputs: bit-identical. */
static void recompute_identical(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *a = create(moe, NULL, 0, 13), *r = create(moe, NULL, 1, 13);
        lk_batch b;
        make_batch(&b, 9);
        lk_step_stats sa, sr;
        fwd_bwd(a, &b, 1.0f, &sa);
        fwd_bwd(r, &b, 1.0f, &sr);
        assert_true(sa.loss == sr.loss);
        assert_true(sa.aux_loss == sr.aux_loss);
        assert_true(memcmp(a->g, r->g, (size_t)a->n_floats * 4) == 0);
        size_t ka = lk_model_activation_bytes(a), kr = lk_model_activation_bytes(r);
        print_message("  %s: activations kept %zu bytes, %zu with recompute\n", moe ? "moe" : "dense", ka, kr);
        assert_true(kr > 0 && kr < ka);
        lk_batch_free(&b);
        lk_model_free(a);
        lk_model_free(r);
    }
}

/* Two batches through a and b, each step from zeroed gradients: the same loss, aux loss and
 * gradients, bit for bit (a stale kept or shared buffer would show in the second). */
static void same_steps(lk_model *a, lk_model *b, uint64_t seed) {
    for (int round = 0; round < 2; round++) {
        lk_batch bt;
        make_batch(&bt, seed + (uint64_t)round);
        lk_step_stats sa, sb;
        lk_model_zero_grad(a);
        lk_model_zero_grad(b);
        fwd_bwd(a, &bt, 1.0f, &sa);
        fwd_bwd(b, &bt, 1.0f, &sb);
        assert_true(sa.loss == sb.loss && sa.aux_loss == sb.aux_loss);
        assert_true(memcmp(a->g, b->g, (size_t)a->n_floats * a->gs) == 0);
        lk_batch_free(&bt);
    }
}

/* lk_model_set_recompute_layers (train.recompute_num_layers): layer 0 of 2 made again, layer
 * 1 kept (and both, create's flag); alone and with the norms made again for the kept one; in
 * bf16 against the model that keeps everything and normalizes the rounded stream, in f32
 * against the default: loss and gradients bit for bit over two batches; the kept bytes
 * between none and all recomputed; n out of range refused with the model unchanged. */
static void recompute_some_layers(void **state) {
    (void)state;
    assert_int_equal(lk_model_set_recompute_layers(NULL, 1), LK_EINVAL);
    for (int moe = 0; moe <= 1; moe++)
        for (int v = 0; v < 3; v++) {   /* bf16; bf16 with the norms made again; f32 */
            lk_model *a = create(moe, "fused", 0, 37), *p = create(moe, "fused", 0, 37), *all = create(moe, "fused", 1, 37);
            assert_int_equal(lk_model_recompute_layers(all), 2);
            assert_int_equal(lk_model_recompute_layers(a), 0);
            assert_int_equal(lk_model_set_recompute_layers(p, 3), LK_EINVAL);
            assert_non_null(strstr(lk_last_error(), "expected 0 .. 2 layers (num_hidden_layers), got 3"));
            assert_int_equal(lk_model_set_recompute_layers(p, -1), LK_EINVAL);
            assert_int_equal(lk_model_recompute_layers(p), 0);
            assert_int_equal(lk_model_set_recompute_layers(p, 1), LK_OK);
            assert_true(p->norm_of_x);
            lk_model *ms[3] = {a, p, all};
            for (int k = 0; v < 2 && k < 3; k++) assert_int_equal(lk_model_set_dtype(ms[k], LK_BF16), LK_OK);
            if (v < 2) a->norm_of_x = 1;
            if (v == 1) assert_int_equal(lk_model_set_recompute_norms(p, 2), LK_OK);   /* the kept layer's */
            same_steps(a, p, 61);
            same_steps(a, all, 61);
            size_t ka = lk_model_activation_bytes(a), kp = lk_model_activation_bytes(p),
                   kl = lk_model_activation_bytes(all);
            if (v != 1) print_message("  %s %s: activations kept %zu bytes, %zu with layer 0 made again, %zu with both\n",
                                      moe ? "moe" : "dense", v ? "f32" : "bf16", ka, kp, kl);
            assert_true(kl < kp && kp < ka);
            lk_model_free(a), lk_model_free(p), lk_model_free(all);
        }
}

/* lk_model_set_recompute_norms (train.recompute_modules [layernorm]): the layers keep neither
 * norm's output, the backward makes h2 and h1 again from the kept x2 and x. In bf16, with
 * and without keep_qk, eager and fused norms, dense and MoE, over two batches: loss, aux loss
 * and gradients bit for bit those of the model that keeps its activations and normalizes the
 * rounded stream (norm_of_x, as the recompute does); in f32 (x is the stream) those of the
 * default model. The kept bytes are two [T, H] a layer fewer; full recompute makes them
 * anyway (the flag changes nothing there, bit for bit). */
static void recompute_norms_identical(void **state) {
    (void)state;
    const char *modes[] = {"eager", "fused"};
    assert_int_equal(lk_model_set_recompute_norms(NULL, 1), LK_EINVAL);
    for (int moe = 0; moe <= 1; moe++)
        for (int mi = 0; mi < 2; mi++)
            for (int v = 0; v < 3; v++) {   /* bf16; bf16 with keep_qk; f32 */
                lk_model *a = create(moe, modes[mi], 0, 29), *n = create(moe, modes[mi], 0, 29);
                if (v < 2) {
                    assert_int_equal(lk_model_set_dtype(a, LK_BF16), LK_OK);
                    assert_int_equal(lk_model_set_dtype(n, LK_BF16), LK_OK);
                    a->norm_of_x = 1;   /* what the backward's norms compute */
                }
                assert_int_equal(lk_model_set_keep_qk(a, v == 1), LK_OK);
                assert_int_equal(lk_model_set_keep_qk(n, v == 1), LK_OK);
                assert_int_equal(lk_model_set_recompute_norms(n, 3), LK_EINVAL);   /* of 2 layers */
                assert_non_null(strstr(lk_last_error(), "model_set_recompute_norms: expected 0 .. 2 layers"));
                assert_int_equal(lk_model_set_recompute_norms(n, 2), LK_OK);
                assert_true(n->norm_of_x);
                same_steps(a, n, 51);
                const size_t TH = (size_t)(n->T * n->H) * n->es, ka = lk_model_activation_bytes(a),
                             kn = lk_model_activation_bytes(n);
                if (moe == 1 && mi == 1)
                    print_message("  %s: activations kept %zu bytes, %zu with the norms made again\n",
                                  v == 2 ? "f32" : v ? "bf16, keep_qk" : "bf16", ka, kn);
                assert_true(ka - kn >= 2 * (size_t)n->cfg.num_hidden_layers * TH);
                assert_true(ka - kn <= 2 * (size_t)n->cfg.num_hidden_layers * (TH + 64));
                assert_int_equal(lk_model_set_recompute_norms(n, 0), LK_OK);
                assert_true(!n->norm_of_x);
                lk_model_free(a), lk_model_free(n);
            }
    for (int moe = 0; moe <= 1; moe++) {   /* under recompute: nothing changes */
        lk_model *r = create(moe, "fused", 1, 31), *rn = create(moe, "fused", 1, 31);
        assert_int_equal(lk_model_set_dtype(r, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_dtype(rn, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_recompute_norms(rn, 2), LK_OK);
        lk_batch b;
        make_batch(&b, 57);
        lk_step_stats sr, srn;
        fwd_bwd(r, &b, 1.0f, &sr);
        fwd_bwd(rn, &b, 1.0f, &srn);
        assert_true(sr.loss == srn.loss);
        assert_true(memcmp(r->g, rn->g, (size_t)r->n_floats * 4) == 0);
        assert_int_equal(lk_model_activation_bytes(r), lk_model_activation_bytes(rn));
        assert_null(rn->sc.hn);
        lk_batch_free(&b);
        lk_model_free(r), lk_model_free(rn);
    }
}

/* lk_model_set_recompute_moe (train.recompute_modules [moe]): a MoE layer keeps no experts'
 * saved block; the backward runs the experts' forward again to make it (the routing stays
 * kept). The forward is untouched, so the gradients are the default model's bit for bit, f32
 * and bf16, eager and fused tables, both layers or only the first, with the norms made again
 * as well (against the norm_of_x model then), over two batches; the kept bytes fall by the
 * experts' saved blocks but one (the shared scratch). A dense model takes it as nothing. */
static void recompute_moe_identical(void **state) {
    (void)state;
    const char *modes[] = {"eager", "fused"};
    assert_int_equal(lk_model_set_recompute_moe(NULL, 1), LK_EINVAL);
    all_moe = 1;
    for (int mi = 0; mi < 2; mi++)
        for (int v = 0; v < 4; v++) {   /* f32 both layers; bf16 both; bf16 the first; bf16 both with the norms */
            lk_model *a = create(1, modes[mi], 0, 71), *n = create(1, modes[mi], 0, 71);
            if (v) {
                assert_int_equal(lk_model_set_dtype(a, LK_BF16), LK_OK);
                assert_int_equal(lk_model_set_dtype(n, LK_BF16), LK_OK);
            }
            assert_int_equal(lk_model_set_recompute_moe(n, v == 2 ? 1 : 2), LK_OK);
            assert_true(!n->norm_of_x);   /* the experts alone change no norm */
            if (v == 3) {
                assert_int_equal(lk_model_set_recompute_norms(n, 2), LK_OK);
                a->norm_of_x = 1;
            }
            same_steps(a, n, 73);
            size_t ka = lk_model_activation_bytes(a), kn = lk_model_activation_bytes(n), se = 0;
            int again = 0;
            for (int l = 0; l < n->cfg.num_hidden_layers; l++)
                if (lk_moe_again(n, l)) se = n->layers[l].saved[S_EXPERTS], again++;
            if (mi == 1) print_message("  %s: activations kept %zu bytes, %zu with %d layers' experts made again\n",
                                       v ? "bf16" : "f32", ka, kn, again);
            assert_int_equal(again, v == 2 ? 1 : 2);
            assert_non_null(n->sc.experts);
            assert_true(ka - kn >= (size_t)again * se);
            lk_model_free(a), lk_model_free(n);
        }
    all_moe = 0;
    lk_model *d = create(0, "fused", 0, 71);   /* dense: no experts to make again */
    assert_int_equal(lk_model_set_recompute_moe(d, 2), LK_OK);
    lk_batch b;
    make_batch(&b, 75);
    lk_step_stats sd;
    fwd_bwd(d, &b, 1.0f, &sd);
    assert_null(d->sc.experts);
    lk_batch_free(&b);
    lk_model_free(d);
}

/* lk_model_set_recompute_qkv (train.recompute_modules [qkv]): the layers keep no q, k, v after
 * their norms and RoPE; the backward makes them again from the projection (kept, or the
 * forward's GEMM again into the scratch, which the norms' backward then reads). The loss, aux
 * loss and gradients bit for bit those of the model that keeps the projection (keep_qk), with
 * or without keep_qk itself, f32 and bf16, eager norms (head moves) and fused (views), dense
 * and MoE, both layers or the first, with the norms made again too (against the norm_of_x
 * model then), over two batches; the kept bytes fall by q, k and v of each layer made again. */
static void recompute_qkv_identical(void **state) {
    (void)state;
    const char *modes[] = {"eager", "fused"};
    assert_int_equal(lk_model_set_recompute_qkv(NULL, 1), LK_EINVAL);
    for (int moe = 0; moe <= 1; moe++)
        for (int mi = 0; mi < 2; mi++)
            for (int v = 0; v < 5; v++) {   /* f32; bf16; bf16 keep_qk; bf16 the first layer; bf16 with the norms */
                lk_model *a = create(moe, modes[mi], 0, 83), *n = create(moe, modes[mi], 0, 83);
                if (v) {
                    assert_int_equal(lk_model_set_dtype(a, LK_BF16), LK_OK);
                    assert_int_equal(lk_model_set_dtype(n, LK_BF16), LK_OK);
                }
                assert_int_equal(lk_model_set_keep_qk(a, 1), LK_OK);
                assert_int_equal(lk_model_set_keep_qk(n, v == 2), LK_OK);
                assert_int_equal(lk_model_set_recompute_qkv(n, 3), LK_EINVAL);   /* of 2 layers */
                assert_non_null(strstr(lk_last_error(), "model_set_recompute_qkv: expected 0 .. 2 layers"));
                assert_int_equal(lk_model_set_recompute_qkv(n, v == 3 ? 1 : 2), LK_OK);
                assert_true(!n->norm_of_x);   /* q, k and v alone change no norm */
                if (v == 4) {
                    assert_int_equal(lk_model_set_recompute_norms(n, 2), LK_OK);
                    a->norm_of_x = 1;
                }
                same_steps(a, n, 87);
                const size_t es = n->es, qkv = (size_t)(n->T * (n->Hq + 2 * n->Hk) * n->D) * es;
                const size_t ka = lk_model_activation_bytes(a), kn = lk_model_activation_bytes(n);
                const int again = v == 3 ? 1 : 2, keep = v == 2;
                if (moe == 1 && mi == 1)
                    print_message("  %s: activations kept %zu bytes with keep_qk, %zu with %d layers' q, k, v made "
                                  "again%s\n", v ? "bf16" : "f32", ka, kn, again, keep ? " (keep_qk)" : "");
                /* q, k, v of each layer made again; without keep_qk the projection too */
                const size_t fewer = (size_t)again * qkv + (keep ? 0 : (size_t)n->cfg.num_hidden_layers * qkv);
                assert_true(ka - kn >= fewer);
                assert_true(ka - kn <= fewer + (v == 4 ? 2 * (size_t)n->cfg.num_hidden_layers * (size_t)(n->T * n->H) * es : 0) +
                                           8 * 64 * (size_t)n->cfg.num_hidden_layers);
                assert_non_null(n->sc.qr);
                assert_true(keep ? n->sc.proj == NULL : n->sc.proj != NULL);
                assert_int_equal(lk_model_set_recompute_qkv(n, 0), LK_OK);
                lk_model_free(a), lk_model_free(n);
            }
    lk_model *r = create(0, "fused", 1, 83);   /* under recompute: the layers make everything again anyway */
    assert_int_equal(lk_model_set_recompute_qkv(r, 2), LK_OK);
    lk_batch b;
    make_batch(&b, 89);
    lk_step_stats st;
    fwd_bwd(r, &b, 1.0f, &st);
    assert_null(r->sc.qr);
    lk_batch_free(&b);
    lk_model_free(r);
}

/* lk_model_set_keep_qk: the backward reads q and k where the forward's projection left them
 * instead of making them again by a GEMM. The same forward (the loss bit for bit) and the
 * same gradients up to that GEMM's summation order (f32: 1e-6 of the largest), on both norm
 * paths (eager: head moves; fused: views), with and without recompute, over two batches (a
 * stale kept buffer would show in the second); the kept bytes are the projection's. */
static void keep_qk_matches(void **state) {
    (void)state;
    const char *modes[] = {"eager", "fused"};
    assert_int_equal(lk_model_set_keep_qk(NULL, 1), LK_EINVAL);
    for (int moe = 0; moe <= 1; moe++)
        for (int mi = 0; mi < 2; mi++)
            for (int rc = 0; rc <= 1; rc++) {
                lk_model *a = create(moe, modes[mi], rc, 17), *k = create(moe, modes[mi], rc, 17);
                assert_int_equal(lk_model_set_keep_qk(k, 1), LK_OK);
                for (int round = 0; round < 2; round++) {
                    lk_batch b;
                    make_batch(&b, 21 + round);
                    lk_step_stats sa, sk;
                    lk_model_zero_grad(a);
                    lk_model_zero_grad(k);
                    fwd_bwd(a, &b, 1.0f, &sa);
                    fwd_bwd(k, &b, 1.0f, &sk);
                    double scale, d = grad_diff(a, k, &scale);
                    assert_true(sa.loss == sk.loss && sa.aux_loss == sk.aux_loss);
                    assert_true(scale > 0 && d <= 1e-6 * scale);
                    if (round == 1) {
                        int64_t QKV = (k->Hq + 2 * k->Hk) * k->D;
                        size_t ka = lk_model_activation_bytes(a), kk = lk_model_activation_bytes(k);
                        size_t want = (size_t)(rc ? 1 : k->cfg.num_hidden_layers) * (size_t)(k->T * QKV) * 4;
                        print_message("  %s %s recompute %d: grad diff %.2e of %.2e, activations %zu -> %zu bytes\n",
                                      moe ? "moe" : "dense", modes[mi], rc, d, scale, ka, kk);
                        /* with recompute the one shared block grows by a layer's projection, which
                         * activation_bytes does not count (the kept inputs only) */
                        if (rc) assert_true(kk == ka);
                        else assert_true(kk >= ka + want && kk <= ka + want + 64 * (size_t)k->cfg.num_hidden_layers);
                    }
                    lk_batch_free(&b);
                }
                lk_model_free(a);
                lk_model_free(k);
            }
}

/* bf16's residual stream is f32 (issue 17): after a forward the stream buffer holds the
 * final norm's input, of which the kept inputs[N] is the rounding, and it carries bits a
 * bf16 stream would have lost; in f32 inputs[N] is the stream itself. */
static void residual_stream_is_f32(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++)
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            lk_model *m = create(moe, "fused", 0, 29);
            if (bf16) assert_int_equal(lk_model_set_dtype(m, LK_BF16), LK_OK);
            lk_batch b;
            make_batch(&b, 31);
            lk_step_stats st;
            assert_int_equal(lk_model_loss(m, &b, &st), LK_OK);
            int64_t n = m->T * m->H, finer = 0;
            const void *xN = m->inputs[m->cfg.num_hidden_layers];
            for (int64_t i = 0; i < n; i++) {
                float r = m->sc.res[i];
                if (bf16) {
                    assert_int_equal(((const uint16_t *)xN)[i], lk_f32_to_bf16(r));
                    finer += lk_bf16_to_f32(lk_f32_to_bf16(r)) != r;
                } else {
                    assert_true(((const float *)xN)[i] == r);
                }
            }
            print_message("  %s %s: %lld of %lld stream elements finer than bf16\n", moe ? "moe" : "dense",
                          bf16 ? "bf16" : "f32", (long long)finer, (long long)n);
            if (bf16) assert_true(finer > n / 2);
            lk_batch_free(&b);
            lk_model_free(m);
        }
}

/* ||a - b|| / ||a|| over every grad. */
static double grad_rel_l2(lk_model *a, lk_model *b) {
    double d = 0, n = 0;
    for (int i = 0; i < lk_model_param_count(a); i++) {
        const lk_tensor *ga = &lk_model_param(a, i)->grad, *gb = &lk_model_param(b, i)->grad;
        for (int64_t j = 0; j < lk_tensor_numel(ga); j++) {
            double x = lk_load(ga->data, ga->dtype, j), y = lk_load(gb->data, gb->dtype, j);
            d += (x - y) * (x - y);
            n += x * x;
        }
    }
    return sqrt(d / n);
}

/* The residual stream in bf16 (lk_model_set_fp32_residual off; a bf16 transformers model's,
 * Megatron's default): no f32 stream buffer; the loss and gradients follow the f32 model
 * (tolerances of bf16_follows_f32 below, measured in the comment there) and are not the
 * f32 stream's bits; a recompute of every layer gives the keeping model's loss and
 * gradients bit for bit without norm_of_x (the stream is x and x2 themselves); turning it
 * back on gives the f32 stream's bits again; an f32 model is the same either way. */
static void bf16_stream_follows_f32(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++)
        for (int fused = 0; fused <= 1; fused++) {
            const char *mode = fused ? "fused" : "eager";
            lk_model *f = create(moe, mode, 0, 19), *h = create(moe, mode, 0, 19), *x = create(moe, mode, 0, 19),
                     *r = create(moe, mode, 1, 19), *f2 = create(moe, mode, 0, 19);
            lk_model *bf[] = {h, x, r};
            for (int i = 0; i < 3; i++) assert_int_equal(lk_model_set_dtype(bf[i], LK_BF16), LK_OK);
            assert_int_equal(lk_model_set_fp32_residual(x, 0), LK_OK);
            assert_int_equal(lk_model_set_fp32_residual(r, 0), LK_OK);
            assert_int_equal(lk_model_set_fp32_residual(f2, 0), LK_OK);
            assert_int_equal(lk_model_set_fp32_residual(NULL, 0), LK_EINVAL);
            lk_batch b;
            make_batch(&b, 23);
            lk_step_stats sf, sh, sx, sr, sf2;
            fwd_bwd(f, &b, 1.0f, &sf);
            fwd_bwd(h, &b, 1.0f, &sh);
            fwd_bwd(x, &b, 1.0f, &sx);
            fwd_bwd(r, &b, 1.0f, &sr);
            fwd_bwd(f2, &b, 1.0f, &sf2);
            assert_null(x->sc.res);
            assert_non_null(h->sc.res);
            double g = grad_rel_l2(f, x);
            print_message("  %s %s: loss f32 %.6f, bf16 f32-stream %.6f, bf16 bf16-stream %.6f, aux %.5f / %.5f, "
                          "grads rel L2 %.2e (f32 stream %.2e)\n", moe ? "moe" : "dense", mode, sf.loss, sh.loss,
                          sx.loss, sf.aux_loss, sx.aux_loss, g, grad_rel_l2(f, h));
            assert_true(fabs(sf.loss - sx.loss) <= 2e-3 * fabs(sf.loss));
            assert_true(fabs(sf.aux_loss - sx.aux_loss) <= 2e-3 * fabs(sf.aux_loss));
            assert_true(g <= 4e-2);
            assert_true(memcmp(h->g, x->g, (size_t)h->n_floats * 4) != 0);   /* not the f32 stream's */
            assert_true(sr.loss == sx.loss && sr.aux_loss == sx.aux_loss);     /* recompute: the same bits */
            assert_int_equal(memcmp(r->g, x->g, (size_t)x->n_floats * 4), 0);
            assert_true(sf2.loss == sf.loss);                                 /* f32: no such stream */
            assert_int_equal(memcmp(f2->g, f->g, (size_t)f->n_floats * 4), 0);
            assert_int_equal(lk_model_set_fp32_residual(x, 1), LK_OK);         /* back: the f32 stream's bits */
            lk_model_zero_grad(x);
            fwd_bwd(x, &b, 1.0f, &sx);
            assert_true(sx.loss == sh.loss);
            assert_int_equal(memcmp(h->g, x->g, (size_t)h->n_floats * 4), 0);
            lk_batch_free(&b);
            for (int i = 0; i < 3; i++) lk_model_free(bf[i]);
            lk_model_free(f);
            lk_model_free(f2);
        }
}

/* bf16 compute (mixed precision) against the f32 model from the same weights, for the
 * eager and the fused tables: the ops round every activation to bf16 (2^-9 relative),
 * so through 2 layers the loss moved by 2.4e-4 relative and the gradients by 1.5e-2
 * (relative L2 of all of them) when this was written; with the f32 residual stream
 * (issue 17) 1.2e-4 and 1.1-1.4e-2 at most; tolerances 2e-3 and 4e-2. The
 * master weights stay f32 and untouched, the compute copy is their rounding, the
 * gradients are f32, and a dtype the model cannot take is refused with the model
 * unchanged. Recompute: its norms normalize the rounded stream x in the first forward
 * too (norm_of_x, qwen3_internal.h), so it is bit-identical with the model that keeps
 * its activations and sets norm_of_x — loss, gradients, and so the routing — and
 * within the same tolerances of f32; the default (the norms read the f32 stream) is
 * not those bits. */
static void bf16_follows_f32(void **state) {
    (void)state;
    for (int moe = 0; moe <= 1; moe++)
        for (int fused = 0; fused <= 1; fused++) {
            const char *mode = fused ? "fused" : "eager";
            lk_model *f = create(moe, mode, 0, 19), *h = create(moe, mode, 0, 19), *r = create(moe, mode, 1, 19),
                     *hx = create(moe, mode, 0, 19);
            assert_int_equal(lk_model_set_dtype(h, LK_BF16), LK_OK);
            assert_int_equal(lk_model_set_dtype(r, LK_BF16), LK_OK);
            assert_int_equal(lk_model_set_dtype(hx, LK_BF16), LK_OK);
            assert_true(r->norm_of_x && !h->norm_of_x);
            hx->norm_of_x = 1;   /* the recompute's norms, activations kept */
            assert_int_equal(lk_model_dtype(h), LK_BF16);
            assert_int_equal(memcmp(f->w, h->w, (size_t)f->n_floats * 4), 0);
            lk_batch b;
            make_batch(&b, 23);
            lk_step_stats sf, sh, sr, sx;
            fwd_bwd(f, &b, 1.0f, &sf);
            fwd_bwd(h, &b, 1.0f, &sh);
            fwd_bwd(r, &b, 1.0f, &sr);
            fwd_bwd(hx, &b, 1.0f, &sx);
            double g = grad_rel_l2(f, h);
            print_message("  %s %s: loss f32 %.6f bf16 %.6f, aux %.5f / %.5f, grads rel L2 %.2e\n",
                          moe ? "moe" : "dense", mode, sf.loss, sh.loss, sf.aux_loss, sh.aux_loss, g);
            assert_true(fabs(sf.loss - sh.loss) <= 2e-3 * fabs(sf.loss));
            assert_true(fabs(sf.aux_loss - sh.aux_loss) <= 2e-3 * fabs(sf.aux_loss));
            assert_true(g <= 4e-2);
            assert_true(g > 0);   /* it did compute in bf16 */
            assert_true(sx.loss == sr.loss && sx.aux_loss == sr.aux_loss);   /* recompute: the first forward's bits */
            assert_true(memcmp(hx->g, r->g, (size_t)hx->n_floats * 4) == 0);
            double gr = grad_rel_l2(f, r);
            print_message("  %s %s: recompute (norm_of_x) loss bf16 %.6f, grads rel L2 %.2e\n", moe ? "moe" : "dense",
                          mode, sr.loss, gr);
            assert_true(fabs(sf.loss - sr.loss) <= 2e-3 * fabs(sf.loss));
            assert_true(gr <= 4e-2);
            /* fused: the stream's norms, other bits; `eager` bf16 normalizes x either way (rms_norm.h) */
            assert_true((memcmp(h->g, r->g, (size_t)h->n_floats * 4) != 0) == fused);
            assert_int_equal(memcmp(f->w, h->w, (size_t)f->n_floats * 4), 0);   /* the master untouched */
            const uint16_t *wc = h->wc;
            for (int64_t i = 0; i < h->n_floats; i += 7) assert_int_equal(wc[i], lk_f32_to_bf16(h->w[i]));
            /* a master changed between steps reaches the next forward */
            h->w[h->embed] += 1.0f;
            lk_step_stats s2;
            assert_int_equal(lk_model_loss(h, &b, &s2), LK_OK);
            assert_int_equal(wc[h->embed], lk_f32_to_bf16(h->w[h->embed]));
            /* an optimizer that writes the copy itself says so, and that forward alone skips the
             * rounding: a master changed behind it is not seen then, and is by the next one */
            const lk_param *p0 = lk_model_param(h, 0);
            assert_ptr_equal(lk_model_param_copy(h, 0),
                             (const char *)h->wc + ((const float *)p0->value.data - h->w) * 2);
            assert_null(lk_model_param_copy(f, 0));   /* f32: the master is the copy */
            assert_null(lk_model_param_copy(h, lk_model_param_count(h)));
            const int64_t q0 = h->layers[0].q;   /* a weight the ops read from the copy alone */
            const uint16_t before = wc[q0];
            h->w[q0] += 1.0f;
            lk_model_copy_is_current(h);
            lk_step_stats s3, s4;
            assert_int_equal(lk_model_loss(h, &b, &s3), LK_OK);
            assert_int_equal(wc[q0], before);
            assert_true(s3.loss == s2.loss);
            assert_int_equal(lk_model_loss(h, &b, &s4), LK_OK);
            assert_int_equal(wc[q0], lk_f32_to_bf16(h->w[q0]));
            assert_true(s4.loss != s2.loss);
            lk_batch_free(&b);
            lk_model_free(f);
            lk_model_free(h);
            lk_model_free(r);
            lk_model_free(hx);
        }
    lk_model *m = create(0, NULL, 0, 3);
    assert_int_equal(lk_model_set_dtype(m, LK_I32), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "expected f32 or bf16, got i32"));
    assert_int_equal(lk_model_set_dtype(m, LK_F16), LK_EDTYPE);
    assert_int_equal(lk_model_dtype(m), LK_F32);
    assert_int_equal(lk_model_set_dtype(NULL, LK_BF16), LK_EINVAL);
    lk_batch b;
    make_batch(&b, 5);
    lk_step_stats st;
    fwd_bwd(m, &b, 1.0f, &st);   /* still the f32 model */
    assert_true(m->wc == (void *)m->w);
    lk_batch_free(&b);
    lk_model_free(m);
}

/* A bf16 master (lk_model_set_master_dtype, train.main_params_dtype): the f32 master is
 * freed and the values are its nearest-even rounding, now the only copy; every parameter a
 * bf16 view, no separate compute copy. Its loss and gradients follow the f32 model within
 * bf16_follows_f32's tolerances (the embedding and the norms' gains now read bf16: at
 * init the gains are 1, exact, the embedding rounded once). A save and a load give the same
 * bytes, and the f32 master made again holds the bf16 values exactly. Refused: an f32
 * model, a dtype not f32 or bf16, and the f32 compute dtype under a bf16 master, each with
 * the model unchanged. */
static void bf16_master(void **state) {
    (void)state;
    char dir[] = "/tmp/lk_test_master_XXXXXX";
    assert_non_null(mkdtemp(dir));
    lk_batch b;
    make_batch(&b, 31);
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *f = create(moe, "fused", 0, 19), *h = create(moe, "fused", 0, 19), *q = create(moe, "fused", 0, 19),
                 *q2 = create(moe, "fused", 0, 23);
        assert_int_equal(lk_model_set_master_dtype(q, LK_BF16), LK_EDTYPE);   /* an f32 model */
        assert_non_null(strstr(lk_last_error(), "expected a bf16 model (lk_model_set_dtype), got f32"));
        assert_non_null(q->w);
        assert_int_equal(lk_model_set_dtype(h, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_dtype(q, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_dtype(q2, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_master_dtype(q, LK_I32), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "expected f32 or bf16, got i32"));
        assert_int_equal(lk_model_set_master_dtype(q, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_master_dtype(q2, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_master_dtype(NULL, LK_BF16), LK_EINVAL);
        assert_null(q->w);
        assert_int_equal(lk_model_master_dtype(q), LK_BF16);
        assert_int_equal(lk_model_master_dtype(h), LK_F32);
        const uint16_t *wc = q->wc;
        for (int64_t i = 0; i < q->n_floats; i++) assert_int_equal(wc[i], lk_f32_to_bf16(h->w[i]));
        for (int i = 0; i < lk_model_param_count(q); i++) {
            const lk_param *p = lk_model_param(q, i);
            assert_int_equal(p->value.dtype, LK_BF16);
            assert_int_equal(p->grad.dtype, LK_F32);
            assert_ptr_equal(p->value.data, (const char *)q->wc + ((const char *)p->grad.data - (const char *)q->g) / 2);
            assert_null(lk_model_param_copy(q, i));   /* the values are what the ops read */
        }
        assert_int_equal(lk_model_set_dtype(q, LK_F32), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "set the master to f32 first"));
        assert_int_equal(lk_model_dtype(q), LK_BF16);
        lk_step_stats sf, sh, sq;
        fwd_bwd(f, &b, 1.0f, &sf);
        fwd_bwd(h, &b, 1.0f, &sh);
        fwd_bwd(q, &b, 1.0f, &sq);
        double gq = grad_rel_l2(f, q), gqh = grad_rel_l2(h, q);
        print_message("  %s: loss f32 %.6f, bf16 %.6f, bf16 master %.6f; grads rel L2 %.2e (to f32), %.2e (to bf16)\n",
                      moe ? "moe" : "dense", sf.loss, sh.loss, sq.loss, gq, gqh);
        assert_true(fabs(sf.loss - sq.loss) <= 2e-3 * fabs(sf.loss));   /* bf16_follows_f32's tolerances */
        assert_true(gq <= 4e-2);
        assert_true(gqh > 0);   /* the embedding's rounding reached the loss */
        /* save, load into another bf16 master: the same bytes, the same loss */
        char sub[80];
        snprintf(sub, sizeof sub, "%s/ckpt%d", dir, moe);
        assert_int_equal(lk_model_save(q, sub), LK_OK);
        assert_int_equal(lk_model_load_weights(q2, sub), LK_OK);
        assert_memory_equal(q2->wc, q->wc, (size_t)q->n_floats * 2);
        assert_true(total_loss(q2, &b) == total_loss(q, &b));
        /* the f32 master again: the bf16 values widened, exactly */
        assert_int_equal(lk_model_set_master_dtype(q, LK_F32), LK_OK);
        assert_non_null(q->w);
        for (int64_t i = 0; i < q->n_floats; i++) assert_true(q->w[i] == lk_bf16_to_f32(wc[i]));
        assert_int_equal(lk_model_param(q, 0)->value.dtype, LK_F32);
        assert_ptr_equal(lk_model_param(q, 0)->value.data, q->w + ((const float *)lk_model_param(q, 0)->grad.data - (const float *)q->g));
        assert_int_equal(lk_model_set_dtype(q, LK_F32), LK_OK);
        lk_model_free(f), lk_model_free(h), lk_model_free(q), lk_model_free(q2);
    }
    lk_batch_free(&b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* bf16 gradients (lk_model_set_grad_dtype, train.main_grads_dtype): every parameter's grad
 * a bf16 view at its offset in one bf16 buffer; the forward is untouched (the same loss
 * bits); each op sums in f32 and rounds as its gradient lands, so the gradients are the
 * f32-gradient model's within bf16 rounding: 2^-9 an element, 2^-8 where two ops add into
 * one (a tied embedding), held to 4e-3 relative L2 of all of them. Poisoned grads are gone
 * after lk_model_zero_grad (every bf16 byte zeroed, the expert stacks left for the backward
 * to write); a second micro-batch adds (0.5 + 0.5 against 1, within 8e-3). Refused: an f32
 * model, a dtype not f32 or bf16, and the f32 compute dtype under bf16 gradients, each with
 * the model unchanged; f32 again gives f32 zeros. */
static void bf16_grads(void **state) {
    (void)state;
    lk_batch b;
    make_batch(&b, 43);
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *h = create(moe, "fused", 0, 47), *q = create(moe, "fused", 0, 47);
        assert_int_equal(lk_model_set_grad_dtype(q, LK_BF16), LK_EDTYPE);   /* an f32 model */
        assert_non_null(strstr(lk_last_error(), "expected a bf16 model (lk_model_set_dtype), got f32"));
        assert_int_equal(lk_model_grad_dtype(q), LK_F32);
        assert_int_equal(lk_model_set_dtype(h, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_dtype(q, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_grad_dtype(q, LK_F16), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "expected f32 or bf16, got f16"));
        assert_int_equal(lk_model_set_grad_dtype(NULL, LK_BF16), LK_EINVAL);
        assert_int_equal(lk_model_set_grad_dtype(q, LK_BF16), LK_OK);
        assert_int_equal(lk_model_grad_dtype(q), LK_BF16);
        int64_t n;
        uint16_t *g = lk_model_grads(q, &n);
        assert_ptr_equal(g, q->g);
        assert_int_equal(n, q->n_floats);
        for (int i = 0; i < lk_model_param_count(q); i++) {
            const lk_param *p = lk_model_param(q, i), *ph = lk_model_param(h, i);
            assert_int_equal(p->grad.dtype, LK_BF16);
            assert_int_equal(p->value.dtype, LK_F32);   /* the master stays */
            assert_ptr_equal(p->grad.data, g + ((const float *)ph->grad.data - (const float *)h->g));
        }
        for (int64_t i = 0; i < n; i++) assert_int_equal(g[i], 0);
        assert_int_equal(lk_model_set_dtype(q, LK_F32), LK_EDTYPE);
        assert_non_null(strstr(lk_last_error(), "the gradients are bf16 (lk_model_set_grad_dtype)"));
        assert_int_equal(lk_model_dtype(q), LK_BF16);
        for (int64_t i = 0; i < n; i++) g[i] = 0x7fc1;   /* NaN: lk_model_zero_grad must clear every one */
        lk_model_zero_grad(q);
        lk_step_stats sh, sq;
        fwd_bwd(h, &b, 1.0f, &sh);
        fwd_bwd(q, &b, 1.0f, &sq);
        assert_true(sq.loss == sh.loss);
        g = lk_model_grads(q, &n);
        for (int64_t i = 0; i < n; i++) assert_true(isfinite(lk_bf16_to_f32(g[i])));
        double e = grad_rel_l2(h, q);
        lk_model *q2 = create(moe, "fused", 0, 47);
        assert_int_equal(lk_model_set_dtype(q2, LK_BF16), LK_OK);
        assert_int_equal(lk_model_set_grad_dtype(q2, LK_BF16), LK_OK);
        fwd_bwd(q2, &b, 0.5f, &sq);
        fwd_bwd(q2, &b, 0.5f, &sq);
        double e2 = grad_rel_l2(h, q2);
        print_message("  %s: grads rel L2 to f32 grads %.2e; two halves %.2e\n", moe ? "moe" : "dense", e, e2);
        assert_true(e > 0 && e <= 4e-3);   /* bf16 rounding as the gradients land */
        assert_true(e2 <= 8e-3);
        assert_int_equal(lk_model_set_grad_dtype(q, LK_F32), LK_OK);
        assert_int_equal(lk_model_param(q, 0)->grad.dtype, LK_F32);
        const float *gf = lk_model_grads(q, &n);
        for (int64_t i = 0; i < n; i++) assert_true(gf[i] == 0.0f);
        assert_int_equal(lk_model_set_dtype(q, LK_F32), LK_OK);
        lk_model_free(h), lk_model_free(q), lk_model_free(q2);
    }
    lk_batch_free(&b);
}

/* The LM head's chunk budget (lk_model_set_lm_head_chunk_bytes, train.lm_head_chunk_bytes):
 * chunks of 3 tokens, and of 40 (two f32 dW accumulators' worth, at vocab 320 and hidden
 * 32: 20 tokens is the accumulator's own size), give the default's loss and gradients to
 * f32 rounding (the chunks only move where the sums split). */
static void lm_head_chunks(void **state) {
    (void)state;
    lk_batch b;
    make_batch(&b, 37);
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *a = create(moe, "fused", 0, 41);
        lk_step_stats sa;
        fwd_bwd(a, &b, 1.0f, &sa);
        const size_t tokens[2] = {3, 40};
        for (int k = 0; k < 2; k++) {
            lk_model *c = create(moe, "fused", 0, 41);
            assert_int_equal(lk_model_set_lm_head_chunk_bytes(c, tokens[k] * (size_t)c->V * 4), LK_OK);
            lk_step_stats sc;
            fwd_bwd(c, &b, 1.0f, &sc);
            const double g = grad_rel_l2(a, c);
            print_message("  %s, chunks of %zu tokens: loss %.7f (default %.7f), grads rel L2 %.2e\n",
                          moe ? "moe" : "dense", tokens[k], sc.loss, sa.loss, g);
            assert_true(fabs(sc.loss - sa.loss) <= 1e-6 * fabs(sa.loss));
            assert_true(g <= 1e-5);
            lk_model_free(c);
        }
        lk_model_free(a);
    }
    assert_int_equal(lk_model_set_lm_head_chunk_bytes(NULL, 1), LK_EINVAL);
    lk_batch_free(&b);
}

/* Two micro-batches at scale 1/2 add up to one at scale 1 (to f32 rounding). */
static void accumulation_adds(void **state) {
    (void)state;
    lk_model *a = create(1, NULL, 0, 17), *c = create(1, NULL, 0, 17);
    lk_batch b;
    make_batch(&b, 2);
    lk_step_stats st;
    fwd_bwd(a, &b, 1.0f, &st);
    fwd_bwd(c, &b, 0.5f, &st);
    fwd_bwd(c, &b, 0.5f, &st);
    double scale, d = grad_diff(a, c, &scale);
    assert_true(d <= 1e-6 * scale);
    /* zero_grad leaves the experts' stacks to the next backward, which writes them: NaN there
     * must not show (the MoE experts' write_weight_grads), and the rest must read as zeros */
    lk_model_zero_grad(c);
    assert_int_equal(c->experts_unwritten, 1);
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe) ((float *)c->g)[c->layers[l].gate_up] = NAN, ((float *)c->g)[c->layers[l].down + 1] = NAN;
    fwd_bwd(c, &b, 1.0f, &st);
    assert_int_equal(c->experts_unwritten, 0);
    d = grad_diff(a, c, &scale);
    assert_true(d <= 1e-6 * scale);
    lk_model_zero_grad(c);   /* read before a backward: zeros (lk_model_grads zeros the stacks first) */
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe) ((float *)c->g)[c->layers[l].gate_up] = NAN;
    int64_t n;
    const float *g = lk_model_grads(c, &n);
    for (int64_t i = 0; i < n; i++) assert_true(g[i] == 0.0f);
    lk_batch_free(&b);
    lk_model_free(a);
    lk_model_free(c);
}

static void save_load_round_trip(void **state) {
    (void)state;
    char dir[] = "/tmp/lk_test_model_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[64];
    snprintf(sub, sizeof sub, "%s/ckpt", dir);
    lk_batch b;
    make_batch(&b, 4);
    for (int moe = 0; moe <= 1; moe++) {
        lk_model *a = create(moe, NULL, 0, 19), *c = create(moe, NULL, 0, 23);
        double la = total_loss(a, &b);
        assert_true(total_loss(c, &b) != la);
        assert_int_equal(lk_model_save(a, sub), LK_OK);
        assert_int_equal(lk_model_load_weights(c, sub), LK_OK);
        assert_true(total_loss(c, &b) == la);                         /* f32: exact */
        lk_qwen3_config rc;
        char path[128];
        snprintf(path, sizeof path, "%s/config.json", sub);
        assert_int_equal(lk_qwen3_config_read(path, &rc), LK_OK);
        assert_int_equal(rc.moe, moe);
        assert_int_equal(rc.hidden_size, 32);
        /* bf16 on disk: the loaded weights are the originals rounded once */
        strcpy(a->cfg.torch_dtype, "bfloat16");
        assert_int_equal(lk_model_save(a, sub), LK_OK);
        assert_int_equal(lk_model_load_weights(c, sub), LK_OK);
        for (int64_t i = 0; i < a->n_floats; i++)
            assert_true(c->w[i] == lk_bf16_to_f32(lk_f32_to_bf16(a->w[i])));
        lk_model_free(a);
        lk_model_free(c);
    }
    /* a checkpoint of another shape is refused before any weight changes */
    lk_model *d = create(0, NULL, 0, 29);
    float *before = malloc((size_t)d->n_floats * 4);
    memcpy(before, d->w, (size_t)d->n_floats * 4);
    lk_qwen3_config wide = tiny(0);
    wide.intermediate_size = 64;
    lk_op_table t;
    table(0, NULL, NULL, &t);
    lk_model *w = NULL;
    assert_int_equal(lk_model_create(&wide, &t, 1, 0, &w), LK_OK);
    assert_int_equal(lk_model_save(w, sub), LK_OK);
    assert_int_equal(lk_model_load_weights(d, sub), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "mlp"));
    assert_memory_equal(before, d->w, (size_t)d->n_floats * 4);
    assert_int_equal(lk_model_load_weights(d, "/nonexistent/dir"), LK_EIO);
    free(before);
    lk_model_free(w);
    lk_model_free(d);
    lk_batch_free(&b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* An override on layers.0.input_layernorm binds that module only. */
static void override_reaches_module(void **state) {
    (void)state;
    lk_qwen3_config c = tiny(0);
    lk_op_table t;
    table(0, "fused", "eager", &t);
    lk_model *m = NULL;
    assert_int_equal(lk_model_create(&c, &t, 3, 0, &m), LK_OK);
    assert_string_equal(m->layers[0].ops.in_norm->name, "eager");
    assert_string_equal(m->layers[1].ops.in_norm->name, "fused");
    assert_string_equal(m->layers[0].ops.post_norm->name, "fused");
    assert_string_equal(m->layers[0].ops.q_norm->name, "fused");
    assert_string_equal(m->final_norm_impl->name, "fused");
    lk_model *f = create(0, "fused", 0, 3);
    lk_batch b;
    make_batch(&b, 6);
    double lo = total_loss(m, &b), lf = total_loss(f, &b);
    assert_true(fabs(lo - lf) <= 1e-5 * lf);    /* same model, another kernel for one norm */
    lk_batch_free(&b);
    lk_model_free(m);
    lk_model_free(f);
}

/* The router options of the ops config (NeMo's fake_gate_noise and gate_precision) reach
 * every MoE layer's router call: noise 0 routes token t to (t*k + j) mod E, noise 0.3
 * routes by the content (the same way twice), gate_precision float32 is the f32 model's
 * own arithmetic (the loss is unchanged). */
static lk_model *router_model(const char *router, const char *noise, const char *precision) {
    lk_qwen3_config c = tiny(1);
    c.num_hidden_layers = 3;   /* layers 0 and 2 MoE, 1 dense */
    lk_ops_config cfg;
    lk_op_table t;
    lk_ops_config_init(&cfg);
    if (router) assert_int_equal(lk_ops_config_set(&cfg, "moe.router", router, "test"), LK_OK);
    if (noise) assert_int_equal(lk_ops_config_set_option(&cfg, "fake_gate_noise", noise, "test"), LK_OK);
    if (precision) assert_int_equal(lk_ops_config_set_option(&cfg, "gate_precision", precision, "test"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3_moe", &t), LK_OK);
    lk_model *m = NULL;
    assert_int_equal(lk_model_create(&c, &t, 5, 0, &m), LK_OK);
    return m;
}

static int routed_round_robin(const lk_model *m) {
    int all = 1;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int64_t t = 0; m->layers[l].moe && t < m->T; t++)
            for (int64_t j = 0; j < m->K; j++) all &= m->acts[l].ids[t * m->K + j] == (t * m->K + j) % m->E;
    return all;
}

static void router_options_reach_every_moe_layer(void **state) {
    (void)state;
    lk_batch b;
    make_batch(&b, 11);
    lk_model *plain = router_model("fake_balanced", "0", NULL);
    total_loss(plain, &b);
    assert_true(plain->layers[0].moe && !plain->layers[1].moe && plain->layers[2].moe);
    assert_string_equal(plain->layers[0].ops.router->name, "fake_balanced");
    assert_string_equal(plain->layers[2].ops.router->name, "fake_balanced");
    assert_true(routed_round_robin(plain));

    lk_model *noisy = router_model("fake_balanced", "0.3", NULL);
    assert_true(noisy->router.noise == 0.3f);
    total_loss(noisy, &b);
    assert_false(routed_round_robin(noisy));
    int32_t ids[2 * 24 * 2];
    assert_true(noisy->T * noisy->K * 2 <= (int64_t)(sizeof ids / sizeof *ids));
    routing_same(noisy, ids, 1);
    total_loss(noisy, &b);
    assert_true(routing_same(noisy, ids, 0));   /* seeded by the content: a recompute routes alike */

    lk_model *learned = router_model(NULL, NULL, NULL), *f32 = router_model(NULL, "0", "torch.float32");
    assert_int_equal(learned->router.gate_f32, 0);
    assert_int_equal(f32->router.gate_f32, 1);
    assert_string_equal(f32->layers[0].ops.router->name, "softmax_topk");
    assert_true(total_loss(learned, &b) == total_loss(f32, &b));
    lk_model_free(plain);
    lk_model_free(noisy);
    lk_model_free(learned);
    lk_model_free(f32);
    lk_batch_free(&b);

    /* a noise no fake_balanced binding uses is refused at finalize, naming both */
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set_option(&cfg, "fake_gate_noise", "0.5", "cfg.yaml:4:22"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "cfg.yaml:4:22: fake_gate_noise: 0.5 is used only by the fake balanced"));
    assert_non_null(strstr(lk_last_error(), "'softmax_topk'"));
    /* ... unless a module's override is fake_balanced */
    assert_int_equal(lk_ops_config_set_override(&cfg, "layers.0.mlp.gate", "moe.router", "fake_balanced", "t"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_true(cfg.router.noise == 0.5f);
    const char *bad[][2] = {{"fake_gate_noise", "1.5"}, {"fake_gate_noise", "-0.1"}, {"fake_gate_noise", "nan"},
                            {"fake_gate_noise", "0.3x"}, {"fake_gate_noise", ""}, {"gate_precision", "bfloat16"},
                            {"gate_precision", "float64"}, {"fake_gate_nois", "0.1"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        lk_ops_config before = cfg;
        assert_int_equal(lk_ops_config_set_option(&cfg, bad[i][0], bad[i][1], "cfg.yaml:9:9"), LK_EINVAL);
        print_message("%s\n", lk_last_error());
        assert_non_null(strstr(lk_last_error(), "cfg.yaml:9:9: "));
        assert_non_null(strstr(lk_last_error(), bad[i][0]));
        assert_memory_equal(&cfg, &before, sizeof cfg);
    }
    assert_non_null(strstr(lk_last_error(), "did you mean 'fake_gate_noise'"));
}

static void bad_configs_rejected(void **state) {
    (void)state;
    lk_op_table t;
    table(0, NULL, NULL, &t);
    lk_model *m = (lk_model *)&t;   /* must be set to NULL on failure */
    lk_qwen3_config c = tiny(0);
    c.num_key_value_heads = 3;
    assert_int_equal(lk_model_create(&c, &t, 1, 0, &m), LK_EINVAL);
    assert_null(m);
    assert_non_null(strstr(lk_last_error(), "num_key_value_heads"));
    c = tiny(0);
    c.head_dim = 7;
    assert_int_equal(lk_model_create(&c, &t, 1, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "head_dim"));
    c = tiny(0);
    c.attention_dropout = 0.1;   /* would be ignored, training other than transformers does */
    assert_int_equal(lk_model_create(&c, &t, 1, 0, &m), LK_EUNAVAILABLE);
    assert_null(m);
    assert_non_null(strstr(lk_last_error(), "attention_dropout: expected 0 (llmkern's attention has no dropout), got 0.1"));
    /* an op not in this build */
    c = tiny(0);
    lk_op_table missing = t;
    missing.op[LK_OP_ATTENTION].impl = NULL;
    assert_int_equal(lk_model_create(&c, &missing, 1, 0, &m), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "self_attn"));
    assert_non_null(strstr(lk_last_error(), "attention"));
    /* q_proj, k_proj and v_proj are one GEMM: another implementation for k_proj alone is refused */
    lk_op_table split = t;
    static lk_impl other;
    other = *t.op[LK_OP_LINEAR].impl;
    other.name = "another_linear";
    lk_binding *k = &split.module[split.n_module++];
    *k = t.op[LK_OP_LINEAR];
    snprintf(k->module, sizeof k->module, "layers.0.self_attn.k_proj");
    k->impl = &other;
    assert_int_equal(lk_model_create(&c, &split, 1, 0, &m), LK_EUNAVAILABLE);
    assert_null(m);
    assert_non_null(strstr(lk_last_error(), "layers.0.self_attn"));
    assert_non_null(strstr(lk_last_error(), "another_linear"));
    /* a table of the other family */
    lk_op_table moe_t;
    table(1, NULL, NULL, &moe_t);
    assert_int_equal(lk_model_create(&c, &moe_t, 1, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "family"));
    assert_int_equal(lk_model_create(NULL, &t, 1, 0, &m), LK_EINVAL);
}

/* A bad batch is refused before any gradient changes. */
static void bad_batch_rejected(void **state) {
    (void)state;
    lk_model *m = create(0, NULL, 0, 5);
    lk_batch b;
    make_batch(&b, 8);
    lk_step_stats st = {.loss = -1};
    b.input_ids[3] = 320;
    assert_int_equal(lk_model_forward_backward(m, &b, 1.0f, &st), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "input_ids"));
    b.input_ids[3] = 1;
    b.labels[4] = 999;
    assert_int_equal(lk_model_forward_backward(m, &b, 1.0f, &st), LK_EINVAL);
    b.labels[4] = 1;
    b.position_ids[5] = 64;     /* beyond max_position_embeddings */
    assert_int_equal(lk_model_forward_backward(m, &b, 1.0f, &st), LK_EINVAL);
    b.position_ids[5] = 0;
    b.cu_seqlens[3] = 23;
    assert_int_equal(lk_model_forward_backward(m, &b, 1.0f, &st), LK_EINVAL);
    assert_true(st.loss == -1);
    for (int64_t i = 0; i < m->n_floats; i++) assert_true(((const float *)m->g)[i] == 0.0f);
    lk_batch_free(&b);
    lk_model_free(m);
}

/* Not an assertion: tokens/s of one forward_backward, printed for bench/NOTES.md. */
static void throughput(void **state) {
    (void)state;
    const char *modes[] = {NULL, "eager"};
    for (int moe = 0; moe <= 1; moe++)
        for (int k = 0; k < 2; k++) {
            lk_model *m = create(moe, modes[k], 0, 1);
            lk_batch b;
            make_batch(&b, 1);
            lk_step_stats st;
            fwd_bwd(m, &b, 1.0f, &st);
            int reps = 20;
            double t0 = lk_now();
            for (int r = 0; r < reps; r++) fwd_bwd(m, &b, 1.0f, &st);
            double dt = (lk_now() - t0) / reps;
            print_message("  %s %-7s: %.0f tokens/s (%lld tokens, %.3f ms per forward_backward)\n",
                          moe ? "moe  " : "dense", modes[k] ? modes[k] : "default", (double)(b.B * b.S) / dt,
                          (long long)(b.B * b.S), dt * 1e3);
            lk_batch_free(&b);
            lk_model_free(m);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grad_check_dense),       cmocka_unit_test(grad_check_moe),
        cmocka_unit_test(eager_matches_fused),    cmocka_unit_test(flex_matches_flash),
        cmocka_unit_test(recompute_identical),    cmocka_unit_test(keep_qk_matches),
        cmocka_unit_test(recompute_norms_identical), cmocka_unit_test(recompute_some_layers),
        cmocka_unit_test(recompute_moe_identical),    cmocka_unit_test(recompute_qkv_identical),    cmocka_unit_test(bf16_follows_f32),
        cmocka_unit_test(bf16_master),             cmocka_unit_test(bf16_grads),
        cmocka_unit_test(lm_head_chunks),
        cmocka_unit_test(residual_stream_is_f32), cmocka_unit_test(bf16_stream_follows_f32), cmocka_unit_test(sliding_window_layers),
        cmocka_unit_test(accumulation_adds),      cmocka_unit_test(save_load_round_trip),
        cmocka_unit_test(override_reaches_module), cmocka_unit_test(bad_configs_rejected),
        cmocka_unit_test(bad_batch_rejected),     cmocka_unit_test(router_options_reach_every_moe_layer),
        cmocka_unit_test(throughput),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
