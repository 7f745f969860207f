/* dense.h — pieces shared by the GEMM-based CPU ops (linear, swiglu_mlp): element
 * load/store in f32 or bf16, rounding an f32 GEMM result into the storage dtype (with
 * an optional bias), gradient accumulation into f32 or bf16 buffers through one f32
 * accumulator rounded once, column sums. */
#ifndef LLMKERN_OPS_DENSE_H
#define LLMKERN_OPS_DENSE_H

#include "llmkern/llmkern.h"
#include "ops/gemm.h"

#define LK_DENSE_INLINE static inline __attribute__((always_inline))

/* Element i as f32, and stored back rounded to dt (f32 or bf16). */
LK_DENSE_INLINE float lk_dense_ld(const void *p, lk_dtype dt, int64_t i) {
    return dt == LK_F32 ? ((const float *)p)[i] : lk_bf16_to_f32(((const uint16_t *)p)[i]);
}
LK_DENSE_INLINE void lk_dense_st(void *p, lk_dtype dt, int64_t i, float v) {
    if (dt == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = lk_f32_to_bf16(v);
}

/* A GEMM operand over stored data. */
LK_DENSE_INLINE lk_gemm_operand lk_dense_opnd(const void *p, lk_dtype dt, int64_t ld, int trans) {
    return (lk_gemm_operand){.data = p, .dtype = dt, .ld = ld, .trans = trans};
}

/* Bytes an arena piece of `bytes` takes, alignment included. */
LK_DENSE_INLINE size_t lk_dense_piece(size_t bytes) {
    return (bytes + 2 * LK_ARENA_ALIGN - 1) & ~(size_t)(LK_ARENA_ALIGN - 1);
}
LK_DENSE_INLINE size_t lk_dense_max(size_t a, size_t b) { return a > b ? a : b; }

/* dst[r, c] = round_dt(src[r, c] + bias[c]), bias (dtype dt) may be NULL; dst may be
 * src itself when dt is f32. */
void lk_dense_store(void *dst, lk_dtype dt, const float *src, int64_t rows, int64_t cols, const void *bias);

/* Where a gradient of n elements is summed: the caller's buffer itself when it is f32
 * (every GEMM adds with beta 1), otherwise an f32 accumulator from the arena that the
 * first GEMM writes (beta 0) and lk_grad_acc_end adds to the caller's bf16 buffer,
 * rounding once. Use: begin; GEMM(s) into acc with beta, then beta = 1; end. */
typedef struct {
    float *acc;
    float beta;
    void *dst;
    lk_dtype dt;
    int64_t n;
} lk_grad_acc;

lk_status lk_grad_acc_begin(lk_grad_acc *g, void *dst, lk_dtype dt, int64_t n, lk_arena *arena);
/* Nothing to do for an accumulator that was zeroed and never begun. */
void lk_grad_acc_end(lk_grad_acc *g);
/* The arena bytes lk_grad_acc_begin takes. */
size_t lk_grad_acc_bytes(lk_dtype dt, int64_t n);

/* dst (f32 or bf16, [m, n] packed) += op(A) · op(B), rounded once. */
lk_status lk_dense_gemm_acc(int64_t m, int64_t n, int64_t k, lk_gemm_operand a, lk_gemm_operand b,
                            void *dst, lk_dtype dst_dt, lk_arena *arena);
size_t lk_dense_gemm_acc_bytes(int64_t m, int64_t n, int64_t k, lk_dtype a, lk_dtype b, lk_dtype dst_dt);

/* dst[c] (f32 or bf16) += Σ_r src[r, c], summed in f32 in row order per column, so the
 * result does not depend on the thread count. */
void lk_dense_colsum_acc(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt, int64_t rows,
                         int64_t cols);

#endif
