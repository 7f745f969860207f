/* test_data.c — the data pipeline: the embedded corpus (deterministic per seed, learnable
 * structure, correct arithmetic), the byte tokenizer, text and LKTOK token files (round
 * trips, and bad files rejected with the path in the error), packing invariants on random
 * document lengths, and iterator save/restore giving the same batches bit for bit.
 * Run: ctest -R test_data, or ./build/test_data. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/data.h"

static char tmpdir[64];

static int setup(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/lk_test_data_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char p[160];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static int datasets_equal(const lk_dataset *a, const lk_dataset *b) {
    return a->n_docs == b->n_docs && a->n_tokens == b->n_tokens &&
           memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof *a->tokens) == 0 &&
           memcmp(a->doc_start, b->doc_start, (size_t)(a->n_docs + 1) * sizeof *a->doc_start) == 0;
}

/* ---- corpus ------------------------------------------------------------------------- */

static void test_corpus_deterministic(void **state) {
    (void)state;
    lk_dataset a, b, c, prefix;
    assert_int_equal(lk_corpus_generate(1234, 300, &a), LK_OK);
    assert_int_equal(lk_corpus_generate(1234, 300, &b), LK_OK);
    assert_int_equal(lk_corpus_generate(1235, 300, &c), LK_OK);
    assert_int_equal(lk_corpus_generate(1234, 40, &prefix), LK_OK);
    assert_true(datasets_equal(&a, &b));
    assert_false(a.n_tokens == c.n_tokens && memcmp(a.tokens, c.tokens, (size_t)a.n_tokens * 4) == 0);
    /* document i depends on (seed, i) only: a smaller corpus is a prefix */
    assert_memory_equal(prefix.tokens, a.tokens, (size_t)prefix.n_tokens * 4);
    assert_int_equal(prefix.doc_start[40], a.doc_start[40]);
    /* lengths from tens to thousands of bytes; every document BOS text EOS with bytes inside */
    int64_t shortest = INT64_MAX, longest = 0;
    for (int64_t d = 0; d < a.n_docs; d++) {
        int64_t s = a.doc_start[d], e = a.doc_start[d + 1];
        shortest = e - s < shortest ? e - s : shortest;
        longest = e - s > longest ? e - s : longest;
        assert_int_equal(a.tokens[s], LK_TOK_BOS);
        assert_int_equal(a.tokens[e - 1], LK_TOK_EOS);
        for (int64_t i = s + 1; i < e - 1; i++) assert_in_range(a.tokens[i], 0, 255);
    }
    assert_true(shortest < 100);
    assert_true(longest > 1500 && longest < 4096);
    assert_int_equal(a.vocab, LK_TOK_VOCAB);
    lk_dataset_free(&a);
    lk_dataset_free(&b);
    lk_dataset_free(&c);
    lk_dataset_free(&prefix);
    assert_int_equal(lk_corpus_generate(1, 0, &a), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "n_docs"));
}

