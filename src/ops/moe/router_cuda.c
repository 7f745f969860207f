/* router_cuda.c — the learned MoE routers on CUDA, `softmax_topk` (Qwen3-MoE) and
 * `sigmoid_bias` (DeepSeek-V3): the CPU softmax_topk.c's and sigmoid_bias.c's math and
 * their saved layout (router_core.h: p or s [T, E] f32, then ids [T, k] i32), with the
 * GEMMs on cuBLASLt (f32 accumulation) and the rest in router.cu's and sigmoid_bias.cu's
 * kernels. The two rows differ only in the per-token kernel and the last step of d_logits.
 *
 *   forward   z [T, E] f32 = hidden · gate_weightᵀ (rounded to bf16 in the next kernel
 *             unless gate_f32, as the CPU rounds); a warp a token: softmax (or sigmoid,
 *             e_bias and the group limit), top-k (ties to the lower index), weights; the
 *             aux loss from integer expert counts and per-block f64 partials into the
 *             device's aux_loss, no float atomics, so it repeats bit for bit.
 *   backward  a warp a token: d_logits dz [T, E] f32 from the saved p (s) and ids;
 *             d_gate_weight += dzᵀ · hidden (beta 1 into f32; into bf16 through an f32
 *             product added and rounded once); d_hidden = dz · gate_weight, written.
 *
 * Precision: f32 math throughout, as on the CPU. cuBLASLt takes one operand dtype, so a
 * bf16 operand meeting an f32 one (bf16 hidden with an f32 gate) is widened to f32 in the
 * workspace first: exact. The backward of bf16 hidden and gate (the trainer's) keeps the
 * GEMMs on bf16 tensor cores instead: dz goes in as two bf16 parts, hi + lo (dz to 2^-17
 * of it; the products of bf16 operands are exact in the f32 accumulators), so d_gate_weight
 * is two GEMMs over T and d_hidden one over K = 2E with the gate stacked twice. Widening
 * hidden and running the f32 GEMMs on CUDA cores took 3.6 ms of e2e_peers' MoE step (16
 * layers; bench/NOTES.md, twentieth session). Other dtypes widen as the forward does.
 *
 * Over a sequence-parallel group (ctx->comm, an NCCL communicator: device buffers) the aux
 * loss is the group's, as router_core.c's lk_router_group_sum makes it on the CPU: each
 * rank's expert counts, score sums and T go into one f64 vector, summed over the group by
 * an all-reduce queued on the stream (lk_comm_all_reduce_on), and the loss (forward) or
 * its per-expert gradient (backward, the counts and T) is made from the sums on the
 * device. A group of one takes the same path. No call reads device memory on the host or
 * synchronizes: forward and backward can be captured in a CUDA graph
 * (tests/cuda/test_moe_router.c does). Reached through lk_moe_router_forward / _backward (router.c), which validated
 * every argument; workspace from ctx->arena (a device arena). */
#include "core/cublaslt_util.h"
#include "llmkern/comm.h"
#include "ops/moe/cuda_router.h"
#include "ops/moe/router_core.h"

static const char *who(lk_router_kind kind) {
    return kind == LK_ROUTER_SIGMOID ? "moe_router: sigmoid_bias (cuda)" : "moe_router: softmax_topk (cuda)";
}

static int n_groups(const lk_moe_router_args *a, lk_router_kind kind) {
    return kind == LK_ROUTER_SIGMOID && a->n_group > 1 ? a->n_group : 0;
}

static lk_router_cuda_dims dims_of(const lk_moe_router_args *a, lk_router_kind kind) {
    return (lk_router_cuda_dims){
        .t = a->hidden.shape[0], .e = lk_router_experts(a), .k = a->top_k,
        .norm = a->norm_topk_prob || a->softmax_after_topk,
        .round_bf16 = !a->gate_f32 && a->hidden.dtype != LK_F32,
        .scale = a->route_scale > 0 ? a->route_scale : 1.0f,
        .sigmoid = kind == LK_ROUTER_SIGMOID,
    };
}

