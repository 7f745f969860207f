/* check.h — MoE runs on fresh random inputs for the harnesses (`llmkern check`,
 * `llmkern bench`) and tests/test_moe.c: an implementation's results, or the float64
 * reference's, as double arrays, and their relative differences.
 * An experts check shape is T x H x I x E x k; a router check shape is T x H x E x k. */
#ifndef LLMKERN_MOE_CHECK_H
#define LLMKERN_MOE_CHECK_H

#include "ops/harness.h"

typedef struct {
    int64_t t, h, i, e, k;
    lk_dtype dt;
    uint64_t seed;
    int dup_routes;     /* ids drawn with repetition from the lower half of the experts: a token
                           may take one expert twice and the upper experts get no token */
    int grad_f32;       /* weight gradients in f32 rather than the storage dtype */
    int write_grads;    /* write_weight_grads: the weight gradients start poisoned (NaN), not random,
                           and the reference's from zeros */
    int saved_alone;    /* the backward reads the saved block of a forward with out.data NULL (a
                           recompute's); out is then made by a second forward, after the backward */
} lk_moe_experts_problem;

typedef struct {
    double *out, *dx, *dw, *dgu, *dd;   /* dgu, dd: the accumulated totals (init + gradient) */
} lk_moe_experts_result;

typedef struct {
    double out, dx, dw, dgu, dd;
} lk_moe_experts_errors;

/* Runs impl forward then backward (outputs poisoned, weight gradients pre-filled with
 * random values the backward must add to, or with write_grads poisoned). */
lk_status lk_moe_experts_run(const lk_impl *impl, const lk_moe_experts_problem *p, lk_moe_experts_result *r);
/* The float64 reference on the same (dtype-rounded) inputs. */
lk_status lk_moe_experts_run_ref(const lk_moe_experts_problem *p, lk_moe_experts_result *r);
void lk_moe_experts_result_free(lk_moe_experts_result *r);
/* max|got − want| / max|want| per output; the worst is returned. */
double lk_moe_experts_diff(const lk_moe_experts_result *got, const lk_moe_experts_result *want,
                           const lk_moe_experts_problem *p, lk_moe_experts_errors *e);
double lk_moe_experts_tol(const lk_impl *impl, lk_dtype dt);

typedef struct {
    int64_t t, h, e;
    lk_dtype dt;
    uint64_t seed;
    lk_moe_router_args opts;    /* top_k and the options; tensors are ignored */
    int with_bias;              /* sigmoid_bias: a random e_bias */
    int gate_f32;               /* gate_weight stored f32 (with opts.gate_f32 the logits too) */
} lk_moe_router_problem;

typedef struct {
    double weights, aux, dx, dwg, choice_gap;
} lk_moe_router_errors;

/* Runs impl forward and backward and compares with the reference at impl's own choice;
 * choice_gap is how much worse than the best the choice scored (0 when exact). For
 * fake_balanced: the noise-0 pattern, or at noise > 0 validity and a repeat's sameness. */
lk_status lk_moe_router_check_case(const lk_impl *impl, const lk_moe_router_problem *p, lk_moe_router_errors *e);
double lk_moe_router_tol(const lk_impl *impl, lk_dtype dt);

#endif
