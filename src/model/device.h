/* device.h — where the model's buffers live, and the few moves the model makes itself
 * (everything else is an op call): allocation, copies to and from the host, the head
 * transposes, residual adds, the gradients' f32 sums, the compute copy of the weights,
 * the embedding gather and its scatter-add. One struct of function pointers per device,
 * picked once at lk_model_create from the op table's device: device_cpu.c (plain C,
 * OpenMP) and, in CUDA builds, device.cu. On CUDA every pointer but the host side of
 * put / get is device memory and the work goes on ctx->stream (the model uses the
 * legacy default stream, which the NCCL communicator orders itself after). */
#ifndef LLMKERN_MODEL_DEVICE_H
#define LLMKERN_MODEL_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "llmkern/comm.h"
#include "llmkern/context.h"
#include "llmkern/status.h"
#include "ops/attention/flex_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    lk_device_type type;
    /* The calling thread's device index (CUDA: cudaGetDevice; CPU 0). */
    int (*current)(void);
    /* bytes of zeroed memory, 64-byte aligned or better; NULL when out of memory. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Synchronous copies between host memory and this device's. */
    lk_status (*put)(void *dst, const void *host_src, size_t bytes);
    lk_status (*get)(void *host_dst, const void *src, size_t bytes);
    /* Host memory the device copies from without the host waiting (CUDA: pinned), and
     * the copy from it on ctx->stream (the source must stay as it is until the stream
     * has run the copy). */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    lk_status (*put_async)(void *dst, const void *pinned_src, size_t bytes, lk_ctx *ctx);
    lk_status (*zero)(void *p, size_t bytes, lk_ctx *ctx);
    /* p[i] = v for i < n, f32 (the residual stream's gradient starts at -0.0: x + -0.0 is
     * x bit for bit, a zero's sign included, where +0.0 would turn a -0.0 into +0.0). */
    lk_status (*fill)(float *p, float v, int64_t n, lk_ctx *ctx);
    /* The activations' moves, in their dtype dt (f32 or bf16):
     * [T, H, D] -> [H, T, D]; back: [H, T, D] -> [T, H, D]. The token-major side's rows are
     * ld >= H·D elements apart (q, k and v are column blocks of one [T, Q + 2K] GEMM output). */
    lk_status (*heads)(const void *src, void *dst, int64_t T, int64_t H, int64_t D, int64_t ld, int back, lk_dtype dt,
                       lk_ctx *ctx);
    /* dst[i] = a[i] + b[i] (in f32, rounded once); dst may be a or b. */
    lk_status (*add)(void *dst, const void *a, const void *b, int64_t n, lk_dtype dt, lk_ctx *ctx);
    /* dst[i] += src[i] in f32, src of dtype dt, dst of ddt (f32; bf16 rounded once): the
     * gradients' own sums (a norm's written dweight into bf16 or f32 gradients) and f32 ones. */
    lk_status (*acc)(void *dst, lk_dtype ddt, const void *src, lk_dtype dt, int64_t n, lk_ctx *ctx);
    /* dst[i] = src[i] rounded to dt (the f32 master weights into the compute copy). */
    lk_status (*round)(void *dst, const float *src, int64_t n, lk_dtype dt, lk_ctx *ctx);
    /* x[t] = table[ids[t]] for t < T (ids in [0, V), checked by the caller); table and x of dt. */
    lk_status (*embed)(const void *table, const int64_t *ids, void *x, int64_t T, int64_t H, int64_t V, lk_dtype dt,
                       lk_ctx *ctx);
    /* dtable[ids[t]] += dx[t], dx of dt, dtable of tdt (f32 or bf16), repeated ids in token
     * order (deterministic); in f32, a bf16 row rounded once: its tokens summed, then added. */
    lk_status (*embed_backward)(void *dtable, lk_dtype tdt, const int64_t *ids, const void *dx, int64_t T, int64_t H,
                                int64_t V, lk_dtype dt, lk_ctx *ctx);
    /* flex_attention's staged document mask (flex_plan.h): the image at img (copied there on
     * ctx->stream) attached to m, its bits made into bits. NULL on the CPU (the mask's lists
     * serve). */
    lk_status (*flex_attach)(lk_block_mask *m, const lk_flex_image *L, const lk_flex_prog *prog, const int32_t *img,
                             uint32_t *bits, lk_ctx *ctx);
    /* The loss over a sequence-parallel group (lk_sp_loss_reduce's math): scal holds this
     * rank's summed loss (f32 scal[0]) and valid tokens (i64 at scal + 4); after it the
     * group's mean loss is at scal[0], its count at scal + 4 and d_loss = scale / count
     * (0 when no rank has a valid token) at scal[1]. CUDA: sp an NCCL group, the sums
     * all-reduced on ctx->stream and one kernel, no host read; CPU: lk_sp_loss_reduce. */
    lk_status (*group_loss)(float *scal, float scale, lk_comm *sp, lk_ctx *ctx);
} lk_model_device;

struct lk_model;
/* The device m's buffers live on (the trainer keeps its optimizer state there too). */
const lk_model_device *lk_model_device_of(const struct lk_model *m);

extern const lk_model_device lk_model_device_cpu;
#ifdef LLMKERN_HAVE_CUDA
extern const lk_model_device lk_model_device_cuda;
#endif

#ifdef __cplusplus
}
#endif
#endif
