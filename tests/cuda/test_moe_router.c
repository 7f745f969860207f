/* test_moe_router.c (GPU) — the CUDA MoE routers, `softmax_topk` and `sigmoid_bias`
 * against the float64 reference (src/ops/moe/reference.c), `fake_balanced` against the
 * CPU row bit for bit, f32 and bf16 storage, over odd shapes (one token, H = 5,
 * E = 4 .. 600, k = 1 .. E) and the issue's matrix (E 8 top-2, E 64 top-8, E 128 top-8
 * at T 1, 37, 1000), norm_topk_prob / softmax_after_topk on and off, route_scale != 1,
 * an f32 gate over bf16 hidden, gate_f32, sigmoid_bias's e_bias and group limits (groups
 * of one expert included):
 *   forward   ids: exactly the CPU rows' choice (lk_router_group_topk, sigmoid_bias's group
 *             limit) made from the GPU's own saved scores; no expert twice, none short
 *             of the f64 best by more than the tolerance (unrounded logits), and
 *             softmax_topk: exactly the f64 ranking on every token without a near-tie
 *             among its k + 1 best logits; weights and aux loss at the GPU's own choice
 *             (a near-tie may be decided either way); a second call bit for bit the same.
 *   backward  d_hidden, and d_gate_weight added onto random values already there (f32
 *             or the gate's dtype), with and without an aux-loss gradient; bf16 hidden and
 *             gate with f32 logits and an f32 d_gate_weight held to f32's tolerance (the
 *             backward's bf16 GEMMs take dz in two parts).
 * Every output and the saved block are NaN-poisoned first. Tolerances (max-normalized,
 * as harness_router.c): f32 2e-5 (exact f32 GEMMs and softmax against float64); bf16
 * 2e-2 (logits rounded to bf16 move each probability by up to ~|z|·2^-9, d_hidden and a
 * bf16 d_gate_weight are rounded once). fake_balanced: the noise-0 pattern exactly, and
 * at noise > 0 the CPU row's ids, weights and aux loss bit for bit (an unaligned
 * hidden included), the same bits from a second call and from a copy of the input (a
 * recompute), other ids from another input; d_hidden zero. Each router's forward +
 * backward captured in a CUDA graph (capture fails on any synchronization) and replayed
 * to the eager run's bits. The learned routers over a sequence-parallel group of one (an
 * NCCL communicator of this GPU: the aux loss's sums all-reduced on the stream) hold the
 * same tolerances, the all-reduces counted. Also: ties go to the lower index, and bad
 * input (k > E, a wrong dtype, bad groups or noise, a host tensor, a host communicator)
 * is refused before anything is written, naming the argument. Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "llmkern/comm.h"
#include "llmkern/registry.h"
#include "ops/moe/check.h"
#include "ops/moe/reference.h"
#include "ops/moe/router_core.h"

typedef struct {
    int64_t t, h, e;
    int k, norm, after;   /* norm_topk_prob, softmax_after_topk */
    float scale, d_aux;
    int gw32;             /* bf16 runs: the gate weight in f32 */
    int gate_f32;         /* bf16 runs: logits kept in f32 */
    int grad_f32;         /* d_gate_weight in f32 (else the gate's dtype) */
    int sig;              /* 1: sigmoid_bias (else softmax_topk) */
    int bias, ng, tg;     /* sigmoid_bias: a random e_bias; n_group, topk_group */
} rcase;

static lk_comm *group;   /* set: every case runs over it (ctx.comm) */

typedef struct {   /* the device side of one case */
    lk_moe_router_args a;
    lk_arena arena;
    lk_ctx ctx;
} rrun;

static const lk_impl *impl_named(const char *name) {
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_ROUTER, name, LK_DEVICE_CUDA);
    assert_non_null(impl);
    return impl;
}
static const lk_impl *impl_cuda(void) { return impl_named("softmax_topk"); }
static const lk_impl *impl_of(const rcase *c) { return impl_named(c->sig ? "sigmoid_bias" : "softmax_topk"); }

static double amax(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, isnan(x[i]) ? INFINITY : fabs(x[i]));
    return m;
}

static void down(void *host, const void *dev, size_t bytes) {
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

static int all_ff(const void *dev, size_t bytes) {
    unsigned char *h = malloc(bytes ? bytes : 1);
    assert_non_null(h);
    down(h, dev, bytes);
    int ok = 1;
    for (size_t i = 0; i < bytes; i++) ok &= h[i] == 0xff;
    free(h);
    return ok;
}

/* Tokens whose k + 1 best logits (k when k = E) are all further apart than the rounding
 * can move them: there the GPU must give exactly the f64 ranking. Returns how many were
 * held to it; fails on the first that differs. */
static int64_t ranked_exactly(const double *z, const int32_t *ids, int64_t t, int64_t e, int k, int bf16_logits) {
    int64_t held = 0;
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)e);
    assert_non_null(ord);
    for (int64_t tok = 0; tok < t; tok++) {
        const double *zr = z + tok * e;
        int n = k < e ? k + 1 : k, clear = 1;
        for (int j = 0; j < n; j++) {   /* selection sort of the n best, lower index first on a tie */
            int32_t best = -1;
            for (int64_t x = 0; x < e; x++) {
                int taken = 0;
                for (int l = 0; l < j; l++) taken |= ord[l] == x;
                if (!taken && (best < 0 || zr[x] > zr[best])) best = (int32_t)x;
            }
            ord[j] = best;
        }
        for (int j = 0; j + 1 < n; j++) {
            double a = zr[ord[j]], b = zr[ord[j + 1]], m = fmax(fabs(a), fabs(b));
            clear &= a - b > (bf16_logits ? m / 128.0 : 0.0) + 1e-4;   /* each moved <= 2^-8·|z| */
        }
        if (!clear) continue;
        held++;
        for (int j = 0; j < k; j++)
            if (ids[tok * k + j] != ord[j])
                fail_msg("token %lld: pick %d is expert %d, the f64 ranking says %d", (long long)tok, j,
                         ids[tok * k + j], ord[j]);
    }
    free(ord);
    return held;
}

