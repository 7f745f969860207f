/* eager.h — the step-by-step RMSNorm shared by `eager` (intermediates in the input
 * dtype) and `eager_fp32` (intermediates in f32): one function each way, parameterized
 * by the intermediate dtype `it`. Only eager.c and eager_fp32.c include this. */
#ifndef LLMKERN_RMS_NORM_EAGER_H
#define LLMKERN_RMS_NORM_EAGER_H

#include "llmkern/rms_norm.h"

/* saved: rstd [rows] then x̂ [rows, n], both in it. */
size_t lk_rms_norm_eager_saved_bytes(int64_t rows, int64_t n, lk_dtype it);
size_t lk_rms_norm_eager_workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, lk_dtype it,
                                         int backward);
lk_status lk_rms_norm_eager_forward(const lk_rms_norm_args *a, lk_ctx *ctx, lk_dtype it);
lk_status lk_rms_norm_eager_backward(const lk_rms_norm_args *a, lk_ctx *ctx, lk_dtype it);

#endif
