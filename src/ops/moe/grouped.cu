/* grouped.cu — the MoE experts' grouped GEMM with device-side problem sizes (moe_cuda.h):
 * every expert's rows in one launch, the tile each CTA takes found on the device from
 * the offsets, so nothing is read back and the call can be captured in a CUDA graph.
 *
 *   mma    bf16 operands: mma.sync m16n8k16 (f32 accumulate), CTA tile TM × TN = 128 ×
 *          128, K steps of TK = 32, 8 warps as 2 (M) × 4 (N) of 64 × 32 each; operands
 *          staged by cp.async (16-byte chunks; element by element where a dimension or a
 *          pointer does not allow it) into a 3-stage ring of XOR-swizzled shared tiles,
 *          fragments by ldmatrix (.trans for an operand contiguous along M or N). Tiles
 *          keep the global layout (K-contiguous rows, or M/N-contiguous rows): the same
 *          loader serves all four operand orientations, and gathered rows (order[i] / k,
 *          the permutation) are just another row address.
 *   simt   f32 operands (and bf16 with LK_MOE_TC 0, the cross-check): 64 × 64 tiles, K
 *          steps of 16 through shared memory, 4 × 4 outputs a thread, f32 FMAs in K order.
 *
 * Schedules. ROWS (M = the expert-sorted rows): tile_scan lists each expert's row tiles
 * (tiles[e] = Σ_{e' < e} ceil(n_e' / TM)); grid.x is the bound rows / TM + E, and a CTA
 * past tiles[E] returns at once; the others find their expert by binary search over
 * tiles, so zero-row experts take no CTA. grid.y covers N. WGRAD (a weight gradient,
 * K = the expert's rows): grid (N tiles, M tiles, E); a CTA walks its expert's rows and
 * adds its tile into the gradient (read, add, round once), alone on it.
 * The SwiGLU between gate_up and down lives in the ROWS epilogue (SWIGLU): the B tile's
 * rows interleave gate and up in groups of 8 (virtual column v: group v / 16, gate for
 * v % 16 < 8, up otherwise), so each thread holds gate and up of the same (row, j) in
 * two adjacent n8 accumulators. The backward's activation lives in the dh' GEMM's
 * epilogue (DSWIGLU): each element of dh' meets the saved gate and up of its (row, j) and
 * leaves as d_gate, d_up and w·h; the row's Σ dh'·h is summed over the CTA's columns
 * (lanes by shuffles, the 4 column warps through shared memory, in a fixed order) into
 * one partial per (row, column tile), and dw_reduce adds the tiles in order — no atomics.
 *
 * On an sm_90 GPU the ROWS GEMMs go to grouped_sm90.cu's wgmma kernel (TMA, a persistent
 * walk of the same tile list) wherever it takes them, and the WGRAD ones to
 * grouped_wgrad_sm90.cu's; lk_moe_cuda_gg_sm80_only keeps them here (the tests run both).
 *
 * Measured on the H200 (bench/NOTES.md): 150-208 TFLOP/s, a quarter of the tensor cores
 * (the tile sizes are the plain first choice; no persistent scheduler, no split-K); on
 * sm_90 the wgmma kernels take its GEMMs. */
#include "core/cuda_check.h"
#include "llmkern/registry.h"
#include "ops/cuda_util.cuh"
#include "ops/mma_sm80.cuh"
#include "ops/moe/moe_cuda.h"

#ifndef LK_MOE_TC
#define LK_MOE_TC 1   /* 0: bf16 on the simt kernel too (a cross-check of the mma one) */
#endif
#ifndef LK_MOE_WGRAD_SM90
#define LK_MOE_WGRAD_SM90 1   /* 0: the weight gradients stay on mma.sync on sm_90 too */
#endif

#define NT 256   /* threads a CTA, both kernels */
#define TM 128
#define TN 128
#define TK 32
#define STAGES 3   /* the shared-memory ring: 3 × (8 + 8) KiB = 48 KiB, the static limit */
#define SM 64
#define SN 64
#define SK 16

enum { ROWS = LK_GG_ROWS, WGRAD = LK_GG_WGRAD };
enum { STORE = LK_GG_STORE, ACCUM = LK_GG_ACCUM, SWIGLU = LK_GG_SWIGLU, DSWIGLU = LK_GG_DSWIGLU };

