/* block_mask.c — building BlockMasks (include/llmkern/block_mask.h): the predicate is
 * evaluated on every element once (a row at a time through the builders' row forms; the
 * interval families count a row's keys from its span instead),
 * each (q block, kv block) classified empty, partial or full, and the lists and their
 * transposes written into one allocation. Also the
 * standard predicates, the ready builders (which own a copy of their context) and the
 * score_mod examples. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/block_mask.h"

#include "core/checked.h"
#include "ops/attention/flex_plan.h"

static int64_t cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }   /* a + b - 1 may overflow */

/* The mask's sizes, every product checked (core/checked.h): B*H*nq*nk and the buffer
 * once wrapped to 64 bytes, and the build then ran for ever. Indices are int32 (as
 * PyTorch's), so each side holds at most 2^31 - 1 blocks. */
typedef struct { int64_t bh, nq, nk, cells; size_t bytes; } mask_sizes;

static lk_status check_sizes(int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN, int64_t q_block, int64_t kv_block,
                             mask_sizes *z) {
    if (B < 1 || H < 1 || Q_LEN < 1 || KV_LEN < 1 || q_block < 1 || kv_block < 1)
        return lk_error(LK_EINVAL, "block_mask: shape: expected B, H, Q_LEN, KV_LEN and block sizes >= 1, got "
                        "[%lld, %lld, %lld, %lld] blocks %lldx%lld", (long long)B, (long long)H, (long long)Q_LEN,
                        (long long)KV_LEN, (long long)q_block, (long long)kv_block);
    z->nq = cdiv(Q_LEN, q_block), z->nk = cdiv(KV_LEN, kv_block);
    if (z->nq > INT32_MAX || z->nk > INT32_MAX)
        return lk_error(LK_EINVAL, "block_mask: %s: %lld / %lld = %lld blocks, more than int32 indices hold (2^31 - 1)",
                        z->nq > INT32_MAX ? "Q_LEN" : "KV_LEN", (long long)(z->nq > INT32_MAX ? Q_LEN : KV_LEN),
                        (long long)(z->nq > INT32_MAX ? q_block : kv_block), (long long)(z->nq > INT32_MAX ? z->nq : z->nk));
    int64_t f[4] = {B, H, z->nq, z->nk}, e[4] = {B, H, Q_LEN, KV_LEN}, span, lists, words;
    lk_status s;
    if ((s = lk_checked_mul("block_mask: B x H", B, H, &z->bh)) ||
        (s = lk_checked_prod("block_mask: B x H x num_q_blocks x num_kv_blocks", f, 4, &z->cells)) ||
        (s = lk_checked_prod("block_mask: B x H x Q_LEN x KV_LEN (the predicate runs on every element)", e, 4, &span)) ||
        (s = lk_checked_mul("block_mask: num_q_blocks x Q_BLOCK_SIZE", z->nq, q_block, &span)) ||   /* loop bounds */
        (s = lk_checked_mul("block_mask: num_kv_blocks x KV_BLOCK_SIZE", z->nk, kv_block, &span)) ||
        (s = lk_checked_mul("block_mask: B x H x (num_q_blocks + num_kv_blocks)", z->bh, z->nq + z->nk, &lists)) ||
        (s = lk_checked_mul("block_mask: the index lists", 4, lists, &lists)) ||
        (s = lk_checked_mul("block_mask: the index arrays", 4, z->cells, &words)) ||
        (s = lk_checked_add("block_mask: the index buffer", lists, words, &words)) ||
        (s = lk_checked_bytes("block_mask: the index buffer", words, sizeof(int32_t), &z->bytes)))
        return s;
    char what[160];
    snprintf(what, sizeof what, "block_mask: [%lld, %lld, %lld, %lld] in %lldx%lld blocks", (long long)B, (long long)H,
             (long long)Q_LEN, (long long)KV_LEN, (long long)q_block, (long long)kv_block);
    return lk_check_fits_memory(what, (uint64_t)z->bytes + (uint64_t)z->cells);
}

