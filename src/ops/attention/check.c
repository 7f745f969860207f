/* check.c — one attention comparison with the float64 reference (check.h): builds the
 * inputs and the options of a case, runs forward and backward through the facade with
 * poisoned outputs, and measures each output's error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/attention/check.h"
#include "ops/attention/reference.h"

/* Tolerances on max|got − ref| / max|ref| of out, LSE, dq, dk, dv, ds_aux.
 * f32: f32 math with f32 sums over ≤ a few thousand keys, a polynomial exp good to
 *   ~1 ulp: errors seen ~1e-6; 2e-4 leaves room yet a wrong mask, scale or missing
 *   term misses by 1e-2 or more.
 * bf16: inputs are rounded the same for the reference, so what remains is each
 *   output's one rounding (2^-8 = 3.9e-3) and, in the backward, delta = dout·out taken
 *   from the bf16-rounded out, which shifts dS by up to ~4e-3 of |delta|: 3e-2. */
double lk_attention_tol(const lk_impl *impl, lk_dtype dt) { return dt == LK_F32 ? 2e-4 : 3e-2; }

static uint32_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

int64_t lk_attention_doc_cuts(int64_t S, int64_t n_docs, uint64_t seed, int32_t *cu, int64_t cap) {
    uint64_t st = seed * 2654435761u + 1;
    int64_t n = 0;
    cu[0] = 0;
    if (n_docs > 0) {                       /* n_docs lengths >= 0 summing to S, uneven */
        int64_t left = S;
        for (n = 0; n < n_docs - 1 && n + 1 < cap; n++) {
            int64_t len = left > 0 ? (int64_t)(next(&st) % (uint64_t)(2 * left / (n_docs - n) + 1)) : 0;
            if (len > left) len = left;
            cu[n + 1] = cu[n] + (int32_t)len;
            left -= len;
        }
        cu[++n] = (int32_t)S;
        return n;
    }
    int64_t lo = S / 16 > 0 ? S / 16 : 1, hi = S / 4 > lo ? S / 4 : lo;
    while (cu[n] < S && n + 1 < cap) {
        int64_t len = lo + (int64_t)(next(&st) % (uint64_t)(hi - lo + 1));
        cu[n + 1] = (int32_t)(cu[n] + len < S ? cu[n] + len : S);
        n++;
    }
    cu[n] = (int32_t)S;
    return n;
}

typedef struct { int64_t offset; } head_ctx;
/* Causal with window 3 + 5h: each head its own visibility. */
static bool per_head(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) {
    int64_t p = q + ((const head_ctx *)ctx)->offset;
    return kv <= p && p - kv < 3 + 5 * h;
}

static bool everything(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx) { return true; }

static lk_status doc_ids_mask(const lk_attention_case *c, uint64_t seed, int causal, lk_block_mask *m) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(c->B * c->Sq)), *cu = malloc(sizeof(int32_t) * (size_t)(c->Sq + 2));
    lk_status s = LK_ENOMEM;
    if (ids && cu) {
        for (int64_t b = 0; b < c->B; b++) {
            int64_t n = lk_attention_doc_cuts(c->Sq, 0, seed + 7 * b, cu, c->Sq + 1);
            for (int64_t d = 0; d < n; d++)
                for (int64_t i = cu[d]; i < cu[d + 1]; i++) ids[b * c->Sq + i] = (int32_t)d;
        }
        s = lk_block_mask_document_ids(ids, causal, c->B, 1, c->Sq, c->block, c->block, m);
    }
    free(ids); free(cu);
    return s == LK_ENOMEM && !(ids && cu) ? lk_error(LK_ENOMEM, "attention: check: out of memory") : s;
}

