/* test_attention.c — attention: every CPU implementation in f32 and bf16 against the
 * float64 reference (non-causal, causal, GQA 8:1, MQA, windows, softcap, sinks, varlen
 * with 1..7 packed documents, q_len != kv_len, odd head dims; eager's dense masks;
 * flex with every BlockMask family, per-head and ragged; document masks of odd lengths
 * across blocks and row groups), finite-difference gradients,
 * the facade's dispatch slots, the padding -> varlen helper, block skipping (blocks listed
 * that nobody sees included), and the rejections (each a status, an error naming the
 * argument, outputs untouched).
 * Run: ctest -R test_attention, or ./build/test_attention. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/llmkern.h"
#include "ops/attention/check.h"

static const char *const flash_like[] = {"eager", "sdpa", "flash_attention_2", "llmkern_flash_attention_2_with_sp"};
static const char *const flex_like[] = {"flex_attention", "llmkern_flex_attention_with_sp"};
static const lk_dtype dtypes[] = {LK_F32, LK_BF16};
#define COUNT(a) (sizeof(a) / sizeof *(a))

static const lk_impl *impl_named(const char *name) {
    const lk_impl *impl = lk_impl_find(LK_OP_ATTENTION, name, LK_DEVICE_CPU);
    assert_non_null(impl);
    return impl;
}

/* The tolerances of check.c, restated where they are asserted: f32 math with f32 sums
 * over at most a few hundred keys here; bf16: one rounding of each output (2^-8) and
 * delta taken from the rounded out. */
static double tol_for(lk_dtype dt) { return dt == LK_F32 ? 2e-4 : 3e-2; }

static void expect_case(const char *name, lk_dtype dt, const lk_attention_case *c, uint64_t seed, const char *what) {
    lk_check_row row;
    lk_attention_errors e = {0};
    lk_status s = lk_attention_check_case(impl_named(name), dt, c, seed, &row, &e);
    if (s) print_error("%s: %s\n", what, lk_last_error());
    assert_int_equal(s, LK_OK);
    double tol = tol_for(dt);
    if (!(row.max_rel_err <= tol))
        print_error("  %-34s %-4s %-16s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e ds %.1e (tol %.0e)\n", name,
                    lk_dtype_name(dt), what, e.out, e.lse, e.dq, e.dk, e.dv, e.ds_aux, tol);
    assert_true(e.out <= tol);
    assert_true(e.lse <= tol);
    assert_true(e.dq <= tol);
    assert_true(e.dk <= tol);
    assert_true(e.dv <= tol);
    assert_true(e.ds_aux <= tol);
    assert_true(row.tol == tol);
    assert_true(row.pass);
}

/* --- flash-style options, every implementation that takes them ----------------- */

static const struct { const char *what; lk_attention_case c; } option_cases[] = {
    {"non-causal", {.B = 2, .Hq = 4, .Sq = 33, .D = 16}},
    {"causal", {.B = 1, .Hq = 3, .Sq = 70, .D = 32, .causal = 1}},
    {"gqa 8:1", {.B = 1, .Hq = 16, .Hkv = 2, .Sq = 40, .D = 24, .causal = 1}},
    {"mqa", {.B = 2, .Hq = 4, .Hkv = 1, .Sq = 66, .D = 64}},
    {"window causal", {.B = 1, .Hq = 2, .Sq = 90, .D = 20, .causal = 1, .window_left = 9}},
    {"window both", {.B = 1, .Hq = 2, .Sq = 75, .D = 16, .window_left = 5, .window_right = 4}},
    {"softcap", {.B = 1, .Hq = 2, .Sq = 50, .D = 32, .causal = 1, .softcap = 1.5f, .scale = 0.5f}},
    {"sinks", {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 45, .D = 16, .causal = 1, .sinks = 1}},
    {"q<kv causal", {.B = 1, .Hq = 2, .Sq = 37, .Skv = 101, .D = 16, .causal = 1}},
    {"q>kv causal", {.B = 1, .Hq = 2, .Sq = 50, .Skv = 20, .D = 16, .causal = 1, .sinks = 1}},
    {"d=80", {.B = 1, .Hq = 2, .Sq = 65, .D = 80, .causal = 1}},
    {"d=128", {.B = 1, .Hq = 1, .Sq = 130, .D = 128}},
};

static void options_match_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < COUNT(flash_like); i++)
        for (size_t d = 0; d < 2; d++)
            for (size_t k = 0; k < COUNT(option_cases); k++)
                expect_case(flash_like[i], dtypes[d], &option_cases[k].c, 10 + k, option_cases[k].what);
}

/* Packed documents: 1..7 of odd random lengths, self- and cross-length, with options. */
static void varlen_matches_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < COUNT(flash_like); i++)
        for (size_t d = 0; d < 2; d++)
            for (int docs = 1; docs <= 7; docs++) {
                lk_attention_case c = {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 97, .D = 16, .causal = docs % 2,
                                       .n_docs = docs, .sinks = docs == 3, .window_left = docs == 5 ? 7 : 0};
                expect_case(flash_like[i], dtypes[d], &c, 100 + docs, "varlen");
                c.Skv = 131;            /* each document's kv longer than its q: bottom-right causal */
                expect_case(flash_like[i], dtypes[d], &c, 200 + docs, "varlen q!=kv");
            }
}