/* A row's visible keys as one interval [lo, hi), for the families where they are one
 * (causal, window, prefix-LM, documents from cu_seqlens, their AND). */
typedef void (*span_fn)(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi);

/* Visible elements of rows [q0, q1) x keys [k0, k1) of (b, h): through the row form when
 * there is one (a vectorized compare or a memset a row; the builders' masks at S = 4096
 * were 20-30 ms of one indirect call an element, more than the flex forward they serve),
 * else the predicate on every element. */
static int64_t count_seen(lk_mask_fn fn, lk_mask_row_fn row, const void *ctx, int64_t b, int64_t h, int64_t q0,
                          int64_t q1, int64_t k0, int64_t k1) {
    int64_t seen = 0;
    uint8_t buf[256];
    for (int64_t i = q0; i < q1; i++) {
        if (!row) {
            for (int64_t j = k0; j < k1; j++) seen += fn(b, h, i, j, ctx);
            continue;
        }
        for (int64_t j0 = k0; j0 < k1; j0 += 256) {
            int64_t n = k1 - j0 < 256 ? k1 - j0 : 256;
            row(b, h, i, j0, n, buf, ctx);
            for (int64_t j = 0; j < n; j++) seen += buf[j] != 0;
        }
    }
    return seen;
}

/* The same from the rows' spans (sp: [lo, hi) of each row): O(rows) a block, where the
 * trainer's document mask over 32k tokens is 2^30 elements. */
static int64_t count_spans(const int64_t *sp, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    int64_t seen = 0;
    for (int64_t i = q0; i < q1; i++) {
        const int64_t lo = sp[2 * i] > k0 ? sp[2 * i] : k0, hi = sp[2 * i + 1] < k1 ? sp[2 * i + 1] : k1;
        seen += hi > lo ? hi - lo : 0;
    }
    return seen;
}