lk_status lk_attention_case_mask(const lk_attention_case *c, uint64_t seed, lk_block_mask m[3]) {
    static head_ctx heads[1];
    int64_t Skv = c->Skv ? c->Skv : c->Sq, W = c->Sq / 4 > 2 ? c->Sq / 4 : 2, bs = c->block;
    memset(m, 0, 3 * sizeof *m);
    switch (c->family) {
    case LK_AM_CAUSAL: return lk_block_mask_causal(1, 1, c->Sq, Skv, bs, bs, m);
    case LK_AM_SLIDING: return lk_block_mask_sliding_window(W, 1, 1, c->Sq, Skv, bs, bs, m);
    case LK_AM_PREFIX: {
        int64_t *pre = malloc(sizeof(int64_t) * (size_t)c->B);
        if (!pre) return lk_error(LK_ENOMEM, "attention: check: out of memory");
        for (int64_t b = 0; b < c->B; b++) pre[b] = (c->Sq / 4 + 3 * b) % (Skv + 1);
        lk_status s = lk_block_mask_prefix_lm(pre, c->B, 1, c->Sq, Skv, bs, bs, m);
        free(pre);
        return s;
    }
    case LK_AM_DOCUMENT: {
        int32_t *cu = malloc(sizeof(int32_t) * (size_t)(c->Sq + 2));
        if (!cu) return lk_error(LK_ENOMEM, "attention: check: out of memory");
        int64_t n = lk_attention_doc_cuts(c->Sq, c->n_docs > 0 ? c->n_docs : 0, seed, cu, c->Sq + 1);
        lk_status s = lk_block_mask_document_cu(cu, n, 1, 1, c->Sq, bs, bs, m);
        free(cu);
        return s;
    }
    case LK_AM_DOC_IDS: return doc_ids_mask(c, seed, 0, m);
    case LK_AM_AND:
    case LK_AM_OR: {
        lk_status s = doc_ids_mask(c, seed, 0, &m[1]);
        if (!s) s = c->family == LK_AM_AND ? lk_block_mask_causal(1, 1, c->Sq, Skv, bs, bs, &m[2])
                                           : lk_block_mask_sliding_window(W, 1, 1, c->Sq, Skv, bs, bs, &m[2]);
        if (!s) s = c->family == LK_AM_AND ? lk_block_mask_and(&m[1], &m[2], m) : lk_block_mask_or(&m[1], &m[2], m);
        return s;
    }
    case LK_AM_FULL: return lk_block_mask_create(everything, NULL, 1, 1, c->Sq, Skv, bs, bs, m);
    case LK_AM_PER_HEAD:
        heads[0].offset = Skv - c->Sq;      /* static: outlives the mask */
        return lk_block_mask_create(per_head, heads, 1, c->Hq, c->Sq, Skv, bs, bs, m);
    default: return LK_OK;
    }
}