/* --- eager's dense masks and score_mod ------------------------------------------ */

static void eager_dense_masks(void **state) {
    (void)state;
    for (size_t d = 0; d < 2; d++) {
        lk_attention_case b = {.B = 2, .Hq = 3, .Sq = 29, .Skv = 41, .D = 16, .dense = 1, .causal = 1};
        lk_attention_case add = {.B = 1, .Hq = 3, .Sq = 40, .D = 16, .dense = 2, .sinks = 1};
        lk_attention_case mod = {.B = 1, .Hq = 4, .Sq = 40, .D = 16, .family = LK_AM_PREFIX, .score_mod = 2};
        expect_case("eager", dtypes[d], &b, 1, "bool mask");
        expect_case("eager", dtypes[d], &add, 2, "additive mask");
        expect_case("eager", dtypes[d], &mod, 3, "blockmask+alibi");
    }
}

/* --- flex with every BlockMask family ------------------------------------------- */

static void flex_families_match_reference(void **state) {
    (void)state;
    for (size_t i = 0; i < COUNT(flex_like); i++)
        for (size_t d = 0; d < 2; d++)
            for (int f = LK_AM_CAUSAL; f < LK_AM_COUNT; f++) {
                /* ragged: 83 is no multiple of 16; window metadata beside the mask is ignored */
                lk_attention_case c = {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 83, .D = 16, .family = f, .block = 16,
                                       .causal = 1, .window_left = 3};
                expect_case(flex_like[i], dtypes[d], &c, 300 + f, "family");
            }
    for (size_t d = 0; d < 2; d++) {
        lk_attention_case big = {.B = 1, .Hq = 2, .Sq = 300, .D = 32, .family = LK_AM_DOCUMENT, .n_docs = 5};
        lk_attention_case qk = {.B = 1, .Hq = 2, .Sq = 40, .Skv = 150, .D = 16, .family = LK_AM_CAUSAL, .block = 32};
        lk_attention_case mods = {.B = 1, .Hq = 4, .Hkv = 1, .Sq = 70, .D = 16, .family = LK_AM_PER_HEAD,
                                  .block = 16, .score_mod = 1, .sinks = 1};
        lk_attention_case alibi = {.B = 1, .Hq = 4, .Sq = 70, .D = 16, .family = LK_AM_SLIDING, .block = 32,
                                   .score_mod = 2, .softcap = 3.0f};
        /* the bench's document lengths (S/16..S/4), no multiple of the block, D 64: spans
         * of 16..112 columns, partial tiles whose rows mostly see nothing */
        lk_attention_case docs = {.B = 1, .Hq = 2, .Sq = 400, .D = 64, .family = LK_AM_DOCUMENT, .block = 64};
        expect_case("flex_attention", dtypes[d], &big, 1, "128 blocks");
        expect_case("flex_attention", dtypes[d], &docs, 5, "documents, 64 blocks");
        expect_case("flex_attention", dtypes[d], &qk, 2, "q<kv");
        expect_case("flex_attention", dtypes[d], &mods, 3, "per-head+softcap mod");
        expect_case("flex_attention", dtypes[d], &alibi, 4, "alibi");
        expect_case("eager", dtypes[d], &mods, 3, "eager per-head");
    }
}

/* Document masks, the family whose partial blocks carry most of their work: documents of
 * random odd lengths whose boundaries fall inside blocks and inside the engine's row groups
 * (flash.c GROUP_ROWS), S no multiple of the block, blocks smaller and larger than the
 * documents, GQA, causal documents (cu_seqlens) and bidirectional per-batch ones (ids);
 * forward and gradients against the float64 reference on fresh inputs, outputs poisoned
 * (lk_attention_check_case). A row group or span that skipped a row's keys, or a row that
 * sees nothing in a tile but something elsewhere, shows here as an error. */
static void flex_documents_match_reference(void **state) {
    (void)state;
    static const lk_attention_case cases[] = {
        {.B = 1, .Hq = 2, .Sq = 259, .D = 64, .family = LK_AM_DOCUMENT, .n_docs = 7, .block = 128},
        {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 333, .D = 40, .family = LK_AM_DOCUMENT, .n_docs = 11, .block = 48},
        {.B = 1, .Hq = 2, .Sq = 517, .D = 64, .family = LK_AM_DOCUMENT, .n_docs = 3, .block = 64},
        {.B = 1, .Hq = 2, .Sq = 97, .D = 24, .family = LK_AM_DOCUMENT, .n_docs = 9, .block = 16},
        {.B = 2, .Hq = 2, .Hkv = 1, .Sq = 201, .D = 32, .family = LK_AM_DOC_IDS, .block = 32},
        {.B = 2, .Hq = 2, .Sq = 150, .D = 64, .family = LK_AM_DOC_IDS, .block = 128},
    };
    for (size_t d = 0; d < COUNT(dtypes); d++)
        for (size_t i = 0; i < COUNT(cases); i++)
            for (uint64_t seed = 11; seed < 13; seed++) {
                char what[64];
                snprintf(what, sizeof what, "documents case %zu seed %llu", i, (unsigned long long)seed);
                expect_case("flex_attention", dtypes[d], &cases[i], seed + 17 * i, what);
            }
}

