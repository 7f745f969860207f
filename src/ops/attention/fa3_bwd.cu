/* fa3_bwd.cu — flash_attention_3's backward on Hopper (sm_90a): FlashAttention-2's
 * order (a block owns keys, walks the query rows that see them, recomputes P from the
 * saved LSE) on wgmma with TMA loads, written for llmkern. bf16 in and out, f32 inside.
 *
 *   prep       a warp a query row (padded to 64-row tiles): delta = rowsum(dO ∘ O), the
 *              LSE in log2 units (+inf where a row sees nothing or lies past S_q, so its
 *              P is 0), each row's visible keys [lo, hi), the sink's share; laid out so
 *              one 512-byte bulk copy brings a tile's LSE and delta, another its lo/hi.
 *   a block    128 keys of one (b, h_kv); three warpgroups (384 threads):
 *   producer   warpgroup 0 (setmaxnreg 56) is producer and dQ warpgroup at once. Its thread 0
 *   and dQ     loads K and V once by TMA, then, for every q head of the group and every
 *              64-row query tile that sees the keys, Q, dO (a 4-D tensor map over [B, S, H,
 *              D]) and the tile's stats into a three-stage ring (mbarriers: `full` by TMA's
 *              transaction bytes, `empty` by the math warpgroups' arrivals), two steps ahead
 *              of the math (step it + 2 once step it - 1 has freed its stage). All 128 threads
 *              then take dQ of every step as dQᵀ = Kᵀ·dSᵀ in m64n32 chunks (d block h x 32
 *              queries over all 128 keys; 2·(DP / 64) chunks a step, 16 f32 accumulators a
 *              thread), each chunk added from the registers with 16-byte reductions in L2
 *              (red.global.add.v4.f32) into an f32 workspace kept in the accumulator's own
 *              order (a warp's adds are 512 contiguous bytes); fa3_dq_convert puts the sums
 *              back in [B, H, S, D], times the scale, in bf16. Not bit-reproducible (the adds
 *              land in any order): `deterministic` runs fa2.cu's separate dQ pass.
 *   math       warpgroups 1 and 2 own 64 keys each (setmaxnreg 224). With keys as the M
 *              dimension, Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (wgmma from shared memory; Sᵀ issued
 *              a step ahead, behind the step before's dV and dK; P is formed while dPᵀ
 *              runs) leave Pᵀ and dSᵀ = Pᵀ ∘ (dPᵀ − δ)
 *              in the accumulator layout that is already the A operand of
 *              dV += Pᵀ·dO and dK += dSᵀ·Q (wgmma with A in registers, dV and dK in
 *              registers for the whole walk, GQA's G heads summed there: no atomics on
 *              dK/dV). They store dS (not dSᵀ: rows of queries, keys contiguous, stmatrix
 *              .trans) into one of three buffers, a K-major B of n32 for the dQ warpgroup:
 *              both operands canonical wgmma layouts. The buffers hand over on mbarriers
 *              both ways (`dsfull`: both math warpgroups wrote it; `dsempty`: the dQ
 *              warpgroup read it). No dQ GEMM to wait on and no L2 reductions in the math
 *              warpgroups' step: the dQ GEMMs fill the tensor pipe while both compute P or
 *              dS, and the two math warpgroups never meet at a barrier, so they drift apart
 *              and one's softmax meets the other's GEMMs.
 * q, k, v, dq, dk and dv may be strided views (attention.h): Q, K and V come through 4-D maps
 * with their own strides (hopper.cuh's view_map), dK and dV rows and fa3_dq_convert's are
 * stored at their tensors' strides (lk_attn_layout).
 * dSᵀ comes from the f32 Pᵀ, not its bf16 rounding: the tests' dq and dk errors fell 20-45% at
 * the same speed (sixteenth session), and dV and dK are then issued together.
 * Measured on the H200 (bench/NOTES.md, twelfth session, call 1): fwd+bwd 0.83-0.94x SDPA-cuDNN
 * in the four cells, where the first design — each math warpgroup its own dQ = dS·K a step
 * late, producer a lone thread with 24 registers — ran 0.73-0.87x in the same run (it is
 * gone; git has it, 9981edd and before); 0.96-0.99x in the thirtieth session, whose
 * profile beside cuDNN's own backward (persistent, 17% fewer operand bytes from shared
 * memory, tensor pipe 67% where this kernel's is 60%) NOTES gives with the layouts counted.
 * Tried and measured slower (thirty-first session): this kernel made persistent (a block an SM
 * taking key blocks in turn, the next one's K/V loading while dK/dV leave: 3bb2b0c, bc1ab4c,
 * +2-24%), and dQ converted by the step that adds last into its tile (f78afe5, +16-70%);
 * in the thirty-second, prep zeroing the dQ workspace in place of its cudaMemsetAsync
 * (d214a31: sliding +0.9%, documents +0.5%, the rest level: the memset runs at HBM's rate);
 * in the thirty-fourth, prep taking four rows a half-warp with their loads issued together
 * (ec423a0: sliding +0.7%, the rest level); in the forty-fifth, dK += dSᵀ·Q with dSᵀ read back
 * from the dS buffer, so the next step's Sᵀ/dPᵀ issue before dK is waited on (the pipe never
 * drains between steps; 32 registers fewer live there): +2-5% in every cell and flex's
 * (wip-s45-ovl 4bd4d21, edc5772): the 16 KB more of shared-memory reads a step cost more than
 * the overlap won, as the shared-memory pipe, not the tensor pipe's gaps, bounds the step. Also the
 * forty-fifth's and forty-sixth's, at B 2, H 32, S 8192 full (9.5 ms): without dQ at all 6.25 ms; with
 * its GEMMs and the chunks stored to shared memory in place of the adds, 8.96 ms; so the dQ GEMMs
 * cost ~2.7 ms (their operands are 96 of a step's 336 KB of shared-memory reads: each m64n32
 * chunk re-reads K's 16 KB) and the adds ~0.5 (plain global stores cost the same; the
 * forty-fifth's "GEMMs alone cost nothing" was ptxas dropping GEMMs whose results went unused).
 * Slower: one 8 KB bulk reduction a chunk from shared memory (wip-s45-tma b3ff480, +29%; a whole
 * step staged, wip-s45-tma2 16ff3ae, as slow); each chunk parked in shared memory and added
 * under the next chunk's wgmma (wip-s45-stage 9bcab67, +19%); the adds made by the math
 * warpgroups from the parked chunks (wip-s46-diagmath, a diagnostic: +4%). Two accumulators, to
 * issue the next chunk before adding this one, do not fit the 56 registers (C7512 and 150-340
 * bytes spilled at n32 and at n16). Fewer shared-memory bytes for dQ need registers this
 * warpgroup does not have (m64n64 chunks, or dS as register A: 32 more). FlashAttention-3's answer,
 * dQ = dS·K in the math warpgroups (m64n64, their d block over all 128 keys, 24 / 240 / 240,
 * the step's operand reads 336 -> 304 KB), ran 5-13% slower (forty-seventh session, wip-s47-mathdq
 * and -c: its wait or its adds land on the math warpgroups' path, where the dQ warpgroup's run
 * beside it); so did cuDNN's own split, each step's whole m64n128 dQ in one math warpgroup
 * in turn (wip-s47-alt, +4-12%; cuDNN adds it through shared memory and TMA, 32 KB this
 * kernel has not got). Turns taken at the GEMM issues (ping-pong, as fa3.cu's) were 1-1.5%
 * slower (wip-s47-pp, -pp1): the two warpgroups' free drift already overlaps one's softmax
 * with the other's GEMMs; and the producer sending step it + 3 early, 1.5-4.4% slower
 * (wip-s47-early), or from inside the dQ chain, after its first chunk or before its last, +10%
 * and +4% unmasked (wip-s50-midprod, -midprod3: the chain is the producer's path). The
 * softmax's LSE read before Sᵀ's wait, +1.6% unmasked (wip-s51-lsefirst: the shared-memory
 * pipe's load, not the loads' place, sets their latency). The backward in chunks of kv heads
 * whose dQ sums fit L2, each chunk's memset, walk and convert in turn (fifty-fifth, wip-s54-chunks):
 * sliding +24%, documents +34%, causal +6% at 16 MB (+12%, +20%, +1% at 32 MB): every chunk's
 * grid drains before its convert, and the tails cost more than the workspace's HBM passes.
 * Each math warpgroup issues the next step's Sᵀ behind its dV and dK before waiting for them
 * (forty-ninth session: -0.3 to -1.2% in ncu; in the fwd+bwd rows level to -1.4%, within the
 * H100's power-capped noise). A block whose rows all see all its keys (no mask, no key past
 * S_kv) loads no lo/hi rows a step and skips the `whole` test (fiftieth: -1.1% and -1.3% in
 * cycles on the two unmasked cells); a grid of such blocks alone runs the OPEN instance, with
 * the masked blocks' code compiled out, and the masked blocks read their `whole` bounds a step
 * early (fifty-second, H100 cycles: full -2.8%, GQA full -2.4%, causal -3.0%, GQA causal
 * +0.4%); a causal grid with no other mask runs the CAUSAL instance, whose mask is arithmetic
 * on the step's query tile (no lo/hi rows loaded; GQA causal -3.4%, causal -0.6%), and whose
 * walk is known causal and never split at compile time. The wgmma descriptors stay in uniform
 * registers (the warpgroup index and the dQ chunk's dS descriptor made warp-uniform by a
 * shuffle; before, each wgmma took two R2UR and a 64-bit add in ordinary registers, the math
 * loop 403 -> 333 instructions a step): fifty-third session, with the walk's and the row
 * intervals' compile-time mask kinds, H100 cycles full -2.7%, GQA full -2.3%, causal -1.1%
 * (-3.7% without the uniform registers, one round), GQA causal -0.3%. The walk's
 * step is found by one multiply (walk_div): a `/` and `%` by a run-time value there, ~40
 * dependent instructions twice a step in the dQ warpgroup and twice in the producer, had made
 * the producer late with the loads the math warpgroups wait on (their `full` wait 13.3% of the
 * stall samples, then 8.6%): -7% in cycles on the unmasked cells, -4% on GQA causal (fiftieth
 * session).
 * Unmasked, the grid's last partial wave runs split into parts that add their dK/dV in f32
 * (tail_split.cuh): B 2, H 32, S 8192 fwd+bwd -1% to -5% on an H100 over two calls
 * (bench/NOTES.md, forty-fifth session).
 * A fourth warpgroup for dQ alone does not fit the registers (24 + 56 + 2 · 224 > 504 a
 * thread); nor do m64n64 dQ chunks (64 + 2 · 216: the math warpgroups spill); nor dV issued
 * before dPᵀ is waited for, to run while dS is formed (forty-eighth session: P's bf16 pack live
 * beside Pᵀ and dPᵀ serialized every wgmma, C7512, and spilled 48-100 bytes).
 * Layouts are fa3.cu's (rows of 64 elements in TMA's 128-byte swizzle). What this kernel
 * does not take — softcap, `deterministic`, and everything fa3.cu's forward hands to
 * fa2.cu — runs on fa2.cu's backward under the same row.
 * flex_attention (FLEX, issue 19): a block's keys are one 128-key tile of the BlockMask; the
 * producer walks its query steps (flex_walk) and brings a partial step's bits (by key, 1 KB)
 * into the stage beside the stats; ALiBi (a flag) adds its bias before P is formed. */
