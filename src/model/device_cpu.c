/* device_cpu.c — the model's buffers in host memory and its own moves as plain loops
 * (device.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/tensor.h"
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

static lk_status copy_async(void *dst, const void *src, size_t bytes, lk_ctx *ctx) {
    (void)ctx;
    return copy(dst, src, bytes);
}

static lk_status zero(void *p, size_t bytes, lk_ctx *ctx) {
    (void)ctx;
    memset(p, 0, bytes);
    return LK_OK;
}

static lk_status fill(float *p, float v, int64_t n, lk_ctx *ctx) {
    (void)ctx;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return LK_OK;
}

static lk_status heads(const void *src, void *dst, int64_t T, int64_t H, int64_t D, int64_t ld, int back,
                       lk_dtype dt, lk_ctx *ctx) {
    (void)ctx;
    size_t es = lk_dtype_size(dt), row = (size_t)D * es;
    const char *s = src;
    char *d = dst;
    if (!back) {
        #pragma omp parallel for schedule(static)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) memcpy(d + (size_t)(h * T + t) * row, s + (size_t)(t * ld + h * D) * es, row);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) memcpy(d + (size_t)(t * ld + h * D) * es, s + (size_t)(h * T + t) * row, row);
    }
    return LK_OK;
}

static lk_status add(void *dst, const void *a, const void *b, int64_t n, lk_dtype dt, lk_ctx *ctx) {
    (void)ctx;
    if (dt == LK_BF16) {
        uint16_t *d = dst;
        const uint16_t *x = a, *y = b;
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = lk_f32_to_bf16(lk_bf16_to_f32(x[i]) + lk_bf16_to_f32(y[i]));
    } else {
        float *d = dst;
        const float *x = a, *y = b;
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = x[i] + y[i];
    }
    return LK_OK;
}

static lk_status acc(void *dst, lk_dtype ddt, const void *src, lk_dtype dt, int64_t n, lk_ctx *ctx) {
    (void)ctx;
    if (ddt == LK_BF16) {
        uint16_t *d = dst;
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = lk_f32_to_bf16(lk_bf16_to_f32(d[i]) + (float)lk_load(src, dt, i));
    } else {
        float *d = dst;
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] += (float)lk_load(src, dt, i);
    }
    return LK_OK;
}

static lk_status round_to(void *dst, const float *src, int64_t n, lk_dtype dt, lk_ctx *ctx) {
    (void)ctx;
    if (dst != (const void *)src) lk_convert(src, LK_F32, dst, dt, n);
    return LK_OK;
}

static lk_status embed(const void *table, const int64_t *ids, void *x, int64_t T, int64_t H, int64_t V,
                       lk_dtype dt, lk_ctx *ctx) {
    (void)V, (void)ctx;
    size_t row = (size_t)H * lk_dtype_size(dt);
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) memcpy((char *)x + (size_t)t * row, (const char *)table + (size_t)ids[t] * row, row);
    return LK_OK;
}

/* serial, so repeated ids add in one fixed order */
static void embed_backward_f32(float *dtable, const int64_t *ids, const void *dx, int64_t T, int64_t H, lk_dtype dt) {
    for (int64_t t = 0; t < T; t++) {
        float *row = dtable + ids[t] * H;
        if (dt == LK_F32) {   /* the f32 trainer's: no conversion per element */
            const float *d = (const float *)dx + t * H;
            for (int64_t j = 0; j < H; j++) row[j] += d[j];
        } else {
            for (int64_t j = 0; j < H; j++) row[j] += (float)lk_load(dx, dt, t * H + j);
        }
    }
}

static int by_id_then_token(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* A bf16 table as the GPU's kernel sums it: the tokens sorted by (id, token), each id's
 * rows summed in f32 in token order and added to the row once. */
static lk_status embed_backward_bf16(uint16_t *dtable, const int64_t *ids, const void *dx, int64_t T, int64_t H,
                                     lk_dtype dt) {
    int64_t (*k)[2] = malloc(sizeof *k * (size_t)(T > 0 ? T : 1));
    float *sum = malloc(sizeof *sum * (size_t)(H > 0 ? H : 1));
    if (!k || !sum) {
        free(k), free(sum);
        return lk_error(LK_ENOMEM, "model: the embedding's gradient: %lld tokens: out of memory", (long long)T);
    }
    for (int64_t t = 0; t < T; t++) k[t][0] = ids[t], k[t][1] = t;
    qsort(k, (size_t)T, sizeof *k, by_id_then_token);
    for (int64_t a = 0, b; a < T; a = b) {
        for (int64_t j = 0; j < H; j++) sum[j] = 0.0f;
        for (b = a; b < T && k[b][0] == k[a][0]; b++)
            for (int64_t j = 0; j < H; j++) sum[j] += (float)lk_load(dx, dt, k[b][1] * H + j);
        uint16_t *row = dtable + k[a][0] * H;
        for (int64_t j = 0; j < H; j++) row[j] = lk_f32_to_bf16(lk_bf16_to_f32(row[j]) + sum[j]);
    }
    free(k), free(sum);
    return LK_OK;
}

static lk_status embed_backward(void *dtable, lk_dtype tdt, const int64_t *ids, const void *dx, int64_t T, int64_t H,
                                int64_t V, lk_dtype dt, lk_ctx *ctx) {
    (void)V, (void)ctx;
    if (tdt == LK_BF16) return embed_backward_bf16(dtable, ids, dx, T, H, dt);
    embed_backward_f32(dtable, ids, dx, T, H, dt);
    return LK_OK;
}

static lk_status group_loss(float *scal, float scale, lk_comm *sp, lk_ctx *ctx) {
    (void)ctx;
    int64_t n;
    memcpy(&n, scal + 4, 8);
    double mean, unit;
    lk_status s = lk_sp_loss_reduce(sp, scal[0], n, &mean, &unit);
    if (s) return s;
    n = unit > 0 ? llround(1.0 / unit) : 0;
    scal[0] = (float)mean, scal[1] = (float)(scale * unit);
    memcpy(scal + 4, &n, 8);
    return LK_OK;
}

const lk_model_device lk_model_device_cpu = {
    .type = LK_DEVICE_CPU, .current = current, .alloc = alloc, .free = free, .put = copy, .get = copy,
    .host_alloc = alloc, .host_free = free, .put_async = copy_async,
    .zero = zero, .fill = fill, .heads = heads, .add = add, .acc = acc, .round = round_to, .embed = embed,
    .embed_backward = embed_backward, .group_loss = group_loss,
};
