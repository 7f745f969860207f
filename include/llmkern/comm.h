/* comm.h — the communicator: one struct of function pointers (SQLite-VFS style, a version
 * first) that every distributed piece talks through, whatever carries the bytes.
 *
 * Backends: single process (size 1, every collective the identity; always built), MPI
 * (lk_comm_mpi_world; built when CMake finds MPI, else it returns LK_EUNAVAILABLE) and
 * NCCL (lk_comm_nccl_create, on device buffers; built when CUDA is on and CMake finds
 * nccl.h and libnccl, else LK_EUNAVAILABLE). Sub-groups come from lk_comm_split
 * (MPI_Comm_split semantics) and form the DP x SP x EP mesh of lk_mesh_create.
 *
 * The all-reduce also comes non-blocking (lk_comm_all_reduce_start, then lk_comm_wait),
 * so the data-parallel gradient buckets travel while the backward still runs.
 *
 * Callers use the lk_comm_* wrappers, not the pointers: the wrappers check arguments,
 * and count the calls and bytes of each collective in comm->stats (what bench/NOTES.md
 * reports for the Ulysses all-to-all). Every collective is called by every rank of the
 * group in the same order. Errors: LK_EINVAL (bad argument), LK_ECOMM (the transport
 * failed or the ranks disagree), lk_last_error() says which. */
#ifndef LLMKERN_COMM_H
#define LLMKERN_COMM_H

#include <stdint.h>
#include "status.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LK_COLL_ALL_REDUCE,
    LK_COLL_ALL_GATHER,
    LK_COLL_REDUCE_SCATTER,
    LK_COLL_ALL_TO_ALL,
    LK_COLL_BROADCAST,
    LK_COLL_BARRIER,
    LK_COLL_COUNT
} lk_coll;

/* Per collective: calls, bytes this rank handed to the collective (its whole send
 * buffer, its own slice included) and bytes it sent to other ranks (the wire). */
typedef struct {
    uint64_t calls[LK_COLL_COUNT];
    uint64_t bytes_in[LK_COLL_COUNT];
    uint64_t bytes_wire[LK_COLL_COUNT];
} lk_comm_stats;

/* What all_reduce and reduce_scatter sum (lk_dtype has no f64). BF16: each pairwise sum
 * in f32, rounded to bf16 (NCCL's bf16 sum; over MPI an op of llmkern's): half the bytes
 * of f32 on the wire, for the gradients' all-reduce (train.grad_reduce_dtype). */
typedef enum { LK_COMM_F32, LK_COMM_F64, LK_COMM_I64, LK_COMM_BF16, LK_COMM_TYPE_COUNT } lk_comm_type;
LK_API size_t lk_comm_type_size(lk_comm_type t);

/* Version 2 appended the non-blocking all-reduce; a version 1 communicator stays valid
 * (the wrappers run its blocking all_reduce instead). Version 3 appended the all-to-all
 * queued on a stream (all_to_all_on); without it lk_comm_all_to_all_on says so. Version 4
 * appended the all-gather and the reduce-scatter queued on a stream (all_gather_on,
 * reduce_scatter_on), likewise optional. Version 5 appended the all-reduce queued on a
 * stream (all_reduce_on), optional too. */
#define LK_COMM_VERSION 5

typedef struct lk_comm lk_comm;

/* One all-reduce in flight, from lk_comm_all_reduce_start until lk_comm_wait (or
 * lk_comm_test saying done). The caller owns the struct and keeps it in place meanwhile;
 * the backend owns what handle points to. Complete every request before destroying its
 * communicator. */
typedef struct {
    lk_comm *comm;              /* the communicator that started it */
    void *handle;               /* the backend's: an MPI_Request, a pooled cudaEvent_t */
    uint64_t bytes;             /* the buffer's size, as counted in stats at the start */
    int pending;                /* 1 until a wait or a test has completed it */
} lk_comm_request;

