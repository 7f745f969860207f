/* gemm.c — CPU GEMM through CBLAS over f32 or bf16 storage (see gemm.h). */
#include <cblas.h>
#include "ops/gemm.h"

size_t lk_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, lk_dtype a, lk_dtype b) {
    size_t bytes = 0;
    if (a == LK_BF16) bytes += (size_t)m * (size_t)k * sizeof(float) + LK_ARENA_ALIGN;
    if (b == LK_BF16) bytes += (size_t)k * (size_t)n * sizeof(float) + LK_ARENA_ALIGN;
    return bytes;
}

/* A bf16 operand widened into a packed f32 copy (ld becomes its row length). */
static lk_status widen(lk_gemm_operand *o, int64_t rows_used, int64_t cols_used, lk_arena *arena) {
    if (o->dtype == LK_F32) return LK_OK;
    if (o->dtype != LK_BF16)
        return lk_error(LK_EDTYPE, "gemm: operand: expected f32 or bf16, got %s", lk_dtype_name(o->dtype));
    int64_t rows = o->trans ? cols_used : rows_used, cols = o->trans ? rows_used : cols_used;
    float *f = arena ? lk_arena_alloc(arena, (size_t)rows * (size_t)cols * sizeof(float)) : NULL;
    if (f == NULL)
        return lk_error(LK_ENOMEM, "gemm: arena: expected room for %lld x %lld f32, got too little "
                        "(reserve lk_gemm_workspace_bytes)", (long long)rows, (long long)cols);
    const uint16_t *src = o->data;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) f[r * cols + c] = lk_bf16_to_f32(src[r * o->ld + c]);
    *o = (lk_gemm_operand){.data = f, .dtype = LK_F32, .ld = cols, .trans = o->trans};
    return LK_OK;
}

lk_status lk_gemm(int64_t m, int64_t n, int64_t k, float alpha, lk_gemm_operand a, lk_gemm_operand b,
                  float beta, float *c, int64_t ldc, lk_arena *arena) {
    if (m == 0 || n == 0) return LK_OK;
    size_t mark = arena ? arena->used : 0;
    lk_status s = widen(&a, m, k, arena);
    if (!s) s = widen(&b, k, n, arena);
    if (!s && k == 0) {                 /* BLAS leaves C alone when k is 0; beta must still apply */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] *= beta;
    } else if (!s) {
        cblas_sgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                    (int)m, (int)n, (int)k, alpha, a.data, (int)a.ld, b.data, (int)b.ld, beta, c, (int)ldc);
    }
    if (arena) lk_arena_release(arena, mark);
    return s;
}
