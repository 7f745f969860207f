/* ulysses.h — the Ulysses sequence-parallel exchange around an attention adapter
 * (ulysses.c), used by the facade (attention.c) for the SP rows. Not installed. */
#ifndef LLMKERN_OPS_ATTENTION_ULYSSES_H
#define LLMKERN_OPS_ATTENTION_ULYSSES_H

#include "llmkern/comm.h"
#include "ops/attention/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_comm *comm;          /* NULL: no exchange (one process, size 1, or skip_ulysses) */
    int P, r;
    int dev;                /* the tensors are CUDA memory: device copies, an NCCL group */
    void *stream;           /* ctx->stream, for the device copies */
    int64_t Hl, Hkvl;       /* heads per rank after the exchange */
    int repeat;             /* H_kv < P: each rank receives one KV head */
    lk_attn_dims loc, in;   /* the caller's dims and the adapter's (full sequence, local heads) */
    int64_t *kv0, *cnt, *dsp; /* host, P each: lk_ulysses_run's */
    int64_t *seen;            /* host, 8·P: every rank's shapes (the agreement check) */
    /* carved from the arena by lk_ulysses_run */
    char *send, *recv;
    float *acc;
} lk_ulysses;

/* Decides whether the call exchanges and checks what Ulysses requires (heads divisible
 * by P, KV heads dividing or divisible by P, head-broadcast masks, a communicator whose
 * buffers live where the tensors do: NCCL for CUDA tensors, host ones for CPU tensors);
 * u->in is what the facade checks masks and cu_seqlens (full-sequence boundaries)
 * against. No collective. */
lk_status lk_ulysses_plan(const lk_attention_args *a, lk_comm *comm, lk_device_type dev, const lk_attn_dims *loc,
                          lk_ulysses *u);
/* Workspace of one pass with the exchange: inner tensors, staging, the adapter's own. */
size_t lk_ulysses_workspace(const lk_ulysses *u, const lk_attention_vtable *vt, const lk_attention_args *a,
                            int backward);
/* One pass: checks that every rank runs the same call (LK_ECOMM otherwise), exchanges,
 * runs vt, exchanges back. The facade has reserved lk_ulysses_workspace bytes. */
lk_status lk_ulysses_run(lk_ulysses *u, const lk_attention_vtable *vt, int backward, const lk_attention_args *a,
                         lk_ctx *ctx);

#ifdef LLMKERN_HAVE_CUDA
/* ulysses.cu: the device moves of a box (dims 1 and 2 from o1, o2, extent m1, m2). */
lk_status lk_ulysses_cuda_box(char *base, const int64_t n[4], int64_t o1, int64_t o2, int64_t m1, int64_t m2,
                              char *buf, size_t es, int pack, void *stream);
lk_status lk_ulysses_cuda_acc(float *acc, const int64_t n[4], int64_t o1, int64_t o2, int64_t m1, int64_t m2,
                              const char *buf, lk_dtype dt, void *stream);
lk_status lk_ulysses_cuda_convert(const float *acc, void *dst, lk_dtype dt, int64_t n, void *stream);
lk_status lk_ulysses_cuda_zero(void *p, size_t bytes, void *stream);
lk_status lk_ulysses_cuda_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream);
lk_status lk_ulysses_cuda_sync(void *stream);
#endif

#ifdef __cplusplus
}
#endif
#endif