struct lk_comm {
    int version;                /* LK_COMM_VERSION */
    const char *backend;        /* "single", "mpi", "nccl" */
    int rank, size;
    void *state;                /* the backend's own */
    lk_comm_stats stats;
    /* Element-wise sum in place over count elements of dt. */
    lk_status (*all_reduce)(lk_comm *c, void *buf, int64_t count, lk_comm_type dt);
    /* recv[r * bytes .. ] = rank r's send (bytes each). */
    lk_status (*all_gather)(lk_comm *c, const void *send, void *recv, size_t bytes);
    /* recv (count elements) = Σ_r rank r's send[rank * count ..]: sum. */
    lk_status (*reduce_scatter)(lk_comm *c, const void *send, void *recv, int64_t count, lk_comm_type dt);
    /* Variable splits in bytes: send[sdispl[r] .. + scount[r]] goes to rank r and lands
     * at its recv[rdispl[me] ..]; rcount[r] must equal what r sends here. */
    lk_status (*all_to_all)(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl, void *recv,
                            const int64_t *rcount, const int64_t *rdispl);
    lk_status (*broadcast)(lk_comm *c, void *buf, size_t bytes, int root);
    lk_status (*barrier)(lk_comm *c);
    /* A new communicator of the ranks with the same color, ordered by key (then rank). */
    lk_status (*split)(lk_comm *c, int color, int key, lk_comm **out);
    void (*destroy)(lk_comm *c);
    /* --- version 2; each optional (NULL: the wrappers block in all_reduce instead) --- */
    /* Starts all_reduce's sum and returns; sets req->handle. buf stays the collective's
     * until wait (or test) completes it. */
    lk_status (*all_reduce_start)(lk_comm *c, void *buf, int64_t count, lk_comm_type dt, lk_comm_request *req);
    /* Blocks until req is complete and releases its handle. */
    lk_status (*wait)(lk_comm *c, lk_comm_request *req);
    /* *done = 1 (handle released) when req is complete, else 0; never blocks. NULL: wait. */
    lk_status (*test)(lk_comm *c, lk_comm_request *req, int *done);
    /* --- version 3; optional (NULL: lk_comm_all_to_all_on returns LK_EUNAVAILABLE) --- */
    /* all_to_all's exchange queued on `stream` (a cudaStream_t of the comm's device) after
     * what is already there, returning at once: no synchronization and no host read of
     * the buffers, so a CUDA graph can capture it. The NCCL backend has it. */
    lk_status (*all_to_all_on)(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl,
                               void *recv, const int64_t *rcount, const int64_t *rdispl, void *stream);
    /* --- version 4; each optional (NULL: its lk_comm_*_on wrapper returns LK_EUNAVAILABLE) --- */
    /* all_gather's and reduce_scatter's exchanges queued on `stream` as all_to_all_on is:
     * no synchronization, no host read, capturable. The NCCL backend has them. */
    lk_status (*all_gather_on)(lk_comm *c, const void *send, void *recv, size_t bytes, void *stream);
    lk_status (*reduce_scatter_on)(lk_comm *c, const void *send, void *recv, int64_t count, lk_comm_type dt,
                                   void *stream);
    /* --- version 5; optional (NULL: lk_comm_all_reduce_on returns LK_EUNAVAILABLE) --- */
    /* all_reduce's sum queued on `stream`, as all_to_all_on: the device-side scalars of a
     * step (the SP group's loss and token count, the router's aux-loss sums) without a
     * host read. The NCCL backend has it. */
    lk_status (*all_reduce_on)(lk_comm *c, void *buf, int64_t count, lk_comm_type dt, void *stream);
};

/* The single-process communicator (rank 0 of 1). */
LK_API lk_status lk_comm_single(lk_comm **out);
/* A process-wide single-process communicator for callers given none (never destroy it). */
LK_API lk_comm *lk_comm_self(void);
/* MPI_COMM_WORLD (MPI initialized here when the caller has not). LK_EUNAVAILABLE in a
 * build without MPI. */
