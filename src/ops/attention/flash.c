/* flash.c — the tiled attention engine (FlashAttention-2's loop order, on the CPU) and
 * the `sdpa` / `flash_attention_2` adapter that drives it with analytic masking.
 *
 * Forward, per (b, h, q tile) on OpenMP: for each kv tile the q tile sees, S = Q·Kᵀ
 * (f32, tiles.c), scale / softcap / score_mod, hide what the tile source says, then the
 * online softmax: running max m and sum l per row, O rescaled by exp(m_old − m_new) and
 * O += P·V. Sinks join the sum at the end. The LSE m + log l is saved; S×S is never
 * materialized: extra memory is a few tiles per thread.
 *
 * Backward, per (b, h_kv, kv tile): dK and dV accumulate in the tile over every q head
 * of the group and every q tile that sees it (P recomputed from the LSE, dS = P ∘
 * (dO·Vᵀ − delta)). dQ: when there are enough (b, h_kv) groups, each group is one task
 * and sums its heads' dQ in place (f32) or in one f32 buffer; otherwise kv tiles are
 * spread over threads, each summing dQ into its own f32 buffer [B, H_q, S_q, D], added
 * at the end. Extra memory is O(S) either way. GQA/MQA index K/V by h / G.
 *
 * The engine asks a tile source (internal.h) which tiles to visit and which are full;
 * flex.c supplies one from the BlockMask. A partial tile's mask is made first, and each
 * group of GROUP_ROWS rows runs its products only over the columns it sees (16-column
 * steps): a document mask's partial blocks are mostly empty, and a causal diagonal tile
 * half (issue 19: the flex document mask's time follows its density). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "ops/attention/internal.h"

#define FLASH_TILE 64
#define GROUP_ROWS 32   /* a partial tile's rows per column span */
/* Calls with fewer multiply-adds than this run on one thread: a parallel region's
 * wake-up and barrier cost more, and much more on a loaded machine. */
#define PAR_MIN_WORK ((double)(1 << 22))

