/* dist_moe.c (several GPUs) — expert parallelism on GPUs over NCCL: mpirun -np P, rank r
 * on GPU r, the NCCL world bootstrapped from the MPI one. Every rank builds the same
 * seeded full problem (all ranks' tokens, E = 3P experts), runs it whole on its GPU with
 * the CUDA `local` dispatcher (the single-GPU reference: every token, every expert, no
 * group), then runs its own tokens (a different T on every rank) and its E/P experts
 * through the CUDA `alltoall` and `allgather` dispatchers over the NCCL world (device
 * counts, slots bounded by max_tokens = the largest T of the case, the same on every rank,
 * and again with max_tokens 3 above it, so every slot holds padding), and compares its
 * rows of out, d_hidden, d_topk_weights and its slices of d_gate_up_weight and
 * d_down_weight (added onto random values already there): f32 1e-5 and bf16 2e-2
 * relative (the same GEMMs per route; only the k-way sums reorder, and bf16 rounds each
 * route's row once more). Cases: skewed routing (expert 1 and the last rank's experts get
 * no token, so that rank receives nothing) with T 5 + 4r (allgather's unequal T within
 * the bound), and uniform routing with equal T; outputs poisoned with NaN first.
 * Refusals: CUDA tensors with the MPI (host memory) group -> LK_EDEVICE naming NCCL, out
 * untouched. A bad id on rank 0 makes allgather's outputs NaN on every rank. Skipped (77)
 * with fewer GPUs than ranks.
 * ctest: cuda_dist_moe_np2 / _np4 (tests/cuda/run_h200.sh on a multi-GPU machine). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include "dist_gpu.h"
#include "util.h"

#define MAXP 8

static lk_comm *nccl;

typedef struct {
    const char *name;
    int skew;           /* routes avoid expert 1 and the last rank's experts */
    int equal_T;        /* the same T on every rank (else 5 + 4r) */
    int64_t k, H, I;
} mcase;

/* The full problem, the same on every rank: host copies in the storage dtype. */
typedef struct {
    int64_t P, E, El, k, H, I, N, T[MAXP], t0[MAXP];
    lk_dtype dt, gdt;   /* storage; weight gradients */
    void *x, *dout, *gu, *dn, *ggu, *gdn;   /* ggu, gdn: the gradients already there (gdt) */
    float *w;
    int32_t *ids;
} problem;

typedef struct {
    void *p[11];
} dev_bufs;

static void *rand_in(lk_rng *g, lk_dtype dt, int64_t n, float std) {
    float *f = malloc(4 * (size_t)n);
    void *h = malloc((size_t)n * lk_dtype_size(dt));
    lk_rng_normal(g, f, n, 0.0f, std);
    lk_convert(f, LK_F32, h, dt, n);
    free(f);
    return h;
}

/* k distinct experts a token, drawn from the allowed ones. */
static void route(problem *pb, const mcase *c, lk_rng *g) {
    int32_t allowed[3 * MAXP];
    int n = 0;
    for (int32_t e = 0; e < pb->E; e++)
        if (!c->skew || (e != 1 && e < pb->E - pb->El)) allowed[n++] = e;
    float u;
    for (int64_t t = 0; t < pb->N; t++)
        for (int64_t j = 0; j < pb->k; j++) {
            int again;
            do {
                lk_rng_uniform(g, &u, 1, 0.0f, (float)n);
                pb->ids[t * pb->k + j] = allowed[(int)u % n], again = 0;
                for (int64_t q = 0; q < j; q++) again |= pb->ids[t * pb->k + q] == pb->ids[t * pb->k + j];
            } while (again);
        }
    lk_rng_uniform(g, pb->w, pb->N * pb->k, 0.1f, 1.0f);
}

