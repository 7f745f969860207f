/* test_config.c — YAML configuration: fields and per-module overrides load with their
 * file:line:column; malformed YAML, unknown keys, unknown implementations and wrong
 * types are errors that name file:line:column and the field, and change nothing; NeMo
 * AutoModel's model.backend section, its names and its gate options. */
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
        /* NeMo AutoModel's model.backend */
        {"model:\n  backend:\n    atn: flex\n", LK_EINVAL, ":3:5",
         {"unknown key 'atn' in model.backend", "did you mean 'attn'", "fake_gate_noise"}},
        {"model:\n  backend:\n    rms_norm: torch_fp3\n", LK_EINVAL, ":3:15",
         {"(model.backend.rms_norm): rms_norm_implementation", "did you mean 'torch_fp32'", "NeMo AutoModel: torch"}},
        {"model:\n  backend:\n    attn: [flex]\n", LK_EINVAL, ":3:11", {"model.backend.attn", "an implementation name", "a list"}},
        {"model:\n  backend:\n    rms_norm: flex\n", LK_EINVAL, ":3:15",   /* attention's name, not rms_norm's */
         {"rms_norm_implementation", "unknown implementation 'flex'", NULL}},
        {"model:\n  backend:\n    fake_gate_noise: 1.5\n    fake_balanced_gate: true\n", LK_EINVAL, ":3:22",
         {"fake_gate_noise", "expected a number in [0, 1]", "'1.5'"}},
        {"model:\n  backend:\n    fake_gate_noise: -0.25\n", LK_EINVAL, ":3:22", {"fake_gate_noise", "[0, 1]", "'-0.25'"}},
        {"model:\n  backend:\n    fake_gate_noise: [0.1]\n", LK_EINVAL, ":3:22", {"fake_gate_noise", "a list", NULL}},
        {"model:\n  backend:\n    gate_precision: bfloat16\n", LK_EINVAL, ":3:21",
         {"gate_precision", "expected float32", "'bfloat16'"}},
        {"model:\n  backend:\n    fake_balanced_gate: maybe\n", LK_EINVAL, ":3:25",
         {"model.backend.fake_balanced_gate", "true or false", "'maybe'"}},
        {"model:\n  backend:\n    rope_fusion: yes\n", LK_EINVAL, ":3:18", {"model.backend.rope_fusion", "true or false", NULL}},
        {"model:\n  backend:\n    rope_fusion: true\n    rope: quack\n", LK_EINVAL, ":4:11",
         {"model.backend.rope", "rope_fusion: true", "'quack'"}},
        {"model:\n  backend:\n    te_fp8: {recipe: current}\n", LK_EINVAL, ":3:5",
         {"model.backend.te_fp8", "NeMo AutoModel option llmkern has no counterpart", NULL}},
        {"model:\n  backend:\n    enable_hf_state_dict_adapter: false\n", LK_EINVAL, ":3:35",
         {"enable_hf_state_dict_adapter", "Hugging Face layout", NULL}},
        {"model:\n  backend:\n    rms_norm: torch\n  ops_implementation:\n    rms_norm_implementation: fused\n",
         LK_EINVAL, ":5:30", {"rms_norm_implementation: set twice in this file, to 'fused' here and to 'torch' at",
                             ":3:15 (model.backend.rms_norm)", NULL}},
        {"model:\n  moe:\n    router: sigmoid_bias\n  backend:\n    fake_balanced_gate: true\n", LK_EINVAL, ":5:25",
         {"moe.router: set twice", "'fake_balanced' here", "'sigmoid_bias' at"}},
        {"model:\n  backend:\n    fake_balanced_gate: false\n  moe:\n    router: fake_balanced\n", LK_EINVAL, ":3:25",
         {"fake_balanced_gate: false): asks for the learned gate, but moe.router is fake_balanced at", ":5:13", NULL}},
        {"model:\n  backend:\n    fake_balanced_gate: true\n  ops_implementation:\n    overrides:\n"
         "      layers.1.mlp.gate: {moe.router: softmax_topk}\n", LK_EINVAL, ":6:39",
         {"override 'layers.1.mlp.gate': moe.router 'softmax_topk', but ",
          ":3:25 (model.backend.fake_balanced_gate: true) routes every MoE layer with fake_balanced", NULL}},
        {"model:\n  backend: [attn]\n", LK_EINVAL, ":2:12", {"model.backend", "expected a mapping", NULL}},
        {"backend:\n  attn: flex\n", LK_EINVAL, ":1:1", {"backend: expected under model: (model.backend", NULL, NULL}},
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

