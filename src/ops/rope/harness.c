/* harness.c — RoPE for `llmkern check` and `llmkern bench` (lk_rope_harness, named by its
 * descriptor, def.c), and the comparison tests/test_rope.c runs (check.h). check: one
 * implementation against the float64 reference (reference.c) on fresh random inputs;
 * bench: forward, backward and both, timed, GB/s counted as q and k read once and
 * q_out and k_out written once per pass (the floor; eager moves several times that).
 *
 * Shapes are B x Hq x S x D [x Hk [x R]] (check.h): the default bench shape
 * 1x32x2048x128 is Qwen3-8B-like, q 32 heads and k Hq/4 = 8 heads, R = D. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "reference.h"

/* Tolerances on max|got − ref| / max|ref|, worst of q_out, k_out, dq, dk. The reference
 * reads the same f32 tables, so only the rotation's own arithmetic is measured.
 * f32: each output is x1·c ∓ x2·s, two products and a sum in f32 (eager rounds each,
 *   fused fuses one): a few ulps (6e-8) of max|x|; 1e-5 leaves room and still catches
 *   a wrong sign, half swap or position (errors of O(1)).
 * bf16, fused: f32 math and one rounding of the output, at most 2^-9 of an element
 *   relative; 1e-2.
 * bf16, eager: cos and sin are cast to bf16 (2^-9 each), both products and the sum are
 *   rounded to bf16: up to ~5·2^-9 ≈ 1e-2 of max|x|; 2e-2. A wrong formula misses by O(1). */
static const lk_tol tols[] = {
    {"eager", LK_BF16, 2e-2},
    {NULL, LK_F32, 1e-5},       /* any other implementation */
    {NULL, LK_BF16, 1e-2},
};

double lk_rope_tol(const lk_impl *impl, lk_dtype dt) {
    return lk_tol_find(tols, sizeof tols / sizeof *tols, impl, dt, 1e-2);
}

lk_status lk_rope_shape_dims(const lk_shape *shape, lk_dtype dt, lk_rope_dims *d) {
    if (shape->ndim < 4 || shape->ndim > 6)
        return lk_error(LK_ESHAPE, "rope: size: expected B x Hq x S x D [x Hk [x rotary_dim]], got %d dims",
                        shape->ndim);
    int64_t hq = shape->d[1];
    *d = (lk_rope_dims){
        .batch = shape->d[0], .q_heads = hq, .seq = shape->d[2], .head_dim = shape->d[3],
        .k_heads = shape->ndim > 4 ? shape->d[4] : hq % 4 == 0 ? hq / 4 : hq,
        .rotary_dim = shape->ndim > 5 ? shape->d[5] : shape->d[3], .dtype = dt,
    };
    return LK_OK;
}

int64_t lk_rope_packed_ids(void *ids, lk_dtype dt, int64_t B, int64_t S, uint64_t seed) {
    int64_t top = 0, counter = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t p = 7 * b + 3;              /* a document continued from the previous chunk */
        for (int64_t s = 0; s < S; s++) {
            if (s > 0 && lk_rng_bits(seed, (uint64_t)counter++) % (uint64_t)(S / 3 + 2) == 0) p = 0;
            if (dt == LK_I64) ((int64_t *)ids)[b * S + s] = p;
            else ((int32_t *)ids)[b * S + s] = (int32_t)p;
            top = p + 1 > top ? p + 1 : top;
            p++;
        }
    }
    return top;
}

/* The buffers of one check, freed together. */
typedef struct {
    void *q, *k, *dqo, *dko, *qo, *ko, *dq, *dk, *saved, *ids;
    float *cos, *sin;
    double *qd, *kd, *dqod, *dkod, *ref, *tab;
    int64_t *pos;
} bufs;