#include <math.h>
#include <string.h>
#include "core/cuda_check.h"
#include "ops/attention/flex_plan.h"
#include "ops/attention/grid_order.cuh"
#include "ops/attention/hopper.cuh"
#include "ops/attention/internal.h"
#include "ops/attention/tail_split.cuh"
#include "ops/attention/visible.cuh"
#include "ops/cuda_util.cuh"

#define BNK 128           /* keys a block, 64 a consumer warpgroup */
#define BMQ 64            /* query rows a step */
#define STAGES 3
/* dSᵀ buffers: dQ of step t runs in step t + 1 and a warpgroup may be a step ahead of the
 * other, so a buffer is rewritten two steps after its last reader finished. */
#define NDS 3
#define THREADS 384       /* producer and dQ + 2 math warpgroups */
/* setmaxnreg budgets. setmaxnreg only moves registers within the block's allocation at
 * launch: 168 a thread (the most __launch_bounds__(384, 1) allows; ptxas -v says 168 for
 * every instantiation) x 384 = 64,512, so the three warpgroups' budgets, multiples of 8,
 * must sum to at most 168 · 3 = 504 a thread. A setmaxnreg.inc that the pool cannot meet
 * waits for ever (USETMAXREG.TRY_ALLOC in a loop): the first budgets, 64 + 224 + 224 = 512
 * (65,536), hung on the H200 in the math warpgroups' inc. Now producer-and-dQ 56 + math 224
 * + 224 = 504. The dQ warpgroup's 56 holds one m64n32 accumulator (16) and its addresses:
 * ptxas wants at least 64 for a region with an m64n64 wgmma (and drops setmaxnreg below
 * that, C7507), 48 for m64n32. The math warpgroups need 224 at D 128 (dK, dV 128; Sᵀ, dPᵀ
 * 64; their bf16 packs: 216 spilled 332 bytes). */
#define REG_DQ 56
#define REG_MATH 224
#define LOG2E 1.4426950408889634f
#define CHUNK 4096        /* f32 of one 64 x 64 dQ chunk */

typedef struct {
    const float *stats;   /* [B·Hq][nqt][lse2 64 | delta 64] */
    const int *rows;      /* [nqt][lo 64 | hi 64] */
    float *dq_acc;        /* [B·Hq][nqt][DP / 64][CHUNK], each chunk in the accumulator's order */
    lk_bf16_t *dk, *dv;   /* [B, Hkv, Skv, D], contiguous or views */
    lk_attn_layout dkl, dvl;
    lk_attn_vis vis;
    int Sq, Skv, Hq, Hkv, G, D, nqt;
    float scale, scale2;  /* scale, scale · log2e */
    int heads, nkt;       /* B·Hkv and the key blocks of each: the grid is heads·nkt blocks */
    lk_attn_order order;  /* grid_order.cuh's, for heads x nkt */
    int down;             /* causal GQA: blocks [0, down) walk their tiles down (step_of) */
    lk_flex_map fx;       /* flex_attention: the BlockMask's tiles on the device (flex_plan.h) */
    const float *alibi;   /* flex's ALiBi score_mod: log2e · slope of each q head (device), or NULL */
    lk_attn_tail tail;    /* unmasked: the last wave's key blocks in parts (tail_split.cuh) */
} bwd_geom;

extern "C" void lk_attn_grid_block(lk_attn_order order, int heads, int tiles, int L, int *head, int *tile) {
    lk_attn_block_of(order, heads, tiles, L, head, tile);
}

/* --- prep and convert ----------------------------------------------------------------- */

/* Half a warp a query row (padded to 64-row tiles), a lane 8 elements of O and of dO in one
 * 16-byte load each (D is a multiple of 8 and at most 128; the tensors 16-byte aligned): the
 * first version, a warp a row and a lane 2 bytes a load, ran at a fraction of HBM's rate
 * (with the convert's first version ~7.8 ms of a 0.6B dense step; now 79 + 93 us a layer,
 * 4.8 ms: bench/NOTES.md, eighteenth session). */
