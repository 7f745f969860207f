/* hopper.cuh — the sm_90a instructions flash_attention_3's kernels are written with
 * (fa3.cu forward, fa3_bwd.cu backward), shared with the MoE experts' Hopper grouped GEMM
 * (moe/grouped_sm90.cu, which adds wgmma_ss_n256) and with fa2.cu's dQ reductions: mbarriers,
 * TMA and bulk copies and reductions, 16-byte f32 reductions and stores into global memory,
 * wgmma and its shared-memory descriptors, the aligned shared-memory base, the quad transpose
 * of the 16-byte epilogues; and on the host the tensor maps TMA reads through. Inline PTX,
 * one instruction a function where it can be; the PTX ISA's names. */
#ifndef LLMKERN_OPS_ATTENTION_HOPPER_CUH
#define LLMKERN_OPS_ATTENTION_HOPPER_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include "core/cuda_check.h"
#include "llmkern/tensor.h"
#include "ops/cuda_util.cuh"
#include "ops/mma_sm80.cuh"   /* smem_u32 */

/* The Hopper-only instructions exist in the sm_90a pass alone; the other passes see the
 * kernels as a trap. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA3_ARCH 1
#else
#define FA3_ARCH 0
#endif

#if FA3_ARCH

/* The dynamic shared memory's first 1024-aligned byte (TMA's 128-byte swizzle wants its
 * boxes 1024-aligned), as a pointer the compiler still knows to be shared. Aligned through
 * uintptr_t it was a generic pointer, and every access through it a generic load or store
 * (LD.E: the global pipe's queue and latency, where LDS takes ~30 cycles): fa3_bwd's stats
 * reads were its math warpgroups' largest stall (ncu, twelfth session). */
static __device__ __forceinline__ uint8_t *smem_align1024(uint8_t *raw) {
    return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
}

/* One 16-byte global store. `*(uint4 *)p = make_uint4(...)` is split into four 4-byte
 * stores inside the large MoE kernels (NVVM; their SASS had no STG.E.128: helper-15's
 * review, twelfth session), so the epilogues that mean 16 bytes say it. */
static __device__ __forceinline__ void st_global_v4(void *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

/* A 4 × 4 transpose across the 4 lanes of a quad: v[j] of lane l becomes v[l] of lane j (two
 * butterfly stages, xor 2 then xor 1). On an m64 fragment with v[j] = the pair of column group
 * 4g + j a lane holds (columns 2·(lane % 4) + b of the group), lane l ends with the 8
 * consecutive columns of group 4g + l, v[k] being columns 2k + b: the MoE grouped GEMMs'
 * 16-byte epilogues (moe/grouped_sm90.cu, moe/grouped_wgrad_sm90.cu). */
static __device__ __forceinline__ void quad_transpose(float *v, int lane) {
    const bool b1 = lane & 2, b0 = lane & 1;
    float s0 = b1 ? v[0] : v[2], s1 = b1 ? v[1] : v[3];
    s0 = __shfl_xor_sync(0xffffffffu, s0, 2), s1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (b1) v[0] = s0, v[1] = s1;
    else v[2] = s0, v[3] = s1;
    s0 = b0 ? v[0] : v[1], s1 = b0 ? v[2] : v[3];
    s0 = __shfl_xor_sync(0xffffffffu, s0, 1), s1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (b0) v[0] = s0, v[2] = s1;
    else v[1] = s0, v[3] = s1;
}

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

/* tma_load's box into the same shared-memory offset of every CTA of the cluster named in
 * mask (bit r: CTA rank r), completing on the barrier at bar's offset in each. */
static __device__ __forceinline__ void tma_load_mc(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                   int c2, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4, %5}], [%2], %6;"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
                 : "memory");
}
/* An arrival on the barrier at bar's offset in the cluster's CTA `cta` (this one included).
 * The default .release.cta, as CUTLASS's ClusterBarrier: enough to hand back a stage whose
 * reads (wgmma's) are complete; .release.cluster put a MEMBAR.ALL.GPU before every arrival
 * (SASS), a stall a stage that made the first cluster kernel 40% slower than coop. */
static __device__ __forceinline__ void mbar_arrive_cta(uint64_t *bar, uint32_t cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" ::"r"(smem_u32(bar)), "r"(cta)
                 : "memory");
}
static __device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* Every thread of the cluster's CTAs (exited ones count as arrived). */
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

