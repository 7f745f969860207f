/* harness_router.c — the MoE routers for `llmkern check` / `llmkern bench`
 * (lk_moe_router_harness, named by its descriptor, def.c) and the comparison
 * tests/test_moe.c runs (check.h). The reference is held at the implementation's own
 * expert choice (near-ties may be decided differently by f32 and f64); how far that
 * choice falls short of the best is checked separately (choice_gap). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/moe/check.h"
#include "ops/moe/reference.h"

/* f32: one GEMM over H terms, a softmax / sigmoid in f32: ~1e-6 of max|ref|. 2e-5.
 * bf16 storage: logits rounded to bf16 (2^-9 relative, unless gate_f32) move every
 *   probability by up to ~|z|·2^-9, and d_hidden is rounded once: 2e-2.
 * The choice gap uses the same tolerances, relative to the scores (at most 1). */
double lk_moe_router_tol(const lk_impl *impl, lk_dtype dt) { return dt == LK_F32 ? 2e-5 : 2e-2; }

/* fake_balanced: noise 0 against its formula; noise > 0 must be a valid choice
 * (distinct experts, weights summing to route_scale) and the same on a second call. */
static double fake_errors(const lk_moe_router_args *o, const int32_t *ids, const float *w, const int32_t *ids2,
                          const float *w2, int64_t t, int64_t e) {
    int k = o->top_k;
    double sc = o->route_scale > 0 ? o->route_scale : 1.0, err = 0;
    for (int64_t tok = 0; tok < t; tok++) {
        double sum = 0;
        for (int j = 0; j < k; j++) {
            int64_t r = tok * k + j;
            if (ids[r] != ids2[r] || w[r] != w2[r] || ids[r] < 0 || ids[r] >= e) return INFINITY;
            if (o->noise == 0.0f) {
                if (ids[r] != (int32_t)(r % e)) return INFINITY;
                err = fmax(err, fabs(w[r] - sc / k) / (sc / k));
            }
            for (int l = 0; l < j && o->noise > 0; l++)
                if (ids[tok * k + l] == ids[r]) return INFINITY;
            sum += w[r];
        }
        err = fmax(err, fabs(sum - sc) / sc);
    }
    return err;
}

