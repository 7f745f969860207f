/* harness.c — RMSNorm for `llmkern check` and `llmkern bench` (lk_rms_norm_harness,
 * named by its descriptor, def.c), and the comparison tests/test_rms_norm.c runs
 * (check.h). check: one implementation against the float64 reference (reference.c) on
 * fresh random inputs; bench: forward, backward and both, timed, with GB/s counted
 * from the tensor passes the op cannot avoid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/rope/reference.h"
#include "reference.h"

/* Tolerances on max|got − ref| / max|ref|, worst of y, dx and dweight.
 * f32: every implementation computes in f32 with f32 accumulation; its error is a few
 *   ulps (6e-8) times the growth of a sum over n ≤ ~4k terms, ~1e-6. 1e-5 leaves room
 *   and still catches a wrong eps, offset or a missing term (errors of 1e-3 and up).
 * bf16, fused and eager_fp32: f32 math, one rounding of each output, at most 2^-8 =
 *   3.9e-3 of an element; 1e-2.
 * bf16, eager: every intermediate is rounded to bf16 (the longest chain is dx: g, g·x,
 *   Σ, −½·d·r³, /n, 2x·dm, +, six or seven roundings of up to 2^-8 that can add), so
 *   ~2.7e-2 worst case; 4e-2. A wrong formula still misses by O(1). */
static const lk_tol tols[] = {
    {"eager", LK_BF16, 4e-2},
    {NULL, LK_F32, 1e-5},       /* any other implementation */
    {NULL, LK_BF16, 1e-2},
};

double lk_rms_norm_tol(const lk_impl *impl, lk_dtype dt) {
    return lk_tol_find(tols, sizeof tols / sizeof *tols, impl, dt, 1e-2);
}

/* dx = rstd·(g − x̂·mean(g·x̂)) is a difference: for a row of one element the two terms
 * cancel to ~eps, and max|dx| says nothing about how well it was computed. So dx's
 * error is measured against the size of its first term, max|rstd·g|, as well as
 * max|dx| (they agree for every row that is not nearly cancelled). NaN gives +inf. */
static double dx_err(const void *got, lk_dtype dt, const double *ref, const double *rstd,
                     const double *dy, const double *w, double off, int64_t rows, int64_t n) {
    double max_err = 0.0, scale = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            int64_t i = r * n + j;
            double g = lk_load(got, dt, i), e = fabs(g - ref[i]);
            if (isnan(e)) return INFINITY;
            double t = fabs(rstd[r] * dy[i] * (w ? off + w[j] : 1.0));
            max_err = fmax(max_err, e);
            scale = fmax(scale, fmax(t, fabs(ref[i])));
        }
    return max_err / (scale > 1e-300 ? scale : 1.0);
}

/* The residual mode's reference (rms_norm.h): the forward's sum is an f32 add, rounded
 * to f32 as the contract says (sum32, and s64 its values in double); x is its rounding to
 * dt (xd, in place of the random x). The forward normalizes s64 (xd with norm_of_x, or
 * with the stream in x's dtype); the backward is the formulas at the forward's rstd with
 * xd; the backward's residual is res + dx in double (rb_ref), and dx its rounding, so the
 * reference for dx is rb_ref itself. rf is of rt: f32, or x's dtype. */
static void residual_reference(const void *rf, lk_dtype rt, const void *delta, lk_dtype dt, int64_t all,
                               float *sum32, double *s64, double *xd) {
    for (int64_t i = 0; i < all; i++) {
        float d = delta ? (float)lk_load(delta, dt, i) : 0.0f, r = (float)lk_load(rf, rt, i);
        sum32[i] = delta ? r + d : r;
        s64[i] = sum32[i];
        xd[i] = lk_bf16_to_f32(lk_f32_to_bf16(sum32[i]));
        if (dt == LK_F32) xd[i] = sum32[i];
    }
}

/* The views case's layouts of a [T, H, n] shape: token-major rows in a padded buffer
 * (x, dx), head-major (y, dy), or contiguous (y, dy of views 2). */