/* The same through a 4-D tensor map. */
static __device__ __forceinline__ void tma_load4(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                 int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
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
/* The descriptor of the matrix `bytes` (a multiple of 16) further on: its address field
 * (bits 0-13, the address / 16) plus bytes / 16, which cannot carry out of it in the 228 KB
 * of a block's shared memory. A k-loop's descriptors as one add each to a base built once:
 * built from each address, every wgmma cost four more instructions (LOP3, SHF, LOP3, R2UR). */
static __device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

/* v made warp-uniform in the compiler's eyes (a shuffle from lane 0): a wgmma reads its
 * descriptors from uniform registers, and a descriptor computed from anything ptxas cannot prove
 * uniform (a loop counter of a divergent loop, the warpgroup index) is moved there by two R2UR a
 * wgmma, with its 64-bit add done in ordinary registers. */
static __device__ __forceinline__ uint64_t warp_uniform(uint64_t v) {
    const uint32_t lo = __shfl_sync(0xffffffffu, (uint32_t)v, 0), hi = __shfl_sync(0xffffffffu, (uint32_t)(v >> 32), 0);
    return (uint64_t)hi << 32 | lo;
}
/* The same for an index the descriptors are built from (a consumer warpgroup's). */
static __device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

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
/* size bytes (a multiple of 16, both ends 16-byte aligned) from global into shared
 * memory, completing on bar. */
static __device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
/* p[0..4) += v[0..4) in f32, one 16-byte reduction in L2 (p 16-byte aligned). */
static __device__ __forceinline__ void red_add_v4(float *p, const float *v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
                 : "memory");
}
/* dst[0..bytes/4) += src[..] in f32, done in L2 element by element (each a relaxed atomic at
 * gpu scope: blocks may add into the same rows), read from shared memory asynchronously and
 * completing in this thread's bulk group; bytes a multiple of 16, both ends 16-byte aligned. */
static __device__ __forceinline__ void bulk_reduce_add(float *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 ::"l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
/* The TMA epilogue (PTX ISA: cp.reduce.async.bulk.tensor, cp.async.bulk.commit_group /
 * wait_group): a box of the tensor map added element-wise into global memory from shared
 * memory (the add done in L2, the type the map's; what lies outside the tensor skipped),
 * completing in this thread's bulk group. */
static __device__ __forceinline__ void tma_reduce_add(const CUtensorMap *map, const void *src, int c0, int c1, int c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
                 ::"l"((uint64_t)map), "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
static __device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* every bulk group of this thread has read its shared memory */
static __device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
/* every bulk group of this thread is complete */
static __device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
/* Shared-memory writes by threads, made visible to the async proxy (wgmma, TMA). */
static __device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void fence_regs_u32(uint32_t *r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* d[m64 x n64] (+)= A · Bᵀ (acc 0: =), A and B K-major in shared memory. */
static __device__ __forceinline__ void wgmma_ss_n64(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}

/* d[m64 x n32] (+)= A · Bᵀ (acc 0: =), A MN-major in shared memory (stored as Aᵀ: K rows
 * of M), B K-major (rows of N, K contiguous). fa3_bwd.cu's variant-2 dQᵀ = Kᵀ·dSᵀ. */
static __device__ __forceinline__ void wgmma_ss_n32_ta(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 1, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc));
}
/* Four 8 x 8 b16 matrices stored transposed: r[m] is this thread's piece of matrix m (row
 * lane / 4, columns 2 (lane % 4) and + 1, the lower half the even column: the accumulator's
 * and pack_a's layout), and lane 8m + x gives the address of the 16 bytes that receive
 * column x of matrix m (stmatrix .trans). */
static __device__ __forceinline__ void stmatrix_x4_trans(void *p, const uint32_t *r) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_u32(p)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
/* d (m64 x nN) (+)= A·Bᵀ over DP columns, A and B K-major tiles of 64-column blocks: A
 * the warpgroup's 64 rows of a tile of RA rows, B a tile of N rows in blocks RB rows
 * apart; the first k-step sets d. */
template <int DP, int N, int RA, int RB>
static __device__ __forceinline__ void issue_ss(float *d, const uint8_t *sa, const uint8_t *sb) {
    const uint64_t a0 = desc(sa, 16, 1024), b0 = desc(sb, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        const int c = kk / 4, off = (kk % 4) * 32;
        const uint64_t da = desc_at(a0, c * RA * 128 + off), db = desc_at(b0, c * RB * 128 + off);
        if constexpr (N == 176) wgmma_ss_n176(d, da, db, kk > 0);
        else if constexpr (N == 128) wgmma_ss_n128(d, da, db, kk > 0);
        else wgmma_ss_n64(d, da, db, kk > 0);
    }
}

/* d (m64 x nDP) += A·B over K rows: A in registers (a[t]: k-step t's fragment), B a tile
 * of K rows read N-major (its 64-column blocks K·128 bytes apart). */
template <int DP, int K>
static __device__ __forceinline__ void issue_rs(float *d, const uint32_t (*a)[4], const uint8_t *sb) {
    const uint64_t b0 = desc(sb, K * 128, 1024);
#pragma unroll
    for (int t = 0; t < K / 16; t++) {
        const uint64_t db = desc_at(b0, t * 2048);
        if constexpr (DP == 128) wgmma_rs_n128(d, a[t], db);
        else wgmma_rs_n64(d, a[t], db);
    }
}

/* Columns 16t..16t+15 of an m64nN accumulator, rounded to bf16, are the A fragment of
 * k-step t. */
template <int N>
static __device__ __forceinline__ void pack_a(const float *x, uint32_t (*a)[4]) {
#pragma unroll
    for (int e = 0; e < N / 2; e += 2) a[e / 8][((e / 4) & 1) * 2 + ((e >> 1) & 1)] = lk_pack_bf16x2(x[e], x[e + 1]);
}
#endif

#if FA3_ARCH
/* d[m64 x n256] (+)= A · B (acc 0: =), both from shared memory: A K-major; B K-major (TB
 * 0: stored as Bᵀ, rows of K) or N-major (TB 1: rows of N). The grouped GEMM's
 * (moe/grouped_sm90.cu). */
template <int TB>
static __device__ __forceinline__ void wgmma_ss_n256(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, %131;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(acc), "n"(TB));
}
#endif

