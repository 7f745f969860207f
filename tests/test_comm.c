/* test_comm.c — the communicator layer on one process: the single-process backend's
 * collectives, the wrappers' checks and byte counts, the mesh (sizes that do not divide
 * the world refused), the SP loss reduction, and the EP dispatchers over the
 * single-process communicator held against `local`; the non-blocking all-reduce (several
 * requests in flight, bad arguments, the blocking fallback of a version 1 communicator);
 * the collectives queued on a stream (versions 3 and 4: the single comm says it has none,
 * a stand-in version 4 comm is checked and counted, an older one refused).
 * tests/dist runs P > 1 under mpirun; tests/cuda/test_comm_nccl.c the NCCL backend. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llmkern/llmkern.h"
#include "ops/harness.h"

static void single_collectives(void **state) {
    (void)state;
    lk_comm *c;
    assert_int_equal(lk_comm_single(&c), LK_OK);
    assert_int_equal(c->size, 1);
    assert_int_equal(c->rank, 0);
    double v[2] = {1.5, 2.5};
    assert_int_equal(lk_comm_all_reduce(c, v, 2, LK_COMM_F64), LK_OK);
    assert_true(v[0] == 1.5 && v[1] == 2.5);
    float s[3] = {1, 2, 3}, r[3] = {0};
    assert_int_equal(lk_comm_all_gather(c, s, r, sizeof s), LK_OK);
    assert_memory_equal(s, r, sizeof s);
    memset(r, 0, sizeof r);
    assert_int_equal(lk_comm_reduce_scatter(c, s, r, 3, LK_COMM_F32), LK_OK);
    assert_memory_equal(s, r, sizeof s);
    int64_t cnt[1] = {8}, dsp[1] = {4}, rd[1] = {0};
    memset(r, 0, sizeof r);
    assert_int_equal(lk_comm_all_to_all(c, s, cnt, dsp, r, cnt, rd), LK_OK);   /* s[1..2] -> r[0..1] */
    assert_true(r[0] == 2 && r[1] == 3 && r[2] == 0);
    assert_int_equal(c->stats.calls[LK_COLL_ALL_TO_ALL], 1);
    assert_int_equal(c->stats.bytes_in[LK_COLL_ALL_TO_ALL], 8);
    assert_int_equal(c->stats.bytes_wire[LK_COLL_ALL_TO_ALL], 0);    /* nothing leaves one process */
    assert_int_equal(lk_comm_broadcast(c, s, sizeof s, 0), LK_OK);
    assert_int_equal(lk_comm_barrier(c), LK_OK);
    /* bad arguments */
    assert_int_equal(lk_comm_all_reduce(c, v, 2, LK_COMM_TYPE_COUNT), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_reduce"));
    assert_int_equal(lk_comm_broadcast(c, s, sizeof s, 1), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "root"));
    int64_t neg[1] = {-1};
    assert_int_equal(lk_comm_all_to_all(c, s, neg, dsp, r, cnt, rd), LK_EINVAL);
    int64_t other[1] = {4};
    assert_int_equal(lk_comm_all_to_all(c, s, cnt, dsp, r, other, rd), LK_ECOMM);
    lk_comm bogus = {0};
    assert_int_equal(lk_comm_barrier(&bogus), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "barrier"));
    assert_int_equal(lk_comm_barrier(NULL), LK_EINVAL);
    lk_comm *sub;
    assert_int_equal(lk_comm_split(c, 0, 0, &sub), LK_OK);
    assert_int_equal(sub->size, 1);
    lk_comm_destroy(sub);
    lk_comm_reset_stats(c);
    assert_int_equal(c->stats.calls[LK_COLL_ALL_TO_ALL], 0);
    lk_comm_destroy(c);
    lk_comm *w;
#ifdef LLMKERN_HAVE_MPI
    (void)w;    /* initializing MPI here would tie this test to mpirun; tests/dist covers it */
#else
    assert_int_equal(lk_comm_mpi_world(&w), LK_EUNAVAILABLE);
