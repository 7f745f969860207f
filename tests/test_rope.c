/* test_rope.c — RoPE: every implementation in f32 and bf16 against the float64
 * reference (odd, partial-rotary and GQA shapes; packed, i32 and absent position ids;
 * in place), eager against fused, the cos/sin tables (default, llama3, yarn) against
 * formulas written here in double, the backward as the exact inverse and by finite
 * differences, and bad arguments refused with outputs untouched.
 * Run: ctest -R test_rope, or ./build/test_rope. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/rope/check.h"

static const char *const impl_names[] = {"eager", "fused"};
#define N_IMPLS 2

static const lk_impl *impl_of(const char *name) {
    const lk_impl *impl = lk_impl_find(LK_OP_ROPE, name, LK_DEVICE_CPU);
    assert_non_null(impl);
    return impl;
}

/* f32: a few ulps of f32 math; bf16: one output rounding (fused) or every intermediate
 * rounded to bf16 with bf16 cos/sin (eager). The reasoning is in harness.c. */
static double tol_for(const char *name, lk_dtype dt) {
    if (dt == LK_F32) return 1e-5;
    return strcmp(name, "eager") == 0 ? 2e-2 : 1e-2;
}

static void expect_case(const char *name, lk_dtype dt, lk_shape shape, const lk_rope_case *c) {
    lk_check_row row;
    lk_rope_errors e;
    lk_status s = lk_rope_check_case(impl_of(name), dt, &shape, 42, c, &row, &e);
    if (s) fail_msg("%s %s %s: %s", name, lk_dtype_name(dt), row.shape, lk_last_error());
    double tol = tol_for(name, dt);
    if (!(row.max_rel_err <= tol))
        fail_msg("%s %s %s: q_out %.3g k_out %.3g dq %.3g dk %.3g > %.1g", name, lk_dtype_name(dt), row.shape,
                 e.q_out, e.k_out, e.dq, e.dk, tol);
    assert_true(row.pass);
    assert_true(row.tol == tol);        /* the harness's table says the same */
}

/* B x Hq x S x D [x Hk [x R]]: smallest; odd S; partial R on D 64 with GQA 6/2; a half of
 * 7 (a masked tail only); several batch rows with one k head; a whole-vector half. */
static const lk_shape shapes[] = {
    {4, {1, 1, 1, 2}}, {4, {2, 3, 7, 16}}, {6, {1, 6, 9, 64, 2, 32}}, {6, {2, 4, 5, 20, 1, 14}},
    {6, {3, 2, 6, 6, 1, 4}}, {4, {1, 8, 33, 128}},
};