typedef struct {
    const void *p;
    int64_t ld, es;
    const int32_t *order;
    int64_t kdiv;
} opnd;

typedef struct {
    opnd a, b;
    int64_t m, n, k, e;      /* n: virtual (SWIGLU: groups of 16 over ceil(I / 8)) */
    const int64_t *offs;
    const int32_t *tiles;
    void *c;
    int64_t ldc, ces;
    int c_bf16;
    lk_bf16_t *keep, *h;
    const lk_bf16_t *gsv;
    lk_bf16_t *dgu, *wh;
    float *dwp;
    const float *w;
    const int32_t *order;
    int64_t inter;
    const int *flag;
    int vec_a, vec_b;
} kargs;

/* --- schedule ---------------------------------------------------------------------- */

/* Row i of an operand for expert e: gathered (a token row) or direct. */
template <typename T>
static __device__ __forceinline__ const T *row_of(const opnd &o, int64_t e, int64_t i) {
    const T *b = (const T *)o.p;
    return o.order ? b + (int64_t)(o.order[i] / o.kdiv) * o.ld : b + e * o.es + i * o.ld;
}

/* This CTA's expert, rows [m0, mlim), columns from n0, K range [k0, klim); false: none. */
template <int MODE, int BM, int BN>
static __device__ __forceinline__ bool problem(const kargs &p, int64_t &e, int64_t &m0, int64_t &mlim, int64_t &n0,
                                               int64_t &k0, int64_t &klim) {
    if (MODE == ROWS) {
        const int32_t t = (int32_t)blockIdx.x;
        if (t >= p.tiles[p.e]) return false;
        int32_t lo = 0, hi = (int32_t)p.e - 1;   /* the last expert whose first tile is <= t */
        while (lo < hi) {
            int32_t mid = (lo + hi + 1) >> 1;
            if (p.tiles[mid] <= t) lo = mid;
            else hi = mid - 1;
        }
        e = lo;
        m0 = p.offs[e] + (int64_t)(t - p.tiles[e]) * BM;
        mlim = p.offs[e + 1];
        n0 = (int64_t)blockIdx.y * BN;
        k0 = 0;
        klim = p.k;
    } else {
        e = blockIdx.z;
        m0 = (int64_t)blockIdx.y * BM;
        mlim = p.m;
        n0 = (int64_t)blockIdx.x * BN;
        k0 = p.offs[e];
        klim = p.offs[e + 1];
    }
    return m0 < mlim && k0 < klim;
}

/* tiles[e] = Σ_{e' < e} ceil((offs[e'+1] - offs[e']) / bm), e in [0, E]. One block. */
__global__ void __launch_bounds__(1024) tile_scan(const int64_t *offs, int32_t E, int32_t bm, int32_t *tiles) {
    __shared__ int32_t sh[32];
    int32_t carry = 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int32_t e0 = 0; e0 < E; e0 += (int32_t)blockDim.x) {
        int32_t e = e0 + (int32_t)threadIdx.x;
        int32_t v = e < E ? (int32_t)((offs[e + 1] - offs[e] + bm - 1) / bm) : 0, x = v;
        for (int o = 1; o < 32; o <<= 1) {
            int32_t y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) sh[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int32_t s = lane < nw ? sh[lane] : 0;
            for (int o = 1; o < 32; o <<= 1) {
                int32_t y = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o) s += y;
            }
            if (lane < nw) sh[lane] = s;
        }
        __syncthreads();
        if (e < E) tiles[e] = carry + (warp ? sh[warp - 1] : 0) + x - v;
        carry += sh[nw - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) tiles[E] = carry;
}

/* --- epilogues (element-wise; both kernels) ----------------------------------------- */

template <int EPI>
static __device__ __forceinline__ void put(const kargs &p, int64_t e, int64_t row, int64_t col, float v) {
    if (EPI == STORE) {
        if (p.c_bf16)
            ((lk_bf16_t *)p.c)[row * p.ldc + col] = __float2bfloat16_rn(v);
        else
            ((float *)p.c)[row * p.ldc + col] = v;
    } else {
        int64_t i = e * p.ces + row * p.ldc + col;
        if (p.c_bf16) {
            lk_bf16_t *c = (lk_bf16_t *)p.c;
            c[i] = __float2bfloat16_rn(__bfloat162float(c[i]) + v);
        } else {
            ((float *)p.c)[i] += v;
        }
    }
}

