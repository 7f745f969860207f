/* gemm_algos.c — how far cuBLASLt's first heuristic choice is from its best offer: for each
 * problem it asks the heuristic for up to 16 algorithms, times each and prints them, the
 * heuristic's first marked with *.
 *
 *   build/gemm_algos                  the CUDA cross-entropy's GEMMs (T 8192, H 4096,
 *                                     V 151936, bf16), median of 5 calls after a warm-up
 *   build/gemm_algos dense [SECONDS]  the dense e2e step's GEMMs (Qwen3-0.6B, 4096 x 8
 *                                     tokens), each algorithm looped for SECONDS (default
 *                                     1.5) with the SM clock and board power from NVML
 *
 * Why the loop: a single call runs at the boost clock, while a training step runs at the
 * board's power cap (bench/NOTES.md, fifty-eighth session), where an algorithm's time
 * follows the energy it spends a call; the heuristic ranks by the first. The loop's
 * first third is left out (the clock settles in tens of ms).
 *
 * Problems are row-major as in core/cublaslt_util.h: C[M, N] = op(A)·op(B) (+ beta·C),
 * issued as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ the library issues. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include "cuda_bench.h"

typedef struct {
    const char *name;
    int trans_a, trans_b;
    long m, n, k;
    cudaDataType_t c_dt;
    float beta;
} problem;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float time_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo,
                       const void *a, const void *b, void *c, float beta, void *ws, size_t wsb) {
    float alpha = 1.0f, t[5];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    if (cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, algo, ws, wsb, 0)) return -1.0f;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(cublasLtMatmul(h, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, algo, ws, wsb, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(t, 5, sizeof t[0], cmp_float);
    return t[2];
}

/* One matmul of a problem with one algorithm, as lk_sustained_ms loops it. */
typedef struct {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    const cublasLtMatmulAlgo_t *algo;
    const void *a, *b;
    void *c, *ws;
    float beta;
    size_t wsb;
} matmul_call;

static int matmul_run(const void *arg, cudaStream_t st) {
    const matmul_call *m = arg;
    float alpha = 1.0f;
    return (int)cublasLtMatmul(m->h, m->op, &alpha, m->a, m->la, m->b, m->lb, &m->beta, m->c, m->lc, m->c, m->lc,
                               m->algo, m->ws, m->wsb, st);
}

