/* fake_balanced.c — `fake_balanced`, the benchmark gate of the described system
 * (NeMo AutoModel's FakeBalancedGate): routing without a learned weight, so expert
 * load is a knob rather than an accident of training.
 *   noise 0:  token t takes experts (t·k + j) mod E, weight 1/k: every expert gets
 *             T·k/E routes (±1).
 *   noise > 0: a generator seeded by a hash of the whole hidden tensor draws, per token,
 *             uniform scores plus a per-expert bias N(0, 1)·0.1·noise (a few experts
 *             systematically hot) and takes the top k (never one expert twice); weights
 *             (1 - noise)/k + noise·r_j/Σr with r uniform. The same input — the forward
 *             and an activation-checkpointing recompute — always routes the same way;
 *             another input (another step) routes differently. The draws are
 *             fake_gate.h's, shared with the CUDA row (fake_balanced.cu), which routes
 *             an input as this row does, bit for bit.
 * The weights do not depend on hidden: d_hidden is zero and no gate gradient exists.
 * aux_loss = E · Σ_e f_e² with f_e the routing fraction: 1 when balanced.
 * Reached through lk_moe_router_forward / _backward (router.c). */
#include <math.h>
#include <string.h>
#include "ops/moe/fake_gate.h"
#include "ops/moe/router_core.h"

static size_t saved_bytes(int64_t t, int64_t e, int64_t k) { return 0; }

static size_t workspace_bytes(const lk_moe_router_args *a, int backward) {
    return 2 * lk_dense_piece(sizeof(double) * (size_t)(lk_router_experts(a) + 1));
}

/* The seed: fake_gate.h's hash of every byte of hidden, its words' shares summed in
 * any order (here over the threads). */
static uint64_t content_hash(const lk_tensor *x) {
    const unsigned char *p = x->data;
    size_t n = lk_tensor_bytes(x), w = n / 8;
    uint64_t h = 0;
    #pragma omp parallel for schedule(static) reduction(+ : h) if (w >= LK_MOE_PAR_MIN)
    for (size_t i = 0; i < w; i++) {
        uint64_t v;
        memcpy(&v, p + 8 * i, 8);
        h += lk_fake_word(v, i);
    }
    if (n % 8) h += lk_fake_word(lk_fake_tail(p + 8 * w, n % 8), w);
    return lk_fake_seed(h, n);
}

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx) {
    int64_t t = a->hidden.shape[0], e = lk_router_experts(a);
    int k = a->top_k;
    int32_t *ids = a->topk_ids.data;
    float *w = a->topk_weights.data, sc = a->route_scale > 0 ? a->route_scale : 1.0f, noise = a->noise;
    if (noise == 0.0f) {
        #pragma omp parallel for schedule(static) if (t * k >= LK_MOE_PAR_MIN)
        for (int64_t r = 0; r < t * k; r++) {
            ids[r] = (int32_t)(r % e);
            w[r] = sc / (float)k;
        }
    } else {
        uint64_t seed = content_hash(&a->hidden);
        float *bias = lk_arena_alloc(ctx->arena, sizeof(double) * (size_t)e);
        if (!bias) return LK_MOE_NOMEM("moe_router");
        for (int64_t x = 0; x < e; x++) bias[x] = lk_fake_bias(seed, x, noise);
        uint64_t score0 = lk_fake_score0(e), weight0 = lk_fake_weight0(t, e);
        #pragma omp parallel if (t * e >= LK_MOE_PAR_MIN)
        {
            float s[e];
            #pragma omp for schedule(static)
            for (int64_t tok = 0; tok < t; tok++) {
                for (int64_t x = 0; x < e; x++) s[x] = lk_fake_uniform(seed, score0 + (uint64_t)(tok * e + x)) + bias[x];
                lk_router_topk(s, NULL, e, k, ids + tok * k);
                float r[k], sum = 0.0f;
                for (int j = 0; j < k; j++) sum += r[j] = lk_fake_uniform(seed, weight0 + (uint64_t)(tok * k + j)) + 0x1p-24f;
                for (int j = 0; j < k; j++) w[tok * k + j] = lk_fake_weight(sc, noise, k, r[j], sum);
            }
        }
    }
    if (a->aux_loss.data) {   /* the routing fractions over the group's tokens (moe.h) */
        double *c = lk_arena_alloc(ctx->arena, sizeof(double) * (size_t)(e + 1)), aux = 0.0;
        if (!c) return LK_MOE_NOMEM("moe_router");
        memset(c, 0, sizeof(double) * (size_t)e);
        for (int64_t r = 0; r < t * k; r++) c[ids[r]] += 1.0;
        c[e] = (double)t;
        lk_status s = lk_router_group_sum(ctx, c, e + 1);
        if (s) return s;
        for (int64_t x = 0; x < e; x++) aux += c[x] * c[x];
        *(float *)a->aux_loss.data = c[e] > 0 ? (float)(aux * (double)e / (c[e] * k * c[e] * k)) : 0.0f;
    }
    return LK_OK;
}

static lk_status backward(const lk_moe_router_args *a, lk_ctx *ctx) {
    memset(a->d_hidden.data, 0, lk_tensor_bytes(&a->d_hidden));
    return LK_OK;
}

const lk_moe_router_vtable lk_moe_router_fake_balanced_vtable = {
    .version = LK_MOE_ROUTER_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
