/* rows.c — the moves and collectives of the expert-parallel dispatchers on the call's
 * memory (internal.h): host loops for CPU tensors, rows.cu's kernels for CUDA ones. The
 * collectives go to ctx->comm after the call's stream has finished what they read (an
 * NCCL group orders itself after the legacy default stream only, and returns with its
 * result in place); with one process over a comm that does not take the tensors' memory
 * they are local copies. */
#include <stdlib.h>
#include <string.h>
#include "ops/moe_dispatch/internal.h"
#ifdef LLMKERN_HAVE_CUDA
#include "ops/moe_dispatch/rows.h"
#define ON_CUDA(c, call) \
    if ((c)->dev) return call
#else
#define ON_CUDA(c, call) (void)0
#endif

static float load(const void *src, lk_dtype dt, int64_t i) {
    return dt == LK_F32 ? ((const float *)src)[i] : lk_bf16_to_f32(((const uint16_t *)src)[i]);
}

lk_status lk_ep_gather(const lk_ep_call *c, void *dst, const void *src, const int32_t *order, int64_t n, int64_t k) {
    size_t row = (size_t)c->H * c->es;
    ON_CUDA(c, lk_ep_cuda_gather(dst, src, order, n, k, row, c->ctx->stream));
    for (int64_t p = 0; p < n; p++)
        memcpy((char *)dst + (size_t)p * row, (const char *)src + (size_t)(order[p] / k) * row, row);
    return LK_OK;
}

lk_status lk_ep_meta(const lk_ep_call *c, int32_t *meta, const int32_t *ids, const float *w, const int32_t *order,
                     int64_t n) {
    ON_CUDA(c, lk_ep_cuda_meta(meta, ids, w, order, n, c->El, c->ctx->stream));
    for (int64_t p = 0; p < n; p++) {
        meta[2 * p] = ids[order[p]] % (int32_t)c->El;
        memcpy(&meta[2 * p + 1], &w[order[p]], 4);
    }
    return LK_OK;
}

lk_status lk_ep_unmeta(const lk_ep_call *c, const int32_t *meta, int32_t *ids, float *w, int64_t n) {
    ON_CUDA(c, lk_ep_cuda_unmeta(meta, ids, w, n, c->ctx->stream));
    for (int64_t i = 0; i < n; i++) ids[i] = meta[2 * i], memcpy(&w[i], &meta[2 * i + 1], 4);
    return LK_OK;
}

lk_status lk_ep_combine(const lk_ep_call *c, void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt,
                        const int32_t *pos, int64_t n, int64_t k) {
    int64_t H = c->H;
    ON_CUDA(c, lk_ep_cuda_combine(dst, dst_dt, src, src_dt, pos, n, k, H, c->ctx->stream));
    float acc[H];
    for (int64_t t = 0; t < n; t++) {
        memset(acc, 0, sizeof acc);
        for (int64_t j = 0; j < k; j++) {
            int64_t p = pos ? pos[t * k + j] : t * k + j;
            for (int64_t h = 0; p >= 0 && h < H; h++) acc[h] += load(src, src_dt, p * H + h);
        }
        lk_convert(acc, LK_F32, (char *)dst + (size_t)(t * H) * lk_dtype_size(dst_dt), dst_dt, H);
    }
    return LK_OK;
}

lk_status lk_ep_pick(const lk_ep_call *c, float *dst, const float *src, const int32_t *pos, int64_t n) {
    ON_CUDA(c, lk_ep_cuda_pick(dst, src, pos, n, c->ctx->stream));
    for (int64_t i = 0; i < n; i++) dst[i] = pos[i] >= 0 ? src[pos[i]] : 0.0f;
    return LK_OK;
}

lk_status lk_ep_copy(const lk_ep_call *c, void *dst, const void *src, size_t bytes, int wait) {
    ON_CUDA(c, lk_ep_cuda_copy(dst, src, bytes, wait, c->ctx->stream));
    if (bytes && dst != src) memmove(dst, src, bytes);
    return LK_OK;
}

lk_status lk_ep_host(const lk_ep_call *c, const void *src, size_t bytes, const void **host, void **own) {
    *own = NULL, *host = src;
    if (!c->dev) return LK_OK;
    if (!(*own = malloc(bytes ? bytes : 1)))
        return lk_error(LK_ENOMEM, "moe_dispatch: no host room for %zu bytes of routing", bytes);
    *host = *own;
    return lk_ep_copy(c, *own, src, bytes, 1);
}

/* --- collectives -------------------------------------------------------------------- */

/* What a collective reads must be done: the call's stream finished on CUDA. */
static lk_status settle(const lk_ep_call *c) {
#ifdef LLMKERN_HAVE_CUDA
    if (c->dev) return lk_ep_cuda_sync(c->ctx->stream);
#endif
    return LK_OK;
}

lk_status lk_ep_all_to_all(const lk_ep_call *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                           const int64_t *rc, const int64_t *rd) {
    if (c->direct) return lk_ep_copy(c, (char *)recv + rd[0], (const char *)send + sd[0], (size_t)sc[0], 0);
    lk_status s = settle(c);
    return s ? s : lk_comm_all_to_all(c->comm, send, sc, sd, recv, rc, rd);
}

lk_status lk_ep_all_gather(const lk_ep_call *c, const void *send, void *recv, size_t bytes) {
    if (c->direct) return lk_ep_copy(c, recv, send, bytes, 0);
    lk_status s = settle(c);
    return s ? s : lk_comm_all_gather(c->comm, send, recv, bytes);
}

lk_status lk_ep_reduce_scatter(const lk_ep_call *c, const float *send, float *recv, int64_t count) {
    if (c->direct) return lk_ep_copy(c, recv, send, 4 * (size_t)count, 0);
    lk_status s = settle(c);
    return s ? s : lk_comm_reduce_scatter(c->comm, send, recv, count, LK_COMM_F32);
}

/* One value to each peer (spread) or one to all: an all-to-all or an all-gather of buf
 * (P values, then the P received), in the comm's memory. */
static lk_status exchange_at(const lk_ep_call *c, int64_t *send, int64_t *recv, int spread) {
    if (!spread) return lk_comm_all_gather(c->comm, send, recv, 8);
    int64_t cnt[LK_EP_MAX_RANKS], dsp[LK_EP_MAX_RANKS];
    for (int p = 0; p < c->P; p++) cnt[p] = 8, dsp[p] = 8 * p;
    return lk_comm_all_to_all(c->comm, send, cnt, dsp, recv, cnt, dsp);
}

lk_status lk_ep_exchange_i64(const lk_ep_call *c, const int64_t *send, int64_t *recv, int spread) {
    if (c->direct) return recv[0] = send[0], LK_OK;
    if (!c->dev) return exchange_at(c, (int64_t *)send, recv, spread);
    size_t bytes = 16 * (size_t)c->P, mark;
    lk_status s = lk_ctx_workspace_begin(c->ctx, "moe_dispatch", bytes, &mark);
    int64_t *buf = s ? NULL : lk_arena_alloc(c->ctx->arena, bytes);
    if (!s && !buf) s = lk_error(LK_ENOMEM, "moe_dispatch: arena: expected the reserved workspace, got too little");
    if (!s && !(s = lk_ep_copy(c, buf, send, 8 * (size_t)(spread ? c->P : 1), 1)) &&
        !(s = exchange_at(c, buf, buf + c->P, spread)))
        s = lk_ep_copy(c, recv, buf + c->P, 8 * (size_t)c->P, 1);
    lk_ctx_workspace_end(c->ctx, mark);
    return s;
}
