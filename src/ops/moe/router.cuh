/* router.cuh — device helpers the CUDA routers' per-token kernels share (router.cu's
 * softmax_topk, sigmoid_bias.cu, fake_balanced.cu): a warp a token, its experts spread
 * over the lanes (x = lane + 32m), and a pick being the first-ranked expert after the
 * previous one under one strict total order. Included by the .cu files only. */
#ifndef LLMKERN_MOE_ROUTER_CUH
#define LLMKERN_MOE_ROUTER_CUH

#include <limits.h>
#include <math.h>
#include <type_traits>
#include <cuda_bf16.h>

#define LK_ROUTER_FULL 0xffffffffu
#define LK_ROUTER_WARPS 4   /* tokens a block of the per-token kernels */

/* (a, ai) ranks before (b, bi): the larger score first, the lower index on a tie, as
 * lk_router_topk picks. NaN ranks as -inf, below every number, so an all-NaN row (NaN or
 * infinite logits) is taken in index order like the CPU's. "No candidate" is
 * (-inf, INT_MAX), which every expert ranks before. */
static __device__ __forceinline__ bool lk_router_before(float a, int ai, float b, int bi) {
    a = a != a ? -INFINITY : a;
    b = b != b ? -INFINITY : b;
    return a > b || (a == b && ai < bi);
}

static __device__ __forceinline__ float lk_router_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(LK_ROUTER_FULL, v, o));
    return v;
}

/* Every lane ends with the warp's first-ranked (v, i): lk_router_before is a strict total
 * order on distinct indices. */
static __device__ __forceinline__ void lk_router_warp_best(float &v, int &i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(LK_ROUTER_FULL, v, o);
        int oi = __shfl_xor_sync(LK_ROUTER_FULL, i, o);
        if (lk_router_before(ov, oi, v, i)) v = ov, i = oi;
    }
}

/* Logit x of a row of f32 logits, rounded to bf16 first when round_bf16 (the CPU's
 * lk_router_logits rounds through the storage dtype unless gate_f32). */
static __device__ __forceinline__ float lk_router_logit(const float *z, int x, int round_bf16) {
    float q = z[x];
    return round_bf16 ? __bfloat162float(__float2bfloat16_rn(q)) : q;
}

/* launch(std::integral_constant<int, N>{}) with the kernels' register width N for e
 * experts: the 32-expert slices a lane holds (1, 2, 4, 8, 16), or 0 (any E, from memory). */
template <typename F>
static inline void lk_router_by_width(int64_t e, F launch) {
    const int64_t m = (e + 31) / 32;
    if (m <= 1) launch(std::integral_constant<int, 1>{});
    else if (m <= 2) launch(std::integral_constant<int, 2>{});
    else if (m <= 4) launch(std::integral_constant<int, 4>{});
    else if (m <= 8) launch(std::integral_constant<int, 8>{});
    else if (m <= 16) launch(std::integral_constant<int, 16>{});
    else launch(std::integral_constant<int, 0>{});
}

#endif