#endif
#ifndef LLMKERN_HAVE_NCCL
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), 0, &w), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "not available in this build"));
#endif
}

/* The request API on one process: several buckets in flight, then waited in another
 * order; values are the identity's (exact); stats counted at the start. */
static void requests_single(void **state) {
    (void)state;
    lk_comm *c;
    assert_int_equal(lk_comm_single(&c), LK_OK);
    assert_int_equal(c->version, LK_COMM_VERSION);
    /* version 3's all-to-all on a stream is NCCL's: the single comm says so */
    int64_t one[1] = {0};
    assert_int_equal(lk_comm_all_to_all_on(c, NULL, one, one, NULL, one, one, NULL), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "all_to_all_on"));
    /* and version 4's all-gather and reduce-scatter on a stream */
    float f[2] = {1, 2}, g[2] = {0};
    assert_int_equal(lk_comm_all_gather_on(c, f, g, sizeof f, NULL), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "all_gather_on"));
    assert_int_equal(lk_comm_reduce_scatter_on(c, f, g, 2, LK_COMM_F32, NULL), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "reduce_scatter_on"));
    assert_true(g[0] == 0 && g[1] == 0);
    /* and version 5's all-reduce on a stream, leaving the buffer as it was */
    assert_int_equal(lk_comm_all_reduce_on(c, f, 2, LK_COMM_F32, NULL), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "all_reduce_on"));
    assert_true(f[0] == 1 && f[1] == 2);
    lk_rng rng = lk_rng_make(0x5eed ^ (uint64_t)time(NULL));
    enum { NB = 4 };
    const int64_t n[NB] = {1, 7, 1023, 0};
    float *buf[NB], *want[NB];
    lk_comm_request req[NB];
    uint64_t bytes = 0;
    for (int b = 0; b < NB; b++) {
        buf[b] = malloc((size_t)(n[b] ? n[b] : 1) * 4), want[b] = malloc((size_t)(n[b] ? n[b] : 1) * 4);
        lk_rng_uniform(&rng, buf[b], n[b], -4.0f, 4.0f);
        memcpy(want[b], buf[b], (size_t)n[b] * 4);
        assert_int_equal(lk_comm_all_reduce_start(c, buf[b], n[b], LK_COMM_F32, &req[b]), LK_OK);
        assert_ptr_equal(req[b].comm, c);
        assert_int_equal(req[b].bytes, (uint64_t)n[b] * 4);
        bytes += (uint64_t)n[b] * 4;
    }
    assert_int_equal(c->stats.calls[LK_COLL_ALL_REDUCE], NB);
    assert_int_equal(c->stats.bytes_in[LK_COLL_ALL_REDUCE], bytes);
    assert_int_equal(c->stats.bytes_wire[LK_COLL_ALL_REDUCE], 0);
    int done = -1;
    assert_int_equal(lk_comm_test(c, &req[1], &done), LK_OK);
    assert_int_equal(done, 1);
    assert_int_equal(req[1].pending, 0);
    for (int b = NB - 1; b >= 0; b--) {
        assert_int_equal(lk_comm_wait(c, &req[b]), LK_OK);
        assert_int_equal(req[b].pending, 0);
        assert_memory_equal(buf[b], want[b], (size_t)n[b] * 4);
    }
    assert_int_equal(lk_comm_wait(c, &req[0]), LK_OK);     /* a second wait is harmless */
    /* bad arguments: LK_EINVAL naming the argument, req untouched */
    lk_comm_request poison, r;
    memset(&poison, 0xa5, sizeof poison);
    r = poison;
    assert_int_equal(lk_comm_all_reduce_start(c, buf[1], 7, LK_COMM_TYPE_COUNT, &r), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_reduce_start"));
    assert_int_equal(lk_comm_all_reduce_start(c, buf[1], -1, LK_COMM_F32, &r), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "count"));
    assert_int_equal(lk_comm_all_reduce_start(c, NULL, 7, LK_COMM_F32, &r), LK_EINVAL);
    assert_memory_equal(&r, &poison, sizeof r);
    assert_int_equal(lk_comm_all_reduce_start(c, buf[1], 7, LK_COMM_F32, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "req"));
    assert_int_equal(lk_comm_all_reduce_start(NULL, buf[1], 7, LK_COMM_F32, &r), LK_EINVAL);
    assert_int_equal(c->stats.calls[LK_COLL_ALL_REDUCE], NB);      /* refused calls are not counted */
    assert_int_equal(lk_comm_wait(c, NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "req"));
    assert_int_equal(lk_comm_all_reduce_start(lk_comm_self(), buf[1], 7, LK_COMM_F32, &r), LK_OK);
    assert_int_equal(lk_comm_wait(c, &r), LK_EINVAL);                 /* started on another comm */
    assert_non_null(strstr(lk_last_error(), "another communicator"));
    assert_int_equal(lk_comm_wait(lk_comm_self(), &r), LK_OK);
    assert_int_equal(lk_comm_test(c, &req[0], NULL), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "done"));
    for (int b = 0; b < NB; b++) free(buf[b]), free(want[b]);
    lk_comm_destroy(c);
}

