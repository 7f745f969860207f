/* layer.c — one Qwen3 decoder layer, forward and backward, through the implementations
 * bound in the op table (resolved at create into lk_layer_ops):
 *   h1 = rms(x); q, k, v = h1·Wᵀ; q, k = rope(rms_q(q), rms_k(k)) per head;
 *   x2 = x + o_proj(attention(q, k, v, varlen causal)); out = x2 + mlp(rms(x2))
 * q, k and v are one GEMM each way: params.c lays their weights out as one [Q + 2K, H]
 * matrix, qwen3.c binds one linear implementation to the three, and the output is one
 * [T, Q + 2K] buffer (d(h1) then sums the three in f32 inside one GEMM, not in bf16 adds
 * after three). q_norm and k_norm read q and k there and write them head-major when their
 * implementation takes views (the fused rows); v, and q and k for the eager norms, are
 * moved to head-major by the model's own kernel.
 * The MLP is the swiglu_mlp op or the MoE block (moe_block.c). By default the backward makes
 * q and k before their norms again (one GEMM from the kept h1) rather than keeping them: at
 * 32k tokens a step, 16 + 8 heads of 128 in bf16 are 200 MB a layer, 5.6 GB of a 28-layer
 * 0.6B model's step for ~0.3 ms a layer of GEMMs. lk_model_set_keep_qk keeps the whole
 * projection output instead (v's columns too: one GEMM writes them; 268 MB a layer there),
 * and the backward reads q and k where the forward's GEMM left them.
 * The residual stream is f32 (qwen3_internal.h): the input and post-attention norms run
 * rms_norm's residual mode on sc.res, adding the branch output before them (forward)
 * and their dx into the gradient after them (backward). They normalize the f32 stream,
 * or with recompute (m->norm_of_x) its rounding x, which a recompute normalizes again
 * with the plain norm to the same bits. A bf16 stream (lk_stream_in_x) is x and x2
 * themselves: each norm reads the value before it where it lies and writes the sum. */
#include "model/qwen3_internal.h"

#define W(off) lk_wc(m, off)
#define G(off) lk_gc(m, off)

/* Activations and weights in the model's dtype; f2 an f32 one (the stream, the RoPE tables);
 * g2 a gradient. */
static lk_tensor t2(const lk_model *m, const void *p, int64_t r, int64_t c) {
    return lk_on(m, lk_tensor_2d((void *)p, m->dt, r, c));
}
static lk_tensor f2(const lk_model *m, float *p, int64_t r, int64_t c) {
    return lk_on(m, lk_tensor_2d(p, LK_F32, r, c));
}
static lk_tensor g2(const lk_model *m, void *p, int64_t r, int64_t c) {
    return lk_on(m, lk_tensor_2d(p, m->gdt, r, c));
}
static lk_tensor t4(const lk_model *m, const void *p, int64_t h, int64_t s, int64_t d) {
    return lk_on(m, lk_tensor_view((void *)p, m->dt, 4, (int64_t[]){1, h, s, d}));
}
static lk_saved sv(void *p, size_t n) { return (lk_saved){p, n}; }

/* [T, H, D] heads as q_norm / k_norm read and write them when their implementation takes
 * views (rms_norm.h): token-major in a buffer of rows ld apart (the q/k/v projection's
 * column blocks), or head-major ([H, T, D], what RoPE and attention take) seen as [T, H, D]. */
static lk_tensor heads_tok(const lk_model *m, const void *p, int64_t H, int64_t ld) {
    lk_tensor t = lk_on(m, lk_tensor_view((void *)p, m->dt, 3, (int64_t[]){m->T, H, m->D}));
    t.stride[0] = ld;
    return t;
}
static lk_tensor heads_hm(const lk_model *m, const void *p, int64_t H) {
    lk_tensor t = lk_on(m, lk_tensor_view((void *)p, m->dt, 3, (int64_t[]){m->T, H, m->D}));
    t.stride[0] = m->D, t.stride[1] = m->T * m->D;
    return t;
}

/* v (or dv) as attention's [1, Hk, T, D] view of the projection's v columns ([T, Q + 2K]
 * rows; its gradient's, in the backward). qkv NULL: the view's shape alone (data NULL). */
