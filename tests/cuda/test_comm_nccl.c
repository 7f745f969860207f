/* test_comm_nccl.c (GPU) — the NCCL communicator on one GPU: a world of 1 bootstrapped
 * from lk_comm_single, every collective on device buffers (all_reduce f32/f64/i64,
 * all_gather, reduce_scatter, broadcast, all_to_all with byte splits and offsets,
 * barrier, a split communicator), the non-blocking all_reduce (several in flight, test,
 * wait), the collectives queued on a caller's stream (all_gather_on, reduce_scatter_on
 * f32/bf16, all_to_all_on; eager and captured in a CUDA graph), and bad arguments refused. Each output sits between NaN-poisoned guards that
 * must survive, and equals what the host computes from the same random inputs, bit for
 * bit (one rank: nothing is rounded). Built only with NCCL; skipped (77) without a GPU.
 * Run: ctest -R cuda_test_comm_nccl (tests/cuda/run_h200.sh on the GPU machine). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"

#define GUARD 64    /* poisoned bytes on each side of every device region */

static uint32_t seed;

/* Device memory of `bytes` between two poisoned guards; returns the region's start. */
static char *guarded(size_t bytes) {
    char *d = lkt_dev(bytes + 2 * GUARD);
    lkt_poison(d, bytes + 2 * GUARD);
    return d + GUARD;
}

static void *random_bytes(size_t bytes) {
    unsigned char *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    for (size_t i = 0; i < bytes; i++) {
        seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
        h[i] = (unsigned char)(seed >> 7);
    }
    return h;
}

static void put(char *d, const void *h, size_t bytes) {
    assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

/* The region equals want[0..bytes) and both guards still hold the poison. */
static void expect(const char *d, const void *want, size_t bytes) {
    unsigned char *h = malloc(bytes + 2 * GUARD);
    assert_non_null(h);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, d - GUARD, bytes + 2 * GUARD, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < GUARD; i++) assert_true(h[i] == 0xff && h[GUARD + bytes + i] == 0xff);
    assert_memory_equal(h + GUARD, want, bytes);
    free(h);
}

static lk_comm *world(void) {
    lk_comm *c = NULL;
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), 0, &c), LK_OK);
    assert_string_equal(c->backend, "nccl");
    assert_true(c->size == 1 && c->rank == 0 && c->version == LK_COMM_VERSION);
    return c;
}

/* n random values of type t, on the host. */
static void *values(lk_comm_type t, int64_t n) {
    size_t es = lk_comm_type_size(t);
    void *h = malloc((size_t)(n ? n : 1) * es);
    assert_non_null(h);
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    lkt_randn(x, n, &seed, 3.0);
    for (int64_t i = 0; i < n; i++) {
        if (t == LK_COMM_F32) ((float *)h)[i] = (float)x[i];
        else if (t == LK_COMM_F64) ((double *)h)[i] = x[i];
        else if (t == LK_COMM_BF16) ((uint16_t *)h)[i] = lk_f32_to_bf16((float)x[i]);
        else ((int64_t *)h)[i] = (int64_t)(x[i] * 1e6);
    }
    free(x);
    return h;
}

