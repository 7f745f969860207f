/* check.h — one RMSNorm comparison with the float64 reference, with the options the
 * lk_harness check() leaves at their defaults (no weight, Gemma's offset, dx over dy, the
 * residual mode, an f32 weight; `llmkern check` runs bf16 with and without the last).
 * harness.c builds `llmkern check` on it; tests/test_rms_norm.c calls it directly. */
#ifndef LLMKERN_RMS_NORM_CHECK_H
#define LLMKERN_RMS_NORM_CHECK_H

#include "ops/harness.h"

typedef struct {
    int no_weight;          /* weight.data = NULL: y = x̂, no dweight */
    float weight_offset;    /* 1: Gemma's y = x̂·(1 + w) */
    int inplace_dx;         /* dx written over dy */
    double eps;             /* 0: 1e-6 */
    int residual;           /* the residual mode: an f32 residual and a delta in, x written; the
                             * backward adds dx into a second f32 residual. 2: the stream in x's
                             * dtype for bf16 (a bf16 residual, read only; f32 runs 1) */
    int residual_in_place;  /* with residual 2: the residual is x itself (forward), dx itself
                             * (backward), as a model carrying its stream in bf16 passes them */
    int no_delta;           /* with residual: delta.data NULL (the first layer's norm) */
    int norm_of_x;          /* with residual: the norm of the written x, not of the f32 stream
                             * (what a recompute runs, rms_norm.h) */
    int f32_weight;         /* weight and dweight f32 whatever x's dtype (bf16 training's f32
                             * master weight, rms_norm.h) */
    int views;              /* a 3-D shape [T, H, n] as a decoder's q/k norms see it: x and dx
                             * views of a [T, H·n + 8] token-major buffer, y and dy of a
                             * head-major [H, T, n] one (rms_norm.h); the gaps must stay as
                             * poisoned. An implementation without views must refuse. 2: y
                             * and dy contiguous instead (views of unlike row layouts: rows.h's
                             * inner count H beside 1) */
    int rope;               /* with views: RoPE after the norm (rms_norm.h), tables of 97 positions and
                             * random ids; the reference rotates y, and dy back before the backward's */
} lk_rms_norm_case;

/* The error of each output: y, dx, dweight (0 without a weight), and in the residual mode
 * the worst of x (written), the forward's residual and the backward's (0 without it; a
 * residual of x's dtype must hold what it held). */
typedef struct {
    double y, dx, dweight, residual;
} lk_rms_norm_errors;

/* Runs impl forward and backward on fresh random inputs of shape (all but the last dim
 * are rows), outputs poisoned first, and compares with the reference computed from the
 * same dtype-rounded inputs. Fills row (pass = worst error <= tol) and, if not NULL,
 * err. Returns the facade's status if a pass fails, LK_ENOMEM if buffers cannot be had. */
lk_status lk_rms_norm_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                                 const lk_rms_norm_case *c, lk_check_row *row, lk_rms_norm_errors *err);

/* The tolerance for impl in dt (see the table in harness.c). */
double lk_rms_norm_tol(const lk_impl *impl, lk_dtype dt);

#endif
