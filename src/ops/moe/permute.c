/* permute.c — the expert-sorted order of the routes and the two row movements around
 * it: a gather into expert-sorted f32 rows and the un-permute that sums each token's k
 * routes (see internal.h). The fused experts build on these; eager finds its tokens
 * expert by expert instead. */
#include <string.h>
#include "ops/moe/internal.h"

lk_moe_dims lk_moe_dims_of(const lk_moe_experts_args *a) {
    lk_moe_dims d = {.t = a->hidden.shape[0], .h = a->hidden.shape[1], .k = a->topk_ids.shape[1],
                     .e = a->gate_up_weight.shape[0], .i = a->gate_up_weight.shape[1] / 2, .dt = a->hidden.dtype};
    d.r = d.t * d.k;
    return d;
}

size_t lk_moe_fused_saved_bytes(int64_t t, int64_t k, int64_t e, int64_t h, int64_t i, lk_dtype dt) {
    int64_t r = t * k;
    return lk_arena_piece(sizeof(int64_t) * (size_t)(e + 1)) + 2 * lk_arena_piece(sizeof(int32_t) * (size_t)r) +
           (size_t)r * (size_t)(2 * i) * lk_dtype_size(dt);
}

lk_moe_fused_saved lk_moe_fused_saved_view(void *saved, const lk_moe_dims *d) {
    char *p = saved;
    lk_moe_fused_saved v;
    v.offs = (int64_t *)p;
    p += lk_arena_piece(sizeof(int64_t) * (size_t)(d->e + 1));
    v.order = (int32_t *)p;
    p += lk_arena_piece(sizeof(int32_t) * (size_t)d->r);
    v.pos = (int32_t *)p;
    p += lk_arena_piece(sizeof(int32_t) * (size_t)d->r);
    v.gu = p;
    return v;
}

void lk_moe_permute(const int32_t *ids, int64_t routes, int64_t experts, int64_t *offs, int32_t *order,
                    int32_t *pos) {
    memset(offs, 0, sizeof(int64_t) * (size_t)(experts + 1));
    for (int64_t r = 0; r < routes; r++) offs[ids[r] + 1]++;
    for (int64_t e = 0; e < experts; e++) offs[e + 1] += offs[e];
    /* a running cursor per expert: offs is restored by the second pass's shift */
    for (int64_t r = 0; r < routes; r++) {
        int64_t p = offs[ids[r]]++;
        order[p] = (int32_t)r;
        pos[r] = (int32_t)p;
    }
    for (int64_t e = experts; e > 0; e--) offs[e] = offs[e - 1];
    offs[0] = 0;
}

void lk_moe_gather_rows(float *dst, const void *src, lk_dtype dt, int64_t h, const int32_t *order, int64_t n,
                        int64_t k) {
    #pragma omp parallel for schedule(static) if (n * h >= LK_MOE_PAR_MIN)
    for (int64_t p = 0; p < n; p++) {
        int64_t t = order[p] / k;
        float *d = dst + p * h;
        if (dt == LK_F32) {
            memcpy(d, (const float *)src + t * h, sizeof(float) * (size_t)h);
        } else {
            const uint16_t *s = (const uint16_t *)src + t * h;
            #pragma omp simd
            for (int64_t c = 0; c < h; c++) d[c] = lk_bf16_to_f32(s[c]);
        }
    }
}

void lk_moe_unpermute_sum(void *dst, lk_dtype dt, const float *src, int64_t h, const int32_t *pos, int64_t t,
                          int64_t k) {
    #pragma omp parallel for schedule(static) if (t * k * h >= LK_MOE_PAR_MIN)
    for (int64_t tok = 0; tok < t; tok++) {
        const float *s0 = src + (int64_t)pos[tok * k] * h;
        if (dt == LK_F32) {
            float *d = (float *)dst + tok * h;
            memcpy(d, s0, sizeof(float) * (size_t)h);
            for (int64_t j = 1; j < k; j++) {
                const float *s = src + (int64_t)pos[tok * k + j] * h;
                #pragma omp simd
                for (int64_t c = 0; c < h; c++) d[c] += s[c];
            }
        } else {
            uint16_t *d = (uint16_t *)dst + tok * h;
            for (int64_t c0 = 0; c0 < h; c0 += 256) {      /* an f32 row piece on the stack */
                float acc[256];
                int64_t n = h - c0 < 256 ? h - c0 : 256;
                memcpy(acc, s0 + c0, sizeof(float) * (size_t)n);
                for (int64_t j = 1; j < k; j++) {
                    const float *s = src + (int64_t)pos[tok * k + j] * h + c0;
                    #pragma omp simd
                    for (int64_t c = 0; c < n; c++) acc[c] += s[c];
                }
                #pragma omp simd
                for (int64_t c = 0; c < n; c++) d[c0 + c] = lk_f32_to_bf16(acc[c]);
            }
        }
    }
}

lk_status lk_moe_grad_begin(lk_grad_acc *g, const lk_tensor *dst, int64_t n, int write, lk_arena *arena) {
    if (write) memset(dst->data, 0, (size_t)n * lk_dtype_size(dst->dtype));   /* written: added onto zeros */
    lk_status s = lk_grad_acc_begin(g, dst->data, dst->dtype, n, arena);
    if (s) return s;
    if (g->beta == 0.0f) {
        memset(g->acc, 0, sizeof(float) * (size_t)n);
        g->beta = 1.0f;
    }
    return LK_OK;
}
