/* grouped_wgrad_sm90.cu — the MoE experts' weight gradients on Hopper (sm_90a): grouped.cu's
 * WGRAD GEMMs, C_e [M, N] += A_eᵀ · B_e with K = expert e's rows [offs[e], offs[e+1]) and
 * A [rows, M], B [rows, N] row-major (d_down_e += dout_eᵀ·(w·h)_e, d_gate_up_e +=
 * d_gate_up_eᵀ·x_e), on wgmma. grouped.cu's launcher sends a WGRAD GEMM here on an sm_90
 * GPU when lk_moe_cuda_gg_sm90_wgrad_takes says its operands fit (moe_cuda.h), unless
 * lk_moe_cuda_gg_sm80_only keeps it on mma.sync (the tests run both).
 *
 *   tile       128 (M) × 256 (N) of an expert's gradient a work item, K steps of 64 rows;
 *              a ring of STAGES = 4 stages of A (64 rows × 128 M: two 64-column blocks of
 *              64 × 128 bytes, 16 KiB) + B (64 rows × 256 N: four blocks, 32 KiB), each
 *              block 128-byte swizzled (chunk c of row r at c ^ (r & 7)), the layout TMA
 *              writes. Both operands are M / N contiguous: MN-major for wgmma (both
 *              transpose bits, grouped_sm90.cu's N-major B descriptor for A too).
 *   producer   warpgroup 0 (setmaxnreg 56). An operand that is not gathered (h·w, d_gate_up:
 *              the sorted rows themselves) by TMA, one thread issuing the boxes against the
 *              stage's `full` mbarrier's byte count, on every K step whose 64 rows all
 *              belong to the expert; a gathered one (dout[order / k], x[order / k]), and
 *              both on an expert's last, partial step (TMA would read the next expert's
 *              rows: they must read as zeros), by cp.async from the 128 threads, 16 bytes
 *              a copy, zero-filled past the expert's rows and past M / N, each thread's
 *              cp.async.mbarrier.arrive.noinc arriving on `full` when its copies land
 *              (128 arrivals + thread 0's, every step). The gathered rows' sources: 64
 *              threads read order[] a step ahead (across items too) and store each row's
 *              offset in 16-byte chunks into shared memory, handed over by a named barrier
 *              of the 4 producer warps; cp_gathered reads them four at a time, a warp
 *              instruction whole row segments.
 *   consumers  warpgroups 1 and 2 (setmaxnreg 224), 64 M rows each: per stage four
 *              wgmma.m64n256k16 (f32, 128 accumulators a thread), one group kept in flight,
 *              the stage before it released on `empty` (256 arrivals). Epilogue: C += acc,
 *              read, add, rounded once into C's dtype (f32 or bf16), as grouped.cu's put
 *              (auto: by TMA reductions, below); the tile's lines of C prefetched into
 *              L2 when its K loop starts.
 *   schedule   persistent, items ranked longest first: every CTA ranks the experts by
 *              their rows (most first, ties by index; up to EMAX experts, in shared
 *              memory; more keep their order), item rank u = (expert of rank u / per,
 *              M tile, N tile), N fastest, per = (M / 128) · (N / 256). CTA b takes ranks
 *              j·G + b on even rounds j and j·G + G - 1 - b on odd ones (G the grid): a
 *              snake, so each round's items are alike and the CTAs that took a round's
 *              largest take the next one's smallest. A training step's router is far from
 *              balanced, and the former walk t = b, b + G, ... in expert order left the
 *              CTAs that drew the large experts running after the rest (e2e_peers' MoE
 *              step: 18.9 -> 12.8 ms of these kernels, 160.7 -> 154.3 ms a step; H200,
 *              bench/NOTES.md nineteenth session). Experts without rows rank last and
 *              end the walk (their slices left as they were, as grouped.cu does; a
 *              written C's consumers walk them too, and store their zeros). Each
 *              output element is one thread's, summed over the expert's rows in order,
 *              whichever CTA holds it: deterministic, no atomics. (The ping-pong variant
 *              below keeps the walk in expert order.)
 *
 * Variants (LLMKERN_GG_SM90, as grouped_sm90.cu's; the tests run each): coop,
 * gg_sm90_wgrad<AG, BG, false> above (242 TFLOP/s); pingpong, gg_sm90_wgrad_pp below: 128 × 128
 * items, one a consumer warpgroup, C's read-add-write under the other's K loop (178);
 * pingpong_v4, the same with the read-add-write on 16-byte accesses (V4, 209); auto (the
 * default), gg_sm90_wgrad<AG, BG, true> where C is f32, or a stored bf16 C, and TMA can address
 * it (tma_c_ok; else coop): the epilogue writes the accumulators into two 8 KiB staging buffers a consumer
 * warpgroup (64 rows × 32 columns, 128-byte swizzled; the ring's 4 stages stay, 232,000 bytes of
 * shared memory) and TMA adds them into C in L2 (cp.reduce.async.bulk.tensor .add, 8 slices a
 * warpgroup, slice j staged while slice j - 1 is read out), so the SM is back in the next item's
 * K loop after writing 128 KiB to shared memory instead of reading and writing 256 KiB of HBM;
 * the same sums, each element added once. A written
 * gradient (STORE, moe.h's write_weight_grads) takes TMA stores instead: C is neither zeroed
 * beforehand nor read; a bf16 one (train.main_grads_dtype) in slices of 64 columns, each
 * accumulator pair rounded once. Measured (twelfth session, call 1, same run): 253.5
 * against coop's 234.8 TFLOP/s (4.88 against 5.27 ms) — 8%, where the prediction was 2.3 ms:
 * the read-add-write was not what held the kernel (bench/NOTES.md, "Issue 18: the weight
 * gradients' TMA reduce epilogue").
 *
 * Count (PEERS-H200.md's shape, R 131072, H 2048, I 768, E 128): d_down 2·R·H·I = 412 GFLOP,
 * d_gate_up 2·R·2I·H = 825 GFLOP, 1.24 TFLOP: 1.6 ms at 790 TFLOP/s; the f32 gradients read
 * and written once (E·3·H·I·4 B = 2.4 GB each way, ~1 ms of HBM) overlap only with other
 * items' K loops. mma.sync (gg_mma WGRAD): 10.7 ms, 115.6 TFLOP/s; this kernel (H200, every
 * cuda_test_moe_experts case passing): 5.1 ms, 242 TFLOP/s in the ninth session; 3.15 ms, 392
 * TFLOP/s in the twelfth (the TMA epilogue, order[] a step ahead, cp_gathered: the producer
 * had been the bottleneck, bench/NOTES.md). */
#include <stdio.h>
#include <string.h>
#include "core/cuda_check.h"
#include "llmkern/registry.h"
#include "ops/attention/hopper.cuh"
#include "ops/cuda_util.cuh"
#include "ops/moe/moe_cuda.h"