/* Uploads the case's tensors (x, wg, dgw, bias rounded in place to what the GPU holds;
 * bias NULL: none), poisons every output and the saved block. */
static void setup(rrun *r, lk_dtype dt, const rcase *c, double *x, double *wg, double *dgw, double *dw,
                  double *bias) {
    int64_t T = c->t, H = c->h, E = c->e, K = c->k;
    lk_dtype gdt = dt == LK_BF16 && !c->gw32 ? LK_BF16 : LK_F32, ddt = c->grad_f32 ? LK_F32 : gdt;
    int64_t sx[2] = {T, H}, sg[2] = {E, H}, sk[2] = {T, K}, s1[1] = {1};
    memset(r, 0, sizeof *r);
    r->a = (lk_moe_router_args){
        .hidden = lkt_view(lkt_upload(x, T * H, dt), dt, 2, sx),
        .gate_weight = lkt_view(lkt_upload(wg, E * H, gdt), gdt, 2, sg),
        .topk_ids = lkt_view(lkt_dev((size_t)(T * K) * 4), LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_dev((size_t)(T * K) * 4), LK_F32, 2, sk),
        .aux_loss = lkt_view(lkt_dev(4), LK_F32, 1, s1),
        .d_topk_weights = lkt_view(lkt_upload(dw, T * K, LK_F32), LK_F32, 2, sk),
        .d_aux_loss = c->d_aux,
        .d_hidden = lkt_view(lkt_dev((size_t)(T * H) * lk_dtype_size(dt)), dt, 2, sx),
        .d_gate_weight = lkt_view(lkt_upload(dgw, E * H, ddt), ddt, 2, sg),
        .top_k = c->k, .norm_topk_prob = c->norm, .softmax_after_topk = c->after, .route_scale = c->scale,
        .gate_f32 = c->gate_f32, .n_group = c->ng, .topk_group = c->tg,
    };
    int64_t se[1] = {E};
    if (bias) r->a.e_bias = lkt_view(lkt_upload(bias, E, LK_F32), LK_F32, 1, se);
    size_t sb = 0;
    assert_int_equal(lk_moe_router_saved_bytes(impl_of(c), T, E, K, &sb), LK_OK);
    r->a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(r->a.saved.data, sb), lkt_poison(r->a.topk_ids.data, (size_t)(T * K) * 4);
    lkt_poison(r->a.topk_weights.data, (size_t)(T * K) * 4), lkt_poison(r->a.aux_loss.data, 4);
    lkt_poison(r->a.d_hidden.data, (size_t)(T * H) * lk_dtype_size(dt));
    r->arena = (lk_arena){.device = LK_DEVICE_CUDA};
    r->ctx = lk_ctx_cuda(&r->arena, NULL, 0);
    r->ctx.comm = group;
}

/* A second forward must give the same bytes: the counts and the aux loss's partial sums
 * are summed in a fixed order. */
static void repeats(const lk_impl *impl, rrun *r, const int32_t *ids, const float *w, float aux) {
    int64_t n = r->a.topk_ids.shape[0] * r->a.topk_ids.shape[1];
    int32_t *ids2 = malloc(sizeof(int32_t) * (size_t)n);
    float *w2 = malloc(sizeof(float) * (size_t)n), aux2 = NAN;
    assert_true(ids2 && w2);
    lkt_poison(r->a.topk_weights.data, (size_t)n * 4), lkt_poison(r->a.aux_loss.data, 4);
    assert_int_equal(lk_moe_router_forward(impl, &r->a, &r->ctx), LK_OK);
    down(ids2, r->a.topk_ids.data, (size_t)n * 4), down(w2, r->a.topk_weights.data, (size_t)n * 4);
    down(&aux2, r->a.aux_loss.data, 4);
    assert_memory_equal(ids2, ids, (size_t)n * 4);
    assert_memory_equal(w2, w, (size_t)n * 4);
    assert_memory_equal(&aux2, &aux, 4);
    free(ids2), free(w2);
}

/* The CPU rows' choice from the GPU's own saved scores v [T, E] (f32): sel = v + bias
 * in f32, then the CPU's lk_router_group_topk (sigmoid_bias's group limit; plain top-k for
 * softmax). The GPU must make it exactly. */
static void cpu_choice(const rcase *c, const float *v, const float *bias, int32_t *ids) {
    int64_t T = c->t, E = c->e;
    float *sel = malloc(sizeof(float) * (size_t)E);
    unsigned char *allowed = malloc((size_t)E);
    assert_true(sel && allowed);
    for (int64_t tok = 0; tok < T; tok++) {
        for (int64_t x = 0; x < E; x++) sel[x] = v[tok * E + x] + (bias ? bias[x] : 0.0f);
        lk_router_group_topk(sel, E, c->k, c->sig ? c->ng : 1, c->tg, allowed, ids + tok * c->k);
    }
    free(sel), free(allowed);
}