static int mixed(const lk_moe_router_args *a) { return a->hidden.dtype != a->gate_weight.dtype; }
static int want_dgw(const lk_moe_router_args *a) { return a->d_gate_weight.data != NULL; }
/* The backward's GEMMs on bf16 tensor cores, dz in two bf16 parts (the opening's precision). */
static int split(const lk_moe_router_args *a) {
    return a->hidden.dtype == LK_BF16 && a->gate_weight.dtype == LK_BF16;
}

/* forward: z, hidden widened (mixed dtypes), sigmoid_bias's group scores and flags, and
 * for the aux loss the scores' row sums, the counts and the partials. backward: dz,
 * counts (d_aux_loss != 0), an f32 [T, H] buffer for bf16 hidden (hidden widened, then
 * d_hidden before rounding), the gate weight widened (bf16) and the f32 weight-gradient
 * product (bf16 d_gate_weight). */
static size_t workspace_bytes(const lk_moe_router_args *a, int backward, lk_router_kind kind) {
    lk_router_cuda_dims d = dims_of(a, kind);
    size_t T = (size_t)d.t, E = (size_t)d.e, H = (size_t)a->hidden.shape[1], n = LK_LT_WORKSPACE_BYTES;
    n += lk_arena_piece(T * E * 4) + lk_arena_piece(E * 4);
    if (!backward) {
        if (mixed(a)) n += lk_arena_piece(T * H * 4);
        if (n_groups(a, kind))
            n += lk_arena_piece(T * (size_t)n_groups(a, kind) * 4) + lk_arena_piece(T * (size_t)n_groups(a, kind));
        if (a->aux_loss.data)
            n += lk_arena_piece(T * 4) + lk_arena_piece(sizeof(double) * (size_t)lk_router_cuda_aux_scratch(d.t, d.e)) +
                 lk_arena_piece(8 * (2 * E + 1));
        return n;
    }
    n += lk_arena_piece(8 * (E + 1));   /* the counts and T for a group's sum */
    if (want_dgw(a) && a->d_gate_weight.dtype != LK_F32) n += lk_arena_piece(E * H * 4);
    /* dz2 [T, 2E], the gate twice [2E, H] */
    if (split(a)) return n + lk_arena_piece(T * E * 4) + lk_arena_piece(E * H * 4);
    if (a->hidden.dtype != LK_F32) n += lk_arena_piece(T * H * 4);
    if (a->gate_weight.dtype != LK_F32) n += lk_arena_piece(E * H * 4);
    return n;
}

/* A group's sums run on the stream: NCCL's queued all-reduce (comm.h, version 5). */
static lk_status check_group(const lk_ctx *ctx, lk_router_kind kind) {
    const lk_comm *c = ctx->comm;
    if (c == NULL) return LK_OK;
    lk_status s = lk_comm_check(who(kind), "ctx.comm", c);
    if (s) return s;
    if (c->version < 5 || !c->all_reduce_on)
        return lk_error(LK_EINVAL, "%s: ctx.comm: expected an NCCL group (the aux loss's sums are all-reduced on the "
                        "GPU's stream), got a '%s' communicator of %d rank(s)", who(kind),
                        c->backend ? c->backend : "?", c->size);
    return LK_OK;
}

static lk_status nomem(lk_router_kind kind) {
    return lk_error(LK_ENOMEM, "%s: arena: expected the reserved workspace, got too little", who(kind));
}

typedef struct {
    int dev;
    void *stream, *ws;
} gemm_ctx;

/* C[m, n] (c_dt) = beta·C + op(A)·op(B), row-major, packed, operands in dt. */
static lk_status gemm(const gemm_ctx *g, int ta, int tb, int64_t m, int64_t n, int64_t k, lk_dtype dt, const void *a,
                      const void *b, float beta, lk_dtype c_dt, void *c) {
    lk_lt_gemm_args x = {.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .ab_dt = dt, .a = a,
                         .lda = ta ? m : k, .b = b, .ldb = tb ? k : n, .alpha = 1.0f, .beta = beta,
                         .c_dt = c_dt, .c = c, .ldc = n};
    return lk_lt_gemm(g->dev, g->stream, g->ws, LK_LT_WORKSPACE_BYTES, &x);
}