#define BM 128          /* gradient rows (A's columns) a tile */
#define BN 256          /* gradient columns (B's columns) a tile */
#define BK 64           /* expert rows a stage */
#define STAGES 4        /* 4 × 48 KiB */
#define THREADS 384     /* producer + two consumer warpgroups */
#define BLK (BK * 128)  /* one 64-column block of a stage: 64 rows × 128 bytes */
#define A_BYTES (BM / 64 * BLK)
#define B_BYTES (BN / 64 * BLK)
#ifndef EB
#define EB 16           /* column pairs of C loaded before the epilogue's stores */
#endif
#define EMAX 256        /* experts ranked by their rows (the schedule); more keep their order */
#define SMEM_BYTES (STAGES * (A_BYTES + B_BYTES) + 2 * STAGES * 8 + STAGES * BK * 4 + EMAX * 2 + 1024)
#define SLICE_BYTES (64 * 32 * 4)   /* TMA epilogue: one slice, 64 rows × 32 f32 columns (128 bytes a row) */
#define STG_BYTES (4 * SLICE_BYTES) /* two slices a consumer warpgroup */
#define TSMEM_BYTES (SMEM_BYTES + STG_BYTES)   /* 232,000 of the 232,448 a block may have */

typedef struct {
    const lk_bf16_t *p;       /* rows of ld elements: row i at p + i·ld, or gathered p + (order[i] / kdiv)·ld */
    int64_t ld, kdiv;
    const int32_t *order;
} wopnd;

typedef struct {
    wopnd a, b;
    int64_t m, n, e;
    int mt, nt;               /* tiles of M and N */
    const int64_t *offs;
    void *c;                  /* [E, M, N]: element (e, i, j) at c + e·ces + i·ldc + j */
    int64_t ldc, ces;
    int c_bf16;
    int store;                /* the TMA epilogue writes C (every expert's slice) instead of adding */
} wargs;

#if FA3_ARCH

static __device__ __forceinline__ void cp_arrive_noinc_w(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* The TMA epilogue's store: tma_reduce_add's box (hopper.cuh) written, not added. */
static __device__ __forceinline__ void tma_store(const CUtensorMap *map, const void *src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
                 ::"l"((uint64_t)map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
static __device__ __forceinline__ void st_shared_b32(void *p, uint32_t a) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(smem_u32(p)), "r"(a) : "memory");
}

static __device__ __forceinline__ void st_shared_v2(void *p, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(smem_u32(p)), "f"(a), "f"(b) : "memory");
}

/* d[m64 x n256] (+)= A · B (acc 0: =), both MN-major in shared memory (A stored as rows
 * of K with M contiguous, B as rows of K with N contiguous): wgmma_ss_n256 with both
 * transpose bits. */
static __device__ __forceinline__ void wgmma_ss_n256_tt(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(acc));
}

/* d[m64 x n128] (+)= A · B (acc 0: =), both MN-major in shared memory: the ping-pong item's
 * instruction (wgmma_ss_n256_tt at half the width). */
static __device__ __forceinline__ void wgmma_ss_n128_tt(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}

/* Item t: expert e, its rows [k0, klim), gradient rows from m0, columns from n0. */
static __device__ __forceinline__ void item_of(const wargs &p, int64_t t, int64_t &e, int64_t &k0, int64_t &klim,
                                               int64_t &m0, int64_t &n0, int tn = BN) {
    const int64_t per = (int64_t)p.mt * p.nt, r = t % per;
    e = t / per;
    m0 = (r / p.nt) * BM;
    n0 = (r % p.nt) * tn;
    k0 = p.offs[e];
    klim = p.offs[e + 1];
}

#if FA3_ARCH
/* The cooperative kernel's walk (the header's schedule): round j of CTA b takes item rank
 * j·G + b (even j) or j·G + G - 1 - b (odd j); rank u is expert ex[u / per]'s, or expert
 * u / per's when the experts were too many to rank. Ranks grow with j, so rank u's round is
 * u / G. Producer and consumers take their items from first() and after() alike: they
 * must walk the same items. */
struct walk {
    const uint16_t *ex;
    const int64_t *offs;
    int ranked, per, items;   /* ranked: experts in ex (0: none) */
    int all;                  /* the items of experts without rows too (a written C's zeros) */
    __device__ __forceinline__ int rank(int j) const {
        const int g = (int)gridDim.x, b = (int)blockIdx.x;
        return j * g + ((j & 1) ? g - 1 - b : b);
    }
    __device__ __forceinline__ int expert(int u) const {
        const int i = u / per;
        return i < ranked ? (int)ex[i] : i;
    }
    /* the rank of the CTA's first item with rows (all: any item) from round j on (items:
     * none); experts without rows rank last, so the first such ranked one ends the walk */
    __device__ __forceinline__ int from(int j) const {
        for (;; j++) {
            const int u = rank(j);
            if (u >= items) return items;
            const int e = expert(u);
            if (all || offs[e] < offs[e + 1]) return u;
            if (ranked) return items;
        }
    }
    __device__ __forceinline__ int first() const { return from(0); }
    __device__ __forceinline__ int after(int u) const { return from(u / (int)gridDim.x + 1); }
};

/* Every thread of the CTA: the experts ranked by their rows into ex (most first, ties by
 * index), the counts staged in cnt (EMAX words); nothing when there are more than EMAX. */
static __device__ __forceinline__ int rank_experts(const int64_t *offs, int64_t experts, int32_t *cnt, uint16_t *ex,
                                                   int tid) {
    const int n = experts <= EMAX ? (int)experts : 0;
    for (int e = tid; e < n; e += THREADS) cnt[e] = (int32_t)(offs[e + 1] - offs[e]);
    __syncthreads();
    for (int e = tid; e < n; e += THREADS) {
        const int32_t c = cnt[e];
        int r = 0;
        for (int f = 0; f < n; f++) r += cnt[f] > c || (cnt[f] == c && f < e);
        ex[r] = (uint16_t)e;
    }
    return n;
}
#endif

/* Rows kr .. kr + 63 (< klim) of operand o, columns c0 .. c0 + 8·CH (< ncols), into a stage
 * of CH / 8 blocks of 64 columns; zeros elsewhere. tk: the gathered operand's source rows of
 * the step (shared memory, -1 past the expert), else the rows are kr + r themselves. The
 * producer's 128 threads: thread tid copies chunk tid % CH of rows tid / CH + (128 / CH)·i
 * (a warp: whole row segments). */
template <int CH>
static __device__ __forceinline__ void cp_rows(uint8_t *dst, const wopnd &o, const int32_t *tk, int64_t kr,
                                               int64_t klim, int64_t c0, int64_t ncols, int tid) {
    constexpr int RP = 128 / CH;
    const int c = tid % CH, rs = tid / CH, blk = c / 8, cc = c % 8;
    const int64_t col = c0 + c * 8;
    const bool cok = col < ncols;
    uint8_t *d = dst + blk * BLK;
#pragma unroll 4   /* 8 with the order loads inline spilled past the producer's 56 registers */
    for (int i = 0; i < BK / RP; i++) {
        const int r = rs + RP * i;
        const int32_t row = tk ? tk[r] : (kr + r < klim ? (int32_t)(kr + r) : -1);
        const bool ok = cok && row >= 0;
        cp16(d + r * 128 + ((cc ^ (r & 7)) << 4), ok ? (const void *)(o.p + (int64_t)row * o.ld + col) : (const void *)o.p,
             ok);
    }
}

