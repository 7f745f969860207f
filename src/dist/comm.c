/* comm.c — the communicator wrappers every caller goes through (argument checks and the
 * per-collective byte counts), the single-process backend, and the SP loss reduction.
 * The MPI backend is comm_mpi.c, built only when CMake finds MPI; the NCCL one is
 * comm_nccl.c, built only with CUDA and NCCL. */
#include <stdlib.h>
#include <string.h>
#include "llmkern/comm.h"
#include "dist/watchdog.h"

/* A blocking backend call, timed by the watchdog (watchdog.c) when it is armed. */
#define WATCHED(c, what, call)                                   \
    do {                                                         \
        int w_ = lk_watch_begin(c, what);                        \
        lk_status r_ = (call);                                   \
        lk_watch_end(w_);                                        \
        return r_;                                               \
    } while (0)

static int reducible(lk_comm_type dt) { return (unsigned)dt < LK_COMM_TYPE_COUNT; }

size_t lk_comm_type_size(lk_comm_type t) { return t == LK_COMM_BF16 ? 2 : t == LK_COMM_F32 ? 4 : 8; }

lk_status lk_comm_check(const char *op, const char *arg, const lk_comm *c) {
    if (c == NULL) return lk_error(LK_EINVAL, "%s: %s: expected a communicator, got NULL", op, arg);
    if (c->version < 1 || c->version > LK_COMM_VERSION || c->size < 1 || c->rank < 0 || c->rank >= c->size ||
        !c->all_reduce || !c->all_gather || !c->reduce_scatter || !c->all_to_all || !c->broadcast ||
        !c->barrier || !c->split)
        return lk_error(LK_EINVAL, "%s: %s: expected a version 1..%d communicator with every collective and "
                        "0 <= rank < size, got version %d rank %d size %d", op, arg, LK_COMM_VERSION, c->version,
                        c->rank, c->size);
    return LK_OK;
}

#define CHECK_COMM(name)                                         \
    do {                                                         \
        lk_status s_ = lk_comm_check("comm", name, c);           \
        if (s_) return s_;                                       \
    } while (0)

static void count(lk_comm *c, lk_coll k, uint64_t in, uint64_t wire) {
    c->stats.calls[k]++;
    c->stats.bytes_in[k] += in;
    c->stats.bytes_wire[k] += wire;
}

/* The checks and counts the blocking and the non-blocking all-reduce share. */
static lk_status all_reduce_begin(lk_comm *c, const char *op, const void *buf, int64_t n, lk_comm_type dt,
                                  uint64_t *bytes) {
    CHECK_COMM(op);
    if (!reducible(dt) || n < 0 || (n > 0 && !buf))
        return lk_error(LK_EINVAL, "comm: %s: expected f32, f64, i64 or bf16, count >= 0 and a buffer, got type %d, "
                        "count %lld", op, (int)dt, (long long)n);
    uint64_t b = (uint64_t)n * lk_comm_type_size(dt);
    /* a ring all-reduce sends 2 (P-1)/P of the buffer */
    count(c, LK_COLL_ALL_REDUCE, b, c->size > 1 ? 2 * b * (uint64_t)(c->size - 1) / (uint64_t)c->size : 0);
    *bytes = b;
    return LK_OK;
}

lk_status lk_comm_all_reduce(lk_comm *c, void *buf, int64_t n, lk_comm_type dt) {
    uint64_t b = 0;
    lk_status s = all_reduce_begin(c, "all_reduce", buf, n, dt, &b);
    if (s) return s;
    if (!n) return LK_OK;
    WATCHED(c, "all_reduce", c->all_reduce(c, buf, n, dt));
}

/* Version 5's queued all-reduce: as all_to_all_on, nothing to time. */
lk_status lk_comm_all_reduce_on(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, void *stream) {
    CHECK_COMM("all_reduce_on");
    if (c->version < 5 || !c->all_reduce_on)
        return lk_error(LK_EUNAVAILABLE, "comm: all_reduce_on: the '%s' communicator cannot queue an all-reduce "
                        "on a stream (NCCL can)", c->backend ? c->backend : "?");
    uint64_t b = 0;
    lk_status s = all_reduce_begin(c, "all_reduce_on", buf, n, dt, &b);
    return s || !n ? s : c->all_reduce_on(c, buf, n, dt, stream);
}