/* --- finite differences ---------------------------------------------------------- */

/* L = Σ out · dout in double, from one forward of impl. */
static double loss(const lk_impl *impl, lk_attention_problem *pb, lk_ctx *ctx) {
    assert_int_equal(lk_attention_forward(impl, &pb->a, ctx), LK_OK);
    double l = 0.0;
    for (int64_t i = 0; i < pb->nq; i++) l += (double)((float *)pb->out)[i] * (double)((float *)pb->dout)[i];
    return l;
}

/* Central differences on a few elements of q, k, v and s_aux against the backward. */
static void fd_check(const char *name, const lk_attention_case *c) {
    const lk_impl *impl = impl_named(name);
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_attention_problem_make(impl, LK_F32, c, 77, 0, &pb), LK_OK);
    assert_int_equal(lk_attention_forward(impl, &pb.a, &ctx), LK_OK);
    assert_int_equal(lk_attention_backward(impl, &pb.a, &ctx), LK_OK);
    float *x[4] = {pb.q, pb.k, pb.v, pb.sink};
    const float *g[4] = {pb.dq, pb.dk, pb.dv, pb.dsink};
    int64_t n[4] = {pb.nq, pb.nk, pb.nk, c->sinks ? c->Hq : 0};
    const float h = 2e-3f;
    double worst = 0.0;
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < n[t]; i += n[t] / 5 + 1) {
            float keep = x[t][i];
            x[t][i] = keep + h;
            double up = loss(impl, &pb, &ctx);
            x[t][i] = keep - h;
            double down = loss(impl, &pb, &ctx);
            x[t][i] = keep;
            double fd = (up - down) / (2.0 * h), err = fabs(fd - g[t][i]) / fmax(1.0, fabs(fd));
            worst = fmax(worst, err);
        }
    print_message("  fd %-18s worst %.2e\n", name, worst);
    /* f32 loss over a few hundred terms: roundoff ~1e-6·|L| / h ~ 1e-3 at worst; a
     * wrong gradient term is off by O(1). */
    assert_true(worst < 1e-2);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static void gradients_by_finite_differences(void **state) {
    (void)state;
    lk_attention_case flash = {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 19, .Skv = 23, .D = 8, .causal = 1, .softcap = 2.0f,
                               .sinks = 1, .window_left = 6};
    lk_attention_case varlen = {.B = 1, .Hq = 2, .Sq = 21, .D = 8, .causal = 1, .n_docs = 3};
    lk_attention_case flex = {.B = 1, .Hq = 2, .Sq = 21, .D = 8, .family = LK_AM_PER_HEAD, .block = 8,
                              .score_mod = 2, .sinks = 1};
    lk_attention_case dense = {.B = 1, .Hq = 2, .Sq = 17, .D = 8, .dense = 2};
    for (size_t i = 0; i < COUNT(flash_like); i++) {
        fd_check(flash_like[i], &flash);
        fd_check(flash_like[i], &varlen);
    }
    fd_check("flex_attention", &flex);
    fd_check("eager", &flex);
    fd_check("eager", &dense);
}

/* The reference's own backward against its forward, in double. */
static void reference_gradient_is_its_derivative(void **state) {
    (void)state;
    lk_attention_case c = {.B = 1, .Hq = 2, .Hkv = 1, .Sq = 9, .Skv = 12, .D = 4, .causal = 1, .softcap = 1.0f,
                           .sinks = 1, .family = LK_AM_CAUSAL};   /* score_mod is f32: no FD in double */
    lk_attention_problem pb;
    assert_int_equal(lk_attention_problem_make(impl_named("eager"), LK_F32, &c, 5, 1, &pb), LK_OK);
    double **in = pb.ref_in, *out = malloc(sizeof(double) * (size_t)(2 * pb.nq + 2 * pb.nk + pb.nlse + 2));
    double *dq = out + pb.nq, *dk = dq + pb.nq, *dv = dk + pb.nk, *lse = dv + pb.nk, *ds = lse + pb.nlse;
    lk_attention_ref_backward(&pb.ref, in[0], in[1], in[2], in[3], dq, dk, dv, ds);
    double *x[4] = {in[0], in[1], in[2], in[4]}, *g[4] = {dq, dk, dv, ds}, h = 1e-6, worst = 0.0;
    int64_t n[4] = {pb.nq, pb.nk, pb.nk, 2};
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            double keep = x[t][i], l[2];
            for (int side = 0; side < 2; side++) {
                x[t][i] = keep + (side ? -h : h);
                lk_attention_ref_forward(&pb.ref, in[0], in[1], in[2], out, lse);
                l[side] = 0.0;
                for (int64_t j = 0; j < pb.nq; j++) l[side] += out[j] * in[3][j];
            }
            x[t][i] = keep;
            worst = fmax(worst, fabs((l[0] - l[1]) / (2 * h) - g[t][i]));
        }
    assert_true(worst < 1e-6);      /* double: h² truncation and 1e-16/h roundoff */
    free(out);
    lk_attention_problem_free(&pb);
}

