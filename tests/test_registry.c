/* test_registry.c — selection and the lifecycle: the precedence table of override,
 * config field, environment (llmkern names and the described system's aliases; a
 * config's own environment defaults) and built-in default; the stage that binds each op; the SP rewrite; errors for explicit
 * requests that cannot be met and recorded fallbacks for defaults; other systems' names
 * (NeMo AutoModel's) resolved per op and device, or refused with the nearest named. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"

static const char *const env_names[] = {
    "LLMKERN_BACKEND", "MODELING_BACKEND", "LLMKERN_USE_FUSED", "VEOMNI_USE_LIGER_KERNEL",
    "LLMKERN_USE_GROUP_GEMM", "USE_GROUP_GEMM", "LLMKERN_ENABLE_CHUNK_LOSS", "VEOMNI_ENABLE_CHUNK_LOSS",
};

/* env: "NAME=value" pairs separated by spaces, or "". */
static void set_env(const char *env) {
    for (size_t i = 0; i < sizeof env_names / sizeof *env_names; i++) unsetenv(env_names[i]);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        *eq = '\0';
        setenv(tok, eq + 1, 1);
    }
    assert_int_equal(lk_env_reload(), LK_OK);
}

static void build(const char *field, const char *override, lk_op_table *t) {
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    if (field) assert_int_equal(lk_ops_config_set(&cfg, "rms_norm_implementation", field, NULL), LK_OK);
    if (override)
        assert_int_equal(lk_ops_config_set_override(&cfg, "layers.0.input_layernorm",
                                                    "rms_norm_implementation", override, "test"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3", t), LK_OK);
}

typedef struct {
    const char *env, *field, *override;
    const char *op_impl; lk_source op_source; const char *op_detail; lk_stage op_stage;
    const char *module_impl; lk_source module_source;
} precedence_case;

static void precedence_table(void **state) {
    (void)state;
    const precedence_case cases[] = {
        {"", NULL, NULL, "fused", LK_SOURCE_DEFAULT, "built-in", LK_STAGE_MODEL_REGISTER, "fused", LK_SOURCE_DEFAULT},
        {"LLMKERN_USE_FUSED=0", NULL, NULL, "eager", LK_SOURCE_ENV, "LLMKERN_USE_FUSED=0",
         LK_STAGE_MODEL_REGISTER, "eager", LK_SOURCE_ENV},
        {"VEOMNI_USE_LIGER_KERNEL=0", NULL, NULL, "eager", LK_SOURCE_ENV, "VEOMNI_USE_LIGER_KERNEL=0",
         LK_STAGE_MODEL_REGISTER, "eager", LK_SOURCE_ENV},
        /* the llmkern name is read before the alias */
        {"LLMKERN_USE_FUSED=1 VEOMNI_USE_LIGER_KERNEL=0", NULL, NULL, "fused", LK_SOURCE_ENV,
         "LLMKERN_USE_FUSED=1", LK_STAGE_MODEL_REGISTER, "fused", LK_SOURCE_ENV},
        {"LLMKERN_BACKEND=reference", NULL, NULL, "eager", LK_SOURCE_ENV, "LLMKERN_BACKEND=reference",
         LK_STAGE_MODEL_REGISTER, "eager", LK_SOURCE_ENV},
        {"MODELING_BACKEND=hf", NULL, NULL, "eager", LK_SOURCE_ENV, "MODELING_BACKEND=hf",
         LK_STAGE_MODEL_REGISTER, "eager", LK_SOURCE_ENV},
        /* a config field beats every environment default */
        {"LLMKERN_USE_FUSED=0", "fused", NULL, "fused", LK_SOURCE_CONFIG, "set from code",
         LK_STAGE_CONFIG_FINALIZE, "fused", LK_SOURCE_CONFIG},
        {"VEOMNI_USE_LIGER_KERNEL=0 MODELING_BACKEND=hf", "eager_fp32", NULL, "eager_fp32", LK_SOURCE_CONFIG,
         "set from code", LK_STAGE_CONFIG_FINALIZE, "eager_fp32", LK_SOURCE_CONFIG},
        /* a per-module override beats the field, for its module only */
        {"LLMKERN_USE_FUSED=0", "eager_fp32", "fused", "eager_fp32", LK_SOURCE_CONFIG, "set from code",
         LK_STAGE_CONFIG_FINALIZE, "fused", LK_SOURCE_OVERRIDE},
        {"", NULL, "eager", "fused", LK_SOURCE_DEFAULT, "built-in", LK_STAGE_MODEL_REGISTER, "eager",
         LK_SOURCE_OVERRIDE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const precedence_case *c = &cases[i];
        lk_op_table t;
        set_env(c->env);
        build(c->field, c->override, &t);
        const lk_binding *op = lk_op_table_get(&t, LK_OP_RMS_NORM, NULL);
        const lk_binding *mod = lk_op_table_get(&t, LK_OP_RMS_NORM, "layers.0.input_layernorm");
        print_message("case %zu: env '%s' field %s override %s -> %s (%s %s), module %s\n", i, c->env,
                      c->field ? c->field : "-", c->override ? c->override : "-", op->impl->name,
                      lk_source_name(op->source), op->source_detail, mod->impl->name);
        assert_string_equal(op->impl->name, c->op_impl);
        assert_int_equal(op->source, c->op_source);
        assert_string_equal(op->source_detail, c->op_detail);
        assert_int_equal(op->stage, c->op_stage);
        assert_string_equal(op->fallback, "");
        assert_string_equal(mod->impl->name, c->module_impl);
        assert_int_equal(mod->source, c->module_source);
        /* another module of the same op keeps the op-wide binding */
        assert_ptr_equal(lk_op_table_get(&t, LK_OP_RMS_NORM, "layers.1.input_layernorm"), op);
    }
    set_env("");
}

static void stages_of_the_lifecycle(void **state) {
    (void)state;
    lk_op_table t;
    set_env("LLMKERN_ENABLE_CHUNK_LOSS=1 USE_GROUP_GEMM=0");
    build(NULL, NULL, &t);
    assert_int_equal(t.op[LK_OP_CROSS_ENTROPY].stage, LK_STAGE_INIT);           /* the loss slot */
    assert_string_equal(t.op[LK_OP_CROSS_ENTROPY].requested, "chunk_loss");
    assert_string_equal(t.op[LK_OP_CROSS_ENTROPY].source_detail, "LLMKERN_ENABLE_CHUNK_LOSS=1");
    assert_int_equal(t.op[LK_OP_ATTENTION].stage, LK_STAGE_CONFIG_FINALIZE);
    assert_int_equal(t.op[LK_OP_MOE_EXPERTS].stage, LK_STAGE_MODEL_BUILD);      /* deferred */
    assert_string_equal(t.op[LK_OP_MOE_EXPERTS].requested, "eager");
    assert_string_equal(t.op[LK_OP_MOE_EXPERTS].source_detail, "USE_GROUP_GEMM=0");
    assert_int_equal(t.op[LK_OP_LINEAR].stage, LK_STAGE_MODEL_BUILD);
    assert_int_equal(t.op[LK_OP_ROPE].stage, LK_STAGE_MODEL_REGISTER);
    assert_ptr_equal(lk_loss_slot(), lk_loss_slot());
    set_env("");
}

/* A config is resolved with the environment defaults it carries (lk_ops_config.env,
 * copied from the process by lk_ops_config_init), not with the process's own. */
static void a_config_resolves_with_its_own_environment(void **state) {
    (void)state;
    set_env("");
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_string_equal(cfg.env[LK_ENV_USE_FUSED].value, "1");
    assert_string_equal(cfg.env[LK_ENV_USE_FUSED].set_by, "");
    const struct { lk_env_id id; const char *value, *set_by; } as_if[] = {
        {LK_ENV_USE_FUSED, "0", "LLMKERN_USE_FUSED"},
        {LK_ENV_ENABLE_CHUNK_LOSS, "1", "VEOMNI_ENABLE_CHUNK_LOSS"},
        {LK_ENV_BACKEND, "reference", "MODELING_BACKEND"},
    };
    for (size_t i = 0; i < sizeof as_if / sizeof *as_if; i++) {
        lk_env_value *e = &cfg.env[as_if[i].id];
        snprintf(e->value, sizeof e->value, "%s", as_if[i].value);
        snprintf(e->set_by, sizeof e->set_by, "%s", as_if[i].set_by);
        snprintf(e->raw, sizeof e->raw, "%s", as_if[i].value);
    }
    lk_op_table t;
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_OK);
    const lk_binding *rms = lk_op_table_get(&t, LK_OP_RMS_NORM, NULL);
    assert_string_equal(rms->impl->name, "eager");                              /* the reference backend */
    assert_int_equal(rms->source, LK_SOURCE_ENV);
    assert_string_equal(rms->source_detail, "MODELING_BACKEND=reference");
    assert_int_equal(rms->stage, LK_STAGE_MODEL_REGISTER);
    assert_string_equal(t.op[LK_OP_CROSS_ENTROPY].requested, "eager");         /* the backend wins */
    assert_int_equal(t.op[LK_OP_CROSS_ENTROPY].stage, LK_STAGE_INIT);
    assert_string_equal(t.op[LK_OP_ATTENTION].resolved, "eager");               /* no SP rewrite */
    /* the backend put back: LLMKERN_USE_FUSED=0 and the chunk loss speak */
    snprintf(cfg.env[LK_ENV_BACKEND].value, sizeof cfg.env[LK_ENV_BACKEND].value, "llmkern");
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_OK);
    assert_string_equal(lk_op_table_get(&t, LK_OP_RMS_NORM, NULL)->source_detail, "LLMKERN_USE_FUSED=0");
    assert_string_equal(lk_op_table_get(&t, LK_OP_RMS_NORM, NULL)->impl->name, "eager");
    assert_string_equal(t.op[LK_OP_CROSS_ENTROPY].requested, "chunk_loss");
    assert_string_equal(t.op[LK_OP_CROSS_ENTROPY].source_detail, "VEOMNI_ENABLE_CHUNK_LOSS=1");
    /* the process's own defaults are untouched */
    lk_op_table plain;
    build(NULL, NULL, &plain);
    assert_string_equal(lk_op_table_get(&plain, LK_OP_RMS_NORM, NULL)->impl->name, "fused");
    assert_int_equal(lk_op_table_get(&plain, LK_OP_RMS_NORM, NULL)->source, LK_SOURCE_DEFAULT);
    assert_string_equal(lk_env(LK_ENV_USE_FUSED)->value, "1");
}

static void attention_names_are_rewritten_for_sp(void **state) {
    (void)state;
    lk_op_table t;
    set_env("");
    build(NULL, NULL, &t);
    assert_string_equal(t.op[LK_OP_ATTENTION].requested, "flash_attention_2");
    /* resolved is the SP-aware registry name, or what a fallback bound instead */
    const lk_binding *b = &t.op[LK_OP_ATTENTION];
    if (b->fallback[0] == '\0') assert_string_equal(b->resolved, "llmkern_flash_attention_2_with_sp");
    else assert_non_null(strstr(b->fallback, "flash_attention_2"));
    set_env("MODELING_BACKEND=hf");      /* the reference backend: no rewrite, reference default */
    build(NULL, NULL, &t);
    assert_string_equal(t.op[LK_OP_ATTENTION].requested, "eager");
    assert_null(strstr(t.op[LK_OP_ATTENTION].resolved, "_with_sp"));
    set_env("");
}

/* Every default either binds what it asked for (under its SP name, for the attention
 * names the llmkern backend rewrites), or records why not and binds another
 * implementation of the same device (or nothing, when the op has none in this build). */
static void defaults_fall_back_and_say_so(void **state) {
    (void)state;
    for (int dev = 0; dev < LK_DEVICE_COUNT; dev++)
        for (int op = 0; op < LK_OP_COUNT; op++) {
            lk_request r = {.op = (lk_op)op, .device = (lk_device_type)dev};
            lk_binding b;
            assert_int_equal(lk_select(&r, LK_STAGE_MODEL_BUILD, &b), LK_OK);
            char sp[96];
            snprintf(sp, sizeof sp, "llmkern_%s_with_sp", b.requested);
            const lk_impl *plain = lk_impl_find((lk_op)op, b.requested, (lk_device_type)dev);
            const lk_impl *rewritten = lk_impl_find((lk_op)op, sp, (lk_device_type)dev);
            const lk_impl *asked = strcmp(b.resolved, sp) == 0 ? rewritten : plain;
            char why[160];
            if (asked && lk_impl_available(asked, lk_hw_get(), why, sizeof why)) {
                assert_ptr_equal(b.impl, asked);
                assert_string_equal(b.fallback, "");
            } else {
                assert_true(b.fallback[0] != '\0');
                assert_non_null(strstr(b.fallback, b.requested));
                if (b.impl) assert_int_equal(b.impl->device, dev);
            }
        }
}

static int never(const lk_hw *hw, char *why, size_t n) {
    (void)hw;
    snprintf(why, n, "needs a feature no machine has");
    return 0;
}

/* A complete rms_norm vtable for the rows below, which are registered, never run. */
static size_t no_bytes(int64_t rows, int64_t n, lk_dtype dt) { (void)rows, (void)n, (void)dt; return 0; }
static lk_status never_run(const lk_rms_norm_args *a, lk_ctx *ctx) {
    (void)a, (void)ctx;
    return lk_error(LK_EINTERNAL, "test fixture: not to be run");
}
static const lk_rms_norm_vtable dummy_vtable = {
    .version = LK_RMS_NORM_VTABLE_VERSION, .saved_bytes = no_bytes, .forward = never_run, .backward = never_run,
};
static const lk_impl needs_nccl = {
    .op = LK_OP_RMS_NORM, .name = "test_needs_nccl", .device = LK_DEVICE_CPU,
    .needs = {.needs = LK_NEED_NCCL, .dtypes = LK_DTYPE_BIT(LK_F32)}, .vtable = &dummy_vtable,
    .summary = "test fixture",
};
static const lk_impl never_here = {
    .op = LK_OP_RMS_NORM, .name = "test_never", .device = LK_DEVICE_CPU, .supported = never,
    .needs = {.dtypes = LK_DTYPE_BIT(LK_F32)}, .vtable = &dummy_vtable, .summary = "test fixture",
};

/* A row is checked by its op's descriptor when it is registered: a vtable without a
 * member the op needs, of a version below 1, or an entry of no known op is refused. */
static void rows_are_checked_when_registered(void **state) {
    (void)state;
    static const lk_rms_norm_vtable no_backward = {
        .version = LK_RMS_NORM_VTABLE_VERSION, .saved_bytes = no_bytes, .forward = never_run,
    };
    static const lk_rms_norm_vtable version_0 = {.saved_bytes = no_bytes, .forward = never_run, .backward = never_run};
    static const lk_impl lacks = {.op = LK_OP_RMS_NORM, .name = "test_lacks", .device = LK_DEVICE_CPU,
                                  .vtable = &no_backward, .summary = "test fixture"};
    static const lk_impl old = {.op = LK_OP_RMS_NORM, .name = "test_old", .device = LK_DEVICE_CPU,
                                .vtable = &version_0, .summary = "test fixture"};
    static const lk_impl nowhere = {.op = LK_OP_COUNT, .name = "test_nowhere", .vtable = &dummy_vtable};
    assert_int_equal(lk_impl_register(&lacks), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "expected backward in 'test_lacks', got a NULL member"));
    assert_int_equal(lk_impl_register(&old), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "version >= 1"));
    assert_int_equal(lk_impl_register(&nowhere), LK_EINVAL);
    assert_null(lk_impl_find(LK_OP_RMS_NORM, "test_lacks", LK_DEVICE_CPU));
    for (int op = 0; op < LK_OP_COUNT; op++)                /* every descriptor in its slot */
        assert_int_equal(lk_op_info_get((lk_op)op)->op, op);
}

