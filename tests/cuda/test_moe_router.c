/* test_moe_router.c (GPU) — the CUDA `softmax_topk` MoE router against the float64
 * reference (src/ops/moe/reference.c), f32 and bf16 storage, over odd shapes (one token,
 * H = 5, E = 4 .. 600, k = 1 .. E), norm_topk_prob / softmax_after_topk on and off,
 * route_scale != 1, an f32 gate over bf16 hidden, gate_f32:
 *   forward   ids: no expert twice, none short of the f64 best by more than the
 *             tolerance, and exactly the f64 ranking on every token without a near-tie
 *             among its k + 1 best logits; weights and aux loss at the GPU's own choice
 *             (a near-tie may be decided either way); a second call bit for bit the same.
 *   backward  d_hidden, and d_gate_weight added onto random values already there (f32
 *             or the gate's dtype), with and without an aux-loss gradient.
 * Every output and the saved block are NaN-poisoned first. Tolerances (max-normalized,
 * as harness_router.c): f32 2e-5 (exact f32 GEMMs and softmax against float64); bf16
 * 2e-2 (logits rounded to bf16 move each probability by up to ~|z|·2^-9, d_hidden and a
 * bf16 d_gate_weight are rounded once). Also: ties go to the lower index, and bad input
 * (k > E, a wrong dtype, a communicator) is refused before anything is written. Skipped
 * (77) where there is no GPU. */
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
#include "ops/moe/check.h"
#include "ops/moe/reference.h"

typedef struct {
    int64_t t, h, e;
    int k, norm, after;   /* norm_topk_prob, softmax_after_topk */
    float scale, d_aux;
    int gw32;             /* bf16 runs: the gate weight in f32 */
    int gate_f32;         /* bf16 runs: logits kept in f32 */
    int grad_f32;         /* d_gate_weight in f32 (else the gate's dtype) */
} rcase;

typedef struct {   /* the device side of one case */
    lk_moe_router_args a;
    lk_arena arena;
    lk_ctx ctx;
} rrun;

static const lk_impl *impl_cuda(void) { return lk_impl_find(LK_OP_MOE_ROUTER, "softmax_topk", LK_DEVICE_CUDA); }

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

/* Uploads the case's tensors (x, wg, dgw rounded in place to what the GPU holds),
 * poisons every output and the saved block. */
static void setup(rrun *r, lk_dtype dt, const rcase *c, double *x, double *wg, double *dgw, double *dw) {
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
        .gate_f32 = c->gate_f32,
    };
    size_t sb = 0;
    assert_int_equal(lk_moe_router_saved_bytes(impl_cuda(), T, E, K, &sb), LK_OK);
    r->a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(r->a.saved.data, sb), lkt_poison(r->a.topk_ids.data, (size_t)(T * K) * 4);
    lkt_poison(r->a.topk_weights.data, (size_t)(T * K) * 4), lkt_poison(r->a.aux_loss.data, 4);
    lkt_poison(r->a.d_hidden.data, (size_t)(T * H) * lk_dtype_size(dt));
    r->arena = (lk_arena){.device = LK_DEVICE_CUDA};
    r->ctx = lk_ctx_cuda(&r->arena, NULL, 0);
}

/* A second forward must give the same bytes: the counts and the aux loss's partial sums
 * are summed in a fixed order. */
static void repeats(rrun *r, const int32_t *ids, const float *w, float aux) {
    int64_t n = r->a.topk_ids.shape[0] * r->a.topk_ids.shape[1];
    int32_t *ids2 = malloc(sizeof(int32_t) * (size_t)n);
    float *w2 = malloc(sizeof(float) * (size_t)n), aux2 = NAN;
    assert_true(ids2 && w2);
    lkt_poison(r->a.topk_weights.data, (size_t)n * 4), lkt_poison(r->a.aux_loss.data, 4);
    assert_int_equal(lk_moe_router_forward(impl_cuda(), &r->a, &r->ctx), LK_OK);
    down(ids2, r->a.topk_ids.data, (size_t)n * 4), down(w2, r->a.topk_weights.data, (size_t)n * 4);
    down(&aux2, r->a.aux_loss.data, 4);
    assert_memory_equal(ids2, ids, (size_t)n * 4);
    assert_memory_equal(w2, w, (size_t)n * 4);
    assert_memory_equal(&aux2, &aux, 4);
    free(ids2), free(w2);
}

