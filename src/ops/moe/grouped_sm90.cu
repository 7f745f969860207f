/* grouped_sm90.cu — the MoE experts' grouped GEMM on Hopper (sm_90a): grouped.cu's ROWS
 * GEMMs (M = the expert-sorted rows, expert e owning [offs[e], offs[e+1])) with the same
 * epilogues, on wgmma. grouped.cu's launcher sends a ROWS GEMM here on an sm_90 GPU when
 * lk_moe_cuda_gg_sm90_takes says its operands fit (moe_cuda.h); the weight gradients
 * (WGRAD) stay on mma.sync.
 *
 *   tile       128 rows × 256 columns a CTA tile, K steps of 64 (one 128-byte swizzled row
 *              of bf16 a k-step row), a ring of STAGES = 4 stages of A (16 KiB) + B (32 KiB).
 *   producer   warpgroup 0 (setmaxnreg 56). B (the expert's weight slice, never gathered)
 *              by TMA through a 3-D map [E, rows, K] or [E, K, N]: one thread issues the
 *              boxes and the stage's `full` mbarrier counts their bytes. A by TMA too where
 *              its rows are the sorted rows themselves (h, d_gate_up); where they are
 *              gathered token rows (x[order / k], dout[order / k]: the permutation fused
 *              into the load) a 2-D tensor map cannot name them (Hopper's TMA has no row
 *              gather), so the warpgroup's 128 threads copy them by cp.async, 16 bytes a
 *              copy, four rows × 128 bytes a warp instruction (coalesced), into the same
 *              128-byte swizzle TMA writes (chunk c of row r at c ^ (r & 7)); each thread's
 *              cp.async.mbarrier.arrive.noinc arrives on the stage's `full` barrier when its
 *              copies land (128 arrivals + the TMA thread's), so the producer never waits
 *              on its own copies, only on `empty`. (The first version waited for its copies
 *              two stages later and fenced them to the async proxy before arriving: that
 *              tied the ring's depth to the copy latency; 506 TFLOP/s gate/up.)
 *   consumers  warpgroups 1 and 2 (setmaxnreg 224), 64 rows each: per stage four
 *              wgmma.m64n256k16 (f32 accumulators, 128 a thread) from the swizzled tiles
 *              (B K-major, or N-major through the descriptor's transpose bit for the
 *              backward's Wd_e / Wgu_e read as [k, n]); one wgmma group kept in flight, the
 *              stage before it released to the producer on its `empty` barrier (256
 *              arrivals). A tile's rows and column tile come from the producer (tinfo, a
 *              slot a stage, released with the stage's `full` barrier), which has already
 *              searched them out: the consumers used to repeat its binary search, seven
 *              dependent loads a tile with the tensor cores idle (3% of gate/up's stall
 *              samples). The epilogue reads the accumulators straight to global memory
 *              while the producer already fills the ring for the next tile.
 *   schedule   persistent: one CTA an SM walks tiles t = blockIdx.x, + gridDim.x, ... <
 *              tiles[E] · ny (tiles[]: grouped.cu's tile_scan, the experts' 128-row tiles
 *              from the device offsets; ny the column tiles), row tile t / ny, column tile
 *              t % ny (a row tile's column tiles run side by side, so its A rows come from
 *              L2 once read); the expert by binary search over tiles. Zero-row experts take
 *              no tile; nothing is read back on the host.
 * Epilogues (grouped.cu's, element for element):
 *   STORE      C f32 or bf16 (y = h·Wdᵀ, d_rows = d_gate_up·Wgu).
 *   SWIGLU     the B tile is 128 gate rows j0.. then the 128 up rows I + j0.. (two TMA
 *              boxes), so accumulator column c < 128 (register e) is gate j0 + c and its up
 *              is register e + 64 of the same thread: keep = [gate | up] bf16, h = w ·
 *              silu(gate) · up bf16, NaN when the ids were bad.
 *   DSWIGLU    C = dh' (N = I): d_gate_up, w·h and the per-row partial of Σ dh'·h over each
 *              128 columns (grouped.cu's dw_part layout, lk_moe_cuda_dw_tiles(I) a row): a
 *              row lives in one warp, summed by two shuffles, no shared memory.
 *
 * Variants (LLMKERN_GG_SM90, read once; lk_moe_cuda_gg_sm90_variant in the tests, which run each):
 *   coop       gg_sm90, the schedule above: both consumer warpgroups on one 128 × 256 tile,
 *              the tensor cores idle through the epilogue; every epilogue on 16-byte stores
 *              where the rows are 16-byte aligned (V4: a quad transpose of the accumulators,
 *              8 consecutive columns a lane, whole row pieces a warp instruction).
 *   pingpong   gg_sm90_pp (below the first kernel): each consumer warpgroup a 128 × 128 tile of
 *              its own, its epilogue under the other's mainloop; 4- and 8-byte epilogues.
 *   pingpong_v4  pingpong with the DSWIGLU and STORE epilogues on 16-byte accesses, and
 *              grouped_wgrad_sm90.cu's likewise.
 *   coop_cluster  coop (V4 epilogues) on clusters of two CTAs (CL 2) walking units of two
 *              adjacent row tiles at one column tile; where both row tiles are one expert's,
 *              each CTA loads half of the B tile and multicasts it to both (torch._grouped_mm's
 *              CUTLASS kernel runs this tile on 2 x 1 clusters). A stage's `empty` barrier
 *              counts one arrival a consumer warp of both CTAs, since the peer writes into it.
 *              Measured a draw against coop (fourteenth session): B's L2 traffic was not what
 *              held the tile back.
 *   auto       (the default) each GEMM on its winner (lk_moe_cuda_gg_sm90_schedule): coop,
 *              for all four since the fifteenth session. The ping-pong halves the MMA time a
 *              tile but not its operand traffic (a 128 × 128 tile reads 2/3 the bytes a FLOP of
 *              128 × 256 does more); with the epilogues on 16-byte accesses, the sigmoid on the
 *              SFU and the tile handed over by the producer, coop's unhidden epilogue costs less
 *              than that. The forward's down was pingpong_v4's until the leaner epilogues
 *              (1812aec): then coop ran it in 0.643-0.647 ms against 0.705-0.732 (H200, two
 *              rounds of bench/ab.sh, fifteenth session's call 2).
 * Measured (H200, bench/NOTES.md, every cuda_test_moe_experts case passing): fifteenth
 * session's call 4, gate/up 656, down 633 (coop), dh' 519, d_rows 692 TFLOP/s (torch._grouped_mm
 * 650 / 522 in the same run); the fourteenth's 664 / 587 / 518 / 714 (torch 675 / 501); the
 * thirteenth's 644 / 577 / 481 / 671; the ninth's 530 / 486 / 234 / 633; the first version 506 /
 * 458 / 176 / 579.
 * Count (PEERS-H200.md's shape, T 16384 · top-8 = R 131072 rows,
 * H 2048, I 768, E 128): gate/up 2·R·H·2I = 824.6 GFLOP, 1.04 ms at 790 TFLOP/s (torch's
 * 665: 1.24 ms); down 2·R·I·H = 412.3 GFLOP, 0.52 ms at 790 (torch's 519: 0.79 ms) — its
 * y (bf16: R·H·2 = 0.54 GB written; f32 was twice that) is ~0.13 ms of HBM beside it, hidden
 * only while other tiles' GEMMs run. */
#include <stdio.h>
#include <string.h>
#include "core/cuda_check.h"
#include "llmkern/config.h"
#include "llmkern/registry.h"
#include "ops/attention/hopper.cuh"
#include "ops/cuda_util.cuh"
#include "ops/moe/moe_cuda.h"

#define BM 128          /* rows a tile (grouped.cu's TM: the same tile list) */
#define BN 256          /* columns a tile */
#define BK 64           /* K a stage: 128 bytes of bf16, one swizzle row */
#define STAGES 4        /* 4 × 48 KiB of the 227 KiB a block may take */
#define THREADS 384     /* producer + two consumer warpgroups */
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define SMEM_BYTES (STAGES * (A_BYTES + B_BYTES) + 2 * STAGES * 8 + STAGES * 32 + 1024)

