/* dist_nccl.c (several GPUs) — the NCCL communicator across processes: mpirun -np P, rank
 * r on GPU r, the NCCL world bootstrapped from the MPI one (lk_comm_nccl_create). Every
 * collective on device buffers against what each rank computes on the host: all_reduce
 * (f32, f64, i64; integer-valued data, so any summation order is exact), all_gather,
 * reduce_scatter, broadcast from the last rank, all_to_all with a different byte count
 * for every pair, barrier, pairs split off as a mesh would, and several non-blocking
 * all_reduces in flight at once. Then every collective against the MPI backend's result
 * for the same inputs (random, so the sums' orders differ), on the world and on every
 * group of each DP x SP x EP mesh the world size allows, with random variable all-to-all
 * splits; and the bus bandwidth of all-reduce and all-to-all from 1 MiB to 1 GiB as
 * nccl-tests reports it (printed, for bench/NOTES.md). Skipped (77) with fewer GPUs than ranks: NCCL puts one rank on a
 * GPU. ctest: cuda_dist_nccl_np2 / _np4 (tests/cuda/run_h200.sh runs them on a machine
 * with the GPUs; elsewhere they skip). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "dist_gpu.h"
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

/* --- against the MPI backend -------------------------------------------------------- */

static uint32_t mix(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
    return x;
}

/* Element i of a rank's buffer for test `tag`: uniform in [-1, 1), not integer-valued, so
 * the backends' different summation orders (NCCL's rings, MPI's reduction) show as
 * rounding differences. */
static double rnd(int rank, int tag, int64_t i) {
    return mix((uint32_t)i * 2654435761U ^ mix((uint32_t)(rank * 7919 + tag))) / 2147483648.0 - 1.0;
}

static void *host_of(const void *d, size_t n) {
    void *h = malloc(n ? n : 1);
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    return h;
}

/* max |a - b| over n elements of t, relative to max |b| (exact for i64). */
static double diff(const void *a, const void *b, int64_t n, lk_comm_type t) {
    double m = 0, big = 1e-300;
    for (int64_t i = 0; i < n; i++) {
        double x = t == LK_COMM_F32 ? ((const float *)a)[i] : t == LK_COMM_F64 ? ((const double *)a)[i]
                                                                                 : (double)((const int64_t *)a)[i];
        double y = t == LK_COMM_F32 ? ((const float *)b)[i] : t == LK_COMM_F64 ? ((const double *)b)[i]
                                                                                 : (double)((const int64_t *)b)[i];
        if (fabs(x - y) > m) m = fabs(x - y);
        if (fabs(y) > big) big = fabs(y);
    }
    return m / big;
}

static void fill_rnd(void *h, lk_comm_type t, int rank, int tag, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = rnd(rank, tag, i);
        if (t == LK_COMM_F32) ((float *)h)[i] = (float)v;
        else if (t == LK_COMM_F64) ((double *)h)[i] = v;
        else ((int64_t *)h)[i] = (int64_t)(v * 1e12);
    }
}

/* Every collective on nc (NCCL, device buffers) and on mc (MPI, host buffers) with the
 * same ranks and inputs: sums agree to a few roundings (f32 4·P ulps of the largest
 * value, f64 likewise, i64 exactly), data movement bit for bit. */
