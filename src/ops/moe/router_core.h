/* router_core.h — what the learned routers (softmax_topk.c, sigmoid_bias.c) share: the
 * whole forward but each token's scores and choice (the router's row function), top-k
 * selection, and the whole backward from the saved value scores. Saved layout: v [T, E] f32 (softmax p or
 * sigmoid s), then ids [T, k] i32. Not installed. */
#ifndef LLMKERN_MOE_ROUTER_CORE_H
#define LLMKERN_MOE_ROUTER_CORE_H

#include "ops/moe/internal.h"

typedef enum { LK_ROUTER_SOFTMAX, LK_ROUTER_SIGMOID } lk_router_kind;

int64_t lk_router_experts(const lk_moe_router_args *a);
size_t lk_router_saved_bytes(int64_t t, int64_t e, int64_t k);
size_t lk_router_workspace_bytes(const lk_moe_router_args *a, int backward);
float *lk_router_saved_v(const lk_moe_router_args *a);
int32_t *lk_router_saved_ids(const lk_moe_router_args *a);

/* z [T, E] f32 = hidden · gate_weightᵀ, rounded through hidden's dtype unless gate_f32. */
lk_status lk_router_logits(const lk_moe_router_args *a, lk_arena *ar, float *z);
/* ids[0..k) = the k largest of s[0..e) where allowed (mask NULL = all), ties to the lower index. */
void lk_router_topk(const float *s, const unsigned char *allowed, int64_t e, int k, int32_t *ids);
/* DeepSeek-V3's group-limited top-k of one token: the k largest of sel[0..e) within the
 * topk_group groups (of n_group, e / n_group experts each) whose two best sum highest;
 * n_group <= 1: lk_router_topk over all. allowed is scratch of e entries. */
void lk_router_group_topk(const float *sel, int64_t e, int k, int n_group, int topk_group, unsigned char *allowed,
                          int32_t *ids);
/* One token's value scores v[0..e) from its logits z[0..e) and the top_k ids it routes to;
 * sel and allowed are scratch of e entries. */
typedef void (*lk_router_row_fn)(const lk_moe_router_args *a, const float *z, int64_t e, float *v, int32_t *ids,
                                 float *sel, unsigned char *allowed);
/* The whole forward of a learned router: the logits, row() for every token into the saved v
 * and ids, then topk_weights, topk_ids and aux_loss (if wanted) from them. */
lk_status lk_router_forward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_row_fn row);
/* Sums n doubles over ctx->comm, the group the aux loss spans (no group: unchanged). */
lk_status lk_router_group_sum(lk_ctx *ctx, double *v, int64_t n);
/* The whole backward of a learned router. */
lk_status lk_router_backward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_kind kind);

#endif
