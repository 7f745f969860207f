/* check.h — one SwiGLU MLP comparison with the float64 reference, with the options the
 * lk_harness check() leaves at their defaults. harness.c builds `llmkern check` on it;
 * tests/test_swiglu_mlp.c calls it directly.
 * A check shape is [leading dims of x..., H, I]: "13x19x11" is x [13, 19],
 * gate_up_weight [22, 19], down_weight [19, 11]. */
#ifndef LLMKERN_SWIGLU_MLP_CHECK_H
#define LLMKERN_SWIGLU_MLP_CHECK_H

#include "ops/harness.h"

typedef struct {
    float swiglu_limit;     /* 0 = off; > 0: moved within [0.8, 1.2]x to the point farthest from
                               every pre-activation, so rounding cannot flip a clamp */
    int grad_f32;           /* weight gradients in f32 rather than the storage dtype */
    int no_weight_grads;    /* d_gate_up_weight, d_down_weight data NULL: not wanted */
    int backward_calls;     /* 0 or 1: one backward; 2: two, the weight gradients must double */
    int saved_alone;        /* the backward reads the saved block of a forward with out.data NULL (a
                               recompute's); out is then made by a second forward, after the backward */
} lk_swiglu_mlp_case;

typedef struct {
    double out, dx, d_gate_up_weight, d_down_weight;
} lk_swiglu_mlp_errors;

/* Runs impl forward and backward on fresh random inputs (outputs poisoned, weight
 * gradients pre-filled with random values they must be added to) and compares with the
 * reference computed from the same dtype-rounded inputs. Fills row (pass = worst error
 * <= tol) and, if not NULL, err. Returns the facade's status if a pass fails, LK_ENOMEM
 * if buffers cannot be had, LK_EINVAL for a shape of fewer than 3 dims. */
lk_status lk_swiglu_mlp_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                                   const lk_swiglu_mlp_case *c, lk_check_row *row, lk_swiglu_mlp_errors *err);

/* The tolerance for impl in dt (see the table in harness.c). */
double lk_swiglu_mlp_tol(const lk_impl *impl, lk_dtype dt);

#endif
