/* fa2.cu — flash_attention_2 (and sdpa) on a GPU: FlashAttention-2's algorithm on tensor
 * cores for bf16, forward and backward, every option of the flash adapter (causal,
 * sliding window, varlen documents, GQA/MQA, softcap, sinks, S_q != S_kv, any D <= 256).
 * f32 inputs go to the CUDA-core kernel (flash.cu, lk_attention_flash_cuda_backend),
 * which this file's vtable calls for them; f16 is not taken (the row's dtypes are f32
 * and bf16).
 *
 * Tensor cores through mma.sync.m16n8k16 (bf16 in, f32 accumulate), operands from
 * shared memory by ldmatrix (.trans where the reduction runs along the rows, as for V),
 * tiles staged by cp.async into XOR-swizzled rows (16-byte chunk c of row r lives at
 * chunk c ^ (r & 7): the 8 row addresses of an ldmatrix hit 8 different bank groups).
 * The head dim is padded to DP in {64, 128, 256} (the one template parameter): padded
 * columns load as zeros and are never stored, so any D <= 256 is exact.
 *
 *   fwd     a block takes BM = 128 query rows of one (b, h) (4 warps of 2 m16 tiles for
 *           DP <= 128; 8 warps of one for DP 256, whose output tile needs the
 *           registers); K/V tiles of BN = 64 keys, double-buffered: one barrier a tile,
 *           after which tile t + 1 loads into the stage every warp has finished with
 *           while tile t computes. S = QK^T and O += PV in registers, online softmax in
 *           the log2 domain (scores scaled by scale·log2e inside one FFMA before ex2),
 *           the LSE (natural log) saved per row. Grid (grid_of): x = query tile, y =
 *           head (the blocks in flight share a few heads' K/V in L2), or for causal
 *           x = head, y = tile, every head's longest rows first.
 *   prep    delta = rowsum(dout ∘ out) per row, and each row's sink share
 *           -exp(sink - lse)·delta, summed per head by lk_attn_cuda_sink_sum (flash.cu) in a fixed order.
 *   dkv     a block takes BNK = 128 keys of one (b, h_kv) (D 256: 64) and walks every q head
 *           of its group and the query tiles (BMQ = 64, double-buffered) that may see them,
 *           in FlashAttention-2's layout: each of a step's three phases splits its GEMMs
 *           over the eight warps in 32-row tiles (S = QK^T and dP = dO V^T; dV += P^T dO and
 *           dK += dS^T Q; dQ = dS K), P and dS passing through shared memory between them.
 *           GQA sums its G heads in dV and dK in registers: no atomics on dk/dv. By default
 *           dQ is added into an f32 workspace with atomics (then fa2_dq_cvt rounds it to
 *           bf16): fast, not bit-reproducible. A 1-D grid in grid_order.cuh's order (key
 *           block 0 the longest under causal; big causal grids in bands, few heads at once);
 *           unmasked, its last partial wave split into parts (tail_split.cuh).
 *   dq      a->deterministic: a second walk per query block (like the forward)
 *           recomputing P and dS and keeping dQ in registers; the dkv pass skips its dQ.
 *           Every sum then has a fixed order: the same bits on every run.
 *
 * Masking: query row i sees keys [lo_i, hi_i), the CPU's rule (lk_attn_row_intervals)
 * computed here per row from the document bounds (cu_seqlens copied to the device:
 * n_docs + 1 ints each, nothing else prepared on the host). lo and hi never decrease
 * with i (causal, window and documents are all bottom-right aligned and documents
 * ascend), so a query tile's key range is [lo_first, hi_last), a key tile is fully seen
 * by every row when it lies within [lo_last, hi_first) — those tiles skip the per-element
 * test — and a key block's query rows are found by binary search. Rows that see no key
 * give 0 and LSE -inf (with sinks: 0 and LSE = the sink). The rule lives in visible.cuh,
 * shared with fa3.cu.
 *
 * flex_attention (the FLEX instances, issue 19; the section at the end): the key tiles or
 * query steps are the BlockMask's (flex_plan.h), partial ones masked by their bits where
 * the analytic kernels compare with a row's interval; FLEX 2 adds ALiBi's bias.
 *
 * D > 128 takes ~200 KiB of shared memory a block: GPUs without it (sm_80: 163 KiB) run
 * those calls on flash.cu. Measured (bench/NOTES.md, fortieth session, the four cells of
 * bench/peers_cuda.py against SDPA's flash backend, FlashAttention-2 itself): the forward
 * 1.02-1.16x on an H200; fwd+bwd 0.95-0.97x at B 2, H 32, S 8192 and 1.00-1.05x at the GQA
 * shape on an H100, with dQ's bulk reductions (the first version: 0.87-1.03x and 0.77-0.90x);
 * with dQ added as soon as written, each warp's box by TMA (forty-sixth session, an H100):
 * 0.99-1.01x full and causal at B 2, H 32, S 8192, 1.04-1.17x at the GQA shape. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include "core/cuda_check.h"
#include "ops/attention/flex_plan.h"
#include "ops/attention/grid_order.cuh"
#include "ops/attention/hopper.cuh"
#include "ops/attention/internal.h"
#include "ops/attention/tail_split.cuh"
#include "ops/attention/visible.cuh"
#include "ops/cuda_util.cuh"
#include "ops/mma_sm80.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define BN 64      /* keys a forward / dq tile (64: S and P of 2 m-tiles fit beside O) */
#define BMQ 64     /* query rows a dkv step takes */
#define MAXD 256
enum { DQ_NONE, DQ_RED, DQ_BULK };   /* how dk/dv adds its dQ into the workspace (dkv_dq_mode) */

typedef struct {
    const lk_bf16_t *q, *k, *v, *out, *dout;
    lk_bf16_t *o, *dq, *dk, *dv;
    float *lse;              /* forward: written; backward: read */
    float *delta, *sink_part, *dq_acc;
    const float *sink;       /* [Hq] or NULL */
    lk_attn_vis vis;         /* which keys each row sees (visible.cuh) */
    int B, Hq, Hkv, G, Sq, Skv, D;
    float scale, cap;
    int vec;                 /* D % 8 == 0 and 16-byte aligned: cp.async of whole chunks */
    int head_major;          /* grid x = head, y = tile (else x = tile, y = head): see grid_of */
    int flex;                /* flex_attention: fx says which tiles and elements are seen, not vis */
    lk_flex_map fx;          /* the BlockMask's tiles and bits on the device (flex_plan.h) */
    const float *alibi;      /* flex's ALiBi score_mod: log2e · slope of each q head (device), or NULL */
    int down;                /* dk/dv, causal GQA: blocks [0, down) walk their tiles down */
    lk_attn_order order;     /* dk/dv: grid_order.cuh's, on a 1-D grid of B·Hkv x key blocks */
    lk_attn_tail tail;       /* dk/dv, unmasked: the last wave's key blocks in parts (tail_split.cuh) */
} fa_args;

/* The forward's and the deterministic dQ pass's grid of `tiles` tiles of `heads` heads (dk/dv
 * runs a 1-D grid in grid_order.cuh's order). Tile-major (x = tile) keeps the blocks in
 * flight on a few heads, whose K/V (forward) or Q/dO and dQ sums (dk/dv, then) stay in L2.
 * Causal tiles differ in work, and head-major launches every head's longest tiles
 * first. bench/NOTES.md issue 16, runs 1-2 (tile-major came with one barrier a step):
 * non-causal gained (fwd 295 -> 302, fwd+bwd 233 -> 243 TFLOP/s), causal lost (fwd
 * 298 -> 285; GQA 8:1 at S 4096, whose dk/dv blocks each walk 8 heads: fwd+bwd 220 ->
 * 158), hence head-major under causal (not yet measured in this combination). */
static dim3 grid_of(const fa_args &p, int64_t tiles, int64_t heads) {
    return p.head_major ? dim3((unsigned)heads, (unsigned)tiles) : dim3((unsigned)tiles, (unsigned)heads);
}
/* This block's head and its tile index, tile 0 first in launch order. */
static __device__ __forceinline__ void block_of(const fa_args &p, int *head, int *tile) {
    *head = p.head_major ? blockIdx.x : blockIdx.y;
    *tile = p.head_major ? blockIdx.y : blockIdx.x;
}
static __device__ __forceinline__ int tiles_of(const fa_args &p) { return p.head_major ? gridDim.y : gridDim.x; }

/* The A fragment of keys/queries 16kk..16kk+15 from two m16n8 accumulators (the C
 * layout of n-tiles 2kk and 2kk+1 is the A layout of one k16 step). */
static __device__ __forceinline__ void c_to_a(uint32_t *a, const float *c0, const float *c1) {
    a[0] = lk_pack_bf16x2(c0[0], c0[1]), a[1] = lk_pack_bf16x2(c0[2], c0[3]), a[2] = lk_pack_bf16x2(c1[0], c1[1]), a[3] = lk_pack_bf16x2(c1[2], c1[3]);
}

/* --- tiles ---------------------------------------------------------------------------- */

/* Element offset of 16-byte chunk c of row r in a swizzled tile of W columns. */
template <int W> static __device__ __forceinline__ int sw(int r, int c) { return r * W + ((c ^ (r & 7)) << 3); }

/* Lane addresses of ldmatrix.x4 for a 16x16 block at (r0, chunk c0):
 *  A-like (A fragment, or B via .trans): matrices (rows 0-7 | 8-15) × (chunk 0 | 1) in
 *  the order r0-7c0, r8-15c0, r0-7c1, r8-15c1;
 *  B-like (B fragment of 2 n8 tiles, or A via .trans): r0-7c0, r0-7c1, r8-15c0, r8-15c1. */