static lk_tensor v_cols(const lk_model *m, const char *qkv) {
    const int64_t QKV = (m->Hq + 2 * m->Hk) * m->D;
    lk_tensor t = t4(m, qkv ? qkv + (size_t)((m->Hq + m->Hk) * m->D) * m->es : NULL, m->Hk, m->T, m->D);
    t.stride[0] = m->T * QKV, t.stride[1] = m->D, t.stride[2] = QKV;
    return t;
}

/* Both head norms of layer l read q and k where the projection left them and write them
 * head-major: no head moves for q and k (only v's remain). */
static int head_views(const lk_layer_ops *op) {
    return lk_rms_norm_takes_views(op->q_norm) && lk_rms_norm_takes_views(op->k_norm);
}

int lk_qwen3_v_in_place(const lk_model *m, int l) {
    if (m->sp || (!m->keep_qk && !lk_qkv_again(m, l))) return 0;
    const lk_attention_args at = {.q = t4(m, NULL, m->Hq, m->T, m->D), .k = t4(m, NULL, m->Hk, m->T, m->D),
                                  .v = v_cols(m, NULL), .deterministic = m->deterministic};
    return lk_attention_takes_views(m->layers[l].ops.attn, &at);
}

size_t lk_qwen3_layer_carve(const lk_model *m, int l, void *base, lk_layer_acts *a) {
    const lk_layer *L = &m->layers[l];
    int64_t T = m->T, es = (int64_t)m->es, TH = T * m->H * es, TQ = T * m->Hq * m->D * es, TK = T * m->Hk * m->D * es;
    size_t u = 0;
    unsigned char *b = base;
    lk_layer_acts z;
    if (!a) a = &z;
    const int kept_norms = !lk_norms_again(m, l), kept_qkv = !lk_qkv_again(m, l);   /* else the scratch's (alloc_acts) */
    a->h1 = kept_norms ? lk_carve(b, &u, TH) : NULL;
    a->vt = kept_qkv && !lk_qwen3_v_in_place(m, l) ? lk_carve(b, &u, TK) : NULL;
    a->qr = kept_qkv ? lk_carve(b, &u, TQ) : NULL;
    a->kr = kept_qkv ? lk_carve(b, &u, TK) : NULL;
    a->ao = lk_carve(b, &u, TQ);
    a->qkv = m->keep_qk ? lk_carve(b, &u, TQ + 2 * TK) : NULL;
    a->x2 = lk_recomputed(m, l) ? NULL : lk_carve(b, &u, TH);   /* recompute: kept in x2s */
    a->h2 = kept_norms ? lk_carve(b, &u, TH) : NULL;
    a->ids = L->moe ? lk_carve(b, &u, T * m->K * 4) : NULL;
    a->tw = L->moe ? lk_carve(b, &u, T * m->K * 4) : NULL;
    for (int i = 0; i < S_COUNT; i++)
        a->s[i] = L->saved[i] && !(i == S_EXPERTS && lk_moe_again(m, l)) ? lk_carve(b, &u, L->saved[i]) : NULL;
    return lk_align64(u);
}

/* The model's own moves, on its device (device.h): [T, H, D] (token rows ld apart) <->
 * [H, T, D]; for q and k only when a head norm cannot take views. */
static lk_status to_heads(lk_model *m, const void *src, int64_t ld, void *dst, int64_t H) {
    return m->dev->heads(src, dst, m->T, H, m->D, ld, 0, m->dt, &m->ctx);
}
static lk_status from_heads(lk_model *m, const void *src, void *dst, int64_t ld, int64_t H) {
    return m->dev->heads(src, dst, m->T, H, m->D, ld, 1, m->dt, &m->ctx);
}

/* A norm's weight is the f32 master at w_off whatever the dtype (rms_norm.h: bf16 x times
 * an f32 weight, as autocast runs it; issue 17: the weight's bf16 rounding was most of
 * the bf16-vs-f32 loss gap). In f32 the master is the compute copy: the same bits. Under
 * a bf16 master the weight is bf16, as transformers' bf16 model holds it. */
