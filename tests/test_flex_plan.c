/* test_flex_plan.c — the GPU flex kernels' view of a BlockMask (ops/attention/flex_plan.c),
 * checked on the CPU against the predicate on every element: the 128 x 128 tiles of masks
 * cut in blocks of 128, 64, 96 and 200 over ragged lengths (a tile listed as full is fully
 * visible and inside the lengths; an unlisted tile hides everything; a partial tile's bits,
 * by row and by key, or the family program, say what the predicate says), the q lists the
 * exact transpose of the kv lists with the same bits tiles, the partial entries before
 * the full ones and each ascending, per-head and broadcast masks, and which predicates
 * become a device program (the families, their AND/OR) and which keep host bits (a dense
 * mask, a custom predicate, a program longer than LK_FLEX_NODES). The staged image of the
 * trainer's document masks: their partial tiles within its cap, its packing and refusals.
 * `falling` (the backward's grid order) against the predicate's count of q tiles a kv tile
 * sees (over the mask's blocks), on every mask, and set or clear on masks known each way.
 * Run: ctest -R test_flex_plan, or ./build/test_flex_plan. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/attention/flex_plan.h"

static bool holes(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    (void)ctx;
    uint64_t x = (uint64_t)(q * 1315423911u) ^ (uint64_t)(kv * 2654435761u) ^ (uint64_t)(b * 97 + h * 31);
    return (kv <= q + 40 * h && q - kv < 150 + 7 * b) || x % 53 == 0;
}

static int bit(const uint32_t *w, int64_t row, int64_t col) {
    return (int)((w[row * LK_FLEX_WORDS + col / 32] >> (col % 32)) & 1u);
}

/* The entry of tile x in a list row: its position, or -1. */
static int find(const int32_t *idx, const int32_t *cnt, int64_t row, int64_t width, int32_t x) {
    for (int e = 0; e < cnt[2 * row] + cnt[2 * row + 1]; e++)
        if (idx[row * width + e] == x) return e;
    return -1;
}

/* Ascending within the partial entries and within the full ones. */
static void expect_sorted(const int32_t *idx, const int32_t *cnt, int64_t row, int64_t width) {
    for (int e = 1; e < cnt[2 * row]; e++) assert_true(idx[row * width + e - 1] < idx[row * width + e]);
    for (int e = cnt[2 * row] + 1; e < cnt[2 * row] + cnt[2 * row + 1]; e++)
        assert_true(idx[row * width + e - 1] < idx[row * width + e]);
}