lk_status lk_moe_router_check_case(const lk_impl *impl, const lk_moe_router_problem *p, lk_moe_router_errors *er) {
    memset(er, 0, sizeof *er);
    int64_t T = p->t, H = p->h, E = p->e;
    int K = p->opts.top_k, fake = strcmp(impl->name, "fake_balanced") == 0;
    lk_moe_score_kind kind = strcmp(impl->name, "sigmoid_bias") == 0 ? LK_MOE_SIGMOID : LK_MOE_SOFTMAX;
    lk_dtype gdt = p->gate_f32 ? LK_F32 : p->dt;
    size_t sb = 0;
    lk_status s = lk_moe_router_saved_bytes(impl, T, E, K, &sb);
    if (s) return s;
    lk_rng rng = lk_rng_make(p->seed);
    double *xd = NULL, *wgd = NULL, *dgw0d = NULL;
    void *x = lk_random_tensor(&rng, p->dt, T * H, 1.0f, &xd);
    void *wg = lk_random_tensor(&rng, gdt, E * H, 2.0f / sqrtf((float)H), &wgd);  /* logits ~ N(0, 4) */
    void *dgw = lk_random_tensor(&rng, gdt, E * H, 0.5f, &dgw0d);
    float *bias = malloc(sizeof(float) * (size_t)E), *dwt = malloc(sizeof(float) * (size_t)(T * K) + 4);
    float *w = malloc(sizeof(float) * (size_t)(T * K) + 4), *w2 = malloc(sizeof(float) * (size_t)(T * K) + 4);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K) + 4), *ids2 = malloc(sizeof(int32_t) * (size_t)(T * K) + 4);
    void *dx = malloc((size_t)(T * H) * lk_dtype_size(p->dt) + 4), *saved = malloc(sb + 4);
    double *z = malloc(sizeof(double) * (size_t)(3 * T * E + 2 * T * K + T * H + 4)), biasd[E > 0 ? E : 1];
    float aux = NAN;
    lk_arena arena = {0};
    lk_placement pl;
    lk_place_begin(&pl, "moe_router", impl);        /* a failure is kept in pl.status */
    if (!x || !wg || !dgw || !bias || !dwt || !w || !w2 || !ids || !ids2 || !dx || !saved || !z) {
        s = lk_error(LK_ENOMEM, "moe_router: check: out of memory");
        goto done;
    }
    lk_rng_uniform(&rng, bias, E, -0.3f, 0.3f);
    lk_rng_normal(&rng, dwt, T * K, 0.0f, 1.0f);
    for (int64_t i = 0; i < E; i++) biasd[i] = p->with_bias ? bias[i] : 0.0;
    lk_poison(w, LK_F32, T * K);
    lk_poison(dx, p->dt, T * H);
    memset(ids, 0xff, sizeof(int32_t) * (size_t)(T * K));
    lk_moe_router_args a = p->opts;
    a.hidden = lk_tensor_2d(x, p->dt, T, H);
    a.gate_weight = lk_tensor_2d(wg, gdt, E, H);
    a.e_bias = lk_tensor_1d(p->with_bias ? bias : NULL, LK_F32, E);
    a.topk_ids = lk_tensor_2d(ids, LK_I32, T, K);
    a.topk_weights = lk_tensor_2d(w, LK_F32, T, K);
    a.aux_loss = lk_tensor_1d(&aux, LK_F32, 1);
    a.d_topk_weights = lk_tensor_2d(dwt, LK_F32, T, K);
    a.d_hidden = lk_tensor_2d(dx, p->dt, T, H);
    a.d_gate_weight = lk_tensor_2d(dgw, gdt, E, H);
    a.saved = (lk_saved){saved, sb};
    lk_place_tensor(&pl, "hidden", &a.hidden, 0);
    lk_place_tensor(&pl, "gate_weight", &a.gate_weight, 0);
    lk_place_tensor(&pl, "e_bias", &a.e_bias, 0);
    lk_place_tensor(&pl, "d_topk_weights", &a.d_topk_weights, 0);
    lk_place_tensor(&pl, "topk_ids", &a.topk_ids, 1);
    lk_place_tensor(&pl, "topk_weights", &a.topk_weights, 1);
    lk_place_tensor(&pl, "aux_loss", &a.aux_loss, 1);
    lk_place_tensor(&pl, "d_hidden", &a.d_hidden, 1);
    lk_place_tensor(&pl, "d_gate_weight", &a.d_gate_weight, 1);
    lk_place_saved(&pl, "saved", &a.saved, 0);
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if ((s = pl.status) || (s = lk_moe_router_forward(impl, &a, &ctx)) || (s = lk_moe_router_backward(impl, &a, &ctx)) ||
        (s = lk_place_fetch(&pl)))
        goto done;
    double *v = z + T * E, *sel = v + T * E, *wref = sel + T * E, *dwd = wref + T * K, *dxr = dwd + T * K, auxr;
    if (fake) {
        lk_moe_router_args b = a;
        b.topk_ids.data = ids2;
        b.topk_weights.data = w2;
        lk_place_tensor(&pl, "topk_ids", &b.topk_ids, 1);
        lk_place_tensor(&pl, "topk_weights", &b.topk_weights, 1);
        if ((s = pl.status) || (s = lk_moe_router_forward(impl, &b, &ctx)) || (s = lk_place_fetch(&pl))) goto done;
        er->weights = fake_errors(&a, ids, w, ids2, w2, T, E);
        er->dx = 0;
        for (int64_t i = 0; i < T * H; i++)
            if (lk_load(dx, p->dt, i) != 0.0) er->dx = INFINITY;
        goto done;
    }
    lk_moe_router_ref_scores(xd, wgd, biasd, T, H, E, kind, z, v, sel);
    er->choice_gap = lk_moe_router_ref_choice_gap(&a, sel, ids, T, E);
    if (isinf(er->choice_gap)) goto done;
    lk_moe_router_ref_forward(&a, v, ids, T, E, kind, wref, &auxr);
    double *wgot = malloc(sizeof(double) * (size_t)(T * K) + 8), *dgw_got = malloc(sizeof(double) * (size_t)(E * H) + 8);
    double *dxg = malloc(sizeof(double) * (size_t)(T * H) + 8);
    for (int64_t i = 0; i < T * K; i++) { wgot[i] = w[i]; dwd[i] = dwt[i]; }
    double *dgw_ref = dgw0d;        /* the backward adds to what the gradient held */
    dgw0d = NULL;
    lk_moe_router_ref_backward(&a, xd, wgd, v, ids, dwd, a.d_aux_loss, T, H, E, kind, dxr, dgw_ref);
    for (int64_t i = 0; i < E * H; i++) dgw_got[i] = lk_load(dgw, gdt, i);
    for (int64_t i = 0; i < T * H; i++) dxg[i] = lk_load(dx, p->dt, i);
    er->weights = lk_rel_err_f64(wgot, wref, T * K);
    er->aux = fabs(aux - auxr) / fmax(fabs(auxr), 1e-30);
    er->dx = lk_rel_err_f64(dxg, dxr, T * H);
    er->dwg = lk_rel_err_f64(dgw_got, dgw_ref, E * H);
    free(wgot); free(dgw_got); free(dxg); free(dgw_ref);
