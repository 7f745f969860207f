/* comm_mpi.c — the MPI backend of lk_comm (include/llmkern/comm.h), built only when
 * CMake finds MPI (the _mpi.c suffix). One MPI_Comm per lk_comm; split is
 * MPI_Comm_split; the non-blocking all-reduce is MPI_Iallreduce / MPI_Wait / MPI_Test.
 * Byte counts above INT_MAX are refused (MPI's int counts) rather than truncated.
 * Errors come back as LK_ECOMM with MPI's own text. MPI has no bf16: LK_COMM_BF16 sums
 * 16-bit words with an op of this file's (each pair in f32, rounded), one per communicator. */
#include <limits.h>
#include <stdlib.h>
#include <mpi.h>
#include "llmkern/comm.h"
#include "llmkern/tensor.h"

static int we_initialized;

typedef struct {
    MPI_Comm comm;
    MPI_Op bf16_sum;            /* LK_COMM_BF16's sum */
    int *sc, *sd, *rc, *rd;     /* int copies of all_to_all's counts, size entries each */
} mpi_state;

static lk_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return lk_error(LK_ECOMM, "comm: mpi: %s failed: %.*s", what, len, msg);
}

#define MPI_TRY(call, what)                       \
    do {                                          \
        int rc_ = (call);                         \
        if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, what); \
    } while (0)

static MPI_Comm comm_of(lk_comm *c) { return ((mpi_state *)c->state)->comm; }

static MPI_Datatype mpi_type(lk_comm_type t) {
    return t == LK_COMM_F32    ? MPI_FLOAT
           : t == LK_COMM_F64  ? MPI_DOUBLE
           : t == LK_COMM_BF16 ? MPI_UINT16_T
                               : MPI_INT64_T;
}

static MPI_Op sum_of(lk_comm *c, lk_comm_type t) {
    return t == LK_COMM_BF16 ? ((mpi_state *)c->state)->bf16_sum : MPI_SUM;
}

/* inout[i] = in[i] + inout[i] for bf16 words: the sum in f32, rounded once (as NCCL's). */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = lk_f32_to_bf16(lk_bf16_to_f32(a[i]) + lk_bf16_to_f32(b[i]));
}

static lk_status too_big(const char *what, uint64_t n) {
    return lk_error(LK_ECOMM, "comm: mpi: %s: expected at most %d elements per call, got %llu", what, INT_MAX,
                    (unsigned long long)n);
}

static lk_status m_all_reduce(lk_comm *c, void *buf, int64_t n, lk_comm_type dt) {
    if (n > INT_MAX) return too_big("all_reduce", (uint64_t)n);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), sum_of(c, dt), comm_of(c)), "MPI_Allreduce");
    return LK_OK;
}

/* The request lives in req->handle itself: no allocation per bucket on the hot path. */
_Static_assert(sizeof(MPI_Request) <= sizeof(void *), "an MPI_Request must fit in lk_comm_request.handle");

static MPI_Request *request_of(lk_comm_request *req) { return (MPI_Request *)&req->handle; }

static lk_status m_all_reduce_start(lk_comm *c, void *buf, int64_t n, lk_comm_type dt, lk_comm_request *req) {
    if (n > INT_MAX) return too_big("all_reduce_start", (uint64_t)n);
    MPI_Request r;
    MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), sum_of(c, dt), comm_of(c), &r), "MPI_Iallreduce");
    *request_of(req) = r;
    return LK_OK;
}

static lk_status m_wait(lk_comm *c, lk_comm_request *req) {
    MPI_TRY(MPI_Wait(request_of(req), MPI_STATUS_IGNORE), "MPI_Wait");
    return LK_OK;
}

static lk_status m_test(lk_comm *c, lk_comm_request *req, int *done) {
    MPI_TRY(MPI_Test(request_of(req), done, MPI_STATUS_IGNORE), "MPI_Test");
    return LK_OK;
}

static lk_status m_all_gather(lk_comm *c, const void *send, void *recv, size_t bytes) {
    if (bytes > INT_MAX) return too_big("all_gather", bytes);
    MPI_TRY(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm_of(c)), "MPI_Allgather");
    return LK_OK;
}