/* NeMo AutoModel's model.backend: each field sets its op with NeMo's name (resolved per
 * field when the config is finalized), the gate options reach the op table. */
static void nemo_backend_section(void **state) {
    (void)state;
    lk_ops_config cfg;
    lk_op_table t;
    lk_ops_config_init(&cfg);
    const char *p = write_yaml(
        "model:\n"
        "  backend:\n"
        "    _target_: nemo_automodel.components.models.common.BackendConfig\n"
        "    attn: flex\n"
        "    linear: torch\n"
        "    rms_norm: torch_fp32\n"
        "    rope: torch\n"
        "    experts: gmm\n"
        "    dispatcher: torch\n"
        "    fake_balanced_gate: true\n"
        "    fake_gate_noise: 0.25\n"
        "    gate_precision: torch.float32\n"
        "    enable_hf_state_dict_adapter: true\n");
    assert_int_equal(lk_config_load_yaml(p, &cfg), LK_OK);
    const struct { lk_op op; const char *value, *at, *impl; } want[] = {
        {LK_OP_ATTENTION, "flex", ":4:11 (model.backend.attn)", "llmkern_flex_attention_with_sp"},
        {LK_OP_LINEAR, "torch", ":5:13 (model.backend.linear)", "blas"},
        {LK_OP_RMS_NORM, "torch_fp32", ":6:15 (model.backend.rms_norm)", "eager_fp32"},
        {LK_OP_ROPE, "torch", ":7:11 (model.backend.rope)", "eager"},
        {LK_OP_MOE_EXPERTS, "gmm", ":8:14 (model.backend.experts)", "fused"},
        {LK_OP_MOE_DISPATCH, "torch", ":9:17 (model.backend.dispatcher)", "allgather"},
        {LK_OP_MOE_ROUTER, "fake_balanced", ":10:25 (model.backend.fake_balanced_gate: true)", "fake_balanced"},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        assert_string_equal(cfg.field[want[i].op].value, want[i].value);
        assert_non_null(strstr(cfg.field[want[i].op].where, p));
        assert_non_null(strstr(cfg.field[want[i].op].where, want[i].at));
    }
    assert_string_equal(cfg.fake_gate_noise.value, "0.25");
    assert_string_equal(cfg.gate_precision.value, "float32");
    assert_non_null(strstr(cfg.gate_precision.where, ":12:21 (model.backend.gate_precision)"));
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3_moe", &t), LK_OK);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        assert_string_equal(t.op[want[i].op].impl->name, want[i].impl);
        assert_string_equal(t.op[want[i].op].requested, want[i].value);
        assert_int_equal(t.op[want[i].op].source, LK_SOURCE_CONFIG);
    }
    assert_true(t.router.noise == 0.25f);
    assert_int_equal(t.router.gate_f32, 1);
    unlink(p);

    /* rope_fusion: true is TE's fused RoPE, llmkern's fused; false the unfused rotation;
     * null gate options and a 0 noise without the fake gate are NeMo's defaults */
    const struct { const char *yaml, *rope, *at; } rope[] = {
        {"model:\n  backend:\n    rope_fusion: true\n", "fused", ":3:18 (model.backend.rope_fusion: true)"},
        {"model:\n  backend:\n    rope: torch\n    rope_fusion: True\n", "fused", ":4:18 (model.backend.rope_fusion: true)"},
        {"model:\n  backend:\n    rope_fusion: false\n    gate_precision: null\n    fake_gate_noise: 0.0\n"
         "    fake_balanced_gate: false\n", "eager", ":3:18 (model.backend.rope_fusion: false)"},
        {"model:\n  backend:\n    rope_fusion: false\n    rope: quack\n", "quack", ":4:11 (model.backend.rope)"},
    };
    for (size_t i = 0; i < sizeof rope / sizeof *rope; i++) {
        lk_ops_config_init(&cfg);
        p = write_yaml(rope[i].yaml);
        lk_status s = lk_config_load_yaml(p, &cfg);
        if (s) print_error("%s\n", lk_last_error());
        assert_int_equal(s, LK_OK);
        assert_string_equal(cfg.field[LK_OP_ROPE].value, rope[i].rope);
        assert_non_null(strstr(cfg.field[LK_OP_ROPE].where, rope[i].at));
        assert_string_equal(cfg.field[LK_OP_MOE_ROUTER].value, "");
        assert_string_equal(cfg.gate_precision.value, "");
        unlink(p);
    }
    /* quack is known but not llmkern's: refused when finalized, with the nearest named */
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "'quack' (NeMo AutoModel: "));
    assert_non_null(strstr(lk_last_error(), "the nearest llmkern implementation is 'fused'"));
    /* the same value in two places of one file is no conflict */
    lk_ops_config_init(&cfg);
    p = write_yaml("model:\n  backend:\n    fake_balanced_gate: true\n  moe:\n    router: fake_balanced\n");
    assert_int_equal(lk_config_load_yaml(p, &cfg), LK_OK);
    unlink(p);
}