static lk_rms_norm_args norm_args(const lk_model *m, const void *x, int64_t rows, int64_t n, int64_t w_off,
                                  void *y, void *saved, size_t saved_bytes) {
    return (lk_rms_norm_args){.x = t2(m, x, rows, n), .weight = lk_master_1d(m, w_off, n),
                              .y = t2(m, y, rows, n), .saved = sv(saved, saved_bytes), .eps = m->cfg.rms_norm_eps};
}

/* The residual mode on the stream sc.res: forward, delta (NULL: none) added and x
 * written, the stream normalized (x with recompute); backward, dx added. A bf16 stream
 * (lk_stream_in_x) is read from prev instead: the value before this norm (forward: the
 * layer before's x2, or x itself; backward: dres, which dx then is). */
static lk_rms_norm_args with_stream(const lk_model *m, lk_rms_norm_args a, const void *prev, const void *delta) {
    int64_t rows = a.x.shape[0], n = a.x.shape[1];
    a.residual = lk_stream_in_x(m) ? t2(m, prev, rows, n) : f2(m, m->sc.res, rows, n);
    a.norm_of_x = m->norm_of_x;
    if (delta) a.delta = t2(m, delta, rows, n);
    return a;
}

/* The op writes dweight in the weight's dtype, f32 (summed over the rows in f32, never
 * rounded; bf16 under a bf16 master); the grads add it (they accumulate over
 * micro-batches, the op writes), in f32 (bf16 grads rounded once). */
static lk_status norm_backward(lk_model *m, const lk_impl *impl, lk_rms_norm_args a, lk_tensor dy, lk_tensor dx,
                               int64_t w_off) {
    int64_t n = a.x.shape[a.x.ndim - 1];
    a.dy = dy;
    a.dx = dx;
    a.inplace_dx = dx.data == dy.data;
    a.dweight = lk_on(m, lk_tensor_1d(m->sc.dw, a.weight.dtype, n));
    lk_status s = lk_rms_norm_backward(impl, &a, &m->ctx);
    return s ? s : m->dev->acc(G(w_off), m->gdt, m->sc.dw, a.weight.dtype, n, &m->ctx);
}

static lk_linear_args lin(const lk_model *m, const void *x, int64_t T, int64_t in, const void *w, int64_t out,
                          void *y) {
    return (lk_linear_args){.x = t2(m, x, T, in), .weight = t2(m, w, out, in), .y = t2(m, y, T, out)};
}

int lk_model_rope_in_norms(const lk_impl *q_norm, const lk_impl *k_norm, const lk_impl *rope, int64_t head_dim,
                           lk_dtype dt) {
    const lk_impl *n[2] = {q_norm, k_norm};
    for (int i = 0; i < 2; i++)
        if (!lk_rms_norm_takes_views(n[i]) || !lk_rms_norm_takes_rope(n[i]) ||
            (head_dim > 0 && !lk_rms_norm_takes_rope_rows(n[i], head_dim, dt)))
            return 0;
    return rope && rope->op == LK_OP_ROPE && strcmp(rope->name, "fused") == 0;
}

/* q and k rotated by their norms (model.h): the separate RoPE kernel moved them once more each way. */
static int rope_in_norms(const lk_model *m, const lk_layer_ops *op) {
    return lk_model_rope_in_norms(op->q_norm, op->k_norm, op->rope, m->D, m->dt);
}

static lk_rms_norm_rope norm_rope(const lk_model *m) {
    return (lk_rms_norm_rope){.cos = f2(m, m->rope_cos, m->max_pos, m->D / 2),
                              .sin = f2(m, m->rope_sin, m->max_pos, m->D / 2),
                              .position_ids = lk_on(m, lk_tensor_1d((void *)m->pos, LK_I64, m->T))};
}

static lk_rope_args rope_args(const lk_model *m, int l, const lk_layer_acts *a) {
    int64_t T = m->T;
    lk_rope_args r = {
        .q = t4(m, a->qr, m->Hq, T, m->D), .k = t4(m, a->kr, m->Hk, T, m->D),
        .q_out = t4(m, a->qr, m->Hq, T, m->D), .k_out = t4(m, a->kr, m->Hk, T, m->D),
        .cos = f2(m, m->rope_cos, m->max_pos, m->D / 2), .sin = f2(m, m->rope_sin, m->max_pos, m->D / 2),
        .position_ids = lk_on(m, lk_tensor_2d((void *)m->pos, LK_I64, 1, T)),
        .saved = sv(a->s[S_ROPE], m->layers[l].saved[S_ROPE]), .rotary_dim = 0,
    };
    return r;
}