static void explicit_requests_that_cannot_be_met_are_errors(void **state) {
    (void)state;
    set_env("");
    if (!lk_impl_find(LK_OP_RMS_NORM, "test_needs_nccl", LK_DEVICE_CPU)) {
        assert_int_equal(lk_impl_register(&needs_nccl), LK_OK);
        assert_int_equal(lk_impl_register(&never_here), LK_OK);
    }
    assert_int_equal(lk_impl_register(&needs_nccl), LK_EINVAL);             /* twice: refused */
    assert_non_null(strstr(lk_last_error(), "already registered"));

    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    if (!lk_hw_get()->has_nccl) {
        assert_int_equal(lk_ops_config_set(&cfg, "rms_norm_implementation", "test_needs_nccl", "x.yaml:3:5"), LK_OK);
        assert_int_equal(lk_ops_config_finalize(&cfg), LK_EUNAVAILABLE);
        assert_non_null(strstr(lk_last_error(), "x.yaml:3:5"));
        assert_non_null(strstr(lk_last_error(), "needs NCCL"));
        assert_non_null(strstr(lk_last_error(), "available here: "));
        assert_non_null(strstr(lk_last_error(), "fused"));
        assert_int_equal(cfg.finalized, 0);                                  /* changed nothing */
        assert_int_equal(cfg.bound_mask, 0);
    }
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set_override(&cfg, "norm", "rms_norm", "test_never", NULL), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "no machine has"));

    /* a name the design lists but this build lacks: "not available", not "unknown" */
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set(&cfg, "moe_implementation", "fused_cublas", NULL), LK_OK);
    lk_status s = lk_ops_config_finalize(&cfg);
    if (!lk_impl_find(LK_OP_MOE_EXPERTS, "fused_cublas", LK_DEVICE_CPU) &&
        !lk_impl_find(LK_OP_MOE_EXPERTS, "fused_cublas", LK_DEVICE_CUDA)) {
        assert_int_equal(s, LK_EUNAVAILABLE);
        assert_non_null(strstr(lk_last_error(), "not available in this build"));
        assert_null(strstr(lk_last_error(), "unknown"));
    }
    /* an unknown name is refused when set, with a did-you-mean */
    assert_int_equal(lk_ops_config_set(&cfg, "rms_norm_implementation", "fusd", NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "did you mean 'fused'"));
    assert_int_equal(lk_ops_config_set(&cfg, "rms_norm_implementaton", "fused", NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "rms_norm_implementation"));
    /* the CUDA fused kernel asked for on a CPU model, or absent from the build */
    lk_request r = {.op = LK_OP_RMS_NORM, .name = "fused", .device = LK_DEVICE_CUDA,
                    .source = LK_SOURCE_CONFIG};
    lk_binding b;
    if (lk_hw_get()->cuda_devices == 0) {
        assert_int_equal(lk_select(&r, LK_STAGE_CONFIG_FINALIZE, &b), LK_EUNAVAILABLE);
        assert_non_null(strstr(lk_last_error(), "rms_norm_implementation"));
    }
}