static void run_case(lk_dtype dt, const rcase *c, uint32_t seed) {
    int64_t T = c->t, H = c->h, E = c->e, K = c->k;
    const lk_impl *impl = impl_of(c);
    lk_moe_score_kind kind = c->sig ? LK_MOE_SIGMOID : LK_MOE_SOFTMAX;
    double *x = lkt_alloc(T * H), *wg = lkt_alloc(E * H), *dgw = lkt_alloc(E * H), *dw = lkt_alloc(T * K);
    double *bias = c->bias ? lkt_alloc(E) : NULL;
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wg, E * H, &seed, 2.0 / sqrt((double)H));   /* logits ~ N(0, 4) */
    lkt_randn(dgw, E * H, &seed, 0.5), lkt_randn(dw, T * K, &seed, 1.0);
    if (bias) lkt_randn(bias, E, &seed, 0.2);   /* DeepSeek-V3's correction bias: a fraction of the scores */
    rrun r;
    setup(&r, dt, c, x, wg, dgw, dw, bias);   /* bias now rounded to f32 */
    int bf16_logits = dt == LK_BF16 && !c->gate_f32;
    double *z = lkt_alloc(T * E), *v = lkt_alloc(T * E), *sel = lkt_alloc(T * E), *wr = lkt_alloc(T * K);
    double *wgot = lkt_alloc(T * K), *dxr = lkt_alloc(T * H), *dxg = lkt_alloc(T * H), *dgg = lkt_alloc(E * H);
    lk_moe_router_ref_scores(x, wg, bias, T, H, E, kind, z, v, sel);

    assert_int_equal(lk_moe_router_forward(impl, &r.a, &r.ctx), LK_OK);
    int32_t *ids = (int32_t *)lkt_alloc(T * K), *want = (int32_t *)lkt_alloc(T * K);
    float *w = (float *)lkt_alloc(T * K), *vg = (float *)lkt_alloc(T * E), *bf = (float *)lkt_alloc(E), aux = NAN;
    down(ids, r.a.topk_ids.data, (size_t)(T * K) * 4), down(w, r.a.topk_weights.data, (size_t)(T * K) * 4);
    down(&aux, r.a.aux_loss.data, 4), down(vg, r.a.saved.data, (size_t)(T * E) * 4);
    for (int64_t i = 0; bias && i < E; i++) bf[i] = (float)bias[i];
    cpu_choice(c, vg, bias ? bf : NULL, want);
    int64_t same = 0;
    for (int64_t i = 0; i < T * K; i++) same += ids[i] == want[i];
    for (int64_t i = 0; i < T * K; i++) wgot[i] = w[i];
    double tol = lk_moe_router_tol(impl, dt), gap = lk_moe_router_ref_choice_gap(&r.a, sel, ids, T, E), auxr = 0;
    int64_t held = c->sig ? T : ranked_exactly(z, ids, T, E, c->k, bf16_logits);
    lk_moe_router_ref_forward(&r.a, v, ids, T, E, kind, wr, &auxr);
    double ew = lkt_rel_err(wgot, wr, T * K), ea = isfinite(aux) ? fabs(aux - auxr) / fabs(auxr) : INFINITY;
    repeats(impl, &r, ids, w, aux);

    assert_int_equal(lk_moe_router_backward(impl, &r.a, &r.ctx), LK_OK);
    lk_moe_router_ref_backward(&r.a, x, wg, v, ids, dw, c->d_aux, T, H, E, kind, dxr, dgw);   /* dgw += */
    lkt_download(r.a.d_hidden.data, T * H, dt, dxg);
    lkt_download(r.a.d_gate_weight.data, E * H, r.a.d_gate_weight.dtype, dgg);
    double edx = lkt_rel_err(dxg, dxr, T * H), edg = lkt_rel_err(dgg, dgw, E * H);
    if (amax(dxr, T * H) < 1e-12) {
        /* a gradient that is zero in exact math (k 1 after top-k: every weight is 1, and no
         * aux term): the GPU's f32 residue measured against the scale of what it multiplies */
        double scale = amax(dw, T * K) * amax(wg, E * H);
        edx = amax(dxg, T * H) / (scale > 0 ? scale : 1);
    }
    print_message("  %s %s%s T %lld H %lld E %lld k %d%s scale %g d_aux %g%s%s groups %d/%d: gap %.1e, %lld/%lld "
                  "ranked exactly, %lld/%lld as the CPU picks, w %.1e aux %.1e dx %.1e dgw(%s) %.1e (tol %.0e)\n",
                  impl->name, lk_dtype_name(dt), c->gw32 && dt == LK_BF16 ? "/f32 gate" : "", (long long)T,
                  (long long)H, (long long)E, c->k, c->norm ? " norm" : c->after ? " after" : "", (double)c->scale,
                  (double)c->d_aux, bf16_logits ? "" : " f32 logits", c->bias ? " bias" : "", c->ng, c->tg, gap,
                  (long long)held, (long long)T, (long long)same, (long long)(T * K), ew, ea, edx,
                  lk_dtype_name(r.a.d_gate_weight.dtype), edg, tol);
    /* the choice: exactly the CPU rows' from the GPU's scores, bit for bit */
    assert_memory_equal(ids, want, (size_t)(T * K) * 4);
    /* ... and within the tolerance of the f64 best (tol: max-normalized scores, as
     * harness_router.c). Logits rounded to bf16 can flip a near-tie between two groups,
     * whose best-k sums may then differ by more than a rounding: the group limit there is
     * held to the CPU's choice above, not to the f64 one. */
    if (!(bf16_logits && c->sig && c->ng > 1)) assert_true(gap <= tol);
    /* unrounded logits: the exact-ranking check held at least half the tokens (rounded
     * to bf16, a near-tie among the k + 1 best is common, so it may hold few) */
    assert_true(bf16_logits || held * 2 >= T);
    assert_true(ew <= tol && ea <= tol && edx <= tol && edg <= tol);   /* tol: f32 2e-5, bf16 2e-2 */
    /* bf16 hidden and gate: the backward's GEMMs take dz as two bf16 parts (router_cuda.c), dz to
     * 2^-17 of it; with unrounded logits and an f32 d_gate_weight that holds f32's tolerance, where
     * dz rounded to bf16 alone would miss it by ~2^-9 */
    if (dt == LK_BF16 && !c->gw32 && c->gate_f32 && c->grad_f32) assert_true(edg <= 2e-5);
    lk_arena_free(&r.arena);
    lkt_free_all();
}

