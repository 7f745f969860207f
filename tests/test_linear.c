/* test_linear.c — linear (blas) against the float64 reference in f32 and bf16 on
 * several shapes (odd ones and leading dims included), the accumulate semantics of the
 * parameter gradients, finite differences, and bad inputs that must change nothing.
 * Run: ./build/test_linear */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/linear/check.h"

static const lk_impl *blas(void) { return lk_impl_find(LK_OP_LINEAR, "blas", LK_DEVICE_CPU); }

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK && blas() ? 0 : -1;
}

/* f32: sgemm rounding, ~1e-6 of max|ref|; bf16: each output rounded once to bf16
 * (2^-9 of an element), gradients summed in f32 and rounded once per call. */
static double tol_of(lk_dtype dt) { return dt == LK_F32 ? 1e-5 : 1e-2; }

static void expect_case(lk_dtype dt, lk_shape shape, const lk_linear_case *c, uint64_t seed) {
    lk_check_row row;
    lk_linear_errors e;
    assert_int_equal(lk_linear_check_case(blas(), dt, &shape, seed, c, &row, &e), LK_OK);
    double tol = tol_of(dt);
    if (!(e.y <= tol && e.dx <= tol && e.dweight <= tol && e.dbias <= tol))
        print_error("%s %s: y %.3g dx %.3g dW %.3g db %.3g (tol %.1g)\n", row.dtype, row.shape, e.y, e.dx,
                    e.dweight, e.dbias, tol);
    assert_true(e.y <= tol);
    assert_true(e.dx <= tol);
    assert_true(e.dweight <= tol);
    assert_true(e.dbias <= tol);
    assert_true(row.pass);
}

static void test_reference(void **state) {
    (void)state;
    static const lk_shape shapes[] = {
        {3, {1, 1, 1}}, {3, {7, 33, 17}}, {4, {2, 3, 5, 4}}, {3, {64, 100, 48}}, {3, {1, 257, 3}},
    };
    for (int dt = LK_F32; dt <= LK_BF16; dt++)
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            expect_case((lk_dtype)dt, shapes[i], &(lk_linear_case){0}, 10 + i);
            expect_case((lk_dtype)dt, shapes[i], &(lk_linear_case){.no_bias = 1}, 20 + i);
            expect_case((lk_dtype)dt, shapes[i], &(lk_linear_case){.grad_f32 = 1, .no_dx = 1}, 30 + i);
        }
}

/* Two backward calls must add the gradients twice (the reference expects init + 2·grad);
 * dx is written, so it stays one gradient. */
static void test_accumulate(void **state) {
    (void)state;
    for (int dt = LK_F32; dt <= LK_BF16; dt++) {
        expect_case((lk_dtype)dt, (lk_shape){3, {7, 33, 17}}, &(lk_linear_case){.backward_calls = 2}, 40);
        expect_case((lk_dtype)dt, (lk_shape){3, {7, 33, 17}}, &(lk_linear_case){.backward_calls = 2, .grad_f32 = 1}, 41);
    }
}

/* --- a small f32 problem run by hand -------------------------------------------------- */

enum { T = 3, IN = 5, OUT = 4 };

typedef struct {
    float x[T * IN], w[OUT * IN], b[OUT], y[T * OUT], r[T * OUT], dx[T * IN], dw[OUT * IN], db[OUT];
    lk_linear_args a;
    lk_arena arena;
    lk_ctx ctx;
} fixture;

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    lk_rng rng = lk_rng_make(5);
    lk_rng_normal(&rng, f->x, T * IN, 0, 1);
    lk_rng_normal(&rng, f->w, OUT * IN, 0, 1);
    lk_rng_normal(&rng, f->b, OUT, 0, 1);
    lk_rng_normal(&rng, f->r, T * OUT, 0, 1);
    f->a = (lk_linear_args){
        .x = lk_tensor_2d(f->x, LK_F32, T, IN), .weight = lk_tensor_2d(f->w, LK_F32, OUT, IN),
        .bias = lk_tensor_1d(f->b, LK_F32, OUT), .y = lk_tensor_2d(f->y, LK_F32, T, OUT),
        .dy = lk_tensor_2d(f->r, LK_F32, T, OUT), .dx = lk_tensor_2d(f->dx, LK_F32, T, IN),
        .dweight = lk_tensor_2d(f->dw, LK_F32, OUT, IN), .dbias = lk_tensor_1d(f->db, LK_F32, OUT),
    };
    f->ctx = lk_ctx_cpu(&f->arena);
}

/* loss = Σ y·r, in double from the f32 outputs */
static double loss(fixture *f) {
    assert_int_equal(lk_linear_forward(blas(), &f->a, &f->ctx), LK_OK);
    double s = 0.0;
    for (int i = 0; i < T * OUT; i++) s += (double)f->y[i] * f->r[i];
    return s;
}

/* d loss / d p[i] by central differences; loss is linear in each parameter, so only
 * rounding separates it from the analytic gradient. */
