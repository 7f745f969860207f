/* test_swiglu_mlp.c — the SwiGLU MLP, eager and fused, against the float64 reference
 * and against each other in f32 and bf16 (T = 1, odd sizes, leading dims, more tokens
 * than fused's chunk), swiglu_limit on, accumulated weight gradients, the saved block
 * alone (a forward without out, as a recompute runs it), finite
 * differences of dx and both weight gradients, and bad inputs that must change nothing.
 * Run: ./build/test_swiglu_mlp */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/swiglu_mlp/check.h"

static const lk_impl *impl_of(const char *name) { return lk_impl_find(LK_OP_SWIGLU_MLP, name, LK_DEVICE_CPU); }
static const char *const impls[] = {"eager", "fused"};

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK && impl_of("eager") && impl_of("fused") ? 0 : -1;
}

/* f32: f32 GEMMs and activation, a few 1e-7 of max|ref| measured; 2e-5.
 * bf16: fused rounds gate_up once and the outputs once (~4e-3); eager rounds every
 * materialized intermediate as a framework does (up to 4 roundings on a path, ~9e-3
 * measured). */
static double tol_of(const char *impl, lk_dtype dt) {
    return dt == LK_F32 ? 2e-5 : strcmp(impl, "eager") == 0 ? 2e-2 : 1e-2;
}

static void expect_case(const char *name, lk_dtype dt, lk_shape shape, const lk_swiglu_mlp_case *c, uint64_t seed) {
    lk_check_row row;
    lk_swiglu_mlp_errors e;
    assert_int_equal(lk_swiglu_mlp_check_case(impl_of(name), dt, &shape, seed, c, &row, &e), LK_OK);
    double tol = tol_of(name, dt);
    if (!(e.out <= tol && e.dx <= tol && e.d_gate_up_weight <= tol && e.d_down_weight <= tol))
        print_error("%s %s %s limit %g: out %.3g dx %.3g dgu %.3g dd %.3g (tol %.1g)\n", name, row.dtype, row.shape,
                    (double)c->swiglu_limit, e.out, e.dx, e.d_gate_up_weight, e.d_down_weight, tol);
    assert_true(e.out <= tol);
    assert_true(e.dx <= tol);
    assert_true(e.d_gate_up_weight <= tol);
    assert_true(e.d_down_weight <= tol);
    assert_true(row.pass);
}

static void test_reference(void **state) {
    (void)state;
    static const lk_shape shapes[] = {
        {3, {1, 16, 8}}, {3, {13, 19, 11}}, {3, {1, 1, 1}}, {4, {2, 3, 8, 5}}, {3, {1100, 8, 4}},
    };
    for (int k = 0; k < 2; k++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++)
            for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
                expect_case(impls[k], (lk_dtype)dt, shapes[i], &(lk_swiglu_mlp_case){0}, 10 + i);
                expect_case(impls[k], (lk_dtype)dt, shapes[i], &(lk_swiglu_mlp_case){.grad_f32 = 1}, 20 + i);
            }
}

/* gate and up are ~N(0, 1): a limit near 0.7 clamps about half of them. The long case
 * (fused's chunks with a remainder) runs in f32 only: among 8800 pre-activations some lie
 * within a bf16 rounding of any limit, where the clamp's step makes bf16 meaningless. */
static void test_limit(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++) {
            expect_case(impls[k], (lk_dtype)dt, (lk_shape){3, {13, 19, 11}}, &(lk_swiglu_mlp_case){.swiglu_limit = 0.7f}, 30);
            if (dt == LK_F32)
                expect_case(impls[k], LK_F32, (lk_shape){3, {1100, 8, 4}}, &(lk_swiglu_mlp_case){.swiglu_limit = 0.7f}, 31);
        }
}

/* Two backward calls: the weight gradients must hold init + 2·grad; without weight
 * gradients wanted, dx alone. */
static void test_accumulate(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++) {
            expect_case(impls[k], (lk_dtype)dt, (lk_shape){3, {13, 19, 11}}, &(lk_swiglu_mlp_case){.backward_calls = 2}, 40);
            expect_case(impls[k], (lk_dtype)dt, (lk_shape){3, {13, 19, 11}}, &(lk_swiglu_mlp_case){.no_weight_grads = 1}, 41);
        }
}

