/* fake_balanced.cu — `fake_balanced` MoE router on CUDA (NeMo AutoModel's
 * FakeBalancedGate): the CPU fake_balanced.c's routing, bit for bit, and its aux loss,
 * queued on the stream with no host read and no synchronization (capturable in a CUDA
 * graph). No learned weight, no saved state.
 *
 *   noise 0    a thread a route: ids (t·k + j) mod E, weights route_scale/k.
 *   noise > 0  fake_gate.h's draws: the content hash of hidden summed over the grid into
 *              one device word (its shares add mod 2^64, so the order of the blocks'
 *              atomics does not matter: the same input gives the same seed, in the
 *              forward and in a recompute); a thread an expert for the bias; then a
 *              warp a token: uniform scores + bias, k picks (router.cuh's order, ties to
 *              the lower index, the CPU's lk_router_topk), the weights' draws summed in
 *              order j by every lane. Rows of up to 512 experts keep their scores in
 *              registers, longer ones redraw them for each pick.
 *   aux loss   E · Σ_e count_e² / (T·k)², from router.cu's integer counts, Σ count² in
 *              integers: the CPU's value exactly.
 *   backward   d_hidden = 0 (a memset); no gate gradient exists.
 *
 * ctx->comm must be NULL: its aux loss is not summed over a sequence-parallel group (the
 * learned CUDA routers' is, router_cuda.c).
 * Reached through lk_moe_router_forward / _backward (router.c), which validated every
 * argument; workspace from ctx->arena (a device arena). */
#include "core/cuda_check.h"
#include "llmkern/comm.h"
#include "llmkern/moe.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/cuda_router.h"
#include "ops/moe/fake_gate.h"
#include "ops/moe/router.cuh"

#define WHO "moe_router: fake_balanced (cuda)"
#define WARPS LK_ROUTER_WARPS
#define HASH_THREADS 256
#define HASH_WORDS 16        /* words a thread hashes before the grid grows another block */
#define HASH_MAX_BLOCKS 1024

typedef unsigned long long u64;

/* *acc += Σ_i lk_fake_word(word i, i) over hidden's n bytes (the tail's word too);
 * aligned: the words are 8-byte aligned, else read byte by byte. */
__global__ void __launch_bounds__(HASH_THREADS) hash_words(const unsigned char *p, u64 n, int aligned, u64 *acc) {
    __shared__ u64 sh[HASH_THREADS / 32];
    u64 w = n / 8, h = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < w; i += (u64)gridDim.x * blockDim.x)
        h += lk_fake_word(aligned ? reinterpret_cast<const uint64_t *>(p)[i] : lk_fake_tail(p + 8 * i, 8), i);
    if (blockIdx.x == 0 && threadIdx.x == 0 && n % 8) h += lk_fake_word(lk_fake_tail(p + 8 * w, n % 8), w);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) h += __shfl_xor_sync(LK_ROUTER_FULL, h, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = h;
    __syncthreads();
    if (threadIdx.x) return;
    for (int i = 1; i < HASH_THREADS / 32; i++) h += sh[i];
    atomicAdd(acc, h);   /* integer: any order gives the same sum */
}

__global__ void expert_bias(int64_t E, float noise, const u64 *acc, u64 n, float *bias) {
    int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (x < E) bias[x] = lk_fake_bias(lk_fake_seed(*acc, n), x, noise);
}

__global__ void round_robin(int64_t routes, int64_t E, float w_each, int32_t *ids, float *w) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < routes; r += (int64_t)gridDim.x * blockDim.x)
        ids[r] = (int32_t)(r % E), w[r] = w_each;
}

template <int N>
__global__ void __launch_bounds__(WARPS * 32) noisy_route(int64_t T, int64_t E64, int k, float noise, float scale,
                                                          const u64 *acc, u64 n, const float *bias, int32_t *ids,
                                                          float *w) {
    int64_t t = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (t >= T) return;   /* the whole warp */
    const int E = (int)E64, M = N > 0 ? N : (E + 31) / 32;
    int lane = threadIdx.x & 31;
    uint64_t seed = lk_fake_seed(*acc, n), c0 = lk_fake_score0(E64) + (uint64_t)(t * E64);
    float r[N > 0 ? N : 1];
#pragma unroll
    for (int m = 0; m < M && N > 0; m++) {
        int x = lane + 32 * m;
        if (x < E) r[m] = lk_fake_uniform(seed, c0 + (uint64_t)x) + bias[x];
    }
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll
        for (int m = 0; m < M; m++) {
            int x = lane + 32 * m;
            if (x >= E) continue;
            float q = N > 0 ? r[m] : lk_fake_uniform(seed, c0 + (uint64_t)x) + bias[x];
            if (lk_router_before(pv, pi, q, x) && lk_router_before(q, x, bv, bi)) bv = q, bi = x;
        }
        lk_router_warp_best(bv, bi);
        if (lane == 0) ids[t * k + j] = bi;
        pv = bv, pi = bi;
    }
    uint64_t c1 = lk_fake_weight0(T, E64) + (uint64_t)(t * k);
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += lk_fake_uniform(seed, c1 + (uint64_t)j) + 0x1p-24f;
    for (int j = lane; j < k; j += 32)
        w[t * k + j] = lk_fake_weight(scale, noise, k, lk_fake_uniform(seed, c1 + (uint64_t)j) + 0x1p-24f, sum);
}

