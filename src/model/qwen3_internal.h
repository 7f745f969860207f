/* qwen3_internal.h — the Qwen3 / Qwen3-MoE model's private layout, shared by qwen3.c
 * (create, the step), params.c (parameters, init, checkpoints), layer.c (one decoder
 * layer's forward and backward) and moe_block.c (the MoE block). Tests include it to
 * see which implementation each module was bound to.
 *
 * Layout choices:
 *   - Parameters live in one flat f32 buffer (and grads in a twin at the same offsets);
 *     each lk_param is a view with its Hugging Face name. The ops read a compute copy
 *     at the same offsets in the model's dtype (lk_model_set_dtype): the f32 buffer
 *     itself, or its bf16 rounding refreshed at the start of every forward (the norms read
 *     the f32 master itself, and write f32 dweights: issue 17's parity, rms_norm.h); the
 *     activations are of that dtype, the gradients f32 (mixed precision; bf16 with
 *     lk_model_set_grad_dtype, train.main_grads_dtype). gate_proj/up_proj of a layer
 *     are adjacent, so together they are the swiglu_mlp op's gate_up [2I, H]; a MoE
 *     layer's experts are stacked [E, 2I, H] and [E, H, I] for the experts op, and the
 *     per-expert HF tensors are views into those stacks.
 *   - Attention runs over the flattened B*S tokens as one row (B = 1) with the batch's
 *     cu_seqlens (flex_attention: a document BlockMask built from them per batch), so
 *     packed documents never see each other; q/k/v are transposed from the
 *     projections' token-major [T, H*D] into the op's [1, H, T, D].
 *   - The embedding is a gather (its backward a scatter-add) in plain C: the family's
 *     "embed_tokens" module is declared for completeness but no op runs it.
 *   - The residual stream is carried in f32 whatever the dtype (issue 17: autocast's
 *     scheme, without its f32 copy per layer): ONE f32 buffer (sc.res) holds the running
 *     sum through the forward (the embedding gathered from the f32 master, then each
 *     branch's output added by the next norm, rms_norm's residual mode), and the
 *     residual gradient through the backward (each norm's dx added in f32). What a
 *     layer keeps is as before, in the model's dtype: x and x2 are the stream rounded,
 *     written by the norm that reads them; the backward's GEMMs read the gradient's
 *     rounding (sc.dres). The norms normalize the f32 stream itself, as autocast's do
 *     (issue 17), and keep its rounding x for their backward. A recompute restarts from
 *     the kept x and x2 and so can only normalize the rounded values: with recompute the
 *     layers' residual-mode norms normalize the rounded stream already in the first
 *     forward (norm_of_x, rms_norm.h), so the recompute runs the plain norms on the
 *     kept x and x2 to the bits the first forward computed — the h1 and h2 its GEMMs,
 *     the MoE router and the backward saw — and recompute stays bit-identical with the
 *     model that keeps its activations and sets norm_of_x. The other design, the stream
 *     kept per layer in f32 for the recompute, costs twice the kept bytes the recompute
 *     is there to save; a recompute that normalized x while the first forward had
 *     normalized the stream would route MoE tokens and differentiate other h1/h2 than
 *     the forward used. The final norm is never recomputed: it reads the stream
 *     always. x2 cannot be made again from x without the stream, so with recompute it
 *     is kept per layer (x2s) outside the shared block. In f32 x is the stream and
 *     every sum the f32 add of before: the bits of the old scheme, recompute or not.
 *   - With lk_model_set_fp32_residual off (a bf16 model; Megatron's fp32_residual_connection
 *     False, and what transformers' bf16 model carries) the stream is bf16 and IS x and
 *     x2: no sc.res; each residual-mode norm reads the previous value where it lies (the
 *     layer before's x2, or x), adds its delta in f32 and writes the rounding as x or x2
 *     (rms_norm.h's stream in x's dtype), so a recompute from the kept x and x2 is exact
 *     without norm_of_x; the backward's gradient stream is dres itself, each norm's dx added
 *     into it in place (dres = round(dres + dx)), and the final norm's dx its start. Six
 *     bytes an element less each way at each of a layer's two residual norms. */
#ifndef LLMKERN_MODEL_QWEN3_INTERNAL_H
#define LLMKERN_MODEL_QWEN3_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "llmkern/llmkern.h"
#include "llmkern/hf_config.h"
#include "llmkern/model.h"
#include "model/device.h"
#include "ops/attention/flex_plan.h"