/* lk_block_mask_create, with the predicate's row and span forms when it has them. */
static lk_status create(lk_mask_fn mask_mod, lk_mask_row_fn row, span_fn span, const void *ctx, int64_t B, int64_t H,
                        int64_t Q_LEN, int64_t KV_LEN, int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    if (!mask_mod || !out)
        return lk_error(LK_EINVAL, "block_mask: %s: expected a pointer, got NULL", out ? "mask_mod" : "out");
    if (q_block == 0) q_block = LK_BLOCK_MASK_DEFAULT_BLOCK;
    if (kv_block == 0) kv_block = LK_BLOCK_MASK_DEFAULT_BLOCK;
    mask_sizes z;
    lk_status s = check_sizes(B, H, Q_LEN, KV_LEN, q_block, kv_block, &z);
    if (s) return s;
    int64_t nq = z.nq, nk = z.nk, bh = z.bh;
    size_t cells = (size_t)z.cells;
    int32_t *all = calloc(z.bytes / sizeof(int32_t), sizeof(int32_t));
    uint8_t *kind = malloc(cells ? cells : 1);          /* 0 empty, 1 partial, 2 full */
    if (!all || !kind) {
        free(all); free(kind);
        return lk_error(LK_ENOMEM, "block_mask: out of memory for %zu blocks", cells);
    }
    /* with a span form, each row's span once a pattern (then one pattern at a time); without
     * one (or no memory for them), the row form's counts a block */
    int64_t *sp = span ? malloc((size_t)Q_LEN * 2 * sizeof *sp) : NULL;
    const int64_t step = sp ? 1 : bh;
    for (int64_t r0 = 0; r0 < bh; r0 += step) {
        if (sp) {
            #pragma omp parallel for if (Q_LEN >= 4096)
            for (int64_t i = 0; i < Q_LEN; i++) span(r0 / H, r0 % H, i, ctx, &sp[2 * i], &sp[2 * i + 1]);
        }
        #pragma omp parallel for collapse(2) schedule(dynamic, 1) if ((double)step * (double)Q_LEN * (double)KV_LEN >= 65536.0)
        for (int64_t r = r0; r < r0 + step; r++)
            for (int64_t qb = 0; qb < nq; qb++)
                for (int64_t kb = 0; kb < nk; kb++) {
                    int64_t q0 = qb * q_block, q1 = q0 + q_block < Q_LEN ? q0 + q_block : Q_LEN;
                    int64_t k0 = kb * kv_block, k1 = k0 + kv_block < KV_LEN ? k0 + kv_block : KV_LEN;
                    int64_t seen = sp ? count_spans(sp, q0, q1, k0, k1)
                                      : count_seen(mask_mod, row, ctx, r / H, r % H, q0, q1, k0, k1);
                    kind[(r * nq + qb) * nk + kb] = seen == 0 ? 0 : seen == (q1 - q0) * (k1 - k0) ? 2 : 1;
                }
    }
    free(sp);
    lk_block_mask m = {.B = B, .H = H, .Q_LEN = Q_LEN, .KV_LEN = KV_LEN, .Q_BLOCK_SIZE = q_block,
                       .KV_BLOCK_SIZE = kv_block, .num_q_blocks = nq, .num_kv_blocks = nk, .mask_mod = mask_mod,
                       .mask_ctx = ctx};
    int32_t *p = all;
    m.kv_num_blocks = p; p += bh * nq;
    m.full_kv_num_blocks = p; p += bh * nq;
    m.q_num_blocks = p; p += bh * nk;
    m.full_q_num_blocks = p; p += bh * nk;
    m.kv_indices = p; p += cells;
    m.full_kv_indices = p; p += cells;
    m.q_indices = p; p += cells;
    m.full_q_indices = p;
    for (int64_t r = 0; r < bh; r++)
        for (int64_t qb = 0; qb < nq; qb++)
            for (int64_t kb = 0; kb < nk; kb++) {
                int k = kind[(r * nq + qb) * nk + kb];
                if (!k) continue;
                int32_t *kn = k == 2 ? m.full_kv_num_blocks : m.kv_num_blocks, *ki = k == 2 ? m.full_kv_indices : m.kv_indices;
                int32_t *qn = k == 2 ? m.full_q_num_blocks : m.q_num_blocks, *qi = k == 2 ? m.full_q_indices : m.q_indices;
                int64_t rq = r * nq + qb, rk = r * nk + kb;
                ki[rq * nk + kn[rq]++] = (int32_t)kb;
                qi[rk * nq + qn[rk]++] = (int32_t)qb;
            }
    free(kind);
    *out = m;
    return LK_OK;
}

lk_status lk_block_mask_create(lk_mask_fn mask_mod, const void *ctx, int64_t B, int64_t H, int64_t Q_LEN,
                               int64_t KV_LEN, int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    return create(mask_mod, NULL, NULL, ctx, B, H, Q_LEN, KV_LEN, q_block, kv_block, out);
}

void lk_block_mask_free(lk_block_mask *m) {
    if (!m) return;
    if (m->gpu) m->gpu->release(m->gpu);
    free(m->kv_num_blocks);
    free(m->owned);
    memset(m, 0, sizeof *m);
}

