/* reference.h — the float64 cross-entropy oracle every implementation is held against
 * (by the harness, `llmkern check` and tests/test_cross_entropy.c). Plain loops on
 * double arrays; no threads, no workspace, no chunks. */
#ifndef LLMKERN_CROSS_ENTROPY_REFERENCE_H
#define LLMKERN_CROSS_ENTROPY_REFERENCE_H

#include <stdint.h>

typedef struct {
    int64_t T, H, V;
    const double *h;               /* [T, H] */
    const double *w;               /* [V, H] */
    const int64_t *labels;         /* [T], −1 = ignored */
    const unsigned char *keep;     /* [T], 1 = scored; NULL = every token */
    int reduction;                 /* lk_ce_reduction */
    double eps, zs, cap;           /* label smoothing, z-loss scale, softcap (0 = none) */
    int round_bf16;                /* logits and their gradient rounded to bf16 */
} lk_ce_ref_problem;

/* Per token loss_tok and z_tok [T] (0 where not scored or ignored), the reduced loss
 * and z-loss (for none: their sums), n_valid, and the gradients at d_loss (1 value, or
 * T for none): dh [T, H] and dw [V, H] (this call's gradient, not accumulated). Any
 * output pointer may be NULL. */
void lk_ce_ref(const lk_ce_ref_problem *p, const double *d_loss, double *loss_tok, double *z_tok, double *loss,
               double *zloss, int64_t *n_valid, double *dh, double *dw);

#endif
