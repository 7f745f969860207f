/* dist_attention.c — Ulysses sequence parallelism over the MPI world (the SP group):
 * every rank builds the same full problem, runs it on one process (the SP row with no
 * communicator), then runs its own S/P slice through the exchange, and compares its
 * slice of out, LSE, dq, dk, dv and the SP-summed ds_aux (f32, 1e-5 relative). Also
 * the rejections, the mesh, the SP loss reduction, and the bytes each all-to-all moves
 * against DeepSpeed-Ulysses' 4·N·h/P. Run: mpirun -np 2|4 ./dist_attention. */
#include <stdlib.h>
#include <string.h>
#include "util.h"
#include "ops/attention/check.h"
#include "ops/attention/internal.h"

#define TOL 1e-5    /* f32: the same adapter on the same heads; only dk/dv sums across ranks reorder */

static const lk_impl *impl_named(const char *n) { return lk_impl_find(LK_OP_ATTENTION, n, LK_DEVICE_CPU); }

typedef struct {
    float *q, *k, *v, *out, *dout, *dq, *dk, *dv, *lse, *ds;
    lk_attention_args a;
} local_problem;

/* This rank's slice of pb (positions [r·S/P, (r+1)·S/P)), outputs poisoned. */
static void slice(const lk_attention_problem *pb, int r, int P, local_problem *lp) {
    const lk_tensor *q = &pb->a.q, *k = &pb->a.k;
    int64_t B = q->shape[0], H = q->shape[1], S = q->shape[2], D = q->shape[3], Hkv = k->shape[1], Skv = k->shape[2];
    int64_t Sl = S / P, Skl = Skv / P, nq = B * H * Sl * D, nk = B * Hkv * Skl * D;
    int64_t qs[4] = {B, H, S, D}, ks[4] = {B, Hkv, Skv, D}, os[4] = {B, S, H, D};
    lp->q = malloc(4 * nq), lp->k = malloc(4 * nk), lp->v = malloc(4 * nk), lp->out = malloc(4 * nq);
    lp->dout = malloc(4 * nq), lp->dq = malloc(4 * nq), lp->dk = malloc(4 * nk), lp->dv = malloc(4 * nk);
    lp->lse = malloc(4 * B * H * Sl), lp->ds = malloc(4 * H);
    dist_box(pb->q, qs, 0, H, r * Sl, Sl, lp->q, 4);
    dist_box(pb->k, ks, 0, Hkv, r * Skl, Skl, lp->k, 4);
    dist_box(pb->v, ks, 0, Hkv, r * Skl, Skl, lp->v, 4);
    dist_box(pb->dout, os, r * Sl, Sl, 0, H, lp->dout, 4);
    memset(lp->out, 0xff, 4 * nq), memset(lp->dq, 0xff, 4 * nq), memset(lp->dk, 0xff, 4 * nk);
    memset(lp->dv, 0xff, 4 * nk), memset(lp->lse, 0xff, 4 * B * H * Sl), memset(lp->ds, 0xff, 4 * H);
    int64_t lq[4] = {B, H, Sl, D}, lk[4] = {B, Hkv, Skl, D}, lo[4] = {B, Sl, H, D};
    lp->a = pb->a;      /* options, cu_seqlens, masks, s_aux: the full sequence's */
    lp->a.q = lk_tensor_view(lp->q, LK_F32, 4, lq), lp->a.dq = lk_tensor_view(lp->dq, LK_F32, 4, lq);
    lp->a.k = lk_tensor_view(lp->k, LK_F32, 4, lk), lp->a.dk = lk_tensor_view(lp->dk, LK_F32, 4, lk);
    lp->a.v = lk_tensor_view(lp->v, LK_F32, 4, lk), lp->a.dv = lk_tensor_view(lp->dv, LK_F32, 4, lk);
    lp->a.out = lk_tensor_view(lp->out, LK_F32, 4, lo), lp->a.dout = lk_tensor_view(lp->dout, LK_F32, 4, lo);
    lp->a.saved = (lk_saved){lp->lse, (size_t)(B * H * Sl) * 4};
    if (pb->a.ds_aux.data) lp->a.ds_aux = lk_tensor_1d(lp->ds, LK_F32, H);
}

