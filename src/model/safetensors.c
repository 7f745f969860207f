/* safetensors.c — opening and validating safetensors files (the reader of
 * checkpoint.h). The file is mapped read-only; the 8-byte header length, the JSON
 * header (jansson through json.h) and every tensor's span are checked before any data
 * pointer is handed out, with the same rules as the reference implementation: spans
 * exactly cover the data section in order, no gaps, no overlaps, no trailing bytes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/checked.h"
#include "llmkern/checkpoint.h"
#include "json.h"
#include "st_dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader maps it as it is"
#endif

/* Sub-byte float types (F4, F6_*) are left out: no element size in bytes. */
static const lk_st_dtype_info st_dtypes[] = {
    {"BOOL", 1, LK_BOOL, 0},          {"U8", 1, LK_DTYPE_COUNT, 4},
    {"I8", 1, LK_DTYPE_COUNT, 5},      {"F8_E5M2", 1, LK_DTYPE_COUNT, 6},
    {"F8_E4M3", 1, LK_DTYPE_COUNT, 7}, {"F8_E8M0", 1, LK_DTYPE_COUNT, 8},
    {"I16", 2, LK_DTYPE_COUNT, 9},     {"U16", 2, LK_DTYPE_COUNT, 10},
    {"F16", 2, LK_F16, 11},            {"BF16", 2, LK_BF16, 12},
    {"I32", 4, LK_I32, 13},            {"U32", 4, LK_DTYPE_COUNT, 14},
    {"F32", 4, LK_F32, 15},            {"F64", 8, LK_DTYPE_COUNT, 16},
    {"I64", 8, LK_I64, 17},            {"U64", 8, LK_DTYPE_COUNT, 18},
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof *st_dtypes)

const lk_st_dtype_info *lk_st_dtype_lookup(const char *name) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
    return NULL;
}

const lk_st_dtype_info *lk_st_dtype_of(lk_dtype dt) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].dtype == dt && dt != LK_DTYPE_COUNT) return &st_dtypes[i];
    return NULL;
}

const char *lk_st_dtype_name(lk_dtype dt) {
    const lk_st_dtype_info *d = lk_st_dtype_of(dt);
    return d ? d->name : "?";
}

struct lk_st_file {
    char *path;
    void *map;
    size_t map_size;
    lk_st_tensor *tensors;          /* data order */
    const lk_st_tensor **by_name;   /* sorted by name, for lk_st_find */
    size_t n;
    const char **meta;              /* key, value, key, value, ... */
    size_t n_meta;
    json_t *root;                   /* the parsed header: owns the strings the above point to */
};

/* An error of the safetensors file at path: LK_EIO and the message fmt. */
#define bad(path, ...) lk_json_file_error(LK_EIO, "safetensors", path, __VA_ARGS__)

static int by_offset(const void *a, const void *b) {
    const lk_st_tensor *x = a, *y = b;   /* data pointers share one base: comparable */
    if (x->data != y->data) return (const char *)x->data < (const char *)y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const lk_st_tensor *const *)a)->name, (*(const lk_st_tensor *const *)b)->name);
}

