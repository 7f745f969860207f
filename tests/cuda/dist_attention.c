/* dist_attention.c (several GPUs) — Ulysses sequence parallelism on GPUs over NCCL:
 * mpirun -np P, rank r on GPU r. Every rank builds the same full problem (the CPU
 * check's, ops/attention/check.h), runs it whole on its GPU (the SP row with no group),
 * then runs its S/P slice through the exchange over the NCCL world with the CUDA flash
 * backend, and compares its slice of out, LSE, dq, dk, dv and the SP-summed ds_aux:
 * f32 1e-5 and bf16 1e-2 relative (the same kernel on the same heads; only the KV-repeat
 * sum of dk/dv across ranks reorders). Cases: MHA causal, MQA with fewer KV heads than
 * ranks and sinks, GQA with a window and softcap, varlen documents crossing the rank
 * boundaries; flash_attention_3's SP row (bf16, the Hopper kernels; sm_90 only) on the
 * MHA, MQA and documents cases; and flex_attention's SP row (bf16) under head-broadcast
 * BlockMasks: causal documents across the rank boundaries, causal MQA with sinks. And the refusal of CUDA
 * tensors with a host-memory (MPI) group. Skipped (77) with fewer GPUs than ranks.
 * ctest: cuda_dist_attention_np2 / _np4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "dist_gpu.h"
#include "util.h"
#include "ops/attention/check.h"

static lk_comm *nccl;

typedef struct {
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv, *lse, *s_aux, *ds;
} dev_bufs;

/* a on the device: q, k, v, dout (and s_aux) copied from h (NULL: the problem's own),
 * outputs poisoned. */
static lk_attention_args on_device(const lk_attention_args *src, const void *const h[4], dev_bufs *b) {
    lk_attention_args a = *src;
    lk_tensor *in[4] = {&a.q, &a.k, &a.v, &a.dout}, *out[4] = {&a.out, &a.dq, &a.dk, &a.dv};
    void **din[4] = {&b->q, &b->k, &b->v, &b->dout}, **dout[4] = {&b->out, &b->dq, &b->dk, &b->dv};
    for (int i = 0; i < 4; i++) {
        *din[i] = dev_copy(h[i], lk_tensor_bytes(in[i]));
        in[i]->data = *din[i], in[i]->device.type = LK_DEVICE_CUDA;
        *dout[i] = dev_copy(NULL, lk_tensor_bytes(out[i]));
        out[i]->data = *dout[i], out[i]->device.type = LK_DEVICE_CUDA;
    }
    b->s_aux = b->ds = NULL;
    if (a.s_aux.data) {
        b->s_aux = dev_copy(a.s_aux.data, lk_tensor_bytes(&a.s_aux));
        a.s_aux.data = b->s_aux, a.s_aux.device.type = LK_DEVICE_CUDA;
        b->ds = dev_copy(NULL, lk_tensor_bytes(&a.ds_aux));
        a.ds_aux.data = b->ds, a.ds_aux.device.type = LK_DEVICE_CUDA;
    }
    b->lse = dev_copy(NULL, a.saved.bytes);
    a.saved.data = b->lse;
    return a;
}

static void dev_free(dev_bufs *b) {
    void *p[] = {b->q, b->k, b->v, b->out, b->dout, b->dq, b->dk, b->dv, b->lse, b->s_aux, b->ds};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) cudaFree(p[i]);
}

/* The SP row `sp_name` on case c (the problem made for the CPU row of its adapter, cpu_name:
 * a flex case gets its BlockMask there, borrowed by both runs). */