double lk_block_mask_density(const lk_block_mask *m) {
    int64_t nq = m->num_q_blocks, nk = m->num_kv_blocks;
    double seen = 0.0;
    for (int64_t r = 0; r < m->B * m->H; r++)
        for (int64_t qb = 0; qb < nq; qb++) {
            int64_t rq = r * nq + qb, qn = (qb + 1) * m->Q_BLOCK_SIZE < m->Q_LEN ? m->Q_BLOCK_SIZE : m->Q_LEN - qb * m->Q_BLOCK_SIZE;
            for (int32_t t = 0; t < m->full_kv_num_blocks[rq]; t++) {
                int64_t kb = m->full_kv_indices[rq * nk + t];
                int64_t kn = (kb + 1) * m->KV_BLOCK_SIZE < m->KV_LEN ? m->KV_BLOCK_SIZE : m->KV_LEN - kb * m->KV_BLOCK_SIZE;
                seen += (double)(qn * kn);
            }
            for (int32_t t = 0; t < m->kv_num_blocks[rq]; t++) {
                int64_t kb = m->kv_indices[rq * nk + t], k0 = kb * m->KV_BLOCK_SIZE;
                seen += (double)count_seen(m->mask_mod, m->mask_row, m->mask_ctx, r / m->H, r % m->H,
                                           qb * m->Q_BLOCK_SIZE, qb * m->Q_BLOCK_SIZE + qn, k0,
                                           k0 + m->KV_BLOCK_SIZE < m->KV_LEN ? k0 + m->KV_BLOCK_SIZE : m->KV_LEN);
            }
        }
    return seen / ((double)(m->B * m->H) * (double)m->Q_LEN * (double)m->KV_LEN);
}

/* --- predicates ------------------------------------------------------------------ */

bool lk_mask_causal(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_causal_ctx *c = ctx;
    return kv_idx <= q_idx + (c ? c->offset : 0);
}

bool lk_mask_sliding_window(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_window_ctx *c = ctx;
    int64_t p = q_idx + c->offset;
    return kv_idx <= p && kv_idx - p > -c->window;   /* p - window may overflow; kv - p cannot */
}

bool lk_mask_prefix_lm(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_prefix_lm_ctx *c = ctx;
    return kv_idx < c->prefix_len[c->n_prefix == 1 ? 0 : b] || kv_idx <= q_idx;
}

bool lk_mask_document(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_document_ctx *c = ctx;
    if (c->causal && kv_idx > q_idx) return false;
    if (c->q_doc) {
        int64_t row = c->per_batch ? b : 0;
        return c->q_doc[row * c->q_len + q_idx] == c->kv_doc[row * c->kv_len + kv_idx];
    }
    return lk_cu_doc_of(c->cu_seqlens, c->n_docs, q_idx) == lk_cu_doc_of(c->cu_seqlens, c->n_docs, kv_idx);
}

bool lk_mask_and(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_mask_pair_ctx *c = ctx;
    return c->a(b, h, q_idx, kv_idx, c->a_ctx) && c->b(b, h, q_idx, kv_idx, c->b_ctx);
}

bool lk_mask_or(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    const lk_mask_pair_ctx *c = ctx;
    return c->a(b, h, q_idx, kv_idx, c->a_ctx) || c->b(b, h, q_idx, kv_idx, c->b_ctx);
}

/* --- row forms of the predicates (the builders set them): the interval families as two
 * memsets, documents as one compare loop that vectorizes (no branch in it) */

/* out[j] = 1 for j in [lo, hi) of [0, n), else 0 (kv0 + j the key). */
static void row_interval(int64_t kv0, int64_t n, int64_t lo, int64_t hi, uint8_t *out) {
    lo = lo - kv0 < 0 ? 0 : lo - kv0 > n ? n : lo - kv0;
    hi = hi - kv0 < lo ? lo : hi - kv0 > n ? n : hi - kv0;
    memset(out, 0, (size_t)lo);
    memset(out + lo, 1, (size_t)(hi - lo));
    memset(out + hi, 0, (size_t)(n - hi));
}

static void span_causal(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi) {
    *lo = INT64_MIN / 2, *hi = q + (ctx ? ((const lk_causal_ctx *)ctx)->offset : 0) + 1;
}

static void span_window(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi) {
    const lk_window_ctx *c = ctx;
    int64_t p = q + c->offset;
    int64_t w = c->window < INT64_MAX / 4 ? c->window : INT64_MAX / 4;   /* p - window must not overflow */
    *lo = p - w + 1, *hi = p + 1;                                          /* kv - p > -window */
}

