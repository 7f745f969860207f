/* test_moe_dispatch.c (GPU) — the CUDA moe_dispatch rows on one GPU: `alltoall` with no
 * group (ctx.comm NULL) and with lk_comm_self(), and `allgather`, against the CUDA `local`
 * (the experts op itself): out, d_hidden, d_topk_weights, and the weight gradients added
 * onto random values already there; f32 (1e-5) and bf16 (2e-2: each route's row is
 * rounded once more before the k-way sum), skewed routing (experts with no token) and
 * uniform, outputs poisoned with NaN first. The f32 CUDA `alltoall` is also held to the
 * CPU `local` (1e-5). Bad input is refused before anything is written: an expert id out
 * of range (read from device memory), a CPU tensor, CPU experts, a host arena. Skipped
 * (77) where there is no GPU. ctest: cuda_test_moe_dispatch. */
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

typedef struct {
    int64_t T, H, I, E, k;
    int skew;           /* routes avoid the first and the last expert */
} dcase;

/* One problem: host values already rounded to their dtypes (lkt_upload does it). */
typedef struct {
    int64_t T, H, I, E, k;
    lk_dtype dt, gdt;
    double *x, *w, *gu, *dn, *dout, *ggu, *gdn;
    int32_t *ids;
} problem;

static uint32_t next(uint32_t *s) {
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s;
}

static void make(problem *pb, const dcase *c, lk_dtype dt, lk_dtype gdt, uint32_t seed) {
    *pb = (problem){.T = c->T, .H = c->H, .I = c->I, .E = c->E, .k = c->k, .dt = dt, .gdt = gdt};
    int64_t NH = c->T * c->H, R = c->T * c->k, G = c->E * 2 * c->I * c->H, D = c->E * c->H * c->I;
    pb->x = lkt_alloc(NH), pb->dout = lkt_alloc(NH), pb->w = lkt_alloc(R);
    pb->gu = lkt_alloc(G), pb->dn = lkt_alloc(D), pb->ggu = lkt_alloc(G), pb->gdn = lkt_alloc(D);
    pb->ids = (int32_t *)lkt_alloc(R);
    lkt_randn(pb->x, NH, &seed, 1.0), lkt_randn(pb->dout, NH, &seed, 1.0);
    lkt_randn(pb->gu, G, &seed, 0.2), lkt_randn(pb->dn, D, &seed, 0.2);
    lkt_randn(pb->ggu, G, &seed, 0.1), lkt_randn(pb->gdn, D, &seed, 0.1);
    uint32_t lo = c->skew ? 1 : 0, n = (uint32_t)c->E - 2 * lo;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t j = 0; j < c->k; j++) {   /* k distinct experts */
            int again;
            do {
                pb->ids[t * c->k + j] = (int32_t)(lo + next(&seed) % n), again = 0;
                for (int64_t q = 0; q < j; q++) again |= pb->ids[t * c->k + q] == pb->ids[t * c->k + j];
            } while (again);
            pb->w[t * c->k + j] = 0.1 + (next(&seed) % 1000) / 1000.0;
        }
}

/* pb on the GPU, outputs poisoned; the gradients start from pb's values. */
static lk_moe_dispatch_args on_gpu(problem *pb) {
    int64_t T = pb->T, H = pb->H, I = pb->I, E = pb->E, k = pb->k;
    int64_t sx[2] = {T, H}, sk[2] = {T, k}, sg[3] = {E, 2 * I, H}, sd[3] = {E, H, I};
    size_t es = lk_dtype_size(pb->dt);
    void *ids = lkt_dev((size_t)(T * k) * 4);
    assert_int_equal(cudaMemcpy(ids, pb->ids, (size_t)(T * k) * 4, cudaMemcpyHostToDevice), cudaSuccess);
    lk_moe_dispatch_args a = {
        .hidden = lkt_view(lkt_upload(pb->x, T * H, pb->dt), pb->dt, 2, sx), .topk_ids = lkt_view(ids, LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_upload(pb->w, T * k, LK_F32), LK_F32, 2, sk),
        .gate_up_weight = lkt_view(lkt_upload(pb->gu, E * 2 * I * H, pb->dt), pb->dt, 3, sg),
        .down_weight = lkt_view(lkt_upload(pb->dn, E * H * I, pb->dt), pb->dt, 3, sd),
        .out = lkt_view(lkt_dev((size_t)(T * H) * es), pb->dt, 2, sx),
        .dout = lkt_view(lkt_upload(pb->dout, T * H, pb->dt), pb->dt, 2, sx),
        .d_hidden = lkt_view(lkt_dev((size_t)(T * H) * es), pb->dt, 2, sx),
        .d_topk_weights = lkt_view(lkt_dev((size_t)(T * k) * 4), LK_F32, 2, sk),
        .d_gate_up_weight = lkt_view(lkt_upload(pb->ggu, E * 2 * I * H, pb->gdt), pb->gdt, 3, sg),
        .d_down_weight = lkt_view(lkt_upload(pb->gdn, E * H * I, pb->gdt), pb->gdt, 3, sd),
        .n_experts = (int)E,
    };
    lkt_poison(a.out.data, (size_t)(T * H) * es), lkt_poison(a.d_hidden.data, (size_t)(T * H) * es);
    lkt_poison(a.d_topk_weights.data, (size_t)(T * k) * 4);
    return a;
}

