/* peers_shim.c — C entry points on raw device pointers for bench/peers_cuda.py (ctypes).
 * Each lkp_<op>(...) prepares one call: it builds the lk_tensor views and a CUDA context
 * on the caller's stream and returns them as a handle (NULL when out of memory; kept
 * for the life of the process, a bench makes a few dozen);
 * lkp_run(handle) then calls the op's facade with its CUDA implementation, checks
 * included, as a C caller of the library does. Timed calls are lkp_run, one argument:
 * converting a dozen Python ints per call through ctypes cost ~8 us a call, longer than
 * the library's own host path, and is the harness's time, not llmkern's (bench/NOTES.md
 * run 28). dt: 0 = f32, 1 = bf16 (lk_dtype). lkp_run returns an lk_status;
 * lkp_last_error() gives the text. Built with CUDA only, as libllmkern_peers_shim.so
 * beside libllmkern.so. Its prototypes' Python types are bench/shim.py's SIGNATURES: a
 * changed prototype changes that table too. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include "llmkern/llmkern.h"
#include "ops/swiglu_mlp/cuda_act.h"

static lk_arena arena = {.device = LK_DEVICE_CUDA};   /* workspace, grown on first use */

/* silu(a)·b's kernels take raw pointers, not a facade's args. */
typedef struct {
    lk_dtype dt;
    void *a, *b, *c, *dc, *da, *db;
    int64_t rows, cols;
    void *stream;
} act_args;

typedef struct lkp_call lkp_call;
struct lkp_call {
    lk_status (*run)(const lkp_call *c);
    int backward;
    const lk_impl *impl;
    lk_ctx ctx;
    union {
        lk_rms_norm_args rms_norm;
        lk_rope_args rope;
        lk_cross_entropy_args cross_entropy;
        lk_attention_args attention;
        lk_moe_experts_args moe_experts;
        act_args act;
    } u;
};

static lkp_call *keep(lkp_call c) {
    lkp_call *p = malloc(sizeof *p);
    if (p) *p = c;
    return p;
}

int lkp_run(const lkp_call *c) { return c->run(c); }

static lk_tensor dev_view(void *p, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor t = lk_tensor_view(p, dt, ndim, shape);
    t.device.type = LK_DEVICE_CUDA;
    return t;
}


int lkp_init(void) { return lk_init() == LK_OK ? lk_hw_get()->cuda_devices : -1; }
const char *lkp_last_error(void) { return lk_last_error(); }
const char *lkp_gpu_name(void) { return lk_hw_get()->cuda_name; }

static const lk_impl *impl_of(lk_op op, const char *name) { return lk_impl_find(op, name, LK_DEVICE_CUDA); }

static lk_status run_rms_norm(const lkp_call *c) {
    lk_ctx ctx = c->ctx;
    return c->backward ? lk_rms_norm_backward(c->impl, &c->u.rms_norm, &ctx)
                       : lk_rms_norm_forward(c->impl, &c->u.rms_norm, &ctx);
}

lkp_call *lkp_rms_norm(int backward, const char *impl, int dt, void *x, void *w, void *y, void *dy, void *dx,
                       void *dw, void *rstd, int64_t rows, int64_t n, double eps, void *stream) {
    int64_t s2[2] = {rows, n};
    lk_dtype d = (lk_dtype)dt;
    lk_rms_norm_args a = {
        .x = dev_view(x, d, 2, s2), .weight = dev_view(w, d, 1, &n), .y = dev_view(y, d, 2, s2),
        .dy = dev_view(dy, d, 2, s2), .dx = dev_view(dx, d, 2, s2), .dweight = dev_view(dw, d, 1, &n),
        .saved = {rstd, (size_t)rows * sizeof(float)}, .eps = eps,
    };
    return keep((lkp_call){run_rms_norm, backward, impl_of(LK_OP_RMS_NORM, impl), lk_ctx_cuda(&arena, stream, 0),
                           .u.rms_norm = a});
}

/* q, k [B, H, S, D]; cos, sin f32 [max_pos, D/2]; positions 0..S-1. Backward: q, k are
 * the incoming gradients and qo, ko the outgoing ones. */