/* The text of document i matches the dataset's tokens; its arithmetic is right. */
static void test_corpus_text_and_facts(void **state) {
    (void)state;
    lk_dataset ds;
    assert_int_equal(lk_corpus_generate(7, 200, &ds), LK_OK);
    char *text = malloc(8192), *dec = malloc(8192);
    int sums = 0, records = 0, sentences = 0;
    for (int64_t d = 0; d < ds.n_docs; d++) {
        size_t len, dlen;
        assert_int_equal(lk_corpus_document(7, d, text, 8192, &len), LK_OK);
        int64_t s = ds.doc_start[d], n = ds.doc_start[d + 1] - s;
        assert_int_equal(n, (int64_t)len + 2);
        assert_int_equal(lk_tok_decode(ds.tokens + s, n, dec, &dlen), LK_OK);
        assert_int_equal(dlen, len);
        assert_memory_equal(dec, text, len);
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            int x, y, z;
            char op;
            if (sscanf(line, "%d %c %d = %d", &x, &op, &y, &z) == 4 && strchr("+-*", op)) {
                assert_int_equal(z, op == '+' ? x + y : op == '-' ? x - y : x * y);
                sums++;
            }
            records += strncmp(line, "name: ", 6) == 0;
            sentences += strstr(line, " lives in ") != NULL;
        }
    }
    assert_true(sums > 100 && records > 20 && sentences > 10);
    /* learnable: the next token given the current one carries less than half the
     * uniform loss ln(320) = 5.77 nats, so a model that learns bigrams alone already
     * halves its first loss (the `make run` target) */
    static double count[LK_TOK_VOCAB][LK_TOK_VOCAB];
    memset(count, 0, sizeof count);
    for (int64_t i = 0; i + 1 < ds.n_tokens; i++) count[ds.tokens[i]][ds.tokens[i + 1]] += 1;
    double h = 0, total = (double)(ds.n_tokens - 1);
    for (int a = 0; a < LK_TOK_VOCAB; a++) {
        double row = 0;
        for (int b = 0; b < LK_TOK_VOCAB; b++) row += count[a][b];
        for (int b = 0; b < LK_TOK_VOCAB; b++)
            if (count[a][b] > 0) h -= count[a][b] / total * log(count[a][b] / row);
    }
    assert_true(h < 0.45 * log(LK_TOK_VOCAB));
    free(text);
    free(dec);
    lk_dataset_free(&ds);
}

/* ---- tokenizer ---------------------------------------------------------------------- */