static void against_reference(void **state) {
    (void)state;
    const rcase cases[] = {
        /* t    h    e   k  norm after scale d_aux gw32 gate_f32 grad_f32 sig bias ng tg */
        {1, 5, 4, 1, 0, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},       /* one token, H = 5 */
        {7, 64, 8, 2, 1, 0, 2.5f, 0.37f, 0, 0, 1, 0, 0, 0, 0},
        {333, 129, 60, 8, 1, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},  /* Qwen3-MoE-like: normalized top-8 */
        {333, 64, 128, 8, 0, 0, 0.0f, 0.37f, 1, 0, 1, 0, 0, 0, 0},  /* route_scale 0 = 1; an f32 gate over bf16 hidden */
        {7, 129, 128, 1, 0, 1, 1.5f, 0.0f, 0, 0, 0, 0, 0, 0, 0},    /* softmax_after_topk, no aux gradient */
        {1, 64, 8, 8, 1, 0, 1.0f, 0.37f, 0, 1, 0, 0, 0, 0, 0},      /* k = E; gate_f32 */
        {333, 5, 4, 2, 1, 0, 0.5f, 1.0f, 1, 1, 1, 0, 0, 0, 0},      /* gate_f32 with an f32 gate */
        {333, 129, 60, 8, 1, 0, 1.0f, 0.37f, 0, 1, 1, 0, 0, 0, 0},  /* bf16 gate, f32 logits and d_gate_weight */
        {64, 64, 200, 8, 1, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},
        {33, 64, 512, 8, 1, 0, 1.0f, 0.37f, 0, 0, 1, 0, 0, 0, 0},   /* the largest row kept in registers */
        {33, 64, 600, 9, 1, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},   /* longer rows: read back from the saved scores */
        {7, 16, 60, 60, 0, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},    /* k = E > 32: picks beyond one lane each */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 17u + (uint32_t)i);
}

/* The issue's matrix for both learned routers: E 8 top-2, E 64 top-8, E 128 top-8 at
 * T 1, 37 and 1000 (no tile divides them), f32 and bf16, H 136. sigmoid_bias with
 * DeepSeek-V3's options: a correction bias, groups (E/8 experts each, the best half
 * kept), normalized weights, route_scale 2.5; bf16 runs alternate gate_f32. */
static void issue_matrix(void **state) {
    (void)state;
    static const int64_t ts[] = {1, 37, 1000}, es[] = {8, 64, 128};
    static const int ks[] = {2, 8, 8};
    uint32_t seed = 100;
    for (int sig = 0; sig < 2; sig++)
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    int ng = es[i] == 8 ? 4 : 8;
                    rcase c = {ts[j], 136, es[i], ks[i], 1, 0, sig ? 2.5f : 1.0f, 0.37f, 0, (i + j) & 1, j & 1,
                               sig, sig, sig ? ng : 0, sig ? ng / 2 : 0};
                    run_case(d ? LK_BF16 : LK_F32, &c, seed++);
                }
}

/* sigmoid_bias beyond the matrix: no groups, no bias, unnormalized; groups of one expert
 * (n_group = E); one group kept; rows longer than the registers hold (E 600); k = E. */
static void sigmoid_bias_cases(void **state) {
    (void)state;
    const rcase cases[] = {
        /* t    h    e   k  norm after scale d_aux gw32 gate_f32 grad_f32 sig bias ng tg */
        {37, 64, 64, 8, 0, 0, 1.0f, 0.37f, 0, 0, 0, 1, 0, 0, 0},      /* plain sigmoid top-k */
        {37, 64, 64, 6, 1, 0, 1.0f, 0.37f, 0, 0, 1, 1, 1, 64, 8},     /* groups of one expert */
        {100, 48, 32, 4, 1, 0, 1.0f, 0.0f, 1, 0, 0, 1, 1, 4, 1},      /* one group kept; f32 gate */
        {33, 64, 600, 9, 1, 0, 2.5f, 0.37f, 0, 0, 0, 1, 1, 5, 2},     /* rows beyond the registers */
        {5, 16, 8, 8, 0, 0, 1.0f, 0.37f, 0, 1, 0, 1, 1, 2, 2},        /* k = E, every group kept */
        {1, 5, 4, 1, 1, 0, 1.0f, 0.37f, 0, 0, 0, 1, 1, 0, 0},         /* one token, H = 5 */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 57u + (uint32_t)i);
}

/* Equal scores go to the lower index. Rows e and e + 4 of the gate are the same, so each
 * logit comes twice and the GPU must list the pair lower index first; an all-zero gate
 * ties everything: experts 0, 1, ... with weight 1/E. */
static void ties_to_lower_index(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        lk_dtype dt = d ? LK_BF16 : LK_F32;
        const rcase c = {3, 16, 8, 8, 0, 0, 1.0f, 0.0f, 0, 1, 0, 0, 0, 0, 0};   /* gate_f32: bf16 rounding makes ties of its own */
        uint32_t seed = 5;
        double x[3 * 16], wg[8 * 16], dgw[8 * 16] = {0}, dw[3 * 8] = {0}, z[3 * 8], v[3 * 8], sel[3 * 8];
        lkt_randn(x, 3 * 16, &seed, 1.0), lkt_randn(wg, 4 * 16, &seed, 0.5);
        memcpy(wg + 4 * 16, wg, sizeof(double) * 4 * 16);
        rrun r;
        setup(&r, dt, &c, x, wg, dgw, dw, NULL);
        lk_moe_router_ref_scores(x, wg, NULL, 3, 16, 8, LK_MOE_SOFTMAX, z, v, sel);
        assert_int_equal(lk_moe_router_forward(impl_cuda(), &r.a, &r.ctx), LK_OK);
        int32_t ids[3 * 8];
        down(ids, r.a.topk_ids.data, sizeof ids);
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < 8; j += 2) {
                assert_int_equal(ids[t * 8 + j] + 4, ids[t * 8 + j + 1]);
                assert_true(ids[t * 8 + j] < 4);
                if (j) assert_true(z[t * 8 + ids[t * 8 + j - 2]] > z[t * 8 + ids[t * 8 + j]]);
            }
        lk_arena_free(&r.arena);
        lkt_free_all();

        const rcase c0 = {5, 16, 8, 3, 0, 0, 1.0f, 0.0f, 0, 0, 0, 0, 0, 0, 0};
        double wz[8 * 16] = {0}, x5[5 * 16];
        lkt_randn(x5, 5 * 16, &seed, 1.0);
        setup(&r, dt, &c0, x5, wz, dgw, dw, NULL);
        assert_int_equal(lk_moe_router_forward(impl_cuda(), &r.a, &r.ctx), LK_OK);
        int32_t ids0[5 * 3];
        float w0[5 * 3];
        down(ids0, r.a.topk_ids.data, sizeof ids0), down(w0, r.a.topk_weights.data, sizeof w0);
        for (int i = 0; i < 5 * 3; i++) {
            assert_int_equal(ids0[i], i % 3);
            assert_float_equal(w0[i], 0.125f, 1e-7f);
        }
        lk_arena_free(&r.arena);
        lkt_free_all();
    }
}