static int worth_threads(const lk_attn_dims *d) {
    return (double)d->B * (double)d->Hq * (double)d->Sq * (double)d->Skv * (double)d->D >= PAR_MIN_WORK;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t pad_cols(int64_t tk) { return cdiv(tk, LK_ATTN_COLS) * LK_ATTN_COLS; }
static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Per-thread scratch, in floats. */
typedef struct { size_t q, o, kt, vt, kf, sc, seen, span, dp, g, tr, dk, dv, m, l, idx, full, total; } thread_layout;

static thread_layout layout(const lk_attn_dims *d, int64_t tq, int64_t tk, int backward) {
    thread_layout t = {0};
    size_t tkp = (size_t)pad_cols(tk), D = (size_t)d->D, n = 0, nt = (size_t)(cdiv(d->Sq, tq) + cdiv(d->Skv, tk));
#define TAKE(f, cnt) (t.f = n, n += up64((cnt) * sizeof(float)) / sizeof(float))
    TAKE(q, tq * D); TAKE(o, tq * D); TAKE(kt, D * tkp); TAKE(vt, D * tkp); TAKE(kf, tkp * D);
    TAKE(sc, tq * tkp); TAKE(seen, cdiv(tq * tkp, 4)); TAKE(span, 2 * cdiv(tq, GROUP_ROWS) + 2); TAKE(m, tq); TAKE(l, tq);
    TAKE(idx, nt); TAKE(full, nt);
    if (backward) { TAKE(dp, tq * tkp); TAKE(g, tq * tkp); TAKE(tr, tkp * tq); TAKE(dk, tk * D); TAKE(dv, tk * D); }
#undef TAKE
    t.total = n;
    return t;
}

/* dQ buffers of the backward: with at least a few (b, h_kv) groups per thread, or an
 * exact split, each group is one task and owns its heads' dQ rows, so one shared
 * buffer does (none for f32: dq itself accumulates). Otherwise the kv tiles of a group
 * are spread over the threads and each sums dQ into a buffer of its own. */
static int dq_buffers(const lk_attn_dims *d, int nth) {
    int64_t groups = d->B * d->Hkv;
    if (groups >= 4 * nth || groups % nth == 0) return d->dt == LK_F32 ? 0 : 1;
    return nth;
}

size_t lk_attn_tiled_workspace(const lk_attention_args *a, int64_t tq, int64_t tk, int backward) {
    lk_attn_dims d = lk_attn_dims_of(a);
    size_t per = layout(&d, tq, tk, backward).total * sizeof(float), nth = (size_t)omp_get_max_threads();
    size_t bytes = nth * per + 64;
    if (backward) {
        size_t rows = (size_t)(d.B * d.Hq * d.Sq), nb = (size_t)dq_buffers(&d, (int)nth);
        bytes += up64(rows * sizeof(float)) + nb * up64(rows * (size_t)d.D * sizeof(float)) + 64 * 3;
    }
    return bytes;
}

static const void *rows_at(const void *base, lk_dtype dt, int64_t row, int64_t D) {
    return (const char *)base + (size_t)(row * D) * lk_dtype_size(dt);
}

/* Rows [c0, c1) of a tile of nk K rows (src its first row), transposed into columns [c0,
 * c1) of kt[D, tkp]; columns past nk zero. A partial tile needs only the columns its spans
 * cover (a document's boundary block often half of them). */
static void load_transposed(const void *src, lk_dtype dt, int64_t c0, int64_t c1, int64_t nk, int64_t D,
                            float *tmp, float *kt, int64_t tkp) {
    int64_t n = (c1 < nk ? c1 : nk) - c0;
    if (n > 0 && dt == LK_F32) {
        lk_attn_transpose(rows_at(src, dt, c0, D), D, n, D, kt + c0, tkp);
    } else if (n > 0) {
        lk_attn_load_rows(rows_at(src, dt, c0, D), dt, D, n, D, tmp, D);
        lk_attn_transpose(tmp, D, n, D, kt + c0, tkp);
    }
    for (int64_t c = 0; c < D; c++)
        for (int64_t j = nk > c0 ? nk : c0; j < c1; j++) kt[c * tkp + j] = 0.0f;
}

/* First nonzero byte of r[0, n) (n when none), a word at a time: a document mask's
 * partial rows are mostly zeros, and the byte loop was 6% of its forward. */
static int64_t first_seen(const uint8_t *r, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        uint64_t w;
        memcpy(&w, r + j, 8);
        if (w) break;
    }
    while (j < n && !r[j]) j++;
    return j;
}

/* One past the last nonzero byte of r[0, n) (0 when none). */
static int64_t last_seen(const uint8_t *r, int64_t n) {
    int64_t e = n;
    for (; e >= 8; e -= 8) {
        uint64_t w;
        memcpy(&w, r + e - 8, 8);
        if (w) break;
    }
    while (e > 0 && !r[e - 1]) e--;
    return e;
}

/* The row groups of a tile and the columns [lo, hi) each one computes (16-aligned, hi <=
 * tkp): a full tile is one group over every column; a partial tile's mask goes to seen
 * (nq x tkp bytes) first, and each GROUP_ROWS rows get the span of the columns any of them
 * sees (lo == hi: none). Returns the number of groups; span holds lo, hi pairs. */
static int64_t tile_spans(const lk_attn_src *src, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0,
                          int64_t nk, int64_t tkp, int full, uint8_t *seen, int32_t *span) {
    if (full) {
        span[0] = 0, span[1] = (int32_t)tkp;
        return 1;
    }
    src->mask_tile(src, b, h, q0, nq, k0, nk, seen, tkp);
    int64_t ng = cdiv(nq, GROUP_ROWS);
    for (int64_t g = 0; g < ng; g++) {
        int64_t lo = nk, hi = 0;
        for (int64_t i = g * GROUP_ROWS; i < (g + 1) * GROUP_ROWS && i < nq; i++) {
            const uint8_t *r = seen + i * tkp;
            int64_t j = first_seen(r, lo), m = hi > j ? hi : j, e = m + last_seen(r + m, nk - m);
            if (j < e) { lo = j < lo ? j : lo; hi = e > hi ? e : hi; }
        }
        if (lo < hi) lo = lo / 16 * 16, hi = cdiv(hi, 16) * 16;
        else lo = hi = 0;
        span[2 * g] = (int32_t)lo, span[2 * g + 1] = (int32_t)hi;
    }
    return ng;
}

