/* harness_experts.c — the MoE experts for `llmkern check` / `llmkern bench`
 * (lk_moe_experts_harness, named by its descriptor, def.c) and the runs
 * tests/test_moe.c compares (check.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/moe/check.h"
#include "ops/moe/reference.h"

/* Tolerances on max|got − ref| / max|ref|, worst of out, d_hidden, d_topk_weights and
 * the weight gradients.
 * f32: f32 GEMMs over at most a few hundred terms and a 2e-7 exp: ~1e-6. 2e-5 still
 *   catches a lost route, a wrong weight or a missed accumulation (errors of 1e-2 up).
 * bf16, fused: gate_up rounded once to bf16 (2^-9), everything after in f32 until the
 *   outputs are rounded once: ~5e-3 worst. 1.5e-2.
 * bf16, eager: x rows, gate_up, h, y, dy, dh, d_gate_up, d_rows each rounded to bf16 as
 *   a framework's tensors are: up to five roundings on a path. 3e-2. */
double lk_moe_experts_tol(const lk_impl *impl, lk_dtype dt) {
    if (dt == LK_F32) return 2e-5;
    return strcmp(impl->name, "eager") == 0 ? 3e-2 : 1.5e-2;
}

typedef struct {
    void *x, *wgu, *wd, *dout, *dgu0, *dd0;
    double *xd, *wgud, *wdd, *doutd, *dgu0d, *dd0d;
    int32_t *ids;
    float *w;
    double *wdbl;
} inputs;

static void inputs_free(inputs *in) {
    free(in->x); free(in->wgu); free(in->wd); free(in->dout); free(in->dgu0); free(in->dd0);
    free(in->xd); free(in->wgud); free(in->wdd); free(in->doutd); free(in->dgu0d); free(in->dd0d);
    free(in->ids); free(in->w); free(in->wdbl);
}

static lk_status make_inputs(const lk_moe_experts_problem *p, inputs *in) {
    memset(in, 0, sizeof *in);
    lk_rng rng = lk_rng_make(p->seed);
    int64_t R = p->t * p->k;
    lk_dtype gdt = p->grad_f32 ? LK_F32 : p->dt;
    in->x = lk_random_tensor(&rng, p->dt, p->t * p->h, 1.0f, &in->xd);
    in->wgu = lk_random_tensor(&rng, p->dt, p->e * 2 * p->i * p->h, 1.0f / sqrtf((float)p->h), &in->wgud);
    in->wd = lk_random_tensor(&rng, p->dt, p->e * p->h * p->i, 1.0f / sqrtf((float)p->i), &in->wdd);
    in->dout = lk_random_tensor(&rng, p->dt, p->t * p->h, 1.0f, &in->doutd);
    in->dgu0 = lk_random_tensor(&rng, gdt, p->e * 2 * p->i * p->h, 0.5f, &in->dgu0d);
    in->dd0 = lk_random_tensor(&rng, gdt, p->e * p->h * p->i, 0.5f, &in->dd0d);
    in->ids = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    in->w = malloc(sizeof(float) * (size_t)(R > 0 ? R : 1));
    in->wdbl = malloc(sizeof(double) * (size_t)(R > 0 ? R : 1));
    if (!in->x || !in->wgu || !in->wd || !in->dout || !in->dgu0 || !in->dd0 || !in->ids || !in->w || !in->wdbl)
        return lk_error(LK_ENOMEM, "moe_experts: check: out of memory");
    if (p->write_grads) {   /* written, not added: whatever was there must not show */
        int64_t ngu = p->e * 2 * p->i * p->h, nd = p->e * p->h * p->i;
        lk_poison(in->dgu0, gdt, ngu), lk_poison(in->dd0, gdt, nd);
        memset(in->dgu0d, 0, sizeof(double) * (size_t)ngu), memset(in->dd0d, 0, sizeof(double) * (size_t)nd);
    }
    int64_t span = p->dup_routes && p->e > 1 ? (p->e + 1) / 2 : p->e;
    for (int64_t tok = 0; tok < p->t; tok++)
        for (int64_t j = 0; j < p->k; j++) {
            uint64_t b = lk_rng_bits(p->seed ^ 0x5eedu, (uint64_t)(tok * p->k + j));
            int32_t id = (int32_t)(b % (uint64_t)span);
            if (!p->dup_routes)          /* distinct within the token: the next free expert */
                for (int again = 1; again;) {
                    again = 0;
                    for (int64_t l = 0; l < j; l++)
                        if (in->ids[tok * p->k + l] == id) { id = (int32_t)((id + 1) % p->e); again = 1; }
                }
            in->ids[tok * p->k + j] = id;
            in->w[tok * p->k + j] = 0.1f + (float)(b >> 40) * 0x1p-24f;
            in->wdbl[tok * p->k + j] = in->w[tok * p->k + j];
        }
    return LK_OK;
}

