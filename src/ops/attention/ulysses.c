/* ulysses.c — DeepSpeed-Ulysses sequence parallelism around an attention adapter, for
 * the SP rows of the facade (attention.c) when ctx->comm is a group of P > 1 ranks.
 *
 * Rank r holds positions [r·S/P, (r+1)·S/P) of every head: q [B, H, S/P, D], k/v
 * [B, H_kv, S/P, D], out [B, S/P, H, D]. One all-to-all per tensor turns that into the
 * full sequence of H/P heads (rank r: heads [r·H/P, (r+1)·H/P)), the adapter runs on
 * it unchanged, and the inverse all-to-all brings out (and the LSE, so saved holds it
 * in the caller's [B, H, S/P] layout) back. When H_kv < P each rank receives the one KV
 * head its q heads use (P % H_kv == 0 keeps a rank's q heads inside one KV group), and
 * the backward sums the dk/dv of the ranks sharing a head. The backward repeats the
 * forward exchanges of q, k, v, out and LSE instead of keeping full-sequence copies
 * between the passes: saved stays the LSE alone.
 *
 * Every tensor moved is a 4-D box: all of dim 0, a range of dims 1 and 2, all of dim 3
 * (dims 2-3 contiguous), so one pack/unpack pair covers q/k/v ([B, H, S, D]), out/dout
 * ([B, S, H, D]) and the LSE ([B, H, S, 1]). Packed order (b, i1, i2, i3) is the same on
 * both sides, so a chunk needs no reordering in flight.
 *
 * CUDA tensors take the same path with device moves (ulysses.cu: strided copies, the
 * KV-repeat sum as a kernel) over an NCCL group, whose collectives take device buffers;
 * the small host metadata (split sizes, the shape agreement) stays on the host. */
#include <stdlib.h>
#include <string.h>
#include "ops/attention/ulysses.h"

/* A tensor [n0, n1, n2, n3] and where peer p's box starts in dims 1 and 2. */
typedef struct {
    char *base;
    int64_t n[4];
    int64_t m1, m2;         /* box extent in dims 1, 2 */
    int64_t s1, s2;         /* box start of peer p: p·s1 (dim 1), p·s2 (dim 2) */
    int kv;                 /* dim-1 start from the KV-head map instead of p·s1 */
} box_view;

static int64_t start1(const lk_ulysses *u, const box_view *v, int p) { return v->kv ? u->kv0[p] : p * v->s1; }

static size_t box_bytes(const box_view *v, size_t es) { return (size_t)(v->n[0] * v->m1 * v->m2 * v->n[3]) * es; }

/* pack = 1: the box of peer p into buf; 0: buf into the box (acc: added to f32 acc
 * of the tensor's shape instead). */
static lk_status box_move(const lk_ulysses *u, const box_view *v, int p, char *buf, size_t es, int pack, float *acc,
                          lk_dtype dt) {
    int64_t o1 = start1(u, v, p), o2 = p * v->s2, run = v->m2 * v->n[3];
#ifdef LLMKERN_HAVE_CUDA
    if (u->dev)
        return acc ? lk_ulysses_cuda_acc(acc, v->n, o1, o2, v->m1, v->m2, buf, dt, u->stream)
                   : lk_ulysses_cuda_box(v->base, v->n, o1, o2, v->m1, v->m2, buf, es, pack, u->stream);
#endif
    for (int64_t i0 = 0; i0 < v->n[0]; i0++)
        for (int64_t i1 = 0; i1 < v->m1; i1++) {
            int64_t off = ((i0 * v->n[1] + o1 + i1) * v->n[2] + o2) * v->n[3];
            char *b = buf + (size_t)((i0 * v->m1 + i1) * run) * es;
            if (acc) {
                for (int64_t j = 0; j < run; j++)
                    acc[off + j] += dt == LK_F32 ? ((const float *)b)[j] : lk_bf16_to_f32(((const uint16_t *)b)[j]);
            } else if (pack) {
                memcpy(b, v->base + (size_t)off * es, (size_t)run * es);
            } else {
                memcpy(v->base + (size_t)off * es, b, (size_t)run * es);
            }
        }
    return LK_OK;
}

