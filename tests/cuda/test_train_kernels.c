/* test_train_kernels.c (GPU) — the training-step kernels of cuda_train.h against float64
 * references: the embedding forward (exact: a gather), its backward (sorted segment sums;
 * repeated ids, a padding-like frequent id, odd widths, i32/i64 ids, f32/bf16 dout and
 * dweight, accumulation into existing values, bit-identical on a second run), bad ids
 * (LK_EINVAL naming the token, dweight untouched), multi-tensor AdamW over three steps
 * (f32 params in place, bf16 params through f32 masters, no_decay, odd sizes), and the
 * global norm + clipping (mixed dtypes, odd sizes, deterministic, NaN passes through), and
 * the plan of a CUDA graph's step (the eager clip + AdamW's bits, its log, its halt).
 * Outputs are poisoned with NaN first. Tolerances at each assertion. Skipped (77)
 * without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "cuda_util.h"
#include "llmkern/cuda_train.h"
#include "llmkern/train.h"
#include "core/sround.h"

static lk_ctx ctx_of(lk_arena *a) {
    *a = (lk_arena){.device = LK_DEVICE_CUDA};
    return lk_ctx_cuda(a, NULL, 0);
}

/* T ids in [0, V), about a third of them the same id (2), like padding. */
static void make_ids(double *ids, int64_t T, int64_t V, uint32_t *seed) {
    for (int64_t t = 0; t < T; t++) {
        uint32_t s = *seed;
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        *seed = s;
        ids[t] = s % 3 == 0 ? 2 % V : (double)(s % (uint32_t)V);
    }
}

typedef struct {
    int64_t T, V, H;
    lk_dtype wdt, gdt, idt;   /* table/out, dout, ids */
} ecase;

static void embedding_case(const ecase *c, uint32_t seed) {
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    int64_t T = c->T, V = c->V, H = c->H, sw[2] = {V, H}, so[3] = {1, T, H}, si[2] = {1, T};
    double *w = lkt_alloc(V * H), *ids = lkt_alloc(T), *g = lkt_alloc(T * H), *dw = lkt_alloc(V * H);
    double *ref = lkt_alloc(V * H), *out = lkt_alloc(T > V ? T * H : V * H);
    lkt_randn(w, V * H, &seed, 1.0), lkt_randn(g, T * H, &seed, 1.0), lkt_randn(dw, V * H, &seed, 1.0);
    make_ids(ids, T, V, &seed);
    void *dW = lkt_upload(w, V * H, c->wdt), *dI = lkt_upload(ids, T, c->idt), *dG = lkt_upload(g, T * H, c->gdt);
    void *dO = lkt_dev((size_t)(T * H) * lk_dtype_size(c->wdt));
    lkt_poison(dO, (size_t)(T * H) * lk_dtype_size(c->wdt));
    lk_tensor tw = lkt_view(dW, c->wdt, 2, sw), ti = lkt_view(dI, c->idt, 2, si), to = lkt_view(dO, c->wdt, 3, so);
    assert_int_equal(lk_cuda_embedding_forward(&tw, &ti, &to, &ctx), LK_OK);
    lkt_download(dO, T * H, c->wdt, out);
    for (int64_t t = 0; t < T; t++)   /* a gather: exact */
        for (int64_t j = 0; j < H; j++) assert_true(out[t * H + j] == w[(int64_t)ids[t] * H + j]);

    /* backward into dweight = dw (accumulates); reference in f64 */
    void *dD = lkt_upload(dw, V * H, c->wdt);
    memcpy(ref, dw, sizeof(double) * (size_t)(V * H));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < H; j++) ref[(int64_t)ids[t] * H + j] += g[t * H + j];
    lk_tensor tg = lkt_view(dG, c->gdt, 3, so), td = lkt_view(dD, c->wdt, 2, sw);
    assert_int_equal(lk_cuda_embedding_backward(&tg, &ti, &td, &ctx), LK_OK);
    lkt_download(dD, V * H, c->wdt, out);
    double e = lkt_rel_err(out, ref, V * H);
    print_message("  embedding T %lld V %lld H %lld w %s dout %s ids %s: bwd %.2e\n", (long long)T, (long long)V,
                  (long long)H, lk_dtype_name(c->wdt), lk_dtype_name(c->gdt), lk_dtype_name(c->idt), e);
    /* f32: sums of up to ~T/3 terms in f32, 1e-5 of the largest; bf16 dweight: one
     * rounding of the f32 sum (2^-8 relative) on top, 1e-2 */
    assert_true(e <= (c->wdt == LK_F32 ? 1e-5 : 1e-2));
    /* deterministic: the same start gives the same bits */
    double *again = lkt_alloc(V * H);
    void *dD2 = lkt_upload(dw, V * H, c->wdt);
    td.data = dD2;
    assert_int_equal(lk_cuda_embedding_backward(&tg, &ti, &td, &ctx), LK_OK);
    lkt_download(dD2, V * H, c->wdt, again);
    assert_memory_equal(out, again, sizeof(double) * (size_t)(V * H));
    lk_arena_free(&ar);
    lkt_free_all();
}

