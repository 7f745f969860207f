/* test_linear.c (GPU) — linear `cublaslt` against the float64 reference: forward with and
 * without bias, backward dx (written), dweight and dbias accumulated into f32 or bf16
 * buffers that already hold values, f32 and bf16, odd shapes (unaligned rows, 1-row and
 * 1-column cases), outputs poisoned with NaN first; the plan cache (a repeat call hits),
 * the same under LLMKERN_GEMM_TUNE (each fresh shape's offers timed in its own output, or
 * on a scratch copy where it accumulates: the gradients still exact) and refused arguments.
 * Tolerances: f32 1e-5 (exact f32 GEMMs, no TF32, sums of <= 300 terms); bf16 1e-2: y, dx
 * and a bf16 dweight are each rounded once to bf16 (2^-9 of an element, ~4e-3 of the
 * largest), sums in f32. Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_util.h"
#include "core/cublaslt_util.h"
#include "ops/linear/check.h"
#include "llmkern/config.h"
#include "ops/linear/reference.h"

typedef struct {
    int64_t t, in, out;
    int bias, grad_f32;
} lcase;

static void run_case(lk_dtype dt, const lcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_LINEAR, "cublaslt", LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t T = c->t, I = c->in, O = c->out, sx[2] = {T, I}, sy[2] = {T, O}, sw[2] = {O, I};
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    double *x = lkt_alloc(T * I), *w = lkt_alloc(O * I), *b = lkt_alloc(O), *dy = lkt_alloc(T * O);
    double *gw = lkt_alloc(O * I), *gb = lkt_alloc(O);
    lkt_randn(x, T * I, &seed, 1.0), lkt_randn(w, O * I, &seed, 1.0 / sqrt((double)I));
    lkt_randn(b, O, &seed, 1.0), lkt_randn(dy, T * O, &seed, 1.0);
    lkt_randn(gw, O * I, &seed, 1.0), lkt_randn(gb, O, &seed, 1.0);   /* what the gradients hold before */
    void *dx_ = lkt_upload(x, T * I, dt), *dw_ = lkt_upload(w, O * I, dt), *db_ = lkt_upload(b, O, dt);
    void *ddy = lkt_upload(dy, T * O, dt), *dgw = lkt_upload(gw, O * I, gdt), *dgb = lkt_upload(gb, O, gdt);
    size_t es = lk_dtype_size(dt);
    void *y = lkt_dev(T * O * es), *gx = lkt_dev(T * I * es);
    lkt_poison(y, T * O * es), lkt_poison(gx, T * I * es);
    lk_linear_args a = {
        .x = lkt_view(dx_, dt, 2, sx), .weight = lkt_view(dw_, dt, 2, sw),
        .bias = lkt_view(c->bias ? db_ : NULL, dt, 1, &O), .y = lkt_view(y, dt, 2, sy), .dy = lkt_view(ddy, dt, 2, sy),
        .dx = lkt_view(gx, dt, 2, sx), .dweight = lkt_view(dgw, gdt, 2, sw),
        .dbias = lkt_view(c->bias ? dgb : NULL, gdt, 1, &O),
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_linear_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_linear_backward(impl, &a, &ctx), LK_OK);

    double *ry = lkt_alloc(T * O), *rdx = lkt_alloc(T * I), *got = lkt_alloc(T * (I > O ? I : O) + O * I), e[4] = {0};
    lk_linear_ref_forward(x, w, c->bias ? b : NULL, T, I, O, ry);
    lk_linear_ref_backward(x, w, dy, T, I, O, rdx, gw, c->bias ? gb : NULL);
    lkt_download(y, T * O, dt, got), e[0] = lkt_rel_err(got, ry, T * O);
    lkt_download(gx, T * I, dt, got), e[1] = lkt_rel_err(got, rdx, T * I);
    lkt_download(dgw, O * I, gdt, got), e[2] = lkt_rel_err(got, gw, O * I);
    if (c->bias) lkt_download(dgb, O, gdt, got), e[3] = lkt_rel_err(got, gb, O);
    print_message("  %-4s T %lld I %lld O %lld bias %d grads %s: y %.2e dx %.2e dW %.2e db %.2e\n", lk_dtype_name(dt),
                  (long long)T, (long long)I, (long long)O, c->bias, lk_dtype_name(gdt), e[0], e[1], e[2], e[3]);
    double tol = lk_linear_tol(impl, dt);     /* the CPU harness's (check.h) */
    for (int i = 0; i < 4; i++) assert_true(e[i] <= tol);

    /* the same shapes again: every plan comes from the cache */
    int64_t h0, m0, h1, m1;
    lk_lt_cache_stats(0, &h0, &m0, NULL);
    assert_int_equal(lk_linear_forward(impl, &a, &ctx), LK_OK);
    lk_lt_cache_stats(0, &h1, &m1, NULL);
    assert_int_equal(m1, m0);
    assert_int_equal(h1, h0 + 1);
    lk_arena_free(&arena);
    lkt_free_all();
}