static void every_impl_matches_reference(void **state) {
    (void)state;
    static const lk_rope_ids_mode modes[] = {LK_ROPE_IDS_PACKED_I64, LK_ROPE_IDS_PACKED_I32, LK_ROPE_IDS_NONE};
    for (int i = 0; i < N_IMPLS; i++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
                for (int m = 0; m < 3; m++) {
                    lk_rope_case c = {.ids = modes[m]};
                    expect_case(impl_names[i], dt ? LK_BF16 : LK_F32, shapes[k], &c);
                }
}

static void in_place_matches_reference(void **state) {
    (void)state;
    lk_rope_case c = {.inplace = 1};
    for (int i = 0; i < N_IMPLS; i++)
        for (int dt = 0; dt < 2; dt++) {
            expect_case(impl_names[i], dt ? LK_BF16 : LK_F32, (lk_shape){6, {1, 6, 9, 64, 2, 32}}, &c);
            expect_case(impl_names[i], dt ? LK_BF16 : LK_F32, (lk_shape){4, {2, 4, 3, 32}}, &c);
        }
}

static void scaled_tables_match_reference(void **state) {
    (void)state;
    lk_rope_case llama = {.theta = 5e5, .scaling = {.type = LK_ROPE_SCALING_LLAMA3, .factor = 8,
                          .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position_embeddings = 16}};
    lk_rope_case yarn = {.theta = 1e6, .scaling = {.type = LK_ROPE_SCALING_YARN, .factor = 4,
                         .original_max_position_embeddings = 16}};
    for (int i = 0; i < N_IMPLS; i++)
        for (int dt = 0; dt < 2; dt++) {
            expect_case(impl_names[i], dt ? LK_BF16 : LK_F32, (lk_shape){4, {2, 4, 11, 32}}, &llama);
            expect_case(impl_names[i], dt ? LK_BF16 : LK_F32, (lk_shape){4, {2, 4, 11, 32}}, &yarn);
        }
}

/* Outputs of 16 MiB and up take fused's streaming stores. */
static void large_outputs_stream(void **state) {
    (void)state;
    expect_case("fused", LK_F32, (lk_shape){5, {1, 32, 1024, 128, 8}}, NULL);
    expect_case("fused", LK_BF16, (lk_shape){5, {1, 32, 2048, 128, 8}}, NULL);
}

/* --- a small problem held in the test, for direct comparisons ------------------------ */

typedef struct {
    lk_dtype dt;
    int64_t B, Hq, Hk, S, D, R, max_pos, nq, nk;
    int64_t qs[4], ks[4], is[2];
    void *q, *k, *qo, *ko, *dqo, *dko, *dq, *dk;
    float *cos, *sin;
    int64_t ids[64];
    unsigned char saved[1 << 14];
    lk_arena arena;
    lk_ctx ctx;
    lk_rope_args a;
} fixture;

static void *rand_buf(lk_rng *rng, lk_dtype dt, int64_t n) {
    void *p = lk_random_tensor(rng, dt, n, 1.0f, NULL);
    assert_non_null(p);
    return p;
}

/* B=2, Hq, Hk, S=5, D, R; packed ids that restart at 0 mid-row. */
static void fx_init(fixture *f, lk_dtype dt, int64_t Hq, int64_t Hk, int64_t D, int64_t R, uint64_t seed) {
    memset(f, 0, sizeof *f);
    f->dt = dt; f->B = 2; f->Hq = Hq; f->Hk = Hk; f->S = 5; f->D = D; f->R = R; f->max_pos = 12;
    f->nq = f->B * Hq * f->S * D; f->nk = f->B * Hk * f->S * D;
    int64_t qs[4] = {f->B, Hq, f->S, D}, ks[4] = {f->B, Hk, f->S, D}, ids[10] = {4, 5, 0, 1, 2, 0, 1, 2, 3, 11};
    memcpy(f->qs, qs, sizeof qs); memcpy(f->ks, ks, sizeof ks);
    memcpy(f->ids, ids, sizeof ids);
    f->is[0] = f->B; f->is[1] = f->S;
    lk_rng rng = lk_rng_make(seed);
    f->q = rand_buf(&rng, dt, f->nq); f->k = rand_buf(&rng, dt, f->nk);
    f->dqo = rand_buf(&rng, dt, f->nq); f->dko = rand_buf(&rng, dt, f->nk);
    f->qo = rand_buf(&rng, dt, f->nq); f->ko = rand_buf(&rng, dt, f->nk);
    f->dq = rand_buf(&rng, dt, f->nq); f->dk = rand_buf(&rng, dt, f->nk);
    f->cos = malloc(sizeof(float) * (size_t)(f->max_pos * R / 2));
    f->sin = malloc(sizeof(float) * (size_t)(f->max_pos * R / 2));
    assert_non_null(f->cos); assert_non_null(f->sin);
    f->ctx = lk_ctx_cpu(&f->arena);
    f->a = (lk_rope_args){
        .q = lk_tensor_view(f->q, dt, 4, f->qs), .k = lk_tensor_view(f->k, dt, 4, f->ks),
        .q_out = lk_tensor_view(f->qo, dt, 4, f->qs), .k_out = lk_tensor_view(f->ko, dt, 4, f->ks),
        .dq_out = lk_tensor_view(f->dqo, dt, 4, f->qs), .dk_out = lk_tensor_view(f->dko, dt, 4, f->ks),
        .dq = lk_tensor_view(f->dq, dt, 4, f->qs), .dk = lk_tensor_view(f->dk, dt, 4, f->ks),
        .cos = lk_tensor_2d(f->cos, LK_F32, f->max_pos, R / 2), .sin = lk_tensor_2d(f->sin, LK_F32, f->max_pos, R / 2),
        .position_ids = lk_tensor_view(f->ids, LK_I64, 2, f->is),
        .saved = {f->saved, sizeof f->saved}, .rotary_dim = R,
    };
    assert_int_equal(lk_rope_tables(1e4, R, NULL, &f->a.cos, &f->a.sin), LK_OK);
}

static void fx_free(fixture *f) {
    void *all[] = {f->q, f->k, f->qo, f->ko, f->dqo, f->dko, f->dq, f->dk, f->cos, f->sin};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    lk_arena_free(&f->arena);
}

static double max_abs_diff(const void *a, const void *b, lk_dtype dt, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(lk_load(a, dt, i) - lk_load(b, dt, i)));
    return m;
}