static void make(problem *pb, const mcase *c, int P, lk_dtype dt, lk_dtype gdt, uint64_t seed) {
    memset(pb, 0, sizeof *pb);
    pb->P = P, pb->E = 3 * P, pb->El = 3, pb->k = c->k, pb->H = c->H, pb->I = c->I, pb->dt = dt, pb->gdt = gdt;
    for (int r = 0; r < P; r++) pb->T[r] = c->equal_T ? 9 : 5 + 4 * r, pb->t0[r] = pb->N, pb->N += pb->T[r];
    int64_t NH = pb->N * pb->H, G = pb->E * 2 * pb->I * pb->H, D = pb->E * pb->H * pb->I;
    lk_rng g = lk_rng_make(seed);
    pb->x = rand_in(&g, dt, NH, 1.0f), pb->dout = rand_in(&g, dt, NH, 1.0f);
    pb->gu = rand_in(&g, dt, G, 0.2f), pb->dn = rand_in(&g, dt, D, 0.2f);
    pb->ggu = rand_in(&g, gdt, G, 0.1f), pb->gdn = rand_in(&g, gdt, D, 0.1f);
    pb->w = malloc(4 * (size_t)(pb->N * pb->k)), pb->ids = malloc(4 * (size_t)(pb->N * pb->k));
    route(pb, c, &g);
}

static void free_problem(problem *pb) {
    free(pb->x), free(pb->dout), free(pb->gu), free(pb->dn), free(pb->ggu), free(pb->gdn), free(pb->w), free(pb->ids);
}

static lk_tensor on_gpu(void *p, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor t = lk_tensor_view(p, dt, ndim, shape);
    t.device = (lk_device){LK_DEVICE_CUDA, nccl->rank};
    return t;
}

/* Tokens [t0, t0 + T) and experts [e0, e0 + El) of pb on the GPU, outputs poisoned. */
static lk_moe_dispatch_args upload(const problem *pb, int64_t t0, int64_t T, int64_t e0, int64_t El, dev_bufs *b) {
    int64_t H = pb->H, I = pb->I, k = pb->k, es = (int64_t)lk_dtype_size(pb->dt), gs = (int64_t)lk_dtype_size(pb->gdt);
    int64_t sx[2] = {T, H}, sk[2] = {T, k}, sg[3] = {El, 2 * I, H}, sd[3] = {El, H, I};
    size_t xb = (size_t)(T * H * es), kb = (size_t)(T * k) * 4;
    size_t gb = (size_t)(El * 2 * I * H), db = (size_t)(El * H * I);   /* elements */
    void **p = b->p;
    p[0] = dev_copy((const char *)pb->x + t0 * H * es, xb);
    p[1] = dev_copy(pb->ids + t0 * k, kb), p[2] = dev_copy(pb->w + t0 * k, kb);
    p[3] = dev_copy((const char *)pb->gu + e0 * 2 * I * H * es, gb * es);
    p[4] = dev_copy((const char *)pb->dn + e0 * H * I * es, db * es);
    p[5] = dev_copy(NULL, xb), p[6] = dev_copy((const char *)pb->dout + t0 * H * es, xb);
    p[7] = dev_copy(NULL, xb), p[8] = dev_copy(NULL, kb);
    p[9] = dev_copy((const char *)pb->ggu + e0 * 2 * I * H * gs, gb * gs);
    p[10] = dev_copy((const char *)pb->gdn + e0 * H * I * gs, db * gs);
    return (lk_moe_dispatch_args){
        .hidden = on_gpu(p[0], pb->dt, 2, sx), .topk_ids = on_gpu(p[1], LK_I32, 2, sk),
        .topk_weights = on_gpu(p[2], LK_F32, 2, sk), .gate_up_weight = on_gpu(p[3], pb->dt, 3, sg),
        .down_weight = on_gpu(p[4], pb->dt, 3, sd), .out = on_gpu(p[5], pb->dt, 2, sx),
        .dout = on_gpu(p[6], pb->dt, 2, sx), .d_hidden = on_gpu(p[7], pb->dt, 2, sx),
        .d_topk_weights = on_gpu(p[8], LK_F32, 2, sk), .d_gate_up_weight = on_gpu(p[9], pb->gdt, 3, sg),
        .d_down_weight = on_gpu(p[10], pb->gdt, 3, sd), .n_experts = (int)pb->E,
    };
}

static void dev_free(dev_bufs *b) {
    for (int i = 0; i < 11; i++) cudaFree(b->p[i]);
}

