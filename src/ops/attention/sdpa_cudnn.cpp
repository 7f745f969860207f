/* sdpa_cudnn.cpp — the `cudnn` row of attention on CUDA: cuDNN 9's fused flash SDPA,
 * forward (out and the natural-log LSE) and backward (dq, dk, dv), bf16.
 *
 * Why the frontend: cudnn_graph.h's single-op SDPA descriptors carry no causal flag,
 * band or ragged layout, so the graph goes through the header-only cudnn-frontend (C++),
 * as PyTorch's and llm.c's cuDNN attention do. This file is plain C++ for the host
 * compiler (no kernels: the few bytes of its own it writes are 2-D copies and memsets on
 * the stream), so the frontend's heavy headers are compiled once, not once per GPU
 * architecture by nvcc; the vtable at the bottom is the C boundary. Built when CMake finds cuDNN and the frontend headers
 * (LLMKERN_HAVE_CUDNN); without them the row is absent and `llmkern list` says why.
 *
 * What cuDNN sees, with its names (key j seen from aligned row p = i + Skv − Sq):
 *   causal             right bound 0 (j <= p); bottom-right alignment when Sq != Skv.
 *   window_right > 0   right bound wr − 1 (j − p < wr), when not causal.
 *   window_left > 0    left bound wl (p − j < wl): HF's convention exactly.
 *   GQA / MQA          K/V with H_kv heads; cuDNN indexes head h / (Hq / Hkv).
 *   varlen             B = documents, S = the longest, ragged offsets (element offsets
 *                      of each document in q/k/v [1, H, T, D], out [1, T, H, D], the LSE
 *                      [1, H, T]) and seq_len tensors with the padding mask, which also
 *                      aligns causal/window per document; built per call on the host
 *                      from cu_seqlens, copied into the workspace on ctx->stream.
 *                      The backward's scratch is dense [documents, H, longest, D]
 *                      (no max_total_seq_len: see build_graph).
 * Rows that see no key: causal with Sq > Skv hides the first Sq − Skv rows of every
 * head, so cuDNN gets q and out sliced past them (its bottom-right mask wants
 * Sq <= Skv) and this file writes out 0, LSE −inf and dq 0 there. Every other way a row
 * can see nothing (a window with Sq > Skv, a document of queries with fewer or no keys
 * under a mask) is refused in supports(), as are softcap, sinks and D that is not a
 * multiple of 8 or above cuDNN's limit (256 on Hopper, 128 before).
 *
 * Plans: a graph is built once per shape/option key (~100 ms: heuristics A, the same as
 * PyTorch's cuDNN SDPA), kept in a table of PLANS per process (round robin), beside one
 * cudnnHandle per device; a build that cuDNN refuses is cached too and answers
 * LK_EUNAVAILABLE with cuDNN's message. workspace_bytes builds (or finds) the plan so
 * the facade can reserve cuDNN's workspace before the pass. One lock covers lookup,
 * cudnnSetStream and execute. Compiled with hidden visibility (CMakeLists.txt): the
 * frontend's inline functions must not bind to another copy (PyTorch's) in the process. */
#include <pthread.h>
#include <string.h>
#include <math.h>
#include <memory>
#include <string>
#include <vector>
#include <unordered_map>
#include <cudnn_frontend.h>
#include "core/cuda_check.h"
#include "ops/attention/internal.h"

namespace fe = cudnn_frontend;

#define OP "attention: cudnn"
#define PLANS 32
#define MAX_DEVICES 16
#define ALIGN 256

enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SEQ_Q, U_SEQ_KV, U_RAG_QKV, U_RAG_KV,
       U_RAG_O, U_RAG_STATS };

/* Everything the graph depends on (pointers are not part of it). */
typedef struct {
    int device, backward, varlen, deterministic, bottom_right;
    int64_t B, Hq, Hkv, Sq, Skv, D;   /* as cuDNN sees them (q sliced, or B = docs, S = longest) */
    int64_t Tq, Tkv;                  /* rows in memory: the packed totals, or the tensors' S */
    int64_t left, right;              /* band bounds, -1 = none */
    int stats_dense;                  /* the LSE goes through a [B, Hq, Sq] scratch (sliced q) */
    uint32_t scale_bits;
} plan_key;

