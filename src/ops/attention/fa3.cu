/* fa3.cu — `flash_attention_3` on Hopper (sm_90a): the forward in FlashAttention-3's shape,
 * written for llmkern. bf16 in, f32 softmax and accumulation, the LSE saved.
 *
 *   a block      128 query rows of one (b, h); three warpgroups (384 threads):
 *   producer     warpgroup 0 gives back its registers (setmaxnreg 24) and one thread issues
 *                TMA loads: the Q tile once, then K and V tiles of BN = 128 keys into a
 *                ring of three stages (D 128). K and V of a stage complete on mbarriers
 *                of their own (TMA's transaction bytes); an `empty` mbarrier takes the
 *                consumers' arrivals when a stage may be refilled.
 *   consumers    warpgroups 1 and 2 take 64 rows each (setmaxnreg 240): S = Q·Kᵀ by
 *                wgmma from shared memory (m64nBNk16, D/16 steps), the online softmax in
 *                registers (exp2, log2e folded into the scale's FFMA), P rounded to bf16 in
 *                registers as the A operand of O += P·V (wgmma, V read N-major through the
 *                descriptor's transpose). Pipelined inside a warpgroup: Q·Kᵀ of tile t + 1
 *                and P·V of tile t are issued together and the softmax of t + 1 runs while
 *                P·V does; and across the two (ping-pong): they take turns issuing their
 *                GEMMs (named barriers 1 and 2), so one's softmax meets the other's GEMMs.
 *   layouts      every tile is rows of 64 elements (128 bytes) in TMA's 128-byte swizzle,
 *                the layout wgmma's descriptors name (K-major: +32 bytes a k-step; V
 *                N-major: +2048 bytes a k-step, 64-column blocks BN·128 bytes apart).
 *
 * Visibility is visible.cuh's (the CPU's rule: causal bottom-right, windows, varlen
 * documents): query row i sees keys [lo_i, hi_i). A block visits the key tiles any of its
 * rows sees; a tile every row sees whole skips the per-element mask. Causal blocks are
 * launched longest first. GQA reads K/V head h / G through the tensor map's head
 * coordinate; no copies. Softcap and sinks as in the contract. Head dims that are
 * multiples of 8 up to 128 (TMA zero-fills the columns past D of a 64- or 128-wide tile).
 * q, k and v may be strided views (attention.h): the maps are 4-D, {column, row, head,
 * batch}, with the tensors' own strides, so a projection's [B, S, H, D] rows are read where
 * they lie (the model's v, transformers' transposed q/k/v) instead of moved head-major first.
 *
 * The backward is fa3_bwd.cu's (wgmma too). What neither takes (f32, other head dims up to
 * 256, unaligned tensors; softcap and `deterministic` in the backward) runs on
 * flash_attention_2's kernels (fa2.cu; the same LSE contract).
 *
 * Tried and measured slower (forty-fourth session, H100, bench/NOTES.md): this kernel made
 * persistent, as FlashAttention-3's forward is (a block an SM taking (query tile, head) items
 * from a counter; the next item's Q and first K/V tiles loaded while the consumers finish the
 * last P·V and store: cedce66, afc623f). Flex's short items (sliding window,
 * documents) ran 3-5% faster; the long ones of the flash cells 0-6% slower, at main's
 * register budgets as at 40 / 232 / 232: the launch, barrier init and first loads it saves
 * are small beside a long item, and something in the loop over items costs more. In the
 * forty-eighth: no ping-pong turns (+0.2-0.8%, now that each warpgroup's softmax overlaps
 * its own P·V), FlashAttention-4's stale max (the running max kept unless a tile's exceeds it
 * by 8: no faster, and flex's dsinks lost precision past the tests' tolerance), and 176-key
 * tiles in two stages (FlashAttention-3's for D 128: every wgmma serialized, C7512).
 * Softcap's and ALiBi's code (MOD) and the masked tiles' (not OPEN) are compiled only into the
 * instances whose calls have them: as branches never taken they cost the loop its schedule (fifty-second
 * session, H100 cycles: full -2.3%, GQA full -2.8%, causal -1.2%, GQA causal -1.1%; flex's
 * forward -1 to -3%). The consumer warpgroup's index comes from a shuffle so that ptxas knows
 * it warp-uniform and keeps the wgmma descriptors built from it in uniform registers (R2UR 38
 * -> 7; fifty-third session, H100 cycles: -0.9 to -1.4% every cell).
 *
 * flex_attention (the FLEX instances, issue 19): the key tiles are the BlockMask's 128-key
 * tiles (flex_plan.h), partial ones first; a partial tile's elements are its bits, read as
 * one 16-byte load a row; ALiBi's bias joins the scores in log2 units. */
