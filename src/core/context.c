/* context.c — the CPU context, OpenMP thread count, and the monotonic clock. */
#include <omp.h>
#include <time.h>
#include "llmkern/context.h"

lk_ctx lk_ctx_cpu(lk_arena *arena) {
    return (lk_ctx){.device = {LK_DEVICE_CPU, 0}, .arena = arena};
}

lk_ctx lk_ctx_cuda(lk_arena *arena, void *stream, int device_index) {
    return (lk_ctx){.device = {LK_DEVICE_CUDA, device_index}, .stream = stream, .arena = arena};
}

lk_status lk_ctx_workspace_begin(lk_ctx *ctx, const char *op, size_t bytes, size_t *mark) {
    *mark = ctx->arena ? ctx->arena->used : 0;
    if (bytes == 0) return LK_OK;
    if (ctx->arena == NULL)
        return lk_error(LK_EINVAL, "%s: ctx.arena: expected an arena for %zu bytes of workspace, got NULL",
                        op, bytes);
    return lk_arena_reserve(ctx->arena, bytes);
}

void lk_ctx_workspace_end(lk_ctx *ctx, size_t mark) {
    if (ctx->arena) lk_arena_release(ctx->arena, mark);
}

void lk_set_num_threads(int n) { if (n > 0) omp_set_num_threads(n); }

int lk_get_num_threads(void) { return omp_get_max_threads(); }

double lk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
