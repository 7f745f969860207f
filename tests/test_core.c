/* test_core.c — dtypes (bf16 and f16 edge cases), tensors, the arena, the counter-based
 * generator and the thread-local error. Run: ctest -R test_core, or ./build/test_core. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "core/checked.h"

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void bf16_rounds_to_nearest_even(void **state) {
    (void)state;
    assert_int_equal(lk_f32_to_bf16(1.0f), 0x3f80);
    /* exactly half-way between 0x3f80 and 0x3f81: ties go to the even 0x3f80 */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
    /* half-way between 0x3f81 and 0x3f82: even is 0x3f82 */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
    /* just above half-way rounds up */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
    /* just below rounds down */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
    /* negative values round on magnitude */
    assert_int_equal(lk_f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);
    /* the largest finite f32 rounds up to infinity, as round-to-nearest-even must */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);
    assert_int_equal(lk_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(lk_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(lk_f32_to_bf16(0.0f), 0x0000);
    assert_int_equal(lk_f32_to_bf16(-0.0f), 0x8000);
    /* subnormals keep their top bits */
    assert_int_equal(lk_f32_to_bf16(from_bits(0x00010000u)), 0x0001);
}

static void bf16_keeps_nan_a_nan(void **state) {
    (void)state;
    /* a NaN whose payload sits only in the low bits would become infinity if truncated */
    uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t h = lk_f32_to_bf16(from_bits(nans[i]));
        assert_true(isnan(lk_bf16_to_f32(h)));
        assert_int_equal(h & 0x8000, (nans[i] >> 16) & 0x8000);   /* sign kept */
    }
}

static void bf16_round_trip_is_exact_for_bf16_values(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = lk_bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(lk_f32_to_bf16(f), h);
    }
}

static void f16_edge_cases(void **state) {
    (void)state;
    assert_int_equal(lk_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(lk_f32_to_f16(65504.0f), 0x7bff);          /* largest finite */
    assert_int_equal(lk_f32_to_f16(65520.0f), 0x7c00);          /* rounds to inf */
    assert_int_equal(lk_f32_to_f16(from_bits(0x33000000u)), 0x0000);  /* 2^-25, half the smallest: tie to even 0 */
    assert_int_equal(lk_f32_to_f16(from_bits(0x33000001u)), 0x0001);  /* just above: the smallest subnormal */
    assert_true(isnan(lk_f16_to_f32(lk_f32_to_f16(NAN))));
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = lk_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(lk_f32_to_f16(f), h);
    }
}

static void tensor_views_and_shapes(void **state) {
    (void)state;
    float buf[24];
    int64_t shape[3] = {2, 3, 4};
    lk_tensor t = lk_tensor_view(buf, LK_F32, 3, shape);
    assert_int_equal(lk_tensor_numel(&t), 24);
    assert_int_equal(lk_tensor_bytes(&t), 96);
    assert_int_equal(t.stride[0], 12);
    assert_true(lk_tensor_is_contiguous(&t));
    t.stride[2] = 2;
    assert_false(lk_tensor_is_contiguous(&t));
    char s[32];
    assert_string_equal(lk_shape_str(&t, s, sizeof s), "[2, 3, 4]");
    lk_dtype dt;
    assert_int_equal(lk_dtype_parse("bfloat16", &dt), LK_OK);
    assert_int_equal(dt, LK_BF16);
    assert_int_equal(lk_dtype_parse("f8", &dt), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "f8"));
}

static void arena_aligns_tracks_peak_and_refuses_overflow(void **state) {
    (void)state;
    lk_arena a = {0};
    assert_int_equal(lk_arena_reserve(&a, 1000), LK_OK);
    void *p = lk_arena_alloc(&a, 10);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % LK_ARENA_ALIGN, 0);
    size_t mark = a.used;
    assert_non_null(lk_arena_alloc(&a, 900));
    assert_null(lk_arena_alloc(&a, 4096));                 /* past the reservation */
    size_t peak = a.peak;
    lk_arena_release(&a, mark);
    assert_int_equal(a.used, mark);
    assert_int_equal(a.peak, peak);
    /* growing while pieces are handed out would move them: refused with a message */
    assert_int_equal(lk_arena_reserve(&a, 1 << 20), LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "arena"));
    lk_arena_release(&a, 0);
    assert_int_equal(lk_arena_reserve(&a, 1 << 20), LK_OK);
    lk_arena_free(&a);
}

