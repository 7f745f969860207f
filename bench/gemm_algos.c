/* gemm_algos.c — how far cuBLASLt's first heuristic choice is from its best offer, on the
 * GEMMs of the CUDA cross-entropy (T 8192, H 4096, V 151936, bf16): for each problem it
 * asks the heuristic for up to 16 algorithms, times each (CUDA events, median of 5 after
 * one warm-up) and prints them, the heuristic's first marked with *.
 *
 *   build-h200/gemm_algos            (built with CUDA; run on the GPU machine)
 *
 * Problems are row-major as in core/cublaslt_util.h: C[M, N] = op(A)·op(B) (+ beta·C),
 * issued as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ the library issues. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define CK(x)                                                                              \
    do {                                                                                   \
        int e_ = (int)(x);                                                                 \
        if (e_) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, e_);         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

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

static void run(cublasLtHandle_t h, const problem *p, void *A, void *B, void *C, void *ws, size_t wsb) {
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
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 16, r, &found));
    double flop = 2.0 * p->m * p->n * p->k;
    printf("%s: M %ld N %ld K %ld, %d algorithms\n", p->name, p->m, p->n, p->k, found);
    float first = 0, best = 1e30f;
    for (int i = 0; i < found; i++) {
        int id = 0, tile = 0, splitk = 0, stages = 0, swz = 0;
        size_t sw;
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sw);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &sw);
        float ms = time_algo(h, op, la, lb, lc, &r[i].algo, B, A, C, p->beta, ws, wsb);
        if (ms <= 0) {
            printf("  %c%2d  failed\n", i ? ' ' : '*', i);
            continue;
        }
        if (i == 0) first = ms;
        if (ms < best) best = ms;
        printf("  %c%2d  %8.3f ms  %5.0f TFLOP/s  id %d tile %d splitk %d stages %d swizzle %d ws %zu\n",
               i ? ' ' : '*', i, ms, flop / (ms * 1e-3) / 1e12, id, tile, splitk, stages, swz,
               r[i].workspaceSize);
    }
    printf("  first %.3f ms, best %.3f ms: the first is %.1f%% slower\n", first, best, 100.0 * (first / best - 1));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    fflush(stdout);
}

/* bf16 values uniform in about [-1, 1): sign, exponent 119-126, random mantissa. */
static void fill_random(void *dev, size_t bytes) {
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

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("gemm_algos: no GPU\n");
        return 77;
    }
    const long T = 8192, H = 4096, V = 151936;
    const problem ps[] = {
        {"logits, chunk 4096", 0, 1, 4096, V, H, CUDA_R_16BF, 0},
        {"logits, chunk 2048", 0, 1, 2048, V, H, CUDA_R_16BF, 0},
        {"dh, chunk 4096", 0, 0, 4096, H, V, CUDA_R_32F, 0},
        {"dh, chunk 2048", 0, 0, 2048, H, V, CUDA_R_32F, 0},
        {"dW f32 += , chunk 4096", 1, 0, V, H, 4096, CUDA_R_32F, 1},
        {"lean logits block, all tokens", 0, 1, T, 37984, H, CUDA_R_16BF, 0},
        {"lean dW bf16 += block, all tokens", 1, 0, 37984, H, T, CUDA_R_16BF, 1},
    };
    size_t big = (size_t)T * V * 2;   /* the largest operand any problem reads */
    size_t cbig = (size_t)V * H * 4;
    void *A, *B, *C, *ws;
    size_t wsb = (size_t)32 << 20;
    CK(cudaMalloc(&A, big));
    CK(cudaMalloc(&B, big));
    CK(cudaMalloc(&C, cbig));
    CK(cudaMalloc(&ws, wsb));
    fill_random(A, big);   /* random bits, not constants: a GEMM's power, hence its clock, */
    fill_random(B, big);   /* depends on how many bits toggle */
    CK(cudaMemset(C, 0, cbig));
    cublasLtHandle_t h;
    CK(cublasLtCreate(&h));
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) run(h, &ps[i], A, B, C, ws, wsb);
    cublasLtDestroy(h);
    return 0;
}
