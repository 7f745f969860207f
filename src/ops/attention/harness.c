/* harness.c — attention for `llmkern check` and `llmkern bench` (lk_attention_harness,
 * named by its descriptor, def.c). A bench case is a size B x H_q x S x D and named options:
 *   --mask none | causal (the default) | sliding (window S/4) | prefix_lm (prefix S/4) |
 *          document (lengths in [S/16, S/4]: 256..1024 at S = 4096)
 *   --kv-heads H_kv (GQA/MQA; it divides H_q; default H_q)
 *   --block N (the BlockMask's blocks, default PyTorch's 128x128; 64 is the flash tile)
 * every one checked by bench_validate before anything is timed. flex_attention gets the
 * family's BlockMask; sdpa / flash get the same visibility as options (documents as
 * varlen cu_seqlens); prefix-LM has no flash form and is refused there. Bench rows carry
 * mask=, hkv=, blk= (where a BlockMask is used) and the visible density=, and count FLOPs
 * on visible elements only. `llmkern check` runs check_shapes: B x H_q x S x D x family x
 * H_kv, family one of check.h's LK_AM_NONE..LK_AM_DOCUMENT. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops/attention/check.h"
#include "ops/attention/internal.h"

/* The --mask names, indexed by lk_attn_mask_family (LK_AM_NONE..LK_AM_DOCUMENT). */
static const char *const mask_names[] = {"none", "causal", "sliding", "prefix_lm", "document"};
#define N_MASKS (int)(sizeof mask_names / sizeof *mask_names)

static lk_attn_adapter adapter_of(const lk_impl *impl) {
    return ((const lk_attention_entry *)impl->vtable)->adapter;
}

/* A strictly parsed positive integer option: digits only, no sign, no overflow. */
static int positive(const char *text, int64_t *out) {
    char *end;
    errno = 0;
    if (!text || *text < '0' || *text > '9') return 0;
    long long v = strtoll(text, &end, 10);
    if (*end || errno || v < 1) return 0;
    *out = v;
    return 1;
}

/* The case of a size, mask family, H_kv (0: H_q) and block (0: the default) for impl. */
static lk_status case_for(const lk_impl *impl, const lk_shape *sh, int mask, int64_t hkv, int64_t block,
                          lk_attention_case *c) {
    *c = (lk_attention_case){.B = sh->d[0], .Hq = sh->d[1], .Sq = sh->d[2], .D = sh->d[3], .Hkv = hkv};
    if (adapter_of(impl) == LK_ATTN_FLEX) {
        c->family = mask == LK_AM_NONE ? LK_AM_FULL : mask;
        c->block = block ? block : LK_BLOCK_MASK_DEFAULT_BLOCK;
        return LK_OK;
    }
    switch (mask) {
    case LK_AM_CAUSAL: c->causal = 1; break;
    case LK_AM_SLIDING: c->causal = 1; c->window_left = c->Sq / 4 > 2 ? c->Sq / 4 : 2; break;
    case LK_AM_PREFIX:
        if (adapter_of(impl) != LK_ATTN_EAGER)
            return lk_error(LK_EUNAVAILABLE, "attention: --mask prefix_lm needs a BlockMask: eager or flex_attention "
                            "run it (pick one with --impl)");
        c->family = LK_AM_PREFIX;
        c->block = block ? block : LK_BLOCK_MASK_DEFAULT_BLOCK;
        break;
    case LK_AM_DOCUMENT: c->causal = 1; c->n_docs = -1; break;
    default: break;
    }
    return LK_OK;
}

/* A bench case from the command line: --size BxHxSxD, --mask, --kv-heads, --block. */
static lk_status bench_case(const lk_impl *impl, const lk_shape *sh, const lk_case_opts *o, lk_attention_case *c) {
    if (sh->ndim != 4)
        return lk_error(LK_EINVAL, "attention: --size: expected BxHxSxD (4 dims such as 1x8x4096x64; the mask, KV "
                        "heads and block size are --mask, --kv-heads, --block), got %d dims", sh->ndim);
    int mask = o->mask ? -1 : LK_AM_CAUSAL;
    for (int m = 0; o->mask && m < N_MASKS; m++)
        if (strcmp(o->mask, mask_names[m]) == 0) mask = m;
    if (mask < 0)
        return lk_error(LK_EINVAL, "attention: --mask: expected one of none, causal, sliding, prefix_lm, document, "
                        "got '%s'", o->mask);
    int64_t hkv = 0, block = 0;
    if (o->kv_heads && (!positive(o->kv_heads, &hkv) || sh->d[1] % hkv != 0))
        return lk_error(LK_EINVAL, "attention: --kv-heads: expected a positive integer that divides the %lld query "
                        "heads of --size, got '%s'", (long long)sh->d[1], o->kv_heads);
    if (o->block && (!positive(o->block, &block) || block > sh->d[2]))
        return lk_error(LK_EINVAL, "attention: --block: expected a positive integer of at most S = %lld (the "
                        "BlockMask's block size, such as 64 or 128), got '%s'", (long long)sh->d[2], o->block);
    return case_for(impl, sh, mask, hkv, block, c);
}

