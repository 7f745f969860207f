/* test_rope.c (GPU) — the CUDA RoPE `fused` against the float64 reference, forward and
 * backward, f32 and bf16: full and partial rotary dims, GQA, odd dims (the scalar path),
 * position ids i32 and i64 with packed documents restarting at 0, in place, outputs
 * poisoned with NaN first, head counts that do not fill the last group, every heads-per-
 * thread setting of the kernel; and an id outside the tables giving NaN for that token, not
 * a read outside them. Tolerances as the CPU harness states them: f32 math and one
 * rounding of the output: f32 1e-5, bf16 1e-2. Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include "cuda_util.h"
#include "ops/rope/check.h"
#include "ops/rope/reference.h"

typedef struct {
    int64_t b, hq, hk, s, d, r;
    int ids;          /* 0 none, 1 i32, 2 i64 */
    int inplace;
} pcase;

static void run_case(lk_dtype dt, const pcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_ROPE, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t R = c->r ? c->r : c->d, half = R / 2, max_pos = c->s + 3;
    int64_t nq = c->b * c->hq * c->s * c->d, nk = c->b * c->hk * c->s * c->d;
    int64_t sq[4] = {c->b, c->hq, c->s, c->d}, sk[4] = {c->b, c->hk, c->s, c->d}, st[2] = {max_pos, half};
    int64_t sp[2] = {c->b, c->s};
    size_t es = lk_dtype_size(dt);
    float *cs = calloc((size_t)(max_pos * half), 4), *sn = calloc((size_t)(max_pos * half), 4);
    lk_tensor tc = lk_tensor_2d(cs, LK_F32, max_pos, half), ts = lk_tensor_2d(sn, LK_F32, max_pos, half);
    assert_int_equal(lk_rope_tables(10000.0, R, NULL, &tc, &ts), LK_OK);
    double *cosd = lkt_alloc(max_pos * half), *sind = lkt_alloc(max_pos * half);
    for (int64_t i = 0; i < max_pos * half; i++) cosd[i] = cs[i], sind[i] = sn[i];
    void *dcos = lkt_upload(cosd, max_pos * half, LK_F32), *dsin = lkt_upload(sind, max_pos * half, LK_F32);
    free(cs), free(sn);
    /* packed documents: positions restart at 0 every 5 tokens, shifted by the batch row */
    double *pos = lkt_alloc(c->b * c->s);
    int64_t *pos64 = (int64_t *)lkt_alloc(c->b * c->s);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t t = 0; t < c->s; t++) pos[b * c->s + t] = pos64[b * c->s + t] = c->ids ? (t % 5) + b : t;
    void *dpos = c->ids ? lkt_upload(pos, c->b * c->s, c->ids == 1 ? LK_I32 : LK_I64) : NULL;

    double *q = lkt_alloc(nq), *k = lkt_alloc(nk), *gq = lkt_alloc(nq), *gk = lkt_alloc(nk);
    lkt_randn(q, nq, &seed, 1.0), lkt_randn(k, nk, &seed, 1.0);
    lkt_randn(gq, nq, &seed, 1.0), lkt_randn(gk, nk, &seed, 1.0);
    void *dq = lkt_upload(q, nq, dt), *dk = lkt_upload(k, nk, dt), *dgq = lkt_upload(gq, nq, dt),
         *dgk = lkt_upload(gk, nk, dt);
    void *oq = c->inplace ? dq : lkt_dev(nq * es), *ok = c->inplace ? dk : lkt_dev(nk * es);
    void *odq = c->inplace ? dgq : lkt_dev(nq * es), *odk = c->inplace ? dgk : lkt_dev(nk * es);
    if (!c->inplace) {
        lkt_poison(oq, nq * es), lkt_poison(ok, nk * es);
        lkt_poison(odq, nq * es), lkt_poison(odk, nk * es);
    }
    lk_rope_args a = {
        .q = lkt_view(dq, dt, 4, sq), .k = lkt_view(dk, dt, 4, sk), .q_out = lkt_view(oq, dt, 4, sq),
        .k_out = lkt_view(ok, dt, 4, sk), .dq_out = lkt_view(dgq, dt, 4, sq), .dk_out = lkt_view(dgk, dt, 4, sk),
        .dq = lkt_view(odq, dt, 4, sq), .dk = lkt_view(odk, dt, 4, sk), .cos = lkt_view(dcos, LK_F32, 2, st),
        .sin = lkt_view(dsin, LK_F32, 2, st), .position_ids = lkt_view(dpos, c->ids == 2 ? LK_I64 : LK_I32, 2, sp),
        .rotary_dim = c->r,
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_rope_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_rope_backward(impl, &a, &ctx), LK_OK);

    lk_rope_ref_problem p = {c->b, c->hq, c->s, c->d, R, cosd, sind, c->ids ? pos64 : NULL};
    double *ref = lkt_alloc(nq > nk ? nq : nk), *out = lkt_alloc(nq > nk ? nq : nk), e[4];
    lk_rope_ref_forward(&p, q, ref), lkt_download(oq, nq, dt, out), e[0] = lkt_rel_err(out, ref, nq);
    lk_rope_ref_backward(&p, gq, ref), lkt_download(odq, nq, dt, out), e[2] = lkt_rel_err(out, ref, nq);
    p.heads = c->hk;
    lk_rope_ref_forward(&p, k, ref), lkt_download(ok, nk, dt, out), e[1] = lkt_rel_err(out, ref, nk);
    lk_rope_ref_backward(&p, gk, ref), lkt_download(odk, nk, dt, out), e[3] = lkt_rel_err(out, ref, nk);
    print_message("  %-4s [%lld,%lld/%lld,%lld,%lld] R %lld ids %d inplace %d: q %.2e k %.2e dq %.2e dk %.2e\n",
                  lk_dtype_name(dt), (long long)c->b, (long long)c->hq, (long long)c->hk, (long long)c->s,
                  (long long)c->d, (long long)R, c->ids, c->inplace, e[0], e[1], e[2], e[3]);
    double t = lk_rope_tol(impl, dt);     /* the CPU harness's: f32 1e-5, bf16 1e-2 (check.h) */
    for (int i = 0; i < 4; i++) assert_true(e[i] <= t);
    lk_arena_free(&arena);
    lkt_free_all();
}

