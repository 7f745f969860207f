/* overlap_probe.c — can the dense backward's weight-gradient GEMMs hide its memory-bound
 * kernels, the two on two streams? Each dense layer's backward runs ~1.3 ms of kernels that
 * stream HBM (the SwiGLU backward, the norms', attention's dQ sums) and ~1.5 ms of GEMMs
 * dW += dyᵀ·x that nothing on the critical path waits for. At the board's power cap a GEMM's
 * time follows its joules (bench/NOTES.md, fifty-eighth session): the hope was that one left a
 * few SMs fewer (cuBLASLt's SM_COUNT_TARGET) loses little, while a kernel bound by HBM on those
 * SMs spends little power. On an H100 it does not (sixty-third session): the kernel alone draws
 * 630-640 W, the two share the cap, and at most 7% of the kernel was hidden.
 *
 *   build/overlap_probe [SECONDS]   each variant looped SECONDS (default 2) at the power cap
 *
 * For each weight gradient of Qwen3-0.6B at 4096 x 8 tokens (bf16, beta 1, cuBLASLt's first
 * heuristic offer) beside llmkern's SwiGLU backward kernel (T 32768, I 3072: 1.2 GB read and
 * written), ms an iteration over the loop's last two thirds, with NVML's SM clock and power:
 *   gemm, act      each alone
 *   serial         the kernel, then the GEMM, on one stream
 *   overlap c      the kernel on a high-priority stream, the GEMM on a low-priority one with
 *                  SM_COUNT_TARGET = SMs - c (c 0: the device's count), joined every
 *                  iteration by events as a layer's backward would be; `gemm first` enqueues
 *                  the GEMM before the kernel; `same priority` runs the kernel on a stream of the
 *                  GEMM's priority (the default's, as the model's legacy stream has)
 * and "hidden", the share of the kernel's time alone that the overlap took off the serial
 * iteration: (serial - overlap) / act. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include "cuda_bench.h"
#include "ops/swiglu_mlp/cuda_act.h"

enum { T = 32768, H = 1024, I = 3072, QKV = 4096 };

/* Row-major dW[M, N] += dy[T, M]ᵀ · x[T, N], issued as the column-major dWᵀ = xᵀ · dy. */
typedef struct {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lx, ldy, lw;
    cublasLtMatmulAlgo_t algo;
    const void *dy, *x;
    void *dw, *ws;
    size_t wsb;
} wgrad;

static int wgrad_make(wgrad *g, long m, long n, int sm_target) {
    cublasOperation_t nop = CUBLAS_OP_N, top = CUBLAS_OP_T;
    CK(cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &nop, sizeof nop));
    CK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &top, sizeof top));
    if (sm_target > 0)
        CK(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof sm_target));
    CK(cublasLtMatrixLayoutCreate(&g->lx, CUDA_R_16BF, (uint64_t)n, T, n));
    CK(cublasLtMatrixLayoutCreate(&g->ldy, CUDA_R_16BF, (uint64_t)m, T, m));
    CK(cublasLtMatrixLayoutCreate(&g->lw, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, n));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->wsb, sizeof g->wsb));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(g->lt, g->op, g->lx, g->ldy, g->lw, g->lw, pref, 1, &r, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    g->algo = r.algo;
    return found;
}

static void wgrad_free(wgrad *g) {
    cublasLtMatrixLayoutDestroy(g->lx);
    cublasLtMatrixLayoutDestroy(g->ldy);
    cublasLtMatrixLayoutDestroy(g->lw);
    cublasLtMatmulDescDestroy(g->op);
}

static void wgrad_run(const wgrad *g, cudaStream_t st) {
    float one = 1.0f;
    CK(cublasLtMatmul(g->lt, g->op, &one, g->x, g->lx, g->dy, g->ldy, &one, g->dw, g->lw, g->dw, g->lw, &g->algo, g->ws,
                      g->wsb, st));
}

