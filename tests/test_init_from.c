/* test_init_from.c — starting from a published-format checkpoint (issue 22, item 3):
 * model.init_from with a checkpoint an earlier run wrote, single and sharded, f32 and
 * bf16: the first step's loss equals that checkpoint's evaluation on the same batch;
 * sharded saves (train.max_shard_size) round-trip bit for bit and load as transformers
 * lays them out (model.safetensors.index.json, model-0000k-of-0000n.safetensors); a save
 * of the other layout removes the stale files; bad directories, indexes and shapes are
 * refused by name before any step, leaving train.out absent. Run: ctest -R test_init_from. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/checkpoint.h"
#include "llmkern/data.h"
#include "llmkern/model.h"
#include "llmkern/train.h"
#include "train_util.h"

static lk_train_config tc;
static lk_ops_config ops;

static void tiny_config(const char *out, int64_t steps, const char *dtype) {
    lk_train_config_init(&tc);
    lk_qwen3_config *c = &tc.model;
    lk_qwen3_config_init(c, 1);
    c->hidden_size = 32; c->num_hidden_layers = 2; c->num_attention_heads = 4; c->num_key_value_heads = 2;
    c->head_dim = 8; c->intermediate_size = 64; c->vocab_size = 320; c->num_experts = 4;
    c->num_experts_per_tok = 2; c->moe_intermediate_size = 32; c->tie_word_embeddings = 0;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", dtype);
    snprintf(c->model_type, sizeof c->model_type, "qwen3_moe");
    snprintf(c->architectures, sizeof c->architectures, "Qwen3MoeForCausalLM");
    tc.has_model = 1;
    tc.steps = steps; tc.save_every = 0; tc.warmup_steps = 1;
    tc.batch_size = 2; tc.seq_len = 32; tc.grad_accum = 1; tc.lr = 3e-3; tc.min_lr = 3e-4;
    tc.corpus_docs = 64;
    snprintf(tc.out, sizeof tc.out, "%s", out);
    lk_ops_config_init(&ops);
}

static int exists(const char *dir, const char *file) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return access(p, F_OK) == 0;
}

/* A model of c with the trainer's default ops, its weights from dir. */
static lk_model *load_model(const lk_qwen3_config *c, const char *dir) {
    const lk_model_family *fam = c->moe ? &lk_family_qwen3_moe : &lk_family_qwen3;
    if (!lk_model_family_find(fam->name)) assert_int_equal(lk_model_register(fam), LK_OK);
    lk_ops_config cfg;
    lk_ops_config_init(&cfg);
    assert_int_equal(lk_ops_config_finalize(&cfg), LK_OK);
    lk_op_table t;
    assert_int_equal(lk_model_build(&cfg, fam->name, &t), LK_OK);
    lk_model *m = NULL;
    assert_int_equal(lk_model_create(c, &t, 99, 0, &m), LK_OK);
    if (dir) assert_int_equal(lk_model_load_weights(m, dir), LK_OK);
    return m;
}

/* The loss of dir's weights on the first batch a run of tc sees. */
static double eval_first_batch(const char *dir) {
    lk_dataset ds;
    lk_data_iter it;
    lk_batch b;
    assert_int_equal(lk_corpus_generate(tc.seed, tc.corpus_docs, &ds), LK_OK);
    assert_int_equal(lk_data_iter_init(&it, &ds, tc.batch_size, tc.seq_len, tc.seed), LK_OK);
    assert_int_equal(lk_batch_alloc(&b, tc.batch_size, tc.seq_len), LK_OK);
    assert_int_equal(lk_data_iter_next(&it, &b), LK_OK);
    lk_model *m = load_model(&tc.model, dir);
    lk_step_stats st;
    assert_int_equal(lk_model_loss(m, &b, &st), LK_OK);
    lk_model_free(m);
    lk_batch_free(&b);
    lk_data_iter_free(&it);
    lk_dataset_free(&ds);
    return st.loss;   /* what the trainer logs: the cross-entropy, the aux loss apart */
}

/* A run of `steps` into out with the given shard limit; its losses in log. */
static void train(const char *out, int64_t steps, const char *dtype, uint64_t shard, const char *init, float *log) {
    tiny_config(out, steps, dtype);
    if (shard) tc.max_shard_size = shard;
    if (init) snprintf(tc.init_from, sizeof tc.init_from, "%s", init);
    lk_train_opts o = {.quiet = 1, .loss_log = log, .loss_log_cap = steps};
    lk_train_result r;
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, steps);
}