/* This rank's part of the reference (ref, the whole problem's buffers) against got. */
static void compare(const char *label, const problem *pb, const lk_moe_dispatch_args *ref,
                    const lk_moe_dispatch_args *got) {
    int r = nccl->rank;
    int64_t t0 = pb->t0[r], e0 = r * pb->El;
    struct { const char *name; const lk_tensor *full, *mine; int64_t off; } cmp[5] = {
        {"out", &ref->out, &got->out, t0 * pb->H}, {"d_hidden", &ref->d_hidden, &got->d_hidden, t0 * pb->H},
        {"d_topk_weights", &ref->d_topk_weights, &got->d_topk_weights, t0 * pb->k},
        {"d_gate_up_weight", &ref->d_gate_up_weight, &got->d_gate_up_weight, e0 * 2 * pb->I * pb->H},
        {"d_down_weight", &ref->d_down_weight, &got->d_down_weight, e0 * pb->H * pb->I}};
    double tol = pb->dt == LK_F32 ? 1e-5 : 2e-2;
    for (int i = 0; i < 5; i++) {
        lk_dtype dt = cmp[i].mine->dtype;
        size_t es = lk_dtype_size(dt), n = (size_t)lk_tensor_numel(cmp[i].mine);
        char *full = host_copy(cmp[i].full->data, lk_tensor_bytes(cmp[i].full));
        void *mine = host_copy(cmp[i].mine->data, n * es);
        double e = dist_rel_err_dt(mine, full + (size_t)cmp[i].off * es, dt, (int64_t)n);
        DIST_CHECK(e <= tol, "%s %s: %s relative error %.3g > %g", label, lk_dtype_name(pb->dt), cmp[i].name, e, tol);
        free(full), free(mine);
    }
}

/* CUDA tensors with the MPI group are refused before anything is written. */
static void host_group_refused(const char *label, const lk_impl *impl, lk_moe_dispatch_args *a, lk_ctx *ctx) {
    size_t n = lk_tensor_bytes(&a->out);
    cudaMemset(a->out.data, 0xff, n);
    ctx->comm = dist_world;
    lk_status s = lk_moe_dispatch_forward(impl, a, ctx);
    DIST_CHECK(s == LK_EDEVICE && strstr(lk_last_error(), "NCCL"), "%s: an MPI group with CUDA tensors: %s", label,
               lk_status_name(s));
    unsigned char *o = host_copy(a->out.data, n);
    int clean = 1;
    for (size_t i = 0; i < n; i++) clean &= o[i] == 0xff;
    DIST_CHECK(clean, "%s: out written by a refused call", label);
    free(o);
    ctx->comm = nccl;
}