/* A stand-in whose blocking all-reduce doubles, so the fallback is seen to run it. */
static int blocking_calls, async_calls;
static lk_status doubling_all_reduce(lk_comm *c, void *buf, int64_t n, lk_comm_type dt) {
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] *= 2;
    blocking_calls++;
    return LK_OK;
}
static lk_status counting_start(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, lk_comm_request *req) {
    async_calls++;
    return LK_OK;
}

/* Version 1 communicators, and version 2 ones without the members, block in start. */
static void requests_fallback(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        lk_comm old = *lk_comm_self();
        lk_comm_reset_stats(&old);
        old.all_reduce = doubling_all_reduce;
        old.all_reduce_start = counting_start;      /* must not run in either case */
        if (k == 0) old.version = 1;
        else old.wait = NULL;
        assert_int_equal(lk_comm_check("test", "old", &old), LK_OK);
        blocking_calls = async_calls = 0;
        double v[3] = {1.5, -2.0, 3.25};
        lk_comm_request r;
        assert_int_equal(lk_comm_all_reduce_start(&old, v, 3, LK_COMM_F64, &r), LK_OK);
        assert_int_equal(r.pending, 0);             /* complete on return */
        assert_true(v[0] == 3.0 && v[1] == -4.0 && v[2] == 6.5);
        int done = 0;
        assert_int_equal(lk_comm_test(&old, &r, &done), LK_OK);
        assert_int_equal(done, 1);
        assert_int_equal(lk_comm_wait(&old, &r), LK_OK);
        assert_true(blocking_calls == 1 && async_calls == 0);
        assert_int_equal(old.stats.calls[LK_COLL_ALL_REDUCE], 1);
        assert_int_equal(old.stats.bytes_in[LK_COLL_ALL_REDUCE], 24);
    }
    lk_comm future = *lk_comm_self();
    future.version = LK_COMM_VERSION + 1;
    assert_int_equal(lk_comm_check("test", "future", &future), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "future"));
}

/* Stand-ins for version 4's queued members: they record the stream they were handed. */
static void *queued_on;
static lk_status fake_all_gather_on(lk_comm *c, const void *send, void *recv, size_t bytes, void *stream) {
    memcpy(recv, send, bytes);
    queued_on = stream;
    return LK_OK;
}
static lk_status fake_reduce_scatter_on(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt,
                                        void *stream) {
    memcpy(recv, send, (size_t)n * lk_comm_type_size(dt));
    queued_on = stream;
    return LK_OK;
}

static lk_status fake_all_reduce_on(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, void *stream) {
    (void)c;
    for (int64_t i = 0; dt == LK_COMM_F32 && i < n; i++) ((float *)buf)[i] *= 2;   /* as two ranks alike */
    queued_on = stream;
    return LK_OK;
}

/* The queued wrappers: a version 4 comm with the members runs them (checked and counted
 * as the blocking twins); a version 3 one, or NULL members, is LK_EUNAVAILABLE. */
