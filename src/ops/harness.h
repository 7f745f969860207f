/* harness.h — what `llmkern check` and `llmkern bench` (and the tests) need of an op:
 * a comparison of one implementation with the float64 reference on fresh random
 * inputs, and a timing of its passes. One lk_harness per op, listed in harness.c. */
#ifndef LLMKERN_HARNESS_H
#define LLMKERN_HARNESS_H

#include <stdio.h>
#include "llmkern/llmkern.h"

typedef struct {
    int ndim;
    int64_t d[LK_MAX_DIMS];
} lk_shape;

typedef struct {
    char op[32], impl[48], dtype[8], shape[64];
    double max_rel_err;     /* worst over every output: max|got - ref| / max|ref| */
    double tol;             /* for this implementation and dtype */
    int pass;
} lk_check_row;

typedef struct {
    char op[32], impl[48], device[8], dtype[8], shape[64], pass[8];  /* pass: fwd, bwd, fwd+bwd */
    double ms, gbps, gflops, ceiling_fraction;
    size_t peak_bytes;      /* extra memory: saved for the backward + workspace peak */
} lk_bench_row;

typedef struct {
    double copy_gbps;       /* measured in the same run: read + write of a large buffer */
    double gemm_gflops;     /* f32 GEMM through CBLAS */
} lk_ceilings;

typedef struct {
    lk_op op;
    /* Runs impl forward and backward against the float64 reference on one shape. */
    lk_status (*check)(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                       lk_check_row *row);
    const lk_shape *check_shapes;       /* what `llmkern check` runs */
    int n_check_shapes;
    /* Times forward, backward and forward+backward: writes rows[0..2]. */
    lk_status (*bench)(const lk_impl *impl, lk_dtype dt, const lk_shape *shape,
                       const lk_ceilings *ceil, lk_bench_row rows[3]);
    lk_shape bench_shape;               /* the default size */
    unsigned dtypes;                    /* LK_DTYPE_BIT mask that check and bench run */
} lk_harness;

/* Measures copy bandwidth and the GEMM rate; rows[0..1] describe them as bench rows. */
lk_status lk_measure_ceilings(lk_ceilings *c, lk_bench_row rows[2]);

/* The harness of an op, or NULL when this build has none. */
const lk_harness *lk_harness_get(lk_op op);

/* --- shared pieces for harnesses ---------------------------------------------- */

/* "8192x4096" <-> shape */
const char *lk_shape_format(const lk_shape *s, char *buf, size_t n);
lk_status lk_shape_parse(const char *text, lk_shape *s);
int64_t lk_shape_numel(const lk_shape *s);

/* A buffer of n elements of dt filled with normal(0, std) (rounded to dt), and the
 * same values as double in ref (may be NULL). Caller frees both with free(). */
void *lk_random_tensor(lk_rng *rng, lk_dtype dt, int64_t n, float std, double **ref);
/* Fills n elements with NaN so an unwritten output fails the comparison. */
void lk_poison(void *data, lk_dtype dt, int64_t n);
/* max|got - ref| / max|ref| over n elements; a NaN anywhere gives +inf. */
double lk_rel_err(const void *got, lk_dtype dt, const double *ref, int64_t n);
/* Median milliseconds of fn(arg) over enough repetitions (after a warm-up). */
double lk_time_ms(void (*fn)(void *), void *arg, double min_seconds);

#endif
