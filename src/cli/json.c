/* json.c — the one JSON writer of the llmkern command (cli.h: cli_json_*). `--json` of
 * list, explain, check and bench is an array of flat objects, one object a line:
 *   [
 *     {"op": "rms_norm", "impl": "fused", "available": true},
 *     {...}
 *   ]
 * and `train --json` writes bare objects, one a line (JSON Lines). Strings are escaped
 * as RFC 8259 asks (quote, backslash, every control character; bytes that are not UTF-8
 * become U+FFFD, so the output stays valid UTF-8); a number that is not finite is written
 * as null (JSON has no NaN or Inf). */
#include <math.h>
#include <string.h>
#include "cli/cli.h"

/* The length of the well-formed UTF-8 sequence at p (1..4), 0 when it is not one
 * (overlong forms, surrogates and code points above U+10FFFF are not). */
static int utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n <= 1) return n;
    unsigned cp = c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const unsigned least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

void cli_json_string(FILE *f, const char *s) {
    fputc('"', f);
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    while (*p) {
        unsigned c = *p;
        int n = utf8_len(p);
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else if (n == 0) { fputs("\\ufffd", f); p++; continue; }
        else { fwrite(p, 1, (size_t)n, f); p += n; continue; }
        p++;
    }
    fputc('"', f);
}

void cli_json_begin(cli_json *j, FILE *f) {
    *j = (cli_json){.f = f, .in_array = 1};
    fputc('[', f);
}

void cli_json_end(cli_json *j) { fputs(j->items ? "\n]\n" : "]\n", j->f); }

void cli_json_object(cli_json *j, FILE *f) {
    if (f) *j = (cli_json){.f = f};    /* a bare object: train's one per step */
    if (j->in_array) fputs(j->items ? ",\n  {" : "\n  {", j->f);
    else fputc('{', j->f);
    j->items++;
    j->keys = 0;
}

void cli_json_close(cli_json *j) { fputs(j->in_array ? "}" : "}\n", j->f); }

static void key(cli_json *j, const char *k) {
    if (j->keys++) fputs(", ", j->f);
    cli_json_string(j->f, k);
    fputs(": ", j->f);
}

void cli_json_str(cli_json *j, const char *k, const char *v) {
    key(j, k);
    cli_json_string(j->f, v);
}

void cli_json_num(cli_json *j, const char *k, const char *fmt, double v) {
    key(j, k);
    if (isfinite(v)) fprintf(j->f, fmt, v);
    else fputs("null", j->f);
}

void cli_json_int(cli_json *j, const char *k, long long v) {
    key(j, k);
    fprintf(j->f, "%lld", v);
}

void cli_json_bool(cli_json *j, const char *k, int v) {
    key(j, k);
    fputs(v ? "true" : "false", j->f);
}
