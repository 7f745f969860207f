/* attention.h — scaled dot-product attention, forward and backward, behind one facade.
 *
 * Every registry name of the op (eager, sdpa, flash_attention_2, flex_attention and the
 * SP-aware llmkern_flash_attention_2_with_sp / llmkern_flex_attention_with_sp the
 * llmkern backend rewrites to) enters lk_attention_forward / lk_attention_backward. The
 * facade checks every argument, then resolves the row's adapter (eager, flash, flex)
 * through its own private dispatch table, never through the registry again. The
 * adapters' compute functions are replaceable slots (lk_attention_set_backend), so a
 * test can swap one.
 *
 *   out[b, i, h, :] = Σ_j softmax_j(mod(scale · q[b,h,i]·k[b,h/g,j])) · v[b,h/g,j]
 *
 * over the keys j that query i sees: all, or causal (bottom-right aligned when Sq <
 * Skv), within a sliding window, within the query's document (varlen), allowed by a
 * dense mask (eager) or a BlockMask (flex). g = H_q / H_kv (GQA, MQA: K/V are indexed,
 * never copied). A row that sees nothing gives 0 and LSE −inf. */
#ifndef LLMKERN_ATTENTION_H
#define LLMKERN_ATTENTION_H

#include "block_mask.h"
#include "context.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    /* q, k, v, dq, dk and dv are contiguous, or strided views where the implementation
     * takes them (lk_attention_takes_views): D contiguous, every other dim a stride of its
     * own, as torch's SDPA takes the transposed [B, S, H, D] rows of a projection (the
     * outputs' elements apart). The rest is contiguous. */
    lk_tensor q;            /* [B, H_q, S_q, D], f32 or bf16 */
    lk_tensor k, v;         /* [B, H_kv, S_kv, D], dtype of q; H_kv divides H_q */
    lk_tensor out;          /* forward output [B, S_q, H_q, D], dtype of q */
    lk_tensor dout;         /* backward input, like out */
    lk_tensor dq, dk, dv;   /* backward outputs, shaped like q, k, v */
    /* Attention sinks (gpt-oss): one logit per q head [H_q] f32 joining every row's
     * softmax with no value. data NULL = none. ds_aux [H_q] f32: its gradient (optional). */
    lk_tensor s_aux, ds_aux;
    /* Varlen: packed documents. [n_docs + 1] i32, 0 first, non-decreasing, ending at
     * S_q / S_kv; both or neither; B must be 1. Host memory for every implementation,
     * the CUDA ones included (the facade reads them; a kernel gets what it needs). Query document d sees key document d
     * only (causal and window apply inside it, bottom-right aligned per document).
     * max_seqlen_*: >= the longest document (what a GPU kernel sizes its grid by). */
    lk_tensor cu_seqlens_q, cu_seqlens_k;
    int64_t max_seqlen_q, max_seqlen_k;
    /* eager only: a dense mask [B or 1, H_q or 1, S_q, S_kv], bool (nonzero = visible)
     * or f32 (added to the score; -inf hides). data NULL = none. */
    lk_tensor mask;
    /* flex_attention: required; eager: optional (its predicate applies per element).
     * Flex follows the mask alone: causal, window and cu_seqlens beside it are ignored. */
    const lk_block_mask *block_mask;
    lk_score_mod score_mod;     /* flex and eager: fn NULL = none */
    lk_saved saved;             /* the forward's log-sum-exp, f32 [B, H_q, S_q]: lk_attention_saved_bytes */
    float scale;                /* 0: 1/sqrt(D) */
    int causal;
    /* Sliding window, HF's convention, 0 = unbounded: key j is seen from aligned query
     * position p only when p − j < window_left and j − p < window_right. */
    int64_t window_left, window_right;
    float softcap;              /* > 0: score = softcap · tanh(score / softcap); 0 = none */
    /* SP rows only: 1 runs this call on the local tensors without the Ulysses exchange
     * (a module that must not take part in the SP group's attention). */
    int skip_ulysses;
    /* Backward: 1 = the same bits on every run. The CPU rows always are; a GPU row that
     * sums dq with atomics by default takes a slower ordered path (`llmkern list` says
     * which rows are deterministic by default). */
    int deterministic;
} lk_attention_args;

/* The compute functions behind an adapter: the slot the facade dispatches to. */
#define LK_ATTENTION_VTABLE_VERSION 3
typedef struct {
    int version;
    /* Bytes the forward keeps for the backward (the LSE). */
    size_t (*saved_bytes)(const lk_attention_args *a);
    /* Scratch bytes a pass needs from ctx->arena. */
    size_t (*workspace_bytes)(const lk_attention_args *a, int backward);
    lk_status (*forward)(const lk_attention_args *a, lk_ctx *ctx);
    lk_status (*backward)(const lk_attention_args *a, lk_ctx *ctx);
    /* Version 2, optional (NULL: every option the adapter takes): called after the
     * facade's checks, before anything is written; LK_EUNAVAILABLE with an error naming
     * the option (and what would run it) when this backend cannot run these arguments. */
    lk_status (*supports)(const lk_attention_args *a, int backward);
    /* Version 3, optional (NULL: never): 1 when this pass reads q, k, v and writes dq, dk,
     * dv as strided views for these arguments (their strides and alignment included). The
     * facade refuses a view to a pass without it. */
    int (*takes_views)(const lk_attention_args *a, int backward);
} lk_attention_vtable;