#define LK_STAGE_SLOTS 2   /* the pinned slots a step's host side stages into (lk_model_set_stage_slot) */

/* A BlockMask the model makes each step for flex_attention (doc_mask.c); on a GPU staged
 * (flex_plan.h): the image's layout and program, LK_STAGE_SLOTS pinned images, the device's
 * copy with the bits after it. */
typedef struct {
    lk_block_mask mask;
    lk_flex_image img;
    lk_flex_prog prog;
    int32_t *host;
    void *dev;
} lk_staged_mask;

/* The implementations one layer calls, resolved from the op table once at create. */
typedef struct {
    const lk_impl *in_norm, *q_norm, *k_norm, *post_norm, *rope, *attn;
    const lk_impl *q_proj, *k_proj, *v_proj, *o_proj;
    const lk_impl *mlp;                 /* dense layers */
    const lk_impl *router, *experts;    /* MoE layers */
} lk_layer_ops;

enum { S_IN, S_QN, S_KN, S_ROPE, S_ATTN, S_POST, S_MLP, S_ROUTER, S_EXPERTS, S_COUNT };

typedef struct {
    int moe;
    /* offsets (in floats) into the model's value and grad buffers */
    int64_t in, q, k, v, o, qn, kn, post;
    int64_t first;           /* the lowest offset of the layer's tensors */
    int64_t gate_up, down;   /* dense: [2I, H], [H, I]; MoE: [E, 2I, H], [E, H, I] */
    int64_t router;          /* MoE: [E, H] */
    lk_layer_ops ops;
    size_t saved[S_COUNT];   /* each op's saved bytes for the current token count */
} lk_layer;

/* One layer's activations: what its backward reads (x is the layer input, kept apart
 * in the model's inputs array; with recompute x2 too, in x2s; with recompute_norms h1 and h2
 * are the scratch sc.hn, made again from x and x2 by the backward, with recompute_moe the
 * experts' saved block sc.experts, made again by their forward, with recompute_qkv attention's
 * inputs qr, kr, vt the scratch's, made again from the projection). qkv is the q/k/v
 * projection's [T, Q + 2K] output, kept only with lk_model_set_keep_qk (else NULL: the
 * forward writes it to the scratch and the backward makes q and k again). vt is NULL where
 * attention reads v in the projection's columns (lk_qwen3_v_in_place). */
typedef struct {
    void *x, *h1, *vt, *qr, *kr, *ao, *x2, *h2, *qkv;   /* the model's dtype */
    int32_t *ids;
    float *tw;
    void *s[S_COUNT];
} lk_layer_acts;

/* Per-step buffers that are not kept between the passes; of the model's dtype but res
 * and dtw. The loss's saved block (m->s_ce) lies over all of them but dh and res: it lives
 * from the loss's forward to its backward, when none of them does, and that backward writes
 * dh (res, the stream, holds the last forward's until the final norm's backward: kept apart,
 * so a forward alone leaves it to be read).
 * Some share memory (alloc_acts in qwen3.c): tmp is dres (the forward's
 * deltas are dead by the backward, and a recompute writes neither: it skips o_proj and
 * asks the MLP for its saved block alone), and dh2 lies in dao when Hq·D >= H (dao is
 * dead by the time the router's d_hidden is made). q and k before their norms (dqt, dkt)
 * live from their head move to their norm: in the forward, before the MLP writes
 * anything; in the backward, after attention has read dao and the post-norm dh, and
 * before q_proj's backward writes dh again, or (recompute_qkv's eager norms) after the
 * post-norm's backward has read dh and before o_proj's writes dao. So dqt lies in dao, and dkt
 * in dh when Hk·D <= H (bench/NOTES.md, seventeenth session: 0.19 GiB of a dense step). */