/* flex (impl's adapter) follows the batch's document BlockMask alone (within the sliding
 * window for a layer that has one); the others the cu_seqlens, causally, within layer l's
 * window. */
static lk_attention_args attn_args(const lk_model *m, int l, const lk_impl *impl, const lk_layer_acts *a,
                                   const lk_batch *b, size_t saved, const char *vsrc) {
    const lk_attention_entry *e = impl->vtable;
    int64_t T = m->T;
    lk_attention_args at = {
        .q = t4(m, a->qr, m->Hq, T, m->D), .k = t4(m, a->kr, m->Hk, T, m->D),
        .v = vsrc ? v_cols(m, vsrc) : t4(m, a->vt, m->Hk, T, m->D),
        .out = lk_on(m, lk_tensor_view(a->ao, m->dt, 4, (int64_t[]){1, T, m->Hq, m->D})),
        .saved = sv(a->s[S_ATTN], saved), .deterministic = m->deterministic,
    };
    if (e->adapter == LK_ATTN_FLEX) {
        at.block_mask = &m->masks[lk_qwen3_layer_window(&m->cfg, l) > 0].mask;
    } else {
        at.cu_seqlens_q = at.cu_seqlens_k = lk_tensor_1d((void *)m->cu, LK_I32, b->n_segs + 1);   /* host memory */
        at.max_seqlen_q = at.max_seqlen_k = b->max_seqlen;
        at.causal = 1;
        at.window_left = lk_qwen3_layer_window(&m->cfg, l);
    }
    return at;
}

/* The projection qkv whose v columns attention reads in place (and whose gradient's v columns
 * it writes dv into): where the layout gave the layer no a->vt (lk_qwen3_v_in_place); else
 * NULL, v moved head-major into a->vt. */
static const char *v_source(const lk_layer_acts *a, const char *qkv) { return a->vt ? NULL : qkv; }

/* Attention's inputs from the q/k/v projection qkv ([T, Q + 2K], rows QKV apart): q_norm /
 * k_norm over the head dim, written head-major into a->qr, a->kr (where RoPE then rotates in
 * place, or the norms rotate as they write: rope_in_norms), v moved head-major into a->vt
 * unless attention reads it in place (vsrc). The forward's, and a recompute_qkv backward's
 * again. */
static lk_status attention_inputs(lk_model *m, int l, const lk_layer_acts *a, const char *qkv, const char *vsrc) {
    const lk_layer *L = &m->layers[l];
    const lk_layer_ops *op = &L->ops;
    lk_scratch *sc = &m->sc;
    int64_t T = m->T, Q = m->Hq * m->D, K = m->Hk * m->D, QKV = Q + 2 * K;
    size_t es = m->es;
    lk_status s;
    lk_rms_norm_args nq = norm_args(m, sc->dqt, m->Hq * T, m->D, L->qn, a->qr, a->s[S_QN], L->saved[S_QN]);
    lk_rms_norm_args nk = norm_args(m, sc->dkt, m->Hk * T, m->D, L->kn, a->kr, a->s[S_KN], L->saved[S_KN]);
    if (head_views(op)) {   /* read where the projection left them */
        nq.x = heads_tok(m, qkv, m->Hq, QKV), nq.y = heads_hm(m, a->qr, m->Hq);
        nk.x = heads_tok(m, qkv + Q * es, m->Hk, QKV), nk.y = heads_hm(m, a->kr, m->Hk);
    } else if ((s = to_heads(m, qkv, QKV, sc->dqt, m->Hq)) || (s = to_heads(m, qkv + Q * es, QKV, sc->dkt, m->Hk))) {
        return s;
    }
    if (!vsrc && (s = to_heads(m, qkv + (Q + K) * es, QKV, a->vt, m->Hk))) return s;
    const lk_rms_norm_rope rp = norm_rope(m);
    if (rope_in_norms(m, op)) nq.rope = nk.rope = &rp;
    if ((s = lk_rms_norm_forward(op->q_norm, &nq, &m->ctx)) || (s = lk_rms_norm_forward(op->k_norm, &nk, &m->ctx)))
        return s;
    if (nq.rope) return LK_OK;
    lk_rope_args r = rope_args(m, l, a);
    return lk_rope_forward(op->rope, &r, &m->ctx);
}