template <int W> static __device__ __forceinline__ int at_a(int r0, int c0, int lane) {
    return sw<W>(r0 + (lane & 15), c0 + (lane >> 4));
}
template <int W> static __device__ __forceinline__ int at_b(int r0, int c0, int lane) {
    return sw<W>(r0 + (lane & 7) + ((lane >> 4) << 3), c0 + ((lane >> 3) & 1));
}

/* The same lanes' offsets for a walk over a tile, kept in two registers: blocks at row r0 (a
 * multiple of 8) and chunk cw + ck, where cw (the warp's chunk offset, fixed for the walk) and
 * ck (a constant once the loops unroll) are even and share no bits. Then the lane's chunk
 * (cw + ck + its chunk bit) ^ (its row % 8) is (cw ^ bit ^ row % 8) ^ ck, so a load costs one
 * XOR with a constant and an add, where sw() recomputed row, chunk and swizzle each time (the
 * dk/dv kernel spent ~40% of its instructions there: bench/NOTES.md, thirty-ninth session). */
template <int W> struct lane_walk {
    int base, x;   /* (rw + the lane's row)·W; (cw ^ bit ^ row % 8) << 3 */
    __device__ __forceinline__ int at(int r0, int ck) const { return base + r0 * W + (x ^ (ck << 3)); }
};
template <int W> static __device__ __forceinline__ lane_walk<W> walk_a(int rw, int cw, int lane) {   /* at_a's lanes */
    return {(rw + (lane & 15)) * W, (cw ^ (lane >> 4) ^ (lane & 7)) << 3};
}
template <int W> static __device__ __forceinline__ lane_walk<W> walk_b(int rw, int cw, int lane) {   /* at_b's lanes */
    return {(rw + (lane & 7) + ((lane >> 4) << 3)) * W, (cw ^ ((lane >> 3) & 1) ^ (lane & 7)) << 3};
}

/* ROWS × DP elements from global rows `stride` apart into a swizzled tile; rows >= n and
 * columns >= D are zero. Whole chunks by cp.async when vec (a thread keeps one chunk
 * column, so its shared offsets are constants apart), else element by element
 * (synchronous; odd D). */
template <int DP, int NT, int ROWS>
static __device__ __forceinline__ void load_tile(lk_bf16_t *s, const lk_bf16_t *g, int64_t stride, int n, int D,
                                                 int vec) {
    constexpr int CH = DP / 8, RS = NT / CH;
    static_assert(NT % CH == 0 && ROWS % RS == 0, "tile rows split evenly over the threads");
    if (vec) {
        const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
        const bool col_ok = c * 8 < D;
        const lk_bf16_t *src = g + r0 * stride + c * 8;
#pragma unroll
        for (int i = 0; i < ROWS / RS; i++) {
            const int r = r0 + i * RS;
            const bool ok = col_ok && r < n;
            cp16(s + sw<DP>(r, c), ok ? src + i * RS * stride : g, ok);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * DP; e += NT) {
            const int r = e / DP, d = e % DP;
            s[sw<DP>(r, d >> 3) + (d & 7)] = r < n && d < D ? g[r * stride + d] : __float2bfloat16_rn(0.0f);
        }
    }
}

/* Two adjacent columns of a row of D, rounded to bf16. */
static __device__ __forceinline__ void store2(lk_bf16_t *row, int col, int D, float x0, float x1, int vec) {
    if (vec) {
        if (col < D) *reinterpret_cast<__nv_bfloat162 *>(row + col) = __floats2bfloat162_rn(x0, x1);
    } else {
        if (col < D) row[col] = __float2bfloat16_rn(x0);
        if (col + 1 < D) row[col + 1] = __float2bfloat16_rn(x1);
    }
}

/* Query row i sees keys [lo, hi). */
static __device__ __forceinline__ void row_iv(const fa_args &p, int i, int &lo, int &hi) { lk_attn_row_iv(p.vis, i, lo, hi); }

/* A query tile's key tiles of BN keys, the forward's and fa2_dq's walk: flex_attention's mask tiles
 * (the fpart partial ones first, then the full ones; two key tiles a mask tile), or every tile from
 * the first row's first visible key (klo) to the last row's last; [maxlo, minhi) every row sees, so
 * a tile inside it needs no mask. */
template <int FLEX> struct key_tiles {
    int n, klo, maxlo, minhi, fpart;   /* n: the tiles to walk */
    const int32_t *fidx, *fbit;        /* FLEX: the mask tiles' key tiles and their bits */
    __device__ int key0(int t) const { return FLEX ? fidx[t >> 1] * LK_FLEX_TILE + (t & 1) * BN : klo + t * BN; }
    /* FLEX, a partial tile: its rows' bits (LK_FLEX_WORDS a row), from this key tile's first key */
    __device__ const uint32_t *bits(const fa_args &p, int t) const {
        return p.fx.bits + (int64_t)fbit[t >> 1] * LK_FLEX_TILE_WORDS + (t & 1) * 2;
    }
};
template <int FLEX>
static __device__ __forceinline__ key_tiles<FLEX> key_tiles_of(const fa_args &p, int b, int h, int q0, int nq) {
    key_tiles<FLEX> w{0, 0, 0, 0, 0, nullptr, nullptr};
    if (FLEX) {
        const int64_t row = (int64_t)lk_flex_pattern(&p.fx, b, h) * p.fx.nq + q0 / LK_FLEX_TILE;
        w.fpart = p.fx.kv_cnt[2 * row];
        w.n = 2 * (w.fpart + p.fx.kv_cnt[2 * row + 1]);
        w.fidx = p.fx.kv_idx + row * p.fx.nk, w.fbit = p.fx.kv_bit + row * p.fx.nk;
    } else {
        int khi;
        row_iv(p, q0, w.klo, w.minhi);
        row_iv(p, q0 + nq - 1, w.maxlo, khi);
        w.n = khi > w.klo ? (khi - w.klo + BN - 1) / BN : 0;
    }
    return w;
}

/* score → the value the softmax exponentiates, before the log2e·scale factor: the raw
 * q·k, or cap·tanh(scale·q·k / cap) with softcap (its factor is then log2e alone). */
static __device__ __forceinline__ float capped(float x, const fa_args &p, float *dfac) {
    /* tanh through one ex2 (tanhf's polynomial costs the forward its registers): absolute
     * error ~1e-7 of cap; |y| <= 15 keeps e finite where tanh is 1 in f32 anyway */
    const float y = fminf(fmaxf(x * p.scale / p.cap, -15.0f), 15.0f), e = lk_ex2(y * (2.0f * LOG2E));
    const float t = 1.0f - __fdividef(2.0f, e + 1.0f);
    *dfac = 1.0f - t * t;
    return p.cap * t;
}

/* --- forward -------------------------------------------------------------------------- */

/* FLEX (1; 2 with ALiBi): the key tiles are the BlockMask's (two of BN a 128-key tile),
 * partial ones masked by their bits. ALiBi is a flag: tested at run time it spilled. */
template <int DP, int WARPS, int MT, bool CAP, int FLEX>
static __global__ void __launch_bounds__(WARPS * 32, 1) fa2_fwd(const fa_args p) {
    constexpr int BM = 16 * MT * WARPS, NT = WARPS * 32, NS = BN / 8, ND = DP / 8;
    static_assert(BM == LK_FLEX_TILE && 2 * BN == LK_FLEX_TILE, "a block's rows are a mask tile's, two key tiles its keys");
    extern __shared__ uint4 smem_[];
    lk_bf16_t *qs = (lk_bf16_t *)smem_, *ks = qs + BM * DP, *vs = ks + 2 * BN * DP;
    int *lo_s = (int *)(vs + 2 * BN * DP), *hi_s = lo_s + BM;
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3, rw = (tid >> 5) * 16 * MT;
    /* x the query tile, longest rows first (causal); y the head: the blocks in flight
     * share a few heads' K/V in L2 */
    int bh, ti;
    block_of(p, &bh, &ti);
    const int h = bh % p.Hq, b = bh / p.Hq;
    const int q0 = (tiles_of(p) - 1 - ti) * BM, nq = min(BM, p.Sq - q0);
    const lk_bf16_t *kg = p.k + ((int64_t)b * p.Hkv + h / p.G) * p.Skv * p.D;
    const lk_bf16_t *vg = p.v + ((int64_t)b * p.Hkv + h / p.G) * p.Skv * p.D;
    load_tile<DP, NT, BM>(qs, p.q + ((int64_t)bh * p.Sq + q0) * p.D, p.D, nq, p.D, p.vec);
    cp_commit();
    if (!FLEX)
        for (int r = tid; r < BM; r += NT) {
            int l = 0, u = 0;
            if (r < nq) row_iv(p, q0 + r, l, u);
            lo_s[r] = l, hi_s[r] = u;
        }
    const key_tiles<FLEX> kw = key_tiles_of<FLEX>(p, b, h, q0, nq);
    if (kw.n > 0) {
        const int ka = kw.key0(0);
        load_tile<DP, NT, BN>(ks, kg + (int64_t)ka * p.D, p.D, min(BN, p.Skv - ka), p.D, p.vec);
        load_tile<DP, NT, BN>(vs, vg + (int64_t)ka * p.D, p.D, min(BN, p.Skv - ka), p.D, p.vec);
    }
    cp_commit();
    /* ALiBi (FLEX): the scores go to log2 units with the bias added, and the softmax's factor is 1 */
    constexpr bool alibi = FLEX == 2;
    const float slope2 = alibi ? p.alibi[h] : 0.0f, c2 = alibi ? 1.0f : p.cap > 0.0f ? LOG2E : p.scale * LOG2E;
    /* the operands' walks (lane_walk): Q rows, K rows, V read transposed */
    const lane_walk<DP> wq = walk_a<DP>(rw, 0, lane), wk = walk_b<DP>(0, 0, lane), wv = walk_a<DP>(0, 0, lane);
    float o[MT][ND][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < ND; n++) o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.0f;
    }
    for (int t = 0; t < kw.n; t++) {
        const int k0 = kw.key0(t);
        cp_wait<0>();      /* Q and tile t landed */
        __syncthreads();   /* ... for every thread; every warp is past tile t-1, whose stage refills now */
        if (t + 1 < kw.n) {
            const int k1 = kw.key0(t + 1), st = (t + 1) & 1;
            load_tile<DP, NT, BN>(ks + st * BN * DP, kg + (int64_t)k1 * p.D, p.D, min(BN, p.Skv - k1), p.D, p.vec);
            load_tile<DP, NT, BN>(vs + st * BN * DP, vg + (int64_t)k1 * p.D, p.D, min(BN, p.Skv - k1), p.D, p.vec);
        }
        cp_commit();
        const lk_bf16_t *kt = ks + (t & 1) * BN * DP, *vt = vs + (t & 1) * BN * DP;
        float s[MT][NS][4];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int n = 0; n < NS; n++) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; i++) ldsm4(a[i], qs + wq.at(16 * i, 2 * kk));
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t bb[4];
                ldsm4(bb, kt + wk.at(16 * np, 2 * kk));
