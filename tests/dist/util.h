/* util.h — what the tests/dist programs share: the MPI world, a check that every
 * rank agrees on (a failure anywhere fails the program on every rank), slicing a full
 * tensor into a rank's box, and the relative error they compare with. Each program
 * runs under `mpirun -np 2` and `-np 4` from ctest (CMakeLists.txt). */
#ifndef LLMKERN_DIST_UTIL_H
#define LLMKERN_DIST_UTIL_H

#include <stdio.h>
#include "llmkern/llmkern.h"

extern lk_comm *dist_world;
extern int dist_failures;

/* lk_init, the MPI world; exits 1 on failure. */
void dist_begin(void);
/* Sums the failures over the ranks, prints the verdict on rank 0, finalizes; the exit code. */
int dist_end(const char *program);

#define DIST_CHECK(cond, ...)                                                        \
    do {                                                                             \
        if (!(cond)) {                                                               \
            dist_failures++;                                                         \
            fprintf(stderr, "[rank %d] %s:%d: FAILED %s: ", dist_world->rank, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, " (last error: %s)\n", lk_last_error());                 \
        }                                                                            \
    } while (0)

/* max |a - b| / max(max |b|, 1e-30) over n f32. */
double dist_rel_err(const float *a, const float *b, int64_t n);
/* The same over n elements of dt (f32 or bf16), got against want: a NaN in got, or an
 * infinity want does not have, is infinitely wrong. */
double dist_rel_err_dt(const void *got, const void *want, lk_dtype dt, int64_t n);
/* rm -rf dir (a test's scratch directory); a failure is printed, not fatal. */
void dist_rm_rf(const char *dir);

/* dst (contiguous [n0, m1, m2, n3]) = src[:, o1:o1+m1, o2:o2+m2, :] of src [n0, n1, n2, n3]. */
void dist_box(const void *src, const int64_t n[4], int64_t o1, int64_t m1, int64_t o2, int64_t m2, void *dst,
              size_t es);

#endif