#include <math.h>
#include <stdlib.h>
#include "core/cuda_check.h"
#include "ops/attention/flex_plan.h"
#include "ops/attention/hopper.cuh"
#include "ops/attention/internal.h"
#include "ops/attention/visible.cuh"
#include "ops/cuda_util.cuh"

#define BM 128            /* query rows a block */
/* Keys a tile, BN: 128 for every mask. Stages of the K/V ring: as many as the 227 KiB a
 * block may take hold (D 128: 32 KiB of Q + 3 x 64 KiB). Unmasked blocks ran 176-key tiles
 * in two stages (fewer tiles' softmax bookkeeping) until the fourteenth session's A/B: three
 * stages of 128 keys were 10-13% faster on the full cells' forward (bench/NOTES.md). */
template <int DP, int BN>
struct tiling {
    static constexpr int stages = (DP / 64) * (BM + 3 * 2 * BN) * 128 + 1024 <= 227 * 1024 ? 3 : 2;
};
#define THREADS 384
#define LOG2E 1.4426950408889634f

typedef struct {
    int64_t Sq, Skv, Hq, Hkv, G;
    int D;
    float scale2;         /* scale · log2e */
    float scale, cap, cap2;   /* scale; softcap and softcap · log2e (0: none) */
    lk_attn_vis vis;
    const float *sink;    /* [Hq] or NULL */
    int reverse;          /* causal: launch the longest query tiles first */
    lk_flex_map fx;       /* flex_attention: the BlockMask's tiles on the device (flex_plan.h) */
    const float *alibi;   /* flex's ALiBi score_mod: log2e · slope of each q head (device), or NULL */
} fwd_geom;

/* The score_mod an instance is compiled for (like its mask kind, visible.cuh): none, softcap
 * (the option, or flex's score_mod), flex's ALiBi. Flex's softcap instance also takes ALiBi
 * where the call has both, tested at run time (beside the tanh loop it costs nothing). */
enum { MOD_NONE, MOD_SOFTCAP, MOD_ALIBI };
template <int MASK, int MOD>
static __device__ __forceinline__ bool has_alibi(const fwd_geom &g) {
    return MOD == MOD_ALIBI || (MOD == MOD_SOFTCAP && MASK == LK_MASK_FLEX && g.alibi);
}


#if FA3_ARCH
/* The consumer warpgroups' turns: warpgroup cg waits on barrier 1 + cg, which the other
 * warpgroup's 128 threads arrive at once its GEMMs are issued. */
static __device__ __forceinline__ void sched_wait(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(1 + cg) : "memory"); }
static __device__ __forceinline__ void sched_signal(int cg) {
    asm volatile("bar.arrive %0, 256;" ::"r"(1 + cg) : "memory");
}

/* The online softmax of one tile of scores in place: sc becomes the unnormalized
 * probabilities (f32), m the rows' running max (log2 units), alpha the factor the rows'
 * earlier sums and outputs take, sum this lane's share of the tile's row sums. FLEX: a
 * partial tile's bits (fb: this thread's first row, the second 8 rows on; NULL when the
 * tile is full) hide what [lo, hi) would, and ALiBi (slope2 · (key − row), row i the
 * thread's first) joins the scores in log2 units. */