#pragma unroll
                for (int i = 0; i < MT; i++) mma(s[i][2 * np], a[i], bb[0], bb[1]), mma(s[i][2 * np + 1], a[i], bb[2], bb[3]);
            }
        }
        const bool full = FLEX ? (t >> 1) >= kw.fpart : k0 >= kw.maxlo && k0 + BN <= kw.minhi;
        const uint32_t *fb = FLEX && !full ? kw.bits(p, t) : nullptr;
        if (CAP)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float f;
                        s[i][n][e] = capped(s[i][n][e], p, &f);
                    }
        /* the online softmax of the tile; MASKED: what the rows do not see, out (a branch a
         * tile: the tests predicated in the loop cost every tile ~3 instructions an element) */
        auto softmax = [&](auto masked) {
            constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int r = rw + 16 * i + g + 8 * hh;
                    /* ALiBi: log2 units plus slope2 · (key − query), key k0 + n*8 + 2·t4 + e */
                    const float rb = alibi ? slope2 * (float)(k0 + 2 * t4 - (q0 + r)) : 0.0f;
                    int rlo = 0, rhi = 0;
                    uint64_t seen = 0;   /* FLEX: bit n*8 + e of the row's 64 keys, from this lane's column on */
                    if (MASKED && FLEX) seen = *reinterpret_cast<const uint64_t *>(fb + r * LK_FLEX_WORDS) >> (2 * t4);
                    else if (MASKED) rlo = lo_s[r] - k0 - 2 * t4, rhi = hi_s[r] - k0 - 2 * t4;   /* against n*8 + (e&1) */
                    float mx = -INFINITY;
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float x = s[i][n][2 * hh + e];
                            if (alibi) x = fmaf(x, p.cap > 0.0f ? LOG2E : p.scale * LOG2E, fmaf(slope2, (float)(n * 8 + e), rb));
                            if (MASKED && (FLEX ? !((seen >> (n * 8 + e)) & 1u) : n * 8 + e < rlo || n * 8 + e >= rhi))
                                x = -INFINITY;
                            s[i][n][2 * hh + e] = x;
                            mx = fmaxf(mx, x);
                        }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float mn = fmaxf(m[i][hh], mx * c2), base = mn == -INFINITY ? 0.0f : mn;
                    const float alpha = lk_ex2(m[i][hh] - base);
                    m[i][hh] = mn;
                    float sum = 0.0f;
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float pv = lk_ex2(fmaf(s[i][n][2 * hh + e], c2, -base));
                            s[i][n][2 * hh + e] = pv;
                            sum += pv;
                        }
                    l[i][hh] = l[i][hh] * alpha + sum;
#pragma unroll
                    for (int n = 0; n < ND; n++) o[i][n][2 * hh] *= alpha, o[i][n][2 * hh + 1] *= alpha;
                }
        };
        if (full) softmax(std::false_type());
        else softmax(std::true_type());
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; i++) c_to_a(a[i], s[i][2 * kk], s[i][2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < DP / 16; dp++) {
                uint32_t bb[4];
                ldsm4t(bb, vt + wv.at(16 * kk, 2 * dp));
#pragma unroll
                for (int i = 0; i < MT; i++) mma(o[i][2 * dp], a[i], bb[0], bb[1]), mma(o[i][2 * dp + 1], a[i], bb[2], bb[3]);
            }
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float sum = l[i][hh], mr = m[i][hh];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            float mul = 1.0f;
            if (p.sink) {   /* one more logit in the softmax, with no value */
                const float sk = p.sink[h] * LOG2E, mn = fmaxf(mr, sk), alpha = lk_ex2(mr - mn);
                sum = sum * alpha + lk_ex2(sk - mn), mul = alpha, mr = mn;
            }
            mul = sum > 0.0f ? mul / sum : 0.0f;
            const int row = q0 + rw + 16 * i + g + 8 * hh;
            if (row >= p.Sq) continue;
            lk_bf16_t *orow = p.o + (((int64_t)b * p.Sq + row) * p.Hq + h) * p.D;
#pragma unroll
            for (int n = 0; n < ND; n++) store2(orow, n * 8 + 2 * t4, p.D, o[i][n][2 * hh] * mul, o[i][n][2 * hh + 1] * mul, p.vec);
            if (t4 == 0) p.lse[(int64_t)bh * p.Sq + row] = sum > 0.0f ? mr * LN2 + logf(sum) : -INFINITY;
        }
}

/* --- backward ------------------------------------------------------------------------- */

/* delta[r] = dout·out of row r = (b, h, i) (a warp a row); the sink share of the row. */
static __global__ void fa2_prep(const fa_args p) {
    const int64_t rows = (int64_t)p.B * p.Hq * p.Sq, r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const int lane = threadIdx.x & 31, i = (int)(r % p.Sq), h = (int)((r / p.Sq) % p.Hq);
    const int64_t b = r / ((int64_t)p.Sq * p.Hq), off = ((b * p.Sq + i) * p.Hq + h) * p.D;
    float s = 0.0f;
    for (int d = lane; d < p.D; d += 32) s += __bfloat162float(p.dout[off + d]) * __bfloat162float(p.out[off + d]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        p.delta[r] = s;
        if (p.sink_part) p.sink_part[r] = p.lse[r] > -INFINITY ? -expf(p.sink[h] - p.lse[r]) * s : 0.0f;
    }
}

static __global__ void fa2_dq_cvt(const float *acc, lk_bf16_t *dq, int64_t n, float scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dq[i] = __float2bfloat16_rn(acc[i] * scale);
}

/* Q and dO of a step element by element (odd D, unaligned rows). Out of line: inlined into
 * the step loop, its addresses were computed beside the fast path's on every step (~20
 * instructions a warp) in a kernel with no registers to spare. */
template <int DP, int NT>
static __device__ __noinline__ void dkv_load_slow(lk_bf16_t *qs, lk_bf16_t *gs, const lk_bf16_t *qg,
                                                  const lk_bf16_t *gg, int64_t gstride, int nq, int D) {
    load_tile<DP, NT, BMQ>(qs, qg, D, nq, D, 0);
    load_tile<DP, NT, BMQ>(gs, gg, gstride, nq, D, 0);
}

/* Issues the BMQ query rows from q0 of head hh into a dkv block's stage (Q, dO, LSE, delta
 * by cp.async; lo/hi computed, but for FLEX, whose bits say what is seen). */
template <int DP, int NT, int FLEX>
static __device__ __forceinline__ void dkv_issue(const fa_args &p, int hh, int q0, int b, lk_bf16_t *qs,
                                                 lk_bf16_t *gs, float *ls, float *ds, int *los, int *his) {
    const int nq = min(BMQ, p.Sq - q0);
    const int64_t bh = (int64_t)b * p.Hq + hh, gstride = (int64_t)p.Hq * p.D;
    const lk_bf16_t *qg = p.q + (bh * p.Sq + q0) * p.D, *gg = p.dout + (((int64_t)b * p.Sq + q0) * p.Hq + hh) * p.D;
    if (p.vec) {   /* load_tile's cp.async path, its row pointers stepped */
        constexpr int CH = DP / 8, RS = NT / CH;
        const int c = threadIdx.x % CH, r0 = threadIdx.x / CH, so = sw<DP>(r0, c);
        const bool col = c * 8 < p.D;
        const lk_bf16_t *qr = qg + r0 * p.D + c * 8, *gr = gg + r0 * gstride + c * 8;
#pragma unroll
        for (int i = 0; i < BMQ / RS; i++) {
            const bool ok = col && r0 + i * RS < nq;
            cp16(qs + so + i * RS * DP, ok ? qr : qg, ok);
            cp16(gs + so + i * RS * DP, ok ? gr : gg, ok);
            qr += RS * p.D, gr += RS * gstride;
        }
    } else {
        dkv_load_slow<DP, NT>(qs, gs, qg, gg, gstride, nq, p.D);
    }
    for (int r = threadIdx.x; r < BMQ; r += NT) {
        const bool ok = r < nq;
        cp4(ls + r, p.lse + bh * p.Sq + (ok ? q0 + r : 0), ok);
        cp4(ds + r, p.delta + bh * p.Sq + (ok ? q0 + r : 0), ok);
        if (FLEX) continue;
        int l = 0, u = 0;
        if (ok) row_iv(p, q0 + r, l, u);
        los[r] = l, his[r] = u;
    }
}

