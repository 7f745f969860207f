/* comm_nccl.c — the NCCL backend of lk_comm (include/llmkern/comm.h) on DEVICE buffers,
 * built only when CUDA is on and CMake finds nccl.h and libnccl (the _nccl.c suffix).
 * lk_comm_nccl_create bootstraps over a host communicator (single or MPI); split is
 * ncclCommSplit. Each comm owns a non-blocking stream: a collective first orders it after
 * the legacy default stream (where cudaMemcpy and unstreamed kernels run, so their
 * results are what it reads), and the blocking calls synchronize it before they return.
 * The non-blocking all-reduce records a pooled event that wait synchronizes. Every wait
 * polls NCCL's asynchronous error while the GPU works (a peer gone, a broken link: NCCL's
 * way of not hanging), and an error there aborts the communicator. all_to_all_on posts the
 * same point-to-point group on the caller's stream and returns (no event, no wait), the
 * piece a captured CUDA graph can hold (moe_dispatch's device-count alltoall);
 * all_gather_on, reduce_scatter_on and all_reduce_on do the same with ncclAllGather,
 * ncclReduceScatter (its device-count allgather) and ncclAllReduce (the SP group's loss
 * and the routers' aux-loss sums). Errors come back as LK_ECOMM with NCCL's or CUDA's text
 * and the call's name. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include "llmkern/comm.h"
#include "llmkern/registry.h"

typedef struct {
    ncclComm_t comm;
    int device;
    cudaStream_t stream;
    cudaEvent_t ready;          /* recorded on the default stream, waited by ours */
    float *scratch;             /* the barrier's one element */
    cudaEvent_t *pool;          /* every event all_reduce_start has made ... */
    int n_pool, n_free;         /* ... the first n_free of them idle */
    atomic_int aborted;         /* 1 once ncclCommAbort ran (here or from the watchdog's thread) */
} nccl_state;

/* ncclCommAbort once, whichever thread gets here first. */
static void abort_once(nccl_state *st) {
    if (st->comm && !atomic_exchange(&st->aborted, 1)) ncclCommAbort(st->comm);
}

static lk_status nccl_fail(ncclResult_t r, const char *what) {
    return lk_error(LK_ECOMM, "comm: nccl: %s failed: %s", what, ncclGetErrorString(r));
}
static lk_status cuda_fail(cudaError_t e, const char *what) {
    return lk_error(LK_ECOMM, "comm: nccl: %s failed: %s", what, cudaGetErrorString(e));
}

#define NCCL_TRY(call, what)                                                       \
    do {                                                                           \
        ncclResult_t r_ = (call);                                                  \
        if (r_ != ncclSuccess) return nccl_fail(r_, what);                         \
    } while (0)
#define CUDA_TRY(call, what)                                                       \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess) return cuda_fail(e_, what);                         \
    } while (0)

static nccl_state *state_of(lk_comm *c) { return c->state; }

static ncclDataType_t nccl_type(lk_comm_type t) {
    return t == LK_COMM_F32    ? ncclFloat32
           : t == LK_COMM_F64  ? ncclFloat64
           : t == LK_COMM_BF16 ? ncclBfloat16
                               : ncclInt64;
}

/* Before a collective reads: the default stream's work so far comes first. */
static lk_status order(nccl_state *st) {
    CUDA_TRY(cudaEventRecord(st->ready, cudaStreamLegacy), "cudaEventRecord");
    CUDA_TRY(cudaStreamWaitEvent(st->stream, st->ready, 0), "cudaStreamWaitEvent");
    return LK_OK;
}

/* Until the stream's work (ev NULL) or the event is done, polling NCCL's asynchronous
 * error in between. */
static lk_status wait_polling(nccl_state *st, cudaEvent_t ev, const char *what) {
    for (;;) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(st->stream);
        if (e == cudaSuccess) return LK_OK;
        if (e != cudaErrorNotReady) return cuda_fail(e, what);
        ncclResult_t r = ncclSuccess;
        if (atomic_load(&st->aborted))
            return lk_error(LK_ECOMM, "comm: nccl: %s: the communicator was aborted", what);
        if (ncclCommGetAsyncError(st->comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
            abort_once(st);
            return lk_error(LK_ECOMM, "comm: nccl: %s: the communicator failed (%s) and was aborted", what,
                            ncclGetErrorString(r));
        }
        sched_yield();
    }
}