/* --- the facade: dispatch slots and registry rows --------------------------------- */

static int stub_calls;
static lk_status stub_pass(const lk_attention_args *a, lk_ctx *ctx) { stub_calls++; return LK_OK; }
static size_t stub_saved(const lk_attention_args *a) { return 4; }
static const lk_attention_vtable stub = {.version = 1, .saved_bytes = stub_saved, .forward = stub_pass,
                                         .backward = stub_pass};

static void slots_are_swappable(void **state) {
    (void)state;
    lk_attention_case c = {.B = 1, .Hq = 2, .Sq = 8, .D = 8};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_attention_problem_make(impl_named("sdpa"), LK_F32, &c, 1, 0, &pb), LK_OK);
    const lk_attention_vtable *prev = lk_attention_set_backend(LK_ATTN_FLASH, &stub);
    assert_non_null(prev);
    stub_calls = 0;
    assert_int_equal(lk_attention_forward(impl_named("sdpa"), &pb.a, &ctx), LK_OK);
    assert_int_equal(lk_attention_forward(impl_named("flash_attention_2"), &pb.a, &ctx), LK_OK);
    assert_int_equal(lk_attention_backward(impl_named("llmkern_flash_attention_2_with_sp"), &pb.a, &ctx), LK_OK);
    assert_int_equal(stub_calls, 3);                        /* every flash name reached the slot */
    assert_int_equal(lk_attention_forward(impl_named("eager"), &pb.a, &ctx), LK_OK);
    assert_int_equal(stub_calls, 3);                        /* eager has its own slot */
    assert_ptr_equal(lk_attention_set_backend(LK_ATTN_FLASH, NULL), &stub);
    assert_ptr_equal(lk_attention_set_backend(LK_ATTN_FLASH, NULL), prev);   /* NULL restored the default */
    assert_null(lk_attention_set_backend(LK_ATTN_ADAPTER_COUNT, &stub));
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static void registry_rows(void **state) {
    (void)state;
    static const struct { const char *name; lk_attn_adapter ad; int sp; } rows[] = {
        {"eager", LK_ATTN_EAGER, 0}, {"sdpa", LK_ATTN_FLASH, 0}, {"flash_attention_2", LK_ATTN_FLASH, 0},
        {"flex_attention", LK_ATTN_FLEX, 0}, {"llmkern_flash_attention_2_with_sp", LK_ATTN_FLASH, 1},
        {"llmkern_flex_attention_with_sp", LK_ATTN_FLEX, 1},
    };
    for (size_t i = 0; i < COUNT(rows); i++) {
        const lk_impl *impl = impl_named(rows[i].name);
        const lk_attention_entry *e = impl->vtable;
        assert_int_equal(e->adapter, rows[i].ad);
        assert_int_equal(e->sp, rows[i].sp);
        assert_int_equal(impl->needs.sp_aware, rows[i].sp);
    }
    assert_null(lk_impl_find(LK_OP_ATTENTION, "flash_attention_3", LK_DEVICE_CPU));   /* Hopper only */
    int cpu_rows = 0;
    for (int i = 0; i < lk_impl_count(); i++)
        cpu_rows += lk_impl_at(i)->op == LK_OP_ATTENTION && lk_impl_at(i)->device == LK_DEVICE_CPU;
    assert_int_equal(cpu_rows, (int)COUNT(rows));           /* every CPU row is tested above */
}

/* --- varlen from a padding mask --------------------------------------------------- */

