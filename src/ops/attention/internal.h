/* internal.h — what the attention adapters share behind the facade (attention.c): the
 * call's dimensions, each query row's visible key interval (causal, window, varlen),
 * the tiled FA-2 engine (flash.c) with its tile sources (flash.c: analytic; flex.c:
 * the BlockMask), the small f32 tile products (tiles.c), and the pieces of the
 * backward every adapter needs (delta, sink gradient). The facade has validated
 * everything before any of this runs. */
#ifndef LLMKERN_OPS_ATTENTION_INTERNAL_H
#define LLMKERN_OPS_ATTENTION_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include "llmkern/attention.h"

#ifdef __cplusplus
extern "C" {   /* flash.cu uses the host pieces */
#endif

typedef struct {
    int64_t B, Hq, Hkv, G, Sq, Skv, D;
    float scale;
    lk_dtype dt;
} lk_attn_dims;

lk_attn_dims lk_attn_dims_of(const lk_attention_args *a);

/* Elements between batches, heads and rows of a [B, H, S, D] tensor, contiguous or a view
 * (attention.h: D contiguous), as the GPU kernels that write one take them. */
typedef struct {
    int64_t b, h, s;
} lk_attn_layout;

static inline lk_attn_layout lk_attn_layout_of(const lk_tensor *t) {
    lk_attn_layout l = {t->stride[0], t->stride[1], t->stride[2]};
    return l;
}

/* Query row i (of the packed sequence; the same for every batch row) sees keys
 * [lo[i], hi[i]) under causal / window / varlen; lo == hi when it sees none. */
void lk_attn_row_intervals(const lk_attention_args *a, const lk_attn_dims *d, int64_t *lo, int64_t *hi);

/* delta[b, h, i] = dout[b, i, h, :] · out[b, i, h, :] (f32 [B, Hq, Sq]). */
void lk_attn_delta(const lk_attention_args *a, const lk_attn_dims *d, float *delta);
/* ds_aux[h] = −Σ_{b,i} exp(s_aux[h] − lse[b,h,i]) · delta[b,h,i], when wanted. */
void lk_attn_sink_grad(const lk_attention_args *a, const lk_attn_dims *d, const float *lse, const float *delta);

/* Row r of a [rows, D] block of q/k/v (f32 or bf16) as f32. */
void lk_attn_load_rows(const void *src, lk_dtype dt, int64_t row_stride, int64_t rows, int64_t D, float *dst,
                       int64_t ldd);

/* --- f32 tile products (tiles.c) ----------------------------------------------- */

#define LK_ATTN_COLS 64     /* BT tiles are padded to a multiple of this */

/* C[m, ncols] = A[m, D] · BT[D, ncols]; ncols a multiple of 16, BT rows ldb apart. */
void lk_attn_abt(const float *A, int64_t lda, int64_t m, const float *BT, int64_t ldb, int64_t ncols, int64_t D,
                 float *C, int64_t ldc);
/* C[m, D] += A[m, n] · B[n, D]. */
void lk_attn_acc_ab(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb, int64_t D,
                    float *C, int64_t ldc);
/* dst[c, r] = src[r, c] for r < rows, c < cols. */
void lk_attn_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd);
/* max of x[0..n) (-inf when n is 0). */
float lk_attn_row_max(const float *x, int64_t n);
/* x[i] = exp(x[i] - m) over n, returns the sum (vectorized). */
float lk_attn_exp_sum(float *x, int64_t n, float m);

/* --- the tiled engine (flash.c) ------------------------------------------------ */

typedef struct lk_attn_src lk_attn_src;
struct lk_attn_src {
    int64_t tq, tk;     /* tile rows (queries) and columns (keys) */
    /* The kv tiles q tile qt of (b, h) must visit: idx[n], full[n] (1 = no masking
     * needed); returns n. */
    int64_t (*kv_tiles)(const lk_attn_src *s, int64_t b, int64_t h, int64_t qt, int32_t *idx, uint8_t *full);
    /* The q tiles that visit kv tile kt. */
    int64_t (*q_tiles)(const lk_attn_src *s, int64_t b, int64_t h, int64_t kt, int32_t *idx, uint8_t *full);
    /* seen[i * lds + j] = 1 where (q0 + i, k0 + j) is visible, else 0 (j < nk), in a
     * partial tile. */
    void (*mask_tile)(const lk_attn_src *s, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                      uint8_t *seen, int64_t lds);
    const void *self;
};

size_t lk_attn_tiled_workspace(const lk_attention_args *a, int64_t tq, int64_t tk, int backward);
lk_status lk_attn_tiled_forward(const lk_attention_args *a, lk_ctx *ctx, const lk_attn_src *src);
lk_status lk_attn_tiled_backward(const lk_attention_args *a, lk_ctx *ctx, const lk_attn_src *src);

/* LSE bytes: f32 [B, Hq, Sq]. */
size_t lk_attn_lse_bytes(const lk_attention_args *a);

extern const lk_attention_vtable lk_attention_eager_backend;
extern const lk_attention_vtable lk_attention_flash_backend;
extern const lk_attention_vtable lk_attention_flex_backend;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_attention_vtable lk_attention_flash_cuda_backend;   /* flash.cu: f32, fa2.cu falls back to it */
/* ds_aux[h] = Σ_{b,i} part[b, h, i] over f32 [B, Hq, Sq] device rows, in a fixed order, on
 * stream (flash.cu; every CUDA backend's sink gradient). */
lk_status lk_attn_cuda_sink_sum(const float *part, float *ds_aux, int64_t B, int64_t Hq, int64_t Sq, void *stream);
extern const lk_attention_vtable lk_attention_fa2_cuda_backend;     /* fa2.cu: bf16 on tensor cores */
extern const lk_attention_vtable lk_attention_fa2_flex_cuda_backend;   /* fa2.cu: flex_attention's BlockMask */
extern const lk_attention_vtable lk_attention_fa3_cuda_backend;     /* fa3.cu: Hopper, wgmma + TMA */
extern const lk_attention_vtable lk_attention_fa3_flex_cuda_backend;   /* fa3.cu: flex on Hopper */
/* flex's ALiBi score_mod on the device (fa2.cu): log2e · slope[h] of the H_q heads in the arena
 * (*out NULL when score_mod is not lk_score_mod_alibi), and the arena bytes that takes. */
size_t lk_attn_flex_alibi_bytes(const lk_attention_args *a);
lk_status lk_attn_flex_alibi(const lk_attention_args *a, lk_arena *ar, void *stream, const float **out);
/* fa3_bwd.cu: flash_attention_3's Hopper backward, for the calls its forward takes that
 * lk_attn_fa3_bwd_takes accepts too (the others run on fa2.cu's backward). */
int lk_attn_fa3_bwd_takes(const lk_attention_args *a);
size_t lk_attn_fa3_bwd_workspace(const lk_attention_args *a);
lk_status lk_attn_fa3_backward(const lk_attention_args *a, lk_ctx *ctx);
/* The order of the tensor-core kernels' grids (grid_order.cuh): block L of heads x tiles
 * takes tile *tile of head *head; what the test of the orders calls. */
typedef enum { LK_ATTN_ORDER_TILES, LK_ATTN_ORDER_HEADS, LK_ATTN_ORDER_BANDS } lk_attn_order;
void lk_attn_grid_block(lk_attn_order order, int heads, int tiles, int L, int *head, int *tile);
#endif
#ifdef LLMKERN_HAVE_CUDNN
extern const lk_attention_vtable lk_attention_cudnn_backend;        /* sdpa_cudnn.cpp */
#endif

#ifdef __cplusplus
}
#endif
#endif
