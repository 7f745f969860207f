/* cuda_bench.h — what the C benches that loop kernels at the power cap share (gemm_algos.c,
 * overlap_probe.c): CK, which exits on a failed CUDA or cuBLASLt call; lk_fill_bf16, random
 * bits; the SM clock and board power sampled every 10 ms by a thread, through NVML opened
 * with dlopen (no link-time dependency); and lk_sustained_ms, a call looped at the cap with the
 * clock and power sampled beside it. Header-only; link pthread and dl.
 *
 *   lk_sampler s = {0};
 *   if (lk_sampler_start(&s)) ...      false without NVML: clocks and power left out
 *   lk_sampler_reset(&s); s.on = 1; ... s.on = 0;  means over the span: lk_sampler_mhz / _watts
 *   lk_sampler_stop(&s);                                                                      */
#ifndef LLMKERN_BENCH_CUDA_BENCH_H
#define LLMKERN_BENCH_CUDA_BENCH_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <cuda_runtime_api.h>

#define CK(x)                                                                              \
    do {                                                                                   \
        int e_ = (int)(x);                                                                 \
        if (e_) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, e_);         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* bf16 values uniform in about [-1, 1): sign, exponent 119-126, random mantissa. Random bits,
 * not constants: a GEMM's power, hence its clock at the cap, depends on how many bits toggle. */
static void lk_fill_bf16(void *dev, size_t bytes) {
    size_t n = (size_t)1 << 24;
    uint16_t *h = malloc(n * 2);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        h[i] = (uint16_t)(((x >> 16) & 0x8000u) | ((119u + (x >> 8) % 8u) << 7) | (x & 0x7fu));
    }
    for (size_t off = 0; off < bytes; off += n * 2)
        CK(cudaMemcpy((char *)dev + off, h, bytes - off < n * 2 ? bytes - off : n * 2, cudaMemcpyHostToDevice));
    free(h);
}

typedef struct {
    void *dev;
    int (*clock)(void *, int, unsigned *);
    int (*power)(void *, unsigned *);
    pthread_t th;
    volatile int on, stop;
    double mhz, watts;
    long n;
} lk_sampler;

static void *lk_sampler_loop(void *p) {
    lk_sampler *s = p;
    while (!s->stop) {
        unsigned mhz = 0, mw = 0;
        if (s->on && s->clock(s->dev, 1 /* NVML_CLOCK_SM */, &mhz) == 0 && s->power(s->dev, &mw) == 0)
            s->mhz += mhz, s->watts += mw / 1e3, s->n++;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* NVML on the current CUDA device and the sampling thread started (idle until s->on). */
static int lk_sampler_start(lk_sampler *s) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return 0;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    s->clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    s->power = (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetPowerUsage");
    int cur = 0;
    cudaGetDevice(&cur);
    if (init && get && s->clock && s->power && init() == 0 && get((unsigned)cur, &s->dev) == 0 &&
        pthread_create(&s->th, NULL, lk_sampler_loop, s) == 0)
        return 1;
    s->dev = NULL;
    return 0;
}

static void lk_sampler_reset(lk_sampler *s) { s->mhz = s->watts = 0, s->n = 0; }
static double lk_sampler_mhz(const lk_sampler *s) { return s->n ? s->mhz / s->n : 0; }
static double lk_sampler_watts(const lk_sampler *s) { return s->n ? s->watts / s->n : 0; }

static void lk_sampler_stop(lk_sampler *s) {
    if (s->dev) s->stop = 1, pthread_join(s->th, NULL);
}

/* ms a call of run(arg, st) takes over the last two thirds of `sec` seconds of back-to-back
 * calls, timed in batches of ~20 ms on st, with the clock and power sampled over the same span
 * (smp: lk_sampler_mhz / _watts after); -1 where run's first call fails (returns nonzero). */
static double lk_sustained_ms(int (*run)(const void *arg, cudaStream_t st), const void *arg, cudaStream_t st,
                              double sec, lk_sampler *smp) {
    float once = 0;
    double spent = 0, kept = 0;
    long calls = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    lk_sampler_reset(smp);
    if (run(arg, st) == 0) {
        CK(cudaEventRecord(e0, st));
        CK(run(arg, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&once, e0, e1));
        const int batch = once > 0 ? (int)(20.0f / once) + 1 : 1;
        while (spent < sec * 1e3) {
            smp->on = spent >= sec * 1e3 / 3;
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < batch; i++) CK(run(arg, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            spent += ms;
            if (smp->on) kept += ms, calls += batch;
        }
        smp->on = 0;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return calls ? kept / calls : -1.0;
}

#endif