static void test_tokenizer_round_trip(void **state) {
    (void)state;
    unsigned char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (unsigned char)i;
    int32_t ids[258];
    assert_int_equal(lk_tok_encode(bytes, 256, 1, ids), 258);
    assert_int_equal(ids[0], LK_TOK_BOS);
    assert_int_equal(ids[257], LK_TOK_EOS);
    for (int i = 0; i < 256; i++) assert_int_equal(ids[i + 1], i);
    char out[258];
    size_t len = 0;
    assert_int_equal(lk_tok_decode(ids, 258, out, &len), LK_OK);
    assert_int_equal(len, 256);
    assert_memory_equal(out, bytes, 256);
    assert_int_equal(lk_tok_encode(bytes, 256, 0, ids), 256);
    assert_int_equal(ids[0], 0);
    int32_t pad[3] = {'h', LK_TOK_PAD, 'i'};
    assert_int_equal(lk_tok_decode(pad, 3, out, &len), LK_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(out, "hi", 2);
    assert_int_equal(LK_TOK_VOCAB % 64, 0);
    assert_true(LK_TOK_PAD < LK_TOK_VOCAB);
    int32_t bad[3] = {'a', 300, 'b'};
    assert_int_equal(lk_tok_decode(bad, 3, out, &len), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ids[1]"));
    bad[1] = -1;
    assert_int_equal(lk_tok_decode(bad, 3, out, &len), LK_EINVAL);
}

/* ---- packing ------------------------------------------------------------------------ */

/* n_docs documents of random length (some empty); token i of document d is d*100000 + i,
 * so every token names its document and place. */
static lk_dataset synthetic(uint64_t seed, int64_t n_docs, int64_t max_len) {
    lk_dataset ds = {0};
    ds.doc_start = malloc((size_t)(n_docs + 1) * sizeof *ds.doc_start);
    ds.doc_start[0] = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        int64_t len = (int64_t)(lk_rng_bits(seed, (uint64_t)d) % (uint64_t)(max_len + 1));
        if (d % 17 == 5) len = 0;
        ds.doc_start[d + 1] = ds.doc_start[d] + len;
    }
    ds.n_docs = n_docs;
    ds.n_tokens = ds.doc_start[n_docs];
    ds.tokens = malloc((size_t)ds.n_tokens * sizeof *ds.tokens);
    for (int64_t d = 0; d < n_docs; d++)
        for (int64_t i = ds.doc_start[d]; i < ds.doc_start[d + 1]; i++)
            ds.tokens[i] = (int32_t)(d * 100000 + (i - ds.doc_start[d]));
    ds.vocab = INT32_MAX;
    return ds;
}

static void check_invariants(const lk_dataset *ds, const lk_batch *b, int64_t *next_tok) {
    const int64_t B = b->B, S = b->S, N = B * S;
    assert_int_equal(b->cu_seqlens[0], 0);
    assert_int_equal(b->cu_seqlens[b->n_segs], N);
    int64_t max_len = 0, n_labels = 0;
    for (int64_t g = 0; g < b->n_segs; g++) {
        int64_t s = b->cu_seqlens[g], e = b->cu_seqlens[g + 1];
        assert_true(e > s);                                   /* strictly increasing */
        assert_int_equal(s / S, (e - 1) / S);                 /* inside one row */
        max_len = e - s > max_len ? e - s : max_len;
        int pad = b->input_ids[s] == LK_TOK_PAD;
        if (pad) {
            assert_int_equal(e % S, 0);                       /* padding only ends a row */
            assert_true(e - s < LK_PACK_MIN_PIECE);
        }
        int64_t d = pad ? -1 : b->input_ids[s] / 100000, i0 = pad ? 0 : b->input_ids[s] % 100000;
        int64_t dlen = pad ? 0 : ds->doc_start[d + 1] - ds->doc_start[d];
        if (!pad) {
            /* a piece starts where the document's previous piece ended */
            assert_int_equal(i0, next_tok[d]);
            next_tok[d] = i0 + (e - s) == dlen ? 0 : i0 + (e - s);
            /* a piece ends at the document's end, or at the row's end and is then no
             * shorter than the minimum piece (shorter room is padded instead) */
            assert_true(i0 + (e - s) == dlen || e % S == 0);
            if (i0 + (e - s) != dlen) assert_true(e - s >= (S < LK_PACK_MIN_PIECE ? S : LK_PACK_MIN_PIECE));
        }
        for (int64_t t = s; t < e; t++) {
            assert_int_equal(b->doc_ids[t], g);
            assert_int_equal(b->position_ids[t], t - s);
            if (pad) {
                assert_int_equal(b->input_ids[t], LK_TOK_PAD);
                assert_int_equal(b->labels[t], LK_LABEL_IGNORE);
                continue;
            }
            assert_int_equal(b->input_ids[t], d * 100000 + i0 + (t - s));
            if (t + 1 < e) {
                assert_int_equal(b->labels[t], b->input_ids[t + 1]);
                n_labels++;
            } else {
                assert_int_equal(b->labels[t], LK_LABEL_IGNORE);
            }
        }
    }
    assert_int_equal(b->max_seqlen, max_len);
    assert_int_equal(b->n_labels, n_labels);
}

static void test_packing_invariants(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{4, 64, 150}, {3, 37, 20}, {1, 5, 12}, {2, 128, 600}, {8, 16, 3}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const int64_t B = shapes[k][0], S = shapes[k][1];
        lk_dataset ds = synthetic(99 + k, 60, shapes[k][2]);
        lk_data_iter it;
        lk_batch b;
        assert_int_equal(lk_data_iter_init(&it, &ds, B, S, 5), LK_OK);
        assert_int_equal(lk_batch_alloc(&b, B, S), LK_OK);
        int64_t *next_tok = calloc((size_t)ds.n_docs, sizeof *next_tok);
        /* enough batches for several epochs, so the rollover is checked too */
        int64_t steps = 3 * ds.n_tokens / (B * S) + 2;
        for (int64_t step = 0; step < steps; step++) {
            assert_int_equal(lk_data_iter_next(&it, &b), LK_OK);
            check_invariants(&ds, &b, next_tok);
        }
        assert_true(lk_data_iter_state(&it).epoch >= 2);
        assert_int_equal(lk_data_iter_state(&it).step, steps);
        free(next_tok);
        lk_batch_free(&b);
        lk_data_iter_free(&it);
        lk_dataset_free(&ds);
    }
}

