/* test_cross_entropy.c — cross-entropy with the LM head: every implementation x {f32,
 * bf16} against the float64 reference (src/ops/cross_entropy/reference.c, through
 * check.h) on odd shapes and vocabularies 1001 and 32003, with every option; every
 * label ignored; finite-difference gradients; bad inputs rejected with outputs untouched. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/cross_entropy/check.h"

static const char *const impls[] = {"eager", "fused", "chunk_loss"};
#define N_IMPLS 3

static int setup(void **state) { (void)state; return lk_init() == LK_OK ? 0 : -1; }

static const lk_impl *impl_of(const char *name) {
    const lk_impl *im = lk_impl_find(LK_OP_CROSS_ENTROPY, name, LK_DEVICE_CPU);
    assert_non_null(im);
    return im;
}

/* Runs a case on every implementation and both dtypes; asserts each output against its
 * tolerance. f32: 2e-5 (f32 math, see harness.c); bf16: 1e-2 on the gradients (bf16
 * outputs), and on the loss 1e-4: the loss stays f32 and the reference rounds the
 * logits as the implementation does, so only summation order differs. */
static void run_case(const char *shape_text, const lk_ce_case *c, uint64_t seed) {
    lk_shape sh;
    assert_int_equal(lk_shape_parse(shape_text, &sh), LK_OK);
    for (int i = 0; i < N_IMPLS; i++)
        for (int d = 0; d < 2; d++) {
            lk_dtype dt = d ? LK_BF16 : LK_F32;
            lk_ce_errors e;
            lk_status s = lk_ce_check_case(impl_of(impls[i]), dt, &sh, seed, c, NULL, &e);
            if (s) print_error("%s %s %s: %s\n", impls[i], lk_dtype_name(dt), shape_text, lk_last_error());
            assert_int_equal(s, LK_OK);
            double tl = dt == LK_F32 ? 2e-5 : 1e-4, tg = dt == LK_F32 ? 2e-5 : 1e-2;
            if (!(e.loss <= tl && e.z_loss <= tl && e.dh <= tg && e.dw <= tg))
                print_error("%s %s %s: loss %.3g z %.3g dh %.3g dw %.3g\n", impls[i], lk_dtype_name(dt), shape_text,
                            e.loss, e.z_loss, e.dh, e.dw);
            assert_true(e.loss <= tl);
            assert_true(e.z_loss <= tl);
            assert_true(e.dh <= tg);
            assert_true(e.dw <= tg);
            assert_true(e.n_valid_ok);
            assert_true(e.unscored_zero);
        }
}

static void test_plain_mean(void **state) {
    (void)state;
    lk_ce_case c = {.ignore_frac = 0.2};
    run_case("13x7x1001", &c, 1);
    run_case("5x3x32003", &c, 2);
    c.labels_i32 = 1;
    c.chunk_bytes = 3 * 1001 * 4;        /* chunks of 3 tokens, the last one short */
    run_case("13x7x1001", &c, 3);
}

static void test_reductions(void **state) {
    (void)state;
    lk_ce_case c = {.reduction = LK_CE_SUM, .ignore_frac = 0.3, .d_loss = -1.5, .chunk_bytes = 4 * 257 * 4};
    run_case("11x9x257", &c, 4);
    c.reduction = LK_CE_NONE;            /* random per-token d_loss, with chunks of 4 */
    run_case("11x9x257", &c, 5);
    run_case("6x4x32003", &c, 6);
}

static void test_all_options_together(void **state) {
    (void)state;
    lk_ce_case c = {.label_smoothing = 0.2, .z_loss_scale = 1e-2, .softcap = 1.5, .ignore_frac = 0.25,
                    .chunk_bytes = 2 * 1001 * 4};
    run_case("9x6x1001", &c, 7);
    c.reduction = LK_CE_NONE;
    run_case("9x6x1001", &c, 8);
}