static __global__ void __launch_bounds__(256) fa3_bwd_prep(const lk_bf16_t *out, const lk_bf16_t *dout,
                                                           const float *lse, const float *sink, float *stats,
                                                           int *rows, float *sink_part, lk_attn_vis vis, int64_t BH,
                                                           int Hq, int Sq, int D, int nqt) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 4;
    const int c = threadIdx.x & 15;
    const bool live = r < BH * nqt * BMQ;
    const int i = live ? (int)(r % ((int64_t)nqt * BMQ)) : Sq;
    const int64_t bh = live ? r / ((int64_t)nqt * BMQ) : 0, b = bh / Hq;
    const int h = (int)(bh % Hq), qt = i / BMQ, ri = i % BMQ;
    float delta = 0.0f;
    if (i < Sq && 8 * c < D) {
        const int64_t off = ((b * Sq + i) * Hq + h) * D + 8 * c;
        const uint4 o = *reinterpret_cast<const uint4 *>(out + off), g = *reinterpret_cast<const uint4 *>(dout + off);
        const __nv_bfloat162 *o2 = reinterpret_cast<const __nv_bfloat162 *>(&o),
                             *g2 = reinterpret_cast<const __nv_bfloat162 *>(&g);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 x = __bfloat1622float2(o2[e]), y = __bfloat1622float2(g2[e]);
            delta += x.x * y.x + x.y * y.y;
        }
    }
    delta = lk_group_sum<16>(delta);
    if (!live || c) return;
    float lse2 = INFINITY;
    if (i < Sq) {
        const float l = lse[bh * Sq + i];
        if (l > -INFINITY) lse2 = l * LOG2E;
        if (sink_part) sink_part[bh * Sq + i] = l > -INFINITY ? -expf(sink[h] - l) * delta : 0.0f;
    } else {
        delta = 0.0f;
    }
    float *st = stats + (bh * nqt + qt) * 2 * BMQ;
    st[ri] = lse2, st[BMQ + ri] = delta;
    if (bh == 0) {   /* rows past S_q see nothing: lo = hi = S_kv keeps a tile with them on the masked path */
        int lo = vis.Skv, hi = vis.Skv;
        if (i < Sq) lk_attn_row_iv(vis, i, lo, hi);
        rows[qt * 2 * BMQ + ri] = lo, rows[qt * 2 * BMQ + BMQ + ri] = hi;
    }
}

/* dq[b, h, i, d] = scale · the sum the workspace holds for it. A block a 64 x 64 chunk (query
 * tile qt, d block hb): its two m64n32 halves of a dQᵀ accumulator (queries 32qh.. as the
 * n32, d as the m64; element e of thread t at (e / 4)·512 + 4t + e % 4: rows m and m + 8,
 * columns n and n + 1 in one float4) read as float4s in that order, so a warp reads 512
 * contiguous bytes; turned in shared memory (68 floats a row: the float4s' four stores of
 * a warp fall on 32 different banks); each thread then writes 16 bf16 of one query row.
 * The first version read the workspace straight into rows (8 useful bytes of each 64). */
static __global__ void __launch_bounds__(256) fa3_dq_convert(const float *acc, lk_bf16_t *dq, lk_attn_layout dql,
                                                             int Hq, int Sq, int D, int nqt, int nhb, float scale) {
    __shared__ float tile[BMQ][68];   /* [query][d] */
    const int64_t ch = blockIdx.x, bq = ch / nhb, bh = bq / nqt;
    const int hb = (int)(ch % nhb), qt = (int)(bq % nqt);
    const float4 *src = reinterpret_cast<const float4 *>(acc + ch * CHUNK);
#pragma unroll
    for (int k = threadIdx.x; k < CHUNK / 4; k += 256) {
        const float4 v = src[k];
        const int t = k & 127, l = t & 31;
        const int m = 16 * (t >> 5) + l / 4, n = 32 * (k >> 9) + 8 * ((k >> 7) & 3) + 2 * (l % 4);
        tile[n][m] = v.x, tile[n + 1][m] = v.y, tile[n][m + 8] = v.z, tile[n + 1][m + 8] = v.w;
    }
    __syncthreads();
    const int q = threadIdx.x >> 2, d0 = (threadIdx.x & 3) * 16, i = qt * BMQ + q, dn = D - hb * 64 - d0;
    if (i >= Sq || dn <= 0) return;
    lk_bf16_t *o = dq + bh / Hq * dql.b + bh % Hq * dql.h + i * dql.s + hb * 64 + d0;
    const float *x = &tile[q][d0];
    if (dn >= 16) {   /* D % 8 == 0, dq 16-byte aligned and its strides 8-element multiples (lk_attn_fa3_bwd_takes) */
        uint4 u[2];
        uint32_t *w = reinterpret_cast<uint32_t *>(u);
#pragma unroll
        for (int e = 0; e < 8; e++) w[e] = lk_pack_bf16x2(x[2 * e] * scale, x[2 * e + 1] * scale);
        reinterpret_cast<uint4 *>(o)[0] = u[0], reinterpret_cast<uint4 *>(o)[1] = u[1];
    } else {
        for (int e = 0; e < dn; e++) o[e] = __float2bfloat16_rn(x[e] * scale);
    }
}

/* --- the kernel ---------------------------------------------------------------------- */

#if FA3_ARCH
/* The dQ warpgroup, one chunk: dQᵀ[64h, 64h + 64)[32qh, 32qh + 32) = Kᵀ·dSᵀ over all
 * BNK keys of the block, m64n32 (16 f32 a thread). A is K's column block h read MN-major
 * (d contiguous: one 128-byte swizzle atom is m64); B is the dS buffer, stored K-major by
 * the math warpgroups ([query][key]: keys 64c..64c + 63 in the 8 KB block c, a query's 64
 * keys one 128-byte row), so n32 is four 8-row groups SBO apart: canonical layouts only. */
static __device__ __forceinline__ void issue_dqt(float *dq, const uint8_t *dsb, const uint8_t *kh, int qh) {
    const uint64_t a0 = desc(kh, BNK * 128, 1024), b0 = warp_uniform(desc(dsb + qh * (32 * 128), 16, 1024));
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BNK / 16; k++)
        wgmma_ss_n32_ta(dq, desc_at(a0, k * 2048), desc_at(b0, (k / 4) * (BMQ * 128) + (k % 4) * 32), k > 0);
    wgmma_commit();
}

/* An m64n32 chunk (16 f32 a thread) into its 2,048 workspace floats, in the accumulator's order. */
static __device__ __forceinline__ void add_dqt(float *chunk, const float *dq) {
#pragma unroll
    for (int j = 0; j < 4; j++) red_add_v4(chunk + j * 512, dq + 4 * j);
}

#endif

/* A flex block's walk: the G query heads of kv head hk in turn, each head's q tiles of mask
 * tile kt (partial first), a tile in two steps of BMQ rows. Only the producer walks (two
 * steps ahead of the others; the dQ warpgroup's 56 registers hold no second walk): take()
 * returns the step's head, its 64-row query tile, the bits tile (-1: full) and the half of
 * the mask tile, which travel with the stage (the math warpgroups) and on to the dS buffer
 * (the dQ warpgroup). A tile's two list entries are read when the walk enters it, a step
 * before their first use: read in take(), their L2 round trip sat on the producer's path
 * before each load it sends. The walk keeps only its position; the map comes from the
 * geometry. */