static void eager_and_fused_agree(void **state) {
    (void)state;
    for (int dt = 0; dt < 2; dt++) {
        lk_dtype t = dt ? LK_BF16 : LK_F32;
        fixture e, f;
        fx_init(&e, t, 6, 2, 64, 32, 7);
        fx_init(&f, t, 6, 2, 64, 32, 7);
        assert_int_equal(lk_rope_forward(impl_of("eager"), &e.a, &e.ctx), LK_OK);
        assert_int_equal(lk_rope_backward(impl_of("eager"), &e.a, &e.ctx), LK_OK);
        assert_int_equal(lk_rope_forward(impl_of("fused"), &f.a, &f.ctx), LK_OK);
        assert_int_equal(lk_rope_backward(impl_of("fused"), &f.a, &f.ctx), LK_OK);
        /* f32: both a few ulps from exact; bf16: eager's extra roundings, ~3 bf16 ulps of |x| <= ~4 */
        double tol = dt ? 0.1 : 1e-5;
        assert_true(max_abs_diff(e.qo, f.qo, t, e.nq) <= tol);
        assert_true(max_abs_diff(e.ko, f.ko, t, e.nk) <= tol);
        assert_true(max_abs_diff(e.dq, f.dq, t, e.nq) <= tol);
        assert_true(max_abs_diff(e.dk, f.dk, t, e.nk) <= tol);
        /* the pass-through dims are copied exactly, whatever the dtype */
        for (int64_t r = 0; r < e.nq / e.D; r++)
            for (int64_t j = e.R; j < e.D; j++) {
                assert_true(lk_load(e.qo, t, r * e.D + j) == lk_load(e.q, t, r * e.D + j));
                assert_true(lk_load(f.qo, t, r * e.D + j) == lk_load(f.q, t, r * e.D + j));
                assert_true(lk_load(f.dq, t, r * e.D + j) == lk_load(f.dqo, t, r * e.D + j));
            }
        fx_free(&e);
        fx_free(&f);
    }
}

/* Position 0 is the identity: a packed document's first token comes out as it went in,
 * and i32 ids give exactly what i64 ids give. */
static void packed_positions_restart(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++) {
        fixture f, g;
        fx_init(&f, LK_F32, 4, 2, 16, 16, 3);
        fx_init(&g, LK_F32, 4, 2, 16, 16, 3);
        int32_t ids32[10];
        for (int t = 0; t < 10; t++) ids32[t] = (int32_t)g.ids[t];
        g.a.position_ids = lk_tensor_view(ids32, LK_I32, 2, g.is);
        assert_int_equal(lk_rope_forward(impl_of(impl_names[i]), &f.a, &f.ctx), LK_OK);
        assert_int_equal(lk_rope_forward(impl_of(impl_names[i]), &g.a, &g.ctx), LK_OK);
        assert_memory_equal(f.qo, g.qo, (size_t)f.nq * 4);
        assert_memory_equal(f.ko, g.ko, (size_t)f.nk * 4);
        int zeros = 0;
        for (int64_t b = 0; b < f.B; b++)
            for (int64_t h = 0; h < f.Hq; h++)
                for (int64_t s = 0; s < f.S; s++) {
                    if (f.ids[b * f.S + s] != 0) continue;
                    zeros++;
                    int64_t o = ((b * f.Hq + h) * f.S + s) * f.D;
                    assert_memory_equal((float *)f.qo + o, (float *)f.q + o, (size_t)f.D * 4);
                }
        assert_int_equal(zeros, 2 * f.Hq);      /* two restarts in the fixture's ids */
        fx_free(&f);
        fx_free(&g);
    }
}