static void first_loss_equals_eval(void **state) {
    (void)state;
    static const struct { const char *dtype; uint64_t shard; } cases[] = {
        {"float32", 0}, {"float32", 20000}, {"bfloat16", 0}, {"bfloat16", 9000},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char *a = tmpdir(), *b = tmpdir(), out[600];
        float la[3], lb[1];
        train(a, 3, cases[k].dtype, cases[k].shard, NULL, la);
        assert_int_equal(exists(a, "model.safetensors.index.json"), cases[k].shard != 0);
        assert_int_equal(exists(a, "model.safetensors"), cases[k].shard == 0);
        double want = eval_first_batch(a);
        snprintf(out, sizeof out, "%s/run", b);
        train(out, 1, cases[k].dtype, 0, a, lb);
        double got = lb[0];
        print_message("init_from %s %s: step-1 loss %.7f, the checkpoint's eval %.7f (trained from %.4f to %.4f)\n",
                      cases[k].dtype, cases[k].shard ? "sharded" : "single", got, want, la[0], la[2]);
        assert_true(fabs(got - want) <= 2e-6 * fabs(want));   /* the float log: f32 rounding of one value */
        assert_true(fabs(got - la[0]) > 1e-3);                /* not random weights: the trained ones */
        rm_rf(a);
        rm_rf(b);
    }
}

/* Each model.safetensors / shard of a and b, byte for byte. */
static void assert_same_files(const char *a, const char *b, int shards) {
    const char *names[8] = {"model.safetensors.index.json", "config.json"};
    char buf[8][64];
    int n = 2;
    for (int i = 1; i <= shards && n < 8; i++, n++) {
        snprintf(buf[n], sizeof buf[n], "model-%05d-of-%05d.safetensors", i, shards);
        names[n] = buf[n];
    }
    for (int i = 0; i < n; i++) {
        char pa[700], pb[700];
        size_t na, nb;
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        uint8_t *x = slurp(pa, &na), *y = slurp(pb, &nb);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(na, nb);
        assert_memory_equal(x, y, na);
        free(x);
        free(y);
    }
}

static int count_shards(const char *dir, int *of) {
    int n = 0;
    for (int i = 1; i < 100; i++) {
        char name[64];
        int found = 0;
        for (int k = 1; k < 100 && !found; k++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i, k);
            if (exists(dir, name)) found = k;
        }
        if (!found) break;
        n++;
        *of = found;
    }
    return n;
}

static void sharded_round_trip(void **state) {
    (void)state;
    char *a = tmpdir(), *b = tmpdir(), p[700];
    float log[3];
    train(a, 3, "float32", 20000, NULL, log);
    int of = 0, n = count_shards(a, &of);
    assert_true(n >= 3);
    assert_int_equal(of, n);
    assert_false(exists(a, "model.safetensors"));
    snprintf(p, sizeof p, "%s/checkpoint-3", a);   /* the checkpoint is sharded too */
    int of2 = 0;
    assert_int_equal(count_shards(p, &of2), n);
    assert_true(exists(p, "model.safetensors.index.json"));
    /* every shard within the limit unless it holds one tensor; the index names them all */
    lk_st_dir *d;
    assert_int_equal(lk_st_dir_open(a, &d), LK_OK);
    assert_int_equal(lk_st_dir_sharded(d), 1);
    assert_int_equal(lk_st_dir_file_count(d), (size_t)n);
    /* the loaded weights are the run's f32 master weights, bit for bit */
    snprintf(p, sizeof p, "%s/checkpoint-3/optimizer.safetensors", a);
    lk_st_file *opt;
    assert_int_equal(lk_st_open(p, &opt), LK_OK);
    lk_model *m = load_model(&tc.model, a);
    assert_int_equal((size_t)lk_model_param_count(m), lk_st_dir_count(d));
    for (int i = 0; i < lk_model_param_count(m); i++) {
        lk_param *q = lk_model_param(m, i);
        char key[200];
        snprintf(key, sizeof key, "param/%s", q->name);
        const lk_st_tensor *t = lk_st_find(opt, key);
        assert_non_null(t);
        assert_memory_equal(q->value.data, t->data, t->nbytes);
    }
    lk_st_close(opt);
    lk_st_dir_close(d);
    /* saved again with the same limit: the same files, byte for byte */
    assert_int_equal(lk_model_save_sharded(m, b, 20000), LK_OK);
    assert_same_files(a, b, n);
    /* saved single over it: index and shards gone, the single file loads the same weights */
    assert_int_equal(lk_model_save_sharded(m, b, LK_ST_DEFAULT_MAX_SHARD), LK_OK);
    assert_true(exists(b, "model.safetensors"));
    assert_false(exists(b, "model.safetensors.index.json"));
    assert_int_equal(count_shards(b, &of), 0);
    /* and sharded again over the single file: the single file is gone (it would win) */
    assert_int_equal(lk_model_save_sharded(m, b, 40000), LK_OK);
    assert_false(exists(b, "model.safetensors"));
    int n2 = count_shards(b, &of);
    assert_true(n2 >= 2 && n2 < n);
    lk_model *m2 = load_model(&tc.model, b);
    for (int i = 0; i < lk_model_param_count(m); i++) {
        lk_param *x = lk_model_param(m, i), *y = lk_model_param(m2, i);
        assert_memory_equal(x->value.data, y->value.data, lk_tensor_bytes(&x->value));
    }
    /* one tensor larger than the limit: a shard of its own each, as save_pretrained */
    assert_int_equal(lk_model_save_sharded(m, b, 1), LK_OK);
    assert_int_equal(count_shards(b, &of), lk_model_param_count(m));
    assert_int_equal(lk_model_save_sharded(m, b, 0), LK_EINVAL);
    lk_model_free(m);
    lk_model_free(m2);
    rm_rf(a);
    rm_rf(b);
}

