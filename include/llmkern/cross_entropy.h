/* cross_entropy.h — cross-entropy fused with the LM head, forward and backward:
 *   z = h·Wᵀ  (over the kept tokens),  z ← cap·tanh(z/cap) when softcap > 0,
 *   loss_t = (1−ε)·(lse_t − z_t[y_t]) + ε·(lse_t − mean_v z_t[v]) + s·lse_t²
 * (HF/PyTorch label smoothing ε, z-loss scale s), over the tokens whose label is not
 * ignore_index. Implementations: eager (the [T, V] logits materialized, as autograd of
 * the unfused composition), fused (LM head + loss chunk by chunk, logits never whole,
 * gradients computed during the forward as Liger does), chunk_loss (chunk by chunk,
 * the backward recomputes each chunk's logits). All share this calling convention.
 *
 * Gradients: d_hidden is WRITTEN (zero for tokens not kept); d_weight is ACCUMULATED.
 * d_weight may be f32 (the accumulation happens in f32, the usual master gradient) or
 * the dtype of weight (bf16: this call's contribution is formed in an f32 temporary
 * and added into the bf16 storage once, one rounding per element per call). */
#ifndef LLMKERN_CROSS_ENTROPY_H
#define LLMKERN_CROSS_ENTROPY_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LK_CE_MEAN = 0, LK_CE_SUM, LK_CE_NONE, LK_CE_REDUCTION_COUNT } lk_ce_reduction;

#define LK_CE_IGNORE_INDEX (-100)
/* fused / chunk_loss: bytes of f32 logits one chunk of tokens may take (chunk_bytes 0).
 * On the CPU 32 MiB (1/8 of eager's extra memory at 4096 x 1024 x 32000 with room to
 * spare). On a GPU 4 GiB: room for the three-GEMM path at large vocabularies (V 151936,
 * H 4096: chunks of 7067 tokens, the fast side of bench/NOTES.md's runs); a smaller
 * budget chooses the lean path (chunk_bytes below). */
#define LK_CE_DEFAULT_CHUNK_BYTES ((size_t)32 << 20)
#define LK_CE_DEFAULT_CHUNK_BYTES_CUDA ((size_t)4 << 30)

typedef struct {
    /* forward inputs */
    lk_tensor hidden;       /* [T, H], or [B, S, H] (any leading dims; S = dim −2), f32 or bf16 */
    lk_tensor weight;       /* LM head [V, H], dtype of hidden */
    lk_tensor labels;       /* [T] or hidden's leading shape, i64 or i32, already shifted */
    lk_tensor keep_indices; /* optional i64 [K]: the tokens (flat index) to score, strictly
                               increasing in [0, T); data NULL = unused */
    /* forward outputs (f32) */
    lk_tensor loss;         /* mean/sum: 1 element; none: T elements (0 where not scored) */
    lk_tensor z_loss;       /* optional, shaped like loss: the s·lse² part alone; NULL = unwanted */
    lk_tensor n_valid;      /* optional i64, 1 element: scored tokens with a label; NULL = unwanted */
    /* backward */
    lk_tensor d_loss;       /* f32: 1 element (mean/sum) or T elements (none) */
    lk_tensor d_hidden;     /* shape and dtype of hidden; written */
    lk_tensor d_weight;     /* [V, H], f32 or dtype of weight; accumulated (see above) */
    lk_saved saved;         /* written by forward, read by backward: lk_cross_entropy_saved_bytes */
    /* options */
    lk_ce_reduction reduction;
    int64_t ignore_index;   /* LK_CE_IGNORE_INDEX (-100) by lk_cross_entropy_args_init */
    double label_smoothing; /* ε in [0, 1) */
    double z_loss_scale;    /* s >= 0 */
    double softcap;         /* 0 = none; > 0: logits = cap·tanh(logits/cap) */
    int64_t logits_to_keep; /* 0 = every position; N = the last N positions of each
                               sequence (dim −2 of hidden; [T, H] is one sequence) */
    int fp32_lm_head;       /* bf16: project and keep logits in f32; otherwise the logits
                               (and their gradient) are rounded to bf16 as a bf16 framework
                               would. No effect on f32. */
    size_t chunk_bytes;     /* fused/chunk_loss memory budget for a chunk's f32 logits;
                               0 = LK_CE_DEFAULT_CHUNK_BYTES (_CUDA on a GPU). At least one
                               token per chunk.
                               CUDA fused: the budget also picks the algorithm. When the f32
                               [V, H] dW accumulator fits it (V·H·4 <= chunk_bytes, i.e. the
                               chunk is at least H tokens) dW is accumulated over token chunks
                               in the forward (3 GEMMs, saved holds it); otherwise the lean
                               path runs: the forward saves dh and the lse, the backward
                               recomputes the logits per vocab block for all kept tokens and
                               adds dW into d_weight directly (4 GEMMs, nothing of size V·H).
                               Same results and contract either way (see fused_cuda.c). */
} lk_cross_entropy_args;

/* The sizes an implementation is asked about, worked out by the facade. */
typedef struct {
    int64_t tokens, hidden, vocab;   /* T, H, V */
    int64_t kept;                    /* K: tokens scored (after logits_to_keep / keep_indices) */
    int64_t chunk;                   /* tokens per chunk, from chunk_bytes (<= max(K, 1)) */
    lk_dtype dtype;                  /* storage of hidden and weight */
    lk_dtype dweight_dtype;
    lk_ce_reduction reduction;
    int fp32_lm_head;                /* the option, for implementations whose buffers depend on it */
} lk_cross_entropy_dims;

#define LK_CROSS_ENTROPY_VTABLE_VERSION 1

typedef struct {
    int version;
    size_t (*saved_bytes)(const lk_cross_entropy_dims *d);
    /* Scratch bytes a pass needs from ctx->arena (given back when it returns). */
    size_t (*workspace_bytes)(const lk_cross_entropy_dims *d, int backward);
    lk_status (*forward)(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);
    lk_status (*backward)(const lk_cross_entropy_args *a, const lk_cross_entropy_dims *d, lk_ctx *ctx);
} lk_cross_entropy_vtable;

/* Zeroed args with the defaults that are not zero: ignore_index −100. */
LK_API lk_cross_entropy_args lk_cross_entropy_args_init(void);

/* The facade: validates every argument (shapes, dtypes, options, label values, index
 * lists) before anything is written, reserves the workspace in ctx->arena, calls impl.
 * LK_EINVAL (bad option, NULL data, label out of range), LK_ESHAPE, LK_EDTYPE, LK_EDEVICE;
 * outputs are untouched on any error. The two queries read shapes, dtypes and options
 * only (data may be NULL; the backward workspace depends on d_weight's dtype). */
LK_API lk_status lk_cross_entropy_saved_bytes(const lk_impl *impl, const lk_cross_entropy_args *a, size_t *bytes);
LK_API lk_status lk_cross_entropy_workspace_bytes(const lk_impl *impl, const lk_cross_entropy_args *a, int backward,
                                           size_t *bytes);
LK_API lk_status lk_cross_entropy_forward(const lk_impl *impl, const lk_cross_entropy_args *a, lk_ctx *ctx);
LK_API lk_status lk_cross_entropy_backward(const lk_impl *impl, const lk_cross_entropy_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
