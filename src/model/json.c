/* json.c — the strict JSON reader (a recursive descent over untrusted bytes, depth
 * limited, nodes from blocks so pointers stay put) and the compact/pretty writer.
 * See json.h. */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define BLOCK_NODES 256

struct lk_json_block {
    lk_json_block *next;
    size_t used;
    lk_json nodes[BLOCK_NODES];
};

typedef struct {
    const unsigned char *p, *end, *start;
    char *str;             /* next free byte of doc->strings */
    lk_json_doc *doc;
} parser;

static int fail(parser *ps, const char *fmt, ...) {
    int n = snprintf(ps->doc->error, sizeof ps->doc->error, "at byte %zu: ", (size_t)(ps->p - ps->start));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->doc->error + n, sizeof ps->doc->error - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static lk_json *new_node(parser *ps, lk_json_type type) {
    lk_json_block *b = ps->doc->blocks;
    if (!b || b->used == BLOCK_NODES) {
        b = malloc(sizeof *b);
        if (!b) return NULL;
        b->next = ps->doc->blocks;
        b->used = 0;
        ps->doc->blocks = b;
    }
    lk_json *v = &b->nodes[b->used++];
    memset(v, 0, sizeof *v);
    v->type = type;
    return v;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

/* Length of the UTF-8 sequence at s (at most n bytes available), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
    if (cp >= 0xd800 && cp <= 0xdfff) return 0;
    return len;
}

int lk_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static int hex4(parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return fail(ps, "bad hex digit in a \\u escape");
    }
    *out = v;
    return 0;
}

static char *put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) { *o++ = (char)(0xc0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) {
        *o++ = (char)(0xe0 | cp >> 12); *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *o++ = (char)(0xf0 | cp >> 18); *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f));
    }
    return o;
}

/* At the opening quote. Decoded text never outgrows its literal, so strings fit. */
static int parse_string(parser *ps, const char **text, size_t *len) {
    ps->p++;
    char *o = ps->str, *begin = o;
    for (;;) {
        if (ps->p >= ps->end) return fail(ps, "unterminated string");
        unsigned c = *ps->p;
        if (c == '"') { ps->p++; break; }
        if (c < 0x20) return fail(ps, "control character 0x%02x in a string", c);
        if (c == '\\') {
            if (ps->end - ps->p < 2) return fail(ps, "unterminated string");
            unsigned e = ps->p[1];
            ps->p += 2;
            const char *simple = strchr("\"\\/bfnrt", (int)e);
            if (e && simple) { *o++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"]; continue; }
            if (e != 'u') { ps->p--; return fail(ps, "bad escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?'); }
            uint32_t cp;
            if (hex4(ps, &cp)) return -1;
            if (cp >= 0xdc00 && cp <= 0xdfff) return fail(ps, "lone low surrogate in a \\u escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                    return fail(ps, "high surrogate without its low half");
                ps->p += 2;
                if (hex4(ps, &lo)) return -1;
                if (lo < 0xdc00 || lo > 0xdfff) return fail(ps, "high surrogate without its low half");
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0) return fail(ps, "\\u0000 in a string is not supported");
            o = put_utf8(o, cp);
            continue;
        }
        size_t k = utf8_seq(ps->p, (size_t)(ps->end - ps->p));
        if (!k) return fail(ps, "invalid UTF-8 in a string");
        memcpy(o, ps->p, k);
        o += k;
        ps->p += k;
    }
    *o = '\0';
    *text = begin;
    *len = (size_t)(o - begin);
    ps->str = o + 1;
    return 0;
}

static int digits(parser *ps) {
    const unsigned char *s = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    return ps->p > s ? 0 : fail(ps, "expected a digit");
}

static int parse_number(parser *ps, lk_json *v) {
    const unsigned char *s = ps->p;
    if (*ps->p == '-') ps->p++;
    if (ps->p < ps->end && *ps->p == '0') ps->p++;
    else if (digits(ps)) return -1;
    if (ps->p < ps->end && *ps->p == '.') { ps->p++; if (digits(ps)) return -1; }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (digits(ps)) return -1;
    }
    size_t n = (size_t)(ps->p - s);
    memcpy(ps->str, s, n);
    ps->str[n] = '\0';
    v->text = ps->str;
    v->len = n;
    ps->str += n + 1;
    return 0;
}

static int parse_value(parser *ps, lk_json **out, int depth);

/* Arrays and objects: elements (object: "key": value) separated by commas. */
static int parse_container(parser *ps, lk_json *v, int depth) {
    int is_obj = v->type == LK_JSON_OBJECT;
    char close = is_obj ? '}' : ']';
    if (depth >= MAX_DEPTH) return fail(ps, "nesting deeper than %d", MAX_DEPTH);
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
    lk_json **tail = &v->child;
    for (;;) {
        const char *key = NULL;
        size_t key_len;
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
            if (parse_string(ps, &key, &key_len)) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':' after an object key");
            ps->p++;
        }
        lk_json *item;
        if (parse_value(ps, &item, depth + 1)) return -1;
        item->key = key;
        *tail = item;
        tail = &item->next;
        v->count++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; skip_ws(ps); continue; }
        if (ps->p < ps->end && *ps->p == close) { ps->p++; return 0; }
        return fail(ps, "expected ',' or '%c'", close);
    }
}

static int parse_value(parser *ps, lk_json **out, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    unsigned c = *ps->p;
    static const struct { const char *word; lk_json_type type; int b; } words[] = {
        {"null", LK_JSON_NULL, 0}, {"true", LK_JSON_BOOL, 1}, {"false", LK_JSON_BOOL, 0}};
    lk_json_type type = c == '{' ? LK_JSON_OBJECT : c == '[' ? LK_JSON_ARRAY : c == '"' ? LK_JSON_STRING
                      : (c == '-' || (c >= '0' && c <= '9')) ? LK_JSON_NUMBER : LK_JSON_NULL;
    lk_json *v = new_node(ps, type);
    if (!v) return fail(ps, "out of memory");
    *out = v;
    switch (type) {
    case LK_JSON_OBJECT: case LK_JSON_ARRAY: return parse_container(ps, v, depth);
    case LK_JSON_STRING: return parse_string(ps, &v->text, &v->len);
    case LK_JSON_NUMBER: return parse_number(ps, v);
    default: break;
    }
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, words[i].word, n) == 0) {
            v->type = words[i].type;
            v->boolean = words[i].b;
            ps->p += n;
            return 0;
        }
    }
    if (c >= 0x80) return fail(ps, "invalid byte 0x%02x (not JSON; non-ASCII only belongs in strings)", c);
    return fail(ps, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? (char)c : '?');
}