/* --- host ---------------------------------------------------------------------------- */

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

/* A tensor of `rank` dims (dims[0] contiguous; strides[i] bytes between steps of dims[i + 1]) in
 * boxes whose first dim is 128 bytes, 128-byte swizzled; what lies outside the tensor reads as
 * zeros and takes no stores or reductions. `who` opens the error. */
static lk_status swizzled_map(CUtensorMap *m, CUtensorMapDataType type, const char *who, const void *base, int rank,
                              const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box) {
    encode_fn enc = encoder();
    if (!enc) return lk_error(LK_EDEVICE, "%s: the driver has no cuTensorMapEncodeTiled", who);
    const cuuint32_t el[4] = {1, 1, 1, 1};
    CUresult r = enc(m, type, (cuuint32_t)rank, (void *)base, dims, strides, box, el, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return lk_error(LK_EDEVICE, "%s: cuTensorMapEncodeTiled failed (%d)", who, (int)r);
    return LK_OK;
}

/* A bf16 tensor read in boxes of 64 columns: the layout the wgmma descriptors name. */
static lk_status bf16_map(CUtensorMap *m, const void *base, int rank, const cuuint64_t *dims,
                          const cuuint64_t *strides, const cuuint32_t *box) {
    return swizzled_map(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "attention: flash_attention_3", base, rank, dims, strides, box);
}

/* An f32 [heads, rows, D] (D % 4 == 0) as boxes of 32 columns x rows_box rows of one head:
 * fa2.cu's dQ workspace, added into by tma_reduce_add. */
static inline lk_status f32_rows_map(CUtensorMap *m, const float *base, int64_t heads, int64_t rows, int64_t D, int rows_box) {
    const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)rows, (cuuint64_t)heads};
    const cuuint64_t strides[2] = {(cuuint64_t)D * 4, (cuuint64_t)(rows * D * 4)};
    const cuuint32_t box[3] = {32, (cuuint32_t)rows_box, 1};
    return swizzled_map(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, "attention: flash_attention_2 dQ", base, 3, dims, strides, box);
}

/* A bf16 [B, H, S, D] tensor, contiguous or a strided view (the strides are the map's: D
 * contiguous, the rest 16-byte multiples, lk_attn_view16), as boxes of 64 columns x rows_box
 * rows of one (b, h): coordinates {column, row, h, b}. A dim of one element takes the stride
 * of the dims inside it (any other would do; TMA wants a multiple of 16). */
static inline lk_status view_map(CUtensorMap *m, const lk_tensor *t, int rows_box) {
    const int64_t *n = t->shape, *st = t->stride;
    const cuuint64_t dims[4] = {(cuuint64_t)n[3], (cuuint64_t)n[2], (cuuint64_t)n[1], (cuuint64_t)n[0]};
    const cuuint64_t strides[3] = {(cuuint64_t)(n[2] > 1 ? st[2] : n[3]) * 2,
                                   (cuuint64_t)(n[1] > 1 ? st[1] : n[2] * n[3]) * 2,
                                   (cuuint64_t)(n[0] > 1 ? st[0] : n[1] * n[2] * n[3]) * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows_box, 1, 1};
    return bf16_map(m, t->data, 4, dims, strides, box);
}

/* 1 when t (bf16) is a tensor view_map can map: data 16-byte aligned, and every stride of a
 * dim past one element a multiple of 8 elements (D contiguous, checked by the facade). */
static inline int lk_attn_view16(const lk_tensor *t) {
    if ((uintptr_t)t->data % 16) return 0;
    for (int i = 0; i < 3; i++)
        if (t->shape[i] > 1 && t->stride[i] % 8) return 0;
    return 1;
}

#endif