#define VIEW_GAP 8
enum { VIEW_PADDED, VIEW_HEAD_MAJOR, VIEW_CONTIGUOUS };
static lk_tensor view_of(void *p, lk_dtype dt, const lk_shape *shape, int layout) {
    lk_tensor t = lk_tensor_view(p, dt, 3, shape->d);
    int64_t T = shape->d[0], H = shape->d[1], n = shape->d[2];
    if (layout == VIEW_PADDED) t.stride[0] = H * n + VIEW_GAP, t.stride[1] = n;
    if (layout == VIEW_HEAD_MAJOR) t.stride[0] = n, t.stride[1] = T * n;
    return t;
}

/* Contiguous row-major src into the view t (scatter), or t's elements back (gather). */
static void view_copy(const lk_tensor *t, void *contig, int gather) {
    int64_t n = t->shape[2], es = (int64_t)lk_dtype_size(t->dtype);
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (int64_t h = 0; h < t->shape[1]; h++) {
            char *v = (char *)t->data + (i * t->stride[0] + h * t->stride[1]) * es;
            char *c = (char *)contig + ((i * t->shape[1] + h) * n) * es;
            if (gather) memcpy(c, v, (size_t)(n * es));
            else memcpy(v, c, (size_t)(n * es));
        }
}

/* 1 when every gap of a token-major view (the VIEW_GAP elements after each row of heads)
 * still holds the poison it was given. */
static int gaps_untouched(const lk_tensor *t) {
    int64_t T = t->shape[0], hn = t->shape[1] * t->shape[2], es = (int64_t)lk_dtype_size(t->dtype);
    unsigned char poison[VIEW_GAP * 4];
    lk_poison(poison, t->dtype, VIEW_GAP);
    for (int64_t i = 0; i < T; i++)
        if (memcmp((char *)t->data + (i * t->stride[0] + hn) * es, poison, (size_t)(VIEW_GAP * es))) return 0;
    return 1;
}

/* The rope case's tables: ROPE_POS positions. */
#define ROPE_POS 97

