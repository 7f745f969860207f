/* harness.c — cross-entropy for `llmkern check` and `llmkern bench`
 * (lk_cross_entropy_harness, named by its descriptor, def.c), and the comparison
 * tests/test_cross_entropy.c runs (check.h). Shapes are T x H x V. check: one
 * implementation against the float64 reference (reference.c) on fresh random inputs;
 * bench: forward, backward and both, timed, GFLOP/s counted from the LM head's GEMMs
 * (2·T·H·V forward, 4·T·H·V backward, whichever pass an implementation does them in). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "reference.h"
#include "llmkern/cross_entropy.h"

extern const lk_cross_entropy_vtable lk_cross_entropy_fused_vtable;

/* Tolerances on the worst of the errors lk_ce_errors describes.
 * f32: all math in f32; lse and the loss are sums of V exp terms and the gradient GEMMs
 *   sum over V (dh) or T (dW) products, ~1e-6 relative; 2e-5 leaves room and still
 *   catches a missing term (smoothing, z-loss, cap derivative: errors of 1e-3 and up).
 * bf16: the reference rounds logits and dlogits like the implementation, so what is
 *   left is the bf16 rounding of d_hidden and d_weight (2^-9 of an element, added to a
 *   prior d_weight a quarter its size: ~3e-3) and an odd logit rounded the other way at
 *   a tie; 1e-2. */
double lk_ce_tol(const lk_impl *impl, lk_dtype dt) {
    (void)impl;
    return dt == LK_F32 ? 2e-5 : 1e-2;
}

/* max over i of |got_i − ref_i| / max(1, max|ref|); NaN gives +inf */
static double loss_err(const float *got, const double *ref, int64_t n) {
    double e = 0.0, m = 1.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d)) return INFINITY;
        e = fmax(e, d);
    }
    return e / m;
}

typedef struct {
    void *h, *w, *labels, *dh, *dw, *saved;
    float *loss, *zl, *dloss;
    double *hd, *wd, *dwprior, *ref;
    int64_t *lab64, nv;
    unsigned char *keep;
} bufs;

static void free_bufs(bufs *b) {
    free(b->h); free(b->w); free(b->labels); free(b->dh); free(b->dw); free(b->saved);
    free(b->loss); free(b->zl); free(b->dloss); free(b->hd); free(b->wd); free(b->dwprior); free(b->ref);
    free(b->lab64); free(b->keep);
}

