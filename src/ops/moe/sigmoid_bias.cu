/* sigmoid_bias.cu — the per-token kernel of the `sigmoid_bias` MoE router on CUDA
 * (DeepSeek-V3; cuda_router.h), launched by router_cuda.c between the logits GEMM and
 * router.cu's shared aux-loss kernels. The CPU sigmoid_bias.c's choice, step for step:
 *
 *   a warp a token: s = sigmoid(z) into the saved scores, sel = s + e_bias (the
 *   correction bias moves the choice, never the weights); with groups, each lane scores
 *   its groups (the sum of a group's two best sel, read back from the saved row: the
 *   lanes own experts x = lane + 32m, the groups are contiguous runs) and keeps a group
 *   when fewer than topk_group groups rank before it (the CPU's greedy pick, as a rank);
 *   then k picks among the kept experts as softmax_topk's (router.cuh's order: larger
 *   first, lower index on a tie), weights s of the chosen, over their sum in pick order
 *   when normalized, times route_scale.
 *
 * A row of up to 512 experts keeps sel in registers (16 a lane); longer rows recompute
 * it from the saved s. The group scores and the kept-group flags live in a [T, n_group]
 * workspace, so any group count works. sigmoid is 1 / (1 + expf(-z)) (CUDA's expf, 2
 * ulp; the CPU's polynomial exp differs by a few f32 ulps, well inside the tolerance). */
#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe/cuda_router.h"
#include "ops/moe/router.cuh"

#define WARPS LK_ROUTER_WARPS

/* sel of expert x of the row: s + bias, one f32 add as on the CPU. */
static __device__ __forceinline__ float sel_of(const float *vr, const float *bias, int x) {
    return vr[x] + (bias ? bias[x] : 0.0f);
}

/* The group limit of one token: gsr[g] = group g's score, kr[g] = 1 when g is kept. */
static __device__ __forceinline__ void keep_groups(const float *vr, const float *bias, int E, int ng, int topk_group,
                                                   float *gsr, unsigned char *kr, int lane) {
    int gs = E / ng;
    for (int g = lane; g < ng; g += 32) {
        float b1 = -INFINITY, b2 = -INFINITY;
        int i1 = INT_MAX, i2 = INT_MAX;
        for (int x = g * gs; x < (g + 1) * gs; x++) {
            float q = sel_of(vr, bias, x);
            if (lk_router_before(q, x, b1, i1)) b2 = b1, i2 = i1, b1 = q, i1 = x;
            else if (lk_router_before(q, x, b2, i2)) b2 = q, i2 = x;
        }
        gsr[g] = gs > 1 ? b1 + b2 : b1;
    }
    __syncwarp();
    for (int g = lane; g < ng; g += 32) {
        float q = gsr[g];
        int rank = 0;
        for (int h = 0; h < ng; h++) rank += lk_router_before(gsr[h], h, q, g);
        kr[g] = rank < topk_group;
    }
    __syncwarp();
}

template <int N>
__global__ void __launch_bounds__(WARPS * 32) sigmoid_bias(lk_router_cuda_dims d, lk_router_cuda_groups gr,
                                                           const float *z, float *v, int32_t *sids, int32_t *ids,
                                                           float *w, float *vsum) {
    int64_t t = blockIdx.x * (int64_t)WARPS + threadIdx.x / 32;
    if (t >= d.t) return;   /* the whole warp */
    const int M = N > 0 ? N : (int)((d.e + 31) / 32), E = (int)d.e;
    int lane = threadIdx.x & 31;
    const float *zr = z + t * d.e, *bias = gr.bias;
    float *vr = v + t * d.e, r[N > 0 ? N : 1], vs = 0.0f;
#pragma unroll
    for (int m = 0; m < M; m++) {
        int x = lane + 32 * m;
        if (x >= E) continue;
        float s = 1.0f / (1.0f + expf(-lk_router_logit(zr, x, d.round_bf16)));
        vr[x] = s;
        vs += s;
        if (N > 0) r[m] = s + (bias ? bias[x] : 0.0f);
    }
    vs = lk_warp_sum(vs);
    if (vsum && lane == 0) vsum[t] = vs;
    __syncwarp();   /* the row, read by every lane below */
    const unsigned char *kr = NULL;
    int gs = 1;
    if (gr.n_group > 1) {
        unsigned char *kw = gr.keep + t * gr.n_group;
        keep_groups(vr, bias, E, gr.n_group, gr.topk_group, gr.gscore + t * gr.n_group, kw, lane);
        kr = kw, gs = E / gr.n_group;
    }
    int32_t *si = sids + t * d.k, *oi = ids + t * d.k;
    float *wr = w + t * d.k, pv = INFINITY, S = 0.0f;
    int pi = -1;
    for (int j = 0; j < d.k; j++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
#pragma unroll
        for (int m = 0; m < M; m++) {
            int x = lane + 32 * m;
            if (x >= E || (kr && !kr[x / gs])) continue;
            float q = N > 0 ? r[m] : sel_of(vr, bias, x);
            if (lk_router_before(pv, pi, q, x) && lk_router_before(q, x, bv, bi)) bv = q, bi = x;
        }
        lk_router_warp_best(bv, bi);
        float s = bi < E ? vr[bi] : __int_as_float(0x7fffffff);   /* the unbiased score; NaN: none (never) */
        if (lane == 0) si[j] = bi, oi[j] = bi, wr[j] = s;
        S += s, pv = bv, pi = bi;
    }
    __syncwarp();   /* lane 0's weights, read by every lane */
    float mul = d.norm ? d.scale / S : d.scale;
    for (int j = lane; j < d.k; j += 32) wr[j] *= mul;
}

extern "C" lk_status lk_router_cuda_sigmoid_bias(const lk_router_cuda_dims *d, const lk_router_cuda_groups *g,
                                                 const float *z, float *v, int32_t *saved_ids, int32_t *topk_ids,
                                                 float *w, float *vsum, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    unsigned blocks = (unsigned)lk_cdiv(d->t, WARPS), b = WARPS * 32;
    lk_router_by_width(d->e, [&](auto n) {
        sigmoid_bias<decltype(n)::value><<<blocks, b, 0, st>>>(*d, *g, z, v, saved_ids, topk_ids, w, vsum);
    });
    LK_CUDA_LAUNCHED("moe_router: sigmoid_bias (cuda): sigmoid and group-limited top-k");
    return LK_OK;
}