typedef struct {
    int used;
    plan_key key;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t ws;
    lk_status fail;        /* a build cuDNN refused: the status and message, kept */
    std::string why;
} plan;

typedef struct {
    cudnnHandle_t h;
    plan plans[PLANS];
    int next;
} device_state;

/* Never freed: process state like the handles (a static array's destructors would tear the
 * graphs down at exit, possibly after the CUDA context is gone). */
static device_state *const states = new device_state[MAX_DEVICES]();
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* --- one call as cuDNN sees it ------------------------------------------------- */

typedef struct {
    plan_key key;
    int64_t cut;                 /* rows of q that see nothing (causal, Sq > Skv) */
    int64_t Sq_full;             /* the caller's Sq */
    /* varlen, per kept document: lengths and element offsets */
    std::vector<int32_t> seq_q, seq_kv;
    std::vector<int64_t> off_q, off_kv, off_o, off_stats;
} view;

static size_t up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Bytes of this file's own pieces of workspace (beside cuDNN's). */
static size_t extra_bytes(const view &v) {
    size_t n = 0;
    if (v.key.stats_dense) n += up((size_t)(v.key.B * v.key.Hq * v.key.Sq) * 4);
    if (v.key.varlen) n += 2 * up(v.seq_q.size() * 4) + 4 * up(v.off_q.size() * 8);
    return n;
}

static int max_d(void) { return lk_hw_get()->cuda_cc >= 90 ? 256 : 128; }

/* The options cuDNN cannot run exactly: an error naming the option, nothing written. */
static lk_status supports(const lk_attention_args *a, int backward) {
    /* The frontend's headers were compiled for the cuDNN this build found. A process that
     * mapped another libcudnn.so.9 first (PyTorch's wheel: 9.19 beside the H200's 9.14)
     * binds this file's calls to that one, and the pair crashed (bench/NOTES.md, issue 16):
     * refused, with both versions, before any cuDNN call. */
    const size_t have = cudnnGetVersion();
    if (have / 100 != CUDNN_VERSION / 100)
        return lk_error(LK_EUNAVAILABLE, "attention: cudnn: built against cuDNN %d.%d, but this process has "
                        "cuDNN %zu.%zu loaded (another library's copy; mixing the two crashes): flash_attention_3 "
                        "or flash_attention_2 run here", CUDNN_VERSION / 10000, CUDNN_VERSION / 100 % 100,
                        have / 10000, have / 100 % 100);
    lk_attn_dims d = lk_attn_dims_of(a);
    if (a->softcap > 0.0f)
        return lk_error(LK_EUNAVAILABLE, "attention: softcap: cudnn takes no logit softcap (flash_attention_2 "
                        "does), got %g", (double)a->softcap);
    if (a->s_aux.data)
        return lk_error(LK_EUNAVAILABLE, "attention: s_aux: cudnn takes no attention sinks here "
                        "(flash_attention_2 does), got sinks");
    if (d.D % 8 != 0 || d.D > max_d())
        return lk_error(LK_EUNAVAILABLE, "attention: D: cudnn takes a head dim that is a multiple of 8 up to %d "
                        "on this GPU (flash_attention_2 takes any up to 256), got %lld", max_d(), (long long)d.D);
    int masked = a->causal || a->window_left > 0 || a->window_right > 0;
    if (!a->cu_seqlens_q.data) {
        if (d.Sq > d.Skv && !a->causal && (a->window_left > 0 || a->window_right > 0))
            return lk_error(LK_EUNAVAILABLE, "attention: %s: cudnn takes a sliding window with S_q > S_kv only "
                            "when causal (flash_attention_2 takes it), got S_q %lld > S_kv %lld",
                            a->window_left > 0 ? "window_left" : "window_right", (long long)d.Sq,
                            (long long)d.Skv);
        return LK_OK;
    }
    const int32_t *cq = (const int32_t *)a->cu_seqlens_q.data, *ck = (const int32_t *)a->cu_seqlens_k.data;
    for (int64_t i = 0; i + 1 < a->cu_seqlens_q.shape[0]; i++) {
        int64_t lq = cq[i + 1] - cq[i], lk = ck[i + 1] - ck[i];
        if ((lq > 0 && lk == 0) || (lq == 0 && lk > 0) || (masked && lq > lk))
            return lk_error(LK_EUNAVAILABLE, "attention: cu_seqlens_q: cudnn takes documents whose queries all see "
                            "a key (%s), got document %lld with %lld queries and %lld keys (flash_attention_2 "
                            "takes it)", masked ? "as many keys as queries under causal or a window"
                                                : "no empty side", (long long)i, (long long)lq, (long long)lk);
    }
    (void)backward;
    return LK_OK;
}

