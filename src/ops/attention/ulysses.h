/* ulysses.h — the Ulysses sequence-parallel exchange around an attention adapter
 * (ulysses.c), used by the facade (attention.c) for the SP rows. Not installed. */
#ifndef LLMKERN_OPS_ATTENTION_ULYSSES_H
#define LLMKERN_OPS_ATTENTION_ULYSSES_H

#include "llmkern/comm.h"
#include "ops/attention/internal.h"

typedef struct {
    lk_comm *comm;          /* NULL: no exchange (one process, size 1, or skip_ulysses) */
    int P, r;
    int64_t Hl, Hkvl;       /* heads per rank after the exchange */
    int repeat;             /* H_kv < P: each rank receives one KV head */
    lk_attn_dims loc, in;   /* the caller's dims and the adapter's (full sequence, local heads) */
    /* carved from the arena by lk_ulysses_run */
    int64_t *kv0, *cnt, *dsp;
    char *send, *recv;
    float *acc;
} lk_ulysses;

/* Decides whether the call exchanges and checks what Ulysses requires (heads divisible
 * by P, KV heads dividing or divisible by P, head-broadcast masks); u->in is what the
 * facade checks masks and cu_seqlens (full-sequence boundaries) against. No collective. */
lk_status lk_ulysses_plan(const lk_attention_args *a, lk_comm *comm, const lk_attn_dims *loc, lk_ulysses *u);
/* Workspace of one pass with the exchange: inner tensors, staging, the adapter's own. */
size_t lk_ulysses_workspace(const lk_ulysses *u, const lk_attention_vtable *vt, const lk_attention_args *a,
                            int backward);
/* One pass: checks that every rank runs the same call (LK_ECOMM otherwise), exchanges,
 * runs vt, exchanges back. The facade has reserved lk_ulysses_workspace bytes. */
lk_status lk_ulysses_run(lk_ulysses *u, const lk_attention_vtable *vt, int backward, const lk_attention_args *a,
                         lk_ctx *ctx);

#endif
