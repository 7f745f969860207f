/* ceilings.c — the machine's own limits, measured in the same run as the benchmarks
 * they judge: copy bandwidth (read + write of buffers far larger than the caches, the
 * better of memcpy and a streaming-store copy, since kernels that stream their stores
 * reach the latter) and the f32 GEMM rate through CBLAS. */
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "ops/harness.h"

typedef struct { char *src, *dst; size_t bytes; } copy_job;

/* Each thread copies its own contiguous slice, as a bandwidth-bound kernel would. */
static lk_status copy_memcpy(void *arg) {
    copy_job *j = arg;
    #pragma omp parallel
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        size_t lo = j->bytes * (size_t)t / (size_t)n, hi = j->bytes * (size_t)(t + 1) / (size_t)n;
        memcpy(j->dst + lo, j->src + lo, hi - lo);
    }
    return LK_OK;
}

/* The same with non-temporal stores, which skip the read-for-ownership of each line. */
static lk_status copy_stream(void *arg) {
    copy_job *j = arg;
    const float *src = (const float *)j->src;
    float *dst = (float *)j->dst;
    int64_t n = (int64_t)(j->bytes / sizeof(float));
#if defined(__AVX512F__)
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 16) _mm512_stream_ps(dst + i, _mm512_load_ps(src + i));
    _mm_sfence();
#elif defined(__AVX__)
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
    _mm_sfence();
#else
    (void)src, (void)dst, (void)n;
    return copy_memcpy(arg);
#endif
    return LK_OK;
}

typedef struct { float *a, *b, *c; int n; } gemm_job;

static lk_status gemm_once(void *arg) {
    gemm_job *g = arg;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n,
                g->b, g->n, 0.0f, g->c, g->n);
    return LK_OK;
}

lk_status lk_measure_ceilings(lk_ceilings *c, lk_bench_row rows[2]) {
    copy_job j = {.bytes = (size_t)512 << 20};
    j.src = aligned_alloc(64, j.bytes);
    j.dst = aligned_alloc(64, j.bytes);
    gemm_job g = {.n = 2048};
    size_t gn = (size_t)g.n * (size_t)g.n;
    g.a = malloc(gn * sizeof(float));
    g.b = malloc(gn * sizeof(float));
    g.c = malloc(gn * sizeof(float));
    if (!j.src || !j.dst || !g.a || !g.b || !g.c) {
        free(j.src); free(j.dst); free(g.a); free(g.b); free(g.c);
        return lk_error(LK_ENOMEM, "bench: out of memory measuring the machine's ceilings");
    }
    memset(j.src, 1, j.bytes);
    memset(j.dst, 0, j.bytes);
    lk_rng r = lk_rng_make(7);
    lk_rng_uniform(&r, g.a, (int64_t)gn, -1, 1);
    lk_rng_uniform(&r, g.b, (int64_t)gn, -1, 1);

    lk_status s;
    double memcpy_ms = lk_time_ms(copy_memcpy, &j, 1.0, &s);
    double stream_ms = lk_time_ms(copy_stream, &j, 1.0, &s);
    double copy_ms = memcpy_ms < stream_ms ? memcpy_ms : stream_ms;
    double gemm_ms = lk_time_ms(gemm_once, &g, 1.0, &s);
    c->copy_gbps = 2.0 * (double)j.bytes / (copy_ms * 1e6);
    c->gemm_gflops = 2.0 * (double)g.n * g.n * g.n / (gemm_ms * 1e6);

    rows[0] = (lk_bench_row){.op = "ceiling", .impl = "memcpy", .device = "cpu", .dtype = "u8",
                             .shape = "512MiB", .pass = "copy", .ms = copy_ms, .gbps = c->copy_gbps,
                             .ceiling_fraction = 1.0};
    if (stream_ms < memcpy_ms) snprintf(rows[0].impl, sizeof rows[0].impl, "stream_copy");
    rows[1] = (lk_bench_row){.op = "ceiling", .impl = "cblas_sgemm", .device = "cpu", .dtype = "f32",
                             .shape = "2048x2048x2048", .pass = "gemm", .ms = gemm_ms,
                             .gflops = c->gemm_gflops, .ceiling_fraction = 1.0};
    free(j.src); free(j.dst); free(g.a); free(g.b); free(g.c);
    return LK_OK;
}
