/* check.h — one linear comparison with the float64 reference, with the options the
 * lk_harness check() leaves at their defaults. harness.c builds `llmkern check` on it;
 * tests/test_linear.c calls it directly.
 * A check shape is [leading dims of x..., I, O]: "7x33x17" is x [7, 33], W [17, 33];
 * "2x3x5x4" is x [2, 3, 5], W [4, 5]. */
#ifndef LLMKERN_LINEAR_CHECK_H
#define LLMKERN_LINEAR_CHECK_H

#include "ops/harness.h"

typedef struct {
    int no_bias;            /* bias.data = NULL (and no dbias) */
    int grad_f32;           /* dweight, dbias in f32 rather than the storage dtype */
    int no_dx;              /* dx.data = NULL: not wanted */
    int backward_calls;     /* 0 or 1: one backward; 2: two, the gradients must double */
} lk_linear_case;

typedef struct {
    double y, dx, dweight, dbias;   /* 0 for an output not produced */
} lk_linear_errors;

/* Runs impl forward and backward on fresh random inputs (outputs poisoned, gradients
 * pre-filled with random values they must be added to) and compares with the reference
 * computed from the same dtype-rounded inputs. Fills row (pass = worst error <= tol)
 * and, if not NULL, err. Returns the facade's status if a pass fails, LK_ENOMEM if
 * buffers cannot be had, LK_EINVAL for a shape of fewer than 2 dims. */
lk_status lk_linear_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                               const lk_linear_case *c, lk_check_row *row, lk_linear_errors *err);

/* The tolerance for impl in dt (see the table in harness.c). */
double lk_linear_tol(const lk_impl *impl, lk_dtype dt);

#endif