/* Step `it` of a flex dk/dv block on mask tile kt: the G query heads of kv head hk in turn,
 * each head's q tiles of kt (partial first), a tile in two steps of BMQ rows. Returns the
 * head, the first row and the bits tile (-1: a full tile). */
static __device__ __forceinline__ int4 flex_step(const fa_args &p, int b, int hk, int kt, int it) {
    static_assert(LK_FLEX_TILE == 2 * BMQ, "a mask tile's rows are two dkv steps");
    for (int j = 0; j < p.G; j++) {
        const int row = lk_flex_q_row(&p.fx, b, hk * p.G + j, kt);
        const int np = p.fx.q_cnt[2 * row], c = 2 * (np + p.fx.q_cnt[2 * row + 1]);
        if (it < c) {
            const int e = it >> 1;
            return make_int4(hk * p.G + j, p.fx.q_idx[row * p.fx.nq + e] * LK_FLEX_TILE + (it & 1) * BMQ,
                             e < np ? p.fx.q_bit[row * p.fx.nq + e] : -1, 0);
        }
        it -= c;
    }
    return make_int4(hk * p.G, 0, -1, 0);   /* past the last step: not reached */
}

#if FA3_ARCH
/* DQ_BULK at DP 64: rows 32 (w % 2).. of dQ's tile are written by the four warps of parity w % 2;
 * warp w % 2 waits until they have (named barriers 1 and 2, 128 threads), the other three arrive
 * and go on. Its bulk reductions then have the rest of the step and the next step's first phase
 * to read the rows before the mid-step wait; issued after the next step's first barrier, as
 * before, fa2_dkv ran 2-3% longer at DP 128 (bench/NOTES.md, forty-sixth session). */