/* Forward then backward with impl; the five outputs come down into o[5]. */
static void run(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx, double *o[5]) {
    assert_non_null(impl);
    lk_status s = lk_moe_dispatch_forward(impl, a, ctx);
    if (!s) s = lk_moe_dispatch_backward(impl, a, ctx);
    if (s) print_error("%s: %s\n", impl->name, lk_last_error());
    assert_int_equal(s, LK_OK);
    const lk_tensor *t[5] = {&a->out, &a->d_hidden, &a->d_topk_weights, &a->d_gate_up_weight, &a->d_down_weight};
    for (int i = 0; i < 5; i++) {
        o[i] = lkt_alloc(lk_tensor_numel(t[i]));
        lkt_download(t[i]->data, lk_tensor_numel(t[i]), t[i]->dtype, o[i]);
    }
}

static const char *const names[5] = {"out", "d_hidden", "d_topk_weights", "d_gate_up_weight", "d_down_weight"};

static void expect_close(const char *what, const problem *pb, double *got[5], double *want[5], double tol) {
    int64_t n[5] = {pb->T * pb->H, pb->T * pb->H, pb->T * pb->k, pb->E * 2 * pb->I * pb->H, pb->E * pb->H * pb->I};
    for (int i = 0; i < 5; i++) {
        double e = lkt_rel_err(got[i], want[i], n[i]);
        if (e > tol)
            print_message("  %s %s: %s relative error %.3g > %g\n", what, lk_dtype_name(pb->dt), names[i], e, tol);
        assert_true(e <= tol);
    }
}

/* The CPU `local` on the same (rounded) values: out, d_hidden, ... as doubles. */
static void cpu_local(const problem *pb, double *o[5]) {
    int64_t T = pb->T, H = pb->H, I = pb->I, E = pb->E, k = pb->k;
    int64_t n[5] = {T * H, T * H, T * k, E * 2 * I * H, E * H * I};
    int64_t sg[3] = {E, 2 * I, H}, sd[3] = {E, H, I};
    float *f[9];
    const double *src[9] = {pb->x, pb->w, pb->gu, pb->dn, pb->dout, pb->ggu, pb->gdn, NULL, NULL};
    int64_t len[9] = {T * H, T * k, E * 2 * I * H, E * H * I, T * H, E * 2 * I * H, E * H * I, T * H, T * H};
    for (int i = 0; i < 9; i++) {
        f[i] = malloc(4 * (size_t)len[i]);
        for (int64_t j = 0; j < len[i]; j++) f[i][j] = src[i] ? (float)src[i][j] : NAN;
    }
    float *dw = malloc(4 * (size_t)(T * k));
    lk_moe_dispatch_args a = {
        .hidden = lk_tensor_2d(f[0], LK_F32, T, H), .topk_ids = lk_tensor_2d(pb->ids, LK_I32, T, k),
        .topk_weights = lk_tensor_2d(f[1], LK_F32, T, k), .gate_up_weight = lk_tensor_view(f[2], LK_F32, 3, sg),
        .down_weight = lk_tensor_view(f[3], LK_F32, 3, sd), .out = lk_tensor_2d(f[7], LK_F32, T, H),
        .dout = lk_tensor_2d(f[4], LK_F32, T, H), .d_hidden = lk_tensor_2d(f[8], LK_F32, T, H),
        .d_topk_weights = lk_tensor_2d(dw, LK_F32, T, k), .d_gate_up_weight = lk_tensor_view(f[5], LK_F32, 3, sg),
        .d_down_weight = lk_tensor_view(f[6], LK_F32, 3, sd), .n_experts = (int)E,
    };
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    const lk_impl *local = lk_impl_find(LK_OP_MOE_DISPATCH, "local", LK_DEVICE_CPU);
    assert_int_equal(lk_moe_dispatch_forward(local, &a, &ctx), LK_OK);
    assert_int_equal(lk_moe_dispatch_backward(local, &a, &ctx), LK_OK);
    const float *res[5] = {f[7], f[8], dw, f[5], f[6]};
    for (int i = 0; i < 5; i++) {
        o[i] = lkt_alloc(n[i]);
        for (int64_t j = 0; j < n[i]; j++) o[i][j] = res[i][j];
    }
    for (int i = 0; i < 9; i++) free(f[i]);
    free(dw);
    lk_arena_free(&arena);
}

