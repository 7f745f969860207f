/* test_moe.c — the MoE router and experts on the CPU: every implementation x {f32, bf16}
 * against the float64 reference; fused against eager on outputs and every gradient over
 * E in {1, 8, 64}, k in {1, 2, 8}, 1 to 4097 tokens, with experts that get no token and
 * tokens routed twice to one expert; finite differences; the fake gate's exact balance,
 * determinism and input dependence (and its load at several noises); sigmoid_bias's
 * selection-only bias; the weight layouts; the build-time binding; bad inputs.
 * Run: ./build/test_moe */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/moe/check.h"

static const lk_impl *experts(const char *n) { return lk_impl_find(LK_OP_MOE_EXPERTS, n, LK_DEVICE_CPU); }
static const lk_impl *router(const char *n) { return lk_impl_find(LK_OP_MOE_ROUTER, n, LK_DEVICE_CPU); }

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK && experts("eager") && experts("fused") && router("softmax_topk") &&
                   router("sigmoid_bias") && router("fake_balanced") ? 0 : -1;
}

/* f32: ~1e-6 measured; 2e-5. bf16: fused rounds gate_up once (~5e-3), eager rounds every
 * intermediate (~1e-2): 1.5e-2 and 3e-2. */
static void expect_experts_ref(const char *name, lk_moe_experts_problem p) {
    lk_moe_experts_result got, want;
    lk_moe_experts_errors e;
    assert_int_equal(lk_moe_experts_run(experts(name), &p, &got), LK_OK);
    assert_int_equal(lk_moe_experts_run_ref(&p, &want), LK_OK);
    double worst = lk_moe_experts_diff(&got, &want, &p, &e);
    double tol = p.dt == LK_F32 ? 2e-5 : strcmp(name, "eager") == 0 ? 3e-2 : 1.5e-2;
    if (!(worst <= tol))
        print_error("%s %s T%lld H%lld I%lld E%lld k%lld: out %.2g dx %.2g dw %.2g dgu %.2g dd %.2g\n", name,
                    lk_dtype_name(p.dt), (long long)p.t, (long long)p.h, (long long)p.i, (long long)p.e,
                    (long long)p.k, e.out, e.dx, e.dw, e.dgu, e.dd);
    assert_true(worst <= tol);
    lk_moe_experts_result_free(&got);
    lk_moe_experts_result_free(&want);
}

static void test_experts_reference(void **state) {
    (void)state;
    static const int64_t shapes[][5] = {{1, 8, 4, 1, 1}, {13, 19, 11, 8, 2}, {37, 16, 8, 8, 8}, {5, 7, 3, 64, 8},
                                        {50, 24, 16, 7, 3}};
    const char *names[] = {"eager", "fused"};
    for (int n = 0; n < 2; n++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++)
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                for (int dup = 0; dup < 2; dup++)
                    expect_experts_ref(names[n], (lk_moe_experts_problem){
                        .t = shapes[s][0], .h = shapes[s][1], .i = shapes[s][2], .e = shapes[s][3], .k = shapes[s][4],
                        .dt = (lk_dtype)dt, .seed = 100 + s, .dup_routes = dup, .grad_f32 = (int)s & 1});
}

/* base's options on both rows, f32 and bf16, each of n shapes (T, H, I, E, k), routes with
 * repeats (the upper half of the experts without a token), gradients in f32 every other shape. */
static void expect_each_shape(const int64_t (*shapes)[5], size_t n, lk_moe_experts_problem base, uint64_t seed) {
    const char *names[] = {"eager", "fused"};
    for (int k = 0; k < 2; k++)
        for (int dt = LK_F32; dt <= LK_BF16; dt++)
            for (size_t s = 0; s < n; s++) {
                lk_moe_experts_problem p = base;
                p.t = shapes[s][0], p.h = shapes[s][1], p.i = shapes[s][2], p.e = shapes[s][3], p.k = shapes[s][4];
                p.dt = (lk_dtype)dt, p.seed = seed + s, p.dup_routes = 1, p.grad_f32 = (int)s & 1;
                expect_experts_ref(names[k], p);
            }
}