/* Group g's rows [*r0, *r1) of ng groups over nq rows. */
static void group_rows(int64_t g, int64_t ng, int64_t nq, int64_t *r0, int64_t *r1) {
    *r0 = ng > 1 ? g * GROUP_ROWS : 0;
    *r1 = ng > 1 && *r0 + GROUP_ROWS < nq ? *r0 + GROUP_ROWS : nq;
}

/* Rows [r0, r1) of C[., lo:hi) = A · BT[:, lo:hi) for each group (its span). */
static void group_abt(const float *A, int64_t lda, int64_t nq, const float *BT, int64_t tkp, int64_t D, float *C,
                      int64_t ng, const int32_t *span) {
    for (int64_t g = 0; g < ng; g++) {
        int64_t r0, r1;
        group_rows(g, ng, nq, &r0, &r1);
        if (span[2 * g] < span[2 * g + 1])
            lk_attn_abt(A + r0 * lda, lda, r1 - r0, BT + span[2 * g], tkp, span[2 * g + 1] - span[2 * g], D,
                        C + r0 * tkp + span[2 * g], tkp);
    }
}

/* Scores of one tile after scale, softcap and score_mod over row i's span [lo, hi) (hi
 * at most nk), hidden ones -inf where seen says so in a partial tile; nothing outside
 * the span is written, since nothing reads it. With g set, g[i, j] = d(score)/d(q·k),
 * what the backward multiplies dS by. */
static void tile_scores(const lk_attention_args *a, const lk_attn_dims *d, int64_t b, int64_t h, int64_t q0,
                        int64_t nq, int64_t k0, int64_t nk, int64_t ng, const int32_t *span, const uint8_t *seen,
                        float *sc, int64_t ld, float *g) {
    const float cap = a->softcap, scale = d->scale;
    const lk_score_mod_fn mod = a->score_mod.fn;
    for (int64_t i = 0; i < nq; i++) {
        const int32_t *sp = span + 2 * (ng > 1 ? i / GROUP_ROWS : 0);
        int64_t lo = sp[0], hi = sp[1] < nk ? sp[1] : nk;
        float *s = sc + i * ld, *gi = g ? g + i * ld : NULL;
        for (int64_t j = lo; j < hi; j++) s[j] *= scale;
        if (cap > 0.0f || mod) {
            for (int64_t j = lo; j < hi; j++) {
                float f = scale, gm = 1.0f;
                if (cap > 0.0f) {
                    float t = tanhf(s[j] / cap);
                    s[j] = cap * t;
                    f *= 1.0f - t * t;
                }
                if (mod) s[j] = mod(s[j], b, h, q0 + i, k0 + j, a->score_mod.ctx, &gm);
                if (gi) gi[j] = f * gm;
            }
        }
        if (seen)
            for (int64_t j = lo; j < hi; j++) s[j] = seen[i * ld + j] ? s[j] : -INFINITY;
    }
}

static void store_row(void *dst, lk_dtype dt, int64_t off, const float *x, float mul, int64_t D) {
    if (dt == LK_F32)
        for (int64_t c = 0; c < D; c++) ((float *)dst)[off + c] = x[c] * mul;
    else
        for (int64_t c = 0; c < D; c++) ((uint16_t *)dst)[off + c] = lk_f32_to_bf16(x[c] * mul);
}

