/* fuzz_util.h — shared by the libFuzzer harnesses of tests/fuzz (built by `make fuzz`,
 * scripts/fuzz.sh): the library initialized once, and the input as a file for the
 * loaders that take a path. */
#ifndef LLMKERN_FUZZ_UTIL_H
#define LLMKERN_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"

/* The input written to a file of this process (overwritten each run); its path, or NULL. */
static const char *fuzz_file(const uint8_t *data, size_t size, const char *ext) {
    static char path[128];
    /* /dev/shm when there is one: the file is rewritten every run */
    snprintf(path, sizeof path, "%s/llmkern-fuzz-%d%s", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             (int)getpid(), ext);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    size_t n = size ? fwrite(data, 1, size, f) : 0;
    if (fclose(f) != 0 || n != size) return NULL;
    return path;
}

/* Every status a loader may return for bad input; anything else (or a crash) is a bug. */
static void fuzz_expect_status(lk_status s) {
    if ((unsigned)s > LK_EINTERNAL || s == LK_EINTERNAL) {
        fprintf(stderr, "unexpected status %d: %s\n", (int)s, lk_last_error());
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (lk_init() != LK_OK) abort();
    lk_model_register(&lk_family_qwen3);
    lk_model_register(&lk_family_qwen3_moe);
    return 0;
}

#endif
