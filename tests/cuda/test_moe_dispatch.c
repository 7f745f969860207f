/* test_moe_dispatch.c (GPU) — the CUDA moe_dispatch rows on one GPU, a group of one:
 * the device-count `alltoall` (alltoall_cuda.c) and `allgather` (allgather_cuda.c), each
 * with no group (ctx.comm NULL), with lk_comm_self(), with max_tokens above T (so their
 * slots hold padding), and over an NCCL communicator of one rank (lk_comm_all_to_all_on,
 * all_gather_on and reduce_scatter_on to itself; where the build has NCCL), against the
 * CUDA `local` (the experts op itself): out, d_hidden, d_topk_weights, and the weight
 * gradients added onto random values already there; f32 (1e-5) and bf16 (2e-2: each
 * route's row is rounded once more before the k-way sum); skewed routing (experts with no
 * token), uniform, and every token on the same experts (one expert with k = 1), T 1, 37,
 * 64, 130, 257 (no tile multiple); outputs poisoned with NaN first. Both are also held to
 * the float64 oracle (ops/moe/reference.h; f32 1e-4, bf16 3e-2) and, in f32, to the CPU
 * `local` (1e-5). A CUDA graph captures each one's forward + backward (global capture
 * mode: any host sync or synchronous copy fails it) with no group and over NCCL, and its
 * replays match the uncaptured calls bit for bit. Bad input: an expert id out of range
 * makes the CUDA local's, alltoall's and allgather's outputs NaN (the ids stay on the
 * device); max_tokens below T, a CPU tensor, f32 topk_ids, weights of
 * the wrong expert count, CPU experts and a host arena are refused by both rows before
 * anything is written, lk_last_error() naming the argument. Skipped (77) where there is
 * no GPU. ctest: cuda_test_moe_dispatch. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "ops/moe/reference.h"

#define SKEW 1     /* routes avoid the first and the last expert */
#define SAME 2     /* every token takes experts 1 .. k */

/* An NCCL communicator of this one process (NULL in a build without NCCL). */
static lk_comm *nccl1;

