/* fa3.cu — `flash_attention_3` on Hopper (sm_90a): the forward in FlashAttention-3's shape,
 * written for llmkern. bf16 in, f32 softmax and accumulation, the LSE saved.
 *
 *   a block      128 query rows of one (b, h); three warpgroups (384 threads):
 *   producer     warpgroup 0 gives back its registers (setmaxnreg 24) and one thread issues
 *                TMA loads: the Q tile once, then K and V tiles (BN keys: 176 where the
 *                block masks nothing inside its key range, else 128) into a ring of two or
 *                three stages. K and V of a stage complete on mbarriers
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
 * launched longest first. GQA reads K/V head h / G through the tensor map's third
 * coordinate; no copies. Softcap and sinks as in the contract. Head dims that are
 * multiples of 8 up to 128 (TMA zero-fills the columns past D of a 64- or 128-wide tile).
 *
 * What this kernel does not take (f32, other head dims up to 256, unaligned tensors) runs
 * on flash_attention_2's kernels, as does the backward (fa2.cu; the same LSE contract): a
 * wgmma backward is still to write (bench/NOTES.md, issue 16). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdlib.h>
#include "core/cuda_check.h"
#include "ops/attention/internal.h"
#include "ops/attention/visible.cuh"
#include "ops/cuda_util.cuh"

#define BM 128            /* query rows a block */
/* Keys a tile, BN: 176 where no row is masked inside the block's range (no causal, no
 * window: fewer, longer tiles amortize each tile's softmax bookkeeping), else 128.
 * Stages of the K/V ring: as many as the 227 KiB a block may take hold (D 128: 32 KiB of
 * Q + 3 x 64 KiB at BN 128, 2 x 88 KiB at BN 176). */
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
} fwd_geom;

/* The Hopper-only instructions exist in the sm_90a pass alone; the other passes see the
 * kernel as a trap. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA3_ARCH 1
#else
#define FA3_ARCH 0
#endif

#if FA3_ARCH
static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
static __device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}" ::"r"(smem_u32(b)), "r"(parity) : "memory");
}
/* A 3-D box of the tensor map into shared memory, completing on bar. */
static __device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

/* A shared-memory matrix descriptor in the 128-byte swizzle (PTX ISA, "matrix descriptor"). */
static __device__ __forceinline__ uint64_t desc(const void *p, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((smem_u32(p) & 0x3ffff) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 |
           1ull << 62;
}

/* The accumulators are written by the tensor cores between issue and wait: these empty
 * asm statements keep the compiler from moving their reads or writes across. */
template <int N>
static __device__ __forceinline__ void fence_regs(float *r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}


/* d[m64 x n176] (+)= A · Bᵀ (acc 0: =), A and B K-major in shared memory. */
static __device__ __forceinline__ void wgmma_ss_n176(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
                 : "l"(da), "l"(db), "r"(acc));
}

/* d[m64 x n128] (+)= A · Bᵀ (acc 0: =), A and B K-major in shared memory. */
static __device__ __forceinline__ void wgmma_ss_n128(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc));
}

/* d[m64 x n128] += A · B, A in registers (this thread's m64k16 fragment), B N-major
 * (transposed) in shared memory. */
static __device__ __forceinline__ void wgmma_rs_n128(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

/* d[m64 x n64] += A · B, A in registers (this thread's m64k16 fragment), B N-major
 * (transposed) in shared memory. */
static __device__ __forceinline__ void wgmma_rs_n64(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#endif

#if FA3_ARCH
/* The consumer warpgroups' turns: warpgroup cg waits on barrier 1 + cg, which the other
 * warpgroup's 128 threads arrive at once its GEMMs are issued. */
static __device__ __forceinline__ void sched_wait(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(1 + cg) : "memory"); }
static __device__ __forceinline__ void sched_signal(int cg) {
    asm volatile("bar.arrive %0, 256;" ::"r"(1 + cg) : "memory");
}

/* S = Q·Kᵀ of this warpgroup's 64 rows against a stage's BN keys (sq: the warpgroup's rows
 * of the Q tile; sk: the stage's K tile). */
template <int DP, int BN>
static __device__ __forceinline__ void issue_qk(float *sc, const uint8_t *sq, const uint8_t *sk) {
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        const int c = kk / 4, off = (kk % 4) * 32;
        const uint64_t dq = desc(sq + c * BM * 128 + off, 16, 1024), dk = desc(sk + c * BN * 128 + off, 16, 1024);
        if constexpr (BN == 176) wgmma_ss_n176(sc, dq, dk, kk > 0);
        else wgmma_ss_n128(sc, dq, dk, kk > 0);
    }
}

