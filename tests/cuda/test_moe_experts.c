/* test_moe_experts.c (GPU) — the CUDA `fused` MoE experts against the float64 reference,
 * forward (out) and backward (d_hidden, d_topk_weights, and the weight gradients added
 * onto random values already there), f32 and bf16, gradients in f32 or the storage
 * dtype, outputs poisoned with NaN first. The routing the GPU computed (saved offsets,
 * order, pos) must equal the CPU counting sort (lk_moe_permute) exactly.
 * Cases: E 8 top-2, E 64 top-8, E 128 top-8; experts with no token; every token on one
 * expert (once, and twice); experts of 0, 1, 37, 1000, 64, 65 and 128 rows (the weight
 * gradients' K: none, tails, whole 64-row steps); T not a multiple of any tile (128-row tensor-core tiles,
 * 64-row CUDA-core ones); odd H and I (the element-wise loads); more routes than a
 * routing chunk (1024); weight gradients and d_topk_weights not wanted.
 * Tolerances (max-normalized): f32 1e-5 (f32 FMAs in K order against float64: ~1e-6),
 * bf16 3e-2 (bf16 GEMM operands, gate_up and h rounded between the GEMMs, bf16
 * gradients rounded once; the cuBLASLt version saw <= 1.6e-2).
 * Also: a bad expert id makes out, d_hidden and d_topk_weights NaN (the ids are never
 * read on the host); and the forward + backward captured in a CUDA graph (global capture
 * mode, so any synchronizing call fails the capture) replays to the same bits as the
 * uncaptured calls. The bf16 cases run three ways: the device's default kernels (on an
 * sm_90 GPU the wgmma grouped GEMMs of grouped_sm90.cu and, for the weight gradients where
 * H and I are multiples of 8, grouped_wgrad_sm90.cu), with lk_moe_cuda_gg_sm80_only
 * (mma.sync), with lk_moe_cuda_gg_simt_only (CUDA cores); and the fused_sm90 row by name
 * where the GPU is sm_90. On an sm_90 GPU the bf16 cases and a graph case run once more on
 * each of grouped_sm90.cu's schedules (lk_moe_cuda_gg_sm90_variant: coop, pingpong,
 * pingpong_v4, auto), whatever LLMKERN_GG_SM90 says. And write_weight_grads (the weight gradients
 * written, not added) on every one of those paths, T = 0 included; and every case's backward on
 * the saved block of a forward without out (a recompute's). Skipped (77) where there is no GPU. */
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
#include "ops/moe/moe_cuda.h"
#include "ops/moe/reference.h"

enum { RANDOM, DUP, ONE, COUNTS };   /* k distinct experts; lower half with repeats; all on expert E - 1;
                                        top-1 with the rows an expert of counts[] below, shuffled */

/* COUNTS: rows an expert (E 8, k 1, T their sum 1295): none, 1, 37, 1000 — not multiples of
 * any tile or K step — and 64, 65, 128 (whole 64-row K steps, one past, two) */
static const int64_t counts[8] = {0, 1, 37, 0, 1000, 64, 65, 128};