static lk_status zero(const lk_ulysses *u, void *p, size_t bytes) {
#ifdef LLMKERN_HAVE_CUDA
    if (u->dev) return lk_ulysses_cuda_zero(p, bytes, u->stream);
#endif
    memset(p, 0, bytes);
    return LK_OK;
}

/* src boxes go to their peers and arrive in dst's boxes; acc_dst: summed (KV repeat). */
static lk_status exchange(const lk_ulysses *u, const box_view *src, const box_view *dst, lk_dtype dt, int acc_dst) {
    size_t es = dt == LK_F32 ? 4 : 2, chunk = box_bytes(src, es);
    int P = u->P;
    lk_status s;
    for (int p = 0; p < P; p++) {
        u->cnt[p] = (int64_t)chunk;
        u->dsp[p] = (int64_t)chunk * p;
        if ((s = box_move(u, src, p, u->send + chunk * p, es, 1, NULL, dt))) return s;
    }
#ifdef LLMKERN_HAVE_CUDA
    if (u->dev && (s = lk_ulysses_cuda_sync(u->stream))) return s;   /* the collective runs on its own stream */
#endif
    if ((s = lk_comm_all_to_all(u->comm, u->send, u->cnt, u->dsp, u->recv, u->cnt, u->dsp))) return s;
    int64_t n = dst->n[0] * dst->n[1] * dst->n[2] * dst->n[3];
    if (acc_dst && (s = zero(u, u->acc, sizeof(float) * (size_t)n))) return s;
    for (int p = 0; p < P; p++)
        if ((s = box_move(u, dst, p, u->recv + chunk * p, es, 0, acc_dst ? u->acc : NULL, dt))) return s;
    if (!acc_dst) return LK_OK;
#ifdef LLMKERN_HAVE_CUDA
    if (u->dev) return lk_ulysses_cuda_convert(u->acc, dst->base, dt, n, u->stream);
#endif
    lk_convert(u->acc, LK_F32, dst->base, dt, n);
    return LK_OK;
}

/* The layouts: local (all heads, S/P positions) and inner (H/P heads, all positions). */
static box_view heads_local(void *t, int64_t B, int64_t H, int64_t Sl, int64_t D, int64_t Hl, int kv) {
    return (box_view){t, {B, H, Sl, D}, Hl, Sl, Hl, 0, kv};
}
static box_view heads_inner(void *t, int64_t B, int64_t Hl, int64_t Sl, int64_t P, int64_t D) {
    return (box_view){t, {B, Hl, Sl * P, D}, Hl, Sl, 0, Sl, 0};
}
static box_view seq_local(void *t, int64_t B, int64_t Sl, int64_t H, int64_t D, int64_t Hl) {
    box_view v = {t, {B, Sl, H, D}, Sl, Hl, 0, Hl, 0};
    return v;
}
static box_view seq_inner(void *t, int64_t B, int64_t Sl, int64_t P, int64_t Hl, int64_t D) {
    return (box_view){t, {B, Sl * P, Hl, D}, Sl, Hl, Sl, 0, 0};
}