static void queued_collectives(void **state) {
    (void)state;
    lk_comm v4 = *lk_comm_self();
    lk_comm_reset_stats(&v4);
    v4.all_gather_on = fake_all_gather_on, v4.reduce_scatter_on = fake_reduce_scatter_on;
    int tag;
    float s[3] = {1, 2, 3}, r[3] = {0};
    assert_int_equal(lk_comm_all_gather_on(&v4, s, r, sizeof s, &tag), LK_OK);
    assert_memory_equal(s, r, sizeof s);
    assert_ptr_equal(queued_on, &tag);
    assert_int_equal(v4.stats.calls[LK_COLL_ALL_GATHER], 1);
    assert_int_equal(v4.stats.bytes_in[LK_COLL_ALL_GATHER], sizeof s);
    memset(r, 0, sizeof r), queued_on = NULL;
    assert_int_equal(lk_comm_reduce_scatter_on(&v4, s, r, 3, LK_COMM_F32, &tag), LK_OK);
    assert_memory_equal(s, r, sizeof s);
    assert_ptr_equal(queued_on, &tag);
    assert_int_equal(v4.stats.calls[LK_COLL_REDUCE_SCATTER], 1);
    assert_int_equal(v4.stats.bytes_in[LK_COLL_REDUCE_SCATTER], sizeof s);
    /* bad arguments named before the backend runs */
    queued_on = NULL;
    assert_int_equal(lk_comm_all_gather_on(&v4, NULL, r, 4, &tag), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_gather_on"));
    assert_int_equal(lk_comm_reduce_scatter_on(&v4, s, r, -1, LK_COMM_F32, &tag), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "reduce_scatter_on"));
    assert_int_equal(lk_comm_reduce_scatter_on(&v4, s, r, 3, LK_COMM_TYPE_COUNT, &tag), LK_EINVAL);
    assert_int_equal(lk_comm_all_gather_on(NULL, s, r, 4, &tag), LK_EINVAL);
    assert_null(queued_on);
    /* an older communicator does not have the members, whatever sits past its end */
    lk_comm v3 = v4;
    v3.version = 3;
    assert_int_equal(lk_comm_all_gather_on(&v3, s, r, sizeof s, &tag), LK_EUNAVAILABLE);
    assert_int_equal(lk_comm_reduce_scatter_on(&v3, s, r, 3, LK_COMM_F32, &tag), LK_EUNAVAILABLE);
    v4.reduce_scatter_on = NULL;
    assert_int_equal(lk_comm_reduce_scatter_on(&v4, s, r, 3, LK_COMM_F32, &tag), LK_EUNAVAILABLE);
    assert_non_null(strstr(lk_last_error(), "'single'"));
    assert_null(queued_on);
    /* version 5's all-reduce: run, counted and checked like the blocking one */
    lk_comm v5 = v4;
    v5.all_reduce_on = fake_all_reduce_on;
    assert_int_equal(lk_comm_all_reduce_on(&v5, s, 3, LK_COMM_F32, &tag), LK_OK);
    assert_true(s[0] == 2 && s[1] == 4 && s[2] == 6);
    assert_ptr_equal(queued_on, &tag);
    assert_int_equal(v5.stats.calls[LK_COLL_ALL_REDUCE], 1);
    assert_int_equal(v5.stats.bytes_in[LK_COLL_ALL_REDUCE], sizeof s);
    queued_on = NULL;
    assert_int_equal(lk_comm_all_reduce_on(&v5, NULL, 3, LK_COMM_F32, &tag), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "all_reduce_on"));
    assert_int_equal(lk_comm_all_reduce_on(&v5, s, 3, LK_COMM_TYPE_COUNT, &tag), LK_EINVAL);
    v5.version = 4;
    assert_int_equal(lk_comm_all_reduce_on(&v5, s, 3, LK_COMM_F32, &tag), LK_EUNAVAILABLE);
    assert_null(queued_on);
    assert_true(s[0] == 2 && s[1] == 4 && s[2] == 6);
}

