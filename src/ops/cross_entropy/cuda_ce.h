/* cuda_ce.h — the kernels of cross-entropy `fused` on CUDA (fused.cu), launched by
 * fused_cuda.c between its cuBLASLt GEMMs. Built only with CUDA. */
#ifndef LLMKERN_CROSS_ENTROPY_CUDA_CE_H
#define LLMKERN_CROSS_ENTROPY_CUDA_CE_H

#include <stdint.h>
#include "llmkern/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which tokens are scored and their labels, all device pointers; passed by value. */
typedef struct {
    int64_t T, V, K, S, keep_n;   /* tokens, vocab, kept, sequence length, logits_to_keep */
    const int64_t *idx;           /* keep_indices or NULL */
    const void *labels;
    int labels_i32;
    int64_t ignore;
    float eps, zs, cap;           /* label smoothing, z-loss scale, softcap (0 = none) */
    int reduction;                /* lk_ce_reduction */
} lk_ce_cuda_plan;

/* *n_valid = kept tokens whose label is not ignore_index (a bad label counts: its loss is NaN). */
lk_status lk_ce_cuda_count_valid(const lk_ce_cuda_plan *p, int64_t *n_valid, void *stream);
/* out[i, :] = hidden[token(k0 + i), :] for i < n (dt storage); an index outside [0, T)
 * gives a NaN row. */
lk_status lk_ce_cuda_gather(const lk_ce_cuda_plan *p, lk_dtype dt, const void *hidden, int64_t H, int64_t k0,
                            int64_t n, void *out, void *stream);
/* One block per row i < n of the logits chunk z [n, V] (zt: f32 or bf16): softcap, online
 * softmax, loss and z-loss of kept row k0 + i, into loss[j] / zl[j] (j = k, or the token
 * when by_token; zl may be NULL), and its log-sum-exp into lse[k] (lse may be NULL). With
 * dz, the gradient wrt the raw logits at weight g = (d_loss ? d_loss[token] : 1) /
 * (mean ? *n_valid : 1) into dz [n, V] (gt), which may be z itself (same dtype): each
 * element is read before it is written, by one thread.
 * A label outside [0, V) that is not ignore_index gives NaN loss and gradient. */
lk_status lk_ce_cuda_rows(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt, void *dz, int64_t k0,
                          int64_t n, const int64_t *n_valid, const float *d_loss, float *loss, float *zl,
                          float *lse, int by_token, void *stream);
/* lk_ce_cuda_rows on Hopper (rows_sm90.cu): the same contract, each row read from global memory
 * once. *taken = 0 (nothing launched) off sm_90 or where the row's length or alignment does
 * not fit it; lk_ce_cuda_rows asks it first. */
lk_status lk_ce_cuda_rows_sm90(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt, void *dz,
                               int64_t k0, int64_t n, const int64_t *n_valid, const float *d_loss, float *loss,
                               float *zl, float *lse, int by_token, void *stream, int *taken);
/* The lean path's second pass: z [K, wb] holds the raw logits of vocab columns v0 .. v0+wb
 * for every kept row (ld wb); dz [K, wb] (may be z, same dtype) gets their gradient with
 * the saved lse [K], weighted as lk_ce_cuda_rows weights it. */
lk_status lk_ce_cuda_block_grad(const lk_ce_cuda_plan *p, lk_dtype zt, const void *z, lk_dtype gt, void *dz,
                                int64_t v0, int64_t wb, const float *lse, const int64_t *n_valid,
                                const float *d_loss, void *stream);
/* loss_out[0] = Σ loss[k] (/ *n_valid for mean), z_out likewise (may be NULL), summed in
 * double in a fixed order; nv_out[0] = *n_valid when nv_out is not NULL. */
lk_status lk_ce_cuda_finish(const lk_ce_cuda_plan *p, const float *loss, const float *zl, const int64_t *n_valid,
                            float *loss_out, float *z_out, int64_t *nv_out, void *stream);
/* dst[token(k0 + i), :] = scale·src[i, :] for i < n (src f32 [n, H], dst in dt); scale =
 * *d_loss, or 1 when d_loss is NULL. */
lk_status lk_ce_cuda_scatter_rows(const lk_ce_cuda_plan *p, const float *src, int64_t k0, int64_t n, int64_t H,
                                  const float *d_loss, lk_dtype dt, void *dst, void *stream);
/* dst[0..n) += scale·src (src f32, dst f32 or bf16 rounded once); scale as above. */
lk_status lk_ce_cuda_axpy(int64_t n, const float *src, const float *d_loss, lk_dtype dt, void *dst, void *stream);

#ifdef __cplusplus
}
#endif
#endif
