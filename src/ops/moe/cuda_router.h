/* cuda_router.h — the kernels of the learned MoE routers on CUDA (router.cu: softmax_topk
 * and what both share; sigmoid_bias.cu), as C launchers on raw device pointers, queued on
 * stream (a cudaStream_t) between the cuBLASLt GEMMs of router_cuda.c; fake_balanced.cu
 * uses the expert counts. f32 math; LK_EDEVICE when a launch fails. Built only with
 * CUDA. Not installed. */
#ifndef LLMKERN_MOE_CUDA_ROUTER_H
#define LLMKERN_MOE_CUDA_ROUTER_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t t, e;       /* tokens, experts */
    int k;              /* routes per token */
    int norm;           /* weights over their sum (norm_topk_prob or softmax_after_topk) */
    int round_bf16;     /* logits rounded to bf16 before the softmax (bf16 storage, no gate_f32) */
    float scale;        /* route_scale, 1 for 0 */
    int sigmoid;        /* the scores are sigmoids (sigmoid_bias), not a softmax */
} lk_router_cuda_dims;

/* sigmoid_bias's choice: the correction bias and the group limit. */
typedef struct {
    const float *bias;      /* e_bias [E] f32, or NULL */
    int n_group, topk_group;   /* n_group <= 1: no groups */
    float *gscore;          /* [T, n_group] f32 workspace (groups only) */
    unsigned char *keep;    /* [T, n_group] workspace (groups only) */
} lk_router_cuda_groups;

/* Per token, from the f32 logits z [T, E]: p = softmax(z) into v [T, E], the k largest p
 * (in descending order, ties to the lower index, as lk_router_topk) into saved_ids and
 * topk_ids [T, k], their weights into w [T, k], and, unless vsum is NULL, vsum[T] = Σ_e p
 * (the aux loss divides by it, as the CPU does). */
lk_status lk_router_cuda_softmax_topk(const lk_router_cuda_dims *d, const float *z, float *v, int32_t *saved_ids,
                                      int32_t *topk_ids, float *w, float *vsum, void *stream);

/* Per token, from the f32 logits z [T, E]: s = sigmoid(z) into v [T, E], the k largest
 * s + bias within the topk_group best groups (a group's score: its two best s + bias)
 * into saved_ids and topk_ids [T, k] (descending, ties to the lower index, as
 * sigmoid_bias.c), the chosen s (over their sum when d->norm) times scale into w, and,
 * unless vsum is NULL, vsum[T] = Σ_e s. */
lk_status lk_router_cuda_sigmoid_bias(const lk_router_cuda_dims *d, const lk_router_cuda_groups *g, const float *z,
                                      float *v, int32_t *saved_ids, int32_t *topk_ids, float *w, float *vsum,
                                      void *stream);

/* Doubles of scratch lk_router_cuda_aux takes for T tokens and E experts. */
int64_t lk_router_cuda_aux_scratch(int64_t t, int64_t e);
/* *aux (f32, device) = E/(T²k) · Σ_e counts_e · Σ_t v[t, e] / vsum[t], summed in f64 in
 * an order fixed by T and E alone (per-block partials, then one block): no atomics. */
lk_status lk_router_cuda_aux(const lk_router_cuda_dims *d, const float *v, const float *vsum, const int32_t *counts,
                             double *scratch, float *aux, void *stream);

/* Over a sequence-parallel group the aux loss needs the group's sums before its product:
 * aux_sums writes this rank's g [2E + 1] f64 (g[e] = Σ_t v[t, e] / vsum[t] in aux's order,
 * g[E + e] = counts_e, g[2E] = T; scratch as lk_router_cuda_aux's), the caller sums g over
 * the group on the stream, and aux_from_sums sets *aux = E/(T²k) · Σ_e g[E + e] · g[e]. */
lk_status lk_router_cuda_aux_sums(const lk_router_cuda_dims *d, const float *v, const float *vsum,
                                  const int32_t *counts, double *scratch, double *g, void *stream);
lk_status lk_router_cuda_aux_from_sums(const lk_router_cuda_dims *d, const double *g, float *aux, void *stream);
/* The backward's share: g [E + 1] f64 = counts, then t. */
lk_status lk_router_cuda_count_pack(int64_t t, int64_t e, const int32_t *counts, double *g, void *stream);

/* counts[E] (i32) = how many of the routes ids[0..n) go to each expert. */
lk_status lk_router_cuda_count(const int32_t *ids, int64_t n, int64_t e, int32_t *counts, void *stream);

/* dz [T, E] (f32) = d loss / d logits from the saved v and ids, d_topk_weights dw [T, k]
 * and the aux loss's gradient: d aux / d q[t, e] = aux_coef · counts[e] with aux_coef =
 * d_aux_loss · E / (T²k); or, with group (the group's summed counts, then its T at
 * group[E]), aux_coef · group[e] / T² with aux_coef = d_aux_loss · E / k; both NULL: none.
 * router_core.c's backward (through a softmax, or a sigmoid with d->sigmoid), a warp a
 * token. */
lk_status lk_router_cuda_d_logits(const lk_router_cuda_dims *d, const float *v, const int32_t *ids, const float *dw,
                                  const int32_t *counts, const double *group, double aux_coef, float *dz,
                                  void *stream);

/* dst[0..n) = src rounded to dst_dt, or with add, dst + src rounded once; src_dt and
 * dst_dt f32 or bf16. */
lk_status lk_router_cuda_convert(int64_t n, lk_dtype src_dt, const void *src, lk_dtype dst_dt, void *dst, int add,
                                 void *stream);

/* dz [T, E] (f32) as two bf16 parts side by side, row t of dz2 [T, 2E] = hi | lo with
 * hi = bf16(dz), lo = bf16(dz - hi): hi + lo is dz to 2^-17 of it, so bf16 GEMMs with f32
 * accumulation over K = 2E (or two of them over hi and lo) keep f32's precision. */
lk_status lk_router_cuda_split_bf16(int64_t t, int64_t e, const float *dz, void *dz2, void *stream);

#ifdef __cplusplus
}
#endif
#endif
