/* harness.c — linear for `llmkern check` and `llmkern bench` (lk_linear_harness,
 * named by its descriptor, def.c), and the comparison tests/test_linear.c runs (check.h).
 * check: one implementation against the float64 reference on fresh random inputs;
 * bench: forward, backward and both, GFLOP/s against the measured GEMM rate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/linear.h"
#include "ops/linear/check.h"
#include "ops/linear/reference.h"

/* Tolerances on max|got − ref| / max|ref|, worst of y, dx, dweight and dbias.
 * f32: sgemm sums ≤ ~4k products in f32; blocked summation keeps the error near
 *   sqrt(k)·6e-8 of the terms, ~1e-6 of max|ref|. 1e-5 still catches a missing bias,
 *   a lost accumulation or a transposed operand (errors of O(1)).
 * bf16: the inputs are the same bf16 values for both sides; every output is rounded
 *   once to bf16 (half an ulp: 2^-9 = 2e-3 of the element), gradients once per call
 *   after summing in f32 (two rounded calls: 4e-3). 1e-2. */
static const struct {
    lk_dtype dt;
    double tol;
} tols[] = {{LK_F32, 1e-5}, {LK_BF16, 1e-2}};

double lk_linear_tol(const lk_impl *impl, lk_dtype dt) {
    for (size_t i = 0; i < sizeof tols / sizeof *tols; i++)
        if (tols[i].dt == dt) return tols[i].tol;
    return 1e-2;
}

/* A buffer of n random values in dt, its double copy in *ref (same values). */
#define RAND(var, dtype, n, std) void *var = lk_random_tensor(&rng, dtype, n, std, &var##_d)

lk_status lk_linear_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                               const lk_linear_case *c, lk_check_row *row, lk_linear_errors *err) {
    static const lk_linear_case defaults = {0};
    if (!c) c = &defaults;
    lk_check_row_begin(row, "linear", impl, dt, shape, impl ? lk_linear_tol(impl, dt) : 0.0);
    if (shape->ndim < 2)
        return lk_error(LK_EINVAL, "linear: check: expected a shape [..., I, O], got %s", row->shape);
    int xnd = shape->ndim - 1, calls = c->backward_calls > 1 ? 2 : 1;
    int64_t in = shape->d[xnd - 1], out = shape->d[xnd], rows = lk_shape_numel(shape) / (in * out);
    int64_t xs[LK_MAX_DIMS], ws[2] = {out, in};
    memcpy(xs, shape->d, sizeof xs);
    int64_t ys[LK_MAX_DIMS];
    memcpy(ys, xs, sizeof ys);
    ys[xnd - 1] = out;
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    int has_b = !c->no_bias, want_dx = !c->no_dx;

    lk_placement pl;
    lk_place_begin(&pl, "linear", impl);
    lk_rng rng = lk_rng_make(seed);
    double *x_d = NULL, *w_d = NULL, *b_d = NULL, *dy_d = NULL, *dw0_d = NULL, *db0_d = NULL;
    RAND(x, dt, rows * in, 1.0f);
    RAND(w, dt, out * in, 1.0f);
    RAND(b, dt, out, 1.0f);
    RAND(dy, dt, rows * out, 1.0f);
    RAND(dw0, gdt, out * in, 1.0f);     /* what the gradients held before: must be added to */
    RAND(db0, gdt, out, 1.0f);
    size_t esz = lk_dtype_size(dt), gsz = lk_dtype_size(gdt);
    void *y = malloc((size_t)(rows * out) * esz + 1), *dx = malloc((size_t)(rows * in) * esz + 1);
    void *dw = malloc((size_t)(out * in) * gsz), *db = malloc((size_t)out * gsz);
    double *ref = malloc(sizeof(double) * (size_t)(rows * out + rows * in + 1));
    lk_arena arena = {0};
    lk_status s = LK_OK;
    if (!x || !w || !b || !dy || !dw0 || !db0 || !y || !dx || !dw || !db || !ref) {
        s = lk_error(LK_ENOMEM, "linear: check: out of memory for shape %s", row->shape);
        goto done;
    }
    double *yref = ref, *dxref = ref + rows * out;
    lk_linear_ref_forward(x_d, w_d, has_b ? b_d : NULL, rows, in, out, yref);
    for (int k = 0; k < calls; k++)     /* dw0_d, db0_d become the expected gradients */
        lk_linear_ref_backward(x_d, w_d, dy_d, rows, in, out, dxref, dw0_d, has_b ? db0_d : NULL);

    lk_poison(y, dt, rows * out);
    lk_poison(dx, dt, rows * in);
    memcpy(dw, dw0, (size_t)(out * in) * gsz);
    memcpy(db, db0, (size_t)out * gsz);
    lk_linear_args a = {
        .x = lk_tensor_view(x, dt, xnd, xs), .weight = lk_tensor_view(w, dt, 2, ws),
        .bias = lk_tensor_1d(has_b ? b : NULL, dt, out), .y = lk_tensor_view(y, dt, xnd, ys),
        .dy = lk_tensor_view(dy, dt, xnd, ys), .dx = lk_tensor_view(want_dx ? dx : NULL, dt, xnd, xs),
        .dweight = lk_tensor_view(dw, gdt, 2, ws), .dbias = lk_tensor_1d(has_b ? db : NULL, gdt, out),
    };
    lk_place_tensors(&pl, LK_TENSORS({"x", &a.x}, {"weight", &a.weight}, {"bias", &a.bias}, {"dy", &a.dy}), 0);
    lk_place_tensors(&pl, LK_TENSORS({"y", &a.y}, {"dx", &a.dx}, {"dweight", &a.dweight}, {"dbias", &a.dbias}), 1);
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if ((s = pl.status) || (s = lk_linear_forward(impl, &a, &ctx))) goto done;
    for (int k = 0; k < calls; k++)
        if ((s = lk_linear_backward(impl, &a, &ctx))) goto done;
    if ((s = lk_place_fetch(&pl))) goto done;

    lk_linear_errors e = {
        .y = lk_rel_err(y, dt, yref, rows * out),
        .dx = want_dx ? lk_rel_err(dx, dt, dxref, rows * in) : 0.0,
        .dweight = lk_rel_err(dw, gdt, dw0_d, out * in),
        .dbias = has_b ? lk_rel_err(db, gdt, db0_d, out) : 0.0,
    };
    lk_check_row_end(row, fmax(fmax(e.y, e.dx), fmax(e.dweight, e.dbias)));
    if (err) *err = e;
done:
    free(x); free(w); free(b); free(dy); free(dw0); free(db0); free(y); free(dx); free(dw); free(db); free(ref);
    free(x_d); free(w_d); free(b_d); free(dy_d); free(dw0_d); free(db0_d);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    return lk_linear_check_case(impl, dt, shape, seed, NULL, row, NULL);
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_linear_args, lk_linear_forward, lk_linear_backward)