typedef struct {
    int64_t t, h, i, e, k;
    int pattern;
    int grad_f32;   /* weight gradients in f32 (else the storage dtype) */
    int no_grads;   /* d_topk_weights, d_gate_up_weight, d_down_weight not wanted */
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

static void make_ids(const mcase *c, int32_t *ids, double *w, uint32_t *seed) {
    int64_t E = c->e, K = c->k;
    for (int64_t t = 0; t < c->t; t++)
        for (int64_t j = 0; j < K; j++) {
            w[t * K + j] = 0.1 + (next(seed) % 1000) / 1000.0;
            if (c->pattern == COUNTS) {
                ids[t * K + j] = 0;   /* set below */
            } else if (c->pattern == ONE) {
                ids[t * K + j] = (int32_t)(E - 1);
            } else if (c->pattern == DUP) {
                ids[t * K + j] = (int32_t)(next(seed) % (uint32_t)(E > 1 ? E / 2 : 1));
            } else {   /* k distinct experts */
                int32_t id;
                int again;
                do {
                    id = (int32_t)(next(seed) % (uint32_t)E), again = 0;
                    for (int64_t q = 0; q < j; q++) again |= ids[t * K + q] == id;
                } while (again);
                ids[t * K + j] = id;
            }
        }
    if (c->pattern == COUNTS) {   /* expert e on counts[e] of the T·k routes, in a shuffled order */
        int64_t r = 0;
        for (int64_t e = 0; e < E && e < 8; e++)
            for (int64_t q = 0; q < counts[e] && r < c->t * K; q++) ids[r++] = (int32_t)e;
        for (; r < c->t * K; r++) ids[r] = (int32_t)(E - 1);
        for (int64_t q = c->t * K - 1; q > 0; q--) {
            int64_t o = (int64_t)(next(seed) % (uint32_t)(q + 1));
            int32_t x = ids[q];
            ids[q] = ids[o], ids[o] = x;
        }
    }
}

/* The device's permutation (saved) against the CPU counting sort of the same ids. */
static void check_routing(const void *saved, const int32_t *ids, const lk_moe_dims *d) {
    lk_moe_fused_saved sv = lk_moe_fused_saved_view((void *)saved, d);
    size_t R = (size_t)d->r, E1 = (size_t)(d->e + 1);
    int64_t *offs = malloc(E1 * 8), *goffs = malloc(E1 * 8);
    int32_t *order = malloc(R * 4), *pos = malloc(R * 4), *gorder = malloc(R * 4), *gpos = malloc(R * 4);
    assert_true(offs && goffs && order && pos && gorder && gpos);
    lk_moe_permute(ids, d->r, d->e, offs, order, pos);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(goffs, sv.offs, E1 * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(gorder, sv.order, R * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(gpos, sv.pos, R * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(goffs, offs, E1 * 8);
    assert_memory_equal(gorder, order, R * 4);
    assert_memory_equal(gpos, pos, R * 4);
    free(offs), free(goffs), free(order), free(pos), free(gorder), free(gpos);
}

static const char *row = "fused";   /* the row run_case runs: fused, or fused_sm90 by name */
static int write_grads;             /* run_case's weight gradients written (write_weight_grads), not added */
static int saved_alone;             /* run_case's backward reads a forward's saved block without out (a
                                     * recompute's: out.data NULL); out comes from a second forward after it */

static void run_case(lk_dtype dt, const mcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, row, LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t T = c->t, H = c->h, I = c->i, E = c->e, K = c->k, R = T * K, ngu = E * 2 * I * H, nd = E * H * I;
    double *x = lkt_alloc(T * H), *w = lkt_alloc(R), *wgu = lkt_alloc(ngu), *wd = lkt_alloc(nd);
    double *dout = lkt_alloc(T * H), *dgu = lkt_alloc(ngu), *dd = lkt_alloc(nd);
    int32_t *ids = (int32_t *)lkt_alloc(R);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wgu, ngu, &seed, 0.2), lkt_randn(wd, nd, &seed, 0.2);
    lkt_randn(dout, T * H, &seed, 1.0), lkt_randn(dgu, ngu, &seed, 0.1), lkt_randn(dd, nd, &seed, 0.1);
    make_ids(c, ids, w, &seed);
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    size_t es = lk_dtype_size(dt);
    void *dx_ = lkt_upload(x, T * H, dt), *dw_ = lkt_upload(w, R, LK_F32), *dgu_w = lkt_upload(wgu, ngu, dt);
    void *dd_w = lkt_upload(wd, nd, dt), *ddout = lkt_upload(dout, T * H, dt), *dids = up_i32(ids, R);
    void *gdgu = lkt_upload(dgu, ngu, gdt), *gdd = lkt_upload(dd, nd, gdt);   /* rounded: the ref adds onto these */
    if (write_grads) {   /* written: the reference's from zeros, whatever lay there (NaN) must not show */
        memset(dgu, 0, sizeof(double) * (size_t)ngu), memset(dd, 0, sizeof(double) * (size_t)nd);
        lkt_poison(gdgu, (size_t)ngu * lk_dtype_size(gdt)), lkt_poison(gdd, (size_t)nd * lk_dtype_size(gdt));
    }
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
        .d_hidden = lkt_view(dh, dt, 2, sx), .write_weight_grads = write_grads,
    };
    if (!c->no_grads) {
        a.d_topk_weights = lkt_view(dwt, LK_F32, 2, sk);
        a.d_gate_up_weight = lkt_view(gdgu, gdt, 3, sgu), a.d_down_weight = lkt_view(gdd, gdt, 3, sd);
    }
    size_t sb = 0;
    assert_int_equal(lk_moe_experts_saved_bytes(impl, T, K, E, H, I, dt, &sb), LK_OK);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(a.saved.data, sb);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    lk_moe_experts_args alone = a;
    alone.out.data = NULL;
    lk_status st = lk_moe_experts_forward(impl, saved_alone ? &alone : &a, &ctx);
    if (st) print_message("  forward: %s\n", lk_last_error());
    assert_int_equal(st, LK_OK);
    lk_moe_dims d = lk_moe_dims_of(&a);
    check_routing(a.saved.data, ids, &d);
    st = lk_moe_experts_backward(impl, &a, &ctx);
    if (st) print_message("  backward: %s\n", lk_last_error());
    assert_int_equal(st, LK_OK);
    if (saved_alone) assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
    double e[5] = {err_of(out, T * H, dt, oref), err_of(dh, T * H, dt, dxr), 0, 0, 0};
    if (!c->no_grads)
        e[2] = err_of(dwt, R, LK_F32, dwr), e[3] = err_of(gdgu, ngu, gdt, dgu), e[4] = err_of(gdd, nd, gdt, dd);
    double tol = dt == LK_F32 ? 1e-5 : 3e-2;
    static const char *pat[] = {"random", "dup", "one expert", "counts"};
    print_message("  %s T %lld H %lld I %lld E %lld k %lld %s%s grads %s: out %.1e dx %.1e dw %.1e dgu %.1e "
                  "dd %.1e (tol %.0e)\n", lk_dtype_name(dt), (long long)T, (long long)H, (long long)I, (long long)E,
                  (long long)K, pat[c->pattern], c->no_grads ? " (no grads)" : "", lk_dtype_name(gdt), e[0], e[1],
                  e[2], e[3], e[4], tol);
    for (int i = 0; i < 5; i++) assert_true(e[i] <= tol);
    lk_arena_free(&arena);
    lkt_free_all();
}

static const mcase cases[] = {
    {37, 48, 40, 5, 2, RANDOM, 1, 0},
    {64, 128, 96, 8, 3, DUP, 0, 0},       /* repeats; the upper experts get no token */
    {1, 32, 16, 4, 4, RANDOM, 0, 0},      /* one token, every expert */
    {50, 64, 24, 16, 1, RANDOM, 1, 0},    /* more experts than tokens need */
    {300, 256, 192, 8, 2, RANDOM, 1, 0},  /* E 8 top-2: 2 row tiles an expert, 3 N tiles, 8 K steps */
    {257, 128, 96, 64, 8, RANDOM, 0, 0},  /* E 64 top-8, bf16 gradients */
    {77, 64, 32, 8, 6, RANDOM, 1, 0},     /* top-6: the un-permute's four-route step and a tail of two */
    {515, 128, 64, 128, 8, RANDOM, 1, 0}, /* E 128 top-8: 4120 routes, 5 routing chunks */
    {200, 96, 80, 32, 4, DUP, 1, 0},      /* experts 16..31 with no token */
    {300, 64, 48, 8, 1, ONE, 1, 0},       /* every token on expert 7: one expert of 3 row tiles */
    {33, 40, 24, 4, 2, ONE, 0, 0},        /* every token twice on expert 3 */
    {45, 37, 19, 6, 2, RANDOM, 1, 0},     /* odd H and I: element-wise loads, partial chunks */
    {1500, 32, 16, 3, 2, DUP, 1, 0},      /* 3000 routes on one expert of 3: long K for the weight grads */
    {129, 64, 40, 8, 2, RANDOM, 1, 1},    /* only d_hidden wanted */
    {200, 320, 264, 4, 2, RANDOM, 1, 0},  /* several 256-column tiles, partial ones, K tails (64-wide K steps) */
    {1295, 136, 72, 8, 1, COUNTS, 1, 0},  /* experts of 0, 1, 37, 1000, 64, 65, 128 rows (the weight grads' K) */
    {1295, 264, 48, 8, 1, COUNTS, 0, 0},  /* bf16 gradients; d_down: 3 M tiles, the last of 8 rows */
    {600, 256, 128, 128, 2, RANDOM, 1, 0}, /* 256 weight-gradient items: more than an H200's 132 CTAs,
                                            * so a CTA walks several (auto's TMA epilogue across items) */
    {700, 64, 32, 257, 2, RANDOM, 1, 0},  /* more experts than the sm90 weight gradients rank (EMAX 256):
                                            * their walk in expert order, skipping the empty ones */
};

static void against_reference_f32(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_F32, &cases[i], 31u + (uint32_t)i);
}

static void against_reference_bf16(void **state) {
    (void)state;
    print_message("  bf16 grouped GEMMs on %s\n", lk_hw_get()->cuda_cc == 90 ? "wgmma where grouped_sm90.cu takes them "
                  "(sm_90), the rest on mma.sync" : "mma.sync (not an sm_90 GPU)");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 131u + (uint32_t)i);
}