static void write_text(const char *dir, const char *file, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A run from init whose error must contain want, before any step: train.out not created. */
static void refused(const char *init, const lk_qwen3_config *model, lk_status want_s, const char *want) {
    char *o = tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/run", o);
    tiny_config(out, 2, "float32");
    if (model) tc.model = *model;
    snprintf(tc.init_from, sizeof tc.init_from, "%s", init);
    lk_train_opts opt = {.quiet = 1};
    lk_status s = lk_train_run(&tc, &ops, NULL, &opt, NULL);
    if (s != want_s || !strstr(lk_last_error(), want)) print_error("got %d: %s\n", s, lk_last_error());
    assert_int_equal(s, want_s);
    assert_non_null(strstr(lk_last_error(), want));
    assert_non_null(strstr(lk_last_error(), "model.init_from"));
    assert_false(exists(o, "run"));
    rm_rf(o);
}

static void bad_directories_refused(void **state) {
    (void)state;
    char *a = tmpdir(), *d = tmpdir(), cmd[1600];
    float log[1];
    train(a, 1, "float32", 20000, NULL, log);
    const lk_qwen3_config good = tc.model;
    /* no weights at all */
    refused(d, &good, LK_EIO, "no weights (expected model.safetensors or model.safetensors.index.json)");
    char missing[700];
    snprintf(missing, sizeof missing, "%s/nope", d);
    refused(missing, &good, LK_EIO, "no such directory");
    /* the index: not JSON, no weight_map, a name outside the directory, a missing shard,
     * a tensor put in the wrong shard, a shard holding a tensor the map does not name */
    struct { const char *sed, *want; } idx[] = {
        {"s/{/[/", "not JSON"},
        {"s/weight_map/weights/", "weight_map: expected an object"},
        {"0,/model-00001-of/s|\"model-00001-of|\"../model-00001-of|", "expected a file name in the directory"},
        {"s/model-00002-of/model-00099-of/", "names the shard 'model-00099-of"},
        {"0,/00001-of/s/00001-of/00002-of/", "which does not hold it"},
        {"/model.layers.0.input_layernorm.weight/d", "which weight_map does not name"},
        {"/lm_head.weight/d", "no tensor 'lm_head.weight' (in the index's weight_map)"},   /* a shard of its own */
    };
    for (size_t k = 0; k < sizeof idx / sizeof *idx; k++) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s/c' && cp -r '%s' '%s/c' && sed -i -e '%s' '%s/c/model.safetensors.index.json'",
                 d, a, d, idx[k].sed, d);
        assert_int_equal(system(cmd), 0);
        snprintf(missing, sizeof missing, "%s/c", d);
        refused(missing, &good, LK_EIO, idx[k].want);
    }
    /* a truncated shard */
    snprintf(cmd, sizeof cmd, "rm -rf '%s/c' && cp -r '%s' '%s/c' && truncate -c -s 100 '%s/c/model-00002-of-'*",
             d, a, d, d);
    assert_int_equal(system(cmd), 0);
    refused(missing, &good, LK_EIO, "model-00002-of-");
    /* a model of another shape: the tensor, expected and got */
    lk_qwen3_config wide = good;
    wide.moe_intermediate_size = 48;
    refused(a, &wide, LK_ESHAPE, "expected shape [48, 32] for the run's model, got [32, 32]");
    /* a checkpoint with tensors the model lacks (one layer over two layers' weights) */
    lk_qwen3_config shallow = good;
    shallow.num_hidden_layers = 1;
    refused(a, &shallow, LK_EIO, "is not a parameter of the model config.json describes");
    rm_rf(a);
    rm_rf(d);
}