template <int BN, int MASK, int MOD>
static __device__ __forceinline__ void softmax_tile(float *sc, float *m, float *alpha, float *sum, int k0, int maxlo,
                                                    int minhi, const int *lo, const int *hi, const uint32_t *fb,
                                                    float slope2, int i, int lane, const fwd_geom &g) {
    constexpr bool FLEX = MASK == LK_MASK_FLEX, OPEN = MASK == LK_MASK_OPEN;
    if (MOD == MOD_SOFTCAP) {   /* softcap: the scores themselves in log2 units */
#pragma unroll
        for (int e = 0; e < BN / 2; e++) sc[e] = g.cap2 * tanhf(sc[e] * g.scale / g.cap);
    }
    float mul = MOD == MOD_SOFTCAP ? 1.0f : g.scale2;   /* raw scores: log2 units after one FFMA */
    if (has_alibi<MASK, MOD>(g)) {
#pragma unroll
        for (int e = 0; e < BN / 2; e++)
            sc[e] = fmaf(sc[e], mul, slope2 * (float)(k0 + 8 * (e / 4) + 2 * (lane % 4) + (e & 1) - (i + (e & 2 ? 8 : 0))));
        mul = 1.0f;
    }
    if (FLEX && fb) {   /* element e: word e / 16 of its row, bit 8 ((e / 4) % 4) + (e & 1) past the lane's 2 (lane % 4) */
        static_assert(BN == LK_FLEX_TILE, "a key tile is a mask tile");
        uint32_t wr[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint4 u = *reinterpret_cast<const uint4 *>(fb + 8 * r * LK_FLEX_WORDS);
            wr[r][0] = u.x >> (2 * (lane % 4)), wr[r][1] = u.y >> (2 * (lane % 4));
            wr[r][2] = u.z >> (2 * (lane % 4)), wr[r][3] = u.w >> (2 * (lane % 4));
        }
#pragma unroll
        for (int e = 0; e < BN / 2; e++)
            if (!((wr[(e >> 1) & 1][e / 16] >> (8 * ((e / 4) % 4) + (e & 1))) & 1u)) sc[e] = -INFINITY;
    } else if (!FLEX && !OPEN && !(maxlo <= k0 && minhi >= k0 + BN)) {   /* some row does not see the whole tile */
#pragma unroll
        for (int e = 0; e < BN / 2; e++) {
            const int r = (e >> 1) & 1, j = k0 + 8 * (e / 4) + 2 * (lane % 4) + (e & 1);
            if (j < lo[r] || j >= hi[r]) sc[e] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < BN / 2; e++) mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], sc[e]);
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r] * mul);
        ms[r] = mn == -INFINITY ? 0.0f : mn;
        alpha[r] = lk_ex2(m[r] - ms[r]);
        m[r] = mn;
        sum[r] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < BN / 2; e++) {
        const int r = (e >> 1) & 1;
        sc[e] = lk_ex2(fmaf(sc[e], mul, -ms[r]));
        sum[r] += sc[e];
    }
}

#endif

/* Consumer registers are indexed only by unrolled constants: fragment element e of an
 * m64nN accumulator is row (e & 2 ? 8 : 0) + lane / 4 of the warp's 16, column
 * 8 (e / 4) + 2 (lane % 4) + (e & 1). */