/* Every case, f32 and bf16, its backward on the saved block of a forward without out
 * (a recompute's): the block whole, out written by neither. */
static void saved_alone_cases(void **state) {
    (void)state;
    saved_alone = 1;
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(b ? LK_BF16 : LK_F32, &cases[i], 331u + (uint32_t)i);
    saved_alone = 0;
}
static int saved_alone_off(void **state) {   /* a teardown: runs after a failed assertion too */
    (void)state;
    saved_alone = 0;
    return 0;
}

/* The same bf16 cases with the Hopper kernel off (lk_moe_cuda_gg_sm80_only): on an sm_90
 * GPU the mma.sync kernel the wgmma one replaced, so both stay checked; elsewhere a repeat. */
static int sm80_on(void **state) {
    (void)state;
    lk_moe_cuda_gg_sm80_only(1);
    return 0;
}
static int sm80_off(void **state) {   /* a teardown: runs after a failed assertion too */
    (void)state;
    lk_moe_cuda_gg_sm80_only(0);
    return 0;
}
static void against_reference_bf16_sm80(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 131u + (uint32_t)i);
}

/* The fused_sm90 row (alias fused_quack) by name, bf16 (its only dtype), where this GPU
 * runs it (sm_90); the sm80-only switch on, which the row asked for by name overrides. */
