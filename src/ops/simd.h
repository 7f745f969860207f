/* simd.h — sixteen floats at a time, loaded from and stored to f32 or bf16 rows, for
 * the fused memory-bound kernels (RMSNorm, RoPE, ...). With AVX-512 (F, BW, VL: -march=native on this project's
 * machines) an lk_v16 is a zmm register; elsewhere it is a plain array the compiler
 * vectorizes as it can, so each kernel is written once for both.
 *
 * k is the number of valid lanes (1..16): the tail of a row is a masked load/store, so
 * no element past the row is read or written. nt asks for a non-temporal (streaming)
 * store; it is honoured only for full, aligned vectors and needs lk_v16_fence() before
 * another thread reads the data. The dtype and k arguments are constants at every
 * call site after inlining, so the branches on them fold away. */
#ifndef LLMKERN_OPS_SIMD_H
#define LLMKERN_OPS_SIMD_H

#include <stdint.h>
#include "llmkern/tensor.h"

/* Forced: the dtype and lane-count branches fold only once inlined. */
#define LK_V16_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define LK_V16_NATIVE 1

typedef __m512 lk_v16;

LK_V16_INLINE lk_v16 lk_v16_set1(float f) { return _mm512_set1_ps(f); }
LK_V16_INLINE lk_v16 lk_v16_mul(lk_v16 a, lk_v16 b) { return _mm512_mul_ps(a, b); }
LK_V16_INLINE lk_v16 lk_v16_add(lk_v16 a, lk_v16 b) { return _mm512_add_ps(a, b); }
LK_V16_INLINE lk_v16 lk_v16_fma(lk_v16 a, lk_v16 b, lk_v16 c) { return _mm512_fmadd_ps(a, b, c); }
/* c - a*b */
LK_V16_INLINE lk_v16 lk_v16_fnma(lk_v16 a, lk_v16 b, lk_v16 c) { return _mm512_fnmadd_ps(a, b, c); }
LK_V16_INLINE float lk_v16_sum(lk_v16 a) { return _mm512_reduce_add_ps(a); }

LK_V16_INLINE lk_v16 lk_v16_load(const void *p, lk_dtype dt, int64_t j, int k) {
    __mmask16 m = (__mmask16)((1u << k) - 1u);
    if (dt == LK_F32) {
        const float *f = (const float *)p + j;
        return k == 16 ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(m, f);
    }
    const uint16_t *h = (const uint16_t *)p + j;
    __m256i b = k == 16 ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(m, h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

/* Round to nearest even into bf16, NaN kept a quiet NaN: lk_f32_to_bf16, 16 lanes. */
LK_V16_INLINE __m256i lk_v16_to_bf16(lk_v16 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

LK_V16_INLINE void lk_v16_store(void *p, lk_dtype dt, int64_t j, lk_v16 v, int k, int nt) {
    __mmask16 m = (__mmask16)((1u << k) - 1u);
    if (dt == LK_F32) {
        float *f = (float *)p + j;
        if (k < 16) _mm512_mask_storeu_ps(f, m, v);
        else if (nt) _mm512_stream_ps(f, v);
        else _mm512_storeu_ps(f, v);
        return;
    }
    uint16_t *h = (uint16_t *)p + j;
    __m256i b = lk_v16_to_bf16(v);
    if (k < 16) _mm256_mask_storeu_epi16(h, m, b);
    else if (nt) _mm256_stream_si256((__m256i *)h, b);
    else _mm256_storeu_si256((__m256i *)h, b);
}

LK_V16_INLINE void lk_v16_fence(void) { _mm_sfence(); }

#else  /* portable: GCC vector extensions, lowered to whatever SIMD the target has */
#define LK_V16_NATIVE 0
/* Every function here is inlined, so no 64-byte vector crosses a call: the ABI note is moot. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float lk_v16 __attribute__((vector_size(64)));

LK_V16_INLINE lk_v16 lk_v16_set1(float f) { return (lk_v16){0} + f; }
LK_V16_INLINE lk_v16 lk_v16_mul(lk_v16 a, lk_v16 b) { return a * b; }
LK_V16_INLINE lk_v16 lk_v16_add(lk_v16 a, lk_v16 b) { return a + b; }
LK_V16_INLINE lk_v16 lk_v16_fma(lk_v16 a, lk_v16 b, lk_v16 c) { return a * b + c; }
LK_V16_INLINE lk_v16 lk_v16_fnma(lk_v16 a, lk_v16 b, lk_v16 c) { return c - a * b; }
LK_V16_INLINE float lk_v16_sum(lk_v16 a) { float s = 0; for (int i = 0; i < 16; i++) s += a[i]; return s; }

LK_V16_INLINE lk_v16 lk_v16_load(const void *p, lk_dtype dt, int64_t j, int k) {
    lk_v16 r = {0};
    if (dt == LK_F32 && k == 16) memcpy(&r, (const float *)p + j, sizeof r);
    else if (dt == LK_F32) for (int i = 0; i < k; i++) r[i] = ((const float *)p)[j + i];
    else for (int i = 0; i < k; i++) r[i] = lk_bf16_to_f32(((const uint16_t *)p)[j + i]);
    return r;
}

LK_V16_INLINE void lk_v16_store(void *p, lk_dtype dt, int64_t j, lk_v16 v, int k, int nt) {
    (void)nt;
    if (dt == LK_F32 && k == 16) memcpy((float *)p + j, &v, sizeof v);
    else if (dt == LK_F32) for (int i = 0; i < k; i++) ((float *)p)[j + i] = v[i];
    else for (int i = 0; i < k; i++) ((uint16_t *)p)[j + i] = lk_f32_to_bf16(v[i]);
}

LK_V16_INLINE void lk_v16_fence(void) {}
#endif

#endif