static void expect_fd(fixture *f, float *p, int n, const float *grad, const char *what) {
    const float eps = 1e-2f;
    for (int i = 0; i < n; i++) {
        float keep = p[i];
        p[i] = keep + eps;
        double up = loss(f);
        p[i] = keep - eps;
        double down = loss(f);
        p[i] = keep;
        double num = (up - down) / (2.0 * eps);
        if (fabs(num - grad[i]) > 1e-3 * fmax(1.0, fabs(num)))
            print_error("%s[%d]: finite difference %.6g, backward %.6g\n", what, i, num, grad[i]);
        assert_true(fabs(num - grad[i]) <= 1e-3 * fmax(1.0, fabs(num)));   /* f32 rounding / 2eps */
    }
}

static void test_finite_differences(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    loss(&f);
    assert_int_equal(lk_linear_backward(blas(), &f.a, &f.ctx), LK_OK);
    expect_fd(&f, f.x, T * IN, f.dx, "dx");
    expect_fd(&f, f.w, OUT * IN, f.dw, "dweight");
    expect_fd(&f, f.b, OUT, f.db, "dbias");
    lk_arena_free(&f.arena);
}

/* --- bad inputs ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int backward;
    lk_status want;
    const char *arg;        /* what lk_last_error() must name */
} bad_case;

static void mutate(const char *name, lk_linear_args *a, const lk_impl **impl) {
    static const int64_t w_bad[2] = {OUT, IN + 1}, y_bad[2] = {T, OUT + 1}, b_bad[1] = {OUT + 1};
    if (!strcmp(name, "weight_shape")) a->weight = lk_tensor_view(a->weight.data, LK_F32, 2, w_bad);
    else if (!strcmp(name, "weight_dtype")) a->weight.dtype = LK_BF16;
    else if (!strcmp(name, "x_null")) a->x.data = NULL;
    else if (!strcmp(name, "x_dtype")) a->x.dtype = LK_I32;
    else if (!strcmp(name, "x_strided")) a->x.stride[0] = IN + 1;
    else if (!strcmp(name, "y_shape")) a->y = lk_tensor_view(a->y.data, LK_F32, 2, y_bad);
    else if (!strcmp(name, "y_over_x")) a->y.data = a->x.data;
    else if (!strcmp(name, "bias_shape")) a->bias = lk_tensor_view(a->bias.data, LK_F32, 1, b_bad);
    else if (!strcmp(name, "impl_op")) *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CPU);
    else if (!strcmp(name, "dy_shape")) a->dy = lk_tensor_view(a->dy.data, LK_F32, 2, y_bad);
    else if (!strcmp(name, "dweight_dtype")) a->dweight.dtype = LK_F16;
    else if (!strcmp(name, "dbias_no_bias")) a->bias.data = NULL;
    else if (!strcmp(name, "dx_device")) a->dx.device.type = LK_DEVICE_CUDA;
    else if (!strcmp(name, "dx_over_dy")) a->dx.data = a->dy.data;
}

static void test_bad_inputs(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"weight_shape", 0, LK_ESHAPE, "weight"}, {"weight_dtype", 0, LK_EDTYPE, "weight"},
        {"x_null", 0, LK_EINVAL, "x"},            {"x_dtype", 0, LK_EDTYPE, "x"},
        {"x_strided", 0, LK_ESHAPE, "x"},         {"y_shape", 0, LK_ESHAPE, "y"},
        {"y_over_x", 0, LK_EINVAL, "y"},          {"bias_shape", 0, LK_ESHAPE, "bias"},
        {"impl_op", 0, LK_EINVAL, "impl"},        {"impl_op", 1, LK_EINVAL, "impl"},
        {"dy_shape", 1, LK_ESHAPE, "dy"},         {"dweight_dtype", 1, LK_EDTYPE, "dweight"},
        {"dbias_no_bias", 1, LK_EINVAL, "dbias"}, {"dx_device", 1, LK_EDEVICE, "dx"},
        {"dx_over_dy", 1, LK_EINVAL, "dx"},       {"weight_shape", 1, LK_ESHAPE, "weight"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fixture f;
        fixture_init(&f);
        const lk_impl *impl = blas();
        mutate(cases[k].name, &f.a, &impl);
        memset(f.y, 0x5a, sizeof f.y);
        memset(f.dx, 0x5a, sizeof f.dx);
        memset(f.dw, 0x5a, sizeof f.dw);
        memset(f.db, 0x5a, sizeof f.db);
        fixture before = f;
        lk_status s = cases[k].backward ? lk_linear_backward(impl, &f.a, &f.ctx) : lk_linear_forward(impl, &f.a, &f.ctx);
        if (s != cases[k].want || !strstr(lk_last_error(), cases[k].arg))
            print_error("%s: got %s '%s'\n", cases[k].name, lk_status_name(s), lk_last_error());
        assert_int_equal(s, cases[k].want);
        assert_non_null(strstr(lk_last_error(), cases[k].arg));
        assert_memory_equal(f.y, before.y, sizeof f.y);
        assert_memory_equal(f.dx, before.dx, sizeof f.dx);
        assert_memory_equal(f.dw, before.dw, sizeof f.dw);
        assert_memory_equal(f.db, before.db, sizeof f.db);
        lk_arena_free(&f.arena);
    }
    /* saved bytes: linear keeps nothing */
    lk_tensor x = lk_tensor_2d(NULL, LK_F32, T, IN), w = lk_tensor_2d(NULL, LK_F32, OUT, IN);
    size_t bytes = 1;
    assert_int_equal(lk_linear_saved_bytes(blas(), &x, &w, &bytes), LK_OK);
    assert_int_equal(bytes, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