/* Plans m and checks every element of every pattern; want_prog: the predicate is a family. */
static void expect_plan(const lk_block_mask *m, int want_prog) {
    lk_flex_plan pl;
    assert_int_equal(lk_flex_plan_make(m, &pl), LK_OK);
    const lk_flex_map *x = &pl.map;
    assert_int_equal(pl.has_prog, want_prog);
    assert_int_equal(x->nq, (m->Q_LEN + 127) / 128);
    assert_int_equal(x->nk, (m->KV_LEN + 127) / 128);
    assert_true(want_prog ? x->bits == NULL : x->bits != NULL);
    int64_t partial = 0;
    /* falling, from the predicate: no kv tile seen by more q tiles than the one before, and on
     * average at most 3/4 of the most any sees. A tile is seen where any element of the mask's
     * blocks that overlap it is (the plan lists a tile by the blocks: with blocks of 200, causal
     * tiles 3, 3, 2 where the elements alone give 3, 2, 1). */
    const int64_t qs = m->Q_BLOCK_SIZE, ks = m->KV_BLOCK_SIZE;
    int falling = 1;
    int64_t all = 0, most = 0;
    for (int64_t p = 0; p < m->B * m->H; p++) {
        int64_t before = INT64_MAX;
        for (int64_t kt = 0; kt < x->nk; kt++) {
            int64_t seen = 0;
            for (int64_t qt = 0; qt < x->nq; qt++) {
                int any = 0;
                const int64_t i1 = ((qt + 1) * 128 + qs - 1) / qs * qs, j1 = ((kt + 1) * 128 + ks - 1) / ks * ks;
                for (int64_t i = qt * 128 / qs * qs; i < i1 && i < m->Q_LEN && !any; i++)
                    for (int64_t j = kt * 128 / ks * ks; j < j1 && j < m->KV_LEN && !any; j++)
                        any = m->mask_mod(p / m->H, p % m->H, i, j, m->mask_ctx);
                seen += any;
            }
            if (seen > before) falling = 0;
            before = seen, all += seen, most = seen > most ? seen : most;
        }
    }
    if (4 * all > 3 * most * m->B * m->H * x->nk) falling = 0;
    assert_int_equal(x->falling, falling);
    for (int64_t p = 0; p < m->B * m->H; p++) {
        const int64_t b = p / m->H, h = p % m->H;
        for (int64_t qt = 0; qt < x->nq; qt++) expect_sorted(x->kv_idx, x->kv_cnt, p * x->nq + qt, x->nk);
        for (int64_t kt = 0; kt < x->nk; kt++) expect_sorted(x->q_idx, x->q_cnt, p * x->nk + kt, x->nq);
        for (int64_t qt = 0; qt < x->nq; qt++)
            for (int64_t kt = 0; kt < x->nk; kt++) {
                const int64_t rq = p * x->nq + qt, rk = p * x->nk + kt;
                const int e = find(x->kv_idx, x->kv_cnt, rq, x->nk, (int32_t)kt);
                const int f = find(x->q_idx, x->q_cnt, rk, x->nq, (int32_t)qt);
                assert_int_equal(e < 0, f < 0);                                  /* the transpose */
                const int full = e >= x->kv_cnt[2 * rq];
                if (e >= 0) {
                    assert_int_equal(full, f >= x->q_cnt[2 * rk]);
                    if (!full) {
                        assert_int_equal(x->kv_bit[rq * x->nk + e], x->q_bit[rk * x->nq + f]);
                        assert_true(x->kv_bit[rq * x->nk + e] >= 0 && x->kv_bit[rq * x->nk + e] < pl.ntiles);
                        const int32_t *t = pl.tile_of + 3 * x->kv_bit[rq * x->nk + e];
                        assert_int_equal(t[0], p), assert_int_equal(t[1], qt), assert_int_equal(t[2], kt);
                        partial++;
                    }
                }
                const uint32_t *w = e >= 0 && !full && x->bits ? x->bits + (int64_t)x->kv_bit[rq * x->nk + e] *
                                                                               LK_FLEX_TILE_WORDS : NULL;
                for (int64_t r = 0; r < 128; r++)
                    for (int64_t c = 0; c < 128; c++) {
                        const int64_t i = qt * 128 + r, j = kt * 128 + c;
                        const int in = i < m->Q_LEN && j < m->KV_LEN;
                        const int want = in && m->mask_mod(b, h, i, j, m->mask_ctx);
                        if (e < 0) assert_int_equal(want, 0);
                        else if (full) assert_true(in && want);
                        else if (w) {
                            assert_int_equal(bit(w, r, c), want);
                            assert_int_equal((w[lk_flex_by_key((int)r / 64, (int)c) + (r % 64) / 32] >> (r % 32)) & 1u,
                                             (uint32_t)want);
                        } else if (in) {
                            assert_int_equal(lk_flex_eval(&pl.prog, pl.data, b, i, j), want);
                        }
                    }
            }
    }
    assert_int_equal(partial, pl.ntiles);
    lk_flex_plan_free(&pl);
}

static void families(void **state) {
    (void)state;
    const int64_t blocks[] = {128, 64, 96, 200};
    for (int bi = 0; bi < 4; bi++) {
        const int64_t bs = blocks[bi];
        lk_block_mask m;
        assert_int_equal(lk_block_mask_causal(1, 1, 300, 300, bs, bs, &m), LK_OK);
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
        assert_int_equal(lk_block_mask_causal(2, 1, 200, 333, bs, bs, &m), LK_OK);   /* q_len < kv_len */
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
        assert_int_equal(lk_block_mask_sliding_window(70, 1, 1, 390, 390, bs, bs, &m), LK_OK);
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
        const int64_t prefix[3] = {0, 150, 1000};
        assert_int_equal(lk_block_mask_prefix_lm(prefix, 3, 1, 270, 270, bs, bs, &m), LK_OK);
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
        const int32_t cu[5] = {0, 37, 200, 201, 420};
        assert_int_equal(lk_block_mask_document_cu(cu, 4, bi & 1, 1, 420, bs, bs, &m), LK_OK);
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
        int32_t ids[2 * 260];
        for (int i = 0; i < 260; i++) ids[i] = i / 90, ids[260 + i] = i < 30 ? 0 : i < 190 ? 1 : 2;
        assert_int_equal(lk_block_mask_document_ids(ids, 1, 2, 1, 260, bs, bs, &m), LK_OK);
        expect_plan(&m, 1);
        lk_block_mask_free(&m);
    }
}

static bool anti_causal(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    (void)b, (void)h, (void)ctx;
    return kv >= q;
}