static view view_of(const lk_attention_args *a, int backward) {
    lk_attn_dims d = lk_attn_dims_of(a);
    view v;
    memset(&v.key, 0, sizeof v.key);   /* padding bytes too: the key is compared with memcmp */
    plan_key &k = v.key;
    k.device = a->q.device.index;
    k.backward = backward;
    k.deterministic = backward && a->deterministic;
    k.Hq = d.Hq, k.Hkv = d.Hkv, k.D = d.D;
    memcpy(&k.scale_bits, &d.scale, 4);
    k.left = a->window_left > 0 ? a->window_left : -1;
    k.right = a->causal ? 0 : a->window_right > 0 ? a->window_right - 1 : -1;
    v.Sq_full = d.Sq;
    v.cut = 0;
    if (!a->cu_seqlens_q.data) {
        if (a->causal && d.Sq > d.Skv) v.cut = d.Sq - d.Skv;
        k.B = d.B, k.Sq = d.Sq - v.cut, k.Skv = d.Skv, k.Tq = d.Sq, k.Tkv = d.Skv;
        k.stats_dense = v.cut > 0;
        k.bottom_right = (k.left >= 0 || k.right >= 0) && k.Sq != k.Skv;
        return v;
    }
    k.varlen = 1;
    k.Tq = d.Sq, k.Tkv = d.Skv;
    const int32_t *cq = (const int32_t *)a->cu_seqlens_q.data, *ck = (const int32_t *)a->cu_seqlens_k.data;
    int64_t mq = 0, mk = 0;
    for (int64_t i = 0; i + 1 < a->cu_seqlens_q.shape[0]; i++) {
        int32_t lq = cq[i + 1] - cq[i], lk = ck[i + 1] - ck[i];
        if (lq == 0 && lk == 0) continue;   /* an empty document: nothing to compute */
        v.seq_q.push_back(lq), v.seq_kv.push_back(lk);
        v.off_q.push_back((int64_t)cq[i] * d.D), v.off_kv.push_back((int64_t)ck[i] * d.D);
        v.off_o.push_back((int64_t)cq[i] * d.Hq * d.D), v.off_stats.push_back(cq[i]);
        if (lq > mq) mq = lq;
        if (lk > mk) mk = lk;
        if (lq != lk) k.bottom_right = 1;
    }
    /* the end offsets close the last document */
    v.off_q.push_back(d.Sq * d.D), v.off_kv.push_back(d.Skv * d.D), v.off_o.push_back(d.Sq * d.Hq * d.D);
    v.off_stats.push_back(d.Sq);
    k.B = (int64_t)v.seq_q.size(), k.Sq = mq, k.Skv = mk;
    k.bottom_right = k.bottom_right && (k.left >= 0 || k.right >= 0);
    return v;
}

/* --- graphs ------------------------------------------------------------------------ */

typedef std::shared_ptr<fe::graph::Tensor_attributes> tensor_t;

static tensor_t tensor(fe::graph::Graph &g, const char *name, int64_t uid, std::vector<int64_t> dim,
                       std::vector<int64_t> stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

static tensor_t index_tensor(fe::graph::Graph &g, const char *name, int64_t uid, int64_t n, fe::DataType_t t) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1}).set_data_type(t));
}