template <int DP, int BN, int MASK, int MOD>
__global__ void __launch_bounds__(THREADS, 1) fa3_fwd(const __grid_constant__ CUtensorMap tq,
                                                      const __grid_constant__ CUtensorMap tk,
                                                      const __grid_constant__ CUtensorMap tv, lk_bf16_t *out,
                                                      float *lse, fwd_geom g) {
#if FA3_ARCH
    constexpr bool FLEX = MASK == LK_MASK_FLEX, OPEN = MASK == LK_MASK_OPEN;
    static_assert(MOD == MOD_NONE || MASK == LK_MASK_FLEX || (MOD == MOD_SOFTCAP && MASK == LK_MASK_ROWS),
                  "softcap's instances are ROWS and FLEX, ALiBi's FLEX");
    constexpr int NC = DP / 64, STAGES = tiling<DP, BN>::stages;   /* NC: 64-column blocks of a row */
    constexpr uint32_t QB = BM * 128, KB = BN * 128; /* bytes of one 64-column block */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sq = sm, *sk = sq + NC * QB, *sv = sk + STAGES * NC * KB;
    /* K and V of a stage complete on barriers of their own: Q·Kᵀ need not wait for V */
    uint64_t *bars = (uint64_t *)(sv + STAGES * NC * KB), *qfull = bars, *kfull = bars + 1, *vfull = kfull + STAGES,
             *empty = vfull + STAGES;

    const int tid = threadIdx.x, wg = tid / 128;
    const int64_t bh = blockIdx.y, h = bh % g.Hq, b = bh / g.Hq;
    const int nqt = (int)((g.Sq + BM - 1) / BM);
    const int qt = g.reverse ? nqt - 1 - (int)blockIdx.x : (int)blockIdx.x, i0 = qt * BM;

    /* the key tiles any row of the block sees, and the keys all of its rows see; FLEX: the
     * mask's partial tiles, then its full ones */
    int kmin = 0, maxlo = 0, minhi = 0, kmax = 0, t0 = 0, nt, fpart = 0;
    const int32_t *fidx = nullptr, *fbit = nullptr;
    if (FLEX) {
        static_assert(!FLEX || (BM == LK_FLEX_TILE && BN == LK_FLEX_TILE), "a block's tiles are the mask's");
        const int64_t row = (int64_t)lk_flex_pattern(&g.fx, (int)b, (int)h) * g.fx.nq + qt;
        fpart = g.fx.kv_cnt[2 * row], nt = fpart + g.fx.kv_cnt[2 * row + 1];
        fidx = g.fx.kv_idx + row * g.fx.nk, fbit = g.fx.kv_bit + row * g.fx.nk;
    } else {
        const int last = (int)min((int64_t)i0 + BM, g.Sq) - 1;
        lk_attn_row_iv<MASK>(g.vis, i0, kmin, minhi);
        lk_attn_row_iv<MASK>(g.vis, last, maxlo, kmax);
        t0 = kmax > kmin ? kmin / BN : 0, nt = kmax > kmin ? (kmax + BN - 1) / BN - t0 : 0;
    }

    if (tid == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&kfull[s], 1), mbar_init(&vfull[s], 1), mbar_init(&empty[s], 256);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0 && nt > 0) {
            const int hk = (int)(h / g.G);   /* the maps are [B, H, S, D] views: {column, row, head, batch} */
            mbar_expect_tx(qfull, NC * QB);
            for (int c = 0; c < NC; c++) tma_load4(sq + c * QB, &tq, qfull, c * 64, i0, (int)h, (int)b);
            for (int it = 0; it < nt; it++) {
                const int s = it % STAGES, k0 = FLEX ? fidx[it] * BN : (t0 + it) * BN;
                if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
                mbar_expect_tx(&kfull[s], NC * KB);
                for (int c = 0; c < NC; c++)
                    tma_load4(sk + (s * NC + c) * KB, &tk, &kfull[s], c * 64, k0, hk, (int)b);
                mbar_expect_tx(&vfull[s], NC * KB);
                for (int c = 0; c < NC; c++)
                    tma_load4(sv + (s * NC + c) * KB, &tv, &vfull[s], c * 64, k0, hk, (int)b);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int ct = tid - 128, cg = warp_uniform(ct / 128), w = (ct % 128) / 32, lane = tid % 32;
    const int rw = cg * 64 + w * 16 + lane / 4;     /* this thread's rows: rw and rw + 8 of the block */
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + rw + 8 * r;
        lo[r] = hi[r] = 0;
        if (!FLEX && !OPEN && i < g.Sq) lk_attn_row_iv<MASK>(g.vis, i, lo[r], hi[r]);
    }
    /* FLEX: tile it's bits from this thread's first row, or NULL for a full tile; its first key */
    auto bits_of = [&](int it) -> const uint32_t * {
        return FLEX && it < fpart ? g.fx.bits + (int64_t)fbit[it] * LK_FLEX_TILE_WORDS + rw * LK_FLEX_WORDS : nullptr;
    };
    auto key_of = [&](int it) { return FLEX ? fidx[it] * BN : (t0 + it) * BN; };
    const float slope2 = has_alibi<MASK, MOD>(g) ? g.alibi[h] : 0.0f;
    const float sink2 = g.sink ? g.sink[h] * LOG2E : -INFINITY;
    /* the sink joins each row as a logit with no value: counted once, by the quad's lane 0 */
    const float l0 = g.sink && lane % 4 == 0 ? 1.0f : 0.0f;
    float m[2] = {sink2, sink2}, l[2] = {l0, l0};
    float o[DP / 2];
#pragma unroll
    for (int e = 0; e < DP / 2; e++) o[e] = 0.0f;

    /* Software-pipelined: while O += P·V of tile t runs on the tensor cores, the softmax
     * of tile t + 1 runs beside it; and the two consumer warpgroups take turns issuing
     * their GEMMs (named barriers 1 and 2, warpgroup 0 first), so one's softmax meets
     * the other's GEMMs. */
    float sc[BN / 2], alpha[2], sum[2];
    uint32_t p[BN / 16][4];
    if (cg == 1) sched_signal(0);
    if (nt > 0) {
        mbar_wait(qfull, 0);
        mbar_wait(&kfull[0], 0);
        sched_wait(cg);
        wgmma_fence();
        issue_ss<DP, BN, BM, BN>(sc, sq + cg * 64 * 128, sk);
        wgmma_commit();
        sched_signal(1 - cg);
        wgmma_wait<0>();
        fence_regs<BN / 2>(sc);
        softmax_tile<BN, MASK, MOD>(sc, m, alpha, sum, key_of(0), maxlo, minhi, lo, hi, bits_of(0), slope2, i0 + rw, lane,
                                    g);
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
        pack_a<BN>(sc, p);
        /* A tile's end (the P·V issued beside its Q·Kᵀ waited for, the stage released, O
         * rescaled, l updated, its P packed) is made at the top of the next iteration, in a
         * block of its own: ptxas puts a wgmma wait at the top of the basic block holding it,
         * which was the softmax's, so the softmax ran after P·V and not beside it (the SASS;
         * fixed in the forty-eighth session: -1.4 to -2.1% on an H100, bench/NOTES.md). */
        auto finish = [&](int st) {
            wgmma_wait<0>();
            fence_regs<DP / 2>(o);
            mbar_arrive(&empty[st]);
            /* no row of the warp took a new max (alpha 1): O stays as it is, exactly */
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int e = 0; e < DP / 2; e++) o[e] *= alpha[(e >> 1) & 1];
            }
#pragma unroll
            for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
            pack_a<BN>(sc, p);
        };
        for (int it = 1; it < nt; it++) {
            const int s = it % STAGES, sp = (it - 1) % STAGES;
            if (it > 1) finish((it - 2) % STAGES);
            mbar_wait(&kfull[s], (it / STAGES) & 1);
            mbar_wait(&vfull[sp], ((it - 1) / STAGES) & 1);
            sched_wait(cg);
            fence_regs<DP / 2>(o);
            wgmma_fence();
            issue_ss<DP, BN, BM, BN>(sc, sq + cg * 64 * 128, sk + s * NC * KB);
            wgmma_commit();
            issue_rs<DP, BN>(o, p, sv + sp * NC * KB);
            wgmma_commit();
            sched_signal(1 - cg);
            wgmma_wait<1>();
            fence_regs<BN / 2>(sc);
            softmax_tile<BN, MASK, MOD>(sc, m, alpha, sum, key_of(it), maxlo, minhi, lo, hi, bits_of(it), slope2,
                                        i0 + rw, lane, g);
        }
        if (nt > 1) finish((nt - 2) % STAGES);
        const int sl = (nt - 1) % STAGES;
        mbar_wait(&vfull[sl], ((nt - 1) / STAGES) & 1);
        sched_wait(cg);
        fence_regs<DP / 2>(o);
        wgmma_fence();
        issue_rs<DP, BN>(o, p, sv + sl * NC * KB);
        wgmma_commit();
        sched_signal(1 - cg);
        wgmma_wait<0>();
        fence_regs<DP / 2>(o);
        mbar_arrive(&empty[sl]);
    }
    if (cg == 0) sched_wait(0);   /* warpgroup 1's last turn signal */

    /* the rows' sums over the quad, then out = o / l and the LSE */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    /* each lane summed its own columns: l was per lane until here */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + rw + 8 * r;
        if (i >= g.Sq) continue;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        lk_bf16_t *row = out + ((b * g.Sq + i) * g.Hq + h) * g.D;
