/* test_check.c (GPU) — `llmkern check` on the GPU, through the harness API: every CUDA row
 * this machine runs, of every op with a harness, on each of its harness's check shapes in
 * every dtype both take (f32, bf16), moved to the device by ops/harness.c's lk_place_*
 * and held against the float64 reference with the tolerance of the op's check.h (a check
 * the row refuses as LK_EUNAVAILABLE, valid but not runnable here, is printed and passed
 * over, as `llmkern check` does). The
 * same comparisons as the CPU rows', so the cases and tolerances live once, beside the
 * op; the GPU tests of each op (test_<op>.c) keep what the harness does not cover
 * (kernel paths, unaligned views, refusals). Then the moves themselves: an in-place pair
 * shares one copy, an output comes back, a buffer overlapping another is refused.
 * Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "cuda_util.h"
#include "ops/harness.h"

static void every_cuda_row(void **state) {
    (void)state;
    int rows = 0, impls = 0;
    for (int i = 0; i < lk_impl_count(); i++) {
        const lk_impl *impl = lk_impl_at(i);
        const lk_harness *h = lk_harness_get(impl->op);
        char why[160];
        if (impl->device != LK_DEVICE_CUDA || !h) continue;
        if (!lk_impl_available(impl, lk_hw_get(), why, sizeof why)) {
            print_message("  %-12s %-34s not run here: %s\n", lk_op_info_get(impl->op)->name, impl->name, why);
            continue;
        }
        impls++;
        for (int dt = 0; dt < LK_DTYPE_COUNT; dt++) {
            if (!lk_harness_runs(h, impl, (lk_dtype)dt)) continue;
            for (int k = 0; k < h->n_check_shapes; k++) {
                lk_check_row r;
                char shape[64];
                lk_shape_format(&h->check_shapes[k], shape, sizeof shape);
                lk_status s = h->check(impl, (lk_dtype)dt, &h->check_shapes[k], 1234u + (unsigned)k, &r);
                if (s == LK_EUNAVAILABLE) {     /* as llmkern check: said, not failed */
                    print_message("  %-12s %-34s %-4s %-40s not run here: %s\n", lk_op_info_get(impl->op)->name,
                                  impl->name, lk_dtype_name((lk_dtype)dt), shape, lk_last_error());
                    continue;
                }
                if (s) print_message("  %s %s %s: %s\n", impl->name, lk_dtype_name((lk_dtype)dt), shape, lk_last_error());
                assert_int_equal(s, LK_OK);
                print_message("  %-12s %-34s %-4s %-40s %.3e (tol %.1e) %s\n", r.op, r.impl, r.dtype, r.shape,
                              r.max_rel_err, r.tol, r.pass ? "pass" : "FAIL");
                assert_true(r.pass);
                rows++;
            }
        }
    }
    print_message("  %d CUDA implementations, %d checks\n", impls, rows);
    assert_true(impls > 0 && rows > 0);
}

/* The moves: inputs go over, outputs come back, dx over dy is one copy on the device, a
 * buffer that overlaps another without lying inside it is refused and stops the rest. */
static void moves(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    float buf[16], other[4] = {1, 2, 3, 4};
    for (int i = 0; i < 16; i++) buf[i] = (float)i;
    lk_tensor whole = lk_tensor_1d(buf, LK_F32, 16), half = lk_tensor_1d(buf + 8, LK_F32, 8),
              none = lk_tensor_1d(NULL, LK_F32, 4), o = lk_tensor_1d(other, LK_F32, 4);
    lk_placement pl;
    assert_int_equal(lk_place_begin(&pl, "test", impl), LK_OK);
    lk_place_tensor(&pl, "whole", &whole, 1);
    lk_place_tensor(&pl, "half", &half, 0);
    lk_place_tensor(&pl, "none", &none, 0);
    lk_place_tensor(&pl, "other", &o, 0);
    assert_int_equal(pl.status, LK_OK);
    assert_int_equal(pl.n, 2);
    assert_true(whole.device.type == LK_DEVICE_CUDA && half.device.type == LK_DEVICE_CUDA &&
                none.device.type == LK_DEVICE_CUDA && none.data == NULL);
    assert_ptr_equal((char *)half.data, (char *)whole.data + 8 * sizeof(float));
    double got[4];
    lkt_download(o.data, 4, LK_F32, got);
    for (int i = 0; i < 4; i++) assert_true(got[i] == other[i]);
    lkt_poison(whole.data, sizeof buf);                 /* "the kernel" writes NaN everywhere */
    memset(other, 0, sizeof other);
    assert_int_equal(lk_place_fetch(&pl), LK_OK);
    for (int i = 0; i < 16; i++) assert_true(isnan(buf[i]));
    for (int i = 0; i < 4; i++) assert_true(other[i] == 0.0f);  /* an input is not copied back */
    lk_tensor across = lk_tensor_1d(buf + 12, LK_F32, 8);       /* past whole's end: refused */
    float spare[8];
    lk_tensor later = lk_tensor_1d(spare, LK_F32, 8);
    void *host = across.data;
    lk_place_tensor(&pl, "across", &across, 0);
    assert_int_equal(pl.status, LK_EINTERNAL);
    assert_non_null(strstr(lk_last_error(), "across"));
    assert_ptr_equal(across.data, host);
    lk_place_tensor(&pl, "later", &later, 0);                   /* nothing after a failure */
    assert_ptr_equal(later.data, spare);
    assert_int_equal(lk_place_fetch(&pl), LK_EINTERNAL);
    lk_place_end(&pl);
    assert_int_equal(pl.n, 0);

    /* a CPU row: nothing moves, the context is the CPU's */
    const lk_impl *cpu = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CPU);
    lk_tensor t = lk_tensor_1d(buf, LK_F32, 16);
    lk_arena arena = {0};
    assert_int_equal(lk_place_begin(&pl, "test", cpu), LK_OK);
    lk_place_tensor(&pl, "t", &t, 1);
    assert_ptr_equal(t.data, buf);
    assert_true(lk_place_ctx(&pl, &arena).device.type == LK_DEVICE_CPU);
    assert_int_equal(lk_place_fetch(&pl), LK_OK);
    lk_place_end(&pl);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_check")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(moves),
        cmocka_unit_test(every_cuda_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
