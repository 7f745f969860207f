/* test_hf_config.c — config.json of Qwen3 / Qwen3-MoE and the checkpoint tensor names:
 * the published Qwen3-0.6B and Qwen3-30B-A3B configs parse, dense and MoE configs round
 * trip through text and through a file (keys sorted, two-space indent), wrong types,
 * missing keys, bad JSON and impossible values are errors naming the key and the
 * source, a failing write keeps the previous config.json, and names, shapes and the
 * tensor list follow transformers. Run: ./build/test_hf_config. */
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
#include "llmkern/hf_config.h"
#include "llmkern/checkpoint.h"
#include "model/atomic_file.h"

/* As published with Qwen/Qwen3-0.6B. */
static const char qwen3_06b[] =
    "{\n  \"architectures\": [\n    \"Qwen3ForCausalLM\"\n  ],\n  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151645,\n"
    "  \"head_dim\": 128,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": 1024,\n  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 3072,\n  \"max_position_embeddings\": 40960,\n  \"max_window_layers\": 28,\n"
    "  \"model_type\": \"qwen3\",\n  \"num_attention_heads\": 16,\n  \"num_hidden_layers\": 28,\n"
    "  \"num_key_value_heads\": 8,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000,\n  \"sliding_window\": null,\n  \"tie_word_embeddings\": true,\n"
    "  \"torch_dtype\": \"bfloat16\",\n  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n  \"vocab_size\": 151936\n}\n";