static lk_status finish(nccl_state *st) { return wait_polling(st, NULL, "cudaStreamSynchronize"); }

static lk_status n_all_reduce(lk_comm *c, void *buf, int64_t n, lk_comm_type dt) {
    nccl_state *st = state_of(c);
    lk_status s = order(st);
    if (s) return s;
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)n, nccl_type(dt), ncclSum, st->comm, st->stream), "ncclAllReduce");
    return finish(st);
}

static lk_status n_all_gather(lk_comm *c, const void *send, void *recv, size_t bytes) {
    nccl_state *st = state_of(c);
    lk_status s = order(st);
    if (s) return s;
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclChar, st->comm, st->stream), "ncclAllGather");
    return finish(st);
}

static lk_status n_reduce_scatter(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt) {
    nccl_state *st = state_of(c);
    lk_status s = order(st);
    if (s) return s;
    NCCL_TRY(ncclReduceScatter(send, recv, (size_t)n, nccl_type(dt), ncclSum, st->comm, st->stream),
             "ncclReduceScatter");
    return finish(st);
}

/* One group of point-to-point calls on stream: NCCL has no all-to-all-v. A zero count
 * posts nothing on either side (the sender's scount[r] is the receiver's rcount[me]). */
static lk_status post_all_to_all(lk_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                                 const int64_t *rc, const int64_t *rd, cudaStream_t stream) {
    nccl_state *st = state_of(c);
    if (sc[c->rank] != rc[c->rank])
        return lk_error(LK_ECOMM, "comm: nccl: all_to_all: rank %d sends %lld bytes to itself but expects %lld",
                        c->rank, (long long)sc[c->rank], (long long)rc[c->rank]);
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (sc[p]) r = ncclSend((const char *)send + sd[p], (size_t)sc[p], ncclChar, p, st->comm, stream);
        if (rc[p] && r == ncclSuccess)
            r = ncclRecv((char *)recv + rd[p], (size_t)rc[p], ncclChar, p, st->comm, stream);
    }
    ncclResult_t e = ncclGroupEnd();    /* always closes the group, even after a failed call */
    if (r != ncclSuccess) return nccl_fail(r, "ncclSend/ncclRecv");
    if (e != ncclSuccess) return nccl_fail(e, "ncclGroupEnd");
    return LK_OK;
}

static lk_status n_all_to_all(lk_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                              const int64_t *rc, const int64_t *rd) {
    nccl_state *st = state_of(c);
    lk_status s = order(st);
    if (!s) s = post_all_to_all(c, send, sc, sd, recv, rc, rd, st->stream);
    return s ? s : finish(st);
}

/* The caller's stream, no ordering event and no wait: capturable (comm.h, version 3). */
static lk_status n_all_to_all_on(lk_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                                 const int64_t *rc, const int64_t *rd, void *stream) {
    return post_all_to_all(c, send, sc, sd, recv, rc, rd, (cudaStream_t)stream);
}

/* Version 4: the all-gather and the reduce-scatter on the caller's stream, likewise. */
static lk_status n_all_gather_on(lk_comm *c, const void *send, void *recv, size_t bytes, void *stream) {
    NCCL_TRY(ncclAllGather(send, recv, bytes, ncclChar, state_of(c)->comm, (cudaStream_t)stream), "ncclAllGather");
    return LK_OK;
}

static lk_status n_reduce_scatter_on(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt,
                                     void *stream) {
    ncclComm_t nc = state_of(c)->comm;
    NCCL_TRY(ncclReduceScatter(send, recv, (size_t)n, nccl_type(dt), ncclSum, nc, (cudaStream_t)stream),
             "ncclReduceScatter");
    return LK_OK;
}

/* Version 5: the all-reduce on the caller's stream, likewise. */
static lk_status n_all_reduce_on(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, void *stream) {
    ncclComm_t nc = state_of(c)->comm;
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)n, nccl_type(dt), ncclSum, nc, (cudaStream_t)stream), "ncclAllReduce");
    return LK_OK;
}