static void overrides_are_checked_against_the_family(void **state) {
    (void)state;
    set_env("");
    lk_ops_config cfg;
    lk_op_table t;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set_override(&cfg, "layers.0.input_layrnorm", "rms_norm_implementation",
                                                "eager", "f.yaml:9:7"), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "layers.0.input_layrnorm"));
    assert_non_null(strstr(lk_last_error(), "layers.*.input_layernorm"));
    assert_non_null(strstr(lk_last_error(), "f.yaml:9:7"));
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set_override(&cfg, "layers.3.mlp", "rms_norm_implementation", "eager",
                                                NULL), LK_OK);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "swiglu_mlp_implementation"));
    assert_int_equal(lk_model_build(&cfg, "llama", &t), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "qwen3"));
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_model_build(&cfg, "qwen3", &t), LK_EINVAL);         /* not finalized */
    assert_non_null(strstr(lk_last_error(), "lk_ops_config_finalize"));
}

static void bad_environment_values_are_refused_and_change_nothing(void **state) {
    (void)state;
    set_env("LLMKERN_USE_FUSED=0");
    setenv("LLMKERN_USE_FUSED", "yes", 1);
    assert_int_equal(lk_env_reload(), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "LLMKERN_USE_FUSED"));
    assert_non_null(strstr(lk_last_error(), "'yes'"));
    assert_non_null(strstr(lk_last_error(), "1, 0"));
    assert_string_equal(lk_env(LK_ENV_USE_FUSED)->value, "0");              /* unchanged */
    unsetenv("LLMKERN_USE_FUSED");
    setenv("MODELING_BACKEND", "veomni", 1);                               /* a value alias */
    assert_int_equal(lk_env_reload(), LK_OK);
    assert_string_equal(lk_env(LK_ENV_BACKEND)->value, "llmkern");
    assert_string_equal(lk_env(LK_ENV_BACKEND)->set_by, "MODELING_BACKEND");
    set_env("");
}