/* One header entry into t, its span checked against the data section. */
static lk_status parse_tensor(const char *path, const char *name, const json_t *info, const char *data,
                              uint64_t data_size, lk_st_tensor *t) {
    if (!json_is_object(info))
        return bad(path, "tensor '%s': expected an object, got %s", name, lk_json_type_name(info));
    const json_t *dtype = json_object_get(info, "dtype"), *shape = json_object_get(info, "shape"),
                 *offs = json_object_get(info, "data_offsets");
    if (!json_is_string(dtype))
        return bad(path, "tensor '%s': dtype: expected a string, got %s", name,
                   dtype ? lk_json_type_name(dtype) : "nothing");
    const lk_st_dtype_info *dt = lk_st_dtype_lookup(json_string_value(dtype));
    if (!dt) return bad(path, "tensor '%s': unknown dtype '%s'", name, json_string_value(dtype));
    if (!json_is_array(shape))
        return bad(path, "tensor '%s': shape: expected an array, got %s", name,
                   shape ? lk_json_type_name(shape) : "nothing");
    size_t ndim = json_array_size(shape);
    if (ndim > LK_MAX_DIMS)
        return bad(path, "tensor '%s': shape has %zu dimensions, at most %d are supported", name, ndim, LK_MAX_DIMS);
    t->ndim = 0;
    for (size_t k = 0; k < ndim; k++) {
        uint64_t v;
        if (lk_json_u64(json_array_get(shape, k), &v) || v > (uint64_t)INT64_MAX)
            return bad(path, "tensor '%s': shape: expected non-negative integers", name);
        t->shape[t->ndim++] = (int64_t)v;
    }
    int64_t numel;
    size_t size;
    /* the header's sizes are user input: core/checked.h (its message is replaced below) */
    int overflow = lk_checked_prod("safetensors", t->shape, t->ndim, &numel) != LK_OK ||
                   lk_checked_bytes("safetensors", numel, (size_t)dt->size, &size) != LK_OK;
    uint64_t nbytes = overflow ? 0 : (uint64_t)size, begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || lk_json_u64(json_array_get(offs, 0), &begin) ||
        lk_json_u64(json_array_get(offs, 1), &end))
        return bad(path, "tensor '%s': data_offsets: expected [begin, end], two non-negative integers", name);
    if (begin > end) return bad(path, "tensor '%s': data_offsets [%llu, %llu] end before they begin", name,
                                (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return bad(path, "tensor '%s': data_offsets [%llu, %llu] outside the data section (%llu bytes)", name,
                   (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
    if (overflow || nbytes != end - begin)
        return bad(path, "tensor '%s': shape/size mismatch: %zu dims of %s need %s%llu bytes, data_offsets span %llu",
                   name, ndim, dt->name, overflow ? "more than " : "",
                   (unsigned long long)(overflow ? UINT64_MAX : nbytes), (unsigned long long)(end - begin));
    t->name = name;
    t->dtype = dt->dtype;
    t->st_dtype = dt->name;
    t->data = data + begin;
    t->nbytes = (size_t)nbytes;
    return LK_OK;
}

/* A header jansson refused; a repeated key said as before: which tensor, or __metadata__. */
static lk_status header_error(const char *path, const lk_json_error *e) {
    if (e->dup_depth == 1 && strcmp(e->dup_key, "__metadata__") == 0) return bad(path, "duplicate key '__metadata__'");
    if (e->dup_depth == 1) return bad(path, "duplicate tensor name '%s'", e->dup_key);
    if (e->dup_depth == 2 && strcmp(e->dup_parent, "__metadata__") == 0)
        return bad(path, "__metadata__: duplicate key '%s'", e->dup_key);
    if (e->dup_depth == 2 && e->dup_parent[0])
        return bad(path, "tensor '%s': duplicate key '%s'", e->dup_parent, e->dup_key);
    return bad(path, "header is not valid JSON: %s", e->message);
}

/* The parsed header into f: metadata, tensors, then the layout rules. */
static lk_status parse_header(lk_st_file *f, const char *data, uint64_t data_size) {
    const json_t *root = f->root;
    if (!json_is_object(root))
        return bad(f->path, "header: expected a JSON object, got %s", lk_json_type_name(root));
    size_t count = json_object_size(root);
    f->tensors = calloc(count ? count : 1, sizeof *f->tensors);
    f->by_name = calloc(count ? count : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) return lk_error(LK_ENOMEM, "safetensors: %s: out of memory", f->path);
    const json_t *meta = json_object_get(root, "__metadata__"), *m;
    const char *key;
    json_object_foreach((json_t *)root, key, m) {   /* in the file's order (jansson keeps it) */
        if (m == meta) continue;
        lk_status s = parse_tensor(f->path, key, m, data, data_size, &f->tensors[f->n]);
        if (s) return s;
        f->by_name[f->n] = &f->tensors[f->n];
        f->n++;
    }
    if (meta) {
        if (!json_is_object(meta))
            return bad(f->path, "__metadata__: expected an object, got %s", lk_json_type_name(meta));
        f->meta = calloc(2 * json_object_size(meta) + 1, sizeof *f->meta);
        if (!f->meta) return lk_error(LK_ENOMEM, "safetensors: %s: out of memory", f->path);
        json_object_foreach((json_t *)meta, key, m) {
            if (!json_is_string(m))
                return bad(f->path, "__metadata__: '%s': expected a string, got %s", key, lk_json_type_name(m));
            f->meta[2 * f->n_meta] = key;
            f->meta[2 * f->n_meta + 1] = json_string_value(m);
            f->n_meta++;
        }
    }
    qsort(f->by_name, f->n, sizeof *f->by_name, by_name);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            return bad(f->path, "duplicate tensor name '%s'", f->by_name[i]->name);
    /* Empty tensors first among equal offsets, so they sit at the running end. */
    qsort(f->tensors, f->n, sizeof *f->tensors, by_offset);
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];   /* the sort moved them */
    qsort(f->by_name, f->n, sizeof *f->by_name, by_name);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n; i++) {
        const lk_st_tensor *t = &f->tensors[i];
        uint64_t begin = (uint64_t)((const char *)t->data - data);
        if (begin < at)
            return bad(f->path, "tensors '%s' and '%s' overlap (bytes %llu..%llu of the data section)",
                       f->tensors[i - 1].name, t->name, (unsigned long long)begin, (unsigned long long)at);
        if (begin > at)
            return bad(f->path, "gap of %llu bytes before tensor '%s' (tensors must be contiguous)",
                       (unsigned long long)(begin - at), t->name);
        at = begin + t->nbytes;
    }
    if (at != data_size)
        return bad(f->path, "the data section is %llu bytes but the tensors cover %llu",
                   (unsigned long long)data_size, (unsigned long long)at);
    return LK_OK;
}

/* The file into memory (mapped), its header length checked before anything else. */
static lk_status map_file(lk_st_file *f, uint64_t *header_len) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bad(f->path, "cannot open: %s", strerror(errno));
    struct stat st;
    lk_status s = LK_OK;
    unsigned char len8[8];
    if (fstat(fd, &st) != 0) s = bad(f->path, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = bad(f->path, "not a regular file");
    else if (st.st_size < 8)
        s = bad(f->path, "truncated: %lld bytes, shorter than the 8-byte header length", (long long)st.st_size);
    else if (pread(fd, len8, 8, 0) != 8) s = bad(f->path, "cannot read the header length: %s", strerror(errno));
    if (!s) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
        *header_len = n;
        if (n > LK_ST_MAX_HEADER)
            s = bad(f->path, "header length %llu is over the limit of %u bytes", (unsigned long long)n,
                    LK_ST_MAX_HEADER);
        else if (n > (uint64_t)st.st_size - 8)
            s = bad(f->path, "header length %llu runs past the end of the file (%lld bytes): truncated?",
                    (unsigned long long)n, (long long)st.st_size);
        else if (n < 2)
            s = bad(f->path, "header length %llu is too short for a JSON object", (unsigned long long)n);
    }
    if (!s) {
        f->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) { f->map = NULL; s = bad(f->path, "cannot map: %s", strerror(errno)); }
        else f->map_size = (size_t)st.st_size;
    }
    close(fd);
    return s;
}

