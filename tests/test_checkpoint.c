/* test_checkpoint.c — safetensors files and atomic writes: every dtype and odd shapes
 * (0-d, empty, 6-d) round trip bit-exact, names added out of order, a file built byte
 * by byte as the Python library writes it reads correctly and our writer reproduces
 * it byte for byte; malformed, truncated and oversized-header files are LK_EIO with a
 * message naming the file and the problem (every prefix of a good file, corrupted
 * headers too, never a crash: also run under ASan); an aborted or failing write leaves
 * the previous file byte-identical. Run: ./build/test_checkpoint. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmkern/llmkern.h"
#include "llmkern/checkpoint.h"
#include "model/atomic_file.h"

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* 8-byte length, header (padded with spaces to 8 when pad), then data. */
static size_t build_file(unsigned char *out, const char *header, int pad, const void *data, size_t data_len) {
    size_t n = strlen(header), padded = pad ? (n + 7) / 8 * 8 : n;
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, header, n);
    memset(out + 8 + n, ' ', padded - n);
    if (data_len) memcpy(out + 8 + padded, data, data_len);
    return 8 + padded + data_len;
}

static void expect_open_fails(const char *path, const char *problem) {
    lk_st_file *f = (lk_st_file *)&f;
    lk_status s = lk_st_open(path, &f);
    print_message("  %-14s -> %s\n", problem, lk_last_error());
    assert_int_equal(s, LK_EIO);
    assert_null(f);
    assert_non_null(strstr(lk_last_error(), path));
    assert_non_null(strstr(lk_last_error(), problem));
}

static int setup(void **state) {
    lk_init();
    snprintf(dir, sizeof dir, "/tmp/lk_ckpt_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

/* The tensors of the round trip: every dtype, a scalar, empties, 6-d, odd sizes. */
typedef struct { const char *name; lk_dtype dt; int ndim; int64_t shape[6]; } spec;
static const spec specs[] = {
    {"z.f32", LK_F32, 2, {3, 5}},          {"a.bf16", LK_BF16, 1, {7}},
    {"m.f16", LK_F16, 3, {2, 3, 1}},       {"scalar.i32", LK_I32, 0, {0}},
    {"b.i64", LK_I64, 1, {3}},             {"empty.bool", LK_BOOL, 1, {0}},
    {"empty.bf16", LK_BF16, 3, {2, 0, 3}}, {"six.f32", LK_F32, 6, {1, 2, 1, 3, 1, 1}},
    {"mask.bool", LK_BOOL, 2, {3, 3}},     {"odd.f16", LK_F16, 1, {1}},
};
#define N_SPECS (sizeof specs / sizeof *specs)

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131 + seed * 17 + 7) & 0xff);
}

static void write_specs(const char *path, unsigned char **bufs, lk_status want) {
    lk_st_writer *w;
    assert_int_equal(lk_st_writer_begin(path, &w), LK_OK);
    for (size_t i = 0; i < N_SPECS; i++) {
        lk_tensor t = lk_tensor_view(bufs[i], specs[i].dt, specs[i].ndim, specs[i].shape);
        assert_int_equal(lk_st_writer_add(w, specs[i].name, &t), LK_OK);
    }
    assert_int_equal(lk_st_writer_set_metadata(w, "step", "11"), LK_OK);
    assert_int_equal(lk_st_writer_set_metadata(w, "step", "12"), LK_OK);   /* replaces */
    assert_int_equal(lk_st_writer_commit(w), want);
}