static void run_case(const char *label, const char *sp_name, const char *cpu_name, lk_dtype dt,
                     const lk_attention_case *c, uint64_t seed) {
    const lk_impl *sp = lk_impl_find(LK_OP_ATTENTION, sp_name, LK_DEVICE_CUDA);
    const lk_impl *cpu = lk_impl_find(LK_OP_ATTENTION, cpu_name, LK_DEVICE_CPU);
    DIST_CHECK(sp && cpu, "%s: the SP row on CUDA", label);
    if (!sp || !cpu) return;
    lk_attention_problem pb;
    DIST_CHECK(lk_attention_problem_make(cpu, dt, c, seed, 0, &pb) == LK_OK, "%s: problem", label);
    int P = nccl->size, r = nccl->rank;
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, r);
    /* the whole sequence on this GPU */
    dev_bufs fb, lb;
    const void *none[4] = {pb.a.q.data, pb.a.k.data, pb.a.v.data, pb.a.dout.data};
    lk_attention_args fa = on_device(&pb.a, none, &fb);
    DIST_CHECK(lk_attention_forward(sp, &fa, &ctx) == LK_OK && lk_attention_backward(sp, &fa, &ctx) == LK_OK,
               "%s: one GPU", label);
    /* this rank's slice, through the exchange */
    const lk_tensor *q = &pb.a.q, *k = &pb.a.k;
    int64_t B = q->shape[0], H = q->shape[1], S = q->shape[2], D = q->shape[3], Hkv = k->shape[1];
    int64_t Sl = S / P, nq = B * H * Sl * D, nk = B * Hkv * Sl * D;
    int64_t qs[4] = {B, H, S, D}, ks[4] = {B, Hkv, S, D}, os[4] = {B, S, H, D}, ls[4] = {B, H, S, 1};
    size_t es = lk_dtype_size(dt);
    void *hl[4] = {malloc(nq * es), malloc(nk * es), malloc(nk * es), malloc(nq * es)};
    dist_box(pb.a.q.data, qs, 0, H, r * Sl, Sl, hl[0], es);
    dist_box(pb.a.k.data, ks, 0, Hkv, r * Sl, Sl, hl[1], es);
    dist_box(pb.a.v.data, ks, 0, Hkv, r * Sl, Sl, hl[2], es);
    dist_box(pb.a.dout.data, os, r * Sl, Sl, 0, H, hl[3], es);
    lk_attention_args la = pb.a;   /* options, cu_seqlens (host, the full sequence's) */
    int64_t lq[4] = {B, H, Sl, D}, lkv[4] = {B, Hkv, Sl, D}, lo[4] = {B, Sl, H, D};
    la.q = la.dq = lk_tensor_view(NULL, dt, 4, lq);
    la.k = la.v = la.dk = la.dv = lk_tensor_view(NULL, dt, 4, lkv);
    la.out = la.dout = lk_tensor_view(NULL, dt, 4, lo);
    la.saved.bytes = (size_t)(B * H * Sl) * 4;
    const void *hin[4] = {hl[0], hl[1], hl[2], hl[3]};
    la = on_device(&la, hin, &lb);
    ctx.comm = nccl;
    DIST_CHECK(lk_attention_forward(sp, &la, &ctx) == LK_OK, "%s: Ulysses forward", label);
    DIST_CHECK(lk_attention_backward(sp, &la, &ctx) == LK_OK, "%s: Ulysses backward", label);
    double tol = dt == LK_F32 ? 1e-5 : 1e-2;
    struct { const char *name; void *full; const int64_t *n; int seq_major; void *got; int64_t count; lk_dtype t; } cmp[] = {
        {"out", fb.out, os, 1, lb.out, nq, dt}, {"lse", fb.lse, ls, 0, lb.lse, B * H * Sl, LK_F32},
        {"dq", fb.dq, qs, 0, lb.dq, nq, dt}, {"dk", fb.dk, ks, 0, lb.dk, nk, dt}, {"dv", fb.dv, ks, 0, lb.dv, nk, dt}};
    for (int i = 0; i < 5; i++) {
        const int64_t *n = cmp[i].n;
        size_t tes = lk_dtype_size(cmp[i].t), full_n = (size_t)(n[0] * n[1] * n[2] * n[3]);
        void *full = host_copy(cmp[i].full, full_n * tes), *got = host_copy(cmp[i].got, (size_t)cmp[i].count * tes);
        void *want = malloc((size_t)cmp[i].count * tes);
        if (cmp[i].seq_major) dist_box(full, n, r * Sl, Sl, 0, n[2], want, tes);
        else dist_box(full, n, 0, n[1], r * Sl, Sl, want, tes);
        double e = dist_rel_err_dt(got, want, cmp[i].t, cmp[i].count);
        DIST_CHECK(e <= tol, "%s %s: %s relative error %.3g > %g", label, lk_dtype_name(dt), cmp[i].name, e, tol);
        free(full), free(got), free(want);
    }
    if (lb.ds) {   /* each rank's share of the sinks' gradient, summed over the SP group */
        DIST_CHECK(lk_comm_all_reduce(nccl, lb.ds, H, LK_COMM_F32) == LK_OK, "%s: ds_aux sum", label);
        void *got = host_copy(lb.ds, (size_t)H * 4), *want = host_copy(fb.ds, (size_t)H * 4);
        double e = dist_rel_err_dt(got, want, LK_F32, H);
        DIST_CHECK(e <= tol, "%s %s: ds_aux relative error %.3g > %g", label, lk_dtype_name(dt), e, tol);
        free(got), free(want);
    }
    if (r == 0) printf("dist_attention: %s %s done\n", label, lk_dtype_name(dt));
    /* CUDA tensors with a group whose collectives take host memory: refused */
    ctx.comm = dist_world;
    lk_status s = lk_attention_forward(sp, &la, &ctx);
    DIST_CHECK(s == LK_EDEVICE && strstr(lk_last_error(), "NCCL"), "%s: an MPI group with CUDA tensors: %s", label,
               lk_status_name(s));
    for (int i = 0; i < 4; i++) free(hl[i]);
    dev_free(&fb), dev_free(&lb);
    lk_arena_free(&arena);
    lk_attention_problem_free(&pb);
}