/* One (b, h, q tile) of the forward. */
static void forward_tile(const lk_attention_args *a, const lk_attn_dims *d, const lk_attn_src *src, int64_t b,
                         int64_t h, int64_t qt, float *w, const thread_layout *L, float *lse) {
    const int64_t D = d->D, tk = src->tk, tkp = pad_cols(tk), q0 = qt * src->tq;
    const int64_t nq = d->Sq - q0 < src->tq ? d->Sq - q0 : src->tq, hk = h / d->G;
    float *qf = w + L->q, *o = w + L->o, *kt = w + L->kt, *vf = w + L->kf, *sc = w + L->sc, *m = w + L->m,
          *l = w + L->l, *tmp = w + L->vt;
    uint8_t *seen = (uint8_t *)(w + L->seen);
    int32_t *idx = (int32_t *)(w + L->idx), *span = (int32_t *)(w + L->span);
    uint8_t *full = (uint8_t *)(w + L->full);
    lk_attn_load_rows(rows_at(a->q.data, d->dt, (b * d->Hq + h) * d->Sq + q0, D), d->dt, D, nq, D, qf, D);
    memset(o, 0, sizeof(float) * (size_t)(nq * D));
    for (int64_t i = 0; i < nq; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    int64_t nt = src->kv_tiles(src, b, h, qt, idx, full);
    for (int64_t t = 0; t < nt; t++) {
        int64_t k0 = (int64_t)idx[t] * tk, nk = d->Skv - k0 < tk ? d->Skv - k0 : tk;
        int64_t krow = (b * d->Hkv + hk) * d->Skv + k0;
        int64_t ng = tile_spans(src, b, h, q0, nq, k0, nk, tkp, full[t], seen, span), c0 = tkp, c1 = 0;
        for (int64_t g = 0; g < ng; g++)
            if (span[2 * g] < span[2 * g + 1]) {
                c0 = span[2 * g] < c0 ? span[2 * g] : c0;
                c1 = span[2 * g + 1] > c1 ? span[2 * g + 1] : c1;
            }
        if (c0 >= c1) continue;             /* no row of this q tile sees a key of it */
        load_transposed(rows_at(a->k.data, d->dt, krow, D), d->dt, c0, c1, nk, D, tmp, kt, tkp);
        const float *vr = vf;
        if (d->dt == LK_F32) vr = rows_at(a->v.data, d->dt, krow, D);     /* f32 rows are used in place */
        else lk_attn_load_rows(rows_at(a->v.data, d->dt, krow, D), d->dt, D, nk, D, vf, D);
        group_abt(qf, D, nq, kt, tkp, D, sc, ng, span);
        tile_scores(a, d, b, h, q0, nq, k0, nk, ng, span, full[t] ? NULL : seen, sc, tkp, NULL);
        for (int64_t g = 0; g < ng; g++) {
            int64_t r0, r1, lo = span[2 * g], hi = span[2 * g + 1] < nk ? span[2 * g + 1] : nk;
            group_rows(g, ng, nq, &r0, &r1);
            if (lo >= hi) continue;
            int64_t rlo = r1, rhi = r0;     /* rows that see something in this tile: the only ones P·V needs */
            for (int64_t i = r0; i < r1; i++) {
                float *s = sc + i * tkp + lo, mx = lk_attn_row_max(s, hi - lo);
                if (mx != -INFINITY) { rlo = i < rlo ? i : rlo; rhi = i + 1; }
                float mn = mx > m[i] ? mx : m[i];
                if (mn == -INFINITY) { memset(s, 0, sizeof(float) * (size_t)(hi - lo)); continue; }
                float alpha = expf(m[i] - mn);
                l[i] = l[i] * alpha + lk_attn_exp_sum(s, hi - lo, mn);
                m[i] = mn;
                if (alpha != 1.0f)
                    for (int64_t c = 0; c < D; c++) o[i * D + c] *= alpha;
            }
            if (rlo < rhi)
                lk_attn_acc_ab(sc + rlo * tkp + lo, tkp, rhi - rlo, hi - lo, vr + lo * D, D, D, o + rlo * D, D);
        }
    }
    const float *sink = a->s_aux.data;
    for (int64_t i = 0; i < nq; i++) {
        float mi = m[i], li = l[i];
        if (sink) {
            float mn = sink[h] > mi ? sink[h] : mi, alpha = expf(mi - mn);
            li = li * alpha + expf(sink[h] - mn);
            for (int64_t c = 0; c < D; c++) o[i * D + c] *= alpha;
            mi = mn;
        }
        lse[(b * d->Hq + h) * d->Sq + q0 + i] = li > 0.0f ? mi + logf(li) : -INFINITY;
        store_row(a->out.data, d->dt, ((b * d->Sq + q0 + i) * d->Hq + h) * D, o + i * D,
                  li > 0.0f ? 1.0f / li : 0.0f, D);
    }
}

static float *thread_scratch(lk_arena *arena, size_t floats, int nth) {
    return lk_arena_alloc(arena, (size_t)nth * floats * sizeof(float));
}

lk_status lk_attn_tiled_forward(const lk_attention_args *a, lk_ctx *ctx, const lk_attn_src *src) {
    lk_attn_dims d = lk_attn_dims_of(a);
    thread_layout L = layout(&d, src->tq, src->tk, 0);
    int nth = omp_get_max_threads();
    float *w = thread_scratch(ctx->arena, L.total, nth), *lse = a->saved.data;
    if (!w) return lk_error(LK_EINTERNAL, "attention: workspace: expected %zu bytes reserved", L.total * nth * 4);
    int64_t nqt = cdiv(d.Sq, src->tq), units = d.B * d.Hq * nqt;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (worth_threads(&d))
    for (int64_t u = 0; u < units; u++) {
        int64_t qt = u % nqt, bh = u / nqt;
        forward_tile(a, &d, src, bh / d.Hq, bh % d.Hq, qt, w + (size_t)omp_get_thread_num() * L.total, &L, lse);
    }
    return LK_OK;
}

/* One q tile's contribution to kv tile (b, hk, kt): dK, dV in the tile, dQ rows in dqa. */
static void backward_pair(const lk_attention_args *a, const lk_attn_dims *d, const lk_attn_src *src, int64_t b,
                          int64_t h, int64_t q0, int64_t nq, int64_t k0, int64_t nk, int full, float *w,
                          const thread_layout *L, const float *lse, const float *delta, float *dqa) {
    const int64_t D = d->D, tq = src->tq, tkp = pad_cols(src->tk);
    float *sc = w + L->sc, *dp = w + L->dp, *tr = w + L->tr;
    float *g = a->softcap > 0.0f || a->score_mod.fn ? w + L->g : NULL;  /* else the chain factor is scale */
    const void *qsrc = rows_at(a->q.data, d->dt, (b * d->Hq + h) * d->Sq + q0, D);
    const void *dsrc = rows_at(a->dout.data, d->dt, (b * d->Sq + q0) * d->Hq + h, D);
    const float *qf = qsrc, *dof = dsrc;
    int64_t ldd = d->Hq * D;                    /* f32 rows are used in place, dout's strided */
    if (d->dt != LK_F32) {
        lk_attn_load_rows(qsrc, d->dt, D, nq, D, w + L->q, D);
        lk_attn_load_rows(dsrc, d->dt, d->Hq * D, nq, D, w + L->o, D);
        qf = w + L->q;
        dof = w + L->o;
        ldd = D;
    }
    uint8_t *seen = (uint8_t *)(w + L->seen);
    int32_t *span = (int32_t *)(w + L->span);
    int64_t ng = tile_spans(src, b, h, q0, nq, k0, nk, tkp, full, seen, span);
    group_abt(qf, D, nq, w + L->kt, tkp, D, sc, ng, span);
    tile_scores(a, d, b, h, q0, nq, k0, nk, ng, span, full ? NULL : seen, sc, tkp, g);
    group_abt(dof, ldd, nq, w + L->vt, tkp, D, dp, ng, span);
    const float *lr = lse + (b * d->Hq + h) * d->Sq + q0, *dr = delta + (b * d->Hq + h) * d->Sq + q0;
    for (int64_t gi = 0; gi < ng; gi++) {
        int64_t r0, r1, lo = span[2 * gi], n = (span[2 * gi + 1] < nk ? span[2 * gi + 1] : nk) - lo;
        group_rows(gi, ng, nq, &r0, &r1);
        if (n <= 0) continue;
        int64_t rlo = r1, rhi = r0;     /* rows with a visible key here: the only ones the products need */
        for (int64_t i = r0; i < r1; i++) {
            float *s = sc + i * tkp + lo, *p = dp + i * tkp + lo;
            if (lr[i] == -INFINITY || lk_attn_row_max(s, n) == -INFINITY) {
                memset(s, 0, sizeof(float) * (size_t)n);
                memset(p, 0, sizeof(float) * (size_t)n);
                continue;
            }
            rlo = i < rlo ? i : rlo;
            rhi = i + 1;
            lk_attn_exp_sum(s, n, lr[i]);                           /* s becomes P */
            if (g)                                                  /* dp becomes dS */
                for (int64_t j = 0; j < n; j++) p[j] = s[j] * (p[j] - dr[i]) * g[i * tkp + lo + j];
            else
                for (int64_t j = 0; j < n; j++) p[j] = s[j] * (p[j] - dr[i]) * d->scale;
        }
        if (rlo >= rhi) continue;
        int64_t nr = rhi - rlo;
        lk_attn_transpose(sc + rlo * tkp + lo, tkp, nr, n, tr, tq);
        lk_attn_acc_ab(tr, tq, n, nr, dof + rlo * ldd, ldd, D, w + L->dv + lo * D, D);
        lk_attn_transpose(dp + rlo * tkp + lo, tkp, nr, n, tr, tq);
        lk_attn_acc_ab(tr, tq, n, nr, qf + rlo * D, D, D, w + L->dk + lo * D, D);
        lk_attn_acc_ab(dp + rlo * tkp + lo, tkp, nr, n, w + L->kf + lo * D, D, D,
                       dqa + ((b * d->Hq + h) * d->Sq + q0 + rlo) * D, D);
    }
}

static void backward_kv_tile(const lk_attention_args *a, const lk_attn_dims *d, const lk_attn_src *src,
                             int64_t b, int64_t hk, int64_t kt, float *w, const thread_layout *L, const float *lse,
                             const float *delta, float *dqa) {
    const int64_t D = d->D, tk = src->tk, tkp = pad_cols(tk), k0 = kt * tk, nk = d->Skv - k0 < tk ? d->Skv - k0 : tk;
    const int64_t krow = (b * d->Hkv + hk) * d->Skv + k0;
    int32_t *idx = (int32_t *)(w + L->idx);
    uint8_t *full = (uint8_t *)(w + L->full);
    lk_attn_load_rows(rows_at(a->k.data, d->dt, krow, D), d->dt, D, nk, D, w + L->kf, D);
    lk_attn_transpose(w + L->kf, D, nk, D, w + L->kt, tkp);
    load_transposed(rows_at(a->v.data, d->dt, krow, D), d->dt, 0, tkp, nk, D, w + L->dv, w + L->vt, tkp);
    for (int64_t c = 0; c < D; c++)
        for (int64_t j = nk; j < tkp; j++) w[L->kt + c * tkp + j] = 0.0f;
    memset(w + L->dk, 0, sizeof(float) * (size_t)(tk * D));
    memset(w + L->dv, 0, sizeof(float) * (size_t)(tk * D));
    for (int64_t h = hk * d->G; h < (hk + 1) * d->G; h++) {
        int64_t nt = src->q_tiles(src, b, h, kt, idx, full);
        for (int64_t t = 0; t < nt; t++) {
            int64_t q0 = (int64_t)idx[t] * src->tq, nq = d->Sq - q0 < src->tq ? d->Sq - q0 : src->tq;
            backward_pair(a, d, src, b, h, q0, nq, k0, nk, full[t], w, L, lse, delta, dqa);
        }
    }
    for (int64_t j = 0; j < nk; j++) {
        store_row(a->dk.data, d->dt, (krow + j) * D, w + L->dk + j * D, 1.0f, D);
        store_row(a->dv.data, d->dt, (krow + j) * D, w + L->dv + j * D, 1.0f, D);
    }
}

lk_status lk_attn_tiled_backward(const lk_attention_args *a, lk_ctx *ctx, const lk_attn_src *src) {
    lk_attn_dims d = lk_attn_dims_of(a);
    thread_layout L = layout(&d, src->tq, src->tk, 1);
    int nth = omp_get_max_threads(), nb = dq_buffers(&d, nth);
    size_t rows = (size_t)(d.B * d.Hq * d.Sq), dq_floats = up64(rows * (size_t)d.D * sizeof(float)) / 4;
    float *w = thread_scratch(ctx->arena, L.total, nth), *delta = lk_arena_alloc(ctx->arena, rows * 4);
    float *dqa = nb ? thread_scratch(ctx->arena, dq_floats, nb) : a->dq.data;
    if (!w || !delta || !dqa) return lk_error(LK_EINTERNAL, "attention: workspace: expected the reserved bytes");
    const float *lse = a->saved.data;
    lk_attn_delta(a, &d, delta);
    memset(dqa, 0, nb ? (size_t)nb * dq_floats * sizeof(float) : rows * (size_t)d.D * sizeof(float));
    int64_t nkt = cdiv(d.Skv, src->tk), groups = d.B * d.Hkv;
    int per_group = nb <= 1;            /* one task per (b, h_kv) group, which owns its dQ rows */
    int64_t units = per_group ? groups : groups * nkt;
    #pragma omp parallel num_threads(nth) if (worth_threads(&d))
    {
        int t = omp_get_thread_num();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            int64_t g = per_group ? u : u / nkt;
            for (int64_t kt = per_group ? 0 : u % nkt; kt < (per_group ? nkt : u % nkt + 1); kt++)
                backward_kv_tile(a, &d, src, g / d.Hkv, g % d.Hkv, kt, w + (size_t)t * L.total, &L, lse, delta,
                                 dqa + (per_group ? 0 : (size_t)t * dq_floats));
        }
        if (nb > 0) {
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < (int64_t)rows; r++) {   /* sum the threads' dQ, in thread order */
                float *acc = dqa + r * d.D;
                for (int k = 1; k < nb; k++)
                    for (int64_t c = 0; c < d.D; c++) acc[c] += dqa[(size_t)k * dq_floats + r * d.D + c];
                store_row(a->dq.data, d.dt, r * d.D, acc, 1.0f, d.D);
            }
        }
    }
    lk_attn_sink_grad(a, &d, lse, delta);
    return LK_OK;
}