/* Rotating by the angle and back gives x again: the backward is the forward's inverse. */
static void backward_undoes_forward(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++)
        for (int dt = 0; dt < 2; dt++) {
            lk_dtype t = dt ? LK_BF16 : LK_F32;
            fixture f;
            fx_init(&f, t, 6, 3, 20, 14, 11);
            assert_int_equal(lk_rope_forward(impl_of(impl_names[i]), &f.a, &f.ctx), LK_OK);
            f.a.dq_out.data = f.qo;          /* backward of q_out, written over it */
            f.a.dk_out.data = f.ko;
            f.a.dq.data = f.qo;
            f.a.dk.data = f.ko;
            assert_int_equal(lk_rope_backward(impl_of(impl_names[i]), &f.a, &f.ctx), LK_OK);
            /* f32: ulps of |x| (< 5); bf16: two passes of roundings, eager's more (|x| < ~5) */
            double tol = dt ? (i == 0 ? 0.15 : 0.06) : 5e-6;
            assert_true(max_abs_diff(f.qo, f.q, t, f.nq) <= tol);
            assert_true(max_abs_diff(f.ko, f.k, t, f.nk) <= tol);
            fx_free(&f);
        }
}

/* L = Σ dq_out·q_out + Σ dk_out·k_out; central differences on every element of q and k. */
static double loss(fixture *f, const lk_impl *impl) {
    assert_int_equal(lk_rope_forward(impl, &f->a, &f->ctx), LK_OK);
    double l = 0;
    for (int64_t i = 0; i < f->nq; i++) l += (double)((float *)f->dqo)[i] * ((float *)f->qo)[i];
    for (int64_t i = 0; i < f->nk; i++) l += (double)((float *)f->dko)[i] * ((float *)f->ko)[i];
    return l;
}

static void gradients_match_finite_differences(void **state) {
    (void)state;
    const float h = 1e-2f;
    for (int i = 0; i < N_IMPLS; i++) {
        const lk_impl *impl = impl_of(impl_names[i]);
        fixture f;
        fx_init(&f, LK_F32, 2, 1, 8, 6, 5);
        assert_int_equal(lk_rope_forward(impl, &f.a, &f.ctx), LK_OK);
        assert_int_equal(lk_rope_backward(impl, &f.a, &f.ctx), LK_OK);
        for (int t = 0; t < 2; t++) {
            float *x = t ? f.k : f.q, *g = t ? f.dk : f.dq;
            for (int64_t e = 0; e < (t ? f.nk : f.nq); e++) {
                float x0 = x[e];
                x[e] = x0 + h;
                double lp = loss(&f, impl);
                x[e] = x0 - h;
                double lm = loss(&f, impl);
                x[e] = x0;
                /* linear in x: only f32 rounding of L (~1e-6) over 2h remains */
                assert_true(fabs((lp - lm) / (2 * h) - g[e]) <= 1e-3);
            }
        }
        fx_free(&f);
    }
}

/* --- tables against formulas written here ----------------------------------------- */

/* HF's default inv_freq, then llama3's three bands, in double. */
static double inv_default(double theta, int64_t R, int64_t i) { return pow(theta, -(double)(2 * i) / (double)R); }

static double inv_llama3(double theta, int64_t R, int64_t i, double factor, double lo, double hi, double old) {
    double f = inv_default(theta, R, i), wavelen = 2 * M_PI / f;
    double smooth = (old / wavelen - lo) / (hi - lo);
    if (wavelen > old / lo) return f / factor;                  /* low frequency: interpolate */
    if (wavelen < old / hi) return f;                           /* high frequency: keep */
    return (1 - smooth) * f / factor + smooth * f;
}