/* The SwiGLU backward as the MLP runs it: dgate and dup into dgu's halves, h beside. */
typedef struct {
    const char *dh, *gu;
    char *dgu, *h;
} act;

static void act_run(const act *a, cudaStream_t st) {
    const size_t half = (size_t)I * 2;
    CK(lk_cuda_swiglu_act_backward(LK_BF16, T, I, 0.0f, a->dh, I, a->gu, 2 * I, a->gu + half, 2 * I, a->dgu, 2 * I,
                                   a->dgu + half, 2 * I, a->h, I, st));
}

enum mode { GEMM, ACT, SERIAL, OVERLAP, GEMM_FIRST, SAME_PRIORITY };

typedef struct {
    cudaStream_t hi, lo, eq;   /* high priority, low, low again */
    cudaEvent_t fork, join, t0, t1;
} streams;

static void iteration(enum mode md, const wgrad *g, const act *a, const streams *s) {
    switch (md) {
    case GEMM: wgrad_run(g, s->hi); return;
    case ACT: act_run(a, s->hi); return;
    case SERIAL: act_run(a, s->hi), wgrad_run(g, s->hi); return;
    case SAME_PRIORITY:
        CK(cudaEventRecord(s->fork, s->hi));   /* the timing events stay on hi */
        CK(cudaStreamWaitEvent(s->eq, s->fork, 0));
        CK(cudaStreamWaitEvent(s->lo, s->fork, 0));
        act_run(a, s->eq), wgrad_run(g, s->lo);
        CK(cudaEventRecord(s->join, s->lo));
        CK(cudaStreamWaitEvent(s->hi, s->join, 0));
        CK(cudaEventRecord(s->join, s->eq));
        CK(cudaStreamWaitEvent(s->hi, s->join, 0));
        return;
    case OVERLAP:
    case GEMM_FIRST:
        CK(cudaEventRecord(s->fork, s->hi));
        CK(cudaStreamWaitEvent(s->lo, s->fork, 0));
        if (md == GEMM_FIRST) wgrad_run(g, s->lo), act_run(a, s->hi);
        else act_run(a, s->hi), wgrad_run(g, s->lo);
        CK(cudaEventRecord(s->join, s->lo));
        CK(cudaStreamWaitEvent(s->hi, s->join, 0));
    }
}

/* One iteration of a mode, as lk_sustained_ms loops it (timed on s->hi, which every mode joins). */
typedef struct {
    enum mode md;
    const wgrad *g;
    const act *a;
    const streams *s;
} probe_call;

static int probe_run(const void *arg, cudaStream_t st) {
    const probe_call *c = arg;
    (void)st;
    iteration(c->md, c->g, c->a, c->s);
    return 0;
}

static double sustained(enum mode md, const wgrad *g, const act *a, const streams *s, double sec, lk_sampler *smp) {
    const probe_call c = {md, g, a, s};
    return lk_sustained_ms(probe_run, &c, s->hi, sec, smp);
}