static const int64_t few_shapes[][5] = {{13, 19, 11, 8, 2}, {37, 16, 8, 8, 8}, {5, 7, 3, 64, 8}, {0, 8, 4, 4, 2}};

/* write_weight_grads: the weight gradients start poisoned (NaN) and must come out as the
 * reference's from zeros: every expert's slice written, zeros for the experts without a
 * token, and T = 0 (all zeros). */
static void test_experts_write_grads(void **state) {
    (void)state;
    expect_each_shape(few_shapes, 4, (lk_moe_experts_problem){.write_grads = 1}, 300);
}

/* A forward with out.data NULL (a recompute's) writes the whole saved block: the backward
 * reads it (poisoned before) and matches the reference; out comes from a second forward. */
static void test_experts_saved_alone(void **state) {
    (void)state;
    expect_each_shape(few_shapes, 3, (lk_moe_experts_problem){.saved_alone = 1}, 400);
}

/* fused == eager in f32 within 1e-5 of max|eager| on every output and gradient. */
static void test_fused_equals_eager(void **state) {
    (void)state;
    static const int64_t es[] = {1, 8, 64}, ks[] = {1, 2, 8}, ts[] = {1, 7, 300, 4097};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) {
                if (ks[b] > es[a]) continue;
                int big = ts[c] > 1000;
                lk_moe_experts_problem p = {.t = ts[c], .h = big ? 8 : 16, .i = big ? 4 : 12, .e = es[a], .k = ks[b],
                                            .dt = LK_F32, .seed = 7 + a * 16 + b * 4 + c, .dup_routes = (c & 1) != 0};
                lk_moe_experts_result x, y;
                lk_moe_experts_errors e;
                assert_int_equal(lk_moe_experts_run(experts("fused"), &p, &x), LK_OK);
                assert_int_equal(lk_moe_experts_run(experts("eager"), &p, &y), LK_OK);
                double worst = lk_moe_experts_diff(&x, &y, &p, &e);
                if (!(worst <= 1e-5))
                    print_error("E%lld k%lld T%lld: out %.2g dx %.2g dw %.2g dgu %.2g dd %.2g\n", (long long)p.e,
                                (long long)p.k, (long long)p.t, e.out, e.dx, e.dw, e.dgu, e.dd);
                assert_true(worst <= 1e-5);
                lk_moe_experts_result_free(&x);
                lk_moe_experts_result_free(&y);
            }
}

/* One experts problem held in f64 for finite differences. */
typedef struct {
    int64_t t, h, i, e, k;
    float *x, *w, *wgu, *wd, *dout;
    int32_t *ids;
} fd_problem;

static double loss_of(const lk_impl *impl, fd_problem *p) {
    int64_t gus[3] = {p->e, 2 * p->i, p->h}, dws[3] = {p->e, p->h, p->i};
    size_t sb;
    lk_moe_experts_saved_bytes(impl, p->t, p->k, p->e, p->h, p->i, LK_F32, &sb);
    float *out = malloc(sizeof(float) * (size_t)(p->t * p->h));
    void *saved = malloc(sb);
    lk_arena ar = {0};
    lk_ctx ctx = lk_ctx_cpu(&ar);
    lk_moe_experts_args a = {
        .hidden = lk_tensor_2d(p->x, LK_F32, p->t, p->h), .topk_ids = lk_tensor_2d(p->ids, LK_I32, p->t, p->k),
        .topk_weights = lk_tensor_2d(p->w, LK_F32, p->t, p->k), .gate_up_weight = lk_tensor_view(p->wgu, LK_F32, 3, gus),
        .down_weight = lk_tensor_view(p->wd, LK_F32, 3, dws), .out = lk_tensor_2d(out, LK_F32, p->t, p->h),
        .saved = {saved, sb}};
    assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
    double l = 0;
    for (int64_t n = 0; n < p->t * p->h; n++) l += (double)out[n] * p->dout[n];
    free(out); free(saved);
    lk_arena_free(&ar);
    return l;
}