static void fused_sm90_row(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused_quack", LK_DEVICE_CUDA);
    assert_non_null(impl);
    assert_string_equal(impl->name, "fused_sm90");
    char why[256] = "";
    if (!lk_impl_available(impl, lk_hw_get(), why, sizeof why)) {
        print_message("  fused_sm90 not run here: %s\n", why);
        return;
    }
    row = "fused_sm90";
    lk_moe_cuda_gg_sm80_only(1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 231u + (uint32_t)i);
    lk_moe_cuda_gg_sm80_only(0);
    row = "fused";
}

/* The same bf16 cases on the CUDA-core kernel (the cross-check of the tensor-core one:
 * if only against_reference_bf16 fails, the mma kernel is wrong). */
static int simt_on(void **state) {
    (void)state;
    lk_moe_cuda_gg_simt_only(1);
    return 0;
}
static int simt_off(void **state) {   /* a teardown: runs after a failed assertion too */
    (void)state;
    lk_moe_cuda_gg_simt_only(0);
    return 0;
}
static void against_reference_bf16_simt(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 131u + (uint32_t)i);
}

/* Many routes, tiny H and I: the routing alone at scale (18 chunks, E 128), checked
 * against the CPU sort by run_case. */
static void routing_at_scale(void **state) {
    (void)state;
    const mcase big = {9000, 8, 8, 128, 2, RANDOM, 1, 0}, skew = {9000, 8, 8, 128, 2, DUP, 1, 0};
    run_case(LK_F32, &big, 7u);
    run_case(LK_BF16, &skew, 8u);
}

