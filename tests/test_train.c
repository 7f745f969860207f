/* test_train.c — the trainer's pieces (train.h): AdamW against a float64 reference
 * step, the warmup + cosine schedule, clipping by the global norm, the PNG writer and the
 * loss plot (chunks and CRCs checked here, pixels decoded back by cairo), and the
 * training sections of the YAML config with their file:line:column errors. The loop
 * itself (resume, NaN stop, failed checkpoints, eager vs fused) is in test_train_loop.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cairo.h>
#include "llmkern/llmkern.h"
#include "llmkern/data.h"
#include "llmkern/train.h"
#include "core/sround.h"

/* --- AdamW ------------------------------------------------------------------------------- */
static void adamw_matches_f64_reference(void **state) {
    (void)state;
    enum { N = 37, STEPS = 5 };
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    const lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int i = 0; i < N; i++) rp[i] = p[i] = (float)sin(i * 0.7) * 0.5f;
    for (int t = 1; t <= STEPS; t++) {
        double lr = 1e-2 * t;
        for (int i = 0; i < N; i++) g[i] = (float)(cos(i * 1.3 + t) * (i % 5 == 0 ? 1e-3 : 2.0));
        lk_adamw_update(p, g, m, v, N, &h, lr, t);
        for (int i = 0; i < N; i++) {   /* torch.optim.AdamW, in float64 */
            rp[i] *= 1.0 - lr * h.weight_decay;
            rm[i] = h.beta1 * rm[i] + (1 - h.beta1) * g[i];
            rv[i] = h.beta2 * rv[i] + (1 - h.beta2) * (double)g[i] * g[i];
            double mh = rm[i] / (1 - pow(h.beta1, t)), vh = rv[i] / (1 - pow(h.beta2, t));
            rp[i] -= lr * mh / (sqrt(vh) + h.eps);
        }
    }
    for (int i = 0; i < N; i++) {
        /* f32 state over 5 steps: a few ulps of the moments and of p (|p| <= ~0.6). */
        assert_true(fabs(p[i] - rp[i]) <= 2e-6);
        /* m sums terms of both signs up to |g| = 2: absolute f32 rounding of that scale. */
        assert_true(fabs(m[i] - rm[i]) <= 1e-6);
        assert_true(fabs(v[i] - rv[i]) <= 1e-6 * (fabs(rv[i]) + 1e-12));
    }
}

static void adamw_zero_lr_and_decay_only(void **state) {
    (void)state;
    float p[3] = {1, -2, 3}, g[3] = {0, 0, 0}, m[3] = {0}, v[3] = {0};
    const lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.5};
    lk_adamw_update(p, g, m, v, 3, &h, 0.0, 1);
    assert_true(p[0] == 1 && p[1] == -2 && p[2] == 3);
    lk_adamw_update(p, g, m, v, 3, &h, 0.1, 2);       /* zero gradient: only the decay */
    assert_true(fabsf(p[0] - 0.95f) < 1e-7f && fabsf(p[1] + 1.9f) < 1e-6f && fabsf(p[2] - 2.85f) < 1e-6f);
}

/* Stochastic rounding: over all 2^16 random draws, f rounds up exactly (dropped bits)
 * times, so its mean is f; bf16 values, NaN and Inf pass unchanged. */
static void sround_is_exact_in_expectation(void **state) {
    (void)state;
    const float xs[] = {1.0f + 0x1p-9f, -3.0f - 0x1p-14f, 0x1p-100f * 1.37f, 5e-39f /* subnormal */, 1234.567f};
    for (size_t k = 0; k < sizeof xs / sizeof *xs; k++) {
        uint32_t u;
        memcpy(&u, &xs[k], 4);
        const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        long ups = 0;
        for (uint32_t r = 0; r < 65536; r++) {
            uint16_t b = lk_sround_bf16(xs[k], r);
            assert_true(b == lo || b == hi);   /* a neighbour, never further */
            ups += b == hi;
        }
        assert_int_equal(ups, (long)(u & 0xffffu));
    }
    const float exact = lk_bf16_to_f32(lk_f32_to_bf16(0.8125f)), inf = INFINITY;
    for (uint32_t r = 0; r < 65536; r += 4099) {
        assert_int_equal(lk_sround_bf16(exact, r), lk_f32_to_bf16(exact));
        assert_int_equal(lk_sround_bf16(inf, r), 0x7f80);
        assert_true(isnan(lk_bf16_to_f32(lk_sround_bf16(NAN, r))));
    }
}

/* bf16 moments (train.exp_avg_dtype / exp_avg_sq_dtype bf16): one step from random bf16
 * state against float64. The weight takes the f32 moments before they are stored, so it
 * meets the f32 tolerance; each stored moment is one of the two bf16 neighbours of the
 * exact value (1 ulp, with f32's own error on top); the same key gives the same bits and
 * another key other roundings. Odd lengths, f32 m with bf16 v and the reverse. */