#pragma unroll
        for (int e = 2 * r; e < DP / 2; e += 4) {
            const int d = 8 * (e / 4) + 2 * (lane % 4);
            if (d + 1 < g.D) {
                *(__nv_bfloat162 *)(row + d) = __floats2bfloat162_rn(o[e] * inv, o[e + 1] * inv);
            } else if (d < g.D) {
                row[d] = lk_from_f32<lk_bf16_t>(o[e] * inv);
            }
        }
        if (lane % 4 == 0) lse[bh * g.Sq + i] = l[r] > 0.0f ? (m[r] + log2f(l[r])) / LOG2E : -INFINITY;
    }
#else
    __trap();   /* built for sm_90a only: the row needs compute capability 9.0 */
#endif
}

/* --- host ---------------------------------------------------------------------------- */

static size_t saved_bytes(const lk_attention_args *a) { return lk_attn_lse_bytes(a); }

/* What the Hopper kernels do not take runs on flash_attention_2's kernels (fa2.cu): f32
 * (CUDA cores there), head dims past 128 or not a multiple of 8, tensors not 16-byte
 * aligned (TMA's rule), B·H_q past the grid's 65535; and in the backward also softcap and
 * `deterministic` (fa3_bwd.cu). */
static const lk_attention_vtable *const fa2 = &lk_attention_fa2_cuda_backend;