/* Each epoch visits every document once, in an order that depends on the seed. */
static void test_epoch_order(void **state) {
    (void)state;
    lk_dataset ds = synthetic(3, 50, 40);
    lk_data_iter a, b;
    assert_int_equal(lk_data_iter_init(&a, &ds, 1, 8, 1), LK_OK);
    assert_int_equal(lk_data_iter_init(&b, &ds, 1, 8, 2), LK_OK);
    int seen[50] = {0};
    for (int i = 0; i < 50; i++) seen[a.order[i]]++;
    for (int i = 0; i < 50; i++) assert_int_equal(seen[i], 1);
    assert_memory_not_equal(a.order, b.order, 50 * sizeof *a.order);
    /* and on the epoch: the next epoch is shuffled anew */
    int64_t first[50];
    memcpy(first, a.order, sizeof first);
    lk_data_state next_epoch = {.seed = 1, .epoch = 1};
    assert_int_equal(lk_data_iter_restore(&a, &next_epoch), LK_OK);
    assert_memory_not_equal(a.order, first, sizeof first);
    lk_data_iter_free(&a);
    lk_data_iter_free(&b);
    lk_dataset_free(&ds);
}

static int batches_equal(const lk_batch *x, const lk_batch *y) {
    size_t n = (size_t)(x->B * x->S);
    return x->n_segs == y->n_segs && x->max_seqlen == y->max_seqlen && x->n_labels == y->n_labels &&
           !memcmp(x->input_ids, y->input_ids, n * 8) && !memcmp(x->labels, y->labels, n * 8) &&
           !memcmp(x->position_ids, y->position_ids, n * 8) && !memcmp(x->doc_ids, y->doc_ids, n * 4) &&
           !memcmp(x->cu_seqlens, y->cu_seqlens, (size_t)(x->n_segs + 1) * 4);
}

static void test_iterator_save_restore(void **state) {
    (void)state;
    lk_dataset ds;
    assert_int_equal(lk_corpus_generate(11, 40, &ds), LK_OK);   /* small: epochs roll over */
    enum { B = 2, S = 256, SKIP = 7, NEXT = 60 };
    lk_data_iter it, resumed;
    lk_batch b, r;
    assert_int_equal(lk_data_iter_init(&it, &ds, B, S, 42), LK_OK);
    assert_int_equal(lk_batch_alloc(&b, B, S), LK_OK);
    assert_int_equal(lk_batch_alloc(&r, B, S), LK_OK);
    for (int i = 0; i < SKIP; i++) assert_int_equal(lk_data_iter_next(&it, &b), LK_OK);
    lk_data_state saved = lk_data_iter_state(&it);
    assert_int_equal(saved.step, SKIP);
    lk_batch *want = calloc(NEXT, sizeof *want);
    for (int i = 0; i < NEXT; i++) {
        assert_int_equal(lk_batch_alloc(&want[i], B, S), LK_OK);
        assert_int_equal(lk_data_iter_next(&it, &want[i]), LK_OK);
    }
    assert_true(lk_data_iter_state(&it).epoch > saved.epoch);
    /* a fresh iterator (other seed at init) restored from the saved integers */
    assert_int_equal(lk_data_iter_init(&resumed, &ds, B, S, 999), LK_OK);
    assert_int_equal(lk_data_iter_restore(&resumed, &saved), LK_OK);
    for (int i = 0; i < NEXT; i++) {
        assert_int_equal(lk_data_iter_next(&resumed, &r), LK_OK);
        assert_true(batches_equal(&r, &want[i]));
    }
    assert_memory_equal(&it.st, &resumed.st, sizeof it.st);
    /* another seed gives other batches */
    lk_data_iter other;
    assert_int_equal(lk_data_iter_init(&other, &ds, B, S, 43), LK_OK);
    lk_data_iter_free(&resumed);
    assert_int_equal(lk_data_iter_init(&resumed, &ds, B, S, 42), LK_OK);
    assert_int_equal(lk_data_iter_next(&other, &b), LK_OK);
    assert_int_equal(lk_data_iter_next(&resumed, &r), LK_OK);
    assert_false(batches_equal(&b, &r));
    /* bad states are refused and leave the iterator as it was */
    lk_data_state before = lk_data_iter_state(&resumed), bad = saved;
    bad.cursor = ds.n_docs;
    assert_int_equal(lk_data_iter_restore(&resumed, &bad), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "cursor"));
    bad = saved;
    bad.offset = 5000;
    assert_int_equal(lk_data_iter_restore(&resumed, &bad), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "offset"));
    assert_memory_equal(&before, &resumed.st, sizeof before);
    /* a batch of another shape is refused */
    lk_batch wrong;
    assert_int_equal(lk_batch_alloc(&wrong, B, S + 1), LK_OK);
    assert_int_equal(lk_data_iter_next(&resumed, &wrong), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "batch"));
    lk_batch_free(&wrong);
    for (int i = 0; i < NEXT; i++) lk_batch_free(&want[i]);
    free(want);
    lk_batch_free(&b);
    lk_batch_free(&r);
    lk_data_iter_free(&it);
    lk_data_iter_free(&resumed);
    lk_data_iter_free(&other);
    lk_dataset_free(&ds);
}

