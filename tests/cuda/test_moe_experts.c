/* test_moe_experts.c (GPU) — the CUDA `fused` MoE experts against the float64 reference,
 * forward (out) and backward (d_hidden, d_topk_weights, and the weight gradients added
 * onto random values already there), f32 and bf16, gradients in f32 or the storage
 * dtype: odd sizes, experts with no token, a token sent twice to one expert, outputs
 * poisoned with NaN first. Tolerances (max-normalized): f32 1e-5 (exact f32 GEMMs against
 * float64; seen <= 1.3e-6), bf16 3e-2 (bf16 GEMM operands, rows rounded between the
 * GEMMs; seen <= 1.6e-2, d_topk_weights of a lone token). And a
 * bad expert id refused before anything is written. Skipped (77) where there is no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "ops/moe/reference.h"

typedef struct {
    int64_t t, h, i, e, k;
    int dup;        /* ids from the lower half of the experts, repeats allowed */
    int grad_f32;   /* weight gradients in f32 (else the storage dtype) */
} mcase;

static uint32_t next(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

static void *up_i32(const int32_t *h, int64_t n) {
    void *d = lkt_dev((size_t)n * 4);
    assert_int_equal(cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static double err_of(const void *dev, int64_t n, lk_dtype dt, const double *ref) {
    double *got = lkt_alloc(n);
    lkt_download(dev, n, dt, got);
    return lkt_rel_err(got, ref, n);
}

static void run_case(lk_dtype dt, const mcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t T = c->t, H = c->h, I = c->i, E = c->e, K = c->k, R = T * K, ngu = E * 2 * I * H, nd = E * H * I;
    double *x = lkt_alloc(T * H), *w = lkt_alloc(R), *wgu = lkt_alloc(ngu), *wd = lkt_alloc(nd);
    double *dout = lkt_alloc(T * H), *dgu = lkt_alloc(ngu), *dd = lkt_alloc(nd);
    int32_t *ids = (int32_t *)lkt_alloc(R);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wgu, ngu, &seed, 0.2), lkt_randn(wd, nd, &seed, 0.2);
    lkt_randn(dout, T * H, &seed, 1.0), lkt_randn(dgu, ngu, &seed, 0.1), lkt_randn(dd, nd, &seed, 0.1);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++) {
            w[t * K + j] = 0.1 + (next(&seed) % 1000) / 1000.0;
            if (c->dup) {
                ids[t * K + j] = (int32_t)(next(&seed) % (uint32_t)(E / 2));
            } else {   /* k distinct experts */
                int32_t id;
                int again;
                do {
                    id = (int32_t)(next(&seed) % (uint32_t)E), again = 0;
                    for (int64_t q = 0; q < j; q++) again |= ids[t * K + q] == id;
                } while (again);
                ids[t * K + j] = id;
            }
        }
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    size_t es = lk_dtype_size(dt);
    void *dx_ = lkt_upload(x, T * H, dt), *dw_ = lkt_upload(w, R, LK_F32), *dgu_w = lkt_upload(wgu, ngu, dt);
    void *dd_w = lkt_upload(wd, nd, dt), *ddout = lkt_upload(dout, T * H, dt), *dids = up_i32(ids, R);
    void *gdgu = lkt_upload(dgu, ngu, gdt), *gdd = lkt_upload(dd, nd, gdt);   /* rounded: the ref adds onto these */
    void *out = lkt_dev((size_t)(T * H) * es), *dh = lkt_dev((size_t)(T * H) * es), *dwt = lkt_dev((size_t)R * 4);
    lkt_poison(out, (size_t)(T * H) * es), lkt_poison(dh, (size_t)(T * H) * es), lkt_poison(dwt, (size_t)R * 4);
    double *oref = lkt_alloc(T * H), *dxr = lkt_alloc(T * H), *dwr = lkt_alloc(R);
    lk_moe_experts_ref_forward(x, ids, w, wgu, wd, T, K, E, H, I, oref);
    lk_moe_experts_ref_backward(x, ids, w, wgu, wd, dout, T, K, E, H, I, dxr, dwr, dgu, dd);   /* dgu, dd += */

    int64_t sx[2] = {T, H}, sk[2] = {T, K}, sgu[3] = {E, 2 * I, H}, sd[3] = {E, H, I};
    lk_moe_experts_args a = {
        .hidden = lkt_view(dx_, dt, 2, sx), .topk_ids = lkt_view(dids, LK_I32, 2, sk),
        .topk_weights = lkt_view(dw_, LK_F32, 2, sk), .gate_up_weight = lkt_view(dgu_w, dt, 3, sgu),
        .down_weight = lkt_view(dd_w, dt, 3, sd), .out = lkt_view(out, dt, 2, sx), .dout = lkt_view(ddout, dt, 2, sx),
        .d_hidden = lkt_view(dh, dt, 2, sx), .d_topk_weights = lkt_view(dwt, LK_F32, 2, sk),
        .d_gate_up_weight = lkt_view(gdgu, gdt, 3, sgu), .d_down_weight = lkt_view(gdd, gdt, 3, sd),
    };
    size_t sb = 0;
    assert_int_equal(lk_moe_experts_saved_bytes(impl, T, K, E, H, I, dt, &sb), LK_OK);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(a.saved.data, sb);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_moe_experts_backward(impl, &a, &ctx), LK_OK);
    double e[5] = {err_of(out, T * H, dt, oref), err_of(dh, T * H, dt, dxr), err_of(dwt, R, LK_F32, dwr),
                   err_of(gdgu, ngu, gdt, dgu), err_of(gdd, nd, gdt, dd)};
    double tol = dt == LK_F32 ? 1e-5 : 3e-2;
    print_message("  %s T %lld H %lld I %lld E %lld k %lld%s grads %s: out %.1e dx %.1e dw %.1e dgu %.1e dd %.1e "
                  "(tol %.0e)\n", lk_dtype_name(dt), (long long)T, (long long)H, (long long)I, (long long)E,
                  (long long)K, c->dup ? " dup" : "", lk_dtype_name(gdt), e[0], e[1], e[2], e[3], e[4], tol);
    for (int i = 0; i < 5; i++) assert_true(e[i] <= tol);
    lk_arena_free(&arena);
    lkt_free_all();
}

