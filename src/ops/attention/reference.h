/* reference.h — attention in float64, element by element: the oracle every
 * implementation (eager included) is compared with. Written from the contract, not
 * from the kernels: its own visibility rule, its own softmax and gradient. */
#ifndef LLMKERN_ATTENTION_REFERENCE_H
#define LLMKERN_ATTENTION_REFERENCE_H

#include "llmkern/attention.h"

typedef struct {
    int64_t B, Hq, Hkv, Sq, Skv, D;
    double scale, softcap;          /* softcap 0 = none */
    int causal;
    int64_t window_left, window_right;  /* 0 = unbounded */
    const int32_t *cu_q, *cu_k;     /* NULL = no varlen */
    int64_t n_docs;
    const double *sink;             /* [Hq] or NULL */
    const lk_tensor *mask;          /* dense (bool or f32 additive) or NULL */
    const lk_block_mask *bm;        /* its predicate, or NULL */
    lk_score_mod mod;
} lk_attn_ref;

/* q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] -> out [B,Sq,Hq,D], lse [B,Hq,Sq] (-inf: nothing seen). */
void lk_attention_ref_forward(const lk_attn_ref *p, const double *q, const double *k, const double *v, double *out,
                              double *lse);
/* Gradients of Σ out·dout: dq, dk, dv like q, k, v; dsink [Hq] (may be NULL). */
void lk_attention_ref_backward(const lk_attn_ref *p, const double *q, const double *k, const double *v,
                               const double *dout, double *dq, double *dk, double *dv, double *dsink);

#endif
