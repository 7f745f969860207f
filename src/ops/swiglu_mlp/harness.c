/* harness.c — the SwiGLU MLP for `llmkern check` and `llmkern bench`
 * (lk_swiglu_mlp_harness, named by its descriptor, def.c), and the comparison
 * tests/test_swiglu_mlp.c runs (check.h). check: one implementation against the float64
 * reference on fresh random inputs; bench: forward, backward and both, GFLOP/s of the
 * three GEMMs (twice that backward) against the measured GEMM rate, and the extra
 * memory held (saved + workspace). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/swiglu_mlp.h"
#include "ops/swiglu_mlp/check.h"
#include "ops/swiglu_mlp/reference.h"

/* Tolerances on max|got − ref| / max|ref|, worst of out, dx and the weight gradients.
 * f32: f32 GEMMs over ≤ ~3k terms (~1e-6 of max|ref|), an exp good to 2e-7, and the
 *   error of gate/up carried through two more GEMMs: a few 1e-6. 2e-5 still catches a
 *   wrong derivative, a lost clamp or a missed accumulation (errors of 1e-2 and up).
 * bf16, fused: gate_up is rounded once to bf16 (2^-9 of an element) and everything
 *   after it stays f32 until the outputs are rounded once: ~4e-3 of max|ref| worst. 1e-2.
 * bf16, eager: gate, up, silu, h and backward dh, d_silu, d_up, d_gate are each rounded
 *   to bf16 as a framework's tensors are; up to four roundings on a path, 2^-9 each,
 *   mostly averaged out by the GEMM sums that follow: 2e-2. */
static const lk_tol tols[] = {
    {"eager", LK_BF16, 2e-2},
    {NULL, LK_F32, 2e-5},
    {NULL, LK_BF16, 1e-2},
};

double lk_swiglu_mlp_tol(const lk_impl *impl, lk_dtype dt) {
    return lk_tol_find(tols, sizeof tols / sizeof *tols, impl, dt, 2e-2);
}

#define RAND(var, dtype, n, std) void *var = lk_random_tensor(&rng, dtype, n, std, &var##_d)