static void adamw_bf16_moments_one_step(void **state) {
    (void)state;
    const int64_t ns[] = {1, 37, 1001};
    const lk_dtype mdt[] = {LK_BF16, LK_F32, LK_BF16}, vdt[] = {LK_BF16, LK_BF16, LK_F32};
    for (int c = 0; c < 3; c++) {
        const int64_t n = ns[c];
        float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *p2 = malloc((size_t)n * 4);
        void *m = malloc((size_t)n * 4), *v = malloc((size_t)n * 4), *m2 = malloc((size_t)n * 4),
             *v2 = malloc((size_t)n * 4);
        double *rp = malloc((size_t)n * 8), *rm = malloc((size_t)n * 8), *rv = malloc((size_t)n * 8),
               *m0 = malloc((size_t)n * 8);
        lk_rng rng = lk_rng_make(100 + (uint64_t)c);
        lk_rng_normal(&rng, p, n, 0.0f, 0.5f);
        lk_rng_normal(&rng, g, n, 0.0f, 1.0f);
        float *tmp = malloc((size_t)n * 4);
        lk_rng_normal(&rng, tmp, n, 0.0f, 0.1f);
        for (int64_t i = 0; i < n; i++) {   /* start from random moments, in their dtypes */
            lk_store(m, mdt[c], i, tmp[i]);
            lk_store(v, vdt[c], i, tmp[i] * tmp[i] + 1e-3);
            rm[i] = lk_load(m, mdt[c], i), rv[i] = lk_load(v, vdt[c], i), rp[i] = p[i];
        }
        memcpy(p2, p, (size_t)n * 4), memcpy(m2, m, (size_t)n * 4), memcpy(v2, v, (size_t)n * 4);
        const double lr = 1e-2;
        const int64_t t = 3;
        lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .m_dtype = mdt[c],
                              .v_dtype = vdt[c], .sround_key = lk_sround_tensor_key(lk_sround_step_key(7, t), c)};
        lk_adamw_update(p, g, m, v, n, &h, lr, t);
        double worst_p = 0;
        for (int64_t i = 0; i < n; i++) {
            m0[i] = rm[i];
            rm[i] = h.beta1 * rm[i] + (1 - h.beta1) * g[i];
            rv[i] = h.beta2 * rv[i] + (1 - h.beta2) * (double)g[i] * g[i];
            rp[i] = rp[i] * (1.0 - lr * h.weight_decay) -
                    lr * (rm[i] / (1 - pow(h.beta1, t))) / (sqrt(rv[i] / (1 - pow(h.beta2, t))) + h.eps);
            worst_p = fmax(worst_p, fabs(p[i] - rp[i]));
            const double got[2] = {lk_load(m, mdt[c], i), lk_load(v, vdt[c], i)}, want[2] = {rm[i], rv[i]};
            /* f32's own error is of the terms summed, not of their (possibly cancelling) sum, and
             * 1 - b2 taken in f32 (1 - 0.999f) is 2e-5 off */
            const double gg = (1 - h.beta2) * (double)g[i] * g[i];
            const double scale[2] = {h.beta1 * fabs(m0[i]) + (1 - h.beta1) * fabs(g[i]), rv[i] + 40 * gg};
            const lk_dtype dt[2] = {mdt[c], vdt[c]};
            for (int k = 0; k < 2; k++) {
                /* bf16: within one ulp (2^-7 of the larger one's binade) of the exact value */
                double ulp = dt[k] == LK_BF16 ? ldexp(1.0, ilogb(fmax(fabs(got[k]), fabs(want[k]))) - 7) : 0.0;
                assert_true(fabs(got[k] - want[k]) <= ulp + 5e-7 * scale[k] + 1e-30);   /* f32: ~4 eps */
            }
        }
        assert_true(worst_p <= 2e-6);   /* f32: p ~ 0.5-2 after a step of ~lr */
        /* from the same start, the same key rounds the same way and another key some
         * elements the other way (n > 100: ~half of them) */
        for (int other = 0; other < 2 && (n > 100 || !other); other++) {
            float *q = malloc((size_t)n * 4);
            void *m3 = malloc((size_t)n * 4), *v3 = malloc((size_t)n * 4);
            memcpy(q, p2, (size_t)n * 4), memcpy(m3, m2, (size_t)n * 4), memcpy(v3, v2, (size_t)n * 4);
            lk_adamw_hparams h2 = h;
            h2.sround_key ^= (uint64_t)other;
            lk_adamw_update(q, g, m3, v3, n, &h2, lr, t);
            const void *bf = mdt[c] == LK_BF16 ? m3 : v3, *bf0 = mdt[c] == LK_BF16 ? m : v;
            assert_int_equal(memcmp(bf, bf0, (size_t)n * 2) != 0, other);
            free(q), free(m3), free(v3);
        }
        free(p), free(g), free(p2), free(m), free(v), free(m2), free(v2), free(rp), free(rm), free(rv), free(m0), free(tmp);
    }
}

/* What the stochastic rounding is for: v's increments under beta2 = 0.999 are smaller
 * than half a bf16 ulp, so nearest rounding would hold v at 1 for ever; with g² = 2 the
 * exact v_t = 2 - 0.999^t, and the mean of 20,000 stochastically rounded v's follows it
 * (per element the rounding noise is ~ulp/2 · sqrt(1/(1 - b2²)) ~ 0.09; the mean's
 * ~6e-4). m (b1 0.9) follows 1.4142 - 0.4142 · 0.9^t the same way. */
static void adamw_bf16_v_follows_small_increments(void **state) {
    (void)state;
    enum { N = 20000, STEPS = 300 };
    float *p = calloc(N, 4), *g = malloc(N * 4);
    uint16_t *m = malloc(N * 2), *v = malloc(N * 2);
    for (int i = 0; i < N; i++) g[i] = (float)sqrt(2.0), m[i] = v[i] = lk_f32_to_bf16(1.0f);
    lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .m_dtype = LK_BF16, .v_dtype = LK_BF16};
    for (int t = 1; t <= STEPS; t++) {
        h.sround_key = lk_sround_tensor_key(lk_sround_step_key(11, t), 0);
        lk_adamw_update(p, g, m, v, N, &h, 1e-4, t);
    }
    double mean_v = 0, mean_m = 0;
    for (int i = 0; i < N; i++) mean_v += lk_bf16_to_f32(v[i]), mean_m += lk_bf16_to_f32(m[i]);
    mean_v /= N, mean_m /= N;
    const double want_v = 2.0 - pow(0.999, STEPS), want_m = sqrt(2.0) - (sqrt(2.0) - 1.0) * pow(0.9, STEPS);
    print_message("  bf16 v after %d steps: mean %.5f, exact %.5f (nearest rounding: 1.0); m %.5f, exact %.5f\n",
                  STEPS, mean_v, want_v, mean_m, want_m);
    assert_true(fabs(mean_v - want_v) <= 3e-3);   /* ~5 sigma of the mean's noise */
    assert_true(fabs(mean_m - want_m) <= 3e-3);
    free(p), free(g), free(m), free(v);
}

