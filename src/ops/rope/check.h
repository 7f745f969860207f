/* check.h — one RoPE comparison with the float64 reference, with the options the
 * lk_harness check() leaves at their defaults (packed i64 position ids, theta 1e4, no
 * scaling, separate outputs). harness.c builds `llmkern check` on it;
 * tests/test_rope.c calls it directly.
 *
 * An lk_shape for rope is B x Hq x S x D [x Hk [x R]]: Hk defaults to Hq/4 when 4
 * divides Hq (Qwen3's 32 q heads over 8 kv heads), else Hq; R (rotary_dim) to D. */
#ifndef LLMKERN_ROPE_CHECK_H
#define LLMKERN_ROPE_CHECK_H

#include "ops/harness.h"

typedef enum {
    LK_ROPE_IDS_PACKED_I64,     /* documents of random lengths restarting at 0 */
    LK_ROPE_IDS_PACKED_I32,     /* the same, as i32 */
    LK_ROPE_IDS_NONE,           /* position_ids absent: 0..S-1 */
} lk_rope_ids_mode;

typedef struct {
    lk_rope_ids_mode ids;
    int inplace;                /* q_out over q, k_out over k; dq over dq_out, dk over dk_out */
    double theta;               /* 0: 1e4 */
    lk_rope_scaling scaling;    /* {0}: none */
} lk_rope_case;

/* The error of each output. */
typedef struct {
    double q_out, k_out, dq, dk;
} lk_rope_errors;

/* The dims an lk_shape describes (dtype dt); LK_ESHAPE if it is not 4 to 6 dims. */
lk_status lk_rope_shape_dims(const lk_shape *shape, lk_dtype dt, lk_rope_dims *d);

/* Runs impl forward and backward on fresh random inputs, outputs poisoned first, and
 * compares with the reference computed from the same dtype-rounded inputs and the same
 * f32 tables. Fills row (pass = worst error <= tol) and, if not NULL, err. Returns the
 * facade's status if a pass fails, LK_ENOMEM if buffers cannot be had. */
lk_status lk_rope_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                             const lk_rope_case *c, lk_check_row *row, lk_rope_errors *err);

/* The tolerance for impl in dt (see the table in harness.c). */
double lk_rope_tol(const lk_impl *impl, lk_dtype dt);

/* Fills ids [B, S] with packed documents: row b starts mid-document at position 7·b + 3
 * (a continuation), then documents of random lengths each restart at 0. Returns the
 * largest id + 1. ids is i32 or i64 by dt. */
int64_t lk_rope_packed_ids(void *ids, lk_dtype dt, int64_t B, int64_t S, uint64_t seed);

#endif