lk_status lk_ulysses_plan(const lk_attention_args *a, lk_comm *comm, lk_device_type dev, const lk_attn_dims *loc,
                          lk_ulysses *u) {
    memset(u, 0, sizeof *u);
    u->P = 1;
    u->loc = u->in = *loc;
    if (comm == NULL || a->skip_ulysses) return LK_OK;
    lk_status s = lk_comm_check("attention", "ctx.comm", comm);
    if (s) return s;
    if (comm->size == 1) return LK_OK;
    int nccl = comm->backend && strcmp(comm->backend, "nccl") == 0;
    if (nccl != (dev == LK_DEVICE_CUDA))
        return lk_error(LK_EDEVICE, "attention: ctx.comm: expected %s for %s tensors (the exchange hands it their "
                        "memory), got a '%s' communicator", dev == LK_DEVICE_CUDA ? "an NCCL communicator" :
                        "a host-memory communicator (mpi, single)", lk_device_name(dev),
                        comm->backend ? comm->backend : "?");
    u->dev = dev == LK_DEVICE_CUDA;
    int P = comm->size;
    u->comm = comm, u->P = P, u->r = comm->rank;
    if (loc->Hq % P)
        return lk_error(LK_ESHAPE, "attention: q: expected H_q divisible by the SP size %d (Ulysses gives each rank "
                        "H_q / P heads), got H_q = %lld", P, (long long)loc->Hq);
    if (loc->Hkv >= P ? loc->Hkv % P : P % loc->Hkv)
        return lk_error(LK_ESHAPE, "attention: k: expected H_kv divisible by the SP size %d, or dividing it (KV "
                        "heads repeated so each rank holds one), got H_kv = %lld", P, (long long)loc->Hkv);
    u->Hl = loc->Hq / P;
    u->repeat = loc->Hkv < P;
    u->Hkvl = u->repeat ? 1 : loc->Hkv / P;
    u->in.Hq = u->Hl, u->in.Hkv = u->Hkvl, u->in.G = u->Hl / u->Hkvl;
    u->in.Sq = loc->Sq * P, u->in.Skv = loc->Skv * P;
    if (a->block_mask && a->block_mask->H != 1)
        return lk_error(LK_EINVAL, "attention: block_mask: expected a head-broadcast BlockMask (H = 1) under Ulysses "
                        "SP (size %d: local head indices restart at 0 on every rank), got H = %lld", P,
                        (long long)a->block_mask->H);
    if (a->mask.data && (a->mask.ndim != 4 || a->mask.shape[1] != 1))
        return lk_error(LK_EINVAL, "attention: mask: expected a head-broadcast dense mask [B or 1, 1, S, S_kv] under "
                        "Ulysses SP (size %d), got a head-specific one", P);
    return LK_OK;
}

/* The inner call's arguments: a's options over workspace tensors of the inner layout. */
static lk_attention_args inner_args(const lk_ulysses *u, const lk_attention_args *a, int backward) {
    const lk_attn_dims *d = &u->in;
    lk_attention_args ia = *a;
    int64_t qs[4] = {d->B, d->Hq, d->Sq, d->D}, ks[4] = {d->B, d->Hkv, d->Skv, d->D}, os[4] = {d->B, d->Sq, d->Hq, d->D};
    ia.q = lk_tensor_view(NULL, d->dt, 4, qs);
    ia.k = ia.v = lk_tensor_view(NULL, d->dt, 4, ks);
    ia.out = lk_tensor_view(NULL, d->dt, 4, os);
    ia.dout = ia.out, ia.dq = ia.q, ia.dk = ia.dv = ia.k;
    if (!backward) ia.dout.data = ia.dq.data = ia.dk.data = ia.dv.data = NULL;
    if (a->s_aux.data) ia.s_aux = lk_tensor_1d((float *)a->s_aux.data + u->r * u->Hl, LK_F32, u->Hl);
    if (a->ds_aux.data) ia.ds_aux = lk_tensor_1d((float *)a->ds_aux.data + u->r * u->Hl, LK_F32, u->Hl);
    ia.saved = (lk_saved){NULL, (size_t)(d->B * d->Hq * d->Sq) * sizeof(float)};
    return ia;
}

#define SLACK 64

size_t lk_ulysses_workspace(const lk_ulysses *u, const lk_attention_vtable *vt, const lk_attention_args *a,
                            int backward) {
    lk_attention_args ia = inner_args(u, a, backward);
    size_t es = lk_dtype_size(u->loc.dt), lse = ia.saved.bytes;
    size_t q = lk_tensor_bytes(&ia.q), k = lk_tensor_bytes(&ia.k);
    size_t stage = q > k ? q : k;
    if (lse > stage) stage = lse;
    size_t acc = u->repeat && backward ? (size_t)(u->loc.B * u->loc.Hkv * u->loc.Skv * u->loc.D) * sizeof(float) : 0;
    size_t tensors = (q + 2 * k + q) * (backward ? 2 : 1) + lse;
    size_t meta = (size_t)(u->P + 1) * 8 * sizeof(int64_t);
    (void)es;
    return tensors + 2 * stage + acc + meta + 16 * SLACK + (vt->workspace_bytes ? vt->workspace_bytes(&ia, backward) : 0);
}

