/* test_block_mask.c — BlockMask construction: every block's class (empty, partial,
 * full) against brute force over the predicate, the q_* lists the exact transpose of
 * the kv_* lists, ragged lengths, per-head and broadcast masks, the density, each
 * family builder's visibility rule (and its blocks, which it classifies through its row
 * form), AND/OR, and bad arguments.
 * Run: ctest -R test_block_mask, or ./build/test_block_mask. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"

/* A pseudo-random pattern with structure: per (b, h) band plus scattered holes. */
static bool pattern(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    uint64_t x = (uint64_t)(q * 1315423911u) ^ (uint64_t)(kv * 2654435761u) ^ (uint64_t)(b * 97 + h * 31);
    return (kv <= q + 3 * h && q - kv < 20 + 7 * b) || (x % 53 == 0);
}

/* Brute-force class of one block: 0 empty, 1 partial, 2 full. */
static int brute(const lk_block_mask *m, int64_t b, int64_t h, int64_t qb, int64_t kb) {
    int64_t seen = 0, n = 0;
    for (int64_t i = qb * m->Q_BLOCK_SIZE; i < (qb + 1) * m->Q_BLOCK_SIZE && i < m->Q_LEN; i++)
        for (int64_t j = kb * m->KV_BLOCK_SIZE; j < (kb + 1) * m->KV_BLOCK_SIZE && j < m->KV_LEN; j++, n++)
            seen += m->mask_mod(b, h, i, j, m->mask_ctx);
    return seen == 0 ? 0 : seen == n ? 2 : 1;
}

static int listed(const int32_t *num, const int32_t *ind, int64_t row, int64_t width, int64_t x) {
    for (int32_t i = 0; num && i < num[row]; i++)
        if (ind[row * width + i] == x) return 1;
    return 0;
}

/* Every block is where brute force says, once, and the q_* lists are the transpose. */
static void expect_consistent(const lk_block_mask *m) {
    int64_t nq = m->num_q_blocks, nk = m->num_kv_blocks;
    assert_int_equal(nq, (m->Q_LEN + m->Q_BLOCK_SIZE - 1) / m->Q_BLOCK_SIZE);
    assert_int_equal(nk, (m->KV_LEN + m->KV_BLOCK_SIZE - 1) / m->KV_BLOCK_SIZE);
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t h = 0; h < m->H; h++) {
            int64_t r = b * m->H + h;
            for (int64_t qb = 0; qb < nq; qb++)
                for (int64_t kb = 0; kb < nk; kb++) {
                    int want = brute(m, b, h, qb, kb);
                    int part = listed(m->kv_num_blocks, m->kv_indices, r * nq + qb, nk, kb);
                    int full = listed(m->full_kv_num_blocks, m->full_kv_indices, r * nq + qb, nk, kb);
                    assert_int_equal(part, want == 1);
                    assert_int_equal(full, want == 2);
                    assert_int_equal(listed(m->q_num_blocks, m->q_indices, r * nk + kb, nq, qb), part);
                    assert_int_equal(listed(m->full_q_num_blocks, m->full_q_indices, r * nk + kb, nq, qb), full);
                }
        }
}

/* The builders' row form says what the predicate says, element by element. */
static void expect_row_agrees(const lk_block_mask *m) {
    assert_non_null(m->mask_row);
    uint8_t row[300];
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t i = 0; i < m->Q_LEN; i++)
            for (int64_t k0 = 0; k0 < m->KV_LEN; k0 += 7) {
                int64_t n = m->KV_LEN - k0 < 300 ? m->KV_LEN - k0 : 300;
                m->mask_row(b, 0, i, k0, n, row, m->mask_ctx);
                for (int64_t j = 0; j < n; j++) assert_int_equal(row[j], m->mask_mod(b, 0, i, k0 + j, m->mask_ctx));
            }
}