/* bf16 weights without an f32 master (train.main_params_dtype bf16): one step from random
 * bf16 weights lands on one of the two bf16 neighbours of float64's update (f32's error on
 * top), with bits 32-47 of the element's draw, the same key the same bits; and what the
 * rounding is for: steps of lr = 1e-4 from w = 1 (half an ulp there is 2e-3) leave a
 * nearest-rounded weight at 1 for ever, where the mean of 20,000 stochastically rounded
 * ones follows the exact 1 - t·lr (per element the rounding's walk is ~ulp/2 · sqrt(t) ~
 * 0.03 after 300 steps; the mean's ~2e-4). The moments in bf16 beside them still draw
 * bits 0-31: their values equal a run with f32 weights. */
static void adamw_bf16_weights(void **state) {
    (void)state;
    const int64_t ns[] = {1, 37, 1001};
    for (int c = 0; c < 3; c++) {
        const int64_t n = ns[c];
        uint16_t *p = malloc((size_t)n * 2), *p2 = malloc((size_t)n * 2);
        float *g = malloc((size_t)n * 4), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4), *tmp = malloc((size_t)n * 4);
        lk_rng rng = lk_rng_make(200 + (uint64_t)c);
        lk_rng_normal(&rng, tmp, n, 0.0f, 0.5f);
        lk_rng_normal(&rng, g, n, 0.0f, 1.0f);
        for (int64_t i = 0; i < n; i++) p[i] = lk_f32_to_bf16(tmp[i]);
        memcpy(p2, p, (size_t)n * 2);
        const double lr = 1e-2;
        lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .p_dtype = LK_BF16,
                              .sround_key = lk_sround_tensor_key(lk_sround_step_key(9, 1), c)};
        lk_adamw_update(p, g, m, v, n, &h, lr, 1);
        for (int64_t i = 0; i < n; i++) {
            const double w0 = lk_bf16_to_f32(p2[i]), mi = 0.1 * g[i], vi = 0.001 * (double)g[i] * g[i];
            const double want = w0 * (1.0 - lr * h.weight_decay) - lr * (mi / 0.1) / (sqrt(vi / 0.001) + h.eps);
            const double got = lk_bf16_to_f32(p[i]);
            /* bf16: within one ulp of the exact value (f32's own error, ~1e-7 of w, on top) */
            const double ulp = ldexp(1.0, ilogb(fmax(fabs(got), fabs(want))) - 7);
            assert_true(fabs(got - want) <= ulp + 1e-6 * fabs(w0) + 1e-30);
            assert_true(fabs(m[i] - mi) <= 1e-6 * fabs(mi) + 1e-30);   /* f32 moments: f32's rounding */
        }
        uint16_t *q = malloc((size_t)n * 2);
        for (int other = 0; other < 2 && (n > 100 || !other); other++) {   /* n > 100: some round the other way */
            float *m3 = calloc((size_t)n, 4), *v3 = calloc((size_t)n, 4);
            memcpy(q, p2, (size_t)n * 2);
            lk_adamw_hparams h2 = h;
            h2.sround_key ^= (uint64_t)other;
            lk_adamw_update(q, g, m3, v3, n, &h2, lr, 1);
            assert_int_equal(memcmp(q, p, (size_t)n * 2) != 0, other);
            free(m3), free(v3);
        }
        free(p), free(p2), free(g), free(m), free(v), free(tmp), free(q);
    }
    enum { N = 20000, STEPS = 300 };
    uint16_t *w = malloc(N * 2), *wn = malloc(N * 2), *m = malloc(N * 2), *v = malloc(N * 2), *mf = malloc(N * 2),
             *vf = malloc(N * 2);
    float *g = malloc(N * 4), *pf = malloc(N * 4);
    for (int i = 0; i < N; i++) g[i] = 1.0f, w[i] = wn[i] = lk_f32_to_bf16(1.0f), m[i] = v[i] = mf[i] = vf[i] = 0, pf[i] = 1;
    lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .m_dtype = LK_BF16, .v_dtype = LK_BF16,
                          .p_dtype = LK_BF16};
    for (int t = 1; t <= STEPS; t++) {
        h.sround_key = lk_sround_tensor_key(lk_sround_step_key(13, t), 0);
        lk_adamw_update(w, g, m, v, N, &h, 1e-4, t);
        lk_adamw_hparams hf = h;   /* f32 weights, the same moments' draws */
        hf.p_dtype = LK_F32;
        lk_adamw_update(pf, g, mf, vf, N, &hf, 1e-4, t);
        for (int i = 0; i < N; i++) {   /* nearest rounding of the same f32 step, by hand */
            const float step = lk_bf16_to_f32(wn[i]) - (float)(1e-4 / (1.0 + 1e-8));
            wn[i] = lk_f32_to_bf16(step);
        }
    }
    assert_memory_equal(m, mf, N * 2);
    assert_memory_equal(v, vf, N * 2);
    double mean = 0;
    for (int i = 0; i < N; i++) mean += lk_bf16_to_f32(w[i]) / N;
    const double want = 1.0 - STEPS * 1e-4;
    print_message("  bf16 weights after %d steps of 1e-4: mean %.5f, exact %.5f, nearest rounding %.5f\n", STEPS, mean,
                  want, (double)lk_bf16_to_f32(wn[0]));
    assert_true(lk_bf16_to_f32(wn[0]) == 1.0f);   /* nearest rounding never moved */
    assert_true(fabs(mean - want) <= 1.5e-3);     /* ~6 sigma of the mean's noise */
    free(w), free(wn), free(m), free(v), free(mf), free(vf), free(g), free(pf);
}

