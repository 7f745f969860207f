/* safetensors_write.c — the safetensors writer of checkpoint.h. Tensors are collected
 * (by reference, or converted into owned copies), then commit lays them out as the
 * reference library does (dtype widest first, then name; compact JSON header with
 * "__metadata__" first, padded with spaces to 8 bytes) and writes through an atomic
 * file. */
#include <stdlib.h>
#include <string.h>
#include "llmkern/checkpoint.h"
#include "json.h"
#include "st_dtype.h"

typedef struct {
    char *name;
    lk_dtype dtype;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
    const void *data;
    size_t nbytes;
    void *owned;       /* add_as's converted copy */
} entry;

struct lk_st_writer {
    char *path;
    entry *e;
    size_t n, cap;
    char **meta;       /* key, value, ... */
    size_t n_meta;
};

lk_status lk_st_writer_begin(const char *path, lk_st_writer **out) {
    if (!out) return lk_error(LK_EINVAL, "safetensors writer: out: expected a pointer, got NULL");
    *out = NULL;
    if (!path || !*path) return lk_error(LK_EINVAL, "safetensors writer: path: expected a file name, got none");
    lk_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", path);
    }
    *out = w;
    return LK_OK;
}

static lk_status check_tensor(const lk_st_writer *w, const char *name, const lk_tensor *t) {
    if (!w) return lk_error(LK_EINVAL, "safetensors writer: expected a writer, got NULL");
    if (!name || !*name || strcmp(name, "__metadata__") == 0 || !lk_utf8_valid(name, strlen(name)))
        return lk_error(LK_EINVAL, "safetensors writer: %s: name: expected a UTF-8 name other than __metadata__, got '%s'",
                        w->path, name ? name : "(null)");
    if (!t) return lk_error(LK_EINVAL, "safetensors writer: %s: '%s': tensor is NULL", w->path, name);
    if ((unsigned)t->dtype >= LK_DTYPE_COUNT || t->ndim < 0 || t->ndim > LK_MAX_DIMS)
        return lk_error(LK_EINVAL, "safetensors writer: %s: '%s': bad dtype or ndim %d", w->path, name, t->ndim);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0)
            return lk_error(LK_EINVAL, "safetensors writer: %s: '%s': negative dimension", w->path, name);
    if (t->device.type != LK_DEVICE_CPU || !lk_tensor_is_contiguous(t))
        return lk_error(LK_EINVAL, "safetensors writer: %s: '%s': expected a contiguous CPU tensor", w->path, name);
    if (!t->data && lk_tensor_numel(t) != 0)
        return lk_error(LK_EINVAL, "safetensors writer: %s: '%s': data is NULL", w->path, name);
    return LK_OK;
}

static lk_status push(lk_st_writer *w, const char *name, const lk_tensor *t, lk_dtype dt, const void *data,
                      void *owned) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        entry *e = realloc(w->e, cap * sizeof *e);
        if (!e) return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path);
        w->e = e;
        w->cap = cap;
    }
    entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path);
    e->dtype = dt;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->data = data;
    e->nbytes = (size_t)lk_tensor_numel(t) * lk_dtype_size(dt);
    e->owned = owned;
    w->n++;
    return LK_OK;
}

lk_status lk_st_writer_add(lk_st_writer *w, const char *name, const lk_tensor *t) {
    lk_status s = check_tensor(w, name, t);
    return s ? s : push(w, name, t, t->dtype, t->data, NULL);
}

static int is_float(lk_dtype dt) { return dt == LK_F32 || dt == LK_BF16 || dt == LK_F16; }

lk_status lk_st_writer_add_as(lk_st_writer *w, const char *name, const lk_tensor *t, lk_dtype as) {
    lk_status s = check_tensor(w, name, t);
    if (s) return s;
    if (t->dtype != as && !(is_float(t->dtype) && is_float(as)))
        return lk_error(LK_EDTYPE, "safetensors writer: %s: '%s': cannot convert %s to %s", w->path, name,
                        lk_dtype_name(t->dtype), lk_dtype_name(as));
    int64_t n = lk_tensor_numel(t);
    void *copy = malloc(n ? (size_t)n * lk_dtype_size(as) : 1);
    if (!copy) return lk_error(LK_ENOMEM, "safetensors writer: %s: '%s': out of memory", w->path, name);
    if (n) lk_convert(t->data, t->dtype, copy, as, n);
    s = push(w, name, t, as, copy, copy);
    if (s) free(copy);
    return s;
}

lk_status lk_st_writer_set_metadata(lk_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value || !lk_utf8_valid(key, strlen(key)) || !lk_utf8_valid(value, strlen(value)))
        return lk_error(LK_EINVAL, "safetensors writer: metadata: expected a writer and UTF-8 key and value");
    for (size_t i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            char *v = strdup(value);
            if (!v) return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path);
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return LK_OK;
        }
    char **m = realloc(w->meta, (2 * w->n_meta + 2) * sizeof *m);
    if (!m) return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path);
    w->meta = m;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) { free(k); free(v); return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path); }
    m[2 * w->n_meta] = k;
    m[2 * w->n_meta + 1] = v;
    w->n_meta++;
    return LK_OK;
}