/* z = hidden · gate_weightᵀ in f32; a bf16 hidden meeting an f32 gate is widened first. */
static lk_status logits(const lk_moe_router_args *a, const gemm_ctx *g, float *z, float *x32) {
    int64_t T = a->hidden.shape[0], H = a->hidden.shape[1], E = lk_router_experts(a);
    const void *x = a->hidden.data;
    lk_dtype dt = a->gate_weight.dtype;
    if (mixed(a)) {
        lk_status s = lk_router_cuda_convert(T * H, a->hidden.dtype, x, LK_F32, x32, 0, g->stream);
        if (s) return s;
        x = x32;
    }
    return gemm(g, 0, 1, T, E, H, dt, x, a->gate_weight.data, 0.0f, LK_F32, z);
}

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_kind kind) {
    lk_status s = check_group(ctx, kind);
    if (s) return s;
    lk_router_cuda_dims d = dims_of(a, kind);
    int64_t H = a->hidden.shape[1];
    lk_arena *ar = ctx->arena;
    gemm_ctx g = {ctx->device.index, ctx->stream, lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES)};
    float *z = lk_arena_alloc(ar, sizeof(float) * (size_t)(d.t * d.e));
    int32_t *counts = lk_arena_alloc(ar, sizeof(int32_t) * (size_t)d.e);
    float *x32 = mixed(a) ? lk_arena_alloc(ar, sizeof(float) * (size_t)(d.t * H)) : NULL;
    int aux = a->aux_loss.data != NULL;
    float *vsum = aux ? lk_arena_alloc(ar, sizeof(float) * (size_t)d.t) : NULL;
    double *part = aux ? lk_arena_alloc(ar, sizeof(double) * (size_t)lk_router_cuda_aux_scratch(d.t, d.e)) : NULL;
    int ng = n_groups(a, kind);
    lk_router_cuda_groups gr = {.bias = a->e_bias.data, .n_group = ng, .topk_group = a->topk_group,
                                .gscore = ng ? lk_arena_alloc(ar, sizeof(float) * (size_t)(d.t * ng)) : NULL,
                                .keep = ng ? lk_arena_alloc(ar, (size_t)(d.t * ng)) : NULL};
    if (!g.ws || !z || !counts || (mixed(a) && !x32) || (aux && (!vsum || !part)) || (ng && (!gr.gscore || !gr.keep)))
        return nomem(kind);
    float *v = lk_router_saved_v(a);
    int32_t *ids = lk_router_saved_ids(a);
    if ((s = logits(a, &g, z, x32))) return s;
    s = kind == LK_ROUTER_SIGMOID
            ? lk_router_cuda_sigmoid_bias(&d, &gr, z, v, ids, a->topk_ids.data, a->topk_weights.data, vsum, ctx->stream)
            : lk_router_cuda_softmax_topk(&d, z, v, ids, a->topk_ids.data, a->topk_weights.data, vsum, ctx->stream);
    if (s) return s;
    if (!aux) return LK_OK;
    if ((s = lk_router_cuda_count(ids, d.t * d.k, d.e, counts, ctx->stream))) return s;
    if (!ctx->comm) return lk_router_cuda_aux(&d, v, vsum, counts, part, a->aux_loss.data, ctx->stream);
    double *sums = lk_arena_alloc(ar, sizeof(double) * (size_t)(2 * d.e + 1));
    if (!sums) return nomem(kind);
    if ((s = lk_router_cuda_aux_sums(&d, v, vsum, counts, part, sums, ctx->stream)) ||
        (s = lk_comm_all_reduce_on(ctx->comm, sums, 2 * d.e + 1, LK_COMM_F64, ctx->stream)))
        return s;
    return lk_router_cuda_aux_from_sums(&d, sums, a->aux_loss.data, ctx->stream);
}

/* out [m, n] (dtype odt) = op(dz)·b, or += when acc, in f32: b (nb elements of bdt)
 * widened into b32 when not f32, the product through tmp when out is not f32 (added and
 * rounded once). */