static double *to_double(const void *src, lk_dtype dt, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; d && i < n; i++) d[i] = lk_load(src, dt, i);
    return d;
}

lk_status lk_moe_experts_run(const lk_impl *impl, const lk_moe_experts_problem *p, lk_moe_experts_result *r) {
    memset(r, 0, sizeof *r);
    inputs in;
    lk_status s = make_inputs(p, &in);
    int64_t T = p->t, H = p->h, I = p->i, E = p->e, K = p->k;
    lk_dtype gdt = p->grad_f32 ? LK_F32 : p->dt;
    size_t esz = lk_dtype_size(p->dt), sb = 0;
    if (!s) s = lk_moe_experts_saved_bytes(impl, T, K, E, H, I, p->dt, &sb);
    void *out = malloc((size_t)(T * H) * esz + 1), *dx = malloc((size_t)(T * H) * esz + 1), *saved = malloc(sb + 1);
    float *dw = malloc(sizeof(float) * (size_t)(T * K) + 1);
    lk_arena arena = {0};
    lk_placement pl;
    lk_place_begin(&pl, "moe_experts", impl);       /* a failure is kept in pl.status */
    if (!s && (!out || !dx || !saved || !dw)) s = lk_error(LK_ENOMEM, "moe_experts: check: out of memory");
    if (!s) {
        lk_poison(out, p->dt, T * H);
        lk_poison(dx, p->dt, T * H);
        lk_poison(dw, LK_F32, T * K);
        memset(saved, 0xff, sb);
        int64_t gus[3] = {E, 2 * I, H}, dws[3] = {E, H, I};
        lk_moe_experts_args a = {
            .hidden = lk_tensor_2d(in.x, p->dt, T, H), .topk_ids = lk_tensor_2d(in.ids, LK_I32, T, K),
            .topk_weights = lk_tensor_2d(in.w, LK_F32, T, K), .gate_up_weight = lk_tensor_view(in.wgu, p->dt, 3, gus),
            .down_weight = lk_tensor_view(in.wd, p->dt, 3, dws), .out = lk_tensor_2d(out, p->dt, T, H),
            .dout = lk_tensor_2d(in.dout, p->dt, T, H), .d_hidden = lk_tensor_2d(dx, p->dt, T, H),
            .d_topk_weights = lk_tensor_2d(dw, LK_F32, T, K),
            .d_gate_up_weight = lk_tensor_view(in.dgu0, gdt, 3, gus), .d_down_weight = lk_tensor_view(in.dd0, gdt, 3, dws),
            .saved = {saved, sb}, .write_weight_grads = p->write_grads,
        };
        lk_place_tensor(&pl, "hidden", &a.hidden, 0);
        lk_place_tensor(&pl, "topk_ids", &a.topk_ids, 0);
        lk_place_tensor(&pl, "topk_weights", &a.topk_weights, 0);
        lk_place_tensor(&pl, "gate_up_weight", &a.gate_up_weight, 0);
        lk_place_tensor(&pl, "down_weight", &a.down_weight, 0);
        lk_place_tensor(&pl, "dout", &a.dout, 0);
        lk_place_tensor(&pl, "out", &a.out, 1);
        lk_place_tensor(&pl, "d_hidden", &a.d_hidden, 1);
        lk_place_tensor(&pl, "d_topk_weights", &a.d_topk_weights, 1);
        lk_place_tensor(&pl, "d_gate_up_weight", &a.d_gate_up_weight, 1);
        lk_place_tensor(&pl, "d_down_weight", &a.d_down_weight, 1);
        lk_place_saved(&pl, "saved", &a.saved, 0);
        lk_ctx ctx = lk_place_ctx(&pl, &arena);
        lk_moe_experts_args alone = a;
        alone.out.data = NULL;
        if (!(s = pl.status) && !(s = lk_moe_experts_forward(impl, p->saved_alone ? &alone : &a, &ctx)) &&
            !(s = lk_moe_experts_backward(impl, &a, &ctx)) &&
            !(p->saved_alone && (s = lk_moe_experts_forward(impl, &a, &ctx))) && !(s = lk_place_fetch(&pl))) {
            r->out = to_double(out, p->dt, T * H);
            r->dx = to_double(dx, p->dt, T * H);
            r->dw = to_double(dw, LK_F32, T * K);
            r->dgu = to_double(in.dgu0, gdt, E * 2 * I * H);
            r->dd = to_double(in.dd0, gdt, E * H * I);
        }
    }
    free(out); free(dx); free(saved); free(dw);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    inputs_free(&in);
    return s;
}

