/* tensor.h — dtypes, devices and lk_tensor, a strided view that never owns its memory.
 * bf16 conversion rounds to nearest even and keeps NaN a NaN. */
#ifndef LLMKERN_TENSOR_H
#define LLMKERN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_MAX_DIMS 6

typedef enum { LK_F32, LK_BF16, LK_F16, LK_I32, LK_I64, LK_BOOL, LK_DTYPE_COUNT } lk_dtype;
typedef enum { LK_DEVICE_CPU, LK_DEVICE_CUDA, LK_DEVICE_COUNT } lk_device_type;
typedef struct { lk_device_type type; int index; } lk_device;

typedef struct {
    void *data;                 /* NULL marks an absent optional tensor */
    lk_dtype dtype;
    lk_device device;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
    int64_t stride[LK_MAX_DIMS]; /* in elements */
} lk_tensor;

LK_API size_t lk_dtype_size(lk_dtype dt);
LK_API const char *lk_dtype_name(lk_dtype dt);               /* "f32", "bf16", ... */
LK_API lk_status lk_dtype_parse(const char *name, lk_dtype *out);
LK_API const char *lk_device_name(lk_device_type t);         /* "cpu", "cuda" */

/* A contiguous row-major CPU view of data. */
LK_API lk_tensor lk_tensor_view(void *data, lk_dtype dt, int ndim, const int64_t *shape);
/* The same for 1-D and 2-D, the common cases. */
LK_API lk_tensor lk_tensor_1d(void *data, lk_dtype dt, int64_t n);
LK_API lk_tensor lk_tensor_2d(void *data, lk_dtype dt, int64_t rows, int64_t cols);

LK_API int64_t lk_tensor_numel(const lk_tensor *t);
LK_API size_t lk_tensor_bytes(const lk_tensor *t);           /* numel * dtype size */
/* The bytes from data to the end of the last element (strides >= 0): lk_tensor_bytes for a
 * contiguous tensor, more for a view with gaps; 0 when empty. */
LK_API size_t lk_tensor_span_bytes(const lk_tensor *t);
LK_API int lk_tensor_is_contiguous(const lk_tensor *t);
LK_API int lk_tensor_same_shape(const lk_tensor *a, const lk_tensor *b);
/* "[8192, 4096]" into buf; returns buf. */
LK_API const char *lk_shape_str(const lk_tensor *t, char *buf, size_t n);

/* bf16: the top half of an f32, rounded to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t lk_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float lk_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
LK_API uint16_t lk_f32_to_f16(float f);
LK_API float lk_f16_to_f32(uint16_t h);

/* Converts n elements between float dtypes (f32, bf16, f16). */
LK_API void lk_convert(const void *src, lk_dtype src_dt, void *dst, lk_dtype dst_dt, int64_t n);
/* Element i of a contiguous float tensor as double, and the reverse (rounded to the dtype). */
LK_API double lk_load(const void *data, lk_dtype dt, int64_t i);
LK_API void lk_store(void *data, lk_dtype dt, int64_t i, double v);

#ifdef __cplusplus
}
#endif
#endif