/* One bad call: refused with code and a message naming want, nothing written. */
static void expect_refused_by(const lk_impl *impl, rrun *r, int backward, lk_status code, const char *want) {
    lk_status s = backward ? lk_moe_router_backward(impl, &r->a, &r->ctx) : lk_moe_router_forward(impl, &r->a, &r->ctx);
    print_message("  refused (%d): %s\n", (int)s, lk_last_error());
    assert_int_equal(s, code);
    assert_non_null(strstr(lk_last_error(), want));
    assert_true(all_ff(r->a.topk_ids.data, lk_tensor_numel(&r->a.topk_ids) * 4));
    assert_true(all_ff(r->a.topk_weights.data, lk_tensor_numel(&r->a.topk_weights) * 4));
    assert_true(all_ff(r->a.aux_loss.data, 4));
    assert_true(all_ff(r->a.saved.data, r->a.saved.bytes));
    assert_true(all_ff(r->a.d_hidden.data, lk_tensor_numel(&r->a.d_hidden) * lk_dtype_size(r->a.d_hidden.dtype)));
}

static void expect_refused(rrun *r, int backward, lk_status code, const char *want) {
    expect_refused_by(impl_cuda(), r, backward, code, want);
}

static void bad_input_refused(void **state) {
    (void)state;
    const rcase c = {6, 16, 4, 2, 1, 0, 1.0f, 0.37f, 0, 0, 1, 0, 0, 0, 0};
    uint32_t seed = 9;
    double x[6 * 16], wg[4 * 16], dgw[4 * 16], dw[6 * 2];
    lkt_randn(x, 6 * 16, &seed, 1.0), lkt_randn(wg, 4 * 16, &seed, 0.5);
    lkt_randn(dgw, 4 * 16, &seed, 0.5), lkt_randn(dw, 6 * 2, &seed, 1.0);
    rrun r;
    setup(&r, LK_F32, &c, x, wg, dgw, dw, NULL);

    r.a.top_k = 5;   /* k > E = 4 */
    expect_refused(&r, 0, LK_EINVAL, "top_k");
    r.a.top_k = 2;
    r.a.hidden.dtype = LK_I32;
    expect_refused(&r, 0, LK_EDTYPE, "hidden");
    r.a.hidden.dtype = LK_F32;
    r.a.d_topk_weights.dtype = LK_BF16;
    expect_refused(&r, 1, LK_EDTYPE, "d_topk_weights");
    r.a.d_topk_weights.dtype = LK_F32;

    /* a host-memory group (even one of a single rank) is refused, forward and backward
     * (the aux loss's sums are all-reduced on the GPU), and d_gate_weight keeps its values */
    r.ctx.comm = lk_comm_self();
    expect_refused(&r, 0, LK_EINVAL, "ctx.comm");
    expect_refused(&r, 1, LK_EINVAL, "ctx.comm");
    double *g = lkt_alloc(4 * 16);
    lkt_download(r.a.d_gate_weight.data, 4 * 16, LK_F32, g);
    assert_memory_equal(g, dgw, sizeof dgw);

    r.ctx.comm = NULL;   /* and the same call without it goes through */
    assert_int_equal(lk_moe_router_forward(impl_cuda(), &r.a, &r.ctx), LK_OK);
    lk_arena_free(&r.arena);
    lkt_free_all();
}

/* The new rows' bad input: refused with the argument named, nothing written. */
static void bad_input_refused_new_rows(void **state) {
    (void)state;
    const rcase c = {6, 16, 4, 2, 1, 0, 1.0f, 0.37f, 0, 0, 1, 1, 1, 2, 1};
    uint32_t seed = 19;
    double x[6 * 16], wg[4 * 16], dgw[4 * 16], dw[6 * 2], bias[4];
    lkt_randn(x, 6 * 16, &seed, 1.0), lkt_randn(wg, 4 * 16, &seed, 0.5);
    lkt_randn(dgw, 4 * 16, &seed, 0.5), lkt_randn(dw, 6 * 2, &seed, 1.0), lkt_randn(bias, 4, &seed, 0.1);
    rrun r;
    setup(&r, LK_F32, &c, x, wg, dgw, dw, bias);
    const lk_impl *sig = impl_named("sigmoid_bias"), *fake = impl_named("fake_balanced");

    r.a.e_bias.dtype = LK_BF16;   /* sigmoid_bias: e_bias must be f32 */
    expect_refused_by(sig, &r, 0, LK_EDTYPE, "e_bias");
    r.a.e_bias.dtype = LK_F32;
    r.a.e_bias.shape[0] = 3;
    expect_refused_by(sig, &r, 0, LK_ESHAPE, "e_bias");
    r.a.e_bias.shape[0] = 4;
    r.a.n_group = 3;              /* E = 4 not divisible */
    expect_refused_by(sig, &r, 0, LK_EINVAL, "n_group");
    r.a.n_group = 2, r.a.topk_group = 1, r.a.top_k = 3;   /* k > topk_group · E/n_group */
    expect_refused_by(sig, &r, 0, LK_EINVAL, "n_group");
    r.a.top_k = 2;
    r.a.hidden.device.type = LK_DEVICE_CPU;   /* a host tensor given to a CUDA row */
    expect_refused_by(sig, &r, 0, LK_EDEVICE, "hidden");
    expect_refused_by(fake, &r, 0, LK_EDEVICE, "hidden");
    r.a.hidden.device.type = LK_DEVICE_CUDA;
    r.a.route_scale = NAN;
    expect_refused_by(sig, &r, 0, LK_EINVAL, "route_scale");
    r.a.route_scale = 1.0f;

    r.a.noise = 1.5f;             /* fake_balanced: noise in [0, 1] */
    expect_refused_by(fake, &r, 0, LK_EINVAL, "noise");
    r.a.noise = 0.3f;
    r.a.top_k = 5;
    expect_refused_by(fake, &r, 0, LK_EINVAL, "top_k");
    r.a.top_k = 2;
    lk_tensor gw = r.a.gate_weight;
    r.a.gate_weight.data = NULL;  /* no gate weight and no n_experts */
    expect_refused_by(fake, &r, 0, LK_EINVAL, "n_experts");
    r.a.gate_weight = gw;
    r.a.d_hidden.dtype = LK_BF16;
    expect_refused_by(fake, &r, 1, LK_EDTYPE, "d_hidden");
    r.a.d_hidden.dtype = LK_F32;

    r.ctx.comm = lk_comm_self();  /* both refuse a host group, as softmax_topk does */
    expect_refused_by(sig, &r, 0, LK_EINVAL, "ctx.comm");
    expect_refused_by(sig, &r, 1, LK_EINVAL, "ctx.comm");
    expect_refused_by(fake, &r, 0, LK_EINVAL, "ctx.comm");
    expect_refused_by(fake, &r, 1, LK_EINVAL, "ctx.comm");
    r.ctx.comm = NULL;
    assert_int_equal(lk_moe_router_forward(sig, &r.a, &r.ctx), LK_OK);
    assert_int_equal(lk_moe_router_forward(fake, &r.a, &r.ctx), LK_OK);
    lk_arena_free(&r.arena);
    lkt_free_all();
}