static void span_prefix(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi) {
    const lk_prefix_lm_ctx *c = ctx;
    int64_t pre = c->prefix_len[c->n_prefix == 1 ? 0 : b];
    *lo = INT64_MIN / 2, *hi = pre > q + 1 ? pre : q + 1;   /* kv < pre || kv <= q */
}

/* Documents from cu_seqlens (q_doc NULL): its document's offsets, causally cut at q. */
static void span_document_cu(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi) {
    const lk_document_ctx *c = ctx;
    const int64_t d = lk_cu_doc_of(c->cu_seqlens, c->n_docs, q);
    *lo = c->cu_seqlens[d], *hi = c->causal && q + 1 < c->cu_seqlens[d + 1] ? q + 1 : c->cu_seqlens[d + 1];
}

#define ROW_OF_SPAN(name)                                                                                    \
    static void row_##name(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const void *ctx) { \
        int64_t lo, hi;                                                                                      \
        span_##name(b, h, q, ctx, &lo, &hi);                                                                 \
        row_interval(kv0, n, lo, hi, out);                                                                   \
    }
ROW_OF_SPAN(causal)
ROW_OF_SPAN(window)
ROW_OF_SPAN(prefix)
ROW_OF_SPAN(document_cu)

/* Documents as ids (q_doc set). */
static void row_document(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const void *ctx) {
    const lk_document_ctx *c = ctx;
    int64_t row = c->per_batch ? b : 0;
    const int32_t dq = c->q_doc[row * c->q_len + q];
    const int32_t *kd = c->kv_doc + row * c->kv_len + kv0;
    for (int64_t j = 0; j < n; j++) out[j] = (uint8_t)(kd[j] == dq);
    if (c->causal && q + 1 - kv0 < n) {   /* keys after q hidden */
        int64_t from = q + 1 - kv0 < 0 ? 0 : q + 1 - kv0;
        memset(out + from, 0, (size_t)(n - from));
    }
}

/* AND / OR of two row forms: lk_mask_pair_ctx first, so lk_mask_and/or read it too. */
typedef struct {
    lk_mask_pair_ctx pair;
    lk_mask_row_fn ra, rb;
    span_fn sa, sb;   /* both set: an AND's span is the intersection of theirs */
} pair_rows;

static void row_combine(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const pair_rows *c,
                        int both) {
    uint8_t other[256];
    c->ra(b, h, q, kv0, n, out, c->pair.a_ctx);
    for (int64_t j0 = 0; j0 < n; j0 += 256) {
        int64_t k = n - j0 < 256 ? n - j0 : 256;
        c->rb(b, h, q, kv0 + j0, k, other, c->pair.b_ctx);
        for (int64_t j = 0; j < k; j++) out[j0 + j] = both ? out[j0 + j] && other[j] : out[j0 + j] || other[j];
    }
}
static void row_and(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const void *ctx) {
    row_combine(b, h, q, kv0, n, out, ctx, 1);
}
static void row_or(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const void *ctx) {
    row_combine(b, h, q, kv0, n, out, ctx, 0);
}

static void span_and(int64_t b, int64_t h, int64_t q, const void *ctx, int64_t *lo, int64_t *hi) {
    const pair_rows *c = ctx;
    int64_t l2, h2;
    c->sa(b, h, q, c->pair.a_ctx, lo, hi);
    c->sb(b, h, q, c->pair.b_ctx, &l2, &h2);
    *lo = *lo > l2 ? *lo : l2, *hi = *hi < h2 ? *hi : h2;
}

/* The span form of a built mask's predicate, when it has one: recognized by the predicate
 * (documents only from cu_seqlens: ids need not be contiguous) or, for an AND that
 * combine() built (its row form says so), from its two sides'. */
