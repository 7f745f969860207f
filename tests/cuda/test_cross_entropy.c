/* test_cross_entropy.c (GPU) — cross-entropy `fused` on CUDA (cuBLASLt LM head + one
 * fused softmax/loss/gradient kernel per chunk) against the float64 reference: mean, sum
 * and none; label smoothing, z-loss, softcap; ignored labels; logits_to_keep; several
 * chunks; fp32_lm_head; d_weight f32 or bf16 holding values before (accumulated); odd
 * vocab and hidden sizes (the scalar kernel path); rows long enough for the Hopper kernel
 * (rows_sm90.cu); d_hidden poisoned with NaN first.
 * Each case runs on both of the op's algorithms, picked by the budget (chunk >= H: dW
 * accumulated in f32 over chunks; chunk < H: the lean path, dW per vocab block in the
 * backward), and the test checks from the saved size which one ran: the lean cases have
 * vocab blocks that do not divide the vocab, blocks of one column, ignored labels, gathered
 * rows (logits_to_keep) and every reduction.
 * Tolerances: f32 2e-5 (as the CPU harness: f32 math, sums of V exp terms); bf16 1e-2
 * (the reference rounds logits and dlogits to bf16 like the kernel; what is left is the
 * bf16 rounding of d_hidden and d_weight, and an odd logit rounded the other way);
 * fp32_lm_head 2e-2: on the GPU the dlogits are still rounded to bf16 for the gradient
 * GEMMs, which the reference (f32 dlogits there) does not do. Skipped (77) without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "ops/cross_entropy/check.h"
#include "ops/cross_entropy/reference.h"

typedef struct {
    int64_t b, s, h, v;
    lk_ce_reduction red;
    double eps, zs, cap;
    int64_t keep, chunk_tokens;
    int fp32_head, grad_f32;
    int lean;   /* the path the budget must pick: 1 lean (chunk < H), 0 accumulating */
} ccase;