/* The catalog's aliases (NeMo AutoModel's names) keep apart from llmkern's own names of
 * the same op, say what they are, and point only at names the op knows. */
static void alias_catalog_is_consistent(void **state) {
    (void)state;
    int n = 0;
    for (int op = 0; op < LK_OP_COUNT; op++) {
        const lk_op_info *info = lk_op_info_get((lk_op)op);
        for (const lk_op_alias *a = info->aliases; a && a->name; a++, n++) {
            print_message("%s: %s\n", info->name, a->name);
            assert_non_null(a->origin);
            for (const char *const *k = info->known; *k; k++) assert_string_not_equal(*k, a->name);
            for (int d = 0; d < LK_DEVICE_COUNT; d++) {
                assert_null(lk_impl_find((lk_op)op, a->name, (lk_device_type)d));   /* no row carries it */
                const char *to = a->same_as[d] ? a->same_as[d] : a->nearest[d];
                assert_non_null(to);
                int known = 0;
                for (const char *const *k = info->known; *k; k++) known |= strcmp(*k, to) == 0;
                assert_true(known);
                if (!a->same_as[d]) assert_non_null(a->what);
            }
            for (const lk_op_alias *b = a + 1; b->name; b++) assert_string_not_equal(a->name, b->name);
            assert_ptr_equal(lk_op_alias_find((lk_op)op, a->name), a);
            assert_true(lk_impl_name_known((lk_op)op, a->name));
        }
    }
    assert_true(n >= 25);
    assert_null(lk_op_alias_find(LK_OP_SWIGLU_MLP, "torch"));   /* NeMo has no swiglu field */
}