static void local_free(local_problem *lp) {
    free(lp->q), free(lp->k), free(lp->v), free(lp->out), free(lp->dout), free(lp->dq), free(lp->dk);
    free(lp->dv), free(lp->lse), free(lp->ds);
}

/* One case: the full problem on one process, then the Ulysses run, compared slice by slice. */
static void run_case(const char *label, const char *impl_name, const lk_attention_case *c, uint64_t seed) {
    const lk_impl *impl = impl_named(impl_name);
    DIST_CHECK(impl != NULL, "%s: no impl %s", label, impl_name);
    if (!impl) return;
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    lk_status s = lk_attention_problem_make(impl, LK_F32, c, seed, 0, &pb);
    DIST_CHECK(s == LK_OK, "%s: problem", label);
    s = s ? s : lk_attention_forward(impl, &pb.a, &ctx);
    s = s ? s : lk_attention_backward(impl, &pb.a, &ctx);
    DIST_CHECK(s == LK_OK, "%s: single-process run", label);
    int P = dist_world->size, r = dist_world->rank;
    local_problem lp;
    slice(&pb, r, P, &lp);
    ctx.comm = dist_world;
    DIST_CHECK(lk_attention_forward(impl, &lp.a, &ctx) == LK_OK, "%s: Ulysses forward", label);
    DIST_CHECK(lk_attention_backward(impl, &lp.a, &ctx) == LK_OK, "%s: Ulysses backward", label);
    const lk_tensor *q = &pb.a.q, *k = &pb.a.k;
    int64_t B = q->shape[0], H = q->shape[1], S = q->shape[2], D = q->shape[3], Hkv = k->shape[1];
    int64_t Sl = S / P, nq = B * H * Sl * D, nk = B * Hkv * Sl * D;
    int64_t qs[4] = {B, H, S, D}, ks[4] = {B, Hkv, S, D}, os[4] = {B, S, H, D}, ls[4] = {B, H, S, 1};
    float *want = malloc(4 * (size_t)nq);
    struct { const char *name; const void *full; const int64_t *n; int seq_major; float *got; int64_t count; } cmp[] = {
        {"out", pb.out, os, 1, lp.out, nq}, {"lse", pb.lse, ls, 0, lp.lse, B * H * Sl}, {"dq", pb.dq, qs, 0, lp.dq, nq},
        {"dk", pb.dk, ks, 0, lp.dk, nk}, {"dv", pb.dv, ks, 0, lp.dv, nk}};
    for (int i = 0; i < 5; i++) {
        const int64_t *n = cmp[i].n;
        if (cmp[i].seq_major) dist_box(cmp[i].full, n, r * Sl, Sl, 0, n[2], want, 4);
        else dist_box(cmp[i].full, n, 0, n[1], r * Sl, Sl, want, 4);
        double e = dist_rel_err(cmp[i].got, want, cmp[i].count);
        DIST_CHECK(e <= TOL, "%s: %s relative error %.3g > %g", label, cmp[i].name, e, TOL);
    }
    if (pb.a.ds_aux.data) {     /* each rank's share, summed over the SP group */
        DIST_CHECK(lk_comm_all_reduce(dist_world, lp.ds, H, LK_COMM_F32) == LK_OK, "%s: ds_aux sum", label);
        double e = dist_rel_err(lp.ds, pb.dsink, H);
        DIST_CHECK(e <= TOL, "%s: ds_aux relative error %.3g > %g", label, e, TOL);
    }
    free(want);
    local_free(&lp);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

/* A call Ulysses must refuse, on every rank, naming arg; nothing written. */
static void expect_reject(const char *label, const char *impl_name, const lk_attention_case *c, lk_status want,
                          const char *arg) {
    const lk_impl *impl = impl_named(impl_name);
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    DIST_CHECK(lk_attention_problem_make(impl, LK_F32, c, 7, 0, &pb) == LK_OK, "%s: problem", label);
    local_problem lp;
    slice(&pb, dist_world->rank, dist_world->size, &lp);
    ctx.comm = dist_world;
    float sentinel;
    memcpy(&sentinel, lp.out, 4);
    lk_status s = lk_attention_forward(impl, &lp.a, &ctx);
    DIST_CHECK(s == want && strstr(lk_last_error(), arg), "%s: got %s, wanted %s naming %s", label, lk_status_name(s),
               lk_status_name(want), arg);
    DIST_CHECK(memcmp(&sentinel, lp.out, 4) == 0, "%s: out written", label);
    local_free(&lp);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

static void mesh_and_loss(void) {
    int P = dist_world->size;
    lk_mesh m;
    lk_status s = lk_mesh_create(dist_world, 0, 3, 1, &m);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "does not divide"), "mesh sp 3 on %d ranks", P);
    s = lk_mesh_create(dist_world, P, 2, 1, &m);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "does not match"), "mesh dp %d sp 2 ep 1", P);
    s = lk_mesh_create(dist_world, 0, 2, 3, &m);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "ep 3 does not divide"), "mesh ep 3 on %d ranks", P);
    s = lk_mesh_create(dist_world, 0, 2, P / 2, &m);    /* dp P/2 x sp 2, ep P/2 folded over them */
    DIST_CHECK(s == LK_OK && m.dp_size == P / 2 && m.sp->size == 2 && m.ep->size == P / 2 && m.dp->size == P / 2,
               "mesh %dx2 ep %d", P / 2, P / 2);
    if (s == LK_OK) {
        int64_t v = dist_world->rank;       /* SP innermost: the SP partners are 2i and 2i+1 */
        DIST_CHECK(lk_comm_all_reduce(m.sp, &v, 1, LK_COMM_I64) == LK_OK && v == 4 * (dist_world->rank / 2) + 1,
                   "sp group sum %lld", (long long)v);
        int e = P / 2, base = dist_world->rank / e * e;   /* EP groups: e consecutive ranks */
        v = dist_world->rank;
        DIST_CHECK(lk_comm_all_reduce(m.ep, &v, 1, LK_COMM_I64) == LK_OK && v == (int64_t)e * base + e * (e - 1) / 2 &&
                   m.ep_rank == dist_world->rank % e, "ep group sum %lld", (long long)v);
        lk_mesh_destroy(&m);
    }
    /* the loss over SP ranks, rank 0 with no valid token */
    int r = dist_world->rank;
    double mean = -1, scale = -1, want_sum = 0, want_n = 0;
    for (int p = 1; p < P; p++) want_sum += 2.0 * p, want_n += p;
    s = lk_sp_loss_reduce(dist_world, r ? 2.0 * r : 0.0, r, &mean, &scale);
    DIST_CHECK(s == LK_OK && mean == want_sum / want_n && scale == 1.0 / want_n, "sp loss %g", mean);
    s = lk_sp_loss_reduce(dist_world, 0.0, 0, &mean, &scale);
    DIST_CHECK(s == LK_OK && mean == 0.0 && scale == 0.0, "sp loss with no valid token: %g %g", mean, scale);
}