/* Members past version 1 exist only in a version 2 struct: read them after the check. */
static int has_async(const lk_comm *c) { return c->version >= 2 && c->all_reduce_start && c->wait; }

lk_status lk_comm_all_reduce_start(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, lk_comm_request *req) {
    if (!req) return lk_error(LK_EINVAL, "comm: all_reduce_start: req: expected a request, got NULL");
    uint64_t b = 0;
    lk_status s = all_reduce_begin(c, "all_reduce_start", buf, n, dt, &b);
    if (s) return s;
    *req = (lk_comm_request){.comm = c, .bytes = b};
    if (n == 0) return LK_OK;
    if (!has_async(c)) WATCHED(c, "all_reduce", c->all_reduce(c, buf, n, dt));
    if ((s = c->all_reduce_start(c, buf, n, dt, req))) return s;
    req->pending = 1;
    return LK_OK;
}

static lk_status request_check(lk_comm *c, const char *op, const lk_comm_request *req) {
    CHECK_COMM(op);
    if (!req) return lk_error(LK_EINVAL, "comm: %s: req: expected a request, got NULL", op);
    if (req->comm != c)
        return lk_error(LK_EINVAL, "comm: %s: req: started on another communicator (%p), not this one (%p)", op,
                        (void *)req->comm, (void *)c);
    return LK_OK;
}

lk_status lk_comm_wait(lk_comm *c, lk_comm_request *req) {
    lk_status s = request_check(c, "wait", req);
    if (s || !req->pending) return s;
    /* complete or failed, the backend has released the handle: never wait on it again */
    int w = lk_watch_begin(c, "wait (a non-blocking all_reduce)");
    s = c->wait(c, req);
    lk_watch_end(w);
    req->pending = 0;
    return s;
}

lk_status lk_comm_test(lk_comm *c, lk_comm_request *req, int *done) {
    lk_status s = request_check(c, "test", req);
    if (s) return s;
    if (!done) return lk_error(LK_EINVAL, "comm: test: done: expected a pointer, got NULL");
    if (!req->pending) return *done = 1, LK_OK;
    int d = 1;
    if (!c->test) {
        s = lk_comm_wait(c, req);
    } else if ((s = c->test(c, req, &d)) || d) {
        req->pending = 0;   /* as in wait: the backend has released the handle */
    }
    if (!s) *done = d;
    return s;
}

/* all_gather's checks and counts, shared by the blocking and the queued one. */
static lk_status all_gather_begin(lk_comm *c, const char *op, const void *send, const void *recv, size_t bytes) {
    CHECK_COMM(op);
    if (bytes && (!send || !recv))
        return lk_error(LK_EINVAL, "comm: %s: expected send and recv buffers, got NULL", op);
    count(c, LK_COLL_ALL_GATHER, bytes, (uint64_t)bytes * (uint64_t)(c->size - 1));
    return LK_OK;
}

lk_status lk_comm_all_gather(lk_comm *c, const void *send, void *recv, size_t bytes) {
    lk_status s = all_gather_begin(c, "all_gather", send, recv, bytes);
    if (s) return s;
    WATCHED(c, "all_gather", c->all_gather(c, send, recv, bytes));
}

/* reduce_scatter's checks and counts, shared by the blocking and the queued one. */
static lk_status reduce_scatter_begin(lk_comm *c, const char *op, const void *send, const void *recv, int64_t n,
                                      lk_comm_type dt) {
    CHECK_COMM(op);
    if (!reducible(dt) || n < 0 || (n > 0 && (!send || !recv)))
        return lk_error(LK_EINVAL, "comm: %s: expected f32, f64, i64 or bf16, count >= 0 and buffers, got "
                        "type %d, count %lld", op, (int)dt, (long long)n);
    uint64_t b = (uint64_t)n * lk_comm_type_size(dt);
    count(c, LK_COLL_REDUCE_SCATTER, b * (uint64_t)c->size, b * (uint64_t)(c->size - 1));
    return LK_OK;
}

