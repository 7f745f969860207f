/* batch.c — packed batches and the resumable iterator (include/llmkern/data.h). Rows are
 * filled with documents in a per-epoch shuffled order; each piece of a document in a row
 * is a segment with positions from 0, labels shifted inside it, and an entry in the
 * flattened cu_seqlens that varlen attention (B = 1 over B*S tokens) and document block
 * masks take. The iterator's state is five integers, so a resumed run sees the same
 * batches bit for bit. */
#include <stdlib.h>
#include <string.h>
#include "llmkern/data.h"
#include "llmkern/rng.h"

lk_status lk_batch_alloc(lk_batch *b, int64_t B, int64_t S) {
    memset(b, 0, sizeof *b);
    if (B < 1 || S < 1 || B > INT32_MAX / S)
        return lk_error(LK_EINVAL, "batch: B x S: expected >= 1 each and B*S <= 2^31 - 1, got %lld x %lld",
                        (long long)B, (long long)S);
    size_t n = (size_t)(B * S);
    b->B = B;
    b->S = S;
    b->input_ids = calloc(n, sizeof *b->input_ids);
    b->labels = calloc(n, sizeof *b->labels);
    b->position_ids = calloc(n, sizeof *b->position_ids);
    b->doc_ids = calloc(n, sizeof *b->doc_ids);
    b->cu_seqlens = calloc(n + 1, sizeof *b->cu_seqlens);
    if (!b->input_ids || !b->labels || !b->position_ids || !b->doc_ids || !b->cu_seqlens) {
        lk_batch_free(b);
        return lk_error(LK_ENOMEM, "batch: out of memory for %lld x %lld", (long long)B, (long long)S);
    }
    return LK_OK;
}

void lk_batch_free(lk_batch *b) {
    if (!b) return;
    free(b->input_ids);
    free(b->labels);
    free(b->position_ids);
    free(b->doc_ids);
    free(b->cu_seqlens);
    memset(b, 0, sizeof *b);
}

/* Epoch e's order: a Fisher-Yates shuffle drawn from a seed derived from (seed, e). */
static void build_order(lk_data_iter *it) {
    int64_t n = it->ds->n_docs;
    uint64_t s = lk_rng_bits(it->st.seed, (uint64_t)it->st.epoch);
    for (int64_t i = 0; i < n; i++) it->order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(lk_rng_bits(s, (uint64_t)i) % (uint64_t)(i + 1));
        int64_t t = it->order[i];
        it->order[i] = it->order[j];
        it->order[j] = t;
    }
    it->order_epoch = it->st.epoch;
}

static int64_t doc_len(const lk_data_iter *it, int64_t cursor) {
    int64_t d = it->order[cursor];
    return it->ds->doc_start[d + 1] - it->ds->doc_start[d];
}

lk_status lk_data_iter_init(lk_data_iter *it, const lk_dataset *ds, int64_t B, int64_t S, uint64_t seed) {
    memset(it, 0, sizeof *it);
    if (!ds || !ds->tokens || !ds->doc_start || ds->n_docs < 1 || ds->n_tokens < 1 ||
        ds->doc_start[ds->n_docs] != ds->n_tokens)
        return lk_error(LK_EINVAL, "data iterator: ds: expected a dataset with tokens, got %s",
                        !ds ? "NULL" : ds->n_tokens < 1 ? "an empty one" : "inconsistent doc_start");
    if (B < 1 || S < 1 || B > INT32_MAX / S)
        return lk_error(LK_EINVAL, "data iterator: B x S: expected >= 1 each and B*S <= 2^31 - 1, got %lld x %lld",
                        (long long)B, (long long)S);
    it->order = malloc((size_t)ds->n_docs * sizeof *it->order);
    if (!it->order) return lk_error(LK_ENOMEM, "data iterator: out of memory for %lld documents", (long long)ds->n_docs);
    it->ds = ds;
    it->B = B;
    it->S = S;
    it->st = (lk_data_state){.seed = seed};
    build_order(it);
    return LK_OK;
}

void lk_data_iter_free(lk_data_iter *it) {
    if (!it) return;
    free(it->order);
    memset(it, 0, sizeof *it);
}