/* --- schedule ------------------------------------------------------------------------------ */
static void schedule_warmup_then_cosine(void **state) {
    (void)state;
    const double lr = 1e-3, min_lr = 1e-4;
    assert_true(fabs(lk_lr_schedule(0, 10, 100, lr, min_lr) - 1e-4) < 1e-15);
    assert_true(fabs(lk_lr_schedule(4, 10, 100, lr, min_lr) - 5e-4) < 1e-15);
    assert_true(fabs(lk_lr_schedule(9, 10, 100, lr, min_lr) - lr) < 1e-15);
    assert_true(fabs(lk_lr_schedule(10, 10, 100, lr, min_lr) - lr) < 1e-15);
    assert_true(fabs(lk_lr_schedule(99, 10, 100, lr, min_lr) - min_lr) < 1e-15);
    /* Halfway through the decay the cosine is at the mean of lr and min_lr. */
    double mid = lk_lr_schedule(10 + 89 / 2, 10, 100, lr, min_lr);
    double want = min_lr + 0.5 * (lr - min_lr) * (1 + cos(M_PI * (89 / 2) / 89.0));
    assert_true(fabs(mid - want) < 1e-15 && fabs(mid - 5.5e-4) < 1e-5);
    double prev = 1.0;
    for (int s = 10; s < 100; s++) {   /* non-increasing after warmup */
        double x = lk_lr_schedule(s, 10, 100, lr, min_lr);
        assert_true(x <= prev + 1e-18 && x >= min_lr - 1e-18);
        prev = x;
    }
    assert_true(lk_lr_schedule(0, 0, 1, lr, min_lr) == lr);   /* no warmup, one step */
    assert_true(fabs(lk_lr_schedule(200, 10, 100, lr, min_lr) - min_lr) < 1e-15);
}

/* --- clipping ------------------------------------------------------------------------------ */
static void clip_by_global_norm(void **state) {
    (void)state;
    enum { A = 10001, B = 3 };   /* A spans several norm chunks */
    float *a = malloc(A * sizeof *a), b[B] = {3, 0, 4};
    double ss = 25;
    for (int i = 0; i < A; i++) { a[i] = (float)((i % 7) - 3) * 0.01f; ss += (double)a[i] * a[i]; }
    float *bufs[2] = {a, b};
    int64_t len[2] = {A, B};
    double norm = lk_clip_grad_norm(bufs, len, 2, 0.0);   /* 0: report only */
    assert_true(fabs(norm - sqrt(ss)) < 1e-9 * sqrt(ss));
    assert_true(b[0] == 3 && b[2] == 4);
    assert_true(lk_clip_grad_norm(bufs, len, 2, 1e6) == norm && b[0] == 3);   /* below the limit */
    double before = lk_clip_grad_norm(bufs, len, 2, 1.0);
    assert_true(before == norm);
    double after = lk_clip_grad_norm(bufs, len, 2, 0.0);
    assert_true(fabs(after - 1.0) < 1e-5);   /* max_norm / (norm + 1e-6) */
    b[1] = NAN;
    assert_true(isnan(lk_clip_grad_norm(bufs, len, 2, 1.0)));
    assert_true(b[0] == b[0] && fabsf(b[2] / b[0] - 4.0f / 3.0f) < 1e-6f);   /* nothing scaled by NaN */
    free(a);
}

/* The norm of bf16 gradients (train.main_grads_dtype) in f64 over their widened values, as
 * the f32 norm of those values; the clip's factor (lk_clip_scale) and AdamW reading a bf16
 * gradient times that factor: the bits of the f32 update from widen(g) * factor in f32 (an
 * f32 gradient clipped in place first, the trainer's old order). g_scale 0 is 1. */
static void bf16_grads_norm_and_clip(void **state) {
    (void)state;
    enum { A = 9001, N = 41 };
    uint16_t *a = malloc(A * sizeof *a);
    float *af = malloc(A * sizeof *af);
    double ss = 0;
    for (int i = 0; i < A; i++) {
        a[i] = lk_f32_to_bf16((float)sin(i * 0.37) * 0.3f);
        af[i] = lk_bf16_to_f32(a[i]);
        ss += (double)af[i] * af[i];
    }
    const void *bufs[1] = {a};
    const int64_t len[1] = {A};
    double norm = lk_grad_norm(bufs, len, 1, LK_BF16);
    float *fb[1] = {af};
    assert_true(norm == lk_clip_grad_norm(fb, len, 1, 0.0));
    assert_true(fabs(norm - sqrt(ss)) <= 1e-12 * sqrt(ss));
    assert_true(lk_clip_scale(norm, 0.0) == 1.0f && lk_clip_scale(norm, 2 * norm) == 1.0f);
    assert_true(lk_clip_scale(NAN, 1.0) == 1.0f);
    const float c = lk_clip_scale(norm, 1.0);
    assert_true(c == (float)(1.0 / (norm + 1e-6)) && c < 1.0f);
    float p1[N], p2[N], m1[N] = {0}, m2[N] = {0}, v1[N] = {0}, v2[N] = {0}, gf[N];
    uint16_t gb[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = (float)cos(i * 0.9);
        gb[i] = lk_f32_to_bf16((float)sin(i * 1.7) * 3.0f);
        gf[i] = lk_bf16_to_f32(gb[i]) * c;   /* an f32 gradient clipped in place holds these */
    }
    lk_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    lk_adamw_hparams hb = h;
    hb.g_dtype = LK_BF16, hb.g_scale = c;
    for (int t = 1; t <= 3; t++) {
        lk_adamw_update(p1, gf, m1, v1, N, &h, 1e-2, t);
        lk_adamw_update(p2, gb, m2, v2, N, &hb, 1e-2, t);
    }
    assert_memory_equal(p1, p2, sizeof p1);
    assert_memory_equal(m1, m2, sizeof m1);
    assert_memory_equal(v1, v2, sizeof v1);
    hb.g_scale = 0;   /* 1 */
    h.g_scale = 1;
    for (int i = 0; i < N; i++) gf[i] = lk_bf16_to_f32(gb[i]);
    lk_adamw_update(p1, gf, m1, v1, N, &h, 1e-2, 4);
    lk_adamw_update(p2, gb, m2, v2, N, &hb, 1e-2, 4);
    assert_memory_equal(p1, p2, sizeof p1);
    free(a), free(af);
}

/* --- PNG ----------------------------------------------------------------------------------- */
static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static uint32_t crc32_ref(const uint8_t *p, size_t n) {   /* bitwise, independent of png.c's table */
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & -(c & 1));
    }
    return ~c;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* Checks the chunk structure and CRCs (8-bit RGB, IHDR first, IEND last), then decodes
 * the image with cairo (libpng) into rows of w*3 bytes, returned malloc'ed. */