lk_status lk_st_open(const char *path, lk_st_file **out) {
    if (!out) return lk_error(LK_EINVAL, "safetensors: out: expected a pointer, got NULL");
    *out = NULL;
    if (!path) return lk_error(LK_EINVAL, "safetensors: path: expected a file name, got NULL");
    lk_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) { free(f); return lk_error(LK_ENOMEM, "safetensors: %s: out of memory", path); }
    uint64_t n = 0;
    lk_json_error err;
    lk_status s = map_file(f, &n);
    if (!s) {
        const char *header = (const char *)f->map + 8;
        if (header[0] != '{') s = bad(path, "header does not start with '{'");
        else if (!lk_utf8_valid(header, (size_t)n)) s = bad(path, "header is not valid UTF-8");
        else if (!(f->root = lk_json_load(header, (size_t)n, &err))) s = header_error(path, &err);
        else s = parse_header(f, header + n, (uint64_t)f->map_size - 8 - n);
    }
    if (s) { lk_st_close(f); return s; }
    *out = f;
    return LK_OK;
}

void lk_st_close(lk_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    json_decref(f->root);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->path);
    free(f);
}

size_t lk_st_count(const lk_st_file *f) { return f ? f->n : 0; }

const lk_st_tensor *lk_st_at(const lk_st_file *f, size_t i) { return f && i < f->n ? &f->tensors[i] : NULL; }