static void free_bufs(bufs *b) {
    void *all[] = {b->q, b->k, b->dqo, b->dko, b->qo, b->ko, b->dq, b->dk, b->saved, b->ids, b->cos,
                   b->sin, b->qd, b->kd, b->dqod, b->dkod, b->ref, b->tab, b->pos};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* The outputs go to fresh poisoned buffers, or (in place) to the input buffers. */
static void *output(void *in, int inplace, lk_dtype dt, int64_t n) {
    void *p = malloc((size_t)n * lk_dtype_size(dt));
    if (p && inplace) memcpy(p, in, (size_t)n * lk_dtype_size(dt));
    else if (p) lk_poison(p, dt, n);
    return p;
}

lk_status lk_rope_check_case(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                             const lk_rope_case *c, lk_check_row *row, lk_rope_errors *err) {
    static const lk_rope_case defaults = {0};
    if (!c) c = &defaults;
    lk_check_row_begin(row, "rope", impl, dt, shape, impl ? lk_rope_tol(impl, dt) : 0.0);
    lk_rope_dims d = {0};
    lk_status s = lk_rope_shape_dims(shape, dt, &d);
    if (s) return s;
    int64_t B = d.batch, S = d.seq, D = d.head_dim, R = d.rotary_dim, h = R / 2;
    int64_t nq = B * d.q_heads * S * D, nk = B * d.k_heads * S * D;
    int64_t qs[4] = {B, d.q_heads, S, D}, ks[4] = {B, d.k_heads, S, D}, is[2] = {B, S};
    lk_dtype idt = c->ids == LK_ROPE_IDS_PACKED_I32 ? LK_I32 : LK_I64;
    lk_rope_args a = {
        .q = lk_tensor_view(NULL, dt, 4, qs), .k = lk_tensor_view(NULL, dt, 4, ks),
        .rotary_dim = shape->ndim > 5 ? R : 0,
    };
    size_t saved_bytes = 0;
    lk_placement pl;
    lk_place_begin(&pl, "rope", impl);              /* a failure is kept in pl.status */
    lk_place_tensor(&pl, "q", &a.q, 0);             /* no data yet: only their device, for the query */
    lk_place_tensor(&pl, "k", &a.k, 0);
    if ((s = lk_rope_saved_bytes(impl, &a, &saved_bytes))) return s;

    lk_rng rng = lk_rng_make(seed);
    bufs m = {0};
    lk_arena arena = {0};
    m.q = lk_random_tensor(&rng, dt, nq, 1.0f, &m.qd);
    m.k = lk_random_tensor(&rng, dt, nk, 1.0f, &m.kd);
    m.dqo = lk_random_tensor(&rng, dt, nq, 1.0f, &m.dqod);
    m.dko = lk_random_tensor(&rng, dt, nk, 1.0f, &m.dkod);
    m.ids = malloc((size_t)(B * S) * sizeof(int64_t) + 1);
    m.pos = malloc((size_t)(B * S) * sizeof(int64_t) + 1);
    m.saved = malloc(saved_bytes + 1);
    m.ref = malloc(sizeof(double) * (size_t)(2 * (nq + nk)) + 1);
    if (!m.q || !m.k || !m.dqo || !m.dko || !m.ids || !m.pos || !m.saved || !m.ref) goto nomem;
    int64_t max_pos = lk_rope_packed_ids(m.pos, LK_I64, B, S, seed ^ 0x9e3779b97f4a7c15u);
    if (c->ids == LK_ROPE_IDS_NONE) {
        for (int64_t i = 0; i < B * S; i++) m.pos[i] = i % S;
        max_pos = S;
    }
    max_pos += 3;                               /* tables longer than needed, as a model's are */
    for (int64_t i = 0; i < B * S; i++)
        if (idt == LK_I64) ((int64_t *)m.ids)[i] = m.pos[i];
        else ((int32_t *)m.ids)[i] = (int32_t)m.pos[i];
    m.cos = malloc((size_t)(max_pos * h) * sizeof(float));
    m.sin = malloc((size_t)(max_pos * h) * sizeof(float));
    m.tab = malloc((size_t)(2 * max_pos * h) * sizeof(double));
    if (!m.cos || !m.sin || !m.tab) goto nomem;
    a.cos = lk_tensor_2d(m.cos, LK_F32, max_pos, h);
    a.sin = lk_tensor_2d(m.sin, LK_F32, max_pos, h);
    if ((s = lk_rope_tables(c->theta > 0 ? c->theta : 1e4, R, &c->scaling, &a.cos, &a.sin))) goto done;
    for (int64_t i = 0; i < max_pos * h; i++) {
        m.tab[i] = m.cos[i];
        m.tab[max_pos * h + i] = m.sin[i];
    }
    double *qref = m.ref, *kref = qref + nq, *dqref = kref + nk, *dkref = dqref + nq;
    lk_rope_ref_problem pq = {B, d.q_heads, S, D, R, m.tab, m.tab + max_pos * h, m.pos}, pk = pq;
    pk.heads = d.k_heads;
    lk_rope_ref_forward(&pq, m.qd, qref);
    lk_rope_ref_forward(&pk, m.kd, kref);
    lk_rope_ref_backward(&pq, m.dqod, dqref);
    lk_rope_ref_backward(&pk, m.dkod, dkref);

    m.qo = output(m.q, c->inplace, dt, nq);
    m.ko = output(m.k, c->inplace, dt, nk);
    m.dq = output(m.dqo, c->inplace, dt, nq);
    m.dk = output(m.dko, c->inplace, dt, nk);
    if (!m.qo || !m.ko || !m.dq || !m.dk) goto nomem;
    memset(m.saved, 0xff, saved_bytes);         /* NaN in f32 and bf16 alike */
    a.q.data = c->inplace ? m.qo : m.q;
    a.k.data = c->inplace ? m.ko : m.k;
    a.q_out = lk_tensor_view(m.qo, dt, 4, qs);
    a.k_out = lk_tensor_view(m.ko, dt, 4, ks);
    a.dq_out = lk_tensor_view(c->inplace ? m.dq : m.dqo, dt, 4, qs);
    a.dk_out = lk_tensor_view(c->inplace ? m.dk : m.dko, dt, 4, ks);
    a.dq = lk_tensor_view(m.dq, dt, 4, qs);
    a.dk = lk_tensor_view(m.dk, dt, 4, ks);
    a.position_ids = lk_tensor_view(c->ids == LK_ROPE_IDS_NONE ? NULL : m.ids, idt, 2, is);
    a.saved = (lk_saved){m.saved, saved_bytes};
    lk_place_tensors(&pl, LK_TENSORS({"q", &a.q}, {"k", &a.k}, {"dq_out", &a.dq_out}, {"dk_out", &a.dk_out}),
                     c->inplace);
    lk_place_tensors(&pl, LK_TENSORS({"q_out", &a.q_out}, {"k_out", &a.k_out}, {"dq", &a.dq}, {"dk", &a.dk}), 1);
    lk_place_tensors(&pl, LK_TENSORS({"cos", &a.cos}, {"sin", &a.sin}, {"position_ids", &a.position_ids}), 0);
    lk_place_saved(&pl, "saved", &a.saved, 0);
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if ((s = pl.status) || (s = lk_rope_forward(impl, &a, &ctx)) || (s = lk_rope_backward(impl, &a, &ctx)) ||
        (s = lk_place_fetch(&pl)))
        goto done;

    lk_rope_errors e = {
        .q_out = lk_rel_err(m.qo, dt, qref, nq), .k_out = lk_rel_err(m.ko, dt, kref, nk),
        .dq = lk_rel_err(m.dq, dt, dqref, nq), .dk = lk_rel_err(m.dk, dt, dkref, nk),
    };
    lk_check_row_end(row, fmax(fmax(e.q_out, e.k_out), fmax(e.dq, e.dk)));
    if (err) *err = e;
    goto done;
nomem:
    s = lk_error(LK_ENOMEM, "rope: check: out of memory for shape %s", row->shape);
done:
    free_bufs(&m);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed,
                       lk_check_row *row) {
    return lk_rope_check_case(impl, dt, shape, seed, NULL, row, NULL);
}

/* --- bench ---------------------------------------------------------------------- */

LK_BENCH_JOB(lk_rope_args, lk_rope_forward, lk_rope_backward)

/* Random normal values in dt. */
static void fill(lk_rng *rng, void *out, lk_dtype dt, int64_t n, float *tmp) {
    lk_rng_normal(rng, tmp, n, 0.0f, 1.0f);
    lk_convert(tmp, LK_F32, out, dt, n);
}

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    lk_rope_dims d = {0};
    lk_status s = lk_rope_shape_dims(shape, dt, &d);
    if (s) return s;
    int64_t B = d.batch, S = d.seq, D = d.head_dim, h = d.rotary_dim / 2;
    int64_t nq = B * d.q_heads * S * D, nk = B * d.k_heads * S * D;
    int64_t qs[4] = {B, d.q_heads, S, D}, ks[4] = {B, d.k_heads, S, D}, is[2] = {B, S};
    size_t esz = lk_dtype_size(dt), qb = (size_t)nq * esz, kb = (size_t)nk * esz, saved_bytes = 0;
    bench_job j = {.impl = impl};
    j.a = (lk_rope_args){.q = lk_tensor_view(NULL, dt, 4, qs), .k = lk_tensor_view(NULL, dt, 4, ks),
                         .rotary_dim = d.rotary_dim};
    if ((s = lk_rope_saved_bytes(impl, &j.a, &saved_bytes))) return s;
    void *q = lk_bench_alloc(qb), *k = lk_bench_alloc(kb), *qo = lk_bench_alloc(qb), *ko = lk_bench_alloc(kb);
    void *dqo = lk_bench_alloc(qb), *dko = lk_bench_alloc(kb), *dq = lk_bench_alloc(qb), *dk = lk_bench_alloc(kb);
    void *saved = lk_bench_alloc(saved_bytes);
    void *cs = lk_bench_alloc((size_t)(S * h) * 4), *sn = lk_bench_alloc((size_t)(S * h) * 4);
    int64_t *ids = malloc((size_t)(B * S) * sizeof *ids);
    float *tmp = malloc((size_t)nq * sizeof(float));
    lk_arena arena = {0};
    if (!q || !k || !qo || !ko || !dqo || !dko || !dq || !dk || !saved || !cs || !sn || !ids || !tmp) {
        s = lk_error(LK_ENOMEM, "rope: bench: out of memory for 8 tensors of up to %zu bytes", qb);
        goto done;
    }
    lk_rng rng = lk_rng_make(1);
    fill(&rng, q, dt, nq, tmp);
    fill(&rng, k, dt, nk, tmp);
    fill(&rng, dqo, dt, nq, tmp);
    fill(&rng, dko, dt, nk, tmp);
    memset(qo, 0, qb); memset(ko, 0, kb);       /* first touch outside the timing */
    memset(dq, 0, qb); memset(dk, 0, kb);
    for (int64_t i = 0; i < B * S; i++) ids[i] = i % S;   /* what a training step passes */
    j.ctx = lk_ctx_cpu(&arena);
    j.a.q.data = q; j.a.k.data = k;
    j.a.q_out = lk_tensor_view(qo, dt, 4, qs); j.a.k_out = lk_tensor_view(ko, dt, 4, ks);
    j.a.dq_out = lk_tensor_view(dqo, dt, 4, qs); j.a.dk_out = lk_tensor_view(dko, dt, 4, ks);
    j.a.dq = lk_tensor_view(dq, dt, 4, qs); j.a.dk = lk_tensor_view(dk, dt, 4, ks);
    j.a.cos = lk_tensor_2d(cs, LK_F32, S, h); j.a.sin = lk_tensor_2d(sn, LK_F32, S, h);
    j.a.position_ids = lk_tensor_view(ids, LK_I64, 2, is);
    j.a.saved = (lk_saved){saved, saved_bytes};
    if ((s = lk_rope_tables(1e6, d.rotary_dim, NULL, &j.a.cos, &j.a.sin)) ||
        (s = lk_rope_forward(impl, &j.a, &j.ctx)) || (s = lk_rope_backward(impl, &j.a, &j.ctx)))
        goto done;

    /* q and k read once and written once, each way */
    lk_bench_spec spec = {.op = "rope", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd,
                          .bwd = run_bwd, .job = &j, .bytes = {2.0 * (double)(qb + kb), 2.0 * (double)(qb + kb)},
                          .arena = &arena, .extra_bytes = saved_bytes};
    s = lk_bench_passes(&spec, ceil, rows);
done:
    free(q); free(k); free(qo); free(ko); free(dqo); free(dko); free(dq); free(dk);
    free(saved); free(cs); free(sn); free(ids); free(tmp);
    lk_arena_free(&arena);
    return s;
}

/* B x Hq x S x D [x Hk [x R]]: the smallest case, odd S, partial rotary on an odd-length
 * half, GQA 6/2, a half of 64 (four whole vectors), and several batch rows. */
static const lk_shape check_shapes[] = {
    {4, {1, 1, 1, 2}}, {4, {2, 3, 7, 16}}, {6, {1, 6, 9, 64, 2, 32}}, {6, {2, 4, 5, 20, 1, 14}},
    {4, {1, 8, 33, 128}}, {5, {3, 4, 17, 48, 4}},
};

const lk_harness lk_rope_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {4, {1, 32, 2048, 128}},
};