static uint8_t *png_check(const char *path, int *w, int *h) {
    size_t n;
    uint8_t *f = read_all(path, &n);
    assert_memory_equal(f, "\x89PNG\r\n\x1a\n", 8);
    size_t o = 8;
    int saw_end = 0, k = 0, idat = 0;
    while (o + 12 <= n && !saw_end) {
        uint32_t len = be32(f + o);
        assert_true(o + 12 + len <= n);
        assert_int_equal(be32(f + o + 8 + len), crc32_ref(f + o + 4, len + 4));
        if (k++ == 0) {
            assert_memory_equal(f + o + 4, "IHDR", 4);
            assert_int_equal(len, 13);
            *w = (int)be32(f + o + 8);
            *h = (int)be32(f + o + 12);
            assert_memory_equal(f + o + 16, "\x08\x02", 2);   /* 8-bit RGB */
        }
        idat += memcmp(f + o + 4, "IDAT", 4) == 0;
        saw_end = memcmp(f + o + 4, "IEND", 4) == 0;
        o += 12 + len;
    }
    assert_true(saw_end && o == n && idat > 0);
    free(f);
    cairo_surface_t *sf = cairo_image_surface_create_from_png(path);
    assert_int_equal(cairo_surface_status(sf), CAIRO_STATUS_SUCCESS);
    assert_int_equal(cairo_image_surface_get_width(sf), *w);
    assert_int_equal(cairo_image_surface_get_height(sf), *h);
    const unsigned char *px = cairo_image_surface_get_data(sf);
    int stride = cairo_image_surface_get_stride(sf);
    uint8_t *rgb = malloc((size_t)*w * *h * 3);
    for (int y = 0; y < *h; y++)
        for (int x = 0; x < *w; x++) {   /* RGB24 / ARGB32 (opaque): native-endian 0x..RRGGBB words */
            uint32_t p = ((const uint32_t *)(px + (size_t)y * stride))[x];
            uint8_t *q = rgb + ((size_t)y * *w + x) * 3;
            q[0] = (uint8_t)(p >> 16); q[1] = (uint8_t)(p >> 8); q[2] = (uint8_t)p;
        }
    cairo_surface_destroy(sf);
    return rgb;
}

static void png_round_trips_pixels(void **state) {
    (void)state;
    enum { W = 150, H = 160 };   /* > 65535 raw bytes: several stored blocks */
    uint8_t *rgb = malloc(W * H * 3);
    for (int i = 0; i < W * H * 3; i++) rgb[i] = (uint8_t)(i * 7 + i / 13);
    char path[] = "/tmp/llmkern_png_XXXXXX";
    close(mkstemp(path));
    assert_int_equal(lk_png_write(path, rgb, W, H), LK_OK);
    int w, h;
    uint8_t *raw = png_check(path, &w, &h);
    assert_int_equal(w, W);
    assert_int_equal(h, H);
    assert_memory_equal(raw, rgb, W * H * 3);
    assert_int_equal(lk_png_write(path, rgb, 0, H), LK_EINVAL);
    free(raw);
    free(rgb);
    unlink(path);
}

static void plot_is_a_valid_png_with_a_curve(void **state) {
    (void)state;
    float x[50], y[50];
    for (int i = 0; i < 50; i++) { x[i] = (float)i; y[i] = 5.8f * expf(-i / 15.0f) + 1.0f; }
    y[20] = NAN;   /* a gap, not a failure */
    char path[] = "/tmp/llmkern_plot_XXXXXX";
    close(mkstemp(path));
    assert_int_equal(lk_plot_png(path, x, y, 50, 640, 400), LK_OK);
    int w, h;
    uint8_t *raw = png_check(path, &w, &h);
    assert_int_equal(w, 640);
    assert_int_equal(h, 400);
    size_t white = 0, curve = 0, dark = 0, shaded = 0;
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++) {
            const uint8_t *p = raw + ((size_t)r * w + c) * 3;
            white += p[0] == 255 && p[1] == 255 && p[2] == 255;
            curve += p[2] > p[0] + 60;                          /* blue: the line and its soft edge */
            dark += p[0] == 0 && p[1] == 0 && p[2] == 0;
            shaded += p[2] > p[0] + 10 && p[2] < 250 && !(p[0] == 31 && p[1] == 119 && p[2] == 180);
        }
    assert_true(white > (size_t)w * h / 2);   /* a white background */
    assert_true(curve > 300);                 /* the loss line */
    assert_true(dark > 600);                  /* the axes */
    assert_true(shaded > 50);                 /* anti-aliased: blues between the line's and white */
    free(raw);
    assert_int_equal(lk_plot_png(path, x, y, 0, 640, 400), LK_OK);   /* no points yet: axes only */
    assert_int_equal(lk_plot_png(path, x, y, 5, 10, 400), LK_EINVAL);
    unlink(path);
}

/* --- YAML ---------------------------------------------------------------------------------- */
static char ypath[64];

static const char *write_yaml(const char *text) {
    snprintf(ypath, sizeof ypath, "/tmp/llmkern_ty_XXXXXX");
    int fd = mkstemp(ypath);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return ypath;
}