done:
    free(x); free(wg); free(dgw); free(bias); free(dwt); free(w); free(w2); free(ids); free(ids2); free(dx);
    free(saved); free(z); free(xd); free(wgd); free(dgw0d);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}

/* The options each router is checked with: Qwen3-MoE's normalized top-k with an aux
 * loss; DeepSeek-V3's bias, groups and route_scale; the fake gate with noise. */
static lk_moe_router_problem problem_of(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed) {
    lk_moe_router_problem p = {.t = shape->d[0], .h = shape->d[1], .e = shape->d[2], .dt = dt, .seed = seed};
    p.opts.top_k = (int)shape->d[3];
    p.opts.d_aux_loss = 0.01f;
    if (strcmp(impl->name, "softmax_topk") == 0) {
        p.opts.norm_topk_prob = (seed & 1) == 0;
    } else if (strcmp(impl->name, "sigmoid_bias") == 0) {
        p.with_bias = 1;
        p.opts.norm_topk_prob = 1;
        p.opts.route_scale = 2.5f;
        if (p.e % 4 == 0 && p.opts.top_k <= 2 * p.e / 4) p.opts.n_group = 4, p.opts.topk_group = 2;
    } else {
        p.opts.noise = (seed & 1) ? 0.3f : 0.0f;
    }
    return p;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    lk_check_row_begin(row, "moe_router", impl, dt, shape, lk_moe_router_tol(impl, dt));
    if (shape->ndim != 4) return lk_error(LK_EINVAL, "moe_router: check: expected a shape TxHxExk, got %s", row->shape);
    lk_moe_router_problem p = problem_of(impl, dt, shape, seed);
    lk_moe_router_errors e;
    lk_status s = lk_moe_router_check_case(impl, &p, &e);
    if (s) return s;
    lk_check_row_end(row, fmax(fmax(fmax(e.weights, e.aux), fmax(e.dx, e.dwg)), e.choice_gap));
    return LK_OK;
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_moe_router_args, lk_moe_router_forward, lk_moe_router_backward)

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    if (shape->ndim != 4) return lk_error(LK_EINVAL, "moe_router: bench: expected a size TxHxExk such as 8192x1024x64x8");
    lk_moe_router_problem p = problem_of(impl, dt, shape, 2);
    int64_t T = p.t, H = p.h, E = p.e, K = p.opts.top_k;
    size_t sb = 0;
    lk_status s = lk_moe_router_saved_bytes(impl, T, E, K, &sb);
    if (s) return s;
    lk_rng rng = lk_rng_make(1);
    void *x = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL), *wg = lk_random_tensor(&rng, dt, E * H, 0.05f, NULL);
    void *dx = malloc((size_t)(T * H) * lk_dtype_size(dt)), *saved = malloc(sb + 1);
    float *dgw = calloc((size_t)(E * H), 4), *bias = calloc((size_t)E, 4), *w = malloc(4 * (size_t)(T * K));
    float *dw = calloc((size_t)(T * K), 4), aux;
    int32_t *ids = malloc(4 * (size_t)(T * K));
    lk_arena arena = {0};
    if (!x || !wg || !dx || !saved || !dgw || !bias || !w || !dw || !ids) {
        s = lk_error(LK_ENOMEM, "moe_router: bench: out of memory");
        goto done;
    }
    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena), .a = p.opts};
    j.a.hidden = lk_tensor_2d(x, dt, T, H);
    j.a.gate_weight = lk_tensor_2d(wg, dt, E, H);
    j.a.e_bias = lk_tensor_1d(p.with_bias ? bias : NULL, LK_F32, E);
    j.a.topk_ids = lk_tensor_2d(ids, LK_I32, T, K);
    j.a.topk_weights = lk_tensor_2d(w, LK_F32, T, K);
    j.a.aux_loss = lk_tensor_1d(&aux, LK_F32, 1);
    j.a.d_topk_weights = lk_tensor_2d(dw, LK_F32, T, K);
    j.a.d_hidden = lk_tensor_2d(dx, dt, T, H);
    j.a.d_gate_weight = lk_tensor_2d(dgw, LK_F32, E, H);
    j.a.saved = (lk_saved){saved, sb};
    double f = 2.0 * (double)T * (double)H * (double)E;
    lk_bench_spec spec = {.op = "moe_router", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd, .bwd = run_bwd,
                          .job = &j, .flops = {f, 2 * f}, .arena = &arena, .extra_bytes = sb};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(x); free(wg); free(dx); free(saved); free(dgw); free(bias); free(w); free(dw); free(ids);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {4, {1, 8, 4, 1}}, {4, {13, 19, 8, 2}}, {4, {37, 16, 64, 8}}, {4, {100, 24, 12, 3}}, {4, {64, 32, 128, 8}},
};

const lk_harness lk_moe_router_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {4, {8192, 1024, 64, 8}},
    .dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16),
};
