/* grid_order.cuh — in which order the blocks of a tensor-core attention kernel take their
 * (head, tile) pairs: fa3_bwd.cu's and fa2.cu's key blocks (fa2.cu's forward keeps its 2-D
 * grid: with this header its bf16 D 128 forward spilled 124-132 bytes). A kernel runs
 * heads x tiles blocks on a 1-D grid; tile 0 is the one with the longest walk under a
 * causal mask (the kernels number their tiles so: the last query tile first, or the first
 * key block). Built only with CUDA; not installed.
 *
 * Blocks of one head share its tiles' operands in L2 (Q, dO and the dQ sums for a key
 * block's walk, 8 MB a head at S 8192, D 128; K and V for a query tile's), so blocks running
 * together should be few heads' (L2 holds 50 MB): tiles fastest, a head's blocks side by
 * side (LK_ATTN_ORDER_TILES, unmasked). Under a causal mask a walk is as long as the part
 * of the sequence it sees, and the longest must start first or they finish alone at the
 * end: head-major order (LK_ATTN_ORDER_HEADS: tiles slowest) does that, but runs every head
 * at once (fa3_bwd on B 2, H 32, S 8192 causal read Q and dO from HBM at 55% of its rate, 3%
 * unmasked: bench/NOTES.md, twenty-fifth session). LK_ATTN_ORDER_BANDS splits the tiles into
 * bands of halving width, [0, n/2), [n/2, 3n/4), ..., each taken head by head with tiles
 * fastest: few heads at a time, and the last bands hold only short walks. It is not
 * longest-first inside a band, which a grid of few waves pays for at its end (fa3_bwd's GQA
 * causal cell, 256 blocks: 6% slower), so only grids of LK_ATTN_BAND_WAVES waves or more
 * take it. */
#ifndef LLMKERN_ATTENTION_GRID_ORDER_CUH
#define LLMKERN_ATTENTION_GRID_ORDER_CUH

#include "llmkern/registry.h"
#include "ops/attention/internal.h"

#define LK_ATTN_BAND_WAVES 8

/* Blocks in one wave of a kernel that holds one block an SM: the SMs (132 where unprobed). */
static inline int lk_attn_wave(void) { return lk_hw_get()->cuda_sms > 0 ? lk_hw_get()->cuda_sms : 132; }

/* causal: the walks fall with the tile index (a causal mask; a flex mask whose lists say so,
 * flex_plan.h's `falling`: the tail of a tiles-first grid was its longest walks, ~3% in a
 * list-scheduling model of B 2, H 32, S 8192 causal and prefix-LM) */
static inline lk_attn_order lk_attn_order_of(int causal, int64_t heads, int64_t tiles) {
    const int64_t sms = lk_attn_wave();
    return !causal                                       ? LK_ATTN_ORDER_TILES
           : heads * tiles >= LK_ATTN_BAND_WAVES * sms ? LK_ATTN_ORDER_BANDS
                                                         : LK_ATTN_ORDER_HEADS;
}

/* How many blocks, from the first, walk their query tiles down under a causal GQA mask
 * (fa3_bwd.cu's step_of says why): in a banded grid every one; otherwise the first wave, the
 * blocks that start together (per_sm an SM), while later ones walk up from their diagonals. */
static inline int lk_attn_down_of(lk_attn_order order, int64_t heads, int64_t tiles, int per_sm) {
    return order == LK_ATTN_ORDER_BANDS ? (int)(heads * tiles) : per_sm * lk_attn_wave();
}

static __host__ __device__ __forceinline__ void lk_attn_block_of(lk_attn_order order, int heads, int tiles, int L,
                                                                 int *head, int *tile) {
    if (order == LK_ATTN_ORDER_HEADS) {
        *head = L % heads, *tile = L / heads;
        return;
    }
    int lo = 0, w = tiles;
    if (order == LK_ATTN_ORDER_BANDS)
        for (w = (tiles + 1) / 2; L >= heads * w; w = (tiles - lo + 1) / 2) L -= heads * w, lo += w;
    *head = L / w, *tile = lo + L % w;
}

#endif
