/* tail_split.cuh — the last, partial wave of a dk/dv grid split along its walks (fa3_bwd.cu's and
 * fa2.cu's backward, one block an SM). Unmasked, every key block walks every query tile, so a grid
 * of L blocks on W SMs takes ceil(L / W) waves of the same length whatever L % W is: at B 2, H 32,
 * S 8192 the 4,096 blocks are 31 waves and 4 blocks, which run nearly alone at the end (blocks
 * drift apart, so less than a whole wave: measured 1-2% of the backward on an H100,
 * bench/NOTES.md, forty-fifth session). Here the last r = L % W blocks, when they fill at most
 * half a wave, become P parts each (P <= W / r): part p walks steps [p·n / P, (p + 1)·n / P) of
 * its block's n and adds its dK (scaled) and dV in f32 into a workspace of r x [2][bnk][D] that
 * lk_attn_tail_convert rounds into dk and dv afterwards. The parts are the grid's last blocks, so
 * they start as the last full wave's blocks finish. A tail past half a wave idles less than the
 * parts' loads and adds would cost; causal grids run longest first (their last wave is short
 * walks) and flex walks differ in length: neither is split. CUTLASS's stream-K GEMM splits its
 * last waves' tiles the same way ("data-parallel + stream-K"). Built only with CUDA; not
 * installed. */
#ifndef LLMKERN_ATTENTION_TAIL_SPLIT_CUH
#define LLMKERN_ATTENTION_TAIL_SPLIT_CUH

#include <stdint.h>
#include "core/cuda_check.h"
#include "ops/attention/grid_order.cuh"
#include "ops/cuda_util.cuh"

/* A part walks at least this many steps, so its K/V load and the adds of its dK/dV stay small
 * beside its walk (a guess, not tuned: the measured split has parts of 4 steps). */
#define LK_ATTN_TAIL_MIN_STEPS 4

typedef struct {
    int whole;    /* blocks [0, whole) take a key block each, in grid_order.cuh's order */
    int split;    /* the key blocks after them (whole + split = L), each in `parts` blocks */
    int parts;
    int bnk, D;   /* keys a block and the head dim: the workspace's rows */
    float *acc;   /* split x [dK rows bnk | dV rows bnk] x D floats, zeroed before the kernel */
} lk_attn_tail;

/* The split of a call's dk/dv grid: its key blocks of bnk keys, each walking its G heads' query
 * tiles of bmq rows. Unsplit (split 0) unless every block walks them all (no causal, window,
 * documents or BlockMask) and the sums may land in any order (not `deterministic`). */
static inline lk_attn_tail lk_attn_tail_of(const lk_attention_args *a, int bnk, int bmq) {
    const lk_attn_dims d = lk_attn_dims_of(a);
    const int even = !a->causal && !a->window_left && !a->window_right && !a->cu_seqlens_q.data &&
                     !a->block_mask && !a->deterministic;
    const int64_t L = d.B * d.Hkv * lk_cdiv(d.Skv, bnk), n = d.G * lk_cdiv(d.Sq, bmq);
    const int64_t W = lk_attn_wave(), r = L % W;
    lk_attn_tail t = {(int)L, 0, 1, bnk, (int)d.D, NULL};
    const int64_t parts = r ? (W / r < n / LK_ATTN_TAIL_MIN_STEPS ? W / r : n / LK_ATTN_TAIL_MIN_STEPS) : 0;
    if (!even || 2 * r > W || parts < 2) return t;
    t.whole = (int)(L - r), t.split = (int)r, t.parts = (int)parts;
    return t;
}
static inline int64_t lk_attn_tail_grid(const lk_attn_tail &t) { return t.whole + (int64_t)t.split * t.parts; }
static inline size_t lk_attn_tail_bytes(const lk_attn_tail &t) { return (size_t)t.split * 2 * t.bnk * t.D * 4; }

/* Block bi's key block in the unsplit grid's numbering; *part is -1 for a whole block. */
static __device__ __forceinline__ int lk_attn_tail_block(const lk_attn_tail &t, int bi, int *part) {
    if (bi < t.whole) return *part = -1, bi;
    *part = (bi - t.whole) % t.parts;
    return t.whole + (bi - t.whole) / t.parts;
}
/* A part's steps of its block's n: [*i0, *i0 + *n). */
static __device__ __forceinline__ void lk_attn_tail_steps(const lk_attn_tail &t, int part, int *i0, int *n) {
    *i0 = 0;
    if (part < 0) return;
    *i0 = (int)((int64_t)part * *n / t.parts);
    *n = (int)((int64_t)(part + 1) * *n / t.parts) - *i0;
}
/* Where a part of split key block L adds key row kr (of bnk) of dK; dV's row is bnk·D on. */
static __device__ __forceinline__ float *lk_attn_tail_row(const lk_attn_tail &t, int L, int kr) {
    return t.acc + ((int64_t)(L - t.whole) * 2 * t.bnk + kr) * t.D;
}

/* A block a split key block: its sums rounded into dk and dv ([B, Hkv, Skv, D] bf16, laid out
 * as dkl and dvl say). At most half a wave of 2·bnk·D elements each: element by element. */
static __global__ void __launch_bounds__(256) lk_attn_tail_convert(lk_attn_tail t, lk_attn_order order, int heads,
                                                                   int tiles, int Skv, int Hkv, lk_bf16_t *dk,
                                                                   lk_attn_layout dkl, lk_bf16_t *dv,
                                                                   lk_attn_layout dvl) {
    int bhk, kt;
    lk_attn_block_of(order, heads, tiles, t.whole + (int)blockIdx.x, &bhk, &kt);
    const int64_t b = bhk / Hkv, h = bhk % Hkv;
    const float *acc = lk_attn_tail_row(t, t.whole + (int)blockIdx.x, 0);
    for (int i = threadIdx.x; i < 2 * t.bnk * t.D; i += blockDim.x) {
        const int row = i / t.D, key = kt * t.bnk + row % t.bnk;
        const lk_attn_layout &l = row < t.bnk ? dkl : dvl;
        if (key < Skv) (row < t.bnk ? dk : dv)[b * l.b + h * l.h + key * l.s + i % t.D] = __float2bfloat16_rn(acc[i]);
    }
}

#endif