/* --- tensor-core kernel (mma_sm80.cuh's copies, ldmatrix and mma) --------------------- */

/* Element offset of 16-byte chunk c of row r in a swizzled tile of CH chunks a row.
 * CH >= 8: chunk c ^ (r & 7) (an ldmatrix's 8 rows hit 8 bank groups); CH 4 (64-byte
 * rows, two to a 128-byte line): c ^ ((r >> 1) & 3), the line half (r & 1) doing the rest. */
template <int CH> static __device__ __forceinline__ int swz(int r, int c) {
    static_assert(CH == 4 || CH % 8 == 0, "swizzle for 4 or a multiple of 8 chunks a row");
    return CH == 4 ? r * 32 + ((c ^ ((r >> 1) & 3)) << 3) : r * CH * 8 + ((c ^ (r & 7)) << 3);
}
/* ldmatrix.x4 lane addresses for a 16 × 16 block at row r0, chunk c0 (fa2.cu's):
 *  at_a: r0-7 c0, r8-15 c0, r0-7 c1, r8-15 c1 — an A fragment, or B (2 n8 tiles) via .trans;
 *  at_b: r0-7 c0, r0-7 c1, r8-15 c0, r8-15 c1 — B (2 n8 tiles), or an A fragment via .trans. */
template <int CH> static __device__ __forceinline__ int at_a(int r0, int c0, int lane) {
    return swz<CH>(r0 + (lane & 15), c0 + (lane >> 4));
}
template <int CH> static __device__ __forceinline__ int at_b(int r0, int c0, int lane) {
    return swz<CH>(r0 + (lane & 7) + ((lane >> 4) << 3), c0 + ((lane >> 3) & 1));
}

/* A tile of OUT rows × IN columns (IN contiguous in global memory, as in the tile): rows
 * o0.. (< olim) of the operand, columns i0.. (< ilim); out of range reads as zero. imap
 * > 0: the SWIGLU B rows, virtual row v → gate row j = (v / 16)·8 + v % 8 or up row I + j
 * (v % 16 >= 8), valid while j < I = imap. */
template <int OUT, int IN>
static __device__ __forceinline__ void load_tile(lk_bf16_t *s, const opnd &o, int64_t e, int64_t o0, int64_t olim,
                                                 int64_t i0, int64_t ilim, int vec, int64_t imap) {
    constexpr int CH = IN / 8;
    static_assert((OUT * CH) % NT == 0, "chunks split evenly over the threads");
#pragma unroll
    for (int q0 = 0; q0 < OUT * CH; q0 += NT) {
        const int q = q0 + (int)threadIdx.x, r = q / CH, c = q % CH;
        int64_t go = o0 + r, gi = i0 + c * 8, phys = go;
        bool rok = go < olim;
        if (imap) {
            int64_t j = (go >> 4) * 8 + (go & 7);
            rok = rok && j < imap;
            phys = j + ((go & 8) ? imap : 0);
        }
        lk_bf16_t *d = s + swz<CH>(r, c);
        if (vec) {
            const bool ok = rok && gi < ilim;
            cp16(d, ok ? (const void *)(row_of<lk_bf16_t>(o, e, phys) + gi) : o.p, ok);
        } else {
            const lk_bf16_t *row = rok ? row_of<lk_bf16_t>(o, e, phys) : (const lk_bf16_t *)o.p;
#pragma unroll
            for (int j = 0; j < 8; j++) d[j] = rok && gi + j < ilim ? row[gi + j] : __float2bfloat16_rn(0.0f);
        }
    }
}

