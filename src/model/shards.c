/* shards.c — a checkpoint directory's weights in the two layouts Hugging Face
 * transformers reads and writes (checkpoint.h: lk_st_dir): one model.safetensors, or
 * model.safetensors.index.json whose weight_map names, for every tensor, the shard
 * (model-00001-of-00003.safetensors, ...) that holds it. Reading follows transformers'
 * order (the single file first, then the index) and trusts nothing: the index is strict
 * JSON (jansson, json.h) under a size limit, its shard names stay inside the directory, every shard is
 * opened and validated (safetensors.c), and the index and the shards must agree tensor
 * for tensor. Writing cuts the tensors, in the caller's order, into shards of at most
 * max_shard_bytes as save_pretrained(max_shard_size=...) does (a tensor larger than
 * the limit gets a shard of its own), each shard and the index written atomically, and
 * then removes the files of the other layout that an earlier save left there. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/checkpoint.h"
#include "json.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define MAX_INDEX_BYTES (64u << 20)   /* a published 235B index is ~2 MB */
#define MAX_SHARDS 100000             /* the five digits of the names */

struct lk_st_dir {
    char *dir;
    lk_st_file **files;
    char **paths;
    size_t n_files;
    size_t n_tensors;
    int sharded;
};

void lk_st_dir_close(lk_st_dir *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_files; i++) {
        lk_st_close(d->files[i]);
        free(d->paths[i]);
    }
    free(d->files);
    free(d->paths);
    free(d->dir);
    free(d);
}

static char *join(const char *dir, const char *file) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Opens path as file i of d (the paths and files arrays have room). */
static lk_status add_file(lk_st_dir *d, char *path) {
    lk_st_file *f;
    lk_status s = lk_st_open(path, &f);
    if (s) { free(path); return s; }
    d->files[d->n_files] = f;
    d->paths[d->n_files++] = path;
    d->n_tensors += lk_st_count(f);
    return LK_OK;
}

static lk_status read_text(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_EIO, "checkpoint: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_INDEX_BYTES) {
        fclose(f);
        return lk_error(LK_EIO, "checkpoint: %s: expected a regular file of at most %u bytes, got %lld bytes", path,
                        MAX_INDEX_BYTES, (long long)st.st_size);
    }
    char *p = malloc((size_t)st.st_size + 1);
    size_t got = p ? fread(p, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!p || got != (size_t)st.st_size) {
        free(p);
        return lk_error(p ? LK_EIO : LK_ENOMEM, "checkpoint: %s: %s", path, p ? "short read" : "out of memory");
    }
    p[got] = '\0';
    *text = p;
    *len = got;
    return LK_OK;
}

/* A shard's name as the weight_map gives it: a plain file name in the directory. */
static int plain_name(const char *s) {
    return s[0] && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/') && !strchr(s, '\\');
}