enum { STORE = LK_GG_STORE, SWIGLU = LK_GG_SWIGLU, DSWIGLU = LK_GG_DSWIGLU };

typedef struct {
    const lk_bf16_t *a;       /* gathered A: token rows of lda elements, row order[i] / kdiv */
    int64_t lda, kdiv;
    const int32_t *aorder;
    int64_t n, k, e;          /* n: C's columns (SWIGLU: I) */
    int ny;                   /* column tiles */
    const int64_t *offs;
    const int32_t *tiles;
    void *c;                  /* STORE: f32, or bf16 when c_bf16 */
    int64_t ldc;
    int c_bf16;
    int vec_c;                /* STORE: pairs of columns as one 8-byte (bf16: 4-byte) store */
    lk_bf16_t *keep, *h;      /* SWIGLU */
    const lk_bf16_t *gsv;     /* DSWIGLU */
    lk_bf16_t *dgu, *wh;
    float *dwp;
    int64_t dwt;
    const float *w;
    const int32_t *order;
    int64_t inter;
    const int *flag;
} sargs;

#if FA3_ARCH

/* The expert of row tile mt: the last whose first tile is <= mt. */
static __device__ __forceinline__ int64_t expert_of(const sargs &p, int32_t mt) {
    int32_t lo = 0, hi = (int32_t)p.e - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) >> 1;
        if (p.tiles[mid] <= mt) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Tile t's expert, rows [m0, mlim) and column tile nt. */
static __device__ __forceinline__ void tile_of(const sargs &p, int t, int64_t &e, int64_t &m0, int64_t &mlim,
                                               int &nt) {
    const int32_t mt = t / p.ny;
    nt = t - mt * p.ny;
    e = expert_of(p, mt);
    m0 = p.offs[e] + (int64_t)(mt - p.tiles[e]) * BM;
    mlim = p.offs[e + 1];
}

/* Work unit u of a cluster of CL CTAs (CL 1: the unit is tile u): this CTA's (rank's) row
 * tile CL·(u / ny) + rank, column tile u % ny; its expert, rows [m0, mlim). mc (CL 2): both
 * row tiles exist and share their expert, so the two CTAs share the expert's B tile (each
 * loads half, multicast to both). Past the last row tile (an odd count's last unit) a CTA
 * gets the last tile's expert and no rows: it still runs the unit's stages, the ring's
 * hand-over counting both CTAs' arrivals. */
template <int CL>
static __device__ __forceinline__ void unit_of(const sargs &p, int u, int rank, int64_t &e, int64_t &m0,
                                               int64_t &mlim, int &nt, bool &mc) {
    const int32_t rt = p.tiles[p.e], mp = u / p.ny, mt = mp * CL + rank, m = mt < rt ? mt : rt - 1;
    nt = u - mp * p.ny;
    e = expert_of(p, m);
    m0 = p.offs[e] + (int64_t)(m - p.tiles[e]) * BM;
    mlim = mt < rt ? p.offs[e + 1] : m0;
    mc = CL == 2 && mp * 2 + 1 < rt && expert_of(p, mp * 2 + (rank ^ 1)) == e;
}

/* An arrival on bar once every cp.async this thread issued so far has landed (the
 * barrier's expected count includes it: .noinc). CUTLASS's cp.async + GMMA mainloop hands
 * its stages over the same way, with no proxy fence. */
static __device__ __forceinline__ void cp_arrive_noinc(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* The gathering producer (AG): its 128 threads copy a stage's A tile from the token rows
 * of the permutation, thread (r0, c) chunk c (16 bytes) of rows r0 + 16 i. tokens_of reads
 * a tile's 8 token ids a thread once (-1 past mlim: zero-filled); gather_stage issues one
 * k-block's copies into the 128-byte swizzle and arrives on bar when they have landed. */
static __device__ __forceinline__ void tokens_of(const sargs &p, int64_t m0, int64_t mlim, int r0, int32_t *tok) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t row = m0 + r0 + 16 * i;
        tok[i] = row < mlim ? (int32_t)(p.aorder[row] / p.kdiv) : -1;
    }
}

static __device__ __forceinline__ void gather_stage(const sargs &p, uint8_t *a, const int32_t *tok, int r0, int c,
                                                    int kb, uint64_t *bar) {
    const int64_t k0 = (int64_t)kb * BK + c * 8;
    const bool kok = k0 < p.k;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = r0 + 16 * i;
        const bool ok = kok && tok[i] >= 0;
        const lk_bf16_t *src = ok ? p.a + (int64_t)tok[i] * p.lda + k0 : p.a;
        cp16(a + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
    cp_arrive_noinc(bar);
}

static __device__ __forceinline__ void st_bf16x2(lk_bf16_t *p, float lo, float hi) {
    *reinterpret_cast<uint32_t *>(p) = lk_pack_bf16x2(lo, hi);
}
/* The epilogues' sigmoid on the special-function unit: expf and an IEEE division are ~20
 * instructions with a slow path, 64 of each a thread a tile while coop's tensor cores wait; this
 * is two MUFU ops, a multiply and an add. Error a few ulp of f32, far under the bf16 the result is
 * stored in; x -> -inf gives 1/inf = 0 (silu -> -0), as the exact form does. The .ftz forms: for
 * __expf, ex2.approx without it wrapped each MUFU.EX2 in a compare and two predicated multiplies
 * (denormal results, SASS), 3 of the SWIGLU epilogue's ~11 instructions an element; a denormal
 * e^-x added to 1 rounds to 1 anyway, so the sigmoid is unchanged. */
static __device__ __forceinline__ float sigmoid_fast(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + lk_ex2(x * -1.44269504088896341f)));
    return r;
}
/* quad_transpose on packed pairs (the shuffles move bits) */
static __device__ __forceinline__ void quad_transpose_u32(uint32_t *v, int lane) {
    float f[4] = {__uint_as_float(v[0]), __uint_as_float(v[1]), __uint_as_float(v[2]), __uint_as_float(v[3])};
    quad_transpose(f, lane);
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = __float_as_uint(f[k]);
}
static __device__ __forceinline__ float2 bf16x2_f2(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}

/* STORE: C's columns col, col + 1 of row `row`, f32 or bf16 (rounded once); one store when
 * vec_c. f32 evict-first: y passes L2 once, the weights stay. */
static __device__ __forceinline__ void store_pair(const sargs &p, int64_t row, int64_t col, float a, float b) {
    const int64_t i = row * p.ldc + col;
    if (p.c_bf16) {
        lk_bf16_t *c = (lk_bf16_t *)p.c;
        if (p.vec_c) {
            st_bf16x2(c + i, a, b);
        } else {
            c[i] = __float2bfloat16_rn(a);
            if (col + 1 < p.n) c[i + 1] = __float2bfloat16_rn(b);
        }
    } else {
        float *c = (float *)p.c;
        if (p.vec_c) {
            __stcs(reinterpret_cast<float2 *>(c + i), make_float2(a, b));
        } else {
            c[i] = a;
            if (col + 1 < p.n) c[i + 1] = b;
        }
    }
}

/* V4: the 8 columns of column groups 4g .. 4g + 3 of an m64 fragment's row half hf that this
 * lane stores (group 4g + lane % 4): acc is the m64 block's accumulators, d0[k] / d1[k] the
 * columns 2k / 2k + 1 after the quad transpose. */
static __device__ __forceinline__ void row8_of(const float *acc, int g, int hf, int lane, float *d0, float *d1) {
#pragma unroll
    for (int jj = 0; jj < 4; jj++) d0[jj] = acc[4 * (4 * g + jj) + 2 * hf], d1[jj] = acc[4 * (4 * g + jj) + 2 * hf + 1];
    quad_transpose(d0, lane), quad_transpose(d1, lane);
}