/* A forward with out.data NULL (a recompute's) writes the whole saved block: the backward
 * reads it (poisoned before) and matches the reference; out comes from a second forward.
 * 1100 tokens: more than fused's chunk. */
static void test_saved_alone(void **state) {
    (void)state;
    static const lk_shape shapes[] = {{3, {13, 19, 11}}, {3, {1100, 8, 4}}};
    for (int k = 0; k < 2; k++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++)
            for (int i = 0; i < 2; i++)
                expect_case(impls[k], (lk_dtype)dt, shapes[i], &(lk_swiglu_mlp_case){.saved_alone = 1}, 42 + i);
}

/* --- a small f32 problem run by hand -------------------------------------------------- */

enum { T = 3, H = 5, I = 4 };

typedef struct {
    float x[T * H], wgu[2 * I * H], wd[H * I], out[T * H], r[T * H], dx[T * H], dgu[2 * I * H], dd[H * I];
    float saved[4 * T * I];     /* enough for either implementation */
    lk_swiglu_mlp_args a;
    lk_arena arena;
    lk_ctx ctx;
} fixture;

static void fixture_init(fixture *f, float limit) {
    memset(f, 0, sizeof *f);
    lk_rng rng = lk_rng_make(9);
    lk_rng_normal(&rng, f->x, T * H, 0, 1);
    lk_rng_normal(&rng, f->wgu, 2 * I * H, 0, 0.45f);
    lk_rng_normal(&rng, f->wd, H * I, 0, 0.5f);
    lk_rng_normal(&rng, f->r, T * H, 0, 1);
    f->a = (lk_swiglu_mlp_args){
        .x = lk_tensor_2d(f->x, LK_F32, T, H), .gate_up_weight = lk_tensor_2d(f->wgu, LK_F32, 2 * I, H),
        .down_weight = lk_tensor_2d(f->wd, LK_F32, H, I), .out = lk_tensor_2d(f->out, LK_F32, T, H),
        .dout = lk_tensor_2d(f->r, LK_F32, T, H), .dx = lk_tensor_2d(f->dx, LK_F32, T, H),
        .d_gate_up_weight = lk_tensor_2d(f->dgu, LK_F32, 2 * I, H), .d_down_weight = lk_tensor_2d(f->dd, LK_F32, H, I),
        .saved = {f->saved, sizeof f->saved}, .swiglu_limit = limit,
    };
    f->ctx = lk_ctx_cpu(&f->arena);
}

static double loss(const lk_impl *impl, fixture *f) {
    assert_int_equal(lk_swiglu_mlp_forward(impl, &f->a, &f->ctx), LK_OK);
    double s = 0.0;
    for (int i = 0; i < T * H; i++) s += (double)f->out[i] * f->r[i];
    return s;
}

/* Central differences of loss = Σ out·r. Truncation (eps²·f''' ~ 1e-5) and f32 rounding
 * of out (~1e-7·|out|·sqrt(n) / 2eps ~ 1e-5) stay well under the 2e-3 allowed. */
static void expect_fd(const lk_impl *impl, fixture *f, float *p, int n, const float *grad, const char *what) {
    const float eps = 5e-3f;
    for (int i = 0; i < n; i++) {
        float keep = p[i];
        p[i] = keep + eps;
        double up = loss(impl, f);
        p[i] = keep - eps;
        double down = loss(impl, f);
        p[i] = keep;
        double num = (up - down) / (2.0 * eps);
        if (fabs(num - grad[i]) > 2e-3 * fmax(1.0, fabs(num)))
            print_error("%s %s[%d]: finite difference %.6g, backward %.6g\n", impl->name, what, i, num, grad[i]);
        assert_true(fabs(num - grad[i]) <= 2e-3 * fmax(1.0, fabs(num)));
    }
}

static void test_finite_differences(void **state) {
    (void)state;
    static const float limits[] = {0.0f, 0.8f};
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < 2; l++) {
            fixture f;
            fixture_init(&f, limits[l]);
            const lk_impl *impl = impl_of(impls[k]);
            loss(impl, &f);
            assert_int_equal(lk_swiglu_mlp_backward(impl, &f.a, &f.ctx), LK_OK);
            expect_fd(impl, &f, f.x, T * H, f.dx, "dx");
            expect_fd(impl, &f, f.wgu, 2 * I * H, f.dgu, "d_gate_up_weight");
            expect_fd(impl, &f, f.wd, H * I, f.dd, "d_down_weight");
            lk_arena_free(&f.arena);
        }
}