/* Layouts: q/k/v/dq/dk/dv [B, H, T, D]; out/dout [B, T, Hq, D]; the LSE [B, Hq, T] (T the
 * rows in memory); the sliced LSE [B, Hq, Sq] in scratch. */
struct layouts {
    std::vector<int64_t> qd, qs, kd, ks, od, os, sd, ss;
};

static layouts layouts_of(const plan_key &k) {
    layouts l;   /* varlen: the batch strides are unused, the ragged offsets place each document */
    l.qd = {k.B, k.Hq, k.Sq, k.D}, l.qs = {k.Hq * k.Tq * k.D, k.Tq * k.D, k.D, 1};
    l.kd = {k.B, k.Hkv, k.Skv, k.D}, l.ks = {k.Hkv * k.Tkv * k.D, k.Tkv * k.D, k.D, 1};
    l.od = {k.B, k.Hq, k.Sq, k.D}, l.os = {k.Tq * k.Hq * k.D, k.D, k.Hq * k.D, 1};
    l.sd = {k.B, k.Hq, k.Sq, 1};
    l.ss = k.stats_dense ? std::vector<int64_t>{k.Hq * k.Sq, k.Sq, 1, 1}
                         : std::vector<int64_t>{k.Hq * k.Tq, k.Tq, 1, 1};
    return l;
}

template <typename Attr>
static void set_masks(Attr &o, const plan_key &k) {
    if (k.right >= 0) o.set_diagonal_band_right_bound((int)k.right);
    if (k.left >= 0) o.set_diagonal_band_left_bound((int)k.left);
    if (k.left >= 0 || k.right >= 0)
        o.set_diagonal_alignment(k.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                : fe::DiagonalAlignment_t::TOP_LEFT);
}

static fe::error_t build_graph(cudnnHandle_t h, const plan_key &k, std::shared_ptr<fe::graph::Graph> &out) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    layouts l = layouts_of(k);
    float scale;
    memcpy(&scale, &k.scale_bits, 4);
    tensor_t Q = tensor(*g, "Q", U_Q, l.qd, l.qs), K = tensor(*g, "K", U_K, l.kd, l.ks),
             V = tensor(*g, "V", U_V, l.kd, l.ks);
    tensor_t sq, skv, rq, rkv, ro, rs;
    if (k.varlen) {
        sq = index_tensor(*g, "seq_q", U_SEQ_Q, k.B, fe::DataType_t::INT32);
        skv = index_tensor(*g, "seq_kv", U_SEQ_KV, k.B, fe::DataType_t::INT32);
        rq = index_tensor(*g, "ragged_q", U_RAG_QKV, k.B + 1, fe::DataType_t::INT64);
        rkv = index_tensor(*g, "ragged_kv", U_RAG_KV, k.B + 1, fe::DataType_t::INT64);
        ro = index_tensor(*g, "ragged_o", U_RAG_O, k.B + 1, fe::DataType_t::INT64);
        rs = index_tensor(*g, "ragged_stats", U_RAG_STATS, k.B + 1, fe::DataType_t::INT64);
        Q->set_ragged_offset(rq), K->set_ragged_offset(rkv), V->set_ragged_offset(rkv);
    }
    if (!k.backward) {
        auto o = fe::graph::SDPA_attributes().set_name("sdpa_fwd").set_generate_stats(true).set_attn_scale(scale);
        set_masks(o, k);
        if (k.varlen) o.set_padding_mask(true).set_seq_len_q(sq).set_seq_len_kv(skv);
        auto [O, Stats] = g->sdpa(Q, K, V, o);
        O->set_output(true).set_uid(U_O).set_dim(l.od).set_stride(l.os);
        Stats->set_output(true).set_uid(U_STATS).set_data_type(fe::DataType_t::FLOAT).set_dim(l.sd)
            .set_stride(l.ss);
        if (k.varlen) O->set_ragged_offset(ro), Stats->set_ragged_offset(rs);
    } else {
        tensor_t O = tensor(*g, "O", U_O, l.od, l.os), dO = tensor(*g, "dO", U_DO, l.od, l.os);
        tensor_t Stats = g->tensor(fe::graph::Tensor_attributes().set_name("Stats").set_uid(U_STATS).set_dim(l.sd)
                                       .set_stride(l.ss).set_data_type(fe::DataType_t::FLOAT));
        auto o = fe::graph::SDPA_backward_attributes().set_name("sdpa_bwd").set_attn_scale(scale)
                     .set_deterministic_algorithm(k.deterministic != 0);
        set_masks(o, k);
        if (k.varlen) {
            /* No max_total_seq_len: with it the frontend sizes its f32 scratch (dQ_accum,
             * softmax_sum, GQA's dK/dV over all heads) as T x the sequence stride, which is
             * H·D only in a token-major THD layout; ours is head-major (stride D), so the
             * scratch came out H times short and GQA's full-head strides overlapped: wrong
             * dq/dk/dv on many short documents (llmkern check's documents case on the H200).
             * Without it the scratch is dense [documents, H, longest, D]. */
            o.set_padding_mask(true).set_seq_len_q(sq).set_seq_len_kv(skv);
            O->set_ragged_offset(ro), dO->set_ragged_offset(ro), Stats->set_ragged_offset(rs);
        }
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, o);
        dQ->set_output(true).set_uid(U_DQ).set_dim(l.qd).set_stride(l.qs);
        dK->set_output(true).set_uid(U_DK).set_dim(l.kd).set_stride(l.ks);
        dV->set_output(true).set_uid(U_DV).set_dim(l.kd).set_stride(l.ks);
        if (k.varlen) dQ->set_ragged_offset(rq), dK->set_ragged_offset(rkv), dV->set_ragged_offset(rkv);
    }
    fe::error_t e = g->build(h, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (e.is_good()) out = g;
    return e;
}

