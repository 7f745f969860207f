/* cuda_util.c — see cuda_util.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <setjmp.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"

#define MAX_BUFS 256
static void *dev_bufs[MAX_BUFS], *host_bufs[MAX_BUFS];
static int n_dev, n_host;

int lkt_have_gpu(const char *test) {
    if (lk_init() != LK_OK) {
        printf("%s: lk_init failed: %s\n", test, lk_last_error());
        return 0;
    }
    const lk_hw *hw = lk_hw_get();
    if (hw->cuda_devices == 0) {
        printf("%s: SKIPPED, no GPU here (%s)\n", test, hw->cuda_why);
        return 0;
    }
    printf("%s: on %s, compute capability %d.%d\n", test, hw->cuda_name, hw->cuda_cc / 10, hw->cuda_cc % 10);
    const char *filter = getenv("LK_TEST_FILTER");
    if (filter) {
        printf("%s: only the tests matching LK_TEST_FILTER=%s\n", test, filter);
        cmocka_set_test_filter(filter);
    }
    return 1;
}

void *lkt_dev(size_t bytes) {
    void *p = NULL;
    assert_int_equal(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
    assert_true(n_dev < MAX_BUFS);
    dev_bufs[n_dev++] = p;
    return p;
}

double *lkt_alloc(int64_t n) {
    double *p = calloc((size_t)(n ? n : 1), sizeof(double));
    assert_non_null(p);
    assert_true(n_host < MAX_BUFS);
    host_bufs[n_host++] = p;
    return p;
}

void lkt_free_all(void) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < n_dev; i++) cudaFree(dev_bufs[i]);
    for (int i = 0; i < n_host; i++) free(host_bufs[i]);
    n_dev = n_host = 0;
}

void *lkt_upload(double *x, int64_t n, lk_dtype dt) {
    size_t es = lk_dtype_size(dt);
    unsigned char *h = malloc((size_t)(n ? n : 1) * es);
    assert_non_null(h);
    for (int64_t i = 0; i < n; i++) {
        lk_store(h, dt, i, x[i]);
        x[i] = lk_load(h, dt, i);
    }
    void *d = lkt_dev((size_t)n * es);
    assert_int_equal(cudaMemcpy(d, h, (size_t)n * es, cudaMemcpyHostToDevice), cudaSuccess);
    free(h);
    return d;
}

void lkt_poison(void *dev, size_t bytes) { assert_int_equal(cudaMemset(dev, 0xff, bytes), cudaSuccess); }

void lkt_download(const void *dev, int64_t n, lk_dtype dt, double *out) {
    size_t es = lk_dtype_size(dt);
    unsigned char *h = malloc((size_t)(n ? n : 1) * es);
    assert_non_null(h);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(h, dev, (size_t)n * es, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < n; i++) out[i] = lk_load(h, dt, i);
    free(h);
}

double lkt_rel_err(const double *out, const double *ref, int64_t n) {
    double num = 0.0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        num = fmax(num, fabs(out[i] - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}

void lkt_randn(double *x, int64_t n, uint32_t *seed, double scale) {
    for (int64_t i = 0; i < n; i++) {
        double u[2];
        for (int k = 0; k < 2; k++) {
            uint32_t s = *seed;
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            *seed = s;
            u[k] = ((double)s + 1.0) / 4294967297.0;
        }
        x[i] = scale * sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
    }
}

lk_tensor lkt_view(void *dev, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor t = lk_tensor_view(dev, dt, ndim, shape);
    t.device.type = LK_DEVICE_CUDA;
    return t;
}

cudaGraphExec_t lkt_capture(cudaStream_t s, lkt_pass pass, void *user) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    lk_status f = pass(user, 0);
    lk_status b = f ? f : pass(user, 1);
    cudaError_t ce = cudaStreamEndCapture(s, &graph);
    if (f || b) print_message("  captured call: %s\n", lk_last_error());
    assert_int_equal(f, LK_OK);
    assert_int_equal(b, LK_OK);
    assert_int_equal(ce, cudaSuccess);
    assert_non_null(graph);
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    assert_int_equal(cudaGraphDestroy(graph), cudaSuccess);   /* exec keeps what it needs */
    return exec;
}