/* eager and fused on the same f32 inputs agree far more closely than either needs to
 * agree with the reference: the same GEMM library and activation, summed in f32. */
static void test_eager_vs_fused(void **state) {
    (void)state;
    fixture e, f;
    fixture_init(&e, 0.0f);
    fixture_init(&f, 0.0f);
    assert_int_equal(lk_swiglu_mlp_forward(impl_of("eager"), &e.a, &e.ctx), LK_OK);
    assert_int_equal(lk_swiglu_mlp_backward(impl_of("eager"), &e.a, &e.ctx), LK_OK);
    assert_int_equal(lk_swiglu_mlp_forward(impl_of("fused"), &f.a, &f.ctx), LK_OK);
    assert_int_equal(lk_swiglu_mlp_backward(impl_of("fused"), &f.a, &f.ctx), LK_OK);
    for (int i = 0; i < T * H; i++) {
        assert_true(fabsf(e.out[i] - f.out[i]) <= 1e-5f * fmaxf(1.0f, fabsf(e.out[i])));
        assert_true(fabsf(e.dx[i] - f.dx[i]) <= 1e-5f * fmaxf(1.0f, fabsf(e.dx[i])));
    }
    for (int i = 0; i < 2 * I * H; i++) assert_true(fabsf(e.dgu[i] - f.dgu[i]) <= 1e-5f * fmaxf(1.0f, fabsf(e.dgu[i])));
    for (int i = 0; i < H * I; i++) assert_true(fabsf(e.dd[i] - f.dd[i]) <= 1e-5f * fmaxf(1.0f, fabsf(e.dd[i])));
    lk_arena_free(&e.arena);
    lk_arena_free(&f.arena);
}

/* --- bad inputs ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int backward;
    lk_status want;
    const char *arg;        /* what lk_last_error() must name */
} bad_case;

static void mutate(const char *name, lk_swiglu_mlp_args *a, const lk_impl **impl) {
    static const int64_t gu_odd[2] = {2 * I + 1, H}, gu_h[2] = {2 * I, H + 1}, d_bad[2] = {H, I + 1};
    static const int64_t x_bad[2] = {T, H + 1};
    if (!strcmp(name, "gate_up_odd")) a->gate_up_weight = lk_tensor_view(a->gate_up_weight.data, LK_F32, 2, gu_odd);
    else if (!strcmp(name, "gate_up_hidden")) a->gate_up_weight = lk_tensor_view(a->gate_up_weight.data, LK_F32, 2, gu_h);
    else if (!strcmp(name, "down_shape")) a->down_weight = lk_tensor_view(a->down_weight.data, LK_F32, 2, d_bad);
    else if (!strcmp(name, "down_dtype")) a->down_weight.dtype = LK_BF16;
    else if (!strcmp(name, "gate_up_dtype")) a->gate_up_weight.dtype = LK_BF16;
    else if (!strcmp(name, "limit_negative")) a->swiglu_limit = -1.0f;
    else if (!strcmp(name, "limit_nan")) a->swiglu_limit = NAN;
    else if (!strcmp(name, "saved_small")) a->saved.bytes = 8;
    else if (!strcmp(name, "out_shape")) a->out = lk_tensor_view(a->out.data, LK_F32, 2, x_bad);
    else if (!strcmp(name, "out_over_saved")) a->out.data = a->saved.data;
    else if (!strcmp(name, "x_f16")) a->x.dtype = LK_F16;
    else if (!strcmp(name, "impl_op")) *impl = lk_impl_find(LK_OP_LINEAR, "blas", LK_DEVICE_CPU);
    else if (!strcmp(name, "dx_shape")) a->dx = lk_tensor_view(a->dx.data, LK_F32, 2, x_bad);
    else if (!strcmp(name, "dout_null")) a->dout.data = NULL;
    else if (!strcmp(name, "d_down_dtype")) a->d_down_weight.dtype = LK_F16;
    else if (!strcmp(name, "d_gate_up_shape")) a->d_gate_up_weight = lk_tensor_view(a->d_gate_up_weight.data, LK_F32, 2, gu_h);
    else if (!strcmp(name, "dx_over_dgu")) a->dx.data = a->d_gate_up_weight.data;
}

