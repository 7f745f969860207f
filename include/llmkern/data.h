/* data.h — training data: the embedded corpus, the byte-level tokenizer, text and token
 * files, and packed batches with the varlen metadata attention takes.
 *
 *   lk_dataset ds;  lk_corpus_generate(seed, LK_CORPUS_DEFAULT_DOCS, &ds);   // or a file
 *   lk_data_iter it; lk_data_iter_init(&it, &ds, B, S, seed);
 *   lk_batch b;     lk_batch_alloc(&b, B, S);
 *   lk_data_iter_next(&it, &b);                    // inputs, labels, positions, cu_seqlens
 *   lk_data_state st = lk_data_iter_state(&it);    // save with a checkpoint ...
 *   lk_data_iter_restore(&it, &st);                // ... and the next batches repeat exactly
 *
 * Every function returns an lk_status; on failure lk_last_error() says what and, for
 * files, which path. Nothing here is called on a training step's hot path except
 * lk_data_iter_next, which does not allocate. */
#ifndef LLMKERN_DATA_H
#define LLMKERN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- tokenizer: byte-level ------------------------------------------------------------
 * Ids 0..255 are the bytes; BOS, EOS and PAD follow. The vocabulary is rounded up to 320
 * (a multiple of 64, so embedding and LM-head rows tile evenly); ids 259..319 are never
 * produced and are rejected by decode. Every document is encoded as BOS bytes... EOS. */
#define LK_TOK_BOS 256
#define LK_TOK_EOS 257
#define LK_TOK_PAD 258
#define LK_TOK_VOCAB 320
#define LK_LABEL_IGNORE (-100)   /* = LK_CE_IGNORE_INDEX */

/* Encodes n bytes of text as [BOS] bytes [EOS] (the markers when with_markers) into out,
 * which has room for n + 2 ids. Returns the number of ids written. */
LK_API int64_t lk_tok_encode(const void *text, size_t n, int with_markers, int32_t *out);
/* Decodes ids to bytes into out (room for n bytes), skipping BOS, EOS and PAD; *len gets
 * the byte count. LK_EINVAL for an id outside the vocabulary or an unused id. */
LK_API lk_status lk_tok_decode(const int32_t *ids, int64_t n, char *out, size_t *len);

/* --- dataset: documents of token ids ---------------------------------------------------- */
typedef struct {
    int32_t *tokens;      /* all documents back to back (owned) */
    int64_t n_tokens;
    int64_t *doc_start;   /* [n_docs + 1]: document d is tokens[doc_start[d] .. doc_start[d+1]) */
    int64_t n_docs;
    int64_t vocab;        /* every id is below it */
} lk_dataset;

LK_API void lk_dataset_free(lk_dataset *ds);

/* The embedded corpus: n_docs documents (each BOS text EOS) generated from seed with the
 * counter-based generator, so document i depends on (seed, i) only: the same seed gives
 * the same bytes on every machine, and a corpus of n documents is a prefix of one of more.
 * Documents mix templated English-like sentences, arithmetic facts ("17 + 25 = 42"),
 * key: value records and simple counting/repeat patterns, tens to a few thousand bytes
 * long, so a tiny model's loss falls visibly within a hundred steps. */
#define LK_CORPUS_DEFAULT_DOCS 4096
LK_API lk_status lk_corpus_generate(uint64_t seed, int64_t n_docs, lk_dataset *out);
/* The text of document `index` (without markers) into buf (cap bytes, NUL-terminated,
 * truncated if short); *len gets the full length. */
LK_API lk_status lk_corpus_document(uint64_t seed, int64_t index, char *buf, size_t cap, size_t *len);

/* A user's text file: documents are separated by one or more blank lines (a line of only
 * spaces, tabs or '\r'); a document's lines keep their '\n'. Each is encoded BOS text EOS
 * with the byte tokenizer. LK_EIO naming the path when the file cannot be read or holds
 * no document. */
LK_API lk_status lk_dataset_load_text(const char *path, lk_dataset *out);

/* Pre-tokenized files ("LKTOK"), little-endian:
 *   bytes 0-4  "LKTOK"    5  version (1 or 2)    6  bytes per token: 2 (uint16) or 4 (uint32)
 *   7          0          8-15  count (uint64)
 *   version 1: 16...  count tokens
 *   version 2: 16-23 the tokenizer's vocabulary (uint64, every id below it), 24-31 its
 *              EOS id (int64, -1: none), 32...  count tokens   (scripts/tokenize.py)
 * Documents are the runs ending with eos_id (a trailing run without one is a document
 * too); eos_id -1 makes the whole file one document; LK_EOS_FROM_FILE takes a version-2
 * file's EOS id (none for version 1). Ids must be below vocab (the model's vocab_size).
 * LK_EIO naming the path for a missing file, wrong magic or version, a bad token size, a
 * version-2 header whose EOS id is not below its vocabulary, a length that disagrees with
 * count (truncated or trailing bytes), or an id >= vocab (naming model.vocab_size and the
 * file's vocabulary). LK_EINVAL for vocab outside 1..2^31 or eos_id < LK_EOS_FROM_FILE. */
