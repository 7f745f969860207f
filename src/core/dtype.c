/* dtype.c — dtype names and sizes, f16 conversion, and bulk conversion between the
 * float storage dtypes. bf16 is inline in tensor.h because every kernel needs it. */
#include <math.h>
#include <string.h>
#include "llmkern/tensor.h"

static const struct { const char *name; size_t size; } dtypes[LK_DTYPE_COUNT] = {
    [LK_F32] = {"f32", 4}, [LK_BF16] = {"bf16", 2}, [LK_F16] = {"f16", 2},
    [LK_I32] = {"i32", 4}, [LK_I64] = {"i64", 8},   [LK_BOOL] = {"bool", 1},
};

size_t lk_dtype_size(lk_dtype dt) { return (unsigned)dt < LK_DTYPE_COUNT ? dtypes[dt].size : 0; }

const char *lk_dtype_name(lk_dtype dt) {
    return (unsigned)dt < LK_DTYPE_COUNT ? dtypes[dt].name : "?";
}

lk_status lk_dtype_parse(const char *name, lk_dtype *out) {
    static const struct { const char *alias; lk_dtype dt; } aliases[] = {
        {"float32", LK_F32}, {"fp32", LK_F32}, {"bfloat16", LK_BF16},
        {"float16", LK_F16}, {"fp16", LK_F16}, {"int32", LK_I32}, {"int64", LK_I64},
    };
    for (int i = 0; i < LK_DTYPE_COUNT; i++)
        if (name && strcmp(name, dtypes[i].name) == 0) { *out = (lk_dtype)i; return LK_OK; }
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (name && strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].dt; return LK_OK; }
    return lk_error(LK_EINVAL, "dtype: expected one of f32, bf16, f16, i32, i64, bool, got '%s'",
                    name ? name : "(null)");
}

const char *lk_device_name(lk_device_type t) {
    return t == LK_DEVICE_CPU ? "cpu" : t == LK_DEVICE_CUDA ? "cuda" : "?";
}

/* IEEE half, round to nearest even, with subnormals, infinities and NaN. */
uint16_t lk_f32_to_f16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);                  /* NaN */
    if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                 /* overflow: inf */
    if (au < 0x38800000u) {                                                   /* subnormal or 0 */
        float a; memcpy(&a, &au, 4);
        uint32_t m = (uint32_t)lrintf(a * 16777216.0f);  /* units of 2^-24, ties to even */
        return (uint16_t)(sign | m);
    }
    uint32_t mant_odd = (au >> 13) & 1u;
    au += 0xc8000fffu + mant_odd;   /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (au >> 13));
}

float lk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        uint32_t u; memcpy(&u, &f, 4); u |= sign; memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                           : sign | ((exp + 112) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}

double lk_load(const void *data, lk_dtype dt, int64_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)data)[i];
    case LK_BF16: return lk_bf16_to_f32(((const uint16_t *)data)[i]);
    case LK_F16: return lk_f16_to_f32(((const uint16_t *)data)[i]);
    case LK_I32: return ((const int32_t *)data)[i];
    case LK_I64: return (double)((const int64_t *)data)[i];
    case LK_BOOL: return ((const uint8_t *)data)[i] != 0;
    default: return NAN;
    }
}

void lk_store(void *data, lk_dtype dt, int64_t i, double v) {
    switch (dt) {
    case LK_F32: ((float *)data)[i] = (float)v; break;
    case LK_BF16: ((uint16_t *)data)[i] = lk_f32_to_bf16((float)v); break;
    case LK_F16: ((uint16_t *)data)[i] = lk_f32_to_f16((float)v); break;
    case LK_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case LK_I64: ((int64_t *)data)[i] = (int64_t)v; break;
    case LK_BOOL: ((uint8_t *)data)[i] = v != 0; break;
    default: break;
    }
}

void lk_convert(const void *src, lk_dtype sdt, void *dst, lk_dtype ddt, int64_t n) {
    if (sdt == ddt) { memmove(dst, src, (size_t)n * lk_dtype_size(sdt)); return; }
    if (sdt == LK_BF16 && ddt == LK_F32) {
        const uint16_t *s = src; float *d = dst;
        #pragma omp parallel for simd schedule(static) if (n > (1 << 16))
        for (int64_t i = 0; i < n; i++) d[i] = lk_bf16_to_f32(s[i]);
        return;
    }
    if (sdt == LK_F32 && ddt == LK_BF16) {
        const float *s = src; uint16_t *d = dst;
        #pragma omp parallel for simd schedule(static) if (n > (1 << 16))
        for (int64_t i = 0; i < n; i++) d[i] = lk_f32_to_bf16(s[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) lk_store(dst, ddt, i, lk_load(src, sdt, i));
}