static void yaml_train_sections_load(void **state) {
    (void)state;
    static lk_train_config tc;
    lk_ops_config ops;
    lk_train_config_init(&tc);
    lk_ops_config_init(&ops);
    const char *p = write_yaml(
        "model:\n"
        "  ops_implementation: { rms_norm_implementation: eager }\n"
        "  hidden_size: 32\n  num_hidden_layers: 2\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
        "  head_dim: 8\n  intermediate_size: 64\n  vocab_size: 320\n  num_experts: 4\n"
        "  num_experts_per_tok: 2\n  moe_intermediate_size: 16\n  tie_word_embeddings: true\n"
        "  rope_theta: 10000\n  torch_dtype: float32\n"
        "  use_sliding_window: true\n  sliding_window: 16\n  max_window_layers: 1\n"
        "train:\n  steps: 7\n  lr: 3e-3\n  min_lr: 1e-4\n  betas: [0.8, 0.99]\n  batch_size: 2\n"
        "  seq_len: 64\n  grad_accum: 3\n  seed: 9\n  save_every: 2\n  out: /tmp/x\n  recompute: true\n"
        "  dtype: bfloat16\n  cuda_graph: true\n  deterministic: true\n  keep_qk: true\n  grad_reduce_dtype: bf16\n"
        "  profile_step: 3\n  fp32_residual_connection: false\n"
        "  exp_avg_dtype: bf16\n  exp_avg_sq_dtype: bfloat16\n  main_params_dtype: bf16\n  main_grads_dtype: bf16\n"
        "  lm_head_chunk_bytes: 1GiB\n  recompute_modules: [layernorm, moe:1, qkv:2]\n  recompute_num_layers: 1\n"
        "data:\n  text: corpus.txt\n");
    lk_train_config_init(&tc);
    assert_int_equal(lk_train_dtype(&tc), LK_F32);          /* the CPU's default */
    assert_int_equal(tc.fp32_residual_connection, 1);       /* autocast's f32 stream by default */
    tc.device = LK_DEVICE_CUDA;
    assert_int_equal(lk_train_dtype(&tc), LK_BF16);         /* a GPU's */
    assert_int_equal(lk_train_config_load_yaml(p, &tc, &ops), LK_OK);
    assert_int_equal(tc.dtype, LK_BF16);
    assert_int_equal(tc.cuda_graph, 1);
    assert_int_equal(tc.deterministic, 1);
    assert_int_equal(tc.keep_qk, 1);
    assert_int_equal(tc.grad_reduce_dtype, LK_BF16);
    assert_int_equal(tc.exp_avg_dtype, LK_BF16);
    assert_int_equal(tc.exp_avg_sq_dtype, LK_BF16);
    assert_int_equal(tc.main_params_dtype, LK_BF16);
    assert_int_equal(tc.main_grads_dtype, LK_BF16);
    assert_int_equal(tc.recompute_modules, LK_RECOMPUTE_LAYERNORM | LK_RECOMPUTE_MOE | LK_RECOMPUTE_QKV);
    assert_true(tc.recompute_module_layers[0] == 0 && tc.recompute_module_layers[1] == 1 &&
                tc.recompute_module_layers[2] == 2);   /* all; the first; the first two */
    assert_int_equal(tc.recompute_num_layers, 1);
    assert_int_equal(tc.lm_head_chunk_bytes, (uint64_t)1 << 30);
    assert_int_equal(tc.profile_step, 3);
    assert_int_equal(tc.fp32_residual_connection, 0);
    assert_true(tc.has_model && tc.model.moe && tc.model.num_experts == 4 && tc.model.hidden_size == 32);
    assert_string_equal(tc.model.model_type, "qwen3_moe");
    assert_string_equal(tc.model.torch_dtype, "float32");
    assert_true(tc.model.tie_word_embeddings == 1);
    assert_true(tc.model.use_sliding_window && tc.model.sliding_window == 16 && tc.model.max_window_layers == 1);
    assert_true(tc.steps == 7 && tc.lr == 3e-3 && tc.beta1 == 0.8 && tc.beta2 == 0.99 && tc.grad_accum == 3);
    assert_true(tc.seed == 9 && tc.save_every == 2 && tc.recompute == 1 && tc.batch_size == 2 && tc.seq_len == 64);
    assert_string_equal(tc.out, "/tmp/x");
    assert_int_equal(tc.data, LK_DATA_TEXT);
    assert_string_equal(tc.data_path, "/tmp/corpus.txt");   /* next to the YAML file */
    assert_string_equal(ops.field[LK_OP_RMS_NORM].value, "eager");
    /* The ops-only loader accepts the same file and keeps only the ops. */
    lk_ops_config only;
    lk_ops_config_init(&only);
    assert_int_equal(lk_config_load_yaml(p, &only), LK_OK);
    assert_string_equal(only.field[LK_OP_RMS_NORM].value, "eager");
    unlink(p);
}