static void run_case(const dcase *c, lk_dtype dt, lk_dtype gdt, uint32_t seed) {
    problem pb;
    make(&pb, c, dt, gdt, seed);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    double *ref[5], *got[5];
    lk_moe_dispatch_args a = on_gpu(&pb);
    run(lk_impl_find(LK_OP_MOE_DISPATCH, "local", LK_DEVICE_CUDA), &a, &ctx, ref);
    double tol = dt == LK_F32 ? 1e-5 : 2e-2;
    struct { const char *name; lk_comm *comm; } rows[3] = {{"alltoall", NULL}, {"alltoall", lk_comm_self()},
                                                           {"allgather", NULL}};
    for (int i = 0; i < 3; i++) {
        a = on_gpu(&pb);
        ctx.comm = rows[i].comm;
        run(lk_impl_find(LK_OP_MOE_DISPATCH, rows[i].name, LK_DEVICE_CUDA), &a, &ctx, got);
        expect_close(rows[i].name, &pb, got, ref, tol);
        if (i == 0 && dt == LK_F32 && gdt == LK_F32) {   /* and the CPU row, the repository's reference */
            double *cpu[5];
            cpu_local(&pb, cpu);
            expect_close("alltoall vs CPU local", &pb, got, cpu, 1e-5);
        }
    }
    print_message("  %s T %lld H %lld I %lld E %lld k %lld%s grads %s: alltoall (NULL, self), allgather = local\n",
                  lk_dtype_name(dt), (long long)c->T, (long long)c->H, (long long)c->I, (long long)c->E,
                  (long long)c->k, c->skew ? " skewed" : "", lk_dtype_name(gdt));
    lk_arena_free(&arena);
    lkt_free_all();
}

static void against_local(void **state) {
    (void)state;
    const dcase cases[] = {
        {37, 48, 40, 6, 2, 1},      /* experts 0 and 5 get no token */
        {64, 64, 24, 8, 3, 0},
        {1, 32, 16, 4, 4, 0},       /* one token, every expert */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            lk_dtype dt = d ? LK_BF16 : LK_F32;
            run_case(&cases[i], dt, i == 1 ? LK_F32 : dt, 17u + (uint32_t)i);
        }
}

/* Each refusal leaves out as poisoned and names what was wrong. */
static void expect_refused(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx, lk_status want,
                           const char *names_arg) {
    size_t n = lk_tensor_bytes(&a->out);
    lkt_poison(a->out.data, n);
    assert_int_equal(lk_moe_dispatch_forward(impl, a, ctx), want);
    if (!strstr(lk_last_error(), names_arg)) print_message("  unexpected message: %s\n", lk_last_error());
    assert_non_null(strstr(lk_last_error(), names_arg));
    unsigned char *o = malloc(n);
    assert_int_equal(cudaMemcpy(o, a->out.data, n, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++) assert_int_equal(o[i], 0xff);
    free(o);
}

static void bad_input_refused(void **state) {
    (void)state;
    const dcase c = {5, 16, 8, 4, 2, 0};
    problem pb;
    make(&pb, &c, LK_F32, LK_F32, 5u);
    pb.ids[7] = 4;   /* == E */
    lk_moe_dispatch_args a = on_gpu(&pb);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    const char *rows[3] = {"local", "alltoall", "allgather"};
    for (int i = 0; i < 3; i++) {
        const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, rows[i], LK_DEVICE_CUDA);
        assert_non_null(impl);
        expect_refused(impl, &a, &ctx, LK_EINVAL, "topk_ids");
    }
    pb.ids[7] = 3;
    a = on_gpu(&pb);
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, "alltoall", LK_DEVICE_CUDA);
    lk_moe_dispatch_args bad = a;
    bad.topk_weights.device.type = LK_DEVICE_CPU;
    expect_refused(impl, &bad, &ctx, LK_EDEVICE, "topk_weights");
    bad = a;
    bad.experts = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CPU);
    expect_refused(impl, &bad, &ctx, LK_EDEVICE, "experts");
    lk_arena host = {0};
    lk_ctx hctx = lk_ctx_cuda(&host, NULL, 0);
    expect_refused(impl, &a, &hctx, LK_EDEVICE, "arena");
    lk_arena_free(&arena);
    lkt_free_all();
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_dispatch")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_local),
        cmocka_unit_test(bad_input_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
