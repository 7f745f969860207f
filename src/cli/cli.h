/* cli.h — the llmkern command's pieces: one file per command, and the small
 * option parser and JSON writer they share. */
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
    unsigned long long seed;
    const char *out;        /* train --out DIR */
    const char *resume;     /* train --resume DIR */
    const char *init;       /* train --init DIR (a Hugging Face checkpoint: model.init_from) */
    const char *device;     /* train --device cpu|cuda (the config's train.device otherwise) */
    long long steps;        /* train --steps N (0: the config's) */
} cli_opts;

int cli_list(const cli_opts *o);
int cli_explain(const cli_opts *o);
int cli_check(const cli_opts *o);
int cli_bench(const cli_opts *o);
int cli_train(const cli_opts *o);

/* Prints the error of a failed call and returns the exit status 2. */
int cli_fail(const char *what, lk_status s);
/* Writes s as a JSON string. */
void json_str(FILE *f, const char *s);
/* The ops --op selects (all when NULL); 0 and a message when the name is unknown. */
int cli_ops(const char *name, int selected[LK_OP_COUNT]);

#endif