static void run_case(lk_dtype dt, const rcase *c, uint32_t seed) {
    int64_t T = c->t, H = c->h, E = c->e, K = c->k;
    double *x = lkt_alloc(T * H), *wg = lkt_alloc(E * H), *dgw = lkt_alloc(E * H), *dw = lkt_alloc(T * K);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wg, E * H, &seed, 2.0 / sqrt((double)H));   /* logits ~ N(0, 4) */
    lkt_randn(dgw, E * H, &seed, 0.5), lkt_randn(dw, T * K, &seed, 1.0);
    rrun r;
    setup(&r, dt, c, x, wg, dgw, dw);
    int bf16_logits = dt == LK_BF16 && !c->gate_f32;
    double *z = lkt_alloc(T * E), *v = lkt_alloc(T * E), *sel = lkt_alloc(T * E), *wr = lkt_alloc(T * K);
    double *wgot = lkt_alloc(T * K), *dxr = lkt_alloc(T * H), *dxg = lkt_alloc(T * H), *dgg = lkt_alloc(E * H);
    lk_moe_router_ref_scores(x, wg, NULL, T, H, E, LK_MOE_SOFTMAX, z, v, sel);

    assert_int_equal(lk_moe_router_forward(impl_cuda(), &r.a, &r.ctx), LK_OK);
    int32_t *ids = (int32_t *)lkt_alloc(T * K);
    float *w = (float *)lkt_alloc(T * K), aux = NAN;
    down(ids, r.a.topk_ids.data, (size_t)(T * K) * 4), down(w, r.a.topk_weights.data, (size_t)(T * K) * 4);
    down(&aux, r.a.aux_loss.data, 4);
    for (int64_t i = 0; i < T * K; i++) wgot[i] = w[i];
    double tol = lk_moe_router_tol(impl_cuda(), dt), gap = lk_moe_router_ref_choice_gap(&r.a, sel, ids, T, E), auxr = 0;
    int64_t held = ranked_exactly(z, ids, T, E, c->k, bf16_logits);
    lk_moe_router_ref_forward(&r.a, v, ids, T, E, LK_MOE_SOFTMAX, wr, &auxr);
    double ew = lkt_rel_err(wgot, wr, T * K), ea = isfinite(aux) ? fabs(aux - auxr) / fabs(auxr) : INFINITY;
    repeats(&r, ids, w, aux);

    assert_int_equal(lk_moe_router_backward(impl_cuda(), &r.a, &r.ctx), LK_OK);
    lk_moe_router_ref_backward(&r.a, x, wg, v, ids, dw, c->d_aux, T, H, E, LK_MOE_SOFTMAX, dxr, dgw);   /* dgw += */
    lkt_download(r.a.d_hidden.data, T * H, dt, dxg);
    lkt_download(r.a.d_gate_weight.data, E * H, r.a.d_gate_weight.dtype, dgg);
    double edx = lkt_rel_err(dxg, dxr, T * H), edg = lkt_rel_err(dgg, dgw, E * H);
    if (amax(dxr, T * H) < 1e-12) {
        /* a gradient that is zero in exact math (k 1 after top-k: every weight is 1, and no
         * aux term): the GPU's f32 residue measured against the scale of what it multiplies */
        double scale = amax(dw, T * K) * amax(wg, E * H);
        edx = amax(dxg, T * H) / (scale > 0 ? scale : 1);
    }
    print_message("  %s%s T %lld H %lld E %lld k %d%s scale %g d_aux %g%s: gap %.1e, %lld/%lld ranked exactly, "
                  "w %.1e aux %.1e dx %.1e dgw(%s) %.1e (tol %.0e)\n",
                  lk_dtype_name(dt), c->gw32 && dt == LK_BF16 ? "/f32 gate" : "", (long long)T, (long long)H,
                  (long long)E, c->k, c->norm ? " norm" : c->after ? " after" : "", (double)c->scale,
                  (double)c->d_aux, bf16_logits ? "" : " f32 logits", gap, (long long)held, (long long)T, ew, ea,
                  edx, lk_dtype_name(r.a.d_gate_weight.dtype), edg, tol);
    assert_true(gap <= tol);
    /* unrounded logits: the exact-ranking check held at least half the tokens (rounded
     * to bf16, a near-tie among the k + 1 best is common, so it may hold few) */
    assert_true(bf16_logits || held * 2 >= T);
    assert_true(ew <= tol && ea <= tol && edx <= tol && edg <= tol);
    lk_arena_free(&r.arena);
    lkt_free_all();
}