static void embedding_matches_reference(void **state) {
    (void)state;
    static const ecase cases[] = {
        {100, 37, 64, LK_F32, LK_F32, LK_I32},      /* 16-byte path */
        {100, 37, 64, LK_BF16, LK_BF16, LK_I64},
        {257, 11, 33, LK_F32, LK_BF16, LK_I64},     /* odd width: scalar path */
        {61, 1000, 24, LK_BF16, LK_F32, LK_I32},    /* mixed: f32 dout into bf16 dweight */
        {3000, 5, 8, LK_F32, LK_F32, LK_I32},       /* long runs of one id */
        {1, 1, 1, LK_BF16, LK_BF16, LK_I32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) embedding_case(&cases[i], 7u + (uint32_t)i);
}

static void embedding_bad_id(void **state) {
    (void)state;
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    int64_t V = 6, H = 8, T = 5, sw[2] = {V, H}, so[2] = {T, H};
    double w[48], ids[5] = {0, 5, 6, 1, -1}, g[40], out[48], keep[48];
    uint32_t seed = 5;
    lkt_randn(w, 48, &seed, 1.0), lkt_randn(g, 40, &seed, 1.0);
    void *dW = lkt_upload(w, 48, LK_F32), *dI = lkt_upload(ids, T, LK_I64), *dG = lkt_upload(g, 40, LK_F32);
    void *dO = lkt_dev(40 * 4);
    lk_tensor tw = lkt_view(dW, LK_F32, 2, sw), ti = lk_tensor_1d(dI, LK_I64, T), to = lkt_view(dO, LK_F32, 2, so);
    ti.device.type = LK_DEVICE_CUDA;
    assert_int_equal(lk_cuda_embedding_forward(&tw, &ti, &to, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "token 2 has id 6"));
    lkt_download(dO, 40, LK_F32, out);
    for (int64_t t = 0; t < T; t++)   /* bad rows NaN, good rows gathered */
        for (int j = 0; j < H; j++)
            assert_true(t == 2 || t == 4 ? isnan(out[t * H + j]) : out[t * H + j] == w[(int64_t)ids[t] * H + j]);
    lk_tensor tg = lkt_view(dG, LK_F32, 2, so), td = tw;
    assert_int_equal(lk_cuda_embedding_backward(&tg, &ti, &td, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ids"));
    lkt_download(dW, 48, LK_F32, keep);
    assert_memory_equal(keep, w, sizeof w);   /* untouched */
    /* host-side checks: wrong out dtype, wrong row count */
    lk_tensor bad = to;
    bad.dtype = LK_BF16;
    assert_int_equal(lk_cuda_embedding_forward(&tw, &ti, &bad, &ctx), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "out"));
    bad = to, bad.shape[0] = T + 1;
    assert_int_equal(lk_cuda_embedding_forward(&tw, &ti, &bad, &ctx), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "out"));
    lk_arena_free(&ar);
    lkt_free_all();
}

/* --- AdamW ----------------------------------------------------------------------------------- */

static void adamw_ref(double *p, const double *g, double *m, double *v, int64_t n, const lk_cuda_adamw_hparams *h,
                      int decay) {
    double wd = decay ? h->weight_decay : 0.0, t = (double)h->step;
    for (int64_t i = 0; i < n; i++) {
        m[i] = h->beta1 * m[i] + (1 - h->beta1) * g[i];
        v[i] = h->beta2 * v[i] + (1 - h->beta2) * g[i] * g[i];
        double mh = m[i] / (1 - pow(h->beta1, t)), vh = v[i] / (1 - pow(h->beta2, t));
        p[i] = p[i] * (1 - h->lr * wd) - h->lr * mh / (sqrt(vh) + h->eps);
    }
}

/* A copy of n elements of device array d one element into a fresh one: a tensor whose
 * blocks are all misaligned, so the kernels take their element-at-a-time path. */
static void *shifted(const void *d, int64_t n, lk_dtype dt) {
    size_t es = lk_dtype_size(dt);
    char *s = lkt_dev((size_t)(n + 1) * es);
    assert_int_equal(cudaMemcpy(s + es, d, (size_t)n * es, cudaMemcpyDeviceToDevice), 0);
    return s + es;
}

#define NT 4
static void adamw_matches_reference(void **state) {
    (void)state;
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    const int64_t n[NT] = {4097, 1, 100003, 33};
    const lk_dtype pdt[NT] = {LK_BF16, LK_F32, LK_BF16, LK_F32}, gdt[NT] = {LK_BF16, LK_F32, LK_F32, LK_BF16};
    lk_cuda_adamw_tensor t[NT];
    double *p[NT], *m[NT], *v[NT], *g[NT];
    uint32_t seed = 11;
    for (int i = 0; i < NT; i++) {
        p[i] = lkt_alloc(n[i]), m[i] = lkt_alloc(n[i]), v[i] = lkt_alloc(n[i]), g[i] = lkt_alloc(n[i]);
        lkt_randn(p[i], n[i], &seed, 1.0);
        void *dp = lkt_upload(p[i], n[i], pdt[i]);   /* p now holds the rounded values */
        t[i] = (lk_cuda_adamw_tensor){.param = dp, .m = lkt_dev((size_t)n[i] * 4),
                                      .v = lkt_dev((size_t)n[i] * 4), .n = n[i], .param_dtype = pdt[i],
                                      .grad_dtype = gdt[i], .no_decay = i == 3};
        assert_int_equal(cudaMemset(t[i].m, 0, (size_t)n[i] * 4), 0);
        assert_int_equal(cudaMemset(t[i].v, 0, (size_t)n[i] * 4), 0);
        if (pdt[i] == LK_BF16) t[i].master = lkt_upload(p[i], n[i], LK_F32);
    }
    lk_cuda_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        for (int i = 0; i < NT; i++) {
            lkt_randn(g[i], n[i], &seed, 0.5);
            void *dg = lkt_upload(g[i], n[i], gdt[i]);   /* g rounded as the GPU sees it */
            t[i].grad = i == 2 ? shifted(dg, n[i], gdt[i]) : dg;   /* 24 whole blocks, none aligned */
            adamw_ref(p[i], g[i], m[i], v[i], n[i], &hp, i != 3);
        }
        assert_int_equal(lk_cuda_adamw_step(t, NT, &hp, &ctx), LK_OK);
    }
    for (int i = 0; i < NT; i++) {
        double *out = lkt_alloc(n[i]), *pb = lkt_alloc(n[i]), e[3];
        lkt_download(t[i].m, n[i], LK_F32, out), e[0] = lkt_rel_err(out, m[i], n[i]);
        lkt_download(t[i].v, n[i], LK_F32, out), e[1] = lkt_rel_err(out, v[i], n[i]);
        lkt_download(pdt[i] == LK_BF16 ? t[i].master : t[i].param, n[i], LK_F32, out);
        e[2] = lkt_rel_err(out, p[i], n[i]);
        print_message("  adamw n %lld param %s grad %s: m %.2e v %.2e p %.2e\n", (long long)n[i],
                      lk_dtype_name(pdt[i]), lk_dtype_name(gdt[i]), e[0], e[1], e[2]);
        /* f32 math over 3 steps against f64: a few ulp of the largest value; the update
         * divides m by sqrt(v) (|m|/sqrt(v) <= ~3), 1e-5 covers both */
        for (int k = 0; k < 3; k++) assert_true(e[k] <= 1e-5);
        if (pdt[i] == LK_BF16) {   /* param = master rounded to nearest even, exactly */
            lkt_download(t[i].param, n[i], LK_BF16, pb);
            for (int64_t j = 0; j < n[i]; j++) assert_true(pb[j] == lk_bf16_to_f32(lk_f32_to_bf16((float)out[j])));
        }
    }
    /* bad inputs: nothing queued, the field named (a bf16 param without a master is
     * adamw_bf16_weights_round_as_documented's) */
    t[1].master = t[0].master;
    assert_int_equal(lk_cuda_adamw_step(t, NT, &hp, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "tensors[1].master: expected NULL for an f32 param"));
    t[1].master = NULL;
    hp.step = 0;
    assert_int_equal(lk_cuda_adamw_step(t, NT, &hp, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "step"));
    lk_arena_free(&ar);
    lkt_free_all();
}

