/* json_write.c — the JSON writer behind config.json and the safetensors header (json.h:
 * lk_jw_*): appends to a growing buffer, compact (as serde_json writes safetensors
 * headers, padding through lk_jw_raw) or pretty (as Python's json.dumps(indent=2) writes
 * config.json). Our own, not jansson's json_dumps: jansson prints a double with 17
 * significant digits (rms_norm_eps 1e-06 becomes 9.9999999999999995e-7), where
 * transformers' files hold the shortest text that reads back (Python's repr), and this
 * is output of our own making, never untrusted input. The reader is json.c (jansson). */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lk_jw_init(lk_jw *w, int pretty) {
    memset(w, 0, sizeof *w);
    w->pretty = pretty;
}

void lk_jw_free(lk_jw *w) {
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}

void lk_jw_raw(lk_jw *w, const char *s, size_t n) {
    if (w->failed) return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1) cap *= 2;
        char *b = realloc(w->buf, cap);
        if (!b) { w->failed = 1; return; }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void put(lk_jw *w, const char *s) { lk_jw_raw(w, s, strlen(s)); }

static void newline_indent(lk_jw *w, int depth) {
    put(w, "\n");
    for (int i = 0; i < depth; i++) put(w, "  ");
}

/* Before a value: nothing after a key; otherwise the separator and, pretty, the indent. */
static void before_value(lk_jw *w) {
    if (w->after_key) { w->after_key = 0; return; }
    if (w->depth == 0) return;
    if (w->count[w->depth - 1]++) put(w, ",");
    if (w->pretty) newline_indent(w, w->depth);
}

static void open_level(lk_jw *w, const char *bracket) {
    before_value(w);
    put(w, bracket);
    if (w->depth == (int)(sizeof w->count / sizeof *w->count)) { w->failed = 1; return; }
    w->count[w->depth++] = 0;
}

static void close_level(lk_jw *w, const char *bracket) {
    if (w->depth == 0) { w->failed = 1; return; }
    int had = w->count[--w->depth];
    if (w->pretty && had) newline_indent(w, w->depth);
    put(w, bracket);
}

void lk_jw_obj_begin(lk_jw *w) { open_level(w, "{"); }
void lk_jw_obj_end(lk_jw *w) { close_level(w, "}"); }
void lk_jw_arr_begin(lk_jw *w) { open_level(w, "["); }
void lk_jw_arr_end(lk_jw *w) { close_level(w, "]"); }

static void put_quoted(lk_jw *w, const char *s) {
    put(w, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') { esc[0] = '\\'; esc[1] = (char)*p; lk_jw_raw(w, esc, 2); }
        else if (*p < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", *p); put(w, esc); }
        else lk_jw_raw(w, (const char *)p, 1);
    }
    put(w, "\"");
}

void lk_jw_key(lk_jw *w, const char *key) {
    before_value(w);
    put_quoted(w, key);
    put(w, w->pretty ? ": " : ":");
    w->after_key = 1;
}

void lk_jw_str(lk_jw *w, const char *s) { before_value(w); put_quoted(w, s); }
void lk_jw_bool(lk_jw *w, int v) { before_value(w); put(w, v ? "true" : "false"); }
void lk_jw_null(lk_jw *w) { before_value(w); put(w, "null"); }

void lk_jw_u64(lk_jw *w, uint64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, v);
    before_value(w);
    put(w, b);
}

void lk_jw_i64(lk_jw *w, int64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    before_value(w);
    put(w, b);
}

/* Python's repr: the fewest digits that read back exactly; positional notation for
 * exponents -4..15 with ".0" on whole numbers (1000000.0, 0.02), else 1e-06. */
void lk_jw_f64(lk_jw *w, double v) {
    char b[48];
    if (!isfinite(v)) { w->failed = 1; return; }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(b, sizeof b, "%.*e", prec - 1, v);
        if (strtod(b, NULL) == v) break;
    }
    snprintf(b, sizeof b, "%.*e", prec - 1, v);
    int e10 = atoi(strchr(b, 'e') + 1);
    if (e10 >= -4 && e10 < 16) {
        snprintf(b, sizeof b, "%.*f", prec - 1 - e10 > 0 ? prec - 1 - e10 : 0, v);
        if (!strchr(b, '.')) strcat(b, ".0");
    }
    before_value(w);
    put(w, b);
}