lk_data_state lk_data_iter_state(const lk_data_iter *it) { return it->st; }

lk_status lk_data_iter_restore(lk_data_iter *it, const lk_data_state *st) {
    if (!it || !it->order || !st) return lk_error(LK_EINVAL, "data iterator: restore: NULL iterator or state");
    if (st->epoch < 0 || st->step < 0 || st->cursor < 0 || st->cursor >= it->ds->n_docs)
        return lk_error(LK_EINVAL, "data iterator: state: expected epoch, step >= 0 and cursor in [0, %lld), "
                        "got epoch %lld, step %lld, cursor %lld", (long long)it->ds->n_docs, (long long)st->epoch,
                        (long long)st->step, (long long)st->cursor);
    lk_data_state old = it->st;
    it->st = *st;
    build_order(it);
    int64_t len = doc_len(it, st->cursor);
    if (st->offset < 0 || st->offset > len) {
        it->st = old;
        build_order(it);
        return lk_error(LK_EINVAL, "data iterator: state: offset: expected 0..%lld (the document's length), got %lld",
                        (long long)len, (long long)st->offset);
    }
    return LK_OK;
}

/* Moves past a finished document, into the next epoch after the last. */
static void advance(lk_data_iter *it) {
    it->st.offset = 0;
    if (++it->st.cursor == it->ds->n_docs) {
        it->st.cursor = 0;
        it->st.epoch++;
        build_order(it);
    }
}

/* One segment of n tokens at flat index at: positions from 0, labels shifted inside it. */
static void put_segment(lk_batch *b, int64_t at, const int32_t *tok, int64_t n) {
    int32_t seg = (int32_t)b->n_segs;
    for (int64_t i = 0; i < n; i++) {
        b->input_ids[at + i] = tok ? tok[i] : LK_TOK_PAD;
        b->labels[at + i] = tok && i + 1 < n ? tok[i + 1] : LK_LABEL_IGNORE;
        b->position_ids[at + i] = i;
        b->doc_ids[at + i] = seg;
    }
    if (tok && n > 1) b->n_labels += n - 1;
    if (n > b->max_seqlen) b->max_seqlen = n;
    b->cu_seqlens[++b->n_segs] = (int32_t)(at + n);
}

lk_status lk_data_iter_next(lk_data_iter *it, lk_batch *b) {
    if (!it || !it->order) return lk_error(LK_EINVAL, "data iterator: it: not initialized");
    if (!b || !b->input_ids || b->B != it->B || b->S != it->S)
        return lk_error(LK_ESHAPE, "data iterator: batch: expected one allocated for %lld x %lld, got %lld x %lld",
                        (long long)it->B, (long long)it->S, b ? (long long)b->B : 0LL, b ? (long long)b->S : 0LL);
    if (it->order_epoch != it->st.epoch) build_order(it);
    const int64_t S = it->S;
    const int64_t min_piece = LK_PACK_MIN_PIECE < S ? LK_PACK_MIN_PIECE : S;
    b->n_segs = 0;
    b->max_seqlen = 0;
    b->n_labels = 0;
    b->cu_seqlens[0] = 0;
    int64_t empty_run = 0;   /* documents skipped in a row without a token: all empty would loop */
    for (int64_t r = 0; r < it->B; r++) {
        for (int64_t col = 0; col < S;) {
            int64_t room = S - col, left = doc_len(it, it->st.cursor) - it->st.offset;
            if (left == 0) {
                if (++empty_run > it->ds->n_docs) return lk_error(LK_EINTERNAL, "data iterator: every document is empty");
                advance(it);
                continue;
            }
            empty_run = 0;
            if (left > room && room < min_piece) {   /* too little room for a useful piece */
                put_segment(b, r * S + col, NULL, room);
                break;
            }
            int64_t take = left < room ? left : room;
            const int32_t *tok = it->ds->tokens + it->ds->doc_start[it->order[it->st.cursor]] + it->st.offset;
            put_segment(b, r * S + col, tok, take);
            col += take;
            it->st.offset += take;
            if (it->st.offset == doc_len(it, it->st.cursor)) advance(it);
        }
    }
    it->st.step++;
    return LK_OK;
}