static __device__ __forceinline__ void rows_written(int w) {
    if (w & 1) {
        if (w == 1) asm volatile("bar.sync 2, 128;" ::: "memory");
        else asm volatile("bar.arrive 2, 128;" ::: "memory");
    } else {
        if (w == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
        else asm volatile("bar.arrive 1, 128;" ::: "memory");
    }
}
#endif

/* dK, dV of BNK keys of one (b, h_kv) (BNK 128; D 256: 64), walking the G q heads of its
 * group and the BMQ-row query tiles that see the keys; unless dq_mode is DQ_NONE also
 * dQ += dS K into p.dq_acc. FlashAttention-2's layout: each phase of a step splits its GEMM
 * over the eight warps in 32 x 32-ish tiles, so every warp reads only its rows and columns of
 * the operands, and P and dS go through shared memory between the phases:
 *   S, dP   S = Q Kᵀ and dP = dO Vᵀ (queries as M): warp (w % 2, w / 2) takes query rows
 *           32 (w % 2).. and keys BNK / 4 · (w / 2)..; P = exp2(scale·s − lse) and
 *           dS = P ∘ (dP − δ) from the f32 P, both stored as bf16 [query][key]
 *   dQ      dQ = dS K: warp (w % 2, w / 2) takes query rows 32 (w % 2).. and head columns
 *           DP / 4 · (w / 2).., added into the f32 workspace: DQ_RED by float2 atomics;
 *           DQ_BULK (sm_90a) through shared memory, added as soon as written: DP 128, each
 *           warp's 32 x 32 box by one TMA reduction; DP 64, rows of a padded tile by a bulk
 *           reduction a row once their four warps have written them (rows_written)
 *   dV, dK  dV += Pᵀ dO and dK += dSᵀ Q (keys as M): warp (w % KW, w / KW) takes keys
 *           32 (w % KW).. and head columns DH (w / KW)..; dV and dK stay in registers for
 *           the whole walk (GQA's heads summed there: no atomics on them)
 * The first version gave each warp 16 keys and every query of the step in all four GEMMs:
 * each warp read the whole Q and dO tile four times, 736 KB of shared memory a step at
 * D 128 against this layout's 576, and ran at 0.73x FlashAttention-2's backward
 * (bench/NOTES.md). Two barriers a step: one before the step (its tiles landed, every warp
 * past the last step, whose stage then refills), one between the phases (P and dS
 * written). FLEX: the steps are flex_step's (decoded at issue into a ring of three),
 * partial tiles masked by their bits by query row. */
template <int DP, bool CAP, int FLEX>
static __global__ void __launch_bounds__(256, 1) fa2_dkv(const fa_args p, int dq_mode, const __grid_constant__ CUtensorMap tdq) {
    constexpr int NT = 256, BNK = DP == 256 ? 64 : 128, KW = BNK / 32, DH = DP / (8 / KW);
    constexpr int SK = BNK / 4, NS = SK / 8, DQ = DP / 4;
    static_assert(BNK == LK_FLEX_TILE || DP == 256, "a block's keys are one mask tile (D 256: half of one)");
    extern __shared__ uint4 smem_[];
    lk_bf16_t *ks = (lk_bf16_t *)smem_, *vs = ks + BNK * DP, *qs = vs + BNK * DP, *gs = qs + 2 * BMQ * DP;
    lk_bf16_t *ps = gs + 2 * BMQ * DP, *dss = ps + BMQ * BNK;   /* P and dS [BMQ queries][BNK keys], swizzled */
    float *ls = (float *)(dss + BMQ * BNK), *dl = ls + 2 * BMQ;
    int *los = (int *)(dl + 2 * BMQ), *his = los + 2 * BMQ;
#if FA3_ARCH
    /* DQ_BULK: DP 128, each warp's 32 query rows x 32 columns of dQ as one box of tdq's (128-byte
     * swizzled, 1024-aligned), added by one TMA reduction from its lane 0 with no barrier (2-3%
     * faster dk/dv than rows_written's rows: bench/NOTES.md, forty-sixth session); DP 64 (a warp's
     * 16 columns are 64 bytes), rows of DP + 8 floats (a warp's STS.64 hit every bank once) */
    constexpr bool BOX = DP == 128;
    static_assert(!BOX || DQ == 32, "a warp's dQ columns are one 32-column box");
    constexpr int DQS = DP + 8;
    float *dqs = BOX ? (float *)smem_align1024((uint8_t *)(his + 2 * BMQ)) : (float *)(his + 2 * BMQ);
#endif
    __shared__ int4 steps[3];   /* FLEX */
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int bhk, kt, part = -1;   /* part >= 0: one of a split block's (never under FLEX) */
    const int L = FLEX ? (int)blockIdx.x : lk_attn_tail_block(p.tail, blockIdx.x, &part);
    lk_attn_block_of(p.order, p.B * p.Hkv, (p.Skv + BNK - 1) / BNK, L, &bhk, &kt);
    const int hk = bhk % p.Hkv, b = bhk / p.Hkv;
    const int k0 = kt * BNK, nk = min(BNK, p.Skv - k0);
    const int64_t kvoff = ((int64_t)bhk * p.Skv + k0) * p.D;
    load_tile<DP, NT, BNK>(ks, p.k + kvoff, p.D, nk, p.D, p.vec);
    load_tile<DP, NT, BNK>(vs, p.v + kvoff, p.D, nk, p.D, p.vec);
    cp_commit();
    int qa = 0, nqt = 1, n;
    const int ft = k0 / LK_FLEX_TILE;
    if (FLEX) {
        n = lk_flex_steps(&p.fx, b, hk, p.G, ft);
    } else {
        qa = lk_attn_first_row(p.vis, k0, 1);
        const int qb = max(qa, lk_attn_first_row(p.vis, k0 + nk, 0));
        nqt = (qb - qa + BMQ - 1) / BMQ, n = p.G * nqt;
    }
    int i0 = 0;   /* a part walks steps [i0, i0 + n) of its block's (unmasked: never by_tile) */
    if (!FLEX) lk_attn_tail_steps(p.tail, part, &i0, &n);
    /* a step's head and first row (and FLEX's bits tile, -1 when full), stepped (a division a
     * step cost ~25 instructions a warp, twice). The analytic steps walk a head's nqt query
     * tiles, then the next head's; under a causal mask with G > 1, a tile's G heads in turn
     * from head kt % G, the tiles down from the last in the first wave's blocks and up from
     * the diagonal in the others: fa3_bwd.cu's step_of says why (L2: its GQA causal cell
     * -28%). */
    const int qend = qa + nqt * BMQ, hg = hk * p.G, h0 = hg + kt % p.G;
    const bool by_tile = p.vis.causal && p.G > 1;
    const int dy = by_tile && (int)blockIdx.x < p.down ? -BMQ : BMQ;
    auto after = [&](int4 s) {
        if (by_tile) {
            const int h = s.x + 1 == hg + p.G ? hg : s.x + 1;
            return make_int4(h, h == h0 ? s.y + dy : s.y, -1, 0);
        }
        return s.y + BMQ < qend ? make_int4(s.x, s.y + BMQ, -1, 0) : make_int4(s.x + 1, qa, -1, 0);
    };
    int4 at = FLEX      ? flex_step(p, b, hk, ft, 0)   /* step 0, then the current one */
              : by_tile ? make_int4(h0, dy < 0 ? qend - BMQ : qa, -1, 0)
                        : make_int4(hg + (i0 ? i0 / nqt : 0), qa + (i0 ? i0 % nqt : 0) * BMQ, -1, 0);
    if (n > 0) {
        if (FLEX && tid == 0) steps[0] = at;
        dkv_issue<DP, NT, FLEX>(p, at.x, at.y, b, qs, gs, ls, dl, los, his);
    }
    cp_commit();
    const float c2 = p.cap > 0.0f ? LOG2E : p.scale * LOG2E;
    const int sm = 32 * (w & 1), sn = SK * (w >> 1);     /* S, dP and dQ: query rows; S, dP: keys */
    const int vk = 32 * (w % KW), vd = DH * (w / KW);    /* dV, dK: keys, head columns */
    const int qd = DQ * (w >> 1);                        /* dQ: head columns */
    /* the operands' walks (lane_walk): Q and dO rows, K and V rows (S, dP); P and dS read
     * transposed, dO and Q as B (dV, dK); dS rows, K as B (dQ) */
    const lane_walk<DP> wq = walk_a<DP>(sm, 0, lane), wk = walk_b<DP>(sn, 0, lane), wg = walk_a<DP>(0, vd >> 3, lane);
    const lane_walk<BNK> wp = walk_b<BNK>(0, vk >> 3, lane), wd = walk_a<BNK>(sm, 0, lane);
    const lane_walk<DP> wkq = walk_a<DP>(0, qd >> 3, lane);
    /* k-step kk of this warp's 32 queries x SK keys of A Bᵀ (S = Q Kᵀ, dP = dO Vᵀ) */
    auto qk_step = [&](float (&acc)[2][NS][4], const lk_bf16_t *at, const lk_bf16_t *bt, int kk) {
        uint32_t a[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) ldsm4(a[i], at + wq.at(16 * i, 2 * kk));
#pragma unroll
        for (int np = 0; np < NS / 2; np++) {
            uint32_t bb[4];
            ldsm4(bb, bt + wk.at(16 * np, 2 * kk));
#pragma unroll
            for (int i = 0; i < 2; i++) mma(acc[i][2 * np], a[i], bb[0], bb[1]), mma(acc[i][2 * np + 1], a[i], bb[2], bb[3]);
        }
    };
    /* where this lane's P and dS pairs go: row sm + g (+ 16i + 8hh), chunk sn / 8 + j, swizzled by g */
    const int pbase = (sm + g) * BNK + 2 * t4, px = ((sn >> 3) ^ g) << 3;
    float dk[2][DH / 8][4], dv[2][DH / 8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < DH / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[i][j][e] = dv[i][j][e] = 0.0f;
    for (int it = 0; it < n; it++) {
        cp_wait<0>();      /* tile it (and K, V) landed */
        __syncthreads();   /* ... for every thread; every warp is past step it-1 */
        const int st = it & 1;
        const int4 cur = FLEX ? steps[it % 3] : at;
        const int q0 = cur.y;
        if (it + 1 < n) {
            const int s1 = (it + 1) & 1;
            const int4 nx = FLEX ? flex_step(p, b, hk, ft, it + 1) : after(cur);
            if (FLEX && tid == 0) steps[(it + 1) % 3] = nx;
            dkv_issue<DP, NT, FLEX>(p, nx.x, nx.y, b, qs + s1 * BMQ * DP, gs + s1 * BMQ * DP, ls + s1 * BMQ,
                                    dl + s1 * BMQ, los + s1 * BMQ, his + s1 * BMQ);
            at = nx;
        }
        cp_commit();
        const lk_bf16_t *qt = qs + st * BMQ * DP, *gt = gs + st * BMQ * DP;
        const float *lt = ls + st * BMQ, *dt = dl + st * BMQ;
        const int *lot = los + st * BMQ, *hit = his + st * BMQ;
        /* S = Q Kᵀ on this warp's 32 queries x SK keys */
        float s[2][NS][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[i][j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) qk_step(s, qt, ks, kk);
        /* P = exp2(scale·s − lse) into s and to shared memory, then dP = dO Vᵀ and dS = P ∘ (dP − δ):
         * P's exponentials share a block with dP's GEMM and issue between its HMMAs (S and dP
         * in one loop left them a stretch of their own). Element e of n-tile j is
         * query row sm + 16i + g + 8 (e / 2), key sn + 8j + 2 t4 + e % 2. MASKED: the tile's
         * elements tested (a branch a step: the tests predicated in the loop cost every step
         * ~3 instructions an element, masked or not) */
        const bool full = FLEX ? cur.z < 0 : q0 + BMQ <= p.Sq && lot[BMQ - 1] <= k0 && hit[0] >= k0 + BNK;
        const float slope2 = FLEX == 2 ? p.alibi[cur.x] : 0.0f;   /* ALiBi: the step's head */
        auto p_ds = [&](auto masked) {
            constexpr bool MASKED = decltype(masked)::value;
            const uint32_t *fb = FLEX && MASKED ? p.fx.bits + (int64_t)cur.z * LK_FLEX_TILE_WORDS : nullptr;
            float fc[CAP ? 2 : 1][CAP ? NS : 1][CAP ? 4 : 1];   /* softcap's derivative */
            float dp[2][NS][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NS; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dp[i][j][e] = 0.0f;
            /* P of n-tile j of row half (i, hh), into s and shared memory (the row's bounds read at j 0) */
            float L2 = 0.0f;
            int lo = 0, hi = 0;
            uint32_t seen = 0;
            auto p_of = [&](int i, int hh, int j) {
                const int r = sm + 16 * i + g + 8 * hh, q = q0 + r;
                if (j == 0) {
                    const float L = lt[r];
                    L2 = L == -INFINITY ? INFINITY : L * LOG2E;
                    if (FLEX && MASKED)   /* the row's keys sn.. of the mask tile, from this lane's column on */
                        seen = fb[(q % LK_FLEX_TILE) * LK_FLEX_WORDS + (k0 % LK_FLEX_TILE + sn) / 32] >> ((sn % 32) + 2 * t4);
                    else if (MASKED)
                        lo = lot[r] - k0 - sn - 2 * t4, hi = hit[r] - k0 - sn - 2 * t4;   /* against 8j + e % 2 */
                }
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    const int c = 8 * j + x;
                    float v = s[i][j][2 * hh + x];
                    if (CAP) v = capped(v, p, &fc[i][j][2 * hh + x]);
                    const float bias = FLEX == 2 ? slope2 * (float)(k0 + sn + c + 2 * t4 - q) : 0.0f;
                    float e = lk_ex2(fmaf(v, c2, bias - L2));
                    if (MASKED && (FLEX ? !((seen >> c) & 1u) : c < lo || c >= hi)) e = 0.0f;
                    s[i][j][2 * hh + x] = e;
                }
                *reinterpret_cast<uint32_t *>(ps + pbase + (16 * i + 8 * hh) * BNK + (px ^ (j << 3))) =
                    lk_pack_bf16x2(s[i][j][2 * hh], s[i][j][2 * hh + 1]);
            };
            /* dP = dO Vᵀ with the thread's 4·NS (i, hh, j) pairs of P spread over its DP / 16 k-steps:
             * ptxas keeps independent work where the source puts it (a P loop ahead of the GEMM
             * stayed ahead of it) */
            constexpr int T = 4 * NS, KD = DP / 16;   /* (i, hh, j) triples; dP's steps */
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) {
                qk_step(dp, gt, vs, kk);
#pragma unroll
                for (int t = (kk * T + KD - 1) / KD; t < ((kk + 1) * T + KD - 1) / KD; t++) p_of(t / (2 * NS), (t / NS) % 2, t % NS);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const float d = dt[sm + 16 * i + g + 8 * hh];
#pragma unroll
                    for (int j = 0; j < NS; j++) {
                        float dsv[2];
#pragma unroll
                        for (int x = 0; x < 2; x++) {
                            const int e = 2 * hh + x;
                            dsv[x] = s[i][j][e] * (dp[i][j][e] - d);
                            if (CAP) dsv[x] *= fc[i][j][e];
                        }
                        *reinterpret_cast<uint32_t *>(dss + pbase + (16 * i + 8 * hh) * BNK + (px ^ (j << 3))) =
                            lk_pack_bf16x2(dsv[0], dsv[1]);
                    }
                }
        };
        if (full) p_ds(std::false_type());
        else p_ds(std::true_type());
#if FA3_ARCH
        if (dq_mode == DQ_BULK && (BOX ? lane == 0 : tid < BMQ)) bulk_wait_read0();   /* the last step's tile read */
#endif
        __syncthreads();   /* P and dS whole (and dqs free) */
        /* dQ first: DQ_RED's reductions drain under the dV and dK GEMMs (measured with them: level
         * with dQ last; FlashAttention-2's order, dV, dQ, dK, 3% slower: bench/NOTES.md, fortieth
         * session); DQ_BULK's tile is written here and added at once */
        if (dq_mode != DQ_NONE) {
            /* dQ += dS K on this warp's 32 queries x DQ columns, into the workspace */
            float acc[2][DQ / 8][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < DQ / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BNK / 16; kk++) {
                uint32_t a[2][4];
#pragma unroll
                for (int i = 0; i < 2; i++) ldsm4(a[i], dss + wd.at(16 * i, 2 * kk));
#pragma unroll
                for (int dn = 0; dn < DQ / 16; dn++) {
                    uint32_t bb[4];
                    ldsm4t(bb, ks + wkq.at(16 * kk, 2 * dn));
#pragma unroll
                    for (int i = 0; i < 2; i++) mma(acc[i][2 * dn], a[i], bb[0], bb[1]), mma(acc[i][2 * dn + 1], a[i], bb[2], bb[3]);
                }
            }
            /* row sm + g + 16i + 8hh, columns qd + 8j + 2 t4 and + 1 */
            const int64_t bh = (int64_t)b * p.Hq + cur.x;
#if FA3_ARCH
            if (dq_mode == DQ_BULK) {
                /* BOX: row r, column c of the warp's box at 16-byte chunk c / 4 ^ r % 8 of its row r */
                float *box = dqs + w * 32 * 32;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++)
#pragma unroll
                        for (int j = 0; j < DQ / 8; j++)
                            *reinterpret_cast<float2 *>(
                                BOX ? box + (g + 16 * i + 8 * hh) * 32 + (((2 * j + (t4 >> 1)) ^ g) << 2) + 2 * (t4 & 1)
                                    : dqs + (sm + g + 16 * i + 8 * hh) * DQS + qd + 8 * j + 2 * t4) =
                                make_float2(acc[i][j][2 * hh], acc[i][j][2 * hh + 1]);
                fence_async_smem();   /* for TMA or the bulk reductions */
                if (BOX) {
                    __syncwarp();
                    if (lane == 0) tma_reduce_add(&tdq, box, qd, q0 + sm, (int)bh), bulk_commit();
                } else {
                    rows_written(w);
                    if (w < 2) {   /* a row a lane */
                        if (q0 + tid < p.Sq) bulk_reduce_add(p.dq_acc + (bh * p.Sq + q0 + tid) * p.D, dqs + tid * DQS, p.D * 4);
                        bulk_commit();
                    }
                }
            } else
#endif
            {   /* DQ_RED: one pointer a step and fixed offsets from it where the warp's columns
                 * all lie in D (the first version formed each address in 64 bits with its bounds
                 * tested: ~20 instructions a reduction) */
                float *dqb = p.dq_acc + (bh * p.Sq + q0 + sm + g) * p.D + qd + 2 * t4;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        if (q0 + sm + g + 16 * i + 8 * hh >= p.Sq) continue;
                        float *dst = dqb + (16 * i + 8 * hh) * p.D;
#if __CUDA_ARCH__ >= 900
                        if (p.vec && qd + DQ <= p.D) {
#pragma unroll
                            for (int j = 0; j < DQ / 8; j++)
                                atomicAdd(reinterpret_cast<float2 *>(dst + 8 * j), make_float2(acc[i][j][2 * hh], acc[i][j][2 * hh + 1]));
                            continue;
                        }
#endif
#pragma unroll
                        for (int j = 0; j < DQ / 8; j++) {
                            const int col = qd + 8 * j + 2 * t4;
                            if (col < p.D) atomicAdd(dst + 8 * j, acc[i][j][2 * hh]);
                            if (col + 1 < p.D) atomicAdd(dst + 8 * j + 1, acc[i][j][2 * hh + 1]);
                        }
                    }
            }
        }
        /* dV += Pᵀ dO and dK += dSᵀ Q on this warp's 32 keys x DH columns */
#pragma unroll
        for (int kk = 0; kk < BMQ / 16; kk++) {
            uint32_t ap[2][4], ad[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                ldsm4t(ap[i], ps + wp.at(16 * kk, 2 * i));
                ldsm4t(ad[i], dss + wp.at(16 * kk, 2 * i));
            }
#pragma unroll
            for (int dn = 0; dn < DH / 16; dn++) {
                uint32_t bg[4], bq[4];
                ldsm4t(bg, gt + wg.at(16 * kk, 2 * dn));
                ldsm4t(bq, qt + wg.at(16 * kk, 2 * dn));
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mma(dv[i][2 * dn], ap[i], bg[0], bg[1]), mma(dv[i][2 * dn + 1], ap[i], bg[2], bg[3]);
                    mma(dk[i][2 * dn], ad[i], bq[0], bq[1]), mma(dk[i][2 * dn + 1], ad[i], bq[2], bq[3]);
                }
            }
        }
    }
