/* eager_fp32.c — `eager_fp32` RMSNorm: the steps of eager.c with every intermediate in
 * f32 (inputs upcast first, outputs cast back last), the way a framework's norm that
 * says `x.float()` runs. Same memory traffic shape as eager, less rounding in bf16. */
#include "eager.h"

static size_t saved_bytes(int64_t rows, int64_t n, lk_dtype dt) {
    return lk_rms_norm_eager_saved_bytes(rows, n, LK_F32);
}

static size_t workspace_bytes(int64_t rows, int64_t n, lk_dtype dt, int backward) {
    return lk_rms_norm_eager_workspace_bytes(rows, n, dt, LK_F32, backward);
}

static lk_status forward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    return lk_rms_norm_eager_forward(a, ctx, LK_F32);
}

static lk_status backward(const lk_rms_norm_args *a, lk_ctx *ctx) {
    return lk_rms_norm_eager_backward(a, ctx, LK_F32);
}

const lk_rms_norm_vtable lk_rms_norm_eager_fp32_vtable = {
    .version = LK_RMS_NORM_VTABLE_VERSION,
    .saved_bytes = saved_bytes,
    .workspace_bytes = workspace_bytes,
    .forward = forward,
    .backward = backward,
};