static lk_status handle_of(int device, cudnnHandle_t *h) {
    if (device < 0 || device >= MAX_DEVICES)
        return lk_error(LK_EDEVICE, OP ": device: expected an index below %d, got %d", MAX_DEVICES, device);
    device_state *st = &states[device];
    if (!st->h) {
        int cur = 0;
        LK_CUDA_TRY(cudaGetDevice(&cur));
        if (cur != device) LK_CUDA_TRY(cudaSetDevice(device));
        cudnnStatus_t s = cudnnCreate(&st->h);
        if (cur != device) cudaSetDevice(cur);
        if (s != CUDNN_STATUS_SUCCESS) {
            st->h = NULL;
            return lk_error(LK_EDEVICE, OP ": cudnnCreate: %s", cudnnGetErrorString(s));
        }
    }
    *h = st->h;
    return LK_OK;
}

/* The plan of key (built on a miss); the lock is held. */
static lk_status plan_of(const plan_key &key, plan **out) {
    cudnnHandle_t h;
    lk_status s = handle_of(key.device, &h);
    if (s) return s;
    device_state *st = &states[key.device];
    for (int i = 0; i < PLANS; i++) {
        plan *p = &st->plans[i];
        if (p->used && memcmp(&p->key, &key, sizeof key) == 0) {
            *out = p;
            return p->fail ? lk_error(p->fail, "%s", p->why.c_str()) : LK_OK;
        }
    }
    plan *p = &st->plans[st->next];
    st->next = (st->next + 1) % PLANS;
    p->used = 0;
    p->graph.reset();
    p->key = key;
    p->ws = 0;
    p->fail = LK_OK;
    p->why.clear();
    try {
        fe::error_t e = build_graph(h, key, p->graph);
        if (e.is_good()) e = p->graph->get_workspace_size(p->ws);
        if (e.is_bad()) {
            p->graph.reset();
            p->fail = e.get_code() == fe::error_code_t::CUDA_API_FAILED ? LK_EDEVICE : LK_EUNAVAILABLE;
            p->why = std::string(OP ": cuDNN ") + std::to_string(cudnnGetVersion()) + " cannot run these arguments (" +
                     (key.backward ? "backward" : "forward") + "): " + e.get_message();
        }
    } catch (const std::exception &x) {
        p->graph.reset();
        p->fail = LK_EDEVICE;
        p->why = std::string(OP ": building the graph threw: ") + x.what();
    }
    p->used = 1;
    *out = p;
    return p->fail ? lk_error(p->fail, "%s", p->why.c_str()) : LK_OK;
}

