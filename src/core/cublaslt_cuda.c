/* cublaslt_cuda.c — the cuBLASLt GEMM of cublaslt_util.h: per-device handle and plan
 * table (see the header for where they live and why), and the row-major call. Row-major
 * C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the call swaps the operands and
 * keeps each one's transpose flag, and a row-major bias over columns is cuBLASLt's
 * column-major bias over rows (CUBLASLT_EPILOGUE_BIAS). */
#include <pthread.h>
#include <string.h>
#include <cublasLt.h>
#include "core/cublaslt_util.h"
#include "llmkern/config.h"
#include "core/cuda_check.h"

#define MAX_DEVICES 16

#define LT_OFFERS 8   /* the heuristic's offers LLMKERN_GEMM_TUNE times (16 ran no faster: sixty-first session) */

static int tune_on(void) {
    const lk_env_value *v = lk_env(LK_ENV_GEMM_TUNE);
    return v && strcmp(v->value, "1") == 0;
}

typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    int trans_a, trans_b, ab_dt, c_dt, bias, beta0;
    unsigned align_a, align_b, align_c;
    size_t ws;
} plan_key;

typedef struct {
    int used;
    plan_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;   /* the heuristic's first, or tune_plan's pick */
} plan;

#define TUNED_MAX 256

typedef struct {
    plan_key key;
    cublasLtMatmulAlgo_t algo;
} tuned_choice;

typedef struct {
    cublasLtHandle_t h;
    plan plans[LK_LT_PLANS];
    int next;
    int64_t hits, misses;
    tuned_choice tuned[TUNED_MAX];   /* LLMKERN_GEMM_TUNE's picks: they outlive their plans' eviction */
    int n_tuned;
} device_state;

static device_state states[MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static lk_status lt_fail(cublasStatus_t s, const char *what) {
    return lk_error(LK_EDEVICE, "cublasLt: %s: %s (%s)", what, cublasGetStatusString(s), cublasGetStatusName(s));
}

#define LT_TRY(call, what)                                                  \
    do {                                                                    \
        cublasStatus_t lt_s_ = (call);                                      \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) return lt_fail(lt_s_, what);    \
    } while (0)

static cudaDataType_t cuda_type(int dt) { return dt == LK_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* The largest power of two up to 256 that divides the address (cuBLASLt's alignment
 * preference: kernels that need more alignment than the pointers have are not offered). */
static unsigned align_of(const void *p) {
    unsigned a = 256;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

static void plan_free(plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
    p->used = 0;
}

/* Column-major view: A' = b (rows n, cols k untransposed), B' = a, C' = Cᵀ [n, m]. The
 * heuristic is asked for `want` offers (1 unless LLMKERN_GEMM_TUNE picks among them): the
 * usable ones into offers[0..*n_offers), its best first, and p->algo. */
static lk_status plan_make(cublasLtHandle_t h, const plan_key *k, plan *p, int want, cublasLtMatmulAlgo_t *offers,
                           int *n_offers) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    LT_TRY(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "matmul descriptor");
    p->used = 1;                       /* from here on plan_free releases what exists */
    p->la = p->lb = p->lc = NULL;
    cublasOperation_t ta = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t ep = k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasStatus_t s;
    if ((s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        (s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep)))
        goto fail;
    uint64_t ar = ta == CUBLAS_OP_N ? k->n : k->k, ac = ta == CUBLAS_OP_N ? k->k : k->n;
    uint64_t br = tb == CUBLAS_OP_N ? k->k : k->m, bc = tb == CUBLAS_OP_N ? k->m : k->k;
    if ((s = cublasLtMatrixLayoutCreate(&p->la, cuda_type(k->ab_dt), ar, ac, k->ldb)) ||
        (s = cublasLtMatrixLayoutCreate(&p->lb, cuda_type(k->ab_dt), br, bc, k->lda)) ||
        (s = cublasLtMatrixLayoutCreate(&p->lc, cuda_type(k->c_dt), k->n, k->m, k->ldc)))
        goto fail;
    cublasLtMatmulPreference_t pref = NULL;
    if ((s = cublasLtMatmulPreferenceCreate(&pref))) goto fail;
    uint32_t al_a = k->align_b, al_b = k->align_a, al_c = k->align_c;   /* swapped with the operands */
    cublasLtMatmulHeuristicResult_t r[LT_OFFERS];
    int found = 0;
    size_t ws = k->ws;
    if (!(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, 4)) &&
        !(s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, 4)))
        s = cublasLtMatmulAlgoGetHeuristic(h, p->op, p->la, p->lb, p->lc, p->lc, pref, want, r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s) goto fail;
    if (found < 1 || r[0].state != CUBLAS_STATUS_SUCCESS) {
        plan_free(p);
        return lk_error(LK_EUNAVAILABLE, "cublasLt: no algorithm for M %lld N %lld K %lld (%s in, %s out)",
                        (long long)k->m, (long long)k->n, (long long)k->k, lk_dtype_name(k->ab_dt),
                        lk_dtype_name(k->c_dt));
    }
    int n = 0;
    while (n < found && r[n].state == CUBLAS_STATUS_SUCCESS) offers[n] = r[n].algo, n++;
    *n_offers = n;
    p->algo = r[0].algo;
    return LK_OK;
