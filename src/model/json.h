/* json.h — JSON for safetensors headers, model.safetensors.index.json and config.json.
 * Reading is jansson's (json.c: libjansson, Debian's libjansson-dev), on untrusted bytes:
 * strict RFC 8259, UTF-8 validated, \u0000 refused, a key repeated in any object refused
 * (JSON_REJECT_DUPLICATES), nesting limited to LK_JSON_MAX_DEPTH; a failure is a message
 * with the byte offset and, for a repeated key, the key and where it is, so callers name
 * it in their own words. Writing is our own (json_write.c: lk_jw_*), compact as serde_json
 * writes safetensors headers or pretty as Python's json.dumps(indent=2) writes
 * config.json. Internal to the library: src/model only. */
#ifndef LLMKERN_MODEL_JSON_H
#define LLMKERN_MODEL_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "llmkern/status.h"

#define LK_JSON_MAX_DEPTH 64

typedef struct {
    char message[240];       /* "at byte 17: ']' expected near end of file" */
    int dup_depth;           /* a repeated key: the depth of its object (1: the top level); else 0 */
    char dup_key[256];       /* that key (cut to fit) */
    char dup_parent[256];    /* dup_depth 2: the top-level key whose object repeats it */
} lk_json_error;

/* Parses len bytes (not NUL-terminated) into a new tree (json_decref it), any value at the
 * top. NULL with err filled on failure. */
json_t *lk_json_load(const char *text, size_t len, lk_json_error *err);

/* Records "<file>: <where>: <message>" as the last error and returns s: how the readers of
 * config.json and safetensors files name what is wrong ("config.json: out/config.json: key ...",
 * "safetensors: model.safetensors: tensor 'w': ..."). */
lk_status lk_json_file_error(lk_status s, const char *file, const char *where, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *lk_json_type_name(const json_t *v);
/* An integer literal (no fraction or exponent; jansson's json_int_t) in range; 0 or -1. */
int lk_json_u64(const json_t *v, uint64_t *out);
int lk_json_i64(const json_t *v, int64_t *out);
/* Any number as a double; 0 or -1. */
int lk_json_f64(const json_t *v, double *out);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF):
 * jansson's check, the one its parser applies to strings. */
int lk_utf8_valid(const char *s, size_t n);

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

#endif
