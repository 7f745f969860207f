/* json.h — the small JSON reader and writer behind safetensors headers and config.json
 * (no dependency). The reader builds a read-only tree from untrusted bytes: strict
 * RFC 8259 syntax, UTF-8 validated, nesting limited, every failure a message with the
 * byte offset, never a crash. The writer appends to a growing buffer, compact (as
 * serde_json writes safetensors headers) or pretty (as Python's json.dumps(indent=2)
 * writes config.json). Internal to the library: src/model only. */
#ifndef LLMKERN_MODEL_JSON_H
#define LLMKERN_MODEL_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { LK_JSON_NULL, LK_JSON_BOOL, LK_JSON_NUMBER, LK_JSON_STRING, LK_JSON_ARRAY,
               LK_JSON_OBJECT } lk_json_type;

typedef struct lk_json lk_json;
struct lk_json {
    lk_json_type type;
    int boolean;
    const char *text;    /* STRING: decoded, NUL-terminated (\u0000 is refused); NUMBER: its literal */
    size_t len;          /* bytes of text */
    const char *key;     /* the member name when the parent is an object */
    lk_json *child;      /* first element or member */
    lk_json *next;       /* next sibling */
    size_t count;        /* elements or members */
};

typedef struct lk_json_block lk_json_block;
typedef struct {
    lk_json *root;
    lk_json_block *blocks;  /* node storage */
    char *strings;          /* decoded strings and number literals */
    char error[200];        /* "at byte 17: expected ':' after an object key" */
} lk_json_doc;

/* Parses len bytes (not NUL-terminated). 0 on success; -1 with doc->error set (and
 * nothing to free beyond lk_json_free, which is always safe to call). */
int lk_json_parse(const char *text, size_t len, lk_json_doc *doc);
void lk_json_free(lk_json_doc *doc);

const char *lk_json_type_name(lk_json_type t);
/* The member named key of an object, or NULL. Linear: for small objects. */
const lk_json *lk_json_get(const lk_json *obj, const char *key);
/* The first key that occurs twice in obj, or NULL. Quadratic: for small objects. */
const char *lk_json_duplicate_key(const lk_json *obj);
/* A NUMBER that is an integer literal (no fraction or exponent) in range; 0 or -1. */
int lk_json_u64(const lk_json *v, uint64_t *out);
int lk_json_i64(const lk_json *v, int64_t *out);
/* Any NUMBER as a double; 0 or -1. */
int lk_json_f64(const lk_json *v, double *out);

/* The writer. Errors (out of memory) are sticky: check failed once at the end. */
typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
    int pretty;
    int depth;
    int after_key;   /* a key was written; its value comes next */
    int count[64];   /* elements written so far at each open level */
} lk_jw;

void lk_jw_init(lk_jw *w, int pretty);
void lk_jw_free(lk_jw *w);
void lk_jw_obj_begin(lk_jw *w);
void lk_jw_obj_end(lk_jw *w);
void lk_jw_arr_begin(lk_jw *w);
void lk_jw_arr_end(lk_jw *w);
void lk_jw_key(lk_jw *w, const char *key);   /* then exactly one value */
void lk_jw_str(lk_jw *w, const char *s);
void lk_jw_u64(lk_jw *w, uint64_t v);
void lk_jw_i64(lk_jw *w, int64_t v);
void lk_jw_f64(lk_jw *w, double v);          /* shortest text that reads back exactly */
void lk_jw_bool(lk_jw *w, int v);
void lk_jw_null(lk_jw *w);
void lk_jw_raw(lk_jw *w, const char *s, size_t n);  /* bytes as they are (padding) */

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int lk_utf8_valid(const char *s, size_t n);

#endif