static lk_status select_one(lk_op op, const char *name, lk_device_type dev, lk_binding *b) {
    lk_request r = {.op = op, .name = name, .source = LK_SOURCE_CONFIG, .source_detail = "nemo.yaml:3:11",
                    .device = dev};
    lk_status s = lk_select(&r, LK_STAGE_CONFIG_FINALIZE, b);
    print_message("%s '%s' on %s: %s\n", lk_op_info_get(op)->name, name, lk_device_name(dev),
                  s ? lk_last_error() : b->impl->name);
    return s;
}

/* One name, as many meanings as fields: `torch` is eager for rms_norm, rope and the
 * experts, the all-gather dispatcher, BLAS on the CPU. The binding keeps the name as
 * written and resolves to the llmkern implementation. */
static void other_systems_names_resolve_per_op(void **state) {
    (void)state;
    set_env("");
    const struct { lk_op op; const char *name, *impl; } cases[] = {
        {LK_OP_RMS_NORM, "torch", "eager"},          {LK_OP_RMS_NORM, "torch_fp32", "eager_fp32"},
        {LK_OP_ROPE, "torch", "eager"},              {LK_OP_MOE_EXPERTS, "torch", "eager"},
        {LK_OP_MOE_EXPERTS, "torch_mm", "fused"},    {LK_OP_MOE_EXPERTS, "gmm", "fused"},
        {LK_OP_MOE_DISPATCH, "torch", "allgather"},  {LK_OP_LINEAR, "torch", "blas"},
        {LK_OP_ATTENTION, "flex", "llmkern_flex_attention_with_sp"},   /* then the SP rewrite */
        {LK_OP_ATTENTION, "eager", "eager"},         {LK_OP_ATTENTION, "sdpa", "sdpa"},   /* the same names */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        lk_binding b;
        assert_int_equal(select_one(cases[i].op, cases[i].name, LK_DEVICE_CPU, &b), LK_OK);
        assert_string_equal(b.impl->name, cases[i].impl);
        assert_string_equal(b.requested, cases[i].name);
        assert_string_equal(b.resolved, cases[i].impl);
        assert_int_equal(b.source, LK_SOURCE_CONFIG);
        assert_string_equal(b.fallback, "");
    }
    set_env("LLMKERN_BACKEND=reference");             /* no SP rewrite: flex is flex_attention itself */
    lk_binding b;
    assert_int_equal(select_one(LK_OP_ATTENTION, "flex", LK_DEVICE_CPU, &b), LK_OK);
    assert_string_equal(b.impl->name, "flex_attention");
    set_env("");
    /* by device: linear's torch is cuBLASLt on a GPU */
    lk_status s = select_one(LK_OP_LINEAR, "torch", LK_DEVICE_CUDA, &b);
    if (s == LK_OK) assert_string_equal(b.impl->name, "cublaslt");
    else assert_non_null(strstr(lk_last_error(), "'torch' (NeMo AutoModel) = 'cublaslt' cannot be used"));
    assert_int_equal(select_one(LK_OP_LINEAR, "torch", (lk_device_type)7, &b), LK_EINVAL);   /* no such device */
    assert_non_null(strstr(lk_last_error(), "device: expected cpu or cuda, got 7"));
    /* a name of one field is no name of another */
    assert_int_equal(select_one(LK_OP_RMS_NORM, "flex", LK_DEVICE_CPU, &b), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "unknown implementation 'flex'"));
    assert_int_equal(select_one(LK_OP_LINEAR, "torch_mm", LK_DEVICE_CPU, &b), LK_EINVAL);
    assert_int_equal(select_one(LK_OP_ATTENTION, "gmm", LK_DEVICE_CPU, &b), LK_EINVAL);
    /* an alias is a name the config takes, and a near miss of one is suggested */
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set(&cfg, "rms_norm_implementation", "torch_fp32", NULL), LK_OK);
    assert_int_equal(lk_ops_config_set(&cfg, "moe_implementation", "torch_mn", "x.yaml:1:1"), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "did you mean 'torch_mm'"));
    assert_non_null(strstr(lk_last_error(), "(NeMo AutoModel: torch, torch_mm, gmm, te, torch_mm_mxfp8)"));
}