static void test_experts_finite_differences(void **state) {
    (void)state;
    for (int n = 0; n < 2; n++) {
        const lk_impl *impl = experts(n ? "fused" : "eager");
        fd_problem p = {.t = 5, .h = 6, .i = 4, .e = 3, .k = 2};
        lk_rng rng = lk_rng_make(77);
        p.x = lk_random_tensor(&rng, LK_F32, p.t * p.h, 1.0f, NULL);
        p.w = lk_random_tensor(&rng, LK_F32, p.t * p.k, 1.0f, NULL);
        p.wgu = lk_random_tensor(&rng, LK_F32, p.e * 2 * p.i * p.h, 0.5f, NULL);
        p.wd = lk_random_tensor(&rng, LK_F32, p.e * p.h * p.i, 0.5f, NULL);
        p.dout = lk_random_tensor(&rng, LK_F32, p.t * p.h, 1.0f, NULL);
        int32_t ids[10] = {0, 0, 1, 2, 2, 2, 0, 1, 0, 2};   /* token 0 and 2 twice to one expert */
        p.ids = ids;
        int64_t gus[3] = {p.e, 2 * p.i, p.h}, dws[3] = {p.e, p.h, p.i};
        size_t sb;
        lk_moe_experts_saved_bytes(impl, p.t, p.k, p.e, p.h, p.i, LK_F32, &sb);
        float *out = malloc(4 * (size_t)(p.t * p.h)), *dx = malloc(4 * (size_t)(p.t * p.h)), *dw = malloc(4 * 10);
        float *dgu = calloc((size_t)(p.e * 2 * p.i * p.h), 4), *dd = calloc((size_t)(p.e * p.h * p.i), 4);
        void *saved = malloc(sb);
        lk_arena ar = {0};
        lk_ctx ctx = lk_ctx_cpu(&ar);
        lk_moe_experts_args a = {
            .hidden = lk_tensor_2d(p.x, LK_F32, p.t, p.h), .topk_ids = lk_tensor_2d(ids, LK_I32, p.t, p.k),
            .topk_weights = lk_tensor_2d(p.w, LK_F32, p.t, p.k), .gate_up_weight = lk_tensor_view(p.wgu, LK_F32, 3, gus),
            .down_weight = lk_tensor_view(p.wd, LK_F32, 3, dws), .out = lk_tensor_2d(out, LK_F32, p.t, p.h),
            .dout = lk_tensor_2d(p.dout, LK_F32, p.t, p.h), .d_hidden = lk_tensor_2d(dx, LK_F32, p.t, p.h),
            .d_topk_weights = lk_tensor_2d(dw, LK_F32, p.t, p.k), .d_gate_up_weight = lk_tensor_view(dgu, LK_F32, 3, gus),
            .d_down_weight = lk_tensor_view(dd, LK_F32, 3, dws), .saved = {saved, sb}};
        assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
        assert_int_equal(lk_moe_experts_backward(impl, &a, &ctx), LK_OK);
        struct { float *v, *g; int64_t n; } params[] = {
            {p.x, dx, p.t * p.h}, {p.w, dw, p.t * p.k}, {p.wgu, dgu, p.e * 2 * p.i * p.h}, {p.wd, dd, p.e * p.h * p.i}};
        for (int q = 0; q < 4; q++)
            for (int64_t j = 0; j < params[q].n; j += 3) {
                float keep = params[q].v[j], hstep = 1e-2f;
                params[q].v[j] = keep + hstep;
                double lp = loss_of(impl, &p);
                params[q].v[j] = keep - hstep;
                double lm = loss_of(impl, &p);
                params[q].v[j] = keep;
                double fd = (lp - lm) / (2 * hstep);
                /* f32 forward, central difference with h = 1e-2: ~1e-3 absolute */
                if (!(fabs(fd - params[q].g[j]) <= 2e-3 + 2e-3 * fabs(fd)))
                    print_error("param %d [%lld]: fd %.6f got %.6f\n", q, (long long)j, fd, params[q].g[j]);
                assert_true(fabs(fd - params[q].g[j]) <= 2e-3 + 2e-3 * fabs(fd));
            }
        free(out); free(dx); free(dw); free(dgu); free(dd); free(saved);
        free(p.x); free(p.w); free(p.wgu); free(p.wd); free(p.dout);
        lk_arena_free(&ar);
    }
}