/* As published with Qwen/Qwen3-30B-A3B. */
static const char qwen3_30b_a3b[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [],"
    " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
    " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
    " \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

static char dir[64];

static int setup(void **state) {
    lk_init();
    snprintf(dir, sizeof dir, "/tmp/lk_hfcfg_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static lk_status parse(const char *text, lk_qwen3_config *c) {
    return lk_qwen3_config_parse(text, strlen(text), "test.json", c);
}

static void test_published_dense(void **state) {
    lk_qwen3_config c;
    assert_int_equal(parse(qwen3_06b, &c), LK_OK);
    assert_int_equal(c.moe, 0);
    assert_string_equal(c.architectures, "Qwen3ForCausalLM");
    assert_string_equal(c.model_type, "qwen3");
    assert_true(c.hidden_size == 1024 && c.num_hidden_layers == 28 && c.num_attention_heads == 16 &&
                c.num_key_value_heads == 8 && c.head_dim == 128 && c.intermediate_size == 3072 &&
                c.vocab_size == 151936 && c.max_position_embeddings == 40960);
    assert_true(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-6 && c.initializer_range == 0.02);
    assert_true(c.tie_word_embeddings && !c.attention_bias && !c.has_rope_scaling && c.sliding_window == -1);
    assert_true(c.bos_token_id == 151643 && c.eos_token_id == 151645);
    assert_string_equal(c.torch_dtype, "bfloat16");
    size_t n;
    assert_int_equal(lk_qwen3_tensor_list(&c, NULL, 0, &n), LK_OK);
    assert_int_equal(n, 1 + 28 * 11 + 1);   /* tied: no lm_head */
    assert_int_equal(lk_qwen3_layer_is_moe(&c, 0), 0);
}

static void test_published_moe(void **state) {
    lk_qwen3_config c;
    assert_int_equal(parse(qwen3_30b_a3b, &c), LK_OK);
    assert_int_equal(c.moe, 1);
    assert_true(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 &&
                c.decoder_sparse_step == 1 && c.norm_topk_prob && c.n_mlp_only_layers == 0 &&
                c.router_aux_loss_coef == 0.001 && !c.tie_word_embeddings);
    for (int i = 0; i < 48; i++) assert_int_equal(lk_qwen3_layer_is_moe(&c, i), 1);
    size_t n;
    assert_int_equal(lk_qwen3_tensor_list(&c, NULL, 0, &n), LK_OK);
    assert_int_equal(n, 1 + 48 * (8 + 1 + 128 * 3) + 1 + 1);
}

static lk_qwen3_config tiny(int moe) {
    lk_qwen3_config c;
    lk_qwen3_config_init(&c, moe);
    c.hidden_size = 64; c.num_hidden_layers = 4; c.num_attention_heads = 4; c.num_key_value_heads = 2;
    c.head_dim = 16; c.intermediate_size = 160; c.vocab_size = 259; c.rope_theta = 10000.0;
    c.tie_word_embeddings = 1; c.torch_dtype[0] = 0; strcpy(c.torch_dtype, "float32");
    if (moe) {
        c.moe_intermediate_size = 48; c.num_experts = 8; c.num_experts_per_tok = 2; c.decoder_sparse_step = 2;
        c.norm_topk_prob = 1; c.n_mlp_only_layers = 1; c.mlp_only_layers[0] = 3;
        c.has_rope_scaling = 1; strcpy(c.rope_scaling_type, "yarn"); c.rope_scaling_factor = 4.0;
        c.rope_scaling_original_max_position_embeddings = 32768;
    }
    return c;
}

/* Top-level keys of the pretty text, in order, are sorted (as save_pretrained writes). */
static void expect_sorted_keys(const char *text) {
    char prev[64] = "", key[64];
    int count = 0;
    for (const char *p = strstr(text, "\n  \""); p; p = strstr(p + 1, "\n  \"")) {
        if (sscanf(p + 4, "%63[^\"]", key) != 1) continue;
        assert_true(strcmp(prev, key) < 0);
        strcpy(prev, key);
        count++;
    }
    assert_true(count >= 25);
}

static void round_trip(int moe) {
    lk_qwen3_config c = tiny(moe), back;
    char *text;
    assert_int_equal(lk_qwen3_config_to_json(&c, &text), LK_OK);
    expect_sorted_keys(text);
    assert_int_equal(parse(text, &back), LK_OK);
    assert_memory_equal(&c, &back, sizeof c);
    char path[128];
    snprintf(path, sizeof path, "%s/config%d.json", dir, moe);
    assert_int_equal(lk_qwen3_config_write(path, &c), LK_OK);
    memset(&back, 0x5a, sizeof back);
    assert_int_equal(lk_qwen3_config_read(path, &back), LK_OK);
    assert_memory_equal(&c, &back, sizeof c);
    if (moe) {
        assert_non_null(strstr(text, "\"mlp_only_layers\": [\n    3\n  ]"));
        assert_non_null(strstr(text, "\"rope_type\": \"yarn\""));
        int want[4] = {0, 1, 0, 0};   /* step 2: layers 1 and 3, but 3 is mlp-only */
        for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_is_moe(&c, i), want[i]);
    } else {
        assert_null(strstr(text, "num_experts"));   /* dense configs carry no MoE keys */
        assert_non_null(strstr(text, "\"rope_scaling\": null"));
    }
    free(text);
}

static void test_round_trip_dense(void **state) { round_trip(0); }
static void test_round_trip_moe(void **state) { round_trip(1); }

/* text with the first `from` replaced by `to`. */
static char *edited(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    assert_non_null(at);
    char *out = malloc(strlen(text) + strlen(to) + 1);
    size_t k = (size_t)(at - text);
    memcpy(out, text, k);
    strcpy(out + k, to);
    strcat(out, at + strlen(from));
    return out;
}

static void test_errors(void **state) {
    static const struct { const char *from, *to; lk_status want; const char *says; } cases[] = {
        {"\"hidden_size\": 1024", "\"hidden_size\": \"1024\"", LK_EIO, "key 'hidden_size': expected an integer, got a string"},
        {"\"hidden_size\": 1024", "\"hidden_size\": 1024.5", LK_EIO, "key 'hidden_size': expected an integer"},
        {"\"num_hidden_layers\": 28,", "", LK_EIO, "missing required key 'num_hidden_layers'"},
        {"\"rms_norm_eps\": 1e-06,", "", LK_EIO, "missing required key 'rms_norm_eps'"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1", LK_EIO, "key 'tie_word_embeddings': expected true or false"},
        {"\"rope_theta\": 1000000", "\"rope_theta\": \"1e6\"", LK_EIO, "key 'rope_theta': expected a number"},
        {"\"rope_scaling\": null", "\"rope_scaling\": 2", LK_EIO, "key 'rope_scaling'"},
        {"\"bos_token_id\": 151643", "\"bos_token_id\": [1]", LK_EIO, "key 'bos_token_id'"},
        {"\"model_type\": \"qwen3\"", "\"model_type\": \"llama\"", LK_EINVAL, "model_type 'llama'"},
        {"\"Qwen3ForCausalLM\"", "\"Qwen3MoeForCausalLM\"", LK_EINVAL, "architectures"},
        {"\"attention_bias\": false", "\"attention_bias\": true", LK_EINVAL, "key 'attention_bias'"},
        {"\"num_key_value_heads\": 8", "\"num_key_value_heads\": 6", LK_EINVAL, "num_key_value_heads"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", LK_EINVAL, "key 'hidden_act'"},
        {"\"head_dim\": 128", "\"head_dim\": 0", LK_EINVAL, "key 'head_dim'"},
        {"\"vocab_size\": 151936", "\"vocab_size\": 151936, \"vocab_size\": 5", LK_EIO, "key 'vocab_size' appears twice"},
        {"\"vocab_size\": 151936\n}", "\"vocab_size\": 151936,\n}", LK_EIO, "not valid JSON"},
        {"\"use_cache\": true", "\"use_cache\": true, \"some_new_key\": {\"x\": [1]}", LK_OK, NULL},   /* ignored */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *text = edited(qwen3_06b, cases[i].from, cases[i].to);
        lk_qwen3_config c;
        memset(&c, 0x5a, sizeof c);
        lk_status s = parse(text, &c);
        print_message("  %-40.40s -> %s\n", cases[i].to, s ? lk_last_error() : "ok");
        assert_int_equal(s, cases[i].want);
        if (s) {
            assert_non_null(strstr(lk_last_error(), cases[i].says));
            assert_non_null(strstr(lk_last_error(), "test.json"));
            assert_true(((unsigned char *)&c)[0] == 0x5a);   /* untouched */
        }
        free(text);
    }
    static const struct { const char *from, *to, *says; } moe_cases[] = {
        {"\"num_experts\": 128,", "", "missing required key 'num_experts'"},
        {"\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129", "num_experts_per_tok"},
        {"\"mlp_only_layers\": []", "\"mlp_only_layers\": [48]", "mlp_only_layers"},
        {"\"mlp_only_layers\": []", "\"mlp_only_layers\": [\"1\"]", "mlp_only_layers"},
    };
    for (size_t i = 0; i < sizeof moe_cases / sizeof *moe_cases; i++) {
        char *text = edited(qwen3_30b_a3b, moe_cases[i].from, moe_cases[i].to);
        lk_qwen3_config c;
        assert_int_not_equal(parse(text, &c), LK_OK);
        assert_non_null(strstr(lk_last_error(), moe_cases[i].says));
        free(text);
    }
    lk_qwen3_config c;
    char path[128];
    snprintf(path, sizeof path, "%s/none.json", dir);
    assert_int_equal(lk_qwen3_config_read(path, &c), LK_EIO);
    assert_non_null(strstr(lk_last_error(), path));
    assert_int_equal(parse("[1]", &c), LK_EIO);
    assert_int_equal(parse("", &c), LK_EIO);
}

/* transformers 5's names (save_pretrained of 5.24): dtype, num_local_experts, rope_theta
 * (and scaling) inside rope_parameters; the 4.x names win where both are given. */
static void test_transformers5_names(void **state) {
    lk_qwen3_config c;
    char *a = edited(qwen3_30b_a3b, "\"num_experts\": 128,", "\"num_local_experts\": 128,");
    char *b = edited(a, "\"rope_theta\": 1000000.0,", "\"rope_parameters\": {\"rope_theta\": 5000000.0, \"rope_type\": \"default\"},");
    char *t = edited(b, "\"torch_dtype\": \"bfloat16\"", "\"dtype\": \"float32\"");
    assert_int_equal(parse(t, &c), LK_OK);
    assert_int_equal(c.num_experts, 128);
    assert_true(c.rope_theta == 5e6 && !c.has_rope_scaling);
    assert_string_equal(c.torch_dtype, "float32");
    free(a);
    free(b);
    free(t);
    a = edited(qwen3_06b, "\"rope_scaling\": null,\n  \"rope_theta\": 1000000,",
               "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"yarn\", \"factor\": 4.0, "
               "\"original_max_position_embeddings\": 32768},");
    assert_int_equal(parse(a, &c), LK_OK);
    assert_true(c.rope_theta == 1e6 && c.has_rope_scaling && c.rope_scaling_factor == 4.0 &&
                c.rope_scaling_original_max_position_embeddings == 32768);
    assert_string_equal(c.rope_scaling_type, "yarn");
    free(a);
    a = edited(qwen3_06b, "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"bfloat16\", \"dtype\": \"float32\"");
    assert_int_equal(parse(a, &c), LK_OK);   /* both: the 4.x name */
    assert_string_equal(c.torch_dtype, "bfloat16");
    free(a);
    a = edited(qwen3_06b, "\"rope_theta\": 1000000,", "\"rope_parameters\": {\"rope_type\": \"default\"},");
    assert_int_equal(parse(a, &c), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "missing required key 'rope_theta' (or rope_parameters.rope_theta"));
    free(a);
    a = edited(qwen3_06b, "\"rope_theta\": 1000000,", "\"rope_parameters\": {\"rope_theta\": \"big\"},");
    assert_int_equal(parse(a, &c), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "key 'rope_theta': expected a number"));
    free(a);
}

static void test_atomic_config(void **state) {
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    lk_qwen3_config a = tiny(0), b = tiny(1), back;
    assert_int_equal(lk_qwen3_config_write(path, &a), LK_OK);
    lk_atomic_file_fail_next_commit();
    assert_int_equal(lk_qwen3_config_write(path, &b), LK_EIO);
    assert_int_equal(lk_qwen3_config_read(path, &back), LK_OK);
    assert_memory_equal(&a, &back, sizeof a);
    b.num_key_value_heads = 3;   /* invalid: nothing written */
    assert_int_equal(lk_qwen3_config_write(path, &b), LK_EINVAL);
    assert_int_equal(lk_qwen3_config_read(path, &back), LK_OK);
    assert_memory_equal(&a, &back, sizeof a);
}

static void test_tensor_names(void **state) {
    char buf[96];
    static const struct { lk_qwen3_tensor_kind k; const char *name; int64_t r, c; } want[] = {
        {LK_QW_EMBED, "model.embed_tokens.weight", 259, 64},
        {LK_QW_INPUT_NORM, "model.layers.2.input_layernorm.weight", 64, 0},
        {LK_QW_Q_PROJ, "model.layers.2.self_attn.q_proj.weight", 64, 64},
        {LK_QW_K_PROJ, "model.layers.2.self_attn.k_proj.weight", 32, 64},
        {LK_QW_V_PROJ, "model.layers.2.self_attn.v_proj.weight", 32, 64},
        {LK_QW_O_PROJ, "model.layers.2.self_attn.o_proj.weight", 64, 64},
        {LK_QW_Q_NORM, "model.layers.2.self_attn.q_norm.weight", 16, 0},
        {LK_QW_K_NORM, "model.layers.2.self_attn.k_norm.weight", 16, 0},
        {LK_QW_POST_ATTN_NORM, "model.layers.2.post_attention_layernorm.weight", 64, 0},
        {LK_QW_MLP_GATE_PROJ, "model.layers.2.mlp.gate_proj.weight", 160, 64},
        {LK_QW_MLP_UP_PROJ, "model.layers.2.mlp.up_proj.weight", 160, 64},
        {LK_QW_MLP_DOWN_PROJ, "model.layers.2.mlp.down_proj.weight", 64, 160},
        {LK_QW_ROUTER, "model.layers.2.mlp.gate.weight", 8, 64},
        {LK_QW_EXPERT_GATE_PROJ, "model.layers.2.mlp.experts.7.gate_proj.weight", 48, 64},
        {LK_QW_EXPERT_UP_PROJ, "model.layers.2.mlp.experts.7.up_proj.weight", 48, 64},
        {LK_QW_EXPERT_DOWN_PROJ, "model.layers.2.mlp.experts.7.down_proj.weight", 64, 48},
        {LK_QW_FINAL_NORM, "model.norm.weight", 64, 0},
        {LK_QW_LM_HEAD, "lm_head.weight", 259, 64},
    };
    lk_qwen3_config c = tiny(1);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        assert_int_equal(lk_qwen3_tensor_name(want[i].k, 2, 7, buf, sizeof buf), LK_OK);
        assert_string_equal(buf, want[i].name);
        int ndim;
        int64_t shape[2];
        assert_int_equal(lk_qwen3_tensor_shape(&c, want[i].k, &ndim, shape), LK_OK);
        assert_int_equal(ndim, want[i].c ? 2 : 1);
        assert_int_equal(shape[0], want[i].r);
        if (ndim == 2) assert_int_equal(shape[1], want[i].c);
    }
    assert_int_equal(lk_qwen3_tensor_name(LK_QW_Q_PROJ, 2, -1, buf, 10), LK_EINVAL);   /* too small */
    assert_int_equal(lk_qwen3_tensor_name(LK_QW_EXPERT_UP_PROJ, 2, -1, buf, sizeof buf), LK_EINVAL);
    assert_int_equal(lk_qwen3_tensor_name(LK_QW_KIND_COUNT, 0, 0, buf, sizeof buf), LK_EINVAL);
    /* The list: layers 0, 2, 3 dense, layer 1 MoE (8 experts), tied. */
    size_t n;
    lk_qwen3_tensor_ref refs[128];
    assert_int_equal(lk_qwen3_tensor_list(&c, refs, 128, &n), LK_OK);
    assert_int_equal(n, 1 + 3 * 11 + (8 + 1 + 8 * 3) + 1);
    assert_true(refs[0].kind == LK_QW_EMBED && refs[n - 1].kind == LK_QW_FINAL_NORM);
    c.tie_word_embeddings = 0;
    assert_int_equal(lk_qwen3_tensor_list(&c, refs, 4, &n), LK_OK);   /* counts past cap */
    assert_int_equal(n, 1 + 3 * 11 + (8 + 1 + 8 * 3) + 2);
}