lk_status lk_swiglu_mlp_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                                   const lk_swiglu_mlp_case *c, lk_check_row *row, lk_swiglu_mlp_errors *err) {
    static const lk_swiglu_mlp_case defaults = {0};
    if (!c) c = &defaults;
    lk_check_row_begin(row, "swiglu_mlp", impl, dt, shape, impl ? lk_swiglu_mlp_tol(impl, dt) : 0.0);
    if (shape->ndim < 3)
        return lk_error(LK_EINVAL, "swiglu_mlp: check: expected a shape [..., H, I], got %s", row->shape);
    int xnd = shape->ndim - 1, calls = c->backward_calls > 1 ? 2 : 1, want_w = !c->no_weight_grads;
    int64_t H = shape->d[xnd - 1], I = shape->d[xnd], T = lk_shape_numel(shape) / (H * I);
    int64_t gus[2] = {2 * I, H}, dws[2] = {H, I};
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    lk_tensor xt = lk_tensor_view(NULL, dt, xnd, shape->d), gut = lk_tensor_view(NULL, dt, 2, gus);
    size_t saved_bytes = 0, esz = lk_dtype_size(dt), tb = (size_t)(T * H) * esz;
    lk_placement pl;
    lk_place_begin(&pl, "swiglu_mlp", impl);        /* a failure is kept in pl.status */
    lk_place_tensor(&pl, "x", &xt, 0);              /* no data: only their device, for the query */
    lk_place_tensor(&pl, "gate_up_weight", &gut, 0);
    lk_status s = lk_swiglu_mlp_saved_bytes(impl, &xt, &gut, &saved_bytes);
    if (s) return s;

    lk_rng rng = lk_rng_make(seed);
    double *x_d = NULL, *wgu_d = NULL, *wd_d = NULL, *dout_d = NULL, *dgu0_d = NULL, *dd0_d = NULL;
    RAND(x, dt, T * H, 1.0f);
    RAND(wgu, dt, 2 * I * H, 1.0f / sqrtf((float)H));   /* gate and up ~ N(0, 1) */
    RAND(wd, dt, H * I, 1.0f / sqrtf((float)I));
    RAND(dout, dt, T * H, 1.0f);
    RAND(dgu0, gdt, 2 * I * H, 0.5f);                   /* what the gradients held before */
    RAND(dd0, gdt, H * I, 0.5f);
    void *out = malloc(tb), *dx = malloc(tb), *saved = malloc(saved_bytes ? saved_bytes : 1);
    void *dgu = malloc((size_t)(2 * I * H) * lk_dtype_size(gdt)), *dd = malloc((size_t)(H * I) * lk_dtype_size(gdt));
    double *ref = malloc(sizeof(double) * (size_t)(2 * T * H));
    lk_arena arena = {0};
    if (!x || !wgu || !wd || !dout || !dgu0 || !dd0 || !out || !dx || !saved || !dgu || !dd || !ref) {
        s = lk_error(LK_ENOMEM, "swiglu_mlp: check: out of memory for shape %s", row->shape);
        goto done;
    }
    double *oref = ref, *dxref = ref + T * H;
    float limit = c->swiglu_limit > 0 ? (float)lk_swiglu_mlp_ref_limit(c->swiglu_limit, x_d, wgu_d, T, H, I) : c->swiglu_limit;
    lk_swiglu_mlp_ref_forward(x_d, wgu_d, wd_d, T, H, I, limit, oref);
    for (int k = 0; k < calls; k++)     /* dgu0_d, dd0_d become the expected gradients */
        lk_swiglu_mlp_ref_backward(x_d, wgu_d, wd_d, dout_d, T, H, I, limit, dxref, dgu0_d, dd0_d);

    lk_poison(out, dt, T * H);
    lk_poison(dx, dt, T * H);
    memset(saved, 0xff, saved_bytes);       /* NaN in f32 and bf16 alike */
    memcpy(dgu, dgu0, (size_t)(2 * I * H) * lk_dtype_size(gdt));
    memcpy(dd, dd0, (size_t)(H * I) * lk_dtype_size(gdt));
    lk_swiglu_mlp_args a = {
        .x = lk_tensor_view(x, dt, xnd, shape->d), .gate_up_weight = lk_tensor_view(wgu, dt, 2, gus),
        .down_weight = lk_tensor_view(wd, dt, 2, dws), .out = lk_tensor_view(out, dt, xnd, shape->d),
        .dout = lk_tensor_view(dout, dt, xnd, shape->d), .dx = lk_tensor_view(dx, dt, xnd, shape->d),
        .d_gate_up_weight = lk_tensor_view(want_w ? dgu : NULL, gdt, 2, gus),
        .d_down_weight = lk_tensor_view(want_w ? dd : NULL, gdt, 2, dws),
        .saved = {saved, saved_bytes}, .swiglu_limit = limit,
    };
    lk_place_tensors(&pl, LK_TENSORS({"x", &a.x}, {"gate_up_weight", &a.gate_up_weight},
                                     {"down_weight", &a.down_weight}, {"dout", &a.dout}), 0);
    lk_place_tensors(&pl, LK_TENSORS({"out", &a.out}, {"dx", &a.dx}, {"d_gate_up_weight", &a.d_gate_up_weight},
                                     {"d_down_weight", &a.d_down_weight}), 1);
    lk_place_saved(&pl, "saved", &a.saved, 0);
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    lk_swiglu_mlp_args alone = a;
    alone.out.data = NULL;
    if ((s = pl.status) || (s = lk_swiglu_mlp_forward(impl, c->saved_alone ? &alone : &a, &ctx))) goto done;
    for (int k = 0; k < calls; k++)
        if ((s = lk_swiglu_mlp_backward(impl, &a, &ctx))) goto done;
    if ((c->saved_alone && (s = lk_swiglu_mlp_forward(impl, &a, &ctx))) || (s = lk_place_fetch(&pl))) goto done;

    lk_swiglu_mlp_errors e = {
        .out = lk_rel_err(out, dt, oref, T * H),
        .dx = lk_rel_err(dx, dt, dxref, T * H),
        .d_gate_up_weight = want_w ? lk_rel_err(dgu, gdt, dgu0_d, 2 * I * H) : 0.0,
        .d_down_weight = want_w ? lk_rel_err(dd, gdt, dd0_d, H * I) : 0.0,
    };
    lk_check_row_end(row, fmax(fmax(e.out, e.dx), fmax(e.d_gate_up_weight, e.d_down_weight)));
    if (err) *err = e;
done:
    free(x); free(wgu); free(wd); free(dout); free(dgu0); free(dd0); free(out); free(dx); free(saved);
    free(dgu); free(dd); free(ref);
    free(x_d); free(wgu_d); free(wd_d); free(dout_d); free(dgu0_d); free(dd0_d);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    return lk_swiglu_mlp_check_case(impl, dt, shape, seed, NULL, row, NULL);
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_swiglu_mlp_args, lk_swiglu_mlp_forward, lk_swiglu_mlp_backward)