/* NeMo's names llmkern does not implement are known (never "unknown") and an explicit
 * request for one is refused, on every device, with the nearest llmkern implementation. */
static void unimplemented_names_are_refused_with_the_nearest(void **state) {
    (void)state;
    const struct { lk_op op; const char *name, *nearest_cpu; } cases[] = {
        {LK_OP_ATTENTION, "te", "sdpa"},            {LK_OP_ATTENTION, "torch", "sdpa"},
        {LK_OP_ATTENTION, "tilelang", "flex_attention"}, {LK_OP_ATTENTION, "fa4", "flash_attention_2"},
        {LK_OP_ATTENTION, "magi", "flex_attention"},
        {LK_OP_RMS_NORM, "te", "fused"},            {LK_OP_RMS_NORM, "quack", "fused"},
        {LK_OP_ROPE, "quack", "fused"},             {LK_OP_ROPE, "triton", "fused"},
        {LK_OP_LINEAR, "te", "blas"},               {LK_OP_LINEAR, "quack", "blas"},
        {LK_OP_MOE_EXPERTS, "te", "fused"},         {LK_OP_MOE_EXPERTS, "torch_mm_mxfp8", "fused"},
        {LK_OP_MOE_DISPATCH, "deepep", "alltoall"}, {LK_OP_MOE_DISPATCH, "hybridep", "alltoall"},
        {LK_OP_MOE_DISPATCH, "uccl_ep", "alltoall"}, {LK_OP_MOE_DISPATCH, "mok", "alltoall"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int d = 0; d < LK_DEVICE_COUNT; d++) {
            lk_binding b;
            memset(&b, 0x5a, sizeof b);
            lk_binding before = b;
            assert_int_equal(select_one(cases[i].op, cases[i].name, (lk_device_type)d, &b), LK_EUNAVAILABLE);
            assert_memory_equal(&b, &before, sizeof b);   /* nothing bound */
            char want[160];
            snprintf(want, sizeof want, "'%s' (NeMo AutoModel: ", cases[i].name);
            assert_non_null(strstr(lk_last_error(), want));
            assert_non_null(strstr(lk_last_error(), "is not available in llmkern; the nearest llmkern implementation is '"));
            assert_non_null(strstr(lk_last_error(), "nemo.yaml:3:11"));
            assert_non_null(strstr(lk_last_error(), lk_op_info_get(cases[i].op)->field));
            if (d == LK_DEVICE_CPU) {
                snprintf(want, sizeof want, "nearest llmkern implementation is '%s'", cases[i].nearest_cpu);
                assert_non_null(strstr(lk_last_error(), want));
            }
        }
    /* through the config: known when set, refused when finalized, the config unchanged */
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_set(&cfg, "attn_implementation", "te", "nemo.yaml:3:11"), LK_OK);
    lk_ops_config before = cfg;
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_EUNAVAILABLE);
    assert_memory_equal(&cfg, &before, sizeof cfg);
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(lk_init(), LK_OK);
    assert_int_equal(lk_model_register(&lk_family_qwen3), LK_OK);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(precedence_table),
        cmocka_unit_test(stages_of_the_lifecycle),
        cmocka_unit_test(a_config_resolves_with_its_own_environment),
        cmocka_unit_test(attention_names_are_rewritten_for_sp),
        cmocka_unit_test(defaults_fall_back_and_say_so),
        cmocka_unit_test(rows_are_checked_when_registered),
        cmocka_unit_test(explicit_requests_that_cannot_be_met_are_errors),
        cmocka_unit_test(overrides_are_checked_against_the_family),
        cmocka_unit_test(bad_environment_values_are_refused_and_change_nothing),
        cmocka_unit_test(alias_catalog_is_consistent),
        cmocka_unit_test(other_systems_names_resolve_per_op),
        cmocka_unit_test(unimplemented_names_are_refused_with_the_nearest),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