static void yaml_train_errors_name_the_place(void **state) {
    (void)state;
    static const struct { const char *yaml, *where, *want; } cases[] = {
        {"train:\n  stpes: 3\n", ":2:3", "unknown key 'stpes' in train (did you mean 'steps'?)"},
        {"train:\n  lr: fast\n", ":2:7", "train.lr: expected a finite number >= 0, got 'fast'"},
        {"train:\n  steps: 0\n", ":2:10", "train.steps: expected an integer >= 1"},
        {"train:\n  betas: [0.9]\n", ":2:10", "train.betas: expected a list of two numbers"},
        {"train:\n  betas: [0.9, 1.5]\n", ":2:16", "train.betas: expected a number below 1"},
        {"train:\n  recompute: maybe\n", ":2:14", "train.recompute: expected true or false"},
        {"train:\n  dtype: fp8\n", ":2:10", "train.dtype: expected bf16 (bfloat16) or f32 (float32), got 'fp8'"},
        {"train:\n  grad_reduce_dtype: f16\n", ":2:22",
         "train.grad_reduce_dtype: expected bf16 (bfloat16) or f32 (float32), got 'f16'"},
        {"train:\n  cuda_graph: 2\n", ":2:15", "train.cuda_graph: expected true or false"},
        {"train:\n  fp32_residual_connection: no\n", ":2:29", "train.fp32_residual_connection: expected true or false"},
        {"train:\n  recompute_modules: layernorm\n", ":2:22", "train.recompute_modules: expected a list"},
        {"train:\n  recompute_num_layers: -1\n", ":2:25", "train.recompute_num_layers: expected an integer >= 0"},
        {"train:\n  recompute_modules: [layernorm, moe_act]\n", ":2:34",
         "train.recompute_modules: expected layernorm, moe or qkv, alone or name:N (the first N layers: moe:6); "
         "Megatron's core_attn"},
        {"train:\n  recompute_modules: [moe:0]\n", ":2:23", "train.recompute_modules: expected layernorm, moe or qkv"},
        {"train:\n  recompute_modules: [moe:2x]\n", ":2:23", "got 'moe:2x'"},
        {"train:\n  exp_avg_sq_dtype: fp8\n", ":2:21",
         "train.exp_avg_sq_dtype: expected bf16 (bfloat16) or f32 (float32), got 'fp8'"},
        {"train: [1]\n", ":1:8", "train: expected a mapping"},
        {"data:\n  corpus: builtin\n  text: a.txt\n", ":3:3", "expected one source"},
        {"data:\n  corpus: web\n", ":2:11", "data.corpus: expected builtin"},
        {"model:\n  hidden_sise: 3\n", ":2:3", "did you mean 'hidden_size'?"},
        {"model:\n  hidden_size: [3]\n", ":2:16", "model.hidden_size: expected an integer"},
        {"model:\n  config_json: /nonexistent/c.json\n", ":2:16", "/nonexistent/c.json"},
        {"model:\n  hidden_size: 30\n  num_hidden_layers: 1\n", "", "model:"},
        {"trian: {}\n", ":1:1", "did you mean 'train'?"},
        /* issue 20: duplicate keys name both places, at every level */
        {"train:\n  steps: 4\n  lr: 0.1\n  steps: 5\n", ":4:3", "duplicate key 'steps' in train (first at line 2, column 3)"},
        {"data: { docs: 3, docs: 4 }\n", ":1:18", "duplicate key 'docs' in data (first at line 1, column 9)"},
        {"train: {}\ntrain: {}\n", ":2:1", "duplicate key 'train' in the document (first at line 1"},
        {"model:\n  ops_implementation: { attn_implementation: eager, attn_implementation: sdpa }\n", ":2:53",
         "duplicate key 'attn_implementation' in model.ops_implementation"},
        {"train:\n  comm_timeout_s: -1\n", ":2:19", "train.comm_timeout_s: expected a finite number >= 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        static lk_train_config tc, before;
        lk_ops_config ops;
        lk_train_config_init(&tc);
        lk_ops_config_init(&ops);
        before = tc;
        const char *p = write_yaml(cases[i].yaml);
        lk_status s = lk_train_config_load_yaml(p, &tc, &ops);
        if (s == LK_OK || !strstr(lk_last_error(), cases[i].want) || !strstr(lk_last_error(), cases[i].where) ||
            !strstr(lk_last_error(), p))
            fprintf(stderr, "case %zu: status %d, error: %s\n", i, s, lk_last_error());
        assert_int_not_equal(s, LK_OK);
        assert_non_null(strstr(lk_last_error(), cases[i].want));
        assert_non_null(strstr(lk_last_error(), cases[i].where));
        assert_non_null(strstr(lk_last_error(), p));
        assert_memory_equal(&tc, &before, sizeof tc);   /* all or nothing */
        lk_ops_config plain;
        lk_ops_config_init(&plain);
        assert_int_not_equal(lk_config_load_yaml(p, &plain), LK_OK);   /* explain rejects it too */
        unlink(p);
    }
}

static void example_configs_load(void **state) {
    (void)state;
    const char *dir = getenv("LLMKERN_SOURCE_DIR");
    const char *names[] = {"configs/tiny-moe.yaml", "configs/tiny-dense.yaml"};
    for (int i = 0; i < 2; i++) {
        char p[512];
        static lk_train_config tc;
        lk_ops_config ops;
        snprintf(p, sizeof p, "%s/%s", dir ? dir : ".", names[i]);
        lk_train_config_init(&tc);
        lk_ops_config_init(&ops);
        assert_int_equal(lk_train_config_load_yaml(p, &tc, &ops), LK_OK);
        assert_true(tc.has_model);
        assert_int_equal(tc.model.moe, i == 0);
        assert_int_equal(tc.data, LK_DATA_BUILTIN);
        assert_true(tc.model.vocab_size >= LK_TOK_VOCAB);
    }
}

static int setup(void **state) {
    (void)state;
    assert_int_equal(lk_init(), LK_OK);
    return 0;
}

/* The memory estimate the trainer refuses by (issue 20): its parts, and products that do
 * not fit named by field. */
static void memory_estimate(void **state) {
    (void)state;
    static lk_train_config tc;
    lk_train_config_init(&tc);
    lk_train_memory m;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);   /* no model: the history only */
    assert_true(m.params == 0 && m.history_bytes == (uint64_t)tc.steps * 20 && m.total_bytes == m.history_bytes);
    tc.has_model = 1;
    tc.model.hidden_size = 32; tc.model.num_hidden_layers = 2; tc.model.num_attention_heads = 2;
    tc.model.num_key_value_heads = 1; tc.model.head_dim = 16; tc.model.intermediate_size = 64; tc.model.vocab_size = 320;
    int64_t params;
    assert_int_equal(lk_qwen3_param_count(&tc.model, "t", &params, NULL), LK_OK);
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_int_equal(m.params, params);
    assert_true(m.state_bytes == (uint64_t)params * 16);
    tc.exp_avg_dtype = LK_BF16;   /* 2 bytes a parameter less, and 2 more for the second moment */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.state_bytes == (uint64_t)params * 14);
    tc.exp_avg_sq_dtype = LK_BF16;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.state_bytes == (uint64_t)params * 12);
    tc.dtype = LK_BF16;   /* the weights' bf16 copy: 2 more; kept alone (main_params_dtype), 4 fewer */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.state_bytes == (uint64_t)params * 14);
    tc.main_params_dtype = LK_BF16;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.state_bytes == (uint64_t)params * 10);
    tc.main_grads_dtype = LK_BF16;   /* bf16 gradients: 2 fewer */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.state_bytes == (uint64_t)params * 8);
    tc.dtype = LK_DTYPE_COUNT, tc.main_params_dtype = tc.main_grads_dtype = LK_F32;
    tc.exp_avg_dtype = tc.exp_avg_sq_dtype = LK_F32;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes >= (uint64_t)tc.batch_size * tc.seq_len * tc.model.vocab_size * 4);
    assert_true(m.total_bytes == m.state_bytes + m.activation_bytes + m.history_bytes);
    assert_true(m.host_bytes == m.total_bytes && m.device_bytes == 0);   /* the CPU holds it all */
    uint64_t lean = m.activation_bytes;   /* train.keep_qk: q and k once more a token and layer (v's columns
                                           * the head-major v's, where attention reads them in place) */
    tc.keep_qk = 1;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean + (uint64_t)tc.batch_size * tc.seq_len * 2 * (32 + 16) * 4);
    tc.keep_qk = 0;
    tc.recompute_modules = LK_RECOMPUTE_LAYERNORM;   /* the norms' outputs made again: 2 hidden fewer */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean - (uint64_t)tc.batch_size * tc.seq_len * 2 * 2 * 32 * 4);
    tc.recompute_modules = LK_RECOMPUTE_MOE;   /* a dense model: no experts to make again */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean);
    tc.recompute_modules = LK_RECOMPUTE_QKV, tc.recompute_module_layers[2] = 1;   /* qkv:1: one layer's q, k, v */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean - (uint64_t)tc.batch_size * tc.seq_len * (32 + 2 * 16) * 4);
    tc.recompute_modules = 0, tc.recompute_module_layers[2] = 0;
    const uint64_t logits = (uint64_t)tc.batch_size * tc.seq_len * 320 * 4, layer = (lean - logits) / 2;
    tc.recompute = 1;   /* both layers made again: one layer's block */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean - layer);
    tc.recompute_num_layers = 1;   /* the first made again in the shared block, the second kept: two */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == lean);
    tc.recompute = 0, tc.recompute_num_layers = 0;
    tc.model.moe = 1, tc.model.num_experts = 4, tc.model.num_experts_per_tok = 2, tc.model.moe_intermediate_size = 16;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    const uint64_t moe = m.activation_bytes, experts = (uint64_t)tc.batch_size * tc.seq_len * 3 * 2 * 16 * 4;
    tc.recompute_modules = LK_RECOMPUTE_MOE;   /* both layers' experts made again */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == moe - 2 * experts);
    tc.recompute_module_layers[1] = 1;   /* moe:1 */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == moe - experts);
    tc.recompute = 1, tc.recompute_num_layers = 1;   /* layer 0 made again whole: its experts too */
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.activation_bytes == moe);
    tc.recompute = 0, tc.recompute_num_layers = 0, tc.recompute_modules = 0, tc.recompute_module_layers[1] = 0;
    tc.model.moe = 0, tc.model.num_experts = 0;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    /* on a GPU: state and activations there, a host copy of the weights and the history here */
    tc.device = LK_DEVICE_CUDA;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_OK);
    assert_true(m.device_bytes == m.state_bytes + m.activation_bytes);
    assert_true(m.host_bytes == (uint64_t)params * 4 + m.history_bytes);
    tc.device = LK_DEVICE_CPU;
    tc.steps = 3689348814741910324LL;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.steps (the loss history): 3689348814741910324 x 5"));
    tc.steps = 10;
    tc.batch_size = (int64_t)1 << 40; tc.seq_len = (int64_t)1 << 40;
    assert_int_equal(lk_train_memory_estimate(&tc, &m), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "train.batch_size x train.seq_len"));
}