static void run_case(lk_dtype dt, const ccase *c, uint32_t seed) {
    const lk_impl *impl = lk_impl_find(LK_OP_CROSS_ENTROPY, "fused", LK_DEVICE_CUDA);
    assert_non_null(impl);
    int64_t T = c->b * c->s, H = c->h, V = c->v, sh[3] = {c->b, c->s, H}, sw[2] = {V, H}, sl[2] = {c->b, c->s};
    lk_dtype gdt = c->grad_f32 ? LK_F32 : dt;
    double *h = lkt_alloc(T * H), *w = lkt_alloc(V * H), *gw = lkt_alloc(V * H), *dl = lkt_alloc(T);
    int64_t *lab = (int64_t *)lkt_alloc(T), *ref_lab = (int64_t *)lkt_alloc(T);
    unsigned char *keep = (unsigned char *)lkt_alloc(T);
    lkt_randn(h, T * H, &seed, 1.0), lkt_randn(w, V * H, &seed, 3.0 / sqrt((double)H));
    lkt_randn(gw, V * H, &seed, 0.25), lkt_randn(dl, T, &seed, 1.0);
    for (int64_t t = 0; t < T; t++) {
        seed = seed * 1664525u + 1013904223u;
        lab[t] = (t % 5 == 3) ? LK_CE_IGNORE_INDEX : (int64_t)(seed >> 8) % V;
        ref_lab[t] = lab[t] == LK_CE_IGNORE_INDEX ? -1 : lab[t];
        keep[t] = c->keep == 0 || t % c->s >= c->s - c->keep;
    }
    int none = c->red == LK_CE_NONE;
    if (!none) dl[0] = 0.75;
    void *dh_ = lkt_upload(h, T * H, dt), *dw_ = lkt_upload(w, V * H, dt), *dgw = lkt_upload(gw, V * H, gdt);
    void *ddl = lkt_upload(dl, none ? T : 1, LK_F32), *dlab = lkt_dev(T * 8);
    assert_int_equal(cudaMemcpy(dlab, lab, T * 8, cudaMemcpyHostToDevice), cudaSuccess);
    int64_t per = none ? T : 1;
    void *loss = lkt_dev(per * 4), *zl = lkt_dev(per * 4), *nv = lkt_dev(8), *gh = lkt_dev(T * H * lk_dtype_size(dt));
    lkt_poison(loss, per * 4), lkt_poison(zl, per * 4), lkt_poison(gh, T * H * lk_dtype_size(dt));
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    a.hidden = lkt_view(dh_, dt, 3, sh), a.weight = lkt_view(dw_, dt, 2, sw), a.labels = lkt_view(dlab, LK_I64, 2, sl);
    a.loss = lkt_view(loss, LK_F32, 1, &per), a.z_loss = lkt_view(zl, LK_F32, 1, &per);
    int64_t one = 1;
    a.n_valid = lkt_view(nv, LK_I64, 1, &one), a.d_loss = lkt_view(ddl, LK_F32, 1, &per);
    a.d_hidden = lkt_view(gh, dt, 3, sh), a.d_weight = lkt_view(dgw, gdt, 2, sw);
    a.reduction = c->red, a.label_smoothing = c->eps, a.z_loss_scale = c->zs, a.softcap = c->cap;
    a.logits_to_keep = c->keep, a.fp32_lm_head = c->fp32_head;
    a.chunk_bytes = (size_t)(c->chunk_tokens * V * 4);
    size_t sb = 0;
    assert_int_equal(lk_cross_entropy_saved_bytes(impl, &a, &sb), LK_OK);
    /* which path: accumulating saves dh [K, H] and dW [V, H] f32 (mean/sum) or nothing but
     * the head (none); lean saves dh and the lse [K], never V·H (V·H·4 >= 1280 here, more
     * than the lse and the alignment) */
    int64_t K = c->keep ? c->b * c->keep : T;
    size_t both = (size_t)((V + K) * H * 4);
    if (none) assert_true(c->lean ? sb > 64 : sb == 64);
    else assert_true(c->lean ? sb < both : sb >= both);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    lkt_poison(a.saved.data, sb);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_cross_entropy_forward(impl, &a, &ctx), LK_OK);
    assert_int_equal(lk_cross_entropy_backward(impl, &a, &ctx), LK_OK);

    lk_ce_ref_problem p = {.T = T, .H = H, .V = V, .h = h, .w = w, .labels = ref_lab, .keep = keep,
                           .reduction = (int)c->red, .eps = c->eps, .zs = c->zs, .cap = c->cap,
                           .round_bf16 = dt == LK_BF16 && !c->fp32_head};
    double *lt = lkt_alloc(T), *zt = lkt_alloc(T), rl, rz, *rdh = lkt_alloc(T * H), *rdw = lkt_alloc(V * H);
    int64_t rnv;
    lk_ce_ref(&p, dl, lt, zt, &rl, &rz, &rnv, rdh, rdw);
    for (int64_t i = 0; i < V * H; i++) rdw[i] += gw[i];
    double *got = lkt_alloc(T * H > V * H ? T * H : V * H), e[5];
    lkt_download(loss, per, LK_F32, got), e[0] = lkt_rel_err(got, none ? lt : &rl, per);
    lkt_download(zl, per, LK_F32, got), e[1] = lkt_rel_err(got, none ? zt : &rz, per);
    if (c->zs == 0.0) e[1] = isfinite(got[0]) && got[0] == 0.0 ? 0.0 : INFINITY;
    lkt_download(gh, T * H, dt, got), e[2] = lkt_rel_err(got, rdh, T * H);
    lkt_download(dgw, V * H, gdt, got), e[3] = lkt_rel_err(got, rdw, V * H);
    lkt_download(nv, 1, LK_I64, got), e[4] = got[0] == (double)rnv ? 0.0 : INFINITY;
    print_message("  %-4s %s B %lld S %lld H %lld V %lld red %d eps %g zs %g cap %g keep %lld chunk %lld fp32 %d dW %s: "
                  "loss %.2e z %.2e dh %.2e dW %.2e nv %g\n", lk_dtype_name(dt), c->lean ? "lean" : "accu",
                  (long long)c->b, (long long)c->s,
                  (long long)H, (long long)V, (int)c->red, c->eps, c->zs, c->cap, (long long)c->keep,
                  (long long)c->chunk_tokens, c->fp32_head, lk_dtype_name(gdt), e[0], e[1], e[2], e[3], e[4]);
    double tol = lk_ce_tol(impl, dt) * (dt == LK_BF16 && c->fp32_head ? 2.0 : 1.0);   /* check.h's; fp32_head above */
    for (int i = 0; i < 5; i++) assert_true(e[i] <= tol);
    lk_arena_free(&arena);
    lkt_free_all();
}