typedef struct {
    void *qkv;                   /* [T, Q + 2K]: the q, k, v projections as column blocks (forward), their
                                  * grads (backward); [T, Q + K] for the backward's q, k again */
    void *tmp;                   /* [T, H]: o_proj / MLP output (the delta the next norm adds) */
    float *res;                  /* [T, H] f32: the residual stream (forward), its gradient (backward);
                                  * NULL when the stream is bf16 (lk_stream_in_x) */
    void *dres, *dh, *dh2;       /* [T, H]: dres the rounding of res's gradient (the GEMMs' dy) */
    void *dao;                   /* [T, Hq*D] */
    void *dqr, *dkr, *dvt;       /* head-major grads; dvt NULL where no layer moves v (lk_qwen3_v_in_place) */
    void *dqt, *dkt;             /* q and k before their norms (head-major): made again in the backward */
    float *dtw;                  /* [T, k] f32 */
    float *dw;                   /* [max(H, D)] f32: a norm's written dweight before it is added */
    void *hn;                    /* [T, H] with recompute_norms (else NULL): those layers' h1, then h2, in the
                                  * forward; made again in the backward, h2 then h1 */
    void *experts;               /* with recompute_moe (else NULL): those MoE layers' experts' saved block, as
                                  * the forward leaves it and as the backward makes it again */
    void *proj;                  /* [T, Q + 2K] with recompute_qkv and no keep_qk (else NULL): the q/k/v
                                  * projection made again, read by the backward as a kept one */
    void *qr, *kr, *vt;          /* with recompute_qkv (else NULL): those layers' attention inputs (a's qr,
                                  * kr, vt), made by the forward and again by the backward; vt only where
                                  * one of them moves v (lk_qwen3_v_in_place) */
} lk_scratch;

struct lk_model {
    lk_qwen3_config cfg;
    int recompute;       /* the first `recompute` layers are made again in the backward (lk_model_set_recompute_layers:
                          * Megatron's block method; create's flag: all) */
    int keep_qk;         /* lk_model_set_keep_qk: each layer keeps its q/k/v projection (acts.qkv) */
    int recompute_norms; /* lk_model_set_recompute_norms: the first n layers make h1 and h2 again (sc.hn) */
    int recompute_moe;   /* lk_model_set_recompute_moe: the first n layers make their experts' saved block
                          * again (sc.experts) */
    int recompute_qkv;   /* lk_model_set_recompute_qkv: the first n layers make attention's inputs again
                          * (sc.qr, sc.kr, sc.vt) from the projection (kept, or sc.proj) */
    size_t ce_chunk_bytes;   /* lk_model_set_lm_head_chunk_bytes (0: the op's default) */
    int norm_of_x;       /* the layers' residual-mode norms normalize the rounded stream x (rms_norm.h's
                          * norm_of_x): set with recompute or recompute_norms, what a recompute from the
                          * kept x runs (in every layer: one rule for the stream) */
    int deterministic;   /* attention's ordered backward (lk_model_set_deterministic) */
    int fp32_residual;   /* lk_model_set_fp32_residual: the residual stream in f32 (1, the default), or
                          * in the model's dtype (0: a bf16 model's stream is x and x2 themselves) */
    int64_t H, Hq, Hk, D, I, V, E, K, Ie;    /* sizes; K = experts per token, Ie = moe_intermediate */
    int n_moe_layers;

    const lk_model_device *dev;   /* where w, g, the tables and the activations live (device.h) */
    float *w;                     /* all parameter values (the f32 master; NULL under a bf16 master, where
                                   * wc holds them) */
    void *g;                      /* all gradients, at the values' offsets, of gdt (lk_gc) */
    lk_dtype gdt;                 /* f32, or bf16 (lk_model_set_grad_dtype) */
    size_t gs;                    /* its bytes */
    int64_t n_floats;             /* elements of the flat buffers (the name is from when all were f32) */
    int experts_unwritten;        /* after lk_model_zero_grad: the experts' gradients hold nothing yet; the
                                   * next backward writes them (moe.h's write_weight_grads) */
    lk_dtype dt;                  /* the compute dtype: the activations' and wc's (f32 or bf16) */
    size_t es;                    /* its bytes */
    void *wc;                     /* the weights the ops read: w itself in f32, else its rounding (or,
                                   * lk_model_set_master_dtype bf16, the values themselves) */
    int copy_current;             /* lk_model_copy_is_current: the next forward need not round w into wc */
    int64_t embed, final_norm, lm_head;      /* offsets; lm_head = embed when tied */
    lk_param *params;
    int n_params;

    lk_layer *layers;
    const lk_impl *final_norm_impl, *ce_impl;
    const lk_impl *dispatch;      /* moe_dispatch: runs the experts when ep > 1 */
    lk_router_options router;     /* every MoE layer's router options (the op table's) */

