/* dist_nccl.c (several GPUs) — the NCCL communicator across processes: mpirun -np P, rank
 * r on GPU r, the NCCL world bootstrapped from the MPI one (lk_comm_nccl_create). Every
 * collective on device buffers against what each rank computes on the host: all_reduce
 * (f32, f64, i64; integer-valued data, so any summation order is exact), all_gather,
 * reduce_scatter, broadcast from the last rank, all_to_all with a different byte count
 * for every pair, barrier, pairs split off as a mesh would, and several non-blocking
 * all_reduces in flight at once. Then the all-reduce's bus bandwidth on 256 MiB (printed,
 * for bench/NOTES.md). Skipped (77) with fewer GPUs than ranks: NCCL puts one rank on a
 * GPU. ctest: cuda_dist_nccl_np2 / _np4 (tests/cuda/run_h200.sh runs them on a machine
 * with the GPUs; elsewhere they skip). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "util.h"

static lk_comm *nccl;

static void *dev(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
        exit(1);
    }
    cudaMemset(p, 0xff, bytes ? bytes : 1);
    return p;
}

static void put(void *d, const void *h, size_t n) { cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); }

static int same(const void *d, const void *want, size_t n) {
    void *h = malloc(n ? n : 1);
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    int ok = memcmp(h, want, n) == 0;
    free(h);
    return ok;
}

/* value i of rank r, integer-valued in every type */
static double val(int r, int64_t i) { return (double)((i * 7 + r * 13) % 101) - 50.0; }

static void fill(void *h, lk_comm_type t, int r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (t == LK_COMM_F32) ((float *)h)[i] = (float)val(r, i);
        else if (t == LK_COMM_F64) ((double *)h)[i] = val(r, i);
        else ((int64_t *)h)[i] = (int64_t)val(r, i);
    }
}

static void sum_of_ranks(void *h, lk_comm_type t, int P, int64_t off, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < P; r++) s += val(r, off + i);
        if (t == LK_COMM_F32) ((float *)h)[i] = (float)s;
        else if (t == LK_COMM_F64) ((double *)h)[i] = s;
        else ((int64_t *)h)[i] = (int64_t)s;
    }
}

static void reductions(void) {
    int P = nccl->size, r = nccl->rank;
    const int64_t counts[] = {1, 1023, 1 << 20};
    for (int t = 0; t < LK_COMM_TYPE_COUNT; t++)
        for (int k = 0; k < 3; k++) {
            int64_t n = counts[k];
            size_t es = lk_comm_type_size((lk_comm_type)t);
            char *h = malloc((size_t)(n * P) * es), *want = malloc((size_t)(n * P) * es);
            char *buf = dev((size_t)(n * P) * es), *out = dev((size_t)n * es);
            fill(h, (lk_comm_type)t, r, n * P);
            put(buf, h, (size_t)(n * P) * es);
            DIST_CHECK(lk_comm_reduce_scatter(nccl, buf, out, n, (lk_comm_type)t) == LK_OK, "reduce_scatter");
            sum_of_ranks(want, (lk_comm_type)t, P, (int64_t)r * n, n);
            DIST_CHECK(same(out, want, (size_t)n * es), "reduce_scatter type %d n %lld", t, (long long)n);
            DIST_CHECK(lk_comm_all_reduce(nccl, buf, n * P, (lk_comm_type)t) == LK_OK, "all_reduce");
            sum_of_ranks(want, (lk_comm_type)t, P, 0, n * P);
            DIST_CHECK(same(buf, want, (size_t)(n * P) * es), "all_reduce type %d n %lld", t, (long long)n * P);
            cudaFree(buf), cudaFree(out), free(h), free(want);
        }
}

static void movement(void) {
    int P = nccl->size, r = nccl->rank;
    size_t nb = 4099;
    unsigned char *h = malloc(nb * (size_t)P), *want = malloc(nb * (size_t)P);
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < nb; i++) want[(size_t)q * nb + i] = (unsigned char)(i * 31 + (size_t)q * 7);
    memcpy(h, want + (size_t)r * nb, nb);
    char *src = dev(nb), *all = dev(nb * (size_t)P);
    put(src, h, nb);
    DIST_CHECK(lk_comm_all_gather(nccl, src, all, nb) == LK_OK && same(all, want, nb * (size_t)P), "all_gather");
    put(src, h, nb);   /* every rank's own bytes; the last rank's reach everyone */
    DIST_CHECK(lk_comm_broadcast(nccl, src, nb, P - 1) == LK_OK && same(src, want + (size_t)(P - 1) * nb, nb),
          "broadcast from %d", P - 1);
    /* all_to_all: rank s sends (s + 1) * (d + 1) * 13 bytes of value s*16+d to rank d */
    int64_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = (int64_t)(r + 1) * (q + 1) * 13, sd[q] = so, so += sc[q];
        rc[q] = (int64_t)(q + 1) * (r + 1) * 13, rd[q] = ro, ro += rc[q];
    }
    unsigned char *hs = malloc((size_t)so), *hw = malloc((size_t)ro);
    for (int q = 0; q < P; q++) memset(hs + sd[q], r * 16 + q, (size_t)sc[q]);
    for (int q = 0; q < P; q++) memset(hw + rd[q], q * 16 + r, (size_t)rc[q]);
    char *ds = dev((size_t)so), *dr = dev((size_t)ro);
    put(ds, hs, (size_t)so);
    DIST_CHECK(lk_comm_all_to_all(nccl, ds, sc, sd, dr, rc, rd) == LK_OK && same(dr, hw, (size_t)ro), "all_to_all");
    DIST_CHECK(lk_comm_barrier(nccl) == LK_OK, "barrier");
    cudaFree(src), cudaFree(all), cudaFree(ds), cudaFree(dr), free(h), free(want), free(hs), free(hw);
}