/* fused evens its chunks out (fused.c, chunk_rows): a budget of 10 tokens over 33 runs
 * as 9, 9, 9, 6 there (10, 10, 10, 3 in chunk_loss), and 6 kept tokens at a budget of 4
 * as 3, 3, each chunk gathered from scattered rows. */
static void test_balanced_chunks(void **state) {
    (void)state;
    lk_ce_case c = {.ignore_frac = 0.2, .label_smoothing = 0.1, .z_loss_scale = 1e-3, .chunk_bytes = 10 * 1001 * 4};
    run_case("33x16x1001", &c, 16);
    c.reduction = LK_CE_SUM;
    c.softcap = 3.0;
    run_case("33x16x1001", &c, 17);
    static const int64_t idx[] = {1, 2, 5, 6, 11, 12};
    lk_ce_case ci = {.keep_indices = idx, .n_keep = 6, .ignore_frac = 0.1, .chunk_bytes = 4 * 257 * 4};
    run_case("13x8x257", &ci, 18);
}

/* A hidden size the wide GEMMs take (lk_gemm_wide_wins: chunks up to 1024 rows, hidden
 * from 256) in fused and chunk_loss: vocab 1001 ends on a partial 8-row tile of W, 53
 * tokens in chunks of 18 on partial token tiles, hidden 320 on a partial column tile of
 * dh; the same with every option and reduction none (recomputed per chunk). */
static void test_wide_gemm_shapes(void **state) {
    (void)state;
    lk_ce_case c = {.ignore_frac = 0.2, .chunk_bytes = 18 * 1001 * 4};
    run_case("53x320x1001", &c, 21);
    c = (lk_ce_case){.label_smoothing = 0.1, .z_loss_scale = 1e-3, .softcap = 2.0, .ignore_frac = 0.1,
                     .reduction = LK_CE_NONE, .chunk_bytes = 18 * 1001 * 4};
    run_case("53x320x1001", &c, 22);
}

static void test_every_label_ignored(void **state) {
    (void)state;
    lk_shape sh;
    assert_int_equal(lk_shape_parse("6x5x101", &sh), LK_OK);
    for (int r = 0; r < LK_CE_REDUCTION_COUNT; r++)
        for (int i = 0; i < N_IMPLS; i++)
            for (int d = 0; d < 2; d++) {
                lk_ce_case c = {.reduction = r, .ignore_frac = 1.0, .label_smoothing = 0.1, .z_loss_scale = 1e-3};
                lk_ce_errors e;
                assert_int_equal(lk_ce_check_case(impl_of(impls[i]), d ? LK_BF16 : LK_F32, &sh, 9, &c, NULL, &e),
                                 LK_OK);
                /* exactly zero: loss 0 (not 0/0), gradients 0, d_weight unchanged */
                assert_true(e.loss == 0.0 && e.z_loss == 0.0);
                assert_true(e.dh == 0.0 && e.dw == 0.0);
                assert_true(e.n_valid_ok);
            }
}

static void test_logits_to_keep(void **state) {
    (void)state;
    lk_ce_case c = {.batch = 3, .logits_to_keep = 2, .ignore_frac = 0.1, .label_smoothing = 0.1,
                    .chunk_bytes = 3 * 257 * 4};
    run_case("15x8x257", &c, 10);        /* [3, 5, 8]: tokens 3,4 of each sequence */
    c.reduction = LK_CE_NONE;
    run_case("15x8x257", &c, 11);
    static const int64_t idx[] = {0, 2, 3, 7, 13, 14};
    lk_ce_case ci = {.keep_indices = idx, .n_keep = 6, .z_loss_scale = 1e-3, .chunk_bytes = 4 * 257 * 4};
    run_case("15x8x257", &ci, 12);
    ci.reduction = LK_CE_SUM;
    run_case("15x8x257", &ci, 13);
    ci.n_keep = 0;                       /* nothing scored: loss 0, zero d_hidden */
    run_case("15x8x257", &ci, 14);
}

