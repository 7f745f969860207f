/* dist_comm.c — the non-blocking all-reduce over the MPI world, the way the trainer's
 * data-parallel buckets use it: buckets of odd sizes (f32, f64, i64) all started, one
 * polled with lk_comm_test, then waited in reverse order; plus a bucket on a split
 * sub-communicator in flight at the same time. Each result must equal, bit for bit, the
 * blocking all-reduce of the same data and the sum every rank recomputes on its own
 * (integer values, so f32 and f64 sums are exact in any order, and bf16's too: its
 * values are kept within ±60, so every partial sum of 4 ranks is an integer below 256,
 * exact in bf16's 8 bits); the stats count every
 * start. Run: mpirun -np 2|4 ./dist_comm. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "util.h"

enum { NB = 7 };
static const int64_t sizes[NB] = {1, 7, 1023, 4097, 0, 33, 515};
static const lk_comm_type types[NB] = {LK_COMM_F32, LK_COMM_F64, LK_COMM_F32, LK_COMM_F64, LK_COMM_F32,
                                       LK_COMM_I64, LK_COMM_BF16};

/* Element i of bucket b on rank r: an integer in [-1000, 1000] (bf16: [-60, 60]). */
static int64_t value(uint64_t seed, int r, int b, int64_t i) {
    int64_t half = types[b] == LK_COMM_BF16 ? 60 : 1000;
    return (int64_t)(lk_rng_bits(seed + (uint64_t)r * 7919 + (uint64_t)b, (uint64_t)i) % (uint64_t)(2 * half + 1)) -
           half;
}

static void fill(void *buf, lk_comm_type t, int64_t i, int64_t v) {
    if (t == LK_COMM_F32) ((float *)buf)[i] = (float)v;
    else if (t == LK_COMM_F64) ((double *)buf)[i] = (double)v;
    else if (t == LK_COMM_BF16) ((uint16_t *)buf)[i] = lk_f32_to_bf16((float)v);
    else ((int64_t *)buf)[i] = v;
}

/* buf[b] = this rank's data; want[b] = the sum over the ranks of comm `ranks` (world ranks). */
static void make(uint64_t seed, const int *ranks, int n_ranks, int b, void *buf, void *want) {
    for (int64_t i = 0; i < sizes[b]; i++) {
        int64_t sum = 0;
        for (int k = 0; k < n_ranks; k++) sum += value(seed, ranks[k], b, i);
        fill(buf, types[b], i, value(seed, dist_world->rank, b, i));
        fill(want, types[b], i, sum);
    }
}

int main(void) {
    dist_begin();
    int P = dist_world->size, me = dist_world->rank;
    uint64_t seed = (uint64_t)time(NULL);
    if (lk_comm_broadcast(dist_world, &seed, sizeof seed, 0)) DIST_CHECK(0, "seed broadcast");
    int *all = malloc(sizeof(int) * (size_t)P), *half = malloc(sizeof(int) * (size_t)P), n_half = 0;
    for (int r = 0; r < P; r++) {
        all[r] = r;
        if (r % 2 == me % 2) half[n_half++] = r;
    }
    lk_comm *sub = NULL;
    DIST_CHECK(lk_comm_split(dist_world, me % 2, me, &sub) == LK_OK, "split");

    void *async[NB + 1], *blocking[NB + 1], *want[NB + 1];
    for (int b = 0; b < NB; b++) {
        size_t bytes = (size_t)(sizes[b] ? sizes[b] : 1) * lk_comm_type_size(types[b]);
        async[b] = malloc(bytes), blocking[b] = malloc(bytes), want[b] = malloc(bytes);
        make(seed, all, P, b, async[b], want[b]);
        memcpy(blocking[b], async[b], bytes);
    }
    /* the sub-communicator's bucket reuses bucket 3's shape over its own ranks */
    async[NB] = malloc(8 * 4097), want[NB] = malloc(8 * 4097), blocking[NB] = NULL;
    make(seed, half, n_half, 3, async[NB], want[NB]);

    lk_comm_reset_stats(dist_world);
    lk_comm_request req[NB + 1];
    uint64_t bytes_in = 0;
    for (int b = 0; b < NB; b++) {
        DIST_CHECK(lk_comm_all_reduce_start(dist_world, async[b], sizes[b], types[b], &req[b]) == LK_OK, "start %d", b);
        bytes_in += (uint64_t)sizes[b] * lk_comm_type_size(types[b]);
        if (b == 2) DIST_CHECK(sub && lk_comm_all_reduce_start(sub, async[NB], 4097, LK_COMM_F64, &req[NB]) == LK_OK,
                               "start on the sub-communicator");
    }
    DIST_CHECK(dist_world->stats.calls[LK_COLL_ALL_REDUCE] == NB, "calls %llu",
               (unsigned long long)dist_world->stats.calls[LK_COLL_ALL_REDUCE]);
    DIST_CHECK(dist_world->stats.bytes_in[LK_COLL_ALL_REDUCE] == bytes_in, "bytes_in %llu, expected %llu",
               (unsigned long long)dist_world->stats.bytes_in[LK_COLL_ALL_REDUCE], (unsigned long long)bytes_in);
    DIST_CHECK(dist_world->stats.bytes_wire[LK_COLL_ALL_REDUCE] == 2 * bytes_in * (uint64_t)(P - 1) / (uint64_t)P,
               "bytes_wire %llu", (unsigned long long)dist_world->stats.bytes_wire[LK_COLL_ALL_REDUCE]);
    /* poll one until done: MPI progresses it only inside MPI calls */
    int done = 0;
    for (long spins = 0; !done && spins < 100000000; spins++)
        if (lk_comm_test(dist_world, &req[3], &done) != LK_OK) break;
    DIST_CHECK(done && !req[3].pending, "test never completed bucket 3");
    if (sub) DIST_CHECK(lk_comm_wait(dist_world, &req[NB]) == LK_EINVAL, "a request of another comm waited");
    for (int b = NB - 1; b >= 0; b--) DIST_CHECK(lk_comm_wait(dist_world, &req[b]) == LK_OK, "wait %d", b);
    DIST_CHECK(sub && lk_comm_wait(sub, &req[NB]) == LK_OK, "wait on the sub-communicator");

    /* checked before any other MPI call, which could complete a request wait left open */
    for (int b = 0; b < NB; b++)
        DIST_CHECK(!memcmp(async[b], want[b], (size_t)sizes[b] * lk_comm_type_size(types[b])),
                   "bucket %d (%lld elements): not the exact sum after wait", b, (long long)sizes[b]);
    DIST_CHECK(!memcmp(async[NB], want[NB], 8 * 4097), "the sub-communicator's bucket: not its ranks' sum");
    for (int b = 0; b < NB; b++) {
        DIST_CHECK(lk_comm_all_reduce(dist_world, blocking[b], sizes[b], types[b]) == LK_OK, "blocking %d", b);
        DIST_CHECK(!memcmp(async[b], blocking[b], (size_t)sizes[b] * lk_comm_type_size(types[b])),
                   "bucket %d: start/wait differs from the blocking all_reduce", b);
    }
    DIST_CHECK(dist_world->stats.calls[LK_COLL_ALL_REDUCE] == 2 * NB, "calls after the blocking ones");

    for (int b = 0; b <= NB; b++) free(async[b]), free(blocking[b]), free(want[b]);
    free(all), free(half);
    lk_comm_destroy(sub);
    return dist_end("dist_comm");
}
