/* test_swiglu_mlp.c (GPU) — the CUDA SwiGLU MLP `fused` (cuBLAS GEMMs + fused activation)
 * against the float64 reference, forward and backward, f32 and bf16, with and without
 * GPT-OSS's clamp, weight gradients accumulated into f32 or bf16 buffers that already
 * hold values, the backward on the saved block of a forward without out (a recompute's);
 * and the activation kernels alone (the bench's silu(a)·b) on odd and 16-byte shapes. The
 * clamp's limit is picked apart from every pre-activation (lk_swiglu_mlp_ref_limit: seed
 * 13's bf16 case at a fixed 1.5 flipped one gate's clamp, dx 0.13 of max|ref|). Outputs
 * poisoned with NaN first. Tolerances: f32 2e-5 (f32 GEMMs, sums of up to 512 terms); bf16
 * 2e-2 as the CPU eager's: gate_up, h, dh and dgate_up are each rounded to bf16 before the
 * next GEMM, up to four roundings of 2^-9 on a path, mostly averaged by the sums; the
 * activation alone 1e-5 / 1e-2 (one rounding). Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include "cuda_util.h"
#include "ops/swiglu_mlp/cuda_act.h"
#include "ops/swiglu_mlp/reference.h"

typedef struct {
    int64_t t, h, i;
    float limit;
    int grad_f32;
    int saved_alone;   /* the backward reads a forward's saved block without out (a recompute's: out.data
                        * NULL); out comes from a second forward after it */
} mcase;

static void run_mlp(lk_dtype dt, const mcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_SWIGLU_MLP, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t T = c->t, H = c->h, I = c->i, sx[2] = {T, H}, sgu[2] = {2 * I, H}, sd[2] = {H, I};
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    double *x = lkt_alloc(T * H), *wgu = lkt_alloc(2 * I * H), *wd = lkt_alloc(H * I), *dout = lkt_alloc(T * H);
    double *gwgu = lkt_alloc(2 * I * H), *gwd = lkt_alloc(H * I);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wgu, 2 * I * H, &seed, 1.0 / sqrt((double)H));
    lkt_randn(wd, H * I, &seed, 1.0 / sqrt((double)I)), lkt_randn(dout, T * H, &seed, 1.0);
    lkt_randn(gwgu, 2 * I * H, &seed, 1.0), lkt_randn(gwd, H * I, &seed, 1.0);   /* what they hold before */
    const float limit = c->limit > 0 ? (float)lk_swiglu_mlp_ref_limit(c->limit, x, wgu, T, H, I) : 0.0f;
    void *dx_ = lkt_upload(x, T * H, dt), *dwgu = lkt_upload(wgu, 2 * I * H, dt), *dwd = lkt_upload(wd, H * I, dt);
    void *ddout = lkt_upload(dout, T * H, dt), *dgwgu = lkt_upload(gwgu, 2 * I * H, gdt),
         *dgwd = lkt_upload(gwd, H * I, gdt);
    size_t es = lk_dtype_size(dt), saved = 0;
    void *out = lkt_dev(T * H * es), *gx = lkt_dev(T * H * es);
    lkt_poison(out, T * H * es), lkt_poison(gx, T * H * es);
    lk_tensor xt = lkt_view(dx_, dt, 2, sx), gut = lkt_view(dwgu, dt, 2, sgu);
    assert_int_equal(lk_swiglu_mlp_saved_bytes(impl, &xt, &gut, &saved), LK_OK);
    lk_swiglu_mlp_args a = {
        .x = xt, .gate_up_weight = gut, .down_weight = lkt_view(dwd, dt, 2, sd), .out = lkt_view(out, dt, 2, sx),
        .dout = lkt_view(ddout, dt, 2, sx), .dx = lkt_view(gx, dt, 2, sx),
        .d_gate_up_weight = lkt_view(dgwgu, gdt, 2, sgu), .d_down_weight = lkt_view(dgwd, gdt, 2, sd),
        .saved = {lkt_dev(saved), saved}, .swiglu_limit = limit,
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    lk_swiglu_mlp_args alone = a;
    alone.out.data = NULL;
    lkt_poison(a.saved.data, saved);
    assert_int_equal(lk_swiglu_mlp_forward(impl, c->saved_alone ? &alone : &a, &ctx), LK_OK);
    assert_int_equal(lk_swiglu_mlp_backward(impl, &a, &ctx), LK_OK);
    if (c->saved_alone) assert_int_equal(lk_swiglu_mlp_forward(impl, &a, &ctx), LK_OK);

    double *rout = lkt_alloc(T * H), *rdx = lkt_alloc(T * H), *got = lkt_alloc(2 * I * H), e[4];
    lk_swiglu_mlp_ref_forward(x, wgu, wd, T, H, I, limit, rout);
    lk_swiglu_mlp_ref_backward(x, wgu, wd, dout, T, H, I, limit, rdx, gwgu, gwd);   /* accumulates */
    lkt_download(out, T * H, dt, got), e[0] = lkt_rel_err(got, rout, T * H);
    lkt_download(gx, T * H, dt, got), e[1] = lkt_rel_err(got, rdx, T * H);
    lkt_download(dgwgu, 2 * I * H, gdt, got), e[2] = lkt_rel_err(got, gwgu, 2 * I * H);
    lkt_download(dgwd, H * I, gdt, got), e[3] = lkt_rel_err(got, gwd, H * I);
    print_message("  %-4s T %lld H %lld I %lld limit %g grads %s%s: out %.2e dx %.2e dWgu %.2e dWd %.2e\n",
                  lk_dtype_name(dt), (long long)T, (long long)H, (long long)I, (double)limit,
                  lk_dtype_name(gdt), c->saved_alone ? " (saved alone)" : "", e[0], e[1], e[2], e[3]);
    double t = dt == LK_F32 ? 2e-5 : 2e-2;
    for (int i = 0; i < 4; i++) assert_true(e[i] <= t);
    lk_arena_free(&arena);
    lkt_free_all();
}

