/* test_config.c — YAML configuration: fields and per-module overrides load with their
 * file:line:column; malformed YAML, unknown keys, unknown implementations and wrong
 * types are errors that name file:line:column and the field, and change nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"

static char path[64];

static const char *write_yaml(const char *text) {
    snprintf(path, sizeof path, "/tmp/llmkern_test_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void loads_fields_and_overrides(void **state) {
    (void)state;
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    const char *p = write_yaml(
        "# a comment\n"
        "model:\n"
        "  ops_implementation:\n"
        "    rms_norm_implementation: eager_fp32\n"
        "    attn_implementation: flash_attention_2\n"
        "    overrides:\n"
        "      \"layers.0.input_layernorm\": { rms_norm_implementation: fused }\n"
        "      layers.1.post_attention_layernorm:\n"
        "        rms_norm_implementation: eager\n"
        "  moe:\n"
        "    router: fake_balanced\n");
    assert_int_equal(lk_config_load_yaml(p, &cfg), LK_OK);
    assert_string_equal(cfg.field[LK_OP_RMS_NORM].value, "eager_fp32");
    char want[128];
    snprintf(want, sizeof want, "%s:4:30", p);
    assert_string_equal(cfg.field[LK_OP_RMS_NORM].where, want);
    assert_string_equal(cfg.field[LK_OP_ATTENTION].value, "flash_attention_2");
    assert_string_equal(cfg.field[LK_OP_MOE_ROUTER].value, "fake_balanced");
    assert_int_equal(cfg.n_overrides, 2);
    assert_string_equal(cfg.overrides[0].module, "layers.0.input_layernorm");
    assert_string_equal(cfg.overrides[0].v.value, "fused");
    snprintf(want, sizeof want, "%s:7:62", p);
    assert_string_equal(cfg.overrides[0].v.where, want);
    assert_string_equal(cfg.overrides[1].module, "layers.1.post_attention_layernorm");
    assert_int_equal(cfg.overrides[1].op, LK_OP_RMS_NORM);
    unlink(p);

    /* an empty file is an empty config */
    p = write_yaml("");
    lk_ops_config empty;
    lk_ops_config_init(&empty);
    assert_int_equal(lk_config_load_yaml(p, &empty), LK_OK);
    assert_int_equal(empty.n_overrides, 0);
    unlink(p);
}

typedef struct {
    const char *yaml;
    lk_status status;
    const char *at;          /* ":line:col" expected in the message */
    const char *says[3];     /* further fragments expected */
} bad_case;

static void bad_files_name_the_place_and_change_nothing(void **state) {
    (void)state;
    const bad_case cases[] = {
        {"model:\n  ops_implementation:\n    rms_norm_implementation: fusd\n", LK_EINVAL, ":3:30",
         {"rms_norm_implementation", "did you mean 'fused'", "eager_fp32"}},
        {"model:\n  ops_implementation:\n    attn_implementation: flash_atention_2\n", LK_EINVAL, ":3:26",
         {"attn_implementation", "flash_attention_2", "sdpa"}},
        {"model:\n  ops_implementation:\n    rms_norm_implementation: [fused]\n", LK_EINVAL, ":3:30",
         {"rms_norm_implementation", "expected a string", "a list"}},
        {"model:\n  ops_implementation:\n    rms_norm_impl: fused\n", LK_EINVAL, ":3:5",
         {"unknown key 'rms_norm_impl'", "rms_norm_implementation", NULL}},
        {"modle:\n  ops_implementation: {}\n", LK_EINVAL, ":1:1", {"unknown key 'modle'", "model", NULL}},
        {"model: fused\n", LK_EINVAL, ":1:8", {"model", "expected a mapping", NULL}},
        {"model:\n  ops_implementation:\n    rms_norm_implementation: fused\n   bad indent: [\n",
         LK_EIO, ":", {"malformed YAML", NULL, NULL}},
        {"model:\n  ops_implementation:\n    overrides:\n      layers.0.input_layernorm: {rms_norm_implementation: eagr}\n",
         LK_EINVAL, ":4:59", {"rms_norm_implementation", "did you mean 'eager'", NULL}},
        {"model:\n  ops_implementation:\n    overrides:\n      layers.0.input_layernorm: eager\n",
         LK_EINVAL, ":4:33", {"layers.0.input_layernorm", "expected a mapping", NULL}},
        {"model:\n  moe:\n    router: topk\n", LK_EINVAL, ":3:13", {"moe.router", "softmax_topk", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lk_ops_config cfg, before;
        lk_ops_config_init(&cfg);
        assert_int_equal(lk_ops_config_set(&cfg, "rope", "eager", "code"), LK_OK);
        before = cfg;
        const char *p = write_yaml(cases[i].yaml);
        lk_status s = lk_config_load_yaml(p, &cfg);
        print_message("case %zu: %s\n", i, lk_last_error());
        assert_int_equal(s, cases[i].status);
        assert_non_null(strstr(lk_last_error(), p));
        assert_non_null(strstr(lk_last_error(), cases[i].at));
        for (int k = 0; k < 3 && cases[i].says[k]; k++) assert_non_null(strstr(lk_last_error(), cases[i].says[k]));
        assert_memory_equal(&cfg, &before, sizeof cfg);          /* changed nothing */
        unlink(p);
    }
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_config_load_yaml("/nonexistent/cfg.yaml", &cfg), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "/nonexistent/cfg.yaml"));
}

static void example_configs_load_and_finalize(void **state) {
    (void)state;
    const char *dir = getenv("LLMKERN_SOURCE_DIR");
    const char *names[] = {"configs/qwen3_fused.yaml", "configs/qwen3_eager.yaml"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir ? dir : ".", names[i]);
        lk_ops_config cfg;
        lk_op_table t;
        lk_ops_config_init(&cfg);
        assert_int_equal(lk_config_load_yaml(p, &cfg), LK_OK);
        assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
        assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_OK);
        assert_int_equal(t.op[LK_OP_RMS_NORM].source, LK_SOURCE_CONFIG);
    }
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(lk_init(), LK_OK);
    assert_int_equal(lk_model_register(&lk_family_qwen3), LK_OK);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loads_fields_and_overrides),
        cmocka_unit_test(bad_files_name_the_place_and_change_nothing),
        cmocka_unit_test(example_configs_load_and_finalize),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