lk_status lk_moe_experts_run_ref(const lk_moe_experts_problem *p, lk_moe_experts_result *r) {
    memset(r, 0, sizeof *r);
    inputs in;
    lk_status s = make_inputs(p, &in);
    int64_t T = p->t, H = p->h, I = p->i, E = p->e, K = p->k;
    if (!s) {
        r->out = malloc(sizeof(double) * (size_t)(T * H + 1));
        r->dx = malloc(sizeof(double) * (size_t)(T * H + 1));
        r->dw = malloc(sizeof(double) * (size_t)(T * K + 1));
        r->dgu = in.dgu0d;          /* the backward adds to what the gradients held */
        r->dd = in.dd0d;
        in.dgu0d = in.dd0d = NULL;
        if (!r->out || !r->dx || !r->dw || !r->dgu || !r->dd) s = lk_error(LK_ENOMEM, "moe_experts: check: out of memory");
    }
    if (!s) {
        lk_moe_experts_ref_forward(in.xd, in.ids, in.wdbl, in.wgud, in.wdd, T, K, E, H, I, r->out);
        lk_moe_experts_ref_backward(in.xd, in.ids, in.wdbl, in.wgud, in.wdd, in.doutd, T, K, E, H, I, r->dx, r->dw,
                                    r->dgu, r->dd);
    }
    inputs_free(&in);
    return s;
}

void lk_moe_experts_result_free(lk_moe_experts_result *r) {
    free(r->out); free(r->dx); free(r->dw); free(r->dgu); free(r->dd);
    memset(r, 0, sizeof *r);
}

double lk_moe_experts_diff(const lk_moe_experts_result *got, const lk_moe_experts_result *want,
                           const lk_moe_experts_problem *p, lk_moe_experts_errors *e) {
    if (!got->out || !want->out) return INFINITY;
    lk_moe_experts_errors x = {
        .out = lk_rel_err_f64(got->out, want->out, p->t * p->h),
        .dx = lk_rel_err_f64(got->dx, want->dx, p->t * p->h),
        .dw = lk_rel_err_f64(got->dw, want->dw, p->t * p->k),
        .dgu = lk_rel_err_f64(got->dgu, want->dgu, p->e * 2 * p->i * p->h),
        .dd = lk_rel_err_f64(got->dd, want->dd, p->e * p->h * p->i),
    };
    if (e) *e = x;
    return fmax(fmax(fmax(x.out, x.dx), fmax(x.dw, x.dgu)), x.dd);
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    lk_check_row_begin(row, "moe_experts", impl, dt, shape, lk_moe_experts_tol(impl, dt));
    if (shape->ndim != 5) return lk_error(LK_EINVAL, "moe_experts: check: expected a shape TxHxIxExk, got %s", row->shape);
    lk_moe_experts_problem p = {.t = shape->d[0], .h = shape->d[1], .i = shape->d[2], .e = shape->d[3],
                                .k = shape->d[4], .dt = dt, .seed = seed, .dup_routes = (seed & 1) != 0};
    lk_moe_experts_result got, want;
    lk_status s = lk_moe_experts_run(impl, &p, &got);
    if (!s) s = lk_moe_experts_run_ref(&p, &want);
    if (!s) {
        lk_check_row_end(row, lk_moe_experts_diff(&got, &want, &p, NULL));
        lk_moe_experts_result_free(&want);
    }
    lk_moe_experts_result_free(&got);
    return s;
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_moe_experts_args, lk_moe_experts_forward, lk_moe_experts_backward)