LK_API lk_status lk_comm_mpi_world(lk_comm **out);
/* MPI_Finalize when lk_comm_mpi_world initialized MPI; a no-op otherwise. */
LK_API void lk_comm_mpi_finalize(void);
/* An NCCL communicator of bootstrap's ranks, on CUDA device `device` (each rank its own):
 * rank 0 makes the ncclUniqueId and broadcasts it over bootstrap (single or MPI), then
 * every rank joins. Buffers passed to its collectives are DEVICE pointers; they run on
 * the comm's own non-blocking stream, and the blocking ones synchronize it before they
 * return (buffers ready, as with MPI). It orders itself after the legacy default stream;
 * work on other streams must be done (synchronized) before a collective reads it. It
 * leaves `device` current on the calling thread: call its collectives with it current.
 * bootstrap stays the caller's. LK_EINVAL (bootstrap, device, out), LK_EUNAVAILABLE in a
 * build without NCCL or on a machine without a GPU (the message says why), LK_ECOMM with
 * NCCL's or CUDA's text. */
LK_API lk_status lk_comm_nccl_create(lk_comm *bootstrap, int device, lk_comm **out);

/* The wrappers: argument checks, stats, then the backend. */
LK_API lk_status lk_comm_all_reduce(lk_comm *c, void *buf, int64_t count, lk_comm_type dt);
/* The non-blocking all-reduce: checks and counts like lk_comm_all_reduce, then starts it
 * and fills *req (left untouched on LK_EINVAL). Several may be outstanding; every rank
 * starts them in the same order. A communicator without a non-blocking path (version 1,
 * or NULL members) runs the blocking one here, and req comes back already complete. */
LK_API lk_status lk_comm_all_reduce_start(lk_comm *c, void *buf, int64_t count, lk_comm_type dt, lk_comm_request *req);
/* Blocks until req is complete: buf then holds the sum. A complete req returns LK_OK at
 * once (waiting twice is harmless). LK_EINVAL when req was started on another comm. */
LK_API lk_status lk_comm_wait(lk_comm *c, lk_comm_request *req);
/* *done = 1 when req is complete (as after wait), else 0; it also drives the transport
 * (MPI progresses a request only inside MPI calls). */
LK_API lk_status lk_comm_test(lk_comm *c, lk_comm_request *req, int *done);
LK_API lk_status lk_comm_all_gather(lk_comm *c, const void *send, void *recv, size_t bytes);
LK_API lk_status lk_comm_reduce_scatter(lk_comm *c, const void *send, void *recv, int64_t count, lk_comm_type dt);
LK_API lk_status lk_comm_all_to_all(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl,
                             void *recv, const int64_t *rcount, const int64_t *rdispl);
/* lk_comm_all_to_all queued on a CUDA stream (the member above): the counts and
 * displacements are host values, the buffers device memory the exchange reads and writes
 * in stream order; returns before the bytes have moved. Counted in stats as all_to_all.
 * LK_EUNAVAILABLE for a communicator without it (single, mpi, version < 3). */
LK_API lk_status lk_comm_all_to_all_on(lk_comm *c, const void *send, const int64_t *scount, const int64_t *sdispl,
                                       void *recv, const int64_t *rcount, const int64_t *rdispl, void *stream);
/* lk_comm_all_gather and lk_comm_reduce_scatter queued on a CUDA stream (version 4): the
 * same arguments and results, the buffers device memory read and written in stream order;
 * they return before the bytes have moved. Counted in stats as their blocking twins.
 * LK_EUNAVAILABLE for a communicator without them (single, mpi, version < 4): those are
 * host-memory groups, and a caller with device buffers and one rank copies on its own
 * stream instead (moe_dispatch does). */
LK_API lk_status lk_comm_all_gather_on(lk_comm *c, const void *send, void *recv, size_t bytes, void *stream);
LK_API lk_status lk_comm_reduce_scatter_on(lk_comm *c, const void *send, void *recv, int64_t count, lk_comm_type dt,
                                           void *stream);
/* lk_comm_all_reduce queued on a CUDA stream (version 5): buf device memory, summed in
 * place in stream order; returns before the sum is there. Counted in stats as
 * all_reduce. LK_EUNAVAILABLE for a communicator without it (single, mpi, version < 5). */
