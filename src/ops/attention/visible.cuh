/* visible.cuh — which keys a query row sees, on the device: the CPU's rule
 * (lk_attn_row_intervals in common.c) for one row, from the document bounds. Query row i
 * sees keys [lo_i, hi_i): causal (bottom-right aligned when S_q != S_kv), the sliding
 * window and varlen documents (each aligned on its own) all narrow it. lo and hi never
 * decrease with i, so a tile of rows sees [lo_first, hi_last) and every row of it sees
 * [lo_last, hi_first) whole. The tensor-core kernels (fa2.cu, fa3.cu) share it. */
#ifndef LLMKERN_OPS_ATTENTION_VISIBLE_CUH
#define LLMKERN_OPS_ATTENTION_VISIBLE_CUH

#include <stdint.h>
#include "core/cuda_check.h"
#include "ops/attention/internal.h"

typedef struct {
    const int32_t *cq, *ck;   /* device cu_seqlens, or NULL (one document) */
    int ndoc;
    int Sq, Skv;
    int causal;
    int64_t wl, wr;           /* window_left / window_right, 0 = unbounded */
} lk_attn_vis;

/* What a Hopper kernel's instance is compiled to mask (fa3.cu, fa3_bwd.cu): each row's [lo, hi)
 * from the options (ROWS), nothing (OPEN: every row sees every key and the keys fill whole
 * tiles), causal alone (CAUSAL: arithmetic on the tile's first row), a BlockMask (FLEX). Code
 * an instance never runs still costs its loop the schedule (bench/NOTES.md, fifty-second
 * session), so each compiles only its own. */
enum { LK_MASK_ROWS, LK_MASK_OPEN, LK_MASK_CAUSAL, LK_MASK_FLEX };

/* No option hides a key: no causal, window or documents (keys past S_kv aside). */
static __host__ __device__ __forceinline__ bool lk_attn_unmasked(const lk_attn_vis &v) {
    return !v.causal && v.wl <= 0 && v.wr <= 0 && !v.cq;
}

/* The mask kind a call's visibility needs, with tiles of `tile` keys (never FLEX). */
static inline int lk_attn_mask_of(const lk_attn_vis &v, int tile) {
    if (v.cq || v.wl > 0 || v.wr > 0) return LK_MASK_ROWS;
    if (v.causal) return LK_MASK_CAUSAL;
    return v.Skv % tile == 0 ? LK_MASK_OPEN : LK_MASK_ROWS;
}

/* Row i's visible keys [lo, hi). An instance that knows its mask kind (MASK) skips the
 * options it has not got: CAUSAL's interval is two compares. */
template <int MASK = LK_MASK_ROWS>
static __device__ __forceinline__ void lk_attn_row_iv(const lk_attn_vis &v, int i, int &lo, int &hi) {
    if (MASK == LK_MASK_OPEN || MASK == LK_MASK_CAUSAL) {
        lo = 0, hi = MASK == LK_MASK_OPEN ? v.Skv : max(min(i + 1 + (v.Skv - v.Sq), v.Skv), 0);
        return;
    }
    int qs = 0, qe = v.Sq, ks = 0, ke = v.Skv;
    if (v.cq) {   /* the last document starting at or before i */
        int a = 0, b = v.ndoc - 1;
        while (a < b) {
            const int mid = (a + b + 1) >> 1;
            if (v.cq[mid] <= i) a = mid;
            else b = mid - 1;
        }
        qs = v.cq[a], qe = v.cq[a + 1], ks = v.ck[a], ke = v.ck[a + 1];
    }
    const long long pos = (long long)ks + (i - qs) + ((ke - ks) - (qe - qs));
    long long l = ks, h = ke;
    if (v.causal && pos + 1 < h) h = pos + 1;
    if (v.wl > 0 && pos - v.wl + 1 > l) l = pos - v.wl + 1;
    if (v.wr > 0 && pos + v.wr < h) h = pos + v.wr;
    if (h < l) h = l;
    lo = (int)l, hi = (int)h;
}

/* The first row i in [0, Sq] with hi_i > j (want_hi) or lo_i >= j (else): hi and lo grow
 * with i, so the rows that see any of the keys [j0, j1) are [first(j0, 1), first(j1, 0)). */
template <int MASK = LK_MASK_ROWS>
static __device__ __forceinline__ int lk_attn_first_row(const lk_attn_vis &v, int j, int want_hi) {
    int a = 0, b = v.Sq;
    while (a < b) {
        const int mid = (a + b) >> 1;
        int l, h;
        lk_attn_row_iv<MASK>(v, mid, l, h);
        if (want_hi ? h > j : l >= j) b = mid;
        else a = mid + 1;
    }
    return a;
}

/* The call's visibility, its cu_seqlens copied into the arena in stream order (n_docs + 1
 * ints each; from pageable memory the copy is staged before the call returns). */
static inline lk_status lk_attn_vis_make(const lk_attention_args *a, lk_arena *ar, cudaStream_t st,
                                         lk_attn_vis *v) {
    *v = (lk_attn_vis){NULL, NULL, 0, (int)a->q.shape[2], (int)a->k.shape[2], a->causal, a->window_left,
                       a->window_right};
    if (!a->cu_seqlens_q.data) return LK_OK;
    size_t n = (size_t)a->cu_seqlens_q.shape[0], bytes = lk_arena_piece(n * 4);
    int32_t *cq = (int32_t *)lk_arena_alloc(ar, bytes), *ck = (int32_t *)lk_arena_alloc(ar, bytes);
    if (!cq || !ck) return lk_error(LK_ENOMEM, "attention: no room for cu_seqlens on the device");
    LK_CUDA_TRY(cudaMemcpyAsync(cq, a->cu_seqlens_q.data, n * 4, cudaMemcpyHostToDevice, st));
    LK_CUDA_TRY(cudaMemcpyAsync(ck, a->cu_seqlens_k.data, n * 4, cudaMemcpyHostToDevice, st));
    v->cq = cq, v->ck = ck, v->ndoc = (int)n - 1;
    return LK_OK;
}

/* Arena bytes lk_attn_vis_make takes. */
static inline size_t lk_attn_vis_bytes(const lk_attention_args *a) {
    if (!a->cu_seqlens_q.data) return 0;
    size_t n = (size_t)a->cu_seqlens_q.shape[0];
    return 2 * lk_arena_piece(n * 4);
}

#endif