static void blocks_match_brute_force(void **state) {
    (void)state;
    static const int64_t dims[][6] = {      /* B, H, Q_LEN, KV_LEN, q_block, kv_block */
        {1, 1, 128, 128, 32, 32}, {2, 3, 77, 91, 16, 32}, {1, 2, 5, 300, 8, 64}, {2, 1, 130, 33, 128, 16},
        {1, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        lk_block_mask m;
        const int64_t *d = dims[i];
        assert_int_equal(lk_block_mask_create(pattern, NULL, d[0], d[1], d[2], d[3], d[4], d[5], &m), LK_OK);
        if (d[4] == 0) assert_int_equal(m.Q_BLOCK_SIZE, 128);        /* 0 = the default */
        expect_consistent(&m);
        assert_null(m.mask_row);                /* a plain predicate has no row form */
        lk_block_mask_free(&m);
        assert_null(m.kv_num_blocks);
    }
}

static double brute_density(const lk_block_mask *m) {
    double seen = 0;
    for (int64_t r = 0; r < m->B * m->H; r++)
        for (int64_t i = 0; i < m->Q_LEN; i++)
            for (int64_t j = 0; j < m->KV_LEN; j++) seen += m->mask_mod(r / m->H, r % m->H, i, j, m->mask_ctx);
    return seen / ((double)(m->B * m->H) * (double)m->Q_LEN * (double)m->KV_LEN);
}

static void builders_follow_their_rules(void **state) {
    (void)state;
    lk_block_mask m;
    /* causal, bottom-right aligned */
    assert_int_equal(lk_block_mask_causal(1, 1, 10, 25, 4, 4, &m), LK_OK);
    for (int64_t i = 0; i < 10; i++)
        for (int64_t j = 0; j < 25; j++) assert_int_equal(m.mask_mod(0, 0, i, j, m.mask_ctx), j <= i + 15);
    expect_consistent(&m);
    assert_true(fabs(lk_block_mask_density(&m) - brute_density(&m)) < 1e-12);
    expect_row_agrees(&m);
    lk_block_mask_free(&m);
    /* sliding window of 4, the diagonal included */
    assert_int_equal(lk_block_mask_sliding_window(4, 1, 1, 30, 30, 8, 8, &m), LK_OK);
    for (int64_t i = 0; i < 30; i++)
        for (int64_t j = 0; j < 30; j++) assert_int_equal(m.mask_mod(0, 0, i, j, m.mask_ctx), j <= i && i - j < 4);
    expect_consistent(&m);
    expect_row_agrees(&m);
    lk_block_mask_free(&m);
    /* a window wider than any sequence: causal (the row form's interval must not overflow) */
    assert_int_equal(lk_block_mask_sliding_window(INT64_MAX, 1, 1, 30, 41, 8, 8, &m), LK_OK);
    for (int64_t i = 0; i < 30; i++)
        for (int64_t j = 0; j < 41; j++) assert_int_equal(m.mask_mod(0, 0, i, j, m.mask_ctx), j <= i + 11);
    expect_row_agrees(&m);
    lk_block_mask_free(&m);
    /* prefix-LM per batch row */
    int64_t pre[2] = {5, 12};
    assert_int_equal(lk_block_mask_prefix_lm(pre, 2, 1, 20, 20, 8, 8, &m), LK_OK);
    pre[0] = 99;                             /* copied: the caller's array may change */
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 20; i++)
            for (int64_t j = 0; j < 20; j++)
                assert_int_equal(m.mask_mod(b, 0, i, j, m.mask_ctx), j < (b ? 12 : 5) || j <= i);
    expect_consistent(&m);
    expect_row_agrees(&m);
    lk_block_mask_free(&m);
    /* documents from cu_seqlens and from ids agree */
    int32_t cu[4] = {0, 7, 7, 23}, ids[23];
    for (int i = 0; i < 23; i++) ids[i] = i < 7 ? 0 : 2;
    lk_block_mask a, b;
    assert_int_equal(lk_block_mask_document_cu(cu, 3, 1, 1, 23, 8, 8, &a), LK_OK);
    assert_int_equal(lk_block_mask_document_ids(ids, 1, 1, 1, 23, 8, 8, &b), LK_OK);
    for (int64_t i = 0; i < 23; i++)
        for (int64_t j = 0; j < 23; j++) {
            bool want = j <= i && (i < 7) == (j < 7);
            assert_int_equal(a.mask_mod(0, 0, i, j, a.mask_ctx), want);
            assert_int_equal(b.mask_mod(0, 0, i, j, b.mask_ctx), want);
        }
    expect_consistent(&a);
    expect_row_agrees(&a);
    expect_row_agrees(&b);
    expect_consistent(&b);
    /* the builders classify blocks through their row forms: per-batch documents whose
     * lengths are no multiple of the (unequal) blocks, causal and not */
    int32_t ids2[2 * 45];
    for (int i = 0; i < 45; i++) ids2[i] = i / 11, ids2[45 + i] = i < 3 ? 0 : i < 30 ? 4 : 5;
    for (int causal = 0; causal < 2; causal++) {
        lk_block_mask p;
        assert_int_equal(lk_block_mask_document_ids(ids2, causal, 2, 1, 45, 8, 16, &p), LK_OK);
        expect_consistent(&p);
        assert_true(fabs(lk_block_mask_density(&p) - brute_density(&p)) < 1e-12);
        lk_block_mask_free(&p);
    }
    lk_block_mask nc;                        /* documents without the causal part */
    assert_int_equal(lk_block_mask_document_ids(ids, 0, 1, 1, 23, 8, 8, &nc), LK_OK);
    expect_row_agrees(&nc);
    lk_block_mask_free(&nc);
    /* AND / OR of the documents with a window */
    lk_block_mask w, and_m, or_m;
    assert_int_equal(lk_block_mask_sliding_window(3, 1, 1, 23, 23, 8, 8, &w), LK_OK);
    assert_int_equal(lk_block_mask_and(&a, &w, &and_m), LK_OK);
    assert_int_equal(lk_block_mask_or(&a, &w, &or_m), LK_OK);
    for (int64_t i = 0; i < 23; i++)
        for (int64_t j = 0; j < 23; j++) {
            bool x = a.mask_mod(0, 0, i, j, a.mask_ctx), y = w.mask_mod(0, 0, i, j, w.mask_ctx);
            assert_int_equal(and_m.mask_mod(0, 0, i, j, and_m.mask_ctx), x && y);
            assert_int_equal(or_m.mask_mod(0, 0, i, j, or_m.mask_ctx), x || y);
        }
    expect_consistent(&and_m);
    expect_consistent(&or_m);
    expect_row_agrees(&and_m);
    expect_row_agrees(&or_m);
    lk_block_mask_free(&and_m); lk_block_mask_free(&or_m); lk_block_mask_free(&w);
    lk_block_mask_free(&a); lk_block_mask_free(&b);
}

