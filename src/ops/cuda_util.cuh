/* cuda_util.cuh — device helpers the CUDA kernels share: f32/bf16 loads and stores in
 * groups of W elements (W = 16 / sizeof(T) is one 16-byte access; W = 1 is the scalar
 * path for odd shapes and unaligned pointers), warp and block sums, launch sizing, the
 * exp2 and bf16-pair packing of the tensor-core attention kernels.
 *
 * Kernels are templated on the storage type T (float or __nv_bfloat16) and on W: one
 * kernel body for both dtypes and both access widths instead of near-identical copies;
 * math is f32 throughout, bf16 rounded once on the store. Included by the .cu files only. */
#ifndef LLMKERN_CUDA_UTIL_CUH
#define LLMKERN_CUDA_UTIL_CUH

#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 lk_bf16_t;

static __device__ __forceinline__ float lk_to_f32(float v) { return v; }
static __device__ __forceinline__ float lk_to_f32(lk_bf16_t v) { return __bfloat162float(v); }
template <typename T> static __device__ __forceinline__ T lk_from_f32(float v);
template <> __device__ __forceinline__ float lk_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ lk_bf16_t lk_from_f32<lk_bf16_t>(float v) { return __float2bfloat16_rn(v); }

/* 2^x on the special-function unit (ex2.approx: ~2 ulp, subnormals flushed), the
 * softmaxes' exponential. */
static __device__ __forceinline__ float lk_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Two floats rounded to bf16 in one register, lo in the low half (a tensor-core operand). */
static __device__ __forceinline__ uint32_t lk_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Elements of T in one 16-byte access. */
template <typename T> struct lk_vec { static const int N = 16 / (int)sizeof(T); };

/* W elements at p (16-byte aligned when W == lk_vec<T>::N) into f[0..W). `stream`
 * marks data read once: it is loaded past L1 with the evict-first hint. */
template <typename T, int W>
static __device__ __forceinline__ void lk_ldw(const T *p, float *f, bool stream = true) {
    if (W == lk_vec<T>::N) {
        const uint4 *q = reinterpret_cast<const uint4 *>(p);
        uint4 u = stream ? __ldcs(q) : __ldg(q);
        const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = lk_to_f32(e[j]);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) f[j] = lk_to_f32(p[j]);
    }
}

/* f[0..W) rounded to T at p; `stream` writes with the evict-first hint (outputs that
 * nobody reads back soon). */
template <typename T, int W>
static __device__ __forceinline__ void lk_stw(T *p, const float *f, bool stream = true) {
    if (W == lk_vec<T>::N) {
        uint4 u;
        T *e = reinterpret_cast<T *>(&u);
#pragma unroll
        for (int j = 0; j < W; j++) e[j] = lk_from_f32<T>(f[j]);
        if (stream) __stcs(reinterpret_cast<uint4 *>(p), u);
        else *reinterpret_cast<uint4 *>(p) = u;
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) p[j] = lk_from_f32<T>(f[j]);
    }
}

/* W elements of T kept as loaded (packed: a 16-byte group of bf16 is 4 registers, half
 * what the same values take as f32), for kernels that hold a row or prefetch the next
 * one and convert each element when they use it. */
template <typename T, int W>
struct alignas(sizeof(T) * W) lk_pack {
    T e[W];
    __device__ __forceinline__ float f(int j) const { return lk_to_f32(e[j]); }
};

template <typename T, int W>
static __device__ __forceinline__ void lk_ldp(const T *p, lk_pack<T, W> &v, bool stream = true) {
    if (W == lk_vec<T>::N) {
        const uint4 *q = reinterpret_cast<const uint4 *>(p);
        *reinterpret_cast<uint4 *>(v.e) = stream ? __ldcs(q) : __ldg(q);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) v.e[j] = p[j];
    }
}

/* Asks for bytes at p (16-byte aligned, a multiple of 16) to be brought into L2 without
 * waiting and without registers: one bulk request on Hopper, called by one thread; a
 * line per 128 bytes from the calling threads' own addresses elsewhere (pass the
 * thread's piece). The loads that follow a row later then hit L2. */
static __device__ __forceinline__ void lk_prefetch_l2_bulk(const void *p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p, (void)bytes;
#endif
}

static __device__ __forceinline__ void lk_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* The sum of v over each aligned group of G lanes (G a power of two up to 32), returned to
 * every lane of the group; every lane of the warp must take part. */
template <int G>
static __device__ __forceinline__ float lk_group_sum(float v) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float lk_warp_sum(float v) { return lk_group_sum<32>(v); }

/* The sum of v over the block, returned to every thread. scratch: 32 floats of shared
 * memory; blockDim.x a multiple of 32. Ends with a barrier, so scratch can be reused. */
static __device__ __forceinline__ float lk_block_sum(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = lk_warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float s = lane < warps ? scratch[lane] : 0.0f;
    s = lk_warp_sum(s);
    __syncthreads();
    return s;
}

static inline int lk_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static inline int64_t lk_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif
