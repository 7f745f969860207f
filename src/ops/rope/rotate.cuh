/* rotate.cuh — the one rotate-half formula of the CUDA kernels that rotate by RoPE: the
 * `fused` RoPE (fused.cu) and RMSNorm's rope (rms_norm/fused.cu, rms_norm.h: the bits of
 * the norm and then that RoPE, so both must round the same products the same way).
 *
 * With vs = sign·s (sign +1 forward, −1 backward: exact), the pair (x1, x2) at (j, j + h)
 * becomes o1 = x1·c − x2·vs, o2 = x2·c + x1·vs, each one fma on a rounded product: the
 * CPU row's formula (rope/row.h: fnma(x2, vs, x1·c), fma(x1, vs, x2·c)). Pinned with
 * fmaf and __fmul_rn rather than left to the compiler's contraction, which may pick either
 * product to fuse, and might pick differently in two kernels. Included by .cu files only. */
#ifndef LLMKERN_ROPE_ROTATE_CUH
#define LLMKERN_ROPE_ROTATE_CUH

#include <cuda_runtime.h>

/* Both halves of one rotate-half pair (a = x1, b = x2) by the angle (c, vs). */
static __device__ __forceinline__ void lk_rope_rotate(float a, float b, float c, float vs, float *o1, float *o2) {
    *o1 = fmaf(-b, vs, __fmul_rn(a, c));
    *o2 = fmaf(a, vs, __fmul_rn(b, c));
}

/* One half of the pair, for a thread that holds one side and got the other (a shuffle):
 * own its element, other its partner's; first = own is x1 (j < h). The same bits as
 * lk_rope_rotate's o1 (first) or o2: a sign moved from one factor to the other is exact. */
static __device__ __forceinline__ float lk_rope_rotate_half(float own, float other, float c, float vs, bool first) {
    return fmaf(other, first ? -vs : vs, __fmul_rn(own, c));
}

#endif