/* STORE, V4: a row's 8 columns col.. (all in C: n a multiple of 8), d0[k] / d1[k] = columns
 * col + 2k / + 1 (quad_transpose's output): two 16-byte f32 stores or one of bf16. */
static __device__ __forceinline__ void store_row8(const sargs &p, int64_t row, int64_t col, const float *d0,
                                                  const float *d1) {
    if (p.c_bf16) {
        st_global_v4((lk_bf16_t *)p.c + row * p.ldc + col, lk_pack_bf16x2(d0[0], d1[0]), lk_pack_bf16x2(d0[1], d1[1]),
                     lk_pack_bf16x2(d0[2], d1[2]), lk_pack_bf16x2(d0[3], d1[3]));
    } else {
        float4 *dst = reinterpret_cast<float4 *>((float *)p.c + row * p.ldc + col);
        __stcs(dst, make_float4(d0[0], d1[0], d0[1], d1[1]));
        __stcs(dst + 1, make_float4(d0[2], d1[2], d0[3], d1[3]));
    }
}

/* DSWIGLU, V4: the saved gate / up of a row's 8-column groups at columns j0 + 32·g, g < 4 (I a
 * multiple of 8: a group all in or all out), zeros where out or !rok. */
static __device__ __forceinline__ void saved_gu4(const sargs &p, int64_t row, bool rok, int64_t j0, uint4 *gv,
                                                 uint4 *uv) {
    const int64_t I = p.inter;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const int64_t j = j0 + 32 * g;
        const bool ok = rok && j < I;
        gv[g] = ok ? __ldg(reinterpret_cast<const uint4 *>(p.gsv + row * 2 * I + j)) : make_uint4(0, 0, 0, 0);
        uv[g] = ok ? __ldg(reinterpret_cast<const uint4 *>(p.gsv + row * 2 * I + I + j)) : make_uint4(0, 0, 0, 0);
    }
}

/* DSWIGLU, V4: a row's 8 columns j.. (I a multiple of 8: all in C), d0[k] / d1[k] = dh' of
 * columns j + 2k / + 1 (quad_transpose's output), gv / uv their saved gate / up: d_gate_up and
 * w·h stored 16 bytes at a time (NaN where wr is: bad ids); returns the 8 columns' Σ dh'·h (h
 * unweighted). */
static __device__ __forceinline__ float dswiglu_row8(const sargs &p, int64_t row, int64_t j, const float *d0,
                                                     const float *d1, uint4 gv, uint4 uv, float wr) {
    const int64_t I = p.inter;
    const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
    uint32_t og[4], ou[4], oh[4];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 gt = bf16x2_f2(gw[k]), up = bf16x2_f2(uw[k]);
        float dg[2], du[2], whv[2];
#pragma unroll
        for (int y = 0; y < 2; y++) {
            const float g = y ? gt.y : gt.x, u = y ? up.y : up.x, dhp = y ? d1[k] : d0[k];
            const float sg = sigmoid_fast(g), silu = g * sg, hv = silu * u, dh = wr * dhp;
            dg[y] = dh * u * sg * (1.0f + g * (1.0f - sg)), du[y] = dh * silu, whv[y] = wr * hv;
            dot += dhp * hv;
        }
        og[k] = lk_pack_bf16x2(dg[0], dg[1]), ou[k] = lk_pack_bf16x2(du[0], du[1]);
        oh[k] = lk_pack_bf16x2(whv[0], whv[1]);
    }
    st_global_v4(p.dgu + row * 2 * I + j, og[0], og[1], og[2], og[3]);
    st_global_v4(p.dgu + row * 2 * I + I + j, ou[0], ou[1], ou[2], ou[3]);
    st_global_v4(p.wh + row * I + j, oh[0], oh[1], oh[2], oh[3]);
    return dot;
}

/* d[m64 x n128] (+)= A · B (acc 0: =), both from shared memory: A K-major; B K-major (TB 0)
 * or N-major (TB 1). hopper.cuh's wgmma_ss_n128 with the transpose bit free: the ping-pong
 * tile's instruction. */
template <int TB>
static __device__ __forceinline__ void wgmma_ss_n128_tb(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(acc), "n"(TB));
}

#endif

/* Accumulator register e of an m64n256 fragment (consumer warpgroup cg, warp w, lane):
 * row cg·64 + w·16 + lane / 4 + 8·((e >> 1) & 1) of the tile, column 8·(e / 4) +
 * 2·(lane % 4) + (e & 1). AG: A gathered (cp.async); BKM: B K-major. V4 (every epilogue,
 * rows 16-byte aligned): a row's 8 columns a lane, 16-byte accesses, as gg_sm90_pp's V4. */