static void yaml_init_from(void **state) {
    (void)state;
    char *a = tmpdir(), *d = tmpdir(), y[700], out[700];
    float log[2];
    train(a, 2, "bfloat16", 9000, NULL, log);
    /* init_from reads the directory's config.json; inline keys override it; sizes parse */
    snprintf(y, sizeof y, "%s/run.yaml", d);
    snprintf(out, sizeof out, "model:\n  init_from: %s\n  rope_theta: 5000\n"
             "train:\n  steps: 2\n  max_shard_size: 1.5 KiB\n  memory_limit: 2GiB\n  log_every: 7\n", a);
    write_text(d, "run.yaml", out);
    lk_train_config t;
    lk_ops_config o;
    lk_train_config_init(&t);
    lk_ops_config_init(&o);
    assert_int_equal(lk_train_config_load_yaml(y, &t, &o), LK_OK);
    assert_string_equal(t.init_from, a);
    assert_int_equal(t.has_model, 1);
    assert_int_equal(t.model.moe, 1);
    assert_int_equal(t.model.num_experts, 4);
    assert_true(t.model.rope_theta == 5000);
    assert_int_equal(t.max_shard_size, 1536);
    assert_int_equal(t.memory_limit, 2ull << 30);
    assert_int_equal(t.log_every, 7);
    /* a relative init_from is taken from the YAML file's directory */
    snprintf(out, sizeof out, "cp -r '%s' '%s/ckpt'", a, d);
    assert_int_equal(system(out), 0);
    write_text(d, "rel.yaml", "model: { init_from: ckpt }\n");
    snprintf(y, sizeof y, "%s/rel.yaml", d);
    lk_train_config_init(&t);
    assert_int_equal(lk_train_config_load_yaml(y, &t, &o), LK_OK);
    snprintf(out, sizeof out, "%s/ckpt", d);
    assert_string_equal(t.init_from, out);
    /* refusals, each naming the key */
    struct { const char *text, *want; } bad[] = {
        {"model: { init_from: ckpt, config_json: ckpt/config.json }\n", "expected one of config_json and init_from"},
        {"model: { init_from: nowhere }\n", "model.init_from: "},
        {"model: { init_from: '' }\n", "model.init_from: expected a path"},
        {"train: { max_shard_size: 5XB }\n", "train.max_shard_size: expected a size in bytes"},
        {"train: { max_shard_size: 0 }\n", "train.max_shard_size: expected a size in bytes"},
        {"train: { max_shard_size: -1GB }\n", "train.max_shard_size: expected a size in bytes"},
        {"train: { memory_limit: [1] }\n", "train.memory_limit: expected a size in bytes"},
        {"train: { log_every: -2 }\n", "train.log_every: expected an integer >= 0"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_text(d, "bad.yaml", bad[k].text);
        snprintf(y, sizeof y, "%s/bad.yaml", d);
        lk_train_config_init(&t);
        lk_status s = lk_train_config_load_yaml(y, &t, &o);
        if (s == LK_OK || !strstr(lk_last_error(), bad[k].want)) print_error("%s -> %s\n", bad[k].text, lk_last_error());
        assert_int_not_equal(s, LK_OK);
        assert_non_null(strstr(lk_last_error(), bad[k].want));
    }
    rm_rf(a);
    rm_rf(d);
}

int main(void) {
    lk_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(first_loss_equals_eval),
        cmocka_unit_test(sharded_round_trip),
        cmocka_unit_test(bad_directories_refused),
        cmocka_unit_test(yaml_init_from),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