/* T x H x I x E x k with the fake gate's balanced routing (noise 0) so eager and fused
 * see the same loads; weight gradients in f32 (mixed precision's master gradients). */
static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    if (shape->ndim != 5) return lk_error(LK_EINVAL, "moe_experts: bench: expected a size TxHxIxExk such as 8192x1024x512x64x8");
    int64_t T = shape->d[0], H = shape->d[1], I = shape->d[2], E = shape->d[3], K = shape->d[4], R = T * K;
    if (K > E) return lk_error(LK_EINVAL, "moe_experts: bench: expected k <= E, got k %lld E %lld", (long long)K, (long long)E);
    size_t esz = lk_dtype_size(dt), sb = 0;
    lk_status s = lk_moe_experts_saved_bytes(impl, T, K, E, H, I, dt, &sb);
    if (s) return s;
    lk_rng rng = lk_rng_make(1);
    void *x = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL), *dout = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL);
    void *wgu = lk_random_tensor(&rng, dt, E * 2 * I * H, 1.0f / sqrtf((float)H), NULL);
    void *wd = lk_random_tensor(&rng, dt, E * H * I, 1.0f / sqrtf((float)I), NULL);
    void *out = calloc((size_t)(T * H), esz), *dx = calloc((size_t)(T * H), esz), *saved = malloc(sb + 1);
    float *dgu = calloc((size_t)(E * 2 * I * H), 4), *dd = calloc((size_t)(E * H * I), 4);
    float *w = malloc(sizeof(float) * (size_t)R), *dw = malloc(sizeof(float) * (size_t)R);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)R);
    lk_arena arena = {0};
    if (!x || !dout || !wgu || !wd || !out || !dx || !saved || !dgu || !dd || !w || !dw || !ids) {
        s = lk_error(LK_ENOMEM, "moe_experts: bench: out of memory");
        goto done;
    }
    for (int64_t r = 0; r < R; r++) {
        ids[r] = (int32_t)(r % E);
        w[r] = 1.0f / (float)K;
    }
    int64_t gus[3] = {E, 2 * I, H}, dws[3] = {E, H, I};
    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena)};
    j.a = (lk_moe_experts_args){
        .hidden = lk_tensor_2d(x, dt, T, H), .topk_ids = lk_tensor_2d(ids, LK_I32, T, K),
        .topk_weights = lk_tensor_2d(w, LK_F32, T, K), .gate_up_weight = lk_tensor_view(wgu, dt, 3, gus),
        .down_weight = lk_tensor_view(wd, dt, 3, dws), .out = lk_tensor_2d(out, dt, T, H),
        .dout = lk_tensor_2d(dout, dt, T, H), .d_hidden = lk_tensor_2d(dx, dt, T, H),
        .d_topk_weights = lk_tensor_2d(dw, LK_F32, T, K), .d_gate_up_weight = lk_tensor_view(dgu, LK_F32, 3, gus),
        .d_down_weight = lk_tensor_view(dd, LK_F32, 3, dws), .saved = {saved, sb},
    };
    double f = 2.0 * (double)R * (double)H * (double)(3 * I);      /* gate_up + down per route */
    lk_bench_spec spec = {.op = "moe_experts", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                          .bwd = run_bwd, .job = &j, .flops = {f, 2 * f}, .arena = &arena, .extra_bytes = sb};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(x); free(dout); free(wgu); free(wd); free(out); free(dx); free(saved); free(dgu); free(dd);
    free(w); free(dw); free(ids);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {5, {1, 8, 4, 1, 1}}, {5, {13, 19, 11, 8, 2}}, {5, {37, 16, 8, 8, 8}}, {5, {64, 32, 24, 64, 8}},
    {5, {200, 24, 16, 7, 3}},
};

const lk_harness lk_moe_experts_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {5, {8192, 1024, 512, 64, 8}},
    .dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16),
};