template <int EPI, bool AG, bool BKM, bool V4 = false, int CL = 1>
__global__ void __launch_bounds__(THREADS, 1) gg_sm90(const __grid_constant__ CUtensorMap ta,
                                                      const __grid_constant__ CUtensorMap tb, sargs p) {
#if FA3_ARCH
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sa = sm, *sb = sa + STAGES * A_BYTES;
    uint64_t *full = (uint64_t *)(sb + STAGES * B_BYTES), *empty = full + STAGES;
    int64_t *tinfo = (int64_t *)(empty + STAGES);   /* [stage][4]: m0, mlim, nt of the tile a stage begins */
    const int tid = threadIdx.x, wg = tid / 128;
    const int units = (p.tiles[p.e] + CL - 1) / CL * p.ny, nk = (int)((p.k + BK - 1) / BK);
    const int rank = CL > 1 ? (int)cluster_rank() : 0, cid = blockIdx.x / CL, ncl = gridDim.x / CL;

    if (tid == 0) {   /* empty: CL 1, every consumer thread; CL 2, each consumer warp of both CTAs */
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], AG ? 129 : 1), mbar_init(&empty[s], CL > 1 ? 8 * CL : 256);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL > 1) cluster_sync();   /* the peer's barriers are initialized before any multicast */
    else __syncthreads();

    if (wg == 0) {   /* --- producer ------------------------------------------------------ */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        if (!AG && tid != 0) return;
        constexpr uint32_t bytes = B_BYTES + (AG ? 0 : A_BYTES);
        const int c = tid & 7, r0 = tid >> 3;   /* gathering: chunk c of rows r0 + 16 i */
        int it = 0;
        for (int u = cid; u < units; u += ncl) {
            int64_t e, m0, mlim;
            int nt;
            bool mc;
            unit_of<CL>(p, u, rank, e, m0, mlim, nt, mc);
            int32_t tok[AG ? 8 : 1];
            if (AG) tokens_of(p, m0, mlim, r0, tok);
            for (int kb = 0; kb < nk; kb++, it++) {
                const int s = it % STAGES;
                if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
                uint8_t *a = sa + s * A_BYTES, *b = sb + s * B_BYTES;
                if (tid == 0) {
                    if (kb == 0) tinfo[4 * s] = m0, tinfo[4 * s + 1] = mlim, tinfo[4 * s + 2] = nt;
                    mbar_expect_tx(&full[s], bytes);   /* releases tinfo[s] with the stage */
                    if (!AG) tma_load(a, &ta, &full[s], kb * BK, (int)m0, 0);
                    if (BKM) {   /* two boxes of 128 rows: SWIGLU gate j0.. and up I + j0.. */
                        const int r1 = EPI == SWIGLU ? nt * (BN / 2) : nt * BN;
                        const int r2 = EPI == SWIGLU ? (int)p.inter + r1 : r1 + BN / 2;
                        if (mc) {   /* this CTA's box into both */
                            tma_load_mc(b + rank * (B_BYTES / 2), &tb, &full[s], kb * BK, rank ? r2 : r1, (int)e, 3);
                        } else {
                            tma_load(b, &tb, &full[s], kb * BK, r1, (int)e);
                            tma_load(b + B_BYTES / 2, &tb, &full[s], kb * BK, r2, (int)e);
                        }
                    } else {     /* four 64-column blocks of 64 k-rows (mc: blocks 2·rank, + 1 into both) */
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            if (!mc) tma_load(b + j * (BK * 128), &tb, &full[s], nt * BN + 64 * j, kb * BK, (int)e);
                            else if (j / 2 == rank)
                                tma_load_mc(b + j * (BK * 128), &tb, &full[s], nt * BN + 64 * j, kb * BK, (int)e, 3);
                        }
                    }
                }
                if (AG) gather_stage(p, a, tok, r0, c, kb, &full[s]);
            }
        }
        if (AG) cp_wait<0>();
        return;
    }

    /* --- consumers -------------------------------------------------------------------- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int cg = wg - 1, w = (tid % 128) / 32, lane = tid % 32;
    const int rl = cg * 64 + w * 16 + lane / 4;   /* this thread's rows: rl and rl + 8 of the tile */
    float acc[BN / 2];
    int it = 0;
    const bool bad = (EPI == SWIGLU || EPI == DSWIGLU) && *p.flag != 0;
    /* a stage goes back to its producers: CL 2, one arrival a warp on each CTA's barrier (the
     * peer's producer multicasts into this CTA's stage too) */
    auto release = [&](int s) {
        if constexpr (CL == 1) mbar_arrive(&empty[s]);
        else if (lane == 0)
            for (int r = 0; r < CL; r++) mbar_arrive_cta(&empty[s], r);
    };
    for (int u = cid; u < units; u += ncl) {
        int64_t m0 = 0, mlim = 0;
        int nt = 0;
        float wr[2] = {0.0f, 0.0f};
        int32_t ord[2] = {-1, -1};
        for (int kb = 0; kb < nk; kb++, it++) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            if (kb == 0)   /* the tile, from the producer: its search over the experts (a chain of
                            * dependent loads) stays off this path, where the tensor cores wait */
                m0 = tinfo[4 * s], mlim = tinfo[4 * s + 1], nt = (int)tinfo[4 * s + 2];
            const uint8_t *a = sa + s * A_BYTES + cg * 64 * 128, *b = sb + s * B_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t da = desc(a + kk * 32, 16, 1024);
                const uint64_t db = BKM ? desc(b + kk * 32, 16, 1024) : desc(b + kk * 2048, BK * 128, 1024);
                wgmma_ss_n256<BKM ? 0 : 1>(acc, da, db, kb > 0 || kk > 0);
            }
            wgmma_commit();
            if constexpr (EPI != STORE) {   /* (D)SWIGLU: the rows' routing weights, order[] under this
                                             * stage's MMAs, w[] under the next's, not at the epilogue */
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int64_t row = m0 + rl + 8 * hf;
                    if (kb == 0 && row < mlim) ord[hf] = p.order[row];
                    if (kb == (nk > 1) && ord[hf] >= 0) wr[hf] = p.w[ord[hf]];
                }
            }
            if (kb > 0) {   /* the previous stage's group is done: its stage goes back */
                wgmma_wait<1>();
                release((it - 1) % STAGES);
            }
        }
        wgmma_wait<0>();
        fence_regs<BN / 2>(acc);
        release((it - 1) % STAGES);

        /* --- epilogue: registers to global memory --- */
        if (bad) wr[0] = wr[1] = __int_as_float(0x7fffffff);   /* bad ids: NaN through every h, d_gate_up, w·h */
        const int64_t rows[2] = {m0 + rl, m0 + rl + 8};
        const int cq = 2 * (lane % 4);
        if constexpr (EPI == STORE && V4) {   /* a row's 8 columns a lane (SWIGLU V4's order) */
            const int64_t n0 = (int64_t)nt * BN;
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
#pragma unroll
                for (int g = 0; g < BN / 32; g++) {
                    float d0[4], d1[4];
                    row8_of(acc, g, hf, lane, d0, d1);
                    const int64_t col = n0 + 8 * (4 * g + lane % 4);   /* n a multiple of 8: all 8 in or out */
                    if (rows[hf] < mlim && col < p.n) store_row8(p, rows[hf], col, d0, d1);
                }
        } else if constexpr (EPI == STORE) {
            const int64_t n0 = (int64_t)nt * BN;
#pragma unroll
            for (int q = 0; q < BN / 2; q += 2) {
                const int64_t row = rows[(q >> 1) & 1], col = n0 + 8 * (q / 4) + cq;
                if (row < mlim && col < p.n) store_pair(p, row, col, acc[q], acc[q + 1]);
            }
        } else if constexpr (EPI == SWIGLU && V4) {   /* a row's 8 columns a lane: three 16-byte stores */
            const int64_t I = p.inter, jl = (int64_t)nt * (BN / 2) + 8 * (lane % 4);   /* this lane's first column */
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const bool rok = rows[hf] < mlim;
                lk_bf16_t *kr = p.keep + (rok ? rows[hf] * 2 * I + jl : 0), *hr = p.h + (rok ? rows[hf] * I + jl : 0);
#pragma unroll
                for (int g = 0; g < 4; g++) {   /* gate column groups 4g .. 4g + 3 (their up: 16 groups on) */
                    /* h where the accumulators lie (a gate and its up are one thread's), then the
                     * packed bf16 pairs transposed: three quad transposes where four of f32 were */
                    uint32_t kg[4], ku[4], hv[4];
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        const int q = 4 * (4 * g + jj) + 2 * hf;
                        const float g0 = acc[q], g1 = acc[q + 1], u0 = acc[q + BN / 4], u1 = acc[q + 1 + BN / 4];
                        kg[jj] = lk_pack_bf16x2(g0, g1), ku[jj] = lk_pack_bf16x2(u0, u1);
                        float h0 = wr[hf] * (g0 * sigmoid_fast(g0)) * u0, h1 = wr[hf] * (g1 * sigmoid_fast(g1)) * u1;
                        hv[jj] = lk_pack_bf16x2(h0, h1);
                    }
                    quad_transpose_u32(kg, lane), quad_transpose_u32(ku, lane), quad_transpose_u32(hv, lane);
                    if (!rok || jl + 32 * g >= I) continue;   /* I a multiple of 8: a lane's 8 all in or out */
                    st_global_v4(kr + 32 * g, kg[0], kg[1], kg[2], kg[3]);
                    st_global_v4(kr + I + 32 * g, ku[0], ku[1], ku[2], ku[3]);
                    st_global_v4(hr + 32 * g, hv[0], hv[1], hv[2], hv[3]);
                }
            }
        } else if constexpr (EPI == SWIGLU) {
            const int64_t I = p.inter, j0 = (int64_t)nt * (BN / 2);
#pragma unroll
            for (int q = 0; q < BN / 4; q += 2) {
                const int hf = (q >> 1) & 1;
                const int64_t row = rows[hf], j = j0 + 8 * (q / 4) + cq;   /* I a multiple of 8 (_takes): j + 1 < I too */
                if (row >= mlim || j >= I) continue;
                const float g0 = acc[q], g1 = acc[q + 1], u0 = acc[q + BN / 4], u1 = acc[q + 1 + BN / 4];
                st_bf16x2(p.keep + row * 2 * I + j, g0, g1);
                st_bf16x2(p.keep + row * 2 * I + I + j, u0, u1);
                float h0 = wr[hf] * (g0 * sigmoid_fast(g0)) * u0, h1 = wr[hf] * (g1 * sigmoid_fast(g1)) * u1;
                st_bf16x2(p.h + row * I + j, h0, h1);
            }
        } else if constexpr (V4) {   /* DSWIGLU on 16-byte accesses, a row's 8 columns a lane (gg_sm90_pp's V4) */
            const int64_t I = p.inter, n0 = (int64_t)nt * BN;
            const int l = lane % 4;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int64_t row = rows[hf];
                const bool rok = row < mlim;
#pragma unroll
                for (int half = 0; half < 2; half++) {   /* 128 columns: dw_part's slot 2·nt + half */
                    uint4 gv[4], uv[4];   /* the saved gate/up of the lane's 8 columns of groups 4g + l */
                    saved_gu4(p, row, rok, n0 + 8 * (16 * half + l), gv, uv);
                    float dot = 0.0f;
#pragma unroll
                    for (int g = 0; g < 4; g++) {
                        const int gg4 = 4 * half + g;
                        float d0[4], d1[4];
                        row8_of(acc, gg4, hf, lane, d0, d1);
                        const int64_t j = n0 + 8 * (4 * gg4 + l);
                        if (!rok || j >= I) continue;
                        dot += dswiglu_row8(p, row, j, d0, d1, gv[g], uv[g], wr[hf]);
                    }
                    dot += __shfl_xor_sync(0xffffffffu, dot, 1);   /* the row's 128 columns: its quad */
                    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                    const int64_t slot = 2 * (int64_t)nt + half;
                    if (p.dwp && l == 0 && rok && slot < p.dwt)
                        p.dwp[row * p.dwt + slot] = bad ? __int_as_float(0x7fffffff) : dot;
                }
            }
        } else {   /* DSWIGLU */
            const int64_t I = p.inter, n0 = (int64_t)nt * BN;
            float dot[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};   /* [128-column half][row] */
            /* the saved gate/up of 16 column pairs loaded together before any store (a store
             * to dgu might alias gsv for all the compiler knows, which would serialize each
             * load behind the previous pair's stores: 176 TFLOP/s in the first version) */
#pragma unroll
            for (int q0 = 0; q0 < BN / 2; q0 += 32) {
                uint32_t gv[16], uv[16];
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int q = q0 + 2 * i;
                    const int64_t row = rows[(q >> 1) & 1], j = n0 + 8 * (q / 4) + cq;
                    const bool ok = row < mlim && j < I;
                    gv[i] = ok ? __ldg(reinterpret_cast<const unsigned int *>(p.gsv + row * 2 * I + j)) : 0u;
                    uv[i] = ok ? __ldg(reinterpret_cast<const unsigned int *>(p.gsv + row * 2 * I + I + j)) : 0u;
                }
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int q = q0 + 2 * i, hf = (q >> 1) & 1, half = q >= BN / 4;
                    const int64_t row = rows[hf], j = n0 + 8 * (q / 4) + cq;
                    if (row >= mlim || j >= I) continue;
                    const float2 gt = bf16x2_f2(gv[i]), up = bf16x2_f2(uv[i]);
                    float dg[2], du[2], whv[2];
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const float g = x ? gt.y : gt.x, u = x ? up.y : up.x, dhp = acc[q + x];
                        const float sg = sigmoid_fast(g), silu = g * sg, hv = silu * u, dh = wr[hf] * dhp;
                        dg[x] = dh * u * sg * (1.0f + g * (1.0f - sg)), du[x] = dh * silu, whv[x] = wr[hf] * hv;
                        dot[half][hf] += dhp * hv;
                    }
                    st_bf16x2(p.dgu + row * 2 * I + j, dg[0], dg[1]);
                    st_bf16x2(p.dgu + row * 2 * I + I + j, du[0], du[1]);
                    st_bf16x2(p.wh + row * I + j, whv[0], whv[1]);
                }
            }
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {   /* the 4 lanes of a row, every lane taking part */
                    float d = dot[half][hf];
                    d += __shfl_xor_sync(0xffffffffu, d, 1);
                    d += __shfl_xor_sync(0xffffffffu, d, 2);
                    const int64_t slot = 2 * (int64_t)nt + half;
                    if (p.dwp && lane % 4 == 0 && rows[hf] < mlim && slot < p.dwt)
                        p.dwp[rows[hf] * p.dwt + slot] = bad ? __int_as_float(0x7fffffff) : d;
                }
        }
    }
    if constexpr (CL > 1) cluster_sync();   /* the peer's arrivals on this CTA's barriers are done */