static lk_status run_rope(const lkp_call *c) {
    lk_ctx ctx = c->ctx;
    return c->backward ? lk_rope_backward(c->impl, &c->u.rope, &ctx) : lk_rope_forward(c->impl, &c->u.rope, &ctx);
}

lkp_call *lkp_rope(int backward, int dt, void *q, void *k, void *qo, void *ko, void *cos, void *sin, int64_t b,
                   int64_t hq, int64_t hk, int64_t s, int64_t d, int64_t max_pos, void *stream) {
    int64_t sq[4] = {b, hq, s, d}, sk[4] = {b, hk, s, d}, st[2] = {max_pos, d / 2};
    lk_dtype t = (lk_dtype)dt;
    lk_rope_args a = {
        .q = dev_view(backward ? NULL : q, t, 4, sq), .k = dev_view(backward ? NULL : k, t, 4, sk),
        .q_out = dev_view(qo, t, 4, sq), .k_out = dev_view(ko, t, 4, sk),
        .dq_out = dev_view(q, t, 4, sq), .dk_out = dev_view(k, t, 4, sk),
        .dq = dev_view(qo, t, 4, sq), .dk = dev_view(ko, t, 4, sk),
        .cos = dev_view(cos, LK_F32, 2, st), .sin = dev_view(sin, LK_F32, 2, st),
    };
    return keep((lkp_call){run_rope, backward, impl_of(LK_OP_ROPE, "fused"), lk_ctx_cuda(&arena, stream, 0),
                           .u.rope = a});
}

/* c = silu(a)·b and its backward (da, db may be a, b themselves), [rows, cols] each. */
static lk_status run_swiglu_act(const lkp_call *c) {
    const act_args *x = &c->u.act;
    int64_t n = x->cols;
    if (c->backward)
        return lk_cuda_swiglu_act_backward(x->dt, x->rows, n, 0.0f, x->dc, n, x->a, n, x->b, n, x->da, n, x->db, n,
                                           NULL, 0, x->stream);
    return lk_cuda_swiglu_act_forward(x->dt, x->rows, n, 0.0f, x->a, n, x->b, n, x->c, n, x->stream);
}

lkp_call *lkp_swiglu_act(int backward, int dt, void *a, void *b, void *c, void *dc, void *da, void *db,
                         int64_t rows, int64_t cols, void *stream) {
    act_args x = {(lk_dtype)dt, a, b, c, dc, da, db, rows, cols, stream};
    return keep((lkp_call){run_swiglu_act, backward, .u.act = x});
}

/* LM head + cross-entropy `fused` (mean over tokens, labels i64 [T], d_loss f32 [1]):
 * hidden [T, H], weight [V, H] in dt, d_weight in dw_dt. chunk_tokens sets chunk_bytes.
 * lkp_cross_entropy_bytes gives the saved block and the larger pass's workspace: the
 * memory the op holds beyond the caller's tensors. */
static lk_cross_entropy_args ce_args(int dt, void *h, void *w, void *labels, void *loss, void *d_loss, void *dh,
                                     void *dw, int dw_dt, void *saved, size_t saved_bytes, int64_t *shape,
                                     int64_t chunk_tokens) {
    static int64_t one = 1;
    lk_cross_entropy_args a = lk_cross_entropy_args_init();
    int64_t sh[2] = {shape[0], shape[1]}, sw[2] = {shape[2], shape[1]};
    a.hidden = dev_view(h, (lk_dtype)dt, 2, sh), a.weight = dev_view(w, (lk_dtype)dt, 2, sw);
    a.labels = dev_view(labels, LK_I64, 1, &shape[0]), a.loss = dev_view(loss, LK_F32, 1, &one);
    a.d_loss = dev_view(d_loss, LK_F32, 1, &one), a.d_hidden = dev_view(dh, (lk_dtype)dt, 2, sh);
    a.d_weight = dev_view(dw, (lk_dtype)dw_dt, 2, sw);
    a.saved = (lk_saved){saved, saved_bytes};
    a.chunk_bytes = (size_t)chunk_tokens * (size_t)shape[2] * 4;
    return a;
}