static void against_reference(void **state) {
    (void)state;
    const mcase cases[] = {
        {37, 48, 40, 5, 2, 0, 1},
        {64, 128, 96, 8, 3, 1, 0},     /* repeats; the upper experts get no token */
        {1, 32, 16, 4, 4, 0, 0},       /* one token, every expert */
        {50, 64, 24, 16, 1, 0, 1},     /* more experts than tokens need */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 31u + (uint32_t)i);
}

/* An id outside [0, E) is refused by the forward before it writes out or saved. */
static void bad_id_refused(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CUDA);
    int64_t T = 3, H = 16, I = 8, E = 4, K = 2, sx[2] = {T, H}, sk[2] = {T, K}, sgu[3] = {E, 2 * I, H},
            sd[3] = {E, H, I};
    int32_t ids[6] = {0, 1, 2, 7, 3, 0};
    double *z = lkt_alloc(E * 2 * I * H);
    lk_moe_experts_args a = {
        .hidden = lkt_view(lkt_upload(z, T * H, LK_F32), LK_F32, 2, sx), .topk_ids = lkt_view(up_i32(ids, 6), LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_upload(z, T * K, LK_F32), LK_F32, 2, sk),
        .gate_up_weight = lkt_view(lkt_upload(z, E * 2 * I * H, LK_F32), LK_F32, 3, sgu),
        .down_weight = lkt_view(lkt_upload(z, E * H * I, LK_F32), LK_F32, 3, sd),
        .out = lkt_view(lkt_dev((size_t)(T * H) * 4), LK_F32, 2, sx),
    };
    size_t sb = 0;
    assert_int_equal(lk_moe_experts_saved_bytes(impl, T, K, E, H, I, LK_F32, &sb), LK_OK);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(a.out.data, (size_t)(T * H) * 4), lkt_poison(a.saved.data, sb);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "topk_ids"));
    unsigned char *o = malloc(sb > (size_t)(T * H) * 4 ? sb : (size_t)(T * H) * 4);
    assert_int_equal(cudaMemcpy(o, a.out.data, (size_t)(T * H) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < T * H * 4; i++) assert_int_equal(o[i], 0xff);
    assert_int_equal(cudaMemcpy(o, a.saved.data, sb, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < sb; i++) assert_int_equal(o[i], 0xff);
    free(o);
    lk_arena_free(&arena);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_experts")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_reference),
        cmocka_unit_test(bad_id_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