/* A caller's allocator (python/llmkern's torch one): every block comes from it and goes
 * back to it, growing frees the old block, NULL and misaligned memory are refused. */
typedef struct { int allocs, frees; size_t last; int misalign, fail; void *raw[4]; } test_alloc;

static void *test_alloc_fn(void *user, size_t bytes, int device) {
    test_alloc *t = user;
    assert_int_equal(device, LK_DEVICE_CPU);
    if (t->fail) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, LK_ARENA_ALIGN, bytes + LK_ARENA_ALIGN) != 0) return NULL;
    t->raw[t->allocs % 4] = p;
    t->allocs++, t->last = bytes;
    return (unsigned char *)p + (t->misalign ? 8 : 0);
}

static void test_free_fn(void *user, void *ptr, int device) {
    test_alloc *t = user;
    (void)device;
    t->frees++;
    free((void *)((uintptr_t)ptr & ~(uintptr_t)(LK_ARENA_ALIGN - 1)));
}

static void arena_takes_the_callers_allocator(void **state) {
    (void)state;
    test_alloc t = {0};
    lk_allocator al = {test_alloc_fn, test_free_fn, &t};
    lk_arena a = {.allocator = &al};
    assert_int_equal(lk_arena_reserve(&a, 1000), LK_OK);
    assert_int_equal(t.allocs, 1);
    assert_true(t.last >= 1000);
    assert_non_null(lk_arena_alloc(&a, 1000));
    lk_arena_release(&a, 0);
    assert_int_equal(lk_arena_reserve(&a, 500), LK_OK);     /* fits: no second block */
    assert_int_equal(t.allocs, 1);
    assert_int_equal(lk_arena_reserve(&a, 5000), LK_OK);    /* grows: the old block goes back */
    assert_int_equal(t.allocs, 2);
    assert_int_equal(t.frees, 1);
    lk_arena_free(&a);
    assert_int_equal(t.frees, 2);
    assert_ptr_equal(a.allocator, &al);                     /* kept for the next use */
    t.fail = 1;
    assert_int_equal(lk_arena_reserve(&a, 100), LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "allocator returned NULL"));
    t.fail = 0, t.misalign = 1;
    assert_int_equal(lk_arena_reserve(&a, 100), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "aligned"));
    assert_int_equal(t.allocs, t.frees);                    /* the misaligned block went back */
    assert_null(a.base);
    lk_allocator half = {test_alloc_fn, NULL, &t};
    a.allocator = &half;
    assert_int_equal(lk_arena_reserve(&a, 100), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "free NULL"));
}