int lkp_cross_entropy_bytes(int dt, int dw_dt, int64_t t, int64_t h, int64_t v, int64_t chunk_tokens,
                            size_t *saved, size_t *workspace) {
    int64_t shape[3] = {t, h, v};
    lk_cross_entropy_args a = ce_args(dt, NULL, NULL, NULL, NULL, NULL, NULL, NULL, dw_dt, NULL, 0, shape,
                                      chunk_tokens);
    const lk_impl *im = impl_of(LK_OP_CROSS_ENTROPY, "fused");
    size_t f = 0, b = 0;
    lk_status s;
    if ((s = lk_cross_entropy_saved_bytes(im, &a, saved)) || (s = lk_cross_entropy_workspace_bytes(im, &a, 0, &f)) ||
        (s = lk_cross_entropy_workspace_bytes(im, &a, 1, &b)))
        return s;
    *workspace = f > b ? f : b;
    return LK_OK;
}

static lk_status run_cross_entropy(const lkp_call *c) {
    lk_ctx ctx = c->ctx;
    return c->backward ? lk_cross_entropy_backward(c->impl, &c->u.cross_entropy, &ctx)
                       : lk_cross_entropy_forward(c->impl, &c->u.cross_entropy, &ctx);
}

lkp_call *lkp_cross_entropy(int backward, int dt, void *h, void *w, void *labels, void *loss, void *d_loss,
                            void *dh, void *dw, int dw_dt, void *saved, size_t saved_bytes, int64_t t, int64_t hd,
                            int64_t v, int64_t chunk_tokens, void *stream) {
    int64_t shape[3] = {t, hd, v};
    lk_cross_entropy_args a = ce_args(dt, h, w, labels, loss, d_loss, dh, dw, dw_dt, saved, saved_bytes, shape,
                                      chunk_tokens);
    return keep((lkp_call){run_cross_entropy, backward, impl_of(LK_OP_CROSS_ENTROPY, "fused"),
                           lk_ctx_cuda(&arena, stream, 0), .u.cross_entropy = a});
}

/* Attention on the GPU through the CUDA row `impl` (flash_attention_2, cudnn, ...): q [B,
 * Hq, S, D], k, v [B, Hkv, S, D], out and dout [B, S, Hq, D], lse f32 [B, Hq, S]; the
 * backward writes dq, dk, dv. NULL when this build has no such row (lkp_last_error says). */
static lk_status run_attention(const lkp_call *c) {
    lk_ctx ctx = c->ctx;
    return c->backward ? lk_attention_backward(c->impl, &c->u.attention, &ctx)
                       : lk_attention_forward(c->impl, &c->u.attention, &ctx);
}

int lkp_has_attention(const char *impl) { return impl_of(LK_OP_ATTENTION, impl) != NULL; }

lkp_call *lkp_attention(const char *impl, int backward, int dt, void *q, void *k, void *v, void *out, void *dout,
                        void *dq, void *dk, void *dv, void *lse, int64_t b, int64_t hq, int64_t hkv, int64_t s,
                        int64_t d, int causal, void *stream) {
    lk_dtype t = (lk_dtype)dt;
    int64_t sq[4] = {b, hq, s, d}, sk[4] = {b, hkv, s, d}, so[4] = {b, s, hq, d};
    lk_attention_args a = {
        .q = dev_view(q, t, 4, sq), .k = dev_view(k, t, 4, sk), .v = dev_view(v, t, 4, sk),
        .out = dev_view(out, t, 4, so), .causal = causal,
        .saved = {lse, (size_t)(b * hq * s) * sizeof(float)},
    };
    if (backward) {
        a.dout = dev_view(dout, t, 4, so), a.dq = dev_view(dq, t, 4, sq);
        a.dk = dev_view(dk, t, 4, sk), a.dv = dev_view(dv, t, 4, sk);
    }
    return keep((lkp_call){run_attention, backward, impl_of(LK_OP_ATTENTION, impl), lk_ctx_cuda(&arena, stream, 0),
                           .u.attention = a});
}