fail:
    plan_free(p);
    return lt_fail(s, "plan");
}

/* The device's state, its handle created on first use (the caller holds the lock). */
static lk_status state_of(int device, device_state **out) {
    if (device < 0 || device >= MAX_DEVICES)
        return lk_error(LK_EINVAL, "cublasLt: device: expected 0..%d, got %d", MAX_DEVICES - 1, device);
    device_state *d = &states[device];
    if (d->h == NULL) {
        int cur = 0;
        cudaGetDevice(&cur);
        if (cur != device) cudaSetDevice(device);
        cublasStatus_t s = cublasLtCreate(&d->h);
        if (cur != device) cudaSetDevice(cur);
        if (s != CUBLAS_STATUS_SUCCESS) {
            d->h = NULL;
            return lt_fail(s, "cublasLtCreate");
        }
    }
    *out = d;
    return LK_OK;
}

/* LLMKERN_GEMM_TUNE=1 (config/env.c): a shape's first call times each of the heuristic's offers
 * looped for TUNE_SECONDS on the call's own operands and keeps the fastest. A loop, not one call:
 * a training step runs at the board's power cap, where the offers rank otherwise than at the
 * boost clock one call sees (bench/NOTES.md, sixtieth session: the first offer 7-12% slower than
 * the best on 6 of the dense step's 15 GEMMs; sixty-first: the dense e2e step 0.5-2.2% faster in
 * four paired rounds on an H100). It waits on the device, so never under CUDA graph capture; the
 * choice outlives the plan's eviction (device_state.tuned), so a shape is timed once a process. */
#define TUNE_SECONDS 0.2f

/* The mean time of n calls of algo (ms), or -1 where it fails. */
static float time_offer(device_state *d, plan *p, const cublasLtMatmulAlgo_t *algo, const lk_lt_gemm_args *g, void *c,
                        void *ws, size_t wsb, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int n) {
    float ms = 0.0f;
    cudaEventRecord(e0, st);
    for (int r = 0; r < n; r++)
        if (cublasLtMatmul(d->h, p->op, &g->alpha, g->b, p->la, g->a, p->lb, &g->beta, c, p->lc, c, p->lc,
                           algo, ws, wsb, st))
            return -1.0f;
    cudaEventRecord(e1, st);
    return cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1) ? -1.0f : ms / (float)n;
}