static double inv_yarn(double theta, int64_t R, int64_t i, double factor, double bf, double bs, double old) {
    double lo = floor(R * log(old / (bf * 2 * M_PI)) / (2 * log(theta)));
    double hi = ceil(R * log(old / (bs * 2 * M_PI)) / (2 * log(theta)));
    if (lo < 0) lo = 0;
    if (hi > R - 1) hi = R - 1;
    if (lo == hi) hi += 0.001;
    double ramp = ((double)i - lo) / (hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double f = inv_default(theta, R, i);
    return f / factor * ramp + f * (1 - ramp);
}

typedef double (*inv_fn)(int64_t i, const double *p);
static double inv_fn_default(int64_t i, const double *p) { return inv_default(p[0], (int64_t)p[1], i); }
static double inv_fn_llama3(int64_t i, const double *p) {
    return inv_llama3(p[0], (int64_t)p[1], i, p[2], p[3], p[4], p[5]);
}
static double inv_fn_yarn(int64_t i, const double *p) { return inv_yarn(p[0], (int64_t)p[1], i, p[2], p[3], p[4], p[5]); }

/* Builds tables of max_pos rows and compares every entry with m·cos(p·inv(i)). Returns
 * how many frequencies differ from the unscaled ones by more than 1e-3 relative. */
static int expect_tables(double theta, int64_t R, const lk_rope_scaling *sc, int64_t max_pos, inv_fn inv,
                         const double *p, double m) {
    int64_t h = R / 2;
    float *c = malloc(sizeof(float) * (size_t)(max_pos * h)), *s = malloc(sizeof(float) * (size_t)(max_pos * h));
    assert_non_null(c); assert_non_null(s);
    lk_tensor ct = lk_tensor_2d(c, LK_F32, max_pos, h), st = lk_tensor_2d(s, LK_F32, max_pos, h);
    assert_int_equal(lk_rope_tables(theta, R, sc, &ct, &st), LK_OK);
    double worst = 0;
    int changed = 0;
    for (int64_t i = 0; i < h; i++) {
        double f = inv(i, p);
        changed += fabs(f / inv_default(theta, R, i) - 1) > 1e-3;
        for (int64_t pos = 0; pos < max_pos; pos++) {
            worst = fmax(worst, fabs(c[pos * h + i] - m * cos((double)pos * f)));
            worst = fmax(worst, fabs(s[pos * h + i] - m * sin((double)pos * f)));
        }
    }
    /* one f32 rounding of a value <= m (~1.2): 2^-24·m ≈ 7e-8 */
    assert_true(worst <= 2e-7);
    free(c); free(s);
    return changed;
}

static void tables_match_formulas(void **state) {
    (void)state;
    double pd[] = {1e6, 128};
    assert_int_equal(expect_tables(1e6, 128, NULL, 4096, inv_fn_default, pd, 1.0), 0);
    lk_rope_scaling none = {0};
    assert_int_equal(expect_tables(1e4, 6, &none, 300, inv_fn_default, (double[]){1e4, 6}, 1.0), 0);

    /* Llama 3.1: theta 5e5, factor 8, bands 1..4, original 8192: all three bands occur */
    lk_rope_scaling l3 = {.type = LK_ROPE_SCALING_LLAMA3, .factor = 8, .low_freq_factor = 1,
                          .high_freq_factor = 4, .original_max_position_embeddings = 8192};
    double pl[] = {5e5, 128, 8, 1, 4, 8192};
    int changed = expect_tables(5e5, 128, &l3, 2048, inv_fn_llama3, pl, 1.0);
    assert_true(changed > 10 && changed < 64);

    /* YaRN as Qwen3 configures it: factor 4, original 32768; betas default to 32 / 1 */
    lk_rope_scaling yarn = {.type = LK_ROPE_SCALING_YARN, .factor = 4, .original_max_position_embeddings = 32768};
    double py[] = {1e6, 128, 4, 32, 1, 32768};
    double m = 0.1 * log(4.0) + 1.0;
    changed = expect_tables(1e6, 128, &yarn, 2048, inv_fn_yarn, py, m);
    assert_true(changed > 10 && changed < 64);
    /* explicit betas and attention factor, partial rotary dim */
    lk_rope_scaling yarn2 = {.type = LK_ROPE_SCALING_YARN, .factor = 16, .beta_fast = 16, .beta_slow = 2,
                             .attention_factor = 0.75, .original_max_position_embeddings = 4096};
    double py2[] = {1e4, 32, 16, 16, 2, 4096};
    expect_tables(1e4, 32, &yarn2, 512, inv_fn_yarn, py2, 0.75);
}

static void scaling_names_parse(void **state) {
    (void)state;
    lk_rope_scaling_type t = LK_ROPE_SCALING_YARN;
    assert_int_equal(lk_rope_scaling_parse("default", &t), LK_OK);
    assert_int_equal(t, LK_ROPE_SCALING_NONE);
    assert_int_equal(lk_rope_scaling_parse("llama3", &t), LK_OK);
    assert_int_equal(t, LK_ROPE_SCALING_LLAMA3);
    assert_int_equal(lk_rope_scaling_parse("yarn", &t), LK_OK);
    assert_int_equal(t, LK_ROPE_SCALING_YARN);
    assert_int_equal(lk_rope_scaling_parse("none", &t), LK_OK);
    assert_int_equal(t, LK_ROPE_SCALING_NONE);
    t = LK_ROPE_SCALING_YARN;
    assert_int_equal(lk_rope_scaling_parse("dynamic", &t), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "scaling.type"));
    assert_non_null(strstr(lk_last_error(), "dynamic"));
    assert_int_equal(t, LK_ROPE_SCALING_YARN);
    assert_string_equal(lk_rope_scaling_name(LK_ROPE_SCALING_LLAMA3), "llama3");
}

