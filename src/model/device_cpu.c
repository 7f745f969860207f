/* device_cpu.c — the model's buffers in host memory and its own moves as plain loops
 * (device.h). */
#include <stdlib.h>
#include <string.h>
#include "model/device.h"

static int current(void) { return 0; }

static void *alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n);
    return p;
}

static lk_status copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
    return LK_OK;
}

static lk_status zero(void *p, size_t bytes, lk_ctx *ctx) {
    (void)ctx;
    memset(p, 0, bytes);
    return LK_OK;
}

static lk_status heads(const float *src, float *dst, int64_t T, int64_t H, int64_t D, int back, lk_ctx *ctx) {
    (void)ctx;
    if (!back) {
        #pragma omp parallel for schedule(static)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) memcpy(dst + (h * T + t) * D, src + (t * H + h) * D, (size_t)D * 4);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) memcpy(dst + (t * H + h) * D, src + (h * T + t) * D, (size_t)D * 4);
    }
    return LK_OK;
}

static lk_status add(float *dst, const float *a, const float *b, int64_t n, lk_ctx *ctx) {
    (void)ctx;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
    return LK_OK;
}

static lk_status embed(const float *table, const int64_t *ids, float *x, int64_t T, int64_t H, int64_t V,
                       lk_ctx *ctx) {
    (void)V, (void)ctx;
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) memcpy(x + t * H, table + ids[t] * H, (size_t)H * 4);
    return LK_OK;
}

/* serial, so repeated ids add in one fixed order */
static lk_status embed_backward(float *dtable, const int64_t *ids, const float *dx, int64_t T, int64_t H, int64_t V,
                                lk_ctx *ctx) {
    (void)V, (void)ctx;
    for (int64_t t = 0; t < T; t++) {
        float *row = dtable + ids[t] * H;
        const float *d = dx + t * H;
        for (int64_t j = 0; j < H; j++) row[j] += d[j];
    }
    return LK_OK;
}

const lk_model_device lk_model_device_cpu = {
    .type = LK_DEVICE_CPU, .current = current, .alloc = alloc, .free = free, .put = copy, .get = copy,
    .zero = zero, .heads = heads, .add = add, .embed = embed, .embed_backward = embed_backward,
};