static void mlp_every_dtype_shape(void **state) {
    (void)state;
    const mcase cases[] = {{37, 64, 96, 0.0f, 1, 0}, {128, 256, 512, 0.0f, 0, 0}, {19, 40, 24, 1.5f, 1, 0},
                           {64, 128, 200, 0.0f, 0, 0}, {5, 33, 7, 0.0f, 0, 0}, {37, 64, 96, 0.0f, 1, 1},
                           {19, 40, 24, 1.5f, 0, 1}};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_mlp(d ? LK_BF16 : LK_F32, &cases[i], 7u + (uint32_t)i);
}

static double silu(double g) { return g / (1.0 + exp(-g)); }

/* silu(a)·b and its backward alone, as the bench calls them: da, db written over a, b. */
static void activation_alone(void **state) {
    (void)state;
    const int64_t shapes[][2] = {{3, 5}, {64, 1024}, {33, 136}, {7, 4099}};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++) {
            lk_dtype dt = d ? LK_BF16 : LK_F32;
            int64_t r = shapes[k][0], c = shapes[k][1], n = r * c;
            uint32_t seed = 11u + (uint32_t)k;
            double *a = lkt_alloc(n), *b = lkt_alloc(n), *dc = lkt_alloc(n), *got = lkt_alloc(n);
            double *rc = lkt_alloc(n), *ra = lkt_alloc(n), *rb = lkt_alloc(n), e[3];
            lkt_randn(a, n, &seed, 2.0), lkt_randn(b, n, &seed, 1.0), lkt_randn(dc, n, &seed, 1.0);
            void *da = lkt_upload(a, n, dt), *db = lkt_upload(b, n, dt), *ddc = lkt_upload(dc, n, dt);
            void *out = lkt_dev(n * lk_dtype_size(dt));
            lkt_poison(out, n * lk_dtype_size(dt));
            for (int64_t i = 0; i < n; i++) {
                double s = 1.0 / (1.0 + exp(-a[i]));
                rc[i] = silu(a[i]) * b[i];
                ra[i] = dc[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
                rb[i] = dc[i] * silu(a[i]);
            }
            assert_int_equal(lk_cuda_swiglu_act_forward(dt, r, c, 0.0f, da, c, db, c, out, c, NULL), LK_OK);
            lkt_download(out, n, dt, got), e[0] = lkt_rel_err(got, rc, n);
            assert_int_equal(lk_cuda_swiglu_act_backward(dt, r, c, 0.0f, ddc, c, da, c, db, c, da, c, db, c, NULL, 0,
                                                         NULL), LK_OK);
            lkt_download(da, n, dt, got), e[1] = lkt_rel_err(got, ra, n);
            lkt_download(db, n, dt, got), e[2] = lkt_rel_err(got, rb, n);
            print_message("  act %-4s %lldx%lld: c %.2e da %.2e db %.2e\n", lk_dtype_name(dt), (long long)r,
                          (long long)c, e[0], e[1], e[2]);
            for (int i = 0; i < 3; i++) assert_true(e[i] <= (dt == LK_F32 ? 1e-5 : 1e-2));
            lkt_free_all();
        }
    /* a dtype the kernels do not take is refused */
    assert_int_equal(lk_cuda_swiglu_act_forward(LK_F16, 1, 1, 0.0f, NULL, 1, NULL, 1, NULL, 1, NULL), LK_EDTYPE);
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_swiglu_mlp")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_every_dtype_shape),
        cmocka_unit_test(activation_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