/* --- routers ---------------------------------------------------------------------- */

static void expect_router(const char *name, lk_moe_router_problem p) {
    lk_moe_router_errors e;
    assert_int_equal(lk_moe_router_check_case(router(name), &p, &e), LK_OK);
    double tol = p.dt == LK_F32 ? 2e-5 : 2e-2;   /* f32 ~1e-6; bf16 logits rounded to 2^-9 */
    if (!(e.weights <= tol && e.aux <= tol && e.dx <= tol && e.dwg <= tol && e.choice_gap <= tol))
        print_error("%s %s T%lld E%lld k%d: w %.2g aux %.2g dx %.2g dwg %.2g gap %.2g\n", name, lk_dtype_name(p.dt),
                    (long long)p.t, (long long)p.e, p.opts.top_k, e.weights, e.aux, e.dx, e.dwg, e.choice_gap);
    assert_true(e.weights <= tol);
    assert_true(e.aux <= tol);
    assert_true(e.dx <= tol);
    assert_true(e.dwg <= tol);
    assert_true(e.choice_gap <= tol);
}

static void test_routers_reference(void **state) {
    (void)state;
    static const int64_t shapes[][4] = {{1, 8, 4, 1}, {13, 19, 8, 2}, {37, 16, 64, 8}, {9, 5, 12, 3}};
    for (int dt = LK_F32; dt <= LK_BF16; dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            lk_moe_router_problem p = {.t = shapes[s][0], .h = shapes[s][1], .e = shapes[s][2], .dt = (lk_dtype)dt,
                                       .seed = 300 + s, .opts = {.top_k = (int)shapes[s][3], .d_aux_loss = 0.05f}};
            expect_router("softmax_topk", p);
            p.opts.norm_topk_prob = 1;
            expect_router("softmax_topk", p);
            p.opts.norm_topk_prob = 0;
            p.opts.softmax_after_topk = 1;
            p.gate_f32 = 1;
            p.opts.gate_f32 = 1;
            expect_router("softmax_topk", p);
            p.opts.softmax_after_topk = 0;
            p.with_bias = 1;
            p.opts.route_scale = 2.5f;
            expect_router("sigmoid_bias", p);
            p.opts.norm_topk_prob = 1;
            if (p.e % 4 == 0 && p.opts.top_k <= p.e / 2) p.opts.n_group = 4, p.opts.topk_group = 2;
            expect_router("sigmoid_bias", p);
        }
}

/* Runs a router forward on hidden [T, H] (f32) and returns ids and weights. */
static lk_status route(const char *name, lk_moe_router_args opts, const float *x, int64_t t, int64_t h, float *wg,
                       int64_t e, float *bias, int32_t *ids, float *w) {
    lk_arena ar = {0};
    lk_ctx ctx = lk_ctx_cpu(&ar);
    size_t sb;
    lk_status s = lk_moe_router_saved_bytes(router(name), t, e, opts.top_k, &sb);
    void *saved = malloc(sb + 1);
    lk_moe_router_args a = opts;
    a.hidden = lk_tensor_2d((void *)x, LK_F32, t, h);
    a.gate_weight = lk_tensor_2d(wg, LK_F32, e, h);
    a.e_bias = lk_tensor_1d(bias, LK_F32, e);
    a.n_experts = (int)e;
    a.topk_ids = lk_tensor_2d(ids, LK_I32, t, opts.top_k);
    a.topk_weights = lk_tensor_2d(w, LK_F32, t, opts.top_k);
    a.saved = (lk_saved){saved, sb};
    if (!s) s = lk_moe_router_forward(router(name), &a, &ctx);
    free(saved);
    lk_arena_free(&ar);
    return s;
}

