/* flex_plan.c — a BlockMask planned for the GPU's flex kernels (flex_plan.h): the tiles
 * of 128 x 128 classified from the mask's own lists, the lists and their transposes
 * written per tile, and each partial tile's bits made here when the predicate is not a
 * standard family (the families become a program the device evaluates). Host code only:
 * tests/test_flex_plan.c checks it against the predicate on every element, no GPU needed. */
#include <stdlib.h>
#include <string.h>
#include "ops/attention/flex_plan.h"
#include "core/checked.h"

#define T LK_FLEX_TILE

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* --- the standard families as a program ------------------------------------------- */

typedef struct {
    lk_flex_prog *p;
    int32_t *data;
    int64_t n, cap;
    int64_t B, Q_LEN, KV_LEN;
} prog_build;

/* Appends n ids (or lengths) to the program's data; its offset, or -1 (no memory). */
static int64_t put(prog_build *b, const int32_t *src, int64_t n) {
    if (b->n + n > b->cap) {
        int64_t cap = b->cap * 2 > b->n + n ? b->cap * 2 : b->n + n + 64;
        int32_t *d = realloc(b->data, (size_t)cap * sizeof *d);
        if (!d) return -1;
        b->data = d, b->cap = cap;
    }
    if (src) memcpy(b->data + b->n, src, (size_t)n * sizeof *src);
    b->n += n;
    return b->n - n;
}