int main(void) {
    dist_begin();
    if (!dist_gpus_enough("dist_attention (cuda)", INT_MAX)) return 77;
    DIST_CHECK(lk_comm_nccl_create(dist_world, dist_world->rank, &nccl) == LK_OK, "nccl world");
    if (nccl) {
        const lk_attention_case cases[] = {
            {.B = 2, .Hq = 4, .Sq = 64, .D = 64, .causal = 1},
            {.B = 1, .Hq = 8, .Hkv = 1, .Sq = 64, .D = 128, .causal = 1, .sinks = 1},     /* H_kv 1 < P */
            {.B = 2, .Hq = 8, .Hkv = 2, .Sq = 48, .D = 40, .window_left = 5, .softcap = 20.f},
            {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 96, .D = 64, .causal = 1, .n_docs = 5},    /* documents across ranks */
        };
        const char *labels[] = {"MHA causal", "MQA (H_kv 1 < P) with sinks", "GQA window softcap",
                                "varlen documents across ranks"};
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
                run_case(labels[i], "llmkern_flash_attention_2_with_sp", "flash_attention_2", d ? LK_BF16 : LK_F32,
                         &cases[i], 11 + i);
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dist_world->rank);
        for (size_t i = 0; major == 9 && i < sizeof cases / sizeof *cases; i++)
            if (i != 2) {   /* softcap's backward is fa2's (lk_attn_fa3_bwd_takes) */
                char label[96];
                snprintf(label, sizeof label, "fa3: %s", labels[i]);
                run_case(label, "llmkern_flash_attention_3_with_sp", "flash_attention_2", LK_BF16, &cases[i], 31 + i);
            }
        const lk_attention_case flex[] = {
            {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 256, .D = 64, .family = LK_AM_DOCUMENT, .n_docs = 5},
            {.B = 2, .Hq = 8, .Hkv = 1, .Sq = 128, .D = 128, .family = LK_AM_CAUSAL, .sinks = 1},
        };
        const char *flex_labels[] = {"flex: documents across ranks", "flex: causal MQA with sinks"};
        for (size_t i = 0; i < sizeof flex / sizeof *flex; i++)
            run_case(flex_labels[i], "llmkern_flex_attention_with_sp", "flex_attention", LK_BF16, &flex[i], 21 + i);
        lk_comm_destroy(nccl);
    }
    return dist_end("dist_attention (cuda)");
}