/* bf16 storage with the f32 LM head: nothing is rounded before the outputs, so the loss
 * is as good as in f32 (2e-5), against a reference that does not round the logits;
 * without it the logits are rounded (run_case's reference rounds them too). The f32
 * d_weight sees no rounding either: its error is the f32 one. */
static void test_fp32_lm_head(void **state) {
    (void)state;
    lk_shape sh;
    assert_int_equal(lk_shape_parse("10x16x1001", &sh), LK_OK);
    for (int i = 0; i < N_IMPLS; i++) {
        lk_ce_case c = {.fp32_lm_head = 1, .dweight_f32 = 1, .ignore_frac = 0.1, .softcap = 2.0, .chunk_bytes = 1};
        lk_ce_errors e;
        assert_int_equal(lk_ce_check_case(impl_of(impls[i]), LK_BF16, &sh, 15, &c, NULL, &e), LK_OK);
        assert_true(e.loss <= 2e-5);
        assert_true(e.dw <= 2e-5);
        assert_true(e.dh <= 1e-2);       /* d_hidden is bf16 */
        c.fp32_lm_head = 0;
        assert_int_equal(lk_ce_check_case(impl_of(impls[i]), LK_BF16, &sh, 15, &c, NULL, &e), LK_OK);
        assert_true(e.loss <= 1e-4);
        assert_true(e.dw <= 1e-2);
    }
}

/* --- finite differences ----------------------------------------------------------- */

enum { FT = 4, FH = 5, FV = 7 };

typedef struct {
    float h[FT * FH], w[FV * FH], dh[FT * FH], dw[FV * FH], loss;
    int64_t labels[FT];
    unsigned char saved[4096];
} fd_problem;

static lk_cross_entropy_args fd_args(fd_problem *p, float *dloss) {
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    a.hidden = lk_tensor_2d(p->h, LK_F32, FT, FH);
    a.weight = lk_tensor_2d(p->w, LK_F32, FV, FH);
    a.labels = lk_tensor_1d(p->labels, LK_I64, FT);
    a.loss = lk_tensor_1d(&p->loss, LK_F32, 1);
    a.d_loss = lk_tensor_1d(dloss, LK_F32, 1);
    a.d_hidden = lk_tensor_2d(p->dh, LK_F32, FT, FH);
    a.d_weight = lk_tensor_2d(p->dw, LK_F32, FV, FH);
    a.saved = (lk_saved){p->saved, sizeof p->saved};
    a.reduction = LK_CE_SUM;
    a.label_smoothing = 0.15;
    a.z_loss_scale = 0.05;
    a.softcap = 2.0;
    a.chunk_bytes = 2 * FV * 4;
    return a;
}

static double fd_loss(const lk_impl *im, fd_problem *p, lk_ctx *ctx) {
    float one = 1.0f;
    lk_cross_entropy_args a = fd_args(p, &one);
    assert_int_equal(lk_cross_entropy_forward(im, &a, ctx), LK_OK);
    return p->loss;
}

/* Central differences with step 1e-2 on an f32 loss of size ~2: truncation ~1e-4 and
 * f32 rounding ~2e-5 of the derivative, so 2e-3 (relative to the largest gradient)
 * separates a right gradient from a wrong term (smoothing, z-loss, cap: >= 1e-2). */