static void test_bad_batch_and_iterator_args(void **state) {
    (void)state;
    lk_batch b;
    assert_int_equal(lk_batch_alloc(&b, 0, 16), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "B x S"));
    assert_int_equal(lk_batch_alloc(&b, (int64_t)1 << 20, (int64_t)1 << 20), LK_EINVAL);
    lk_dataset empty = {0};
    lk_data_iter it;
    assert_int_equal(lk_data_iter_init(&it, &empty, 1, 16, 0), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ds"));
    assert_int_equal(lk_data_iter_init(&it, NULL, 1, 16, 0), LK_EINVAL);
}

/* ---- files -------------------------------------------------------------------------- */

static void test_token_file_round_trip(void **state) {
    (void)state;
    lk_dataset ds, back;
    assert_int_equal(lk_corpus_generate(5, 120, &ds), LK_OK);
    const char *p = tmp_path("corpus.u16.lktok");
    assert_int_equal(lk_tokfile_write(p, ds.tokens, ds.n_tokens, 2), LK_OK);
    assert_int_equal(lk_dataset_load_tokens(p, LK_TOK_VOCAB, LK_TOK_EOS, &back), LK_OK);
    assert_true(datasets_equal(&ds, &back));
    assert_int_equal(back.vocab, LK_TOK_VOCAB);
    lk_dataset_free(&back);
    /* uint32 with ids beyond 16 bits; the eos id 70000 splits documents, the last has none */
    int32_t ids[] = {1, 70000, 123456, 70000, 65536, 70000, 7, 8};
    p = tmp_path("big.u32.lktok");
    assert_int_equal(lk_tokfile_write(p, ids, 8, 4), LK_OK);
    assert_int_equal(lk_dataset_load_tokens(p, 200000, 70000, &back), LK_OK);
    assert_int_equal(back.n_tokens, 8);
    assert_memory_equal(back.tokens, ids, sizeof ids);
    int64_t want_starts[] = {0, 2, 4, 6, 8};
    assert_int_equal(back.n_docs, 4);
    assert_memory_equal(back.doc_start, want_starts, sizeof want_starts);
    lk_dataset_free(&back);
    assert_int_equal(lk_dataset_load_tokens(p, 200000, -1, &back), LK_OK);
    assert_int_equal(back.n_docs, 1);
    lk_dataset_free(&back);
    /* the file's exact layout */
    FILE *f = fopen(p, "rb");
    unsigned char hdr[LK_TOKFILE_HEADER_BYTES + 8];
    assert_int_equal(fread(hdr, 1, sizeof hdr, f), sizeof hdr);
    fclose(f);
    assert_memory_equal(hdr, "LKTOK\1\4\0\10\0\0\0\0\0\0\0", 16);
    assert_memory_equal(hdr + 16, "\1\0\0\0\x70\x11\1\0", 8);
    /* the writer refuses ids that do not fit */
    assert_int_equal(lk_tokfile_write(tmp_path("x"), ids, 8, 2), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ids[1]"));
    assert_int_equal(lk_tokfile_write(tmp_path("x"), ids, 8, 3), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "token_bytes"));
    assert_int_equal(access(tmp_path("x"), F_OK), -1);
    assert_int_equal(lk_tokfile_write(tmp_path("no/such/dir"), ids, 1, 4), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "no/such/dir"));
    lk_dataset_free(&ds);
}