static void mesh(void **state) {
    (void)state;
    lk_comm *c;
    assert_int_equal(lk_comm_single(&c), LK_OK);
    lk_mesh m;
    assert_int_equal(lk_mesh_create(c, 0, 1, 1, &m), LK_OK);
    assert_true(m.dp_size == 1 && m.sp->size == 1 && m.ep->size == 1 && m.dp->size == 1);
    assert_true(m.dp_rank == 0 && m.sp_rank == 0 && m.ep_rank == 0);
    lk_mesh_destroy(&m);
    assert_int_equal(lk_mesh_create(c, 0, 2, 1, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "does not divide the world size 1"));
    assert_int_equal(lk_mesh_create(c, 2, 1, 1, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "does not match"));
    assert_int_equal(lk_mesh_create(c, 1, 0, 1, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "sp >= 1"));
    lk_comm_destroy(c);
}

static void sp_loss(void **state) {
    (void)state;
    double mean, scale;
    assert_int_equal(lk_sp_loss_reduce(NULL, 6.0, 3, &mean, &scale), LK_OK);
    assert_true(mean == 2.0 && scale == 1.0 / 3.0);
    assert_int_equal(lk_sp_loss_reduce(lk_comm_self(), 0.0, 0, &mean, &scale), LK_OK);
    assert_true(mean == 0.0 && scale == 0.0 && !isnan(mean));
    assert_int_equal(lk_sp_loss_reduce(NULL, 1.0, -1, &mean, &scale), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "local_valid"));
}

/* alltoall and allgather over the single-process communicator equal local. */
static void dispatch_single(void **state) {
    (void)state;
    const int64_t T = 9, k = 2, E = 4, H = 8, I = 4;
    lk_rng rng = lk_rng_make(5);
    float *x = lk_random_tensor(&rng, LK_F32, T * H, 1.0f, NULL), *dout = lk_random_tensor(&rng, LK_F32, T * H, 1.0f, NULL);
    float *gu = lk_random_tensor(&rng, LK_F32, E * 2 * I * H, 0.3f, NULL), *dn = lk_random_tensor(&rng, LK_F32, E * H * I, 0.3f, NULL);
    float w[T * k];
    int32_t ids[T * k];
    lk_rng_uniform(&rng, w, T * k, 0.1f, 1.0f);
    for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)((i * 7 + 3) % E);
    int64_t gs[3] = {E, 2 * I, H}, ds[3] = {E, H, I};
    float out[3][T * H], dx[3][T * H], dw[3][T * k];
    float *dgu[3], *ddn[3];
    const char *names[3] = {"local", "alltoall", "allgather"};
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    for (int n = 0; n < 3; n++) {
        dgu[n] = calloc((size_t)(E * 2 * I * H), 4), ddn[n] = calloc((size_t)(E * H * I), 4);
        lk_moe_dispatch_args a = {
            .hidden = lk_tensor_2d(x, LK_F32, T, H), .topk_ids = lk_tensor_2d(ids, LK_I32, T, k),
            .topk_weights = lk_tensor_2d(w, LK_F32, T, k), .gate_up_weight = lk_tensor_view(gu, LK_F32, 3, gs),
            .down_weight = lk_tensor_view(dn, LK_F32, 3, ds), .out = lk_tensor_2d(out[n], LK_F32, T, H),
            .dout = lk_tensor_2d(dout, LK_F32, T, H), .d_hidden = lk_tensor_2d(dx[n], LK_F32, T, H),
            .d_topk_weights = lk_tensor_2d(dw[n], LK_F32, T, k), .d_gate_up_weight = lk_tensor_view(dgu[n], LK_F32, 3, gs),
            .d_down_weight = lk_tensor_view(ddn[n], LK_F32, 3, ds), .n_experts = (int)E,
        };
        const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, names[n], LK_DEVICE_CPU);
        assert_non_null(impl);
        assert_int_equal(lk_moe_dispatch_forward(impl, &a, &ctx), LK_OK);
        assert_int_equal(lk_moe_dispatch_backward(impl, &a, &ctx), LK_OK);
        if (n == 2) {   /* bad inputs: an id out of range, a wrong weight shape; out untouched */
            float sentinel = out[n][0];
            ids[3] = (int32_t)E;
            assert_int_equal(lk_moe_dispatch_forward(impl, &a, &ctx), LK_EINVAL);
            assert_non_null(strstr(lk_last_error(), "topk_ids"));
            ids[3] = (int32_t)((3 * 7 + 3) % E);
            a.down_weight.shape[2] = I + 1;
            assert_int_equal(lk_moe_dispatch_forward(impl, &a, &ctx), LK_ESHAPE);
            assert_non_null(strstr(lk_last_error(), "down_weight"));
            assert_true(out[n][0] == sentinel);
        }
    }
    /* f32: the same per-route GEMMs; the k-way sums reorder */
    for (int n = 1; n < 3; n++) {
        for (int64_t i = 0; i < T * H; i++) {
            assert_float_equal(out[n][i], out[0][i], 1e-5 * (1 + fabsf(out[0][i])));
            assert_float_equal(dx[n][i], dx[0][i], 1e-5 * (1 + fabsf(dx[0][i])));
        }
        for (int64_t i = 0; i < T * k; i++) assert_float_equal(dw[n][i], dw[0][i], 1e-5 * (1 + fabsf(dw[0][i])));
        for (int64_t i = 0; i < E * 2 * I * H; i++) assert_float_equal(dgu[n][i], dgu[0][i], 1e-5 * (1 + fabsf(dgu[0][i])));
        for (int64_t i = 0; i < E * H * I; i++) assert_float_equal(ddn[n][i], ddn[0][i], 1e-5 * (1 + fabsf(ddn[0][i])));
    }
    for (int n = 0; n < 3; n++) free(dgu[n]), free(ddn[n]);
    free(x), free(dout), free(gu), free(dn);
    lk_arena_free(&arena);
}

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK ? 0 : -1;
}

