/* common.c — pieces every attention adapter uses (internal.h): dimensions, the
 * visible key interval of each query row, the backward's delta and sink gradient,
 * row loads to f32, and the padding-mask → varlen helper of the public header. */
#include <math.h>
#include <omp.h>
#include "ops/validate.h"
#include "ops/attention/internal.h"

lk_attn_dims lk_attn_dims_of(const lk_attention_args *a) {
    lk_attn_dims d = {
        .B = a->q.shape[0], .Hq = a->q.shape[1], .Sq = a->q.shape[2], .D = a->q.shape[3],
        .Hkv = a->k.shape[1], .Skv = a->k.shape[2], .dt = a->q.dtype,
    };
    d.G = d.Hq / d.Hkv;
    d.scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)d.D);
    return d;
}

size_t lk_attn_lse_bytes(const lk_attention_args *a) {
    return (size_t)a->q.shape[0] * (size_t)a->q.shape[1] * (size_t)a->q.shape[2] * sizeof(float);
}

void lk_attn_row_intervals(const lk_attention_args *a, const lk_attn_dims *d, int64_t *lo, int64_t *hi) {
    const int32_t *cq = a->cu_seqlens_q.data, *ck = a->cu_seqlens_k.data;
    int64_t ndoc = cq ? a->cu_seqlens_q.shape[0] - 1 : 1, doc = 0;
    for (int64_t i = 0; i < d->Sq; i++) {
        int64_t qs = 0, qe = d->Sq, ks = 0, ke = d->Skv;
        if (cq) {
            while (doc + 1 < ndoc && i >= cq[doc + 1]) doc++;
            qs = cq[doc]; qe = cq[doc + 1]; ks = ck[doc]; ke = ck[doc + 1];
        }
        int64_t p = ks + (i - qs) + ((ke - ks) - (qe - qs));   /* aligned position, global kv index */
        int64_t l = ks, h = ke;
        if (a->causal && p + 1 < h) h = p + 1;
        if (a->window_left > 0 && p - a->window_left + 1 > l) l = p - a->window_left + 1;
        if (a->window_right > 0 && p + a->window_right < h) h = p + a->window_right;
        if (h < l) h = l;
        lo[i] = l;
        hi[i] = h;
    }
}

void lk_attn_load_rows(const void *src, lk_dtype dt, int64_t row_stride, int64_t rows, int64_t D, float *dst,
                       int64_t ldd) {
    for (int64_t r = 0; r < rows; r++) {
        if (dt == LK_F32) {
            const float *s = (const float *)src + r * row_stride;
            for (int64_t c = 0; c < D; c++) dst[r * ldd + c] = s[c];
        } else {
            const uint16_t *s = (const uint16_t *)src + r * row_stride;
            for (int64_t c = 0; c < D; c++) dst[r * ldd + c] = lk_bf16_to_f32(s[c]);
        }
    }
}

static float row_dot(const void *x, const void *y, lk_dtype dt, int64_t off, int64_t n) {
    float s = 0.0f;
    if (dt == LK_F32) {
        const float *a = (const float *)x + off, *b = (const float *)y + off;
        for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
    } else {
        const uint16_t *a = (const uint16_t *)x + off, *b = (const uint16_t *)y + off;
        for (int64_t c = 0; c < n; c++) s += lk_bf16_to_f32(a[c]) * lk_bf16_to_f32(b[c]);
    }
    return s;
}

void lk_attn_delta(const lk_attention_args *a, const lk_attn_dims *d, float *delta) {
    #pragma omp parallel for collapse(2) schedule(static) if (d->B * d->Sq * d->Hq * d->D >= (1 << 16))
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t i = 0; i < d->Sq; i++)
            for (int64_t h = 0; h < d->Hq; h++)
                delta[(b * d->Hq + h) * d->Sq + i] =
                    row_dot(a->dout.data, a->out.data, d->dt, ((b * d->Sq + i) * d->Hq + h) * d->D, d->D);
}

void lk_attn_sink_grad(const lk_attention_args *a, const lk_attn_dims *d, const float *lse, const float *delta) {
    if (!a->s_aux.data || !a->ds_aux.data) return;
    const float *sink = a->s_aux.data;
    float *ds = a->ds_aux.data;
    for (int64_t h = 0; h < d->Hq; h++) {
        double acc = 0.0;
        for (int64_t b = 0; b < d->B; b++)
            for (int64_t i = 0; i < d->Sq; i++) {
                int64_t r = (b * d->Hq + h) * d->Sq + i;
                acc -= (double)expf(sink[h] - lse[r]) * delta[r];
            }
        ds[h] = (float)acc;
    }
}

static int64_t mask_at(const lk_tensor *m, int64_t i) {
    switch (m->dtype) {
    case LK_BOOL: return ((const uint8_t *)m->data)[i];
    case LK_I32: return ((const int32_t *)m->data)[i];
    default: return ((const int64_t *)m->data)[i];
    }
}

lk_status lk_attention_varlen_from_padding(const lk_tensor *mask, int32_t *cu_seqlens, int64_t *indices,
                                           int64_t *total, int64_t *max_seqlen) {
    static const char *op = "attention";
    lk_status s;
    if (mask == NULL) return lk_error(LK_EINVAL, "attention: mask: expected a padding mask, got NULL");
    if (!cu_seqlens || !indices || !total || !max_seqlen)
        return lk_error(LK_EINVAL, "attention: cu_seqlens: expected outputs cu_seqlens, indices, total and "
                        "max_seqlen, got NULL");
    if ((s = lk_expect_present(op, "mask", mask)) || (s = lk_expect_contiguous(op, "mask", mask, 2)) ||
        (s = lk_expect_dtype(op, "mask", mask, LK_DTYPE_BIT(LK_BOOL) | LK_DTYPE_BIT(LK_I32) |
                                                   LK_DTYPE_BIT(LK_I64))))
        return s;
    if (mask->ndim != 2)
        return lk_error(LK_ESHAPE, "attention: mask: expected a rank-2 padding mask [B, S], got rank %d",
                        mask->ndim);
    int64_t B = mask->shape[0], S = mask->shape[1], n = 0, longest = 0;
    if ((int64_t)(B * S) > INT32_MAX)
        return lk_error(LK_ESHAPE, "attention: mask: expected fewer than 2^31 tokens, got %lld", (long long)(B * S));
    cu_seqlens[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t start = n;
        for (int64_t t = 0; t < S; t++)
            if (mask_at(mask, b * S + t)) indices[n++] = b * S + t;
        if (n - start > longest) longest = n - start;
        cu_seqlens[b + 1] = (int32_t)n;
    }
    *total = n;
    *max_seqlen = longest;
    return LK_OK;
}