static lk_status n_broadcast(lk_comm *c, void *buf, size_t bytes, int root) {
    nccl_state *st = state_of(c);
    lk_status s = order(st);
    if (s) return s;
    NCCL_TRY(ncclBroadcast(buf, buf, bytes, ncclChar, root, st->comm, st->stream), "ncclBroadcast");
    return finish(st);
}

static lk_status n_barrier(lk_comm *c) {
    nccl_state *st = state_of(c);
    NCCL_TRY(ncclAllReduce(st->scratch, st->scratch, 1, ncclFloat32, ncclSum, st->comm, st->stream),
             "ncclAllReduce (barrier)");
    return finish(st);
}

/* --- the non-blocking all-reduce: an event per request, from a pool ------------------ */

static lk_status n_all_reduce_start(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, lk_comm_request *req) {
    nccl_state *st = state_of(c);
    if (st->n_free == 0) {      /* grows to the most requests ever outstanding, then stays */
        cudaEvent_t *p = realloc(st->pool, (size_t)(st->n_pool + 1) * sizeof *p), ev;
        if (!p) return lk_error(LK_ENOMEM, "comm: nccl: all_reduce_start: out of memory");
        st->pool = p;
        CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        if (st->n_pool) p[st->n_pool] = p[0];   /* idle events sit first, busy ones after */
        p[0] = ev;
        st->n_pool++;
        st->n_free = 1;
    }
    lk_status s = order(st);
    if (s) return s;
    NCCL_TRY(ncclAllReduce(buf, buf, (size_t)n, nccl_type(dt), ncclSum, st->comm, st->stream), "ncclAllReduce");
    cudaEvent_t ev = st->pool[st->n_free - 1];
    CUDA_TRY(cudaEventRecord(ev, st->stream), "cudaEventRecord");
    st->n_free--;
    req->handle = ev;
    return LK_OK;
}

/* Back into the idle part of the pool (any busy slot can take it: events are alike). */
static void release(nccl_state *st, lk_comm_request *req) {
    for (int i = st->n_free; i < st->n_pool; i++)
        if (st->pool[i] == (cudaEvent_t)req->handle) {
            st->pool[i] = st->pool[st->n_free];
            st->pool[st->n_free++] = (cudaEvent_t)req->handle;
            break;
        }
    req->handle = NULL;
}

static lk_status n_wait(lk_comm *c, lk_comm_request *req) {
    lk_status s = wait_polling(state_of(c), (cudaEvent_t)req->handle, "wait (all_reduce_start)");
    release(state_of(c), req);
    return s;
}

static lk_status n_test(lk_comm *c, lk_comm_request *req, int *done) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)req->handle);
    if (e == cudaErrorNotReady) return *done = 0, LK_OK;
    release(state_of(c), req);
    if (e != cudaSuccess) return cuda_fail(e, "cudaEventQuery");
    *done = 1;
    return LK_OK;
}

/* --- lifetime ------------------------------------------------------------------------ */

/* The collective watchdog's hook (comm.h): a collective stuck past train.comm_timeout_s
 * aborts the communicator, so its kernels stop before the process ends. */
static void n_abort(void *arg) { abort_once(arg); }

static void n_destroy(lk_comm *c) {
    nccl_state *st = c->state;
    if (st) {
        lk_comm_watchdog_on_fire(n_abort, st, 0);
        if (st->comm && !atomic_load(&st->aborted)) ncclCommDestroy(st->comm);   /* finishes what is queued */
        for (int i = 0; i < st->n_pool; i++) cudaEventDestroy(st->pool[i]);
        if (st->ready) cudaEventDestroy(st->ready);
        if (st->stream) cudaStreamDestroy(st->stream);
        cudaFree(st->scratch);
        free(st->pool);
    }
    free(st);
    free(c);
}

static lk_status n_split(lk_comm *c, int color, int key, lk_comm **out);