static void padding_mask_to_varlen(void **state) {
    (void)state;
    enum { B = 3, S = 10, H = 2, D = 8 };
    uint8_t pad[B * S] = {0};
    static const int len[B] = {10, 4, 7};
    for (int b = 0; b < B; b++)
        for (int s = 0; s < len[b]; s++) pad[b * S + (b == 2 ? S - 1 - s : s)] = 1;    /* row 2 left-padded */
    int32_t cu[B + 1];
    int64_t idx[B * S], total = 0, longest = 0;
    lk_tensor m = lk_tensor_2d(pad, LK_BOOL, B, S);
    assert_int_equal(lk_attention_varlen_from_padding(&m, cu, idx, &total, &longest), LK_OK);
    assert_int_equal(total, 21);
    assert_int_equal(longest, 10);
    assert_int_equal(cu[0], 0); assert_int_equal(cu[1], 10); assert_int_equal(cu[2], 14); assert_int_equal(cu[3], 21);
    assert_int_equal(idx[10], 10); assert_int_equal(idx[14], 23);
    /* packed and run once == each row alone */
    lk_rng rng = lk_rng_make(3);
    float *x = lk_random_tensor(&rng, LK_F32, 3 * H * B * S * D, 1.0f, NULL);
    float *packed = calloc(3 * H * 21 * D, 4), *out = calloc(21 * H * D, 4), *row_out = calloc(S * H * D, 4);
    float lse[H * 21];
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < H; h++)
            for (int64_t r = 0; r < total; r++) {
                int64_t b = idx[r] / S, s = idx[r] % S;
                memcpy(packed + ((t * H + h) * 21 + r) * D, x + (((t * B + b) * H + h) * S + s) * D, D * 4);
            }
    int64_t sh[4] = {1, H, 21, D}, osh[4] = {1, 21, H, D};
    lk_attention_args a = {.q = lk_tensor_view(packed, LK_F32, 4, sh),
                           .k = lk_tensor_view(packed + H * 21 * D, LK_F32, 4, sh),
                           .v = lk_tensor_view(packed + 2 * H * 21 * D, LK_F32, 4, sh),
                           .out = lk_tensor_view(out, LK_F32, 4, osh), .causal = 1, .saved = {lse, sizeof lse},
                           .cu_seqlens_q = lk_tensor_1d(cu, LK_I32, B + 1), .cu_seqlens_k = lk_tensor_1d(cu, LK_I32, B + 1),
                           .max_seqlen_q = longest, .max_seqlen_k = longest};
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_attention_forward(impl_named("sdpa"), &a, &ctx), LK_OK);
    for (int b = 0; b < B; b++) {
        float *rq = calloc(3 * H * len[b] * D, 4), rl[H * S];
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < H; h++)
                memcpy(rq + (t * H + h) * len[b] * D, packed + ((t * H + h) * 21 + cu[b]) * D, (size_t)len[b] * D * 4);
        int64_t rs[4] = {1, H, len[b], D}, ro[4] = {1, len[b], H, D};
        lk_attention_args r = {.q = lk_tensor_view(rq, LK_F32, 4, rs), .k = lk_tensor_view(rq + H * len[b] * D, LK_F32, 4, rs),
                               .v = lk_tensor_view(rq + 2 * H * len[b] * D, LK_F32, 4, rs),
                               .out = lk_tensor_view(row_out, LK_F32, 4, ro), .causal = 1, .saved = {rl, sizeof rl}};
        assert_int_equal(lk_attention_forward(impl_named("eager"), &r, &ctx), LK_OK);
        for (int i = 0; i < len[b] * H * D; i++) assert_true(fabsf(row_out[i] - out[cu[b] * H * D + i]) < 1e-5f);
        free(rq);
    }
    lk_tensor bad = lk_tensor_1d(pad, LK_BOOL, B * S);
    assert_int_equal(lk_attention_varlen_from_padding(&bad, cu, idx, &total, &longest), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "mask"));
    free(x); free(packed); free(out); free(row_out);
    lk_arena_free(&arena);
}

/* --- block skipping: the predicate runs on partial blocks only -------------------- */

static long predicate_calls;
static bool counting_causal(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    #pragma omp atomic
    predicate_calls++;
    return kv <= q;
}