struct flex_walk {
    int j, e, half, np, nall, row;   /* int: flex_plan.c keeps a map's cells under 2^29 */
    int2 tile;                       /* q_idx and q_bit of entry e (q_bit whatever e: -1 past np) */
    /* the next head with any tile, from j on, and its first entry */
    __device__ __forceinline__ void head(const lk_flex_map &fx, int b, int hk, int G, int kt) {
        for (; j < G; j++) {
            row = lk_flex_q_row(&fx, b, hk * G + j, kt), np = fx.q_cnt[2 * row], nall = np + fx.q_cnt[2 * row + 1];
            if (nall) break;
        }
        if (j < G) enter(fx);
    }
    __device__ __forceinline__ void enter(const lk_flex_map &fx) {
        tile = make_int2(fx.q_idx[row * fx.nq + e], fx.q_bit[row * fx.nq + e]);
    }
    __device__ __forceinline__ int4 take(const lk_flex_map &fx, int b, int hk, int G, int kt) {
        static_assert(LK_FLEX_TILE == 2 * BMQ, "a mask tile's rows are two steps");
        const int4 r = make_int4(hk * G + j, 2 * tile.x + half, e < np ? tile.y : -1, half);
        if (++half == 2) {
            half = 0;
            if (++e == nall) e = 0, j++, head(fx, b, hk, G, kt);
            else enter(fx);
        }
        return r;
    }
};

/* Step it of key block kt, whose heads' walks are nq tiles from qt0: (the head within the
 * group, the query tile). An unmasked block starts at tile kt, so blocks in flight add into
 * different dQ tiles; a causal block of one head walks up from its diagonal (as flex's walk,
 * 6% faster on the dense trainer's documents: bench/NOTES.md). A causal GQA block takes each
 * tile's G heads in turn, from head kt % G (off the dQ rows of the group's other blocks), so a
 * group's blocks in flight read the same tiles; walked head by head, their walks (two tiles a
 * head apart in length) drift apart until they read all the group's heads at once and L2
 * misses (B 1, Hq 64, Hkv 8, S 4096 on an H100: fwd+bwd 2.65-2.68 ms, now 1.91-1.93).
 * Blocks [0, g.down) walk down from the last tile, the others up from their diagonals. In a
 * head-major grid (longest first: grid_order.cuh) g.down is the first wave, whose blocks
 * start together and so stay level walking down; a later block starts when a shorter one
 * finishes, as many steps late as its diagonal lies ahead, so walking up it stays level with
 * the later blocks before it (all down: 2.19-2.20 ms). In a banded grid every block walks
 * down: bench/walk_sim.py's L2 model has them miss least there (not yet measured). */
#if FA3_ARCH   /* the kernel's body exists in the sm_90a pass alone */
/* The walk's divisor, made once a block: the step's position in a head's walk (unmasked: nq
 * tiles; causal GQA: G heads) by one multiply, where `/` and `%` by a run-time value cost ~40
 * dependent instructions (IABS, I2F, MUFU.RCP, F2I, ...) on every step of the dQ warpgroup
 * and of the producer, whose loads came late for it (fa3_bwd -7% in cycles unmasked, -4% on
 * GQA causal: bench/NOTES.md, fiftieth session). */
struct walk_div {
    int d, rot;    /* the divisor; the block's rotation kt % d */
    uint32_t m;    /* 0xffffffff / d */
    __device__ __forceinline__ walk_div(int d_, int kt) : d(max(d_, 1)), rot(kt % max(d_, 1)), m(0xffffffffu / max(d_, 1)) {}
    /* (n / d, (n + rot) % d) for 0 <= n < 2^31: the high word of n·m is the quotient or one
     * short (n·2^32 / d ≥ n·m > n·2^32 / d − 2n − 1), mended by one compare */
    __device__ __forceinline__ int2 at(int n) const {
        int q = (int)__umulhi((uint32_t)n, m), r = n - q * d;
        if (r >= d) q++, r -= d;
        r += rot;
        return make_int2(q, r >= d ? r - d : r);
    }
};
static __device__ __forceinline__ int2 step_of(const bwd_geom &g, const walk_div &w, bool causal, int qt0, int nq,
                                               int it) {
    if (causal && g.G == 1) return make_int2(0, qt0 + it);
    const int2 h = w.at(it);
    if (!causal) return make_int2(h.x, qt0 + h.y);
    return make_int2(h.y, (int)blockIdx.x < g.down ? qt0 + nq - 1 - h.x : qt0 + h.x);
}
#endif

/* Fragment element e of an m64nN accumulator is row (e & 2 ? 8 : 0) + lane / 4 of the
 * warp's 16, column 8 (e / 4) + 2 (lane % 4) + (e & 1). FLEX: the steps are flex_walk's; the
 * producer puts each step's bits tile and half where a stage's lo/hi would be, and a
 * partial tile's elements are tested against its bits by key. OPEN: a grid whose every block
 * is `open` (below), compiled without the masked blocks' code: the bounds carried across the
 * back edge for the masked blocks' `whole` test cost the unmasked walk 1.3-1.6% in cycles as
 * dead code (fifty-first session). CAUSAL: a causal grid with no window and one document; the
 * producer puts the step's query tile where a stage's lo/hi rows would be. */