#define LK_TOKFILE_HEADER_BYTES 16
#define LK_TOKFILE_META_HEADER_BYTES 32
#define LK_EOS_FROM_FILE (-2)
LK_API lk_status lk_dataset_load_tokens(const char *path, int64_t vocab, int64_t eos_id, lk_dataset *out);
/* Writes n ids (each < 2^(8*token_bytes)) as an LKTOK file, atomically (temporary file,
 * fsync, rename). LK_EINVAL for token_bytes not 2 or 4 or an id that does not fit;
 * LK_EIO naming the path for a failed write. */
LK_API lk_status lk_tokfile_write(const char *path, const int32_t *ids, int64_t n, int token_bytes);
/* The same as version 2, with the tokenizer's vocabulary and EOS id (-1: none) in the
 * header; every id must be below vocab (LK_EINVAL otherwise, or for an eos_id outside
 * -1..vocab-1, or a vocab that token_bytes cannot hold). */
LK_API lk_status lk_tokfile_write_meta(const char *path, const int32_t *ids, int64_t n, int token_bytes, int64_t vocab,
                                int64_t eos_id);

/* --- packed batches --------------------------------------------------------------------
 * B rows of S tokens, documents packed back to back. A row boundary is always a segment
 * boundary: a document longer than the room left is split, and the piece in the next row
 * restarts its positions at 0 (attention cannot see across rows). Room of fewer than
 * LK_PACK_MIN_PIECE tokens at a row's end is padded instead (PAD, label -100, a segment
 * of its own) so no piece is too short to learn from.
 * All arrays are row-major over the flattened B*S tokens. */
#define LK_PACK_MIN_PIECE 16
typedef struct {
    int64_t B, S;
    int64_t *input_ids;     /* [B*S] i64 */
    int64_t *labels;        /* [B*S] i64: input t+1 inside the same segment, else -100 */
    int64_t *position_ids;  /* [B*S] i64: 0 at every segment start */
    int32_t *doc_ids;       /* [B*S] i32: segment index over the flattened batch (block masks) */
    int32_t *cu_seqlens;    /* [n_segs + 1] i32 over the flattened B*S: 0, ..., B*S (varlen, B = 1) */
    int64_t n_segs;
    int64_t max_seqlen;     /* the longest segment */
    int64_t n_labels;       /* labels that are not -100 */
} lk_batch;

/* Allocates the arrays for B x S (cu_seqlens with room for B*S + 1). LK_EINVAL, LK_ENOMEM. */
LK_API lk_status lk_batch_alloc(lk_batch *b, int64_t B, int64_t S);
LK_API void lk_batch_free(lk_batch *b);

/* The iterator's whole state: save it with a checkpoint, restore it to resume. Epoch e
 * visits the documents in an order shuffled from (seed, e); cursor is the position in
 * that order and offset the tokens of that document already given out. */
typedef struct {
    uint64_t seed;
    int64_t epoch, cursor, offset;
    int64_t step;           /* batches given out so far */
} lk_data_state;

typedef struct {
    const lk_dataset *ds;   /* borrowed: must outlive the iterator */
    int64_t B, S;
    lk_data_state st;
    int64_t *order;         /* the current epoch's permutation (derived from seed, epoch) */
    int64_t order_epoch;
} lk_data_iter;

/* LK_EINVAL for B or S < 1, S*B beyond INT32_MAX, or a dataset with no tokens. */
LK_API lk_status lk_data_iter_init(lk_data_iter *it, const lk_dataset *ds, int64_t B, int64_t S, uint64_t seed);
/* Fills b (allocated for the iterator's B x S) with the next batch; epochs roll over. */
LK_API lk_status lk_data_iter_next(lk_data_iter *it, lk_batch *b);
LK_API lk_data_state lk_data_iter_state(const lk_data_iter *it);
/* LK_EINVAL when the state does not fit this dataset (cursor or offset out of range). */
LK_API lk_status lk_data_iter_restore(lk_data_iter *it, const lk_data_state *st);
LK_API void lk_data_iter_free(lk_data_iter *it);

#ifdef __cplusplus
}
#endif
#endif