static void report(const char *what, double ms, const lk_sampler *smp, double serial, double act_ms) {
    printf("  %-16s %7.3f ms", what, ms);
    if (lk_sampler_mhz(smp) > 0) printf("  %4.0f MHz %3.0f W", lk_sampler_mhz(smp), lk_sampler_watts(smp));
    if (serial > 0 && act_ms > 0) printf("  hidden %4.0f%%", 100.0 * (serial - ms) / act_ms);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    int ndev = 0, sms = 0, lo_prio = 0, hi_prio = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("overlap_probe: no GPU\n");
        return 77;
    }
    const double sec = argc > 1 ? atof(argv[1]) : 2.0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    streams s;
    CK(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
    CK(cudaStreamCreateWithPriority(&s.hi, cudaStreamNonBlocking, hi_prio));
    CK(cudaStreamCreateWithPriority(&s.lo, cudaStreamNonBlocking, lo_prio));
    CK(cudaStreamCreateWithPriority(&s.eq, cudaStreamNonBlocking, lo_prio));
    CK(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming));
    CK(cudaEventCreate(&s.t0));
    CK(cudaEventCreate(&s.t1));

    const size_t ti = (size_t)T * I * 2, big = (size_t)T * QKV * 2 > 2 * ti ? (size_t)T * QKV * 2 : 2 * ti;
    void *dy, *x, *dw, *ws, *dh, *gu, *dgu, *h;
    size_t wsb = (size_t)32 << 20;
    CK(cudaMalloc(&dy, big));
    CK(cudaMalloc(&x, ti));
    CK(cudaMalloc(&dw, (size_t)2 * I * I * 2));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMalloc(&dh, ti));
    CK(cudaMalloc(&gu, 2 * ti));
    CK(cudaMalloc(&dgu, 2 * ti));
    CK(cudaMalloc(&h, ti));
    lk_fill_bf16(dy, big);
    lk_fill_bf16(x, ti);
    lk_fill_bf16(dh, ti);
    lk_fill_bf16(gu, 2 * ti);
    CK(cudaMemset(dw, 0, (size_t)2 * I * I * 2));
    const act a = {dh, gu, dgu, h};
    cublasLtHandle_t lt;
    CK(cublasLtCreate(&lt));
    lk_sampler smp = {0};
    if (!lk_sampler_start(&smp)) printf("no NVML: clocks and power left out\n");

    const struct {
        const char *name;
        long m, n;
    } dws[] = {{"gate_up dW +=", 2 * I, H}, {"qkv dW +=", QKV, H}, {"down dW +=", H, I}};
    const int carve[] = {8, 16, 32, 48};   /* SMs the GEMM leaves (overlap 0: g itself, every SM) */
    printf("%d SMs; SwiGLU backward T %d, I %d beside each weight gradient (K = %d tokens)\n", sms, T, I, T);
    for (size_t p = 0; p < sizeof dws / sizeof *dws; p++) {
        wgrad g = {.lt = lt, .dy = dy, .x = x, .dw = dw, .ws = ws, .wsb = wsb};
        if (!wgrad_make(&g, dws[p].m, dws[p].n, 0)) {
            printf("%s: no algorithm\n", dws[p].name);
            continue;
        }
        printf("%s: M %ld N %ld\n", dws[p].name, dws[p].m, dws[p].n);
        const double gemm_ms = sustained(GEMM, &g, &a, &s, sec, &smp);
        report("gemm", gemm_ms, &smp, 0, 0);
        const double act_ms = sustained(ACT, &g, &a, &s, sec, &smp);
        report("act", act_ms, &smp, 0, 0);
        const double serial = sustained(SERIAL, &g, &a, &s, sec, &smp);
        report("serial", serial, &smp, serial, act_ms);
        report("gemm first", sustained(GEMM_FIRST, &g, &a, &s, sec, &smp), &smp, serial, act_ms);
        report("same priority", sustained(SAME_PRIORITY, &g, &a, &s, sec, &smp), &smp, serial, act_ms);
        report("overlap 0", sustained(OVERLAP, &g, &a, &s, sec, &smp), &smp, serial, act_ms);
        wgrad_free(&g);
        for (size_t c = 0; c < sizeof carve / sizeof *carve; c++) {
            wgrad gc = {.lt = lt, .dy = dy, .x = x, .dw = dw, .ws = ws, .wsb = wsb};
            if (!wgrad_make(&gc, dws[p].m, dws[p].n, sms - carve[c])) continue;
            char what[32];
            snprintf(what, sizeof what, "gemm on %d SMs", sms - carve[c]);
            report(what, sustained(GEMM, &gc, &a, &s, sec, &smp), &smp, 0, 0);
            snprintf(what, sizeof what, "overlap %d", carve[c]);
            report(what, sustained(OVERLAP, &gc, &a, &s, sec, &smp), &smp, serial, act_ms);
            wgrad_free(&gc);
        }
    }
    lk_sampler_stop(&smp);
    cublasLtDestroy(lt);
    return 0;
}