/* The attention row impl timed in a process of its own (bench/attention_alone.py): the
 * cudnn row cannot share a process with torch when torch's cuDNN is another version than
 * the one llmkern was built against (bench/NOTES.md, issue 16's cudnn row). Random bf16
 * inputs, q [b, hq, s, d], k, v [b, hkv, s, d]; one untimed forward + backward, then `reps`
 * forwards and `reps` forward + backward pairs between CUDA events: ms[0] the forward's
 * mean, ms[1] the pair's. Returns an lk_status (lkp_last_error() says why). */
static int time_attention(const char *impl, int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d, int causal,
                          const lk_block_mask *mask, int reps, double ms[2]) {
    const lk_impl *im = impl_of(LK_OP_ATTENTION, impl);
    if (!im) return lk_error(LK_EUNAVAILABLE, "lkp_time_attention: no CUDA attention row '%s'", impl);
    const size_t nq = (size_t)(b * hq * s * d), nk = (size_t)(b * hkv * s * d), nl = (size_t)(b * hq * s);
    const size_t elems[8] = {nq, nk, nk, nq, nq, nq, nk, nk};   /* q k v out dout dq dk dv */
    void *p[9] = {0};
    uint16_t *h = malloc(nq * sizeof *h);
    lk_status st = h ? LK_OK : lk_error(LK_ENOMEM, "lkp_time_attention: out of host memory");
    uint32_t x = 2463534242u;
    for (size_t i = 0; !st && i < nq; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        h[i] = lk_f32_to_bf16((float)(x >> 8) / 8388608.0f - 1.0f);   /* uniform in [-1, 1) */
    }
    for (int i = 0; !st && i < 9; i++) {
        size_t bytes = i < 8 ? elems[i] * 2 : nl * sizeof(float);
        if (cudaMalloc(&p[i], bytes) != cudaSuccess) st = lk_error(LK_ENOMEM, "lkp_time_attention: cudaMalloc");
        else if (i < 5 && cudaMemcpy(p[i], h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            st = lk_error(LK_EDEVICE, "lkp_time_attention: cudaMemcpy");
    }
    free(h);
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (!st && (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess))
        st = lk_error(LK_EDEVICE, "lkp_time_attention: cudaEventCreate");
    lkp_call *f = NULL, *bw = NULL;
    if (!st) {
        f = lkp_attention(impl, 0, LK_BF16, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], b, hq, hkv, s, d,
                          causal, NULL);
        bw = lkp_attention(impl, 1, LK_BF16, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], b, hq, hkv, s, d,
                           causal, NULL);
        if (!f || !bw) st = lk_error(LK_ENOMEM, "lkp_time_attention: out of host memory");
        else f->u.attention.block_mask = bw->u.attention.block_mask = mask;
    }
    if (!st) st = lkp_run(f);
    if (!st) st = lkp_run(bw);
    for (int pass = 0; !st && pass < 2; pass++) {
        float t = 0.0f;
        cudaEventRecord(e0, NULL);
        for (int r = 0; !st && r < reps; r++)
            if (!(st = lkp_run(f)) && pass) st = lkp_run(bw);
        cudaEventRecord(e1, NULL);
        if (!st && (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&t, e0, e1) != cudaSuccess))
            st = lk_error(LK_EDEVICE, "lkp_time_attention: the CUDA events");
        ms[pass] = (double)t / (reps > 0 ? reps : 1);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int i = 0; i < 9; i++) cudaFree(p[i]);
    free(f), free(bw);
    return st;
}

int lkp_time_attention(const char *impl, int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d, int causal,
                       int reps, double ms[2]) {
    return time_attention(impl, b, hq, hkv, s, d, causal, NULL, reps, ms);
}

/* A flex row (flex_attention) timed as lkp_time_attention under one of PEERS-H200.md's
 * BlockMasks, head-broadcast, blocks of 128: 1 causal, 2 causal sliding window of `param`
 * keys, 3 causal documents of random lengths in [256, param] (per batch row, from ids),
 * 4 prefix-LM of `param` keys. *density: the visible fraction (the FLOPs' factor). */