const lk_st_tensor *lk_st_find(const lk_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const char *lk_st_metadata(const lk_st_file *f, const char *key) {
    for (size_t i = 0; f && key && i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

size_t lk_st_metadata_count(const lk_st_file *f) { return f ? f->n_meta : 0; }

void lk_st_metadata_at(const lk_st_file *f, size_t i, const char **key, const char **value) {
    int ok = f && i < f->n_meta;
    if (key) *key = ok ? f->meta[2 * i] : NULL;
    if (value) *value = ok ? f->meta[2 * i + 1] : NULL;
}

/* Same-dtype copies go through memcpy; conversions through an aligned bounce buffer,
 * since a file from another writer need not align its tensors. */
lk_status lk_st_read(const lk_st_file *f, const char *name, const lk_tensor *dst) {
    if (!f || !name || !dst) return lk_error(LK_EINVAL, "safetensors: read: expected a file, a name and a tensor");
    const lk_st_tensor *t = lk_st_find(f, name);
    if (!t) return bad(f->path, "no tensor named '%s'", name);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    int same = dst->ndim == t->ndim || (t->ndim == 0 && dst->ndim == 1 && dst->shape[0] == 1);
    for (int i = 0; same && i < t->ndim; i++) same = dst->shape[i] == t->shape[i];
    if (!same) {
        char got[96];
        int k = snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->ndim && k < (int)sizeof got; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
        char want[96];
        return lk_error(LK_ESHAPE, "safetensors: %s: tensor '%s': expected shape %s, the file has %s]", f->path,
                        name, lk_shape_str(dst, want, sizeof want), got);
    }
    if ((unsigned)dst->dtype >= LK_DTYPE_COUNT || dst->device.type != LK_DEVICE_CPU || !lk_tensor_is_contiguous(dst) || (!dst->data && numel))
        return lk_error(LK_EINVAL, "safetensors: %s: tensor '%s': destination must be a contiguous CPU tensor with data",
                        f->path, name);
    int is_float_src = t->dtype == LK_F32 || t->dtype == LK_BF16 || t->dtype == LK_F16;
    int is_float_dst = dst->dtype == LK_F32 || dst->dtype == LK_BF16 || dst->dtype == LK_F16;
    if (t->dtype != dst->dtype && !(is_float_src && is_float_dst))
        return lk_error(LK_EDTYPE, "safetensors: %s: tensor '%s': the file has %s, cannot load it into %s", f->path,
                        name, t->st_dtype, lk_dtype_name(dst->dtype));
    if (t->dtype == dst->dtype) { if (numel) memcpy(dst->data, t->data, t->nbytes); return LK_OK; }
    size_t es = lk_dtype_size(t->dtype), ds = lk_dtype_size(dst->dtype);
    uint64_t bounce[1024];
    int64_t chunk = (int64_t)(sizeof bounce / es);
    for (int64_t i = 0; i < numel; i += chunk) {
        int64_t m = numel - i < chunk ? numel - i : chunk;
        memcpy(bounce, (const char *)t->data + (size_t)i * es, (size_t)m * es);
        lk_convert(bounce, t->dtype, (char *)dst->data + (size_t)i * ds, dst->dtype, m);
    }
    return LK_OK;
}