/* --- global norm and clipping ----------------------------------------------------------------- */

static void grad_norm_and_clip(void **state) {
    (void)state;
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    const int64_t n[NT] = {1, 4097, 300001, 3};
    const lk_dtype dt[NT] = {LK_F32, LK_BF16, LK_F32, LK_BF16};
    lk_cuda_buf b[NT];
    double *x[NT], ss = 0.0;
    uint32_t seed = 21;
    for (int i = 0; i < NT; i++) {
        x[i] = lkt_alloc(n[i]);
        lkt_randn(x[i], n[i], &seed, 0.01);
        b[i] = (lk_cuda_buf){lkt_upload(x[i], n[i], dt[i]), n[i], dt[i]};
        if (i == 2) b[i].data = shifted(b[i].data, n[i], dt[i]);   /* whole blocks, none aligned */
        for (int64_t j = 0; j < n[i]; j++) ss += x[i][j] * x[i][j];
    }
    double ref = sqrt(ss), nrm = -1.0, nrm2 = -2.0;
    assert_int_equal(lk_cuda_grad_norm(b, NT, &nrm, &ctx), LK_OK);
    assert_int_equal(lk_cuda_grad_norm(b, NT, &nrm2, &ctx), LK_OK);
    print_message("  grad norm %.10g ref %.10g rel %.2e\n", nrm, ref, fabs(nrm - ref) / ref);
    assert_true(fabs(nrm - ref) <= 1e-12 * ref);   /* f64 sums of exactly the stored values */
    assert_memory_equal(&nrm, &nrm2, sizeof nrm);   /* deterministic */

    /* max_norm above the norm: nothing changes */
    assert_int_equal(lk_cuda_clip_grad_norm(b, NT, ref * 2, &nrm, &ctx), LK_OK);
    for (int i = 0; i < NT; i++) {
        double *o = lkt_alloc(n[i]);
        lkt_download(b[i].data, n[i], dt[i], o);
        assert_memory_equal(o, x[i], sizeof(double) * (size_t)n[i]);
    }
    /* max_norm below: scaled by max/(norm + 1e-6), f32 math, bf16 rounded once (2^-8) */
    double max = ref / 3, scale = max / (ref + 1e-6);
    assert_int_equal(lk_cuda_clip_grad_norm(b, NT, max, &nrm, &ctx), LK_OK);
    assert_true(fabs(nrm - ref) <= 1e-12 * ref);
    for (int i = 0; i < NT; i++) {
        double *o = lkt_alloc(n[i]), *r = lkt_alloc(n[i]);
        for (int64_t j = 0; j < n[i]; j++) r[j] = x[i][j] * scale;
        lkt_download(b[i].data, n[i], dt[i], o);
        assert_true(lkt_rel_err(o, r, n[i]) <= (dt[i] == LK_F32 ? 1e-6 : 8e-3));
    }
    /* a NaN gradient: NaN norm, nothing scaled */
    double nan1 = NAN;
    void *dn = lkt_upload(&nan1, 1, LK_F32);
    lk_cuda_buf bn[2] = {b[2], {dn, 1, LK_F32}};
    double *before = lkt_alloc(n[2]), *after = lkt_alloc(n[2]);
    lkt_download(b[2].data, n[2], LK_F32, before);
    assert_int_equal(lk_cuda_clip_grad_norm(bn, 2, 1e-9, &nrm, &ctx), LK_OK);
    assert_true(isnan(nrm));
    lkt_download(b[2].data, n[2], LK_F32, after);
    assert_memory_equal(before, after, sizeof(double) * (size_t)n[2]);
    /* empty tensors between others and an odd count of chunks (7: sumsq_kernel takes two a
     * block, pairs within a tensor, across two, and a last one alone) */
    const int64_t n2[5] = {2 * 4096, 0, 3 * 4096, 0, 5000};
    const lk_dtype dt2[5] = {LK_BF16, LK_F32, LK_F32, LK_BF16, LK_BF16};
    lk_cuda_buf b2[5];
    double ss2 = 0.0;
    for (int i = 0; i < 5; i++) {
        double *y = lkt_alloc(n2[i] ? n2[i] : 1);
        lkt_randn(y, n2[i], &seed, 0.01);
        b2[i] = (lk_cuda_buf){n2[i] ? lkt_upload(y, n2[i], dt2[i]) : NULL, n2[i], dt2[i]};
        for (int64_t j = 0; j < n2[i]; j++) ss2 += y[j] * y[j];
    }
    assert_int_equal(lk_cuda_grad_norm(b2, 5, &nrm, &ctx), LK_OK);
    assert_int_equal(lk_cuda_grad_norm(b2, 5, &nrm2, &ctx), LK_OK);
    print_message("  grad norm, empty tensors, 7 chunks: rel %.2e\n", fabs(nrm - sqrt(ss2)) / sqrt(ss2));
    assert_true(fabs(nrm - sqrt(ss2)) <= 1e-12 * sqrt(ss2));
    assert_memory_equal(&nrm, &nrm2, sizeof nrm);
    /* a bad dtype is named */
    lk_cuda_buf bi = {dn, 1, LK_I32};
    assert_int_equal(lk_cuda_grad_norm(&bi, 1, &nrm, &ctx), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "bufs[0].dtype"));
    lk_arena_free(&ar);
    lkt_free_all();
}