    /* Sequence and expert parallelism (lk_model_set_parallel; NULL = one process). The
     * model is handed the whole batch; an SP rank runs the tokens [sp_rank·T, +T) of it
     * (local: the batch with its per-token arrays moved there; cu_seqlens stay whole). */
    lk_comm *sp, *ep;
    lk_batch local;
    /* The step's per-token arrays where the ops read them: m->local's own on the CPU, on
     * a GPU their copies in dev_tokens ([3, T] i64: ids, labels, positions). */
    const int64_t *ids, *labels, *pos;
    int64_t *dev_tokens;
    /* On a GPU, the step's host side in pinned memory: the token arrays (copied to
     * dev_tokens on the stream, so a CUDA graph's copy reads what the host staged) and the
     * cu_seqlens the attention reads (cu points there; on the CPU at the batch's own). */
    int64_t *stage;               /* two slots of [3, T] i64, then [T + 1] i32 */
    int stage_slot;               /* the one staged and copied from (lk_model_set_stage_slot) */
    const int32_t *cu;
    int defer_stats;              /* lk_model_defer_stats: the forward reads no scalar back */
    float *scal;                  /* device scalars: loss, d_loss, aux loss (f32), then n_valid (i64) */
    int flex;                     /* an attention binding is flex_attention: masks[] serve it */
    /* masks[0] the current batch's documents, causal, over all B*S tokens; masks[1] the same
     * within the sliding window, when a flex layer slides (the AND of masks[0] and window) */
    lk_staged_mask masks[2];
    lk_block_mask window;
    float d_loss_put;             /* the d_loss scal[1] holds (NaN: none yet) */
    void (*grads_ready)(void *user, int64_t first);   /* lk_model_on_grads_ready */
    void *grads_ready_user;

    float *rope_cos, *rope_sin;   /* [max_pos, D/2] */
    int64_t max_pos;

    /* activations for the current token count T */
    int64_t T;
    void *act_block, *scratch_block;
    lk_layer_acts *acts;          /* per layer; the recomputed ones share one block */
    void **inputs;                /* [N + 1]: layer inputs, inputs[N] the last layer's output */
    void **x2s;                   /* with recompute, [N]: each recomputed layer's x2 (the stream after attention) */
    void *hf;                     /* final norm output */
    void *s_final, *s_ce;
    size_t s_final_bytes, s_ce_bytes;
    unsigned char *shared;        /* with recompute: the one layer block every recomputed layer uses */
    lk_scratch sc;
    size_t activation_bytes;

    lk_arena arena;
    lk_ctx ctx;
};

/* params.c */
lk_status lk_qwen3_params_init(lk_model *m, uint64_t seed);
/* layer.c: the pass of layer l over acts a (carved for l). first: the step's forward,
 * which adds sc.tmp (the previous layer's MLP output; layer 0: nothing) and its
 * attention output into the stream sc.res, writes a->x and a->x2, and leaves its MLP
 * output in sc.tmp for the next norm; else a recompute from the kept x and x2. add_aux:
 * a MoE layer adds its router's aux loss into scal[3]. */
lk_status lk_qwen3_layer_forward(lk_model *m, int l, const lk_layer_acts *a, const lk_batch *b, int first,
                                 int add_aux);
/* sc.res in: d(layer output) in f32, sc.dres its rounding; out: d(layer input), both. */
lk_status lk_qwen3_layer_backward(lk_model *m, int l, const lk_layer_acts *a, const lk_batch *b, float d_aux);
/* Bytes of layer l's activation block; carves it into a when base is not NULL. */
size_t lk_qwen3_layer_carve(const lk_model *m, int l, void *base, lk_layer_acts *a);
/* moe_block.c */
lk_status lk_qwen3_moe_forward(lk_model *m, int l, const lk_layer_acts *a, void *out, int add_aux);
lk_status lk_qwen3_moe_backward(lk_model *m, int l, const lk_layer_acts *a, const void *dout, void *dx,
                                float d_aux);
/* The saved-bytes queries of a MoE block for T tokens. */
lk_status lk_qwen3_moe_saved(const lk_model *m, int l, int64_t T, size_t *router, size_t *experts);