/* chunk >= H and K >= H: the f32 dW accumulator fits the budget. */
static void accumulating_path(void **state) {
    (void)state;
    const ccase cases[] = {
        {2, 24, 16, 512, LK_CE_MEAN, 0.0, 0.0, 0.0, 0, 20, 0, 1, 0},     /* 3 chunks */
        {1, 40, 32, 1000, LK_CE_SUM, 0.1, 1e-3, 30.0, 0, 32, 0, 0, 0},   /* chunk = H: fits exactly */
        {3, 9, 9, 257, LK_CE_MEAN, 0.05, 1e-4, 0.0, 4, 10, 0, 1, 0},     /* odd sizes, logits_to_keep */
        {2, 17, 16, 384, LK_CE_NONE, 0.1, 1e-3, 20.0, 0, 16, 0, 0, 0},   /* none: backward recomputes */
        {2, 16, 24, 640, LK_CE_MEAN, 0.0, 1e-3, 0.0, 0, 24, 1, 1, 0},    /* fp32_lm_head */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 5u + (uint32_t)i);
}

/* chunk < H: the lean path, forced by a small budget. */
static void lean_path(void **state) {
    (void)state;
    const ccase cases[] = {
        {2, 24, 64, 512, LK_CE_MEAN, 0.0, 0.0, 0.0, 0, 64, 0, 1, 1},      /* K < H: one vocab block */
        {1, 40, 96, 1000, LK_CE_SUM, 0.1, 1e-3, 30.0, 0, 16, 0, 0, 1},    /* blocks 384, 384, 232 */
        {3, 9, 33, 257, LK_CE_MEAN, 0.05, 1e-4, 0.0, 4, 5, 0, 1, 1},      /* odd sizes, gathered rows */
        {2, 17, 64, 384, LK_CE_NONE, 0.1, 1e-3, 20.0, 0, 8, 0, 0, 1},     /* none; blocks of 77 (scalar) */
        {1, 33, 48, 301, LK_CE_NONE, 0.0, 0.0, 0.0, 7, 3, 0, 1, 1},       /* none, logits_to_keep */
        {2, 16, 64, 640, LK_CE_MEAN, 0.0, 1e-3, 0.0, 0, 12, 1, 1, 1},     /* fp32_lm_head */
        {2, 30, 64, 1001, LK_CE_MEAN, 0.1, 0.0, 0.0, 0, 7, 0, 0, 1},      /* 8 blocks of 112 + one of 105 */
        {1, 40, 64, 5, LK_CE_SUM, 0.0, 1e-3, 0.0, 0, 1, 0, 1, 1},         /* blocks of one column */
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 25u + (uint32_t)i);
}

/* Rows of at least 64 KiB: on an sm_90 GPU rows_sm90.cu's kernel takes them, each row split
 * over a cluster of 2, 4 or 8 CTAs by its length and dtype (bf16 40000: two slices; 65544:
 * four of unequal length; 151936, Qwen3's vocab: eight, f32 logits eight long ones), elsewhere
 * fused.cu's ce_rows; either way the same float64 reference and tolerances. The gradient is
 * written over the logits in place, so the last case has many rows in flight at once. */
static void long_rows(void **state) {
    (void)state;
    const ccase cases[] = {
        {1, 40, 16, 151936, LK_CE_MEAN, 0.1, 1e-3, 30.0, 0, 16, 0, 1, 0},  /* 3 chunks, softcap */
        {2, 10, 16, 40000, LK_CE_SUM, 0.0, 1e-3, 0.0, 0, 16, 0, 0, 0},
        {1, 18, 16, 65544, LK_CE_NONE, 0.05, 0.0, 20.0, 0, 16, 0, 1, 0},   /* none: by token */
        {4, 9, 16, 151936, LK_CE_MEAN, 0.0, 1e-4, 0.0, 5, 16, 1, 1, 0},    /* fp32_lm_head, logits_to_keep */
        {1, 11, 48, 65544, LK_CE_MEAN, 0.1, 0.0, 0.0, 0, 4, 0, 1, 1},      /* lean: the rows give the lse */
        /* 1024 rows in one chunk, hundreds of clusters in flight: the label's logit must be read
         * before a peer CTA writes its gradient over it (f32: one row's loss off is 2e-4) */
        {1, 1024, 8, 151936, LK_CE_MEAN, 0.0, 0.0, 0.0, 0, 1024, 0, 1, 0},
    };
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            run_case(d ? LK_BF16 : LK_F32, &cases[i], 45u + (uint32_t)i);
}