/* The bench shape is T x H x I; weight gradients in f32 (the master-gradient buffers of
 * mixed precision), so peak_bytes counts what the implementation itself adds. */
static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    if (shape->ndim != 3)
        return lk_error(LK_EINVAL, "swiglu_mlp: bench: expected a size TxHxI such as 4096x1024x2816");
    int64_t T = shape->d[0], H = shape->d[1], I = shape->d[2];
    size_t esz = lk_dtype_size(dt), saved_bytes = 0;
    lk_tensor xt = lk_tensor_2d(NULL, dt, T, H), gut = lk_tensor_2d(NULL, dt, 2 * I, H);
    lk_status s = lk_swiglu_mlp_saved_bytes(impl, &xt, &gut, &saved_bytes);
    if (s) return s;
    lk_rng rng = lk_rng_make(1);
    void *x = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL);
    void *wgu = lk_random_tensor(&rng, dt, 2 * I * H, 1.0f / sqrtf((float)H), NULL);
    void *wd = lk_random_tensor(&rng, dt, H * I, 1.0f / sqrtf((float)I), NULL);
    void *dout = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL);
    void *out = calloc((size_t)(T * H), esz), *dx = calloc((size_t)(T * H), esz), *saved = calloc(saved_bytes, 1);
    float *dgu = calloc((size_t)(2 * I * H), sizeof(float)), *dd = calloc((size_t)(H * I), sizeof(float));
    lk_arena arena = {0};
    if (!x || !wgu || !wd || !dout || !out || !dx || !saved || !dgu || !dd) {
        s = lk_error(LK_ENOMEM, "swiglu_mlp: bench: out of memory for shape %lldx%lldx%lld", (long long)T,
                     (long long)H, (long long)I);
        goto done;
    }
    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena)};
    j.a = (lk_swiglu_mlp_args){
        .x = lk_tensor_2d(x, dt, T, H), .gate_up_weight = lk_tensor_2d(wgu, dt, 2 * I, H),
        .down_weight = lk_tensor_2d(wd, dt, H, I), .out = lk_tensor_2d(out, dt, T, H),
        .dout = lk_tensor_2d(dout, dt, T, H), .dx = lk_tensor_2d(dx, dt, T, H),
        .d_gate_up_weight = lk_tensor_2d(dgu, LK_F32, 2 * I, H), .d_down_weight = lk_tensor_2d(dd, LK_F32, H, I),
        .saved = {saved, saved_bytes},
    };
    if ((s = lk_swiglu_mlp_forward(impl, &j.a, &j.ctx)) || (s = lk_swiglu_mlp_backward(impl, &j.a, &j.ctx)))
        goto done;
    double f = 2.0 * (double)T * (double)H * (double)(2 * I) + 2.0 * (double)T * (double)I * (double)H;
    lk_bench_spec spec = {.op = "swiglu_mlp", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                                .bwd = run_bwd, .job = &j, .flops = {f, 2 * f}, .arena = &arena,
                                .extra_bytes = saved_bytes};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(x); free(wgu); free(wd); free(dout); free(out); free(dx); free(saved); free(dgu); free(dd);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {3, {1, 1, 1}}, {3, {1, 16, 8}}, {3, {13, 19, 11}}, {4, {2, 3, 8, 5}}, {3, {64, 128, 96}}, {3, {256, 256, 704}},
};

const lk_harness lk_swiglu_mlp_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {3, {4096, 1024, 2816}},
};