/* What the machine has now (issue 22): the host's available RAM, at most its physical
 * memory; a run past train.memory_limit refused before train.out exists, naming both. */
static void memory_available_and_limit(void **state) {
    (void)state;
    char src[160];
    uint64_t have = lk_hw_mem_available(LK_DEVICE_CPU, src, sizeof src);
    assert_true(have > (16ull << 20));
    assert_true(have <= (uint64_t)lk_hw_get()->cpu_mem_bytes);
    assert_non_null(strstr(src, "of host RAM"));
#ifndef LLMKERN_HAVE_CUDA
    assert_int_equal(lk_hw_mem_available(LK_DEVICE_CUDA, src, sizeof src), 0);
    assert_non_null(strstr(src, "unknown in this build"));
#endif
    static lk_train_config tc;
    static lk_ops_config ops;
    lk_train_config_init(&tc);
    lk_ops_config_init(&ops);
    tc.has_model = 1;
    lk_qwen3_config_init(&tc.model, 0);
    tc.model.hidden_size = 32; tc.model.num_hidden_layers = 1; tc.model.num_attention_heads = 2;
    tc.model.num_key_value_heads = 1; tc.model.head_dim = 16; tc.model.intermediate_size = 64; tc.model.vocab_size = 320;
    tc.steps = 2; tc.batch_size = 2; tc.seq_len = 32; tc.corpus_docs = 16;
    tc.memory_limit = 100 << 10;
    char dir[] = "/tmp/lk_train_mem_XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(tc.out, sizeof tc.out, "%s/run", dir);
    lk_train_opts o = {.quiet = 1};
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_ENOMEM);
    assert_non_null(strstr(lk_last_error(), "on cpu, more than the 100.0 KiB of train.memory_limit"));
    assert_non_null(strstr(lk_last_error(), "train.batch_size 2 x train.seq_len 32"));
    assert_int_equal(access(tc.out, F_OK), -1);
    tc.memory_limit = 64ull << 20;   /* enough: it trains */
    assert_int_equal(lk_train_run(&tc, &ops, NULL, &o, NULL), LK_OK);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The progress period where stdout is not a terminal: ~20 lines a run, round numbers. */
static void log_every_from_length(void **state) {
    (void)state;
    static const int64_t steps[][2] = {{1, 1}, {3, 1}, {39, 1}, {40, 2}, {100, 5}, {400, 20}, {1000, 50},
                                       {2500, 100}, {1000000, 50000}, {INT64_MAX, 200000000000000000LL}};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        assert_int_equal(lk_train_log_every(steps[i][0]), steps[i][1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(memory_available_and_limit),
        cmocka_unit_test(log_every_from_length),
        cmocka_unit_test(adamw_matches_f64_reference),
        cmocka_unit_test(adamw_zero_lr_and_decay_only),
        cmocka_unit_test(sround_is_exact_in_expectation),
        cmocka_unit_test(adamw_bf16_moments_one_step),
        cmocka_unit_test(adamw_bf16_v_follows_small_increments),
        cmocka_unit_test(adamw_bf16_weights),
        cmocka_unit_test(schedule_warmup_then_cosine),
        cmocka_unit_test(clip_by_global_norm),
        cmocka_unit_test(bf16_grads_norm_and_clip),
        cmocka_unit_test(png_round_trips_pixels),
        cmocka_unit_test(plot_is_a_valid_png_with_a_curve),
        cmocka_unit_test(yaml_train_sections_load),
        cmocka_unit_test(yaml_train_errors_name_the_place),
        cmocka_unit_test(memory_estimate),
        cmocka_unit_test(example_configs_load),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