static void test_finite_differences(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++) {
        const lk_impl *im = impl_of(impls[i]);
        fd_problem p;
        memset(&p, 0, sizeof p);
        lk_rng rng = lk_rng_make(42);
        lk_rng_normal(&rng, p.h, FT * FH, 0.0f, 1.0f);
        lk_rng_normal(&rng, p.w, FV * FH, 0.0f, 0.6f);
        for (int t = 0; t < FT; t++) p.labels[t] = t == 2 ? LK_CE_IGNORE_INDEX : (t * 3) % FV;
        lk_arena arena = {0};
        lk_ctx ctx = lk_ctx_cpu(&arena);
        float dl = 1.0f;
        lk_cross_entropy_args a = fd_args(&p, &dl);
        size_t sb;
        assert_int_equal(lk_cross_entropy_saved_bytes(im, &a, &sb), LK_OK);
        assert_true(sb <= sizeof p.saved);
        assert_int_equal(lk_cross_entropy_forward(im, &a, &ctx), LK_OK);
        assert_int_equal(lk_cross_entropy_backward(im, &a, &ctx), LK_OK);
        float gh[FT * FH], gw[FV * FH];
        memcpy(gh, p.dh, sizeof gh);
        memcpy(gw, p.dw, sizeof gw);
        double gmax = 0.0, emax = 0.0;
        for (int k = 0; k < FT * FH + FV * FH; k++) {
            float *x = k < FT * FH ? &p.h[k] : &p.w[k - FT * FH], x0 = *x, step = 1e-2f;
            *x = x0 + step;
            double lp = fd_loss(im, &p, &ctx);
            *x = x0 - step;
            double lm = fd_loss(im, &p, &ctx);
            *x = x0;
            double fd = (lp - lm) / (2.0 * step), g = k < FT * FH ? gh[k] : gw[k - FT * FH];
            gmax = fmax(gmax, fabs(g));
            emax = fmax(emax, fabs(fd - g));
        }
        assert_true(gmax > 0.1);
        if (emax > 2e-3 * gmax) print_error("%s: fd error %.3g of %.3g\n", impls[i], emax, gmax);
        assert_true(emax <= 2e-3 * gmax);
        lk_arena_free(&arena);
    }
}

/* A NaN in the hidden state (a diverged step) gives a NaN loss, never a crash or
 * undefined behaviour in the kernels (UBSan runs this in CI): the trainer then stops. */
static void test_nan_hidden_gives_nan_loss(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++) {
        const lk_impl *im = impl_of(impls[i]);
        fd_problem p;
        memset(&p, 0, sizeof p);
        lk_rng rng = lk_rng_make(7);
        lk_rng_normal(&rng, p.h, FT * FH, 0.0f, 1.0f);
        lk_rng_normal(&rng, p.w, FV * FH, 0.0f, 0.6f);
        for (int t = 0; t < FT; t++) p.labels[t] = t % FV;
        p.h[1] = NAN;
        lk_arena arena = {0};
        lk_ctx ctx = lk_ctx_cpu(&arena);
        float dl = 1.0f;
        lk_cross_entropy_args a = fd_args(&p, &dl);
        assert_int_equal(lk_cross_entropy_forward(im, &a, &ctx), LK_OK);
        assert_true(isnan(p.loss));
        assert_int_equal(lk_cross_entropy_backward(im, &a, &ctx), LK_OK);
        lk_arena_free(&arena);
    }
}

/* --- bad inputs ------------------------------------------------------------------- */

enum { BT = 6, BH = 4, BV = 9 };

typedef struct {
    float h[BT * BH], w[BV * BH], dh[BT * BH], dw[BV * BH], loss[BT], dloss[BT], hf_bad[BT];
    int64_t labels[BT], idx[3], nvalid;
    unsigned char saved[8192];
    lk_cross_entropy_args a;
} bad_fixture;