/* --- the flash adapter: tiles from each row's visible interval ------------------- */

typedef struct {
    const int64_t *lo, *hi;         /* per query row */
    const int64_t *tmin_lo, *tmax_hi, *tmax_lo, *tmin_hi;   /* per q tile */
    int64_t nqt, nkt, Skv;
} flash_src;

static int64_t flash_kv_tiles(const lk_attn_src *s, int64_t b, int64_t h, int64_t qt, int32_t *idx, uint8_t *full) {
    const flash_src *f = s->self;
    int64_t n = 0;
    if (f->tmin_lo[qt] >= f->tmax_hi[qt]) return 0;
    for (int64_t kt = f->tmin_lo[qt] / s->tk; kt < f->nkt && kt * s->tk < f->tmax_hi[qt]; kt++) {
        int64_t k0 = kt * s->tk, k1 = k0 + s->tk < f->Skv ? k0 + s->tk : f->Skv;
        idx[n] = (int32_t)kt;
        full[n++] = f->tmax_lo[qt] <= k0 && f->tmin_hi[qt] >= k1;
    }
    return n;
}

static int64_t flash_q_tiles(const lk_attn_src *s, int64_t b, int64_t h, int64_t kt, int32_t *idx, uint8_t *full) {
    const flash_src *f = s->self;
    int64_t k0 = kt * s->tk, k1 = k0 + s->tk < f->Skv ? k0 + s->tk : f->Skv, n = 0;
    for (int64_t qt = 0; qt < f->nqt; qt++)
        if (f->tmin_lo[qt] < k1 && f->tmax_hi[qt] > k0) {
            idx[n] = (int32_t)qt;
            full[n++] = f->tmax_lo[qt] <= k0 && f->tmin_hi[qt] >= k1;
        }
    return n;
}

