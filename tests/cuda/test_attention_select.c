/* test_attention_select.c (GPU) — which attention row the registry binds on a GPU: with
 * nothing named, the built-in default for the probed device (flash_attention_3 from
 * sm_90, flash_attention_2 from sm_80), its source saying so, under the SP-aware name;
 * where that row is not in this build, the GPU's next default, with the fallback
 * recorded; a name given explicitly binds exactly that row or is an error naming why.
 * Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include "cuda_util.h"

static lk_binding select_gpu(const char *name) {
    lk_request r = {.op = LK_OP_ATTENTION, .device = LK_DEVICE_CUDA, .name = name, .source = LK_SOURCE_CONFIG};
    lk_binding b;
    assert_int_equal(lk_select(&r, LK_STAGE_CONFIG_FINALIZE, &b), LK_OK);
    return b;
}

static void default_follows_the_gpu(void **state) {
    (void)state;
    const lk_hw *hw = lk_hw_get();
    lk_binding b = select_gpu(NULL);
    const char *want = hw->cuda_cc >= 90 ? "flash_attention_3" : "flash_attention_2";
    char sm[32];
    snprintf(sm, sizeof sm, "sm_%d", hw->cuda_cc);
    print_message("  sm_%d: requested %s (%s), bound %s, fallback '%s'\n", hw->cuda_cc, b.requested,
                  b.source_detail, b.impl ? b.impl->name : "-", b.fallback);
    assert_int_equal(b.source, LK_SOURCE_DEFAULT);
    assert_string_equal(b.requested, want);
    assert_non_null(strstr(b.source_detail, sm));
    assert_non_null(b.impl);
    assert_int_equal(b.impl->device, LK_DEVICE_CUDA);
    assert_true(b.impl->needs.sp_aware);   /* the llmkern backend's SP rewrite applies */
    char sp[96];
    snprintf(sp, sizeof sp, "llmkern_%s_with_sp", want);
    const lk_impl *asked = lk_impl_find(LK_OP_ATTENTION, sp, LK_DEVICE_CUDA);
    if (asked) {
        assert_ptr_equal(b.impl, asked);
        assert_string_equal(b.fallback, "");
    } else {   /* not in this build yet: the next GPU default, said */
        assert_string_equal(b.impl->name, "llmkern_flash_attention_2_with_sp");
        assert_non_null(strstr(b.fallback, want));
    }
}

static void explicit_names_bind_exactly(void **state) {
    (void)state;
    const char *names[] = {"flash_attention_2", "sdpa", "cudnn", "flash_attention_3"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char sp[96];
        snprintf(sp, sizeof sp, "llmkern_%s_with_sp", names[i]);
        const lk_impl *row = lk_impl_find(LK_OP_ATTENTION, names[i], LK_DEVICE_CUDA);
        const lk_impl *sp_row = lk_impl_find(LK_OP_ATTENTION, sp, LK_DEVICE_CUDA);
        lk_request r = {.op = LK_OP_ATTENTION, .device = LK_DEVICE_CUDA, .name = names[i],
                        .source = LK_SOURCE_CONFIG};
        lk_binding b;
        lk_status s = lk_select(&r, LK_STAGE_CONFIG_FINALIZE, &b);
        print_message("  %s: %s\n", names[i], s ? lk_last_error() : b.impl->name);
        if (!row && !sp_row) {   /* not in this build: an error naming it, never another kernel */
            assert_int_equal(s, LK_EUNAVAILABLE);
            assert_non_null(strstr(lk_last_error(), names[i]));
            continue;
        }
        assert_int_equal(s, LK_OK);
        assert_string_equal(b.fallback, "");
        /* the row itself, or its SP-aware twin under the llmkern backend */
        assert_true(b.impl == row || (sp_row && b.impl == sp_row));
    }
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_attention_select")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(default_follows_the_gpu),
        cmocka_unit_test(explicit_names_bind_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