/* --- bad arguments ---------------------------------------------------------------- */

#define SENTINEL 0x5a

static void fill_sentinel(fixture *f) {
    size_t e = lk_dtype_size(f->dt);
    memset(f->qo, SENTINEL, (size_t)f->nq * e); memset(f->ko, SENTINEL, (size_t)f->nk * e);
    memset(f->dq, SENTINEL, (size_t)f->nq * e); memset(f->dk, SENTINEL, (size_t)f->nk * e);
}

static void expect_untouched(const void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != SENTINEL) fail_msg("output byte %zu was written", i);
}

/* The call fails with want, the error names `arg`, and no output was written. */
static void expect_refused(fixture *f, const lk_impl *impl, const lk_rope_args *a, int backward, lk_status want,
                           const char *arg) {
    fill_sentinel(f);
    lk_status s = backward ? lk_rope_backward(impl, a, &f->ctx) : lk_rope_forward(impl, a, &f->ctx);
    if (s != want)
        fail_msg("%s %s: expected %s for '%s', got %s: %s", impl ? impl->name : "NULL", backward ? "bwd" : "fwd",
                 lk_status_name(want), arg, lk_status_name(s), lk_last_error());
    if (!strstr(lk_last_error(), arg)) fail_msg("error '%s' does not name '%s'", lk_last_error(), arg);
    size_t e = lk_dtype_size(f->dt);
    expect_untouched(f->qo, (size_t)f->nq * e); expect_untouched(f->ko, (size_t)f->nk * e);
    expect_untouched(f->dq, (size_t)f->nq * e); expect_untouched(f->dk, (size_t)f->nk * e);
}