/* A label outside [0, V) is not read on the host: the kernel makes that loss NaN. */
static void bad_label_is_nan(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_CROSS_ENTROPY, "fused", LK_DEVICE_CUDA);
    int64_t T = 4, H = 32, V = 64, sh[2] = {T, H}, sw[2] = {V, H}, one = 1, lab[4] = {1, 2, 99, 3};
    double *h = lkt_alloc(T * H), *w = lkt_alloc(V * H);
    uint32_t seed = 9;
    lkt_randn(h, T * H, &seed, 1.0), lkt_randn(w, V * H, &seed, 0.2);
    void *dh_ = lkt_upload(h, T * H, LK_F32), *dw_ = lkt_upload(w, V * H, LK_F32), *dlab = lkt_dev(T * 8);
    assert_int_equal(cudaMemcpy(dlab, lab, sizeof lab, cudaMemcpyHostToDevice), cudaSuccess);
    void *loss = lkt_dev(4);
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    a.hidden = lkt_view(dh_, LK_F32, 2, sh), a.weight = lkt_view(dw_, LK_F32, 2, sw);
    a.labels = lkt_view(dlab, LK_I64, 1, &T), a.loss = lkt_view(loss, LK_F32, 1, &one);
    size_t sb = 0;
    assert_int_equal(lk_cross_entropy_saved_bytes(impl, &a, &sb), LK_OK);
    a.saved = (lk_saved){lkt_dev(sb), sb};
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, 0);
    assert_int_equal(lk_cross_entropy_forward(impl, &a, &ctx), LK_OK);
    double got;
    lkt_download(loss, 1, LK_F32, &got);
    assert_true(isnan(got));
    /* and a CPU loss tensor is refused by the facade, naming it */
    a.loss.device.type = LK_DEVICE_CPU;
    assert_int_equal(lk_cross_entropy_forward(impl, &a, &ctx), LK_EDEVICE);
    assert_non_null(strstr(lk_last_error(), "loss"));
    lk_arena_free(&arena);
    lkt_free_all();
}

/* chunk_bytes 0 on the GPU is LK_CE_DEFAULT_CHUNK_BYTES_CUDA: at the LM head of the
 * bench (T 8192, H 4096, V 151936) the three-GEMM path, whose saved state holds the f32
 * dW; the CPU's 32 MiB would give chunks of 55 tokens and the lean path. A size query:
 * nothing is allocated or read. */
static void default_budget_is_the_gpus(void **state) {
    (void)state;
    const lk_impl *impl = lk_impl_find(LK_OP_CROSS_ENTROPY, "fused", LK_DEVICE_CUDA);
    int64_t T = 8192, H = 4096, V = 151936, sh[2] = {T, H}, sw[2] = {V, H}, one = 1;
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    a.hidden = lkt_view(NULL, LK_BF16, 2, sh), a.weight = lkt_view(NULL, LK_BF16, 2, sw);
    a.labels = lkt_view(NULL, LK_I64, 1, &T), a.loss = lkt_view(NULL, LK_F32, 1, &one);
    size_t sb = 0;
    assert_int_equal(lk_cross_entropy_saved_bytes(impl, &a, &sb), LK_OK);
    assert_true(sb >= (size_t)(V * H * 4));
    a.chunk_bytes = LK_CE_DEFAULT_CHUNK_BYTES;   /* the CPU's: lean */
    assert_int_equal(lk_cross_entropy_saved_bytes(impl, &a, &sb), LK_OK);
    assert_true(sb < (size_t)(V * H * 4));
}

int main(void) {
    if (!lkt_have_gpu("cuda_test_cross_entropy")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accumulating_path),
        cmocka_unit_test(lean_path),
        cmocka_unit_test(long_rows),
        cmocka_unit_test(bad_label_is_nan),
        cmocka_unit_test(default_budget_is_the_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
