/* yaml_loader.h — internal to src/config: the YAML walker's state and helpers shared by
 * yaml.c (the ops sections) and train_yaml.c (architecture, train: and data:). */
#ifndef LLMKERN_CONFIG_YAML_LOADER_H
#define LLMKERN_CONFIG_YAML_LOADER_H

#include <yaml.h>
#include "llmkern/config.h"
#include "llmkern/train.h"

typedef struct {
    const char *path;
    yaml_document_t *doc;
    lk_ops_config *cfg;
    const char *module;        /* the override being read */
    lk_train_config *train;    /* the training sections (a scratch copy for lk_config_load_yaml) */
    int arch_keys;             /* inline architecture keys seen */
    int data_sources;          /* corpus / text / tokens keys seen */
} loader;

/* Shared between two files of the library, never exported from it. */
#pragma GCC visibility push(hidden)

typedef lk_status (*entry_fn)(loader *l, const yaml_node_t *key, const yaml_node_t *value);

void where(const loader *l, const yaml_node_t *n, char *buf, size_t size);
const char *kind_name(const yaml_node_t *n);
const char *scalar(const yaml_node_t *n);
lk_status expect(const loader *l, const yaml_node_t *n, yaml_node_type_t type, const char *what);
lk_status unknown_key(const loader *l, const yaml_node_t *key, const char *section, const char *const *valid);
lk_status each_entry(loader *l, const yaml_node_t *map, const char *what, entry_fn fn);

/* Reads both sections' files; tc NULL checks the training sections without keeping them. */
lk_status lk_yaml_load(const char *path, lk_ops_config *cfg, lk_train_config *tc);

/* train_yaml.c: model: (config_json is read first, inline keys then override it),
 * train:, data:, parallel:, and the checks once the whole file is read. */
lk_status lk_yaml_model_begin(loader *l, const yaml_node_t *model);
lk_status lk_yaml_model_arch_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_train_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_data_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_parallel_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_finish(loader *l);

#pragma GCC visibility pop

#endif