template <int MODE, int EPI, bool AK, bool BKM>
__global__ void __launch_bounds__(NT) gg_mma(kargs p) {
    __shared__ __align__(128) lk_bf16_t sA[STAGES][TM * TK], sB[STAGES][TN * TK];
    int64_t e, m0, mlim, n0, k0, klim;
    if (!problem<MODE, TM, TN>(p, e, m0, mlim, n0, k0, klim)) return;
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, wm = warp >> 2, wn = warp & 3;
    const int64_t imap = EPI == SWIGLU ? p.inter : 0;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    auto load = [&](int stage, int64_t kb) {
        if (AK) load_tile<TM, TK>(sA[stage], p.a, e, m0, mlim, kb, klim, p.vec_a, 0);
        else load_tile<TK, TM>(sA[stage], p.a, e, kb, klim, m0, mlim, p.vec_a, 0);
        if (BKM) load_tile<TN, TK>(sB[stage], p.b, e, n0, p.n, kb, klim, p.vec_b, imap);
        else load_tile<TK, TN>(sB[stage], p.b, e, kb, klim, n0, p.n, p.vec_b, 0);
        cp_commit();
    };

    /* The ring of STAGES K steps: the prologue issues steps 0 .. STAGES-2, one cp.async
     * group each (empty past the end, so the count stays fixed). Iteration it waits until
     * at most STAGES-2 groups are in flight (step it has landed), and its barrier both
     * publishes step it to every warp and proves every warp done with step it-1, whose
     * stage the load of step it + STAGES-1 then overwrites while step it computes. */
    const int64_t nk = (klim - k0 + TK - 1) / TK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, k0 + (int64_t)s * TK);
        else cp_commit();
    }
    for (int64_t it = 0; it < nk; it++) {
        cp_wait<STAGES - 2>();
        __syncthreads();
        const int64_t nx = it + STAGES - 1;
        if (nx < nk) load((int)(nx % STAGES), k0 + nx * TK);
        else cp_commit();
        const lk_bf16_t *a = sA[it % STAGES], *b = sB[it % STAGES];
#pragma unroll
        for (int kk = 0; kk < TK / 16; kk++) {
            uint32_t af[4][4], bf[2][4];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const int ml = wm * 64 + mt * 16;
                if (AK) ldsm4(af[mt], a + at_a<TK / 8>(ml, kk * 2, lane));
                else ldsm4t(af[mt], a + at_b<TM / 8>(kk * 16, ml / 8, lane));
            }
#pragma unroll
            for (int np = 0; np < 2; np++) {
                const int nl = wn * 32 + np * 16;
                if (BKM) ldsm4(bf[np], b + at_b<TK / 8>(nl, kk * 2, lane));
                else ldsm4t(bf[np], b + at_a<TN / 8>(kk * 16, nl / 8, lane));
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) mma(acc[mt][nt], af[mt], bf[nt >> 1][(nt & 1) * 2], bf[nt >> 1][(nt & 1) * 2 + 1]);
        }
    }

    /* accumulator (mt, nt, q): row g (+8 for q >= 2), column 2·t4 + (q & 1) of the n8 tile */
    const int g = lane >> 2, t4 = lane & 3;
    const bool bad = (EPI == SWIGLU || EPI == DSWIGLU) && *p.flag != 0;
    if constexpr (EPI == DSWIGLU) {
        /* the ring, drained (no group in flight, every warp past its last ldmatrix), holds
         * the row partials */
        cp_wait<0>();
        __syncthreads();
        float *red = reinterpret_cast<float *>(&sA[0][0]);   /* [TM][4 column warps] */
        const int64_t I = p.inter;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int lr = wm * 64 + mt * 16 + g + hf * 8;
                const int64_t row = m0 + lr;
                float dot = 0.0f;
                if (row < mlim) {
                    const float wr = p.w[p.order[row]];
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            const int64_t j = n0 + wn * 32 + nt * 8 + 2 * t4 + q;
                            if (j >= I) continue;
                            const float dhp = acc[mt][nt][hf * 2 + q];
                            const float gt = __bfloat162float(p.gsv[row * 2 * I + j]);
                            const float up = __bfloat162float(p.gsv[row * 2 * I + I + j]);
                            const float s = 1.0f / (1.0f + expf(-gt)), silu = gt * s, hv = silu * up, dh = wr * dhp;
                            float dg = dh * up * s * (1.0f + gt * (1.0f - s)), du = dh * silu, whv = wr * hv;
                            if (bad) dg = du = whv = __int_as_float(0x7fffffff);
                            p.dgu[row * 2 * I + j] = __float2bfloat16_rn(dg);
                            p.dgu[row * 2 * I + I + j] = __float2bfloat16_rn(du);
                            p.wh[row * I + j] = __float2bfloat16_rn(whv);
                            dot += dhp * hv;
                        }
                }
                dot += __shfl_xor_sync(0xffffffffu, dot, 1);   /* the 4 lanes of a row, every lane taking part */
                dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                if (t4 == 0) red[lr * 4 + wn] = dot;
            }
        __syncthreads();
        if (p.dwp && threadIdx.x < TM) {
            const int64_t row = m0 + threadIdx.x;
            const float *r4 = red + threadIdx.x * 4;
            if (row < mlim)
                p.dwp[row * gridDim.y + blockIdx.y] = bad ? __int_as_float(0x7fffffff) : ((r4[0] + r4[1]) + r4[2]) + r4[3];
        }
    } else {
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int64_t row = m0 + wm * 64 + mt * 16 + g + hf * 8;
                if (row >= mlim) continue;
                if (EPI == SWIGLU) {
                    const int64_t I = p.inter;
                    const float wr = p.w[p.order[row]];
#pragma unroll
                    for (int np = 0; np < 2; np++) {
                        const int64_t v = n0 + wn * 32 + np * 16 + 2 * t4, j = (v >> 4) * 8 + (v & 7);
#pragma unroll
                        for (int q = 0; q < 2; q++) {
                            if (j + q >= I) continue;
                            const float gt = acc[mt][2 * np][hf * 2 + q], up = acc[mt][2 * np + 1][hf * 2 + q];
                            p.keep[row * 2 * I + j + q] = __float2bfloat16_rn(gt);
                            p.keep[row * 2 * I + I + j + q] = __float2bfloat16_rn(up);
                            p.h[row * I + j + q] = __float2bfloat16_rn(bad ? __int_as_float(0x7fffffff)
                                                                           : wr * (gt / (1.0f + expf(-gt))) * up);
                        }
                    }
                } else {
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const int64_t col = n0 + wn * 32 + nt * 8 + 2 * t4;
#pragma unroll
                        for (int q = 0; q < 2; q++)
                            if (col + q < p.n) put<EPI>(p, e, row, col + q, acc[mt][nt][hf * 2 + q]);
                    }
                }
            }
    }
}