static void bad_arguments_are_refused(void **state) {
    (void)state;
    for (int i = 0; i < N_IMPLS; i++) {
        const lk_impl *impl = impl_of(impl_names[i]);
        fixture f;
        fx_init(&f, LK_F32, 4, 2, 8, 8, 9);
        lk_rope_args a;
        int64_t q7[4] = {2, 4, 5, 7}, k7[4] = {2, 2, 5, 7}, bad_ids[2] = {2, 4};
        for (int bw = 0; bw < 2; bw++) {
            a = f.a; a.k.shape[1] = 3; a.k_out.shape[1] = 3; a.dk_out.shape[1] = 3; a.dk.shape[1] = 3;
            expect_refused(&f, impl, &a, bw, LK_ESHAPE, "k: expected");             /* Hk = 3 does not divide 4 */
            a = f.a; a.q = lk_tensor_view(f.q, LK_F32, 4, q7); a.k = lk_tensor_view(f.k, LK_F32, 4, k7);
            a.rotary_dim = 0;
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "rotary_dim");              /* D = 7 odd, R = D */
            a = f.a; a.rotary_dim = 10;
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "rotary_dim");              /* R > D */
            a = f.a; a.rotary_dim = 5;
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "rotary_dim");              /* R odd */
            a = f.a; a.rotary_dim = 6;
            expect_refused(&f, impl, &a, bw, LK_ESHAPE, "cos");                     /* table half is 4, not 3 */
            a = f.a; a.cos.dtype = LK_BF16;
            expect_refused(&f, impl, &a, bw, LK_EDTYPE, "cos");
            a = f.a; a.sin.data = NULL;
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "sin");
            a = f.a; a.sin.shape[0] = 11;
            expect_refused(&f, impl, &a, bw, LK_ESHAPE, "sin");
            a = f.a; a.q.dtype = LK_F16; a.k.dtype = LK_F16;
            expect_refused(&f, impl, &a, bw, LK_EDTYPE, "q: expected dtype");
            a = f.a; a.k.dtype = LK_BF16;
            expect_refused(&f, impl, &a, bw, LK_EDTYPE, "k: expected dtype");
            a = f.a; a.q.ndim = 3;
            expect_refused(&f, impl, &a, bw, LK_ESHAPE, "q");
            a = f.a; a.position_ids.dtype = LK_F32;
            expect_refused(&f, impl, &a, bw, LK_EDTYPE, "position_ids");
            a = f.a; a.position_ids = lk_tensor_view(f.ids, LK_I64, 2, bad_ids);
            expect_refused(&f, impl, &a, bw, LK_ESHAPE, "position_ids");
            a = f.a; f.ids[7] = 12;                                                 /* == max_pos */
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "position_ids");
            f.ids[7] = -1;
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "position_ids");
            f.ids[7] = 2;
            int32_t ids32[10] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 99};
            a.position_ids = lk_tensor_view(ids32, LK_I32, 2, f.is);
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "position_ids");
            a = f.a; a.position_ids.data = NULL; a.cos.shape[0] = 4; a.sin.shape[0] = 4;   /* S = 5 > 4 rows */
            expect_refused(&f, impl, &a, bw, LK_EINVAL, "position_ids");
            a = f.a; a.saved.bytes = 0; a.saved.data = NULL;
            if (i == 0) expect_refused(&f, impl, &a, bw, LK_EINVAL, "saved");      /* eager keeps cos, sin */
            a = f.a;
            expect_refused(&f, lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CPU), &a, bw, LK_EINVAL, "impl");
            expect_refused(&f, NULL, &a, bw, LK_EINVAL, "impl");
            expect_refused(&f, impl, NULL, bw, LK_EINVAL, "args");
            fill_sentinel(&f);
            assert_int_equal(bw ? lk_rope_backward(impl, &a, NULL) : lk_rope_forward(impl, &a, NULL), LK_EINVAL);
            assert_non_null(strstr(lk_last_error(), "ctx"));
            a = f.a; a.q.device.type = LK_DEVICE_CUDA;
            expect_refused(&f, impl, &a, bw, LK_EDEVICE, "q");
        }
        /* forward only */
        a = f.a; a.q_out.dtype = LK_BF16;
        expect_refused(&f, impl, &a, 0, LK_EDTYPE, "q_out");
        a = f.a; a.k_out.shape[1] = 4;
        expect_refused(&f, impl, &a, 0, LK_ESHAPE, "k_out");
        a = f.a; a.q.data = NULL;
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "q");
        a = f.a; a.k_out.data = NULL;
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "k_out");
        a = f.a; a.q.data = (char *)f.qo + 4;                 /* a partial overlap is not in place */
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "q_out");
        a = f.a; a.k_out.data = f.qo;
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "q_out");
        a = f.a; a.q_out.data = f.k;
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "q_out");
        a = f.a; a.k_out.data = f.cos;
        expect_refused(&f, impl, &a, 0, LK_EINVAL, "k_out");
        /* backward only */
        a = f.a; a.dq.dtype = LK_BF16;
        expect_refused(&f, impl, &a, 1, LK_EDTYPE, "dq");
        a = f.a; a.dk_out.data = NULL;
        expect_refused(&f, impl, &a, 1, LK_EINVAL, "dk_out");
        a = f.a; a.dk.data = NULL;
        expect_refused(&f, impl, &a, 1, LK_EINVAL, "dk");
        a = f.a; a.dk.data = f.dqo;
        expect_refused(&f, impl, &a, 1, LK_EINVAL, "dk");
        /* the backward does not read q and k */
        a = f.a; a.q.data = NULL; a.k.data = NULL;
        if (i == 1) assert_int_equal(lk_rope_backward(impl, &a, &f.ctx), LK_OK);
        fx_free(&f);
    }
}