#endif
}

/* --- ping-pong: each consumer warpgroup owns a whole tile ------------------------------
 * The variant LLMKERN_GG_SM90=pingpong selects (lk_moe_cuda_gg_sm90_variant in the tests).
 * The CTA's tiles alternate between the two consumer warpgroups, each tile 128 rows × 128
 * columns (SWIGLU: 64 gate + 64 up columns), two wgmma.m64n128k16 a k16 step (the same 128
 * f32 accumulators a thread as the cooperative 64 × 256); the producer fills one ring in
 * tile order, so warpgroup 2's tile starts when warpgroup 1's last stages are issued, and
 * one warpgroup's epilogue runs under the other's mainloop (CUTLASS's Pingpong schedule).
 * The mainloops take turns by two named barriers (`order`: a warpgroup starts tile i once the
 * other has issued tile i - 1's last stage): besides keeping the turns, that is what keeps
 * each `full` wait within one phase of the barrier (warpgroup 2 waiting on its first stage
 * while that stage's barrier still held tile 0's fill would read parity as done). A stage is
 * A 16 KiB + B 16 KiB, PSTAGES of them. Accumulator register q: m block q / 64 (tile rows 64·(q / 64) ..), and
 * within it e = q % 64 as the m64 fragment: row w·16 + lane / 4 + 8·((e >> 1) & 1), column
 * 8·(e / 4) + 2·(lane % 4) + (e & 1). */
#define PN 128                                   /* columns a ping-pong tile */
#define PSTAGES 7                                /* 7 × 32 KiB of the 227 KiB */
#define PB_BYTES (PN * BK * 2)
#ifndef PEB
#define PEB 8                                    /* DSWIGLU: column pairs loaded at once (16: 96 bytes spilled) */
#endif
#define PSMEM_BYTES (PSTAGES * (A_BYTES + PB_BYTES) + 2 * PSTAGES * 8 + 1024)

#if FA3_ARCH
/* The consumer warpgroups' turns: named barrier 2 + cg, 256 threads (warpgroup cg waits, the
 * other arrives). */
static __device__ __forceinline__ void order_wait(int cg) { asm volatile("bar.sync %0, 256;" ::"r"(2 + cg) : "memory"); }
static __device__ __forceinline__ void order_pass(int cg) {
    asm volatile("bar.arrive %0, 256;" ::"r"(3 - cg) : "memory");
}
#endif

/* V4 (DSWIGLU and STORE, LLMKERN_GG_SM90=pingpong_v4): the epilogue on 16-byte accesses, each
 * lane 8 consecutive columns of a row after a quad transpose of the accumulators: a quarter
 * of the memory instructions of the pair-wise one for DSWIGLU (320 a thread there), half for
 * the f32 store (64), each warp instruction whole 64- or 128-byte row pieces. The DSWIGLU
 * stores were four 4-byte ones each until st_global_v4 (NVVM split the uint4 stores; its
 * measured +46% against coop came from the 16-byte loads and the ping-pong). */