typedef enum { LK_ATTN_EAGER, LK_ATTN_FLASH, LK_ATTN_FLEX, LK_ATTN_ADAPTER_COUNT } lk_attn_adapter;

/* What a registry row of the op points at: which adapter it enters, and whether it
 * enters through the sequence-parallel path. */
#define LK_ATTENTION_ENTRY_VERSION 2
typedef struct {
    int version;
    lk_attn_adapter adapter;
    int sp;     /* 1: the Ulysses path over ctx->comm (the SP group); with no group, a group of
                 * one, or skip_ulysses it is the identity */
    /* Version 2: the backend a GPU row runs (flash_attention_2's tensor-core kernel, fa3,
     * cudnn); a GPU row without one is refused (LK_EUNAVAILABLE). Ignored on the CPU, where
     * the adapter's slot runs (lk_attention_set_backend swaps it). */
    const lk_attention_vtable *cuda;
} lk_attention_entry;

/* 1 when impl runs both passes of these arguments with q, k, v, dq, dk, dv as the strided
 * views they are (a->dq etc. may be unset: the forward's tensors stand for them):
 * flash_attention_3 and flex_attention on a Hopper, in bf16, D <= 128, 16-byte aligned
 * strides, where no option sends the pass to flash_attention_2's kernels. 0 for any other
 * row, and for bad arguments (the pass then says what is wrong). It may be asked before the
 * buffers exist, as lk_attention_saved_bytes is: a NULL data pointer counts as aligned. */
LK_API int lk_attention_takes_views(const lk_impl *impl, const lk_attention_args *a);
/* Bytes of impl's saved state for these inputs (q, k, v shapes read). */
LK_API lk_status lk_attention_saved_bytes(const lk_impl *impl, const lk_attention_args *a, size_t *bytes);
/* The facade. Errors (nothing written): LK_EINVAL (bad option, missing tensor, missing
 * BlockMask for flex, a mask the adapter does not take, bad cu_seqlens), LK_ESHAPE,
 * LK_EDTYPE, LK_EDEVICE, LK_ECOMM (the SP group failed, or its ranks called with different shapes).
 *
 * Ulysses (SP rows, ctx->comm a group of P > 1): q/k/v are this rank's S/P positions of
 * every head ([B, H, S/P, D]; every rank the same S/P: the caller pads the sequence to a
 * multiple of P, padding as a document of its own or masked out of the loss), out
 * [B, S/P, H, D] and saved (the LSE [B, H, S/P]) the same; cu_seqlens, max_seqlen, a
 * BlockMask (head-broadcast, H = 1) and a dense mask ([., 1, S, S_kv]) describe the FULL
 * sequence, taken before slicing. H_q % P == 0; H_kv % P == 0 or P % H_kv == 0 (the KV
 * heads repeated so each rank holds one). s_aux is the global [H_q]; ds_aux comes back
 * as this rank's heads' share (zeros elsewhere): summed over the SP group it is the
 * gradient, like every parameter gradient under SP. Every SP rank makes the same call. */
LK_API lk_status lk_attention_forward(const lk_impl *impl, const lk_attention_args *a, lk_ctx *ctx);
/* Needs out and saved from the forward of the same arguments. */
LK_API lk_status lk_attention_backward(const lk_impl *impl, const lk_attention_args *a, lk_ctx *ctx);

/* Replaces adapter's compute functions on the CPU (a GPU row always enters its built-in
 * CUDA backend); returns the previous ones. NULL restores the built-in default. For
 * tests; not thread-safe against running calls. */
LK_API const lk_attention_vtable *lk_attention_set_backend(lk_attn_adapter adapter, const lk_attention_vtable *vt);

/* A rank-2 padding mask [B, S] (bool, i32 or i64; nonzero = token) as varlen metadata:
 * cu_seqlens[B + 1] (i32), the kept token positions b * S + s in order (indices, room
 * for B * S), their count and the longest row. The q/k/v rows to pack are those
 * positions, taken before any sequence-parallel slicing. LK_EINVAL / LK_EDTYPE. */
LK_API lk_status lk_attention_varlen_from_padding(const lk_tensor *mask, int32_t *cu_seqlens, int64_t *indices,
                                           int64_t *total, int64_t *max_seqlen);

#ifdef __cplusplus
}
#endif
#endif