static void bad_tables_are_refused(void **state) {
    (void)state;
    float c[8 * 4], s[8 * 4];
    lk_tensor ct = lk_tensor_2d(c, LK_F32, 8, 4), st = lk_tensor_2d(s, LK_F32, 8, 4), wrong = lk_tensor_2d(s, LK_F32, 8, 3);
    lk_rope_scaling l3 = {.type = LK_ROPE_SCALING_LLAMA3, .factor = 8, .low_freq_factor = 1,
                          .high_freq_factor = 4, .original_max_position_embeddings = 64};
    lk_rope_scaling yarn = {.type = LK_ROPE_SCALING_YARN, .factor = 4, .original_max_position_embeddings = 64};
    struct { double theta; int64_t R; lk_rope_scaling sc; lk_tensor *sin; lk_status want; const char *arg; } cases[] = {
        {0.5, 8, {0}, &st, LK_EINVAL, "theta"},
        {NAN, 8, {0}, &st, LK_EINVAL, "theta"},
        {1e4, 7, {0}, &st, LK_EINVAL, "rotary_dim"},
        {1e4, 8, {.type = (lk_rope_scaling_type)7}, &st, LK_EINVAL, "scaling.type"},
        {1e4, 8, l3, &wrong, LK_ESHAPE, "sin"},
        {1e4, 8, {0}, &ct, LK_EINVAL, "sin"},
        {1e4, 6, {0}, &st, LK_ESHAPE, "cos"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases + 6; i++) {
        double theta = 1e4;
        int64_t R = 8;
        lk_rope_scaling sc;
        lk_tensor *sn = &st;
        lk_status want = LK_EINVAL;
        const char *arg;
        if (i < sizeof cases / sizeof *cases) {
            theta = cases[i].theta; R = cases[i].R; sc = cases[i].sc; sn = cases[i].sin;
            want = cases[i].want; arg = cases[i].arg;
        } else {
            switch (i - sizeof cases / sizeof *cases) {
            case 0: sc = l3; sc.factor = 0; arg = "scaling.factor"; break;
            case 1: sc = l3; sc.high_freq_factor = 1; arg = "scaling.high_freq_factor"; break;
            case 2: sc = l3; sc.low_freq_factor = -1; arg = "scaling.low_freq_factor"; break;
            case 3: sc = yarn; sc.original_max_position_embeddings = 0; arg = "original_max_position_embeddings"; break;
            case 4: sc = yarn; sc.beta_fast = -2; arg = "beta_fast"; break;
            default: sc = yarn; sc.attention_factor = -1; arg = "attention_factor"; break;
            }
        }
        memset(c, SENTINEL, sizeof c);
        memset(s, SENTINEL, sizeof s);
        lk_status got = lk_rope_tables(theta, R, &sc, &ct, sn);
        if (got != want || !strstr(lk_last_error(), arg))
            fail_msg("case %zu: expected %s naming '%s', got %s: %s", i, lk_status_name(want), arg,
                     lk_status_name(got), lk_last_error());
        expect_untouched(c, sizeof c);
        expect_untouched(s, sizeof s);
    }
    assert_int_equal(lk_rope_tables(1e4, 8, NULL, NULL, &st), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "cos"));
}

static void queries(void **state) {
    (void)state;
    int64_t qs[4] = {2, 8, 100, 64}, ks[4] = {2, 2, 100, 64};
    lk_rope_args a = {.q = lk_tensor_view(NULL, LK_BF16, 4, qs), .k = lk_tensor_view(NULL, LK_BF16, 4, ks),
                      .rotary_dim = 32};
    size_t b = 1;
    assert_int_equal(lk_rope_saved_bytes(impl_of("fused"), &a, &b), LK_OK);
    assert_int_equal(b, 0);
    assert_int_equal(lk_rope_workspace_bytes(impl_of("fused"), &a, 0, &b), LK_OK);
    assert_int_equal(b, 0);
    /* eager keeps cos and sin [B, S, R] in the storage dtype, like autograd */
    assert_int_equal(lk_rope_saved_bytes(impl_of("eager"), &a, &b), LK_OK);
    assert_int_equal(b, 2 * 2 * 100 * 32 * 2);
    /* rotate_half, x·cos, rot·sin and the partial sum, [B, Hq, S, R] each */
    assert_int_equal(lk_rope_workspace_bytes(impl_of("eager"), &a, 1, &b), LK_OK);
    assert_int_equal(b, 4 * 2 * 8 * 100 * 32 * 2);
    a.rotary_dim = 66;
    b = 7;
    assert_int_equal(lk_rope_saved_bytes(impl_of("eager"), &a, &b), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "rotary_dim"));
    assert_int_equal(b, 7);
    assert_int_equal(lk_rope_saved_bytes(impl_of("eager"), &a, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "bytes"));
}

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_impl_matches_reference),
        cmocka_unit_test(in_place_matches_reference),
        cmocka_unit_test(scaled_tables_match_reference),
        cmocka_unit_test(large_outputs_stream),
        cmocka_unit_test(eager_and_fused_agree),
        cmocka_unit_test(packed_positions_restart),
        cmocka_unit_test(backward_undoes_forward),
        cmocka_unit_test(gradients_match_finite_differences),
        cmocka_unit_test(tables_match_formulas),
        cmocka_unit_test(scaling_names_parse),
        cmocka_unit_test(bad_arguments_are_refused),
        cmocka_unit_test(bad_tables_are_refused),
        cmocka_unit_test(queries),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