static void loads(const int32_t *ids, int64_t n, int64_t e, double *max_over_mean) {
    int64_t c[1024] = {0}, mx = 0;
    for (int64_t r = 0; r < n; r++) c[ids[r]]++;
    for (int64_t x = 0; x < e; x++) mx = c[x] > mx ? c[x] : mx;
    *max_over_mean = (double)mx / ((double)n / (double)e);
}

static void test_fake_gate(void **state) {
    (void)state;
    enum { T = 4096, H = 16, E = 64, K = 8 };
    lk_rng rng = lk_rng_make(5);
    float *x = lk_random_tensor(&rng, LK_F32, T * H, 1.0f, NULL), *x2 = malloc(sizeof(float) * T * H);
    float *w = malloc(sizeof(float) * T * K), *w2 = malloc(sizeof(float) * T * K);
    int32_t *ids = malloc(sizeof(int32_t) * T * K), *ids2 = malloc(sizeof(int32_t) * T * K);
    static const float noises[] = {0.0f, 0.1f, 0.3f, 0.5f, 1.0f};
    for (int n = 0; n < 5; n++) {
        lk_moe_router_args o = {.top_k = K, .noise = noises[n]};
        assert_int_equal(route("fake_balanced", o, x, T, H, NULL, E, NULL, ids, w), LK_OK);
        double mm;
        loads(ids, T * K, E, &mm);
        double mean = (double)T * K / E, sum_w = 0;
        for (int j = 0; j < K; j++) sum_w += w[j];
        printf("fake_balanced E=%d k=%d T=%d noise %.1f: max/mean expert load %.3f (max %.0f, mean %.0f)\n", E, K, T,
               (double)noises[n], mm, mm * mean, mean);
        assert_true(fabs(sum_w - 1.0) < 1e-5);
        if (noises[n] == 0.0f) {              /* exact balance and the formula */
            assert_true(mm == 1.0);
            for (int64_t r = 0; r < T * K; r++) {
                assert_int_equal(ids[r], (int32_t)(r % E));
                assert_true(w[r] == 1.0f / K);
            }
            continue;
        }
        assert_true(mm > 1.0);
        /* a recompute sees the same routing ... */
        memcpy(x2, x, sizeof(float) * T * H);
        assert_int_equal(route("fake_balanced", o, x2, T, H, NULL, E, NULL, ids2, w2), LK_OK);
        assert_memory_equal(ids, ids2, sizeof(int32_t) * T * K);
        assert_memory_equal(w, w2, sizeof(float) * T * K);
        /* ... and another input another one */
        x2[T * H - 1] += 1.0f;
        assert_int_equal(route("fake_balanced", o, x2, T, H, NULL, E, NULL, ids2, w2), LK_OK);
        assert_true(memcmp(ids, ids2, sizeof(int32_t) * T * K) != 0);
    }
    free(x); free(x2); free(w); free(w2); free(ids); free(ids2);
}

/* The correction bias moves the choice but the weights stay the unbiased scores. */
static void test_sigmoid_bias_selects_only(void **state) {
    (void)state;
    enum { T = 8, H = 6, E = 8, K = 2 };
    lk_rng rng = lk_rng_make(9);
    float *x = lk_random_tensor(&rng, LK_F32, T * H, 1.0f, NULL), *wg = lk_random_tensor(&rng, LK_F32, E * H, 0.5f, NULL);
    float bias[E] = {0}, w0[T * K], w1[T * K];
    int32_t i0[T * K], i1[T * K];
    lk_moe_router_args o = {.top_k = K};
    assert_int_equal(route("sigmoid_bias", o, x, T, H, wg, E, NULL, i0, w0), LK_OK);
    bias[E - 1] = 10.0f;                    /* expert E-1 now always wins */
    assert_int_equal(route("sigmoid_bias", o, x, T, H, wg, E, bias, i1, w1), LK_OK);
    for (int t = 0; t < T; t++) {
        assert_int_equal(i1[t * K], E - 1);
        double z = 0;
        for (int c = 0; c < H; c++) z += (double)x[t * H + c] * wg[(E - 1) * H + c];
        assert_true(fabs(w1[t * K] - 1.0 / (1.0 + exp(-z))) < 1e-6);   /* sigmoid(z), not + 10 */
        assert_int_equal(i1[t * K + 1], i0[t * K] == E - 1 ? i0[t * K + 1] : i0[t * K]);
    }
    free(x); free(wg);
}