/* --- the vtable ------------------------------------------------------------------- */

static size_t saved_bytes(const lk_attention_args *a) { return lk_attn_lse_bytes(a); }

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    if (supports(a, backward)) return 0;   /* the pass answers with the reason */
    view v = view_of(a, backward);
    plan *p;
    pthread_mutex_lock(&lock);
    lk_status s = plan_of(v.key, &p);
    size_t ws = s ? 0 : (size_t)p->ws;
    pthread_mutex_unlock(&lock);
    return s ? 0 : up(ws) + extra_bytes(v) + ALIGN;
}

/* The sliced LSE between the caller's [rows, Sq] (its first `cut` columns excluded) and
 * the scratch [rows, Sq - cut] cuDNN reads or writes: one strided copy on the stream. */
static lk_status lse_copy(float *lse, float *dense, int64_t rows, int64_t Sq, int64_t cut, int to_dense,
                          cudaStream_t st) {
    size_t full = (size_t)Sq * 4, part = (size_t)(Sq - cut) * 4;
    cudaError_t e = to_dense ? cudaMemcpy2DAsync(dense, part, lse + cut, full, part, (size_t)rows,
                                                 cudaMemcpyDeviceToDevice, st)
                             : cudaMemcpy2DAsync(lse + cut, full, dense, part, part, (size_t)rows,
                                                 cudaMemcpyDeviceToDevice, st);
    return e == cudaSuccess ? LK_OK : lk_cuda_fail(e, OP ": the sliced LSE", __FILE__, __LINE__);
}

/* LSE -inf in the first `cut` columns of every row (from pageable host memory: staged
 * before the call returns). */
static lk_status lse_hidden(float *lse, int64_t rows, int64_t Sq, int64_t cut, cudaStream_t st) {
    std::vector<float> inf((size_t)(rows * cut), -INFINITY);
    cudaError_t e = cudaMemcpy2DAsync(lse, (size_t)Sq * 4, inf.data(), (size_t)cut * 4, (size_t)cut * 4,
                                      (size_t)rows, cudaMemcpyHostToDevice, st);
    return e == cudaSuccess ? LK_OK : lk_cuda_fail(e, OP ": LSE of rows that see nothing", __FILE__, __LINE__);
}

static lk_status copy_up(void *dst, const void *src, size_t n, cudaStream_t st) {
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st);
    return e == cudaSuccess ? LK_OK : lk_cuda_fail(e, OP ": varlen metadata", __FILE__, __LINE__);
}

