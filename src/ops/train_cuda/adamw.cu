/* adamw.cu — multi-tensor AdamW on CUDA (cuda_train.h): every parameter tensor of a
 * step in one launch (multi_tensor.cuh cuts them into 4096-element blocks). One thread
 * per element, 16 elements a thread strided by the block so each load is coalesced;
 * memory-bound (a bf16 parameter with f32 master and bf16 grad moves 2+2+4·3 read and
 * 2+4·3 written bytes an element), so the math is the CPU trainer's, in f32. */
#include <math.h>
#include <stdlib.h>
#include "llmkern/cuda_train.h"
#include "ops/train_cuda/multi_tensor.cuh"

static const char *FN = "adamw (cuda)";

typedef struct {
    void *p;
    const void *g;
    float *m, *v, *master;
    int64_t n, block0;
    int p_bf16, g_bf16;
    float decay;            /* 1 - lr·wd, or 1 for a no_decay tensor */
} adesc;

typedef struct {
    float b1, b2, eps, step, vcorr;   /* step = lr/(1-b1^t), vcorr = 1/sqrt(1-b2^t) */
} ascal;

__global__ void __launch_bounds__(LK_MT_THREADS) adamw_kernel(const adesc *list, int n_list, ascal s) {
    const adesc d = list[lk_mt_find(list, n_list, blockIdx.x)];
    const int64_t base = (blockIdx.x - d.block0) * (int64_t)LK_MT_CHUNK + threadIdx.x;
    float *w = d.p_bf16 ? d.master : static_cast<float *>(d.p);
#pragma unroll 4
    for (int k = 0; k < LK_MT_PER_THREAD; k++) {
        int64_t i = base + (int64_t)k * LK_MT_THREADS;
        if (i >= d.n) break;
        float g = lk_mt_ld(d.g, d.g_bf16, i);
        float m = s.b1 * d.m[i] + (1.0f - s.b1) * g;
        float v = s.b2 * d.v[i] + (1.0f - s.b2) * g * g;
        d.m[i] = m;
        d.v[i] = v;
        float p = w[i] * d.decay - s.step * m / (sqrtf(v) * s.vcorr + s.eps);
        w[i] = p;
        if (d.p_bf16) static_cast<lk_bf16_t *>(d.p)[i] = __float2bfloat16_rn(p);
    }
}

static int is_fp(lk_dtype dt) { return dt == LK_F32 || dt == LK_BF16; }

static lk_status check(const lk_cuda_adamw_tensor *t, int n, const lk_cuda_adamw_hparams *hp) {
    if (hp == NULL) return lk_error(LK_EINVAL, "%s: hparams: expected a pointer, got NULL", FN);
    if (!(hp->lr >= 0.0 && isfinite(hp->lr)))
        return lk_error(LK_EINVAL, "%s: lr: expected finite >= 0, got %g", FN, hp->lr);
    if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0))
        return lk_error(LK_EINVAL, "%s: beta1: expected [0, 1), got %g", FN, hp->beta1);
    if (!(hp->beta2 >= 0.0 && hp->beta2 < 1.0))
        return lk_error(LK_EINVAL, "%s: beta2: expected [0, 1), got %g", FN, hp->beta2);
    if (!(hp->eps > 0.0)) return lk_error(LK_EINVAL, "%s: eps: expected > 0, got %g", FN, hp->eps);
    if (!(hp->weight_decay >= 0.0 && hp->lr * hp->weight_decay < 1.0))
        return lk_error(LK_EINVAL, "%s: weight_decay: expected >= 0 with lr·wd < 1, got %g", FN, hp->weight_decay);
    if (hp->step < 1) return lk_error(LK_EINVAL, "%s: step: expected >= 1, got %lld", FN, (long long)hp->step);
    if (n < 0 || (n > 0 && t == NULL))
        return lk_error(LK_EINVAL, "%s: tensors: expected a list of n_tensors >= 0, got %d", FN, n);
    for (int i = 0; i < n; i++) {
        const lk_cuda_adamw_tensor *x = &t[i];
        if (x->n < 0) return lk_error(LK_EINVAL, "%s: tensors[%d].n: expected >= 0, got %lld", FN, i, (long long)x->n);
        if (x->n == 0) continue;
        if (!x->param || !x->grad || !x->m || !x->v)
            return lk_error(LK_EINVAL, "%s: tensors[%d]: expected param, grad, m and v, got a NULL %s", FN, i,
                            !x->param ? "param" : !x->grad ? "grad" : !x->m ? "m" : "v");
        if (!is_fp(x->param_dtype) || !is_fp(x->grad_dtype))
            return lk_error(LK_EDTYPE, "%s: tensors[%d].%s_dtype: expected f32 or bf16, got %s", FN, i,
                            is_fp(x->param_dtype) ? "grad" : "param",
                            lk_dtype_name(is_fp(x->param_dtype) ? x->grad_dtype : x->param_dtype));
        if (x->param_dtype == LK_BF16 && x->master == NULL)
            return lk_error(LK_EINVAL, "%s: tensors[%d].master: expected f32 master weights for a bf16 param, got NULL",
                            FN, i);
        if (x->param_dtype == LK_F32 && x->master != NULL)
            return lk_error(LK_EINVAL, "%s: tensors[%d].master: expected NULL for an f32 param (updated in place)",
                            FN, i);
    }
    return LK_OK;
}

extern "C" lk_status lk_cuda_adamw_step(const lk_cuda_adamw_tensor *tensors, int n_tensors,
                                        const lk_cuda_adamw_hparams *hp, lk_ctx *ctx) {
    lk_status st = lk_mt_check_ctx(FN, ctx);
    if (st == LK_OK) st = check(tensors, n_tensors, hp);
    if (st != LK_OK || n_tensors == 0) return st;
    adesc *h = static_cast<adesc *>(malloc(sizeof(adesc) * (size_t)n_tensors));
    if (h == NULL) return lk_error(LK_ENOMEM, "%s: %d descriptors", FN, n_tensors);
    const float decay = (float)(1.0 - hp->lr * hp->weight_decay);
    int64_t blocks = 0;
    for (int i = 0; i < n_tensors; i++) {
        const lk_cuda_adamw_tensor *x = &tensors[i];
        h[i] = (adesc){x->param, x->grad, x->m, x->v, x->master, x->n, blocks, x->param_dtype == LK_BF16,
                       x->grad_dtype == LK_BF16, x->no_decay ? 1.0f : decay};
        blocks += lk_cdiv(x->n, LK_MT_CHUNK);
    }
    ascal s = {(float)hp->beta1, (float)hp->beta2, (float)hp->eps,
               (float)(hp->lr / (1.0 - pow(hp->beta1, (double)hp->step))),
               (float)(1.0 / sqrt(1.0 - pow(hp->beta2, (double)hp->step)))};
    size_t mark;
    adesc *dev = NULL;
    st = lk_ctx_workspace_begin(ctx, FN, lk_mt_piece(sizeof(adesc) * (size_t)n_tensors), &mark);
    if (st == LK_OK) st = lk_mt_upload(FN, ctx, h, n_tensors, &dev);
    free(h);
    if (st == LK_OK && blocks > 0) {
        adamw_kernel<<<(unsigned)blocks, LK_MT_THREADS, 0, static_cast<cudaStream_t>(ctx->stream)>>>(dev, n_tensors, s);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = lk_cuda_fail(e, "adamw (cuda): launch", __FILE__, __LINE__);
    }
    lk_ctx_workspace_end(ctx, mark);
    return st;
}