static void collectives(void **state) {
    (void)state;
    lk_comm *c = world();
    const int64_t counts[] = {1, 7, 1023, 65537};
    for (int t = 0; t < LK_COMM_TYPE_COUNT; t++)
        for (int k = 0; k < 4; k++) {
            int64_t n = counts[k];
            size_t bytes = (size_t)n * lk_comm_type_size((lk_comm_type)t);
            void *h = values((lk_comm_type)t, n);
            char *buf = guarded(bytes), *out = guarded(bytes);
            put(buf, h, bytes);
            assert_int_equal(lk_comm_all_reduce(c, buf, n, (lk_comm_type)t), LK_OK);
            expect(buf, h, bytes);
            assert_int_equal(lk_comm_reduce_scatter(c, buf, out, n, (lk_comm_type)t), LK_OK);
            expect(out, h, bytes);
            free(h);
        }
    /* byte-sized payloads: all_gather, broadcast, all_to_all at odd offsets */
    size_t nb = 4099;
    unsigned char *h = random_bytes(nb);
    char *src = guarded(nb), *dst = guarded(nb);
    put(src, h, nb);
    assert_int_equal(lk_comm_all_gather(c, src, dst, nb), LK_OK);
    expect(dst, h, nb);
    assert_int_equal(lk_comm_broadcast(c, src, nb, 0), LK_OK);
    expect(src, h, nb);
    char *a2a = guarded(nb);
    int64_t sc[1] = {1001}, sd[1] = {13}, rd[1] = {7};
    assert_int_equal(lk_comm_all_to_all(c, src, sc, sd, a2a, sc, rd), LK_OK);
    unsigned char *want = malloc(nb);
    memset(want, 0xff, nb);
    memcpy(want + 7, h + 13, 1001);
    expect(a2a, want, nb);
    int64_t other[1] = {1000};
    assert_int_equal(lk_comm_all_to_all(c, src, sc, sd, a2a, other, rd), LK_ECOMM);
    assert_non_null(strstr(lk_last_error(), "all_to_all"));
    expect(a2a, want, nb);      /* refused: untouched */
    assert_int_equal(lk_comm_barrier(c), LK_OK);
    assert_int_equal(c->stats.calls[LK_COLL_ALL_REDUCE], 4 * LK_COMM_TYPE_COUNT);
    assert_int_equal(c->stats.bytes_in[LK_COLL_ALL_TO_ALL], 2 * 1001);
    /* a split communicator runs collectives of its own */
    lk_comm *sub = NULL;
    assert_int_equal(lk_comm_split(c, 3, 0, &sub), LK_OK);
    assert_true(sub->size == 1 && sub->rank == 0 && !strcmp(sub->backend, "nccl"));
    char *b2 = guarded(nb);
    put(b2, h, nb);
    assert_int_equal(lk_comm_broadcast(sub, b2, nb, 0), LK_OK);
    assert_int_equal(lk_comm_all_gather(sub, src, dst, nb), LK_OK);
    assert_int_equal(lk_comm_barrier(sub), LK_OK);
    expect(b2, h, nb);
    expect(dst, h, nb);
    lk_comm_destroy(sub);
    free(h), free(want);
    lk_comm_destroy(c);
    lkt_free_all();
}

/* With graph: begin capturing st; replay ends the capture and launches it once. */
static void capture(int graph, cudaStream_t st) {
    if (graph) assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
}