/* O += P·V over a stage's BN keys (sv: the stage's V tile, read N-major). */
template <int DP, int BN>
static __device__ __forceinline__ void issue_pv(float *o, const uint32_t (*p)[4], const uint8_t *sv) {
#pragma unroll
    for (int t = 0; t < BN / 16; t++) {
        const uint64_t dv = desc(sv + t * 2048, BN * 128, 1024);
        if constexpr (DP == 128) wgmma_rs_n128(o, p[t], dv);
        else wgmma_rs_n64(o, p[t], dv);
    }
}

/* The online softmax of one tile of scores in place: sc becomes the unnormalized
 * probabilities (f32), m the rows' running max (log2 units), alpha the factor the rows'
 * earlier sums and outputs take, sum this lane's share of the tile's row sums. */
template <int BN>
static __device__ __forceinline__ void softmax_tile(float *sc, float *m, float *alpha, float *sum, int k0, int maxlo,
                                                    int minhi, const int *lo, const int *hi, int lane,
                                                    const fwd_geom &g) {
    if (g.cap > 0.0f) {   /* softcap: the scores themselves in log2 units */
#pragma unroll
        for (int e = 0; e < BN / 2; e++) sc[e] = g.cap2 * tanhf(sc[e] * g.scale / g.cap);
    }
    const float mul = g.cap > 0.0f ? 1.0f : g.scale2;   /* raw scores: log2 units after one FFMA */
    if (!(maxlo <= k0 && minhi >= k0 + BN)) {           /* some row does not see the whole tile */
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

/* Accumulator columns 16t..16t+15 of P are the A fragment of k-step t. */
template <int BN>
static __device__ __forceinline__ void pack_p(const float *sc, uint32_t (*p)[4]) {
#pragma unroll
    for (int e = 0; e < BN / 2; e += 2) p[e / 8][((e / 4) & 1) * 2 + ((e >> 1) & 1)] = lk_pack_bf16x2(sc[e], sc[e + 1]);
}
#endif

/* Consumer registers are indexed only by unrolled constants: fragment element e of an
 * m64nN accumulator is row (e & 2 ? 8 : 0) + lane / 4 of the warp's 16, column
 * 8 (e / 4) + 2 (lane % 4) + (e & 1). */
template <int DP, int BN>
__global__ void __launch_bounds__(THREADS, 1) fa3_fwd(const __grid_constant__ CUtensorMap tq,
                                                      const __grid_constant__ CUtensorMap tk,
                                                      const __grid_constant__ CUtensorMap tv, lk_bf16_t *out,
                                                      float *lse, fwd_geom g) {
#if FA3_ARCH
    constexpr int NC = DP / 64, STAGES = tiling<DP, BN>::stages;   /* NC: 64-column blocks of a row */
    constexpr uint32_t QB = BM * 128, KB = BN * 128; /* bytes of one 64-column block */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sq = sm, *sk = sq + NC * QB, *sv = sk + STAGES * NC * KB;
    /* K and V of a stage complete on barriers of their own: Q·Kᵀ need not wait for V */
    uint64_t *bars = (uint64_t *)(sv + STAGES * NC * KB), *qfull = bars, *kfull = bars + 1, *vfull = kfull + STAGES,
             *empty = vfull + STAGES;

    const int tid = threadIdx.x, wg = tid / 128;
    const int64_t bh = blockIdx.y, h = bh % g.Hq, b = bh / g.Hq;
    const int nqt = (int)((g.Sq + BM - 1) / BM);
    const int qt = g.reverse ? nqt - 1 - (int)blockIdx.x : (int)blockIdx.x, i0 = qt * BM;

    /* the key tiles any row of the block sees, and the keys all of its rows see */
    const int last = (int)min((int64_t)i0 + BM, g.Sq) - 1;
    int kmin, maxlo, minhi, kmax;
    lk_attn_row_iv(g.vis, i0, kmin, minhi);
    lk_attn_row_iv(g.vis, last, maxlo, kmax);
    const int t0 = kmax > kmin ? kmin / BN : 0, nt = kmax > kmin ? (kmax + BN - 1) / BN - t0 : 0;

    if (tid == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < STAGES; s++) mbar_init(&kfull[s], 1), mbar_init(&vfull[s], 1), mbar_init(&empty[s], 256);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0 && nt > 0) {
            const int zq = (int)bh, zk = (int)(b * g.Hkv + h / g.G);
            mbar_expect_tx(qfull, NC * QB);
            for (int c = 0; c < NC; c++) tma_load(sq + c * QB, &tq, qfull, c * 64, i0, zq);
            for (int it = 0; it < nt; it++) {
                const int s = it % STAGES, k0 = (t0 + it) * BN;
                if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
                mbar_expect_tx(&kfull[s], NC * KB);
                for (int c = 0; c < NC; c++) tma_load(sk + (s * NC + c) * KB, &tk, &kfull[s], c * 64, k0, zk);
                mbar_expect_tx(&vfull[s], NC * KB);
                for (int c = 0; c < NC; c++) tma_load(sv + (s * NC + c) * KB, &tv, &vfull[s], c * 64, k0, zk);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int ct = tid - 128, cg = ct / 128, w = (ct % 128) / 32, lane = tid % 32;
    const int rw = cg * 64 + w * 16 + lane / 4;     /* this thread's rows: rw and rw + 8 of the block */
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + rw + 8 * r;
        lo[r] = hi[r] = 0;
        if (i < g.Sq) lk_attn_row_iv(g.vis, i, lo[r], hi[r]);
    }
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
        issue_qk<DP, BN>(sc, sq + cg * 64 * 128, sk);
        wgmma_commit();
        sched_signal(1 - cg);
        wgmma_wait<0>();
        fence_regs<BN / 2>(sc);
        softmax_tile<BN>(sc, m, alpha, sum, t0 * BN, maxlo, minhi, lo, hi, lane, g);
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
        pack_p<BN>(sc, p);
        for (int it = 1; it < nt; it++) {
            const int s = it % STAGES, sp = (it - 1) % STAGES;
            mbar_wait(&kfull[s], (it / STAGES) & 1);
            mbar_wait(&vfull[sp], ((it - 1) / STAGES) & 1);
            sched_wait(cg);
            fence_regs<DP / 2>(o);
            wgmma_fence();
            issue_qk<DP, BN>(sc, sq + cg * 64 * 128, sk + s * NC * KB);
            wgmma_commit();
            issue_pv<DP, BN>(o, p, sv + sp * NC * KB);
            wgmma_commit();
            sched_signal(1 - cg);
            wgmma_wait<1>();
            fence_regs<BN / 2>(sc);
            softmax_tile<BN>(sc, m, alpha, sum, (t0 + it) * BN, maxlo, minhi, lo, hi, lane, g);
            wgmma_wait<0>();
            fence_regs<DP / 2>(o);
            mbar_arrive(&empty[sp]);
#pragma unroll
            for (int e = 0; e < DP / 2; e++) o[e] *= alpha[(e >> 1) & 1];
#pragma unroll
            for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
            pack_p<BN>(sc, p);
        }
        const int sl = (nt - 1) % STAGES;
        mbar_wait(&vfull[sl], ((nt - 1) / STAGES) & 1);
        sched_wait(cg);
        fence_regs<DP / 2>(o);
        wgmma_fence();
        issue_pv<DP, BN>(o, p, sv + sl * NC * KB);
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

/* What the Hopper kernel does not take runs on flash_attention_2's kernels (fa2.cu): the
 * backward always, and the forward of f32 (CUDA cores there), head dims past 128 or not
 * a multiple of 8, tensors not 16-byte aligned (TMA's rule), B·H_q past the grid's 65535. */
static const lk_attention_vtable *const fa2 = &lk_attention_fa2_cuda_backend;

static int hopper_takes(const lk_attention_args *a) {
    const int64_t D = a->q.shape[3];
    return a->q.dtype == LK_BF16 && D % 8 == 0 && D <= 128 && a->q.shape[0] * a->q.shape[1] <= 65535 &&
           a->q.shape[2] < INT32_MAX && a->k.shape[2] < INT32_MAX && (uintptr_t)a->q.data % 16 == 0 &&
           (uintptr_t)a->k.data % 16 == 0 && (uintptr_t)a->v.data % 16 == 0;
}

static size_t workspace_bytes(const lk_attention_args *a, int backward) {
    return backward || !hopper_takes(a) ? fa2->workspace_bytes(a, backward) : lk_attn_vis_bytes(a);
}

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, found once through the runtime (no -lcuda). */
static encode_fn encoder(void) {
    static encode_fn fn;
    if (!fn) {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess && q == cudaDriverEntryPointSuccess)
            fn = (encode_fn)f;
    }
    return fn;
}

/* [heads, rows, D] bf16 as boxes of 64 columns x rows_box rows of one head, 128-byte
 * swizzled; rows past the head's end and columns past D read as zeros. */
static lk_status tensor_map(CUtensorMap *m, const void *base, int64_t heads, int64_t rows, int64_t D, int rows_box) {
    encode_fn enc = encoder();
    if (!enc) return lk_error(LK_EDEVICE, "attention: flash_attention_3: the driver has no cuTensorMapEncodeTiled");
    cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)rows, (cuuint64_t)heads};
    cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)(rows * D * 2)};
    cuuint32_t box[3] = {64, (cuuint32_t)rows_box, 1}, el[3] = {1, 1, 1};
    CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, el,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return lk_error(LK_EDEVICE, "attention: flash_attention_3: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return LK_OK;
}