#if FA3_ARCH
    if (dq_mode == DQ_BULK) bulk_wait0();   /* the last step's rows */
#endif
    cp_wait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int key = k0 + vk + 16 * i + g + 8 * hh;
            if (key >= p.Skv) continue;
            if (!FLEX && part >= 0) {   /* a part of a split block: its share added into the tail's sums */
                float *rk = lk_attn_tail_row(p.tail, L, key - k0), *rv = rk + BNK * p.D;
#pragma unroll
                for (int j = 0; j < DH / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const int col = vd + 8 * j + 2 * t4 + x;
                        if (col >= p.D) continue;
                        atomicAdd(rk + col, dk[i][j][2 * hh + x] * p.scale);
                        atomicAdd(rv + col, dv[i][j][2 * hh + x]);
                    }
                continue;
            }
            lk_bf16_t *krow = p.dk + ((int64_t)bhk * p.Skv + key) * p.D, *vrow = p.dv + ((int64_t)bhk * p.Skv + key) * p.D;
#pragma unroll
            for (int j = 0; j < DH / 8; j++) {
                const int col = vd + 8 * j + 2 * t4;
                store2(krow, col, p.D, dk[i][j][2 * hh] * p.scale, dk[i][j][2 * hh + 1] * p.scale, p.vec);
                store2(vrow, col, p.D, dv[i][j][2 * hh], dv[i][j][2 * hh + 1], p.vec);
            }
        }
}

/* Deterministic dQ: a block takes 64 query rows of one (b, h) (4 warps of 16), walks
 * their keys in BN tiles like the forward and keeps dQ in registers. FLEX as the forward:
 * the mask's tiles, partial ones masked by their bits by row. */
template <int DP, int FLEX>
static __global__ void __launch_bounds__(128, 1) fa2_dq(const fa_args p) {
    constexpr int NT = 128, NS = BN / 8, ND = DP / 8;
    extern __shared__ uint4 smem_[];
    lk_bf16_t *qs = (lk_bf16_t *)smem_, *gs = qs + BMQ * DP, *ks = gs + BMQ * DP, *vs = ks + 2 * BN * DP;
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3, rw = (tid >> 5) * 16;
    int bh, ti;
    block_of(p, &bh, &ti);
    const int h = bh % p.Hq, b = bh / p.Hq;
    const int q0 = (tiles_of(p) - 1 - ti) * BMQ, nq = min(BMQ, p.Sq - q0);
    const lk_bf16_t *kg = p.k + ((int64_t)b * p.Hkv + h / p.G) * p.Skv * p.D;
    const lk_bf16_t *vg = p.v + ((int64_t)b * p.Hkv + h / p.G) * p.Skv * p.D;
    load_tile<DP, NT, BMQ>(qs, p.q + ((int64_t)bh * p.Sq + q0) * p.D, p.D, nq, p.D, p.vec);
    load_tile<DP, NT, BMQ>(gs, p.dout + (((int64_t)b * p.Sq + q0) * p.Hq + h) * p.D, (int64_t)p.Hq * p.D, nq, p.D,
                      p.vec);
    cp_commit();
    int lo[2], hi[2];
    float L2[2], dl[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int r = rw + g + 8 * hh;
        lo[hh] = hi[hh] = 0, L2[hh] = INFINITY, dl[hh] = 0.0f;
        if (r < nq) {
            if (!FLEX) row_iv(p, q0 + r, lo[hh], hi[hh]);
            const float L = p.lse[(int64_t)bh * p.Sq + q0 + r];
            L2[hh] = L == -INFINITY ? INFINITY : L * LOG2E;
            dl[hh] = p.delta[(int64_t)bh * p.Sq + q0 + r];
        }
    }
    const key_tiles<FLEX> kw = key_tiles_of<FLEX>(p, b, h, q0, nq);
    if (kw.n > 0) {
        const int ka = kw.key0(0);
        load_tile<DP, NT, BN>(ks, kg + (int64_t)ka * p.D, p.D, min(BN, p.Skv - ka), p.D, p.vec);
        load_tile<DP, NT, BN>(vs, vg + (int64_t)ka * p.D, p.D, min(BN, p.Skv - ka), p.D, p.vec);
    }
    cp_commit();
    const float c2 = p.cap > 0.0f ? LOG2E : p.scale * LOG2E, slope2 = FLEX == 2 ? p.alibi[h] : 0.0f;
    float acc[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int t = 0; t < kw.n; t++) {
        const int k0 = kw.key0(t);
        cp_wait<0>();
        __syncthreads();   /* tile t in for every thread; tile t-1's stage free */
        if (t + 1 < kw.n) {
            const int k1 = kw.key0(t + 1), st = (t + 1) & 1;
            load_tile<DP, NT, BN>(ks + st * BN * DP, kg + (int64_t)k1 * p.D, p.D, min(BN, p.Skv - k1), p.D, p.vec);
            load_tile<DP, NT, BN>(vs + st * BN * DP, vg + (int64_t)k1 * p.D, p.D, min(BN, p.Skv - k1), p.D, p.vec);
        }
        cp_commit();
        const lk_bf16_t *kt = ks + (t & 1) * BN * DP, *vt = vs + (t & 1) * BN * DP;
        float s[NS][4], dp[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t aq[4], ag[4];
            ldsm4(aq, qs + at_a<DP>(rw, 2 * kk, lane));
            ldsm4(ag, gs + at_a<DP>(rw, 2 * kk, lane));
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t bb[4];
                ldsm4(bb, kt + at_b<DP>(16 * np, 2 * kk, lane));
                mma(s[2 * np], aq, bb[0], bb[1]), mma(s[2 * np + 1], aq, bb[2], bb[3]);
                ldsm4(bb, vt + at_b<DP>(16 * np, 2 * kk, lane));
                mma(dp[2 * np], ag, bb[0], bb[1]), mma(dp[2 * np + 1], ag, bb[2], bb[3]);
            }
        }
        const bool full = FLEX ? (t >> 1) >= kw.fpart : k0 >= kw.maxlo && k0 + BN <= kw.minhi;
        uint64_t seen[2] = {0, 0};   /* FLEX: the two rows' 64 keys, from this lane's column on */
        if (FLEX && !full) {
            const uint32_t *fb = kw.bits(p, t);
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                seen[hh] = *reinterpret_cast<const uint64_t *>(fb + (q0 % LK_FLEX_TILE + rw + g + 8 * hh) *
                                                                         LK_FLEX_WORDS) >> (2 * t4);
        }
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hh = e >> 1, key = k0 + 8 * n + 2 * t4 + (e & 1);
                float x = s[n][e], f = 1.0f;
                if (p.cap > 0.0f) x = capped(x, p, &f);
                const float bias = FLEX == 2 ? slope2 * (float)(key - (q0 + rw + g + 8 * hh)) : 0.0f;
                float pv = lk_ex2(fmaf(x, c2, bias - L2[hh]));
                if (!full && (FLEX ? !((seen[hh] >> (8 * n + (e & 1))) & 1u) : key < lo[hh] || key >= hi[hh]))
                    pv = 0.0f;
                dp[n][e] = pv * (dp[n][e] - dl[hh]) * f;
            }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4];
            c_to_a(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
            for (int dn = 0; dn < DP / 16; dn++) {
                uint32_t bb[4];
                ldsm4t(bb, kt + at_a<DP>(16 * kk, 2 * dn, lane));
                mma(acc[2 * dn], a, bb[0], bb[1]), mma(acc[2 * dn + 1], a, bb[2], bb[3]);
            }
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int row = q0 + rw + g + 8 * hh;
        if (row >= p.Sq) continue;
        lk_bf16_t *dst = p.dq + ((int64_t)bh * p.Sq + row) * p.D;
#pragma unroll
        for (int n = 0; n < ND; n++)
            store2(dst, 8 * n + 2 * t4, p.D, acc[n][2 * hh] * p.scale, acc[n][2 * hh + 1] * p.scale, p.vec);
    }
}