/* The index, its shards opened once each, and the two checked against each other. */
static lk_status open_index(lk_st_dir *d, const char *path) {
    char *text = NULL;
    size_t len = 0;
    lk_status s = read_text(path, &text, &len);
    if (s) return s;
    lk_json_error err;
    json_t *root = lk_json_load(text, len, &err);
    free(text);
    if (!root && err.dup_depth == 2 && strcmp(err.dup_parent, "weight_map") == 0)
        return lk_error(LK_EIO, "checkpoint: %s: weight_map: tensor '%s' named twice", path, err.dup_key);
    if (!root) return lk_error(LK_EIO, "checkpoint: %s: not JSON: %s", path, err.message);
    json_t *map = json_object_get(root, "weight_map"), *e;
    if (!json_is_object(map) || json_object_size(map) == 0)
        s = lk_error(LK_EIO, "checkpoint: %s: weight_map: expected an object naming each tensor's file, got %s", path,
                     map ? lk_json_type_name(map) : "none");
    /* the distinct shard names, in order of first mention */
    const char **names = s ? NULL : calloc(json_object_size(map), sizeof *names);
    size_t n_names = 0;
    if (!s && !names) s = lk_error(LK_ENOMEM, "checkpoint: %s: out of memory", path);
    const char *key;
    if (!s) json_object_foreach(map, key, e) {
        const char *file = json_string_value(e);   /* NULL when not a string */
        if (!file || !plain_name(file)) {
            s = lk_error(LK_EIO, "checkpoint: %s: weight_map['%s']: expected a file name in the directory, got %s%s%s",
                         path, key, file ? "'" : lk_json_type_name(e), file ? file : "", file ? "'" : "");
            break;
        }
        size_t k = 0;
        while (k < n_names && strcmp(names[k], file) != 0) k++;
        if (k == n_names) names[n_names++] = file;
    }
    if (!s && n_names > MAX_SHARDS) s = lk_error(LK_EIO, "checkpoint: %s: %zu shards, expected at most %d", path,
                                                 n_names, MAX_SHARDS);
    if (!s) {
        d->files = calloc(n_names, sizeof *d->files);
        d->paths = calloc(n_names, sizeof *d->paths);
        if (!d->files || !d->paths) s = lk_error(LK_ENOMEM, "checkpoint: %s: out of memory", path);
    }
    for (size_t k = 0; k < n_names && !s; k++) {
        char *p = join(d->dir, names[k]);
        if (!p) s = lk_error(LK_ENOMEM, "checkpoint: out of memory");
        else if (!is_file(p)) {
            s = lk_error(LK_EIO, "checkpoint: %s names the shard '%s', which is not in %s", path, names[k], d->dir);
            free(p);
        } else s = add_file(d, p);
    }
    /* every tensor of the map is in the shard it names; every tensor of a shard is mapped there */
    if (!s) json_object_foreach(map, key, e) {
        size_t k = 0;
        while (strcmp(names[k], json_string_value(e)) != 0) k++;
        if (!lk_st_find(d->files[k], key)) {
            s = lk_error(LK_EIO, "checkpoint: %s: weight_map puts '%s' in %s, which does not hold it", path, key,
                         json_string_value(e));
            break;
        }
    }
    if (!s && d->n_tensors != json_object_size(map)) {   /* then a shard holds a tensor the map does not put there */
        for (size_t k = 0; k < d->n_files && !s; k++)
            for (size_t i = 0; i < lk_st_count(d->files[k]) && !s; i++) {
                const char *name = lk_st_at(d->files[k], i)->name;
                const char *file = json_string_value(json_object_get(map, name));
                if (!file || strcmp(file, names[k]) != 0)
                    s = lk_error(LK_EIO, "checkpoint: %s: shard %s holds '%s', which weight_map %s%s", path, names[k],
                                 name, file ? "puts in " : "does not name", file ? file : "");
            }
    }
    free(names);
    json_decref(root);
    return s;
}

lk_status lk_st_dir_open(const char *dir, lk_st_dir **out) {
    if (!out) return lk_error(LK_EINVAL, "checkpoint: out: expected a pointer, got NULL");
    *out = NULL;
    if (!dir || !dir[0]) return lk_error(LK_EINVAL, "checkpoint: dir: expected a directory, got %s", dir ? "''" : "NULL");
    lk_st_dir *d = calloc(1, sizeof *d);
    char *single = join(dir, SINGLE_NAME), *index = join(dir, INDEX_NAME);
    if (!d || !single || !index || !(d->dir = strdup(dir))) {
        free(d ? d->dir : NULL); free(d); free(single); free(index);
        return lk_error(LK_ENOMEM, "checkpoint: %s: out of memory", dir);
    }
    lk_status s;
    if (is_file(single)) {   /* transformers' order: the single file wins over an index */
        d->files = calloc(1, sizeof *d->files);
        d->paths = calloc(1, sizeof *d->paths);
        if (d->files && d->paths) {
            s = add_file(d, single);   /* it owns the path now */
            single = NULL;
        } else s = lk_error(LK_ENOMEM, "checkpoint: out of memory");
    } else if (is_file(index)) {
        d->sharded = 1;
        s = open_index(d, index);
    } else {
        struct stat st;
        s = stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)
                ? lk_error(LK_EIO, "checkpoint: %s: no such directory", dir)
                : lk_error(LK_EIO, "checkpoint: %s: no weights (expected " SINGLE_NAME " or " INDEX_NAME ")", dir);
    }
    free(single);
    free(index);
    if (s) { lk_st_dir_close(d); return s; }
    *out = d;
    return LK_OK;
}

