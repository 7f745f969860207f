/* check.h — one cross-entropy comparison with the float64 reference (reference.c) on
 * fresh random inputs, with every option a test may want to vary. harness.c builds
 * `llmkern check` on it; tests/test_cross_entropy.c calls it directly. */
#ifndef LLMKERN_CROSS_ENTROPY_CHECK_H
#define LLMKERN_CROSS_ENTROPY_CHECK_H

#include "ops/harness.h"

typedef struct {
    int reduction;                  /* lk_ce_reduction */
    double label_smoothing, z_loss_scale, softcap;
    int64_t batch;                  /* > 1: hidden is [batch, T/batch, H] */
    int64_t logits_to_keep;
    const int64_t *keep_indices;    /* with n_keep: an explicit index list */
    int64_t n_keep;
    int fp32_lm_head;
    int labels_i32;
    double ignore_frac;             /* share of labels set to ignore_index (1: all) */
    size_t chunk_bytes;             /* 0: the default */
    int dweight_f32;                /* bf16: accumulate into an f32 d_weight */
    double d_loss;                  /* mean/sum: the scalar (0: 0.75); none: random per token */
} lk_ce_case;

/* The error of each output against the reference: loss and z-loss relative to
 * max(|ref|, 1) per element; dh and dw as max|got − ref| / max|ref| (dw after
 * accumulating onto a random prior d_weight, measured on the difference). n_valid_ok:
 * the count matched; nan: some output (or a row of d_hidden not scored) was not finite
 * or not zero where it had to be. */
typedef struct {
    double loss, z_loss, dh, dw;
    int n_valid_ok, unscored_zero;
} lk_ce_errors;

/* shape: T x H x V. Returns the facade's status if a pass fails. row may be NULL. */
lk_status lk_ce_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                           const lk_ce_case *c, lk_check_row *row, lk_ce_errors *err);

/* The tolerance for impl in dt (see the table in harness.c). */
double lk_ce_tol(const lk_impl *impl, lk_dtype dt);

#endif