static void nemo_example_config(void **state) {
    (void)state;
    const char *dir = getenv("LLMKERN_SOURCE_DIR");
    char p[512];
    snprintf(p, sizeof p, "%s/configs/nemo-tiny-moe.yaml", dir ? dir : ".");
    lk_ops_config cfg;
    lk_train_config tc;
    lk_op_table t;
    lk_ops_config_init(&cfg);
    lk_train_config_init(&tc);
    lk_status s = lk_train_config_load_yaml(p, &tc, &cfg);
    if (s) print_error("%s\n", lk_last_error());
    assert_int_equal(s, LK_OK);
    assert_true(tc.model.moe);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3_moe", &t), LK_OK);
    for (int op = 0; op < LK_OP_COUNT; op++)   /* NeMo has no field for the loss and the dense MLP; */
        if (op != LK_OP_CROSS_ENTROPY && op != LK_OP_SWIGLU_MLP && op != LK_OP_MOE_ROUTER)
            assert_int_equal(t.op[op].source, LK_SOURCE_CONFIG);
    assert_int_equal(t.op[LK_OP_MOE_ROUTER].source, LK_SOURCE_DEFAULT);   /* fake_balanced_gate: false: learned */
    assert_string_equal(t.op[LK_OP_MOE_ROUTER].impl->name, "softmax_topk");
    assert_string_equal(t.op[LK_OP_RMS_NORM].impl->name, "eager_fp32");
    assert_string_equal(t.op[LK_OP_MOE_EXPERTS].impl->name, "fused");
    assert_int_equal(t.router.gate_f32, 1);
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(lk_init(), LK_OK);
    assert_int_equal(lk_model_register(&lk_family_qwen3), LK_OK);
    assert_int_equal(lk_model_register(&lk_family_qwen3_moe), LK_OK);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loads_fields_and_overrides),
        cmocka_unit_test(bad_files_name_the_place_and_change_nothing),
        cmocka_unit_test(example_configs_load_and_finalize),
        cmocka_unit_test(nemo_backend_section),
        cmocka_unit_test(nemo_example_config),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