static span_fn span_of(const lk_block_mask *m) {
    if (m->mask_mod == lk_mask_causal) return span_causal;
    if (m->mask_mod == lk_mask_sliding_window) return span_window;
    if (m->mask_mod == lk_mask_prefix_lm) return span_prefix;
    if (m->mask_mod == lk_mask_document) {
        const lk_document_ctx *c = m->mask_ctx;
        return !c->q_doc && c->cu_seqlens ? span_document_cu : NULL;
    }
    if (m->mask_mod == lk_mask_and && m->mask_row == row_and) {
        const pair_rows *c = m->mask_ctx;
        return c->sa && c->sb ? span_and : NULL;
    }
    return NULL;
}

/* --- builders: the context (and any array it points at) lives in m->owned -------- */

static lk_status build_owned(lk_mask_fn fn, lk_mask_row_fn row, span_fn span, void *owned, int64_t B, int64_t H,
                             int64_t Q, int64_t KV, int64_t qb, int64_t kb, lk_block_mask *out) {
    if (!owned) return lk_error(LK_ENOMEM, "block_mask: out of memory for the mask's context");
    lk_status s = create(fn, row, span, owned, B, H, Q, KV, qb, kb, out);
    if (s) { free(owned); return s; }
    out->owned = owned;
    out->mask_row = row;
    return LK_OK;
}

/* A context struct of ctx_bytes followed by extra bytes copied from src. */
static void *ctx_with(size_t ctx_bytes, const void *src, size_t extra) {
    char *p = calloc(1, ctx_bytes + extra + 1);
    if (p && src && extra) memcpy(p + ctx_bytes, src, extra);
    return p;
}

/* The last query sees up to the last key: KV_LEN - Q_LEN, taken before create checks the
 * sizes, so only when both are >= 1 (then it cannot overflow; the fuzzer found
 * INT64_MIN - 65536 here). */
static int64_t offset_of(int64_t Q_LEN, int64_t KV_LEN) { return Q_LEN >= 1 && KV_LEN >= 1 ? KV_LEN - Q_LEN : 0; }

lk_status lk_block_mask_causal(int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN, int64_t q_block,
                               int64_t kv_block, lk_block_mask *out) {
    lk_causal_ctx *c = ctx_with(sizeof *c, NULL, 0);
    if (c) c->offset = offset_of(Q_LEN, KV_LEN);
    return build_owned(lk_mask_causal, row_causal, span_causal, c, B, H, Q_LEN, KV_LEN, q_block, kv_block, out);
}

lk_status lk_block_mask_sliding_window(int64_t window, int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN,
                                       int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    if (window < 1) return lk_error(LK_EINVAL, "block_mask: window: expected >= 1, got %lld", (long long)window);
    lk_window_ctx *c = ctx_with(sizeof *c, NULL, 0);
    if (c) *c = (lk_window_ctx){.window = window, .offset = offset_of(Q_LEN, KV_LEN)};
    return build_owned(lk_mask_sliding_window, row_window, span_window, c, B, H, Q_LEN, KV_LEN, q_block, kv_block, out);
}

lk_status lk_block_mask_prefix_lm(const int64_t *prefix_len, int64_t B, int64_t H, int64_t Q_LEN, int64_t KV_LEN,
                                  int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    if (!prefix_len || B < 1) return lk_error(LK_EINVAL, "block_mask: prefix_len: expected B >= 1 lengths, got NULL");
    mask_sizes z;
    lk_status s = check_sizes(B, H, Q_LEN, KV_LEN, q_block ? q_block : LK_BLOCK_MASK_DEFAULT_BLOCK,
                              kv_block ? kv_block : LK_BLOCK_MASK_DEFAULT_BLOCK, &z);   /* before B is copied */
    if (s) return s;
    lk_prefix_lm_ctx *c = ctx_with(sizeof *c, prefix_len, (size_t)B * sizeof(int64_t));
    if (c) *c = (lk_prefix_lm_ctx){.prefix_len = (const int64_t *)(c + 1), .n_prefix = B};
    return build_owned(lk_mask_prefix_lm, row_prefix, span_prefix, c, B, H, Q_LEN, KV_LEN, q_block, kv_block, out);
}

