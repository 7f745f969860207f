/* sround.h — f32 to bf16 by stochastic rounding, one definition for the CPU (train/adamw.c)
 * and the GPU (ops/train_cuda/adamw.cu): the AdamW moments kept in bf16
 * (train.exp_avg_dtype / train.exp_avg_sq_dtype), and the weights kept in bf16 without an
 * f32 master (train.main_params_dtype: an AdamW step of about lr = 1e-4 is under half an ulp
 * of every weight above ~0.05 in magnitude, a norm's gain near 1 included, so nearest
 * rounding would drop it whole).
 *
 * Why not round to nearest: v's step under beta2 = 0.999 adds 0.1% of (g² - v), less than
 * half a bf16 ulp (0.2-0.4%), so nearest rounding puts v back where it was until g² is
 * ~3x v: v could only grow, never decay. Rounding up with probability equal to the
 * dropped fraction keeps every increment in expectation (E[round(x)] = x), which is what
 * torchao's bf16_stochastic_round and "Revisiting BFloat16 Training" (Zamirai et al. 2020)
 * rely on.
 *
 * The random bits are a pure function of (train.seed, step, tensor, element), so a run,
 * its resume, every data-parallel replica and the CPU and GPU rows draw the same:
 *   step_key   = lk_sround_step_key(seed, step)             once a step (the host)
 *   tensor_key = lk_sround_tensor_key(step_key, tensor)     tensor = the parameter's index
 *   bits       = lk_sround_bits(tensor_key, i, weight)      element i's bits: the low 16
 *                round m, the next 16 round v, and with weight != 0 bits 32-47 round
 *                the weight. Not installed.
 * The element's draws are 32-bit hashes (lowbias32, two 32-bit multiplies each), fewer
 * instructions than the 64-bit finalizer's three 64-bit multiplies: AdamW on bf16 state
 * is bound by its instructions and its memory together (bench/NOTES.md, twenty-ninth
 * session: -1.5% from the hashes alone). */
#ifndef LLMKERN_CORE_SROUND_H
#define LLMKERN_CORE_SROUND_H

#include <stdint.h>
#include <string.h>
#include "core/mix.h"

#ifdef __CUDACC__
#define LK_SROUND_FN static __host__ __device__ __forceinline__
#else
#define LK_SROUND_FN static inline
#endif

LK_SROUND_FN uint64_t lk_sround_step_key(uint64_t seed, int64_t step) { return lk_mix_bits(seed, (uint64_t)step); }

LK_SROUND_FN uint64_t lk_sround_tensor_key(uint64_t step_key, int tensor) {
    return lk_mix64(step_key ^ ((uint64_t)tensor + 1) * 0xd1b54a32d192ed03ull);
}

/* lowbias32 (C. Wellons' hash-prospector): every input bit moves every output bit. */
LK_SROUND_FN uint32_t lk_sround_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* m's and v's 32 bits from the element's counter (distinct for every i below 2^32) and the
 * whole key folded; the weight's 16 from those bits and the key's high word again, drawn
 * only when asked (a masterless bf16 weight). */
LK_SROUND_FN uint64_t lk_sround_bits(uint64_t tensor_key, int64_t i, int weight) {
    const uint32_t c = (uint32_t)i * 0x9e3779b9u ^ (uint32_t)((uint64_t)i >> 32), hi = (uint32_t)(tensor_key >> 32);
    const uint32_t mv = lk_sround_mix32(c + ((uint32_t)tensor_key ^ hi));
    return weight ? mv | (uint64_t)(lk_sround_mix32(mv ^ hi) & 0xffffu) << 32 : mv;
}

/* f rounded to a bf16 neighbour: up (in magnitude) with probability (dropped bits) / 2^16,
 * r16 = 16 uniform bits. Exact bf16 values stay; a NaN stays a quiet NaN, an Inf an Inf. */
LK_SROUND_FN uint16_t lk_sround_bf16(float f, uint32_t r16) {
    uint32_t u;
    memcpy(&u, &f, 4);
    /* an Inf's low half is 0, so adding r16 leaves it an Inf: only a NaN needs its own case */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + (r16 & 0xffffu)) >> 16);
}

#endif
