/* cli.h — the llmkern command's pieces: one file per command, and what they share:
 * the option parser's result, the JSON writer (json.c) and the table printer (table.c). */
#ifndef LLMKERN_CLI_H
#define LLMKERN_CLI_H

#include <stdio.h>
#include "llmkern/llmkern.h"
#include "ops/harness.h"

typedef struct {
    int json;
    const char *config;     /* --config FILE */
    const char *family;     /* --family qwen3 (NULL: the config's model, else qwen3) */
    const char *op;         /* --op NAME */
    const char *impl;       /* --impl NAME */
    const char *dtype;      /* --dtype f32 */
    const char *size;       /* --size 8192x4096 */
    const char *mask;       /* bench --mask document (attention) */
    const char *kv_heads;   /* bench --kv-heads 2 (attention) */
    const char *block;      /* bench --block 64 (attention's BlockMask) */
    unsigned long long seed;
    const char *out;        /* train --out DIR */
    const char *resume;     /* train --resume DIR */
    const char *init;       /* train --init DIR (a Hugging Face checkpoint: model.init_from) */
    const char *device;     /* --device cpu|cuda: train's and explain's (the config's train.device otherwise);
                             * check's rows (every device otherwise) */
    long long steps;        /* train --steps N (0: the config's) */
    int no_save;            /* train --no-save: no checkpoint, no final model (benchmarks) */
    int save_init;          /* train --save-init: the initial weights saved into --out, no step */
} cli_opts;

int cli_list(const cli_opts *o);
int cli_explain(const cli_opts *o);
int cli_check(const cli_opts *o);
int cli_bench(const cli_opts *o);
int cli_train(const cli_opts *o);

/* Prints the error of a failed call and returns the exit status 2. */
int cli_fail(const char *what, lk_status s);

/* --- the JSON writer (json.c): every command's --json --------------------------------- */
typedef struct {
    FILE *f;
    int in_array;           /* objects go one a line inside "[" ... "]" */
    int items, keys;        /* objects written so far, keys of the open object */
} cli_json;
/* Writes s (NULL: "") as a JSON string: quote, backslash and control characters
 * escaped, bytes that are not UTF-8 written as U+FFFD. */
void cli_json_string(FILE *f, const char *s);
/* "[" ... "\n]\n": an array of objects, one a line. */
void cli_json_begin(cli_json *j, FILE *f);
void cli_json_end(cli_json *j);
/* Opens an object: the array's next one (f NULL), or a bare one on f ("{...}\n"). */
void cli_json_object(cli_json *j, FILE *f);
void cli_json_close(cli_json *j);
/* One member of the open object; fmt is a printf format of one double, and a value
 * that is not finite is written as null. */
void cli_json_str(cli_json *j, const char *key, const char *v);
void cli_json_num(cli_json *j, const char *key, const char *fmt, double v);
void cli_json_int(cli_json *j, const char *key, long long v);
void cli_json_bool(cli_json *j, const char *key, int v);

/* --- the table printer (table.c): every command's text output -------------------------- */
#define CLI_WIDTH 120           /* every line of list and explain fits (tests/cli_output.sh) */
#define CLI_TABLE_COLS 12
typedef struct {
    int ncol;
    const char *head[CLI_TABLE_COLS];  /* all NULL: no header line */
    unsigned right;                    /* bit c set: column c right-aligned (numbers) */
    int nrow, cap, oom;
    char **cell;                       /* nrow x ncol copies, owned */
} cli_table;
/* head: ncol column names, or NULL for a table without a header line. */
void cli_table_init(cli_table *t, int ncol, const char *const *head, unsigned right);
/* Appends a copy of one row of ncol cells (NULL cells are empty). */
void cli_table_add(cli_table *t, const char *const *cells);
/* Prints the table indented by indent (widths measured from its rows, the last column
 * wrapped within CLI_WIDTH, no trailing spaces) and frees it; LK_ENOMEM when a row
 * could not be kept. */
lk_status cli_table_print(cli_table *t, FILE *f, int indent);
void cli_table_free(cli_table *t);
/* Prints text wrapped within CLI_WIDTH: its first line indented by indent, the others
 * by hang. */
void cli_text(FILE *f, int indent, int hang, const char *text);
/* What a long command is doing, on one line of stderr rewritten in place, when stderr is
 * a terminal (elsewhere nothing); NULL clears it. */
void cli_progress(const char *text);

/* The ops --op selects (all when NULL); 0 and a message when the name is unknown. */
int cli_ops(const char *name, int selected[LK_OP_COUNT]);
/* The harness `check` and `bench` run impl with: NULL unless its op is selected, has a
 * harness, impl's device is one of devices (CLI_DEVICE bits: check moves its tensors to
 * any row's device; bench times CPU rows only, CUDA rows are bench/peers_cuda.py's), is
 * the row --impl names (any when NULL) and can run here. */
#define CLI_DEVICE(type) (1u << (type))
const lk_harness *cli_harness_for(const lk_impl *impl, const int selected[LK_OP_COUNT], const char *only,
                                  unsigned devices);

#endif
