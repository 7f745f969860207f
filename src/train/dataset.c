/* dataset.c — documents from files: a user's text file (blank-line separated) and the
 * pre-tokenized LKTOK format, reader and atomic writers (format in include/llmkern/data.h:
 * version 1, and version 2 whose header adds the tokenizer's vocabulary and EOS id, as
 * scripts/tokenize.py writes it).
 * A bad file is an LK_EIO naming the path, never a crash: every length is checked
 * against the file's size before it is used. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/checked.h"
#include "llmkern/data.h"

#define TOKFILE_VERSION 1
#define TOKFILE_VERSION_META 2

void lk_dataset_free(lk_dataset *ds) {
    if (!ds) return;
    free(ds->tokens);
    free(ds->doc_start);
    memset(ds, 0, sizeof *ds);
}

/* The whole file into a malloc'd buffer (one spare byte, NUL). */
static lk_status read_file(const char *path, const char *what, unsigned char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    if (!path) return lk_error(LK_EINVAL, "%s: path: expected a file name, got NULL", what);
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_EIO, "%s: cannot open '%s': %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return lk_error(LK_EIO, "%s: cannot read '%s': not a regular file", what, path);
    }
    long end = (long)st.st_size;
    unsigned char *p = malloc((size_t)end + 1);
    if (!p) { fclose(f); return lk_error(LK_ENOMEM, "%s: '%s': %ld bytes do not fit in memory", what, path, end); }
    size_t got = fread(p, 1, (size_t)end, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)end) {
        free(p);
        return lk_error(LK_EIO, "%s: cannot read '%s': short read (%zu of %ld bytes)", what, path, got, end);
    }
    p[end] = 0;
    *data = p;
    *size = (size_t)end;
    return LK_OK;
}

