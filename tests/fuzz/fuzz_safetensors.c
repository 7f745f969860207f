/* fuzz_safetensors.c — the safetensors reader (lk_st_open: header length, JSON header,
 * dtypes, shapes against spans, layout) on arbitrary files; every tensor of a file that
 * opens is read (f32 for float dtypes, its own dtype otherwise) and its metadata walked. */
#include "fuzz_util.h"
#include "llmkern/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, ".safetensors");
    if (!path) return 0;
    lk_st_file *f = NULL;
    lk_status s = lk_st_open(path, &f);
    fuzz_expect_status(s);
    if (s) { if (f) abort(); return 0; }
    for (size_t i = 0; i < lk_st_count(f); i++) {
        const lk_st_tensor *t = lk_st_at(f, i);
        if (lk_st_find(f, t->name) == NULL) abort();
        int isf = t->dtype == LK_F32 || t->dtype == LK_BF16 || t->dtype == LK_F16;
        lk_dtype dt = isf ? LK_F32 : t->dtype;
        if (dt == LK_DTYPE_COUNT || t->nbytes > (1 << 24)) continue;
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        void *buf = malloc((size_t)numel * lk_dtype_size(dt) + 1);
        lk_tensor x = lk_tensor_view(buf, dt, t->ndim ? t->ndim : 1, t->ndim ? t->shape : (int64_t[]){1});
        fuzz_expect_status(lk_st_read(f, t->name, &x));
        free(buf);
    }
    for (size_t i = 0; i < lk_st_metadata_count(f); i++) {
        const char *k, *v;
        lk_st_metadata_at(f, i, &k, &v);
        if (!k || !v || lk_st_metadata(f, k) == NULL) abort();
    }
    lk_st_close(f);
    return 0;
}