/* A dense mask (another framework's predicate, evaluated) gives the blocks of the same
 * predicate built directly, broadcast over heads; the bytes are copied. */
static void dense_masks_are_their_predicate(void **state) {
    (void)state;
    enum { B = 2, H = 3, Q = 70, KV = 90 };
    uint8_t *d = malloc((size_t)B * Q * KV);
    for (int64_t b = 0; b < B; b++)
        for (int64_t q = 0; q < Q; q++)
            for (int64_t kv = 0; kv < KV; kv++) d[(b * Q + q) * KV + kv] = pattern(b, 1, q, kv, NULL) ? 7 : 0;
    lk_block_mask m, ref;
    int64_t dims[4] = {B, 1, Q, KV};
    assert_int_equal(lk_block_mask_dense(d, dims, 16, 32, &m), LK_OK);
    memset(d, 0, (size_t)B * Q * KV);                       /* the mask holds its own copy */
    assert_int_equal(lk_block_mask_create(pattern, NULL, B, 1, Q, KV, 16, 32, &ref), LK_OK);
    expect_consistent(&m);
    expect_row_agrees(&m);
    for (int64_t b = 0; b < B; b++)
        for (int64_t q = 0; q < Q; q++)
            for (int64_t kv = 0; kv < KV; kv++)
                assert_int_equal(m.mask_mod(b, 2, q, kv, m.mask_ctx), pattern(b, 1, q, kv, NULL));
    int64_t nq = m.num_q_blocks;
    assert_memory_equal(m.kv_num_blocks, ref.kv_num_blocks, (size_t)B * nq * sizeof(int32_t));
    assert_memory_equal(m.full_kv_num_blocks, ref.full_kv_num_blocks, (size_t)B * nq * sizeof(int32_t));
    lk_block_mask_free(&m);
    lk_block_mask_free(&ref);
    int64_t bad[4] = {B, 0, Q, KV};
    assert_int_equal(lk_block_mask_dense(d, bad, 0, 0, &m), LK_EINVAL);
    assert_int_equal(lk_block_mask_dense(NULL, dims, 0, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "mask"));
    free(d);
}

static void score_mods(void **state) {
    (void)state;
    float cap = 2.0f, g = 0.0f, slopes[2] = {0.5f, 0.25f};
    float s = lk_score_mod_softcap(1.0f, 0, 0, 0, 0, &cap, &g);
    assert_true(fabsf(s - 2.0f * tanhf(0.5f)) < 1e-6f);
    assert_true(fabsf(g - (1.0f - tanhf(0.5f) * tanhf(0.5f))) < 1e-6f);
    s = lk_score_mod_alibi(1.0f, 0, 1, 10, 4, slopes, &g);
    assert_true(fabsf(s - (1.0f - 0.25f * 6.0f)) < 1e-6f);
    assert_true(g == 1.0f);
}