static lk_status m_reduce_scatter(lk_comm *c, const void *send, void *recv, int64_t n, lk_comm_type dt) {
    if (n > INT_MAX) return too_big("reduce_scatter", (uint64_t)n);
    MPI_TRY(MPI_Reduce_scatter_block(send, recv, (int)n, mpi_type(dt), sum_of(c, dt), comm_of(c)),
            "MPI_Reduce_scatter_block");
    return LK_OK;
}

static lk_status m_all_to_all(lk_comm *c, const void *send, const int64_t *sc, const int64_t *sd, void *recv,
                              const int64_t *rc, const int64_t *rd) {
    mpi_state *st = c->state;
    for (int r = 0; r < c->size; r++) {
        if (sc[r] + sd[r] > INT_MAX || rc[r] + rd[r] > INT_MAX)
            return too_big("all_to_all", (uint64_t)(sc[r] + sd[r] > rc[r] + rd[r] ? sc[r] + sd[r] : rc[r] + rd[r]));
        st->sc[r] = (int)sc[r], st->sd[r] = (int)sd[r], st->rc[r] = (int)rc[r], st->rd[r] = (int)rd[r];
    }
    MPI_TRY(MPI_Alltoallv(send, st->sc, st->sd, MPI_BYTE, recv, st->rc, st->rd, MPI_BYTE, st->comm),
            "MPI_Alltoallv");
    return LK_OK;
}

static lk_status m_broadcast(lk_comm *c, void *buf, size_t bytes, int root) {
    if (bytes > INT_MAX) return too_big("broadcast", bytes);
    MPI_TRY(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c)), "MPI_Bcast");
    return LK_OK;
}

static lk_status m_barrier(lk_comm *c) {
    MPI_TRY(MPI_Barrier(comm_of(c)), "MPI_Barrier");
    return LK_OK;
}

static void m_destroy(lk_comm *c) {
    mpi_state *st = c->state;
    if (st) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized && st->comm != MPI_COMM_NULL) MPI_Comm_free(&st->comm);
        if (!finalized && st->bf16_sum != MPI_OP_NULL) MPI_Op_free(&st->bf16_sum);
        free(st->sc);
    }
    free(st);
    free(c);
}

static lk_status wrap(MPI_Comm mc, lk_comm **out);

static lk_status m_split(lk_comm *c, int color, int key, lk_comm **out) {
    MPI_Comm nc;
    MPI_TRY(MPI_Comm_split(comm_of(c), color, key, &nc), "MPI_Comm_split");
    lk_status s = wrap(nc, out);
    if (s) MPI_Comm_free(&nc);
    return s;
}

static lk_status wrap(MPI_Comm mc, lk_comm **out) {
    lk_comm *c = calloc(1, sizeof *c);
    mpi_state *st = calloc(1, sizeof *st);
    int rank, size;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    int *counts = calloc(4 * (size_t)size, sizeof(int));
    if (!c || !st || !counts) {
        free(c), free(st), free(counts);
        return lk_error(LK_ENOMEM, "comm: mpi: out of memory");
    }
    /* errors come back as codes, not aborts */
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    *st = (mpi_state){.comm = mc, .bf16_sum = MPI_OP_NULL, .sc = counts, .sd = counts + size, .rc = counts + 2 * size,
                      .rd = counts + 3 * size};
    int rc = MPI_Op_create(bf16_sum, 1, &st->bf16_sum);
    if (rc != MPI_SUCCESS) {
        free(c), free(st), free(counts);
        return mpi_fail(rc, "MPI_Op_create");
    }
    *c = (lk_comm){
        .version = LK_COMM_VERSION, .backend = "mpi", .rank = rank, .size = size, .state = st,
        .all_reduce = m_all_reduce, .all_gather = m_all_gather, .reduce_scatter = m_reduce_scatter,
        .all_to_all = m_all_to_all, .broadcast = m_broadcast, .barrier = m_barrier, .split = m_split,
        .destroy = m_destroy, .all_reduce_start = m_all_reduce_start, .wait = m_wait, .test = m_test,
    };
    *out = c;
    return LK_OK;
}

lk_status lk_comm_mpi_world(lk_comm **out) {
    if (!out) return lk_error(LK_EINVAL, "comm: out: expected a pointer, got NULL");
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        int provided;
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        we_initialized = 1;
    }
    MPI_Comm dup;
    MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    lk_status s = wrap(dup, out);
    if (s) MPI_Comm_free(&dup);
    return s;
}

void lk_comm_mpi_finalize(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (we_initialized && !fin) MPI_Finalize();
}
