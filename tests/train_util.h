/* train_util.h — what the trainer's tests share (tests/test_train_loop.c on the CPU,
 * tests/cuda/test_train_resume.c on a GPU): temporary output directories, whole-file
 * reads, checkpoint comparisons, and the resume check itself. Header-only: each test
 * program includes it once, after cmocka.h. */
#ifndef LLMKERN_TESTS_TRAIN_UTIL_H
#define LLMKERN_TESTS_TRAIN_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/checkpoint.h"
#include "llmkern/train.h"

static inline char *tmpdir(void) {
    char *d = strdup("/tmp/llmkern_train_XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static inline void rm_rf(char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

static inline uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

static inline void assert_latest(const char *dir, const char *want) {
    char p[600];
    size_t n;
    snprintf(p, sizeof p, "%s/latest", dir);
    char *t = (char *)slurp(p, &n);
    assert_non_null(t);
    assert_string_equal(t, want);
    free(t);
}

/* Every tensor of two optimizer files but the trainer's history: same names, same bits
 * (the first that differs is named). */
static inline void assert_same_weights(const char *a_path, const char *b_path) {
    lk_st_file *a, *b;
    assert_int_equal(lk_st_open(a_path, &a), LK_OK);
    assert_int_equal(lk_st_open(b_path, &b), LK_OK);
    assert_int_equal(lk_st_count(a), lk_st_count(b));
    int n_params = 0;
    for (size_t i = 0; i < lk_st_count(a); i++) {
        const lk_st_tensor *x = lk_st_at(a, i), *y = lk_st_find(b, x->name);
        assert_non_null(y);
        assert_int_equal(x->nbytes, y->nbytes);
        if (strcmp(x->name, "trainer/history") == 0) continue;   /* tokens/s differ; losses compared apart */
        if (memcmp(x->data, y->data, x->nbytes) != 0) print_error("%s differs\n", x->name);
        assert_memory_equal(x->data, y->data, x->nbytes);
        n_params += strncmp(x->name, "param/", 6) == 0;
    }
    assert_true(n_params > 10);
    lk_st_close(a);
    lk_st_close(b);
}

/* N steps straight against N/2 steps, a stop (as if killed after the checkpoint of step
 * N/2), --resume from the output directory and N/2 more: every loss, every tensor of the
 * final optimizer file and loss.csv (but its tokens/s) bit for bit. config(out, steps,
 * save_every) sets up tc and ops for a run into out. */
static inline void assert_resume_bit_identical(lk_train_config *tc, lk_ops_config *ops,
                                               void (*config)(const char *out, int64_t steps, int64_t save_every)) {
    enum { N = 6 };
    char *da = tmpdir(), *db = tmpdir(), pa[600], pb[600];
    float la[N], lb[N];
    lk_train_opts o = {.quiet = 1, .loss_log = la, .loss_log_cap = N};
    lk_train_result r;
    config(da, N, 3);
    assert_int_equal(lk_train_run(tc, ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, N);
    assert_true(r.last_loss < r.first_loss);

    memset(lb, 0, sizeof lb);
    o.loss_log = lb;
    o.stop_at = N / 2;             /* as if killed after step 3 (checkpoint-3 written) */
    config(db, N, 3);
    assert_int_equal(lk_train_run(tc, ops, NULL, &o, &r), LK_OK);
    assert_int_equal(r.steps_done, N / 2);
    snprintf(pb, sizeof pb, "%s/model.safetensors", db);
    assert_true(access(pb, F_OK) != 0);   /* a stopped run writes no final model */
    o.stop_at = 0;
    lk_status rs = lk_train_run(tc, ops, db, &o, &r);   /* resume from the output dir */
    if (rs) print_error("resume: %s\n", lk_last_error());
    assert_int_equal(rs, LK_OK);
    assert_int_equal(r.first_step, N / 2);
    assert_int_equal(r.steps_done, N);
    for (int i = 0; i < N; i++)
        if (memcmp(&la[i], &lb[i], sizeof la[i])) print_error("loss %d: %a straight, %a resumed\n", i, la[i], lb[i]);
    assert_memory_equal(la, lb, sizeof la);   /* every loss, bit for bit */
    snprintf(pa, sizeof pa, "%s/checkpoint-%d/optimizer.safetensors", da, N);
    snprintf(pb, sizeof pb, "%s/checkpoint-%d/optimizer.safetensors", db, N);
    assert_same_weights(pa, pb);
    assert_latest(db, "checkpoint-6\n");
    /* loss.csv of the resumed run holds all N steps with the same losses. */
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/loss.csv", da);
    snprintf(pb, sizeof pb, "%s/loss.csv", db);
    char *ca = (char *)slurp(pa, &na), *cb = (char *)slurp(pb, &nb), *sa, *sb;
    int lines = 0;
    for (char *a = strtok_r(ca, "\n", &sa), *b = strtok_r(cb, "\n", &sb); a || b;
         a = strtok_r(NULL, "\n", &sa), b = strtok_r(NULL, "\n", &sb), lines++) {
        assert_true(a && b);
        char *ea = strrchr(a, ','), *eb = strrchr(b, ',');   /* drop tokens_per_s */
        *ea = *eb = 0;
        assert_string_equal(a, b);
    }
    assert_int_equal(lines, N + 1);
    free(ca);
    free(cb);
    rm_rf(da);
    rm_rf(db);
}

#endif
