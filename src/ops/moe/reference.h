/* reference.h — the float64 MoE oracles every implementation is held against (the
 * harnesses, `llmkern check`, tests/test_moe.c). Plain loops on contiguous double
 * arrays, no threads. Experts: x [T, H], ids/w [T, k], wgu [E, 2I, H], wd [E, H, I].
 * Router: x [T, H], wg [E, H]; the options are read from an lk_moe_router_args whose
 * tensors are not touched. The router oracle takes the implementation's expert choice
 * (ids) as given — a choice is a discrete decision that near-ties make rounding-
 * dependent — and lk_moe_router_ref_choice_gap says how far from optimal it is. */
#ifndef LLMKERN_MOE_REFERENCE_H
#define LLMKERN_MOE_REFERENCE_H

#include "llmkern/moe.h"

void lk_moe_experts_ref_forward(const double *x, const int32_t *ids, const double *w, const double *wgu,
                                const double *wd, int64_t t, int64_t k, int64_t e, int64_t h, int64_t i,
                                double *out);
/* dx and dw written; dwgu and dwd ACCUMULATED. */
void lk_moe_experts_ref_backward(const double *x, const int32_t *ids, const double *w, const double *wgu,
                                 const double *wd, const double *dout, int64_t t, int64_t k, int64_t e, int64_t h,
                                 int64_t i, double *dx, double *dw, double *dwgu, double *dwd);

typedef enum { LK_MOE_SOFTMAX, LK_MOE_SIGMOID } lk_moe_score_kind;

/* logits z [T, E] and the value scores v (softmax p or sigmoid s) and selection scores
 * sel (v + e_bias for sigmoid; v otherwise). bias may be NULL. */
void lk_moe_router_ref_scores(const double *x, const double *wg, const double *bias, int64_t t, int64_t h,
                              int64_t e, lk_moe_score_kind kind, double *z, double *v, double *sel);
/* The largest, over tokens, of (best achievable sum of k selection scores under the
 * group limit) − (sum of the chosen ones); 0 for an exact choice. Also checks that
 * no expert is chosen twice and all are in range (else returns +inf). */
double lk_moe_router_ref_choice_gap(const lk_moe_router_args *o, const double *sel, const int32_t *ids,
                                    int64_t t, int64_t e);
/* Weights [T, k] and aux loss for the given choice. */
void lk_moe_router_ref_forward(const lk_moe_router_args *o, const double *v, const int32_t *ids, int64_t t,
                               int64_t e, lk_moe_score_kind kind, double *w, double *aux);
/* dx [T, H] written, dwg [E, H] ACCUMULATED, from dw [T, k] and d_aux. */
void lk_moe_router_ref_backward(const lk_moe_router_args *o, const double *x, const double *wg, const double *v,
                                const int32_t *ids, const double *dw, double d_aux, int64_t t, int64_t h, int64_t e,
                                lk_moe_score_kind kind, double *dx, double *dwg);

#endif