int64_t lk_cu_doc_of(const int32_t *cu, int64_t n_docs, int64_t i) {
    int64_t lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Adds the nodes of predicate fn(ctx); 0, or -1 when it is not a standard family (or the
 * program would pass LK_FLEX_NODES, or no memory). */
static int add(prog_build *b, lk_mask_fn fn, const void *ctx) {
    if (b->p->n >= LK_FLEX_NODES) return -1;
    lk_flex_node x = {0};
    if (fn == lk_mask_causal) {
        x.op = LK_FLEX_CAUSAL, x.offset = ctx ? ((const lk_causal_ctx *)ctx)->offset : 0;
    } else if (fn == lk_mask_sliding_window) {
        const lk_window_ctx *c = ctx;
        x.op = LK_FLEX_WINDOW, x.offset = c->offset, x.window = c->window;
    } else if (fn == lk_mask_prefix_lm) {
        const lk_prefix_lm_ctx *c = ctx;
        if (c->n_prefix != 1 && c->n_prefix < b->B) return -1;
        x.op = LK_FLEX_PREFIX, x.q_stride = c->n_prefix == 1 ? 0 : 1;
        if ((x.q_at = put(b, NULL, c->n_prefix)) < 0) return -1;
        for (int64_t i = 0; i < c->n_prefix; i++) {   /* j < len with j in [0, KV_LEN): clamp to that */
            int64_t v = c->prefix_len[i];
            b->data[x.q_at + i] = (int32_t)(v < 0 ? 0 : v > b->KV_LEN ? b->KV_LEN : v);
        }
    } else if (fn == lk_mask_document) {
        const lk_document_ctx *c = ctx;
        x.op = LK_FLEX_DOC, x.causal = c->causal != 0;
        if (c->q_doc) {
            const int64_t rows = c->per_batch ? b->B : 1;
            if (c->q_len < b->Q_LEN || c->kv_len < b->KV_LEN) return -1;
            if ((x.q_at = put(b, c->q_doc, rows * c->q_len)) < 0) return -1;
            x.kv_at = x.q_at;
            if (c->kv_doc != c->q_doc && (x.kv_at = put(b, c->kv_doc, rows * c->kv_len)) < 0) return -1;
            x.q_stride = c->per_batch ? c->q_len : 0, x.kv_stride = c->per_batch ? c->kv_len : 0;
        } else {   /* cu_seqlens: the ids of every position, once */
            const int64_t L = b->Q_LEN > b->KV_LEN ? b->Q_LEN : b->KV_LEN;
            if (c->n_docs < 1 || (x.q_at = put(b, NULL, L)) < 0) return -1;
            for (int64_t i = 0; i < L; i++) b->data[x.q_at + i] = (int32_t)lk_cu_doc_of(c->cu_seqlens, c->n_docs, i);
            x.kv_at = x.q_at;
        }
    } else if (fn == lk_mask_and || fn == lk_mask_or) {
        const lk_mask_pair_ctx *c = ctx;
        if (add(b, c->a, c->a_ctx) || add(b, c->b, c->b_ctx) || b->p->n >= LK_FLEX_NODES) return -1;
        x.op = fn == lk_mask_and ? LK_FLEX_AND : LK_FLEX_OR;
    } else {
        return -1;
    }
    b->p->node[b->p->n++] = x;
    return 0;
}

int lk_flex_prog_of(const lk_block_mask *m, lk_flex_prog *prog, int32_t **data, int64_t *ndata) {
    memset(prog, 0, sizeof *prog);
    prog_build b = {.p = prog, .B = m->B, .Q_LEN = m->Q_LEN, .KV_LEN = m->KV_LEN};
    if (add(&b, m->mask_mod, m->mask_ctx) || put(&b, NULL, 1) < 0) {   /* never empty: one word at least */
        free(b.data);
        memset(prog, 0, sizeof *prog);
        *data = NULL, *ndata = 0;
        return 0;
    }
    *data = b.data, *ndata = b.n;
    return 1;
}

/* --- the plan ----------------------------------------------------------------------- */

/* Every mask block tile (qt, kt) of pattern p overlaps: 0 all empty, 2 all full (and the
 * tile inside the lengths), else 1. mk holds the mask's blocks' kinds [P][mnq][mnk]. */
static uint8_t tile_kind(const lk_block_mask *m, const uint8_t *mk, int64_t p, int64_t qt, int64_t kt) {
    const int64_t q0 = qt * T, q1 = q0 + T < m->Q_LEN ? q0 + T : m->Q_LEN;
    const int64_t k0 = kt * T, k1 = k0 + T < m->KV_LEN ? k0 + T : m->KV_LEN;
    int any = 0, all = 1;
    for (int64_t a = q0 / m->Q_BLOCK_SIZE; a <= (q1 - 1) / m->Q_BLOCK_SIZE; a++)
        for (int64_t c = k0 / m->KV_BLOCK_SIZE; c <= (k1 - 1) / m->KV_BLOCK_SIZE; c++) {
            uint8_t k = mk[(p * m->num_q_blocks + a) * m->num_kv_blocks + c];
            any |= k != 0, all &= k == 2;
        }
    if (!any) return 0;
    return all && q0 + T <= m->Q_LEN && k0 + T <= m->KV_LEN ? 2 : 1;
}

/* Tile id's bits from the host predicate: by query row, then by key. */
static void host_bits(const lk_block_mask *m, int64_t b, int64_t h, int64_t qt, int64_t kt, uint32_t *w) {
    uint8_t seen[T];
    const int64_t q0 = qt * T, k0 = kt * T, nk = k0 + T < m->KV_LEN ? T : m->KV_LEN - k0;
    memset(w, 0, LK_FLEX_TILE_WORDS * sizeof *w);
    for (int64_t i = 0; i < T && q0 + i < m->Q_LEN; i++) {
        if (m->mask_row) m->mask_row(b, h, q0 + i, k0, nk, seen, m->mask_ctx);
        else
            for (int64_t j = 0; j < nk; j++) seen[j] = m->mask_mod(b, h, q0 + i, k0 + j, m->mask_ctx);
        for (int64_t j = 0; j < nk; j++)
            if (seen[j]) {
                w[i * LK_FLEX_WORDS + j / 32] |= 1u << (j % 32);
                w[lk_flex_by_key((int)i / 64, (int)j) + (i % 64) / 32] |= 1u << (i % 32);
            }
    }
}

void lk_flex_plan_free(lk_flex_plan *p) {
    if (!p) return;
    free(p->buf);
    free(p->data);
    memset(p, 0, sizeof *p);
}

lk_status lk_flex_plan_make(const lk_block_mask *m, lk_flex_plan *out) {
    memset(out, 0, sizeof *out);
    const int64_t P = m->B * m->H, nq = cdiv(m->Q_LEN, T), nk = cdiv(m->KV_LEN, T);
    const int64_t mnq = m->num_q_blocks, mnk = m->num_kv_blocks;
    int64_t cells, mcells;
    lk_status s;
    if ((s = lk_checked_mul("flex (cuda): B x H x q tiles", P, nq, &cells)) ||
        (s = lk_checked_mul("flex (cuda): B x H x q tiles x kv tiles", cells, nk, &cells)) ||
        (s = lk_checked_mul("flex (cuda): the mask's blocks", P * mnq, mnk, &mcells)))
        return s;
    if (cells > INT32_MAX / 4 || m->Q_LEN > INT32_MAX || m->KV_LEN > INT32_MAX)
        return lk_error(LK_EINVAL, "attention: block_mask: expected fewer than 2^29 tiles of 128 x 128 and lengths "
                        "within int32 on the GPU, got %lld tiles", (long long)cells);
    uint8_t *mk = calloc((size_t)mcells + 1, 1), *kind = malloc((size_t)cells + 1);
    int32_t *id = malloc(((size_t)cells + 1) * sizeof *id);
    if (!mk || !kind || !id) {
        free(mk), free(kind), free(id);
        return lk_error(LK_ENOMEM, "attention: block_mask: out of memory planning %lld tiles", (long long)cells);
    }
    for (int64_t r = 0; r < P * mnq; r++) {   /* the mask's own blocks: partial 1, full 2 */
        for (int32_t i = 0; i < m->kv_num_blocks[r]; i++) mk[r * mnk + m->kv_indices[r * mnk + i]] = 1;
        for (int32_t i = 0; m->full_kv_num_blocks && i < m->full_kv_num_blocks[r]; i++)
            mk[r * mnk + m->full_kv_indices[r * mnk + i]] = 2;
    }
    int64_t ntiles = 0;
    for (int64_t p = 0; p < P; p++)
        for (int64_t qt = 0; qt < nq; qt++)
            for (int64_t kt = 0; kt < nk; kt++) {
                const int64_t c = (p * nq + qt) * nk + kt;
                kind[c] = tile_kind(m, mk, p, qt, kt);
                id[c] = kind[c] == 1 ? (int32_t)ntiles++ : -1;
            }
    free(mk);
    out->has_prog = lk_flex_prog_of(m, &out->prog, &out->data, &out->ndata);
    const size_t lists = (size_t)(2 * P * nq + 2 * cells + 2 * P * nk + 2 * cells + 3 * ntiles);
    const size_t words = lists + (out->has_prog ? 0 : (size_t)ntiles * LK_FLEX_TILE_WORDS);
    int32_t *buf = out->buf = calloc(words + 1, sizeof *buf);
    if (!buf) {
        free(kind), free(id), lk_flex_plan_free(out);
        return lk_error(LK_ENOMEM, "attention: block_mask: out of memory for %zu words of tile lists", words);
    }
    lk_flex_map *x = &out->map;
    *x = (lk_flex_map){.B = (int32_t)m->B, .H = (int32_t)m->H, .nq = (int32_t)nq, .nk = (int32_t)nk,
                       .Q_LEN = (int32_t)m->Q_LEN, .KV_LEN = (int32_t)m->KV_LEN};
    int32_t *kv_cnt = buf, *kv_idx = kv_cnt + 2 * P * nq, *kv_bit = kv_idx + cells;
    int32_t *q_cnt = kv_bit + cells, *q_idx = q_cnt + 2 * P * nk, *q_bit = q_idx + cells;
    int32_t *tile_of = q_bit + cells;
    x->kv_cnt = kv_cnt, x->kv_idx = kv_idx, x->kv_bit = kv_bit, x->q_cnt = q_cnt, x->q_idx = q_idx, x->q_bit = q_bit;
    out->tile_of = tile_of, out->ntiles = ntiles, out->list_words = lists;
    for (int64_t p = 0; p < P; p++)
        for (int pass = 1; pass <= 2; pass++) {   /* the partial tiles first, then the full ones */
            for (int64_t qt = 0; qt < nq; qt++)
                for (int64_t kt = 0; kt < nk; kt++) {
                    const int64_t c = (p * nq + qt) * nk + kt, rq = p * nq + qt, rk = p * nk + kt;
                    if (kind[c] != pass) continue;
                    const int32_t e = kv_cnt[2 * rq] + kv_cnt[2 * rq + 1], f = q_cnt[2 * rk] + q_cnt[2 * rk + 1];
                    kv_idx[rq * nk + e] = (int32_t)kt, kv_bit[rq * nk + e] = id[c];
                    q_idx[rk * nq + f] = (int32_t)qt, q_bit[rk * nq + f] = id[c];
                    kv_cnt[2 * rq + pass - 1]++, q_cnt[2 * rk + pass - 1]++;
                    if (pass == 1) tile_of[3 * id[c]] = (int32_t)p, tile_of[3 * id[c] + 1] = (int32_t)qt,
                                   tile_of[3 * id[c] + 2] = (int32_t)kt;
                }
        }
    free(kind), free(id);
    int64_t seen = 0, most = 0;   /* q tiles seen, summed over the kv tiles; the most one kv tile sees */
    x->falling = 1;
    for (int64_t rk = 0; rk < P * nk; rk++) {
        const int64_t c = q_cnt[2 * rk] + q_cnt[2 * rk + 1];
        if (rk % nk && c > q_cnt[2 * rk - 2] + q_cnt[2 * rk - 1]) x->falling = 0;
        seen += c, most = c > most ? c : most;
    }
    if (4 * seen > 3 * most * P * nk) x->falling = 0;
    if (!out->has_prog) {
        uint32_t *bits = (uint32_t *)(buf + lists);
        x->bits = bits;
        #pragma omp parallel for schedule(dynamic, 4) if (ntiles >= 16)
        for (int64_t t = 0; t < ntiles; t++)
            host_bits(m, tile_of[3 * t] / m->H, tile_of[3 * t] % m->H, tile_of[3 * t + 1], tile_of[3 * t + 2],
                      bits + t * LK_FLEX_TILE_WORDS);
    }
    return LK_OK;
}

/* --- staged images --------------------------------------------------------------------- */

static int64_t list_words_of(int64_t P, int64_t nq, int64_t nk) { return 2 * P * nq + 4 * P * nq * nk + 2 * P * nk; }

lk_flex_image lk_flex_image_of(const lk_flex_plan *p, int64_t cap_tiles, int64_t cap_data) {
    const lk_flex_map *x = &p->map;
    lk_flex_image L = {.B = x->B, .H = x->H, .nq = x->nq, .nk = x->nk, .Q_LEN = x->Q_LEN, .KV_LEN = x->KV_LEN,
                       .cap_tiles = cap_tiles, .cap_data = cap_data};
    L.count = list_words_of((int64_t)x->B * x->H, x->nq, x->nk);
    L.tile_of = L.count + 1, L.data = L.tile_of + 3 * cap_tiles, L.words = L.data + cap_data;
    return L;
}

lk_status lk_flex_image_pack(const lk_flex_image *L, const lk_flex_plan *p, int32_t *image) {
    const lk_flex_map *x = &p->map;
    if (x->B != L->B || x->H != L->H || x->Q_LEN != L->Q_LEN || x->KV_LEN != L->KV_LEN)
        return lk_error(LK_EINVAL, "attention: block_mask: expected the staged shape [%d, %d, %d, %d], got [%d, %d, "
                        "%d, %d]", L->B, L->H, L->Q_LEN, L->KV_LEN, x->B, x->H, x->Q_LEN, x->KV_LEN);
    if (!p->has_prog)
        return lk_error(LK_EINVAL, "attention: block_mask: a staged mask must be a standard family (its bits are "
                        "made on the device), got another predicate");
    if (p->ntiles > L->cap_tiles || p->ndata > L->cap_data)
        return lk_error(LK_EINVAL, "attention: block_mask: expected at most %lld partial tiles and %lld words of "
                        "data staged, got %lld and %lld", (long long)L->cap_tiles, (long long)L->cap_data,
                        (long long)p->ntiles, (long long)p->ndata);
    memcpy(image, p->buf, (size_t)L->count * sizeof *image);   /* the lists: the plan's first words */
    image[L->count] = (int32_t)p->ntiles;
    memcpy(image + L->tile_of, p->tile_of, (size_t)(3 * p->ntiles) * sizeof *image);
    memcpy(image + L->data, p->data, (size_t)p->ndata * sizeof *image);
    return LK_OK;
}

/* A causal document mask over LEN packed tokens in 128 x 128 tiles (nq of them a side)
 * has at most 5·nq partial tiles. A q tile inside one document d has at most two: the
 * diagonal, and the kv tile that holds d's start. A q tile that holds a document's end
 * (or runs past LEN) sees at most len(doc of its first row) / 128 + 2 tiles, and those
 * first rows' documents differ from tile to tile: together at most nq + 2·nq. Within a
 * sliding window, a tile partial in the AND is partial in one of the two (full in both
 * is full, empty in either is empty). The window's own partial tiles inside the lengths
 * are at most three a q tile (the diagonal, and the two kv tiles its rows' first keys fall
 * in; a tile past LEN, when the AND does not hide it, is partial in the document mask
 * already): 3·nq more. */
int64_t lk_flex_documents_cap(int64_t LEN, int64_t window) { return (window > 0 ? 8 : 5) * cdiv(LEN, T); }