template <int DP, int BN>
static size_t fwd_smem(void) {
    constexpr int st = tiling<DP, BN>::stages;
    return 1024 + (size_t)(DP / 64) * (BM + 2 * st * BN) * 128 + 8 * (1 + 3 * st);
}

template <int DP, int BN>
static lk_status launch(const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                        const lk_attention_args *a, const lk_attn_dims *d, const fwd_geom &g, cudaStream_t st) {
    const size_t sh = fwd_smem<DP, BN>();
    LK_CUDA_TRY(cudaFuncSetAttribute(fa3_fwd<DP, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh));
    dim3 grid((unsigned)((d->Sq + BM - 1) / BM), (unsigned)(d->B * d->Hq));
    fa3_fwd<DP, BN><<<grid, THREADS, sh, st>>>(tq, tk, tv, (lk_bf16_t *)a->out.data, (float *)a->saved.data, g);
    LK_CUDA_LAUNCHED("attention: flash_attention_3 forward");
    return LK_OK;
}

static lk_status forward(const lk_attention_args *a, lk_ctx *ctx) {
    if (!hopper_takes(a)) return fa2->forward(a, ctx);
    lk_attn_dims d = lk_attn_dims_of(a);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    fwd_geom g = {d.Sq, d.Skv, d.Hq, d.Hkv, d.G, (int)d.D, d.scale * LOG2E, d.scale, a->softcap,
                  a->softcap * LOG2E, {}, (const float *)a->s_aux.data, a->causal};
    /* 176-key tiles where no row is masked inside the block's key range (D 128) */
    const int bn = d.D > 64 && !a->causal && !a->window_left && !a->window_right ? 176 : 128;
    CUtensorMap tq, tk, tv;
    lk_status s;
    if ((s = lk_attn_vis_make(a, ctx->arena, st, &g.vis)) || (s = tensor_map(&tq, a->q.data, d.B * d.Hq, d.Sq, d.D, BM)) ||
        (s = tensor_map(&tk, a->k.data, d.B * d.Hkv, d.Skv, d.D, bn)) ||
        (s = tensor_map(&tv, a->v.data, d.B * d.Hkv, d.Skv, d.D, bn)))
        return s;
    if (d.D <= 64) return launch<64, 128>(tq, tk, tv, a, &d, g, st);
    return bn == 176 ? launch<128, 176>(tq, tk, tv, a, &d, g, st) : launch<128, 128>(tq, tk, tv, a, &d, g, st);
}

static lk_status backward(const lk_attention_args *a, lk_ctx *ctx) { return fa2->backward(a, ctx); }

extern "C" const lk_attention_vtable lk_attention_fa3_cuda_backend = {
    LK_ATTENTION_VTABLE_VERSION, saved_bytes, workspace_bytes, forward, backward, NULL,
};