/* pairs of consecutive ranks, as the mesh's SP groups are; then buckets in flight */
static void groups_and_requests(void) {
    int r = nccl->rank;
    lk_comm *pair = NULL;
    DIST_CHECK(lk_comm_split(nccl, r / 2, r, &pair) == LK_OK && pair->size == (nccl->size > 1 ? 2 : 1), "split");
    if (pair) {
        int64_t h = r, *d = dev(8);
        put(d, &h, 8);
        DIST_CHECK(lk_comm_all_reduce(pair, d, 1, LK_COMM_I64) == LK_OK, "pair all_reduce");
        int64_t want = pair->size == 2 ? 4 * (r / 2) + 1 : r;
        DIST_CHECK(same(d, &want, 8), "pair sum");
        cudaFree(d);
        lk_comm_destroy(pair);
    }
    enum { NB = 6 };
    lk_comm_request req[NB];
    float *b[NB], *want[NB];
    int64_t n[NB] = {1, 7, 1023, 4097, 65536, 333};
    for (int i = 0; i < NB; i++) {
        float *h = malloc((size_t)n[i] * 4);
        want[i] = malloc((size_t)n[i] * 4);
        fill(h, LK_COMM_F32, r + i, n[i]);
        for (int64_t j = 0; j < n[i]; j++) {
            double s = 0;
            for (int q = 0; q < nccl->size; q++) s += val(q + i, j);
            want[i][j] = (float)s;
        }
        b[i] = dev((size_t)n[i] * 4);
        put(b[i], h, (size_t)n[i] * 4);
        free(h);
        DIST_CHECK(lk_comm_all_reduce_start(nccl, b[i], n[i], LK_COMM_F32, &req[i]) == LK_OK, "start %d", i);
    }
    for (int i = NB - 1; i >= 0; i--) {
        DIST_CHECK(lk_comm_wait(nccl, &req[i]) == LK_OK && same(b[i], want[i], (size_t)n[i] * 4), "bucket %d", i);
        cudaFree(b[i]), free(want[i]);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* nccl-tests' bus bandwidth: 2 (P-1)/P of the buffer crosses each link per all-reduce */
static void bandwidth(void) {
    int64_t n = (int64_t)64 << 20;   /* 256 MiB of f32 */
    float *d = dev((size_t)n * 4);
    for (int i = 0; i < 3; i++) lk_comm_all_reduce(nccl, d, n, LK_COMM_F32);
    const int reps = 10;
    lk_comm_barrier(nccl);
    double t0 = now();
    for (int i = 0; i < reps; i++) lk_comm_all_reduce(nccl, d, n, LK_COMM_F32);
    double t = (now() - t0) / reps, bytes = (double)n * 4, P = nccl->size;
    if (nccl->rank == 0)
        printf("dist_nccl: all_reduce 256 MiB f32 on %d GPUs: %.3f ms, algorithm %.0f GB/s, bus %.0f GB/s\n",
               nccl->size, t * 1e3, bytes / t / 1e9, bytes / t / 1e9 * 2 * (P - 1) / P);
    cudaFree(d);
}

int main(void) {
    dist_begin();
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (ndev < dist_world->size || dist_world->size > 8) {
        if (dist_world->rank == 0)
            printf("dist_nccl: SKIPPED, %d ranks need %d GPUs (one each), found %d\n", dist_world->size,
                   dist_world->size, ndev);
        lk_comm_destroy(dist_world);
        lk_comm_mpi_finalize();
        return 77;
    }
    DIST_CHECK(lk_comm_nccl_create(dist_world, dist_world->rank, &nccl) == LK_OK && nccl->size == dist_world->size &&
          nccl->rank == dist_world->rank, "nccl world");
    if (nccl) {
        reductions();
        movement();
        groups_and_requests();
        bandwidth();
        lk_comm_destroy(nccl);
    }
    return dist_end("dist_nccl");
}