/* --- fake_balanced -------------------------------------------------------------------- */

typedef struct {
    int64_t t, h, e;
    int k;
    float noise, scale;
    int gate;        /* a gate_weight given (else n_experts alone) */
    int unaligned;   /* hidden one element past an 8-byte boundary: the hash's byte path */
} fcase;

typedef struct {
    int32_t *ids;
    float *w, aux;
} fout;

static void fake_forward(const lk_impl *impl, lk_moe_router_args *a, lk_ctx *ctx, fout *o) {
    int64_t n = lk_tensor_numel(&a->topk_ids);
    if (impl->device == LK_DEVICE_CUDA) {
        lkt_poison(a->topk_ids.data, (size_t)n * 4), lkt_poison(a->topk_weights.data, (size_t)n * 4);
        lkt_poison(a->aux_loss.data, 4);
    }
    assert_int_equal(lk_moe_router_forward(impl, a, ctx), LK_OK);
    if (impl->device == LK_DEVICE_CUDA) {
        down(o->ids, a->topk_ids.data, (size_t)n * 4), down(o->w, a->topk_weights.data, (size_t)n * 4);
        down(&o->aux, a->aux_loss.data, 4);
    }
}

static void fake_case(lk_dtype dt, const fcase *c, uint32_t seed) {
    int64_t T = c->t, H = c->h, E = c->e, K = c->k, n = T * K;
    size_t xb = (size_t)(T * H) * lk_dtype_size(dt);
    const lk_impl *gpu = impl_named("fake_balanced"), *cpu = lk_impl_find(LK_OP_MOE_ROUTER, "fake_balanced", LK_DEVICE_CPU);
    assert_non_null(cpu);
    double *x = lkt_alloc(T * H), *wg = lkt_alloc(E * H), *dgw = lkt_alloc(E * H);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wg, E * H, &seed, 0.1), lkt_randn(dgw, E * H, &seed, 0.5);
    char *xd = lkt_upload(x, T * H, dt);   /* x now holds the dtype's values */
    if (c->unaligned) {   /* one element past an 8-byte boundary: 2 or 4 bytes */
        char *buf = lkt_dev(xb + 16);
        size_t off = lk_dtype_size(dt);
        assert_int_equal(cudaMemcpy(buf + off, xd, xb, cudaMemcpyDeviceToDevice), cudaSuccess);
        xd = buf + off;
    }
    unsigned char *xh = malloc(xb);
    assert_non_null(xh);
    down(xh, xd, xb);
    int64_t sx[2] = {T, H}, sk[2] = {T, K}, sg[2] = {E, H}, s1[1] = {1};
    lk_moe_router_args a = {
        .hidden = lkt_view(xd, dt, 2, sx),
        .topk_ids = lkt_view(lkt_dev((size_t)n * 4), LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_dev((size_t)n * 4), LK_F32, 2, sk),
        .aux_loss = lkt_view(lkt_dev(4), LK_F32, 1, s1),
        .d_topk_weights = lkt_view(lkt_dev((size_t)n * 4), LK_F32, 2, sk),
        .d_hidden = lkt_view(lkt_dev(xb), dt, 2, sx),
        .n_experts = (int)E, .top_k = c->k, .route_scale = c->scale, .noise = c->noise,
    };
    if (c->gate) {
        a.gate_weight = lkt_view(lkt_upload(wg, E * H, dt), dt, 2, sg);
        a.d_gate_weight = lkt_view(lkt_upload(dgw, E * H, LK_F32), LK_F32, 2, sg);
    }
    lk_arena arena = {.device = LK_DEVICE_CUDA}, harena = {0};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0), hctx = lk_ctx_cpu(&harena);
    fout g = {(int32_t *)lkt_alloc(n), (float *)lkt_alloc(n), NAN}, g2 = {(int32_t *)lkt_alloc(n), (float *)lkt_alloc(n), NAN};
    fout h = {(int32_t *)lkt_alloc(n), (float *)lkt_alloc(n), NAN};
    fake_forward(gpu, &a, &ctx, &g);

    /* the CPU row on the same bytes (n_experts alone: the gate is not read) */
    lk_moe_router_args b = a;
    b.hidden = lk_tensor_2d(xh, dt, T, H);
    b.gate_weight = b.d_gate_weight = (lk_tensor){0};
    b.topk_ids = lk_tensor_2d(h.ids, LK_I32, T, K), b.topk_weights = lk_tensor_2d(h.w, LK_F32, T, K);
    b.aux_loss = lk_tensor_1d(&h.aux, LK_F32, 1), b.d_topk_weights = lk_tensor_2d(NULL, LK_F32, T, K);
    b.d_hidden = lk_tensor_2d(NULL, dt, T, H);
    fake_forward(cpu, &b, &hctx, &h);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += g.ids[i] == h.ids[i];
    print_message("  fake_balanced %s T %lld H %lld E %lld k %d noise %g scale %g%s%s: %lld/%lld routes as the CPU's, "
                  "aux %.6f (cpu %.6f)\n", lk_dtype_name(dt), (long long)T, (long long)H, (long long)E, c->k,
                  (double)c->noise, (double)c->scale, c->gate ? " gate" : "", c->unaligned ? " unaligned" : "",
                  (long long)same, (long long)n, (double)g.aux, (double)h.aux);
    assert_memory_equal(g.ids, h.ids, (size_t)n * 4);   /* bit for bit the CPU row's routing */
    assert_memory_equal(g.w, h.w, (size_t)n * 4);
    assert_memory_equal(&g.aux, &h.aux, 4);
    float sc = c->scale > 0 ? c->scale : 1.0f;
    if (c->noise == 0.0f) {   /* the noise-0 pattern: (t·k + j) mod E, weight route_scale/k, exactly */
        for (int64_t r = 0; r < n; r++) {
            assert_int_equal(g.ids[r], (int32_t)(r % E));
            assert_true(g.w[r] == sc / (float)K);
        }
    } else {              /* a valid choice: distinct experts in range, weights summing to route_scale */
        for (int64_t t = 0; t < T; t++) {
            double sum = 0;
            for (int j = 0; j < K; j++) {
                int32_t id = g.ids[t * K + j];
                assert_true(id >= 0 && id < E);
                for (int l = 0; l < j; l++) assert_true(g.ids[t * K + l] != id);
                sum += g.w[t * K + j];
            }
            assert_true(fabs(sum - sc) <= 1e-5 * sc);   /* f32 sums of k terms */
        }
    }
    /* determinism: a second call, and a recompute from a copy of hidden elsewhere */
    fake_forward(gpu, &a, &ctx, &g2);
    assert_memory_equal(g2.ids, g.ids, (size_t)n * 4);
    assert_memory_equal(g2.w, g.w, (size_t)n * 4);
    assert_memory_equal(&g2.aux, &g.aux, 4);
    lk_moe_router_args re = a;
    re.hidden.data = lkt_dev(xb);
    assert_int_equal(cudaMemcpy(re.hidden.data, xd, xb, cudaMemcpyDeviceToDevice), cudaSuccess);
    fake_forward(gpu, &re, &ctx, &g2);
    assert_memory_equal(g2.ids, g.ids, (size_t)n * 4);
    assert_memory_equal(g2.w, g.w, (size_t)n * 4);
    if (c->noise > 0 && T >= 37) {   /* another input routes otherwise */
        x[T * H - 1] += 1.0;
        re.hidden.data = lkt_upload(x, T * H, dt);
        fake_forward(gpu, &re, &ctx, &g2);
        assert_true(memcmp(g2.ids, g.ids, (size_t)n * 4) != 0);
    }
    /* backward: d_hidden written with zeros, the gate gradient left alone */
    lkt_poison(a.d_hidden.data, xb);
    assert_int_equal(lk_moe_router_backward(gpu, &a, &ctx), LK_OK);
    double *dx = lkt_alloc(T * H), *dg = lkt_alloc(E * H);
    lkt_download(a.d_hidden.data, T * H, dt, dx);
    assert_true(amax(dx, T * H) == 0.0);
    if (c->gate) {
        lkt_download(a.d_gate_weight.data, E * H, LK_F32, dg);
        assert_memory_equal(dg, dgw, sizeof(double) * (size_t)(E * H));
    }
    free(xh);
    lk_arena_free(&arena), lk_arena_free(&harena);
    lkt_free_all();
}