template <int DP, int MASK, bool ALIBI>
__global__ void __launch_bounds__(THREADS, 1) fa3_bwd(const __grid_constant__ CUtensorMap tq,
                                                      const __grid_constant__ CUtensorMap tk,
                                                      const __grid_constant__ CUtensorMap tv,
                                                      const __grid_constant__ CUtensorMap tdo, bwd_geom g) {
#if FA3_ARCH
    constexpr bool FLEX = MASK == LK_MASK_FLEX, OPEN = MASK == LK_MASK_OPEN, CAUSAL = MASK == LK_MASK_CAUSAL;
    static_assert(!ALIBI || FLEX, "ALiBi is flex's score_mod");
    constexpr int NC = DP / 64;
    constexpr uint32_t KB = BNK * 128, QB = BMQ * 128;   /* bytes of one 64-column block */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sk = sm, *sv = sk + NC * KB, *sq = sv + NC * KB, *sdo = sq + STAGES * NC * QB;
    uint8_t *sds = sdo + STAGES * NC * QB;              /* dS [NDS][2 key blocks][64 queries][64 keys] bf16 */
    float *sst = (float *)(sds + NDS * KB);             /* [STAGES][lse2 | delta | lo | hi] x 64 */
    uint32_t *sbits = (uint32_t *)(sst + STAGES * 4 * BMQ);   /* FLEX: [STAGES][128 keys][2 words] */
    uint64_t *kvfull = (uint64_t *)(sbits + STAGES * 2 * LK_FLEX_TILE), *full = kvfull + 1, *empty = full + STAGES;
    /* dsfull [NDS]: both math warpgroups' dS written (256 arrivals); dsempty [NDS]: the dQ
     * warpgroup has read it (128) */
    uint64_t *dsfull = empty + STAGES, *dsempty = dsfull + NDS;
    __shared__ int2 dsstep[NDS];   /* FLEX: the head and query tile of the step in each dS buffer */

    const int tid = threadIdx.x, wg = tid / 128;
    constexpr bool SPLIT = !FLEX && !CAUSAL;   /* blocks that may be parts (tail_split.cuh): never flex's or causal's */
    int bhk, kt, part = -1;   /* part >= 0: one of a split block's */
    const int L = SPLIT ? lk_attn_tail_block(g.tail, blockIdx.x, &part) : (int)blockIdx.x;
    lk_attn_block_of(g.order, g.heads, g.nkt, L, &bhk, &kt);   /* grid_order.cuh */
    const int hk = bhk % g.Hkv, b = bhk / g.Hkv, k0 = kt * BNK;
    /* the query tiles whose rows see any of the block's keys */
    int qt0 = 0, nq = 1, n;
    if (FLEX) {
        static_assert(!FLEX || BNK == LK_FLEX_TILE, "a block's keys are a mask tile's");
        n = lk_flex_steps(&g.fx, b, hk, g.G, kt);
    } else {
        const int qa = lk_attn_first_row<MASK>(g.vis, k0, 1);
        const int qb = max(qa, lk_attn_first_row<MASK>(g.vis, min(k0 + BNK, g.Skv), 0));
        qt0 = qa / BMQ, nq = qb > qa ? (qb + BMQ - 1) / BMQ - qt0 : 0, n = g.G * nq;
    }
    /* every query row sees every key of the block (no mask of any kind, no key past S_kv): the
     * steps need no lo/hi rows and no `whole` test (rows past S_q have LSE +inf: P is 0) */
    const bool open = OPEN || (MASK == LK_MASK_ROWS && lk_attn_unmasked(g.vis) && k0 + BNK <= g.Skv);
    const bool rows = MASK == LK_MASK_ROWS && !open;   /* the stages carry the steps' lo/hi rows */
    /* causal, known at compile time in the OPEN and CAUSAL instances */
    const bool causal = CAUSAL || (!OPEN && g.vis.causal);
    const walk_div wd(causal ? g.G : nq, kt);   /* step_of's */
    int i0 = 0;   /* the walk's steps [i0, i0 + n): a part's share of its block's */
    if (SPLIT) lk_attn_tail_steps(g.tail, part, &i0, &n);

    if (tid == 0) {
        mbar_init(kvfull, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 256);
        for (int x = 0; x < 2 * NDS; x++) mbar_init(&dsfull[x], x < NDS ? 256 : 128);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    /* step it's Q, dO and stats into stage it % STAGES, once the math warpgroups have freed it
     * (FLEX: steps taken from the producer's walk, in order) */
    auto produce = [&](const int it, flex_walk *fw) {
        const int s = it % STAGES;
        const int2 st = step_of(g, wd, causal, qt0, nq, i0 + it);
        int hh = hk * g.G + st.x, qt = st.y;
        int4 fs = make_int4(0, 0, -1, 0);
        if (FLEX) fs = fw->take(g.fx, b, hk, g.G, kt), hh = fs.x, qt = fs.y;
        const int64_t bh = (int64_t)b * g.Hq + hh;
        if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        if (FLEX)   /* the bits tile, the half, the head and the tile, before the arrival that publishes the stage */
            *(int4 *)(sst + s * 4 * BMQ + 2 * BMQ) = make_int4(fs.z, fs.w, hh, qt);
        if (CAUSAL) *(int *)(sst + s * 4 * BMQ + 2 * BMQ) = qt;   /* the step's query tile: its mask is arithmetic */
        mbar_expect_tx(&full[s], 2 * NC * QB + (rows ? 4 : 2) * BMQ * 4 +
                                     (FLEX && fs.z >= 0 ? 8 * LK_FLEX_TILE : 0));
        for (int c = 0; c < NC; c++) {
            tma_load4(sq + (s * NC + c) * QB, &tq, &full[s], c * 64, qt * BMQ, hh, b);
            tma_load4(sdo + (s * NC + c) * QB, &tdo, &full[s], c * 64, hh, qt * BMQ, b);
        }
        bulk_load(sst + s * 4 * BMQ, g.stats + (bh * g.nqt + qt) * 2 * BMQ, 2 * BMQ * 4, &full[s]);
        if (rows) bulk_load(sst + s * 4 * BMQ + 2 * BMQ, g.rows + qt * 2 * BMQ, 2 * BMQ * 4, &full[s]);
        if (FLEX && fs.z >= 0)   /* a partial step's bits by key: 1 KB in one piece (flex_plan.h) */
            bulk_load(sbits + s * 2 * LK_FLEX_TILE, g.fx.bits + (int64_t)fs.z * LK_FLEX_TILE_WORDS + lk_flex_by_key(fs.w, 0),
                      8 * LK_FLEX_TILE, &full[s]);
    };
    auto produce_kv = [&]() {
        mbar_expect_tx(kvfull, 2 * NC * KB);
        for (int c = 0; c < NC; c++) {
            tma_load4(sk + c * KB, &tk, kvfull, c * 64, k0, hk, b);
            tma_load4(sv + c * KB, &tv, kvfull, c * 64, k0, hk, b);
        }
    };
    /* The hand-over, and why it cannot deadlock. Step t's stage s = t % STAGES and
     * dS buffer x = t % NDS are used for the (t / 3)-th time, so every wait below is for
     * phase t / 3 of its barrier (parity (t / 3) & 1; dsempty's, for the phase before:
     * parity ((t / 3) & 1) ^ 1, which a fresh barrier passes for t < 3, so the math
     * warpgroups write the first three buffers at once). Every thread of a role waits and
     * arrives on the same n steps (n, nq, the heads and tiles depend on blockIdx alone:
     * causal blocks skip no step inside the walk, GQA's heads are steps), one arrival a thread
     * a step, so a phase counts exactly one step's arrivals (full 1 + bytes, empty 256,
     * dsfull 256, dsempty 128). Who waits for whom:
     *   math step t       full[t] (loaded at dQ iteration t − 2, or before the loop for
     *                     t < 3) and dsempty of step t − 3 (dQ finished step t − 3)
     *   dQ iteration t    thread 0 first loads step t + 2, which waits empty of step t − 1
     *                     (both math warpgroups finished dV and dK of step t − 1, after
     *                     issuing step t's Sᵀ on full[t]); then dsfull of step t
     * So math step t needs the dQ warpgroup only up to step t − 2 (the load) and t − 3 (the
     * buffer); dQ iteration t needs the math warpgroups only up to step t. Induction on t:
     * no cycle, and no phase can run two ahead of its waiter (a buffer is rewritten only
     * after dsempty of its last use; a stage refilled only after empty of its last), so no
     * parity is ever read for the wrong phase. n = 0: both roles skip everything (no loads,
     * no waits); n = 1, 2: only the loads before the loop. The budgets fit the pool (the
     * REG_ comment), so neither setmaxnreg waits for ever. */
    if (wg == 0) {   /* the producer and dQ warpgroup */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_DQ));
        if (n == 0) return;
        flex_walk ahead = {0, 0, 0, 0, 0, 0, make_int2(0, 0)};   /* FLEX: the producer's walk */
        if (FLEX) ahead.head(g.fx, b, hk, g.G, kt);
        if (tid == 0) {
            produce_kv();
            for (int it = 0; it < min(n, STAGES); it++) produce(it, &ahead);
        }
        mbar_wait(kvfull, 0);
        for (int it = 0; it < n; it++) {
            /* step it + STAGES − 1 into the stage step it − 1 frees: two steps ahead of the math */
            if (tid == 0 && it >= 1 && it + STAGES - 1 < n) produce(it + STAGES - 1, &ahead);
            __syncwarp();
            const int2 st = step_of(g, wd, causal, qt0, nq, i0 + it);
            int hh = hk * g.G + st.x, qt = st.y;
            const int buf = it % NDS;
            mbar_wait(&dsfull[buf], (it / NDS) & 1);
            if (FLEX) hh = dsstep[buf].x, qt = dsstep[buf].y;   /* the math warpgroups' copy of the step */
            float *chunk = g.dq_acc + (((int64_t)b * g.Hq + hh) * g.nqt + qt) * NC * CHUNK + tid * 4;
            __syncwarp();
            /* 2·NC chunks of m64n32 (d block h, query half qh), each issued, waited for and
             * added before the next: 16 accumulators live, not 32 (the budget above) */
#pragma unroll
            for (int c = 0; c < 2 * NC; c++) {
                float dq[16];
                issue_dqt(dq, sds + buf * KB, sk + (c / 2) * KB, c % 2);
                wgmma_wait<0>();
                fence_regs<16>(dq);
                if (c == 2 * NC - 1) mbar_arrive(&dsempty[buf]);   /* every wgmma read of buf is done */
                add_dqt(chunk + c * (CHUNK / 2), dq);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_MATH));
    const int ct = tid - 128, cg = warp_uniform(ct / 128), w = (ct % 128) / 32, lane = tid % 32, t4 = lane % 4;
    const int kb = k0 + cg * 64, key0 = kb + w * 16 + lane / 4;   /* this thread's keys: key0, key0 + 8 */
    float dk[DP / 2], dv[DP / 2];
#pragma unroll
    for (int e = 0; e < DP / 2; e++) dk[e] = dv[e] = 0.0f;
    /* Sᵀ of step it + 1 is issued at the end of step it, right behind its dV and dK, and
     * only then are dV and dK waited for: the tensor pipe holds this warpgroup's next GEMM
     * meanwhile, and the wait for the next stage's `full` is off the step's path. At the top
     * of step it + 1 Sᵀ is done, so Pᵀ is formed as soon as dPᵀ is issued. (fa3_bwd -0.3 to
     * -1.2% on an H100: bench/NOTES.md, forty-ninth session.) */
    float sc[32], dp[32];
    uint32_t pp[4][4], ds[4][4];
    /* the `whole` test's two bounds, lo[BMQ − 1] and hi[0], read from the step's stage at the end
     * of the step before (below) and carried across the back edge: read in the step, even before
     * Sᵀ's wait, the LDS queued behind the GEMMs' operand reads and the test waited on it (causal
     * -3.0% cycles, fifty-first session). FLEX reads its stage words in the step: carried, they
     * cost its sliding-window and document backward ~1.4%. */
    int2 bounds = make_int2(0, 0);
    /* CAUSAL: query q sees keys below min(q + climit, S_kv); bounds.x carries the step's first
     * query + climit */
    const int climit = 1 + g.Skv - g.Sq;
    if (n > 0) mbar_wait(kvfull, 0);
    /* Step it's work, then Sᵀ of step it + 1. The loop starts at -1 so that Sᵀ has one
     * issue: issued once more before the loop, its accumulators were moved between
     * registers while it ran and ptxas serialized every wgmma (C7515); a `wait<1>` at the
     * top for a group of the iteration before did the same (C7514). One group pending
     * across the back edge, waited for with `wait<0>`, as in fa3.cu's forward, compiles
     * clean. */
    for (int it = -1; it < n; it++) {
        if (it >= 0) {
            const int s = it % STAGES;
            const uint8_t *q = sq + s * NC * QB, *o = sdo + s * NC * QB;
            const float *lse2 = sst + s * 4 * BMQ, *delta = lse2 + BMQ;
            const int *lo = (const int *)(lse2 + 2 * BMQ), *hi = lo + BMQ;
            const bool whole = FLEX     ? lo[0] < 0
                               : CAUSAL ? bounds.x >= kb + 64 && g.Skv >= kb + 64
                                        : open || (bounds.x <= kb && bounds.y >= kb + 64);

            wgmma_wait<0>();   /* Sᵀ, issued at the end of the step before */
            fence_regs<32>(sc);
            wgmma_fence();
            issue_ss<DP, 64, BNK, BMQ>(dp, sv + cg * 64 * 128, o);
            wgmma_commit();
            /* the stats the softmax starts with, read while the GEMMs run (read after the wait,
             * every math warp stalled on them at once: 7.6% of the stall samples) */
            float2 L[8];
#pragma unroll
            for (int j = 0; j < 8; j++) L[j] = *reinterpret_cast<const float2 *>(lse2 + 8 * j + 2 * t4);
            const float2 D0 = *reinterpret_cast<const float2 *>(delta + 2 * t4);
            float s2 = g.scale2;
            if (ALIBI) {   /* the scores in log2 units plus slope2 · (key − query), the step's head (a flag: it
                            * cost the plain flex kernel 24 bytes of spills at D 128 as a run-time test) */
                const float slope2 = g.alibi[lo[2]];
                const int q0 = lo[3] * BMQ + 2 * t4;
#pragma unroll
                for (int e = 0; e < 32; e++)
                    sc[e] = fmaf(sc[e], g.scale2, slope2 * (float)(key0 + (e & 2 ? 8 : 0) - (q0 + 8 * (e / 4) + (e & 1))));
                s2 = 1.0f;
            }

            /* Pᵀ = exp2(scale2 · s − lse2 of the query), 0 where the query does not see the key. One
             * branch a step: `whole` tested inside the loop cost a BSSY / branch / BSYNC / PLOP3 around
             * each of the 32 elements (160 instructions a step in the SASS, for the common case) */
            if (whole) {
#pragma unroll
                for (int e = 0; e < 32; e++) sc[e] = lk_ex2(fmaf(sc[e], s2, -(e & 1 ? L[e / 4].y : L[e / 4].x)));
            } else if (FLEX) {   /* the two keys' bits (the stage's copy) against the step's queries, a word at a time */
                const uint32_t *fb = sbits + s * 2 * LK_FLEX_TILE + 2 * (key0 - k0);
#pragma unroll
                for (int hw = 0; hw < 2; hw++) {
                    const uint32_t kw[2] = {fb[hw] >> (2 * t4), fb[16 + hw] >> (2 * t4)};
#pragma unroll
                    for (int e = 16 * hw; e < 16 * hw + 16; e++) {
                        const float pv = lk_ex2(fmaf(sc[e], s2, -(e & 1 ? L[e / 4].y : L[e / 4].x)));
                        sc[e] = (kw[(e >> 1) & 1] >> (8 * ((e / 4) % 4) + (e & 1))) & 1u ? pv : 0.0f;
                    }
                }
            } else {
#pragma unroll
                for (int e = 0; e < 32; e++) {
                    const int key = key0 + (e & 2 ? 8 : 0), col = 8 * (e / 4) + 2 * t4 + (e & 1);
                    const float pv = lk_ex2(fmaf(sc[e], s2, -(e & 1 ? L[e / 4].y : L[e / 4].x)));
                    if (CAUSAL) sc[e] = key >= bounds.x + col || key >= g.Skv ? 0.0f : pv;
                    else sc[e] = key < lo[col] || key >= hi[col] ? 0.0f : pv;
                }
            }
            wgmma_wait<0>();
            fence_regs<32>(dp);
            /* dSᵀ = Pᵀ ∘ (dPᵀ − δ of the query), from the f32 Pᵀ (as FlashAttention-2 and -3 do), in
             * place of dPᵀ; then both bf16 A operands, and dV and dK issued together */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 dd = j ? *reinterpret_cast<const float2 *>(delta + 8 * j + 2 * t4) : D0;
#pragma unroll
                for (int e = 4 * j; e < 4 * j + 4; e++) dp[e] = sc[e] * (dp[e] - (e & 1 ? dd.y : dd.x));
            }
            pack_a<64>(sc, pp);
            pack_a<64>(dp, ds);
            wgmma_fence();
            issue_rs<DP, BMQ>(dv, pp, o);   /* dV += Pᵀ·dO */
            wgmma_commit();
            issue_rs<DP, BMQ>(dk, ds, q);   /* dK += dSᵀ·Q */
            wgmma_commit();
            const int buf = it % NDS;
            uint8_t *dsb = sds + buf * KB;
            /* the dQ warpgroup has read what this buffer held NDS steps ago (the first NDS
             * waits, on parity 1 of a fresh barrier, pass at once) */
            mbar_wait(&dsempty[buf], ((it / NDS) & 1) ^ 1);
            /* dS, not dSᵀ, for the dQ warpgroup's dQᵀ = Kᵀ·dSᵀ (issue_dqt): rows of queries, this
             * warpgroup's 64 keys a 128-byte row of block cg, 16-byte pieces swizzled by the
             * query's row % 8. ds[g] holds the 8 x 8 tiles (queries 8j.., keys kh·8..) with j
             * = 2g + m / 2, kh = m % 2 as its matrices m; stored transposed, tile m's column x
             * (query 16g + 8 (m / 2) + x) is the 16 bytes of keys 16w + 8kh.. of that row. */
            const int m = lane / 8, x = lane % 8;
            uint8_t *row = dsb + cg * (BMQ * 128) + (8 * (m / 2) + x) * 128 + (((2 * w + (m & 1)) ^ x) << 4);
#pragma unroll
            for (int gq = 0; gq < 4; gq++) stmatrix_x4_trans(row + gq * 16 * 128, ds[gq]);
            if (FLEX && ct == 0) dsstep[buf] = make_int2(lo[2], lo[3]);
            fence_async_smem();
            mbar_arrive(&dsfull[buf]);
        }
        /* Sᵀ of step it + 1; after the last step, of a stage no load is coming to (results
         * unused): a conditional issue made ptxas serialize every wgmma */
        const int s1 = (it + 1) % STAGES;
        if (it + 1 < n) {
            mbar_wait(&full[s1], ((it + 1) / STAGES) & 1);
            const int *lo1 = (const int *)(sst + s1 * 4 * BMQ + 2 * BMQ);
            if (CAUSAL) bounds.x = lo1[0] * BMQ + climit;
            else if (rows) bounds = make_int2(lo1[BMQ - 1], lo1[BMQ]);   /* lo[BMQ − 1], hi[0] */
        }
        wgmma_fence();
        issue_ss<DP, 64, BNK, BMQ>(sc, sk + cg * 64 * 128, sq + s1 * NC * QB);
        wgmma_commit();
        wgmma_wait<1>();   /* dV and dK: their operands and the stage they read are free */
        fence_regs<DP / 2>(dv);
        fence_regs<DP / 2>(dk);
        fence_regs_u32<16>(&pp[0][0]);
        fence_regs_u32<16>(&ds[0][0]);
        if (it >= 0) mbar_arrive(&empty[it % STAGES]);
    }
    wgmma_wait<0>();   /* the last Sᵀ (unconditional: behind `n > 0`, ptxas injected waits, C7517) */
    fence_regs<DP / 2>(dv);
    fence_regs<DP / 2>(dk);
    fence_regs<32>(sc);

    if (SPLIT && part >= 0) {   /* a part of a split block: its share added into the tail's sums */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + 8 * r;
            if (key >= g.Skv) continue;
            float *rk = lk_attn_tail_row(g.tail, L, key - k0), *rv = rk + BNK * g.D;
#pragma unroll
            for (int j = 0; j < DP / 8; j++) {
                const int e = 4 * j + 2 * r, d = 8 * j + 2 * t4;
                if (d >= g.D) continue;
                atomicAdd(reinterpret_cast<float2 *>(rk + d), make_float2(dk[e] * g.scale, dk[e + 1] * g.scale));
                atomicAdd(reinterpret_cast<float2 *>(rv + d), make_float2(dv[e], dv[e + 1]));
            }
        }
        return;
    }
    /* dK and dV in 16-byte stores: a quad's four lanes hold a row's 8-column groups j0..j0 + 3 two
     * columns each (one bf16 pair a lane); a quad transpose gives lane t4 all eight columns of group
     * j0 + t4. Four-byte stores of the pairs, a warp's 32 of them over 8 rows, held 5.3% of the
     * sliding-window backward's stall samples; these took 4-5% off flex's sliding and documents
     * fwd+bwd and ~3% off fa3's (bench/NOTES.md, thirty-first session). D % 8 == 0 (hopper_takes),
     * so a group lies wholly inside D or wholly past it. */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        lk_bf16_t *krow = g.dk + b * g.dkl.b + hk * g.dkl.h + key * g.dkl.s,
                  *vrow = g.dv + b * g.dvl.b + hk * g.dvl.h + key * g.dvl.s;