/* The cooperative kernel's gathered operand, a step's 64 rows: row r's source starts tk[r]
 * 16-byte chunks past p (~0u: past the expert, zeros), columns c0 .. c0 + 8·CH (< ncols),
 * into the stage at shared address dst (CH / 8 blocks of 64 columns, swizzled as TMA
 * writes). Warp w copies rows 16w .. 16w + 15, 32 / CH rows a warp instruction (a row's
 * chunks contiguous on both sides), their offsets read four at a time (ld.shared.v4, the
 * same words for every lane). cp_rows spent its time on the address of each copy (a
 * generic load of the row, the operand's stride reloaded from the constant bank, a 64-bit
 * multiply: ncu's per-instruction samples, twelfth session) while the consumers waited. */
template <int CH>
static __device__ __forceinline__ void cp_gathered(uint32_t dst, const lk_bf16_t *p, uint32_t tk, int64_t c0,
                                                   int64_t ncols, int tid) {
    constexpr int RPW = 32 / CH;
    const int lane = tid % 32, w = tid / 32, c = lane % CH, h = lane / CH;
    const bool cok = c0 + c * 8 < ncols;
    const lk_bf16_t *pc = p + c0 + c * 8;
#pragma unroll
    for (int j = 0; j < 4; j++) {   /* rows 16w + 4j .. 16w + 4j + 3 */
        uint32_t off[4];
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(off[0]), "=r"(off[1]), "=r"(off[2]), "=r"(off[3])
                     : "r"(tk + (16 * w + 4 * j) * 4));
#pragma unroll
        for (int i = 0; i < 4 / RPW; i++) {
            const uint32_t o = RPW == 1 ? off[i] : (h ? off[RPW * i + 1] : off[RPW * i]);
            const int r = 16 * w + 4 * j + RPW * i + h;
            const bool ok = cok && o != ~0u;
            const uint32_t d = dst + (c / 8) * BLK + r * 128 + (((c % 8) ^ (r & 7)) << 4);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d),
                         "l"(ok ? pc + (uint64_t)o * 8 : p), "r"(ok ? 16 : 0));
        }
    }
}

/* Thread 0's part of a step's loads, for both kernels: the operands that are not gathered
 * (NA and NB blocks of 64 columns) by TMA against the stage's `full` when the step's 64 rows
 * are all the expert's (whole); else, with nothing for TMA, a plain arrival. */
template <bool AG, bool BG, int NA, int NB>
static __device__ __forceinline__ void tma_step(uint8_t *a, uint8_t *b, const CUtensorMap *ta, const CUtensorMap *tb,
                                                uint64_t *full, bool whole, int64_t m0, int64_t n0, int64_t kr) {
    const uint32_t bytes = whole ? (uint32_t)((AG ? 0 : NA) + (BG ? 0 : NB)) * BLK : 0u;
    if (bytes) {
        mbar_expect_tx(full, bytes);
        if (!AG)
#pragma unroll
            for (int j = 0; j < NA; j++) tma_load(a + j * BLK, ta, full, (int)m0 + 64 * j, (int)kr, 0);
        if (!BG)
#pragma unroll
            for (int j = 0; j < NB; j++) tma_load(b + j * BLK, tb, full, (int)n0 + 64 * j, (int)kr, 0);
    } else {
        mbar_arrive(full);
    }
}

#endif

/* AG / BG: A / B gathered (cp.async always); otherwise TMA on the full K steps. Accumulator
 * register q of the m64n256 fragment (consumer warpgroup cg, warp w, lane): gradient row
 * cg·64 + w·16 + lane / 4 + 8·((q >> 1) & 1) of the tile, column 8·(q / 4) + 2·(lane % 4) +
 * (q & 1). */