static void bad_init(bad_fixture *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < BT * BH; i++) f->h[i] = 0.1f * (float)(i % 7), f->dh[i] = 123.0f;
    for (int i = 0; i < BV * BH; i++) f->w[i] = 0.05f * (float)(i % 5), f->dw[i] = 7.0f;
    for (int t = 0; t < BT; t++) f->labels[t] = t % BV, f->loss[t] = -9.0f, f->dloss[t] = 1.0f;
    f->nvalid = -5;
    lk_cross_entropy_args *a = &f->a;
    *a = lk_cross_entropy_args_init();
    a->hidden = lk_tensor_2d(f->h, LK_F32, BT, BH);
    a->weight = lk_tensor_2d(f->w, LK_F32, BV, BH);
    a->labels = lk_tensor_1d(f->labels, LK_I64, BT);
    a->loss = lk_tensor_1d(f->loss, LK_F32, 1);
    a->n_valid = lk_tensor_1d(&f->nvalid, LK_I64, 1);
    a->d_loss = lk_tensor_1d(f->dloss, LK_F32, 1);
    a->d_hidden = lk_tensor_2d(f->dh, LK_F32, BT, BH);
    a->d_weight = lk_tensor_2d(f->dw, LK_F32, BV, BH);
    a->saved = (lk_saved){f->saved, sizeof f->saved};
}

static void expect_untouched(const bad_fixture *f) {
    for (int i = 0; i < BT * BH; i++) assert_true(f->dh[i] == 123.0f);
    for (int i = 0; i < BV * BH; i++) assert_true(f->dw[i] == 7.0f);
    for (int t = 0; t < BT; t++) assert_true(f->loss[t] == -9.0f);
    assert_int_equal(f->nvalid, -5);
}

/* Both passes reject it with status s and a message naming arg; nothing is written. */
static void expect_bad(const lk_impl *im, bad_fixture *f, lk_status s, const char *arg) {
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_cross_entropy_forward(im, &f->a, &ctx), s);
    if (!strstr(lk_last_error(), arg)) print_error("'%s' does not name %s\n", lk_last_error(), arg);
    assert_non_null(strstr(lk_last_error(), arg));
    assert_int_equal(lk_cross_entropy_backward(im, &f->a, &ctx), s);
    assert_non_null(strstr(lk_last_error(), arg));
    expect_untouched(f);
    lk_arena_free(&arena);
}