/* bf16 moments (train.exp_avg_dtype / exp_avg_sq_dtype): each step from the state the
 * GPU left, every stored moment is exactly lk_sround_bf16 of the f32 value (computed here
 * in the kernel's order, each operation rounded) with the documented bits (sround.h), so
 * the CPU trainer draws the same; and within one bf16 ulp of float64. The master weight
 * takes the unrounded f32 moments: f32's tolerance against float64. Odd sizes, m and v
 * bf16 alone and together, a tensor whose moments are misaligned (the element path). */
#define NB 4
static void adamw_bf16_moments_round_as_documented(void **state) {
    (void)state;
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    const int64_t n[NB] = {4097, 1001, 20001, 33};
    const lk_dtype mdt[NB] = {LK_BF16, LK_BF16, LK_BF16, LK_F32}, vdt[NB] = {LK_BF16, LK_F32, LK_BF16, LK_BF16};
    const lk_dtype pdt[NB] = {LK_BF16, LK_F32, LK_BF16, LK_BF16}, gdt[NB] = {LK_BF16, LK_F32, LK_F32, LK_BF16};
    lk_cuda_adamw_tensor t[NB];
    double *p[NB], *m[NB], *v[NB], *g[NB];
    uint32_t seed = 23;
    for (int i = 0; i < NB; i++) {
        p[i] = lkt_alloc(n[i]), m[i] = lkt_alloc(n[i]), v[i] = lkt_alloc(n[i]), g[i] = lkt_alloc(n[i]);
        lkt_randn(p[i], n[i], &seed, 1.0);
        t[i] = (lk_cuda_adamw_tensor){.param = lkt_upload(p[i], n[i], pdt[i]), .n = n[i], .param_dtype = pdt[i],
                                      .grad_dtype = gdt[i], .m_dtype = mdt[i], .v_dtype = vdt[i]};
        t[i].m = lkt_upload(m[i], n[i], mdt[i]);   /* zeros */
        t[i].v = lkt_upload(v[i], n[i], vdt[i]);
        if (i == 2) t[i].m = shifted(t[i].m, n[i], mdt[i]), t[i].v = shifted(t[i].v, n[i], vdt[i]);
        if (pdt[i] == LK_BF16) t[i].master = lkt_upload(p[i], n[i], LK_F32);
    }
    lk_cuda_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                                .seed = 77};
    const float b1 = (float)hp.beta1, b2 = (float)hp.beta2;
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        for (int i = 0; i < NB; i++) {
            lkt_randn(g[i], n[i], &seed, 0.5);
            t[i].grad = lkt_upload(g[i], n[i], gdt[i]);   /* g rounded as the GPU sees it */
            /* the state the GPU holds before the step */
            lkt_download(t[i].m, n[i], mdt[i], m[i]);
            lkt_download(t[i].v, n[i], vdt[i], v[i]);
            lkt_download(pdt[i] == LK_BF16 ? t[i].master : t[i].param, n[i], LK_F32, p[i]);
        }
        assert_int_equal(lk_cuda_adamw_step(t, NB, &hp, &ctx), LK_OK);
        for (int i = 0; i < NB; i++) {
            double *gm = lkt_alloc(n[i]), *gv = lkt_alloc(n[i]), *gp = lkt_alloc(n[i]);
            lkt_download(t[i].m, n[i], mdt[i], gm);
            lkt_download(t[i].v, n[i], vdt[i], gv);
            lkt_download(pdt[i] == LK_BF16 ? t[i].master : t[i].param, n[i], LK_F32, gp);
            const uint64_t key = lk_sround_tensor_key(lk_sround_step_key(hp.seed, step), i);
            double ep = 0, em = 0, ev = 0;
            for (int64_t j = 0; j < n[i]; j++) {
                /* the kernel's f32 arithmetic, one rounding an operation (volatile: no contraction) */
                const float gj = (float)g[i][j];
                volatile float a = b1 * (float)m[i][j], b = (1.0f - b1) * gj;
                volatile float c = b2 * (float)v[i][j], d = (1.0f - b2) * gj, e = d * gj;
                const float mx = a + b, vx = c + e;
                const uint64_t r = lk_sround_bits(key, j, 0);
                if (mdt[i] == LK_BF16) assert_true(gm[j] == lk_bf16_to_f32(lk_sround_bf16(mx, (uint32_t)r)));
                if (vdt[i] == LK_BF16) assert_true(gv[j] == lk_bf16_to_f32(lk_sround_bf16(vx, (uint32_t)(r >> 16))));
                /* float64 */
                const double rm = hp.beta1 * m[i][j] + (1 - hp.beta1) * g[i][j];
                const double rv = hp.beta2 * v[i][j] + (1 - hp.beta2) * g[i][j] * g[i][j];
                const double rp = p[i][j] * (1 - hp.lr * hp.weight_decay) -
                                  hp.lr * (rm / (1 - pow(hp.beta1, step))) / (sqrt(rv / (1 - pow(hp.beta2, step))) + hp.eps);
                ep = fmax(ep, fabs(gp[j] - rp));
                em = fmax(em, fabs(gm[j] - rm) / (fabs(rm) + 1e-3));
                ev = fmax(ev, fabs(gv[j] - rv) / (rv + 1e-12));
            }
            if (step == 3)
                print_message("  adamw bf16 moments n %lld m %s v %s: p %.2e, m rel %.2e, v rel %.2e\n", (long long)n[i],
                              lk_dtype_name(mdt[i]), lk_dtype_name(vdt[i]), ep, em, ev);
            assert_true(ep <= 1e-5);   /* f32 math, |p| <= ~5 */
            /* a bf16 neighbour: 2^-7 relative at most (m: of |m| + 1e-3, for cancelling sums),
             * plus f32's own error, of which 1 - b2 taken in f32 (1.3e-5 off) is the most */
            assert_true(em <= (mdt[i] == LK_BF16 ? 0x1p-7 : 0.0) + 3e-5);
            assert_true(ev <= (vdt[i] == LK_BF16 ? 0x1p-7 : 0.0) + 3e-5);
        }
    }
    /* a bad moment dtype is named, nothing queued */
    t[1].v_dtype = LK_I32;
    assert_int_equal(lk_cuda_adamw_step(t, NB, &hp, &ctx), LK_EDTYPE);
    assert_non_null(strstr(lk_last_error(), "tensors[1].v_dtype: expected f32 or bf16, got i32"));
    lk_arena_free(&ar);
    lkt_free_all();
}