static void run(cublasLtHandle_t h, const problem *p, void *A, void *B, void *C, void *ws, size_t wsb, double sec,
                lk_sampler *smp) {
    /* Column-major view: A' = the row-major B (kept transpose flag), B' = the row-major A. */
    cublasOperation_t ta = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    long ldb = p->trans_b ? p->k : p->n, lda = p->trans_a ? p->m : p->k;   /* row-major leading dims */
    uint64_t ar = ta == CUBLAS_OP_N ? p->n : p->k, ac = ta == CUBLAS_OP_N ? p->k : p->n;
    uint64_t br = tb == CUBLAS_OP_N ? p->k : p->m, bc = tb == CUBLAS_OP_N ? p->m : p->k;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, ldb));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, lda));
    CK(cublasLtMatrixLayoutCreate(&lc, p->c_dt, p->n, p->m, p->n));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t r[16];
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, sec > 0 ? 8 : 16, r, &found));
    double flop = 2.0 * p->m * p->n * p->k;
    printf("%s: M %ld N %ld K %ld, %d algorithms\n", p->name, p->m, p->n, p->k, found);
    float first = 0, best = 1e30f;
    for (int i = 0; i < found; i++) {
        int id = 0, tile = 0, splitk = 0, stages = 0, swz = 0, inner = 0, cluster = 0;
        size_t sw;
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof inner, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                             &sw);
        const matmul_call call = {h, op, la, lb, lc, &r[i].algo, B, A, C, ws, p->beta, wsb};
        float ms = sec > 0 ? (float)lk_sustained_ms(matmul_run, &call, 0, sec, smp)
                           : time_algo(h, op, la, lb, lc, &r[i].algo, B, A, C, p->beta, ws, wsb);
        double mhz = sec > 0 ? lk_sampler_mhz(smp) : 0, watts = sec > 0 ? lk_sampler_watts(smp) : 0;
        if (ms <= 0) {
            printf("  %c%2d  failed\n", i ? ' ' : '*', i);
            continue;
        }
        if (i == 0) first = ms;
        if (ms < best) best = ms;
        printf("  %c%2d  %8.3f ms  %5.0f TFLOP/s  id %d tile %d splitk %d stages %d swizzle %d inner %d cluster %d ws %zu",
               i ? ' ' : '*', i, ms, flop / (ms * 1e-3) / 1e12, id, tile, splitk, stages, swz, inner, cluster,
               r[i].workspaceSize);
        if (mhz > 0) printf("  %4.0f MHz %3.0f W %5.2f J/TFLOP", mhz, watts, watts * ms * 1e-3 / (flop / 1e12));
        printf("\n");
    }
    printf("  first %.3f ms, best %.3f ms: the first is %.1f%% slower\n", first, best, 100.0 * (first / best - 1));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("gemm_algos: no GPU\n");
        return 77;
    }
    const long T = 8192, H = 4096, V = 151936;
    const problem ce[] = {
        {"logits, chunk 4096", 0, 1, 4096, V, H, CUDA_R_16BF, 0},
        {"logits, chunk 2048", 0, 1, 2048, V, H, CUDA_R_16BF, 0},
        {"dh, chunk 4096", 0, 0, 4096, H, V, CUDA_R_32F, 0},
        {"dh, chunk 2048", 0, 0, 2048, H, V, CUDA_R_32F, 0},
        {"dW f32 += , chunk 4096", 1, 0, V, H, 4096, CUDA_R_32F, 1},
        {"lean logits block, all tokens", 0, 1, T, 37984, H, CUDA_R_16BF, 0},
        {"lean dW bf16 += block, all tokens", 1, 0, 37984, H, T, CUDA_R_16BF, 1},
    };
    /* Qwen3-0.6B at 4096 x 8 tokens (e2e_peers.py's dense config) with bf16 gradients: the
     * projections (linear/cublaslt_cuda.c), the MLP (swiglu_mlp/fused_cuda.c) and the LM
     * head's 2,048-token chunks (cross_entropy/fused_cuda.c), each once a layer or a chunk */
    const long Td = 32768, Hd = 1024, QKV = 4096, Q = 2048, I = 3072, Ch = 2048;
    const problem dense[] = {
        {"qkv", 0, 1, Td, QKV, Hd, CUDA_R_16BF, 0},
        {"o", 0, 1, Td, Hd, Q, CUDA_R_16BF, 0},
        {"gate_up", 0, 1, Td, 2 * I, Hd, CUDA_R_16BF, 0},
        {"down", 0, 1, Td, Hd, I, CUDA_R_16BF, 0},
        {"qkv dx", 0, 0, Td, Hd, QKV, CUDA_R_16BF, 0},
        {"o dx", 0, 0, Td, Q, Hd, CUDA_R_16BF, 0},
        {"gate_up dx", 0, 0, Td, Hd, 2 * I, CUDA_R_16BF, 0},
        {"down dh", 0, 0, Td, I, Hd, CUDA_R_16BF, 0},
        {"qkv dW +=", 1, 0, QKV, Hd, Td, CUDA_R_16BF, 1},
        {"o dW +=", 1, 0, Hd, Q, Td, CUDA_R_16BF, 1},
        {"gate_up dW +=", 1, 0, 2 * I, Hd, Td, CUDA_R_16BF, 1},
        {"down dW +=", 1, 0, Hd, I, Td, CUDA_R_16BF, 1},
        {"lm head logits, chunk", 0, 1, Ch, V, Hd, CUDA_R_16BF, 0},
        {"lm head dh, chunk", 0, 0, Ch, Hd, V, CUDA_R_32F, 0},
        {"lm head dW +=, chunk", 1, 0, V, Hd, Ch, CUDA_R_16BF, 1},
    };
    const int use_dense = argc > 1 && strcmp(argv[1], "dense") == 0;
    const double sec = use_dense ? (argc > 2 ? atof(argv[2]) : 1.5) : 0;
    const problem *ps = use_dense ? dense : ce;
    const size_t np = use_dense ? sizeof dense / sizeof dense[0] : sizeof ce / sizeof ce[0];
    size_t big = (size_t)T * V * 2;   /* the largest operand any problem reads */
    size_t cbig = (size_t)V * H * 4;
    void *A, *B, *C, *ws;
    size_t wsb = (size_t)32 << 20;
    CK(cudaMalloc(&A, big));
    CK(cudaMalloc(&B, big));
    CK(cudaMalloc(&C, cbig));
    CK(cudaMalloc(&ws, wsb));
    lk_fill_bf16(A, big);
    lk_fill_bf16(B, big);
    CK(cudaMemset(C, 0, cbig));
    cublasLtHandle_t h;
    CK(cublasLtCreate(&h));
    lk_sampler smp = {0};
    if (sec > 0 && !lk_sampler_start(&smp)) printf("no NVML: clocks and power left out\n");
    for (size_t i = 0; i < np; i++) run(h, &ps[i], A, B, C, ws, wsb, sec, &smp);
    lk_sampler_stop(&smp);
    cublasLtDestroy(h);
    return 0;
}
