/* eager.c — `eager` RoPE: what Hugging Face runs without fused kernels. The rotary
 * module gathers cos and sin by position id into [B, S, R] tensors (cat(freqs, freqs),
 * cast to the storage dtype), then apply_rotary_pos_emb does, for q and then k,
 *   rotate_half(x), x·cos, rotate_half(x)·sin, their sum   (and cat with x[..., R:] when
 * the rotary part is partial), each its own pass over memory into its own intermediate
 * from ctx->arena, rounded to the storage dtype as a framework tensor would be. The
 * backward is autograd's: dout·cos, dout·sin, rotate_half's backward, the sum (and
 * cat's). Like autograd it keeps the gathered cos and sin for the backward (saved).
 *
 * This is the baseline the fused kernel has to beat, and the reference implementation
 * of the catalog: it is measured and checked against, not a fast path. */
#include <omp.h>
#include "internal.h"

/* Fewer elements than this run on one thread. */
#define EAGER_PAR_MIN ((int64_t)1 << 15)

/* Element i as f32, and stored back rounded to dt; dt is f32 or bf16 here. */
static inline float ld(const void *p, lk_dtype dt, int64_t i) {
    return dt == LK_F32 ? ((const float *)p)[i] : lk_bf16_to_f32(((const uint16_t *)p)[i]);
}
static inline void st(void *p, lk_dtype dt, int64_t i, float v) {
    if (dt == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = lk_f32_to_bf16(v);
}

/* The shape of one tensor's pass: rows = B·H·S of length R taken from rows of ld_x. */
typedef struct {
    int64_t batch, heads, seq, R, D;
    lk_dtype dt;
} pass_shape;

static int64_t n_rows(const pass_shape *p) { return p->batch * p->heads * p->seq; }

/* --- the steps: each one pass ------------------------------------------------------- */

/* cos_f[b, s, :] = cat(tab[pos], tab[pos]) in dt (the module's forward, cast to x.dtype) */
static void gather(const float *tab, const lk_tensor *ids, void *out, int64_t B, int64_t S, int64_t R,
                   lk_dtype dt) {
    int64_t h = R / 2;
    #pragma omp parallel for schedule(static) if (B * S * R >= EAGER_PAR_MIN)
    for (int64_t t = 0; t < B * S; t++) {
        const float *row = tab + lk_rope_pos(ids, t / S, t % S, S) * h;
        for (int64_t j = 0; j < R; j++) st(out, dt, t * R + j, row[j % h]);
    }
}

/* out = rotate_half(x[..., :R]) = cat(−x[..., h:R], x[..., :h]); with `backward` the
 * transpose, cat(x[..., h:R], −x[..., :h]). out rows are R long, x rows ld long. */
static void rotate_half(const void *x, int64_t ldx, void *out, const pass_shape *p, int backward) {
    int64_t h = p->R / 2, rows = n_rows(p);
    float sg = backward ? -1.0f : 1.0f;
    #pragma omp parallel for schedule(static) if (rows * p->R >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        #pragma omp simd
        for (int64_t j = 0; j < h; j++) {
            st(out, p->dt, r * p->R + j, -sg * ld(x, p->dt, r * ldx + j + h));
            st(out, p->dt, r * p->R + j + h, sg * ld(x, p->dt, r * ldx + j));
        }
    }
}

/* out[b, h, s, :R] = x[b, h, s, :R] · t[b, s, :]  (t broadcast over heads) */
static void mul_bcast(const void *x, int64_t ldx, const void *t, void *out, const pass_shape *p) {
    int64_t rows = n_rows(p), R = p->R;
    #pragma omp parallel for schedule(static) if (rows * R >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t tr = (r / (p->heads * p->seq)) * p->seq + r % p->seq;
        #pragma omp simd
        for (int64_t j = 0; j < R; j++) st(out, p->dt, r * R + j, ld(x, p->dt, r * ldx + j) * ld(t, p->dt, tr * R + j));
    }
}

/* out = a + b, rows R long, written into rows ldo long (ldo = D when out is the output). */
static void add(const void *a, const void *b, void *out, int64_t ldo, const pass_shape *p) {
    int64_t rows = n_rows(p), R = p->R;
    #pragma omp parallel for schedule(static) if (rows * R >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        #pragma omp simd
        for (int64_t j = 0; j < R; j++) st(out, p->dt, r * ldo + j, ld(a, p->dt, r * R + j) + ld(b, p->dt, r * R + j));
    }
}

/* out = cat(a, x[..., R:]) along the last dim: torch.cat([x_embed, x_pass], -1). */
static void cat_pass(const void *a, const void *x, void *out, const pass_shape *p) {
    int64_t rows = n_rows(p), R = p->R, D = p->D;
    #pragma omp parallel for schedule(static) if (rows * D >= EAGER_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < R; j++) st(out, p->dt, r * D + j, ld(a, p->dt, r * R + j));
        for (int64_t j = R; j < D; j++) st(out, p->dt, r * D + j, ld(x, p->dt, r * D + j));
    }
}