int lk_st_dir_sharded(const lk_st_dir *d) { return d ? d->sharded : 0; }
size_t lk_st_dir_file_count(const lk_st_dir *d) { return d ? d->n_files : 0; }
size_t lk_st_dir_count(const lk_st_dir *d) { return d ? d->n_tensors : 0; }

const lk_st_tensor *lk_st_dir_at(const lk_st_dir *d, size_t i, const char **path) {
    for (size_t k = 0; d && k < d->n_files; k++) {
        size_t n = lk_st_count(d->files[k]);
        if (i < n) {
            if (path) *path = d->paths[k];
            return lk_st_at(d->files[k], i);
        }
        i -= n;
    }
    return NULL;
}

const lk_st_tensor *lk_st_dir_find(const lk_st_dir *d, const char *name, const char **path) {
    for (size_t k = 0; d && name && k < d->n_files; k++) {
        const lk_st_tensor *t = lk_st_find(d->files[k], name);
        if (t) {
            if (path) *path = d->paths[k];
            return t;
        }
    }
    return NULL;
}

lk_status lk_st_dir_read(const lk_st_dir *d, const char *name, const lk_tensor *dst) {
    if (!d || !name) return lk_error(LK_EINVAL, "checkpoint: read: expected a directory and a name");
    for (size_t k = 0; k < d->n_files; k++)
        if (lk_st_find(d->files[k], name)) return lk_st_read(d->files[k], name, dst);
    return lk_error(LK_EIO, "checkpoint: %s: no tensor '%s'", d->dir, name);
}

/* --- writing ------------------------------------------------------------------------- */

/* "model-%05d-of-%05d.safetensors" -> 1 (with i and n) when name is one. */
static int shard_name(const char *name, int *i, int *n) {
    int a, b, used = 0;
    if (strlen(name) != strlen("model-00001-of-00001.safetensors")) return 0;
    if (sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) != 2 || used != (int)strlen(name)) return 0;
    if (i) *i = a;
    if (n) *n = b;
    return 1;
}

/* Removes what an earlier save of the other layout (or another shard count) left in dir:
 * keep_single 1 keeps model.safetensors and removes the index and every shard; 0 removes
 * model.safetensors and the shards not of n_keep. Nothing of the new layout is touched. */
static lk_status remove_stale(const char *dir, int keep_single, int n_keep) {
    DIR *dd = opendir(dir);
    if (!dd) return lk_error(LK_EIO, "checkpoint: %s: %s", dir, strerror(errno));
    lk_status s = LK_OK;
    for (struct dirent *e; (e = readdir(dd)) != NULL && !s;) {
        int i, n, stale;
        if (strcmp(e->d_name, SINGLE_NAME) == 0) stale = !keep_single;
        else if (strcmp(e->d_name, INDEX_NAME) == 0) stale = keep_single;
        else if (shard_name(e->d_name, &i, &n)) stale = keep_single || n != n_keep || i < 1 || i > n;
        else stale = 0;
        if (!stale) continue;
        char *p = join(dir, e->d_name);
        if (!p) s = lk_error(LK_ENOMEM, "checkpoint: out of memory");
        else if (unlink(p) != 0 && errno != ENOENT)
            s = lk_error(LK_EIO, "checkpoint: %s: cannot remove a stale file: %s", p, strerror(errno));
        free(p);
    }
    closedir(dd);
    return s;
}

static lk_status write_shard(const char *path, const lk_st_entry *e, size_t n) {
    lk_st_writer *w;
    lk_status s = lk_st_writer_begin(path, &w);
    for (size_t i = 0; i < n && !s; i++)
        s = e[i].as == e[i].tensor.dtype ? lk_st_writer_add(w, e[i].name, &e[i].tensor)
                                         : lk_st_writer_add_as(w, e[i].name, &e[i].tensor, e[i].as);
    if (s) { if (w) lk_st_writer_abort(w); return s; }
    return lk_st_writer_commit(w);
}

static int by_entry_name(const void *a, const void *b) {
    return strcmp((*(const lk_st_entry *const *)a)->name, (*(const lk_st_entry *const *)b)->name);
}

