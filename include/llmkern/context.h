/* context.h — what every op call gets besides its arguments: the device, the CUDA
 * stream, the workspace arena, the communicator and the generator; and threads and clocks. */
#ifndef LLMKERN_CONTEXT_H
#define LLMKERN_CONTEXT_H

#include "arena.h"
#include "rng.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a forward keeps for its backward: caller-owned storage of the size the op's
 * saved_bytes query gives, so the memory an op holds between passes is visible. */
typedef struct {
    void *data;
    size_t bytes;
} lk_saved;

struct lk_comm;  /* comm.h */

typedef struct lk_ctx {
    lk_device device;
    void *stream;      /* cudaStream_t on CUDA; unused on the CPU */
    lk_arena *arena;   /* workspace; required by ops whose query asks for one */
    /* The group a distributed op runs over (comm.h): attention's SP rows take the
     * sequence-parallel group, moe_dispatch the expert-parallel one. NULL = one process. */
    struct lk_comm *comm;
    lk_rng *rng;
} lk_ctx;

/* For op facades: reserves `bytes` of workspace in ctx->arena for one call (an error
 * naming op when bytes > 0 and there is no arena) and gives the mark that
 * lk_ctx_workspace_end releases to after the call. */
LK_API lk_status lk_ctx_workspace_begin(lk_ctx *ctx, const char *op, size_t bytes, size_t *mark);
LK_API void lk_ctx_workspace_end(lk_ctx *ctx, size_t mark);

/* A CPU context over an arena the caller owns. */
LK_API lk_ctx lk_ctx_cpu(lk_arena *arena);
/* A CUDA context: device index, a cudaStream_t (NULL = the default stream) and a device
 * arena (arena->device = LK_DEVICE_CUDA) the caller owns. Kernels are queued on the
 * stream and not waited for; errors the launch reports come back as LK_EDEVICE. */
LK_API lk_ctx lk_ctx_cuda(lk_arena *arena, void *stream, int device_index);

/* OpenMP threads used by CPU kernels. */
LK_API void lk_set_num_threads(int n);
LK_API int lk_get_num_threads(void);

/* Monotonic seconds. */
LK_API double lk_now(void);

#ifdef __cplusplus
}
#endif
#endif
