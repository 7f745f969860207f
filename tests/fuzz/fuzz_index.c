/* fuzz_index.c — a sharded checkpoint's model.safetensors.index.json (checkpoint.h:
 * lk_st_dir_open): the input is the index, beside two valid shards written once per
 * process (tensors a and b in model-00001-of-00002, c in model-00002-of-00002), so the
 * mutations reach the checks of the weight_map against the shards; what opens is walked
 * (every tensor by index and by name). */
#include <sys/stat.h>
#include "fuzz_util.h"
#include "llmkern/checkpoint.h"

static char dir[128];

static void write_shard(const char *name, const char *const *tensors, int n) {
    static float data[4] = {1, 2, 3, 4};
    char p[200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    lk_st_writer *w;
    if (lk_st_writer_begin(p, &w) != LK_OK) abort();
    for (int i = 0; i < n; i++) {
        lk_tensor t = lk_tensor_1d(data, LK_F32, 4);
        if (lk_st_writer_add(w, tensors[i], &t) != LK_OK) abort();
    }
    if (lk_st_writer_commit(w) != LK_OK) abort();
}

static void cleanup(void) {
    static const char *const files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                        "model.safetensors.index.json"};
    char p[200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/llmkern-fuzz-index-%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                 (int)getpid());
        if (mkdir(dir, 0777) != 0) abort();
        atexit(cleanup);
        static const char *const one[] = {"a", "b"}, *const two[] = {"c"};
        write_shard("model-00001-of-00002.safetensors", one, 2);
        write_shard("model-00002-of-00002.safetensors", two, 1);
    }
    char p[200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f) return 0;
    size_t n = size ? fwrite(data, 1, size, f) : 0;
    if (fclose(f) != 0 || n != size) return 0;
    lk_st_dir *d;
    lk_status s = lk_st_dir_open(dir, &d);
    fuzz_expect_status(s);
    if (s) return 0;
    for (size_t i = 0; i < lk_st_dir_count(d); i++) {
        const char *file;
        const lk_st_tensor *t = lk_st_dir_at(d, i, &file);
        if (!t || !file || lk_st_dir_find(d, t->name, NULL) == NULL) abort();
    }
    lk_st_dir_close(d);
    return 0;
}