#pragma unroll
        for (int j0 = 0; j0 < DP / 8; j0 += 4) {
            float kq[4], vq[4];   /* bf16 pairs as float bits: the transpose moves 32-bit words */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int e = 4 * (j0 + q) + 2 * r;
                kq[q] = __uint_as_float(lk_pack_bf16x2(dk[e] * g.scale, dk[e + 1] * g.scale));
                vq[q] = __uint_as_float(lk_pack_bf16x2(dv[e], dv[e + 1]));
            }
            int ql;   /* %laneid read again here: `lane` kept live across the loop spilled */
            asm volatile("mov.u32 %0, %%laneid;" : "=r"(ql));
            quad_transpose(kq, ql);
            quad_transpose(vq, ql);
            const int d = 8 * (j0 + t4);
            if (key < g.Skv && d < g.D) {
                *reinterpret_cast<uint4 *>(krow + d) = make_uint4(__float_as_uint(kq[0]), __float_as_uint(kq[1]),
                                                                  __float_as_uint(kq[2]), __float_as_uint(kq[3]));
                *reinterpret_cast<uint4 *>(vrow + d) = make_uint4(__float_as_uint(vq[0]), __float_as_uint(vq[1]),
                                                                  __float_as_uint(vq[2]), __float_as_uint(vq[3]));
            }
        }
    }