void lk_st_writer_abort(lk_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) { free(w->e[i].name); free(w->e[i].owned); }
    for (size_t i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->e);
    free(w->path);
    free(w);
}

static int by_layout(const void *a, const void *b) {
    const entry *x = a, *y = b;
    int rx = lk_st_dtype_of(x->dtype)->rank, ry = lk_st_dtype_of(y->dtype)->rank;
    if (rx != ry) return rx > ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int by_name_ptr(const void *a, const void *b) {
    return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static int by_key(const void *a, const void *b) {
    return strcmp(((char *const *)a)[0], ((char *const *)b)[0]);
}

/* The header as serde_json writes it, padded so the data starts 8-byte aligned. */
static void build_header(lk_st_writer *w, lk_jw *j) {
    lk_jw_obj_begin(j);
    lk_jw_key(j, "__metadata__");
    lk_jw_obj_begin(j);
    for (size_t i = 0; i < w->n_meta; i++) { lk_jw_key(j, w->meta[2 * i]); lk_jw_str(j, w->meta[2 * i + 1]); }
    lk_jw_obj_end(j);
    uint64_t at = 0;
    for (size_t i = 0; i < w->n; i++) {
        const entry *e = &w->e[i];
        lk_jw_key(j, e->name);
        lk_jw_obj_begin(j);
        lk_jw_key(j, "dtype");
        lk_jw_str(j, lk_st_dtype_name(e->dtype));
        lk_jw_key(j, "shape");
        lk_jw_arr_begin(j);
        for (int d = 0; d < e->ndim; d++) lk_jw_i64(j, e->shape[d]);
        lk_jw_arr_end(j);
        lk_jw_key(j, "data_offsets");
        lk_jw_arr_begin(j);
        lk_jw_u64(j, at);
        lk_jw_u64(j, at + e->nbytes);
        lk_jw_arr_end(j);
        lk_jw_obj_end(j);
        at += e->nbytes;
    }
    lk_jw_obj_end(j);
    while (j->len % 8) lk_jw_raw(j, " ", 1);
}

/* Sorted names first, so a duplicate is found before anything touches the disk. */
static lk_status prepare(lk_st_writer *w) {
    const entry **names = malloc((w->n ? w->n : 1) * sizeof *names);
    if (!names) return lk_error(LK_ENOMEM, "safetensors writer: %s: out of memory", w->path);
    for (size_t i = 0; i < w->n; i++) names[i] = &w->e[i];
    qsort(names, w->n, sizeof *names, by_name_ptr);
    for (size_t i = 1; i < w->n; i++)
        if (strcmp(names[i - 1]->name, names[i]->name) == 0) {
            lk_status s = lk_error(LK_EINVAL, "safetensors writer: %s: tensor name '%s' added twice", w->path,
                                   names[i]->name);
            free(names);
            return s;
        }
    free(names);
    int has_format = 0;
    for (size_t i = 0; i < w->n_meta; i++) has_format |= strcmp(w->meta[2 * i], "format") == 0;
    lk_status s = has_format ? LK_OK : lk_st_writer_set_metadata(w, "format", "pt");
    if (s) return s;
    qsort(w->e, w->n, sizeof *w->e, by_layout);
    qsort(w->meta, w->n_meta, 2 * sizeof *w->meta, by_key);
    return LK_OK;
}

lk_status lk_st_writer_commit(lk_st_writer *w) {
    if (!w) return lk_error(LK_EINVAL, "safetensors writer: expected a writer, got NULL");
    lk_status s = prepare(w);
    lk_jw j;
    lk_jw_init(&j, 0);
    if (!s) {
        build_header(w, &j);
        if (j.failed || j.len > LK_ST_MAX_HEADER)
            s = lk_error(j.failed ? LK_ENOMEM : LK_EINVAL, "safetensors writer: %s: header of %zu bytes %s", w->path,
                         j.len, j.failed ? "could not be built" : "over the limit");
    }
    lk_atomic_file *f = NULL;
    if (!s) s = lk_atomic_file_begin(w->path, &f);
    if (!s) {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)j.len >> (8 * i));
        s = lk_atomic_file_write(f, len8, 8);
        if (!s) s = lk_atomic_file_write(f, j.buf, j.len);
        for (size_t i = 0; i < w->n && !s; i++)
            if (w->e[i].nbytes) s = lk_atomic_file_write(f, w->e[i].data, w->e[i].nbytes);
        s = s ? (lk_atomic_file_abort(f), s) : lk_atomic_file_commit(f);
    }
    lk_jw_free(&j);
    lk_st_writer_abort(w);
    return s;
}