lk_status lk_block_mask_document_cu(const int32_t *cu_seqlens, int64_t n_docs, int causal, int64_t H, int64_t LEN,
                                    int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    if (!cu_seqlens || n_docs < 1 || cu_seqlens[0] != 0 || cu_seqlens[n_docs] != LEN)
        return lk_error(LK_EINVAL, "block_mask: cu_seqlens: expected %s", "n_docs >= 1 offsets from 0 to LEN");
    for (int64_t i = 0; i < n_docs; i++)
        if (cu_seqlens[i + 1] < cu_seqlens[i])
            return lk_error(LK_EINVAL, "block_mask: cu_seqlens: expected non-decreasing offsets, got %d after %d",
                            cu_seqlens[i + 1], cu_seqlens[i]);
    /* the predicate finds each position's document in its copy of the offsets; the row and
     * span forms once a row */
    lk_document_ctx *c = ctx_with(sizeof *c, cu_seqlens, (size_t)(n_docs + 1) * sizeof(int32_t));
    if (c) *c = (lk_document_ctx){.q_len = LEN, .kv_len = LEN, .cu_seqlens = (const int32_t *)(c + 1), .n_docs = n_docs,
                                  .causal = causal};
    return build_owned(lk_mask_document, row_document_cu, span_document_cu, c, 1, H, LEN, LEN, q_block, kv_block, out);
}

lk_status lk_block_mask_document_ids(const int32_t *doc, int causal, int64_t B, int64_t H, int64_t LEN,
                                     int64_t q_block, int64_t kv_block, lk_block_mask *out) {
    if (!doc || B < 1 || LEN < 1) return lk_error(LK_EINVAL, "block_mask: doc: expected B * LEN document ids, got NULL");
    mask_sizes z;
    lk_status s = check_sizes(B, H, LEN, LEN, q_block ? q_block : LK_BLOCK_MASK_DEFAULT_BLOCK,
                              kv_block ? kv_block : LK_BLOCK_MASK_DEFAULT_BLOCK, &z);   /* before B * LEN is copied */
    if (s) return s;
    int64_t n_ids;
    size_t ids_bytes;
    if ((s = lk_checked_mul("block_mask: doc: B x LEN", B, LEN, &n_ids)) ||
        (s = lk_checked_bytes("block_mask: doc: B x LEN ids", n_ids, sizeof(int32_t), &ids_bytes)))
        return s;
    lk_document_ctx *c = ctx_with(sizeof *c, doc, ids_bytes);
    if (c) {
        const int32_t *ids = (const int32_t *)(c + 1);
        *c = (lk_document_ctx){.q_doc = ids, .kv_doc = ids, .q_len = LEN, .kv_len = LEN, .per_batch = B > 1,
                               .causal = causal};
    }
    return build_owned(lk_mask_document, row_document, NULL, c, B, H, LEN, LEN, q_block, kv_block, out);
}

/* The dense predicate: the bytes follow the context in the same allocation. */
typedef struct { int64_t B, H, Q, KV; const uint8_t *m; } dense_ctx;

static const uint8_t *dense_row(const dense_ctx *c, int64_t b, int64_t h, int64_t q) {
    return c->m + (((c->B == 1 ? 0 : b) * c->H + (c->H == 1 ? 0 : h)) * c->Q + q) * c->KV;
}

static bool mask_dense(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx) {
    return dense_row(ctx, b, h, q_idx)[kv_idx] != 0;
}

static void row_dense(int64_t b, int64_t h, int64_t q, int64_t kv0, int64_t n, uint8_t *out, const void *ctx) {
    const uint8_t *r = dense_row(ctx, b, h, q) + kv0;
    for (int64_t j = 0; j < n; j++) out[j] = r[j] != 0;
}