lk_status lk_st_dir_write(const char *dir, const lk_st_entry *e, size_t n, uint64_t max_shard_bytes) {
    if (!dir || !dir[0] || (n && !e))
        return lk_error(LK_EINVAL, "checkpoint: write: expected a directory and %zu tensors", n);
    if (max_shard_bytes == 0)
        return lk_error(LK_EINVAL, "checkpoint: max_shard_bytes: expected at least 1 byte, got 0");
    /* plan: shard k holds entries [first[k], first[k + 1]) */
    size_t *first = malloc((n + 2) * sizeof *first), shards = 0;
    uint64_t total = 0, cur = 0;
    if (!first) return lk_error(LK_ENOMEM, "checkpoint: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (e[i].as != LK_F32 && e[i].as != LK_BF16 && e[i].as != LK_F16 && e[i].as != e[i].tensor.dtype) {
            free(first);
            return lk_error(LK_EINVAL, "checkpoint: '%s': expected to be saved as its own dtype or a float one",
                            e[i].name);
        }
        uint64_t b = (uint64_t)lk_tensor_numel(&e[i].tensor) * lk_dtype_size(e[i].as);
        if (i == 0 || (cur > 0 && cur + b > max_shard_bytes)) { first[shards++] = i; cur = 0; }
        cur += b;
        total += b;
    }
    first[shards] = n;
    if (shards > MAX_SHARDS) {
        free(first);
        return lk_error(LK_EINVAL, "checkpoint: max_shard_bytes %llu: %zu shards, expected at most %d",
                        (unsigned long long)max_shard_bytes, shards, MAX_SHARDS);
    }
    lk_status s = LK_OK;
    char name[64];
    if (shards <= 1) {   /* one shard: the single file, as save_pretrained writes it */
        char *p = join(dir, SINGLE_NAME);
        s = p ? write_shard(p, e, n) : lk_error(LK_ENOMEM, "checkpoint: out of memory");
        free(p);
        free(first);
        return s ? s : remove_stale(dir, 1, 0);
    }
    for (size_t k = 0; k < shards && !s; k++) {
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards);
        char *p = join(dir, name);
        s = p ? write_shard(p, e + first[k], first[k + 1] - first[k]) : lk_error(LK_ENOMEM, "checkpoint: out of memory");
        free(p);
    }
    /* the index last, as save_pretrained: {"metadata": {"total_size"}, "weight_map"} with sorted keys */
    const lk_st_entry **sorted = s ? NULL : malloc(n * sizeof *sorted);
    size_t *shard_of = s ? NULL : malloc(n * sizeof *shard_of);
    if (!s && (!sorted || !shard_of)) s = lk_error(LK_ENOMEM, "checkpoint: out of memory");
    if (!s) {
        for (size_t k = 0; k < shards; k++)
            for (size_t i = first[k]; i < first[k + 1]; i++) shard_of[i] = k;
        for (size_t i = 0; i < n; i++) sorted[i] = &e[i];
        qsort(sorted, n, sizeof *sorted, by_entry_name);
        for (size_t i = 1; i < n && !s; i++)
            if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
                s = lk_error(LK_EINVAL, "checkpoint: tensor '%s' given twice", sorted[i]->name);
    }
    if (!s) {
        lk_jw w;
        lk_jw_init(&w, 1);
        lk_jw_obj_begin(&w);
        lk_jw_key(&w, "metadata");
        lk_jw_obj_begin(&w);
        lk_jw_key(&w, "total_size");
        lk_jw_u64(&w, total);
        lk_jw_obj_end(&w);
        lk_jw_key(&w, "weight_map");
        lk_jw_obj_begin(&w);
        for (size_t i = 0; i < n; i++) {
            size_t k = shard_of[sorted[i] - e];
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards);
            lk_jw_key(&w, sorted[i]->name);
            lk_jw_str(&w, name);
        }
        lk_jw_obj_end(&w);
        lk_jw_obj_end(&w);
        lk_jw_raw(&w, "\n", 1);
        char *p = join(dir, INDEX_NAME);
        if (w.failed || !p) s = lk_error(LK_ENOMEM, "checkpoint: out of memory");
        else s = lk_write_file_atomic(p, w.buf, w.len);
        free(p);
        lk_jw_free(&w);
    }
    free(sorted);
    free(shard_of);
    free(first);
    return s ? s : remove_stale(dir, 0, (int)shards);
}