static void against_mpi(lk_comm *mc, lk_comm *nc, const char *group) {
    DIST_CHECK(mc->size == nc->size && mc->rank == nc->rank, "%s: ranks: MPI %d of %d, NCCL %d of %d", group,
               mc->rank, mc->size, nc->rank, nc->size);
    if (mc->size != nc->size || mc->rank != nc->rank) return;
    int P = mc->size, r = mc->rank;
    for (int t = 0; t < LK_COMM_TYPE_COUNT; t++) {
        int64_t n = 100003;   /* odd: no type or rank boundary falls on a nice size */
        size_t es = lk_comm_type_size((lk_comm_type)t), nb = (size_t)(n * P) * es;
        double tol = t == LK_COMM_I64 ? 0 : 4.0 * P * (t == LK_COMM_F32 ? 0x1p-24 : 0x1p-53);
        char *h = malloc(nb), *hm = malloc(nb), *hrs = malloc((size_t)n * es);
        fill_rnd(h, (lk_comm_type)t, r, 10 + t, n * P);
        char *d = dev(nb), *drs = dev((size_t)n * es);
        put(d, h, nb);
        memcpy(hm, h, nb);
        DIST_CHECK(lk_comm_reduce_scatter(nc, d, drs, n, (lk_comm_type)t) == LK_OK &&
                       lk_comm_reduce_scatter(mc, hm, hrs, n, (lk_comm_type)t) == LK_OK, "%s reduce_scatter", group);
        void *got = host_of(drs, (size_t)n * es);
        double e = diff(got, hrs, n, (lk_comm_type)t);
        DIST_CHECK(e <= tol, "%s reduce_scatter type %d: NCCL vs MPI %.3g > %.3g", group, t, e, tol);
        free(got);
        DIST_CHECK(lk_comm_all_reduce(nc, d, n * P, (lk_comm_type)t) == LK_OK &&
                       lk_comm_all_reduce(mc, hm, n * P, (lk_comm_type)t) == LK_OK, "%s all_reduce", group);
        got = host_of(d, nb);
        e = diff(got, hm, n * P, (lk_comm_type)t);
        DIST_CHECK(e <= tol, "%s all_reduce type %d: NCCL vs MPI %.3g > %.3g", group, t, e, tol);
        free(got), free(h), free(hm), free(hrs), cudaFree(d), cudaFree(drs);
    }
    /* all_gather and broadcast from every root, 3 odd byte counts */
    size_t nb = 12347;
    unsigned char *h = malloc(nb), *hall = malloc(nb * (size_t)P);
    for (size_t i = 0; i < nb; i++) h[i] = (unsigned char)mix((uint32_t)(i * 131 + (size_t)r));
    char *d = dev(nb), *dall = dev(nb * (size_t)P);
    put(d, h, nb);
    DIST_CHECK(lk_comm_all_gather(nc, d, dall, nb) == LK_OK && lk_comm_all_gather(mc, h, hall, nb) == LK_OK &&
                   same(dall, hall, nb * (size_t)P), "%s all_gather", group);
    for (int root = 0; root < P; root++) {
        put(d, h, nb);
        unsigned char *hb = malloc(nb);
        memcpy(hb, h, nb);
        DIST_CHECK(lk_comm_broadcast(nc, d, nb, root) == LK_OK && lk_comm_broadcast(mc, hb, nb, root) == LK_OK &&
                       same(d, hb, nb), "%s broadcast from %d", group, root);
        free(hb);
    }
    free(h), free(hall), cudaFree(d), cudaFree(dall);
    /* all_to_all with a different, random split for every (sender, receiver) pair, some
     * of them empty; every rank derives the whole table from the same seed */
    int64_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
    for (int q = 0; q < P; q++) {
        uint32_t to = mix((uint32_t)(r * 8 + q) ^ 0x5bd1e995U), from = mix((uint32_t)(q * 8 + r) ^ 0x5bd1e995U);
        sc[q] = to % 4 == 0 ? 0 : (int64_t)(to % 20011), sd[q] = so, so += sc[q];
        rc[q] = from % 4 == 0 ? 0 : (int64_t)(from % 20011), rd[q] = ro, ro += rc[q];
    }
    unsigned char *hs = malloc((size_t)so + 1), *hr = malloc((size_t)ro + 1);
    for (int64_t i = 0; i < so; i++) hs[i] = (unsigned char)mix((uint32_t)(i * 17 + r * 1000003));
    char *ds = dev((size_t)so), *dr = dev((size_t)ro);
    put(ds, hs, (size_t)so);
    DIST_CHECK(lk_comm_all_to_all(nc, ds, sc, sd, dr, rc, rd) == LK_OK &&
                   lk_comm_all_to_all(mc, hs, sc, sd, hr, rc, rd) == LK_OK && same(dr, hr, (size_t)ro),
               "%s all_to_all (variable splits)", group);
    free(hs), free(hr), cudaFree(ds), cudaFree(dr);
}

/* The world, then every group of each DP x SP x EP mesh the world size allows, built
 * both ways (lk_mesh_create over the MPI world and over the NCCL world). */
