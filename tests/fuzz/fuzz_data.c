/* fuzz_data.c — the training data files: LKTOK token files (lk_dataset_load_tokens, the
 * vocabulary and eos id taken from the input's first bytes) and text files
 * (lk_dataset_load_text), then an iterator over what loaded: a few packed batches. */
#include "fuzz_util.h"

static void batches(const lk_dataset *ds) {
    lk_data_iter it;
    lk_batch b;
    if (lk_data_iter_init(&it, ds, 2, 16, 7) != LK_OK) abort();
    if (lk_batch_alloc(&b, 2, 16) != LK_OK) abort();
    for (int i = 0; i < 3; i++) fuzz_expect_status(lk_data_iter_next(&it, &b));
    lk_batch_free(&b);
    lk_data_iter_free(&it);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    int64_t vocab = 1 + (int64_t)(data[0] | data[1] << 8) * 4, eos = (int64_t)data[2] - 2;   /* -2: LK_EOS_FROM_FILE */
    const char *path = fuzz_file(data + 3, size - 3, ".lktok");
    if (!path) return 0;
    lk_dataset ds;
    lk_status s = lk_dataset_load_tokens(path, vocab, eos, &ds);
    fuzz_expect_status(s);
    if (!s) { batches(&ds); lk_dataset_free(&ds); }
    s = lk_dataset_load_text(path, &ds);
    fuzz_expect_status(s);
    if (!s) { batches(&ds); lk_dataset_free(&ds); }
    return 0;
}