/* Bytes per Ulysses all-to-all against DeepSpeed-Ulysses: one all-to-all of an [N, h]
 * activation (N tokens, h = H·D) moves N·h/P elements per link; q, k, v and out make
 * 4·N·h/P per layer forward. */
static void bytes_moved(void) {
    int P = dist_world->size;
    lk_attention_case c = {.B = 1, .Hq = 8, .Sq = 256, .D = 32, .causal = 1};
    const lk_impl *impl = impl_named("llmkern_flash_attention_2_with_sp");
    lk_attention_problem pb;
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    DIST_CHECK(lk_attention_problem_make(impl, LK_F32, &c, 3, 0, &pb) == LK_OK, "bytes: problem");
    local_problem lp;
    slice(&pb, dist_world->rank, P, &lp);
    ctx.comm = dist_world;
    lk_comm_reset_stats(dist_world);
    DIST_CHECK(lk_attention_forward(impl, &lp.a, &ctx) == LK_OK, "bytes: forward");
    const lk_comm_stats *st = &dist_world->stats;
    double calls = (double)st->calls[LK_COLL_ALL_TO_ALL];
    double wire = (double)st->bytes_wire[LK_COLL_ALL_TO_ALL], in = (double)st->bytes_in[LK_COLL_ALL_TO_ALL];
    double Nh = (double)c.Sq * c.Hq * c.D * 4;      /* bytes of one [N, h] f32 activation */
    double lse = (double)c.Sq * c.Hq * 4 / P;       /* the LSE's all-to-all: this rank's [H, S/P] */
    double qkvo_wire = wire - lse * (P - 1) / P;
    /* expected: each of q, k, v, out hands N·h/P bytes to the all-to-all, (P-1)/P of it leaves the rank */
    DIST_CHECK(calls == 5 && in == 4 * Nh / P + lse, "bytes: %g calls, %g bytes in", calls, in);
    DIST_CHECK(qkvo_wire == 4 * Nh / P * (P - 1) / P, "bytes: wire %g", qkvo_wire);
    if (dist_world->rank == 0)
        printf("ulysses bytes, N=%d h=%d f32 P=%d: per rank per forward: q/k/v/out all-to-alls hand %.0f bytes "
               "(4*N*h/P = %.0f), %.0f leave the rank (4*N*h/P*(P-1)/P); the LSE adds %.0f; per all-to-all %.0f "
               "(N*h/P = %.0f)\n", (int)c.Sq, (int)(c.Hq * c.D), P, in - lse, 4 * Nh / P, qkvo_wire, lse,
               (in - lse) / 4, Nh / P);
    local_free(&lp);
    lk_attention_problem_free(&pb);
    lk_arena_free(&arena);
}