static void meshes(void) {
    against_mpi(dist_world, nccl, "world");
    int P = nccl->size;
    for (int sp = 1; sp <= P; sp++)
        for (int ep = 1; ep <= P; ep++) {
            if (P % sp || P % ep || (sp == 1 && ep == 1)) continue;
            lk_mesh mm, mn;
            DIST_CHECK(lk_mesh_create(dist_world, 0, sp, ep, &mm) == LK_OK, "MPI mesh sp %d ep %d", sp, ep);
            DIST_CHECK(lk_mesh_create(nccl, 0, sp, ep, &mn) == LK_OK, "NCCL mesh sp %d ep %d", sp, ep);
            char g[64];
            snprintf(g, sizeof g, "mesh dp %d x sp %d, ep %d: dp", P / sp, sp, ep);
            against_mpi(mm.dp, mn.dp, g);
            snprintf(g, sizeof g, "mesh dp %d x sp %d, ep %d: sp", P / sp, sp, ep);
            against_mpi(mm.sp, mn.sp, g);
            snprintf(g, sizeof g, "mesh dp %d x sp %d, ep %d: ep", P / sp, sp, ep);
            against_mpi(mm.ep, mn.ep, g);
            lk_mesh_destroy(&mm), lk_mesh_destroy(&mn);
        }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* nccl-tests' figures, 1 MiB to 1 GiB: algorithm bandwidth = bytes / time (bytes: the
 * all-reduce's buffer, the all-to-all's send buffer), bus bandwidth = algorithm
 * bandwidth x 2 (P-1)/P for all-reduce and x (P-1)/P for all-to-all (what crosses the
 * links). Each time is the mean of several blocking calls after two warm-ups. */
static void bandwidth(void) {
    int P = nccl->size;
    size_t most = (size_t)1 << 30;
    char *a = dev(most), *b = dev(most);
    if (nccl->rank == 0)
        printf("dist_nccl: bus bandwidth on %d GPUs (GB/s; algorithm bandwidth in brackets)\n"
               "  %10s  %24s  %24s\n", P, "bytes", "all_reduce f32", "all_to_all");
    for (size_t bytes = (size_t)1 << 20; bytes <= most; bytes <<= 2) {
        int64_t n = (int64_t)(bytes / 4), sc[8], sd[8];
        for (int q = 0; q < P; q++) sc[q] = (int64_t)(bytes / (size_t)P), sd[q] = q * sc[q];
        int reps = bytes <= ((size_t)16 << 20) ? 50 : 10;
        double t[2];
        for (int which = 0; which < 2; which++) {
            for (int i = 0; i < reps + 2; i++) {
                if (i == 2) lk_comm_barrier(nccl), t[which] = now();
                lk_status s = which == 0 ? lk_comm_all_reduce(nccl, a, n, LK_COMM_F32)
                                         : lk_comm_all_to_all(nccl, a, sc, sd, b, sc, sd);
                DIST_CHECK(s == LK_OK, "bandwidth %s %zu bytes", which ? "all_to_all" : "all_reduce", bytes);
            }
            t[which] = (now() - t[which]) / reps;
        }
        double algo_ar = (double)bytes / t[0] / 1e9, algo_a2a = (double)(sc[0] * P) / t[1] / 1e9;
        if (nccl->rank == 0)
            printf("  %10zu  %7.1f (%6.1f) %6.3f ms  %7.1f (%6.1f) %6.3f ms\n", bytes, algo_ar * 2 * (P - 1) / P,
                   algo_ar, t[0] * 1e3, algo_a2a * (P - 1) / P, algo_a2a, t[1] * 1e3);
    }
    cudaFree(a), cudaFree(b);
}

int main(void) {
    dist_begin();
    if (!dist_gpus_enough("dist_nccl", 8)) return 77;
    DIST_CHECK(lk_comm_nccl_create(dist_world, dist_world->rank, &nccl) == LK_OK && nccl->size == dist_world->size &&
          nccl->rank == dist_world->rank, "nccl world");
    if (nccl) {
        reductions();
        movement();
        groups_and_requests();
        meshes();
        bandwidth();
        lk_comm_destroy(nccl);
    }
    return dist_end("dist_nccl");
}