typedef struct {
    int64_t T, H, I, E, k;
    int mode;           /* 0 uniform, SKEW, SAME */
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
    uint32_t lo = c->mode == SKEW ? 1 : 0, n = (uint32_t)c->E - 2 * lo;
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t j = 0; j < c->k; j++) {   /* k distinct experts */
            int again;
            do {
                pb->ids[t * c->k + j] = c->mode == SAME ? (int32_t)(1 + j) : (int32_t)(lo + next(&seed) % n), again = 0;
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

/* The float64 oracle on the same (rounded) values; the gradients onto pb's. */
static void f64_ref(const problem *pb, double *o[5]) {
    int64_t T = pb->T, H = pb->H, I = pb->I, E = pb->E, k = pb->k, G = E * 2 * I * H, D = E * H * I;
    o[0] = lkt_alloc(T * H), o[1] = lkt_alloc(T * H), o[2] = lkt_alloc(T * k), o[3] = lkt_alloc(G), o[4] = lkt_alloc(D);
    memcpy(o[3], pb->ggu, 8 * (size_t)G), memcpy(o[4], pb->gdn, 8 * (size_t)D);
    lk_moe_experts_ref_forward(pb->x, pb->ids, pb->w, pb->gu, pb->dn, T, k, E, H, I, o[0]);
    lk_moe_experts_ref_backward(pb->x, pb->ids, pb->w, pb->gu, pb->dn, pb->dout, T, k, E, H, I, o[1], o[2], o[3],
                                o[4]);
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
    double *f64[5], *cpu[5];
    f64_ref(&pb, f64);
    int with_cpu = dt == LK_F32 && gdt == LK_F32;
    if (with_cpu) cpu_local(&pb, cpu);
    /* each device-count row with no group, self, padded slots, and an NCCL group of one */
    struct { const char *name; int nccl; int self; int64_t extra; } rows[10] = {
        {"alltoall", 0, 0, 0}, {"alltoall", 0, 1, 0}, {"alltoall", 0, 0, 3}, {"alltoall", 1, 0, 0},
        {"alltoall", 1, 0, 5}, {"allgather", 0, 0, 0}, {"allgather", 0, 1, 0}, {"allgather", 0, 0, 3},
        {"allgather", 1, 0, 0}, {"allgather", 1, 0, 5}};
    for (int i = 0; i < 10; i++) {
        if (rows[i].nccl && !nccl1) continue;
        a = on_gpu(&pb);
        ctx.comm = rows[i].nccl ? nccl1 : rows[i].self ? lk_comm_self() : NULL;
        a.max_tokens = rows[i].extra ? pb.T + rows[i].extra : 0;   /* above T: padding in the slots */
        run(lk_impl_find(LK_OP_MOE_DISPATCH, rows[i].name, LK_DEVICE_CUDA), &a, &ctx, got);
        char what[96];
        snprintf(what, sizeof what, "%s%s%s max_tokens %lld", rows[i].name, rows[i].nccl ? " (nccl)" : "",
                 rows[i].self ? " (self)" : "", (long long)a.max_tokens);
        expect_close(what, &pb, got, ref, tol);
        if (rows[i].extra == 0 && !rows[i].self) {
            /* and the float64 oracle; in f32 the CPU row, the repository's reference, too */
            char vs[128];
            snprintf(vs, sizeof vs, "%s vs float64", what);
            expect_close(vs, &pb, got, f64, dt == LK_F32 ? 1e-4 : 3e-2);
            snprintf(vs, sizeof vs, "%s vs CPU local", what);
            if (with_cpu) expect_close(vs, &pb, got, cpu, 1e-5);
        }
    }
    ctx.comm = NULL;
    print_message("  %s T %lld H %lld I %lld E %lld k %lld%s grads %s: alltoall, allgather (NULL, self, padded%s) "
                  "= local\n", lk_dtype_name(dt), (long long)c->T, (long long)c->H, (long long)c->I, (long long)c->E,
                  (long long)c->k, c->mode == SKEW ? " skewed" : c->mode == SAME ? " same experts" : "",
                  lk_dtype_name(gdt), nccl1 ? ", nccl" : "");
    lk_arena_free(&arena);
    lkt_free_all();
}

static void against_local(void **state) {
    (void)state;
    const dcase cases[] = {
        {37, 48, 40, 6, 2, SKEW},   /* experts 0 and 5 get no token */
        {64, 64, 24, 8, 3, 0},
        {1, 32, 16, 4, 4, 0},       /* one token, every expert */
        {130, 40, 24, 4, 1, SAME},  /* every token on expert 1, the others none */
        {257, 72, 56, 8, 2, SAME},  /* experts 1 and 2 take every token */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            lk_dtype dt = d ? LK_BF16 : LK_F32;
            run_case(&cases[i], dt, i % 2 ? LK_F32 : dt, 17u + (uint32_t)i);
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

/* Every element of t NaN (downloaded as doubles). */
static void expect_all_nan(const char *what, const lk_tensor *t) {
    int64_t n = lk_tensor_numel(t);
    double *h = lkt_alloc(n);
    lkt_download(t->data, n, t->dtype, h);
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++) finite += !isnan(h[i]);
    if (finite) print_message("  %s: %lld of %lld elements not NaN\n", what, (long long)finite, (long long)n);
    assert_int_equal(finite, 0);
}

/* A bad id on the rows that keep the ids on the device: LK_OK, and out (forward), d_hidden
 * and d_topk_weights (backward) NaN, every element (zeroed first, so NaN is written). */
static void bad_id_nan(const lk_impl *impl, const lk_moe_dispatch_args *a, lk_ctx *ctx, const char *what) {
    const lk_tensor *outs[3] = {&a->out, &a->d_hidden, &a->d_topk_weights};
    for (int i = 0; i < 3; i++) assert_int_equal(cudaMemset(outs[i]->data, 0, lk_tensor_bytes(outs[i])), cudaSuccess);
    assert_int_equal(lk_moe_dispatch_forward(impl, a, ctx), LK_OK);
    assert_int_equal(lk_moe_dispatch_backward(impl, a, ctx), LK_OK);
    for (int i = 0; i < 3; i++) expect_all_nan(what, outs[i]);
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
    const lk_impl *local = lk_impl_find(LK_OP_MOE_DISPATCH, "local", LK_DEVICE_CUDA);
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, "alltoall", LK_DEVICE_CUDA);
    const lk_impl *ag = lk_impl_find(LK_OP_MOE_DISPATCH, "allgather", LK_DEVICE_CUDA);
    assert_true(local && impl && ag);
    bad_id_nan(local, &a, &ctx, "local, id == E");
    bad_id_nan(impl, &a, &ctx, "alltoall, id == E");
    bad_id_nan(ag, &a, &ctx, "allgather, id == E");
    a.max_tokens = pb.T + 2;
    bad_id_nan(ag, &a, &ctx, "allgather padded, id == E");
    pb.ids[7] = -1;
    a = on_gpu(&pb);
    bad_id_nan(impl, &a, &ctx, "alltoall, id -1");
    bad_id_nan(ag, &a, &ctx, "allgather, id -1");
    if (nccl1) {
        ctx.comm = nccl1;
        bad_id_nan(impl, &a, &ctx, "alltoall over nccl, id -1");
        bad_id_nan(ag, &a, &ctx, "allgather over nccl, id -1");
        ctx.comm = NULL;
    }
    pb.ids[7] = 3;
    a = on_gpu(&pb);
    const lk_impl *dev_rows[2] = {impl, ag};
    for (int i = 0; i < 2; i++) {
        lk_moe_dispatch_args bad = a;
        bad.max_tokens = pb.T - 1;
        expect_refused(dev_rows[i], &bad, &ctx, LK_EINVAL, "max_tokens");
        bad.max_tokens = -1;
        expect_refused(dev_rows[i], &bad, &ctx, LK_EINVAL, "max_tokens");
        bad = a;
        bad.topk_weights.device.type = LK_DEVICE_CPU;
        expect_refused(dev_rows[i], &bad, &ctx, LK_EDEVICE, "topk_weights");
        bad = a;
        bad.topk_ids.dtype = LK_F32;
        expect_refused(dev_rows[i], &bad, &ctx, LK_EDTYPE, "topk_ids");
        bad = a;
        bad.n_experts = 5;   /* the weights hold 4 */
        expect_refused(dev_rows[i], &bad, &ctx, LK_ESHAPE, "gate_up_weight");
        bad = a;
        bad.experts = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CPU);
        expect_refused(dev_rows[i], &bad, &ctx, LK_EDEVICE, "experts");
        lk_arena host = {0};
        lk_ctx hctx = lk_ctx_cuda(&host, NULL, 0);
        expect_refused(dev_rows[i], &a, &hctx, LK_EDEVICE, "arena");
    }
    lk_arena_free(&arena);
    lkt_free_all();
}

/* --- CUDA graph -------------------------------------------------------------------- */

/* The five outputs' device buffers and bytes; the gradients' starting values. */
typedef struct {
    void *p[5];
    size_t n[5];
    void *g0[2];
} outs;

static outs outs_of(const lk_moe_dispatch_args *a, const problem *pb) {
    const lk_tensor *t[5] = {&a->out, &a->d_hidden, &a->d_topk_weights, &a->d_gate_up_weight, &a->d_down_weight};
    outs o;
    for (int i = 0; i < 5; i++) o.p[i] = t[i]->data, o.n[i] = lk_tensor_bytes(t[i]);
    int64_t G = pb->E * 2 * pb->I * pb->H, D = pb->E * pb->H * pb->I;
    o.g0[0] = lkt_upload(pb->ggu, G, pb->gdt), o.g0[1] = lkt_upload(pb->gdn, D, pb->gdt);
    return o;
}

/* Outputs poisoned, the gradients back to their starting values. */
static void reset(const outs *o) {
    for (int i = 0; i < 3; i++) lkt_poison(o->p[i], o->n[i]);
    for (int i = 0; i < 2; i++)
        assert_int_equal(cudaMemcpy(o->p[3 + i], o->g0[i], o->n[3 + i], cudaMemcpyDeviceToDevice), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

static void *host_copy(const void *dev, size_t n) {
    void *h = malloc(n ? n : 1);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

/* lkt_capture's pass: the dispatch row's forward or backward. */
typedef struct {
    const lk_impl *impl;
    const lk_moe_dispatch_args *a;
    lk_ctx *ctx;
} dispatch_call;

static lk_status dispatch_pass(void *user, int backward) {
    const dispatch_call *c = user;
    return backward ? lk_moe_dispatch_backward(c->impl, c->a, c->ctx) : lk_moe_dispatch_forward(c->impl, c->a, c->ctx);
}

/* The row's forward + backward on a created stream, eager (which also grows the arena, so
 * the captured calls allocate nothing), then captured in global mode, instantiated and
 * replayed twice: every output matches the eager bits. */
static void graph_case(const char *name, lk_dtype dt, lk_comm *comm, int64_t extra, uint32_t seed) {
    const dcase c = {53, 64, 32, 8, 2, SKEW};
    problem pb;
    make(&pb, &c, dt, LK_F32, seed);
    lk_moe_dispatch_args a = on_gpu(&pb);
    a.max_tokens = extra ? pb.T + extra : 0;
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, name, LK_DEVICE_CUDA);
    assert_non_null(impl);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, s, 0);
    ctx.comm = comm;
    outs o = outs_of(&a, &pb);
    reset(&o);
    lk_status st = lk_moe_dispatch_forward(impl, &a, &ctx);
    if (!st) st = lk_moe_dispatch_backward(impl, &a, &ctx);
    if (st) print_message("  eager: %s\n", lk_last_error());
    assert_int_equal(st, LK_OK);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    void *want[5];
    for (int i = 0; i < 5; i++) want[i] = host_copy(o.p[i], o.n[i]);
    reset(&o);
    cudaGraphExec_t exec = lkt_capture(s, dispatch_pass, &(dispatch_call){impl, &a, &ctx});
    for (int rep = 0; rep < 2; rep++) {
        reset(&o);
        assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < 5; i++) {
            void *h = host_copy(o.p[i], o.n[i]);
            assert_memory_equal(h, want[i], o.n[i]);
            free(h);
        }
    }
    print_message("  graph %s %s%s max_tokens %lld: captured forward + backward replayed to the same bits\n",
                  lk_dtype_name(dt), name, comm ? " over nccl" : "", (long long)a.max_tokens);
    for (int i = 0; i < 5; i++) free(want[i]);
    assert_int_equal(cudaGraphExecDestroy(exec), cudaSuccess);
    lk_arena_free(&arena);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    lkt_free_all();
}

static void graph_capture(void **state) {
    (void)state;
    const char *const dev_rows[2] = {"alltoall", "allgather"};
    for (int i = 0; i < 2; i++) {
        uint32_t seed = 61u + 4u * (uint32_t)i;
        graph_case(dev_rows[i], LK_BF16, NULL, 0, seed);
        graph_case(dev_rows[i], LK_F32, NULL, 4, seed + 1);
        if (nccl1) {
            graph_case(dev_rows[i], LK_BF16, nccl1, 0, seed + 2);
            graph_case(dev_rows[i], LK_F32, nccl1, 7, seed + 3);
        }
    }
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_dispatch")) return LKT_SKIP;
#ifdef LLMKERN_HAVE_NCCL
    if (lk_comm_nccl_create(lk_comm_self(), 0, &nccl1)) {
        fprintf(stderr, "cuda_test_moe_dispatch: an NCCL communicator of one: %s\n", lk_last_error());
        return 1;
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_local),
        cmocka_unit_test(bad_input_refused),
        cmocka_unit_test(graph_capture),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (nccl1) lk_comm_destroy(nccl1);
    return rc;
}
