/* test_gemm_wide.c — the chunked LM head's GEMMs that read W in place (src/ops/gemm_wide.c)
 * against a float64 reference: odd m, n and k (tile edges on every side), leading dims
 * longer than the rows, C poisoned with NaN before the call and its padding columns
 * checked untouched after it, fresh random inputs each case.
 * Run: ./build/test_gemm_wide */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/gemm.h"

static uint64_t rng = 88172645463325252ull;

static float uniform(void) {                      /* xorshift64, in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

static float *random_matrix(int64_t rows, int64_t ld) {
    float *a = malloc(sizeof(float) * (size_t)(rows * ld + 1));
    for (int64_t i = 0; i < rows * ld; i++) a[i] = uniform();
    return a;
}

/* f32: k products of |x| <= 1 summed in f32; the sum's rounding is ~sqrt(k)·2^-24 of its
 * terms' magnitude: measured <= 1.2e-6 of max|ref| at these shapes; 2e-5 keeps a margin and still
 * fails a lost or doubled term (>= 1e-3). */
#define TOL 2e-5

/* C[m, n] (ldc) against ref[m, n]; columns n .. ldc must still hold the poison. */
static void expect_close(const float *c, int64_t ldc, const double *ref, int64_t m, int64_t n, int64_t k) {
    double worst = 0, big = 1e-30;
    for (int64_t i = 0; i < m * n; i++) big = fmax(big, fabs(ref[i]));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double e = fabs((double)c[i * ldc + j] - ref[i * n + j]);
            worst = isnan(c[i * ldc + j]) ? INFINITY : fmax(worst, e);
        }
        for (int64_t j = n; j < ldc; j++) assert_true(isnan(c[i * ldc + j]));   /* untouched */
    }
    if (!(worst / big <= TOL)) print_error("m %lld n %lld k %lld: rel err %.3g (tol %.1g)\n", (long long)m,
                                              (long long)n, (long long)k, worst / big, TOL);
    assert_true(worst / big <= TOL);
}

static float *poisoned(int64_t rows, int64_t ld) {
    float *c = malloc(sizeof(float) * (size_t)(rows * ld + 1));
    for (int64_t i = 0; i < rows * ld; i++) c[i] = NAN;
    return c;
}

/* logits: C[m, n] = X[m, k] · W[n, k]ᵀ */
static void check_xwt(int64_t m, int64_t n, int64_t k, int64_t pad) {
    int64_t ldx = k + pad, ldw = k + 2 * pad, ldc = n + pad;
    float *x = random_matrix(m, ldx), *w = random_matrix(n, ldw), *c = poisoned(m, ldc);
    float *scratch = aligned_alloc(64, (lk_gemm_wide_scratch_bytes(m, k) + 64) / 64 * 64);
    double *ref = calloc((size_t)(m * n), sizeof(double));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t q = 0; q < k; q++) ref[i * n + j] += (double)x[i * ldx + q] * w[j * ldw + q];
    lk_gemm_wide_xwt(m, n, k, x, ldx, w, ldw, c, ldc, scratch);
    expect_close(c, ldc, ref, m, n, k);
    free(x), free(w), free(c), free(scratch), free(ref);
}

/* d_hidden: C[m, n] = G[m, k] · W[k, n] */
static void check_gw(int64_t m, int64_t n, int64_t k, int64_t pad) {
    int64_t ldg = k + pad, ldw = n + 2 * pad, ldc = n + pad;
    float *g = random_matrix(m, ldg), *w = random_matrix(k, ldw), *c = poisoned(m, ldc);
    double *ref = calloc((size_t)(m * n), sizeof(double));
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < k; q++)
            for (int64_t j = 0; j < n; j++) ref[i * n + j] += (double)g[i * ldg + q] * w[q * ldw + j];
    lk_gemm_wide_gw(m, n, k, g, ldg, w, ldw, c, ldc);
    expect_close(c, ldc, ref, m, n, k);
    free(g), free(w), free(c), free(ref);
}

/* m crosses the 48-token and 6-token tiles, n the 8-row and 64-column tiles and the
 * 64-row block, k the 256-row block of gw. */
static const int64_t shapes[][3] = {
    {1, 1, 1}, {5, 7, 3}, {47, 65, 17}, {49, 130, 64}, {97, 1001, 33}, {6, 9, 300}, {50, 129, 513},
};

static void test_xwt(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        check_xwt(shapes[i][0], shapes[i][1], shapes[i][2], 0);
        check_xwt(shapes[i][0], shapes[i][1], shapes[i][2], 3);
    }
}

static void test_gw(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        check_gw(shapes[i][0], shapes[i][1], shapes[i][2], 0);
        check_gw(shapes[i][0], shapes[i][1], shapes[i][2], 5);
    }
}

/* An empty sum (k = 0) writes zeros; an empty C writes nothing. */
static void test_empty(void **state) {
    (void)state;
    float c[6], x[1] = {1}, w[1] = {1}, s[64] __attribute__((aligned(64)));
    for (int i = 0; i < 6; i++) c[i] = NAN;
    lk_gemm_wide_xwt(2, 3, 0, x, 1, w, 1, c, 3, s);
    for (int i = 0; i < 6; i++) assert_true(c[i] == 0.0f);
    for (int i = 0; i < 6; i++) c[i] = NAN;
    lk_gemm_wide_gw(3, 2, 0, x, 1, w, 2, c, 2);
    for (int i = 0; i < 6; i++) assert_true(c[i] == 0.0f);
    for (int i = 0; i < 6; i++) c[i] = NAN;
    lk_gemm_wide_xwt(0, 3, 4, x, 4, w, 4, c, 3, s);
    lk_gemm_wide_gw(2, 0, 4, x, 4, w, 1, c, 1);
    for (int i = 0; i < 6; i++) assert_true(isnan(c[i]));
}

/* Where the wide GEMMs are used: chunks of 1 .. 1024 rows, hidden sizes from 256, with
 * AVX-512. */
static void test_wins(void **state) {
    (void)state;
    assert_false(lk_gemm_wide_wins(0, 1024));
    assert_false(lk_gemm_wide_wins(4096, 1024));
    assert_false(lk_gemm_wide_wins(373, 64));
#if defined(__AVX512F__)
    assert_true(lk_gemm_wide_wins(1, 256) && lk_gemm_wide_wins(373, 1024) && lk_gemm_wide_wins(1024, 4096));
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xwt),
        cmocka_unit_test(test_gw),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
