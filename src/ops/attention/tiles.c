/* tiles.c — the f32 tile products and the exponential the tiled attention engine
 * (flash.c) runs on: register-blocked AVX-512 (or portable vector) loops on tiles of
 * 64-128 rows that live in L1/L2. Called from inside the engine's OpenMP region, so
 * they never start threads (a threaded BLAS call per 64x64 tile costs more than the
 * product). 4 rows x 64 columns of accumulators = 16 vector registers. */
#include <math.h>
#include "ops/attention/internal.h"
#include "ops/simd.h"

#define INLINE static inline __attribute__((always_inline))

/* rows (1..4) rows of C[., 0:64) = A · BT[:, 0:64). */
INLINE void abt_block(const float *A, int64_t lda, int rows, const float *BT, int64_t ldb, int64_t D, float *C,
                      int64_t ldc) {
    lk_v16 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = lk_v16_set1(0.0f);
    for (int64_t d = 0; d < D; d++) {
        const float *b = BT + d * ldb;
        lk_v16 b0 = lk_v16_load(b, LK_F32, 0, 16), b1 = lk_v16_load(b, LK_F32, 16, 16);
        lk_v16 b2 = lk_v16_load(b, LK_F32, 32, 16), b3 = lk_v16_load(b, LK_F32, 48, 16);
        for (int r = 0; r < rows; r++) {
            lk_v16 x = lk_v16_set1(A[r * lda + d]);
            acc[r][0] = lk_v16_fma(x, b0, acc[r][0]);
            acc[r][1] = lk_v16_fma(x, b1, acc[r][1]);
            acc[r][2] = lk_v16_fma(x, b2, acc[r][2]);
            acc[r][3] = lk_v16_fma(x, b3, acc[r][3]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 4; c++) lk_v16_store(C + r * ldc, LK_F32, 16 * c, acc[r][c], 16, 0);
}

/* rows (1..4) rows of C[., 0:16 nv) = A · BT[:, 0:16 nv), nv 1..3: the columns of a span
 * past its last 64 (a partial tile's spans are often 16-48 wide). Four rows share each
 * load of BT; the one-row loop it replaced did a load per FMA, a quarter of lk_attn_abt
 * in a document mask's forward. A separate function from abt_block, called with
 * constant nv, so that the 64-column block stays as gcc schedules it. */
INLINE void abt_tail(const float *A, int64_t lda, int rows, const float *BT, int64_t ldb, int64_t D, float *C,
                     int64_t ldc, int nv) {
    lk_v16 acc[4][3];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = lk_v16_set1(0.0f);
    for (int64_t d = 0; d < D; d++) {
        lk_v16 b[3];
        for (int c = 0; c < nv; c++) b[c] = lk_v16_load(BT + d * ldb, LK_F32, 16 * c, 16);
        for (int r = 0; r < rows; r++) {
            lk_v16 x = lk_v16_set1(A[r * lda + d]);
            for (int c = 0; c < nv; c++) acc[r][c] = lk_v16_fma(x, b[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < nv; c++) lk_v16_store(C + r * ldc, LK_F32, 16 * c, acc[r][c], 16, 0);
}

/* The rows of C[., 0:16 nv) in fours, then one by one. */
INLINE void abt_tail_rows(const float *A, int64_t lda, int64_t m, const float *BT, int64_t ldb, int64_t D, float *C,
                          int64_t ldc, int nv) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) abt_tail(A + i * lda, lda, 4, BT, ldb, D, C + i * ldc, ldc, nv);
    for (; i < m; i++) abt_tail(A + i * lda, lda, 1, BT, ldb, D, C + i * ldc, ldc, nv);
}

void lk_attn_abt(const float *A, int64_t lda, int64_t m, const float *BT, int64_t ldb, int64_t ncols, int64_t D,
                 float *C, int64_t ldc) {
    int64_t c0 = 0;
    for (; c0 + LK_ATTN_COLS <= ncols; c0 += LK_ATTN_COLS) {
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) abt_block(A + i * lda, lda, 4, BT + c0, ldb, D, C + i * ldc + c0, ldc);
        for (; i < m; i++) abt_block(A + i * lda, lda, 1, BT + c0, ldb, D, C + i * ldc + c0, ldc);
    }
    switch ((ncols - c0) / 16) {
    case 1: abt_tail_rows(A, lda, m, BT + c0, ldb, D, C + c0, ldc, 1); break;
    case 2: abt_tail_rows(A, lda, m, BT + c0, ldb, D, C + c0, ldc, 2); break;
    case 3: abt_tail_rows(A, lda, m, BT + c0, ldb, D, C + c0, ldc, 3); break;
    default: break;
    }
}

/* rows (1..4) rows of C[., c0:c0+64) += A · B[:, c0:c0+64), lanes per vector in k[]. */
INLINE void ab_block(const float *A, int64_t lda, int rows, int64_t n, const float *B, int64_t ldb, int64_t c0,
                     const int k[4], float *C, int64_t ldc) {
    lk_v16 acc[4][4];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = k[c] ? lk_v16_load(C + r * ldc, LK_F32, c0 + 16 * c, k[c]) : lk_v16_set1(0.0f);
    for (int64_t j = 0; j < n; j++) {
        const float *b = B + j * ldb;
        lk_v16 bv[4];
        for (int c = 0; c < 4; c++) bv[c] = k[c] ? lk_v16_load(b, LK_F32, c0 + 16 * c, k[c]) : lk_v16_set1(0.0f);
        for (int r = 0; r < rows; r++) {
            lk_v16 x = lk_v16_set1(A[r * lda + j]);
            for (int c = 0; c < 4; c++) acc[r][c] = lk_v16_fma(x, bv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 4; c++)
            if (k[c]) lk_v16_store(C + r * ldc, LK_F32, c0 + 16 * c, acc[r][c], k[c], 0);
}

void lk_attn_acc_ab(const float *A, int64_t lda, int64_t m, int64_t n, const float *B, int64_t ldb, int64_t D,
                    float *C, int64_t ldc) {
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
        int k[4];
        for (int c = 0; c < 4; c++) {
            int64_t left = D - c0 - 16 * c;
            k[c] = left <= 0 ? 0 : left >= 16 ? 16 : (int)left;
        }
        int64_t i = 0;
        if (k[3] == 16) {       /* a whole 64-column chunk: the common case, lanes fixed */
            static const int full[4] = {16, 16, 16, 16};
            for (; i + 4 <= m; i += 4) ab_block(A + i * lda, lda, 4, n, B, ldb, c0, full, C + i * ldc, ldc);
            for (; i < m; i++) ab_block(A + i * lda, lda, 1, n, B, ldb, c0, full, C + i * ldc, ldc);
        } else {
            for (; i + 4 <= m; i += 4) ab_block(A + i * lda, lda, 4, n, B, ldb, c0, k, C + i * ldc, ldc);
            for (; i < m; i++) ab_block(A + i * lda, lda, 1, n, B, ldb, c0, k, C + i * ldc, ldc);
        }
    }
}

#if LK_V16_NATIVE
/* One block of up to 16 x 16 in registers: the four unpack / shuffle stages of the
 * 16 x 16 transpose. The scalar loop it replaced was an eighth of the forward (the K
 * tile of every visited block) and of the backward (P and dS of every pair). */
INLINE void transpose16(const float *src, int64_t lds, int rows, int cols, float *dst, int64_t ldd) {
    __m512 a[16], b[16];
    __mmask16 kc = (__mmask16)((1u << cols) - 1u), kr = (__mmask16)((1u << rows) - 1u);
    for (int i = 0; i < 16; i++) a[i] = i < rows ? _mm512_maskz_loadu_ps(kc, src + i * lds) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
        b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            __m512d x = _mm512_castps_pd(b[i + k]), y = _mm512_castps_pd(b[i + k + 2]);
            a[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            a[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            b[i + k] = _mm512_shuffle_f32x4(a[i + k], a[i + k + 4], 0x88);
            b[i + k + 4] = _mm512_shuffle_f32x4(a[i + k], a[i + k + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        a[i] = _mm512_shuffle_f32x4(b[i], b[i + 8], 0x88);
        a[i + 8] = _mm512_shuffle_f32x4(b[i], b[i + 8], 0xdd);
    }
    for (int c = 0; c < cols; c++) _mm512_mask_storeu_ps(dst + c * ldd, kr, a[c]);
}

void lk_attn_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c0 = 0; c0 < cols; c0 += 16)
            transpose16(src + r0 * lds + c0, lds, rows - r0 < 16 ? (int)(rows - r0) : 16,
                        cols - c0 < 16 ? (int)(cols - c0) : 16, dst + c0 * ldd + r0, ldd);
}

float lk_attn_row_max(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
    if (j < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, (__mmask16)((1u << (n - j)) - 1u), x + j));
    return _mm512_reduce_max_ps(m);
}

/* exp(x) for x <= 0-ish: 2^n · p(f), p a degree-7 fit of 2^f on [-½, ½] (~1 ulp).
 * Inputs below -87 (the -inf of hidden scores among them) give exactly 0, through the
 * mask rather than by scalef's underflow: a subnormal or underflowing result takes a
 * microcode assist, which made exp of a hidden score ~4x dearer than of a seen one and
 * partial blocks (a document mask's majority) dearer than full ones. e^-87 is still
 * normal; what is dropped is below 2^-126 of the row's largest term. */
INLINE __m512 exp16(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);   /* NaN: 0, as before */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

float lk_attn_exp_sum(float *x, int64_t n, float m) {
    __m512 vm = _mm512_set1_ps(m), s = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
        _mm512_storeu_ps(x + j, e);
        s = _mm512_add_ps(s, e);
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(x + j, k, e);
        s = _mm512_add_ps(s, e);
    }
    return _mm512_reduce_add_ps(s);
}
#else
void lk_attn_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c = 0; c < cols; c++)
            for (int64_t r = r0; r < r0 + 16 && r < rows; r++) dst[c * ldd + r] = src[r * lds + c];
}

float lk_attn_row_max(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

float lk_attn_exp_sum(float *x, int64_t n, float m) {
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++) s += (x[j] = expf(x[j] - m));
    return s;
}
#endif