/* --- host ----------------------------------------------------------------------------- */


static size_t dq_acc_bytes(const lk_attention_args *a) {
    return lk_arena_piece((size_t)a->q.shape[0] * (size_t)a->q.shape[1] * (size_t)a->q.shape[2] *
                          (size_t)a->q.shape[3] * 4);
}

static int dp_of(int64_t D);

/* dk/dv's last wave split into parts (tail_split.cuh), for dkv's key blocks (D 256: 64 keys). */
static lk_attn_tail tail_of(const lk_attention_args *a) {
    return lk_attn_tail_of(a, dp_of(a->q.shape[3]) == 256 ? 64 : 128, BMQ);
}

static size_t saved_bytes(const lk_attention_args *a) { return lk_attn_lse_bytes(a); }

static int fits(const lk_attention_args *a, int backward);

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    if (a->q.dtype != LK_BF16 || !fits(a, backward)) return lk_attention_flash_cuda_backend.workspace_bytes(a, backward);
    size_t n = lk_attn_vis_bytes(a) + lk_attn_flex_alibi_bytes(a);
    if (backward && !a->deterministic) n += dq_acc_bytes(a) + lk_arena_piece(lk_attn_tail_bytes(tail_of(a)));
    if (backward) n += 2 * lk_arena_piece(lk_attn_lse_bytes(a));
    return n;
}

static int aligned16(const void *x) { return ((uintptr_t)x & 15) == 0; }

/* The kernels' arguments (cu_seqlens copied into the arena by lk_attn_vis_make). */
static lk_status args_of(const lk_attention_args *a, lk_ctx *ctx, fa_args *p) {
    lk_attn_dims d = lk_attn_dims_of(a);
    if (d.D > MAXD)
        return lk_error(LK_ESHAPE, "attention: q: expected head dim D <= %d on CUDA, got %lld", MAXD, (long long)d.D);
    const int head_major = a->causal || d.B * d.Hq > 65535;   /* grid_of; y at most 65535 */
    if (d.Sq >= INT32_MAX || d.Skv >= INT32_MAX || (head_major ? (d.Sq > 65535 * 64 || d.Skv > 65535 * 64)
                                                               : d.B * d.Hq > 65535))
        return lk_error(LK_ESHAPE, "attention: q: expected S_q, S_kv and B·H_q within the CUDA grid, got %lld, %lld "
                        "and %lld", (long long)d.Sq, (long long)d.Skv, (long long)(d.B * d.Hq));
    fa_args z = {0};
    *p = z;
    p->q = (const lk_bf16_t *)a->q.data, p->k = (const lk_bf16_t *)a->k.data, p->v = (const lk_bf16_t *)a->v.data;
    p->out = (const lk_bf16_t *)a->out.data, p->o = (lk_bf16_t *)a->out.data;
    p->dout = (const lk_bf16_t *)a->dout.data;
    p->dq = (lk_bf16_t *)a->dq.data, p->dk = (lk_bf16_t *)a->dk.data, p->dv = (lk_bf16_t *)a->dv.data;
    p->lse = (float *)a->saved.data;
    p->sink = (const float *)a->s_aux.data;
    p->B = (int)d.B, p->Hq = (int)d.Hq, p->Hkv = (int)d.Hkv, p->G = (int)d.G, p->Sq = (int)d.Sq;
    p->Skv = (int)d.Skv, p->D = (int)d.D;
    p->scale = d.scale, p->cap = a->softcap > 0.0f ? a->softcap : 0.0f, p->head_major = head_major;
    p->vec = d.D % 8 == 0 && aligned16(a->q.data) && aligned16(a->k.data) && aligned16(a->v.data) &&
             aligned16(a->out.data) && (!a->dout.data || aligned16(a->dout.data)) &&
             (!a->dq.data || aligned16(a->dq.data)) && (!a->dk.data || aligned16(a->dk.data)) &&
             (!a->dv.data || aligned16(a->dv.data));
    return lk_attn_vis_make(a, ctx->arena, (cudaStream_t)ctx->stream, &p->vis);
}

static size_t fwd_smem(int DP);
static size_t dkv_smem(int DP, int dq_mode);
static size_t dq_smem(int DP);

template <typename K>
static lk_status allow_smem(K kernel, size_t bytes) {
    if (bytes > (48u << 10))
        LK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return LK_OK;
}

/* Softcap is a template flag of the forward and dkv kernels: its tanh, inlined into the
 * tile loop, cost them spills (ptxas -v) even on calls without it. */
template <int DP, int WARPS, int MT>
static lk_status launch_fwd(const fa_args &p, cudaStream_t st) {
    constexpr int BM = 16 * MT * WARPS;
    static_assert(BM == 128, "fwd_smem assumes 128 query rows a block");
    const size_t sh = fwd_smem(DP);
    const int mode = p.flex ? (p.alibi ? 2 : 1) : 0;
    void (*const kerns[3][2])(const fa_args) = {{fa2_fwd<DP, WARPS, MT, false, 0>, fa2_fwd<DP, WARPS, MT, true, 0>},
                                                {fa2_fwd<DP, WARPS, MT, false, 1>, fa2_fwd<DP, WARPS, MT, true, 1>},
                                                {fa2_fwd<DP, WARPS, MT, false, 2>, fa2_fwd<DP, WARPS, MT, true, 2>}};
    void (*kern)(const fa_args) = kerns[mode][p.cap > 0.0f];
    lk_status s = allow_smem(kern, sh);
    if (s) return s;
    const dim3 grid = grid_of(p, (p.Sq + BM - 1) / BM, (int64_t)p.B * p.Hq);
    kern<<<grid, WARPS * 32, sh, st>>>(p);
    LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) forward");
    return LK_OK;
}

/* Shared bytes of each kernel at head dim D (DP = D padded up). */
static int dp_of(int64_t D) { return D <= 64 ? 64 : D <= 128 ? 128 : 256; }
static size_t fwd_smem(int DP) { return (size_t)(128 + 4 * BN) * DP * 2 + 2 * 128 * sizeof(int); }
static size_t dkv_smem(int DP, int dq_mode) {
    const int bnk = DP == 256 ? 64 : 128;   /* K, V; Q, dO two stages; P, dS; the rows' stats and bounds; dQ */
    return (size_t)(2 * bnk * DP + 4 * BMQ * DP + 2 * bnk * BMQ) * 2 + 8 * BMQ * 4 +
           (dq_mode == DQ_BULK ? (DP == 128 ? (size_t)BMQ * DP * 4 + 1024 /* the boxes' alignment */ : (size_t)BMQ * (DP + 8) * 4) : 0);
}
static size_t dq_smem(int DP) { return (size_t)(2 * BMQ + 4 * BN) * DP * 2; }

/* D past 128 takes ~200 KiB of shared memory a block: where the GPU has less (sm_80:
 * 163 KiB) those calls run on flash.cu's CUDA cores, the same LSE either way. */
static int fits(const lk_attention_args *a, int backward) {
    const int DP = dp_of(a->q.shape[3]);
    size_t need = backward ? (a->deterministic ? dq_smem(DP) : 0) : fwd_smem(DP);
    if (backward && dkv_smem(DP, DQ_RED) > need) need = dkv_smem(DP, DQ_RED);
    const lk_hw *hw = lk_hw_get();
    return hw->cuda_smem_per_block == 0 || need <= hw->cuda_smem_per_block;
}

static lk_status run_fwd(const fa_args &p, cudaStream_t st) {
    return p.D <= 64 ? launch_fwd<64, 4, 2>(p, st) : p.D <= 128 ? launch_fwd<128, 4, 2>(p, st)
                                                                 : launch_fwd<256, 8, 1>(p, st);
}

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) {
    if (a->q.dtype != LK_BF16 || !fits(a, 0)) return lk_attention_flash_cuda_backend.forward(a, ctx);
    fa_args p;
    lk_status s = args_of(a, ctx, &p);
    if (s || p.Sq == 0 || p.B * p.Hq == 0) return s;
    return run_fwd(p, (cudaStream_t)ctx->stream);
}

/* How dk/dv adds dQ: none (deterministic: fa2_dq does), by bulk reductions where the GPU
 * runs the sm_90a code and the extra 34 KiB fit (rows of D, 16-byte aligned: vec), else by
 * atomics. The bulk reductions take the register-held REDs out of the step: behind them the
 * warps stalled on the long scoreboard (bench/NOTES.md, fortieth session). */