/* --- CUDA-core kernel ------------------------------------------------------------------ */

template <typename T, int MODE, int EPI, bool AK, bool BKM>
__global__ void __launch_bounds__(NT) gg_simt(kargs p) {
    __shared__ float sA[SK][SM + 4], sB[SK][SN + 4];
    int64_t e, m0, mlim, n0, k0, klim;
    if (!problem<MODE, SM, SN>(p, e, m0, mlim, n0, k0, klim)) return;
    const int tx = (int)threadIdx.x & 15, ty = (int)threadIdx.x >> 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t kb = k0; kb < klim; kb += SK) {
        for (int q = (int)threadIdx.x; q < SM * SK; q += NT) {
            const int mi = AK ? q / SK : q % SM, ki = AK ? q % SK : q / SM;
            const int64_t gm = m0 + mi, gk = kb + ki;
            float v = 0.0f;
            if (gm < mlim && gk < klim) v = AK ? lk_to_f32(row_of<T>(p.a, e, gm)[gk]) : lk_to_f32(row_of<T>(p.a, e, gk)[gm]);
            sA[ki][mi] = v;
        }
        for (int q = (int)threadIdx.x; q < SN * SK; q += NT) {
            const int ni = BKM ? q / SK : q % SN, ki = BKM ? q % SK : q / SN;
            const int64_t gn = n0 + ni, gk = kb + ki;
            float v = 0.0f;
            if (gn < p.n && gk < klim) v = BKM ? lk_to_f32(row_of<T>(p.b, e, gn)[gk]) : lk_to_f32(row_of<T>(p.b, e, gk)[gn]);
            sB[ki][ni] = v;
        }
        __syncthreads();
#pragma unroll
        for (int ki = 0; ki < SK; ki++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = sA[ki][ty + 16 * i], b[i] = sB[ki][tx + 16 * i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t row = m0 + ty + 16 * i;
        if (row >= mlim) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t col = n0 + tx + 16 * j;
            if (col < p.n) put<EPI>(p, e, row, col, acc[i][j]);
        }
    }
}

/* dw[order[p]] = Σ_t part[p, t], t in order. */
__global__ void dw_reduce(const float *part, int64_t tiles, const int32_t *order, int64_t rows, float *dw) {
    int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (p >= rows) return;
    float s = 0.0f;
    for (int64_t t = 0; t < tiles; t++) s += part[p * tiles + t];
    dw[order[p]] = s;
}

/* --- host ---------------------------------------------------------------------------- */

extern "C" int64_t lk_moe_cuda_dw_tiles(int64_t inter) { return lk_cdiv(inter, TN); }