/* Every rank must run the same call: a mismatch would otherwise hang or mix garbage. */
static lk_status agree(lk_ulysses *u, int backward, lk_arena *ar) {
    int64_t mine[8] = {u->loc.B, u->loc.Hq, u->loc.Hkv, u->loc.Sq, u->loc.Skv, u->loc.D, u->loc.dt, backward};
    int64_t *buf = lk_arena_alloc(ar, sizeof mine * (size_t)(u->P + 1)), *all = buf;
    if (!buf) return lk_error(LK_ENOMEM, "attention: arena: expected the reserved workspace, got too little");
    lk_status s;
#ifdef LLMKERN_HAVE_CUDA
    if (u->dev) {   /* through the device: an NCCL group takes device buffers */
        all = u->seen;
        if ((s = lk_ulysses_cuda_copy(buf + 8 * u->P, mine, sizeof mine, 1, u->stream)) ||
            (s = lk_comm_all_gather(u->comm, buf + 8 * u->P, buf, sizeof mine)) ||
            (s = lk_ulysses_cuda_copy(all, buf, sizeof mine * (size_t)u->P, 0, u->stream)))
            return s;
    } else
#endif
    if ((s = lk_comm_all_gather(u->comm, mine, all, sizeof mine))) return s;
    for (int p = 0; p < u->P; p++)
        if (memcmp(all + 8 * p, mine, sizeof mine))
            return lk_error(LK_ECOMM, "attention: ctx.comm: expected every SP rank to call with the same shapes "
                            "and pass, got [B %lld H %lld Hkv %lld S %lld Skv %lld D %lld] on rank %d and [B %lld H "
                            "%lld Hkv %lld S %lld Skv %lld D %lld] on rank %d", (long long)mine[0], (long long)mine[1],
                            (long long)mine[2], (long long)mine[3], (long long)mine[4], (long long)mine[5], u->r,
                            (long long)all[8 * p], (long long)all[8 * p + 1], (long long)all[8 * p + 2],
                            (long long)all[8 * p + 3], (long long)all[8 * p + 4], (long long)all[8 * p + 5], p);
    return LK_OK;
}

static lk_status run(lk_ulysses *u, const lk_attention_vtable *vt, int backward, const lk_attention_args *a,
                     lk_ctx *ctx);

lk_status lk_ulysses_run(lk_ulysses *u, const lk_attention_vtable *vt, int backward, const lk_attention_args *a,
                         lk_ctx *ctx) {
    int64_t *meta = malloc(sizeof(int64_t) * 11 * (size_t)u->P);
    if (meta == NULL) return lk_error(LK_ENOMEM, "attention: ulysses: no room for %d ranks' split sizes", u->P);
    u->kv0 = meta, u->cnt = meta + u->P, u->dsp = meta + 2 * u->P, u->seen = meta + 3 * u->P;
    u->stream = ctx->stream;
    lk_status s = run(u, vt, backward, a, ctx);
    free(meta);
    u->kv0 = u->cnt = u->dsp = u->seen = NULL;
    return s;
}