static void flash_mask(const lk_attn_src *s, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                       uint8_t *seen, int64_t lds) {
    const flash_src *f = s->self;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++) seen[i * lds + j] = k0 + j >= f->lo[q0 + i] && k0 + j < f->hi[q0 + i];
}

static size_t flash_meta_bytes(const lk_attention_args *a) {
    int64_t Sq = a->q.shape[2];
    return up64((size_t)Sq * 16) + up64((size_t)cdiv(Sq, FLASH_TILE) * 32) + 128;
}

/* The tiled passes' source (as flex.c's): the rows' key intervals and each query tile's
 * bounds, worked out into ctx's workspace and held by f. */
static lk_status source(const lk_attention_args *a, lk_ctx *ctx, flash_src *f, lk_attn_src *src) {
    lk_attn_dims d = lk_attn_dims_of(a);
    int64_t nqt = cdiv(d.Sq, FLASH_TILE);
    int64_t *lo = lk_arena_alloc(ctx->arena, (size_t)d.Sq * 16), *t = lk_arena_alloc(ctx->arena, (size_t)nqt * 32);
    if (!lo || !t) return lk_error(LK_EINTERNAL, "attention: workspace: expected the reserved bytes");
    int64_t *hi = lo + d.Sq;
    lk_attn_row_intervals(a, &d, lo, hi);
    *f = (flash_src){.lo = lo, .hi = hi, .tmin_lo = t, .tmax_hi = t + nqt, .tmax_lo = t + 2 * nqt,
                     .tmin_hi = t + 3 * nqt, .nqt = nqt, .nkt = cdiv(d.Skv, FLASH_TILE), .Skv = d.Skv};
    for (int64_t qt = 0; qt < nqt; qt++) {
        int64_t mnl = INT64_MAX, mxh = INT64_MIN, mxl = INT64_MIN, mnh = INT64_MAX;
        for (int64_t i = qt * FLASH_TILE; i < (qt + 1) * FLASH_TILE && i < d.Sq; i++) {
            if (lo[i] < hi[i]) { mnl = lo[i] < mnl ? lo[i] : mnl; mxh = hi[i] > mxh ? hi[i] : mxh; }
            mxl = lo[i] > mxl ? lo[i] : mxl;
            mnh = hi[i] < mnh ? hi[i] : mnh;
        }
        if (mnl == INT64_MAX) { mnl = 0; mxh = 0; }
        t[qt] = mnl; t[nqt + qt] = mxh; t[2 * nqt + qt] = mxl; t[3 * nqt + qt] = mnh;
    }
    *src = (lk_attn_src){.tq = FLASH_TILE, .tk = FLASH_TILE, .kv_tiles = flash_kv_tiles, .q_tiles = flash_q_tiles,
                         .mask_tile = flash_mask, .self = f};
    return LK_OK;
}

static size_t flash_workspace(const lk_attention_args *a, int backward) {
    return flash_meta_bytes(a) + lk_attn_tiled_workspace(a, FLASH_TILE, FLASH_TILE, backward);
}
static lk_status flash_forward(const lk_attention_args *a, lk_ctx *ctx) {
    flash_src f;
    lk_attn_src s;
    lk_status st = source(a, ctx, &f, &s);
    return st ? st : lk_attn_tiled_forward(a, ctx, &s);
}
static lk_status flash_backward(const lk_attention_args *a, lk_ctx *ctx) {
    flash_src f;
    lk_attn_src s;
    lk_status st = source(a, ctx, &f, &s);
    return st ? st : lk_attn_tiled_backward(a, ctx, &s);
}

const lk_attention_vtable lk_attention_flash_backend = {
    .version = LK_ATTENTION_VTABLE_VERSION,
    .saved_bytes = lk_attn_lse_bytes,
    .workspace_bytes = flash_workspace,
    .forward = flash_forward,
    .backward = flash_backward,
};