template <bool AG, bool BG, bool TMA>
__global__ void __launch_bounds__(THREADS, 1) gg_sm90_wgrad(const __grid_constant__ CUtensorMap ta,
                                                            const __grid_constant__ CUtensorMap tb,
                                                            const __grid_constant__ CUtensorMap tc, wargs p) {
#if FA3_ARCH
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sa = sm, *sb = sa + STAGES * A_BYTES;
    uint8_t *stg = sb + STAGES * B_BYTES;   /* TMA: the epilogue's staging, 2 × 2 slices (1024-aligned) */
    uint64_t *full = (uint64_t *)(stg + (TMA ? STG_BYTES : 0)), *empty = full + STAGES;
    /* [STAGES][BK]: the gathered operand's source rows of a step, in 16-byte chunks from its base
     * (the experts' counts while they are ranked, before the first step) */
    const uint32_t toks = smem_u32(empty + STAGES);
    uint16_t *ex = (uint16_t *)(empty + STAGES + STAGES * BK / 2);   /* [EMAX]: the experts, most rows first */
    static_assert(STAGES * BK >= EMAX, "the experts' counts are staged where the steps' rows go");
    const int tid = threadIdx.x, wg = tid / 128;
    const int items = (int)(p.e * p.mt * p.nt);   /* lk_moe_cuda_gg_sm90_wgrad_takes bounds it */
    const walk W{ex, p.offs, rank_experts(p.offs, p.e, (int32_t *)(empty + STAGES), ex, tid), p.mt * p.nt, items, 0};

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 129), mbar_init(&empty[s], 256);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   /* --- producer ------------------------------------------------------ */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        /* The CTA's non-empty items in turn. The gathered operand's source rows (order[],
         * a dependent global load) are read a step ahead, across items too, so the load's
         * latency lies under the previous step's copies and the wait on `empty`: read
         * where they were used, they held each step for a round trip to L2 (ncu, twelfth
         * session: 58% of the warps' cycles waiting on L1TEX, 2.3 us a step where the
         * MMAs take 0.7). */
        /* 32-bit item and row arithmetic (lk_moe_cuda_gg_sm90_wgrad_takes bounds both): the
         * 56 registers spilled with 64-bit divisions */
        const wopnd &g = AG ? p.a : p.b;
        const int kdiv = (int)g.kdiv, ld16 = (int)(g.ld / 8);
        int u = W.first();
        int32_t nxt = -1;   /* this thread's order[] value of the next step (tid < BK) */
        if ((AG || BG) && tid < BK && u < items) {
            const int e = W.expert(u);
            if (p.offs[e] + tid < p.offs[e + 1]) nxt = g.order[p.offs[e] + tid];
        }
        int it = 0;
        for (; u < items; u = W.after(u)) {
            const int e = W.expert(u), r = u % W.per, m0 = (r / p.nt) * BM, n0 = (r % p.nt) * BN;
            const int k0 = (int)p.offs[e], klim = (int)p.offs[e + 1];
            for (int kr = k0; kr < klim; kr += BK, it++) {
                const int s = it % STAGES;
                const bool whole = kr + BK <= klim;   /* TMA may read these 64 rows */
                uint8_t *a = sa + s * A_BYTES, *b = sb + s * B_BYTES;
                const uint32_t tk = toks + s * BK * 4;   /* the gathered operand's rows of this step */
                if (AG || BG) {
                    if (tid < BK) {   /* lk_moe_cuda_gg_sm90_wgrad_takes: every row's offset < 2^32 - 1 */
                        const uint32_t o = nxt >= 0 ? (uint32_t)(nxt / kdiv) * (uint32_t)ld16 : ~0u;
                        asm volatile("st.shared.u32 [%0], %1;" ::"r"(tk + tid * 4), "r"(o) : "memory");
                        nxt = -1;
                        if (kr + BK < klim) {
                            if (kr + BK + tid < klim) nxt = g.order[kr + BK + tid];
                        } else {   /* the next non-empty item's first step */
                            const int u2 = W.after(u);
                            if (u2 < items) {
                                const int e2 = W.expert(u2);
                                if (p.offs[e2] + tid < p.offs[e2 + 1]) nxt = g.order[p.offs[e2] + tid];
                            }
                        }
                    }
                    asm volatile("bar.sync 1, 128;" ::: "memory");   /* the producer's warps: tk written */
                }
                if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
                if (tid == 0) tma_step<AG, BG, BM / 64, BN / 64>(a, b, &ta, &tb, &full[s], whole, m0, n0, kr);
                if (AG) cp_gathered<BM / 8>(smem_u32(a), p.a.p, tk, m0, p.m, tid);
                else if (!whole) cp_rows<BM / 8>(a, p.a, nullptr, kr, klim, m0, p.m, tid);
                if (BG) cp_gathered<BN / 8>(smem_u32(b), p.b.p, tk, n0, p.n, tid);
                else if (!whole) cp_rows<BN / 8>(b, p.b, nullptr, kr, klim, n0, p.n, tid);
                cp_arrive_noinc_w(&full[s]);   /* arrives when this thread's copies have landed */
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");   /* its last copies land before it leaves */
        return;
    }

    /* --- consumers -------------------------------------------------------------------- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int cg = wg - 1, w = (tid % 128) / 32, lane = tid % 32;
    const int rl = cg * 64 + w * 16 + lane / 4;   /* this thread's gradient rows: rl and rl + 8 of the tile */
    float acc[BN / 2];
    int it = 0;
    /* experts without rows: their slices left as they were, or (store) written with zeros */
    const bool store = TMA && p.store;
    const walk Wc{W.ex, W.offs, W.ranked, W.per, W.items, store};
    for (int u = Wc.first(); u < items; u = Wc.after(u)) {
        const int64_t e = Wc.expert(u), k0 = p.offs[e], klim = p.offs[e + 1];
        const int r = u % Wc.per;
        const int64_t m0 = (int64_t)(r / p.nt) * BM, n0 = (int64_t)(r % p.nt) * BN;
        if (!store) {   /* C's lines this thread's epilogue reads, into L2 while the K loop runs (a hint) */
            const int64_t per = p.c_bf16 ? 64 : 32;   /* elements a 128-byte line */
            const size_t es = p.c_bf16 ? 2 : 4;
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int64_t row = m0 + rl + 8 * hf, col = n0 + per * (lane % 4 + 4 * j);
                    if (row < p.m && col < p.n && col < n0 + BN)
                        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p.c +
                                                                      (e * p.ces + row * p.ldc + col) * es));
                }
        }
        int kb = 0;
        for (int64_t kr = k0; kr < klim; kr += BK, kb++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            fence_async_smem();   /* the producer threads' cp.async writes, before wgmma's reads */
            const uint8_t *a = sa + s * A_BYTES + cg * BLK, *b = sb + s * B_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wgmma_ss_n256_tt(acc, desc(a + kk * 2048, BLK, 1024), desc(b + kk * 2048, BLK, 1024), kb > 0 || kk > 0);
            wgmma_commit();
            if (kb > 0) {   /* the previous stage's group is done: its stage goes back */
                wgmma_wait<1>();
                mbar_arrive(&empty[(it - 1) % STAGES]);
            }
        }
        wgmma_wait<0>();
        fence_regs<BN / 2>(acc);
        if (kb > 0) mbar_arrive(&empty[(it - 1) % STAGES]);

        if constexpr (TMA) {   /* --- epilogue: C += acc by TMA reductions in L2 (f32 C) --- */
            {   /* an expert without rows (store only): its slice is zeros (a select, not a branch:
                 * wgmma's registers written on a divergent path serialize it) */
                const bool none = kb == 0;
#pragma unroll
                for (int q = 0; q < BN / 2; q++) acc[q] = none ? 0.0f : acc[q];
            }
            /* 8 slices of the warpgroup's 64 rows × 32 columns, two buffers: each thread writes
             * its 16 accumulators of slice j into buffer j & 1 (tc's 128-byte swizzle: row r's
             * 16-byte chunk c at c ^ (r & 7), two wavefronts a warp store), the leader (the
             * warpgroup's thread 0, whose bulk groups these are) waits until slice j - 1 has
             * been read out of the other buffer (slice j + 1's), the warpgroup meets on named
             * barrier 2 + cg, the leader hands slice j to TMA. The last slices are read and
             * added while the next item's K loop runs; the wait and meeting before slice 0
             * frees both buffers whichever slices the previous item issued (the slices past M
             * or N are skipped: TMA would clip them to nothing). */
            uint8_t *const buf0 = stg + cg * 2 * SLICE_BYTES;
            const int r = w * 16 + lane / 4;   /* the thread's rows r and r + 8 of the warpgroup's 64 */
            const bool leader = tid % 128 == 0;
            if (leader) bulk_wait_read0();
            asm volatile("bar.sync %0, 128;" ::"r"(2 + cg) : "memory");
            if (m0 + 64 * cg >= p.m) continue;
            if (p.c_bf16) {   /* a bf16 C, stored (tma_c_ok): slices of 64 columns, each pair rounded once */
#pragma unroll
                for (int j = 0; j < BN / 64; j++) {
                    if (n0 + 64 * j >= p.n) break;
                    uint8_t *const buf = buf0 + (j & 1) * SLICE_BYTES;
#pragma unroll
                    for (int g = 0; g < 8; g++)   /* columns 8g + 2·(lane % 4): 16-byte chunk g, 4 bytes a pair */
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int q = 32 * j + 4 * g + 2 * h, row = r + 8 * h;
                            st_shared_b32(buf + row * 128 + ((g ^ (row & 7)) << 4) + 4 * (lane & 3),
                                          lk_pack_bf16x2(acc[q], acc[q + 1]));
                        }
                    fence_async_smem();
                    if (leader) bulk_wait_read0();
                    asm volatile("bar.sync %0, 128;" ::"r"(2 + cg) : "memory");
                    if (leader) {
                        tma_store(&tc, buf, (int)n0 + 64 * j, (int)m0 + 64 * cg, (int)e);
                        bulk_commit();
                    }
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < BN / 32; j++) {
                if (n0 + 32 * j >= p.n) break;
                uint8_t *const buf = buf0 + (j & 1) * SLICE_BYTES;
#pragma unroll
                for (int g = 0; g < 4; g++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int q = 16 * j + 4 * g + 2 * h, row = r + 8 * h, chunk = 2 * g + (lane % 4) / 2;
                        st_shared_v2(buf + row * 128 + ((chunk ^ (row & 7)) << 4) + 8 * (lane & 1), acc[q], acc[q + 1]);
                    }
                fence_async_smem();                 /* these writes, before TMA's reads */
                if (leader) bulk_wait_read0();      /* slice j - 1 read: buffer (j + 1) & 1 free */
                asm volatile("bar.sync %0, 128;" ::"r"(2 + cg) : "memory");
                if (leader) {
                    if (store) tma_store(&tc, buf, (int)n0 + 32 * j, (int)m0 + 64 * cg, (int)e);
                    else tma_reduce_add(&tc, buf, (int)n0 + 32 * j, (int)m0 + 64 * cg, (int)e);
                    bulk_commit();
                }
            }
            continue;
        }

        /* --- epilogue: C += acc, EB column pairs loaded before any store --- */
        const int64_t rows[2] = {m0 + rl, m0 + rl + 8};
        const int cq = 2 * (lane % 4);
        if (p.c_bf16) {
            lk_bf16_t *c = (lk_bf16_t *)p.c + e * p.ces;
#pragma unroll
            for (int q0 = 0; q0 < BN / 2; q0 += 2 * EB) {
                uint32_t v[EB];
#pragma unroll
                for (int i = 0; i < EB; i++) {
                    const int q = q0 + 2 * i;
                    const int64_t row = rows[(q >> 1) & 1], col = n0 + 8 * (q / 4) + cq;
                    v[i] = row < p.m && col < p.n ? *reinterpret_cast<const uint32_t *>(c + row * p.ldc + col) : 0u;
                }
#pragma unroll
                for (int i = 0; i < EB; i++) {
                    const int q = q0 + 2 * i;
                    const int64_t row = rows[(q >> 1) & 1], col = n0 + 8 * (q / 4) + cq;
                    if (row >= p.m || col >= p.n) continue;
                    const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v[i]));
                    *reinterpret_cast<uint32_t *>(c + row * p.ldc + col) = lk_pack_bf16x2(o.x + acc[q], o.y + acc[q + 1]);
                }
            }
        } else {
            float *c = (float *)p.c + e * p.ces;
#pragma unroll
            for (int q0 = 0; q0 < BN / 2; q0 += 2 * EB) {
                float2 v[EB];
#pragma unroll
                for (int i = 0; i < EB; i++) {
                    const int q = q0 + 2 * i;
                    const int64_t row = rows[(q >> 1) & 1], col = n0 + 8 * (q / 4) + cq;
                    v[i] = row < p.m && col < p.n ? *reinterpret_cast<const float2 *>(c + row * p.ldc + col)
                                                  : make_float2(0.0f, 0.0f);
                }
#pragma unroll
                for (int i = 0; i < EB; i++) {
                    const int q = q0 + 2 * i;
                    const int64_t row = rows[(q >> 1) & 1], col = n0 + 8 * (q / 4) + cq;
                    if (row >= p.m || col >= p.n) continue;
                    *reinterpret_cast<float2 *>(c + row * p.ldc + col) = make_float2(v[i].x + acc[q], v[i].y + acc[q + 1]);
                }
            }
        }
    }
    if constexpr (TMA)   /* the reductions read and done before the CTA's shared memory goes */
        if (tid % 128 == 0) bulk_wait0();