#else
    __trap();   /* built for sm_90a only: the row needs compute capability 9.0 */
#endif
}

/* --- host ---------------------------------------------------------------------------- */

static int dp_of(int64_t D) { return D <= 64 ? 64 : 128; }

static size_t bwd_smem(int DP) {
    const size_t nc = (size_t)DP / 64;
    return 1024 + 2 * nc * BNK * 128 + 2 * STAGES * nc * BMQ * 128 + NDS * BNK * 128 + STAGES * 4 * BMQ * 4 +
           STAGES * 8 * LK_FLEX_TILE + 8 * (1 + 2 * STAGES + 2 * NDS);
}

/* Query tiles of 64 rows a head: whole 128-row tiles of the BlockMask, because flex's walk
 * takes both halves of a mask tile (S_q 300: a 3-tile mask, so steps into tiles 4 and 5;
 * with 5 tiles a head, tile 5 was the next head's tile 0, and past the last head the stats
 * were read and zeros added beyond the workspace). The sixth sees nothing: P = 0 there. */
static int64_t tiles_of(int64_t Sq) { return 2 * lk_cdiv(Sq, 2 * BMQ); }

/* The grid's last wave split into parts (tail_split.cuh). */
static lk_attn_tail tail_of(const lk_attention_args *a) { return lk_attn_tail_of(a, BNK, BMQ); }

/* The workspace's pieces, in the order backward takes them; the tail's sums follow the dQ
 * sums, so one memset zeroes both. */
typedef struct {
    size_t stats, rows, dq_acc, tail, sink_part;
} pieces;

static pieces pieces_of(const lk_attention_args *a) {
    const lk_attn_dims d = lk_attn_dims_of(a);
    const size_t nqt = (size_t)tiles_of(d.Sq), bh = (size_t)(d.B * d.Hq);
    pieces p = {lk_arena_piece(bh * nqt * 2 * BMQ * 4), lk_arena_piece(nqt * 2 * BMQ * 4),
                lk_arena_piece(bh * nqt * (size_t)dp_of(d.D) / 64 * CHUNK * 4),
                lk_arena_piece(lk_attn_tail_bytes(tail_of(a))),
                a->s_aux.data && a->ds_aux.data ? lk_arena_piece(lk_attn_lse_bytes(a)) : 0};
    return p;
}

int lk_attn_fa3_bwd_takes(const lk_attention_args *a) {
    const lk_attn_dims d = lk_attn_dims_of(a);
    const lk_hw *hw = lk_hw_get();
    const int grid_ok = d.B * d.Hkv * lk_cdiv(d.Skv, BNK) <= INT32_MAX;   /* a 1-D grid (grid_order.cuh) */
    /* score_mod: none, or flex's ALiBi (ALIBI); softcap in either form runs on fa2.cu */
    return !(a->softcap > 0.0f) && (!a->score_mod.fn || a->score_mod.fn == lk_score_mod_alibi) && !a->deterministic &&
           grid_ok && lk_aligned16(a->dout.data) && lk_aligned16(a->out.data) && lk_attn_view16(&a->dq) &&
           lk_attn_view16(&a->dk) && lk_attn_view16(&a->dv) &&
           (hw->cuda_smem_per_block == 0 || bwd_smem(dp_of(d.D)) <= hw->cuda_smem_per_block);
}

