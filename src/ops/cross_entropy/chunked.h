/* chunked.h — the chunk loop of chunk_loss.c, which fused.c also runs for reduction none
 * (where per-token d_loss makes the gradients of the forward unusable; see fused.c). */
#ifndef LLMKERN_CROSS_ENTROPY_CHUNKED_H
#define LLMKERN_CROSS_ENTROPY_CHUNKED_H

#include "common.h"

size_t lk_ce_chunked_saved_bytes(const lk_cross_entropy_dims *d);
size_t lk_ce_chunked_workspace_bytes(const lk_cross_entropy_dims *d, int backward);
lk_status lk_ce_chunked_forward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);
lk_status lk_ce_chunked_backward(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);

#endif