/* Each bad file: LK_EIO, the path and the reason in the error, the output left empty. */
static void expect_bad_tokens(const void *bytes, size_t n, const char *why) {
    const char *p = tmp_path("bad.lktok");
    write_bytes(p, bytes, n);
    lk_dataset out;
    memset(&out, 0x5a, sizeof out);
    assert_int_equal(lk_dataset_load_tokens(p, LK_TOK_VOCAB, LK_TOK_EOS, &out), LK_EIO);
    assert_non_null(strstr(lk_last_error(), p));
    if (!strstr(lk_last_error(), why)) fail_msg("'%s' does not say '%s'", lk_last_error(), why);
    assert_null(out.tokens);
    assert_null(out.doc_start);
}

static void test_bad_token_files(void **state) {
    (void)state;
    /* a good uint16 file of three tokens: 'h', 'i', EOS */
    unsigned char good[] = {'L', 'K', 'T', 'O', 'K', 1, 2, 0, 3, 0, 0, 0, 0, 0, 0, 0, 'h', 0, 'i', 0, 1, 1};
    lk_dataset ok;
    write_bytes(tmp_path("good.lktok"), good, sizeof good);
    assert_int_equal(lk_dataset_load_tokens(tmp_path("good.lktok"), LK_TOK_VOCAB, LK_TOK_EOS, &ok), LK_OK);
    assert_int_equal(ok.n_tokens, 3);
    assert_int_equal(ok.tokens[2], LK_TOK_EOS);
    lk_dataset_free(&ok);
    unsigned char b[sizeof good + 2];
    memcpy(b, good, sizeof good);
    b[0] = 'X';
    expect_bad_tokens(b, sizeof good, "magic");
    expect_bad_tokens(good, sizeof good - 1, "truncated");
    expect_bad_tokens(good, 10, "header");
    expect_bad_tokens(good, 0, "header");
    memcpy(b, good, sizeof good);
    b[sizeof good] = b[sizeof good + 1] = 0;
    expect_bad_tokens(b, sizeof good + 2, "trailing");
    memcpy(b, good, sizeof good);
    b[15] = 0x80;   /* a count near 2^63: no overflow, just a mismatch */
    expect_bad_tokens(b, sizeof good, "truncated");
    memcpy(b, good, sizeof good);
    b[5] = 3;
    expect_bad_tokens(b, sizeof good, "version 3, expected 1 or 2");
    b[5] = 2;   /* version 2 needs 32 header bytes */
    expect_bad_tokens(b, sizeof good, "shorter than the version-2 header");
    memcpy(b, good, sizeof good);
    b[6] = 3;
    expect_bad_tokens(b, sizeof good, "token size");
    memcpy(b, good, sizeof good);
    b[18] = 0x90;   /* token 1 = 400, beyond the vocabulary of 320 */
    b[19] = 0x01;
    expect_bad_tokens(b, sizeof good, "token 1 is 400, beyond the model's vocabulary (model.vocab_size 320");
    memcpy(b, good, sizeof good);
    b[8] = 0;
    expect_bad_tokens(b, LK_TOKFILE_HEADER_BYTES, "no tokens");
    lk_dataset out;
    assert_int_equal(lk_dataset_load_tokens(tmp_path("missing.lktok"), LK_TOK_VOCAB, LK_TOK_EOS, &out), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "missing.lktok"));
    assert_int_equal(lk_dataset_load_tokens(tmp_path("good.lktok"), 0, LK_TOK_EOS, &out), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "vocab"));
}