static lk_status run(const lk_attention_args *a, lk_ctx *ctx, int backward) {
    lk_status s = supports(a, backward);
    if (s) return s;
    view v = view_of(a, backward);
    const plan_key &k = v.key;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    lk_arena *ar = ctx->arena;
    float *dense = NULL;
    void *seq_q = NULL, *seq_kv = NULL, *rag[4] = {NULL, NULL, NULL, NULL};
    if (k.stats_dense && !(dense = (float *)lk_arena_alloc(ar, up((size_t)(k.B * k.Hq * k.Sq) * 4))))
        return lk_error(LK_ENOMEM, OP ": no room for the LSE scratch (workspace_bytes reserves it)");
    if (k.varlen) {
        const std::vector<int64_t> *offs[4] = {&v.off_q, &v.off_kv, &v.off_o, &v.off_stats};
        if (!(seq_q = lk_arena_alloc(ar, up(v.seq_q.size() * 4))) || !(seq_kv = lk_arena_alloc(ar, up(v.seq_q.size() * 4))))
            return lk_error(LK_ENOMEM, OP ": no room for the varlen metadata");
        if ((s = copy_up(seq_q, v.seq_q.data(), v.seq_q.size() * 4, st)) ||
            (s = copy_up(seq_kv, v.seq_kv.data(), v.seq_kv.size() * 4, st)))
            return s;
        for (int i = 0; i < 4; i++) {
            if (!(rag[i] = lk_arena_alloc(ar, up(offs[i]->size() * 8))))
                return lk_error(LK_ENOMEM, OP ": no room for the ragged offsets");
            if ((s = copy_up(rag[i], offs[i]->data(), offs[i]->size() * 8, st))) return s;
        }
    }
    const size_t e2 = 2;   /* bf16 */
    char *q = (char *)a->q.data + (size_t)(v.cut * k.D) * e2;
    char *o = (char *)a->out.data + (size_t)(v.cut * k.Hq * k.D) * e2;
    char *lse = (char *)a->saved.data;
    std::unordered_map<int64_t, void *> pack = {{U_Q, q}, {U_K, a->k.data}, {U_V, a->v.data}, {U_O, o},
                                                {U_STATS, k.stats_dense ? (void *)dense : (void *)lse}};
    if (backward) {
        pack[U_DO] = (char *)a->dout.data + (size_t)(v.cut * k.Hq * k.D) * e2;
        pack[U_DQ] = (char *)a->dq.data + (size_t)(v.cut * k.D) * e2;
        pack[U_DK] = a->dk.data, pack[U_DV] = a->dv.data;
    }
    if (k.varlen) {
        pack[U_SEQ_Q] = seq_q, pack[U_SEQ_KV] = seq_kv;
        pack[U_RAG_QKV] = rag[0], pack[U_RAG_KV] = rag[1], pack[U_RAG_O] = rag[2], pack[U_RAG_STATS] = rag[3];
    }
    int64_t rows = k.B * k.Hq;
    if (backward && k.stats_dense && (s = lse_copy((float *)lse, dense, rows, v.Sq_full, v.cut, 1, st))) return s;
    pthread_mutex_lock(&lock);
    plan *p;
    cudnnHandle_t h = NULL;
    void *ws = NULL;
    if (!(s = plan_of(k, &p)) && !(s = handle_of(k.device, &h)) &&
        !(p->ws > 0 && !(ws = lk_arena_alloc(ar, up((size_t)p->ws) + ALIGN)))) {
        ws = ws ? (void *)(((uintptr_t)ws + ALIGN - 1) / ALIGN * ALIGN) : NULL;
        cudnnStatus_t cs = cudnnSetStream(h, st);
        if (cs != CUDNN_STATUS_SUCCESS) {
            s = lk_error(LK_EDEVICE, OP ": cudnnSetStream: %s", cudnnGetErrorString(cs));
        } else {
            fe::error_t e = p->graph->execute(h, pack, ws);
            if (e.is_bad())
                s = lk_error(LK_EDEVICE, OP ": execute (%s): %s", backward ? "backward" : "forward",
                             e.get_message().c_str());
        }
    } else if (!s) {
        s = lk_error(LK_ENOMEM, OP ": no room for cuDNN's %lld bytes of workspace (workspace_bytes reserves them)",
                     (long long)p->ws);
    }
    pthread_mutex_unlock(&lock);
    if (s) return s;
    if (v.cut > 0) {   /* rows that see nothing: out 0 and LSE -inf, or dq 0 */
        if (!backward) {
            LK_CUDA_TRY(cudaMemset2DAsync(a->out.data, (size_t)(v.Sq_full * k.Hq * k.D) * e2, 0,
                                          (size_t)(v.cut * k.Hq * k.D) * e2, (size_t)k.B, st));
            if ((s = lse_copy((float *)lse, dense, rows, v.Sq_full, v.cut, 0, st)) ||
                (s = lse_hidden((float *)lse, rows, v.Sq_full, v.cut, st)))
                return s;
        } else {
            LK_CUDA_TRY(cudaMemset2DAsync(a->dq.data, (size_t)(v.Sq_full * k.D) * e2, 0, (size_t)(v.cut * k.D) * e2,
                                          (size_t)rows, st));
        }
    }
    return LK_OK;
}

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) { return run(a, ctx, 0); }
static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) { return run(a, ctx, 1); }

extern "C" const lk_attention_vtable lk_attention_cudnn_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward, supports,
};
