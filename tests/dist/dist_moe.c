/* dist_moe.c — expert parallelism over the MPI world (the EP group): every rank builds
 * the same P·T tokens and E experts, runs the experts op on all of them on one process
 * (the reference), then runs its T tokens and E/P experts through the alltoall and
 * allgather dispatchers and compares its rows of out, d_hidden, d_topk_weights and its
 * experts' weight gradients (f32, 1e-5 relative). Run: mpirun -np 2|4 ./dist_moe. */
#include <stdlib.h>
#include <string.h>
#include "util.h"
#include "ops/harness.h"

#define TOL 1e-5    /* f32: the same GEMMs per route; only the k-way sums reorder */

typedef struct {
    int64_t N, T, k, E, H, I;
    float *x, *w, *gu, *dn, *dout;      /* global inputs */
    int32_t *ids;
    float *out, *dx, *dw, *dgu, *ddn;   /* reference outputs */
} global;

static void make(global *g, int P, uint64_t seed) {
    g->T = 12, g->N = g->T * P, g->k = 2, g->E = 2 * P, g->H = 16, g->I = 8;
    lk_rng rng = lk_rng_make(seed);
    int64_t NH = g->N * g->H, NK = g->N * g->k, G = g->E * 2 * g->I * g->H, D = g->E * g->H * g->I;
    g->x = lk_random_tensor(&rng, LK_F32, NH, 1.0f, NULL), g->dout = lk_random_tensor(&rng, LK_F32, NH, 1.0f, NULL);
    g->gu = lk_random_tensor(&rng, LK_F32, G, 0.3f, NULL), g->dn = lk_random_tensor(&rng, LK_F32, D, 0.3f, NULL);
    g->w = malloc(4 * NK), g->ids = malloc(4 * NK);
    lk_rng_uniform(&rng, g->w, NK, 0.1f, 1.0f);
    float *u = malloc(4 * NK);
    lk_rng_uniform(&rng, u, NK, 0.0f, (float)g->E);
    for (int64_t i = 0; i < NK; i++) g->ids[i] = (int32_t)u[i] % (int32_t)g->E;
    free(u);
    g->out = malloc(4 * NH), g->dx = malloc(4 * NH), g->dw = malloc(4 * NK);
    g->dgu = calloc((size_t)G, 4), g->ddn = calloc((size_t)D, 4);
}

static void free_global(global *g) {
    free(g->x), free(g->w), free(g->gu), free(g->dn), free(g->dout), free(g->ids);
    free(g->out), free(g->dx), free(g->dw), free(g->dgu), free(g->ddn);
}

/* The dispatch args of rows [t0, t0 + T) and experts [e0, e0 + El). */
static lk_moe_dispatch_args args_of(const global *g, int64_t t0, int64_t T, int64_t e0, int64_t El, float *out,
                                    float *dx, float *dw, float *dgu, float *ddn) {
    int64_t gs[3] = {El, 2 * g->I, g->H}, ds[3] = {El, g->H, g->I};
    float *gu = g->gu + e0 * 2 * g->I * g->H, *dn = g->dn + e0 * g->H * g->I;
    return (lk_moe_dispatch_args){
        .hidden = lk_tensor_2d(g->x + t0 * g->H, LK_F32, T, g->H), .topk_ids = lk_tensor_2d(g->ids + t0 * g->k, LK_I32, T, g->k),
        .topk_weights = lk_tensor_2d(g->w + t0 * g->k, LK_F32, T, g->k),
        .gate_up_weight = lk_tensor_view(gu, LK_F32, 3, gs), .down_weight = lk_tensor_view(dn, LK_F32, 3, ds),
        .out = lk_tensor_2d(out, LK_F32, T, g->H), .dout = lk_tensor_2d(g->dout + t0 * g->H, LK_F32, T, g->H),
        .d_hidden = lk_tensor_2d(dx, LK_F32, T, g->H), .d_topk_weights = lk_tensor_2d(dw, LK_F32, T, g->k),
        .d_gate_up_weight = lk_tensor_view(dgu, LK_F32, 3, gs), .d_down_weight = lk_tensor_view(ddn, LK_F32, 3, ds),
        .n_experts = (int)g->E,
    };
}

static void ep_case(const char *name, const global *g) {
    int P = dist_world->size, r = dist_world->rank;
    int64_t T = g->T, H = g->H, k = g->k, El = g->E / P, G = El * 2 * g->I * H, D = El * H * g->I;
    float *out = malloc(4 * T * H), *dx = malloc(4 * T * H), *dw = malloc(4 * T * k);
    float *dgu = calloc((size_t)G, 4), *ddn = calloc((size_t)D, 4);
    lk_poison(out, LK_F32, T * H), lk_poison(dx, LK_F32, T * H), lk_poison(dw, LK_F32, T * k);
    lk_moe_dispatch_args a = args_of(g, r * T, T, r * El, El, out, dx, dw, dgu, ddn);
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    ctx.comm = dist_world;
    const lk_impl *impl = lk_impl_find(LK_OP_MOE_DISPATCH, name, LK_DEVICE_CPU);
    DIST_CHECK(lk_moe_dispatch_forward(impl, &a, &ctx) == LK_OK, "%s forward", name);
    DIST_CHECK(lk_moe_dispatch_backward(impl, &a, &ctx) == LK_OK, "%s backward", name);
    double e[5] = {dist_rel_err(out, g->out + r * T * H, T * H), dist_rel_err(dx, g->dx + r * T * H, T * H),
                   dist_rel_err(dw, g->dw + r * T * k, T * k), dist_rel_err(dgu, g->dgu + r * G, G),
                   dist_rel_err(ddn, g->ddn + r * D, D)};
    const char *what[5] = {"out", "d_hidden", "d_topk_weights", "d_gate_up_weight", "d_down_weight"};
    for (int i = 0; i < 5; i++) DIST_CHECK(e[i] <= TOL, "%s: %s relative error %.3g > %g", name, what[i], e[i], TOL);
    /* the group size must divide E: a rejection before any collective, on every rank */
    a.n_experts = (int)g->E + 1;
    lk_status s = lk_moe_dispatch_forward(impl, &a, &ctx);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "n_experts"), "%s: E not divisible: %s", name, lk_status_name(s));
    free(out), free(dx), free(dw), free(dgu), free(ddn);
    lk_arena_free(&arena);
}

int main(void) {
    dist_begin();
    int P = dist_world->size;
    global g;
    make(&g, P, 11);
    /* the reference: every token, every expert, one process (local) */
    lk_moe_dispatch_args ref = args_of(&g, 0, g.N, 0, g.E, g.out, g.dx, g.dw, g.dgu, g.ddn);
    lk_arena arena = {0};
    lk_ctx ctx = lk_ctx_cpu(&arena);
    const lk_impl *local = lk_impl_find(LK_OP_MOE_DISPATCH, "local", LK_DEVICE_CPU);
    DIST_CHECK(lk_moe_dispatch_forward(local, &ref, &ctx) == LK_OK && lk_moe_dispatch_backward(local, &ref, &ctx) == LK_OK,
               "reference");
    ctx.comm = dist_world;
    lk_status s = lk_moe_dispatch_forward(local, &ref, &ctx);
    DIST_CHECK(s == LK_EINVAL && strstr(lk_last_error(), "ctx.comm"), "local on %d ranks: %s", P, lk_status_name(s));
    ep_case("alltoall", &g);
    ep_case("allgather", &g);
    lk_arena_free(&arena);
    free_global(&g);
    return dist_end("dist_moe");
}