static void test_layouts(void **state) {
    (void)state;
    enum { E = 3, I = 4, H = 5 };
    float g[E][I * H], u[E][I * H], d[E][H * I], gu[E * 2 * I * H], dn[E * H * I];
    float g2[E][I * H], u2[E][I * H], d2[E][H * I];
    lk_tensor tg[E], tu[E], td[E], tg2[E], tu2[E], td2[E];
    for (int e = 0; e < E; e++) {
        for (int n = 0; n < I * H; n++) g[e][n] = 100 * e + n, u[e][n] = -100 * e - n, d[e][n] = 1000 + 7 * e + n;
        tg[e] = lk_tensor_2d(g[e], LK_F32, I, H), tu[e] = lk_tensor_2d(u[e], LK_F32, I, H);
        td[e] = lk_tensor_2d(d[e], LK_F32, H, I);
        tg2[e] = lk_tensor_2d(g2[e], LK_F32, I, H), tu2[e] = lk_tensor_2d(u2[e], LK_F32, I, H);
        td2[e] = lk_tensor_2d(d2[e], LK_F32, H, I);
    }
    int64_t gus[3] = {E, 2 * I, H}, dns[3] = {E, H, I};
    lk_tensor tgu = lk_tensor_view(gu, LK_F32, 3, gus), tdn = lk_tensor_view(dn, LK_F32, 3, dns);
    assert_int_equal(lk_moe_stack_weights(E, tg, tu, td, &tgu, &tdn), LK_OK);
    assert_true(gu[1 * 2 * I * H + 0] == g[1][0] && gu[1 * 2 * I * H + I * H] == u[1][0] && dn[2 * H * I + 3] == d[2][3]);
    assert_int_equal(lk_moe_unstack_weights(E, &tgu, &tdn, tg2, tu2, td2), LK_OK);
    assert_memory_equal(g, g2, sizeof g);
    assert_memory_equal(u, u2, sizeof u);
    assert_memory_equal(d, d2, sizeof d);
    tu[1] = lk_tensor_2d(u[1], LK_F32, I, H + 1);            /* a mismatched expert: nothing written */
    memset(gu, 0, sizeof gu);
    assert_int_equal(lk_moe_stack_weights(E, tg, tu, td, &tgu, &tdn), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "up[1]"));
    for (size_t n = 0; n < sizeof gu / sizeof *gu; n++) assert_true(gu[n] == 0.0f);
}

/* Stage 4 binds moe_experts; CUDA-only names are an error on a CPU model: "runs on cuda"
 * where the build has the row (fused_sm90, built with CUDA), else what it needs. */
static void test_binding(void **state) {
    (void)state;
    lk_request r = {.op = LK_OP_MOE_EXPERTS, .name = "fused_sm90", .device = LK_DEVICE_CPU, .source = LK_SOURCE_CONFIG};
    lk_binding b;
    if (!lk_impl_find(LK_OP_MOE_EXPERTS, "fused_sm90", LK_DEVICE_CPU)) {
        assert_int_equal(lk_select(&r, LK_STAGE_MODEL_BUILD, &b), LK_EUNAVAILABLE);
        assert_non_null(strstr(lk_last_error(), "fused_sm90"));
        if (lk_impl_find(LK_OP_MOE_EXPERTS, "fused_sm90", LK_DEVICE_CUDA)) {
            assert_non_null(strstr(lk_last_error(), "runs on cuda"));
        } else {
            assert_true(strstr(lk_last_error(), "not available in this build") ||
                        strstr(lk_last_error(), "compute capability"));
            assert_true(strstr(lk_last_error(), "Hopper") || strstr(lk_last_error(), "compute capability"));
        }
    }
    r.name = "fused_triton";                 /* an alias of fused */
    assert_int_equal(lk_select(&r, LK_STAGE_MODEL_BUILD, &b), LK_OK);
    assert_string_equal(b.impl->name, "fused");
}