static void bad_arguments(void **state) {
    (void)state;
    lk_block_mask m;
    memset(&m, 0x33, sizeof m);
    lk_block_mask keep = m;
    assert_int_equal(lk_block_mask_create(NULL, NULL, 1, 1, 8, 8, 4, 4, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "mask_mod"));
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, 0, 8, 4, 4, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "shape"));
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, 8, 8, -4, 4, &m), LK_EINVAL);
    assert_int_equal(lk_block_mask_sliding_window(0, 1, 1, 8, 8, 4, 4, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "window"));
    int32_t cu_bad[3] = {0, 9, 8};
    assert_int_equal(lk_block_mask_document_cu(cu_bad, 2, 1, 1, 8, 4, 4, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "cu_seqlens"));
    assert_memory_equal(&m, &keep, sizeof m);   /* nothing written on failure */
    lk_block_mask x, y;
    assert_int_equal(lk_block_mask_causal(1, 1, 8, 8, 4, 4, &x), LK_OK);
    assert_int_equal(lk_block_mask_causal(1, 1, 9, 9, 4, 4, &y), LK_OK);
    assert_int_equal(lk_block_mask_and(&x, &y, &m), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "y"));
    lk_block_mask_free(&x); lk_block_mask_free(&y);
    lk_block_mask_free(NULL);
}

/* Issue 20, item 2: sizes whose products overflow int64 (UBSan) or wrapped the buffer
 * to 64 bytes and built for ever are LK_EINVAL naming the product; ones that fit in 64
 * bits but not in this machine are LK_ENOMEM before anything is allocated. The inputs
 * are the fuzzer's (tests/fuzz/fuzz_block_mask.c) and replayed here on every build. */
static void impossible_sizes(void **state) {
    (void)state;
    lk_block_mask m;
    memset(&m, 0x33, sizeof m);
    lk_block_mask keep = m;
    const int64_t big = (int64_t)1 << 32, huge = (int64_t)1 << 62;
    assert_int_equal(lk_block_mask_causal(big, big, 1, 1, 1, 1, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "B x H: 4294967296 x 4294967296 does not fit in 64 bits"));
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, huge, 8, 0, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "Q_LEN: 4611686018427387904 / 128"));
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, 8, INT64_MAX, 1 << 20, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "KV_LEN"));
    /* cdiv and the last block's bound (nq * q_block) past INT64_MAX */
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, INT64_MAX, 1, huge, 1, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "num_q_blocks x Q_BLOCK_SIZE"));
    /* 2^31 blocks a side: each fits in int32 ... the product of all four does not */
    assert_int_equal(lk_block_mask_causal(big, 4, (int64_t)INT32_MAX * 128, (int64_t)INT32_MAX * 128, 0, 0, &m),
                     LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "B x H x num_q_blocks x num_kv_blocks"));
    /* a few blocks of more elements than 64 bits count: the build could never finish */
    assert_int_equal(lk_block_mask_create(pattern, NULL, 1, 1, huge, 1 << 10, huge, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "B x H x Q_LEN x KV_LEN"));
    /* fits in 64 bits, not in memory: refused before the allocation */
    assert_int_equal(lk_block_mask_causal(1 << 20, 1 << 20, 128, 128, 0, 0, &m), LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "more than this machine's"));
    /* the builders that copy B-sized input check before they copy */
    int64_t prefix[1] = {4};
    assert_int_equal(lk_block_mask_prefix_lm(prefix, huge, 1, 8, 8, 4, 4, &m), LK_EINVAL);
    int32_t ids[1] = {0};
    assert_int_equal(lk_block_mask_document_ids(ids, 1, big, 1, big, 0, 0, &m), LK_EINVAL);
    assert_memory_equal(&m, &keep, sizeof m);   /* nothing written on failure */
    /* tests/fuzz found: the builders took KV_LEN - Q_LEN before the sizes were checked */
    assert_int_equal(lk_block_mask_sliding_window(-((int64_t)1 << 40), 1, 1, INT64_MIN, 65536, 0, 0, &m), LK_EINVAL);
    assert_int_equal(lk_block_mask_sliding_window(5, 1, 1, INT64_MIN, 65536, 0, 0, &m), LK_EINVAL);
    assert_int_equal(lk_block_mask_causal(1, 1, 2, INT64_MIN, 0, 0, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "shape"));
    /* a window of INT64_MAX with Q_LEN > KV_LEN: p - window once overflowed */
    assert_int_equal(lk_block_mask_sliding_window(INT64_MAX, 1, 1, 9, 5, 4, 4, &m), LK_OK);
    expect_consistent(&m);
    expect_row_agrees(&m);
    lk_block_mask_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(blocks_match_brute_force),
        cmocka_unit_test(builders_follow_their_rules),
        cmocka_unit_test(dense_masks_are_their_predicate),
        cmocka_unit_test(score_mods),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(impossible_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