static void test_round_trip(void **state) {
    unsigned char *bufs[N_SPECS];
    for (size_t i = 0; i < N_SPECS; i++) {
        lk_tensor t = lk_tensor_view(NULL, specs[i].dt, specs[i].ndim, specs[i].shape);
        size_t n = lk_tensor_bytes(&t);
        bufs[i] = malloc(n + 1);
        fill(bufs[i], n, (unsigned)i);
        if (specs[i].dt == LK_BOOL) for (size_t k = 0; k < n; k++) bufs[i][k] &= 1;
    }
    const char *path = path_of("rt.safetensors");
    write_specs(path, bufs, LK_OK);
    lk_st_file *f;
    assert_int_equal(lk_st_open(path, &f), LK_OK);
    assert_int_equal(lk_st_count(f), N_SPECS);
    assert_string_equal(lk_st_metadata(f, "format"), "pt");
    assert_string_equal(lk_st_metadata(f, "step"), "12");
    assert_int_equal(lk_st_metadata_count(f), 2);
    for (size_t i = 0; i < N_SPECS; i++) {
        const lk_st_tensor *t = lk_st_find(f, specs[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, specs[i].dt);
        assert_string_equal(t->st_dtype, lk_st_dtype_name(specs[i].dt));
        assert_int_equal(t->ndim, specs[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) { assert_int_equal(t->shape[d], specs[i].shape[d]); numel *= t->shape[d]; }
        assert_int_equal(t->nbytes, (size_t)numel * lk_dtype_size(specs[i].dt));
        assert_int_equal((uintptr_t)t->data % lk_dtype_size(specs[i].dt), 0);   /* aligned by the layout */
        if (t->nbytes) assert_memory_equal(t->data, bufs[i], t->nbytes);
    }
    assert_null(lk_st_find(f, "nope"));
    /* Data order: widest dtype first (I64, F32, I32, BF16, F16, BOOL), then name. */
    static const char *const order[] = {"b.i64", "six.f32", "z.f32", "scalar.i32", "a.bf16", "empty.bf16",
                                        "m.f16", "odd.f16", "empty.bool", "mask.bool"};
    for (size_t i = 0; i < N_SPECS; i++) assert_string_equal(lk_st_at(f, i)->name, order[i]);
    lk_st_close(f);
    size_t n1, n2;
    unsigned char *first = read_bytes(path, &n1);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | first[i];
    assert_int_equal(hlen % 8, 0);
    write_specs(path, bufs, LK_OK);   /* the same tensors give the same bytes */
    unsigned char *second = read_bytes(path, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(first, second, n1);
    free(first);
    free(second);
    for (size_t i = 0; i < N_SPECS; i++) free(bufs[i]);
}

/* As safetensors.torch.save_file({"a": f32 [2], "b": bf16 [1, 2]}) writes it. */
static const char known_header[] =
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}";

static void test_known_good_file(void **state) {
    unsigned char data[12], file[256];
    float a[2] = {1.0f, -2.5f};
    uint16_t b[2] = {0x3f80, 0x4040};   /* bf16 1.0, 3.0 */
    memcpy(data, a, 8);
    memcpy(data + 8, b, 4);
    size_t n = build_file(file, known_header, 1, data, sizeof data);
    assert_int_equal((n - 12) % 8, 0);
    const char *path = path_of("known.safetensors");
    write_bytes(path, file, n);
    lk_st_file *f;
    assert_int_equal(lk_st_open(path, &f), LK_OK);
    const lk_st_tensor *ta = lk_st_find(f, "a"), *tb = lk_st_find(f, "b");
    assert_true(ta && tb && ta->dtype == LK_F32 && tb->dtype == LK_BF16 && tb->ndim == 2 && tb->shape[1] == 2);
    assert_memory_equal(ta->data, a, 8);
    float got[2] = {0, 0};
    lk_tensor dst = lk_tensor_2d(got, LK_F32, 1, 2);
    assert_int_equal(lk_st_read(f, "b", &dst), LK_OK);   /* bf16 -> f32 */
    assert_true(got[0] == 1.0f && got[1] == 3.0f);
    uint16_t gb[2];
    lk_tensor dstb = lk_tensor_1d(gb, LK_BF16, 2);
    assert_int_equal(lk_st_read(f, "a", &dstb), LK_OK);   /* f32 -> bf16 */
    assert_true(gb[0] == 0x3f80 && gb[1] == 0xc020);
    /* Errors leave dst as it was. */
    float sentinel[3] = {7, 7, 7};
    lk_tensor wrong = lk_tensor_1d(sentinel, LK_F32, 3);
    assert_int_equal(lk_st_read(f, "a", &wrong), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "'a'"));
    int32_t ints[2] = {7, 7};
    lk_tensor wrong_dt = lk_tensor_1d(ints, LK_I32, 2);
    assert_int_equal(lk_st_read(f, "a", &wrong_dt), LK_EDTYPE);
    assert_int_equal(lk_st_read(f, "c", &dst), LK_EIO);
    assert_non_null(strstr(lk_last_error(), "no tensor named 'c'"));
    assert_true(sentinel[0] == 7 && sentinel[2] == 7 && ints[0] == 7 && ints[1] == 7);
    lk_st_close(f);
    /* Our writer, given the same tensors in the other order, writes the same bytes. */
    const char *ours = path_of("ours.safetensors");
    lk_st_writer *w;
    assert_int_equal(lk_st_writer_begin(ours, &w), LK_OK);
    lk_tensor tb2 = lk_tensor_2d(b, LK_BF16, 1, 2), ta2 = lk_tensor_1d(a, LK_F32, 2);
    assert_int_equal(lk_st_writer_add(w, "b", &tb2), LK_OK);
    assert_int_equal(lk_st_writer_add(w, "a", &ta2), LK_OK);
    assert_int_equal(lk_st_writer_commit(w), LK_OK);
    size_t m;
    unsigned char *mine = read_bytes(ours, &m);
    assert_int_equal(m, n);
    assert_memory_equal(mine, file, n);
    free(mine);
}

typedef struct { const char *label, *header; size_t data_len; const char *problem; } bad_case;

static void test_malformed(void **state) {
    static const bad_case cases[] = {
        {"bad json", "{\"a\":{\"dtype\":\"F32\",", 0, "not valid JSON"},
        {"not object", "[1, 2]", 0, "start with '{'"},
        {"unknown dtype", "{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype 'Q4'"},
        {"out of range", "{\"a\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}", 8, "outside the data section"},
        {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "gap of 4 bytes"},
        {"size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "shape/size mismatch"},
        {"huge shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
         "shape/size mismatch"},
        {"duplicate", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate tensor name 'a'"},
        {"dup in tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': duplicate key 'dtype'"},
        {"dup metadata", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "__metadata__: duplicate key 'k'"},
        {"two metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key '__metadata__'"},
        {"dup long name", "{\"model.layers.0.\\\"q\\\\\\\".weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"model.layers.0.\\\"q\\\\\\\".weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "duplicate tensor name 'model.layers.0.\"q\\\".weight'"},
        {"nul", "{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\\u0000 in a string"},
        {"non-utf8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid UTF-8"},
        {"overlong utf8", "{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not valid UTF-8"},
        {"trailing data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "cover 8"},
        {"reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "end before"},
        {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"float dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"no offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"},
        {"3 offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 4, "data_offsets"},
        {"7 dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "7 dimensions"},
        {"bad metadata", "{\"__metadata__\":{\"format\":1}}", 0, "__metadata__"},
        {"info not obj", "{\"a\":[1]}", 0, "expected an object"},
        {"deep", "{\"__metadata__\":{},\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                 "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 0, "nesting"},
        {"lone surrogate", "{\"\\udc00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "surrogate"},
        {"garbage after", "{} x", 0, "after the JSON value"},
    };
    unsigned char file[1024], data[64] = {0};
    const char *path = path_of("bad.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = build_file(file, cases[i].header, 1, data, cases[i].data_len);
        write_bytes(path, file, n);
        expect_open_fails(path, cases[i].problem);
    }
    /* The header length against the file and the limit. */
    write_bytes(path, file, 0);
    expect_open_fails(path, "truncated: 0 bytes");
    write_bytes(path, "\x10\0\0", 3);
    expect_open_fails(path, "truncated: 3 bytes");
    size_t n = build_file(file, known_header, 1, data, 12);
    file[1] = 0x10;   /* 4 KiB more header than the file holds */
    write_bytes(path, file, n);
    expect_open_fails(path, "runs past the end of the file");
    memset(file, 0, 8);
    file[3] = 0x10;   /* 256 MiB > the 100 MB limit */
    write_bytes(path, file, n);
    expect_open_fails(path, "over the limit");
    expect_open_fails(path_of("missing.safetensors"), "cannot open");
    expect_open_fails(dir, "not a regular file");
}

/* Every strict prefix of a good file fails cleanly; corrupting any header byte either
 * still parses or fails cleanly (ASan and UBSan watch for the rest). */
static void test_truncations_and_corruption(void **state) {
    unsigned char data[12] = {0}, file[256];
    size_t n = build_file(file, known_header, 1, data, sizeof data);
    const char *path = path_of("cut.safetensors");
    for (size_t k = 0; k < n; k++) {
        write_bytes(path, file, k);
        lk_st_file *f = NULL;
        assert_int_equal(lk_st_open(path, &f), LK_EIO);
        assert_null(f);
        assert_non_null(strstr(lk_last_error(), path));
    }
    static const unsigned char junk[] = {0x00, 0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x31, 0x80, 0xff};
    int failed = 0, opened = 0;
    for (size_t k = 0; k < n - sizeof data; k++)
        for (size_t j = 0; j < sizeof junk; j++) {
            unsigned char copy[256];
            memcpy(copy, file, n);
            copy[k] = junk[j];
            write_bytes(path, copy, n);
            lk_st_file *f = NULL;
            lk_status s = lk_st_open(path, &f);
            assert_true(s == LK_OK || s == LK_EIO);
            if (s == LK_OK) {
                for (size_t i = 0; i < lk_st_count(f); i++) assert_true(lk_st_at(f, i)->nbytes <= sizeof data);
                opened++;
            } else failed++;
            lk_st_close(f);
        }
    print_message("  corrupted headers: %d rejected, %d still valid\n", failed, opened);
    assert_true(failed > 0);
}

static void test_writer_errors(void **state) {
    const char *path = path_of("w.safetensors");
    unlink(path);
    lk_st_writer *w;
    float x[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(lk_st_writer_begin(path, &w), LK_OK);
    lk_tensor t = lk_tensor_2d(x, LK_F32, 2, 3), none = lk_tensor_1d(NULL, LK_F32, 3), strided = t;
    strided.stride[0] = 4;
    assert_int_equal(lk_st_writer_add(w, "n", &none), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "data is NULL"));
    assert_int_equal(lk_st_writer_add(w, "s", &strided), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "contiguous"));
    assert_int_equal(lk_st_writer_add(w, "__metadata__", &t), LK_EINVAL);
    assert_int_equal(lk_st_writer_add(w, "", &t), LK_EINVAL);
    int32_t ints[2] = {1, 2};
    lk_tensor ti = lk_tensor_1d(ints, LK_I32, 2);
    assert_int_equal(lk_st_writer_add_as(w, "i", &ti, LK_BF16), LK_EDTYPE);
    assert_int_equal(lk_st_writer_add(w, "x", &t), LK_OK);
    assert_int_equal(lk_st_writer_add_as(w, "x", &t, LK_BF16), LK_OK);   /* a duplicate, found at commit */
    assert_int_equal(lk_st_writer_commit(w), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "'x' added twice"));
    assert_int_equal(access(path, F_OK), -1);    /* nothing written */
    /* add_as owns its converted copy: the source may change before commit. */
    assert_int_equal(lk_st_writer_begin(path, &w), LK_OK);
    assert_int_equal(lk_st_writer_add_as(w, "x", &t, LK_BF16), LK_OK);
    x[0] = 100;
    assert_int_equal(lk_st_writer_commit(w), LK_OK);
    lk_st_file *f;
    assert_int_equal(lk_st_open(path, &f), LK_OK);
    const lk_st_tensor *r = lk_st_find(f, "x");
    assert_true(r->dtype == LK_BF16 && ((const uint16_t *)r->data)[0] == 0x3f80 && ((const uint16_t *)r->data)[5] == 0x40c0);
    lk_st_close(f);
}

static void write_one(const char *path, float v, lk_status want) {
    lk_st_writer *w;
    float x[4] = {v, v, v, v};
    lk_tensor t = lk_tensor_1d(x, LK_F32, 4);
    assert_int_equal(lk_st_writer_begin(path, &w), LK_OK);
    assert_int_equal(lk_st_writer_add(w, "w", &t), LK_OK);
    assert_int_equal(lk_st_writer_commit(w), want);
}

static void expect_unchanged(const char *path, const unsigned char *before, size_t n) {
    size_t m;
    unsigned char *now = read_bytes(path, &m);
    assert_int_equal(m, n);
    assert_memory_equal(now, before, n);
    free(now);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct stat st;
    assert_true(stat(tmp, &st) != 0 || S_ISDIR(st.st_mode));   /* no stray tmp file */
}

static void test_atomic_write(void **state) {
    const char *path = path_of("ckpt.safetensors");
    write_one(path, 1.0f, LK_OK);
    size_t n;
    unsigned char *v1 = read_bytes(path, &n);
    /* Abort: nothing changes. */
    lk_st_writer *w;
    float y[2] = {9, 9};
    lk_tensor t = lk_tensor_1d(y, LK_F32, 2);
    assert_int_equal(lk_st_writer_begin(path, &w), LK_OK);
    assert_int_equal(lk_st_writer_add(w, "w", &t), LK_OK);
    lk_st_writer_abort(w);
    expect_unchanged(path, v1, n);
    /* A failure after the tmp file is written and synced, before the rename. */
    lk_atomic_file_fail_next_commit();
    write_one(path, 2.0f, LK_EIO);
    assert_non_null(strstr(lk_last_error(), "before the rename"));
    expect_unchanged(path, v1, n);
    /* A failure creating the tmp file (a directory is in its way). */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(mkdir(tmp, 0755), 0);
    write_one(path, 3.0f, LK_EIO);
    assert_non_null(strstr(lk_last_error(), "cannot create"));
    expect_unchanged(path, v1, n);
    rmdir(tmp);
    /* And a write that succeeds replaces it. */
    write_one(path, 4.0f, LK_OK);
    lk_st_file *f;
    assert_int_equal(lk_st_open(path, &f), LK_OK);
    assert_true(((const float *)lk_st_find(f, "w")->data)[3] == 4.0f);
    lk_st_close(f);
    assert_int_equal(access(tmp, F_OK), -1);
    write_one(path_of("no/such/dir/x.safetensors"), 1.0f, LK_EIO);
    /* The generic atomic file: a failed commit keeps the old text. */
    const char *txt = path_of("state.bin");
    assert_int_equal(lk_write_file_atomic(txt, "old", 3), LK_OK);
    lk_atomic_file *af;
    assert_int_equal(lk_atomic_file_begin(txt, &af), LK_OK);
    assert_int_equal(lk_atomic_file_write(af, "new!", 4), LK_OK);
    lk_atomic_file_fail_next_commit();
    assert_int_equal(lk_atomic_file_commit(af), LK_EIO);
    expect_unchanged(txt, (const unsigned char *)"old", 3);
    free(v1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_known_good_file),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncations_and_corruption),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_atomic_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