int main(void) {
    dist_begin();
    int P = dist_world->size;
    const char *flash = "llmkern_flash_attention_2_with_sp", *flex = "llmkern_flex_attention_with_sp";
    lk_attention_case mha = {.B = 2, .Hq = 4, .Sq = 32, .D = 16, .causal = 1};
    run_case("sdpa/flash causal", flash, &mha, 1);
    lk_attention_case gqa1 = {.B = 1, .Hq = 8, .Hkv = 1, .Sq = 32, .D = 8, .causal = 1, .sinks = 1};
    run_case("flash MQA (H_kv 1 < P) with sinks", flash, &gqa1, 2);
    lk_attention_case gqa2 = {.B = 2, .Hq = 8, .Hkv = 2, .Sq = 24, .D = 8, .window_left = 5, .softcap = 20.f};
    run_case("flash GQA H_kv 2 window softcap", flash, &gqa2, 3);
    lk_attention_case varlen = {.B = 1, .Hq = 4, .Hkv = 2, .Sq = 48, .D = 8, .causal = 1, .n_docs = 5};
    run_case("flash varlen, documents across ranks", flash, &varlen, 4);
    lk_attention_case doc = {.B = 1, .Hq = 4, .Sq = 64, .D = 8, .family = LK_AM_AND, .n_docs = 3, .block = 8};
    run_case("flex document AND causal mask", flex, &doc, 5);
    lk_attention_case slide = {.B = 2, .Hq = 4, .Hkv = 1, .Sq = 32, .D = 8, .family = LK_AM_SLIDING, .block = 16};
    run_case("flex sliding, MQA", flex, &slide, 6);
    /* eager: the flash slot running the eager adapter's compute (no SP row of its own) */
    lk_attention_set_backend(LK_ATTN_FLASH, &lk_attention_eager_backend);
    run_case("eager causal GQA sinks", flash, &(lk_attention_case){.B = 1, .Hq = 4, .Hkv = 2, .Sq = 16, .D = 8,
                                                                  .causal = 1, .sinks = 1}, 8);
    lk_attention_set_backend(LK_ATTN_FLASH, NULL);

    expect_reject("heads not divisible", flash, &(lk_attention_case){.B = 1, .Hq = 3, .Sq = 8, .D = 8}, LK_ESHAPE, "H_q");
    expect_reject("kv heads neither", flash, &(lk_attention_case){.B = 1, .Hq = 12, .Hkv = 3, .Sq = 8, .D = 8},
                  LK_ESHAPE, "H_kv");
    expect_reject("head-specific BlockMask", flex, &(lk_attention_case){.B = 1, .Hq = 4, .Sq = 16, .D = 8,
                  .family = LK_AM_PER_HEAD, .block = 8}, LK_EINVAL, "head-broadcast");
    mesh_and_loss();
    bytes_moved();
    (void)P;
    return dist_end("dist_attention");
}