lk_status lk_comm_reduce_scatter(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt) {
    lk_status s = reduce_scatter_begin(c, "reduce_scatter", send, recv, n, dt);
    if (s) return s;
    WATCHED(c, "reduce_scatter", c->reduce_scatter(c, send, recv, n, dt));
}

/* all_to_all's argument checks and counts, shared by the blocking and the queued one. */
static lk_status all_to_all_begin(lk_comm *c, const char *op, const void *send, const int64_t *scount,
                                  const int64_t *sdispl, const void *recv, const int64_t *rcount,
                                  const int64_t *rdispl) {
    CHECK_COMM(op);
    if (!scount || !sdispl || !rcount || !rdispl)
        return lk_error(LK_EINVAL, "comm: %s: expected counts and displacements, got NULL", op);
    uint64_t in = 0, wire = 0;
    for (int r = 0; r < c->size; r++) {
        if (scount[r] < 0 || sdispl[r] < 0 || rcount[r] < 0 || rdispl[r] < 0)
            return lk_error(LK_EINVAL, "comm: %s: expected counts and displacements >= 0, got %lld/%lld "
                            "for rank %d", op, (long long)scount[r], (long long)rcount[r], r);
        if ((scount[r] && !send) || (rcount[r] && !recv))
            return lk_error(LK_EINVAL, "comm: %s: expected buffers for nonzero counts, got NULL", op);
        in += (uint64_t)scount[r];
        if (r != c->rank) wire += (uint64_t)scount[r];
    }
    count(c, LK_COLL_ALL_TO_ALL, in, wire);
    return LK_OK;
}

lk_status lk_comm_all_to_all(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl,
                             void *recv, const int64_t *rcount, const int64_t *rdispl) {
    lk_status s = all_to_all_begin(c, "all_to_all", send, scount, sdispl, recv, rcount, rdispl);
    if (s) return s;
    WATCHED(c, "all_to_all", c->all_to_all(c, send, scount, sdispl, recv, rcount, rdispl));
}

/* Queued, not blocking: nothing for the watchdog to time (the stream's next wait is). */
lk_status lk_comm_all_to_all_on(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl,
                                void *recv, const int64_t *rcount, const int64_t *rdispl, void *stream) {
    CHECK_COMM("all_to_all_on");
    if (c->version < 3 || !c->all_to_all_on)
        return lk_error(LK_EUNAVAILABLE, "comm: all_to_all_on: the '%s' communicator cannot queue an all-to-all "
                        "on a stream (NCCL can)", c->backend ? c->backend : "?");
    lk_status s = all_to_all_begin(c, "all_to_all_on", send, scount, sdispl, recv, rcount, rdispl);
    return s ? s : c->all_to_all_on(c, send, scount, sdispl, recv, rcount, rdispl, stream);
}

/* Version 4's queued all-gather and reduce-scatter: as all_to_all_on, nothing to time. */
lk_status lk_comm_all_gather_on(lk_comm *c, const void *send, void *recv, size_t bytes, void *stream) {
    CHECK_COMM("all_gather_on");
    if (c->version < 4 || !c->all_gather_on)
        return lk_error(LK_EUNAVAILABLE, "comm: all_gather_on: the '%s' communicator cannot queue an all-gather "
                        "on a stream (NCCL can)", c->backend ? c->backend : "?");
    lk_status s = all_gather_begin(c, "all_gather_on", send, recv, bytes);
    return s || !bytes ? s : c->all_gather_on(c, send, recv, bytes, stream);
}

lk_status lk_comm_reduce_scatter_on(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt,
                                    void *stream) {
    CHECK_COMM("reduce_scatter_on");
    if (c->version < 4 || !c->reduce_scatter_on)
        return lk_error(LK_EUNAVAILABLE, "comm: reduce_scatter_on: the '%s' communicator cannot queue a "
                        "reduce-scatter on a stream (NCCL can)", c->backend ? c->backend : "?");
    lk_status s = reduce_scatter_begin(c, "reduce_scatter_on", send, recv, n, dt);
    return s || !n ? s : c->reduce_scatter_on(c, send, recv, n, dt, stream);
}