lk_status lk_qwen3_layer_forward(lk_model *m, int l, const lk_layer_acts *a, const lk_batch *b, int first,
                                 int add_aux) {
    const lk_layer *L = &m->layers[l];
    const lk_layer_ops *op = &L->ops;
    lk_ctx *ctx = &m->ctx;
    lk_scratch *sc = &m->sc;
    int64_t T = m->T, H = m->H, Q = m->Hq * m->D, K = m->Hk * m->D, QKV = Q + 2 * K;
    char *qkv = a->qkv ? a->qkv : sc->qkv;   /* kept for the backward, or scratch */
    lk_status s;
    lk_rms_norm_args n = norm_args(m, a->x, T, H, L->in, a->h1, a->s[S_IN], L->saved[S_IN]);
    if (first)   /* + the previous layer's MLP output */
        n = with_stream(m, n, l ? m->acts[l - 1].x2 : a->x, l ? sc->tmp : NULL);
    if ((s = lk_rms_norm_forward(op->in_norm, &n, ctx))) return s;
    /* q, k and v in one GEMM, as column blocks of qkv; the norms' inputs kept only in a->qkv
     * (else the backward makes them again) */
    lk_linear_args p = lin(m, a->h1, T, H, W(L->q), QKV, qkv);
    const char *vsrc = v_source(a, qkv);
    if ((s = lk_linear_forward(op->q_proj, &p, ctx)) || (s = attention_inputs(m, l, a, qkv, vsrc))) return s;
    lk_attention_args at = attn_args(m, l, op->attn, a, b, L->saved[S_ATTN], vsrc);
    ctx->comm = m->sp;   /* Ulysses over the SP group (NULL: one process) */
    s = lk_attention_forward(op->attn, &at, ctx);
    ctx->comm = NULL;
    if (s) return s;
    /* x2 = x + o_proj(attention) on the stream; a recompute has x2 kept and skips o_proj */
    lk_rms_norm_args np = norm_args(m, a->x2, T, H, L->post, a->h2, a->s[S_POST], L->saved[S_POST]);
    if (first) {
        lk_linear_args po = lin(m, a->ao, T, Q, W(L->o), H, sc->tmp);
        if ((s = lk_linear_forward(op->o_proj, &po, ctx))) return s;
        np = with_stream(m, np, a->x, sc->tmp);
    }
    if ((s = lk_rms_norm_forward(op->post_norm, &np, ctx))) return s;
    void *out = first ? sc->tmp : NULL;   /* a recompute wants the MLP's saved block alone (out.data NULL) */
    if (L->moe) return lk_qwen3_moe_forward(m, l, a, out, add_aux);
    lk_swiglu_mlp_args f = {.x = t2(m, a->h2, T, H), .gate_up_weight = t2(m, W(L->gate_up), 2 * m->I, H),
                            .down_weight = t2(m, W(L->down), H, m->I), .out = t2(m, out, T, H),
                            .saved = sv(a->s[S_MLP], L->saved[S_MLP])};
    return lk_swiglu_mlp_forward(op->mlp, &f, ctx);
}

/* A projection's backward: dx written, the weight's gradient accumulated into the grads. */
static lk_status lin_backward(lk_model *m, const lk_impl *impl, lk_linear_args p, const void *dy, int64_t w_off,
                              void *dx) {
    p.dy = t2(m, dy, p.y.shape[0], p.y.shape[1]);
    p.dx = t2(m, dx, p.x.shape[0], p.x.shape[1]);
    p.dweight = g2(m, G(w_off), p.weight.shape[0], p.weight.shape[1]);
    return lk_linear_backward(impl, &p, &m->ctx);
}

