/* rope.h — rotary position embedding (RoPE), forward and backward, in the rotate-half
 * convention of Llama / Qwen (Hugging Face's apply_rotary_pos_emb):
 *   out = x·cos + rotate_half(x)·sin,   rotate_half(x) = cat(−x[..., R/2:], x[..., :R/2])
 * over the first R = rotary_dim dims of each head; dims R..D-1 pass through unchanged
 * (partial rotary). q and k are rotated in one call. The backward rotates by the
 * negative angle (sin → −sin), which is the exact transpose of the forward.
 *
 * cos and sin come from tables [max_pos, R/2] (f32) that lk_rope_tables builds once
 * from rope_theta and the model's rope scaling; each token looks up the row of its
 * position id. Implementations: eager (HF's unfused steps, each its own pass in the
 * storage dtype) and fused (one pass over q and k). Both share this calling convention. */
#ifndef LLMKERN_ROPE_H
#define LLMKERN_ROPE_H

#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- tables ------------------------------------------------------------------- */

typedef enum {
    LK_ROPE_SCALING_NONE,       /* HF "default": inv_freq[i] = theta^(−2i/R) */
    LK_ROPE_SCALING_LLAMA3,     /* HF _compute_llama3_parameters */
    LK_ROPE_SCALING_YARN,       /* HF _compute_yarn_parameters (truncate = true) */
    LK_ROPE_SCALING_COUNT
} lk_rope_scaling_type;

/* The rope_scaling block of a model's config.json. Fields a type does not use are
 * ignored; a zero-initialized struct is "none". */
typedef struct {
    lk_rope_scaling_type type;
    double factor;                          /* llama3, yarn: > 0 */
    double low_freq_factor;                 /* llama3: > 0 */
    double high_freq_factor;                /* llama3: > low_freq_factor */
    double beta_fast;                       /* yarn: 0 = HF's default 32 */
    double beta_slow;                       /* yarn: 0 = HF's default 1 */
    double attention_factor;                /* yarn: 0 = 0.1·ln(factor) + 1 (1 when factor <= 1);
                                               cos and sin are multiplied by it */
    int64_t original_max_position_embeddings;   /* llama3, yarn: > 0 */
} lk_rope_scaling;

/* "default" (or "none"), "llama3", "yarn" -> type; LK_EINVAL naming the valid ones. */
LK_API lk_status lk_rope_scaling_parse(const char *name, lk_rope_scaling_type *out);
LK_API const char *lk_rope_scaling_name(lk_rope_scaling_type t);

/* Fills cos and sin, both f32 [max_pos, rotary_dim/2] contiguous CPU tensors the caller
 * owns: cos[p, i] = m·cos(p·inv_freq[i]), sin likewise, with inv_freq from theta and
 * scaling (NULL = none) and m the attention factor (1 except yarn). Angles are computed
 * in double and rounded once, so long positions keep their precision. LK_EINVAL for a
 * bad theta, rotary_dim (even, >= 2), scaling, or table; nothing is written then. */
LK_API lk_status lk_rope_tables(double theta, int64_t rotary_dim, const lk_rope_scaling *scaling,
                         lk_tensor *cos, lk_tensor *sin);

/* --- the op ------------------------------------------------------------------- */

typedef struct {
    lk_tensor q;            /* [B, Hq, S, D], contiguous, f32 or bf16 */
    lk_tensor k;            /* [B, Hk, S, D], dtype of q; Hk divides Hq (GQA) */
    lk_tensor q_out, k_out; /* forward outputs, shapes and dtype of q, k. In place: q_out may
                               be q itself (same data) and k_out k; any other overlap is
                               an error */
    lk_tensor dq_out, dk_out;   /* backward inputs, shapes and dtype of q, k */
    lk_tensor dq, dk;           /* backward outputs; may be dq_out, dk_out themselves */
    lk_tensor cos, sin;         /* f32 [max_pos, R/2] from lk_rope_tables */
    lk_tensor position_ids;     /* [B, S], i32 or i64, each in [0, max_pos): packed documents
                                   restart at 0. data NULL: 0..S-1 for every batch row.
                                   On CUDA the facade cannot read them: a token whose id is
                                   out of range gets NaN in its rotated dims instead */
    lk_saved saved;             /* what forward keeps for backward: lk_rope_saved_bytes
                                   (eager keeps the gathered cos and sin as autograd does;
                                   fused nothing: it needs only the tables and positions) */
    int64_t rotary_dim;         /* R: even, 2..D; 0 means D */
} lk_rope_args;

/* What the queries see of a call. */
typedef struct {
    int64_t batch, q_heads, k_heads, seq, head_dim, rotary_dim;
    lk_dtype dtype;
} lk_rope_dims;

#define LK_ROPE_VTABLE_VERSION 1

typedef struct {
    int version;
    /* Bytes the forward keeps for the backward. */
    size_t (*saved_bytes)(const lk_rope_dims *d);
    /* Scratch bytes a pass needs from ctx->arena (given back when it returns); optional. */
    size_t (*workspace_bytes)(const lk_rope_dims *d, int backward);
    lk_status (*forward)(const lk_rope_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_rope_args *a, lk_ctx *ctx);
} lk_rope_vtable;

/* The facade. The queries look only at q, k (shape and dtype, no data) and rotary_dim.
 * forward / backward validate every argument, position ids included, before anything
 * is written, reserve the workspace in ctx->arena, and call impl. The backward takes
 * its shapes from q and k but does not read their data (it may be NULL); it needs the
 * forward's saved, tables and position ids. LK_EINVAL, LK_ESHAPE, LK_EDTYPE or
 * LK_EDEVICE name the argument in lk_last_error(). */
LK_API lk_status lk_rope_saved_bytes(const lk_impl *impl, const lk_rope_args *a, size_t *bytes);
LK_API lk_status lk_rope_workspace_bytes(const lk_impl *impl, const lk_rope_args *a, int backward,
                                  size_t *bytes);
LK_API lk_status lk_rope_forward(const lk_impl *impl, const lk_rope_args *a, lk_ctx *ctx);
LK_API lk_status lk_rope_backward(const lk_impl *impl, const lk_rope_args *a, lk_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