static void fake_balanced_cases(void **state) {
    (void)state;
    static const int64_t ts[] = {1, 37, 1000}, es[] = {8, 64, 128};
    static const int ks[] = {2, 8, 8};
    static const float noises[] = {0.0f, 0.3f, 1.0f};
    uint32_t seed = 300;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                for (int q = 0; q < 3; q++) {
                    fcase c = {ts[j], 72, es[i], ks[i], noises[q], q == 1 ? 2.5f : 0.0f, (i + q) & 1, 0};
                    fake_case(d ? LK_BF16 : LK_F32, &c, seed++);
                }
    const fcase odd[] = {
        {37, 67, 64, 8, 0.3f, 1.0f, 0, 1},    /* unaligned hidden, a tail (37·67·2 = 4958 bytes, ·4 = 9916) */
        {33, 16, 600, 9, 0.5f, 1.0f, 0, 0},   /* rows beyond the registers */
        {7, 16, 60, 60, 0.3f, 1.0f, 1, 0},    /* k = E */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) fake_case(d ? LK_BF16 : LK_F32, &odd[i], 400u + (uint32_t)i);
}

/* --- CUDA graphs --------------------------------------------------------------------- */

/* lkt_capture's pass: a router row's forward or backward. */
typedef struct {
    const lk_impl *impl;
    const lk_moe_router_args *a;
    lk_ctx *ctx;
} router_call;

static lk_status router_pass(void *user, int backward) {
    const router_call *c = user;
    return backward ? lk_moe_router_backward(c->impl, c->a, c->ctx) : lk_moe_router_forward(c->impl, c->a, c->ctx);
}

/* One router's forward + backward captured on a stream (any synchronization or host read
 * fails the capture) and replayed twice, each time to the eager run's bits, outputs
 * poisoned and the accumulated gate gradient reset before each. */