#endif
}

/* --- ping-pong: each consumer warpgroup owns a whole item -------------------------------
 * LLMKERN_GG_SM90=pingpong (lk_moe_cuda_gg_sm90_variant in the tests). Items of 128 (M) ×
 * 128 (N), the CTA's non-empty items alternating between the two consumer warpgroups (two
 * wgmma.m64n128k16 a k16 step, 128 accumulators a thread as before); the producer fills one
 * ring of PSTAGES stages of A 16 KiB + B 16 KiB in item order, so one warpgroup's
 * read-add-write of C runs under the other's K loop; the K loops take turns by two named
 * barriers, as grouped_sm90.cu's gg_sm90_pp (which says why the `full` waits need them). The gathered operand's order[] values
 * are loaded one step ahead (the cooperative producer waits on that load before each step's
 * copies).
 * Accumulator register q: m block q / 64 (gradient rows 64·(q / 64) .. of the item), e = q % 64
 * as the m64 fragment (row w·16 + lane / 4 + 8·((e >> 1) & 1), column 8·(e / 4) + 2·(lane % 4)
 * + (e & 1)). */
#define PN 128                                   /* gradient columns a ping-pong item */
#define PSTAGES 7                                /* 7 × 32 KiB + the rows: 232,304 of 232,448 bytes */
#define PB_BYTES (PN / 64 * BLK)
#define PSMEM_BYTES (PSTAGES * (A_BYTES + PB_BYTES) + 2 * PSTAGES * 8 + PSTAGES * BK * 4 + 1024)
#ifndef PEB
#define PEB 8                                    /* column pairs of C loaded before the stores */
#endif

#if FA3_ARCH
/* The consumer warpgroups' turns: named barrier 2 + cg, 256 threads (warpgroup cg waits, the
 * other arrives); 1 is the producer's. */
static __device__ __forceinline__ void order_wait(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(2 + cg) : "memory"); }
static __device__ __forceinline__ void order_pass(int cg) {
    asm volatile("bar.arrive %0, 256;" ::"r"(3 - cg) : "memory");
}
#endif

/* V4 (LLMKERN_GG_SM90=pingpong_v4, C's rows 16-byte aligned): the read-add-write on 16-byte
 * accesses, 8 consecutive columns of a row a lane after a quad transpose of the accumulators
 * (f32: 16 + 16 instructions a thread where the pair-wise one has 64 + 64; bf16 8 + 8). */