static const pcase cases[] = {
    {2, 4, 2, 16, 128, 0, 0, 0},     /* 16-byte path, GQA */
    {1, 8, 8, 33, 128, 64, 1, 0},    /* partial rotary, i32 ids */
    {2, 6, 3, 7, 64, 0, 2, 1},       /* i64 ids, in place */
    {1, 3, 1, 9, 18, 10, 0, 0},      /* odd dims: scalar path, pass-through copy */
    {3, 5, 5, 11, 6, 0, 1, 1},       /* six dims, in place */
    {1, 15, 5, 37, 128, 96, 0, 1},   /* head counts not multiples of the 4-head groups, in place */
};

static void every_dtype_shape(void **state) {
    (void)state;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 99u + (uint32_t)i);
}

/* A position id outside the tables: NaN over that token's rotated dims, the others right. */
static void bad_position_id_is_nan(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_ROPE, "fused", LK_DEVICE_CUDA);
    int64_t S = 4, D = 8, sq[4] = {1, 1, S, D}, st[2] = {S, D / 2}, sp[2] = {1, S};
    double q[32], pos[4] = {0, 1, 99, 2}, tab[16], out[32];
    uint32_t seed = 3;
    lkt_randn(q, 32, &seed, 1.0);
    lkt_randn(tab, 16, &seed, 1.0);
    void *dq = lkt_upload(q, 32, LK_F32), *dk = lkt_upload(q, 32, LK_F32), *dt = lkt_upload(tab, 16, LK_F32);
    void *dp = lkt_upload(pos, 4, LK_I32), *oq = lkt_dev(128), *ok = lkt_dev(128);
    lk_rope_args a = {.q = lkt_view(dq, LK_F32, 4, sq), .k = lkt_view(dk, LK_F32, 4, sq),
                      .q_out = lkt_view(oq, LK_F32, 4, sq), .k_out = lkt_view(ok, LK_F32, 4, sq),
                      .cos = lkt_view(dt, LK_F32, 2, st), .sin = lkt_view(dt, LK_F32, 2, st),
                      .position_ids = lkt_view(dp, LK_I32, 2, sp)};
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_rope_forward(impl, &a, &ctx), LK_OK);
    lkt_download(oq, 32, LK_F32, out);
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < 8; j++) assert_true(t == 2 ? isnan(out[t * 8 + j]) : isfinite(out[t * 8 + j]));
    lk_arena_free(&arena);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_rope")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_shape),
        cmocka_unit_test(bad_position_id_is_nan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