/* bf16 weights without a master (train.main_params_dtype bf16): each of three steps from the
 * state the GPU left, every stored weight is exactly lk_sround_bf16 of the f32 update
 * (computed here in the kernel's order, each operation rounded) with bits 32-47 of the
 * element's draw (sround.h), so the CPU's lk_adamw_update stores the same; and within one
 * bf16 ulp of float64. f32 and bf16 moments beside it, a misaligned tensor (the element
 * path), odd sizes. */
#define NW 3
static void adamw_bf16_weights_round_as_documented(void **state) {
    (void)state;
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    const int64_t n[NW] = {4097, 1001, 33};
    const lk_dtype mdt[NW] = {LK_F32, LK_BF16, LK_BF16}, gdt[NW] = {LK_F32, LK_F32, LK_BF16};
    lk_cuda_adamw_tensor t[NW];
    double *p[NW], *m[NW], *v[NW], *g[NW];
    uint32_t seed = 29;
    for (int i = 0; i < NW; i++) {
        p[i] = lkt_alloc(n[i]), m[i] = lkt_alloc(n[i]), v[i] = lkt_alloc(n[i]), g[i] = lkt_alloc(n[i]);
        lkt_randn(p[i], n[i], &seed, 1.0);
        t[i] = (lk_cuda_adamw_tensor){.param = lkt_upload(p[i], n[i], LK_BF16), .n = n[i], .param_dtype = LK_BF16,
                                      .grad_dtype = gdt[i], .m_dtype = mdt[i], .v_dtype = mdt[i]};
        if (i == 1) t[i].param = shifted(t[i].param, n[i], LK_BF16);
        t[i].m = lkt_upload(m[i], n[i], mdt[i]);   /* zeros */
        t[i].v = lkt_upload(v[i], n[i], mdt[i]);
    }
    lk_cuda_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                                .seed = 79};
    const float b1 = (float)hp.beta1, b2 = (float)hp.beta2, eps = (float)hp.eps;
    for (int step = 1; step <= 3; step++) {
        hp.step = step;
        const float lrs = (float)(hp.lr / (1.0 - pow(hp.beta1, step))), vcorr = (float)(1.0 / sqrt(1.0 - pow(hp.beta2, step)));
        const float decay = (float)(1.0 - hp.lr * hp.weight_decay);
        for (int i = 0; i < NW; i++) {
            lkt_randn(g[i], n[i], &seed, 0.5);
            t[i].grad = lkt_upload(g[i], n[i], gdt[i]);
            lkt_download(t[i].m, n[i], mdt[i], m[i]);
            lkt_download(t[i].v, n[i], mdt[i], v[i]);
            lkt_download(t[i].param, n[i], LK_BF16, p[i]);
        }
        assert_int_equal(lk_cuda_adamw_step(t, NW, &hp, &ctx), LK_OK);
        for (int i = 0; i < NW; i++) {
            double *gp = lkt_alloc(n[i]);
            lkt_download(t[i].param, n[i], LK_BF16, gp);
            const uint64_t key = lk_sround_tensor_key(lk_sround_step_key(hp.seed, step), i);
            double worst = 0;
            for (int64_t j = 0; j < n[i]; j++) {
                const float gj = (float)g[i][j];
                volatile float a = b1 * (float)m[i][j], b = (1.0f - b1) * gj;
                volatile float c = b2 * (float)v[i][j], d = (1.0f - b2) * gj, e = d * gj;
                volatile float mx = a + b, vx = c + e;
                volatile float root = sqrtf(vx), scaled = root * vcorr, den = scaled + eps;
                volatile float num = lrs * mx, q = num / den, kept = (float)p[i][j] * decay;
                const float w = kept - q;
                const uint64_t r = lk_sround_bits(key, j, 1);
                assert_true(gp[j] == lk_bf16_to_f32(lk_sround_bf16(w, (uint32_t)(r >> 32))));
                const double rm = hp.beta1 * m[i][j] + (1 - hp.beta1) * g[i][j];
                const double rv = hp.beta2 * v[i][j] + (1 - hp.beta2) * g[i][j] * g[i][j];
                const double rp = p[i][j] * (1 - hp.lr * hp.weight_decay) -
                                  hp.lr * (rm / (1 - pow(hp.beta1, step))) / (sqrt(rv / (1 - pow(hp.beta2, step))) + hp.eps);
                /* a bf16 neighbour of float64's: within 2^-7 of the larger binade (bf16 moments
                 * move the step by their own rounding: 2^-7 of lr more) */
                const double ulp = ldexp(1.0, ilogb(fmax(fabs(gp[j]), fabs(rp))) - 7);
                worst = fmax(worst, fabs(gp[j] - rp) / (ulp + 2e-2 * hp.lr));
            }
            if (step == 3)
                print_message("  adamw bf16 weights n %lld, moments %s: worst |p - float64| %.2f of (1 ulp + 2%% of lr)\n",
                              (long long)n[i], lk_dtype_name(mdt[i]), worst);
            assert_true(worst <= 1.0);
        }
    }
    lk_arena_free(&ar);
    lkt_free_all();
}