/* The collective watchdog (issue 20): armed and disarmed at will, refusing a bad timeout,
 * silent on collectives that complete (a group of one is never watched); that a stopped
 * rank ends the job is tests/dist/stop_rank.sh, under mpirun. */
static void never_fired(void *arg) { (void)arg; abort(); }

static void watchdog_arms(void **state) {
    (void)state;
    assert_int_equal(lk_comm_watchdog_arm(-1, 0), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "timeout_s"));
    assert_int_equal(lk_comm_watchdog_arm(NAN, 0), LK_EINVAL);
    assert_int_equal(lk_comm_watchdog_arm(0.05, 0), LK_OK);
    assert_int_equal(lk_comm_watchdog_arm(0.05, 0), LK_OK);   /* re-arming keeps one thread */
    lk_comm_watchdog_step(3);
    lk_comm_watchdog_grace(5);   /* a checkpoint's longer limit, then back */
    lk_comm_watchdog_grace(0);
    int64_t x = 5;
    for (int i = 0; i < 20; i++) assert_int_equal(lk_comm_all_reduce(lk_comm_self(), &x, 1, LK_COMM_I64), LK_OK);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);                                      /* idle for 4 timeouts: nothing in flight */
    assert_int_equal(x, 5);
    static int hook;
    assert_int_equal(lk_comm_watchdog_on_fire(never_fired, &hook, 1), LK_OK);
    assert_int_equal(lk_comm_watchdog_on_fire(never_fired, &hook, 0), LK_OK);
    lk_comm_watchdog_step(-1);
    assert_int_equal(lk_comm_watchdog_arm(0, 0), LK_OK);
    assert_int_equal(lk_comm_watchdog_arm(0, 0), LK_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(single_collectives),
        cmocka_unit_test(requests_single),
        cmocka_unit_test(requests_fallback),
        cmocka_unit_test(queued_collectives),
        cmocka_unit_test(mesh),
        cmocka_unit_test(sp_loss),
        cmocka_unit_test(dispatch_single),
        cmocka_unit_test(watchdog_arms),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