static int all_nan(const void *dev, int64_t n, lk_dtype dt) {
    double *v = lkt_alloc(n);
    lkt_download(dev, n, dt, v);
    for (int64_t i = 0; i < n; i++)
        if (!isnan(v[i])) return 0;
    return 1;
}

/* An id outside [0, E) is never read on the host: the forward and backward succeed, and
 * out, d_hidden and d_topk_weights come back NaN, every element. */
static void bad_id_poisons(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CUDA);
    for (int bf = 0; bf < 2; bf++) {
        lk_dtype dt = bf ? LK_BF16 : LK_F32;
        size_t es = lk_dtype_size(dt);
        int64_t T = 3, H = 16, I = 8, E = 4, K = 2, sx[2] = {T, H}, sk[2] = {T, K}, sgu[3] = {E, 2 * I, H},
                sd[3] = {E, H, I};
        int32_t ids[6] = {0, 1, 2, 7, 3, 0};
        uint32_t seed = 5;
        double *r = lkt_alloc(E * 2 * I * H);
        lkt_randn(r, E * 2 * I * H, &seed, 0.5);
        void *dwt = lkt_dev((size_t)(T * K) * 4);
        lk_moe_experts_args a = {
            .hidden = lkt_view(lkt_upload(r, T * H, dt), dt, 2, sx), .topk_ids = lkt_view(up_i32(ids, 6), LK_I32, 2, sk),
            .topk_weights = lkt_view(lkt_upload(r, T * K, LK_F32), LK_F32, 2, sk),
            .gate_up_weight = lkt_view(lkt_upload(r, E * 2 * I * H, dt), dt, 3, sgu),
            .down_weight = lkt_view(lkt_upload(r, E * H * I, dt), dt, 3, sd),
            .out = lkt_view(lkt_dev((size_t)(T * H) * es), dt, 2, sx),
            .dout = lkt_view(lkt_upload(r, T * H, dt), dt, 2, sx),
            .d_hidden = lkt_view(lkt_dev((size_t)(T * H) * es), dt, 2, sx),
            .d_topk_weights = lkt_view(dwt, LK_F32, 2, sk),
        };
        size_t sb = 0;
        assert_int_equal(lk_moe_experts_saved_bytes(impl, T, K, E, H, I, dt, &sb), LK_OK);
        a.saved = (lk_saved){lkt_dev(sb), sb};
        lk_arena arena = {.device = LK_DEVICE_CUDA};
        lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
        assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
        assert_true(all_nan(a.out.data, T * H, dt));
        assert_int_equal(lk_moe_experts_backward(impl, &a, &ctx), LK_OK);
        assert_true(all_nan(a.d_hidden.data, T * H, dt));
        assert_true(all_nan(dwt, T * K, LK_F32));
        /* the same arguments with good ids give finite numbers: the flag is per call */
        int32_t good[6] = {0, 1, 2, 3, 3, 0};
        assert_int_equal(cudaMemcpy(a.topk_ids.data, good, sizeof good, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
        double *o = lkt_alloc(T * H);
        lkt_download(a.out.data, T * H, dt, o);
        for (int64_t i = 0; i < T * H; i++) assert_true(isfinite(o[i]));
        lk_arena_free(&arena);
        lkt_free_all();
    }
}

/* --- CUDA graph -------------------------------------------------------------------- */

typedef struct {
    void *p;
    size_t n;
} dbuf;

static void *host_copy(dbuf b) {
    void *h = malloc(b.n ? b.n : 1);
    assert_non_null(h);
    assert_int_equal(cudaMemcpy(h, b.p, b.n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

/* lkt_capture's pass: the experts row's forward or backward. */
typedef struct {
    const lk_impl *impl;
    const lk_moe_experts_args *a;
    lk_ctx *ctx;
} experts_call;

static lk_status experts_pass(void *user, int backward) {
    const experts_call *c = user;
    return backward ? lk_moe_experts_backward(c->impl, c->a, c->ctx) : lk_moe_experts_forward(c->impl, c->a, c->ctx);
}

/* Forward + backward queued on a created stream, captured with cudaStreamCaptureModeGlobal
 * (a host sync or a synchronous copy anywhere in them invalidates the capture and the
 * test fails), instantiated and replayed twice: out, d_hidden, d_topk_weights and the
 * accumulated weight gradients match the uncaptured calls bit for bit. */
static void graph_case(lk_dtype dt, const mcase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CUDA);
    int64_t T = c->t, H = c->h, I = c->i, E = c->e, K = c->k, R = T * K, ngu = E * 2 * I * H, nd = E * H * I;
    size_t es = lk_dtype_size(dt);
    double *x = lkt_alloc(T * H), *w = lkt_alloc(R), *wgu = lkt_alloc(ngu), *wd = lkt_alloc(nd);
    double *dout = lkt_alloc(T * H), *g0 = lkt_alloc(ngu), *d0 = lkt_alloc(nd);
    int32_t *ids = (int32_t *)lkt_alloc(R);
    lkt_randn(x, T * H, &seed, 1.0), lkt_randn(wgu, ngu, &seed, 0.2), lkt_randn(wd, nd, &seed, 0.2);
    lkt_randn(dout, T * H, &seed, 1.0), lkt_randn(g0, ngu, &seed, 0.1), lkt_randn(d0, nd, &seed, 0.1);
    make_ids(c, ids, w, &seed);
    int64_t sx[2] = {T, H}, sk[2] = {T, K}, sgu[3] = {E, 2 * I, H}, sd[3] = {E, H, I};
    dbuf gu0 = {lkt_upload(g0, ngu, LK_F32), (size_t)ngu * 4}, dn0 = {lkt_upload(d0, nd, LK_F32), (size_t)nd * 4};
    dbuf bufs[5] = {{lkt_dev((size_t)(T * H) * es), (size_t)(T * H) * es},   /* out */
                    {lkt_dev((size_t)(T * H) * es), (size_t)(T * H) * es},   /* d_hidden */
                    {lkt_dev((size_t)R * 4), (size_t)R * 4},                 /* d_topk_weights */
                    {lkt_dev(gu0.n), gu0.n},                                 /* d_gate_up_weight (f32) */
                    {lkt_dev(dn0.n), dn0.n}};                                /* d_down_weight (f32) */
    lk_moe_experts_args a = {
        .hidden = lkt_view(lkt_upload(x, T * H, dt), dt, 2, sx), .topk_ids = lkt_view(up_i32(ids, R), LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_upload(w, R, LK_F32), LK_F32, 2, sk),
        .gate_up_weight = lkt_view(lkt_upload(wgu, ngu, dt), dt, 3, sgu),
        .down_weight = lkt_view(lkt_upload(wd, nd, dt), dt, 3, sd), .out = lkt_view(bufs[0].p, dt, 2, sx),
        .dout = lkt_view(lkt_upload(dout, T * H, dt), dt, 2, sx), .d_hidden = lkt_view(bufs[1].p, dt, 2, sx),
        .d_topk_weights = lkt_view(bufs[2].p, LK_F32, 2, sk), .d_gate_up_weight = lkt_view(bufs[3].p, LK_F32, 3, sgu),
        .d_down_weight = lkt_view(bufs[4].p, LK_F32, 3, sd),
    };
    size_t sb = 0;
    assert_int_equal(lk_moe_experts_saved_bytes(impl, T, K, E, H, I, dt, &sb), LK_OK);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    cudaStream_t s;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, s, 0);
    /* uncaptured: also grows the arena to its size, so the captured calls allocate nothing */
    for (int i = 0; i < 5; i++) lkt_poison(bufs[i].p, bufs[i].n);
    assert_int_equal(cudaMemcpy(bufs[3].p, gu0.p, gu0.n, cudaMemcpyDeviceToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(bufs[4].p, dn0.p, dn0.n, cudaMemcpyDeviceToDevice), cudaSuccess);
    assert_int_equal(lk_moe_experts_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_moe_experts_backward(impl, &a, &ctx), LK_OK);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    void *want[5];
    for (int i = 0; i < 5; i++) want[i] = host_copy(bufs[i]);
    /* the uncaptured result is right, not only repeatable */
    double *oref = lkt_alloc(T * H), *got = lkt_alloc(T * H);
    lk_moe_experts_ref_forward(x, ids, w, wgu, wd, T, K, E, H, I, oref);
    lkt_download(bufs[0].p, T * H, dt, got);
    assert_true(lkt_rel_err(got, oref, T * H) <= (dt == LK_F32 ? 1e-5 : 3e-2));

    cudaGraphExec_t exec = lkt_capture(s, experts_pass, &(experts_call){impl, &a, &ctx});
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < 5; i++) lkt_poison(bufs[i].p, bufs[i].n);
        assert_int_equal(cudaMemcpy(bufs[3].p, gu0.p, gu0.n, cudaMemcpyDeviceToDevice), cudaSuccess);
        assert_int_equal(cudaMemcpy(bufs[4].p, dn0.p, dn0.n, cudaMemcpyDeviceToDevice), cudaSuccess);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaGraphLaunch(exec, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < 5; i++) {
            void *h = host_copy(bufs[i]);
            assert_memory_equal(h, want[i], bufs[i].n);
            free(h);
        }
    }
    print_message("  graph %s T %lld E %lld k %lld: captured forward + backward replayed to the same bits\n",
                  lk_dtype_name(dt), (long long)T, (long long)E, (long long)K);
    for (int i = 0; i < 5; i++) free(want[i]);
    assert_int_equal(cudaGraphExecDestroy(exec), cudaSuccess);
    lk_arena_free(&arena);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    lkt_free_all();
}

static void graph_capture(void **state) {
    (void)state;
    const mcase c = {300, 128, 96, 8, 2, RANDOM, 1, 0}, z = {200, 64, 48, 16, 4, DUP, 1, 0};
    graph_case(LK_BF16, &c, 3u);
    graph_case(LK_F32, &c, 4u);
    graph_case(LK_BF16, &z, 5u);   /* experts with no token inside the graph */
}

/* The bf16 cases and a graph case on each schedule of grouped_sm90.cu (lk_moe_cuda_gg_sm90_variant),
 * so both stay checked whichever LLMKERN_GG_SM90 picks; on another GPU a repeat of the mma.sync run. */
static void sm90_schedules(void **state) {
    (void)state;
    static const char *names[LK_GG_SM90_VARIANTS] = {"coop", "pingpong", "pingpong_v4", "auto", "coop_cluster"};
    const mcase c = {300, 128, 96, 8, 2, RANDOM, 1, 0};
    for (int v = 0; v < LK_GG_SM90_VARIANTS; v++) {
        lk_moe_cuda_gg_sm90_variant(v);
        print_message("  grouped_sm90.cu schedule %s%s\n", names[v],
                      lk_hw_get()->cuda_cc == 90 ? "" : " (not an sm_90 GPU: mma.sync)");
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 331u + (uint32_t)i);
        graph_case(LK_BF16, &c, 7u);
    }
    lk_moe_cuda_gg_sm90_variant(-1);
}