extern "C" lk_status lk_moe_cuda_dw_reduce(const float *dw_part, int64_t tiles, const int32_t *order, int64_t rows,
                                           float *dw, void *stream) {
    if (rows < 1) return LK_OK;
    dw_reduce<<<(unsigned)((rows + 255) / 256), 256, 0, (cudaStream_t)stream>>>(dw_part, tiles, order, rows, dw);
    LK_CUDA_LAUNCHED("moe_experts: grouped gemm: dw_reduce");
    return LK_OK;
}

static int simt_only;   /* lk_moe_cuda_gg_simt_only: the tests' cross-check */
static int sm80_only;   /* lk_moe_cuda_gg_sm80_only: mma.sync on Hopper too */

extern "C" void lk_moe_cuda_gg_simt_only(int on) { simt_only = on != 0; }
extern "C" void lk_moe_cuda_gg_sm80_only(int on) { sm80_only = on != 0; }

static int use_tc(lk_dtype dt) { return dt == LK_BF16 && LK_MOE_TC && !simt_only; }

extern "C" int lk_moe_cuda_gg_fuses_swiglu(lk_dtype dt) { return use_tc(dt); }

static opnd opnd_of(const lk_gg_operand *o) { return opnd{o->src, o->ld, o->e_stride, o->order, o->kdiv}; }

/* cp.async of whole 16-byte chunks: aligned base, row and expert strides in whole chunks,
 * and the contiguous dimension's bound a multiple of 8 (a chunk is all in or all out). */
static int vec_ok(const lk_gg_operand *o, int64_t inner) {
    return lk_aligned16(o->src) && o->ld % 8 == 0 && o->e_stride % 8 == 0 && inner % 8 == 0;
}

#define LAUNCH_TC(MODE, EPI, AK, BK) gg_mma<MODE, EPI, AK, BK><<<grid, NT, 0, st>>>(p)
#define LAUNCH_SIMT(T, MODE, EPI, AK, BK) gg_simt<T, MODE, EPI, AK, BK><<<grid, NT, 0, st>>>(p)

extern "C" lk_status lk_moe_cuda_wgrad_zero(const lk_gg *g, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const size_t es = lk_dtype_size(g->c_dt), pitch = (size_t)g->ldc * es, width = (size_t)g->n * es;
    if (g->c_e_stride == g->m * g->ldc)   /* the slices back to back: one region of E·m rows */
        LK_CUDA_TRY(cudaMemset2DAsync(g->c, pitch, 0, width, (size_t)(g->experts * g->m), st));
    else
        for (int64_t e = 0; e < g->experts; e++)
            LK_CUDA_TRY(cudaMemset2DAsync((char *)g->c + (size_t)(e * g->c_e_stride) * es, pitch, 0, width,
                                          (size_t)g->m, st));
    return LK_OK;
}