LK_API lk_status lk_comm_all_reduce_on(lk_comm *c, void *buf, int64_t count, lk_comm_type dt, void *stream);
LK_API lk_status lk_comm_broadcast(lk_comm *c, void *buf, size_t bytes, int root);
LK_API lk_status lk_comm_barrier(lk_comm *c);
LK_API lk_status lk_comm_split(lk_comm *c, int color, int key, lk_comm **out);
LK_API void lk_comm_destroy(lk_comm *c);
LK_API void lk_comm_reset_stats(lk_comm *c);
/* LK_OK when c is a communicator this version understands (names arg in the error). */
LK_API lk_status lk_comm_check(const char *op, const char *arg, const lk_comm *c);

/* --- the collective watchdog -------------------------------------------------------
 * A stopped rank (SIGSTOP, a debugger, a wedged GPU) would leave every other rank blocked
 * in its next collective for ever. Armed, every blocking wrapper above (the collectives,
 * lk_comm_wait, lk_comm_split) on a group of two or more is timed by one thread; a call
 * still in flight after timeout_s seconds writes one line to stderr naming the call, the
 * world rank and the step, e.g.
 *   llmkern: rank 0: wait (step 12) did not complete within 300 s (train.comm_timeout_s) ...
 * runs the abort hooks (an NCCL communicator registers ncclCommAbort), and ends the
 * process with exit status 3, so mpirun ends the job. lk_train_run arms it with
 * train.comm_timeout_s. timeout_s 0 disarms (and stops the thread). LK_EINVAL for a
 * negative or NaN timeout. Process-wide; call from the thread that runs the collectives. */
LK_API lk_status lk_comm_watchdog_arm(double timeout_s, int rank);
/* The step the message names (-1: none). */
LK_API void lk_comm_watchdog_step(int64_t step);
/* A longer limit (seconds; 0 ends it) for a phase where one rank legitimately keeps the
 * others waiting: rank 0 writing a checkpoint, every rank loading data and the model
 * before the first collective. lk_train_run gives 10 x train.comm_timeout_s there. */
LK_API void lk_comm_watchdog_grace(double seconds);
/* Adds (add 1) or removes (add 0) fn(arg), run when the watchdog fires, before the exit. */
LK_API lk_status lk_comm_watchdog_on_fire(void (*fn)(void *), void *arg, int add);

/* --- the DP x SP x EP mesh ------------------------------------------------------- */

/* The mesh as VeOmni lays it out. world = dp x sp, SP innermost (its all-to-alls are the
 * heaviest traffic): world rank = dp_rank * sp + sp_rank. Expert parallelism folds over
 * the same ranks: ep divides the world size and an EP group is ep consecutive ranks
 * (ep_rank = rank % ep), so each rank runs the experts of its ep_rank for the tokens of
 * its EP group, whatever their SP or DP coordinates. sp = ep = 2, dp = 2 is 4 ranks.
 * Each group is its own communicator. */
typedef struct {
    lk_comm *world, *dp, *sp, *ep;      /* world is borrowed; the groups are owned */
    int dp_size, sp_size, ep_size;
    int dp_rank, sp_rank, ep_rank;
} lk_mesh;

/* dp x sp must equal world->size (dp 0 = world->size / sp) and ep must divide it.
 * LK_EINVAL with the sizes when they do not, before any collective runs. */
LK_API lk_status lk_mesh_create(lk_comm *world, int dp, int sp, int ep, lk_mesh *out);
LK_API void lk_mesh_destroy(lk_mesh *m);

/* --- the loss across sequence-parallel ranks ------------------------------------ */

/* Each SP rank holds the loss summed over its valid tokens (local_sum) and their count.
 * mean = Σ sums / Σ counts over the group; grad_scale = 1 / Σ counts, the factor each
 * rank's d_logits takes. No valid token anywhere: mean 0 and grad_scale 0 (no NaN).
 * sp NULL = one process. */
LK_API lk_status lk_sp_loss_reduce(lk_comm *sp, double local_sum, int64_t local_valid, double *mean, double *grad_scale);

#ifdef __cplusplus
}
#endif
#endif