int lk_json_parse(const char *text, size_t len, lk_json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    parser ps = {(const unsigned char *)text, (const unsigned char *)text + len,
                 (const unsigned char *)text, NULL, doc};
    doc->strings = malloc(len + 1);
    if (!doc->strings) return fail(&ps, "out of memory");
    ps.str = doc->strings;
    if (parse_value(&ps, &doc->root, 0)) return -1;
    skip_ws(&ps);
    if (ps.p != ps.end) return fail(&ps, "unexpected data after the JSON value");
    return 0;
}

void lk_json_free(lk_json_doc *doc) {
    while (doc->blocks) {
        lk_json_block *next = doc->blocks->next;
        free(doc->blocks);
        doc->blocks = next;
    }
    free(doc->strings);
    doc->strings = NULL;
    doc->root = NULL;
}

const char *lk_json_type_name(lk_json_type t) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return (unsigned)t < 6 ? names[t] : "?";
}

const lk_json *lk_json_get(const lk_json *obj, const char *key) {
    if (!obj || obj->type != LK_JSON_OBJECT) return NULL;
    for (const lk_json *m = obj->child; m; m = m->next)
        if (strcmp(m->key, key) == 0) return m;
    return NULL;
}

const char *lk_json_duplicate_key(const lk_json *obj) {
    for (const lk_json *a = obj->child; a; a = a->next)
        for (const lk_json *b = a->next; b; b = b->next)
            if (strcmp(a->key, b->key) == 0) return a->key;
    return NULL;
}

static int is_integer_literal(const lk_json *v) {
    return v && v->type == LK_JSON_NUMBER && !strpbrk(v->text, ".eE");
}

int lk_json_u64(const lk_json *v, uint64_t *out) {
    if (!is_integer_literal(v) || v->text[0] == '-') return -1;
    uint64_t x = 0;
    for (const char *s = v->text; *s; s++) {
        if (x > (UINT64_MAX - (uint64_t)(*s - '0')) / 10) return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *out = x;
    return 0;
}

int lk_json_i64(const lk_json *v, int64_t *out) {
    if (!is_integer_literal(v)) return -1;
    errno = 0;
    long long x = strtoll(v->text, NULL, 10);
    if (errno) return -1;
    *out = (int64_t)x;
    return 0;
}

int lk_json_f64(const lk_json *v, double *out) {
    if (!v || v->type != LK_JSON_NUMBER) return -1;
    double x = strtod(v->text, NULL);
    if (!isfinite(x)) return -1;
    *out = x;
    return 0;
}

/* ---- writer ---- */

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
