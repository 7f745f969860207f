/* table.c — the one table printer of the llmkern command (cli.h: cli_table_*, cli_text).
 * A table keeps copies of its cells until it is printed; each column is as wide as its
 * widest cell or header, columns are two spaces apart, numbers may be right-aligned, and
 * the last column is wrapped at spaces (a word longer than the column is cut) so that
 * every line fits in CLI_WIDTH columns, its continuation lines starting under it. No
 * line ends in a space. Widths count code points, so UTF-8 text lines up too. While rows
 * are being made (check, bench), cli_progress keeps one status line on a terminal's stderr. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/cli.h"

/* The narrowest the wrapped last column gets: when the columns before it leave less, the
 * line is allowed past CLI_WIDTH rather than a cell cut into slivers. */
#define MIN_WRAP 20

void cli_table_init(cli_table *t, int ncol, const char *const *head, unsigned right) {
    memset(t, 0, sizeof *t);
    t->ncol = ncol < CLI_TABLE_COLS ? ncol : CLI_TABLE_COLS;
    for (int c = 0; c < t->ncol && head; c++) t->head[c] = head[c];   /* head NULL: no header line */
    t->right = right;
}

void cli_table_add(cli_table *t, const char *const *cells) {
    if (t->oom) return;
    if (t->nrow == t->cap) {
        int cap = t->cap ? 2 * t->cap : 32;
        char **grown = realloc(t->cell, sizeof(char *) * (size_t)cap * (size_t)t->ncol);
        if (!grown) { t->oom = 1; return; }
        t->cell = grown;
        t->cap = cap;
    }
    char **row = t->cell + (size_t)t->nrow * (size_t)t->ncol;
    for (int c = 0; c < t->ncol; c++) {
        row[c] = strdup(cells[c] ? cells[c] : "");
        if (!row[c]) {
            while (c-- > 0) free(row[c]);
            t->oom = 1;
            return;
        }
    }
    t->nrow++;
}

void cli_table_free(cli_table *t) {
    for (size_t i = 0; i < (size_t)t->nrow * (size_t)t->ncol; i++) free(t->cell[i]);
    free(t->cell);
    memset(t, 0, sizeof *t);
}

/* Columns (code points) of the n bytes at s. */
static int cols_of(const char *s, size_t n) {
    int w = 0;
    for (size_t i = 0; i < n; i++) w += ((unsigned char)s[i] & 0xc0) != 0x80;
    return w;
}

/* Bytes of the longest prefix of s that fits in w columns, never inside a code point. */
static size_t fit(const char *s, int w) {
    size_t i = 0;
    for (int k = 0; s[i]; k++) {
        if (k == w) return i;
        i++;
        while (((unsigned char)s[i] & 0xc0) == 0x80) i++;
    }
    return i;
}

/* The next line of wrapped text: *len bytes from the returned start; *rest moves on. */
static const char *next_line(const char **rest, int w, size_t *len) {
    const char *s = *rest;
    while (*s == ' ') s++;
    size_t n = fit(s, w);
    if (s[n] != '\0' && s[n] != ' ') {         /* cut at the last space that fits, if any */
        size_t k = n;
        while (k > 0 && s[k - 1] != ' ') k--;
        if (k > 0) n = k;
    }
    *len = n;
    *rest = s + n;
    while (*len > 0 && s[*len - 1] == ' ') (*len)--;
    return s;
}

/* One output line: pieces appended, trailing spaces dropped when it is written. */
typedef struct { char buf[4096]; size_t n; } line_buf;

static void put(line_buf *l, const char *s, size_t n) {
    if (n > sizeof l->buf - 1 - l->n) n = sizeof l->buf - 1 - l->n;
    memcpy(l->buf + l->n, s, n);
    l->n += n;
}

static void pad(line_buf *l, int k) {
    while (k-- > 0) put(l, " ", 1);
}

static void flush(line_buf *l, FILE *f) {
    while (l->n > 0 && l->buf[l->n - 1] == ' ') l->n--;
    fwrite(l->buf, 1, l->n, f);
    fputc('\n', f);
    l->n = 0;
}

static void print_row(const cli_table *t, FILE *f, int indent, const int *width, int wrap,
                      const char *const *cells) {
    line_buf l = {.n = 0};
    int last = t->ncol - 1;
    pad(&l, indent);
    for (int c = 0; c < last; c++) {
        int w = cols_of(cells[c], strlen(cells[c]));
        if (t->right >> c & 1) pad(&l, width[c] - w);
        put(&l, cells[c], strlen(cells[c]));
        if (!(t->right >> c & 1)) pad(&l, width[c] - w);
        pad(&l, 2);
    }
    const char *rest = cells[last];
    int lead = indent;
    for (int c = 0; c < last; c++) lead += width[c] + 2;
    if (t->right >> last & 1) pad(&l, width[last] - cols_of(rest, strlen(rest)));
    do {
        size_t n;
        const char *s = next_line(&rest, wrap, &n);
        if (l.n == 0) pad(&l, lead);
        put(&l, s, n);
        flush(&l, f);
        while (*rest == ' ') rest++;
    } while (*rest);
}

lk_status cli_table_print(cli_table *t, FILE *f, int indent) {
    if (t->oom) {
        cli_table_free(t);
        return lk_error(LK_ENOMEM, "table: out of memory");
    }
    int width[CLI_TABLE_COLS] = {0}, used = indent, last = t->ncol - 1;
    int has_head = t->head[0] != NULL;
    for (int c = 0; c < t->ncol; c++) {
        if (has_head && t->head[c]) width[c] = cols_of(t->head[c], strlen(t->head[c]));
        for (int r = 0; r < t->nrow; r++) {
            const char *s = t->cell[(size_t)r * (size_t)t->ncol + (size_t)c];
            int w = cols_of(s, strlen(s));
            if (w > width[c]) width[c] = w;
        }
        if (c < last) used += width[c] + 2;
    }
    int wrap = CLI_WIDTH - used;
    if (wrap < MIN_WRAP) wrap = MIN_WRAP;
    if (wrap > width[last]) wrap = width[last] > 0 ? width[last] : 1;
    if (has_head) {
        const char *head[CLI_TABLE_COLS];
        for (int c = 0; c < t->ncol; c++) head[c] = t->head[c] ? t->head[c] : "";
        print_row(t, f, indent, width, wrap, head);
    }
    for (int r = 0; r < t->nrow; r++)
        print_row(t, f, indent, width, wrap, (const char *const *)t->cell + (size_t)r * (size_t)t->ncol);
    cli_table_free(t);
    return LK_OK;
}

void cli_text(FILE *f, int indent, int hang, const char *text) {
    const char *rest = text;
    line_buf l = {.n = 0};
    for (int first = 1; first || *rest; first = 0) {
        int lead = first ? indent : hang, w = CLI_WIDTH - lead;
        size_t n;
        const char *s = next_line(&rest, w > MIN_WRAP ? w : MIN_WRAP, &n);
        pad(&l, lead);
        put(&l, s, n);
        flush(&l, f);
        while (*rest == ' ') rest++;
    }
}

void cli_progress(const char *text) {
    static int shown;
    if (!isatty(STDERR_FILENO)) return;
    if (text) fprintf(stderr, "\r%.*s\033[K", CLI_WIDTH - 1, text);
    else if (shown) fputs("\r\033[K", stderr);
    shown = text != NULL;
    fflush(stderr);
}