int lkp_time_flex(const char *impl, int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d, int kind,
                  int64_t param, int reps, double ms[2], double *density) {
    lk_block_mask m = {0};
    lk_status st = LK_OK;
    if (kind == 1) st = lk_block_mask_causal(1, 1, s, s, 128, 128, &m);
    else if (kind == 2) st = lk_block_mask_sliding_window(param, 1, 1, s, s, 128, 128, &m);
    else if (kind == 4) {
        int64_t *pre = malloc(sizeof *pre * (size_t)b);
        for (int64_t i = 0; pre && i < b; i++) pre[i] = param;
        st = pre ? lk_block_mask_prefix_lm(pre, b, 1, s, s, 128, 128, &m) : lk_error(LK_ENOMEM, "lkp_time_flex");
        free(pre);
    } else if (kind == 3) {
        int32_t *ids = malloc(sizeof *ids * (size_t)(b * s));
        uint32_t x = 88172645u;
        for (int64_t r = 0; ids && r < b; r++)
            for (int64_t i = 0, doc = 0; i < s; doc++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                for (int64_t n = 256 + x % (uint32_t)(param - 255); n > 0 && i < s; n--) ids[r * s + i++] = (int32_t)doc;
            }
        st = ids ? lk_block_mask_document_ids(ids, 1, b, 1, s, 128, 128, &m) : lk_error(LK_ENOMEM, "lkp_time_flex");
        free(ids);
    } else {
        return lk_error(LK_EINVAL, "lkp_time_flex: kind: expected 1-4, got %d", kind);
    }
    if (st) return st;
    *density = lk_block_mask_density(&m);
    st = time_attention(impl, b, hq, hkv, s, d, 0, &m, reps, ms);
    lk_block_mask_free(&m);
    return st;
}

/* MoE experts `fused` (include/llmkern/moe.h): hidden [T, H], ids i32 [T, k], weights f32
 * [T, k], gate_up [E, 2I, H] and down [E, H, I] in dt, weight gradients in grad_dt (NULL =
 * not wanted), d_topk_weights f32 [T, k] (NULL = not wanted), saved of
 * lkp_moe_experts_saved_bytes. The forward and the backward share one call's tensors. */
static lk_status run_moe_experts(const lkp_call *c) {
    lk_ctx ctx = c->ctx;
    return c->backward ? lk_moe_experts_backward(c->impl, &c->u.moe_experts, &ctx)
                       : lk_moe_experts_forward(c->impl, &c->u.moe_experts, &ctx);
}

size_t lkp_moe_experts_saved_bytes(int dt, int64_t t, int64_t k, int64_t e, int64_t h, int64_t i) {
    size_t b = 0;
    return lk_moe_experts_saved_bytes(impl_of(LK_OP_MOE_EXPERTS, "fused"), t, k, e, h, i, (lk_dtype)dt, &b) ? 0 : b;
}

lkp_call *lkp_moe_experts(int backward, int dt, void *x, void *ids, void *w, void *wgu, void *wd, void *out,
                          void *dout, void *dx, void *dw, void *dwgu, void *dwd, int grad_dt, void *saved,
                          size_t saved_bytes, int64_t t, int64_t h, int64_t i, int64_t e, int64_t k, void *stream) {
    lk_dtype d = (lk_dtype)dt, g = (lk_dtype)grad_dt;
    int64_t sx[2] = {t, h}, sk[2] = {t, k}, sgu[3] = {e, 2 * i, h}, sd[3] = {e, h, i};
    lk_moe_experts_args a = {
        .hidden = dev_view(x, d, 2, sx), .topk_ids = dev_view(ids, LK_I32, 2, sk),
        .topk_weights = dev_view(w, LK_F32, 2, sk), .gate_up_weight = dev_view(wgu, d, 3, sgu),
        .down_weight = dev_view(wd, d, 3, sd), .out = dev_view(out, d, 2, sx), .dout = dev_view(dout, d, 2, sx),
        .d_hidden = dev_view(dx, d, 2, sx), .d_topk_weights = dev_view(dw, LK_F32, 2, sk),
        .d_gate_up_weight = dev_view(dwgu, g, 3, sgu), .d_down_weight = dev_view(dwd, g, 3, sd),
        .saved = {saved, saved_bytes},
    };
    return keep((lkp_call){run_moe_experts, backward, impl_of(LK_OP_MOE_EXPERTS, "fused"),
                           lk_ctx_cuda(&arena, stream, 0), .u.moe_experts = a});
}