/* --- bad inputs ------------------------------------------------------------------- */

static void test_bad_inputs(void **state) {
    (void)state;
    enum { T = 4, H = 6, I = 3, E = 4, K = 2 };
    float x[T * H] = {0}, w[T * K] = {0}, wgu[E * 2 * I * H] = {0}, wd[E * H * I] = {0}, out[T * H], wg[E * H] = {0};
    float rw[T * K];
    int32_t ids[T * K] = {0, 1, 2, 3, 0, 1, 2, 3}, rid[T * K];
    int64_t gus[3] = {E, 2 * I, H}, dws[3] = {E, H, I};
    size_t sb;
    assert_int_equal(lk_moe_experts_saved_bytes(experts("fused"), T, K, E, H, I, LK_F32, &sb), LK_OK);
    void *saved = malloc(sb);
    lk_arena ar = {0};
    lk_ctx ctx = lk_ctx_cpu(&ar);
    lk_moe_experts_args good = {
        .hidden = lk_tensor_2d(x, LK_F32, T, H), .topk_ids = lk_tensor_2d(ids, LK_I32, T, K),
        .topk_weights = lk_tensor_2d(w, LK_F32, T, K), .gate_up_weight = lk_tensor_view(wgu, LK_F32, 3, gus),
        .down_weight = lk_tensor_view(wd, LK_F32, 3, dws), .out = lk_tensor_2d(out, LK_F32, T, H), .saved = {saved, sb}};
    struct { const char *arg; lk_status want; lk_moe_experts_args a; } cases[8];
    int n = 0;
    cases[n] = (typeof(cases[0])){"down_weight", LK_ESHAPE, good};
    cases[n++].a.down_weight.shape[2] = I + 1;
    cases[n] = (typeof(cases[0])){"gate_up_weight", LK_ESHAPE, good};
    cases[n++].a.gate_up_weight.shape[2] = H - 1;
    cases[n] = (typeof(cases[0])){"gate_up_weight", LK_EDTYPE, good};
    cases[n++].a.gate_up_weight.dtype = LK_BF16;
    cases[n] = (typeof(cases[0])){"hidden", LK_EINVAL, good};
    cases[n++].a.hidden.data = NULL;
    cases[n] = (typeof(cases[0])){"topk_weights", LK_EDTYPE, good};
    cases[n++].a.topk_weights.dtype = LK_BF16;
    cases[n] = (typeof(cases[0])){"saved", LK_EINVAL, good};
    cases[n++].a.saved.bytes = sb - 1;
    cases[n] = (typeof(cases[0])){"topk_ids", LK_ESHAPE, good};    /* k > E */
    cases[n].a.topk_ids = lk_tensor_2d(ids, LK_I32, 1, 8);
    cases[n++].a.hidden = lk_tensor_2d(x, LK_F32, 1, H);
    for (int c = 0; c < n; c++) {
        for (int j = 0; j < T * H; j++) out[j] = 42.0f;
        assert_int_equal(lk_moe_experts_forward(experts("fused"), &cases[c].a, &ctx), cases[c].want);
        if (!strstr(lk_last_error(), cases[c].arg)) print_error("case %d: %s\n", c, lk_last_error());
        assert_non_null(strstr(lk_last_error(), cases[c].arg));
        for (int j = 0; j < T * H; j++) assert_true(out[j] == 42.0f);
    }
    float dgu[E * 2 * I * H], dd[E * H * I], dx[T * H];   /* write_weight_grads neither 0 nor 1 */
    lk_moe_experts_args wb = good;
    wb.dout = lk_tensor_2d(x, LK_F32, T, H), wb.d_hidden = lk_tensor_2d(dx, LK_F32, T, H);
    wb.d_gate_up_weight = lk_tensor_view(dgu, LK_F32, 3, gus), wb.d_down_weight = lk_tensor_view(dd, LK_F32, 3, dws);
    wb.write_weight_grads = 2;
    for (int j = 0; j < E * H * I; j++) dd[j] = 42.0f;
    assert_int_equal(lk_moe_experts_backward(experts("fused"), &wb, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "write_weight_grads"));
    for (int j = 0; j < E * H * I; j++) assert_true(dd[j] == 42.0f);
    ids[5] = E;                              /* an expert id out of range */
    assert_int_equal(lk_moe_experts_forward(experts("eager"), &good, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "topk_ids"));
    for (int j = 0; j < T * H; j++) assert_true(out[j] == 42.0f);
    ids[5] = 1;
    assert_int_equal(lk_moe_experts_forward(router("softmax_topk") ? router("softmax_topk") : NULL, &good, &ctx),
                     LK_EINVAL);             /* wrong op */
    assert_non_null(strstr(lk_last_error(), "impl"));

    /* router: k > E, negative noise, wrong gate shape, bad groups; outputs untouched */
    lk_moe_router_args ra = {.hidden = lk_tensor_2d(x, LK_F32, T, H), .gate_weight = lk_tensor_2d(wg, LK_F32, E, H),
                             .topk_ids = lk_tensor_2d(rid, LK_I32, T, K), .topk_weights = lk_tensor_2d(rw, LK_F32, T, K),
                             .top_k = K, .n_experts = E};
    size_t rsb;
    assert_int_equal(lk_moe_router_saved_bytes(router("softmax_topk"), T, E, K, &rsb), LK_OK);
    void *rsaved = malloc(rsb);
    ra.saved = (lk_saved){rsaved, rsb};
    struct { const char *impl, *arg; lk_status want; lk_moe_router_args a; } rc[5];
    int m = 0;
    rc[m] = (typeof(rc[0])){"softmax_topk", "top_k", LK_EINVAL, ra};
    rc[m].a.top_k = E + 1;
    rc[m++].a.topk_ids.shape[1] = E + 1;
    rc[m] = (typeof(rc[0])){"fake_balanced", "noise", LK_EINVAL, ra};
    rc[m++].a.noise = -0.1f;
    rc[m] = (typeof(rc[0])){"softmax_topk", "gate_weight", LK_ESHAPE, ra};
    rc[m].a.gate_weight.shape[1] = H + 1;
    rc[m++].a.n_experts = 0;
    rc[m] = (typeof(rc[0])){"sigmoid_bias", "n_group", LK_EINVAL, ra};
    rc[m].a.n_group = 3;
    rc[m++].a.topk_group = 1;
    rc[m] = (typeof(rc[0])){"softmax_topk", "topk_weights", LK_ESHAPE, ra};
    rc[m++].a.topk_weights.shape[0] = T + 1;
    for (int c = 0; c < m; c++) {
        memset(rid, 0x7f, sizeof rid);
        assert_int_equal(lk_moe_router_forward(router(rc[c].impl), &rc[c].a, &ctx), rc[c].want);
        if (!strstr(lk_last_error(), rc[c].arg)) print_error("router case %d: %s\n", c, lk_last_error());
        assert_non_null(strstr(lk_last_error(), rc[c].arg));
        for (int j = 0; j < T * K; j++) assert_int_equal(rid[j], 0x7f7f7f7f);
    }
    free(saved);
    free(rsaved);
    lk_arena_free(&ar);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_reference),
        cmocka_unit_test(test_fused_equals_eager),
        cmocka_unit_test(test_experts_write_grads),
        cmocka_unit_test(test_experts_saved_alone),
        cmocka_unit_test(test_experts_finite_differences),
        cmocka_unit_test(test_routers_reference),
        cmocka_unit_test(test_fake_gate),
        cmocka_unit_test(test_sigmoid_bias_selects_only),
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_binding),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
