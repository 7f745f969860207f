/* tokenizer.c — the byte-level tokenizer: a byte is its own id, BOS/EOS/PAD sit above
 * them (include/llmkern/data.h). Used by the corpus, the text loader and decode for
 * samples; it needs no table, so any text round-trips exactly. */
#include "llmkern/data.h"

int64_t lk_tok_encode(const void *text, size_t n, int with_markers, int32_t *out) {
    const unsigned char *p = text;
    int64_t k = 0;
    if (with_markers) out[k++] = LK_TOK_BOS;
    for (size_t i = 0; i < n; i++) out[k++] = p[i];
    if (with_markers) out[k++] = LK_TOK_EOS;
    return k;
}

lk_status lk_tok_decode(const int32_t *ids, int64_t n, char *out, size_t *len) {
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id >= 0 && id < 256) {
            out[k++] = (char)(unsigned char)id;
        } else if (id != LK_TOK_BOS && id != LK_TOK_EOS && id != LK_TOK_PAD) {
            if (len) *len = k;
            return lk_error(LK_EINVAL, "tokenizer: ids[%lld]: expected a byte (0..255) or BOS/EOS/PAD "
                            "(%d..%d), got %d", (long long)i, LK_TOK_BOS, LK_TOK_PAD, (int)id);
        }
    }
    if (len) *len = k;
    return LK_OK;
}