static void graph_case(const char *name, lk_dtype dt, const rcase *c, float noise, uint32_t seed) {
    int64_t T = c->t, H = c->h, E = c->e, K = c->k;
    const lk_impl *impl = impl_named(name);
    double *x = lkt_alloc(T * H), *wg = lkt_alloc(E * H), *dgw = lkt_alloc(E * H), *dw = lkt_alloc(T * K);
    double *bias = c->bias ? lkt_alloc(E) : NULL;
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wg, E * H, &seed, 2.0 / sqrt((double)H));
    lkt_randn(dgw, E * H, &seed, 0.5), lkt_randn(dw, T * K, &seed, 1.0);
    if (bias) lkt_randn(bias, E, &seed, 0.2);
    rrun r;
    setup(&r, dt, c, x, wg, dgw, dw, bias);
    r.a.noise = noise;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    r.ctx = lk_ctx_cuda(&r.arena, st, 0);
    size_t gb = lk_tensor_numel(&r.a.d_gate_weight) * lk_dtype_size(r.a.d_gate_weight.dtype);
    void *g0 = lkt_dev(gb);
    assert_int_equal(cudaMemcpy(g0, r.a.d_gate_weight.data, gb, cudaMemcpyDeviceToDevice), cudaSuccess);
    struct { void *p; size_t n; } outs[] = {
        {r.a.topk_ids.data, (size_t)(T * K) * 4}, {r.a.topk_weights.data, (size_t)(T * K) * 4},
        {r.a.aux_loss.data, 4}, {r.a.d_hidden.data, (size_t)(T * H) * lk_dtype_size(dt)},
        {r.a.d_gate_weight.data, gb},
    };
    enum { NOUT = sizeof outs / sizeof *outs };
    void *want[NOUT];
    /* eager, which also grows the arena to what the captured calls reserve */
    assert_int_equal(lk_moe_router_forward(impl, &r.a, &r.ctx), LK_OK);
    assert_int_equal(lk_moe_router_backward(impl, &r.a, &r.ctx), LK_OK);
    for (int i = 0; i < NOUT; i++) {
        want[i] = malloc(outs[i].n);
        assert_non_null(want[i]);
        down(want[i], outs[i].p, outs[i].n);
    }
    cudaGraphExec_t exec = lkt_capture(st, router_pass, &(router_call){impl, &r.a, &r.ctx});
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < NOUT - 1; i++) lkt_poison(outs[i].p, outs[i].n);
        lkt_poison(r.a.saved.data, r.a.saved.bytes);
        assert_int_equal(cudaMemcpy(r.a.d_gate_weight.data, g0, gb, cudaMemcpyDeviceToDevice), cudaSuccess);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
        for (int i = 0; i < NOUT; i++) {
            void *hb = malloc(outs[i].n);
            assert_non_null(hb);
            down(hb, outs[i].p, outs[i].n);
            assert_memory_equal(hb, want[i], outs[i].n);
            free(hb);
        }
    }
    print_message("  graph %s %s T %lld E %lld k %lld%s: forward + backward captured, replayed to the eager bits\n",
                  name, lk_dtype_name(dt), (long long)T, (long long)E, (long long)K, noise > 0 ? " (noise)" : "");
    for (int i = 0; i < NOUT; i++) free(want[i]);
    assert_int_equal(cudaGraphExecDestroy(exec), cudaSuccess);
    lk_arena_free(&r.arena);
    assert_int_equal(cudaStreamDestroy(st), cudaSuccess);
    lkt_free_all();
}

static void graph_capture(void **state) {
    (void)state;
    const rcase soft = {1000, 136, 128, 8, 1, 0, 1.0f, 0.37f, 0, 0, 1, 0, 0, 0, 0};
    const rcase sig = {1000, 136, 128, 8, 1, 0, 2.5f, 0.37f, 0, 0, 0, 1, 1, 8, 4};
    const rcase fake = {1000, 136, 64, 8, 0, 0, 1.0f, 0.0f, 0, 0, 1, 0, 0, 0, 0};
    for (int d = 0; d < 2; d++) {
        lk_dtype dt = d ? LK_BF16 : LK_F32;
        graph_case("softmax_topk", dt, &soft, 0.0f, 7u);
        graph_case("sigmoid_bias", dt, &sig, 0.0f, 8u);
        graph_case("fake_balanced", dt, &fake, 0.3f, 9u);
        graph_case("fake_balanced", dt, &fake, 0.0f, 10u);
    }
}

/* Over an NCCL group of one: the forward's aux loss from the group's sums (one all-reduce
 * a call) and the backward's aux gradient from the group's counts and T (one more), held
 * to the f64 reference as without a group. */
static void group_of_one(void **state) {
    (void)state;
    if (!lk_hw_get()->has_nccl) {
        print_message("  NCCL is not built in: %s\n", "no group to run over");
        skip();
    }
    assert_int_equal(lk_comm_nccl_create(lk_comm_self(), 0, &group), LK_OK);
    const rcase cases[] = {
        /* t    h    e   k  norm after scale d_aux gw32 gate_f32 grad_f32 sig bias ng tg */
        {333, 129, 60, 8, 1, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},
        {1, 5, 4, 1, 0, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},
        {1000, 136, 128, 8, 1, 0, 2.5f, 0.37f, 0, 1, 1, 1, 1, 8, 4},   /* sigmoid_bias, DeepSeek-V3's options */
        {37, 64, 600, 9, 1, 0, 1.0f, 0.37f, 0, 0, 0, 0, 0, 0, 0},
    };
    int n = (int)(sizeof cases / sizeof *cases);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < n; i++) run_case(d ? LK_BF16 : LK_F32, &cases[i], 300u + (uint32_t)i);
    /* per case: the forward, its repeat and the backward's counts */
    assert_int_equal(group->stats.calls[LK_COLL_ALL_REDUCE], 2 * n * 3);
    lk_comm_destroy(group);
    group = NULL;
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_router")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_reference),
        cmocka_unit_test(issue_matrix),
        cmocka_unit_test(sigmoid_bias_cases),
        cmocka_unit_test(fake_balanced_cases),
        cmocka_unit_test(graph_capture),
        cmocka_unit_test(ties_to_lower_index),
        cmocka_unit_test(bad_input_refused),
        cmocka_unit_test(bad_input_refused_new_rows),
        cmocka_unit_test(group_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