static lk_status bench_validate(const lk_impl *impl, const lk_shape *shape, const lk_case_opts *opts) {
    lk_attention_case c;
    return bench_case(impl, shape, opts, &c);
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    lk_attention_case c;
    int mask = shape->ndim > 4 ? (int)shape->d[4] : LK_AM_NONE;
    if (shape->ndim < 4 || mask < 0 || mask >= N_MASKS)
        return lk_error(LK_EINVAL, "attention: check: expected BxHxSxD[xFAMILY[xHKV]] with FAMILY %d..%d, got %d dims",
                        LK_AM_NONE, LK_AM_DOCUMENT, shape->ndim);
    lk_status s = case_for(impl, shape, mask, shape->ndim > 5 ? shape->d[5] : 0, 0, &c);
    if (s) return s;
    return lk_attention_check_case(impl, dt, &c, seed, row, NULL);
}

/* Visible fraction of the [B, H, S_q, S_kv] score elements. */
static double density(const lk_attention_args *a) {
    if (a->block_mask) return lk_block_mask_density(a->block_mask);
    lk_attn_dims d = lk_attn_dims_of(a);
    int64_t *lo = malloc(sizeof(int64_t) * 2 * (size_t)d.Sq);
    if (!lo) return 1.0;
    lk_attn_row_intervals(a, &d, lo, lo + d.Sq);
    double seen = 0.0;
    for (int64_t i = 0; i < d.Sq; i++) seen += (double)(lo[d.Sq + i] - lo[i]);
    free(lo);
    return seen / ((double)d.Sq * (double)d.Skv);
}

typedef struct {
    const lk_impl *impl;
    const lk_attention_args *a;
    lk_ctx ctx;
} bench_job;

static lk_status run_fwd(void *p) { bench_job *j = p; return lk_attention_forward(j->impl, j->a, &j->ctx); }
static lk_status run_bwd(void *p) { bench_job *j = p; return lk_attention_backward(j->impl, j->a, &j->ctx); }

static void param(lk_bench_row *r, const char *name, const char *text, double value) {
    if (r->nparam == LK_BENCH_PARAMS) return;
    lk_bench_param *p = &r->param[r->nparam++];
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->text, sizeof p->text, "%s", text ? text : "");
    p->value = value;
}

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_case_opts *opts,
                       const lk_ceilings *ceil, lk_bench_row rows[3]) {
    lk_attention_case c;
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_status s = bench_case(impl, shape, opts, &c);
    if (s) return s;
    if ((s = lk_attention_problem_make(impl, dt, &c, 1, 0, &pb))) goto done;
    bench_job j = {.impl = impl, .a = &pb.a, .ctx = lk_ctx_cpu(&arena)};
    if ((s = run_fwd(&j)) || (s = run_bwd(&j))) goto done;      /* warm, and reject bad input untimed */
    double dens = density(&pb.a);
    double fwd = 4.0 * (double)c.D * dens * (double)(c.B * c.Hq) * (double)c.Sq * (double)c.Sq;
    lk_bench_spec spec = {
        .op = "attention", .impl = impl, .dtype = dt, .shape = shape, .fwd = run_fwd, .bwd = run_bwd, .job = &j,
        .flops = {fwd, 2.5 * fwd}, .arena = &arena, .extra_bytes = (size_t)pb.nlse * sizeof(float),
    };
    if ((s = lk_bench_passes(&spec, ceil, rows))) goto done;
    const char *mask = "causal";
    for (int m = 0; opts->mask && m < N_MASKS; m++)
        if (strcmp(opts->mask, mask_names[m]) == 0) mask = mask_names[m];
    for (int k = 0; k < 3; k++) {
        param(&rows[k], "mask", mask, 0);
        param(&rows[k], "hkv", NULL, (double)(c.Hkv ? c.Hkv : c.Hq));
        if (pb.a.block_mask) param(&rows[k], "blk", NULL, (double)pb.a.block_mask->Q_BLOCK_SIZE);
        param(&rows[k], "density", NULL, dens);
    }
done:
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {4, {2, 4, 33, 16}},                            /* none, odd length */
    {6, {1, 8, 77, 64, LK_AM_CAUSAL, 1}},           /* causal, MQA */
    {6, {2, 8, 130, 32, LK_AM_SLIDING, 2}},         /* sliding window, GQA 4:1 */
    {6, {1, 4, 200, 64, LK_AM_DOCUMENT, 2}},        /* documents (varlen for flash, a BlockMask for flex) */
};

const lk_harness lk_attention_harness = {
    .check = check,
    LK_CHECK_SHAPES(check_shapes),
    .bench = bench,
    .bench_shape = {4, {1, 8, 2048, 64}},          /* --mask causal unless asked */
    .case_opts = LK_CASE_MASK | LK_CASE_KV_HEADS | LK_CASE_BLOCK,
    .bench_validate = bench_validate,
};