lk_status lk_comm_broadcast(lk_comm *c, void *buf, size_t bytes, int root) {
    CHECK_COMM("broadcast");
    if (root < 0 || root >= c->size || (bytes && !buf))
        return lk_error(LK_EINVAL, "comm: broadcast: expected root in [0, %d) and a buffer, got root %d", c->size,
                        root);
    count(c, LK_COLL_BROADCAST, bytes, c->rank == root ? (uint64_t)bytes * (uint64_t)(c->size - 1) : 0);
    WATCHED(c, "broadcast", c->broadcast(c, buf, bytes, root));
}

lk_status lk_comm_barrier(lk_comm *c) {
    CHECK_COMM("barrier");
    count(c, LK_COLL_BARRIER, 0, 0);
    WATCHED(c, "barrier", c->barrier(c));
}

lk_status lk_comm_split(lk_comm *c, int color, int key, lk_comm **out) {
    CHECK_COMM("split");
    if (!out || color < 0)
        return lk_error(LK_EINVAL, "comm: split: expected color >= 0 and an output pointer, got color %d", color);
    *out = NULL;
    WATCHED(c, "split", c->split(c, color, key, out));
}

void lk_comm_destroy(lk_comm *c) {
    if (c && c->destroy) c->destroy(c);
}

void lk_comm_reset_stats(lk_comm *c) {
    if (c) memset(&c->stats, 0, sizeof c->stats);
}

/* --- single process: every collective is a copy or nothing ------------------------ */

static lk_status single_all_reduce(lk_comm *c, void *buf, int64_t n, lk_comm_type dt) { return LK_OK; }
/* the sum over one rank is done when it starts */
static lk_status single_all_reduce_start(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, lk_comm_request *req) {
    return LK_OK;
}
static lk_status single_wait(lk_comm *c, lk_comm_request *req) { return LK_OK; }
static lk_status single_test(lk_comm *c, lk_comm_request *req, int *done) { return *done = 1, LK_OK; }
static lk_status single_all_gather(lk_comm *c, const void *send, void *recv, size_t bytes) {
    if (bytes && send != recv) memmove(recv, send, bytes);
    return LK_OK;
}
static lk_status single_reduce_scatter(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt) {
    if (n && send != recv) memmove(recv, send, (size_t)n * lk_comm_type_size(dt));
    return LK_OK;
}
static lk_status single_all_to_all(lk_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                                   const int64_t *rc, const int64_t *rd) {
    if (sc[0] != rc[0])
        return lk_error(LK_ECOMM, "comm: all_to_all: rank 0 sends %lld bytes to itself but expects %lld",
                        (long long)sc[0], (long long)rc[0]);
    if (sc[0]) memmove((char *)recv + rd[0], (const char *)send + sd[0], (size_t)sc[0]);
    return LK_OK;
}
static lk_status single_broadcast(lk_comm *c, void *buf, size_t bytes, int root) { return LK_OK; }
static lk_status single_barrier(lk_comm *c) { return LK_OK; }
static lk_status single_split(lk_comm *c, int color, int key, lk_comm **out) { return lk_comm_single(out); }
static void single_destroy(lk_comm *c) { free(c); }

lk_status lk_comm_single(lk_comm **out) {
    if (!out) return lk_error(LK_EINVAL, "comm: out: expected a pointer, got NULL");
    lk_comm *c = calloc(1, sizeof *c);
    if (!c) return lk_error(LK_ENOMEM, "comm: single: out of memory");
    *c = (lk_comm){
        .version = LK_COMM_VERSION, .backend = "single", .rank = 0, .size = 1,
        .all_reduce = single_all_reduce, .all_gather = single_all_gather,
        .reduce_scatter = single_reduce_scatter, .all_to_all = single_all_to_all,
        .broadcast = single_broadcast, .barrier = single_barrier, .split = single_split,
        .destroy = single_destroy, .all_reduce_start = single_all_reduce_start, .wait = single_wait,
        .test = single_test,
    };
    *out = c;
    return LK_OK;
}

lk_comm *lk_comm_self(void) {
    static _Thread_local lk_comm self;      /* per thread: its stats are not shared */
    if (self.version == 0) {
        self = (lk_comm){
            .version = LK_COMM_VERSION, .backend = "single", .rank = 0, .size = 1,
            .all_reduce = single_all_reduce, .all_gather = single_all_gather,
            .reduce_scatter = single_reduce_scatter, .all_to_all = single_all_to_all,
            .broadcast = single_broadcast, .barrier = single_barrier, .split = single_split,
            .all_reduce_start = single_all_reduce_start, .wait = single_wait, .test = single_test,
        };
    }
    return &self;
}