lk_status lk_qwen3_layer_backward(lk_model *m, int l, const lk_layer_acts *a, const lk_batch *b, float d_aux) {
    const lk_layer *L = &m->layers[l];
    const lk_layer_ops *op = &L->ops;
    lk_ctx *ctx = &m->ctx;
    lk_scratch *sc = &m->sc;
    int64_t T = m->T, H = m->H, Q = m->Hq * m->D, K = m->Hk * m->D, QKV = Q + 2 * K;
    char *qkv = sc->qkv;
    size_t es = m->es;
    lk_status s;
    /* recompute_norms: h2 (then h1, below) made again in sc.hn from the kept x2 (x) by the
     * plain norm: the forward's bits (norm_of_x) */
    const int norms_again = sc->hn && a->h2 == sc->hn;
    lk_rms_norm_args again = norm_args(m, a->x2, T, H, L->post, a->h2, a->s[S_POST], L->saved[S_POST]);
    if (norms_again && (s = lk_rms_norm_forward(op->post_norm, &again, ctx))) return s;
    /* MLP: dres is d(out) = d(mlp out), and part of d(x2) */
    if (L->moe) {
        if ((s = lk_qwen3_moe_backward(m, l, a, sc->dres, sc->dh, d_aux))) return s;
    } else {
        lk_swiglu_mlp_args f = {.x = t2(m, a->h2, T, H), .gate_up_weight = t2(m, W(L->gate_up), 2 * m->I, H),
                                .down_weight = t2(m, W(L->down), H, m->I), .out = t2(m, sc->tmp, T, H),
                                .dout = t2(m, sc->dres, T, H), .dx = t2(m, sc->dh, T, H),
                                .d_gate_up_weight = g2(m, G(L->gate_up), 2 * m->I, H),
                                .d_down_weight = g2(m, G(L->down), H, m->I),
                                .saved = sv(a->s[S_MLP], L->saved[S_MLP])};
        if ((s = lk_swiglu_mlp_backward(op->mlp, &f, ctx))) return s;
    }
    lk_rms_norm_args np = norm_args(m, a->x2, T, H, L->post, a->h2, a->s[S_POST], L->saved[S_POST]);
    np = with_stream(m, np, sc->dres, NULL);                        /* d(x2) into the stream */
    if ((s = norm_backward(m, op->post_norm, np, t2(m, sc->dh, T, H), t2(m, sc->dres, T, H), L->post))) return s;
    /* recompute_norms: h1 made again (h2 is dead now: sc.hn is free) */
    again = norm_args(m, a->x, T, H, L->in, a->h1, a->s[S_IN], L->saved[S_IN]);
    if (norms_again && (s = lk_rms_norm_forward(op->in_norm, &again, ctx))) return s;
    /* recompute_qkv: attention's inputs made again from the projection, the kept one or the
     * forward's GEMM again into sc.proj (which the norms' backward then reads as kept: the
     * forward's bits); before o_proj's backward writes dao, where dqt lies */
    const char *kept = a->qkv;
    const char *vsrc = v_source(a, kept ? kept : lk_qkv_again(m, l) ? sc->proj : NULL);
    if (lk_qkv_again(m, l)) {
        if (!kept) {
            lk_linear_args rp = lin(m, a->h1, T, H, W(L->q), QKV, sc->proj);
            if ((s = lk_linear_forward(op->q_proj, &rp, ctx))) return s;
            kept = sc->proj;
        }
        if ((s = attention_inputs(m, l, a, kept, vsrc))) return s;
    }
    /* attention */
    lk_linear_args po = lin(m, a->ao, T, Q, W(L->o), H, sc->tmp);
    if ((s = lin_backward(m, op->o_proj, po, sc->dres, L->o, sc->dao))) return s;
    lk_attention_args at = attn_args(m, l, op->attn, a, b, L->saved[S_ATTN], vsrc);
    at.dout = lk_on(m, lk_tensor_view(sc->dao, m->dt, 4, (int64_t[]){1, T, m->Hq, m->D}));
    at.dq = t4(m, sc->dqr, m->Hq, T, m->D);
    at.dk = t4(m, sc->dkr, m->Hk, T, m->D);
    at.dv = vsrc ? v_cols(m, qkv) : t4(m, sc->dvt, m->Hk, T, m->D);   /* in place: into d(qkv)'s v columns */
    ctx->comm = m->sp;
    s = lk_attention_backward(op->attn, &at, ctx);
    ctx->comm = NULL;
    if (s) return s;
    const lk_rms_norm_rope rp = norm_rope(m);
    if (!rope_in_norms(m, op)) {   /* else the norms' backward rotates dq and dk back */
        lk_rope_args r = rope_args(m, l, a);
        r.dq_out = r.dq = at.dq;                                  /* rotated back in place */
        r.dk_out = r.dk = at.dk;
        if ((s = lk_rope_backward(op->rope, &r, ctx))) return s;
    }
    /* the norms' inputs (kept in a->qkv or sc.proj, or made again from the same h1), and d(q, k, v) as
     * the column blocks of one [T, Q + 2K] dy: d(h1) in one GEMM over all three (summed in
     * f32 and rounded once), their weights' gradients in another. With views the norms read
     * q and k token-major (kept, or made by a GEMM each into dqt / dkt) and their dx lands in
     * qkv; else q and k are moved head-major into dqt / dkt (from the kept qkv, or from one
     * GEMM into qkv), dx written over dy and moved back. */
    lk_rms_norm_args nq = norm_args(m, sc->dqt, m->Hq * T, m->D, L->qn, a->qr, a->s[S_QN], L->saved[S_QN]);
    lk_rms_norm_args nk = norm_args(m, sc->dkt, m->Hk * T, m->D, L->kn, a->kr, a->s[S_KN], L->saved[S_KN]);
    if (head_views(op)) {
        if (rope_in_norms(m, op)) nq.rope = nk.rope = &rp;
        if (kept) {
            nq.x = heads_tok(m, kept, m->Hq, QKV), nk.x = heads_tok(m, kept + Q * es, m->Hk, QKV);
        } else {
            lk_linear_args rq = lin(m, a->h1, T, H, W(L->q), Q, sc->dqt);
            lk_linear_args rk = lin(m, a->h1, T, H, W(L->q + Q * H), K, sc->dkt);
            if ((s = lk_linear_forward(op->q_proj, &rq, ctx)) || (s = lk_linear_forward(op->q_proj, &rk, ctx)))
                return s;
            nq.x = heads_tok(m, sc->dqt, m->Hq, Q), nk.x = heads_tok(m, sc->dkt, m->Hk, K);
        }
        if ((s = norm_backward(m, op->q_norm, nq, heads_hm(m, sc->dqr, m->Hq), heads_tok(m, qkv, m->Hq, QKV), L->qn)) ||
            (s = norm_backward(m, op->k_norm, nk, heads_hm(m, sc->dkr, m->Hk),
                               heads_tok(m, qkv + Q * es, m->Hk, QKV), L->kn)))
            return s;
    } else {
        const char *src = kept ? kept : qkv;
        const int64_t ld = kept ? QKV : Q + K;
        lk_linear_args r2 = lin(m, a->h1, T, H, W(L->q), Q + K, qkv);
        if ((!kept && (s = lk_linear_forward(op->q_proj, &r2, ctx))) || (s = to_heads(m, src, ld, sc->dqt, m->Hq)) ||
            (s = to_heads(m, src + Q * es, ld, sc->dkt, m->Hk)) ||
            (s = norm_backward(m, op->q_norm, nq, t2(m, sc->dqr, m->Hq * T, m->D), t2(m, sc->dqr, m->Hq * T, m->D),
                               L->qn)) ||
            (s = norm_backward(m, op->k_norm, nk, t2(m, sc->dkr, m->Hk * T, m->D), t2(m, sc->dkr, m->Hk * T, m->D),
                               L->kn)) ||
            (s = from_heads(m, sc->dqr, qkv, QKV, m->Hq)) || (s = from_heads(m, sc->dkr, qkv + Q * es, QKV, m->Hk)))
            return s;
    }
    if (!vsrc && (s = from_heads(m, sc->dvt, qkv + (Q + K) * es, QKV, m->Hk))) return s;
    lk_linear_args p = lin(m, a->h1, T, H, W(L->q), QKV, NULL);
    if ((s = lin_backward(m, op->q_proj, p, qkv, L->q, sc->dh))) return s;
    lk_rms_norm_args n = norm_args(m, a->x, T, H, L->in, a->h1, a->s[S_IN], L->saved[S_IN]);
    return norm_backward(m, op->in_norm, with_stream(m, n, sc->dres, NULL), t2(m, sc->dh, T, H), t2(m, sc->dres, T, H),
                         L->in);   /* d(x) */
}