static int variant_off(void **state) {   /* a teardown: runs after a failed assertion too */
    (void)state;
    lk_moe_cuda_gg_sm90_variant(-1);
    return 0;
}

/* write_weight_grads: every case with the weight gradients poisoned first, f32 and bf16, on
 * every path: the Hopper kernel's TMA epilogue (auto, the default: it stores, and walks the
 * experts without rows to store their zeros), its other schedules, mma.sync and CUDA cores
 * (zeros queued, then added onto); and T = 0, where only zeros are written. */
static void write_weight_grads(void **state) {
    (void)state;
    write_grads = 1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_F32, &cases[i], 531u + (uint32_t)i);
    for (int v = -1; v < LK_GG_SM90_VARIANTS; v++) {   /* -1: LLMKERN_GG_SM90 or auto */
        lk_moe_cuda_gg_sm90_variant(v);
        print_message("  write_weight_grads, bf16, sm90 schedule %d\n", v);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 631u + (uint32_t)i);
    }
    lk_moe_cuda_gg_sm90_variant(-1);
    lk_moe_cuda_gg_sm80_only(1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 731u + (uint32_t)i);
    lk_moe_cuda_gg_sm80_only(0);
    lk_moe_cuda_gg_simt_only(1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(LK_BF16, &cases[i], 831u + (uint32_t)i);
    lk_moe_cuda_gg_simt_only(0);
    write_grads = 0;

    enum { H = 16, I = 8, E = 4, K = 2 };   /* no token: the gradients come back zeros */
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_EXPERTS, "fused", LK_DEVICE_CUDA);
    int64_t sx[2] = {0, H}, sk[2] = {0, K}, sgu[3] = {E, 2 * I, H}, sd[3] = {E, H, I};
    size_t sb = 0;
    assert_int_equal(lk_moe_experts_saved_bytes(impl, 0, K, E, H, I, LK_BF16, &sb), LK_OK);
    void *gdgu = lkt_dev((size_t)E * 2 * I * H * 4), *gdd = lkt_dev((size_t)E * H * I * 4);
    lkt_poison(gdgu, (size_t)E * 2 * I * H * 4), lkt_poison(gdd, (size_t)E * H * I * 4);
    lk_moe_experts_args a = {
        .hidden = lkt_view(lkt_dev(0), LK_BF16, 2, sx), .topk_ids = lkt_view(lkt_dev(0), LK_I32, 2, sk),
        .topk_weights = lkt_view(lkt_dev(0), LK_F32, 2, sk),
        .gate_up_weight = lkt_view(lkt_dev((size_t)E * 2 * I * H * 2), LK_BF16, 3, sgu),
        .down_weight = lkt_view(lkt_dev((size_t)E * H * I * 2), LK_BF16, 3, sd), .dout = lkt_view(lkt_dev(0), LK_BF16, 2, sx),
        .d_hidden = lkt_view(lkt_dev(0), LK_BF16, 2, sx), .d_gate_up_weight = lkt_view(gdgu, LK_F32, 3, sgu),
        .d_down_weight = lkt_view(gdd, LK_F32, 3, sd), .saved = {lkt_dev(sb), sb}, .write_weight_grads = 1,
    };
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    lk_status st = lk_moe_experts_backward(impl, &a, &ctx);
    if (st) print_message("  T 0: %s\n", lk_last_error());
    assert_int_equal(st, LK_OK);
    double *v = lkt_alloc(E * 2 * I * H);
    lkt_download(gdgu, E * 2 * I * H, LK_F32, v);
    for (int64_t i = 0; i < E * 2 * I * H; i++) assert_true(v[i] == 0.0);
    lkt_download(gdd, E * H * I, LK_F32, v);
    for (int64_t i = 0; i < E * H * I; i++) assert_true(v[i] == 0.0);
    lk_arena_free(&arena);
    lkt_free_all();
}

static int write_off(void **state) {   /* a teardown: runs after a failed assertion too */
    (void)state;
    write_grads = 0;
    lk_moe_cuda_gg_sm90_variant(-1), lk_moe_cuda_gg_sm80_only(0), lk_moe_cuda_gg_simt_only(0);
    return 0;
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_moe_experts")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(against_reference_f32),
        cmocka_unit_test(against_reference_bf16),
        cmocka_unit_test_setup_teardown(against_reference_bf16_sm80, sm80_on, sm80_off),
        cmocka_unit_test_setup_teardown(against_reference_bf16_simt, simt_on, simt_off),
        cmocka_unit_test_setup_teardown(fused_sm90_row, NULL, sm80_off),
        cmocka_unit_test_setup_teardown(saved_alone_cases, NULL, saved_alone_off),
        cmocka_unit_test(routing_at_scale),
        cmocka_unit_test(bad_id_poisons),
        cmocka_unit_test(graph_capture),
        cmocka_unit_test_setup_teardown(sm90_schedules, NULL, variant_off),
        cmocka_unit_test_setup_teardown(write_weight_grads, NULL, write_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