/* --- the mesh -------------------------------------------------------------------- */

lk_status lk_mesh_create(lk_comm *world, int dp, int sp, int ep, lk_mesh *out) {
    lk_status s = lk_comm_check("mesh", "world", world);
    if (s) return s;
    if (!out) return lk_error(LK_EINVAL, "mesh: out: expected a pointer, got NULL");
    int n = world->size;
    if (sp < 1 || ep < 1 || dp < 0)
        return lk_error(LK_EINVAL, "mesh: expected dp >= 0 (0 = the rest), sp >= 1, ep >= 1, got dp %d sp %d ep %d",
                        dp, sp, ep);
    if (n % sp) return lk_error(LK_EINVAL, "mesh: sp %d does not divide the world size %d", sp, n);
    if (n % ep) return lk_error(LK_EINVAL, "mesh: ep %d does not divide the world size %d", ep, n);
    if (dp == 0) dp = n / sp;
    if ((int64_t)dp * sp != n)
        return lk_error(LK_EINVAL, "mesh: dp %d x sp %d = %lld does not match the world size %d", dp, sp,
                        (long long)dp * sp, n);
    memset(out, 0, sizeof *out);
    int r = world->rank;
    out->world = world;
    out->dp_size = dp, out->sp_size = sp, out->ep_size = ep;
    out->sp_rank = r % sp, out->dp_rank = r / sp, out->ep_rank = r % ep;
    /* colors: the coordinates the group does not vary over */
    if ((s = lk_comm_split(world, out->dp_rank, out->sp_rank, &out->sp)) ||
        (s = lk_comm_split(world, r / ep, out->ep_rank, &out->ep)) ||
        (s = lk_comm_split(world, out->sp_rank, out->dp_rank, &out->dp))) {
        lk_mesh_destroy(out);
        return s;
    }
    return LK_OK;
}

void lk_mesh_destroy(lk_mesh *m) {
    if (!m) return;
    lk_comm_destroy(m->sp);
    lk_comm_destroy(m->ep);
    lk_comm_destroy(m->dp);
    m->sp = m->ep = m->dp = NULL;
}

/* --- the SP loss ---------------------------------------------------------------- */

lk_status lk_sp_loss_reduce(lk_comm *sp, double local_sum, int64_t local_valid, double *mean, double *grad_scale) {
    if (!mean || !grad_scale) return lk_error(LK_EINVAL, "sp_loss: mean: expected pointers, got NULL");
    if (local_valid < 0) return lk_error(LK_EINVAL, "sp_loss: local_valid: expected >= 0, got %lld", (long long)local_valid);
    double v[2] = {local_sum, (double)local_valid};
    lk_status s;
    if (sp && (s = lk_comm_all_reduce(sp, v, 2, LK_COMM_F64))) return s;
    *mean = v[1] > 0 ? v[0] / v[1] : 0.0;
    *grad_scale = v[1] > 0 ? 1.0 / v[1] : 0.0;
    return LK_OK;
}

#ifndef LLMKERN_HAVE_MPI
lk_status lk_comm_mpi_world(lk_comm **out) {
    return lk_error(LK_EUNAVAILABLE, "comm: mpi: not available in this build (CMake found no MPI; install "
                    "libopenmpi-dev and reconfigure)");
}
void lk_comm_mpi_finalize(void) {}
#endif

#ifndef LLMKERN_HAVE_NCCL
lk_status lk_comm_nccl_create(lk_comm *bootstrap, int device, lk_comm **out) {
#ifdef LLMKERN_HAVE_CUDA
    return lk_error(LK_EUNAVAILABLE, "comm: nccl: not available in this build (CMake found no nccl.h and libnccl; "
                    "set NCCL_ROOT to where they are and reconfigure)");
#else
    return lk_error(LK_EUNAVAILABLE, "comm: nccl: not available in this build (CUDA is off: LLMKERN_CUDA=OFF, a "
                    "sanitizer build, or no nvcc found)");
#endif
}
#endif