/* --- the composition -------------------------------------------------------------- */

typedef struct {
    void *t1, *t2, *t3, *sum;   /* [B, Hq, S, R] each; sum only when R < D */
} scratch;

static size_t plane(const lk_rope_dims *d, int64_t heads) {
    return lk_arena_piece((size_t)(d->batch * heads * d->seq * d->rotary_dim) * lk_dtype_size(d->dtype));
}

static size_t eager_saved_bytes(const lk_rope_dims *d) {
    return 2 * lk_arena_piece((size_t)(d->batch * d->seq * d->rotary_dim) * lk_dtype_size(d->dtype));
}

static size_t eager_workspace_bytes(const lk_rope_dims *d, int backward) {
    return (d->rotary_dim < d->head_dim ? 4 : 3) * plane(d, d->q_heads);
}

static lk_status take(lk_ctx *ctx, const lk_rope_dims *d, scratch *w) {
    size_t n = plane(d, d->q_heads);
    w->t1 = lk_arena_alloc(ctx->arena, n);
    w->t2 = lk_arena_alloc(ctx->arena, n);
    w->t3 = lk_arena_alloc(ctx->arena, n);
    w->sum = d->rotary_dim < d->head_dim ? lk_arena_alloc(ctx->arena, n) : NULL;
    if (!w->t1 || !w->t2 || !w->t3 || (d->rotary_dim < d->head_dim && !w->sum))
        return lk_error(LK_EINTERNAL, "rope: eager: workspace was not reserved");
    return LK_OK;
}

/* One tensor of heads H: x → out (forward) or dout → dx (backward). */
static void apply(const void *x, void *out, const void *cs, const void *sn, const scratch *w,
                  const pass_shape *p, int backward) {
    int partial = p->R < p->D;
    void *sum = partial ? w->sum : out;
    if (!backward) {
        rotate_half(x, p->D, w->t1, p, 0);               /* rotate_half(x)          */
        mul_bcast(x, p->D, cs, w->t2, p);                /* x·cos                   */
        mul_bcast(w->t1, p->R, sn, w->t3, p);            /* rotate_half(x)·sin      */
        add(w->t2, w->t3, sum, partial ? p->R : p->D, p);
    } else {
        mul_bcast(x, p->D, cs, w->t1, p);                /* dout·cos                */
        mul_bcast(x, p->D, sn, w->t2, p);                /* dout·sin                */
        rotate_half(w->t2, p->R, w->t3, p, 1);           /* rotate_half's backward  */
        add(w->t1, w->t3, sum, partial ? p->R : p->D, p);
    }
    if (partial) cat_pass(sum, x, out, p);               /* cat(·, x[..., R:])      */
}

/* What both passes work with: the dims, the gathered cos and sin (the two halves of
 * saved), the scratch and the shapes of q's and k's passes. */
typedef struct {
    lk_rope_dims d;
    void *cs, *sn;
    scratch w;
    pass_shape pq, pk;
} pass;

static lk_status pass_begin(const lk_rope_args *a, lk_ctx *ctx, pass *p) {
    p->d = lk_rope_dims_of(a);
    const lk_rope_dims *d = &p->d;
    p->cs = a->saved.data;
    p->sn = (char *)a->saved.data + eager_saved_bytes(d) / 2;
    p->pq = (pass_shape){d->batch, d->q_heads, d->seq, d->rotary_dim, d->head_dim, d->dtype};
    p->pk = p->pq;
    p->pk.heads = d->k_heads;
    return take(ctx, d, &p->w);
}

static lk_status eager_forward(const lk_rope_args *a, lk_ctx *ctx) {
    pass p;
    lk_status s = pass_begin(a, ctx, &p);
    if (s) return s;
    gather(a->cos.data, &a->position_ids, p.cs, p.d.batch, p.d.seq, p.d.rotary_dim, p.d.dtype);
    gather(a->sin.data, &a->position_ids, p.sn, p.d.batch, p.d.seq, p.d.rotary_dim, p.d.dtype);
    apply(a->q.data, a->q_out.data, p.cs, p.sn, &p.w, &p.pq, 0);
    apply(a->k.data, a->k_out.data, p.cs, p.sn, &p.w, &p.pk, 0);
    return LK_OK;
}

static lk_status eager_backward(const lk_rope_args *a, lk_ctx *ctx) {
    pass p;
    lk_status s = pass_begin(a, ctx, &p);
    if (s) return s;
    apply(a->dq_out.data, a->dq.data, p.cs, p.sn, &p.w, &p.pq, 1);
    apply(a->dk_out.data, a->dk.data, p.cs, p.sn, &p.w, &p.pk, 1);
    return LK_OK;
}

const lk_rope_vtable lk_rope_eager_vtable = {
    .version = LK_ROPE_VTABLE_VERSION,
    .saved_bytes = eager_saved_bytes,
    .workspace_bytes = eager_workspace_bytes,
    .forward = eager_forward,
    .backward = eager_backward,
};