extern "C" lk_status lk_moe_cuda_grouped_gemm(const lk_gg *g, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int tc = use_tc(g->dt), rows = g->mode == LK_GG_ROWS;
    const int ak = g->a.kmajor, bk = g->b.kmajor;
    /* the combinations fused.cu uses, each instantiated below */
    const int known = rows ? ak && (g->epi == LK_GG_STORE || (g->epi == LK_GG_SWIGLU && bk && tc) ||
                                    (g->epi == LK_GG_DSWIGLU && !bk && tc))
                           : !ak && !bk && (g->epi == LK_GG_ACCUM || g->epi == LK_GG_STORE);
    if (!known || (g->dt != LK_F32 && g->dt != LK_BF16) || g->experts < 1 || g->experts > INT32_MAX)
        return lk_error(LK_EINTERNAL, "moe_experts: grouped gemm: mode %d epilogue %d kmajor %d/%d dtype %s E %lld: "
                        "not a combination this build has", (int)g->mode, (int)g->epi, ak, bk, lk_dtype_name(g->dt),
                        (long long)g->experts);
    const int bm = tc ? TM : SM, bn = tc ? TN : SN;
    kargs p;
    p.a = opnd_of(&g->a), p.b = opnd_of(&g->b);
    p.m = g->m, p.k = g->k, p.e = g->experts;
    p.n = g->epi == LK_GG_SWIGLU ? lk_cdiv(g->inter, 8) * 16 : g->n;
    p.offs = g->offs, p.tiles = g->tiles;
    p.c = g->c, p.ldc = g->ldc, p.ces = g->c_e_stride, p.c_bf16 = g->c_dt == LK_BF16;
    p.keep = (lk_bf16_t *)g->keep, p.h = (lk_bf16_t *)g->h, p.w = g->w, p.order = g->order, p.inter = g->inter;
    p.gsv = (const lk_bf16_t *)g->gu_saved, p.dgu = (lk_bf16_t *)g->dgu, p.wh = (lk_bf16_t *)g->wh;
    p.dwp = g->dw_part;
    p.flag = g->flag;
    /* each operand's contiguous dimension: K when kmajor, else M (A) / N (B) */
    p.vec_a = vec_ok(&g->a, ak ? g->k : g->m);
    p.vec_b = vec_ok(&g->b, bk ? g->k : g->n);
    if (rows && g->a.order == NULL && g->a.e_stride != 0)
        return lk_error(LK_EINTERNAL, "moe_experts: grouped gemm: ROWS A must be the sorted rows (no expert stride)");
    dim3 grid;
    if (rows) {
        const int64_t bound = g->rows / bm + g->experts, ny = lk_cdiv(p.n, bn);
        if (bound > INT32_MAX || ny > 65535)
            return lk_error(LK_EDEVICE, "moe_experts: grouped gemm: grid %lld x %lld over the device's limits",
                            (long long)bound, (long long)ny);
        tile_scan<<<1, 1024, 0, st>>>(g->offs, (int32_t)g->experts, bm, g->tiles);
        LK_CUDA_LAUNCHED("moe_experts: grouped gemm: tile_scan");
        /* on Hopper the wgmma kernel (grouped_sm90.cu), on the same 128-row tile list */
        if (tc && (g->hopper || !sm80_only) && lk_hw_get()->cuda_cc == 90 && lk_moe_cuda_gg_sm90_takes(g))
            return lk_moe_cuda_gg_sm90(g, st);
        grid = dim3((unsigned)bound, (unsigned)ny, 1);
    } else {
        const int64_t nx = lk_cdiv(g->n, bn), ny = lk_cdiv(g->m, bm);
        if (nx > INT32_MAX || ny > 65535 || g->experts > 65535)
            return lk_error(LK_EDEVICE, "moe_experts: grouped gemm: grid %lld x %lld x %lld over the device's limits",
                            (long long)nx, (long long)ny, (long long)g->experts);
        /* on Hopper the wgmma weight-gradient kernel (grouped_wgrad_sm90.cu) */
        if (LK_MOE_WGRAD_SM90 && tc && (g->hopper || !sm80_only) && lk_hw_get()->cuda_cc == 90 &&
            lk_moe_cuda_gg_sm90_wgrad_takes(g))
            return lk_moe_cuda_gg_sm90_wgrad(g, st);
        if (g->epi == LK_GG_STORE) {   /* written: zeros first, then accumulated onto them */
            lk_status s = lk_moe_cuda_wgrad_zero(g, st);
            if (s) return s;
        }
        grid = dim3((unsigned)nx, (unsigned)ny, (unsigned)g->experts);
    }
    if (tc) {
        if (!rows) LAUNCH_TC(WGRAD, ACCUM, false, false);
        else if (g->epi == LK_GG_SWIGLU) LAUNCH_TC(ROWS, SWIGLU, true, true);
        else if (g->epi == LK_GG_DSWIGLU) LAUNCH_TC(ROWS, DSWIGLU, true, false);
        else if (bk) LAUNCH_TC(ROWS, STORE, true, true);
        else LAUNCH_TC(ROWS, STORE, true, false);
    } else if (g->dt == LK_F32) {
        if (!rows) LAUNCH_SIMT(float, WGRAD, ACCUM, false, false);
        else if (bk) LAUNCH_SIMT(float, ROWS, STORE, true, true);
        else LAUNCH_SIMT(float, ROWS, STORE, true, false);
    } else {
        if (!rows) LAUNCH_SIMT(lk_bf16_t, WGRAD, ACCUM, false, false);
        else if (bk) LAUNCH_SIMT(lk_bf16_t, ROWS, STORE, true, true);
        else LAUNCH_SIMT(lk_bf16_t, ROWS, STORE, true, false);
    }
    LK_CUDA_LAUNCHED("moe_experts: grouped gemm");
    return LK_OK;
}
