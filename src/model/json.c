/* json.c — the JSON reader (json.h) on jansson. jansson rather than cJSON: it refuses a
 * key repeated in an object as it parses (JSON_REJECT_DUPLICATES; cJSON keeps both and
 * its lookup returns the first), keeps integers as integers (json_int_t: safetensors'
 * data_offsets and shapes need all 64 bits, cJSON holds every number as a double, exact
 * to 2^53 only), validates UTF-8 and refuses \u0000 in strings and lone surrogates, and
 * reports the byte offset of a failure. What is added here: the nesting limit
 * (LK_JSON_MAX_DEPTH, below jansson's 2048), messages in the project's words for the
 * failures tests pin (data after the value, a surrogate, \u0000), and, for a repeated
 * key, which key in which object: jansson names it only when short, so it is read back
 * from the bytes before the error's offset, which jansson has already accepted. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

lk_status lk_json_file_error(lk_status s, const char *file, const char *where, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lk_error(s, "%s: %s: %s", file, where, msg);
}

/* jansson's text with bytes that are not printable ASCII as '?' (its "near '...'" quotes
 * the input, which is untrusted). */
static void set_message(lk_json_error *e, int pos, const char *text, const char *extra) {
    char clean[JSON_ERROR_TEXT_LENGTH];
    size_t i = 0;
    for (; text[i] && i + 1 < sizeof clean; i++) {
        unsigned char c = (unsigned char)text[i];
        clean[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    clean[i] = '\0';
    snprintf(e->message, sizeof e->message, "at byte %d: %s%s", pos, clean, extra);
}

/* The string literal t[open..close] (quotes included) decoded into out. */
static void decode_literal(const char *t, size_t open, size_t close, char *out, size_t n) {
    json_t *s = json_loadb(t + open, close - open + 1, JSON_DECODE_ANY, NULL);
    snprintf(out, n, "%s", json_is_string(s) ? json_string_value(s) : "?");
    json_decref(s);
}

/* A repeated key: jansson stopped just after its closing quote (t[pos - 1]). Finds the
 * literal, then walks the accepted bytes before it for the nesting and the top-level key
 * whose value holds it. 0 when found. */
static int locate_duplicate(const char *t, size_t len, size_t pos, lk_json_error *e) {
    if (pos < 2 || pos > len || t[pos - 1] != '"') return -1;
    size_t close = pos - 1, open = close;
    for (;;) {   /* the opening quote: the nearest one not escaped */
        if (open == 0) return -1;
        open--;
        size_t bs = 0;
        while (open > bs && t[open - 1 - bs] == '\\') bs++;
        if (t[open] == '"' && bs % 2 == 0) break;
    }
    decode_literal(t, open, close, e->dup_key, sizeof e->dup_key);
    int depth = 0, top_is_object = 0;
    size_t s0 = 0, s1 = 0, k0 = 0, k1 = 0;   /* the last string; the last top-level key */
    for (size_t i = 0; i < open; i++) {
        char c = t[i];
        if (c == '"') {
            s0 = i++;
            while (i < open && t[i] != '"') i += t[i] == '\\' ? 2 : 1;
            s1 = i;
        } else if (c == ':' && depth == 1) {
            k0 = s0;
            k1 = s1;
        } else if (c == '{' || c == '[') {
            if (depth++ == 0) top_is_object = c == '{';
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    e->dup_depth = depth;
    if (depth == 2 && top_is_object && k1 > k0) decode_literal(t, k0, k1, e->dup_parent, sizeof e->dup_parent);
    return 0;
}

/* The offset of the first bracket that opens a container deeper than LK_JSON_MAX_DEPTH,
 * or -1: brackets outside strings counted before jansson reads the text, so a deeper
 * text is refused whatever else is wrong with it. */
static long too_deep(const char *t, size_t len) {
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = t[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > LK_JSON_MAX_DEPTH) return (long)i;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return -1;
}

json_t *lk_json_load(const char *text, size_t len, lk_json_error *err) {
    memset(err, 0, sizeof *err);
    long deep = too_deep(text, len);
    if (deep >= 0) {
        snprintf(err->message, sizeof err->message, "at byte %ld: nesting deeper than %d", deep, LK_JSON_MAX_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (root) return root;
    enum json_error_code code = json_error_code(&je);
    int pos = je.position;
    if (code == json_error_duplicate_key && locate_duplicate(text, len, (size_t)pos, err) == 0)
        snprintf(err->message, sizeof err->message, "at byte %d: key '%s' appears twice", pos, err->dup_key);
    else if (code == json_error_stack_overflow)
        snprintf(err->message, sizeof err->message, "nesting deeper than %d", LK_JSON_MAX_DEPTH);
    else if (code == json_error_end_of_input_expected)
        set_message(err, pos, "unexpected data after the JSON value: ", je.text);
    else if (code == json_error_null_character || code == json_error_null_byte_in_key)
        snprintf(err->message, sizeof err->message, "at byte %d: \\u0000 in a string is not supported", pos);
    else if (strncmp(je.text, "invalid Unicode", 15) == 0)   /* jansson's words for a lone surrogate */
        set_message(err, pos, je.text, " (a lone UTF-16 surrogate in a \\u escape)");
    else
        set_message(err, pos, je.text, "");
    return NULL;
}

const char *lk_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return "null";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_INTEGER: case JSON_REAL: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}

int lk_json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

int lk_json_i64(const json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return -1;
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int lk_json_f64(const json_t *v, double *out) {
    if (!json_is_number(v)) return -1;   /* jansson refuses what overflows a double */
    *out = json_number_value(v);
    return 0;
}

int lk_utf8_valid(const char *s, size_t n) {
    json_t *t = json_stringn(s, n);   /* NULL for invalid UTF-8 (or no memory: refused too) */
    int ok = t != NULL;
    json_decref(t);
    return ok;
}