/* LSE: the same −inf rows, and |got − ref| / max(1, max|ref|) elsewhere. */
double lk_attention_lse_err(const float *got, const double *ref, int64_t n) {
    double e = 0.0, scale = 1.0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(got[i])) {
            if (!(isinf(ref[i]) && isinf(got[i]))) return INFINITY;
            continue;
        }
        if (isnan(got[i])) return INFINITY;
        e = fmax(e, fabs(got[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    return e / scale;
}

static float alibi_slopes[64];
static const float softcap_two = 2.0f;

/* Inputs, outputs and options of one case: what check and bench both run. */
lk_status lk_attention_problem_make(const lk_impl *impl, lk_dtype dt, const lk_attention_case *c, uint64_t seed,
                                    int with_ref, lk_attention_problem *pb) {
    memset(pb, 0, sizeof *pb);
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv ? c->Hkv : c->Hq, Sq = c->Sq, Skv = c->Skv ? c->Skv : c->Sq, D = c->D;
    const int flex = impl && ((const lk_attention_entry *)impl->vtable)->adapter == LK_ATTN_FLEX;
    pb->nq = B * Hq * Sq * D;
    pb->nk = B * Hkv * Skv * D;
    pb->nlse = B * Hq * Sq;
    for (int h = 0; h < 64; h++) alibi_slopes[h] = exp2f(-0.5f * (float)(h + 1));
    lk_rng rng = lk_rng_make(seed);
    double **r = pb->ref_in;
    pb->q = lk_random_tensor(&rng, dt, pb->nq, 1.0f, with_ref ? &r[0] : NULL);
    pb->k = lk_random_tensor(&rng, dt, pb->nk, 1.0f, with_ref ? &r[1] : NULL);
    pb->v = lk_random_tensor(&rng, dt, pb->nk, 1.0f, with_ref ? &r[2] : NULL);
    pb->dout = lk_random_tensor(&rng, dt, pb->nq, 1.0f, with_ref ? &r[3] : NULL);
    pb->sink = lk_random_tensor(&rng, LK_F32, Hq, 1.0f, with_ref ? &r[4] : NULL);
    size_t esz = lk_dtype_size(dt);
    pb->out = malloc((size_t)pb->nq * esz); pb->dq = malloc((size_t)pb->nq * esz);
    pb->dk = malloc((size_t)pb->nk * esz); pb->dv = malloc((size_t)pb->nk * esz);
    pb->lse = malloc((size_t)pb->nlse * 4); pb->dsink = malloc((size_t)Hq * 4);
    pb->cu = malloc(sizeof(int32_t) * (size_t)(Sq + Skv + 4));
    if (!pb->q || !pb->k || !pb->v || !pb->dout || !pb->sink || !pb->out || !pb->dq || !pb->dk || !pb->dv ||
        !pb->lse || !pb->dsink || !pb->cu || (with_ref && (!r[0] || !r[1] || !r[2] || !r[3] || !r[4])))
        return lk_error(LK_ENOMEM, "attention: check: out of memory");
    int64_t shape_q[4] = {B, Hq, Sq, D}, shape_k[4] = {B, Hkv, Skv, D}, shape_o[4] = {B, Sq, Hq, D};
    lk_attention_args *a = &pb->a;
    *a = (lk_attention_args){
        .q = lk_tensor_view(pb->q, dt, 4, shape_q), .k = lk_tensor_view(pb->k, dt, 4, shape_k),
        .v = lk_tensor_view(pb->v, dt, 4, shape_k), .out = lk_tensor_view(pb->out, dt, 4, shape_o),
        .dout = lk_tensor_view(pb->dout, dt, 4, shape_o), .dq = lk_tensor_view(pb->dq, dt, 4, shape_q),
        .dk = lk_tensor_view(pb->dk, dt, 4, shape_k), .dv = lk_tensor_view(pb->dv, dt, 4, shape_k),
        .saved = {pb->lse, (size_t)pb->nlse * 4}, .scale = c->scale, .causal = c->causal,
        .window_left = c->window_left, .window_right = c->window_right, .softcap = c->softcap,
        .deterministic = c->deterministic,
    };
    lk_attn_ref *p = &pb->ref;
    *p = (lk_attn_ref){.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Skv = Skv, .D = D,
                       .scale = c->scale != 0.0f ? c->scale : 1.0 / sqrt((double)D), .softcap = c->softcap,
                       .causal = flex ? 0 : c->causal, .window_left = flex ? 0 : c->window_left,
                       .window_right = flex ? 0 : c->window_right};
    if (c->sinks) {
        a->s_aux = lk_tensor_1d(pb->sink, LK_F32, Hq);
        a->ds_aux = lk_tensor_1d(pb->dsink, LK_F32, Hq);
        p->sink = r[4];
    }
    if (c->n_docs != 0 && !c->family) {     /* with a family, n_docs counts the mask's documents */
        int32_t *cq = pb->cu;
        int64_t n = lk_attention_doc_cuts(Sq, c->n_docs > 0 ? c->n_docs : 0, seed, cq, Sq + 1);
        int32_t *ck = cq;
        if (Skv != Sq) {
            ck = cq + n + 1;
            lk_attention_doc_cuts(Skv, n, seed + 1, ck, Skv + 1);
        }
        a->cu_seqlens_q = lk_tensor_1d(cq, LK_I32, n + 1);
        a->cu_seqlens_k = lk_tensor_1d(ck, LK_I32, n + 1);
        for (int64_t d = 0; d < n; d++) {
            if (cq[d + 1] - cq[d] > a->max_seqlen_q) a->max_seqlen_q = cq[d + 1] - cq[d];
            if (ck[d + 1] - ck[d] > a->max_seqlen_k) a->max_seqlen_k = ck[d + 1] - ck[d];
        }
        p->cu_q = cq; p->cu_k = ck; p->n_docs = n;
    }
    lk_status s;
    if (c->family && (s = lk_attention_case_mask(c, seed, pb->bm))) return s;
    if (c->family) a->block_mask = p->bm = &pb->bm[0];
    if (c->dense) {
        int64_t ms[4] = {c->dense == 1 ? B : 1, c->dense == 1 ? 1 : Hq, Sq, Skv}, n = ms[0] * ms[1] * Sq * Skv;
        float *m = pb->dmask = malloc((size_t)n * 4);
        if (!m) return lk_error(LK_ENOMEM, "attention: check: out of memory");
        uint64_t st = seed;
        for (int64_t i = 0; i < n; i++) {
            uint32_t x = next(&st);
            if (c->dense == 1) ((uint8_t *)m)[i] = x % 5 != 0;
            else m[i] = x % 7 == 0 ? -INFINITY : (float)((int)(x % 1000) - 500) / 500.0f;
        }
        a->mask = lk_tensor_view(m, c->dense == 1 ? LK_BOOL : LK_F32, 4, ms);
        p->mask = &a->mask;
    }
    if (c->score_mod) {
        a->score_mod = c->score_mod == 1 ? (lk_score_mod){lk_score_mod_softcap, &softcap_two}
                                         : (lk_score_mod){lk_score_mod_alibi, alibi_slopes};
        p->mod = a->score_mod;
    }
    return LK_OK;
}

void lk_attention_problem_free(lk_attention_problem *pb) {
    free(pb->q); free(pb->k); free(pb->v); free(pb->dout); free(pb->sink); free(pb->out); free(pb->dq);
    free(pb->dk); free(pb->dv); free(pb->lse); free(pb->dsink); free(pb->cu); free(pb->dmask);
    for (int i = 0; i < 5; i++) free(pb->ref_in[i]);
    for (int i = 0; i < 3; i++) lk_block_mask_free(&pb->bm[i]);
    memset(pb, 0, sizeof *pb);
}

lk_status lk_attention_check_case(const lk_impl *impl, lk_dtype dt, const lk_attention_case *c, uint64_t seed,
                                  lk_check_row *row, lk_attention_errors *err) {
    memset(row, 0, sizeof *row);
    snprintf(row->op, sizeof row->op, "attention");
    snprintf(row->impl, sizeof row->impl, "%s", impl ? impl->name : "(null)");
    snprintf(row->dtype, sizeof row->dtype, "%s", lk_dtype_name(dt));
    static const char *const fam[LK_AM_COUNT] = {"", " causal_mask", " sliding_mask", " prefix_lm", " documents",
                                                 " doc_ids", " and", " or", " per_head", " full_mask"};
    snprintf(row->shape, sizeof row->shape, "%lldx%lldx%lldx%lld kv%lldx%lld%s%s%s%s", (long long)c->B,
             (long long)c->Hq, (long long)c->Sq, (long long)c->D, (long long)(c->Hkv ? c->Hkv : c->Hq),
             (long long)(c->Skv ? c->Skv : c->Sq), c->causal ? " causal" : "", c->window_left ? " window" : "",
             c->n_docs && !c->family ? " varlen" : "", c->family > 0 && c->family < LK_AM_COUNT ? fam[c->family] : "");
    row->max_rel_err = INFINITY;
    row->tol = lk_attention_tol(impl, dt);
    lk_attention_problem pb = {0};   /* freed at done, made or not */
    lk_arena arena = {0};
    lk_placement pl;
    double *ref = NULL;
    lk_place_begin(&pl, "attention", impl);         /* a failure is kept in pl.status */
    lk_status s = c->views ? lk_error(LK_EINVAL, "attention: check: views: expected 0 (the views case is "
                                      "tests/cuda/test_attention.c's; check runs contiguous tensors), got %d", c->views)
                           : lk_attention_problem_make(impl, dt, c, seed, 1, &pb);
    if (s) goto done;
    int64_t nq = pb.nq, nk = pb.nk, nl = pb.nlse, Hq = c->Hq;
    ref = malloc(sizeof(double) * (size_t)(2 * nq + 2 * nk + nl + Hq));
    if (!ref) { s = lk_error(LK_ENOMEM, "attention: check: out of memory"); goto done; }
    double *oref = ref, *dqr = oref + nq, *dkr = dqr + nq, *dvr = dkr + nk, *lref = dvr + nk, *dsr = lref + nl;
    double **in = pb.ref_in;
    lk_attention_ref_forward(&pb.ref, in[0], in[1], in[2], oref, lref);
    lk_attention_ref_backward(&pb.ref, in[0], in[1], in[2], in[3], dqr, dkr, dvr, c->sinks ? dsr : NULL);
    lk_poison(pb.out, dt, nq); lk_poison(pb.dq, dt, nq); lk_poison(pb.dk, dt, nk); lk_poison(pb.dv, dt, nk);
    lk_poison(pb.dsink, LK_F32, Hq);
    memset(pb.lse, 0xff, (size_t)nl * 4);
    /* on a GPU row, cu_seqlens and a dense mask stay host memory, as the facade wants */
    lk_attention_args a = pb.a;
    lk_place_tensors(&pl, LK_TENSORS({"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"dout", &a.dout},
                                     {"s_aux", &a.s_aux}), 0);
    lk_place_tensors(&pl, LK_TENSORS({"out", &a.out}, {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv},
                                     {"ds_aux", &a.ds_aux}), 1);
    lk_place_saved(&pl, "saved", &a.saved, 1);     /* the LSE, compared below */
    lk_ctx ctx = lk_place_ctx(&pl, &arena);
    if ((s = pl.status) || (s = lk_attention_forward(impl, &a, &ctx)) || (s = lk_attention_backward(impl, &a, &ctx)) ||
        (s = lk_place_fetch(&pl)))
        goto done;
    lk_attention_errors e = {
        .out = lk_rel_err(pb.out, dt, oref, nq), .lse = lk_attention_lse_err(pb.lse, lref, nl),
        .dq = lk_rel_err(pb.dq, dt, dqr, nq), .dk = lk_rel_err(pb.dk, dt, dkr, nk),
        .dv = lk_rel_err(pb.dv, dt, dvr, nk), .ds_aux = c->sinks ? lk_rel_err(pb.dsink, LK_F32, dsr, Hq) : 0.0,
    };
    row->max_rel_err = fmax(fmax(fmax(e.out, e.lse), fmax(e.dq, e.dk)), fmax(e.dv, e.ds_aux));
    row->pass = row->max_rel_err <= row->tol;
    if (err) *err = e;
done:
    free(ref);
    lk_attention_problem_free(&pb);
    lk_place_end(&pl);
    lk_arena_free(&arena);
    return s;
}