/* q, k and v contiguous or strided views alike: TMA reads either (view_map). */
static int hopper_takes(const lk_attention_args *a) {
    const int64_t D = a->q.shape[3];
    return a->q.dtype == LK_BF16 && D % 8 == 0 && D <= 128 && a->q.shape[0] * a->q.shape[1] <= 65535 &&
           a->q.shape[2] < INT32_MAX && a->k.shape[2] < INT32_MAX && lk_attn_view16(&a->q) && lk_attn_view16(&a->k) &&
           lk_attn_view16(&a->v);
}

static int hopper_backward(const lk_attention_args *a) { return hopper_takes(a) && lk_attn_fa3_bwd_takes(a); }

/* Views go where this file's kernels run the pass; fa2.cu's take contiguous tensors. */
static int takes_views(const lk_attention_args *a, int backward) {
    return backward ? hopper_backward(a) : hopper_takes(a);
}

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    if (backward) return hopper_backward(a) ? lk_attn_fa3_bwd_workspace(a) : fa2->workspace_bytes(a, 1);
    return hopper_takes(a) ? lk_attn_vis_bytes(a) : fa2->workspace_bytes(a, 0);
}

template <int DP, int BN>
static size_t fwd_smem(void) {
    constexpr int st = tiling<DP, BN>::stages;
    return 1024 + (size_t)(DP / 64) * (BM + 2 * st * BN) * 128 + 8 * (1 + 3 * st);
}

template <int DP, int BN, int MASK, int MOD>
static lk_status launch(const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                        const lk_attention_args *a, const lk_attn_dims *d, const fwd_geom &g, cudaStream_t st) {
    const size_t sh = fwd_smem<DP, BN>();
    auto kernel = fa3_fwd<DP, BN, MASK, MOD>;
    LK_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    dim3 grid((unsigned)((d->Sq + BM - 1) / BM), (unsigned)(d->B * d->Hq));
    kernel<<<grid, THREADS, sh, st>>>(tq, tk, tv, (lk_bf16_t *)a->out.data, (float *)a->saved.data, g);
    LK_CUDA_LAUNCHED("attention: flash_attention_3 forward");
    return LK_OK;
}

/* The instance for the call: the score_mod's code (MOD) and the masked tiles' (not OPEN) only where
 * the call has them (the opening says what that is worth). */
template <int DP, int MASK>   /* MASK: LK_MASK_FLEX, or LK_MASK_ROWS made OPEN or CAUSAL where it can be */
static lk_status launch_for(const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                            const lk_attention_args *a, const lk_attn_dims *d, const fwd_geom &g, cudaStream_t st) {
    if (g.cap > 0.0f) return launch<DP, 128, MASK, MOD_SOFTCAP>(tq, tk, tv, a, d, g, st);
    if (MASK == LK_MASK_FLEX)
        return g.alibi ? launch<DP, 128, LK_MASK_FLEX, MOD_ALIBI>(tq, tk, tv, a, d, g, st)
                       : launch<DP, 128, LK_MASK_FLEX, MOD_NONE>(tq, tk, tv, a, d, g, st);
    switch (lk_attn_mask_of(g.vis, 128)) {
    case LK_MASK_OPEN: return launch<DP, 128, LK_MASK_OPEN, MOD_NONE>(tq, tk, tv, a, d, g, st);
    case LK_MASK_CAUSAL: return launch<DP, 128, LK_MASK_CAUSAL, MOD_NONE>(tq, tk, tv, a, d, g, st);
    default: return launch<DP, 128, LK_MASK_ROWS, MOD_NONE>(tq, tk, tv, a, d, g, st);
    }
}