lk_status lk_block_mask_dense(const uint8_t *mask, const int64_t dims[4], int64_t q_block, int64_t kv_block,
                              lk_block_mask *out) {
    if (!mask || !dims) return lk_error(LK_EINVAL, "block_mask: %s: expected a pointer, got NULL", mask ? "dims" : "mask");
    mask_sizes z;
    lk_status s = check_sizes(dims[0], dims[1], dims[2], dims[3], q_block ? q_block : LK_BLOCK_MASK_DEFAULT_BLOCK,
                              kv_block ? kv_block : LK_BLOCK_MASK_DEFAULT_BLOCK, &z);   /* before the bytes are copied */
    if (s) return s;
    int64_t n;
    size_t bytes;
    if ((s = lk_checked_prod("block_mask: mask: B x H x Q_LEN x KV_LEN", dims, 4, &n)) ||
        (s = lk_checked_bytes("block_mask: mask", n, 1, &bytes)))
        return s;
    dense_ctx *c = ctx_with(sizeof *c, mask, bytes);
    if (c) *c = (dense_ctx){dims[0], dims[1], dims[2], dims[3], (const uint8_t *)(c + 1)};
    return build_owned(mask_dense, row_dense, NULL, c, dims[0], dims[1], dims[2], dims[3], q_block, kv_block, out);
}

static lk_status combine(lk_mask_fn fn, const lk_block_mask *x, const lk_block_mask *y, lk_block_mask *out) {
    if (!x || !y || !x->mask_mod || !y->mask_mod)
        return lk_error(LK_EINVAL, "block_mask: %s: expected a built mask, got none", !x || !x->mask_mod ? "x" : "y");
    if (x->Q_LEN != y->Q_LEN || x->KV_LEN != y->KV_LEN || (x->B != y->B && x->B != 1 && y->B != 1) ||
        (x->H != y->H && x->H != 1 && y->H != 1))
        return lk_error(LK_ESHAPE, "block_mask: y: expected the shape of x [%lld, %lld, %lld, %lld], got [%lld, "
                        "%lld, %lld, %lld]", (long long)x->B, (long long)x->H, (long long)x->Q_LEN,
                        (long long)x->KV_LEN, (long long)y->B, (long long)y->H, (long long)y->Q_LEN,
                        (long long)y->KV_LEN);
    pair_rows *c = ctx_with(sizeof *c, NULL, 0);
    if (c) *c = (pair_rows){{x->mask_mod, x->mask_ctx, y->mask_mod, y->mask_ctx}, x->mask_row, y->mask_row,
                            span_of(x), span_of(y)};
    lk_mask_row_fn row = x->mask_row && y->mask_row ? (fn == lk_mask_and ? row_and : row_or) : NULL;
    const int spans = c && fn == lk_mask_and && c->sa && c->sb;   /* an OR of intervals is not one */
    return build_owned(fn, row, spans ? span_and : NULL, c, x->B > y->B ? x->B : y->B, x->H > y->H ? x->H : y->H, x->Q_LEN, x->KV_LEN,
                       x->Q_BLOCK_SIZE, x->KV_BLOCK_SIZE, out);
}

lk_status lk_block_mask_and(const lk_block_mask *x, const lk_block_mask *y, lk_block_mask *out) {
    return combine(lk_mask_and, x, y, out);
}
lk_status lk_block_mask_or(const lk_block_mask *x, const lk_block_mask *y, lk_block_mask *out) {
    return combine(lk_mask_or, x, y, out);
}

/* --- score_mod examples --------------------------------------------------------- */

float lk_score_mod_softcap(float score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx,
                           float *grad) {
    float cap = *(const float *)ctx, t = tanhf(score / cap);
    *grad = 1.0f - t * t;
    return cap * t;
}

float lk_score_mod_alibi(float score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx,
                         float *grad) {
    *grad = 1.0f;
    return score - ((const float *)ctx)[h] * (float)(q_idx - kv_idx);
}