static lk_status run(lk_ulysses *u, const lk_attention_vtable *vt, int backward, const lk_attention_args *a,
                     lk_ctx *ctx) {
    lk_arena *ar = ctx->arena;
    lk_status s = agree(u, backward, ar);
    if (s) return s;
    const lk_attn_dims *L = &u->loc;
    int64_t B = L->B, H = L->Hq, Hkv = L->Hkv, Sl = L->Sq, Skl = L->Skv, D = L->D, P = u->P, Hl = u->Hl, Hkl = u->Hkvl;
    lk_dtype dt = L->dt;
    lk_attention_args ia = inner_args(u, a, backward);
    size_t q = lk_tensor_bytes(&ia.q), k = lk_tensor_bytes(&ia.k), stage = q > k ? q : k;
    if (ia.saved.bytes > stage) stage = ia.saved.bytes;
    u->send = lk_arena_alloc(ar, stage);
    u->recv = lk_arena_alloc(ar, stage);
    ia.q.data = lk_arena_alloc(ar, q);
    ia.k.data = lk_arena_alloc(ar, k);
    ia.v.data = lk_arena_alloc(ar, k);
    ia.out.data = lk_arena_alloc(ar, q);
    ia.saved.data = lk_arena_alloc(ar, ia.saved.bytes);
    if (backward) {
        ia.dout.data = lk_arena_alloc(ar, q);
        ia.dq.data = lk_arena_alloc(ar, q);
        ia.dk.data = lk_arena_alloc(ar, k);
        ia.dv.data = lk_arena_alloc(ar, k);
        u->acc = u->repeat ? lk_arena_alloc(ar, (size_t)(B * Hkv * Skl * D) * sizeof(float)) : NULL;
    }
    if (!u->send || !u->recv || !ia.q.data || !ia.k.data || !ia.v.data ||
        !ia.out.data || !ia.saved.data || (backward && (!ia.dout.data || !ia.dq.data || !ia.dk.data || !ia.dv.data ||
                                                         (u->repeat && !u->acc))))
        return lk_error(LK_ENOMEM, "attention: arena: expected the reserved workspace, got too little");
    /* KV head of peer p: the one its first q head reads (all its q heads read it when repeating) */
    for (int64_t p = 0; p < P; p++) u->kv0[p] = u->repeat ? (p * Hl) / (H / Hkv) : p * Hkl;

    box_view q_loc = heads_local(a->q.data, B, H, Sl, D, Hl, 0), q_in = heads_inner(ia.q.data, B, Hl, Sl, P, D);
    box_view k_loc = heads_local(a->k.data, B, Hkv, Skl, D, Hkl, 1), k_in = heads_inner(ia.k.data, B, Hkl, Skl, P, D);
    box_view v_loc = k_loc, v_in = k_in;
    v_loc.base = a->v.data, v_in.base = ia.v.data;
    box_view l_loc = heads_local(a->saved.data, B, H, Sl, 1, Hl, 0), l_in = heads_inner(ia.saved.data, B, Hl, Sl, P, 1);
    box_view o_loc = seq_local(a->out.data, B, Sl, H, D, Hl), o_in = seq_inner(ia.out.data, B, Sl, P, Hl, D);
    if ((s = exchange(u, &q_loc, &q_in, dt, 0)) || (s = exchange(u, &k_loc, &k_in, dt, 0)) ||
        (s = exchange(u, &v_loc, &v_in, dt, 0)))
        return s;
    if (!backward) {
        if ((s = vt->forward(&ia, ctx))) return s;
        if ((s = exchange(u, &o_in, &o_loc, dt, 0))) return s;
        return exchange(u, &l_in, &l_loc, LK_F32, 0);    /* the LSE restored to [B, H, S/P] */
    }
    box_view d_loc = o_loc, d_in = o_in;
    d_loc.base = a->dout.data, d_in.base = ia.dout.data;
    if ((s = exchange(u, &o_loc, &o_in, dt, 0)) || (s = exchange(u, &d_loc, &d_in, dt, 0)) ||
        (s = exchange(u, &l_loc, &l_in, LK_F32, 0)))
        return s;
    if ((s = vt->backward(&ia, ctx))) return s;
    box_view dq_loc = q_loc, dq_in = q_in, dk_loc = k_loc, dk_in = k_in, dv_loc = k_loc, dv_in = k_in;
    dq_loc.base = a->dq.data, dq_in.base = ia.dq.data;
    dk_loc.base = a->dk.data, dk_in.base = ia.dk.data;
    dv_loc.base = a->dv.data, dv_in.base = ia.dv.data;
    if ((s = exchange(u, &dq_in, &dq_loc, dt, 0)) || (s = exchange(u, &dk_in, &dk_loc, dt, u->repeat)) ||
        (s = exchange(u, &dv_in, &dv_loc, dt, u->repeat)))
        return s;
    /* ds_aux: this rank's heads; the other heads' share is another rank's, so summed over
     * the SP group (as every parameter gradient is) it is the full gradient */
    if (a->ds_aux.data) {
        float *ds = a->ds_aux.data;
        if ((s = zero(u, ds, sizeof(float) * (size_t)(u->r * Hl))) ||
            (s = zero(u, ds + (u->r + 1) * Hl, sizeof(float) * (size_t)(H - (u->r + 1) * Hl))))
            return s;
    }
    return LK_OK;
}
