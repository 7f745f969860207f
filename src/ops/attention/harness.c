/* harness.c — attention for `llmkern check` and `llmkern bench` (lk_attention_harness,
 * listed in src/ops/harness.c). Shapes are B x H_q x S x D [x mask [x H_kv]], mask one
 * of 1 causal, 2 sliding window (S/4), 3 prefix-LM (S/4), 4 documents (lengths in
 * [S/16, S/4]: 256..1024 at S = 4096), 5 (or absent) none; flex's BlockMask has
 * PyTorch's default 128x128 blocks, or 64x64 (the flash tile) with 10 added to the
 * code (14: documents at 64). flex_attention gets the family's BlockMask;
 * sdpa / flash get the same visibility as options (documents as varlen cu_seqlens);
 * prefix-LM has no flash form and is refused there. Bench rows name the mask and its
 * element density in `shape`, and count FLOPs on visible elements only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops/attention/check.h"
#include "ops/attention/internal.h"

/* The BlockMask blocks of the harness: PyTorch's default, and (mask code + 10) the
 * flash tile, where partial blocks cover less of a document mask's area. */
#define FLEX_BENCH_BLOCK LK_BLOCK_MASK_DEFAULT_BLOCK
#define FLEX_SMALL_BLOCK 64

static const char *const family_names[] = {"none", "causal", "sliding", "prefix_lm", "document", "none"};

static lk_attn_adapter adapter_of(const lk_impl *impl) {
    return ((const lk_attention_entry *)impl->vtable)->adapter;
}

static lk_status case_of(const lk_impl *impl, const lk_shape *sh, lk_attention_case *c) {
    int code = sh->ndim > 4 ? (int)sh->d[4] : 5, blk = FLEX_BENCH_BLOCK;
    if (code > 10) { code -= 10; blk = FLEX_SMALL_BLOCK; }
    if (sh->ndim < 4 || code < 1 || code > 5)
        return lk_error(LK_EINVAL, "attention: size: expected BxHxSxD[xMASK[xHKV]] with MASK 1..5 (causal, sliding, "
                        "prefix_lm, document, none; +10: 64x64 blocks), got %d dims", sh->ndim);
    *c = (lk_attention_case){.B = sh->d[0], .Hq = sh->d[1], .Sq = sh->d[2], .D = sh->d[3],
                             .Hkv = sh->ndim > 5 ? sh->d[5] : 0};
    if (adapter_of(impl) == LK_ATTN_FLEX) {
        c->family = code == 5 ? LK_AM_FULL : code;
        c->block = blk;
        return LK_OK;
    }
    switch (code) {
    case 1: c->causal = 1; break;
    case 2: c->causal = 1; c->window_left = c->Sq / 4 > 2 ? c->Sq / 4 : 2; break;
    case 3:
        if (adapter_of(impl) != LK_ATTN_EAGER)
            return lk_error(LK_EUNAVAILABLE, "attention: size: mask 3 (prefix_lm) needs a BlockMask: eager or "
                            "flex_attention, not '%s' (pick one with --impl)", impl->name);
        c->family = LK_AM_PREFIX;
        c->block = blk;
        break;
    case 4: c->causal = 1; c->n_docs = -1; break;
    default: break;
    }
    return LK_OK;
}

static lk_status check(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, uint64_t seed, lk_check_row *row) {
    lk_attention_case c;
    lk_status s = case_of(impl, shape, &c);
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

static lk_status bench(const lk_impl *impl, lk_dtype dt, const lk_shape *shape, const lk_ceilings *ceil,
                       lk_bench_row rows[3]) {
    lk_attention_case c;
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_status s = case_of(impl, shape, &c);
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
    int code = shape->ndim > 4 ? (int)shape->d[4] % 10 : 5;
    char blk[16] = "";
    if (pb.a.block_mask) snprintf(blk, sizeof blk, " blk%lld", (long long)pb.a.block_mask->Q_BLOCK_SIZE);
    for (int k = 0; k < 3; k++)
        snprintf(rows[k].shape, sizeof rows[k].shape, "%lldx%lldx%lldx%lld kv%lld %s d=%.3f%s", (long long)c.B,
                 (long long)c.Hq, (long long)c.Sq, (long long)c.D, (long long)(c.Hkv ? c.Hkv : c.Hq),
                 family_names[code], dens, blk);
done:
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
    return s;
}

static const lk_shape check_shapes[] = {
    {4, {2, 4, 33, 16}},                /* none, odd length */
    {6, {1, 8, 77, 64, 1, 1}},          /* causal, MQA */
    {6, {2, 8, 130, 32, 2, 2}},         /* sliding window, GQA 4:1 */
    {6, {1, 4, 200, 64, 4, 2}},         /* documents (varlen for flash, a BlockMask for flex) */
};

const lk_harness lk_attention_harness = {
    .op = LK_OP_ATTENTION,
    .check = check,
    .check_shapes = check_shapes,
    .n_check_shapes = (int)(sizeof check_shapes / sizeof *check_shapes),
    .bench = bench,
    .bench_shape = {5, {1, 8, 2048, 64, 1}},
    .dtypes = LK_DTYPE_BIT(LK_F32) | LK_DTYPE_BIT(LK_BF16),
};
