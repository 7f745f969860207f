/* util.c — see util.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

lk_comm *dist_world;
int dist_failures;

void dist_begin(void) {
    if (lk_init() != LK_OK || lk_comm_mpi_world(&dist_world) != LK_OK) {
        fprintf(stderr, "dist: set-up failed: %s\n", lk_last_error());
        exit(1);
    }
}

int dist_end(const char *program) {
    int64_t n = dist_failures;
    if (lk_comm_all_reduce(dist_world, &n, 1, LK_COMM_I64) != LK_OK) n = 1 + dist_failures;
    if (dist_world->rank == 0) printf("%s on %d ranks: %s (%lld failed checks)\n", program, dist_world->size,
                                      n ? "FAILED" : "ok", (long long)n);
    lk_comm_destroy(dist_world);
    lk_comm_mpi_finalize();
    return n ? 1 : 0;
}

double dist_rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e;          /* NaN propagates as a failure */
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return d / m;
}

static double at(const void *p, lk_dtype dt, int64_t i) {
    return dt == LK_F32 ? ((const float *)p)[i] : lk_bf16_to_f32(((const uint16_t *)p)[i]);
}

double dist_rel_err_dt(const void *got, const void *want, lk_dtype dt, int64_t n) {
    double e = 0.0, m = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double g = at(got, dt, i), w = at(want, dt, i);
        if (isnan(g)) return INFINITY;
        if (isinf(w) || isinf(g)) {
            if (g != w) return INFINITY;
            continue;
        }
        e = fmax(e, fabs(g - w)), m = fmax(m, fabs(w));
    }
    return e / m;
}

void dist_rm_rf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

void dist_box(const void *src, const int64_t n[4], int64_t o1, int64_t m1, int64_t o2, int64_t m2, void *dst,
              size_t es) {
    size_t run = (size_t)(m2 * n[3]) * es;
    for (int64_t i0 = 0; i0 < n[0]; i0++)
        for (int64_t i1 = 0; i1 < m1; i1++)
            memcpy((char *)dst + (size_t)(i0 * m1 + i1) * run,
                   (const char *)src + (size_t)(((i0 * n[1] + o1 + i1) * n[2] + o2) * n[3]) * es, run);
}