/* Plans m (made with status made), checks its `falling` is want, and frees m. */
static void expect_falling(lk_status made, lk_block_mask *m, int want) {
    lk_flex_plan pl;
    assert_int_equal(made, LK_OK);
    assert_int_equal(lk_flex_plan_make(m, &pl), LK_OK);
    assert_int_equal(pl.map.falling, want);
    lk_flex_plan_free(&pl), lk_block_mask_free(m);
}

/* `falling` (the backward's grid order) on masks known each way: set under causal and
 * prefix-LM masks (kv tile 0 seen by every q tile, the mean half of it), clear where later kv
 * tiles are seen by more q tiles and under a sliding window (walks that fall only at the end);
 * expect_plan checks it on every mask against the predicate. */
static void falling_walks(void **state) {
    (void)state;
    lk_block_mask m;
    const int64_t prefix[1] = {300};
    expect_falling(lk_block_mask_causal(1, 2, 1000, 1000, 128, 128, &m), &m, 1);
    expect_falling(lk_block_mask_prefix_lm(prefix, 1, 1, 1000, 1000, 128, 128, &m), &m, 1);
    expect_falling(lk_block_mask_sliding_window(500, 1, 1, 2000, 2000, 128, 128, &m), &m, 0);
    assert_int_equal(lk_block_mask_create(anti_causal, NULL, 1, 1, 1000, 1000, 128, 128, &m), LK_OK);
    expect_plan(&m, 0);
    expect_falling(LK_OK, &m, 0);
}

/* AND / OR of families stay a program; a custom predicate, a dense mask and a program
 * past LK_FLEX_NODES keep host bits; per-head masks plan each head apart. */
static void compositions_and_host_bits(void **state) {
    (void)state;
    lk_block_mask a, b, c, m;
    const int32_t cu[4] = {0, 100, 240, 300};
    assert_int_equal(lk_block_mask_document_cu(cu, 3, 0, 1, 300, 64, 64, &a), LK_OK);
    assert_int_equal(lk_block_mask_causal(1, 1, 300, 300, 64, 64, &b), LK_OK);
    assert_int_equal(lk_block_mask_and(&a, &b, &m), LK_OK);
    expect_plan(&m, 1);
    lk_block_mask_free(&m);
    assert_int_equal(lk_block_mask_sliding_window(33, 1, 1, 300, 300, 64, 64, &c), LK_OK);
    assert_int_equal(lk_block_mask_or(&a, &c, &m), LK_OK);
    expect_plan(&m, 1);
    /* m is 3 nodes; each AND with causal adds 2: the sixth is 15 nodes, the seventh 17,
     * one more than a program holds */
    lk_block_mask chain[7];
    const lk_block_mask *prev = &m;
    for (int i = 0; i < 7; i++) {
        assert_int_equal(lk_block_mask_and(prev, &b, &chain[i]), LK_OK);
        prev = &chain[i];
    }
    expect_plan(&chain[5], 1);
    expect_plan(&chain[6], 0);
    for (int i = 6; i >= 0; i--) lk_block_mask_free(&chain[i]);
    lk_block_mask_free(&m);
    lk_block_mask_free(&a), lk_block_mask_free(&b), lk_block_mask_free(&c);

    assert_int_equal(lk_block_mask_create(holes, NULL, 2, 3, 310, 290, 128, 128, &m), LK_OK);
    expect_plan(&m, 0);
    lk_block_mask_free(&m);
    assert_int_equal(lk_block_mask_create(holes, NULL, 1, 2, 257, 385, 96, 64, &m), LK_OK);
    expect_plan(&m, 0);
    lk_block_mask_free(&m);
    const int64_t dims[4] = {1, 2, 150, 260};
    uint8_t *dense = malloc(2 * 150 * 260);
    for (int64_t i = 0; i < 2 * 150 * 260; i++) dense[i] = (uint8_t)((i * 7919) % 11 < 4);
    assert_int_equal(lk_block_mask_dense(dense, dims, 128, 128, &m), LK_OK);
    free(dense);
    expect_plan(&m, 0);
    lk_block_mask_free(&m);
}

/* Causal document masks of random packings, alone and within windows of 5, 128 and 300
 * keys, stay within lk_flex_documents_cap, and a plan
 * packed into the staged image is its lists, count, tile_of and data; a plan of another
 * shape, past the caps or with host bits is refused, the image untouched. */