static void every_dtype_shape(void **state) {
    (void)state;
    const lcase cases[] = {{37, 64, 96, 1, 1}, {128, 256, 512, 0, 0}, {19, 40, 24, 1, 0},
                           {5, 33, 7, 1, 1},   {1, 16, 1, 1, 0},     {300, 128, 130, 0, 1}};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 3u + (uint32_t)i);
}

/* LLMKERN_GEMM_TUNE=1: fresh shapes (none of every_dtype_shape's) are timed, each once, and
 * still give the reference's values: an accumulating GEMM's offers ran on a scratch copy of C,
 * not on the gradients it adds into; an overwriting one's in its own C, which the call then
 * writes again. */
static void tuned_plans(void **state) {
    (void)state;
    assert_int_equal(setenv("LLMKERN_GEMM_TUNE", "1", 1), 0);
    assert_int_equal(lk_env_reload(), LK_OK);
    const lcase cases[] = {{41, 72, 88, 1, 1}, {256, 512, 384, 0, 0}, {3, 24, 40, 0, 1}};
    int64_t h, m, t0, t1;
    lk_lt_cache_stats(0, &h, &m, &t0);
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 11u + (uint32_t)i);
    lk_lt_cache_stats(0, &h, &m, &t1);
    print_message("  tuned shapes: %lld\n", (long long)(t1 - t0));
    assert_true(t1 > t0);   /* shapes with one offer are not timed: not every one */
    assert_int_equal(unsetenv("LLMKERN_GEMM_TUNE"), 0);
    assert_int_equal(lk_env_reload(), LK_OK);
}

/* Wrong dtype and a CPU tensor are refused, naming the argument, with y untouched. */
static void refused(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_LINEAR, "cublaslt", LK_DEVICE_CUDA);
    int64_t sx[2] = {4, 8}, sw[2] = {6, 8}, sy[2] = {4, 6};
    void *x = lkt_dev(64 * 4), *w = lkt_dev(64 * 4), *y = lkt_dev(64 * 4);
    lkt_poison(y, 24 * 4);
    lk_linear_args a = {.x = lkt_view(x, LK_F32, 2, sx), .weight = lkt_view(w, LK_BF16, 2, sw),
                        .y = lkt_view(y, LK_F32, 2, sy)};
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_linear_forward(impl, &a, &ctx), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "weight"));
    a.weight = lkt_view(w, LK_F32, 2, sw);
    a.y.device.type = LK_DEVICE_CPU;
    assert_int_equal(lk_linear_forward(impl, &a, &ctx), LK_EDEVICE);
    assert_non_null(strstr(lk_last_error(), "y"));
    double *got = lkt_alloc(24);
    lkt_download(y, 24, LK_F32, got);
    for (int i = 0; i < 24; i++) assert_true(isnan(got[i]));
    lk_arena_free(&arena);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_linear")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_shape),
        cmocka_unit_test(tuned_plans),
        cmocka_unit_test(refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