static void flex_calls_predicate_only_in_partial_blocks(void **state) {
    (void)state;
    lk_attention_case c = {.B = 1, .Hq = 2, .Sq = 96, .D = 8};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    lk_block_mask m;
    assert_int_equal(lk_attention_problem_make(impl_named("flex_attention"), LK_F32, &c, 1, 0, &pb), LK_OK);
    assert_int_equal(lk_block_mask_create(counting_causal, NULL, 1, 1, 96, 96, 32, 32, &m), LK_OK);
    assert_int_equal(predicate_calls, 96 * 96);             /* creation: every element once */
    assert_int_equal(m.kv_num_blocks[2], 1);                /* the diagonal block is partial */
    assert_int_equal(m.full_kv_num_blocks[2], 2);           /* the two before it are full */
    pb.a.block_mask = &m;
    predicate_calls = 0;
    assert_int_equal(lk_attention_forward(impl_named("flex_attention"), &pb.a, &ctx), LK_OK);
    assert_int_equal(predicate_calls, 2 * 3 * 32 * 32);     /* 2 heads x 3 diagonal blocks, nothing else */
    predicate_calls = 0;
    assert_int_equal(lk_attention_backward(impl_named("flex_attention"), &pb.a, &ctx), LK_OK);
    assert_int_equal(predicate_calls, 2 * 3 * 32 * 32);
    pb.a.block_mask = NULL;
    lk_block_mask_free(&m);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

/* A block listed as partial that no query of it sees (PyTorch's lists may be coarser than
 * the predicate) changes nothing: the engine skips it. Outputs poisoned before each run. */
static void run_poisoned(lk_attention_problem *pb, lk_ctx *ctx, float *keep[4]) {
    float *outs[4] = {pb->out, pb->dq, pb->dk, pb->dv};
    int64_t n[4] = {pb->nq, pb->nq, pb->nk, pb->nk};
    for (int k = 0; k < 4; k++)
        for (int64_t i = 0; i < n[k]; i++) outs[k][i] = NAN;
    assert_int_equal(lk_attention_forward(impl_named("flex_attention"), &pb->a, ctx), LK_OK);
    assert_int_equal(lk_attention_backward(impl_named("flex_attention"), &pb->a, ctx), LK_OK);
    for (int k = 0; k < 4; k++) {
        if (!keep[k]) {
            keep[k] = malloc(sizeof(float) * (size_t)n[k]);
            assert_non_null(keep[k]);
            memcpy(keep[k], outs[k], sizeof(float) * (size_t)n[k]);
            continue;
        }
        for (int64_t i = 0; i < n[k]; i++) assert_true(outs[k][i] == keep[k][i]);   /* NaN fails too */
    }
}

static void flex_skips_listed_blocks_nobody_sees(void **state) {
    (void)state;
    lk_attention_case c = {.B = 1, .Hq = 2, .Sq = 150, .D = 16, .family = LK_AM_DOCUMENT, .block = 32, .n_docs = 3};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    float *keep[4] = {0};
    assert_int_equal(lk_attention_problem_make(impl_named("flex_attention"), LK_F32, &c, 9, 0, &pb), LK_OK);
    run_poisoned(&pb, &ctx, keep);
    lk_block_mask *m = &pb.bm[0];
    int64_t nq = m->num_q_blocks, nk = m->num_kv_blocks, qb = nq - 1, kb = nk - 1;
    for (int64_t b = 0; b < nk && kb == nk - 1; b++) {        /* a block of the last q row nobody sees */
        int seen = 0;
        for (int32_t t = 0; t < m->kv_num_blocks[qb]; t++) seen |= m->kv_indices[qb * nk + t] == b;
        for (int32_t t = 0; t < m->full_kv_num_blocks[qb]; t++) seen |= m->full_kv_indices[qb * nk + t] == b;
        if (!seen) kb = b;
    }
    assert_true(kb < nk - 1);                                 /* seed 9: the last document starts past it */
    m->kv_indices[qb * nk + m->kv_num_blocks[qb]++] = (int32_t)kb;
    m->q_indices[kb * nq + m->q_num_blocks[kb]++] = (int32_t)qb;
    run_poisoned(&pb, &ctx, keep);
    for (int k = 0; k < 4; k++) free(keep[k]);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

/* --- rejections --------------------------------------------------------------------- */

typedef void (*breaker)(lk_attention_args *a, lk_attention_problem *pb);

static int32_t bad_cu[4];
static void no_mask(lk_attention_args *a, lk_attention_problem *pb) { a->block_mask = NULL; }
/* t with dim changed to n, strides kept consistent so only the shape is wrong. */
static void reshape(lk_tensor *t, int dim, int64_t n) {
    int64_t s[4] = {t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
    s[dim] = n;
    *t = lk_tensor_view(t->data, t->dtype, 4, s);
}
static void k_shape(lk_attention_args *a, lk_attention_problem *pb) { reshape(&a->k, 3, 4); }
static void v_shape(lk_attention_args *a, lk_attention_problem *pb) { reshape(&a->v, 2, a->v.shape[2] - 1); }
static void k_dtype(lk_attention_args *a, lk_attention_problem *pb) { a->k.dtype = LK_BF16; }
static void heads(lk_attention_args *a, lk_attention_problem *pb) { reshape(&a->q, 1, 3); reshape(&a->out, 2, 3); }
static void q_null(lk_attention_args *a, lk_attention_problem *pb) { a->q.data = NULL; }
static void softcap(lk_attention_args *a, lk_attention_problem *pb) { a->softcap = -1.0f; }
static void window(lk_attention_args *a, lk_attention_problem *pb) { a->window_left = -2; }
static void saved(lk_attention_args *a, lk_attention_problem *pb) { a->saved.bytes = 4; }
static void cu_order(lk_attention_args *a, lk_attention_problem *pb) {
    bad_cu[0] = 0; bad_cu[1] = 20; bad_cu[2] = 10; bad_cu[3] = 40;
    a->cu_seqlens_q = a->cu_seqlens_k = lk_tensor_1d(bad_cu, LK_I32, 4);
    a->max_seqlen_q = a->max_seqlen_k = 40;
}
static void cu_end(lk_attention_args *a, lk_attention_problem *pb) {
    bad_cu[0] = 0; bad_cu[1] = 10; bad_cu[2] = 20; bad_cu[3] = 39;
    a->cu_seqlens_q = a->cu_seqlens_k = lk_tensor_1d(bad_cu, LK_I32, 4);
    a->max_seqlen_q = a->max_seqlen_k = 40;
}
static void cu_max(lk_attention_args *a, lk_attention_problem *pb) {
    bad_cu[0] = 0; bad_cu[1] = 10; bad_cu[2] = 20; bad_cu[3] = 40;
    a->cu_seqlens_q = a->cu_seqlens_k = lk_tensor_1d(bad_cu, LK_I32, 4);
    a->max_seqlen_q = a->max_seqlen_k = 19;
}
static void dense_for_flash(lk_attention_args *a, lk_attention_problem *pb) {
    int64_t s[4] = {1, 1, 40, 40};
    a->mask = lk_tensor_view(pb->dq, LK_BOOL, 4, s);
}
static void mask_for_flash(lk_attention_args *a, lk_attention_problem *pb) { a->block_mask = &pb->bm[0]; }
static void mask_shape(lk_attention_args *a, lk_attention_problem *pb) { pb->bm[0].Q_LEN = 41; }
static void out_dtype(lk_attention_args *a, lk_attention_problem *pb) { a->out.dtype = LK_BF16; }
static void out_alias(lk_attention_args *a, lk_attention_problem *pb) { a->out.data = a->q.data; }
/* t's buffer read as token-major [B, S, H, D] rows: a legal view, which the CPU rows refuse */
static void token_major(lk_tensor *t) { t->stride[1] = t->shape[3], t->stride[2] = t->shape[1] * t->shape[3]; }
static void v_view(lk_attention_args *a, lk_attention_problem *pb) { token_major(&a->v); }
static void q_heads_overlap(lk_attention_args *a, lk_attention_problem *pb) { a->q.stride[1] = 0; }
static void k_rows_overlap(lk_attention_args *a, lk_attention_problem *pb) { a->k.stride[2] = a->k.shape[3] - 1; }
static void q_strided_d(lk_attention_args *a, lk_attention_problem *pb) { a->q.stride[3] = 2; }

/* both: the backward is refused too (out aliasing q is a forward-only fault: the
 * backward reads both). */
static void expect_rejected_in(const char *name, int family, breaker brk, lk_status want, const char *arg, int both) {
    lk_attention_case c = {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 40, .D = 8, .family = family, .block = 16};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_attention_problem_make(impl_named(name), LK_F32, &c, 1, 0, &pb), LK_OK);
    lk_attention_args a = pb.a;
    brk(&a, &pb);
    memset(pb.out, 0x5a, (size_t)pb.nq * 4);
    memset(pb.dq, 0x5a, (size_t)pb.nq * 4);
    lk_status s = lk_attention_forward(impl_named(name), &a, &ctx);
    if (s != want || !strstr(lk_last_error(), arg))
        print_error("%s: want %s naming '%s', got %s: %s\n", name, lk_status_name(want), arg, lk_status_name(s),
                    lk_last_error());
    assert_int_equal(s, want);
    assert_non_null(strstr(lk_last_error(), arg));
    for (int64_t i = 0; i < pb.nq; i++) assert_int_equal(((uint32_t *)pb.out)[i], 0x5a5a5a5au);
    if (both) {
        assert_int_equal(lk_attention_backward(impl_named(name), &a, &ctx), want);
        assert_non_null(strstr(lk_last_error(), arg));
        for (int64_t i = 0; i < pb.nq; i++) assert_int_equal(((uint32_t *)pb.dq)[i], 0x5a5a5a5au);
    }
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static void expect_rejected(const char *name, int family, breaker brk, lk_status want, const char *arg) {
    expect_rejected_in(name, family, brk, want, arg, 1);
}

static void bad_inputs_are_rejected(void **state) {
    (void)state;
    expect_rejected("flex_attention", LK_AM_CAUSAL, no_mask, LK_EINVAL, "block_mask");
    expect_rejected("llmkern_flex_attention_with_sp", LK_AM_CAUSAL, no_mask, LK_EINVAL, "block_mask");
    expect_rejected("sdpa", 0, k_shape, LK_ESHAPE, "k");
    expect_rejected("flex_attention", LK_AM_CAUSAL, v_shape, LK_ESHAPE, "v");
    expect_rejected("eager", 0, k_dtype, LK_EDTYPE, "k");
    expect_rejected("sdpa", 0, heads, LK_ESHAPE, "H_kv");
    expect_rejected("eager", 0, q_null, LK_EINVAL, "q");
    expect_rejected("sdpa", 0, softcap, LK_EINVAL, "softcap");
    expect_rejected("sdpa", 0, window, LK_EINVAL, "window_left");
    expect_rejected("flash_attention_2", 0, saved, LK_EINVAL, "saved");
    expect_rejected("sdpa", 0, cu_order, LK_EINVAL, "cu_seqlens_q");
    expect_rejected("eager", 0, cu_end, LK_EINVAL, "cu_seqlens_q");
    expect_rejected("sdpa", 0, cu_max, LK_EINVAL, "max_seqlen_q");
    expect_rejected("flex_attention", LK_AM_CAUSAL, cu_max, LK_EINVAL, "cu_seqlens_q");
    expect_rejected("sdpa", 0, dense_for_flash, LK_EINVAL, "mask");
    expect_rejected("sdpa", LK_AM_CAUSAL, mask_for_flash, LK_EINVAL, "block_mask");
    expect_rejected("flex_attention", LK_AM_CAUSAL, mask_shape, LK_ESHAPE, "block_mask");
    expect_rejected("sdpa", 0, out_dtype, LK_EDTYPE, "out");
    expect_rejected_in("sdpa", 0, out_alias, LK_EINVAL, "out", 0);
    expect_rejected("sdpa", 0, v_view, LK_ESHAPE, "takes contiguous");
    expect_rejected("flex_attention", LK_AM_CAUSAL, v_view, LK_ESHAPE, "v: 'flex_attention'");
    expect_rejected("eager", 0, q_heads_overlap, LK_ESHAPE, "elements apart");
    expect_rejected("flash_attention_2", 0, k_rows_overlap, LK_ESHAPE, "k: expected elements apart");
    expect_rejected("sdpa", 0, q_strided_d, LK_ESHAPE, "q: expected a contiguous last dim");
}

/* Strided views (attention.h) go only where a pass takes them: no CPU row does, and the
 * backward names the gradient that is a view; lk_attention_takes_views says so up front. */
static void views_only_where_taken(void **state) {
    (void)state;
    lk_attention_case c = {.B = 2, .Hq = 4, .Hkv = 2, .Sq = 24, .D = 8};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    const lk_impl *sdpa = impl_named("sdpa");
    assert_int_equal(lk_attention_problem_make(sdpa, LK_F32, &c, 3, 0, &pb), LK_OK);
    assert_int_equal(lk_attention_takes_views(sdpa, &pb.a), 0);
    assert_int_equal(lk_attention_takes_views(sdpa, NULL), 0);
    lk_attention_args shapes = pb.a;   /* asked before the buffers exist (the model's layout does) */
    shapes.q.data = shapes.k.data = shapes.v.data = NULL;
    assert_int_equal(lk_attention_takes_views(sdpa, &shapes), 0);
    assert_int_equal(lk_attention_forward(sdpa, &pb.a, &ctx), LK_OK);
    lk_attention_args a = pb.a;
    token_major(&a.dv);   /* only the backward sees it */
    memset(pb.dq, 0x5a, (size_t)pb.nq * 4);
    assert_int_equal(lk_attention_backward(sdpa, &a, &ctx), LK_ESHAPE);
    assert_non_null(strstr(lk_last_error(), "dv: 'sdpa' takes contiguous"));
    for (int64_t i = 0; i < pb.nq; i++) assert_int_equal(((uint32_t *)pb.dq)[i], 0x5a5a5a5au);
    assert_int_equal(lk_attention_backward(sdpa, &pb.a, &ctx), LK_OK);   /* contiguous again: runs */
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static void wrong_impl_and_sp_comm(void **state) {
    (void)state;
    lk_attention_case c = {.B = 1, .Hq = 2, .Sq = 8, .D = 8};
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    assert_int_equal(lk_attention_problem_make(impl_named("sdpa"), LK_F32, &c, 1, 0, &pb), LK_OK);
    const lk_impl *rms = lk_impl_find(LK_OP_RMS_NORM, "fused", LK_DEVICE_CPU);
    assert_int_equal(lk_attention_forward(rms, &pb.a, &ctx), LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "impl"));
    lk_comm bogus = {0};     /* version 0: not a communicator */
    ctx.comm = &bogus;
    assert_int_equal(lk_attention_forward(impl_named("llmkern_flash_attention_2_with_sp"), &pb.a, &ctx),
                     LK_EINVAL);
    assert_non_null(strstr(lk_last_error(), "ctx.comm"));
    assert_int_equal(lk_attention_forward(impl_named("sdpa"), &pb.a, &ctx), LK_OK);   /* not SP: no exchange */
    lk_comm *one;            /* a group of one: the identity (tests/dist runs P > 1) */
    assert_int_equal(lk_comm_single(&one), LK_OK);
    ctx.comm = one;
    assert_int_equal(lk_attention_forward(impl_named("llmkern_flash_attention_2_with_sp"), &pb.a, &ctx), LK_OK);
    lk_comm posing = *one;   /* a group of two whose buffers are device memory: not for CPU tensors */
    posing.backend = "nccl", posing.size = 2;
    ctx.comm = &posing;
    assert_int_equal(lk_attention_forward(impl_named("llmkern_flash_attention_2_with_sp"), &pb.a, &ctx),
                     LK_EDEVICE);
    assert_non_null(strstr(lk_last_error(), "host-memory communicator"));
    lk_comm_destroy(one);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static int setup(void **state) {
    (void)state;
    return lk_init() == LK_OK ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_rows),
        cmocka_unit_test(options_match_reference),
        cmocka_unit_test(varlen_matches_reference),
        cmocka_unit_test(eager_dense_masks),
        cmocka_unit_test(flex_families_match_reference),
        cmocka_unit_test(flex_documents_match_reference),
        cmocka_unit_test(gradients_by_finite_differences),
        cmocka_unit_test(reference_gradient_is_its_derivative),
        cmocka_unit_test(slots_are_swappable),
        cmocka_unit_test(padding_mask_to_varlen),
        cmocka_unit_test(flex_calls_predicate_only_in_partial_blocks),
        cmocka_unit_test(flex_skips_listed_blocks_nobody_sees),
        cmocka_unit_test(bad_inputs_are_rejected),
        cmocka_unit_test(views_only_where_taken),
        cmocka_unit_test(wrong_impl_and_sp_comm),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