static lk_status f32_gemm(const gemm_ctx *g, int ta, int64_t m, int64_t n, int64_t k, const float *dz, const void *b,
                          lk_dtype bdt, int64_t nb, float *b32, void *out, lk_dtype odt, int acc, float *tmp) {
    lk_status s;
    if (bdt != LK_F32) {
        if ((s = lk_router_cuda_convert(nb, bdt, b, LK_F32, b32, 0, g->stream))) return s;
        b = b32;
    }
    if (odt == LK_F32) return gemm(g, ta, 0, m, n, k, LK_F32, dz, b, acc ? 1.0f : 0.0f, LK_F32, out);
    if ((s = gemm(g, ta, 0, m, n, k, LK_F32, dz, b, 0.0f, LK_F32, tmp))) return s;
    return lk_router_cuda_convert(m * n, LK_F32, tmp, odt, out, acc, g->stream);
}

/* d_gate_weight += dzᵀ · hidden (hidden widened into x32 when bf16). */
static lk_status d_gate_weight(const lk_moe_router_args *a, const gemm_ctx *g, const float *dz, float *x32,
                               float *acc) {
    int64_t T = a->hidden.shape[0], H = a->hidden.shape[1], E = lk_router_experts(a);
    return f32_gemm(g, 1, E, H, T, dz, a->hidden.data, a->hidden.dtype, T * H, x32, a->d_gate_weight.data,
                    a->d_gate_weight.dtype, 1, acc);
}

/* d_hidden = dz · gate_weight (the gate widened into w32 when bf16, the product through
 * x32). Runs after d_gate_weight, whose widened hidden x32 it overwrites. */
static lk_status d_hidden(const lk_moe_router_args *a, const gemm_ctx *g, const float *dz, float *x32, float *w32) {
    int64_t T = a->hidden.shape[0], H = a->hidden.shape[1], E = lk_router_experts(a);
    return f32_gemm(g, 0, T, H, E, dz, a->gate_weight.data, a->gate_weight.dtype, E * H, w32, a->d_hidden.data,
                    a->hidden.dtype, 0, x32);
}

/* bf16 hidden and gate: dz into dz2 [T, 2E] = hi | lo (bf16), then d_gate_weight (+)= hiᵀ·x
 * + loᵀ·x (f32 out, or through acc for a bf16 one, added and rounded once) and d_hidden =
 * dz2 · [gate; gate] (K = 2E, rounded once). */
static lk_status backward_split(const lk_moe_router_args *a, lk_router_kind kind, const gemm_ctx *g, const float *dz,
                                float *acc, lk_arena *ar) {
    int64_t T = a->hidden.shape[0], H = a->hidden.shape[1], E = lk_router_experts(a);
    uint16_t *dz2 = lk_arena_alloc(ar, sizeof(uint16_t) * (size_t)(T * 2 * E));
    uint16_t *w2 = lk_arena_alloc(ar, sizeof(uint16_t) * (size_t)(2 * E * H));
    if (!dz2 || !w2) return nomem(kind);
    lk_status s = lk_router_cuda_split_bf16(T, E, dz, dz2, g->stream);
    if (s) return s;
    if (want_dgw(a)) {
        int f32 = a->d_gate_weight.dtype == LK_F32;
        float *out = f32 ? a->d_gate_weight.data : acc;
        for (int part = 0; part < 2; part++) {
            lk_lt_gemm_args x = {.trans_a = 1, .m = E, .n = H, .k = T, .ab_dt = LK_BF16, .a = dz2 + part * E,
                                 .lda = 2 * E, .b = a->hidden.data, .ldb = H, .alpha = 1.0f,
                                 .beta = f32 || part ? 1.0f : 0.0f, .c_dt = LK_F32, .c = out, .ldc = H};
            if ((s = lk_lt_gemm(g->dev, g->stream, g->ws, LK_LT_WORKSPACE_BYTES, &x))) return s;
        }
        if (!f32 && (s = lk_router_cuda_convert(E * H, LK_F32, acc, a->d_gate_weight.dtype, a->d_gate_weight.data, 1,
                                                g->stream)))
            return s;
    }
    for (int part = 0; part < 2; part++)
        if ((s = lk_router_cuda_convert(E * H, LK_BF16, a->gate_weight.data, LK_BF16, w2 + part * E * H, 0,
                                        g->stream)))
            return s;
    return gemm(g, 0, 0, T, H, 2 * E, LK_BF16, dz2, w2, 0.0f, LK_BF16, a->d_hidden.data);
}

