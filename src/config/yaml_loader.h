/* yaml_loader.h — internal to src/config: the YAML walker's state, the helpers below every
 * section (yaml_walk.c), and the entry points of the sections' files that yaml.c's top
 * level calls: backend_yaml.c (NeMo AutoModel's model.backend) and train_yaml.c
 * (architecture, train:, data:, parallel:). yaml.c reads the document and the ops
 * sections; the section files call only yaml_walk.c, never each other. */
#ifndef LLMKERN_CONFIG_YAML_LOADER_H
#define LLMKERN_CONFIG_YAML_LOADER_H

#include <yaml.h>
#include "llmkern/config.h"
#include "llmkern/train.h"

#define LK_YAML_BACKEND_KEYS 16

typedef struct {
    const char *path;
    yaml_document_t *doc;
    lk_ops_config *cfg;
    const char *module;        /* the override being read */
    lk_train_config *train;    /* the training sections (a scratch copy for lk_config_load_yaml) */
    int arch_keys;             /* inline architecture keys seen */
    int data_sources;          /* corpus / text / tokens keys seen */
    unsigned ops_set;          /* bit (1u << op): the op's field was set by this file (one place only) */
    int fake_gate;             /* model.backend.fake_balanced_gate: -1 not given, 0, 1 */
    char fake_gate_at[192];    /* where it was given */
    const yaml_node_t *backend[LK_YAML_BACKEND_KEYS];   /* model.backend's values, by key (backend_yaml.c) */
} loader;

/* Shared between the files of src/config, never exported from the library. */
#pragma GCC visibility push(hidden)

/* --- yaml_walk.c: the helpers ---------------------------------------------------- */

typedef lk_status (*entry_fn)(loader *l, const yaml_node_t *key, const yaml_node_t *value);

void where(const loader *l, const yaml_node_t *n, char *buf, size_t size);
const char *kind_name(const yaml_node_t *n);
const char *scalar(const yaml_node_t *n);
lk_status expect(const loader *l, const yaml_node_t *n, yaml_node_type_t type, const char *what);
/* "cfg.yaml:3:9: key: expected want, got 'value'" (or the node's kind), LK_EINVAL. */
lk_status bad_value(const loader *l, const yaml_node_t *v, const char *key, const char *want);
lk_status unknown_key(const loader *l, const yaml_node_t *key, const char *section, const char *const *valid);
lk_status each_entry(loader *l, const yaml_node_t *map, const char *what, entry_fn fn);
/* Sets op field `field` (a config field or op name) to value, found at where: an op set
 * twice by one file to different values is an error naming both places. */
lk_status lk_yaml_set_op(loader *l, const char *field, const char *value, const char *where);

/* --- the sections ------------------------------------------------------------------ */

/* backend_yaml.c: NeMo AutoModel's model.backend section, and the checks of its gate
 * options once the whole file is read. */
lk_status lk_yaml_backend(loader *l, const yaml_node_t *map);
lk_status lk_yaml_backend_finish(loader *l);

/* train_yaml.c: model: (config_json is read first, inline keys then override it),
 * train:, data:, parallel:, and the checks once the whole file is read. */
lk_status lk_yaml_model_begin(loader *l, const yaml_node_t *model);
lk_status lk_yaml_model_arch_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_train_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_data_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_parallel_entry(loader *l, const yaml_node_t *k, const yaml_node_t *v);
lk_status lk_yaml_finish(loader *l);

/* yaml.c: reads the whole file, every section; tc NULL checks the training sections
 * without keeping them. */
lk_status lk_yaml_load(const char *path, lk_ops_config *cfg, lk_train_config *tc);

#pragma GCC visibility pop

#endif