template <int EPI, bool AG, bool BKM, bool V4 = false>
__global__ void __launch_bounds__(THREADS, 1) gg_sm90_pp(const __grid_constant__ CUtensorMap ta,
                                                         const __grid_constant__ CUtensorMap tb, sargs p) {
#if FA3_ARCH
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    uint8_t *sa = sm, *sb = sa + PSTAGES * A_BYTES;
    uint64_t *full = (uint64_t *)(sb + PSTAGES * PB_BYTES), *empty = full + PSTAGES;
    const int tid = threadIdx.x, wg = tid / 128;
    const int total = p.tiles[p.e] * p.ny, nk = (int)((p.k + BK - 1) / BK);

    if (tid == 0) {
        for (int s = 0; s < PSTAGES; s++) mbar_init(&full[s], AG ? 129 : 1), mbar_init(&empty[s], 128);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   /* --- producer: every tile of the CTA, in order, into one ring ------- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        if (!AG && tid != 0) return;
        constexpr uint32_t bytes = PB_BYTES + (AG ? 0 : A_BYTES);
        const int c = tid & 7, r0 = tid >> 3;   /* gathering: chunk c of rows r0 + 16 i */
        int it = 0;
        for (int t = blockIdx.x; t < total; t += gridDim.x) {
            int64_t e, m0, mlim;
            int nt;
            tile_of(p, t, e, m0, mlim, nt);
            int32_t tok[AG ? 8 : 1];
            if (AG) tokens_of(p, m0, mlim, r0, tok);
            for (int kb = 0; kb < nk; kb++, it++) {
                const int s = it % PSTAGES;
                if (it >= PSTAGES) mbar_wait(&empty[s], ((it / PSTAGES) - 1) & 1);
                uint8_t *a = sa + s * A_BYTES, *b = sb + s * PB_BYTES;
                if (tid == 0) {
                    mbar_expect_tx(&full[s], bytes);
                    if (!AG) tma_load(a, &ta, &full[s], kb * BK, (int)m0, 0);
                    if (BKM) {   /* two boxes of 64 rows: SWIGLU gate j0.. and up I + j0.. */
                        const int r1 = EPI == SWIGLU ? nt * (PN / 2) : nt * PN;
                        const int r2 = EPI == SWIGLU ? (int)p.inter + r1 : r1 + PN / 2;
                        tma_load(b, &tb, &full[s], kb * BK, r1, (int)e);
                        tma_load(b + PB_BYTES / 2, &tb, &full[s], kb * BK, r2, (int)e);
                    } else {     /* two 64-column blocks of 64 k-rows */
#pragma unroll
                        for (int j = 0; j < PN / 64; j++)
                            tma_load(b + j * (BK * 128), &tb, &full[s], nt * PN + 64 * j, kb * BK, (int)e);
                    }
                }
                if (AG) gather_stage(p, a, tok, r0, c, kb, &full[s]);
            }
        }
        if (AG) cp_wait<0>();
        return;
    }

    /* --- consumers: warpgroup cg takes the CTA's tiles cg, cg + 2, ... --------------- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    const int cg = wg - 1, w = (tid % 128) / 32, lane = tid % 32;
    const int rl = w * 16 + lane / 4;   /* this thread's rows: rl, rl + 8, 64 + rl, 72 + rl of the tile */
    const int cq = 2 * (lane % 4);
    float acc[PN];
    const bool bad = (EPI == SWIGLU || EPI == DSWIGLU) && *p.flag != 0;
    for (int i = cg, t = blockIdx.x + cg * gridDim.x; t < total; i += 2, t += 2 * gridDim.x) {
        int64_t e, m0, mlim;
        int nt;
        tile_of(p, t, e, m0, mlim, nt);
        int32_t rows[4];   /* [m block · 2 + hf]; rows <= INT32_MAX (lk_moe_cuda_gg_sm90_takes) */
#pragma unroll
        for (int x = 0; x < 4; x++) rows[x] = (int32_t)m0 + 64 * (x >> 1) + rl + 8 * (x & 1);
        float wr[4] = {0.0f, 0.0f, 0.0f, 0.0f};   /* (D)SWIGLU: the rows' routing weights, under the K loop */
        if constexpr (EPI != STORE) {
#pragma unroll
            for (int x = 0; x < 4; x++)
                if (rows[x] < mlim) wr[x] = bad ? __int_as_float(0x7fffffff) : p.w[p.order[rows[x]]];
        }
        int it = i * nk;   /* the ring's count at this tile's first stage */
        if (i > 0) order_wait(cg);   /* the other warpgroup has issued tile i - 1's last stage */
        for (int kb = 0; kb < nk; kb++, it++) {
            const int s = it % PSTAGES;
            mbar_wait(&full[s], (it / PSTAGES) & 1);
            const uint8_t *a = sa + s * A_BYTES, *b = sb + s * PB_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t db = BKM ? desc(b + kk * 32, 16, 1024) : desc(b + kk * 2048, BK * 128, 1024);
#pragma unroll
                for (int mb = 0; mb < 2; mb++)
                    wgmma_ss_n128_tb<BKM ? 0 : 1>(acc + 64 * mb, desc(a + mb * 64 * 128 + kk * 32, 16, 1024), db,
                                                  kb > 0 || kk > 0);
            }
            wgmma_commit();
            if (kb > 0) {   /* the previous stage's group is done: its stage goes back */
                wgmma_wait<1>();
                mbar_arrive(&empty[(it - 1) % PSTAGES]);
            }
        }
        if (t + gridDim.x < total) order_pass(cg);   /* tile i + 1's turn */
        wgmma_wait<0>();
        fence_regs<PN>(acc);
        mbar_arrive(&empty[(it - 1) % PSTAGES]);

        /* --- epilogue (under the other warpgroup's mainloop): registers to global memory --- */
        if constexpr (EPI == STORE && V4) {   /* a row's 8 columns a lane: two 16-byte stores */
            const int64_t n0 = (int64_t)nt * PN;
#pragma unroll
            for (int x = 0; x < 4; x++) {   /* [m block · 2 + hf] */
                const int mb = x >> 1, hf = x & 1;
                const int64_t row = rows[x];
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    float d0[4], d1[4];
                    row8_of(acc + 64 * mb, g, hf, lane, d0, d1);
                    const int64_t col = n0 + 8 * (4 * g + lane % 4);   /* n a multiple of 8: all 8 in or out */
                    if (row < mlim && col < p.n) store_row8(p, row, col, d0, d1);
                }
            }
        } else if constexpr (EPI == STORE) {
            const int64_t n0 = (int64_t)nt * PN;
#pragma unroll
            for (int q = 0; q < PN; q += 2) {
                const int mb = q >> 6, ef = q & 63;
                const int64_t row = rows[2 * mb + ((ef >> 1) & 1)], col = n0 + 8 * (ef / 4) + cq;
                if (row < mlim && col < p.n) store_pair(p, row, col, acc[q], acc[q + 1]);
            }
        } else if constexpr (EPI == SWIGLU) {
            const int64_t I = p.inter, j0 = (int64_t)nt * (PN / 2);
#pragma unroll
            for (int mb = 0; mb < 2; mb++)
#pragma unroll
                for (int ef = 0; ef < 32; ef += 2) {   /* gate: registers 0..31 of the block, up: 32..63 */
                    const int x = 2 * mb + ((ef >> 1) & 1), q = 64 * mb + ef;
                    const int64_t row = rows[x], j = j0 + 8 * (ef / 4) + cq;   /* I a multiple of 8 (_takes): j + 1 < I too */
                    if (row >= mlim || j >= I) continue;
                    const float g0 = acc[q], g1 = acc[q + 1], u0 = acc[q + 32], u1 = acc[q + 33];
                    st_bf16x2(p.keep + row * 2 * I + j, g0, g1);
                    st_bf16x2(p.keep + row * 2 * I + I + j, u0, u1);
                    float h0 = wr[x] * (g0 * sigmoid_fast(g0)) * u0, h1 = wr[x] * (g1 * sigmoid_fast(g1)) * u1;
                    st_bf16x2(p.h + row * I + j, h0, h1);
                }
        } else if constexpr (V4) {   /* DSWIGLU on 16-byte accesses: a row's 8 columns a lane */
            const int64_t I = p.inter, n0 = (int64_t)nt * PN;
            const int l = lane % 4;
#pragma unroll
            for (int x = 0; x < 4; x++) {   /* [m block · 2 + hf] */
                const int mb = x >> 1, hf = x & 1;
                const int64_t row = rows[x];
                const bool rok = row < mlim;
                const float wrx = wr[x];
                uint4 gv[4], uv[4];   /* the saved gate/up of the lane's 8 columns of groups 4g + l, g < 4 */
                saved_gu4(p, row, rok, n0 + 8 * l, gv, uv);
                float dot = 0.0f;
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    float d0[4], d1[4];
                    row8_of(acc + 64 * mb, g, hf, lane, d0, d1);
                    const int64_t j = n0 + 8 * (4 * g + l);
                    if (!rok || j >= I) continue;
                    dot += dswiglu_row8(p, row, j, d0, d1, gv[g], uv[g], wrx);
                }
                dot += __shfl_xor_sync(0xffffffffu, dot, 1);   /* the row's 128 columns: its quad */
                dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                if (p.dwp && l == 0 && rok && nt < p.dwt)
                    p.dwp[row * p.dwt + nt] = bad ? __int_as_float(0x7fffffff) : dot;
            }
        } else {   /* DSWIGLU: the tile's 128 columns are dw_part's slot nt; one m block at a time */
            const int64_t I = p.inter, n0 = (int64_t)nt * PN;
#pragma unroll
            for (int mb = 0; mb < 2; mb++) {
                float dot[2] = {0.0f, 0.0f};
                /* the saved gate/up of PEB column pairs loaded together before any store (as in gg_sm90) */
#pragma unroll
                for (int e0 = 0; e0 < 64; e0 += 2 * PEB) {
                    uint32_t gv[PEB], uv[PEB];
#pragma unroll
                    for (int u = 0; u < PEB; u++) {
                        const int ef = e0 + 2 * u;
                        const int64_t row = rows[2 * mb + ((ef >> 1) & 1)], j = n0 + 8 * (ef / 4) + cq;
                        const bool ok = row < mlim && j < I;
                        gv[u] = ok ? __ldg(reinterpret_cast<const unsigned int *>(p.gsv + row * 2 * I + j)) : 0u;
                        uv[u] = ok ? __ldg(reinterpret_cast<const unsigned int *>(p.gsv + row * 2 * I + I + j)) : 0u;
                    }
#pragma unroll
                    for (int u = 0; u < PEB; u++) {
                        const int ef = e0 + 2 * u, hf = (ef >> 1) & 1, q = 64 * mb + ef;
                        const int64_t row = rows[2 * mb + hf], j = n0 + 8 * (ef / 4) + cq;
                        if (row >= mlim || j >= I) continue;
                        const float2 gt = bf16x2_f2(gv[u]), up = bf16x2_f2(uv[u]);
                        float dg[2], du[2], whv[2];
#pragma unroll
                        for (int y = 0; y < 2; y++) {
                            const float g = y ? gt.y : gt.x, uu = y ? up.y : up.x, dhp = acc[q + y];
                            const float sg = sigmoid_fast(g), silu = g * sg, hv = silu * uu, dh = wr[2 * mb + hf] * dhp;
                            dg[y] = dh * uu * sg * (1.0f + g * (1.0f - sg)), du[y] = dh * silu, whv[y] = wr[2 * mb + hf] * hv;
                            dot[hf] += dhp * hv;
                        }
                        st_bf16x2(p.dgu + row * 2 * I + j, dg[0], dg[1]);
                        st_bf16x2(p.dgu + row * 2 * I + I + j, du[0], du[1]);
                        st_bf16x2(p.wh + row * I + j, whv[0], whv[1]);
                    }
                }
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {   /* the 4 lanes of a row, every lane taking part */
                    const int32_t row = rows[2 * mb + hf];
                    float d = dot[hf];
                    d += __shfl_xor_sync(0xffffffffu, d, 1);
                    d += __shfl_xor_sync(0xffffffffu, d, 2);
                    if (p.dwp && lane % 4 == 0 && row < mlim && nt < p.dwt)
                        p.dwp[(int64_t)row * p.dwt + nt] = bad ? __int_as_float(0x7fffffff) : d;
                }
            }
        }
    }