/* doc_mask.c: flex_attention's masks, built and (on a GPU) staged in stage_batch, copied
 * and attached in the forward; the buffers freed with the activations, the masks with
 * the model (lk_qwen3_doc_mask_free(m, 1)). */
lk_status lk_qwen3_doc_mask_stage(lk_model *m, const lk_batch *whole);
lk_status lk_qwen3_doc_mask_put(lk_model *m);
void lk_qwen3_doc_mask_free(lk_model *m, int masks_too);

/* params.c: every value moved to a master of dt (f32 or bf16, the model's dtype), rounded
 * to nearest even or widened exactly; the lk_param views follow (lk_model_set_master_dtype). */
lk_status lk_qwen3_params_move_master(lk_model *m, lk_dtype dt);
/* params.c: the gradients in a new zeroed buffer of dt (f32 or bf16); the views follow
 * (lk_model_set_grad_dtype). */
lk_status lk_qwen3_params_move_grads(lk_model *m, lk_dtype dt);

/* The residual stream is the model's bf16 activations themselves, not sc.res (qwen3_internal.h's
 * lk_model_set_fp32_residual off in a bf16 model). */
static inline int lk_stream_in_x(const lk_model *m) { return !m->fp32_residual && m->dt != LK_F32; }

/* Layer l is made again in the backward (its activations in the shared block, x2 in x2s). */
static inline int lk_recomputed(const lk_model *m, int l) { return l < m->recompute; }
/* Layer l keeps neither norm's output (sc.hn), or no experts' saved block (sc.experts): the
 * backward makes them again. Not in a recomputed layer, which makes everything again; not
 * under EP, whose dispatcher keeps nothing. */
static inline int lk_norms_again(const lk_model *m, int l) { return l < m->recompute_norms && !lk_recomputed(m, l); }
static inline int lk_moe_again(const lk_model *m, int l) {
    return l < m->recompute_moe && m->layers[l].moe && !m->ep && !lk_recomputed(m, l);
}
/* Layer l keeps no q, k, v after their norms and RoPE (attention's inputs, sc.qr/kr/vt): the
 * backward makes them again from the projection, the kept one or one GEMM into sc.proj. */
static inline int lk_qkv_again(const lk_model *m, int l) { return l < m->recompute_qkv && !lk_recomputed(m, l); }

/* Attention reads layer l's v in the projection's own columns and writes dv into its
 * gradient's (no head-major a->vt, sc.vt, sc.dvt), where its row takes the views
 * (lk_attention_takes_views: flash_attention_3 on a Hopper, bf16) and the projection lasts
 * until the backward (keep_qk, or made again by recompute_qkv); not under Ulysses, whose
 * exchange packs contiguous heads. Asked when the activations are laid out, before any
 * buffer exists: the answer is the same at every base the carve gives (64-byte aligned), and
 * what it rests on (dtype, sp, keep_qk, the recompute counts, deterministic) lays them out
 * again when it changes. layer.c. */
int lk_qwen3_v_in_place(const lk_model *m, int l);

/* The compute copy of the weights at offset off (in elements, the master's offsets). */
static inline void *lk_wc(const lk_model *m, int64_t off) { return (char *)m->wc + (size_t)off * m->es; }

/* The gradient at offset off (in elements, the master's offsets), of m->gdt. */
static inline void *lk_gc(const lk_model *m, int64_t off) { return (char *)m->g + (size_t)off * m->gs; }

/* t placed on the model's device (the ops check where their tensors live). */
static inline lk_tensor lk_on(const lk_model *m, lk_tensor t) {
    t.device = m->ctx.device;
    return t;
}

/* The n values at off as the norms and the embedding read them: the f32 master, or under
 * a bf16 master the bf16 values (a norm then writes its dweight in bf16: rms_norm.h). */
static inline lk_tensor lk_master_1d(const lk_model *m, int64_t off, int64_t n) {
    return lk_on(m, m->w ? lk_tensor_1d(m->w + off, LK_F32, n) : lk_tensor_1d(lk_wc(m, off), m->dt, n));
}

static inline size_t lk_align64(size_t n) { return (n + 63) & ~(size_t)63; }
/* Hands out 64-byte aligned pieces of base (or only counts them when base is NULL). */
static inline void *lk_carve(unsigned char *base, size_t *used, size_t bytes) {
    size_t off = lk_align64(*used);
    *used = off + bytes;
    return base ? base + off : NULL;
}

#endif