lk_status lk_ce_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                           const lk_ce_case *c, lk_check_row *row, lk_ce_errors *err) {
    static const lk_ce_case defaults = {0};
    lk_check_row scratch;
    if (!c) c = &defaults;
    if (!row) row = &scratch;
    lk_check_row_begin(row, "cross_entropy", impl, dt, shape, impl ? lk_ce_tol(impl, dt) : 0.0);
    if (shape->ndim != 3) return lk_error(LK_EINVAL, "cross_entropy: check: expected a shape T x H x V");
    int64_t T = shape->d[0], H = shape->d[1], V = shape->d[2], B = c->batch > 1 ? c->batch : 1, S = T / B;
    int none = c->reduction == LK_CE_NONE, per = none ? T : 1;
    lk_dtype dwt = c->dweight_f32 ? LK_F32 : dt;
    lk_rng rng = lk_rng_make(seed);
    bufs b = {0};
    lk_status s = LK_OK;
    lk_placement pl;
    lk_place_begin(&pl, "cross_entropy", impl);      /* a failure is kept in pl.status */
    b.h = lk_random_tensor(&rng, dt, T * H, 1.0f, &b.hd);
    b.w = lk_random_tensor(&rng, dt, V * H, (float)(1.5 / sqrt((double)H)), &b.wd);
    float *u = malloc(sizeof(float) * (size_t)(2 * T + 1));
    b.labels = malloc((size_t)T * 8); b.lab64 = malloc((size_t)T * 8); b.keep = calloc((size_t)T + 1, 1);
    b.dh = malloc((size_t)(T * H) * lk_dtype_size(dt)); b.dw = malloc((size_t)(V * H) * lk_dtype_size(dwt));
    b.loss = malloc(sizeof(float) * (size_t)per); b.zl = malloc(sizeof(float) * (size_t)per);
    b.dloss = malloc(sizeof(float) * (size_t)per);
    b.dwprior = malloc(sizeof(double) * (size_t)(V * H));
    b.ref = malloc(sizeof(double) * (size_t)(T * H + V * H + 2 * T + 2));
    if (!b.h || !b.w || !u || !b.labels || !b.lab64 || !b.keep || !b.dh || !b.dw || !b.loss || !b.zl ||
        !b.dloss || !b.dwprior || !b.ref) {
        s = lk_error(LK_ENOMEM, "cross_entropy: check: out of memory for shape %s", row->shape);
        goto done;
    }
    lk_rng_uniform(&rng, u, 2 * T, 0.0f, 1.0f);
    for (int64_t t = 0; t < T; t++) {
        int64_t y = (int64_t)(u[t] * (float)V) % V, lab = u[T + t] < c->ignore_frac ? LK_CE_IGNORE_INDEX : y;
        b.lab64[t] = lab == LK_CE_IGNORE_INDEX ? -1 : lab;
        if (c->labels_i32) ((int32_t *)b.labels)[t] = (int32_t)lab;
        else ((int64_t *)b.labels)[t] = lab;
        b.keep[t] = c->keep_indices ? 0 : c->logits_to_keep ? (t % S) >= S - c->logits_to_keep : 1;
    }
    for (int64_t k = 0; c->keep_indices && k < c->n_keep; k++) b.keep[c->keep_indices[k]] = 1;
    if (none) lk_rng_normal(&rng, b.dloss, T, 0.0f, 1.0f);
    else b.dloss[0] = c->d_loss != 0.0 ? (float)c->d_loss : 0.75f;

    double *dhref = b.ref, *dwref = dhref + T * H, *ltok = dwref + V * H, *ztok = ltok + T, lref, zref;
    lk_ce_ref_problem pr = {.T = T, .H = H, .V = V, .h = b.hd, .w = b.wd, .labels = b.lab64, .keep = b.keep,
                            .reduction = c->reduction, .eps = c->label_smoothing, .zs = c->z_loss_scale,
                            .cap = c->softcap, .round_bf16 = dt == LK_BF16 && !c->fp32_lm_head};
    double ddl[1] = {b.dloss[0]}, *dl = none ? NULL : ddl;
    double *dlt = none ? malloc(sizeof(double) * (size_t)T) : NULL;
    for (int64_t t = 0; none && dlt && t < T; t++) dlt[t] = b.dloss[t];
    lk_ce_ref(&pr, none ? dlt : dl, ltok, ztok, &lref, &zref, &b.nv, dhref, dwref);
    free(dlt);
    /* a prior d_weight a quarter of the gradient's size: accumulation is seen, and its bf16
     * rounding (2^-9 of the sum) stays within the bf16 tolerance */
    double mdw = 1e-30;
    for (int64_t i = 0; i < V * H; i++) mdw = fmax(mdw, fabs(dwref[i]));
    float *prior = malloc(sizeof(float) * (size_t)(V * H));
    if (!prior) { s = lk_error(LK_ENOMEM, "cross_entropy: check: out of memory"); goto done; }
    lk_rng_normal(&rng, prior, V * H, 0.0f, (float)(0.25 * mdw));
    lk_convert(prior, LK_F32, b.dw, dwt, V * H);
    for (int64_t i = 0; i < V * H; i++) b.dwprior[i] = lk_load(b.dw, dwt, i);
    free(prior);

    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    int64_t hshape[3] = {B, S, H}, lshape[2] = {B, S};
    a.hidden = B > 1 ? lk_tensor_view(b.h, dt, 3, hshape) : lk_tensor_2d(b.h, dt, T, H);
    a.weight = lk_tensor_2d(b.w, dt, V, H);
    a.labels = B > 1 ? lk_tensor_view(b.labels, c->labels_i32 ? LK_I32 : LK_I64, 2, lshape)
                     : lk_tensor_1d(b.labels, c->labels_i32 ? LK_I32 : LK_I64, T);
    if (c->keep_indices) a.keep_indices = lk_tensor_1d((void *)c->keep_indices, LK_I64, c->n_keep);
    a.loss = lk_tensor_1d(b.loss, LK_F32, per);
    a.z_loss = lk_tensor_1d(b.zl, LK_F32, per);
    int64_t nvalid = -7;
    a.n_valid = lk_tensor_1d(&nvalid, LK_I64, 1);
    a.d_loss = lk_tensor_1d(b.dloss, LK_F32, per);
    a.d_hidden = a.hidden;
    a.d_hidden.data = b.dh;
    a.d_weight = lk_tensor_2d(b.dw, dwt, V, H);
    a.reduction = (lk_ce_reduction)c->reduction;
    a.label_smoothing = c->label_smoothing;
    a.z_loss_scale = c->z_loss_scale;
    a.softcap = c->softcap;
    a.logits_to_keep = c->logits_to_keep;
    a.fp32_lm_head = c->fp32_lm_head;
    a.chunk_bytes = c->chunk_bytes;
    lk_poison(b.loss, LK_F32, per);
    lk_poison(b.zl, LK_F32, per);
    lk_poison(b.dh, dt, T * H);
    lk_place_tensors(&pl, LK_TENSORS({"hidden", &a.hidden}, {"weight", &a.weight}, {"labels", &a.labels},
                                     {"keep_indices", &a.keep_indices}, {"d_loss", &a.d_loss}), 0);
    lk_place_tensors(&pl, LK_TENSORS({"loss", &a.loss}, {"z_loss", &a.z_loss}, {"n_valid", &a.n_valid},
                                     {"d_hidden", &a.d_hidden}, {"d_weight", &a.d_weight}), 1);
    size_t sb = 0;          /* asked of the tensors where the passes see them */
    if ((s = pl.status) || (s = lk_cross_entropy_saved_bytes(impl, &a, &sb))) goto done;
    b.saved = malloc(sb ? sb : 1);
    if (!b.saved) { s = lk_error(LK_ENOMEM, "cross_entropy: check: out of memory for saved"); goto done; }
    memset(b.saved, 0xff, sb);
    a.saved = (lk_saved){b.saved, sb};
    lk_place_saved(&pl, "saved", &a.saved, 0);
    lk_arena arena = {0};
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if (!(s = pl.status) && !(s = lk_cross_entropy_forward(impl, &a, &ctx)) &&
        !(s = lk_cross_entropy_backward(impl, &a, &ctx)))
        s = lk_place_fetch(&pl);
    lk_arena_free(&arena);
    if (s) goto done;

    lk_ce_errors e = {0};
    e.loss = none ? loss_err(b.loss, ltok, T) : loss_err(b.loss, &lref, 1);
    e.z_loss = none ? loss_err(b.zl, ztok, T) : loss_err(b.zl, &zref, 1);
    e.dh = lk_rel_err(b.dh, dt, dhref, T * H);
    double md = 0.0, mr = 0.0;                 /* d_weight − prior against the gradient */
    for (int64_t i = 0; i < V * H; i++) {
        double d = fabs(lk_load(b.dw, dwt, i) - b.dwprior[i] - dwref[i]);
        md = isnan(d) || isnan(md) ? NAN : fmax(md, d);
        mr = fmax(mr, fabs(dwref[i]));
    }
    e.dw = isnan(md) ? INFINITY : md / (mr > 1e-300 ? mr : 1.0);
    e.n_valid_ok = nvalid == b.nv;
    e.unscored_zero = 1;
    for (int64_t t = 0; t < T; t++) {
        if (b.keep[t]) continue;
        for (int64_t j = 0; j < H; j++) e.unscored_zero &= lk_load(b.dh, dt, t * H + j) == 0.0;
        if (none) e.unscored_zero &= b.loss[t] == 0.0f && b.zl[t] == 0.0f;
    }
    double worst = fmax(fmax(e.loss, e.z_loss), fmax(e.dh, e.dw));
    lk_check_row_end(row, e.n_valid_ok && e.unscored_zero ? worst : INFINITY);
    if (err) *err = e;
done:
    free(u);
    free_bufs(&b);
    lk_place_end(&pl);
    return s;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                       lk_check_row *row) {
    /* every option on at once, a tenth of the labels ignored, chunks of 5 tokens */
    lk_ce_case c = {.label_smoothing = 0.1, .z_loss_scale = 1e-3, .softcap = 3.0, .ignore_frac = 0.1,
                    .chunk_bytes = (size_t)(5 * shape->d[2]) * sizeof(float)};
    return lk_ce_check_case(impl, dt, shape, seed, &c, row, NULL);
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_cross_entropy_args, lk_cross_entropy_forward, lk_cross_entropy_backward)

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    if (shape->ndim != 3) return lk_error(LK_EINVAL, "cross_entropy: bench: expected a shape T x H x V");
    int64_t T = shape->d[0], H = shape->d[1], V = shape->d[2];
    size_t esz = lk_dtype_size(dt), sb = 0;
    float loss = 0.0f, dloss = 1.0f;
    lk_rng rng = lk_rng_make(1);
    void *h = lk_random_tensor(&rng, dt, T * H, 1.0f, NULL), *w = lk_random_tensor(&rng, dt, V * H, 0.02f, NULL);
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)T);
    void *dh = malloc((size_t)(T * H) * esz);
    float *dw = calloc((size_t)(V * H), sizeof(float)), *u = malloc(sizeof(float) * (size_t)T);
    void *saved = NULL;
    lk_arena arena = {0};
    lk_status s = LK_OK;
    if (!h || !w || !labels || !dh || !dw || !u) {
        s = lk_error(LK_ENOMEM, "cross_entropy: bench: out of memory for %s", "inputs");
        goto done;
    }
    lk_rng_uniform(&rng, u, T, 0.0f, 1.0f);
    for (int64_t t = 0; t < T; t++) labels[t] = (int64_t)(u[t] * (float)V) % V;
    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena), .a = lk_cross_entropy_args_init()};
    j.a.hidden = lk_tensor_2d(h, dt, T, H);
    j.a.weight = lk_tensor_2d(w, dt, V, H);
    j.a.labels = lk_tensor_1d(labels, LK_I64, T);
    j.a.loss = lk_tensor_1d(&loss, LK_F32, 1);
    j.a.d_loss = lk_tensor_1d(&dloss, LK_F32, 1);
    j.a.d_hidden = lk_tensor_2d(dh, dt, T, H);
    j.a.d_weight = lk_tensor_2d(dw, LK_F32, V, H);     /* the f32 master gradient */
    if ((s = lk_cross_entropy_saved_bytes(impl, &j.a, &sb))) goto done;
    if (!(saved = malloc(sb ? sb : 1))) {
        s = lk_error(LK_ENOMEM, "cross_entropy: bench: out of memory for %zu saved bytes", sb);
        goto done;
    }
    memset(saved, 0, sb);
    j.a.saved = (lk_saved){saved, sb};
    if ((s = lk_cross_entropy_forward(impl, &j.a, &j.ctx)) || (s = lk_cross_entropy_backward(impl, &j.a, &j.ctx)))
        goto done;

    /* one GEMM of the LM head; fused makes both gradient GEMMs in its forward and the
     * backward only scales, so its rows carry all three there */
    double f = 2.0 * (double)T * (double)H * (double)V;
    int grads_in_forward = impl->vtable == &lk_cross_entropy_fused_vtable;
    lk_bench_spec spec = {.op = "cross_entropy", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                          .bwd = run_bwd, .job = &j, .arena = &arena, .extra_bytes = sb,
                          .flops = {grads_in_forward ? 3.0 * f : f, grads_in_forward ? 0.0 : 2.0 * f}};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(h); free(w); free(labels); free(dh); free(dw); free(u); free(saved);
    lk_arena_free(&arena);
    return s;
}

/* 53 x 320 x 1001: a hidden size the chunked implementations run through lk_gemm_wide. */
static const lk_shape check_shapes[] = {
    {3, {1, 1, 2}}, {3, {7, 5, 3}}, {3, {33, 16, 1001}}, {3, {9, 8, 32003}}, {3, {64, 64, 257}},
    {3, {53, 320, 1001}},
};

const lk_harness lk_cross_entropy_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {3, {4096, 1024, 32000}},
};