/* lk_qwen3_param_count is the sum over the tensor list, and sizes whose products do not
 * fit in 64 bits are refused by the config's validation naming the keys (issue 20). */
static void test_param_count(void **state) {
    (void)state;
    for (int moe = 0; moe < 2; moe++) {
        lk_qwen3_config c = tiny(moe);
        size_t n;
        assert_int_equal(lk_qwen3_tensor_list(&c, NULL, 0, &n), LK_OK);
        lk_qwen3_tensor_ref *refs = calloc(n, sizeof *refs);
        assert_int_equal(lk_qwen3_tensor_list(&c, refs, n, &n), LK_OK);
        int64_t sum = 0, params, tensors;
        for (size_t i = 0; i < n; i++) {
            int nd;
            int64_t sh[2];
            assert_int_equal(lk_qwen3_tensor_shape(&c, refs[i].kind, &nd, sh), LK_OK);
            sum += nd == 2 ? sh[0] * sh[1] : sh[0];
        }
        free(refs);
        assert_int_equal(lk_qwen3_param_count(&c, "tiny", &params, &tensors), LK_OK);
        assert_int_equal(params, sum);
        assert_int_equal(tensors, (int64_t)n);
    }
    lk_qwen3_config c = tiny(0);
    c.hidden_size = (int64_t)1 << 40; c.vocab_size = (int64_t)1 << 40;
    assert_int_equal(lk_qwen3_config_validate(&c, "big.json"), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "big.json: vocab_size x hidden_size: 1099511627776 x 1099511627776 does not fit"));
    c = tiny(0);
    c.num_attention_heads = (int64_t)1 << 62; c.num_key_value_heads = 1; c.head_dim = 16;
    assert_int_equal(lk_qwen3_config_validate(&c, "heads.json"), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "num_attention_heads x head_dim"));
    c = tiny(1);
    c.num_experts = (int64_t)1 << 40; c.moe_intermediate_size = (int64_t)1 << 30;
    assert_int_equal(lk_qwen3_config_validate(&c, "experts.json"), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "num_experts x 3 x moe_intermediate_size x hidden_size"));
    c = tiny(1);
    c.num_experts = (int64_t)1 << 32; c.moe_intermediate_size = 1; c.hidden_size = 1; c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    assert_int_equal(lk_qwen3_config_validate(&c, "many.json"), LK_EINVAL);   /* the loop would run for ever */
    assert_non_null(strstr(lk_last_error(), "tensors, more than 2^31 - 1"));
    c = tiny(0);
    c.num_hidden_layers = (int64_t)1 << 40;
    assert_int_equal(lk_qwen3_config_validate(&c, "deep.json"), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "num_hidden_layers"));
}

