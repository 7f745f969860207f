/* rows.h — the CUDA side of the dispatchers' moves (rows.cu), called by rows.c for CUDA
 * tensors (each the lk_ep_* of internal.h of the same name, on device pointers) and by
 * alltoall_cuda.c and allgather_cuda.c (the device-count plans: owners, slots, padding),
 * all queued on `stream` with no host read. Built only with CUDA. */
#ifndef LLMKERN_MOE_DISPATCH_ROWS_H
#define LLMKERN_MOE_DISPATCH_ROWS_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* row: bytes a row (H elements). dst[p] = src[order[p] / k], a zero row where order[p] < 0. */
lk_status lk_ep_cuda_gather(void *dst, const void *src, const int32_t *order, int64_t n, int64_t k, size_t row,
                            void *stream);
/* dst[spos[r]] = src[r / k], r < n: rows into their per-peer slots. */
lk_status lk_ep_cuda_scatter(void *dst, const void *src, const int32_t *spos, int64_t n, int64_t k, size_t row,
                             void *stream);
lk_status lk_ep_cuda_meta(int32_t *meta, const int32_t *ids, const float *w, const int32_t *order, int64_t n,
                          int64_t El, void *stream);
lk_status lk_ep_cuda_unmeta(const int32_t *meta, int32_t *ids, float *w, int64_t n, void *stream);
lk_status lk_ep_cuda_combine(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt, const int32_t *pos,
                             int64_t n, int64_t k, int64_t H, void *stream);
lk_status lk_ep_cuda_pick(float *dst, const float *src, const int32_t *pos, int64_t n, void *stream);
/* --- the device-count plan of alltoall_cuda.c ---
 * owner[r] = ids[r] / El, -1 for an id outside [0, E) (route.cu raises its flag). */
lk_status lk_ep_cuda_owners(const int32_t *ids, int64_t R, int64_t E, int64_t El, int32_t *owner, void *stream);
/* From route.cu's sort of the routes by owner (offs [P + 1], pos [R]): spos[r], route r's
 * row in P slots of B rows (owner o's slot starts at o·B), and scnt[p] the rows for p. */
lk_status lk_ep_cuda_slots(const int32_t *owner, const int32_t *pos, const int64_t *offs, int64_t R, int P, int64_t B,
                           int32_t *spos, int64_t *scnt, void *stream);
/* meta[2·spos[r] ..] = (local id, -1 for a bad id; the bits of w[r]). */
lk_status lk_ep_cuda_meta_slots(int32_t *meta, const int32_t *ids, const float *w, const int32_t *spos, int64_t R,
                                int64_t E, int64_t El, void *stream);
/* Received slots: row i < rcnt[p] of slot p split from meta, the others (0, 0.0f); a count
 * outside [0, B] raises *flag and counts as 0. */
lk_status lk_ep_cuda_unmeta_slots(const int32_t *meta, const int64_t *rcnt, int P, int64_t B, int32_t *ids, float *w,
                                  int *flag, void *stream);
/* The rows i >= rcnt[p] of every slot zeroed (row bytes each, even). */
lk_status lk_ep_cuda_clear_padding(void *rows, const int64_t *rcnt, int P, int64_t B, size_t row, int *flag,
                                   void *stream);
/* --- the device-count plan of allgather_cuda.c ---
 * What this rank sends: meta[2r ..] = (ids[r], the bits of w[r]) for r < R, cnt[0] = T,
 * and *flag = 0 (the call's bad-input flag, raised by what follows on the stream). */
lk_status lk_ep_cuda_pack_routes(int32_t *meta, int64_t *cnt, int *flag, const int32_t *ids, const float *w, int64_t R,
                                 int64_t T, void *stream);
/* The gathered routes, P slots of Tb tokens of k routes (slot p: cnt[p] real tokens, the
 * rest padding): route q is owned here when real with an id in [e0, e0 + El); then
 * lid[q] = id - e0, w[q] = its weight, own[q] = q; else (0, 0.0f, -1). A real id outside
 * [0, E), or a count outside [0, Tb], raises *flag (the slot's count then taken as 0). */
lk_status lk_ep_cuda_own_routes(const int32_t *meta, const int64_t *cnt, int P, int64_t Tb, int64_t k, int64_t E,
                                int64_t e0, int64_t El, int32_t *lid, float *w, int32_t *own, int *flag,
                                void *stream);
/* dst[0..n) of dt (f32, bf16) = NaN when *flag, else untouched. */
lk_status lk_ep_cuda_nan_if(const int *flag, void *dst, lk_dtype dt, int64_t n, void *stream);
/* Any direction (unified addressing tells); wait: the stream synchronized after. */
lk_status lk_ep_cuda_copy(void *dst, const void *src, size_t bytes, int wait, void *stream);
lk_status lk_ep_cuda_sync(void *stream);

#ifdef __cplusplus
}
#endif
#endif