static void rng_is_the_same_whatever_the_thread_count(void **state) {
    (void)state;
    enum { N = 300007 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    int threads = omp_get_max_threads();
    lk_rng r1 = lk_rng_make(42), r2 = lk_rng_make(42);
    omp_set_num_threads(1);
    lk_rng_normal(&r1, a, N, 0, 1);
    omp_set_num_threads(threads > 1 ? threads : 2);
    lk_rng_normal(&r2, b, N, 0, 1);
    omp_set_num_threads(threads);
    assert_memory_equal(a, b, N * sizeof(float));
    assert_int_equal(r1.offset, r2.offset);
    /* the stream goes on: a second fill differs from the first */
    lk_rng_normal(&r1, b, N, 0, 1);
    assert_true(memcmp(a, b, N * sizeof(float)) != 0);
    /* moments of a normal: mean ~0, variance ~1 (5 standard errors) */
    double m = 0, v = 0;
    for (int i = 0; i < N; i++) m += a[i];
    m /= N;
    for (int i = 0; i < N; i++) v += (a[i] - m) * (a[i] - m);
    v /= N;
    assert_true(fabs(m) < 5.0 / sqrt(N));
    assert_true(fabs(v - 1.0) < 5.0 * sqrt(2.0 / N));
    lk_rng u = lk_rng_make(3);
    lk_rng_uniform(&u, a, N, -2, 3);
    for (int i = 0; i < N; i++) assert_true(a[i] >= -2.0f && a[i] < 3.0f);
    free(a);
    free(b);
}

static void errors_are_per_thread(void **state) {
    (void)state;
    lk_error(LK_ESHAPE, "main thread error");
    #pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) lk_error(LK_EINVAL, "worker error");
    }
    assert_string_equal(lk_last_error(), "main thread error");
    assert_string_equal(lk_status_name(LK_EUNAVAILABLE), "LK_EUNAVAILABLE");
}

/* core/checked.h: products of user sizes that do not fit are LK_EINVAL naming them,
 * and nothing is written to the output (issue 20). */
static void checked_sizes_refuse_what_wraps(void **state) {
    (void)state;
    int64_t out = 7;
    size_t bytes = 7;
    assert_int_equal(lk_checked_mul("t: steps", 3689348814741910324LL, 5, &out), LK_EINVAL);
    assert_string_equal(lk_last_error(), "t: steps: 3689348814741910324 x 5 does not fit in 64 bits");
    assert_int_equal(out, 7);
    assert_int_equal(lk_checked_mul("t", -1, 5, &out), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "non-negative"));
    assert_int_equal(lk_checked_mul("t", INT64_MAX, 1, &out), LK_OK);
    assert_true(out == INT64_MAX);
    assert_int_equal(lk_checked_mul("t", 0, INT64_MAX, &out), LK_OK);
    assert_true(out == 0);
    int64_t f[4] = {(int64_t)1 << 32, (int64_t)1 << 32, 1, 1};
    assert_int_equal(lk_checked_prod("mask: B x H x nq x nk", f, 4, &out), LK_EINVAL);
    assert_string_equal(lk_last_error(), "mask: B x H x nq x nk: 4294967296 x 4294967296 x 1 x 1 does not fit in 64 bits");
    assert_int_equal(lk_checked_prod("empty", f, 0, &out), LK_OK);
    assert_true(out == 1);
    assert_int_equal(lk_checked_add("t", INT64_MAX, 1, &out), LK_EINVAL);
    assert_int_equal(lk_checked_add("t", 2, 3, &out), LK_OK);
    assert_true(out == 5);
    assert_int_equal(lk_checked_bytes("t: buf", (int64_t)1 << 62, 4, &bytes), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "t: buf: 4611686018427387904 x 4 bytes does not fit"));
    assert_true(bytes == 7);
    assert_int_equal(lk_checked_bytes("t", 1000, 8, &bytes), LK_OK);
    assert_true(bytes == 8000);
    assert_int_equal(lk_check_fits_memory("t: huge", (uint64_t)1 << 62), LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "t: huge: needs 4.0 EiB, more than this machine's"));
    assert_int_equal(lk_check_fits_memory("t: small", 4096), LK_OK);
    assert_true(lk_hw_get()->cpu_mem_bytes > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(bf16_keeps_nan_a_nan),
        cmocka_unit_test(bf16_round_trip_is_exact_for_bf16_values),
        cmocka_unit_test(f16_edge_cases),
        cmocka_unit_test(tensor_views_and_shapes),
        cmocka_unit_test(arena_aligns_tracks_peak_and_refuses_overflow),
        cmocka_unit_test(arena_takes_the_callers_allocator),
        cmocka_unit_test(rng_is_the_same_whatever_the_thread_count),
        cmocka_unit_test(errors_are_per_thread),
        cmocka_unit_test(checked_sizes_refuse_what_wraps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