/* Sliding-window layers, transformers' rule: none without use_sliding_window or with a null
 * sliding_window; else Qwen3's layers from max_window_layers on, or those layer_types names
 * "sliding_attention" (read, written back only when given, and validated), and every layer
 * of Qwen3-MoE. */
static void test_sliding_layers(void **state) {
    (void)state;
    lk_qwen3_config c = tiny(0), back;
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), 0);   /* the defaults: off */
    c.use_sliding_window = 1;
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), 0);   /* sliding_window null */
    c.sliding_window = 7, c.max_window_layers = 2;
    const int64_t want[4] = {0, 0, 7, 7};
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), want[i]);
    char *text;
    assert_int_equal(lk_qwen3_config_to_json(&c, &text), LK_OK);
    assert_null(strstr(text, "layer_types"));   /* not given: not written */
    free(text);
    c.n_layer_types = 4;
    const unsigned char kinds[4] = {1, 0, 1, 0};
    memcpy(c.sliding_layer, kinds, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), kinds[i] ? 7 : 0);
    assert_int_equal(lk_qwen3_config_to_json(&c, &text), LK_OK);
    assert_non_null(strstr(text, "\"layer_types\": [\n    \"sliding_attention\",\n    \"full_attention\""));
    assert_int_equal(parse(text, &back), LK_OK);
    assert_int_equal(back.n_layer_types, 4);
    assert_memory_equal(back.sliding_layer, kinds, 4);
    assert_true(back.use_sliding_window && back.sliding_window == 7);
    c.use_sliding_window = 0;   /* layer_types alone slides nothing, as in transformers */
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), 0);
    /* refusals: an unknown kind, another count, a window of 0 */
    char *bad = malloc(strlen(text) + 64);
    const char *at = strstr(text, "\"full_attention\"");
    snprintf(bad, strlen(text) + 64, "%.*s\"chunked_attention\"%s", (int)(at - text), text, at + strlen("\"full_attention\""));
    assert_int_equal(parse(bad, &back), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "key 'layer_types': entry 1: expected \"full_attention\" or"));
    assert_non_null(strstr(lk_last_error(), "chunked_attention"));
    free(bad);
    free(text);
    c = tiny(0);
    c.n_layer_types = 3;
    assert_int_equal(lk_qwen3_config_to_json(&c, &text), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "key 'layer_types': expected one entry a layer (4), got 3"));
    c = tiny(1);   /* Qwen3-MoE: every layer, whatever max_window_layers says */
    c.use_sliding_window = 1, c.sliding_window = 5, c.max_window_layers = 2;
    for (int i = 0; i < 4; i++) assert_int_equal(lk_qwen3_layer_window(&c, i), 5);
    c = tiny(0);
    c.use_sliding_window = 1, c.sliding_window = 0;
    assert_int_equal(lk_qwen3_config_to_json(&c, &text), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "sliding_window"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_dense),
        cmocka_unit_test(test_published_moe),
        cmocka_unit_test(test_round_trip_dense),
        cmocka_unit_test(test_round_trip_moe),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_transformers5_names),
        cmocka_unit_test(test_atomic_config),
        cmocka_unit_test(test_tensor_names),
        cmocka_unit_test(test_param_count),
        cmocka_unit_test(test_sliding_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
