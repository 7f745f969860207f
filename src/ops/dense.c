/* dense.c — the pieces shared by the GEMM-based CPU ops (see dense.h). */
#include <omp.h>
#include <stdint.h>
#include "ops/dense.h"

/* Fewer elements than this run on one thread: waking the team costs more. */
#define DENSE_PAR_MIN ((int64_t)1 << 15)

void lk_dense_store(void *dst, lk_dtype dt, const float *src, int64_t rows, int64_t cols, const void *bias) {
    #pragma omp parallel for schedule(static) if (rows * cols >= DENSE_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * cols;
        if (dt == LK_F32) {
            float *d = (float *)dst + r * cols;
            const float *b = bias;
            if (b) {
                #pragma omp simd
                for (int64_t c = 0; c < cols; c++) d[c] = s[c] + b[c];
            } else if (d != s) {
                #pragma omp simd
                for (int64_t c = 0; c < cols; c++) d[c] = s[c];
            }
        } else {
            uint16_t *d = (uint16_t *)dst + r * cols;
            const uint16_t *b = bias;
            #pragma omp simd
            for (int64_t c = 0; c < cols; c++) d[c] = lk_f32_to_bf16(s[c] + (b ? lk_bf16_to_f32(b[c]) : 0.0f));
        }
    }
}

size_t lk_grad_acc_bytes(lk_dtype dt, int64_t n) {
    return dt == LK_F32 ? 0 : lk_dense_piece((size_t)n * sizeof(float));
}

lk_status lk_grad_acc_begin(lk_grad_acc *g, void *dst, lk_dtype dt, int64_t n, lk_arena *arena) {
    *g = (lk_grad_acc){.dst = dst, .dt = dt, .n = n, .beta = 1.0f};
    if (dt == LK_F32) {
        g->acc = dst;
        return LK_OK;
    }
    g->acc = arena ? lk_arena_alloc(arena, (size_t)n * sizeof(float)) : NULL;
    g->beta = 0.0f;
    if (g->acc == NULL)
        return lk_error(LK_ENOMEM, "grad: arena: expected room for %lld f32, got too little", (long long)n);
    return LK_OK;
}

void lk_grad_acc_end(lk_grad_acc *g) {
    if (g->dt == LK_F32 || g->beta == 0.0f) return;      /* nothing was summed into acc */
    uint16_t *d = g->dst;
    const float *a = g->acc;
    #pragma omp parallel for simd schedule(static) if (g->n >= DENSE_PAR_MIN)
    for (int64_t i = 0; i < g->n; i++) d[i] = lk_f32_to_bf16(lk_bf16_to_f32(d[i]) + a[i]);
}

size_t lk_dense_gemm_acc_bytes(int64_t m, int64_t n, int64_t k, lk_dtype a, lk_dtype b, lk_dtype dst_dt) {
    return lk_grad_acc_bytes(dst_dt, m * n) + lk_gemm_workspace_bytes(m, n, k, a, b);
}

lk_status lk_dense_gemm_acc(int64_t m, int64_t n, int64_t k, lk_gemm_operand a, lk_gemm_operand b,
                            void *dst, lk_dtype dst_dt, lk_arena *arena) {
    lk_grad_acc g;
    size_t mark = arena ? arena->used : 0;
    lk_status s = lk_grad_acc_begin(&g, dst, dst_dt, m * n, arena);
    if (!s) s = lk_gemm(m, n, k, 1.0f, a, b, g.beta, g.acc, n, arena);
    if (!s) {
        g.beta = 1.0f;
        lk_grad_acc_end(&g);
    }
    if (arena) lk_arena_release(arena, mark);
    return s;
}

/* Columns are split in bands of DENSE_BAND; a thread sums its band over all rows, which
 * touches one short segment per row and keeps the accumulator in registers or L1. */
#define DENSE_BAND 256

void lk_dense_colsum_acc(void *dst, lk_dtype dst_dt, const void *src, lk_dtype src_dt, int64_t rows,
                         int64_t cols) {
    int64_t bands = (cols + DENSE_BAND - 1) / DENSE_BAND;
    #pragma omp parallel for schedule(static) if (rows * cols >= DENSE_PAR_MIN)
    for (int64_t b = 0; b < bands; b++) {
        float acc[DENSE_BAND];
        int64_t c0 = b * DENSE_BAND, w = cols - c0 < DENSE_BAND ? cols - c0 : DENSE_BAND;
        for (int64_t c = 0; c < w; c++) acc[c] = 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            #pragma omp simd
            for (int64_t c = 0; c < w; c++) acc[c] += lk_dense_ld(src, src_dt, r * cols + c0 + c);
        }
        for (int64_t c = 0; c < w; c++)
            lk_dense_st(dst, dst_dt, c0 + c, lk_dense_ld(dst, dst_dt, c0 + c) + acc[c]);
    }
}
