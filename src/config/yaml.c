/* yaml.c — loads a YAML config through libyaml's document API, which keeps every node's
 * line and column: the document and its top level, and model.ops_implementation.* (with
 * per-module overrides) and model.moe.router/dispatcher. The other sections have files of
 * their own: NeMo AutoModel's model.backend (backend_yaml.c) and, for training (train.h),
 * the architecture keys of model: and the train:, data: and parallel: sections
 * (train_yaml.c), which lk_config_load_yaml checks but does not keep. All of them walk the
 * document with yaml_walk.c's helpers:
 *
 *   model:
 *     ops_implementation:
 *       attn_implementation: flash_attention_2
 *       rms_norm_implementation: fused
 *       overrides:
 *         "layers.0.input_layernorm": { rms_norm_implementation: eager_fp32 }
 *
 * Every error names file:line:column; the config changes only when the whole file is good. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include "llmkern/config.h"
#include "config/yaml_loader.h"

static lk_status set_field(loader *l, const char *field, const yaml_node_t *v, const char *module) {
    char w[192];
    lk_status s = expect(l, v, YAML_SCALAR_NODE, field);
    if (s) return s;
    where(l, v, w, sizeof w);
    return module ? lk_ops_config_set_override(l->cfg, module, field, scalar(v), w)
                  : lk_yaml_set_op(l, field, scalar(v), w);
}

static lk_status override_field(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    return set_field(l, scalar(k), v, l->module);
}

static lk_status override_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    l->module = scalar(k);
    return each_entry(l, v, scalar(k), override_field);
}

static const char *const ops_keys[] = {"attn_implementation", "cross_entropy_loss_implementation",
    "rms_norm_implementation", "rotary_pos_emb_implementation", "swiglu_mlp_implementation",
    "moe_implementation", "linear_implementation", "overrides", NULL};

static lk_status ops_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    if (strcmp(scalar(k), "overrides") == 0) return each_entry(l, v, "overrides", override_entry);
    for (const char *const *f = ops_keys; *f; f++)
        if (strcmp(scalar(k), *f) == 0) return set_field(l, *f, v, NULL);
    return unknown_key(l, k, "model.ops_implementation", ops_keys);
}

static const char *const moe_keys[] = {"router", "dispatcher", NULL};

static lk_status moe_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    if (strcmp(scalar(k), "router") == 0) return set_field(l, "moe.router", v, NULL);
    if (strcmp(scalar(k), "dispatcher") == 0) return set_field(l, "moe.dispatcher", v, NULL);
    return unknown_key(l, k, "model.moe", moe_keys);
}

static lk_status model_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    if (strcmp(scalar(k), "ops_implementation") == 0)
        return each_entry(l, v, "model.ops_implementation", ops_entry);
    if (strcmp(scalar(k), "moe") == 0) return each_entry(l, v, "model.moe", moe_entry);
    if (strcmp(scalar(k), "backend") == 0) return lk_yaml_backend(l, v);
    return lk_yaml_model_arch_entry(l, k, v);
}

static const char *const top_keys[] = {"model", "train", "data", "parallel", NULL};

static lk_status top_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v) {
    lk_status s;
    if (strcmp(scalar(k), "model") == 0)
        return (s = lk_yaml_model_begin(l, v)) ? s : each_entry(l, v, "model", model_entry);
    if (strcmp(scalar(k), "train") == 0) return each_entry(l, v, "train", lk_yaml_train_entry);
    if (strcmp(scalar(k), "data") == 0) return each_entry(l, v, "data", lk_yaml_data_entry);
    if (strcmp(scalar(k), "parallel") == 0) return each_entry(l, v, "parallel", lk_yaml_parallel_entry);
    if (strcmp(scalar(k), "backend") == 0) {   /* NeMo AutoModel keeps it in model: */
        char w[192];
        where(l, k, w, sizeof w);
        return lk_error(LK_EINVAL, "%s: backend: expected under model: (model.backend, where NeMo AutoModel "
                        "recipes write it), got it at the top level", w);
    }
    return unknown_key(l, k, "the top level", top_keys);
}

lk_status lk_yaml_load(const char *path, lk_ops_config *cfg, lk_train_config *tc) {
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (f == NULL) return lk_error(LK_EIO, "config: %s: cannot open", path ? path : "(null)");
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    lk_status s = LK_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        s = lk_error(LK_EIO, "%s:%zu:%zu: malformed YAML: %s%s%s", path, parser.problem_mark.line + 1,
                     parser.problem_mark.column + 1, parser.problem ? parser.problem : "parse error",
                     parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        fclose(f);
        return s;
    }
    lk_ops_config next = *cfg;                       /* all or nothing */
    lk_train_config *tnext = malloc(sizeof *tnext);
    if (tnext == NULL) s = lk_error(LK_ENOMEM, "config: %s", path);
    else if (tc) *tnext = *tc;
    else lk_train_config_init(tnext);
    loader l = {.path = path, .doc = &doc, .cfg = &next, .train = tnext, .fake_gate = -1};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!s && root && !(root->type == YAML_SCALAR_NODE && root->data.scalar.length == 0))
        s = each_entry(&l, root, "the document", top_entry);
    if (!s) s = lk_yaml_backend_finish(&l);
    if (!s) s = lk_yaml_finish(&l);
    if (s == LK_OK) {
        *cfg = next;
        if (tc) *tc = *tnext;
    }
    free(tnext);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return s;
}

lk_status lk_config_load_yaml(const char *path, lk_ops_config *cfg) { return lk_yaml_load(path, cfg, NULL); }

lk_status lk_train_config_load_yaml(const char *path, lk_train_config *tc, lk_ops_config *ops) {
    if (tc == NULL || ops == NULL) return lk_error(LK_EINVAL, "config: expected a train config and an ops config");
    return lk_yaml_load(path, ops, tc);
}