size_t lk_attn_fa3_bwd_workspace(const lk_attention_args *a) {
    const pieces p = pieces_of(a);
    return lk_attn_vis_bytes(a) + lk_attn_flex_alibi_bytes(a) + p.stats + p.rows + p.dq_acc + p.tail + p.sink_part;
}

template <int DP, int MASK, bool ALIBI = false>
static lk_status launch(const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv, const CUtensorMap &tdo,
                        const bwd_geom &g, cudaStream_t st) {
    const size_t sh = bwd_smem(DP);
    LK_CUDA_TRY(cudaFuncSetAttribute(fa3_bwd<DP, MASK, ALIBI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    fa3_bwd<DP, MASK, ALIBI><<<(unsigned)lk_attn_tail_grid(g.tail), THREADS, sh, st>>>(tq, tk, tv, tdo, g);
    LK_CUDA_LAUNCHED("attention: flash_attention_3 backward");
    return LK_OK;
}

/* The instance for the call's mask kind (visible.cuh); ALiBi only under flex. */
template <int DP>
static lk_status launch_for(int mask, bool alibi, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                            const CUtensorMap &tdo, const bwd_geom &g, cudaStream_t st) {
    switch (mask) {
    case LK_MASK_FLEX: return alibi ? launch<DP, LK_MASK_FLEX, true>(tq, tk, tv, tdo, g, st)
                                    : launch<DP, LK_MASK_FLEX>(tq, tk, tv, tdo, g, st);
    case LK_MASK_OPEN: return launch<DP, LK_MASK_OPEN>(tq, tk, tv, tdo, g, st);
    case LK_MASK_CAUSAL: return launch<DP, LK_MASK_CAUSAL>(tq, tk, tv, tdo, g, st);
    default: return launch<DP, LK_MASK_ROWS>(tq, tk, tv, tdo, g, st);
    }
}

lk_status lk_attn_fa3_backward(const lk_attention_args *a, lk_ctx *ctx) {
    const lk_attn_dims d = lk_attn_dims_of(a);
    if (d.Sq == 0 || d.B * d.Hq == 0) return LK_OK;
    lk_status s;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const pieces pc = pieces_of(a);
    const int DP = dp_of(d.D), nqt = (int)tiles_of(d.Sq);
    bwd_geom g = {};
    const int flex = a->block_mask != NULL;   /* the flex row: the mask's tiles, not the options */
    if (flex) g.vis = (lk_attn_vis){NULL, NULL, 0, (int)d.Sq, (int)d.Skv, 0, 0, 0};
    if (flex && (s = lk_attn_flex_alibi(a, ctx->arena, st, &g.alibi))) return s;
    if ((s = flex ? lk_attn_flex_map(a->block_mask, st, &g.fx) : lk_attn_vis_make(a, ctx->arena, st, &g.vis)))
        return s;
    float *stats = (float *)lk_arena_alloc(ctx->arena, pc.stats);
    int *rows = (int *)lk_arena_alloc(ctx->arena, pc.rows);
    g.dq_acc = (float *)lk_arena_alloc(ctx->arena, pc.dq_acc + pc.tail);
    float *sink_part = pc.sink_part ? (float *)lk_arena_alloc(ctx->arena, pc.sink_part) : NULL;
    if (!stats || !rows || !g.dq_acc || (pc.sink_part && !sink_part))
        return lk_error(LK_ENOMEM, "attention: flash_attention_3: no room for the backward's row stats and dq sums");
    g.stats = stats, g.rows = rows;
    g.dk = (lk_bf16_t *)a->dk.data, g.dv = (lk_bf16_t *)a->dv.data;
    g.dkl = lk_attn_layout_of(&a->dk), g.dvl = lk_attn_layout_of(&a->dv);
    g.Sq = (int)d.Sq, g.Skv = (int)d.Skv, g.Hq = (int)d.Hq, g.Hkv = (int)d.Hkv, g.G = (int)d.G, g.D = (int)d.D;
    g.nqt = nqt, g.scale = d.scale, g.scale2 = d.scale * LOG2E;
    g.heads = (int)(d.B * d.Hkv), g.nkt = (int)lk_cdiv(d.Skv, BNK);
    g.order = lk_attn_order_of(flex ? g.fx.falling : a->causal, g.heads, g.nkt);
    g.down = lk_attn_down_of(g.order, g.heads, g.nkt, 1);
    g.tail = tail_of(a);
    g.tail.acc = pc.tail ? g.dq_acc + pc.dq_acc / 4 : NULL;

    const int64_t prow = d.B * d.Hq * nqt * BMQ;
    fa3_bwd_prep<<<(unsigned)lk_cdiv(prow, 16), 256, 0, st>>>(
        (const lk_bf16_t *)a->out.data, (const lk_bf16_t *)a->dout.data, (const float *)a->saved.data,
        (const float *)a->s_aux.data, stats, rows, sink_part, g.vis, d.B * d.Hq, (int)d.Hq, (int)d.Sq, (int)d.D, nqt);
    LK_CUDA_LAUNCHED("attention: flash_attention_3 backward prep");
    LK_CUDA_TRY(cudaMemsetAsync(g.dq_acc, 0, pc.dq_acc + pc.tail, st));

    if (d.Skv > 0) {
        CUtensorMap tq, tk, tv, tdo;
        /* dO is [B, S, H, D]: a box of 64 columns x 1 head x 64 rows is one [64][64] tile */
        const cuuint64_t ddims[4] = {(cuuint64_t)d.D, (cuuint64_t)d.Hq, (cuuint64_t)d.Sq, (cuuint64_t)d.B};
        const cuuint64_t dstr[3] = {(cuuint64_t)d.D * 2, (cuuint64_t)(d.Hq * d.D * 2),
                                    (cuuint64_t)(d.Sq * d.Hq * d.D * 2)};
        const cuuint32_t dbox[4] = {64, 1, BMQ, 1};
        if ((s = view_map(&tq, &a->q, BMQ)) || (s = view_map(&tk, &a->k, BNK)) || (s = view_map(&tv, &a->v, BNK)) ||
            (s = bf16_map(&tdo, a->dout.data, 4, ddims, dstr, dbox)))
            return s;
        const int mask = flex ? LK_MASK_FLEX : lk_attn_mask_of(g.vis, BNK);
        s = DP == 64 ? launch_for<64>(mask, g.alibi != NULL, tq, tk, tv, tdo, g, st)
                     : launch_for<128>(mask, g.alibi != NULL, tq, tk, tv, tdo, g, st);
        if (s) return s;
        if (g.tail.split) {
            lk_attn_tail_convert<<<(unsigned)g.tail.split, 256, 0, st>>>(g.tail, g.order, g.heads, g.nkt, g.Skv, g.Hkv,
                                                                         g.dk, g.dkl, g.dv, g.dvl);
            LK_CUDA_LAUNCHED("attention: flash_attention_3 backward dk/dv of the split blocks");
        }
    }   /* no keys: dK and dV are empty, dQ is 0 */
    /* with no keys the workspace is zeros: dQ 0 */
    fa3_dq_convert<<<(unsigned)(d.B * d.Hq * nqt * (DP / 64)), 256, 0, st>>>(
        g.dq_acc, (lk_bf16_t *)a->dq.data, lk_attn_layout_of(&a->dq), (int)d.Hq, (int)d.Sq, (int)d.D, nqt, DP / 64,
        d.scale);
    LK_CUDA_LAUNCHED("attention: flash_attention_3 backward dq convert");
    return sink_part ? lk_attn_cuda_sink_sum(sink_part, (float *)a->ds_aux.data, d.B, d.Hq, d.Sq, st) : LK_OK;
}