/* Version 2 (scripts/tokenize.py's): the tokenizer's vocabulary and EOS id in the header;
 * LK_EOS_FROM_FILE takes that EOS, an explicit one overrides it; the model's vocabulary
 * is checked against every id, the message naming both. */
static void test_token_file_v2(void **state) {
    (void)state;
    int32_t ids[] = {5, 9, 0, 7, 0, 3, 3};
    char p[600];   /* tmp_path's buffer is reused by the next call */
    snprintf(p, sizeof p, "%s", tmp_path("meta.lktok"));
    assert_int_equal(lk_tokfile_write_meta(p, ids, 7, 2, 10, 0), LK_OK);
    size_t n;
    FILE *f = fopen(p, "rb");
    unsigned char hdr[LK_TOKFILE_META_HEADER_BYTES + 2];
    n = fread(hdr, 1, sizeof hdr, f);
    fclose(f);
    assert_int_equal(n, sizeof hdr);
    assert_memory_equal(hdr, "LKTOK\2\2\0\7\0\0\0\0\0\0\0\12\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\5\0", 34);
    lk_dataset ds;
    assert_int_equal(lk_dataset_load_tokens(p, 10, LK_EOS_FROM_FILE, &ds), LK_OK);
    int64_t want[] = {0, 3, 5, 7};
    assert_int_equal(ds.n_docs, 3);
    assert_memory_equal(ds.doc_start, want, sizeof want);
    assert_memory_equal(ds.tokens, ids, sizeof ids);
    lk_dataset_free(&ds);
    assert_int_equal(lk_dataset_load_tokens(p, 10, 3, &ds), LK_OK);   /* an explicit eos wins */
    assert_int_equal(ds.n_docs, 2);
    lk_dataset_free(&ds);
    assert_int_equal(lk_dataset_load_tokens(p, 10, -1, &ds), LK_OK);
    assert_int_equal(ds.n_docs, 1);
    lk_dataset_free(&ds);
    /* a model vocabulary smaller than the ids: the id, model.vocab_size and the file's */
    assert_int_equal(lk_dataset_load_tokens(p, 8, LK_EOS_FROM_FILE, &ds), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "token 1 is 9, beyond the model's vocabulary (model.vocab_size 8"));
    assert_non_null(strstr(lk_last_error(), "the file's tokenizer has 10 ids"));
    assert_null(ds.tokens);
    /* a version-1 file: FROM_FILE is none, one document */
    assert_int_equal(lk_tokfile_write(tmp_path("v1.lktok"), ids, 7, 2), LK_OK);
    assert_int_equal(lk_dataset_load_tokens(tmp_path("v1.lktok"), 10, LK_EOS_FROM_FILE, &ds), LK_OK);
    assert_int_equal(ds.n_docs, 1);
    lk_dataset_free(&ds);
    assert_int_equal(lk_dataset_load_tokens(p, 10, -3, &ds), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "eos_id"));
    /* bad headers: an EOS id at or beyond the header's vocabulary, a vocabulary of 0 */
    unsigned char b[LK_TOKFILE_META_HEADER_BYTES + 14];
    f = fopen(p, "rb");
    n = fread(b, 1, sizeof b, f);
    fclose(f);
    assert_int_equal(n, sizeof b);
    b[24] = 10;
    expect_bad_tokens(b, sizeof b, "EOS id is 10, expected -1 (none) or below its vocabulary (10)");
    b[24] = 0;
    b[16] = 0;
    expect_bad_tokens(b, sizeof b, "vocabulary is 0 ids");
    b[16] = 10;
    expect_bad_tokens(b, sizeof b - 1, "header says 7 tokens, the file holds 13 bytes after the header (truncated)");
    /* the writer: ids below vocab, eos in range, vocab within the token size */
    assert_int_equal(lk_tokfile_write_meta(tmp_path("y"), ids, 7, 2, 9, 0), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ids[1]: expected 0..8 (below vocab), got 9"));
    assert_int_equal(lk_tokfile_write_meta(tmp_path("y"), ids, 7, 2, 10, 10), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "eos_id"));
    assert_int_equal(lk_tokfile_write_meta(tmp_path("y"), ids, 7, 2, 70000, 0), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "vocab: expected 1..65536 for 2-byte tokens"));
    assert_int_equal(access(tmp_path("y"), F_OK), -1);
}