template <bool AG, bool BG, bool V4 = false>
__global__ void __launch_bounds__(THREADS, 1) gg_sm90_wgrad_pp(const __grid_constant__ CUtensorMap ta,
                                                               const __grid_constant__ CUtensorMap tb, wargs p) {
#if FA3_ARCH
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sa = sm, *sb = sa + PSTAGES * A_BYTES;
    uint64_t *full = (uint64_t *)(sb + PSTAGES * PB_BYTES), *empty = full + PSTAGES;
    int32_t *toks = (int32_t *)(empty + PSTAGES);   /* [PSTAGES][BK] */
    const int tid = threadIdx.x, wg = tid / 128;
    const int64_t total = p.e * p.mt * p.nt;

    if (tid == 0) {
        for (int s = 0; s < PSTAGES; s++) mbar_init(&full[s], 129), mbar_init(&empty[s], 128);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   /* --- producer: every item of the CTA, in order, into one ring -------- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        int it = 0;
        for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
            int64_t e, k0, klim, m0, n0;
            item_of(p, t, e, k0, klim, m0, n0, PN);
            int32_t nxt = -1;   /* this thread's order[] value of the next step (tid < BK) */
            if ((AG || BG) && tid < BK && k0 + tid < klim) nxt = (AG ? p.a : p.b).order[k0 + tid];
            for (int64_t kr = k0; kr < klim; kr += BK, it++) {
                const int s = it % PSTAGES;
                const bool whole = kr + BK <= klim;   /* TMA may read these 64 rows */
                uint8_t *a = sa + s * A_BYTES, *b = sb + s * PB_BYTES;
                int32_t *tk = toks + s * BK;   /* the gathered operand's rows of this step */
                if (AG || BG) {
                    const wopnd &g = AG ? p.a : p.b;
                    if (tid < BK) {
                        tk[tid] = nxt >= 0 ? (int32_t)(nxt / g.kdiv) : -1;
                        nxt = kr + BK + tid < klim ? g.order[kr + BK + tid] : -1;
                    }
                    asm volatile("bar.sync 1, 128;" ::: "memory");   /* the producer's warps: tk written */
                }
                if (it >= PSTAGES) mbar_wait(&empty[s], ((it / PSTAGES) - 1) & 1);
                if (tid == 0) tma_step<AG, BG, BM / 64, PN / 64>(a, b, &ta, &tb, &full[s], whole, m0, n0, kr);
                if (AG || !whole) cp_rows<BM / 8>(a, p.a, AG ? tk : nullptr, kr, klim, m0, p.m, tid);
                if (BG || !whole) cp_rows<PN / 8>(b, p.b, BG ? tk : nullptr, kr, klim, n0, p.n, tid);
                cp_arrive_noinc_w(&full[s]);   /* arrives when this thread's copies have landed */
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");   /* its last copies land before it leaves */
        return;
    }

    /* --- consumers: warpgroup cg takes the CTA's non-empty items cg, cg + 2, ... -------- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int cg = wg - 1, w = (tid % 128) / 32, lane = tid % 32;
    const int rl = w * 16 + lane / 4;   /* this thread's gradient rows: rl, rl + 8, 64 + rl, 72 + rl */
    const int cq = 2 * (lane % 4);
    float acc[PN];
    int it = 0, j = 0;   /* the ring's count over every item of the CTA; non-empty items seen */
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        int64_t e, k0, klim, m0, n0;
        item_of(p, t, e, k0, klim, m0, n0, PN);
        if (k0 >= klim) continue;   /* no rows: the slice stays as it was (the producer skips it too) */
        const int steps = (int)((klim - k0 + BK - 1) / BK);
        if ((j & 1) != cg) {   /* the other warpgroup's item: its stages pass by */
            it += steps, j++;
            continue;
        }
        if (j++ > 0) order_wait(cg);   /* the other warpgroup has issued the previous item's last stage */
        {   /* C's lines this thread's epilogue reads, into L2 while the K loop runs (a hint) */
            const int64_t per = p.c_bf16 ? 64 : 32;   /* elements a 128-byte line */
            const size_t es = p.c_bf16 ? 2 : 4;
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int64_t row = m0 + 64 * (x >> 1) + rl + 8 * (x & 1), col = n0 + per * (lane % 4);
                if (row < p.m && col < p.n && col < n0 + PN)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p.c + (e * p.ces + row * p.ldc + col) * es));
            }
        }
        for (int kb = 0; kb < steps; kb++, it++) {
            const int s = it % PSTAGES;
            mbar_wait(&full[s], (it / PSTAGES) & 1);
            fence_async_smem();   /* the producer threads' cp.async writes, before wgmma's reads */
            const uint8_t *a = sa + s * A_BYTES, *b = sb + s * PB_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t db = desc(b + kk * 2048, BLK, 1024);
#pragma unroll
                for (int mb = 0; mb < 2; mb++)
                    wgmma_ss_n128_tt(acc + 64 * mb, desc(a + mb * BLK + kk * 2048, BLK, 1024), db, kb > 0 || kk > 0);
            }
            wgmma_commit();
            if (kb > 0) {   /* the previous stage's group is done: its stage goes back */
                wgmma_wait<1>();
                mbar_arrive(&empty[(it - 1) % PSTAGES]);
            }
        }
        for (int64_t u = t + gridDim.x; u < total; u += gridDim.x) {   /* a next non-empty item: its turn */
            const int64_t eu = u / ((int64_t)p.mt * p.nt);
            if (p.offs[eu] < p.offs[eu + 1]) {
                order_pass(cg);
                break;
            }
        }
        wgmma_wait<0>();
        fence_regs<PN>(acc);
        mbar_arrive(&empty[(it - 1) % PSTAGES]);

        /* --- epilogue (under the other warpgroup's K loop): C += acc, one m block at a time --- */
        if constexpr (V4) {
#pragma unroll
            for (int x = 0; x < 4; x++) {   /* [m block · 2 + hf] */
                const int mb = x >> 1, hf = x & 1;
                const int64_t row = m0 + 64 * mb + rl + 8 * hf;
                float d[4][8];   /* the lane's 8 columns of groups 4g + lane % 4 */
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    float d0[4], d1[4];
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        d0[jj] = acc[64 * mb + 4 * (4 * g + jj) + 2 * hf];
                        d1[jj] = acc[64 * mb + 4 * (4 * g + jj) + 2 * hf + 1];
                    }
                    quad_transpose(d0, lane), quad_transpose(d1, lane);
#pragma unroll
                    for (int k = 0; k < 4; k++) d[g][2 * k] = d0[k], d[g][2 * k + 1] = d1[k];
                }
                if (row >= p.m) continue;
                if (p.c_bf16) {
                    lk_bf16_t *c = (lk_bf16_t *)p.c + e * p.ces + row * p.ldc;
                    uint4 v[4];
#pragma unroll
                    for (int g = 0; g < 4; g++) {
                        const int64_t col = n0 + 8 * (4 * g + lane % 4);   /* N a multiple of 8 */
                        v[g] = col < p.n ? *reinterpret_cast<const uint4 *>(c + col) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int g = 0; g < 4; g++) {
                        const int64_t col = n0 + 8 * (4 * g + lane % 4);
                        if (col >= p.n) continue;
                        const uint32_t w[4] = {v[g].x, v[g].y, v[g].z, v[g].w};
                        uint32_t o[4];
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w[k]));
                            o[k] = lk_pack_bf16x2(f.x + d[g][2 * k], f.y + d[g][2 * k + 1]);
                        }
                        st_global_v4(c + col, o[0], o[1], o[2], o[3]);
                    }
                } else {
                    float *c = (float *)p.c + e * p.ces + row * p.ldc;
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {   /* two groups' 16 columns loaded before their stores */
                        float4 v[4];
#pragma unroll
                        for (int g = 2 * h2; g < 2 * h2 + 2; g++) {
                            const int64_t col = n0 + 8 * (4 * g + lane % 4);
                            const bool ok = col < p.n;
                            const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                            v[2 * (g - 2 * h2)] = ok ? *reinterpret_cast<const float4 *>(c + col) : z;
                            v[2 * (g - 2 * h2) + 1] = ok ? *reinterpret_cast<const float4 *>(c + col + 4) : z;
                        }
#pragma unroll
                        for (int g = 2 * h2; g < 2 * h2 + 2; g++) {
                            const int64_t col = n0 + 8 * (4 * g + lane % 4);
                            if (col >= p.n) continue;
                            const float4 a = v[2 * (g - 2 * h2)], b = v[2 * (g - 2 * h2) + 1];
                            *reinterpret_cast<float4 *>(c + col) =
                                make_float4(a.x + d[g][0], a.y + d[g][1], a.z + d[g][2], a.w + d[g][3]);
                            *reinterpret_cast<float4 *>(c + col + 4) =
                                make_float4(b.x + d[g][4], b.y + d[g][5], b.z + d[g][6], b.w + d[g][7]);
                        }
                    }
                }
            }
        } else {   /* pair-wise */
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                const int64_t rows[2] = {m0 + 64 * mb + rl, m0 + 64 * mb + rl + 8};
                if (p.c_bf16) {
                    lk_bf16_t *c = (lk_bf16_t *)p.c + e * p.ces;
#pragma unroll
                    for (int e0 = 0; e0 < 64; e0 += 2 * PEB) {
                        uint32_t v[PEB];
#pragma unroll
                        for (int u = 0; u < PEB; u++) {
                            const int ef = e0 + 2 * u;
                            const int64_t row = rows[(ef >> 1) & 1], col = n0 + 8 * (ef / 4) + cq;
                            v[u] = row < p.m && col < p.n ? *reinterpret_cast<const uint32_t *>(c + row * p.ldc + col)
                                                          : 0u;
                        }
#pragma unroll
                        for (int u = 0; u < PEB; u++) {
                            const int ef = e0 + 2 * u, q = 64 * mb + ef;
                            const int64_t row = rows[(ef >> 1) & 1], col = n0 + 8 * (ef / 4) + cq;
                            if (row >= p.m || col >= p.n) continue;
                            const float2 o = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v[u]));
                            *reinterpret_cast<uint32_t *>(c + row * p.ldc + col) =
                                lk_pack_bf16x2(o.x + acc[q], o.y + acc[q + 1]);
                        }
                    }
                } else {
                    float *c = (float *)p.c + e * p.ces;
#pragma unroll
                    for (int e0 = 0; e0 < 64; e0 += 2 * PEB) {
                        float2 v[PEB];
#pragma unroll
                        for (int u = 0; u < PEB; u++) {
                            const int ef = e0 + 2 * u;
                            const int64_t row = rows[(ef >> 1) & 1], col = n0 + 8 * (ef / 4) + cq;
                            v[u] = row < p.m && col < p.n ? *reinterpret_cast<const float2 *>(c + row * p.ldc + col)
                                                          : make_float2(0.0f, 0.0f);
                        }
#pragma unroll
                        for (int u = 0; u < PEB; u++) {
                            const int ef = e0 + 2 * u, q = 64 * mb + ef;
                            const int64_t row = rows[(ef >> 1) & 1], col = n0 + 8 * (ef / 4) + cq;
                            if (row >= p.m || col >= p.n) continue;
                            *reinterpret_cast<float2 *>(c + row * p.ldc + col) =
                                make_float2(v[u].x + acc[q], v[u].y + acc[q + 1]);
                        }
                    }
                }
            }
        }
    }