/* The bench shape is T x I x O; no bias (as in the transformer's projections) and f32
 * gradients (the usual master-gradient buffers of mixed precision). */
static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    if (shape->ndim != 3)
        return lk_error(LK_EINVAL, "linear: bench: expected a size TxIxO such as 4096x1024x4096");
    int64_t t = shape->d[0], in = shape->d[1], out = shape->d[2];
    size_t esz = lk_dtype_size(dt);
    lk_rng rng = lk_rng_make(1);
    void *x = lk_random_tensor(&rng, dt, t * in, 1.0f, NULL), *w = lk_random_tensor(&rng, dt, out * in, 0.03f, NULL);
    void *dy = lk_random_tensor(&rng, dt, t * out, 1.0f, NULL);
    void *y = calloc((size_t)(t * out), esz), *dx = calloc((size_t)(t * in), esz);
    float *dw = calloc((size_t)(out * in), sizeof(float));
    lk_arena arena = {0};
    lk_status s = LK_OK;
    if (!x || !w || !dy || !y || !dx || !dw) {
        s = lk_error(LK_ENOMEM, "linear: bench: out of memory for shape %lldx%lldx%lld", (long long)t,
                     (long long)in, (long long)out);
        goto done;
    }
    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena)};
    j.a = (lk_linear_args){
        .x = lk_tensor_2d(x, dt, t, in), .weight = lk_tensor_2d(w, dt, out, in), .y = lk_tensor_2d(y, dt, t, out),
        .dy = lk_tensor_2d(dy, dt, t, out), .dx = lk_tensor_2d(dx, dt, t, in),
        .dweight = lk_tensor_2d(dw, LK_F32, out, in),
    };
    if ((s = lk_linear_forward(impl, &j.a, &j.ctx)) || (s = lk_linear_backward(impl, &j.a, &j.ctx))) goto done;
    double f = 2.0 * (double)t * (double)in * (double)out;
    lk_bench_spec spec = {.op = "linear", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                                .bwd = run_bwd, .job = &j, .flops = {f, 2 * f}, .arena = &arena};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(x); free(w); free(dy); free(y); free(dx); free(dw);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {3, {1, 1, 1}}, {3, {7, 33, 17}}, {4, {2, 3, 5, 4}}, {3, {64, 256, 96}}, {3, {128, 1024, 512}},
};

const lk_harness lk_linear_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {3, {4096, 1024, 4096}},
};