static void test_bad_inputs(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++) {
        const lk_impl *im = impl_of(impls[i]);
        bad_fixture f;
        bad_init(&f);
        { lk_arena ar = {0}; lk_ctx ctx = lk_ctx_cpu(&ar);      /* the fixture itself is fine */
          bad_fixture g = f;
          g.a.loss.data = g.loss; g.a.hidden.data = g.h; g.a.weight.data = g.w; g.a.labels.data = g.labels;
          g.a.n_valid.data = &g.nvalid; g.a.d_loss.data = g.dloss; g.a.d_hidden.data = g.dh;
          g.a.d_weight.data = g.dw; g.a.saved.data = g.saved;
          assert_int_equal(lk_cross_entropy_forward(im, &g.a, &ctx), LK_OK);
          assert_int_equal(lk_cross_entropy_backward(im, &g.a, &ctx), LK_OK);
          assert_true(isfinite(g.loss[0]) && g.loss[0] != -9.0f);
          lk_arena_free(&ar); }
        bad_init(&f); f.a.labels.shape[0] = BT - 1;                 expect_bad(im, &f, LK_ESHAPE, "labels");
        bad_init(&f); f.a.weight.shape[1] = BH - 1;                 expect_bad(im, &f, LK_ESHAPE, "weight");
        bad_init(&f); f.a.labels.dtype = LK_F32;                    expect_bad(im, &f, LK_EDTYPE, "labels");
        bad_init(&f); f.a.weight.dtype = LK_BF16;                   expect_bad(im, &f, LK_EDTYPE, "weight");
        bad_init(&f); f.a.logits_to_keep = BT + 1;                  expect_bad(im, &f, LK_ESHAPE, "logits_to_keep");
        bad_init(&f); f.a.softcap = -1.0;                           expect_bad(im, &f, LK_EINVAL, "softcap");
        bad_init(&f); f.a.label_smoothing = 1.0;                    expect_bad(im, &f, LK_EINVAL, "label_smoothing");
        bad_init(&f); f.a.z_loss_scale = NAN;                       expect_bad(im, &f, LK_EINVAL, "z_loss_scale");
        bad_init(&f); f.a.reduction = (lk_ce_reduction)7;           expect_bad(im, &f, LK_EINVAL, "reduction");
        bad_init(&f); f.labels[3] = BV;                             expect_bad(im, &f, LK_EINVAL, "labels");
        bad_init(&f); f.labels[3] = -1;                             expect_bad(im, &f, LK_EINVAL, "labels");
        bad_init(&f); f.a.hidden.data = NULL;                       expect_bad(im, &f, LK_EINVAL, "hidden");
        bad_init(&f); f.a.saved.bytes = 8;                          expect_bad(im, &f, LK_EINVAL, "saved");
        bad_init(&f);
        f.idx[0] = 1; f.idx[1] = 1; f.idx[2] = 4;                    /* not strictly increasing */
        f.a.keep_indices = lk_tensor_1d(f.idx, LK_I64, 3);          expect_bad(im, &f, LK_EINVAL, "keep_indices");
        bad_init(&f);
        f.idx[0] = 1; f.idx[1] = 2; f.idx[2] = BT;                   /* out of range */
        f.a.keep_indices = lk_tensor_1d(f.idx, LK_I64, 3);          expect_bad(im, &f, LK_EINVAL, "keep_indices");
        bad_init(&f); f.a.reduction = LK_CE_NONE;                   /* loss must then be [T] */
        {
            lk_arena ar = {0};
            lk_ctx ctx = lk_ctx_cpu(&ar);
            assert_int_equal(lk_cross_entropy_forward(im, &f.a, &ctx), LK_ESHAPE);
            assert_non_null(strstr(lk_last_error(), "loss"));
            f.a.loss.shape[0] = BT;
            assert_int_equal(lk_cross_entropy_forward(im, &f.a, &ctx), LK_OK);
            f.loss[0] = -9.0f;                                      /* d_loss must be [T] too */
            for (int t = 0; t < BT; t++) f.loss[t] = -9.0f;
            f.nvalid = -5;
            assert_int_equal(lk_cross_entropy_backward(im, &f.a, &ctx), LK_ESHAPE);
            assert_non_null(strstr(lk_last_error(), "d_loss"));
            expect_untouched(&f);
            lk_arena_free(&ar);
        }
        bad_init(&f); f.a.d_weight.shape[0] = BV - 1;
        {
            lk_arena ar = {0};
            lk_ctx ctx = lk_ctx_cpu(&ar);
            assert_int_equal(lk_cross_entropy_backward(im, &f.a, &ctx), LK_ESHAPE);
            assert_non_null(strstr(lk_last_error(), "d_weight"));
            expect_untouched(&f);
            lk_arena_free(&ar);
        }
        bad_init(&f);
        f.a.d_hidden.data = f.h;                                    /* overlaps hidden */
        {
            lk_arena ar = {0};
            lk_ctx ctx = lk_ctx_cpu(&ar);
            assert_int_equal(lk_cross_entropy_backward(im, &f.a, &ctx), LK_EINVAL);
            assert_non_null(strstr(lk_last_error(), "d_hidden"));
            lk_arena_free(&ar);
        }
        bad_init(&f);
        const lk_impl *other = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CPU);
        assert_non_null(other);
        {
            lk_arena ar = {0};
            lk_ctx ctx = lk_ctx_cpu(&ar);
            assert_int_equal(lk_cross_entropy_forward(other, &f.a, &ctx), LK_EINVAL);
            assert_non_null(strstr(lk_last_error(), "impl"));
            expect_untouched(&f);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_mean),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_all_options_together),
        cmocka_unit_test(test_balanced_chunks),
        cmocka_unit_test(test_wide_gemm_shapes),
        cmocka_unit_test(test_every_label_ignored),
        cmocka_unit_test(test_logits_to_keep),
        cmocka_unit_test(test_fp32_lm_head),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_nan_hidden_gives_nan_loss),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