static int dkv_dq_mode(const fa_args &p, int DP, int det) {
    const lk_hw *hw = lk_hw_get();
    if (det) return DQ_NONE;
    return hw->cuda_cc == 90 && DP <= 128 && p.vec && dkv_smem(DP, DQ_BULK) <= hw->cuda_smem_per_block ? DQ_BULK
                                                                                                        : DQ_RED;
}

template <int DP>
static lk_status launch_bwd(const fa_args &p, int det, cudaStream_t st) {
    constexpr int BNK = DP == 256 ? 64 : 128;
    const int mode = dkv_dq_mode(p, DP, det);
    const size_t sh = dkv_smem(DP, mode);
    const int fm = p.flex ? (p.alibi ? 2 : 1) : 0;
    void (*const kerns[3][2])(const fa_args, int, const CUtensorMap) = {{fa2_dkv<DP, false, 0>, fa2_dkv<DP, true, 0>},
                                                     {fa2_dkv<DP, false, 1>, fa2_dkv<DP, true, 1>},
                                                     {fa2_dkv<DP, false, 2>, fa2_dkv<DP, true, 2>}};
    void (*kern)(const fa_args, int, const CUtensorMap) = kerns[fm][p.cap > 0.0f];
    lk_status s = allow_smem(kern, sh);
    if (s) return s;
    CUtensorMap tdq;   /* DQ_BULK at DP 128: the workspace [B·Hq, Sq, D] in boxes of 32 rows x 32 columns */
    memset(&tdq, 0, sizeof tdq);
    if (DP == 128 && mode == DQ_BULK && (s = f32_rows_map(&tdq, p.dq_acc, (int64_t)p.B * p.Hq, p.Sq, p.D, 32))) return s;
    if (p.Skv > 0) {
        /* a 1-D grid in grid_order.cuh's order: under a causal mask the 2-D head-major grid ran
         * every head at once (bench/walk_sim.py --head-major: 49% of the B 2, H 32, S 8192 causal
         * steps missed in L2, 6% banded; measured -1.6% fwd+bwd on the H200); GQA's first wave
         * (or a banded grid's every block) walks down (the walk above: GQA causal -3.3%) */
        const int64_t heads = (int64_t)p.B * p.Hkv, tiles = (p.Skv + BNK - 1) / BNK;
        fa_args pk = p;
        pk.order = lk_attn_order_of(p.flex ? p.fx.falling : p.vis.causal, heads, tiles);
        int per_sm = 1;   /* asked only where the walk reads its first wave; an order, not a result */
        if (p.vis.causal && p.G > 1 && pk.order != LK_ATTN_ORDER_BANDS &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 256, sh) != cudaSuccess)
            per_sm = 1, (void)cudaGetLastError();   /* never fail the call over it */
        pk.down = lk_attn_down_of(pk.order, heads, tiles, per_sm);
        kern<<<(unsigned)lk_attn_tail_grid(pk.tail), 256, sh, st>>>(pk, mode, tdq);
        LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) dk/dv");
        if (pk.tail.split) {
            const lk_attn_layout kv = {(int64_t)p.Hkv * p.Skv * p.D, (int64_t)p.Skv * p.D, p.D};   /* contiguous */
            lk_attn_tail_convert<<<(unsigned)pk.tail.split, 256, 0, st>>>(pk.tail, pk.order, (int)heads, (int)tiles,
                                                                          p.Skv, p.Hkv, p.dk, kv, p.dv, kv);
            LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) dk/dv of the split blocks");
        }
    }
    if (det) {
        const size_t shq = dq_smem(DP);
        void (*dq)(const fa_args) = !p.flex ? fa2_dq<DP, 0> : p.alibi ? fa2_dq<DP, 2> : fa2_dq<DP, 1>;
        if ((s = allow_smem(dq, shq))) return s;
        const dim3 grid = grid_of(p, (p.Sq + BMQ - 1) / BMQ, (int64_t)p.B * p.Hq);
        dq<<<grid, 128, shq, st>>>(p);
        LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) dq");
    } else {
        const int64_t n = (int64_t)p.B * p.Hq * p.Sq * p.D;
        fa2_dq_cvt<<<(unsigned)((n + 1023) / 1024 < 4096 ? (n + 1023) / 1024 : 4096), 256, 0, st>>>(p.dq_acc, p.dq, n,
                                                                                               p.scale);
        LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) dq convert");
    }
    return LK_OK;
}

static lk_status run_bwd(const lk_attention_args *a, lk_ctx *ctx, fa_args &p);

static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) {
    if (a->q.dtype != LK_BF16 || !fits(a, 1)) return lk_attention_flash_cuda_backend.backward(a, ctx);
    fa_args p;
    lk_status s = args_of(a, ctx, &p);
    if (s || p.Sq == 0 || p.B * p.Hq == 0) return s;
    return run_bwd(a, ctx, p);
}

static lk_status run_bwd(const lk_attention_args *a, lk_ctx *ctx, fa_args &p) {
    lk_status s;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const int det = a->deterministic, sinks = a->s_aux.data && a->ds_aux.data;
    const size_t rows = lk_attn_lse_bytes(a);
    p.delta = (float *)lk_arena_alloc(ctx->arena, lk_arena_piece(rows));
    p.sink_part = sinks ? (float *)lk_arena_alloc(ctx->arena, lk_arena_piece(rows)) : NULL;
    const size_t dq_bytes = det ? 0 : dq_acc_bytes(a);
    p.tail = tail_of(a);
    const size_t tail_bytes = lk_arena_piece(lk_attn_tail_bytes(p.tail));   /* after the dQ sums: one memset */
    p.dq_acc = det ? NULL : (float *)lk_arena_alloc(ctx->arena, dq_bytes + tail_bytes);
    p.tail.acc = tail_bytes && p.dq_acc ? p.dq_acc + dq_bytes / 4 : NULL;
    if (!p.delta || (sinks && !p.sink_part) || (!det && !p.dq_acc))
        return lk_error(LK_ENOMEM, "attention: flash_attention_2 (cuda): no room for delta and the dq sums");
    const int64_t nrows = (int64_t)p.B * p.Hq * p.Sq;
    fa2_prep<<<(unsigned)((nrows + 7) / 8), 256, 0, st>>>(p);
    LK_CUDA_LAUNCHED("attention: flash_attention_2 (cuda) delta");
    if (!det) LK_CUDA_TRY(cudaMemsetAsync(p.dq_acc, 0, dq_bytes + tail_bytes, st));
    s = p.D <= 64 ? launch_bwd<64>(p, det, st) : p.D <= 128 ? launch_bwd<128>(p, det, st) : launch_bwd<256>(p, det, st);
    if (s) return s;
    return sinks ? lk_attn_cuda_sink_sum(p.sink_part, (float *)a->ds_aux.data, p.B, p.Hq, p.Sq, st) : LK_OK;
}

extern "C" const lk_attention_vtable lk_attention_fa2_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward, NULL,
};

/* --- flex_attention: the BlockMask's tiles on the same kernels --------------------------
 * The mask's tiles on the GPU and ALiBi's slopes come from flex_map.cu. The mask alone says what is
 * seen (causal and window options are ignored, as on the CPU); softcap comes as the
 * option or as score_mod lk_score_mod_softcap, ALiBi as lk_score_mod_alibi (FLEX 2). The
 * Hopper row (fa3.cu) takes the same plan and slopes from here. */

/* What these kernels cannot run: an error naming it, before anything is written. */
static lk_status flex_supports(const lk_attention_args *a, int backward) {
    if (!fits(a, backward))
        return lk_error(LK_EUNAVAILABLE, "attention: D: flex_attention on this GPU takes a head dim up to 128 "
                        "(the shared memory of D 256's tiles is not there), got %lld", (long long)a->q.shape[3]);
    if (a->score_mod.fn && a->score_mod.fn != lk_score_mod_softcap && a->score_mod.fn != lk_score_mod_alibi)
        return lk_error(LK_EUNAVAILABLE, "attention: score_mod: flex_attention on CUDA takes none, "
                        "lk_score_mod_softcap or lk_score_mod_alibi (other host functions: the CPU's "
                        "flex_attention), got another function");
    if (a->score_mod.fn == lk_score_mod_softcap && a->softcap > 0.0f)
        return lk_error(LK_EINVAL, "attention: score_mod: expected softcap once, as score_mod or as the softcap "
                        "option, got both");
    return LK_OK;
}

/* The kernels' arguments for a flex call: the mask's tiles instead of the visibility options. */
static lk_status flex_args(const lk_attention_args *a, lk_ctx *ctx, fa_args *p) {
    lk_attention_args plain = *a;
    plain.causal = 0, plain.window_left = plain.window_right = 0;
    lk_status s = args_of(&plain, ctx, p);
    if (s) return s;
    p->head_major = (int64_t)p->B * p->Hq > 65535;
    if (a->score_mod.fn == lk_score_mod_softcap) p->cap = *(const float *)a->score_mod.ctx;
    p->flex = 1;
    if ((s = lk_attn_flex_alibi(a, ctx->arena, ctx->stream, &p->alibi))) return s;
    return lk_attn_flex_map(a->block_mask, ctx->stream, &p->fx);
}

static lk_status flex_forward(const lk_attention_args *a, lk_ctx *ctx) {
    fa_args p;
    lk_status s = flex_args(a, ctx, &p);
    return s ? s : run_fwd(p, (cudaStream_t)ctx->stream);
}

static lk_status flex_backward(const lk_attention_args *a, lk_ctx *ctx) {
    fa_args p;
    lk_status s = flex_args(a, ctx, &p);
    return s ? s : run_bwd(a, ctx, p);
}

extern "C" const lk_attention_vtable lk_attention_fa2_flex_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, flex_forward, flex_backward, flex_supports,
};