lk_status lk_rms_norm_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                                 const lk_rms_norm_case *c, lk_check_row *row, lk_rms_norm_errors *err) {
    static const lk_rms_norm_case defaults = {0};
    if (!c) c = &defaults;
    lk_check_row_begin(row, "rms_norm", impl, dt, shape, impl ? lk_rms_norm_tol(impl, dt) : 0.0);
    if (c->views < 0 || c->views > 2)
        return lk_error(LK_EINVAL, "rms_norm: check: views: expected 0, 1 or 2, got %d", c->views);
    if (c->residual < 0 || c->residual > 2 || (c->residual_in_place && (c->residual != 2 || c->inplace_dx)))
        return lk_error(LK_EINVAL, "rms_norm: check: residual: expected 0, 1 or 2 (residual_in_place with 2 and "
                        "without inplace_dx), got %d", c->residual);
    if (c->views && (shape->ndim != 3 || c->residual || c->inplace_dx))
        return lk_error(LK_EINVAL, "rms_norm: check: the views case takes a 3-D shape, without the residual mode or "
                        "inplace_dx");
    if (c->rope && (!c->views || shape->d[2] % 2))
        return lk_error(LK_EINVAL, "rms_norm: check: the rope case takes the views case and an even last dim");
    int64_t all = lk_shape_numel(shape), n = shape->d[shape->ndim - 1], rows = all / n;
    lk_dtype wt = c->f32_weight ? LK_F32 : dt;      /* weight and dweight */
    size_t esz = lk_dtype_size(dt), wsz = lk_dtype_size(wt), saved_bytes = 0;
    lk_tensor xt = lk_tensor_view(NULL, dt, shape->ndim, shape->d);
    lk_placement pl;
    lk_place_begin(&pl, "rms_norm", impl);          /* a failure is kept in pl.status */
    lk_place_tensor(&pl, "x", &xt, 0);              /* no data yet: only its device, for the query */
    lk_status s = lk_rms_norm_saved_bytes(impl, &xt, &saved_bytes);
    if (s) return s;

    lk_rng rng = lk_rng_make(seed);
    double *xd = NULL, *wd = NULL, *dyd = NULL;
    void *x = lk_random_tensor(&rng, dt, all, 1.0f, &xd);
    void *w = lk_random_tensor(&rng, wt, n, 0.2f, &wd);
    void *dy = lk_random_tensor(&rng, dt, all, 1.0f, &dyd);
    void *y = malloc((size_t)all * esz), *dx = malloc((size_t)all * esz), *dw = malloc((size_t)n * wsz);
    void *saved = malloc(saved_bytes ? saved_bytes : 1);
    double *ref = malloc(sizeof(double) * (size_t)(2 * all + n + rows));
    /* the residual mode: the forward's residual and delta, the backward's residual, and
     * their references (sum32, the copies kept before the passes write over them) */
    int res = c->residual;
    const lk_dtype rt = res == 2 ? dt : LK_F32;   /* the stream in x's dtype, or f32 */
    const int in_place = c->residual_in_place && rt != LK_F32;
    double *rfd = NULL, *rbd = NULL, *dd = NULL;
    void *rf = res ? lk_random_tensor(&rng, rt, all, 1.0f, &rfd) : NULL;
    void *delta = res && !c->no_delta ? lk_random_tensor(&rng, dt, all, 0.5f, &dd) : NULL;
    void *rb = res ? lk_random_tensor(&rng, rt, all, 1.0f, &rbd) : NULL;
    float *sum32 = res ? malloc(sizeof(float) * (size_t)(all ? all : 1)) : NULL;
    double *s64 = res ? malloc(sizeof(double) * (size_t)(all ? all : 1)) : NULL;
    /* the views case: x and dx in a padded token-major buffer, y and dy head-major */
    int views = c->views;
    size_t vtok = views ? (size_t)(shape->d[0] * (shape->d[1] * n + VIEW_GAP)) * esz : 0;
    void *vx = views ? malloc(vtok) : NULL, *vdx = views ? malloc(vtok) : NULL;
    void *vy = views ? malloc((size_t)all * esz) : NULL, *vdy = views ? malloc((size_t)all * esz) : NULL;
    /* the rope case: f32 tables [ROPE_POS, n/2] and a random position a token */
    int64_t T = shape->d[0], half = n / 2;
    float *rcos = c->rope ? malloc(sizeof(float) * (size_t)(ROPE_POS * half)) : NULL;
    float *rsin = c->rope ? malloc(sizeof(float) * (size_t)(ROPE_POS * half)) : NULL;
    int64_t *rpos = c->rope ? malloc(sizeof(int64_t) * (size_t)(T ? T : 1)) : NULL;
    double *rtab = c->rope ? malloc(sizeof(double) * (size_t)(2 * ROPE_POS * half)) : NULL;   /* cos, sin */
    double *rtmp = c->rope ? malloc(sizeof(double) * (size_t)(all ? all : 1)) : NULL;
    lk_arena arena = {0};
    if (!x || !w || !dy || !y || !dx || !dw || !saved || !ref || (views && (!vx || !vdx || !vy || !vdy)) ||
        (res && (!rf || !rb || !sum32 || !s64 || (!delta && !c->no_delta))) || (c->rope && (!rcos || !rsin || !rpos || !rtab || !rtmp))) {
        s = lk_error(LK_ENOMEM, "rms_norm: check: out of memory for shape %s", row->shape);
        goto done;
    }
    double *yref = ref, *dxref = ref + all, *dwref = ref + 2 * all, *rstd = dwref + n;
    /* weights around 1, or around 0 when the offset supplies the 1 */
    for (int64_t j = 0; j < n; j++) {
        lk_store(w, wt, j, (c->weight_offset != 0.0f ? 0.0 : 1.0) + wd[j]);
        wd[j] = lk_load(w, wt, j);
    }
    const double *wref = c->no_weight ? NULL : wd;
    double eps = c->eps > 0 ? c->eps : 1e-6;
    if (res) {
        residual_reference(rf, rt, delta, dt, all, sum32, s64, xd);
        if (in_place) memcpy(x, rf, (size_t)all * esz);   /* the stream is x */
        else lk_poison(x, dt, all);         /* written by the forward */
    }
    /* the residual mode normalizes the f32 stream, or x with norm_of_x or the stream in x's
     * dtype; `eager` in bf16 runs its steps in bf16, where the stream enters as x (rms_norm.h) */
    int of_x = c->norm_of_x || rt != LK_F32 || (impl && dt != LK_F32 && strcmp(impl->name, "eager") == 0);
    lk_rms_norm_ref_forward(res && !of_x ? s64 : xd, wref, c->weight_offset, eps, rows, n, yref, rstd);
    lk_tensor tcos = {0}, tsin = {0}, tpos = {0};
    if (c->rope) {   /* y rotated; the backward's reference from dy rotated back */
        lk_tensor ct = lk_tensor_2d(rcos, LK_F32, ROPE_POS, half), st = lk_tensor_2d(rsin, LK_F32, ROPE_POS, half);
        if ((s = lk_rope_tables(10000.0, n, NULL, &ct, &st))) goto done;
        for (int64_t t = 0; t < T; t++) rpos[t] = (int64_t)(lk_rng_bits(seed, (uint64_t)t) % ROPE_POS);
        for (int64_t e = 0; e < ROPE_POS * half; e++) rtab[e] = rcos[e], rtab[ROPE_POS * half + e] = rsin[e];
        /* RoPE's float64 oracle on [T, H, n] as [B = T, H, S = 1, n]: token t at position rpos[t] */
        const lk_rope_ref_problem rp = {.batch = T, .heads = shape->d[1], .seq = 1, .head_dim = n, .rotary_dim = n,
                                        .cos = rtab, .sin = rtab + ROPE_POS * half, .pos = rpos};
        lk_rope_ref_forward(&rp, yref, rtmp);
        memcpy(yref, rtmp, sizeof(double) * (size_t)all);
        lk_rope_ref_backward(&rp, dyd, rtmp);
        memcpy(dyd, rtmp, sizeof(double) * (size_t)all);
        tcos = ct, tsin = st, tpos = lk_tensor_1d(rpos, LK_I64, T);
    }
    lk_rms_norm_ref_backward_at(xd, rstd, wref, c->weight_offset, eps, dyd, rows, n, dxref, dwref);

    lk_poison(y, dt, all);
    lk_poison(dw, wt, n);
    memset(saved, 0xff, saved_bytes);       /* NaN in f32 and bf16 alike */
    if (c->inplace_dx) memcpy(dx, dy, (size_t)all * esz);
    else if (in_place) memcpy(dx, rb, (size_t)all * esz);   /* the gradient's stream is dx */
    else lk_poison(dx, dt, all);
    xt.data = x;
    lk_rms_norm_args a = {
        .x = xt, .y = lk_tensor_view(y, dt, shape->ndim, shape->d),
        .dy = lk_tensor_view(c->inplace_dx ? dx : dy, dt, shape->ndim, shape->d),
        .dx = lk_tensor_view(dx, dt, shape->ndim, shape->d),
        .weight = lk_tensor_1d(c->no_weight ? NULL : w, wt, n), .dweight = lk_tensor_1d(dw, wt, n),
        .saved = {saved, saved_bytes}, .eps = eps, .weight_offset = c->weight_offset,
        .inplace_dx = c->inplace_dx, .norm_of_x = c->norm_of_x,
    };
    const int yl = views == 2 ? VIEW_CONTIGUOUS : VIEW_HEAD_MAJOR;   /* the views case's host views */
    lk_tensor hx = view_of(vx, dt, shape, VIEW_PADDED), hy = view_of(vy, dt, shape, yl),
              hdy = view_of(vdy, dt, shape, yl), hdx = view_of(vdx, dt, shape, VIEW_PADDED);
    if (views) {
        lk_poison(vx, dt, (int64_t)(vtok / esz));
        lk_poison(vdx, dt, (int64_t)(vtok / esz));
        lk_poison(vy, dt, all);
        view_copy(&hx, x, 0);
        view_copy(&hdy, dy, 0);
        a.x = hx, a.y = hy, a.dy = hdy, a.dx = hdx;
    }
    lk_tensor rft = lk_tensor_view(rf, rt, shape->ndim, shape->d), rbt = rft;
    rbt.data = rb;
    if (res) {
        a.delta = lk_tensor_view(delta, dt, shape->ndim, shape->d);
        if (in_place) lk_place_tensor(&pl, "x", &a.x, 1);
        else lk_place_tensors(&pl, LK_TENSORS({"x", &a.x}, {"residual", &rft}, {"residual (backward)", &rbt}), 1);
        if (delta) lk_place_tensor(&pl, "delta", &a.delta, 0);
        lk_place_tensor(&pl, "weight", &a.weight, 0);
    } else {
        lk_place_tensors(&pl, LK_TENSORS({"x", &a.x}, {"weight", &a.weight}), 0);
    }
    lk_place_tensor(&pl, "dy", &a.dy, c->inplace_dx);
    lk_rms_norm_rope rope = {0};
    if (c->rope) {
        lk_place_tensors(&pl, LK_TENSORS({"rope.cos", &tcos}, {"rope.sin", &tsin}, {"rope.position_ids", &tpos}), 0);
        rope = (lk_rms_norm_rope){tcos, tsin, tpos};
        a.rope = &rope;
    }
    lk_place_tensors(&pl, LK_TENSORS({"y", &a.y}, {"dx", &a.dx}, {"dweight", &a.dweight}), 1);
    lk_place_saved(&pl, "saved", &a.saved, 0);
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if ((s = pl.status)) goto done;
    a.residual = !res ? (lk_tensor){0} : in_place ? a.x : rft;
    if ((s = lk_rms_norm_forward(impl, &a, &ctx))) goto done;
    a.residual = !res ? (lk_tensor){0} : in_place ? a.dx : rbt;
    if ((s = lk_rms_norm_backward(impl, &a, &ctx)) || (s = lk_place_fetch(&pl))) goto done;
    int gaps_ok = 1;
    if (views) {   /* the outputs back in row order; dx's gaps must be as poisoned */
        view_copy(&hy, y, 1);
        view_copy(&hdx, dx, 1);
        gaps_ok = gaps_untouched(&hdx);
    }
    if (res) {   /* the backward's residual and dx: res + dx; dx_err's scale covers both */
        for (int64_t i = 0; i < all; i++) dxref[i] += rbd[i];
    }

    lk_rms_norm_errors e = {
        .y = lk_rel_err(y, dt, yref, all),
        .dx = dx_err(dx, dt, dxref, rstd, dyd, wref, c->weight_offset, rows, n),   /* dyd rotated back (rope) */
        .dweight = c->no_weight ? 0.0 : lk_rel_err(dw, wt, dwref, n),
    };
    if (res && rt == LK_F32)   /* x and the forward's residual are exact; the backward's residual as dx, in f32 */
        e.residual = fmax(fmax(lk_rel_err(x, dt, xd, all), lk_rel_err(rf, LK_F32, s64, all)),
                          lk_rel_err(rb, LK_F32, dxref, all));
    else if (res)   /* x exact; a residual of x's dtype holds what it held (in place it is x and dx) */
        e.residual = in_place ? lk_rel_err(x, dt, xd, all)
                              : fmax(lk_rel_err(x, dt, xd, all), fmax(lk_rel_err(rf, rt, rfd, all), lk_rel_err(rb, rt, rbd, all)));
    if (!gaps_ok) e.dx = INFINITY;
    double worst = fmax(fmax(e.y, e.dx), fmax(e.dweight, e.residual));
    lk_check_row_end(row, isnan(e.y) || isnan(e.dx) || isnan(e.dweight) || isnan(e.residual) ? NAN : worst);
    if (err) *err = e;
done:
    free(x); free(w); free(dy); free(y); free(dx); free(dw); free(saved); free(ref);
    free(xd); free(wd); free(dyd);
    free(rf); free(rb); free(delta); free(sum32); free(s64); free(rfd); free(rbd); free(dd);
    free(vx); free(vdx); free(vy); free(vdy);
    free(rcos); free(rsin); free(rpos); free(rtab); free(rtmp);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}