static void staged_documents(void **state) {
    (void)state;
    const int64_t lens[] = {1, 127, 128, 640, 1000, 4113};
    uint64_t x = 12345;
    for (int li = 0; li < 6; li++)
        for (int rep = 0; rep < 16; rep++) {
            const int64_t LEN = lens[li], longest = rep / 4 % 3 == 0 ? 3 : rep / 4 % 3 == 1 ? 200 : 2000;
            int32_t *cu = malloc((size_t)(LEN + 1) * sizeof *cu);
            int64_t n = 0;
            cu[0] = 0;
            while (cu[n] < LEN) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                const int64_t d = 1 + (int64_t)((x >> 33) % (uint64_t)longest);
                cu[n + 1] = (int32_t)(cu[n] + d < LEN ? cu[n] + d : LEN), n++;
            }
            lk_block_mask docs, win, m;
            const int64_t window = rep % 4 == 3 ? 0 : rep % 4 == 0 ? 5 : rep % 4 == 1 ? 128 : 300;
            assert_int_equal(lk_block_mask_document_cu(cu, n, 1, 1, LEN, 0, 0, &docs), LK_OK);
            if (window) {
                assert_int_equal(lk_block_mask_sliding_window(window, 1, 1, LEN, LEN, 0, 0, &win), LK_OK);
                assert_int_equal(lk_block_mask_and(&docs, &win, &m), LK_OK);
            } else {
                m = docs;
            }
            if (LEN <= 1000 && rep < 3) expect_plan(&m, 1);
            lk_flex_plan pl;
            assert_int_equal(lk_flex_plan_make(&m, &pl), LK_OK);
            const int64_t cap = lk_flex_documents_cap(LEN, window);
            assert_true(pl.ntiles <= cap);
            const lk_flex_image L = lk_flex_image_of(&pl, cap, pl.ndata);
            int32_t *img = malloc((size_t)L.words * sizeof *img);
            memset(img, 0x5a, (size_t)L.words * sizeof *img);
            assert_int_equal(lk_flex_image_pack(&L, &pl, img), LK_OK);
            assert_memory_equal(img, pl.buf, (size_t)L.count * sizeof *img);
            assert_int_equal(img[L.count], pl.ntiles);
            assert_memory_equal(img + L.tile_of, pl.tile_of, (size_t)(3 * pl.ntiles) * sizeof *img);
            assert_memory_equal(img + L.data, pl.data, (size_t)pl.ndata * sizeof *img);
            if (pl.ntiles > 0) {   /* one tile short: refused, the image as it was */
                const lk_flex_image S = lk_flex_image_of(&pl, pl.ntiles - 1, pl.ndata);
                memset(img, 0x5a, (size_t)L.words * sizeof *img);
                assert_int_equal(lk_flex_image_pack(&S, &pl, img), LK_EINVAL);
                assert_non_null(strstr(lk_last_error(), "partial tiles"));
                assert_int_equal(img[0], 0x5a5a5a5a);
            }
            free(img);
            lk_flex_plan_free(&pl);
            if (window) lk_block_mask_free(&m), lk_block_mask_free(&win);
            lk_block_mask_free(&docs);
            free(cu);
        }
    lk_block_mask a, b;
    const int32_t cu[3] = {0, 100, 300};
    assert_int_equal(lk_block_mask_document_cu(cu, 2, 1, 1, 300, 0, 0, &a), LK_OK);
    lk_flex_plan pa, pb;
    assert_int_equal(lk_flex_plan_make(&a, &pa), LK_OK);
    const lk_flex_image L = lk_flex_image_of(&pa, lk_flex_documents_cap(300, 0), pa.ndata);
    int32_t *img = calloc((size_t)L.words, sizeof *img);
    assert_int_equal(lk_block_mask_causal(1, 1, 299, 299, 0, 0, &b), LK_OK);   /* another shape */
    assert_int_equal(lk_flex_plan_make(&b, &pb), LK_OK);
    assert_int_equal(lk_flex_image_pack(&L, &pb, img), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "expected the staged shape [1, 1, 300, 300], got [1, 1, 299, 299]"));
    lk_flex_plan_free(&pb), lk_block_mask_free(&b);
    assert_int_equal(lk_block_mask_create(holes, NULL, 1, 1, 300, 300, 0, 0, &b), LK_OK);   /* host bits */
    assert_int_equal(lk_flex_plan_make(&b, &pb), LK_OK);
    assert_int_equal(lk_flex_image_pack(&L, &pb, img), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "standard family"));
    lk_flex_plan_free(&pb), lk_block_mask_free(&b);
    free(img);
    lk_flex_plan_free(&pa), lk_block_mask_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(families),
        cmocka_unit_test(falling_walks),
        cmocka_unit_test(staged_documents),
        cmocka_unit_test(compositions_and_host_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