#endif
}

/* --- host ---------------------------------------------------------------------------- */

/* Rows of whole 16-byte chunks from a 16-byte aligned base (TMA's and cp.async's rule), no
 * expert stride (WGRAD's operands are the sorted or token rows themselves), M / N contiguous. */
/* rows: the sorted rows' bound; a gathered operand's source rows are fewer than rows / kdiv,
 * and the cooperative kernel keeps each one's offset in 16-byte chunks in 32 bits. */
static int operand_ok(const lk_gg_operand *o, int64_t cols, int64_t rows) {
    return !o->kmajor && o->e_stride == 0 && lk_aligned16(o->src) && o->ld % 8 == 0 && cols % 8 == 0 &&
           cols <= o->ld && (!o->order || (o->kdiv >= 1 && o->kdiv <= INT32_MAX &&
                                           (uint64_t)(rows / o->kdiv + 1) * (uint64_t)(o->ld / 8) <
                                                                   0xffffffffull));
}

extern "C" int lk_moe_cuda_gg_sm90_wgrad_takes(const lk_gg *g) {
    if (g->dt != LK_BF16 || g->mode != LK_GG_WGRAD || (g->epi != LK_GG_ACCUM && g->epi != LK_GG_STORE) || g->m < 8 || g->n < 8 ||
        g->m > INT32_MAX || g->n > INT32_MAX || g->rows > INT32_MAX - 2 * BK || g->experts < 1 ||
        !operand_ok(&g->a, g->m, g->rows) || !operand_ok(&g->b, g->n, g->rows) || (g->a.order && g->b.order))
        return 0;
    /* C: f32 or bf16, element pairs (8 or 4 bytes) aligned */
    const size_t es = g->c_dt == LK_F32 ? 4 : g->c_dt == LK_BF16 ? 2 : 0;
    /* the ping-pong's, the most; the producer's int item index steps past the last by a grid */
    const int64_t items = g->experts * lk_cdiv(g->m, BM) * lk_cdiv(g->n, PN);
    return es && items <= INT32_MAX / 2 && ((uintptr_t)g->c % (2 * es)) == 0 && g->ldc % 2 == 0 && g->c_e_stride % 2 == 0 && g->ldc >= g->n;
}

static lk_status map_error(lk_status s) {
    char why[256];
    snprintf(why, sizeof why, "%s", lk_last_error());
    return lk_error(s, "moe_experts: grouped gemm (sm90 wgrad): tensor map: %s", why);
}

/* [rows, cols] row-major, ld apart, in boxes of 64 columns × 64 rows. */
static lk_status rows_map(CUtensorMap *m, const lk_gg_operand *o, int64_t rows, int64_t cols) {
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, 1};
    const cuuint64_t strides[2] = {(cuuint64_t)o->ld * 2, (cuuint64_t)(o->ld * rows * 2)};
    const cuuint32_t box[3] = {64, BK, 1};
    lk_status s = bf16_map(m, o->src, 3, dims, strides, box);
    return s ? map_error(s) : LK_OK;
}

template <bool AG, bool BG, bool TMA>
static lk_status launch(const CUtensorMap &ta, const CUtensorMap &tb, const CUtensorMap &tc, const wargs &p, int grid,
                        cudaStream_t st) {
    static int opted;   /* once a process: a host-side attribute, no stream work */
    const int bytes = TMA ? TSMEM_BYTES : SMEM_BYTES;
    if (!opted) {
        LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90_wgrad<AG, BG, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        opted = 1;
    }
    gg_sm90_wgrad<AG, BG, TMA><<<grid, THREADS, bytes, st>>>(ta, tb, tc, p);
    LK_CUDA_LAUNCHED(TMA ? "moe_experts: grouped gemm (sm90 wgrad, TMA reduce)" : "moe_experts: grouped gemm (sm90 wgrad)");
    return LK_OK;
}