/* An lk_comm around nc (owned from here on, destroyed on failure too). */
static lk_status wrap(ncclComm_t nc, int device, lk_comm **out) {
    lk_comm *c = calloc(1, sizeof *c);
    nccl_state *st = calloc(1, sizeof *st);
    if (!c || !st) {
        free(c), free(st);
        ncclCommDestroy(nc);
        return lk_error(LK_ENOMEM, "comm: nccl: out of memory");
    }
    *c = (lk_comm){
        .version = LK_COMM_VERSION, .backend = "nccl", .state = st,
        .all_reduce = n_all_reduce, .all_gather = n_all_gather, .reduce_scatter = n_reduce_scatter,
        .all_to_all = n_all_to_all, .broadcast = n_broadcast, .barrier = n_barrier, .split = n_split,
        .destroy = n_destroy, .all_reduce_start = n_all_reduce_start, .wait = n_wait, .test = n_test,
        .all_to_all_on = n_all_to_all_on, .all_gather_on = n_all_gather_on,
        .reduce_scatter_on = n_reduce_scatter_on, .all_reduce_on = n_all_reduce_on,
    };
    st->comm = nc, st->device = device;
    ncclResult_t r = ncclCommCount(nc, &c->size);
    if (r == ncclSuccess) r = ncclCommUserRank(nc, &c->rank);
    if (r != ncclSuccess) {
        n_destroy(c);
        return nccl_fail(r, "ncclCommCount/ncclCommUserRank");
    }
    const char *what = "cudaSetDevice";
    cudaError_t e = cudaSetDevice(device);
    if (!e) what = "cudaStreamCreateWithFlags", e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (!e) what = "cudaEventCreateWithFlags", e = cudaEventCreateWithFlags(&st->ready, cudaEventDisableTiming);
    if (!e) what = "cudaMalloc", e = cudaMalloc((void **)&st->scratch, sizeof(float));
    if (e) {
        n_destroy(c);
        return cuda_fail(e, what);
    }
    lk_comm_watchdog_on_fire(n_abort, st, 1);   /* at most 8 communicators are aborted by name */
    *out = c;
    return LK_OK;
}

static lk_status n_split(lk_comm *c, int color, int key, lk_comm **out) {
    nccl_state *st = state_of(c);
    ncclComm_t nc = NULL;
    CUDA_TRY(cudaSetDevice(st->device), "cudaSetDevice");
    NCCL_TRY(ncclCommSplit(st->comm, color, key, &nc, NULL), "ncclCommSplit");
    return wrap(nc, st->device, out);
}

lk_status lk_comm_nccl_create(lk_comm *bootstrap, int device, lk_comm **out) {
    lk_status s = lk_comm_check("comm: nccl", "bootstrap", bootstrap);
    if (s) return s;
    if (!out) return lk_error(LK_EINVAL, "comm: nccl: out: expected a pointer, got NULL");
    if (!strcmp(bootstrap->backend, "nccl"))
        return lk_error(LK_EINVAL, "comm: nccl: bootstrap: expected a host communicator (single, mpi), got nccl");
    const lk_hw *hw = lk_hw_get();
    if (hw->cuda_devices == 0) return lk_error(LK_EUNAVAILABLE, "comm: nccl: %s", hw->cuda_why);
    if (device < 0 || device >= hw->cuda_devices)
        return lk_error(LK_EINVAL, "comm: nccl: device: expected 0 <= device < %d, got %d", hw->cuda_devices, device);
    /* rank 0's failure travels with the id, so no rank waits for a peer that gave up */
    struct { ncclUniqueId id; int32_t ok; } boot = {.ok = 1};
    ncclResult_t r = ncclSuccess;
    if (bootstrap->rank == 0 && (r = ncclGetUniqueId(&boot.id)) != ncclSuccess) boot.ok = 0;
    if ((s = lk_comm_broadcast(bootstrap, &boot, sizeof boot, 0))) return s;
    if (!boot.ok)
        return bootstrap->rank == 0 ? nccl_fail(r, "ncclGetUniqueId")
                                    : lk_error(LK_ECOMM, "comm: nccl: rank 0 could not make the ncclUniqueId");
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    ncclComm_t nc = NULL;
    NCCL_TRY(ncclCommInitRank(&nc, bootstrap->size, boot.id, bootstrap->rank), "ncclCommInitRank");
    return wrap(nc, device, out);
}