static void replay(int graph, cudaStream_t st) {
    if (!graph) return;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    assert_int_equal(cudaStreamEndCapture(st, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(ex, st), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(cudaGraphExecDestroy(ex), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(g), cudaSuccess);
}

/* Version 4's all-gather and reduce-scatter (and version 3's all-to-all, version 5's
 * all-reduce in place) queued on a stream of the caller's: right after the call nothing is required to have moved; after
 * the stream's sync each result is the input's bits, the guards intact. Then the four
 * captured in one CUDA graph (global mode) and replayed into cleared outputs. */
static void queued(void **state) {
    (void)state;
    lk_comm *c = world();
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    size_t nb = 4099;
    int64_t n = 1031;   /* f32 and bf16 elements */
    unsigned char *h = random_bytes(nb);
    char *src = guarded(nb), *ag = guarded(nb), *rs = guarded(4 * (size_t)n), *rb = guarded(2 * (size_t)n);
    char *a2a = guarded(nb);
    void *hf = values(LK_COMM_F32, n), *hb = values(LK_COMM_BF16, n);
    char *sf = guarded(4 * (size_t)n), *sb = guarded(2 * (size_t)n), *ar = guarded(4 * (size_t)n);
    put(src, h, nb), put(sf, hf, 4 * (size_t)n), put(sb, hb, 2 * (size_t)n);
    int64_t sc[1] = {1001}, sd[1] = {13}, rd[1] = {7};
    unsigned char *want = malloc(nb);
    memset(want, 0xff, nb);
    memcpy(want + 7, h + 13, 1001);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);   /* the poison and the puts landed (legacy stream) */
    for (int graph = 0; graph < 2; graph++) {
        lkt_poison(ar, 4 * (size_t)n);
        put(ar, hf, 4 * (size_t)n);   /* the sum of one rank: its own values */
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        capture(graph, st);
        lk_status s1 = lk_comm_all_gather_on(c, src, ag, nb, st);
        lk_status s2 = lk_comm_reduce_scatter_on(c, sf, rs, n, LK_COMM_F32, st);
        lk_status s3 = lk_comm_reduce_scatter_on(c, sb, rb, n, LK_COMM_BF16, st);
        lk_status s4 = lk_comm_all_to_all_on(c, src, sc, sd, a2a, sc, rd, st);
        lk_status s5 = lk_comm_all_reduce_on(c, ar, n, LK_COMM_F32, st);
        replay(graph, st);
        assert_true(s1 == LK_OK && s2 == LK_OK && s3 == LK_OK && s4 == LK_OK && s5 == LK_OK);
        assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
        print_message("queued: %s\n", graph ? "graph replay" : "eager");
        expect(ag, h, nb), expect(rs, hf, 4 * (size_t)n), expect(rb, hb, 2 * (size_t)n), expect(a2a, want, nb);
        expect(ar, hf, 4 * (size_t)n);
        lkt_poison(ag, nb), lkt_poison(rs, 4 * (size_t)n), lkt_poison(rb, 2 * (size_t)n), lkt_poison(a2a, nb);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);   /* st does not wait for the legacy stream */
    }
    assert_int_equal(c->stats.calls[LK_COLL_ALL_GATHER], 2);
    assert_int_equal(c->stats.calls[LK_COLL_REDUCE_SCATTER], 4);
    assert_int_equal(c->stats.bytes_in[LK_COLL_ALL_GATHER], 2 * nb);
    assert_int_equal(c->stats.calls[LK_COLL_ALL_REDUCE], 2);
    /* refused before anything is queued */
    assert_int_equal(lk_comm_all_gather_on(c, NULL, ag, nb, st), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_gather_on"));
    assert_int_equal(lk_comm_reduce_scatter_on(c, sf, rs, n, LK_COMM_TYPE_COUNT, st), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "reduce_scatter_on"));
    assert_int_equal(lk_comm_all_reduce_on(c, ar, -1, LK_COMM_F32, st), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_reduce_on"));
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    unsigned char *poison = malloc(4 * (size_t)n);   /* the largest region compared below (rs) */
    memset(poison, 0xff, 4 * (size_t)n);
    expect(ag, poison, nb), expect(rs, poison, 4 * (size_t)n);
    assert_int_equal(cudaStreamDestroy(st), cudaSuccess);
    free(h), free(want), free(hf), free(hb), free(poison);
    lk_comm_destroy(c);
    lkt_free_all();
}

/* Several buckets in flight (more than the event pool has seen), completed by test and
 * by wait in another order than started; then the pool is reused. */
static void requests(void **state) {
    (void)state;
    lk_comm *c = world();
    enum { NB = 5 };
    const int64_t n[NB] = {3, 4097, 1, 0, 100003};
    for (int round = 0; round < 2; round++) {
        void *h[NB];
        char *d[NB];
        lk_comm_request req[NB];
        for (int b = 0; b < NB; b++) {
            lk_comm_type t = b % 2 ? LK_COMM_F64 : LK_COMM_F32;
            size_t bytes = (size_t)n[b] * lk_comm_type_size(t);
            h[b] = values(t, n[b]);
            d[b] = guarded(bytes);
            put(d[b], h[b], bytes);
            assert_int_equal(lk_comm_all_reduce_start(c, d[b], n[b], t, &req[b]), LK_OK);
            assert_int_equal(req[b].pending, n[b] > 0);
        }
        int done = 0;
        while (!done) assert_int_equal(lk_comm_test(c, &req[1], &done), LK_OK);
        assert_int_equal(req[1].pending, 0);
        for (int b = NB - 1; b >= 0; b--) {
            assert_int_equal(lk_comm_wait(c, &req[b]), LK_OK);
            assert_int_equal(req[b].pending, 0);
            expect(d[b], h[b], req[b].bytes);
            free(h[b]);
        }
    }
    assert_int_equal(c->stats.calls[LK_COLL_ALL_REDUCE], 2 * NB);
    lk_comm_destroy(c);
    lkt_free_all();
}

static void bad_arguments(void **state) {
    (void)state;
    lk_comm sentinel, *c = NULL, *out = &sentinel;
    assert_int_equal(lk_comm_nccl_create(NULL, 0, &out), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "bootstrap"));
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), 0, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "out"));
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), -1, &out), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "device"));
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), lk_hw_get()->cuda_devices, &out), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "device"));
    assert_ptr_equal(out, &sentinel);       /* untouched */
    c = world();
    assert_int_equal(lk_comm_nccl_create(c, 0, &out), LK_EINVAL);    /* bootstraps over the host only */
    assert_non_null(strstr(lk_last_error(), "host communicator"));
    char *d = guarded(64);
    assert_int_equal(lk_comm_all_reduce(c, d, 4, LK_COMM_TYPE_COUNT), LK_EINVAL);
    assert_int_equal(lk_comm_broadcast(c, d, 64, 1), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "root"));
    lk_comm_request r;
    assert_int_equal(lk_comm_all_reduce_start(c, d, -1, LK_COMM_F32, &r), LK_EINVAL);
    assert_int_equal(lk_comm_all_reduce_start(lk_comm_self(), d, 0, LK_COMM_F32, &r), LK_OK);
    assert_int_equal(lk_comm_wait(c, &r), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "another communicator"));
    unsigned char poison[64];
    memset(poison, 0xff, sizeof poison);
    expect(d, poison, 64);
    lk_comm_destroy(c);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_comm_nccl")) return LKT_SKIP;
    seed = (uint32_t)time(NULL) | 1u;
    printf("cuda_test_comm_nccl: seed %u\n", seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(collectives),
        cmocka_unit_test(requests),
        cmocka_unit_test(queued),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