static void expect_docs(const lk_dataset *ds, const char *const *docs, int n) {
    assert_int_equal(ds->n_docs, n);
    char buf[256];
    for (int d = 0; d < n; d++) {
        size_t len;
        int64_t s = ds->doc_start[d], e = ds->doc_start[d + 1];
        assert_int_equal(ds->tokens[s], LK_TOK_BOS);
        assert_int_equal(ds->tokens[e - 1], LK_TOK_EOS);
        assert_int_equal(lk_tok_decode(ds->tokens + s, e - s, buf, &len), LK_OK);
        assert_int_equal(len, strlen(docs[d]));
        assert_memory_equal(buf, docs[d], len);
    }
}

static void test_text_file(void **state) {
    (void)state;
    const char *p = tmp_path("text.txt");
    const char *text = "\n\nfirst doc\nline two\n\n \t\r\nsecond\r\n\r\n\n\nthird, no newline";
    write_bytes(p, text, strlen(text));
    lk_dataset ds;
    assert_int_equal(lk_dataset_load_text(p, &ds), LK_OK);
    const char *const want[] = {"first doc\nline two\n", "second\r\n", "third, no newline"};
    expect_docs(&ds, want, 3);
    assert_int_equal(ds.vocab, LK_TOK_VOCAB);
    lk_dataset_free(&ds);
    write_bytes(p, "one\n", 4);
    assert_int_equal(lk_dataset_load_text(p, &ds), LK_OK);
    const char *const one[] = {"one\n"};
    expect_docs(&ds, one, 1);
    lk_dataset_free(&ds);
    /* the bytes survive the round trip: every byte value but '\n' inside one document */
    unsigned char all[255];
    for (int i = 0, k = 0; i < 256; i++) if (i != '\n') all[k++] = (unsigned char)i;
    write_bytes(p, all, sizeof all);
    assert_int_equal(lk_dataset_load_text(p, &ds), LK_OK);
    assert_int_equal(ds.n_docs, 1);
    for (int i = 0; i < 255; i++) assert_int_equal(ds.tokens[i + 1], all[i]);
    lk_dataset_free(&ds);
    /* errors name the path */
    write_bytes(p, " \n\n\t\n", 5);
    assert_int_equal(lk_dataset_load_text(p, &ds), LK_EIO);
    assert_non_null(strstr(lk_last_error(), p));
    assert_non_null(strstr(lk_last_error(), "no document"));
    assert_null(ds.tokens);
    assert_int_equal(lk_dataset_load_text(tmp_path("missing.txt"), &ds), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "missing.txt"));
    assert_non_null(strstr(lk_last_error(), "No such file"));
    assert_int_equal(lk_dataset_load_text(tmpdir, &ds), LK_EIO);   /* a directory */
    assert_non_null(strstr(lk_last_error(), tmpdir));
    assert_int_equal(lk_dataset_load_text(NULL, &ds), LK_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_deterministic),
        cmocka_unit_test(test_corpus_text_and_facts),
        cmocka_unit_test(test_tokenizer_round_trip),
        cmocka_unit_test(test_packing_invariants),
        cmocka_unit_test(test_epoch_order),
        cmocka_unit_test(test_iterator_save_restore),
        cmocka_unit_test(test_bad_batch_and_iterator_args),
        cmocka_unit_test(test_token_file_round_trip),
        cmocka_unit_test(test_bad_token_files),
        cmocka_unit_test(test_token_file_v2),
        cmocka_unit_test(test_text_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