/* *aux = E · Σ count² / (T·k)², the sum in integers (exact), the rest as the CPU does. */
__global__ void __launch_bounds__(256) fake_aux(int64_t T, int64_t E, int k, const int32_t *counts, float *aux) {
    __shared__ u64 sh[256];
    u64 s = 0;
    for (int64_t x = threadIdx.x; x < E; x += 256) s += (u64)((int64_t)counts[x] * counts[x]);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    double t = (double)T;
    if (threadIdx.x == 0) *aux = (float)((double)sh[0] * (double)E / (t * k * t * k));
}

/* --- the row ------------------------------------------------------------------------ */

static int64_t experts_of(const lk_moe_router_args *a) {
    return a->n_experts > 0 ? a->n_experts : a->gate_weight.shape[0];
}

static size_t saved_bytes(int64_t t, int64_t e, int64_t k) { return 0; }

/* the hash's word, the biases, the counts */
static size_t workspace_bytes(const lk_moe_router_args *a, int backward) {
    return backward ? 0 : lk_arena_piece(sizeof(u64)) + 2 * lk_arena_piece(sizeof(float) * (size_t)experts_of(a));
}

static lk_status refuse_group(const lk_ctx *ctx) {
    if (ctx->comm == NULL) return LK_OK;
    return lk_error(LK_EINVAL, WHO ": ctx.comm: expected NULL (this router's aux loss is not summed over a "
                    "sequence-parallel group; softmax_topk's and sigmoid_bias's are), got a group of %d rank(s)",
                    ctx->comm->size);
}

static lk_status noisy(const lk_moe_router_args *a, u64 *acc, float *bias, cudaStream_t st) {
    int64_t T = a->hidden.shape[0], E = experts_of(a);
    u64 n = (u64)lk_tensor_bytes(&a->hidden);
    int64_t per = (int64_t)HASH_THREADS * HASH_WORDS, blocks = lk_cdiv((int64_t)(n / 8), per);
    blocks = blocks < 1 ? 1 : blocks > HASH_MAX_BLOCKS ? HASH_MAX_BLOCKS : blocks;
    int aligned = ((uintptr_t)a->hidden.data & 7) == 0;
    float scale = a->route_scale > 0 ? a->route_scale : 1.0f;
    LK_CUDA_TRY(cudaMemsetAsync(acc, 0, sizeof(u64), st));
    hash_words<<<(unsigned)blocks, HASH_THREADS, 0, st>>>((const unsigned char *)a->hidden.data, n, aligned, acc);
    expert_bias<<<(unsigned)lk_cdiv(E, 256), 256, 0, st>>>(E, a->noise, acc, n, bias);
    unsigned g = (unsigned)lk_cdiv(T, WARPS), b = WARPS * 32;
    int32_t *ids = (int32_t *)a->topk_ids.data;
    float *w = (float *)a->topk_weights.data;
    lk_router_by_width(E, [&](auto w_) {
        noisy_route<decltype(w_)::value><<<g, b, 0, st>>>(T, E, a->top_k, a->noise, scale, acc, n, bias, ids, w);
    });
    LK_CUDA_LAUNCHED(WHO ": content hash, bias and routing");
    return LK_OK;
}

static lk_status forward(const lk_moe_router_args *a, lk_ctx *ctx) {
    lk_status s = refuse_group(ctx);
    if (s) return s;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    int64_t T = a->hidden.shape[0], E = experts_of(a);
    int k = a->top_k;
    u64 *acc = (u64 *)lk_arena_alloc(ctx->arena, sizeof(u64));
    float *bias = (float *)lk_arena_alloc(ctx->arena, sizeof(float) * (size_t)E);
    int32_t *counts = (int32_t *)lk_arena_alloc(ctx->arena, sizeof(int32_t) * (size_t)E);
    if (!acc || !bias || !counts)
        return lk_error(LK_ENOMEM, WHO ": arena: expected the reserved workspace, got too little");
    if (a->noise == 0.0f) {
        float scale = a->route_scale > 0 ? a->route_scale : 1.0f;
        int64_t routes = T * k, blocks = lk_cdiv(routes, 256);
        round_robin<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, st>>>(
            routes, E, scale / (float)k, (int32_t *)a->topk_ids.data, (float *)a->topk_weights.data);
        LK_CUDA_LAUNCHED(WHO ": round robin");
    } else if ((s = noisy(a, acc, bias, st))) {
        return s;
    }
    if (!a->aux_loss.data) return LK_OK;
    if ((s = lk_router_cuda_count((const int32_t *)a->topk_ids.data, T * k, E, counts, ctx->stream))) return s;
    fake_aux<<<1, 256, 0, st>>>(T, E, k, counts, (float *)a->aux_loss.data);
    LK_CUDA_LAUNCHED(WHO ": aux loss");
    return LK_OK;
}

static lk_status backward(const lk_moe_router_args *a, lk_ctx *ctx) {
    lk_status s = refuse_group(ctx);
    if (s) return s;
    LK_CUDA_TRY(cudaMemsetAsync(a->d_hidden.data, 0, lk_tensor_bytes(&a->d_hidden), (cudaStream_t)ctx->stream));
    return LK_OK;
}

extern "C" const lk_moe_router_vtable lk_moe_router_cuda_fake_balanced_vtable = {
    LK_MOE_ROUTER_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward,
};