#endif
}

/* --- host ---------------------------------------------------------------------------- */

/* 16-byte aligned base, row and expert strides in whole 16-byte chunks (TMA's and
 * cp.async's rule), K a multiple of 8 (a chunk all in or all out). */
static int tma_ok(const lk_gg_operand *o) {
    return lk_aligned16(o->src) && o->ld % 8 == 0 && o->e_stride % 8 == 0;
}

extern "C" int lk_moe_cuda_gg_sm90_takes(const lk_gg *g) {
    if (g->dt != LK_BF16 || g->mode != LK_GG_ROWS || !g->a.kmajor || g->k < 8 || g->k % 8 || g->k > INT32_MAX ||
        g->rows > INT32_MAX || g->experts > INT32_MAX || !tma_ok(&g->a) || !tma_ok(&g->b) || g->a.e_stride != 0)
        return 0;
    switch (g->epi) {
    case LK_GG_STORE:   /* y = h · Wd_e, d_rows = d_gate_up · Wgu_e */
        return !g->a.order && (g->c_dt == LK_F32 || g->c_dt == LK_BF16) && g->n <= INT32_MAX;
    case LK_GG_SWIGLU: return g->b.kmajor && g->a.order && g->inter % 8 == 0 && 2 * g->inter <= INT32_MAX;
    case LK_GG_DSWIGLU: return !g->b.kmajor && g->a.order && g->inter % 8 == 0 && g->inter <= INT32_MAX;
    default: return 0;
    }
}

/* hopper.cuh's encoder speaks for flash_attention_3: its words, under this op's name */
static lk_status map_error(lk_status s) {
    char why[256];
    snprintf(why, sizeof why, "%s", lk_last_error());
    return lk_error(s, "moe_experts: grouped gemm (sm90): tensor map: %s", why);
}

/* The coop V4 kernel on clusters of two CTAs: as many clusters as fit at once (the
 * occupancy query once a process), at most one a unit of two row tiles. */
template <int EPI, bool AG, bool BKM>
static lk_status launch_cluster(const CUtensorMap &ta, const CUtensorMap &tb, const sargs &p, int grid,
                                cudaStream_t st) {
    static int fit;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 2, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = SMEM_BYTES, cfg.stream = st, cfg.attrs = &at, cfg.numAttrs = 1;
    if (!fit) {
        LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90<EPI, AG, BKM, true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         SMEM_BYTES));
        cfg.gridDim = dim3(2 * (unsigned)grid);
        LK_CUDA_TRY(cudaOccupancyMaxActiveClusters(&fit, gg_sm90<EPI, AG, BKM, true, 2>, &cfg));
        if (fit < 1) return lk_error(LK_EDEVICE, "moe_experts: grouped gemm (sm90): no cluster of two CTAs fits");
    }
    const int clusters = (grid + 1) / 2 < fit ? (grid + 1) / 2 : fit;
    cfg.gridDim = dim3(2 * (unsigned)clusters);
    LK_CUDA_TRY(cudaLaunchKernelEx(&cfg, gg_sm90<EPI, AG, BKM, true, 2>, ta, tb, p));
    return LK_OK;
}

template <int EPI, bool AG, bool BKM>
static lk_status launch(const CUtensorMap &ta, const CUtensorMap &tb, const sargs &p, int grid, int pp, int v4, int cl,
                        cudaStream_t st) {
    static int opted[4];   /* once a process: a host-side attribute, no stream work (fa3.cu sets its own per call, captured too) */
    if (cl == 2 && v4) return launch_cluster<EPI, AG, BKM>(ta, tb, p, grid, st);
    if constexpr (EPI == DSWIGLU || EPI == STORE) {
        if (pp && v4) {
            if (!opted[2]) {
                LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90_pp<EPI, AG, BKM, true>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, PSMEM_BYTES));
                opted[2] = 1;
            }
            gg_sm90_pp<EPI, AG, BKM, true><<<grid, THREADS, PSMEM_BYTES, st>>>(ta, tb, p);
            LK_CUDA_LAUNCHED("moe_experts: grouped gemm (sm90)");
            return LK_OK;
        }
    }
    if constexpr (EPI == SWIGLU || EPI == STORE || EPI == DSWIGLU) {
        if (!pp && v4) {
            if (!opted[3]) {
                LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90<EPI, AG, BKM, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 SMEM_BYTES));
                opted[3] = 1;
            }
            gg_sm90<EPI, AG, BKM, true><<<grid, THREADS, SMEM_BYTES, st>>>(ta, tb, p);
            LK_CUDA_LAUNCHED("moe_experts: grouped gemm (sm90)");
            return LK_OK;
        }
    }
    if (pp) {
        if (!opted[1]) {
            LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90_pp<EPI, AG, BKM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             PSMEM_BYTES));
            opted[1] = 1;
        }
        gg_sm90_pp<EPI, AG, BKM><<<grid, THREADS, PSMEM_BYTES, st>>>(ta, tb, p);
    } else {
        if (!opted[0]) {
            LK_CUDA_TRY(cudaFuncSetAttribute(gg_sm90<EPI, AG, BKM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             SMEM_BYTES));
            opted[0] = 1;
        }
        gg_sm90<EPI, AG, BKM><<<grid, THREADS, SMEM_BYTES, st>>>(ta, tb, p);
    }
    LK_CUDA_LAUNCHED("moe_experts: grouped gemm (sm90)");
    return LK_OK;
}