static int blank_line(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* Room in out for n tokens in at most docs documents (doc_start has docs + 1 entries),
 * its size checked and refused when it cannot fit in memory; what ("text file") and
 * path name the file in errors. */
static lk_status alloc_tokens(lk_dataset *out, const char *what, const char *path, int64_t n, int64_t docs) {
    char label[2][48];
    size_t tok_bytes, start_bytes;
    snprintf(label[0], sizeof label[0], "%s: tokens", what);
    snprintf(label[1], sizeof label[1], "%s: documents", what);
    lk_status s;
    if ((s = lk_checked_bytes(label[0], n, sizeof *out->tokens, &tok_bytes)) ||
        (s = lk_checked_bytes(label[1], docs + 1, sizeof *out->doc_start, &start_bytes)) ||
        (s = lk_check_fits_memory(path, (uint64_t)tok_bytes + start_bytes)))
        return s;
    out->tokens = malloc(tok_bytes);
    out->doc_start = malloc(start_bytes);
    if (!out->tokens || !out->doc_start) {
        lk_dataset_free(out);
        return lk_error(LK_ENOMEM, "%s: '%s': %lld tokens do not fit in memory", what, path, (long long)n);
    }
    return LK_OK;
}

lk_status lk_dataset_load_text(const char *path, lk_dataset *out) {
    memset(out, 0, sizeof *out);
    unsigned char *text;
    size_t size;
    lk_status s = read_file(path, "text file", &text, &size);
    if (s != LK_OK) return s;
    /* Upper bounds: every byte a token plus two markers per document; a document needs a
     * non-blank line and the blank one after it, so there are at most size/2 + 1. */
    size_t max_docs = size / 2 + 1;
    if ((s = alloc_tokens(out, "text file", path, (int64_t)(size + 2 * max_docs), (int64_t)max_docs))) {
        free(text);
        return s;
    }
    int64_t n = 0, docs = 0;
    size_t doc_begin = 0, doc_end = 0;   /* the current document's bytes; empty when equal */
    out->doc_start[0] = 0;
    for (size_t i = 0; i <= size;) {
        size_t eol = i;
        while (eol < size && text[eol] != '\n') eol++;
        size_t next = eol < size ? eol + 1 : size + 1;
        int last = next > size;
        if (!blank_line(text + i, eol - i)) {
            if (doc_end == doc_begin) doc_begin = i;
            doc_end = eol < size ? eol + 1 : eol;   /* keep the line's '\n' */
        }
        if ((blank_line(text + i, eol - i) || last) && doc_end > doc_begin) {
            n += lk_tok_encode(text + doc_begin, doc_end - doc_begin, 1, out->tokens + n);
            out->doc_start[++docs] = n;
            doc_begin = doc_end = 0;
        }
        i = next;
    }
    free(text);
    if (docs == 0) {
        lk_dataset_free(out);
        return lk_error(LK_EIO, "text file: '%s': no document (the file is empty or only blank lines)", path);
    }
    out->n_tokens = n;
    out->n_docs = docs;
    out->vocab = LK_TOK_VOCAB;
    return LK_OK;
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

lk_status lk_dataset_load_tokens(const char *path, int64_t vocab, int64_t eos_id, lk_dataset *out) {
    memset(out, 0, sizeof *out);
    if (vocab < 1 || vocab > ((int64_t)1 << 31))
        return lk_error(LK_EINVAL, "token file: vocab: expected 1..2^31, got %lld", (long long)vocab);
    if (eos_id < LK_EOS_FROM_FILE)
        return lk_error(LK_EINVAL, "token file: eos_id: expected an id, -1 (none) or LK_EOS_FROM_FILE, got %lld",
                        (long long)eos_id);
    unsigned char *p;
    size_t size;
    lk_status s = read_file(path, "token file", &p, &size);
    if (s != LK_OK) return s;
    const char *bad = NULL;
    char why[200];
    uint64_t count = 0, file_vocab = 0;
    int64_t file_eos = -1;
    int tb = 0, hdr = LK_TOKFILE_HEADER_BYTES;
    if (size < LK_TOKFILE_HEADER_BYTES) {
        snprintf(why, sizeof why, "%zu bytes, shorter than the %d-byte header", size, LK_TOKFILE_HEADER_BYTES);
        bad = why;
    } else if (memcmp(p, "LKTOK", 5) != 0) {
        bad = "wrong magic (expected \"LKTOK\")";
    } else if (p[5] != TOKFILE_VERSION && p[5] != TOKFILE_VERSION_META) {
        snprintf(why, sizeof why, "version %u, expected %d or %d", p[5], TOKFILE_VERSION, TOKFILE_VERSION_META);
        bad = why;
    } else if (p[5] == TOKFILE_VERSION_META && size < LK_TOKFILE_META_HEADER_BYTES) {
        snprintf(why, sizeof why, "%zu bytes, shorter than the version-2 header (%d bytes)", size,
                 LK_TOKFILE_META_HEADER_BYTES);
        bad = why;
    } else if (p[6] != 2 && p[6] != 4) {
        snprintf(why, sizeof why, "token size %u bytes, expected 2 (uint16) or 4 (uint32)", p[6]);
        bad = why;
    } else {
        tb = p[6];
        count = le64(p + 8);
        if (p[5] == TOKFILE_VERSION_META) {
            hdr = LK_TOKFILE_META_HEADER_BYTES;
            file_vocab = le64(p + 16);
            file_eos = (int64_t)le64(p + 24);
        }
        uint64_t have = (size - (size_t)hdr) / (uint64_t)tb;
        if (hdr == LK_TOKFILE_META_HEADER_BYTES && (file_vocab < 1 || file_vocab > ((uint64_t)1 << 32))) {
            snprintf(why, sizeof why, "the header's vocabulary is %llu ids, expected 1..2^32",
                     (unsigned long long)file_vocab);
            bad = why;
        } else if (hdr == LK_TOKFILE_META_HEADER_BYTES && (file_eos < -1 || file_eos >= (int64_t)file_vocab)) {
            snprintf(why, sizeof why, "the header's EOS id is %lld, expected -1 (none) or below its vocabulary (%llu)",
                     (long long)file_eos, (unsigned long long)file_vocab);
            bad = why;
        } else if (count != have || (size - (size_t)hdr) % (uint64_t)tb != 0) {
            snprintf(why, sizeof why, "header says %llu tokens, the file holds %zu bytes after the header (%s)",
                     (unsigned long long)count, size - (size_t)hdr, count > have ? "truncated" : "trailing bytes");
            bad = why;
        } else if (count == 0) {
            bad = "no tokens";
        }
    }
    if (bad) {
        free(p);
        return lk_error(LK_EIO, "token file: '%s': %s", path, bad);
    }
    if (eos_id == LK_EOS_FROM_FILE) eos_id = file_eos;   /* version 1: none, the file one document */
    /* count <= the file's size: the sizes cannot wrap, checked all the same */
    if ((s = alloc_tokens(out, "token file", path, (int64_t)count, (int64_t)count))) {
        free(p);
        return s;
    }
    const unsigned char *q = p + hdr;
    int64_t docs = 0;
    out->doc_start[0] = 0;
    for (uint64_t i = 0; i < count; i++, q += tb) {
        uint32_t id = tb == 2 ? (uint32_t)(q[0] | q[1] << 8)
                              : (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        if ((int64_t)id >= vocab) {
            char tok[96] = "";
            if (file_vocab) snprintf(tok, sizeof tok, "; the file's tokenizer has %llu ids", (unsigned long long)file_vocab);
            free(p);
            lk_dataset_free(out);
            return lk_error(LK_EIO, "token file: '%s': token %llu is %u, beyond the model's vocabulary (model.vocab_size "
                            "%lld: every id must be below it%s)", path, (unsigned long long)i, id, (long long)vocab, tok);
        }
        out->tokens[i] = (int32_t)id;
        if ((int64_t)id == eos_id) out->doc_start[++docs] = (int64_t)i + 1;
    }
    if (docs == 0 || out->doc_start[docs] != (int64_t)count) out->doc_start[++docs] = (int64_t)count;
    free(p);
    out->n_tokens = (int64_t)count;
    out->n_docs = docs;
    out->vocab = vocab;
    return LK_OK;
}

/* Both versions: meta 0 writes version 1 (vocab and eos_id unused). */
static lk_status tokfile_write(const char *path, const int32_t *ids, int64_t n, int token_bytes, int meta,
                               int64_t vocab, int64_t eos_id) {
    if (!path) return lk_error(LK_EINVAL, "token file: path: expected a file name, got NULL");
    if (token_bytes != 2 && token_bytes != 4)
        return lk_error(LK_EINVAL, "token file: token_bytes: expected 2 or 4, got %d", token_bytes);
    if (n < 0 || (n > 0 && !ids))
        return lk_error(LK_EINVAL, "token file: ids: expected %lld ids, got %s", (long long)n, ids ? "n < 0" : "NULL");
    int64_t limit = token_bytes == 2 ? 65536 : (int64_t)1 << 32;
    if (meta && (vocab < 1 || vocab > limit))
        return lk_error(LK_EINVAL, "token file: vocab: expected 1..%lld for %d-byte tokens, got %lld", (long long)limit,
                        token_bytes, (long long)vocab);
    if (meta && (eos_id < -1 || eos_id >= vocab))
        return lk_error(LK_EINVAL, "token file: eos_id: expected -1 (none) or an id below vocab %lld, got %lld",
                        (long long)vocab, (long long)eos_id);
    if (meta) limit = vocab;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit)
            return lk_error(LK_EINVAL, "token file: ids[%lld]: expected 0..%lld%s, got %d", (long long)i,
                            (long long)limit - 1, meta ? " (below vocab)" : token_bytes == 2 ? " for 2-byte tokens" :
                            " for 4-byte tokens", (int)ids[i]);
    unsigned char hdr[LK_TOKFILE_META_HEADER_BYTES] = {'L', 'K', 'T', 'O', 'K',
        (unsigned char)(meta ? TOKFILE_VERSION_META : TOKFILE_VERSION), (unsigned char)token_bytes, 0};
    size_t hdr_bytes = meta ? LK_TOKFILE_META_HEADER_BYTES : LK_TOKFILE_HEADER_BYTES;
    for (int i = 0; i < 8; i++) {
        hdr[8 + i] = (unsigned char)((uint64_t)n >> (8 * i));
        hdr[16 + i] = (unsigned char)((uint64_t)vocab >> (8 * i));
        hdr[24 + i] = (unsigned char)((uint64_t)eos_id >> (8 * i));
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return lk_error(LK_ENOMEM, "token file: out of memory");
    snprintf(tmp, plen + 16, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        lk_status s = lk_error(LK_EIO, "token file: cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    int ok = fwrite(hdr, 1, hdr_bytes, f) == hdr_bytes;
    unsigned char buf[4096];
    for (int64_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; i < n && k + 4 <= sizeof buf; i++)
            for (int b = 0; b < token_bytes; b++) buf[k++] = (unsigned char)((uint32_t)ids[i] >> (8 * b));
        ok = fwrite(buf, 1, k, f) == k;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        lk_status s = lk_error(LK_EIO, "token file: cannot write '%s': %s", path, strerror(errno));
        remove(tmp);
        free(tmp);
        return s;
    }
    free(tmp);
    return LK_OK;
}

lk_status lk_tokfile_write(const char *path, const int32_t *ids, int64_t n, int token_bytes) {
    return tokfile_write(path, ids, n, token_bytes, 0, 0, 0);
}

lk_status lk_tokfile_write_meta(const char *path, const int32_t *ids, int64_t n, int token_bytes, int64_t vocab,
                                int64_t eos_id) {
    return tokfile_write(path, ids, n, token_bytes, 1, vocab, eos_id);
}