static void test_bad_inputs(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"gate_up_odd", 0, LK_ESHAPE, "gate_up_weight"},  {"gate_up_hidden", 0, LK_ESHAPE, "gate_up_weight"},
        {"down_shape", 0, LK_ESHAPE, "down_weight"},      {"down_dtype", 0, LK_EDTYPE, "down_weight"},
        {"gate_up_dtype", 0, LK_EDTYPE, "gate_up_weight"}, {"limit_negative", 0, LK_EINVAL, "swiglu_limit"},
        {"limit_nan", 0, LK_EINVAL, "swiglu_limit"},      {"saved_small", 0, LK_EINVAL, "saved"},
        {"out_shape", 0, LK_ESHAPE, "out"},
        {"out_over_saved", 0, LK_EINVAL, "out"},          {"x_f16", 0, LK_EDTYPE, "x"},
        {"impl_op", 0, LK_EINVAL, "impl"},                {"dx_shape", 1, LK_ESHAPE, "dx"},
        {"dout_null", 1, LK_EINVAL, "dout"},              {"d_down_dtype", 1, LK_EDTYPE, "d_down_weight"},
        {"d_gate_up_shape", 1, LK_ESHAPE, "d_gate_up_weight"}, {"dx_over_dgu", 1, LK_EINVAL, "dx"},
        {"limit_negative", 1, LK_EINVAL, "swiglu_limit"}, {"saved_small", 1, LK_EINVAL, "saved"},
    };
    for (int k = 0; k < 2; k++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            fixture f;
            fixture_init(&f, 0.0f);
            const lk_impl *impl = impl_of(impls[k]);
            mutate(cases[c].name, &f.a, &impl);
            memset(f.out, 0x5a, sizeof f.out);
            memset(f.dx, 0x5a, sizeof f.dx);
            memset(f.dgu, 0x5a, sizeof f.dgu);
            memset(f.dd, 0x5a, sizeof f.dd);
            memset(f.saved, 0x5a, sizeof f.saved);
            fixture before = f;
            lk_status s = cases[c].backward ? lk_swiglu_mlp_backward(impl, &f.a, &f.ctx)
                                            : lk_swiglu_mlp_forward(impl, &f.a, &f.ctx);
            if (s != cases[c].want || !strstr(lk_last_error(), cases[c].arg))
                print_error("%s %s: got %s '%s'\n", impls[k], cases[c].name, lk_status_name(s), lk_last_error());
            assert_int_equal(s, cases[c].want);
            assert_non_null(strstr(lk_last_error(), cases[c].arg));
            assert_memory_equal(f.out, before.out, sizeof f.out);
            assert_memory_equal(f.dx, before.dx, sizeof f.dx);
            assert_memory_equal(f.dgu, before.dgu, sizeof f.dgu);
            assert_memory_equal(f.dd, before.dd, sizeof f.dd);
            assert_memory_equal(f.saved, before.saved, sizeof f.saved);
            lk_arena_free(&f.arena);
        }
}

/* What each keeps for the backward: eager gate, up, silu, h; fused gate_up only. */
static void test_saved_bytes(void **state) {
    (void)state;
    lk_tensor x = lk_tensor_2d(NULL, LK_BF16, 4096, 1024), gu = lk_tensor_2d(NULL, LK_BF16, 2 * 2816, 1024);
    size_t eager = 0, fused = 0;
    assert_int_equal(lk_swiglu_mlp_saved_bytes(impl_of("eager"), &x, &gu, &eager), LK_OK);
    assert_int_equal(lk_swiglu_mlp_saved_bytes(impl_of("fused"), &x, &gu, &fused), LK_OK);
    assert_int_equal(eager, (size_t)4 * 4096 * 2816 * 2);
    assert_int_equal(fused, (size_t)2 * 4096 * 2816 * 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_saved_alone),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_eager_vs_fused),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_saved_bytes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