/* The schedule: lk_moe_cuda_gg_sm90_variant's, else LLMKERN_GG_SM90's (read once, by
 * lk_init's strict table in config/env.c): auto, coop, pingpong, pingpong_v4 (pingpong with
 * gg_sm90_pp's 16-byte DSWIGLU epilogue). */
static int variant_set = -1;

extern "C" void lk_moe_cuda_gg_sm90_variant(int v) { variant_set = v < 0 ? -1 : v; }

extern "C" int lk_moe_cuda_gg_sm90_variant_in_force(void) {
    if (variant_set >= 0) return variant_set;
    static int from_env = -1;
    if (from_env < 0) {
        const lk_env_value *v = lk_env(LK_ENV_GG_SM90);
        from_env = !v                                   ? LK_GG_SM90_AUTO
                   : strcmp(v->value, "coop") == 0        ? LK_GG_SM90_COOP
                   : strcmp(v->value, "pingpong") == 0    ? LK_GG_SM90_PINGPONG
                   : strcmp(v->value, "pingpong_v4") == 0 ? LK_GG_SM90_PINGPONG_V4
                   : strcmp(v->value, "coop_cluster") == 0 ? LK_GG_SM90_COOP_CLUSTER
                                                          : LK_GG_SM90_AUTO;
    }
    return from_env;
}

/* AUTO: the measured winner per GEMM (bench/NOTES.md, PEERS-H200.md's MoE shape, the same
 * call), coop for all four: dh' (DSWIGLU) 465-492 / 394-407 TFLOP/s against pingpong_v4
 * (thirteenth session, both on 16-byte epilogues), gate/up (SWIGLU) 537 / 418, d_rows (STORE,
 * B N-major) 633 / 614, and the forward's down (STORE, B K-major) 0.643-0.647 / 0.705-0.732 ms
 * (fifteenth session; within the noise of each other before 1812aec). g is the GEMM a later
 * winner may depend on. (The weight gradients: grouped_wgrad_sm90.cu.) */
extern "C" int lk_moe_cuda_gg_sm90_schedule(const lk_gg *g) {
    const int v = lk_moe_cuda_gg_sm90_variant_in_force();
    return v == LK_GG_SM90_AUTO ? LK_GG_SM90_COOP : v;
}

extern "C" lk_status lk_moe_cuda_gg_sm90(const lk_gg *g, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int ag = g->a.order != NULL, bk = g->b.kmajor;   /* as lk_moe_cuda_gg_sm90_takes allowed */
    sargs p;
    memset(&p, 0, sizeof p);
    p.a = (const lk_bf16_t *)g->a.src, p.lda = g->a.ld, p.kdiv = g->a.kdiv, p.aorder = g->a.order;
    p.n = g->epi == LK_GG_STORE ? g->n : g->inter, p.k = g->k, p.e = g->experts;
    const int variant = lk_moe_cuda_gg_sm90_schedule(g);
    const int cl = variant == LK_GG_SM90_COOP_CLUSTER ? 2 : 1;
    const int pp = variant != LK_GG_SM90_COOP && cl == 1;
    /* 16-byte epilogue accesses wherever the rows are 16-byte aligned: coop's (every epilogue) and
     * pingpong_v4's (DSWIGLU and STORE); pingpong keeps the narrow ones */
    const int c_bf16 = g->c_dt == LK_BF16;
    const int dsw_v4 = lk_aligned16(g->gu_saved) && lk_aligned16(g->dgu) && lk_aligned16(g->wh);
    const int c_v4 = g->epi == LK_GG_STORE && lk_aligned16(g->c) && g->ldc % (c_bf16 ? 8 : 4) == 0 && g->n % 8 == 0;
    const int v4 = g->epi == LK_GG_SWIGLU    ? !pp && lk_aligned16(g->keep) && lk_aligned16(g->h)
                   : variant == LK_GG_SM90_PINGPONG ? 0
                   : g->epi == LK_GG_DSWIGLU        ? dsw_v4
                                                    : c_v4;
    const int tn = pp ? PN : BN;   /* columns a tile */
    p.ny = (int)lk_cdiv(p.n, g->epi == LK_GG_SWIGLU ? tn / 2 : tn);
    p.offs = g->offs, p.tiles = g->tiles;
    p.c = g->c, p.ldc = g->ldc, p.c_bf16 = c_bf16;
    p.vec_c = g->epi == LK_GG_STORE && ((uintptr_t)g->c & (c_bf16 ? 3 : 7)) == 0 && g->ldc % 2 == 0 && g->n % 2 == 0;
    p.keep = (lk_bf16_t *)g->keep, p.h = (lk_bf16_t *)g->h;
    p.gsv = (const lk_bf16_t *)g->gu_saved, p.dgu = (lk_bf16_t *)g->dgu, p.wh = (lk_bf16_t *)g->wh;
    p.dwp = g->dw_part, p.dwt = lk_moe_cuda_dw_tiles(g->inter);
    p.w = g->w, p.order = g->order, p.inter = g->inter, p.flag = g->flag;

    /* the tensor maps: A (unless gathered) [1, rows, K] in 128-row boxes; B [E, rows, K]
     * in boxes of half a tile's columns (K-major: 128 rows, ping-pong 64) or [E, K, N] in
     * 64 × 64 boxes (N-major); 64 columns a box */
    CUtensorMap ta, tb;
    memset(&ta, 0, sizeof ta), memset(&tb, 0, sizeof tb);
    lk_status s;
    if (!ag) {
        const cuuint64_t dims[3] = {(cuuint64_t)g->k, (cuuint64_t)g->rows, 1};
        const cuuint64_t strides[2] = {(cuuint64_t)g->a.ld * 2, (cuuint64_t)(g->a.ld * g->rows * 2)};
        const cuuint32_t box[3] = {BK, BM, 1};
        if ((s = bf16_map(&ta, g->a.src, 3, dims, strides, box))) return map_error(s);
    }
    const int64_t nphys = g->epi == LK_GG_SWIGLU ? 2 * g->inter : p.n;
    const cuuint64_t bdims[3] = {(cuuint64_t)(bk ? g->k : nphys), (cuuint64_t)(bk ? nphys : g->k),
                                 (cuuint64_t)g->experts};
    const cuuint64_t bstrides[2] = {(cuuint64_t)g->b.ld * 2, (cuuint64_t)(g->b.e_stride ? g->b.e_stride * 2 : 16)};
    const cuuint32_t bbox[3] = {BK, (cuuint32_t)(bk ? tn / 2 : BK), 1};
    if ((s = bf16_map(&tb, g->b.src, 3, bdims, bstrides, bbox))) return map_error(s);

    const int sms = lk_hw_get()->cuda_sms > 0 ? lk_hw_get()->cuda_sms : 1;
    const int64_t bound = (g->rows / BM + g->experts) * p.ny;
    if (bound < 1) return LK_OK;
    const int grid = (int)(bound < sms ? bound : sms);
    if (g->epi == LK_GG_SWIGLU) return launch<SWIGLU, true, true>(ta, tb, p, grid, pp, v4, cl, st);
    if (g->epi == LK_GG_DSWIGLU) return launch<DSWIGLU, true, false>(ta, tb, p, grid, pp, v4, cl, st);
    return bk ? launch<STORE, false, true>(ta, tb, p, grid, pp, v4, cl, st)
              : launch<STORE, false, false>(ta, tb, p, grid, pp, v4, cl, st);
}