/* AUTO's TMA epilogue: C laid out as TMA can address it (the base and both strides 16-byte
 * aligned, rows and expert slices that do not overlap), f32, or bf16 when stored (a bf16 C
 * added in L2 would be rounded twice: the accumulators' rounding, then the sum's; the
 * read-add-write rounds once); else the cooperative kernel's read-add-write. */
static int tma_c_ok(const lk_gg *g) {
    const int64_t per = g->c_dt == LK_F32 ? 4 : 8;   /* elements a 16-byte chunk */
    return (g->c_dt == LK_F32 || (g->c_dt == LK_BF16 && g->epi == LK_GG_STORE)) && lk_aligned16(g->c) &&
           g->ldc % per == 0 && g->c_e_stride % per == 0 && g->ldc >= g->n && g->c_e_stride >= g->m * g->ldc &&
           g->experts <= INT32_MAX && (uint64_t)g->c_e_stride * 4 < (1ull << 40);
}

/* C [E, M, N] (element (e, i, j) at c + e·ces + i·ldc + j) in boxes of 128 bytes (32 f32 or
 * 64 bf16 columns) × 64 rows of one expert, 128-byte swizzled (the staging buffers' layout);
 * TMA's stores and reductions leave what lies outside M, N untouched. */
static lk_status c_map(CUtensorMap *m, const lk_gg *g) {
    encode_fn enc = encoder();
    if (!enc) return lk_error(LK_EDEVICE, "moe_experts: grouped gemm (sm90 wgrad): the driver has no cuTensorMapEncodeTiled");
    const int bf16 = g->c_dt == LK_BF16;
    const cuuint64_t es = bf16 ? 2 : 4;
    const cuuint64_t dims[3] = {(cuuint64_t)g->n, (cuuint64_t)g->m, (cuuint64_t)g->experts};
    const cuuint64_t strides[2] = {(cuuint64_t)g->ldc * es, (cuuint64_t)g->c_e_stride * es};
    const cuuint32_t box[3] = {bf16 ? 64u : 32u, 64, 1}, el[3] = {1, 1, 1};
    CUresult r = enc(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, g->c, dims,
                     strides, box, el, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lk_error(LK_EDEVICE, "moe_experts: grouped gemm (sm90 wgrad): cuTensorMapEncodeTiled (C) failed (%d)", (int)r);
    return LK_OK;
}

template <bool AG, bool BG, bool V4>
static lk_status launch_pp(const CUtensorMap &ta, const CUtensorMap &tb, const wargs &p, int grid, cudaStream_t st) {
    static int opted;
    if (!opted) {
        LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90_wgrad_pp<AG, BG, V4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         PSMEM_BYTES));
        opted = 1;
    }
    gg_sm90_wgrad_pp<AG, BG, V4><<<grid, THREADS, PSMEM_BYTES, st>>>(ta, tb, p);
    LK_CUDA_LAUNCHED("moe_experts: grouped gemm (sm90 wgrad, ping-pong)");
    return LK_OK;
}

extern "C" lk_status lk_moe_cuda_gg_sm90_wgrad(const lk_gg *g, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const bool ag = g->a.order != NULL, bg = g->b.order != NULL;
    wargs p;
    memset(&p, 0, sizeof p);
    p.a = wopnd{(const lk_bf16_t *)g->a.src, g->a.ld, g->a.kdiv, g->a.order};
    p.b = wopnd{(const lk_bf16_t *)g->b.src, g->b.ld, g->b.kdiv, g->b.order};
    p.m = g->m, p.n = g->n, p.e = g->experts;
    const int variant = lk_moe_cuda_gg_sm90_variant_in_force();   /* AUTO: coop's kernel with the TMA epilogue */
    const int pp = variant == LK_GG_SM90_PINGPONG || variant == LK_GG_SM90_PINGPONG_V4;
    const size_t es = g->c_dt == LK_BF16 ? 2 : 4;   /* pingpong_v4: C's rows and slices 16-byte aligned */
    const int v4 = variant == LK_GG_SM90_PINGPONG_V4 && lk_aligned16(g->c) && (g->ldc * es) % 16 == 0 &&
                   (g->c_e_stride * es) % 16 == 0;
    p.mt = (int)lk_cdiv(g->m, BM), p.nt = (int)lk_cdiv(g->n, pp ? PN : BN);
    p.offs = g->offs;
    p.c = g->c, p.ldc = g->ldc, p.ces = g->c_e_stride, p.c_bf16 = g->c_dt == LK_BF16;
    /* the default: coop's kernel with the TMA epilogue, which writes a STORE's C itself (zeros
     * for the experts without rows); the other kernels only add, onto zeros queued first */
    const int tma_epi = (variant == LK_GG_SM90_AUTO || variant == LK_GG_SM90_COOP_CLUSTER) && !pp && tma_c_ok(g);
    p.store = g->epi == LK_GG_STORE && tma_epi && g->rows >= 1;
    lk_status s;
    if (g->epi == LK_GG_STORE && !p.store && (s = lk_moe_cuda_wgrad_zero(g, st))) return s;
    if (g->rows < 1) return LK_OK;

    /* the tensor maps of the operands that are not gathered: [rows, M] / [rows, N] */
    CUtensorMap ta, tb;
    memset(&ta, 0, sizeof ta), memset(&tb, 0, sizeof tb);
    if (!ag && (s = rows_map(&ta, &g->a, g->rows, g->m))) return s;
    if (!bg && (s = rows_map(&tb, &g->b, g->rows, g->n))) return s;

    const int sms = lk_hw_get()->cuda_sms > 0 ? lk_hw_get()->cuda_sms : 1;
    const int64_t bound = g->experts * p.mt * p.nt;
    const int grid = (int)(bound < sms ? bound : sms);
    if (pp && v4) {   /* LLMKERN_GG_SM90=pingpong_v4 */
        if (ag) return launch_pp<true, false, true>(ta, tb, p, grid, st);
        return bg ? launch_pp<false, true, true>(ta, tb, p, grid, st)
                  : launch_pp<false, false, true>(ta, tb, p, grid, st);
    }
    if (pp) {   /* LLMKERN_GG_SM90=pingpong (or pingpong_v4 on rows that are not 16-byte aligned) */
        if (ag) return launch_pp<true, false, false>(ta, tb, p, grid, st);
        return bg ? launch_pp<false, true, false>(ta, tb, p, grid, st)
                  : launch_pp<false, false, false>(ta, tb, p, grid, st);
    }
    CUtensorMap tc;
    memset(&tc, 0, sizeof tc);
    if (tma_epi) {   /* the default: the TMA epilogue */
        if ((s = c_map(&tc, g))) return s;
        if (ag) return launch<true, false, true>(ta, tb, tc, p, grid, st);
        return bg ? launch<false, true, true>(ta, tb, tc, p, grid, st) : launch<false, false, true>(ta, tb, tc, p, grid, st);
    }
    if (ag) return launch<true, false, false>(ta, tb, tc, p, grid, st);
    return bg ? launch<false, true, false>(ta, tb, tc, p, grid, st) : launch<false, false, false>(ta, tb, tc, p, grid, st);
}