static void against_reference(void **state) {
    (void)state;
    const rcase cases[] = {
        /* t    h    e   k  norm after scale d_aux gw32 gate_f32 grad_f32 */
        {1, 5, 4, 1, 0, 0, 1.0f, 0.37f, 0, 0, 0},       /* one token, H = 5 */
        {7, 64, 8, 2, 1, 0, 2.5f, 0.37f, 0, 0, 1},
        {333, 129, 60, 8, 1, 0, 1.0f, 0.37f, 0, 0, 0},  /* Qwen3-MoE-like: normalized top-8 */
        {333, 64, 128, 8, 0, 0, 0.0f, 0.37f, 1, 0, 1},  /* route_scale 0 = 1; an f32 gate over bf16 hidden */
        {7, 129, 128, 1, 0, 1, 1.5f, 0.0f, 0, 0, 0},    /* softmax_after_topk, no aux gradient */
        {1, 64, 8, 8, 1, 0, 1.0f, 0.37f, 0, 1, 0},      /* k = E; gate_f32 */
        {333, 5, 4, 2, 1, 0, 0.5f, 1.0f, 1, 1, 1},      /* gate_f32 with an f32 gate */
        {64, 64, 200, 8, 1, 0, 1.0f, 0.37f, 0, 0, 0},
        {33, 64, 512, 8, 1, 0, 1.0f, 0.37f, 0, 0, 1},   /* the largest row kept in registers */
        {33, 64, 600, 9, 1, 0, 1.0f, 0.37f, 0, 0, 0},   /* longer rows: read back from the saved scores */
        {7, 16, 60, 60, 0, 0, 1.0f, 0.37f, 0, 0, 0},    /* k = E > 32: picks beyond one lane each */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 17u + (uint32_t)i);
}

/* Equal scores go to the lower index. Rows e and e + 4 of the gate are the same, so each
 * logit comes twice and the GPU must list the pair lower index first; an all-zero gate
 * ties everything: experts 0, 1, ... with weight 1/E. */
static void ties_to_lower_index(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++) {
        lk_dtype dt = d ? LK_BF16 : LK_F32;
        const rcase c = {3, 16, 8, 8, 0, 0, 1.0f, 0.0f, 0, 1, 0};   /* gate_f32: bf16 rounding makes ties of its own */
        uint32_t seed = 5;
        double x[3 * 16], wg[8 * 16], dgw[8 * 16] = {0}, dw[3 * 8] = {0}, z[3 * 8], v[3 * 8], sel[3 * 8];
        lkt_randn(x, 3 * 16, &seed, 1.0), lkt_randn(wg, 4 * 16, &seed, 0.5);
        memcpy(wg + 4 * 16, wg, sizeof(double) * 4 * 16);
        rrun r;
        setup(&r, dt, &c, x, wg, dgw, dw);
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

        const rcase c0 = {5, 16, 8, 3, 0, 0, 1.0f, 0.0f, 0, 0, 0};
        double wz[8 * 16] = {0}, x5[5 * 16];
        lkt_randn(x5, 5 * 16, &seed, 1.0);
        setup(&r, dt, &c0, x5, wz, dgw, dw);
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
static void expect_refused(rrun *r, int backward, lk_status code, const char *want) {
    lk_status s = backward ? lk_moe_router_backward(impl_cuda(), &r->a, &r->ctx)
                           : lk_moe_router_forward(impl_cuda(), &r->a, &r->ctx);
    print_message("  refused (%d): %s\n", (int)s, lk_last_error());
    assert_int_equal(s, code);
    assert_non_null(strstr(lk_last_error(), want));
    assert_true(all_ff(r->a.topk_ids.data, lk_tensor_numel(&r->a.topk_ids) * 4));
    assert_true(all_ff(r->a.topk_weights.data, lk_tensor_numel(&r->a.topk_weights) * 4));
    assert_true(all_ff(r->a.aux_loss.data, 4));
    assert_true(all_ff(r->a.saved.data, r->a.saved.bytes));
    assert_true(all_ff(r->a.d_hidden.data, lk_tensor_numel(&r->a.d_hidden) * lk_dtype_size(r->a.d_hidden.dtype)));
}

static void bad_input_refused(void **state) {
    (void)state;
    const rcase c = {6, 16, 4, 2, 1, 0, 1.0f, 0.37f, 0, 0, 1};
    uint32_t seed = 9;
    double x[6 * 16], wg[4 * 16], dgw[4 * 16], dw[6 * 2];
    lkt_randn(x, 6 * 16, &seed, 1.0), lkt_randn(wg, 4 * 16, &seed, 0.5);
    lkt_randn(dgw, 4 * 16, &seed, 0.5), lkt_randn(dw, 6 * 2, &seed, 1.0);
    rrun r;
    setup(&r, LK_F32, &c, x, wg, dgw, dw);

    r.a.top_k = 5;   /* k > E = 4 */
    expect_refused(&r, 0, LK_EINVAL, "top_k");
    r.a.top_k = 2;
    r.a.hidden.dtype = LK_I32;
    expect_refused(&r, 0, LK_EDTYPE, "hidden");
    r.a.hidden.dtype = LK_F32;
    r.a.d_topk_weights.dtype = LK_BF16;
    expect_refused(&r, 1, LK_EDTYPE, "d_topk_weights");
    r.a.d_topk_weights.dtype = LK_F32;

    /* a sequence-parallel group (even one of a single rank) is refused, forward and
     * backward, and d_gate_weight keeps its values */
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

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_router")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_reference),
        cmocka_unit_test(ties_to_lower_index),
        cmocka_unit_test(bad_input_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