/* t's elements all NaN (f32 or bf16 on the device). */
static int all_nan(const lk_tensor *t) {
    size_t n = (size_t)lk_tensor_numel(t), es = lk_dtype_size(t->dtype);
    char *h = host_copy(t->data, n * es);
    float *f = malloc(4 * n);
    lk_convert(h, t->dtype, f, LK_F32, (int64_t)n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= isnan(f[i]) != 0;
    free(h), free(f);
    return ok;
}

/* allgather: rank 0's route 1 given id E; every rank sees it, so every rank's out,
 * d_hidden and d_topk_weights come out NaN (LK_OK: the ids stay on the device). */
static void bad_id_everywhere(const char *label, const lk_impl *impl, lk_moe_dispatch_args *a, lk_ctx *ctx) {
    int32_t bad = (int32_t)a->n_experts;
    if (nccl->rank == 0) cudaMemcpy((int32_t *)a->topk_ids.data + 1, &bad, 4, cudaMemcpyHostToDevice);
    lk_status s = lk_moe_dispatch_forward(impl, a, ctx);
    if (!s) s = lk_moe_dispatch_backward(impl, a, ctx);
    cudaDeviceSynchronize();
    DIST_CHECK(s == LK_OK, "%s: a bad id on rank 0: %s", label, lk_status_name(s));
    DIST_CHECK(all_nan(&a->out) && all_nan(&a->d_hidden) && all_nan(&a->d_topk_weights),
               "%s: a bad id on rank 0: this rank's outputs not all NaN", label);
}

/* The row over the NCCL world: max_tokens = the case's largest T + extra (the slots' bound;
 * extra > 0 leaves padding in every rank's slots). */
static void ep_run(const char *label, const char *name, const problem *pb, const lk_moe_dispatch_args *ref,
                   lk_ctx *ctx, int64_t extra) {
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, name, LK_DEVICE_CUDA);
    DIST_CHECK(impl != NULL, "%s: the CUDA %s row", label, name);
    if (!impl) return;
    int r = nccl->rank;
    dev_bufs b;
    lk_moe_dispatch_args a = upload(pb, pb->t0[r], pb->T[r], r * pb->El, pb->El, &b);
    for (int p = 0; p < pb->P; p++) a.max_tokens = pb->T[p] > a.max_tokens ? pb->T[p] : a.max_tokens;
    a.max_tokens += extra;
    ctx->comm = nccl;
    lk_status s = lk_moe_dispatch_forward(impl, &a, ctx);
    DIST_CHECK(s == LK_OK, "%s: %s forward: %s", label, name, lk_status_name(s));
    if (!s) s = lk_moe_dispatch_backward(impl, &a, ctx);
    DIST_CHECK(s == LK_OK, "%s: %s backward: %s", label, name, lk_status_name(s));
    char what[128];
    snprintf(what, sizeof what, "%s %s max_tokens %lld", label, name, (long long)a.max_tokens);
    if (!s) compare(what, pb, ref, &a);
    host_group_refused(what, impl, &a, ctx);
    if (!strcmp(name, "allgather")) bad_id_everywhere(what, impl, &a, ctx);
    dev_free(&b);
}

static void run_case(const mcase *c, lk_dtype dt, lk_dtype gdt, uint64_t seed) {
    problem pb;
    make(&pb, c, nccl->size, dt, gdt, seed);
    lk_arena arena = {.device = LK_DEVICE_CUDA};
    lk_ctx ctx = lk_ctx_cuda(&arena, NULL, nccl->rank);
    /* the reference: every token and every expert on this GPU, no group */
    const lk_impl *local = lk_impl_find(LK_OP_MOE_DISPATCH, "local", LK_DEVICE_CUDA);
    DIST_CHECK(local != NULL, "%s: the CUDA local row", c->name);
    dev_bufs fb;
    lk_moe_dispatch_args ref = upload(&pb, 0, pb.N, 0, pb.E, &fb);
    if (local) {
        lk_status s = lk_moe_dispatch_forward(local, &ref, &ctx);
        if (!s) s = lk_moe_dispatch_backward(local, &ref, &ctx);
        DIST_CHECK(s == LK_OK, "%s: one GPU: %s", c->name, lk_status_name(s));
        for (int64_t extra = 0; extra <= 3; extra += 3) {
            ep_run(c->name, "alltoall", &pb, &ref, &ctx, extra);
            ep_run(c->name, "allgather", &pb, &ref, &ctx, extra);
        }
    }
    if (nccl->rank == 0) printf("dist_moe (cuda): %s %s (grads %s) done\n", c->name, lk_dtype_name(dt),
                                lk_dtype_name(gdt));
    dev_free(&fb);
    lk_arena_free(&arena);
    free_problem(&pb);
}

int main(void) {
    dist_begin();
    if (!dist_gpus_enough("dist_moe (cuda)", MAXP)) return 77;
    DIST_CHECK(lk_comm_nccl_create(dist_world, dist_world->rank, &nccl) == LK_OK, "nccl world");
    if (nccl) {
        const mcase cases[] = {
            {"skewed routing, T 5 + 4r", 1, 0, 2, 64, 48},
            {"uniform routing, equal T", 0, 1, 3, 40, 24},
        };
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                lk_dtype dt = d ? LK_BF16 : LK_F32;
                run_case(&cases[i], dt, i % 2 ? LK_F32 : dt, 41 + i);
            }
        lk_comm_destroy(nccl);
    }
    return dist_end("dist_moe (cuda)");
}