/* p->algo: the fastest of offers[0..n_offers), or the one a previous timing of p's key picked. */
static void tune_plan(device_state *d, plan *p, const cublasLtMatmulAlgo_t *offers, int n_offers,
                      const lk_lt_gemm_args *g, void *ws, size_t wsb, cudaStream_t st) {
    for (int i = 0; i < d->n_tuned; i++)
        if (memcmp(&d->tuned[i].key, &p->key, sizeof p->key) == 0) {
            p->algo = d->tuned[i].algo;
            return;
        }
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (n_offers < 2 || d->n_tuned == TUNED_MAX || cudaStreamIsCapturing(st, &cap) ||
        cap != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return;
    }
    /* every timed call writes C: where the call overwrites it (beta 0) its own C takes the loops,
     * else a scratch copy does (the gradient it adds into stays as it was) */
    const int scratch = g->beta != 0.0f;
    const size_t cb = ((size_t)(g->m - 1) * (size_t)g->ldc + (size_t)g->n) * (g->c_dt == LK_BF16 ? 2 : 4);
    void *c = scratch ? NULL : g->c;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if ((!scratch || (!cudaMalloc(&c, cb) && !cudaMemcpyAsync(c, g->c, cb, cudaMemcpyDeviceToDevice, st))) &&
        !cudaEventCreate(&e0) && !cudaEventCreate(&e1)) {
        /* two rounds over the offers, half the time each, the second timed: every offer is timed
         * after the board has run at the cap (the first of a cold board ran at boost) */
        int n[LT_OFFERS];
        for (int i = 0; i < n_offers; i++) {
            const float once = time_offer(d, p, &offers[i], g, c, ws, wsb, st, e0, e1, 1);
            n[i] = once < 0.0f ? 0 : (int)(TUNE_SECONDS * 500.0f / (once > 1e-3f ? once : 1e-3f)) + 1;
        }
        float best = 0.0f;
        for (int round = 0; round < 2; round++)
            for (int i = 0; i < n_offers; i++) {
                const float t = n[i] ? time_offer(d, p, &offers[i], g, c, ws, wsb, st, e0, e1, n[i]) : -1.0f;
                if (t < 0.0f) n[i] = 0;
                else if (round && (best == 0.0f || t < best)) best = t, p->algo = offers[i];
            }
        d->tuned[d->n_tuned++] = (tuned_choice){p->key, p->algo};
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (scratch) cudaFree(c);
}

/* The plan of key k: the table's, or a new one in the oldest's place (timed by tune_plan on
 * g's operands where LLMKERN_GEMM_TUNE is on and the GEMM has no bias epilogue). */
static lk_status find_plan(device_state *d, const plan_key *k, const lk_lt_gemm_args *g, void *ws, cudaStream_t st,
                           plan **out) {
    for (int i = 0; i < LK_LT_PLANS; i++)
        if (d->plans[i].used && memcmp(&d->plans[i].key, k, sizeof *k) == 0) {
            d->hits++;
            *out = &d->plans[i];
            return LK_OK;
        }
    d->misses++;
    plan *p = &d->plans[d->next];
    d->next = (d->next + 1) % LK_LT_PLANS;
    plan_free(p);
    const int tune = !g->bias && tune_on();
    cublasLtMatmulAlgo_t offers[LT_OFFERS];
    int n_offers = 0;
    lk_status s = plan_make(d->h, k, p, tune ? LT_OFFERS : 1, offers, &n_offers);
    if (s) return s;
    if (tune) tune_plan(d, p, offers, n_offers, g, ws, k->ws, st);
    *out = p;
    return LK_OK;
}

static lk_status gemm_locked(int device, void *stream, void *workspace, size_t ws_bytes, const lk_lt_gemm_args *g) {
    device_state *d = NULL;
    lk_status st = state_of(device, &d);
    if (st) return st;
    plan_key k;
    memset(&k, 0, sizeof k);           /* padding too: keys are compared bytewise */
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    k.trans_a = !!g->trans_a, k.trans_b = !!g->trans_b, k.ab_dt = g->ab_dt, k.c_dt = g->c_dt;
    k.bias = g->bias != NULL, k.beta0 = g->beta == 0.0f;
    k.align_a = align_of(g->a), k.align_b = align_of(g->b), k.align_c = align_of(g->c);
    k.ws = ws_bytes < LK_LT_WORKSPACE_BYTES ? ws_bytes : LK_LT_WORKSPACE_BYTES;
    plan *p = NULL;
    if ((st = find_plan(d, &k, g, workspace, (cudaStream_t)stream, &p))) return st;
    if (g->bias)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
               "bias pointer");
    LT_TRY(cublasLtMatmul(d->h, p->op, &g->alpha, g->b, p->la, g->a, p->lb, &g->beta, g->c, p->lc, g->c, p->lc,
                          &p->algo, workspace, k.ws, (cudaStream_t)stream),
           "cublasLtMatmul");
    return LK_OK;
}

lk_status lk_lt_gemm(int device, void *stream, void *workspace, size_t ws_bytes, const lk_lt_gemm_args *g) {
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX)
        return lk_error(LK_ESHAPE, "cublasLt: gemm: expected dims below 2^31, got M %lld N %lld K %lld",
                        (long long)g->m, (long long)g->n, (long long)g->k);
    if (g->ab_dt != LK_F32 && g->ab_dt != LK_BF16)
        return lk_error(LK_EDTYPE, "cublasLt: gemm: expected f32 or bf16 operands, got %s", lk_dtype_name(g->ab_dt));
    if (g->c_dt != LK_F32 && !(g->c_dt == LK_BF16 && g->ab_dt == LK_BF16))
        return lk_error(LK_EDTYPE, "cublasLt: gemm: expected an f32 C, or bf16 with bf16 operands, got %s",
                        lk_dtype_name(g->c_dt));
    if (g->m == 0 || g->n == 0) return LK_OK;
    if (g->k == 0)   /* cuBLASLt refuses K = 0: C = beta·C (+ bias) is left to the caller */
        return lk_error(LK_ESHAPE, "cublasLt: gemm: expected K >= 1, got 0");
    /* cuBLASLt wants a 256-byte aligned workspace (CUBLAS_STATUS_INVALID_VALUE otherwise);
     * arena pieces are 64-byte aligned, so start at the next 256 and offer what is left */
    uintptr_t at = (uintptr_t)workspace, up = (at + 255) & ~(uintptr_t)255;
    if (workspace == NULL || ws_bytes < up - at) ws_bytes = 0, workspace = NULL;
    else ws_bytes -= up - at, workspace = (void *)up;
    pthread_mutex_lock(&lock);
    lk_status s = gemm_locked(device, stream, workspace, ws_bytes, g);
    pthread_mutex_unlock(&lock);
    return s;
}

void lk_lt_cache_stats(int device, int64_t *hits, int64_t *misses, int64_t *timed) {
    pthread_mutex_lock(&lock);
    int ok = device >= 0 && device < MAX_DEVICES;
    *hits = ok ? states[device].hits : 0;
    *misses = ok ? states[device].misses : 0;
    if (timed) *timed = ok ? states[device].n_tuned : 0;
    pthread_mutex_unlock(&lock);
}