/* --- the plan: a whole optimizer step without the host (train.cuda_graph's) ----------------- */

/* The plan against the eager clip + AdamW on twin tensors, bit for bit, over three steps
 * that clip (two slots in turn); its log gives each step's loss and norm; a NaN loss halts
 * it: neither that step nor a finite one after it changes a tensor. The eager twin clips in
 * place (lk_cuda_clip_grad_norm) or, fold, as AdamW reads the gradients (lk_cuda_grad_norm,
 * then hparams.grad_scale = lk_clip_scale: the trainer's order); gradients of gdt (f32, or
 * bf16: train.main_grads_dtype). */
static void plan_case(lk_dtype gdt, int fold) {
    lk_arena ar;
    lk_ctx ctx = ctx_of(&ar);
    enum { NP = 3, STEPS = 5 };
    const int64_t n[NP] = {4099, 1, 70001};
    const lk_dtype pdt[NP] = {LK_BF16, LK_F32, LK_BF16}, mdt[NP] = {LK_F32, LK_F32, LK_BF16};   /* + bf16 moments */
    lk_cuda_adamw_tensor te[NP], tp[NP];
    lk_cuda_buf ge[NP];
    void *gp[NP];   /* the plan twin's gradients */
    const size_t gs = lk_dtype_size(gdt);
    uint32_t seed = 31;
    for (int i = 0; i < NP; i++) {
        double *x = lkt_alloc(n[i]);
        lkt_randn(x, n[i], &seed, 1.0);
        lk_cuda_adamw_tensor *tt[2] = {&te[i], &tp[i]};
        for (int k = 0; k < 2; k++) {
            *tt[k] = (lk_cuda_adamw_tensor){.param = lkt_upload(x, n[i], pdt[i]), .grad = lkt_dev((size_t)n[i] * gs),
                                            .m = lkt_dev((size_t)n[i] * 4), .v = lkt_dev((size_t)n[i] * 4), .n = n[i],
                                            .param_dtype = pdt[i], .grad_dtype = gdt, .no_decay = i == 1,
                                            .m_dtype = mdt[i], .v_dtype = mdt[i]};
            assert_int_equal(cudaMemset(tt[k]->m, 0, (size_t)n[i] * 4), 0);
            assert_int_equal(cudaMemset(tt[k]->v, 0, (size_t)n[i] * 4), 0);
            if (pdt[i] == LK_BF16) tt[k]->master = lkt_upload(x, n[i], LK_F32);
        }
        ge[i] = (lk_cuda_buf){(void *)te[i].grad, n[i], gdt};
        gp[i] = (void *)tp[i].grad;
    }
    lk_cuda_adamw_hparams hp = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .seed = 5};
    const double max_norm = 1.0;   /* the grads' norm is ~100: every step clips */
    lk_cuda_adamw_plan *plan;
    assert_int_equal(lk_cuda_adamw_plan_create(tp, NP, &hp, max_norm, 8, &plan), LK_OK);
    double losses[STEPS] = {2.5, 2.25, 2.0, NAN, 1.5}, norm_e[STEPS];
    float *dloss = lkt_dev(4);
    double *after3[NP];
    for (int step = 1; step <= STEPS; step++) {
        for (int i = 0; i < NP; i++) {   /* the same gradients into both twins */
            double *g = lkt_alloc(n[i]);
            lkt_randn(g, n[i], &seed, 0.5);
            void *dg = lkt_upload(g, n[i], gdt);
            assert_int_equal(cudaMemcpy(ge[i].data, dg, (size_t)n[i] * gs, cudaMemcpyDeviceToDevice), 0);
            assert_int_equal(cudaMemcpy(gp[i], dg, (size_t)n[i] * gs, cudaMemcpyDeviceToDevice), 0);
        }
        float l = (float)losses[step - 1];
        assert_int_equal(cudaMemcpy(dloss, &l, 4, cudaMemcpyHostToDevice), 0);
        hp.step = step;
        if (step <= 3 && fold) {   /* the eager twin stops where the plan halts */
            lk_cuda_adamw_hparams he = hp;
            assert_int_equal(lk_cuda_grad_norm(ge, NP, &norm_e[step - 1], &ctx), LK_OK);
            he.grad_scale = lk_clip_scale(norm_e[step - 1], max_norm);
            assert_true(he.grad_scale < 1.0f);
            assert_int_equal(lk_cuda_adamw_step(te, NP, &he, &ctx), LK_OK);
        } else if (step <= 3) {
            assert_int_equal(lk_cuda_clip_grad_norm(ge, NP, max_norm, &norm_e[step - 1], &ctx), LK_OK);
            assert_int_equal(lk_cuda_adamw_step(te, NP, &hp, &ctx), LK_OK);
        }
        assert_int_equal(lk_cuda_adamw_plan_set(plan, step % 2, hp.lr, step), LK_OK);
        assert_int_equal(lk_cuda_adamw_plan_step(plan, step % 2, dloss, &ctx), LK_OK);
        assert_int_equal(cudaDeviceSynchronize(), 0);   /* the slot's scalars are read by the step */
        if (step == 3)
            for (int i = 0; i < NP; i++) {
                after3[i] = lkt_alloc(n[i]);
                lkt_download(pdt[i] == LK_BF16 ? tp[i].master : tp[i].param, n[i], LK_F32, after3[i]);
            }
    }
    double lg[8], ng[8];
    int got = -1;
    assert_int_equal(lk_cuda_adamw_plan_read(plan, lg, ng, 8, &got), LK_OK);
    assert_int_equal(got, STEPS);
    for (int k = 0; k < STEPS; k++) {
        print_message("  %s gradients, eager %s: plan step %d: loss %g norm %.10g%s\n", lk_dtype_name(gdt),
                      fold ? "folds the clip" : "clips in place", k + 1, lg[k], ng[k], k < 3 ? "" : " (halted)");
        assert_true(k == 3 ? isnan(lg[k]) : lg[k] == losses[k]);   /* an f32 loss, exact in f64 */
        if (k < 3) assert_memory_equal(&ng[k], &norm_e[k], sizeof(double));   /* the same fixed-order sum */
        assert_true(ng[k] > 10 * max_norm);
    }
    for (int i = 0; i < NP; i++) {   /* the twins bit for bit after 3 steps; nothing moved after */
        double *a = lkt_alloc(n[i]), *b = lkt_alloc(n[i]);
        const void *src[3][2] = {{pdt[i] == LK_BF16 ? te[i].master : te[i].param,
                                  pdt[i] == LK_BF16 ? tp[i].master : tp[i].param},
                                 {te[i].m, tp[i].m}, {te[i].v, tp[i].v}};
        for (int k = 0; k < 3; k++) {   /* the moments in their dtype: the same stochastic rounding */
            lkt_download(src[k][0], n[i], k ? mdt[i] : LK_F32, a);
            lkt_download(src[k][1], n[i], k ? mdt[i] : LK_F32, b);
            assert_memory_equal(a, b, sizeof(double) * (size_t)n[i]);
        }
        lkt_download(src[0][1], n[i], LK_F32, b);
        assert_memory_equal(after3[i], b, sizeof(double) * (size_t)n[i]);
    }
    /* read again: nothing new; bad slots and a short read are named */
    assert_int_equal(lk_cuda_adamw_plan_read(plan, lg, ng, 8, &got), LK_OK);
    assert_int_equal(got, 0);
    assert_int_equal(lk_cuda_adamw_plan_set(plan, 2, hp.lr, 6), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "slot: expected 0 .. 1, got 2"));
    assert_int_equal(lk_cuda_adamw_plan_step(plan, -1, dloss, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "slot"));
    for (int k = 0; k < 2; k++) assert_int_equal(lk_cuda_adamw_plan_step(plan, k, NULL, &ctx), LK_OK);
    assert_int_equal(lk_cuda_adamw_plan_read(plan, lg, ng, 1, &got), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "2 steps logged"));
    lk_cuda_adamw_plan_free(plan);
    assert_int_equal(lk_cuda_adamw_plan_create(tp, NP, &hp, max_norm, 0, &plan), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "log_cap"));
    assert_null(plan);
    hp.grad_scale = NAN;
    assert_int_equal(lk_cuda_adamw_step(te, NP, &hp, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "grad_scale: expected finite >= 0"));
    lk_arena_free(&ar);
    lkt_free_all();
}

static void adamw_plan_matches_eager_and_halts(void **state) {
    (void)state;
    plan_case(LK_F32, 0);
    plan_case(LK_F32, 1);    /* the same bits whether the clip is folded or done in place */
    plan_case(LK_BF16, 1);   /* bf16 gradients: folded, as the trainer does */
}

int main(void) {
    if (!lkt_have_gpu("test_train_kernels")) return LKT_SKIP;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(embedding_matches_reference),
        cmocka_unit_test(embedding_bad_id),
        cmocka_unit_test(adamw_matches_reference),
        cmocka_unit_test(adamw_bf16_moments_round_as_documented),
        cmocka_unit_test(adamw_bf16_weights_round_as_documented),
        cmocka_unit_test(grad_norm_and_clip),
        cmocka_unit_test(adamw_plan_matches_eager_and_halts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