/* bf16 runs twice: the weight bf16, and f32 as bf16 training passes its master weight
 * (rms_norm.h); the row is the worse of the two. */
static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                       lk_check_row *row) {
    lk_status s = lk_rms_norm_check_case(impl, dt, shape, seed, NULL, row, NULL);
    if (s || dt != LK_BF16) return s;
    lk_check_row f32w;
    if ((s = lk_rms_norm_check_case(impl, dt, shape, seed, &(lk_rms_norm_case){.f32_weight = 1}, &f32w, NULL)))
        return s;
    if (!(f32w.max_rel_err <= row->max_rel_err)) row->max_rel_err = f32w.max_rel_err;   /* NaN too */
    row->pass = row->pass && f32w.pass;
    return LK_OK;
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_rms_norm_args, lk_rms_norm_forward, lk_rms_norm_backward)

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    int64_t all = lk_shape_numel(shape), n = shape->d[shape->ndim - 1];
    size_t esz = lk_dtype_size(dt), tb = (size_t)all * esz, saved_bytes = 0;
    lk_tensor xt = lk_tensor_view(NULL, dt, shape->ndim, shape->d);
    lk_status s = lk_rms_norm_saved_bytes(impl, &xt, &saved_bytes);
    if (s) return s;
    void *x = lk_bench_alloc(tb), *dy = lk_bench_alloc(tb), *y = lk_bench_alloc(tb), *dx = lk_bench_alloc(tb);
    void *w = lk_bench_alloc((size_t)n * esz), *dw = lk_bench_alloc((size_t)n * esz);
    void *saved = lk_bench_alloc(saved_bytes);
    float *tmp = malloc(tb / esz * sizeof(float));
    lk_arena arena = {0};
    if (!x || !dy || !y || !dx || !w || !dw || !saved || !tmp) {
        s = lk_error(LK_ENOMEM, "rms_norm: bench: out of memory for 4 tensors of %zu bytes", tb);
        goto done;
    }
    lk_rng rng = lk_rng_make(1);
    lk_rng_normal(&rng, tmp, all, 0.0f, 1.0f);
    lk_convert(tmp, LK_F32, x, dt, all);
    lk_rng_normal(&rng, tmp, all, 0.0f, 1.0f);
    lk_convert(tmp, LK_F32, dy, dt, all);
    lk_rng_normal(&rng, tmp, n, 1.0f, 0.2f);
    lk_convert(tmp, LK_F32, w, dt, n);
    memset(y, 0, tb);               /* first touch outside the timing */
    memset(dx, 0, tb);

    bench_job j = {.impl = impl, .ctx = lk_ctx_cpu(&arena)};
    j.a = (lk_rms_norm_args){
        .x = lk_tensor_view(x, dt, shape->ndim, shape->d), .y = lk_tensor_view(y, dt, shape->ndim, shape->d),
        .dy = lk_tensor_view(dy, dt, shape->ndim, shape->d), .dx = lk_tensor_view(dx, dt, shape->ndim, shape->d),
        .weight = lk_tensor_1d(w, dt, n), .dweight = lk_tensor_1d(dw, dt, n),
        .saved = {saved, saved_bytes}, .eps = 1e-6,
    };
    if ((s = lk_rms_norm_forward(impl, &j.a, &j.ctx)) || (s = lk_rms_norm_backward(impl, &j.a, &j.ctx)))
        goto done;

    /* tensor passes: x read, y written; then x, dy read, dx written */
    lk_bench_spec spec = {.op = "rms_norm", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                          .bwd = run_bwd, .job = &j, .bytes = {2.0 * (double)tb, 3.0 * (double)tb},
                          .arena = &arena, .extra_bytes = saved_bytes};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(x); free(dy); free(y); free(dx); free(w); free(dw); free(saved); free(tmp);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {2, {1, 1}}, {2, {3, 7}}, {2, {17, 4099}}, {2, {64, 1024}}, {3, {2, 5, 33}},
};

const lk_harness lk_rms_norm_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {2, {8192, 4096}},
};
