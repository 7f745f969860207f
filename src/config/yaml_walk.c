/* yaml_walk.c — the helpers every section of a YAML config is read with (yaml.c's ops
 * sections, backend_yaml.c's model.backend, train_yaml.c's training sections): where a
 * node stands (file:line:column), the errors for a value of the wrong kind or an unknown
 * key, the walk over a mapping's entries that refuses a key given twice, and the setting of
 * an op field that refuses one file setting it twice. They know no section's keys. */
#include <stdio.h>
#include <string.h>
#include <yaml.h>
#include "llmkern/config.h"
#include "config/yaml_loader.h"

void where(const loader *l, const yaml_node_t *n, char *buf, size_t size) {
    snprintf(buf, size, "%s:%zu:%zu", l->path, n->start_mark.line + 1, n->start_mark.column + 1);
}

const char *kind_name(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE ? "a scalar" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a mapping";
}

lk_status bad_value(const loader *l, const yaml_node_t *v, const char *key, const char *want) {
    char w[192];
    where(l, v, w, sizeof w);
    int sc = v->type == YAML_SCALAR_NODE;
    return lk_error(LK_EINVAL, "%s: %s: expected %s, got %s%s%s", w, key, want, sc ? "'" : "",
                    sc ? scalar(v) : kind_name(v), sc ? "'" : "");
}

lk_status expect(const loader *l, const yaml_node_t *n, yaml_node_type_t type, const char *what) {
    if (n->type == type) return LK_OK;
    char w[192];
    where(l, n, w, sizeof w);
    return lk_error(LK_EINVAL, "%s: %s: expected %s, got %s", w, what,
                    type == YAML_SCALAR_NODE ? "a string" : type == YAML_MAPPING_NODE ? "a mapping" : "a list",
                    kind_name(n));
}

const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

lk_status unknown_key(const loader *l, const yaml_node_t *key, const char *section,
                             const char *const *valid) {
    char w[192], list[256] = "";
    size_t k = 0;
    where(l, key, w, sizeof w);
    for (const char *const *v = valid; *v && k < sizeof list; v++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", *v);
    const char *hint = lk_suggest(scalar(key), valid);
    return lk_error(LK_EINVAL, "%s: unknown key '%s' in %s%s%s%s; valid: %s", w, scalar(key), section,
                    hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "", list);
}

/* A key given twice in one mapping is an error naming both places: libyaml keeps both
 * pairs and the last would silently win. */
static lk_status duplicate_key(const loader *l, const yaml_node_t *map, const yaml_node_pair_t *at,
                               const yaml_node_t *k, const char *what) {
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < at; p++) {
        const yaml_node_t *e = yaml_document_get_node(l->doc, p->key);
        if (e->type != YAML_SCALAR_NODE || strcmp(scalar(e), scalar(k)) != 0) continue;
        char w[192];
        where(l, k, w, sizeof w);
        return lk_error(LK_EINVAL, "%s: duplicate key '%s' in %s (first at line %zu, column %zu)", w, scalar(k), what,
                        e->start_mark.line + 1, e->start_mark.column + 1);
    }
    return LK_OK;
}

/* Calls fn for every key: value of a mapping; keys must be strings, each given once. */
lk_status each_entry(loader *l, const yaml_node_t *map, const char *what, entry_fn fn) {
    lk_status s = expect(l, map, YAML_MAPPING_NODE, what);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; !s && p < map->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(l->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(l->doc, p->value);
        if (!(s = expect(l, k, YAML_SCALAR_NODE, "key")) && !(s = duplicate_key(l, map, p, k, what))) s = fn(l, k, v);
    }
    return s;
}

lk_status lk_yaml_set_op(loader *l, const char *field, const char *value, const char *where) {
    lk_op op;
    if (lk_op_parse(field, &op) == LK_OK && (l->ops_set >> op) & 1u) {
        const lk_config_value *was = &l->cfg->field[op];
        if (strcmp(was->value, value) != 0)
            return lk_error(LK_EINVAL, "%s: %s: set twice in this file, to '%s' here and to '%s' at %s; expected "
                            "one of them", where, lk_op_info_get(op)->field, value, was->value, was->where);
    }
    lk_status s = lk_ops_config_set(l->cfg, field, value, where);
    if (!s && lk_op_parse(field, &op) == LK_OK) l->ops_set |= 1u << op;
    return s;
}