static lk_status backward(const lk_moe_router_args *a, lk_ctx *ctx, lk_router_kind kind) {
    lk_status s = check_group(ctx, kind);
    if (s) return s;
    lk_router_cuda_dims d = dims_of(a, kind);
    size_t TH = (size_t)(d.t * a->hidden.shape[1]), EH = (size_t)(d.e * a->hidden.shape[1]);
    int bf_x = !split(a) && a->hidden.dtype != LK_F32, bf_w = !split(a) && a->gate_weight.dtype != LK_F32;
    int bf_g = want_dgw(a) && a->d_gate_weight.dtype != LK_F32;
    lk_arena *ar = ctx->arena;
    gemm_ctx g = {ctx->device.index, ctx->stream, lk_arena_alloc(ar, LK_LT_WORKSPACE_BYTES)};
    float *dz = lk_arena_alloc(ar, sizeof(float) * (size_t)(d.t * d.e));
    int32_t *counts = lk_arena_alloc(ar, sizeof(int32_t) * (size_t)d.e);
    double *group = ctx->comm ? lk_arena_alloc(ar, sizeof(double) * (size_t)(d.e + 1)) : NULL;
    float *x32 = bf_x ? lk_arena_alloc(ar, sizeof(float) * TH) : NULL;
    float *w32 = bf_w ? lk_arena_alloc(ar, sizeof(float) * EH) : NULL;
    float *acc = bf_g ? lk_arena_alloc(ar, sizeof(float) * EH) : NULL;
    if (!g.ws || !dz || !counts || (ctx->comm && !group) || (bf_x && !x32) || (bf_w && !w32) || (bf_g && !acc))
        return nomem(kind);
    const int32_t *ids = lk_router_saved_ids(a);
    int aux = a->d_aux_loss != 0.0f;
    /* the group's T is on the device: its share of the coefficient is made there */
    double T = (double)d.t, coef = (double)a->d_aux_loss * (double)d.e / (group ? (double)d.k : T * T * d.k);
    if (aux && (s = lk_router_cuda_count(ids, d.t * d.k, d.e, counts, ctx->stream))) return s;
    if (aux && group &&
        ((s = lk_router_cuda_count_pack(d.t, d.e, counts, group, ctx->stream)) ||
         (s = lk_comm_all_reduce_on(ctx->comm, group, d.e + 1, LK_COMM_F64, ctx->stream))))
        return s;
    if ((s = lk_router_cuda_d_logits(&d, lk_router_saved_v(a), ids, a->d_topk_weights.data,
                                     aux && !group ? counts : NULL, aux ? group : NULL, coef, dz, ctx->stream)))
        return s;
    if (split(a)) return backward_split(a, kind, &g, dz, acc, ar);
    if (want_dgw(a) && (s = d_gate_weight(a, &g, dz, x32, acc))) return s;
    return d_hidden(a, &g, dz, x32, w32);
}

/* A router kind's entry points and vtable, stamped once per kind. */
#define CUDA_ROUTER(name, kind)                                                                                 \
    static size_t name##_ws(const lk_moe_router_args *a, int bwd) { return workspace_bytes(a, bwd, kind); }    \
    static lk_status name##_fwd(const lk_moe_router_args *a, lk_ctx *ctx) { return forward(a, ctx, kind); }    \
    static lk_status name##_bwd(const lk_moe_router_args *a, lk_ctx *ctx) { return backward(a, ctx, kind); }   \
    const lk_moe_router_vtable lk_moe_router_cuda_##name##_vtable = {                                           \
        .version = LK_MOE_ROUTER_VTABLE_VERSION, .saved_bytes = lk_router_saved_bytes,                          \
        .workspace_bytes = name##_ws, .forward = name##_fwd, .backward = name##_bwd};

CUDA_ROUTER(softmax_topk, LK_ROUTER_SOFTMAX)
CUDA_ROUTER(sigmoid_bias, LK_ROUTER_SIGMOID)