/* The forward of the flash row, or with flex of the flex row (the BlockMask's tiles
 * instead of the visibility options; softcap as the option or as score_mod). */
static lk_status run_forward(const lk_attention_args *a, lk_ctx *ctx, int flex) {
    lk_attn_dims d = lk_attn_dims_of(a);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const float cap = flex && a->score_mod.fn == lk_score_mod_softcap ? *(const float *)a->score_mod.ctx : a->softcap;
    fwd_geom g = {d.Sq, d.Skv, d.Hq, d.Hkv, d.G, (int)d.D, d.scale * LOG2E, d.scale, cap, cap * LOG2E, {},
                  (const float *)a->s_aux.data, flex ? 0 : a->causal, {}, NULL};
    const int bn = 128;
    CUtensorMap tq, tk, tv;
    lk_status s;
    if ((flex && (s = lk_attn_flex_alibi(a, ctx->arena, st, &g.alibi))) ||
        (s = flex ? lk_attn_flex_map(a->block_mask, st, &g.fx) : lk_attn_vis_make(a, ctx->arena, st, &g.vis)) ||
        (s = view_map(&tq, &a->q, BM)) || (s = view_map(&tk, &a->k, bn)) || (s = view_map(&tv, &a->v, bn)))
        return s;
    if (flex)
        return d.D <= 64 ? launch_for<64, LK_MASK_FLEX>(tq, tk, tv, a, &d, g, st)
                         : launch_for<128, LK_MASK_FLEX>(tq, tk, tv, a, &d, g, st);
    return d.D <= 64 ? launch_for<64, LK_MASK_ROWS>(tq, tk, tv, a, &d, g, st)
                     : launch_for<128, LK_MASK_ROWS>(tq, tk, tv, a, &d, g, st);
}

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) {
    return hopper_takes(a) ? run_forward(a, ctx, 0) : fa2->forward(a, ctx);
}

static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) {
    return hopper_backward(a) ? lk_attn_fa3_backward(a, ctx) : fa2->backward(a, ctx);
}

extern "C" const lk_attention_vtable lk_attention_fa3_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward, NULL, takes_views,
};

/* --- flex_attention on Hopper: the forward above and fa3_bwd.cu's backward under the
 * BlockMask; what they do not take (f32, D past 128 or not a multiple of 8, unaligned
 * tensors; in the backward softcap and `deterministic`) runs on flash_attention_2's flex
 * kernels (fa2.cu) ------------------------------------------------------------------- */
static const lk_attention_vtable *const fa2_flex = &lk_attention_fa2_flex_cuda_backend;

/* The flex row is the same on sm_80 (min_cc 80): only a Hopper runs this file's kernel. */
static int hopper_flex(const lk_attention_args *a) { return lk_hw_get()->cuda_cc >= 90 && hopper_takes(a); }

static int hopper_flex_backward(const lk_attention_args *a) { return hopper_flex(a) && lk_attn_fa3_bwd_takes(a); }

static size_t flex_workspace(const lk_attention_args *a, int backward) {
    if (backward) return hopper_flex_backward(a) ? lk_attn_fa3_bwd_workspace(a) : fa2_flex->workspace_bytes(a, 1);
    return hopper_flex(a) ? lk_attn_flex_alibi_bytes(a) : fa2_flex->workspace_bytes(a, 0);
}

static lk_status flex_forward(const lk_attention_args *a, lk_ctx *ctx) {
    return hopper_flex(a) ? run_forward(a, ctx, 1) : fa2_flex->forward(a, ctx);
}

static lk_status flex_backward(const lk_attention_args *a, lk_ctx *ctx) {
    return hopper_flex_backward(a) ? lk_attn_fa3_backward(a, ctx) : fa2_flex->backward(a, ctx);
}
static lk_status flex_supports(const lk_attention_args *a, int backward) { return fa2_flex->supports(a, backward); }
static int flex_takes_views(const lk_attention_args *a, int backward) {
    return backward ? hopper_flex_backward(a) : hopper_flex(a);
}

extern "C" const lk_attention_vtable lk_attention_fa3_flex_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, flex_workspace, flex_forward, flex_backward, flex_supports,
    flex_takes_views,
};
